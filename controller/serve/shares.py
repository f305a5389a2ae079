"""GPU slots shared between the jobs `serve` runs at once, by tenant weight, within each tenant's quota.

A tenant with a 10,000-photo job must not starve one with 10 photos. Every job `serve` runs that
reserves GPUs joins one ``ShareBook``; each round its supervisor asks how many chunks it may have
running (``Share.limit``), telling the book how many it has and how many it still wants. The book
answers from one allocation of the swarm's GPUs over all jobs that want any:

- GPUs go one chunk at a time to the tenant with the least GPUs per unit of weight (ties: the tenant
  whose job arrived first), never beyond what its jobs still want or its ``quota.gpus``; inside a
  tenant, to its job with the fewest (ties: the earliest). The result is weighted max-min fair in
  whole chunks, and work-conserving: what one tenant does not want goes to the others.
- A job starts a chunk only while it is below its share *and* a GPU is free now (the swarm's GPUs
  less what every job of the book holds), so a newcomer's chunk never waits as a pending service
  behind another tenant's running ones, eating its schedule timeout; it starts as they end.
  Running chunks are never stopped for a newcomer: shares move as chunks end.
- Jobs of the command line (no tenant) share as one tenant of weight 1 without a quota.

The book lives in the one `serve` process; jobs run by other controllers are not in it (their
services simply take GPUs first). ``running`` counts a job's live chunk services, pending
ones included; a job's answer is reserved at once so that two jobs asking in the same instant
cannot both take the last GPU.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

CLI = ""  # the share key of jobs without a tenant


@dataclass
class _Job:
    tenant: str
    weight: int
    cap: int | None  # the tenant's quota.gpus (None: no cap of its own)
    gpus: int  # per chunk
    order: int  # arrival: ties go to the earlier job
    want: int = 0  # chunks it would run at once if it could (running + queued, ≤ its own max)
    running: int = 0  # chunk services it holds (reported each round, reserved on answer)


class ShareBook:
    """The allocation over every job of one `serve`. ``total``: the GPUs the swarm advertises on
    usable nodes (asked at most every ``refresh`` seconds by the caller's own caching; None when
    unknown: then only quotas limit)."""

    def __init__(self, total: Callable[[], int | None]) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._arrivals = itertools.count()
        self.freed = 0  # moves whenever a job leaves or reports fewer chunks running than it held

    def join(self, job: str, tenant: str | None, weight: int, cap: int | None, gpus: int) -> Share:
        with self._lock:
            self._jobs[job] = _Job(tenant or CLI, max(1, weight), cap, gpus, next(self._arrivals))
        return Share(self, job)

    def leave(self, job: str) -> None:
        with self._lock:
            if self._jobs.pop(job, None) is not None:
                self.freed += 1

    def limit(self, job: str, asked: int, want: int, running: int) -> int:
        """How many chunks ``job`` may have running now (its own ``asked`` maximum included)."""
        total = self.total()
        with self._lock:
            me = self._jobs.get(job)
            if me is None:
                return asked
            me.want = min(asked, want)
            if running < me.running:
                self.freed += 1
            me.running = running
            if total is None:  # the swarm's size unknown: quotas alone
                answer = me.want
            else:
                shares = allocate(self._jobs, total)
                held = sum(j.running * j.gpus for j in self._jobs.values())
                free = max(total - held, 0)
                answer = min(shares.get(job, 0), running + free // me.gpus)
            if me.cap is not None:  # the quota holds whatever the shares were a moment ago
                answer = min(answer, self._cap_left(me) // me.gpus)
            answer = max(min(answer, asked), 0)
            me.running = max(running, answer)  # reserved until the job's next report
            return answer

    def _cap_left(self, me: _Job) -> int:
        assert me.cap is not None
        others = sum(j.running * j.gpus for k, j in self._jobs.items() if j.tenant == me.tenant and j is not me)
        return max(me.cap - others, 0)

    def shares(self) -> dict[str, int]:
        """Each job's share in chunks, as the book would answer now (for status and tests)."""
        total = self.total()
        with self._lock:
            return allocate(self._jobs, total if total is not None else 0)


def allocate(jobs: dict[str, _Job], total: int) -> dict[str, int]:
    """Whole chunks per job: weighted max-min fair between tenants (least GPUs per weight first),
    fewest-first between a tenant's jobs, within quotas, wants and ``total`` GPUs."""
    got = {k: 0 for k in jobs}
    tenant_gpus: dict[str, int] = {}
    weight: dict[str, int] = {}
    first: dict[str, int] = {}
    cap: dict[str, int | None] = {}
    for j in jobs.values():
        tenant_gpus.setdefault(j.tenant, 0)
        weight[j.tenant] = max(weight.get(j.tenant, 0), j.weight)
        first[j.tenant] = min(first.get(j.tenant, j.order), j.order)
        cap[j.tenant] = j.cap
    left = total
    while True:
        best: tuple[float, int, str] | None = None
        for t in tenant_gpus:
            pick = _next_job(jobs, got, t, left, tenant_gpus[t], cap[t])
            if pick is None:
                continue
            key = (tenant_gpus[t] / weight[t], first[t], t)
            if best is None or key < best:
                best = key
        if best is None:
            return got
        t = best[2]
        k = _next_job(jobs, got, t, left, tenant_gpus[t], cap[t])
        assert k is not None
        got[k] += 1
        tenant_gpus[t] += jobs[k].gpus
        left -= jobs[k].gpus


def _next_job(
    jobs: dict[str, _Job], got: dict[str, int], tenant: str, left: int, used: int, cap: int | None
) -> str | None:
    """The tenant's job that gets its next chunk: wanting more, fitting what is left and the quota;
    the one with the fewest chunks, then the earliest."""
    fits = [
        k
        for k, j in jobs.items()
        if j.tenant == tenant and got[k] < j.want and j.gpus <= left and (cap is None or used + j.gpus <= cap)
    ]
    return min(fits, key=lambda k: (got[k], jobs[k].order)) if fits else None


@dataclass(frozen=True)
class Share:
    """One job's seat in the book: what its supervisor asks each round."""

    book: ShareBook
    job: str

    def limit(self, asked: int, want: int, running: int) -> int:
        return self.book.limit(self.job, asked, want, running)

    def leave(self) -> None:
        self.book.leave(self.job)

    def freed(self) -> int:
        return self.book.freed
