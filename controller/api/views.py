"""What a tenant reads about its jobs: status, report, cancel; and whether the API can serve at all
(/readyz).

All of it comes from the run folder and the inbox (the API keeps no state): a job not yet claimed
by `serve` is ``queued``; one `serve` refused is ``refused`` with its reason. results.zip is
controller/api/results.py, the event stream controller/api/events.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from contract.layout import RECORDS, TENANTS, DataRootLayout
from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.config import Config
from controller.errors import FfswarmError
from controller.job.ledger import Ledger
from controller.run import control, deletion, handover, status, usage, webhooks
from controller.run.rundir import RunDir
from controller.volume import read_nofollow

MAX_REASON = 4096


def job_view(config: Config, area: Area, job: str) -> dict[str, Any]:
    """The job's status object, for every phase: its outcome once it ended, and when it was
    created (the API's record), started (its run folder made) and ended."""
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    row = _phase_row(config, area, job, rec.cancelled)
    row = {**row, "created": rec.created, "created_at": status.utc(rec.created)}
    row.setdefault("started_at", None)
    row.setdefault("finished_at", None)
    row["outcome"] = status.outcome_of(row)
    if row["outcome"] is None:  # a job queued again (POST …/retry) has not ended
        row["finished_at"] = None
    return row


def _phase_row(config: Config, area: Area, job: str, cancelled: bool) -> dict[str, Any]:
    box = DataRootLayout.host(config.data_root).inbox
    rundir = RunDir(config.data_root, job)
    if rundir.exists():
        try:
            row = status.job_status(rundir)
        except FfswarmError:
            row = {"job": job, "phase": "unreadable"}
        if os.path.lexists(box / f"{job}.yaml") or _claimed_again(box, job, row, rundir):  # POST …/retry
            row = {**row, "phase": "queued"}
            row.pop("reason", None)
        if isinstance(row.get("reason"), str):  # `serve` gave up on it: paths as the tenant knows them
            row["reason"] = row["reason"].replace(area.rel + "/", "")
        return {**row, "owner": area.tenant, "usage": usage.of_rundir(rundir)}
    reason = read_nofollow(box / "failed" / f"{job}.yaml.reason.txt", MAX_REASON)
    if reason is not None or os.path.lexists(box / "failed" / f"{job}.yaml"):
        text = (reason or b"").decode("utf-8", "replace").replace(area.rel + "/", "")
        ended = _mtime(box / "failed" / f"{job}.yaml")  # when serve refused it
        return {"job": job, "phase": "refused", "reason": text, "owner": area.tenant, "finished_at": status.utc(ended)}
    if cancelled:  # taken out of the inbox: its record was rewritten then
        ended = _mtime(area.records / f"{job}.json")
        return {"job": job, "phase": "cancelled", "owner": area.tenant, "finished_at": status.utc(ended)}
    return {"job": job, "phase": "queued", "owner": area.tenant}


def _claimed_again(box: Path, job: str, row: dict[str, Any], rundir: RunDir) -> bool:
    """A job that ended, was handed back by POST …/retry and is claimed by serve (its file in
    ``inbox/running/``, newer than its report) but not yet taken up again: it is queued, not the
    run it was (a follower such as ``ffswarm retry`` would stop at the old end)."""
    if row.get("phase") not in ("finished", "cancelled"):
        return False
    ended = _mtime(rundir.layout.report)
    claimed = re.compile(re.escape(job) + r"\.[0-9a-f]{32}\.yaml")
    try:
        with os.scandir(box / "running") as entries:
            return any(
                claimed.fullmatch(e.name) and (ended is None or e.stat(follow_symlinks=False).st_mtime > ended)
                for e in entries
            )
    except OSError:
        return False


def _mtime(path: os.PathLike[str]) -> float | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return None


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
        if status.finished(rundir):
            try:  # a retry serve has not claimed yet is withdrawn: the job stays as it had finished
                os.unlink(DataRootLayout.host(config.data_root).inbox / f"{job}.yaml")
                return {"job": job, "cancelled": True}
            except FileNotFoundError:
                raise ApiError(409, "finished", f"job {job!r} already finished: nothing to cancel") from None
        # running, or started and handed back to wait in the inbox (a full volume, no free slot): its
        # file stays for serve, which continues the job, sees the flag and ends it cancelled
        control.flag_cancel(rundir)
        return {"job": job, "cancelled": True}
    queued = DataRootLayout.host(config.data_root).inbox / f"{job}.yaml"
    handed = read_nofollow(queued, config.policy.limits.job_file + 1)  # its on_complete, before it goes
    try:
        os.unlink(queued)
    except FileNotFoundError:
        raise ApiError(409, "not_cancellable", f"job {job!r} is being started; try again in a moment") from None
    area.mark_cancelled(job)
    Ledger(config.data_root, area.tenant).job_ended(job)  # its quota slot given back now, not at a recount
    _announce_cancel(config, area, job, handed, rec.sha256)
    return {"job": job, "cancelled": True}


def _announce_cancel(config: Config, area: Area, job: str, handed: bytes | None, sha256: str | None) -> None:
    """``job.cancelled`` for a job taken out of the inbox, queued once for `serve`'s deliverer: the
    webhook of the job file the API handed over (the bytes its record names; any others are not
    trusted), its status as the API shows it now."""
    if handed is None or sha256 != hashlib.sha256(handed).hexdigest():
        return
    on_complete = webhooks.on_complete_of(handed)
    if on_complete is None or not webhooks.wanted(on_complete, webhooks.CANCELLED):
        return
    try:
        data = job_view(config, area, job)
    except ApiError:  # deleted meanwhile: nothing to tell
        return
    webhooks.ended_before_running(config, job, area.tenant, on_complete, webhooks.CANCELLED, data)


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


def delete(config: Config, area: Area, job: str) -> None:
    """The caller's finished job deleted; 404 for any other job, 409 ``not_finished`` while it is
    queued or running."""
    if area.owns(job) is None:
        raise not_found(job)
    try:
        deletion.delete_job(config, job, area.tenant)
    except deletion.NoSuchJob:
        raise not_found(job) from None
    except deletion.NotFinished as e:
        raise ApiError(409, "not_finished", str(e)) from None
