"""`ffswarm status` and `ffswarm logs`: read-only views of run folders (any manager can answer)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from contract.layout import RUNS, RunLayout
from controller.config import Config
from controller.errors import UsageError
from controller.run import join
from controller.run.rundir import RunDir


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
    plan = rundir.plan()
    items: Counter[str] = Counter()  # what the user submitted: images, and videos once joined
    first = last = 0.0
    kinds = {i.id: i.kind for i in plan.items}
    segments_done = images_done = 0
    for chunk in plan.chunks:
        for r in rundir.latest_results(chunk.id).values():
            first = min(first or r.started, r.started)
            last = max(last, r.finished)
            if kinds.get(r.item) == "segment":
                segments_done += 1
            else:
                items[r.status.value] += 1
                images_done += 1
    joined = join.joins(rundir)
    for v in plan.videos:
        if v.error:
            items["error"] += 1
        elif v.id in joined:
            items[joined[v.id].status.value] += 1
    total = sum(1 for i in plan.items if i.kind != "segment") + len(plan.videos)
    done = sum(items.values())
    state = rundir.state() or {"chunks": {}}
    chunks = state["chunks"]
    by_state = Counter(c["state"] for c in chunks.values())
    attempts = sum(len(c["attempts"]) for c in chunks.values())
    nodes = sorted({a["node"] for c in chunks.values() for a in c["attempts"] if a.get("node")})
    report = rundir.report()
    control = rundir.control()
    if control.cancel:
        phase = "cancelled"
    elif report is not None and done == total:
        phase = "finished"
    elif report is not None:
        phase = "stopped"
    else:
        phase = "running"
    eta = None
    work_done = images_done + segments_done  # ETA from work items: images and video segments
    if phase == "running" and work_done > 0 and last > first:
        eta = round(max(len(plan.items) - work_done, 0) * (last - first) / work_done)
    return {
        "job": rundir.job,
        "phase": phase,
        "items": {
            "total": total,
            "ok": items["ok"],
            "no_face": items["no_face"],
            "failed": items["error"],
            "pending": total - done,
        },
        "segments": {"total": len(plan.items) - (total - len(plan.videos)), "done": segments_done},
        "chunks": {"total": len(plan.chunks), **dict(by_state)},
        "attempts": attempts,
        "nodes": nodes,
        "max_concurrent": control.max_concurrent,
        "eta_seconds": eta,
    }


def describe(row: dict[str, Any]) -> str:
    i, c = row["items"], row["chunks"]
    states = ", ".join(f"{v} {k}" for k, v in c.items() if k != "total") or "none started"
    eta = f" · ETA {row['eta_seconds']}s" if row["eta_seconds"] is not None else ""
    seg = row["segments"]
    segs = f" · video segments {seg['done']}/{seg['total']}" if seg["total"] else ""
    return (
        f"{row['job']}: {row['phase']} · items {i['ok'] + i['no_face']}/{i['total']} done, {i['failed']} failed, "
        f"{i['pending']} pending{segs} · chunks: {states} (of {c['total']}) · {row['attempts']} attempts on "
        f"{len(row['nodes'])} node(s) · max_concurrent {row['max_concurrent']}{eta}"
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
