"""Slow work in a bounded pool of its own, shared fairly between tenants.

Globs over a large area, receiving and unpacking uploads, thumbnails and results.zip can each hold a
thread for seconds. Run on the threads that answer quick reads (status, lists, events), one tenant's
burst of them would leave every other tenant's ``GET`` waiting behind it. So slow steps run here
instead: one ``ThreadPoolExecutor`` of ``api.slow_threads`` threads used by nothing else, of which
one tenant holds at most ``api.slow_threads_per_tenant`` at once. A tenant's further slow steps
wait in its own queue without holding any thread (an ``asyncio.Semaphore`` per tenant), and the
requests waiting there still count against its ``quota.requests_in_flight``, so the queue is bounded
by that quota: beyond it the tenant gets 429 at the door (controller/api/fairness.py). The quick
steps of every request stay on the event loop's default executor (controller/api/app.py).

Because one tenant may hold fewer threads than the pool has, another tenant's slow step finds a
free thread, or waits at most for one step of someone else's to end, never behind the whole
queue of a tenant flooding. Like the fairness limits, the pool is per API process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class SlowWork:
    """The slow pool of one API process; ``lane(tenant)`` is where that tenant's slow steps run."""

    def __init__(self, threads: int, per_tenant: int) -> None:
        if not 1 <= per_tenant <= threads:
            raise ValueError(f"per_tenant must be 1..{threads}, got {per_tenant}")
        self.threads = threads
        self.per_tenant = per_tenant
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="api-slow")
        self._lanes: dict[str, Lane] = {}

    def lane(self, tenant: str) -> Lane:
        lane = self._lanes.get(tenant)
        if lane is None:
            lane = self._lanes[tenant] = Lane(self._pool, self.per_tenant)
        return lane

    def close(self) -> None:
        """No new slow steps; those running end on their own (the threads are not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class Lane:
    """One tenant's share of the slow pool: ``running`` steps on a thread, ``waiting`` for one."""

    def __init__(self, pool: ThreadPoolExecutor, size: int) -> None:
        self._pool = pool
        self._slots: asyncio.Semaphore | None = None  # made on first use, in the serving loop
        self._size = size
        self.running = 0
        self.waiting = 0

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a slow thread once this tenant has a slot free. A step cannot
        be stopped on its thread: when the request is cancelled meanwhile, this returns (raising the
        cancellation) only once the step has ended, so the caller's clean-up (closing the files the
        step writes to) never races it, and the tenant never holds more than its share of threads."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._size)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            step = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
            try:
                return await asyncio.shield(step)
            except asyncio.CancelledError:
                while not step.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([step])
                raise
        finally:
            self.running -= 1
            self._slots.release()

    async def pieces(self, source: Iterator[bytes]) -> AsyncIterator[bytes]:
        """``source`` (a blocking iterator: a download built while it is sent) drawn one piece at a
        time on a slow thread, so two of this tenant's downloads share its slots piece by piece."""
        while (piece := await self.run(_next, source)) is not None:
            yield piece


def _next(source: Iterator[bytes]) -> bytes | None:
    return next(source, None)


__all__ = ["Lane", "SlowWork"]
