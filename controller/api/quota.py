"""A tenant's quotas (``quota.jobs_queued``, ``quota.stored``), reserved on every submit and retry.

A submit reads the tenant's counts from its quota ledger (controller/job/ledger.py) in O(1) and takes
a job slot there atomically — across threads, processes and API replicas on the same volume — before
it does anything else: two requests at the quota's edge never both get the last slot. The slot is
bound to the job's id before the job reaches the inbox, kept when it is handed over (`serve`
subtracts it when the job ends) and given back when the request is refused.

What counts as unfinished is what `serve` has not ended: the job's file is still in the inbox or in
``inbox/running/``. The fast count is recounted from the ledger's files (each checked that way, at
most the quota's worth) whenever it says "over quota" and every RECOUNT_SECONDS, so a job that ended
without its decrement (a controller killed in between, a queued job cancelled) never keeps a tenant
out. The first time (no ledger yet), the ledger is built from the tenant's records.

Stored bytes: the area is walked at most every STORED_SECONDS (by whichever request finds the walk
due, across replicas), and the bytes accepted since, plus those reserved by requests in flight, are
added from the ledger. An upload reserves every byte it will leave in the area before writing it,
through its ``Claim`` (its declared body at once, an unpacked archive as it goes), so concurrent
uploads of a tenant — in any thread, process or replica — never pass ``quota.stored`` together.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from contract.layout import RunLayout
from controller.api.area import JOB_ID, Area
from controller.api.errors import ApiError
from controller.api.slow import Lent
from controller.apiconfig import Tenant
from controller.config import Config
from controller.job.ledger import RECOUNT_SECONDS, STORED_SECONDS, Counts, Ledger, OverQuota
from controller.job.reservation import Reservation
from controller.serve.inbox import JOB_SUFFIXES, original_name

__all__ = ["BOOK", "RECOUNT_SECONDS", "STORED_SECONDS", "Claim", "QuotaBook", "Reservation", "check_quota", "reserve"]

RETRY_AFTER = "30"


@dataclass
class _View:
    ended: set[str] = field(default_factory=set)  # jobs seen ended (and not retried since)


class QuotaBook:
    """The tenants' quota ledgers as this API process uses them (thread-safe; the ledgers are on the
    volume, so every replica sees the same counts). ``clock``: wall-clock seconds, shared by replicas."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._views: dict[Path, _View] = {}

    def ledger(self, area: Area) -> Ledger:
        return Ledger(area.root, area.tenant)

    def reserve(
        self, config: Config, tenant: Tenant, area: Area, nbytes: int = 0, job: str | None = None
    ) -> Reservation:
        """A job slot (and ``nbytes``) for one request; 429 ``over_quota`` when the tenant has no slot
        left or its area is full. Release it unless the job is handed over (``with`` does that).
        One ledger transaction, two when the area's walk is due (walked between them, unlocked)."""
        ledger = self.ledger(area)
        quota = tenant.quota
        walked: tuple[int, int, float] | None = None  # (bytes, accepted when the walk began, when)
        while True:
            with ledger.transaction() as tx:
                now = self.clock()
                counts = tx.counts
                if counts is None or counts.counted_at == -math.inf:  # new or torn: built from the records
                    alive = still_queued(config, _records(area)[0])
                    counts = ledger.recount(tx, alive.intersection, now, also=alive)
                elif counts.jobs >= quota.jobs_queued or now - counts.counted_at >= RECOUNT_SECONDS:
                    counts = ledger.recount(tx, lambda js: still_queued(config, js), now)
                walk = walked is None and _walk_due(counts, now)
                if walked is not None:
                    _walk_done(counts, *walked)
                    tx.save(counts)
                elif walk:  # claimed here, walked unlocked, then back here
                    counts.walk_started = now
                    tx.save(counts)
                    since, started = counts.accepted, now
                if not walk:
                    if counts.jobs >= quota.jobs_queued:
                        raise _over_jobs(counts.jobs, quota.jobs_queued)
                    if counts.stored >= quota.stored or (nbytes and counts.stored + nbytes > quota.stored):
                        raise _over_bytes(quota.stored)
                    return ledger.reserve(tx, nbytes, job)
            walked = (area.stored_bytes(quota.stored), since, started)

    def give_back_orphans(self, config: Config, area: Area) -> bool:
        """The slots and bytes of requests killed in flight (an API replica killed mid-upload) given
        back now, by a recount, rather than at the tenant's next over-quota answer or RECOUNT_SECONDS:
        the API's minute sweep calls it for each tenant. True when it recounted."""
        ledger = self.ledger(area)
        if not ledger.orphaned():
            return False
        with ledger.transaction() as tx:
            ledger.recount(tx, lambda js: still_queued(config, js), self.clock())
        return True

    def _walked(self, ledger: Ledger, area: Area, stop_after: int) -> Counts:
        """The ledger's counts, the area walked first when its walk is due (claimed in the ledger, so
        one replica walks and the others go on with the last figure meanwhile)."""
        with ledger.transaction() as tx:
            now = self.clock()
            counts = tx.counts or Counts()
            if not _walk_due(counts, now):
                return counts
            counts.walk_started = now
            since = counts.accepted
            tx.save(counts)
        total = area.stored_bytes(stop_after)
        with ledger.transaction() as tx:
            counts = tx.counts or Counts()
            _walk_done(counts, total, since, now)
            tx.save(counts)
            return counts

    def stored(self, area: Area, stop_after: int) -> int:
        """Bytes the tenant's area holds or has promised to requests in flight (all replicas')."""
        return self._walked(self.ledger(area), area, stop_after).stored

    def add_stored(self, area: Area, n: int) -> None:
        """Bytes just put in the area (an accepted upload): counted at once, by every replica."""
        with self.ledger(area).transaction() as tx:
            counts = tx.counts or Counts()
            counts.accepted += max(n, 0)
            tx.save(counts)

    def job_ended(self, area: Area, job: str) -> bool:
        return self.ledger(area).job_ended(job)

    def unfinished(self, config: Config, area: Area, enough: int) -> int:
        """The tenant's jobs not yet ended, counted from all its records up to ``enough`` (remembering
        jobs seen ended: only a retry runs one again). Not on a submit's path: a cross-check of the
        ledger's count, by the older rule (a job ends with its done/failed file or its report)."""
        with self._lock:
            view = self._views.setdefault(area.path, _View())
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


BOOK = QuotaBook()


def _walk_due(counts: Counts, now: float) -> bool:
    return now - counts.walked_at >= STORED_SECONDS and now - counts.walk_started >= STORED_SECONDS


def _walk_done(counts: Counts, total: int, accepted_before: int, at: float) -> None:
    """The walk's figure in; bytes accepted while it walked stay counted (maybe twice until the next)."""
    counts.walked, counts.walked_at = total, at
    counts.accepted = max(counts.accepted - accepted_before, 0)


def still_queued(config: Config, jobs: Collection[str]) -> set[str]:
    """Of these jobs, those `serve` has not ended: their file in the inbox or claimed in running/.
    The inbox is looked at before and after the listing of running/, so a job being claimed or put
    back between the two is seen in one of them."""
    box = config.data_root / "inbox"

    def waiting(job: str) -> bool:
        return any(os.path.lexists(box / f"{job}{s}") for s in JOB_SUFFIXES)

    out = {j for j in jobs if waiting(j)}
    rest = set(jobs) - out
    if rest:
        try:
            running = {original_name(e.name).rsplit(".", 1)[0] for e in os.scandir(box / "running")}
        except OSError:
            running = set()
        out |= rest & running
        out |= {j for j in rest - running if waiting(j)}
    return out


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


def _over_jobs(have: int, quota: int) -> ApiError:
    return ApiError(
        429, "over_quota", f"{have} jobs are not finished; this tenant may have {quota}",
        headers={"Retry-After": RETRY_AFTER},
    )  # fmt: skip


def _over_bytes(quota: int) -> ApiError:
    return ApiError(
        429, "over_quota",
        f"the tenant's area holds {quota} bytes or more, its quota: delete finished jobs "
        "(DELETE /v1/jobs/{id}) or ask for a larger quota.stored",
        headers={"Retry-After": RETRY_AFTER},
    )  # fmt: skip


def reserve(
    config: Config, tenant: Tenant, area: Area, nbytes: int = 0, book: QuotaBook = BOOK, job: str | None = None
) -> Reservation:
    """A job slot for one request (QuotaBook.reserve), bound to the new ``job`` when its id is known;
    429 while the tenant's jobs or area are full."""
    return book.reserve(config, tenant, area, nbytes, job)


def reserve_bytes(res: Reservation, tenant: Tenant, n: int) -> None:
    """``n`` more bytes for a request in flight; 429 when they would fill the tenant's area."""
    try:
        res.reserve_bytes(n, tenant.quota.stored)
    except OverQuota:
        raise _over_bytes(tenant.quota.stored) from None


def release_bytes(res: Reservation, n: int, kept: int = 0) -> None:
    """``n`` reserved bytes given back; ``kept`` of them are now in the area."""
    res.release_bytes(n, kept)


@dataclass
class Claim:
    """A request's reservation as the steps that write its bytes add to them: a thread of the API
    (the body as it arrives) or a slow worker process (archives as they unpack), which receives the
    reservation's descriptor lent (controller/api/slow.py) and closes its copy when done.
    ``limit``: the tenant's ``quota.stored``."""

    root: Path
    tenant: str
    limit: int
    lent: Lent

    def hold(self, need: int, ahead: int = 0) -> int:
        """``need`` more bytes taken in the tenant's ledger, and up to ``ahead`` more as far as they
        fit: the bytes taken. OverQuota when ``need`` would take the tenant past ``limit``."""
        return Ledger(self.root, self.tenant).hold(self.lent.fd, need, ahead, self.limit)


def claim(res: Reservation, tenant: Tenant, area: Area) -> Claim:
    """The request's reservation ``res``, to add the bytes it writes to."""
    return Claim(area.root, tenant.name, tenant.quota.stored, Lent(res.fd))


def check_quota(config: Config, tenant: Tenant, area: Area, book: QuotaBook = BOOK) -> None:
    """429 while the tenant has as many unfinished jobs as its quota, or its area is full (a slot
    taken and given back at once: a check, not a reservation)."""
    book.reserve(config, tenant, area).release()
