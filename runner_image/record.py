"""The attempt's record for the controller (contract/attempt.py): written when the models are loaded
and again when the attempt ends.

Written to a temporary name beside ``attempts/<chunk>.a<n>.json`` and renamed into place, so a
reader sees the earlier record or the later one, never half of one. A record that cannot be written
does not fail the chunk (its results are what count): the controller then falls back on the log.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.attempt import CONTROL_CHARS, MAX_REASON, TERMINATED, AttemptRecord
from contract.errors import RecordError
from contract.exits import RunnerExit
from contract.manifest import Manifest
from contract.paths import user_text

from .errors import Terminated
from .volume import DataRoot

PROCESS = secrets.token_hex(8)  # this runner process, in every record it writes (contract/attempt.py)


def exit_kind(code: int) -> str:
    """How the record names an exit code: its RunnerExit name, TERMINATED for anything else (SIGTERM)."""
    try:
        return RunnerExit(code).name
    except ValueError:
        return TERMINATED


class AttemptRecorder:
    """One attempt's record, kept up to date in memory and written at its two moments."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.started = clock()
        self.record: AttemptRecord | None = None  # None until the manifest says whose attempt this is
        self.path: Path | None = None

    def begin(self, root: DataRoot, manifest: Manifest, attempt: int, logger: Any) -> None:
        try:
            self.record = AttemptRecord(
                job=manifest.job, chunk=manifest.chunk, attempt=attempt, started=self.started, process=PROCESS
            )
        except RecordError as e:  # a job or chunk id no record can carry: the controller reads the log
            logger.warning("no attempt record", reason=str(e))
            return
        self.path = root.path(str(manifest.layout.attempt_record(manifest.chunk, attempt)))

    def models_loaded(self, provider: str, threads: int, cold_start_s: float | None, logger: Any) -> None:
        loaded_at = self.clock()
        self._update(logger, provider=provider, threads=threads, cold_start_s=cold_start_s, models_loaded_at=loaded_at)

    def count(self, *, done: int = 0, failed: int = 0) -> None:
        if self.record is not None:
            self.record = dataclasses.replace(
                self.record, items_done=self.record.items_done + done, items_failed=self.record.items_failed + failed
            )

    def finish(self, code: int, reason: str | None, logger: Any) -> None:
        """The attempt's ending: its exit kind and, for a failure, the reason (files named relative to
        the data root, as users know them)."""
        if reason is not None:
            reason = CONTROL_CHARS.sub(" ", user_text(reason))[:MAX_REASON]
        self._update(logger, exit=exit_kind(code), reason=reason, finished=max(self.clock(), self.started))

    def _update(self, logger: Any, **changes: Any) -> None:
        if self.record is None or self.path is None:
            return
        try:
            self.record = dataclasses.replace(self.record, **changes)
        except RecordError as e:
            logger.warning("attempt record not updated", reason=str(e))
            return
        try:
            write_atomic(self.path, self.record.to_json().encode("utf-8"))
        except (Exception, Terminated) as e:  # the record never changes how the attempt ends
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            logger.warning("attempt record not written", reason=f"{self.path}: {why}")


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
