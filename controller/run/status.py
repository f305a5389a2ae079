"""`ffswarm status` and `ffswarm logs`: read-only views of run folders (any manager can answer)."""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contract.layout import DataRootLayout, RunLayout
from controller.config import Config
from controller.errors import UsageError
from controller.job.plan import ID
from controller.run import history
from controller.run import job_lease as lease
from controller.run.fold import Fold
from controller.run.rundir import RunDir, Stage
from controller.volume import UnsafePath

OUTCOMES = ("succeeded", "partial", "failed", "cancelled")


def collect(config: Config, job: str | None) -> list[dict[str, Any]]:
    if job:
        names = [job]
    else:
        names = [n for n in run_ids(config.data_root) if RunLayout.host(config.data_root, n).plan.is_file()]
    return [job_status(RunDir(config.data_root, n)) for n in names]


def run_ids(data_root: Path) -> list[str]:
    """The id of every job with a run folder (made or being made): runs/<job>/, and each tenant's
    packs' runs/.tenants/<key>/<pack>/ — only folders where their id says (contract/layout.py
    run_rel), never through a link."""
    top = DataRootLayout.host(data_root)
    folders = [top.runs] + [top.tenant_runs() / t for t in _names(top.tenant_runs()) if not t.startswith(".")]
    found = {name for folder in folders for name in _names(folder) if ID.fullmatch(name)}
    return sorted(n for n in found if top.run(n).dir.is_dir() and not top.run(n).dir.is_symlink())


def _names(folder: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def job_status(rundir: RunDir, ending: bool = False) -> dict[str, Any]:
    """The job's status object. ``ending``: its controller is ending it now (its report is written,
    its hooks run), so its report counts as its end."""
    if not rundir.exists():
        raise UsageError(f"no job {rundir.job!r} under {rundir.path.parent}")
    fold = Fold.read(rundir.plan(), rundir)
    plan = fold.plan
    items = fold.user_counts()  # what the user submitted: images, and videos once joined
    total = fold.user_total()
    segments_total, segments_done = fold.segments()
    first, last = fold.span()
    state = rundir.state() or {}
    chunks = history.whole(rundir, fold)  # every run's chunk records, not only the last run's
    by_state = Counter(c["state"] for c in chunks.values())
    attempts = sum(len(c["attempts"]) for c in chunks.values())
    nodes = sorted({a["node"] for c in chunks.values() for a in c["attempts"] if a.get("node")})
    stage = state.get("stage")  # recorded by the controller running the job (controller/run/usecase.py)
    stage = stage if isinstance(stage, str) else None
    control = rundir.control()
    holder = lease.holder(rundir)
    report = rundir.report()
    over = ending or (stage == Stage.ENDED and holder is None)
    if report is not None and over and not control.cancel:  # its report failed them: not pending
        items["error"] += failed_unrun(fold, report)
    done = sum(items.values())
    phase = _phase(control.cancel and holder is None, stage, report is not None, done == total, holder)
    cancelled = total - done if phase == "cancelled" else 0  # never to be run unless resumed
    eta = None
    work_done = len(fold.results)  # ETA from work items: images and video segments
    if phase == "running" and work_done > 0 and last > first:
        eta = round(max(len(plan.items) - work_done, 0) * (last - first) / work_done)
    row = {
        "job": rundir.job,
        "phase": phase,
        "stage": stage if phase == "running" and stage != Stage.ENDED else None,
        "items": {
            "total": total,
            "ok": items["ok"],
            "no_face": items["no_face"],
            "failed": items["error"],
            "cancelled": cancelled,
            "pending": total - done - cancelled,
        },
        "segments": {"total": segments_total, "done": segments_done},
        "chunks": {"total": len(plan.chunks), **dict(by_state)},
        "attempts": attempts,
        "nodes": nodes,
        "max_concurrent": control.max_concurrent,
        "eta_seconds": eta,
        "controller": (
            {"owner": holder.owner.label, "host": holder.owner.host, "pid": holder.owner.pid, "since": holder.since()}
            if holder is not None
            else None
        ),
    }
    reason = (report or {}).get("reason")
    if phase == "finished" and isinstance(reason, str):  # why its controller gave up on it
        row["reason"] = reason
    row["outcome"] = outcome_of(row)
    started = _stamp(rundir, rundir.layout.plan)  # plan.json is written once, as the run folder is made
    ended = None
    if row["outcome"] is not None:
        ended = _number((report or {}).get("finished"))
        if ended is None:  # cancelled before a report, or a rendered stack's chunks: the last sign of it
            ended = _stamp(rundir, rundir.layout.control) if phase == "cancelled" else last or None
    row.update(created_at=utc(started), started_at=utc(started), finished_at=utc(ended))
    return row


def failed_unrun(fold: Fold, report: Mapping[str, Any]) -> int:
    """Items without a result of their own that the job's report ended as failed: their chunk
    failed, or the controller gave up on the job. Once the job has ended they are failed, not pending."""
    entries = report.get("items")
    if not isinstance(entries, dict):
        return 0
    unrun = [i.id for i in fold.plan.items if i.kind != "segment" and fold.result(i.id) is None]
    unrun += [v.id for v in fold.plan.videos if fold.video_status(v) is None]
    return sum(1 for i in unrun if isinstance(e := entries.get(i), dict) and e.get("status") == "error")


def outcome_of(row: Mapping[str, Any]) -> str | None:
    """How a job that has ended ended, in one word (None while it has not): ``succeeded`` (no item
    failed), ``partial`` (some failed, at least one ended ok or with no face), ``failed`` (none did,
    or the job was refused), ``cancelled``. ``stopped`` is not an end: the job can be resumed."""
    phase = row.get("phase")
    if phase == "cancelled":
        return "cancelled"
    if phase == "refused":
        return "failed"
    if phase != "finished":
        return None
    items = row.get("items") or {}
    if not items.get("failed"):
        return "succeeded"
    return "partial" if items.get("ok", 0) + items.get("no_face", 0) > 0 else "failed"


def utc(t: float | None) -> str | None:
    """A unix time as RFC 3339 in UTC to the second (``2026-12-02T07:41:03Z``); None stays None."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _number(value: object) -> float | None:
    """A time read back from a file the runner's uid could write: a finite, positive number, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value) if value < 2**40 else None


def _stamp(rundir: RunDir, path: Path) -> float | None:
    """When a run-folder file was last written (its mtime, the link itself if it is one); None if gone."""
    try:
        with rundir.volume.parent(path, "read") as (dfd, name):
            return _number(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime)
    except (OSError, UnsafePath):
        return None


def _phase(cancelled: bool, stage: str | None, reported: bool, all_ended: bool, holder: lease.Record | None) -> str:
    """A job runs while a controller holds its lease (controller/run/job_lease.py); a recorded stage
    without one is a controller that stopped (Ctrl-C, killed). A run folder without a stage (an
    older controller's, or chunks run by `docker stack deploy` of a render) is finished once every
    item has ended, else judged by its report."""
    if cancelled:
        return "cancelled"
    if holder is not None:
        return "running"
    if stage is not None and stage != Stage.ENDED:
        return "stopped"
    if all_ended and (reported or stage is None):
        return "finished"
    return "stopped" if reported or stage is not None else "running"


def finished(rundir: RunDir) -> bool:
    """Whether the job's run is over: no controller runs it, and its last run ended with a report (or,
    a rendered stack's job, every item has ended). `cancel` and `scale` refuse such a job."""
    row = job_status(rundir)
    if row["phase"] == "finished":
        return True
    stage = (rundir.state() or {}).get("stage")
    return row["controller"] is None and rundir.report() is not None and stage in (None, Stage.ENDED.value)


def describe(row: dict[str, Any]) -> str:
    i, c = row["items"], row["chunks"]
    states = ", ".join(f"{v} {k}" for k, v in c.items() if k != "total") or "none started"
    eta = f" · ETA {row['eta_seconds']}s" if row["eta_seconds"] is not None else ""
    seg = row["segments"]
    segs = f" · video segments {seg['done']}/{seg['total']}" if seg["total"] else ""
    cancelled = f", {i['cancelled']} cancelled" if i.get("cancelled") else ""
    return (
        f"{row['job']}: {_phase_words(row)}{_ended_words(row)} · items {i['ok'] + i['no_face']}/{i['total']} done, "
        f"{i['failed']} failed{cancelled}, {i['pending']} pending{segs} · chunks: {states} (of {c['total']}) · "
        f"{row['attempts']} attempts on {len(row['nodes'])} node(s) · max_concurrent {row['max_concurrent']}{eta}"
    )


def _phase_words(row: dict[str, Any]) -> str:
    ctl, stage, job = row.get("controller"), row.get("stage"), row["job"]
    if row["phase"] == "running" and ctl:
        return f"running ({stage + '; ' if stage else ''}controller on {ctl['host']})"
    if row["phase"] == "running":
        return "running"  # chunks of a rendered stack: no controller watches them
    if row["phase"] == "stopped":  # items pending, or all ended but the report and hooks not done
        return f"stopped: no controller — `ffswarm resume {job}`"
    if row["phase"] == "cancelled" and row["items"]["cancelled"]:
        return f"cancelled — `ffswarm resume {job}` continues it"
    return str(row["phase"])


def _ended_words(row: Mapping[str, Any]) -> str:
    """`` — partial (ended 2026-12-02 07:41:03 UTC)`` once the job has an outcome the phase does not
    say already (a cancelled job's says it)."""
    outcome = row.get("outcome")
    if outcome is None or outcome == row["phase"]:
        return ""
    at = row.get("finished_at")
    when = f" (ended {at[:10]} {at[11:19]} UTC)" if isinstance(at, str) and len(at) == 20 else ""
    return f" — {outcome}{when}"


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
