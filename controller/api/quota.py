"""A tenant's quotas (``quota.jobs_queued``, ``quota.stored``), checked on every submit and retry.

Counted naively, each submit looked at every job the tenant ever had (four stats each) and walked
every file of its area: 68% of the API's CPU at 300 one-photo requests (py-spy, scripts/bench_small.py),
and a 50,000-selfie campaign's last request would have cost ~200,000 stats. Instead, per tenant area:

- unfinished jobs: one listing of the area's records each time; a job once seen ended is not looked
  at again unless its ``.retry`` record says it was retried (an ended job only runs again by a retry,
  controller/api/ops.py), so a check costs the listing plus a stat or four per unfinished job;
- stored bytes: the area walked at most every STORED_SECONDS, the bytes of uploads this process
  accepted meanwhile added to the last count. Several API replicas each add only their own uploads,
  so the area may pass its quota by what the others accepted within those seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contract.layout import RunLayout
from controller.api.area import JOB_ID, Area
from controller.api.errors import ApiError
from controller.api.settings import Tenant
from controller.config import Config

RETRY_AFTER = "30"
STORED_SECONDS = 5.0


@dataclass
class _View:
    ended: set[str] = field(default_factory=set)  # jobs seen ended (and not retried since)
    stored: int = 0
    stored_at: float = -float("inf")


class QuotaBook:
    """What this API process knows of each tenant area's jobs and bytes (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._views: dict[Path, _View] = {}

    def _view(self, area: Area) -> _View:
        with self._lock:
            return self._views.setdefault(area.path, _View())

    def unfinished(self, config: Config, area: Area, enough: int) -> int:
        """The tenant's jobs not yet ended, counted up to ``enough``."""
        view = self._view(area)
        jobs, retried = _records(area)
        count = 0
        with self._lock:
            view.ended &= jobs  # forget jobs whose records are gone
            known = set(view.ended) - retried
        for job in sorted(jobs - known):
            if ended(config, job, area):
                if job not in retried:
                    with self._lock:
                        view.ended.add(job)
                continue
            count += 1
            if count >= enough:  # enough said: the rest need not be looked at
                break
        return count

    def stored(self, area: Area, stop_after: int) -> int:
        view = self._view(area)
        with self._lock:
            fresh = self.clock() - view.stored_at < STORED_SECONDS
            if fresh:
                return view.stored
        total = area.stored_bytes(stop_after)
        with self._lock:
            view.stored, view.stored_at = total, self.clock()
        return total

    def add_stored(self, area: Area, n: int) -> None:
        """Bytes this process just put in the area (an accepted upload)."""
        view = self._view(area)
        with self._lock:
            view.stored += max(n, 0)


BOOK = QuotaBook()


def _records(area: Area) -> tuple[set[str], set[str]]:
    """The area's job ids, and those with a ``.retry`` record (one listing)."""
    try:
        names = [e.name for e in os.scandir(area.records) if e.is_file(follow_symlinks=False)]
    except OSError:
        return set(), set()
    jobs = {n[:-5] for n in names if n.endswith(".json") and JOB_ID.fullmatch(n[:-5])}
    retried = {n[:-6] for n in names if n.endswith(".retry")} & jobs
    return jobs, retried


def ended(config: Config, job: str, area: Area) -> bool:
    box = config.data_root / "inbox"
    if os.path.lexists(area.records / f"{job}.retry"):  # retried (controller/api/ops.py): until serve is done
        lease = RunLayout.host(config.data_root, job).lease
        return not (os.path.lexists(box / f"{job}.yaml") or os.path.lexists(lease))
    if any(os.path.lexists(box / d / f"{job}.yaml") for d in ("done", "failed")):
        return True
    # Its report exists: a stat, not a parse (reading every finished job's report made each submit
    # cost as much as all the tenant's earlier jobs: 11 of 12 s at 600 jobs, scripts/bench_api.py).
    return os.path.isfile(RunLayout.host(config.data_root, job).report)


def check_quota(config: Config, tenant: Tenant, area: Area, book: QuotaBook = BOOK) -> None:
    """429 while the tenant has as many unfinished jobs as its quota, or its area is full."""
    queued = book.unfinished(config, area, tenant.quota.jobs_queued)
    if queued >= tenant.quota.jobs_queued:
        raise ApiError(
            429, "over_quota", f"{queued} jobs are not finished; this tenant may have {tenant.quota.jobs_queued}",
            headers={"Retry-After": RETRY_AFTER},
        )  # fmt: skip
    if book.stored(area, tenant.quota.stored) >= tenant.quota.stored:
        raise ApiError(
            429, "over_quota", f"the tenant's area holds {tenant.quota.stored} bytes or more, its quota",
            headers={"Retry-After": RETRY_AFTER},
        )  # fmt: skip
