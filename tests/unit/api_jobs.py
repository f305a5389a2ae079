"""Tenants' jobs laid on a data root as the API and `serve` leave them, for the status and list tests:
a record (and index entry) as POST /v1/jobs writes it, then a run folder whose items ended as given,
a refusal in the inbox, or a cancel before it ran."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import control
from controller.run.rundir import Control, RunDir

OK, NO_FACE, ERROR = ItemStatus.OK, ItemStatus.NO_FACE, ItemStatus.ERROR


def record(root: Path, job: str, tenant: str = "acme") -> Area:
    """The owner record (and the job's index entry), as accepting the job writes them."""
    area = Area(root, tenant)
    area.ensure(None)
    area.write_record(job, uploads=False)
    return area


def run(root: Path, job: str, ended: Sequence[ItemStatus | None], tenant: str = "acme") -> RunDir:
    """The job's run folder with one item per entry of ``ended``: a result for each status, none
    for None (still pending)."""
    out = f"tenants/{tenant}/out/{job}"
    items = tuple(
        PlannedItem(f"i{n:06d}", f"tenants/{tenant}/in/{n}.jpg", f"{out}/{n}.jpg", "image") for n in range(len(ended))
    )
    rd = RunDir(root, job)
    rd.create(b"name: x\n", Plan(job, items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(1), "sha256:x")
    now = time.time()
    lines = [
        ItemResult(item.id, status, 1, f"/data/{item.input}", None, started=now, finished=now).to_line()
        for item, status in zip(items, ended, strict=True)
        if status is not None
    ]
    (rd.path / "results" / "c0000.a1.jsonl").write_text("".join(lines))
    return rd


def report(rd: RunDir, started: float, finished: float) -> None:
    rd.write_report({"job": rd.job, "started": started, "finished": finished})


def finished(root: Path, job: str, ended: Sequence[ItemStatus], tenant: str = "acme", at: float = 0.0) -> RunDir:
    """A tenant's job whose every item ended as ``ended`` says, its report written (ended at ``at``,
    or now)."""
    record(root, job, tenant)
    rd = run(root, job, ended, tenant)
    at = at or time.time()
    report(rd, at - 5, at)
    return rd


def cancelled_running(root: Path, job: str, tenant: str = "acme") -> RunDir:
    """A job cancelled while it ran: one item ended ok, one never ran; no controller holds it."""
    record(root, job, tenant)
    rd = run(root, job, [OK, None], tenant)
    control.flag_cancel(rd)
    return rd


def refused(root: Path, job: str, reason: str, tenant: str = "acme") -> None:
    """A job `serve` refused: its inbox file in failed/ with the reason beside it."""
    record(root, job, tenant)
    failed = root / "inbox" / "failed"
    failed.mkdir(parents=True, exist_ok=True)
    (failed / f"{job}.yaml").write_text("name: x\n")
    (failed / f"{job}.yaml.reason.txt").write_text(reason)
