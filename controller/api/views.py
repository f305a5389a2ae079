"""What a tenant reads about its jobs: status, report, events, cancel;
and whether the API can serve at all (/readyz).

All of it comes from the run folder and the inbox (the API keeps no state): a job not yet claimed
by `serve` is ``queued``; one `serve` refused is ``refused`` with its reason. results.zip is
controller/api/results.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from contract.layout import RECORDS, TENANTS, DataRootLayout
from contract.paths import user_text
from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.config import Config
from controller.errors import FfswarmError
from controller.run import control, handover, history, status, usage
from controller.run.fold import Fold
from controller.run.rundir import RunDir, read_nofollow

MAX_REASON = 4096
EVENT_INTERVAL = 0.5  # progress at most every 500 ms


def job_view(config: Config, area: Area, job: str) -> dict[str, Any]:
    return _with_outcome(_job_view(config, area, job), RunDir(config.data_root, job))


def _job_view(config: Config, area: Area, job: str) -> dict[str, Any]:
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job)
    if rundir.exists():
        try:
            row = status.job_status(rundir)
        except FfswarmError:
            row = {"job": job, "phase": "unreadable"}
        if os.path.lexists(DataRootLayout.host(config.data_root).inbox / f"{job}.yaml"):  # handed back by POST …/retry
            row = {**row, "phase": "queued"}
        return {**row, "owner": area.tenant, "created": rec.created, "usage": usage.of_rundir(rundir)}
    box = DataRootLayout.host(config.data_root).inbox
    reason = read_nofollow(box / "failed" / f"{job}.yaml.reason.txt", MAX_REASON)
    if reason is not None or os.path.lexists(box / "failed" / f"{job}.yaml"):
        text = (reason or b"").decode("utf-8", "replace").replace(area.rel + "/", "")
        return {"job": job, "phase": "refused", "reason": text, "owner": area.tenant, "created": rec.created}
    phase = "cancelled" if rec.cancelled else "queued"
    return {"job": job, "phase": phase, "owner": area.tenant, "created": rec.created}


def _utc(t: object) -> str | None:
    ok = isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t < 32_503_680_000
    return datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ok else None  # type: ignore[arg-type]


def _with_outcome(row: dict[str, Any], rundir: RunDir) -> dict[str, Any]:
    """A stand-in for controller/run/status.py's ``outcome_of`` and the status times: ``outcome``
    (null until the end) and ``created_at``, ``started_at``, ``finished_at`` from the record and the
    report."""
    phase, items = row["phase"], row.get("items") or {}
    outcome = None
    if phase == "finished":
        ended_well = items.get("ok", 0) + items.get("no_face", 0)
        outcome = "succeeded" if not items.get("failed") else "partial" if ended_well else "failed"
    elif phase in ("refused", "cancelled"):
        outcome = "failed" if phase == "refused" else "cancelled"
    try:
        report = rundir.report() if rundir.exists() else None
    except FfswarmError:
        report = None
    ended = phase in ("finished", "cancelled", "refused")
    return {
        **row,
        "outcome": outcome,
        "created_at": _utc(row.get("created")),
        "started_at": _utc((report or {}).get("started")),
        "finished_at": _utc((report or {}).get("finished")) if ended else None,
    }


def list_jobs(config: Config, area: Area, limit: int, cursor: str | None) -> dict[str, Any]:
    """The tenant's jobs as status objects, newest first (a stand-in: every job is read per page)."""
    rows = []
    for job in area.jobs():
        try:
            rows.append(job_view(config, area, job))
        except ApiError:  # taken over by another tenant's run folder: not the caller's
            continue
    rows.sort(key=lambda r: (-float(r.get("created") or 0), r["job"]))
    ids = [r["job"] for r in rows]
    start = ids.index(cursor) + 1 if cursor in ids else 0
    page = rows[start : start + limit]
    return {"jobs": page, "next_cursor": page[-1]["job"] if start + limit < len(rows) else None}


def report(config: Config, area: Area, job: str) -> dict[str, Any]:
    if area.owns(job) is None:
        raise not_found(job)
    data = RunDir(config.data_root, job).report()
    if data is None:
        raise ApiError(404, "no_report", f"job {job!r} has no report yet")
    return data


def cancel(config: Config, area: Area, job: str) -> dict[str, Any]:
    """A queued job is taken out of the inbox; a running one is flagged (its controller stops it)."""
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job, None, config.controller_ids())
    if rundir.exists():
        try:  # a retry serve has not claimed yet is withdrawn: the job stays as it had finished
            os.unlink(DataRootLayout.host(config.data_root).inbox / f"{job}.yaml")
            return {"job": job, "cancelled": True}
        except FileNotFoundError:
            pass
        if status.finished(rundir):
            raise ApiError(409, "finished", f"job {job!r} already finished: nothing to cancel")
        control.flag_cancel(rundir)
        return {"job": job, "cancelled": True}
    try:
        os.unlink(DataRootLayout.host(config.data_root).inbox / f"{job}.yaml")
    except FileNotFoundError:
        raise ApiError(409, "not_cancellable", f"job {job!r} is being started; try again in a moment") from None
    area.mark_cancelled(job)
    return {"job": job, "cancelled": True}


def _reason(config: Config, area: Area, text: str) -> str:
    """A reason as the report words it for the tenant: paths relative to its area, none of this host's."""
    return user_text(text, str(config.data_root)).replace(area.rel + "/", "")[:MAX_REASON]


def _chunk_event(
    config: Config, area: Area, cid: str, rec: dict[str, Any], fold: Fold, items: tuple[str, ...]
) -> dict[str, Any] | None:
    """One chunk as a ``chunk`` event says it; None while it waits for its first attempt."""
    atts = rec["attempts"]
    last = atts[-1] if atts else None
    state, reason = rec["state"], rec["reason"]
    if state == "queued":  # queued again after an attempt that failed: waiting for its retry
        if last is None or last.get("outcome") in ("running", "done", None):
            return None
        state, reason = "retrying", last.get("reason")
    elif state == "running":  # placed on a node once its task is scheduled
        state = "running" if last is not None and last.get("node") else "started"
    elif state == "unknown":  # a runner's attempt record with no ending yet (a rendered stack's chunk)
        state = "running"
    event: dict[str, Any] = {"chunk": cid, "state": state, "attempt": last["attempt"] if last else 0}
    if state in ("done", "failed", "cancelled"):  # an item with no result: as the report counts it
        unended = "cancelled" if state == "cancelled" else "error"
        ended = Counter(r.status.value if r is not None else unended for r in (fold.result(i) for i in items))
        event["items"] = {"total": len(items), "ok": ended["ok"], "no_face": ended["no_face"],
                          "failed": ended["error"], "cancelled": ended["cancelled"]}  # fmt: skip
    if reason and state in ("failed", "retrying", "cancelled"):
        event["reason"] = _reason(config, area, reason)
    return event


def chunk_states(config: Config, area: Area, job: str) -> dict[str, dict[str, Any]]:
    """Every chunk of the job that has left the queue, as its ``chunk`` event says it: from
    state.json as `status` reads it (controller/run/history.py, every run's records), and for a
    chunk no controller recorded there, the report's record of it (a packed job's one chunk,
    whose pack ran it: it shows only at the end)."""
    rundir = RunDir(config.data_root, job)
    if not rundir.exists():
        return {}
    plan = rundir.plan()
    fold = Fold.read(plan, rundir)
    records = history.whole(rundir, fold)
    reported = (rundir.report() or {}).get("chunks")
    for cid, raw in (reported if isinstance(reported, dict) else {}).items():
        rec = history.clean(raw)
        if isinstance(cid, str) and cid not in records and rec is not None:
            records[cid] = rec
    out = {}
    for chunk in plan.chunks:
        rec = records.get(chunk.id)
        event = _chunk_event(config, area, chunk.id, rec, fold, chunk.items) if rec is not None else None
        if event is not None:
            out[chunk.id] = event
    return out


def _stamp(path: os.PathLike[str]) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _look(config: Config, area: Area, job: str, before: object) -> tuple[dict[str, Any], object, Any]:
    """The job's status row; its chunks again only when the row or state.json changed since ``before``
    (None: unchanged, or unreadable now)."""
    row = job_view(config, area, job)
    mark = (json.dumps(row, sort_keys=True), _stamp(RunDir(config.data_root, job).layout.state))
    if mark == before:
        return row, mark, None
    try:
        return row, mark, chunk_states(config, area, job)
    except FfswarmError:  # a run-folder file being replaced or odd: looked at again next time
        return row, None, None


def _sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, sort_keys=True)}\n\n".encode()


async def events(config: Config, area: Area, job: str, poll: float = EVENT_INTERVAL) -> AsyncIterator[bytes]:
    """Server-sent events, looked at every 500 ms: ``chunk`` for each chunk whose state changed (on
    connecting, every chunk that has left the queue, as it is), ``progress`` when the status changed,
    then ``end``."""
    last = None
    mark: object = None
    seen: dict[str, dict[str, Any]] = {}
    while True:
        row, mark, chunks = await asyncio.to_thread(_look, config, area, job, mark)
        for cid, event in (chunks or {}).items():
            if seen.get(cid) != event:
                seen[cid] = event
                yield _sse("chunk", event)
        text = json.dumps(row, sort_keys=True)
        if text != last:
            last = text
            yield f"event: progress\ndata: {text}\n\n".encode()
        if row["phase"] in ("finished", "cancelled", "refused", "stopped"):
            yield _sse("end", {"job": job, "phase": row["phase"]})
            return
        await asyncio.sleep(poll)


# --- readiness ----------------------------------------------------------------------------------
def _records_problem(config: Config, rel: str) -> str | None:
    """Why the API's own record folder ``rel`` (under the data root) is not usable, as
    controller/api/area.py ensure() would refuse it: "" when it is missing but can be made."""
    path = config.data_root / rel
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "" if os.access(path.parent, os.W_OK | os.X_OK) else f"{rel} is missing and cannot be made"
    except OSError:
        return f"{rel} cannot be read"
    if not stat.S_ISDIR(st.st_mode):
        return f"{rel} is not a folder"
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        return f"{rel} is not the API's own (owner or mode)"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{rel} is not writable by the API"
    return None


def readiness(config: Config, signing_key: bytes | None) -> list[str]:
    """Why this replica cannot serve now (empty: it can): the data root, the API's record folders,
    the signing key, a live `serve` to hand jobs to. Short, and no path outside the data root."""
    try:
        reachable = stat.S_ISDIR(os.stat(config.data_root).st_mode)
    except OSError:
        reachable = False
    if not reachable:
        return ["the data root cannot be reached"]
    reasons = []
    for rel in (TENANTS, f"{TENANTS}/{RECORDS}"):
        problem = _records_problem(config, rel)
        if problem is not None:  # missing (made on first use) or bad: what lies below says nothing more
            reasons += [problem] if problem else []
            break
    else:
        for tenant in sorted(config.tenants):
            problem = _records_problem(config, f"{TENANTS}/{RECORDS}/{tenant}")
            reasons += [problem] if problem else []
    if config.api.signing_key_file is not None and not signing_key:
        reasons.append("the signing key was not read")
    if not handover.serving(DataRootLayout.host(config.data_root).inbox):
        reasons.append("no controller is serving the inbox (no live `ffswarm serve` heartbeat)")
    return reasons
