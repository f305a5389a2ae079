"""Slow work in bounded pools of its own, shared fairly between tenants.

Globs over a large area, receiving and unpacking uploads, thumbnails and results.zip can each take
seconds. Run on the threads that answer quick reads (status, lists, events), one tenant's burst of
them would leave every other tenant's ``GET`` waiting behind it. So slow steps run here instead, at
most ``api.slow_threads`` at once, of which one tenant holds at most ``api.slow_threads_per_tenant``.
A tenant's further slow steps wait in its own queue without holding anything (an
``asyncio.Semaphore`` per tenant), and the requests waiting there still count against its
``quota.requests_in_flight``, so the queue is bounded by that quota: beyond it the tenant gets 429
at the door (controller/api/fairness.py). The quick steps of every request stay on the event loop's
default executor (controller/api/app.py).

The steps that are mostly Python (walking a glob's folders, checking and unpacking an archive's
entries, decoding a thumbnail) run in worker processes (``Lane.run_apart``): on a thread they would
hold the interpreter's lock, and the event loop answering every other tenant would wait for it.
The workers lower their CPU priority (``os.nice``), so the API process's quick answers come first.
What is sent to them is a top-level function and plain data (a config, an area, paths, limits);
an open file or folder travels as its descriptor (``Lent``), never as a path a runner could swap.
What they raise comes back as raised there: a refusal (``ApiError``) reaches the caller unchanged.
The steps that stay on threads (``Lane.run``) need this process: the multipart parser's state across
the pieces of a body, a download's open iterator, the quota book and the staging folder's lock.

Workers start from a ``forkserver``: a clean single-threaded process that imported the steps' modules
once, so a worker starts quickly and inherits nothing of the API process — not its threads (a fork
of a threaded process can inherit a lock held by another thread), not its sockets, held lock files
or keys. ``spawn`` would be as clean, but imports everything again for every worker.

Because one tenant may hold fewer steps than the pools have, another tenant's slow step finds a
free thread or worker, or waits at most for one step of someone else's to end, never behind the
whole queue of a tenant flooding. Like the fairness limits, the pools are per API process; the
worker processes start with the app and stop with it (``start``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import reduction
from typing import Any, ParamSpec, TypeVar

from controller.api.errors import ApiError

P = ParamSpec("P")
T = TypeVar("T")
NICE = 10  # added to the workers' niceness: their steps yield the CPU to the API process's answers
PRELOAD = ["controller.api.page", "controller.api.submit"]  # the steps' modules, imported once by the forkserver


class SlowWork:
    """The slow pools of one API process; ``lane(tenant)`` is where that tenant's slow steps run."""

    def __init__(self, threads: int, per_tenant: int) -> None:
        if not 1 <= per_tenant <= threads:
            raise ValueError(f"per_tenant must be 1..{threads}, got {per_tenant}")
        self.threads = threads
        self.per_tenant = per_tenant
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="api-slow")
        self._processes: ProcessPoolExecutor | None = None
        self._lanes: dict[str, Lane] = {}

    def lane(self, tenant: str) -> Lane:
        lane = self._lanes.get(tenant)
        if lane is None:
            lane = self._lanes[tenant] = Lane(self, self.per_tenant)
        return lane

    def start(self) -> None:
        """The worker processes made ready (as the app starts): a worker starts on first need."""
        if self._processes is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            self._processes = ProcessPoolExecutor(self.threads, context, initializer=_lowered, initargs=(NICE,))

    def processes(self) -> ProcessPoolExecutor:
        if self._processes is None:
            raise RuntimeError("the slow worker processes are not started (SlowWork.start, at the app's start)")
        return self._processes

    def renew(self, broken: Executor) -> None:
        """A pool whose worker died (killed for memory, say) is replaced; the others' steps go on."""
        if self._processes is broken:
            self._processes = None
            broken.shutdown(wait=False, cancel_futures=True)
            self.start()

    def close(self) -> None:
        """No new slow steps; those running end on their own (nothing waits for them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)
            self._processes = None


class Lane:
    """One tenant's share of the slow pools: ``running`` steps, ``waiting`` for a slot."""

    def __init__(self, work: SlowWork, size: int) -> None:
        self._work = work
        self._slots: asyncio.Semaphore | None = None  # made on first use, in the serving loop
        self._size = size
        self.running = 0
        self.waiting = 0

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a slow thread once this tenant has a slot free (for steps that
        need this process's state). A step cannot be stopped: when the request is cancelled
        meanwhile, this returns (raising the cancellation) only once the step has ended, so the
        caller's clean-up (closing the files the step writes to) never races it, and the tenant
        never holds more than its share."""
        return await self._step(lambda: self._work._pool.submit(functools.partial(fn, *args, **kwargs)))

    async def run_apart(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker process once this tenant has a slot free: ``fn`` a top-level
        function, ``args`` plain data or ``Lent`` descriptors, what it returns plain data. As
        ``run``, it returns only once the step has ended. A worker that died mid-step is replaced
        and the caller told to try again (503)."""
        pool = self._work.processes()
        try:
            return await self._step(lambda: pool.submit(fn, *args))
        except BrokenProcessPool:
            self._work.renew(pool)
            raise ApiError(
                503, "busy", "a worker of this API stopped during the request; try again", headers={"Retry-After": "1"}
            ) from None

    async def _step(self, submit: Callable[[], Future[T]]) -> T:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._size)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            step = asyncio.wrap_future(submit())
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


class Lent:
    """An open descriptor lent to a worker process: the worker receives a duplicate of it (passed
    over a Unix socket), so a file or folder opened here without following links is the very one
    the worker reads or writes. The worker closes its copy (``close``); the lender keeps its own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (reduction.DupFd(self.fd),))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _received(dup: Any) -> Lent:
    return Lent(dup.detach())


def _lowered(increment: int) -> None:
    os.nice(increment)


def _next(source: Iterator[bytes]) -> bytes | None:
    return next(source, None)


__all__ = ["Lane", "Lent", "SlowWork"]
