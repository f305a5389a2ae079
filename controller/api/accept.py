"""A checked job handed to `serve`'s inbox: its owner record, then its job file, made durable.

The last step of every submit (controller/api/submit.py). The owner record is written before the job
file, so the job is never unowned, and neither is flushed here: a JSON submit's writes are staged
(``accept_json``) and made durable with the rest of its intake batch (controller/api/intake.py); an
upload's (``hand_over``) by the process's group commit at once (controller/api/commit.py). Until
flushed, the job file is younger than serve's settle time, so taking both back is safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller.api import commit, quota
from controller.api.area import Area
from controller.api.errors import ApiError
from controller.api.intake import Staged
from controller.api.quota import RETRY_AFTER
from controller.config import Config
from controller.run import handover
from controller.serve.inbox import SETTLE_SECONDS


@dataclass(frozen=True)
class Accepted:
    job: str
    notes: tuple[str, ...] = ()


def inbox(config: Config) -> Path:
    return config.data_root / "inbox"


def served_inbox(config: Config, nothing_was: str) -> Path:
    """The inbox, when a live `serve` takes from it (a fresh heartbeat); else 503 ``no_controller``
    saying nothing was ``nothing_was`` (accepted, retried)."""
    box = inbox(config)
    if not handover.serving(box):
        raise ApiError(
            503, "no_controller", f"no controller is serving the inbox; nothing was {nothing_was}",
            headers={"Retry-After": RETRY_AFTER},
        )  # fmt: skip
    return box


def hand_over(config: Config, area: Area, job: str, text: str, uploads: bool) -> Path:
    """The owner record, then the job file in the inbox (never replacing one), both durable on return
    (one filesystem flush shared with the requests written meanwhile); undone on failure. The job
    file, to ``settle`` once the request's slot is committed."""
    placed, undo = place(config, area, job, text, uploads)
    try:
        commit.durable(config.data_root)  # the 202 is sent only after this
    except BaseException:
        undo()
        raise
    return placed


def settle(placed: Path) -> None:
    """Let `serve` take a job file the API placed at once: dated back by the settle time that a file
    written in place needs (controller/serve/inbox.py), since this one is whole (placed by a link)
    and durable. Only then: until flushed, a young file is never claimed, so ``undo`` stays safe."""
    then = time.time() - SETTLE_SECONDS
    with contextlib.suppress(OSError):  # not dated back: it settles in a second, as any file does
        os.utime(placed, (then, then), follow_symlinks=False)


def place(config: Config, area: Area, job: str, text: str, uploads: bool) -> tuple[Path, Callable[[], None]]:
    """The owner record, then the job file in the inbox (never replacing one), not yet flushed; the
    file and what takes both back (until flushed, the file is younger than serve's settle time: not
    claimed)."""
    box = served_inbox(config, "accepted")
    area.write_record(job, uploads, hashlib.sha256(text.encode("utf-8")).hexdigest(), durable=False)
    try:
        placed = handover.place(box, f"{job}.yaml", text)
    except BaseException:
        area.remove_record(job)
        raise

    def undo() -> None:
        placed.unlink(missing_ok=True)
        area.remove_record(job)

    return placed, undo


def accept_json(config: Config, area: Area, job: str, text: str, slot: quota.Reservation) -> Staged[Accepted]:
    """The checked job handed over in its reserved ``slot``, not yet durable (controller/api/intake.py):
    the slot is committed once it is; on failure nothing of it is left and the slot is given back."""
    try:
        slot.bind(job)  # before the inbox: the job's end (which may come at once) finds its slot
        placed, undo = place(config, area, job, text, uploads=False)
    except BaseException:
        slot.release()
        raise

    def kept() -> None:
        slot.commit()
        settle(placed)

    def taken_back() -> None:
        undo()
        slot.release()

    return Staged(Accepted(job), keep=kept, undo=taken_back)


__all__ = ["Accepted", "accept_json", "hand_over", "inbox", "place", "served_inbox", "settle"]
