"""``tenants.<t>.retention``: `serve` deletes a tenant's jobs that finished longer ago than that.

Looked at from the serve loop, at most once every RETENTION_SECONDS: each tenant with a retention,
each of its owner records (``tenants/.jobs/<t>/<job>.json``); a job that finished (its report's mtime,
else its inbox done/failed file's; a job cancelled before it ran: its record's, rewritten when it was
cancelled) longer ago than the retention is deleted exactly as ``DELETE /v1/jobs/{id}`` deletes it
(controller/run/deletion.py). A job queued or running again (a retry) is left until it ends.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from contract.layout import DataRootLayout
from controller import log
from controller.config import Config
from controller.errors import FfswarmError
from controller.job.owners import JOB_ID
from controller.run import deletion

RETENTION_SECONDS = 60.0


class Retention:
    """The retention sweep; ``clock``: wall-clock seconds (injected in tests)."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.next = -math.inf
        self.log = log.get(component="serve")

    def tick(self) -> list[str]:
        """Delete what is past retention, unless the last sweep was under a minute ago; the jobs deleted."""
        now = self.clock()
        if now < self.next:
            return []
        self.next = now + RETENTION_SECONDS
        deleted: list[str] = []
        for name, tenant in sorted(self.config.tenants.items()):
            if tenant.retention is not None:
                deleted += self._tenant(name, now - tenant.retention)
        return deleted

    def _tenant(self, tenant: str, before: float) -> list[str]:
        records = DataRootLayout.host(self.config.data_root).records / tenant
        try:
            names = sorted(e.name for e in os.scandir(records) if e.is_file(follow_symlinks=False))
        except OSError:
            return []
        deleted = []
        for job in (n[:-5] for n in names if n.endswith(".json") and JOB_ID.fullmatch(n[:-5])):
            when = self._finished(tenant, job)
            if when is None or when >= before:
                continue
            try:
                deletion.delete_job(self.config, job, tenant)
            except deletion.NotFinished:
                continue  # handed back for a retry since
            except (FfswarmError, OSError) as e:
                self.log.warning("retention_delete_failed", tenant=tenant, job=job, error=type(e).__name__)
                continue
            self.log.info("job_deleted_by_retention", tenant=tenant, job=job)
            deleted.append(job)
        return deleted

    def _finished(self, tenant: str, job: str) -> float | None:
        when = deletion.finished_at(self.config, job)
        if when is not None:
            return when
        try:
            if deletion.phase(self.config, job, tenant) != "cancelled":
                return None
            record = DataRootLayout.host(self.config.data_root).records / tenant / f"{job}.json"
            return os.lstat(record).st_mtime
        except (FfswarmError, OSError):
            return None
