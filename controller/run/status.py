"""`ffswarm status` and `ffswarm logs`: read-only views of run folders (any manager can answer)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from contract.layout import RUNS, RunLayout
from controller.config import Config
from controller.errors import UsageError
from controller.run.fold import Fold
from controller.run.rundir import RunDir, Stage


def collect(config: Config, job: str | None) -> list[dict[str, Any]]:
    runs = config.data_root / RUNS
    if job:
        names = [job]
    else:
        names = sorted(p.name for p in runs.iterdir() if RunLayout(p).plan.is_file()) if runs.is_dir() else []
    return [job_status(RunDir(config.data_root, n)) for n in names]


def job_status(rundir: RunDir) -> dict[str, Any]:
    if not rundir.exists():
        raise UsageError(f"no job {rundir.job!r} under {rundir.path.parent}")
    fold = Fold.read(rundir.plan(), rundir)
    plan = fold.plan
    items = fold.user_counts()  # what the user submitted: images, and videos once joined
    total = fold.user_total()
    done = sum(items.values())
    segments_total, segments_done = fold.segments()
    first, last = fold.span()
    state = rundir.state() or {"chunks": {}}
    chunks = state["chunks"]
    by_state = Counter(c["state"] for c in chunks.values())
    attempts = sum(len(c["attempts"]) for c in chunks.values())
    nodes = sorted({a["node"] for c in chunks.values() for a in c["attempts"] if a.get("node")})
    stage = state.get("stage")  # recorded by the controller running the job (controller/run/usecase.py)
    control = rundir.control()
    phase = _phase(control.cancel, stage, rundir.report() is not None, done == total)
    eta = None
    work_done = len(fold.results)  # ETA from work items: images and video segments
    if phase == "running" and work_done > 0 and last > first:
        eta = round(max(len(plan.items) - work_done, 0) * (last - first) / work_done)
    return {
        "job": rundir.job,
        "phase": phase,
        "stage": stage if phase == "running" else None,
        "items": {
            "total": total,
            "ok": items["ok"],
            "no_face": items["no_face"],
            "failed": items["error"],
            "pending": total - done,
        },
        "segments": {"total": segments_total, "done": segments_done},
        "chunks": {"total": len(plan.chunks), **dict(by_state)},
        "attempts": attempts,
        "nodes": nodes,
        "max_concurrent": control.max_concurrent,
        "eta_seconds": eta,
    }


def _phase(cancelled: bool, stage: str | None, reported: bool, all_ended: bool) -> str:
    """The stage the controller recorded says whether the job runs; a run folder without one (an
    older controller's) is judged by its report, as before."""
    if cancelled:
        return "cancelled"
    if stage is not None and stage != Stage.ENDED:
        return "running"
    if reported and all_ended:
        return "finished"
    return "stopped" if reported else "running"


def describe(row: dict[str, Any]) -> str:
    i, c = row["items"], row["chunks"]
    states = ", ".join(f"{v} {k}" for k, v in c.items() if k != "total") or "none started"
    eta = f" · ETA {row['eta_seconds']}s" if row["eta_seconds"] is not None else ""
    seg = row["segments"]
    stage = f" ({row['stage']})" if row.get("stage") else ""
    segs = f" · video segments {seg['done']}/{seg['total']}" if seg["total"] else ""
    return (
        f"{row['job']}: {row['phase']}{stage} · items {i['ok'] + i['no_face']}/{i['total']} done, "
        f"{i['failed']} failed, {i['pending']} pending{segs} · chunks: {states} (of {c['total']}) · "
        f"{row['attempts']} attempts on {len(row['nodes'])} node(s) · max_concurrent {row['max_concurrent']}{eta}"
    )


def log_lines(rundir: RunDir, chunk: str | None, follow: bool, poll: float = 0.5) -> Iterator[str]:
    """Every runner log line of the job (or one chunk), file by file; with follow, keeps reading new
    lines and new attempt files until the job's report is written."""
    offsets: dict[str, int] = {}
    while True:
        for f, _ in rundir.attempt_logs(chunk):
            with f.open() as fh:
                fh.seek(offsets.get(f.name, 0))
                text = fh.read()
                offsets[f.name] = fh.tell()
            for line in text.splitlines(keepends=True):
                yield f"{f.stem}: {line}"
        if not follow or rundir.report() is not None:
            return
        time.sleep(poll)
