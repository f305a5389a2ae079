"""A tenant's job that `serve` refuses before it has a run folder still tells its webhook.

The API hands a job over with a 202 and leaves the expensive checks to `serve`; one that fails them
ends in ``inbox/failed/`` with a reason, and the API shows it as ``phase: refused``. Its webhook gets
``job.finished`` with ``outcome: failed`` and that reason (the event type receivers already take for
every end; ``webhook_events`` filters it as such). It is queued before the file is moved to failed/,
under a stable id (controller/run/outbox.py), so a `serve` killed in between refuses the file again
after its restart and finds the delivery it already made: the end is announced once.

The job's ``on_complete`` is read on its own from the claimed bytes (the rest of the file may be
what was refused); the tenant is the one whose owner record names those very bytes, so a CLI job or
a file dropped by anyone else announces nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from contract.layout import TENANTS
from controller import log
from controller.config import Config
from controller.errors import FfswarmError
from controller.job import owners
from controller.redact import printable
from controller.run import status, webhooks
from controller.run.rundir import RunDir
from controller.serve.inbox import original_name
from controller.serve.jobs import job_owner
from controller.volume import read_nofollow

MAX_REASON = 4096  # as the API shows a refusal's reason (controller/api/views.py)


def announce(config: Config, claimed: Path, reason: str | None) -> None:
    """``job.finished`` (refused) queued for the job in ``claimed`` when it is a tenant's and has no
    run folder; a job with one announces its own end (controller/run/usecase.py). Never raises."""
    job = os.path.splitext(original_name(claimed.name))[0]
    try:
        if RunDir(config.data_root, job).exists():
            return
        tenant = job_owner(config, claimed)
        if tenant is None:
            return
        raw = read_nofollow(claimed, config.policy.limits.job_file + 1)
        on_complete = webhooks.on_complete_of(raw) if raw is not None else None
        if on_complete is None or not webhooks.wanted(on_complete, webhooks.FINISHED):
            return
        trusted = owners.trusted_uids(config.controller_ids()[0], None)
        rec = owners.read_record(config.data_root, tenant, job, trusted)
        if rec is None:
            return
        data = refused_status(job, tenant, rec.created, reason or "", claimed)
        webhooks.ended_before_running(config, job, tenant, on_complete, webhooks.FINISHED, data)
    except (OSError, FfswarmError) as e:  # the refusal itself goes on: only the announcement is lost
        log.get(job=job).warning("webhook_not_queued", type=webhooks.FINISHED, error=type(e).__name__)


def refused_status(job: str, tenant: str, created: float, reason: str, claimed: Path) -> dict[str, object]:
    """The status object the API will show once the file is in failed/ (``phase: refused``)."""
    shown = reason.replace(f"running/{claimed.name}", f"failed/{original_name(claimed.name)}")
    shown = shown.replace(f"{TENANTS}/{tenant}/", "")
    shown = (printable(shown.rstrip(), newlines=True) + "\n")[:MAX_REASON]  # as the reason file holds it
    return {
        "job": job,
        "phase": "refused",
        "outcome": "failed",
        "reason": shown,
        "owner": tenant,
        "created_at": status.utc(created),
        "started_at": None,
        "finished_at": status.utc(time.time()),
    }
