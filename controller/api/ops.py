"""``POST /v1/jobs/{id}/scale`` and ``/retry``: `ffswarm scale` and `ffswarm retry` for a tenant's own job.

Scale, like the CLI's, writes the run folder's control.json (controller/run/control.py), which
the job's controller reads; it is capped by the cluster's ``policy.limits.max_concurrent`` and, for a
job on GPUs, by the tenant's ``quota.gpus``. A job not yet claimed by `serve` has no run folder: its
job file in the inbox is replaced by one with the new ``max_concurrent`` — taken out first (as a
queued cancel takes it out, so `serve` can never claim half of a change), then its owner record
given the new file's digest, then placed again — so the job starts at that width.

Retry hands a finished job back to `serve` the way the first hand-over did: the run folder's frozen
job file, whose bytes the owner record's ``sha256`` names, placed as ``inbox/<id>.yaml``. `serve`
continues a job whose run folder exists (controller/run/usecase.py: run → open_or_start): only
chunks with an item not committed run again, so committed items are never redone. A cancelled job's
flag is cleared first (as `ffswarm retry` does). ``tenants/.jobs/<t>/<id>.retry`` marks the job as
retried, so that the queued-jobs quota counts it until its controller is done with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from controller import yamlio
from controller.api.accept import inbox, served_inbox
from controller.api.area import Area, JobRecord
from controller.api.errors import ApiError, not_found
from controller.api.quota import reserve
from controller.apiconfig import Tenant
from controller.config import Config
from controller.errors import FfswarmError, UsageError
from controller.job.files import parse_job_text
from controller.run import control, handover, status
from controller.run.rundir import RunDir
from controller.volume import read_nofollow, write_atomic

MAX_BODY = 4096


def retry_marker(area: Area, job: str) -> Path:
    return area.records / f"{job}.retry"


def retry_waiting(config: Config, job: str) -> bool:
    """A finished job handed back for a retry whose file `serve` has not claimed yet."""
    return RunDir(config.data_root, job).exists() and os.path.lexists(inbox(config) / f"{job}.yaml")


# -- scale -----------------------------------------------------------------------------------------
def parse_scale(body: bytes) -> int:
    """``{"max_concurrent": n}``, n a whole number ≥ 1; anything else names the field."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ApiError(400, "bad_request", 'the body is not JSON; send {"max_concurrent": N}') from None
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_request", 'the body must be a JSON object like {"max_concurrent": 4}')
    for key in data:
        if key != "max_concurrent":
            raise ApiError(422, "invalid_request", "unknown field (only max_concurrent)", field=str(key)[:40])
    n = data.get("max_concurrent")
    if "max_concurrent" not in data:
        raise ApiError(422, "invalid_request", "is required", field="max_concurrent")
    if type(n) is not int or n < 1:
        raise ApiError(422, "invalid_request", "must be a whole number of at least 1", field="max_concurrent")
    return n


def _check_width(config: Config, tenant: Tenant, job: str, n: int, gpus: int) -> None:
    limit = config.policy.limits.max_concurrent
    if n > limit:
        raise ApiError(
            422, "over_limit", f"asks for {n}, the limit is {limit} (the cluster's policy.limits.max_concurrent)",
            field="max_concurrent",
        )  # fmt: skip
    quota = tenant.quota.gpus
    if gpus > 0 and quota is not None and n * gpus > quota:
        raise ApiError(
            422, "over_limit",
            f"asks for {n} chunks at once of {gpus} GPU(s) each ({n * gpus} GPUs); this tenant's quota.gpus is "
            f"{quota}, so job {job!r} may run at most {quota // gpus} at once",
            field="max_concurrent",
        )  # fmt: skip


def _gpus(text: bytes, where: str) -> int:
    try:
        return parse_job_text(text.decode("utf-8"), where).resources.gpus
    except (UnicodeDecodeError, FfswarmError):
        raise ApiError(409, "unreadable", "the job's job file cannot be read back; nothing was changed") from None


def scale(config: Config, tenant: Tenant, area: Area, job: str, n: int) -> dict[str, Any]:
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job, None, config.controller_ids())
    if rundir.exists():
        try:
            frozen = rundir.read_job_file()
            finished = status.finished(rundir) and not retry_waiting(config, job)
            rundir.control()  # readable, or nothing is changed
        except FfswarmError:
            raise ApiError(409, "unreadable", f"job {job!r}'s run folder cannot be read; nothing was changed") from None
        _check_width(config, tenant, job, n, _gpus(frozen, "job.yaml"))
        if finished:
            raise ApiError(409, "finished", f"job {job!r} already finished: nothing to scale (POST …/retry re-runs it)")
        control.set_width(rundir, n)
        return {"job": job, "max_concurrent": n}
    if rec.cancelled:
        raise ApiError(409, "finished", f"job {job!r} was cancelled: nothing to scale")
    path = inbox(config) / f"{job}.yaml"
    old = read_nofollow(path, config.policy.limits.job_file)
    if old is None:  # claimed by serve this moment, or refused by it
        raise ApiError(409, "not_started", f"job {job!r} is being started; try again in a moment",
                       headers={"Retry-After": "1"})  # fmt: skip
    if rec.sha256 != hashlib.sha256(old).hexdigest():
        raise ApiError(409, "unreadable", f"job {job!r}'s inbox file is not the one handed over; nothing was changed")
    _check_width(config, tenant, job, n, _gpus(old, f"inbox/{job}.yaml"))
    fields = yamlio.load(old.decode("utf-8"))
    text = yamlio.dump({**fields, "max_concurrent": n}, sort_keys=False, allow_unicode=True)
    parse_job_text(text, f"inbox/{job}.yaml")  # what serve will read back
    _replace_queued(config, area, job, rec, old, text)
    return {"job": job, "max_concurrent": n}


def _replace_queued(config: Config, area: Area, job: str, rec: JobRecord, old: bytes, text: str) -> None:
    """The inbox file out (only one taker wins: serve's claim, a cancel or another scale), the
    record's digest changed, the new file in; the old record and file put back if that fails."""
    box = inbox(config)
    try:
        os.unlink(box / f"{job}.yaml")
    except FileNotFoundError:
        raise ApiError(409, "not_started", f"job {job!r} is being started; try again in a moment",
                       headers={"Retry-After": "1"}) from None  # fmt: skip
    record = area.records / f"{job}.json"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    try:
        write_atomic(record, dataclasses.replace(rec, sha256=digest).to_json())
        handover.place(box, f"{job}.yaml", text)
    except BaseException:
        write_atomic(record, rec.to_json())
        handover.place(box, f"{job}.yaml", old.decode("utf-8"))
        raise


# -- retry -----------------------------------------------------------------------------------------
def retry(config: Config, tenant: Tenant, area: Area, job: str) -> dict[str, Any]:
    rec = area.owns(job)
    if rec is None:
        raise not_found(job)
    rundir = RunDir(config.data_root, job, None, config.controller_ids())
    if not rundir.exists():
        if rec.cancelled or os.path.lexists(inbox(config) / "failed" / f"{job}.yaml"):
            raise ApiError(409, "not_retryable", f"job {job!r} never started (cancelled or refused): submit it again")
        raise ApiError(409, "not_finished", f"job {job!r} is queued; it has not run yet")
    if retry_waiting(config, job):
        raise ApiError(409, "not_finished", f"job {job!r} is already queued for a retry")
    try:
        if not status.finished(rundir):
            raise ApiError(409, "not_finished", f"job {job!r} is running; retry it once it has finished")
        items = status.job_status(rundir)["items"]
        frozen = rundir.read_job_file()
    except FfswarmError:
        raise ApiError(409, "unreadable", f"job {job!r}'s run folder cannot be read; nothing was retried") from None
    todo = items["failed"] + items["cancelled"] + items["pending"]
    if todo == 0:
        raise ApiError(
            409, "nothing_to_retry",
            f"job {job!r} has no failed items: all {items['total']} are done "
            f"({items['ok']} ok, {items['no_face']} without a face)",
        )  # fmt: skip
    if rec.sha256 is None or rec.sha256 != hashlib.sha256(frozen).hexdigest():
        raise ApiError(409, "not_retryable", f"job {job!r}'s job file is not the one handed over; submit it again")
    box = served_inbox(config, "retried")
    with reserve(config, tenant, area) as slot:  # the job counts again until it ends; given back on refusal
        write_atomic(retry_marker(area, job), json.dumps({"job": job, "retried": time.time()}).encode())
        slot.bind(job)
        try:  # as `ffswarm retry`: a cancelled job's remaining items run
            control.hand_back(rundir, box, frozen)
        except UsageError:  # a second retry won the race
            raise ApiError(409, "not_finished", f"job {job!r} is already queued for a retry") from None
        slot.commit()
    base = f"/v1/jobs/{job}"
    return {"id": job, "status_url": base, "events_url": f"{base}/events", "items": todo}
