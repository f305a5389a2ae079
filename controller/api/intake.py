"""The API's intake: accepted jobs handed over in batches, on threads of their own, one flush a batch.

A JSON submit that names a few files does a few milliseconds of file work: its quota slot, the job
checked and its id taken, the owner record, the inbox file. On the event loop's shared pool each of
those requests hopped to a thread and back two or three times, and every thread trip and every
one of its system calls handed the interpreter lock between the loop and half a dozen threads —
more CPU in lock hand-offs than in the work (benchmarks/RESULTS.md, B-api). Here each request is one
trip: the loop queues its step, an intake thread takes every step queued, runs them one after
another, makes what they wrote durable with one flush (controller/api/commit.py, shared with the
other writers of this process), and wakes the loop once for the whole batch.

A step returns its writes ``Staged``: the answer it will give, what to do once they are durable
(``keep``: the quota slot committed) and how to take them back (``undo``) when the flush fails, so a
202 is never sent for a job that is not on disk and nothing of a refused request is left. A step
that raises answers its own request only; the others of the batch go on.

Few threads (``THREADS``): enough that one request waiting on a slow volume (NFS) does not hold
every other, few enough that the lock is not handed around. Each API process (``--workers``) has
its own intake; the volume's locks (quota ledger, inbox) keep them and other replicas apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from controller.api import commit

T = TypeVar("T")
THREADS = 2  # intake threads per API process
BATCH = 64  # steps at most in one batch: its requests wait for each other's work and one flush


@dataclass
class Staged(Generic[T]):
    """A request's writes done but not yet durable: ``result`` is its answer once they are."""

    result: T
    keep: Callable[[], None]  # after the flush: what the request holds committed
    undo: Callable[[], None]  # the flush failed: the writes taken back, what it holds given back

    def settle(self, data_root: Path) -> T:
        """The writes made durable alone (no intake): the result, or the flush's error once undone."""
        try:
            commit.durable(data_root)
        except BaseException:
            self.undo()
            raise
        self.keep()
        return self.result


_Item = tuple[Callable[[], Staged[Any]], asyncio.Future[Any]]
_STOP = None


class Intake:
    """The intake threads of one API process; ``run(step)`` from the event loop, between ``start``
    (in the app's lifespan, on its loop) and ``close``."""

    def __init__(
        self, data_root: Path, threads: int = THREADS, batch: int = BATCH, flush: Callable[[], None] | None = None
    ) -> None:
        self.flush = flush or functools.partial(commit.durable, data_root)  # shared with the process's other writers
        self.batch = batch
        self._count = threads
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # batches flushed (read by tests)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._work, name=f"api-intake-{n}", daemon=True) for n in range(self._count)
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Every step queued so far is run and answered; then the threads end."""
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []

    async def run(self, step: Callable[[], Staged[T]]) -> T:
        """``step()`` on an intake thread; its result once its writes are durable. Cancelling the
        caller does not stop the step (the job may still be accepted, as with any lost answer)."""
        if not self._threads:
            raise RuntimeError("the intake is not started")
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put((step, done))
        return await done

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            items = [first]
            while len(items) < self.batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    self._queue.put(_STOP)  # for this thread's next turn, after this batch
                    break
                items.append(more)
            self._deliver(self._settle(items))

    def _settle(self, items: list[_Item]) -> list[tuple[asyncio.Future[Any], Any, BaseException | None]]:
        """Each step run, the staged ones flushed together; (future, result, error) for each."""
        out: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        staged: list[tuple[asyncio.Future[Any], Staged[Any]]] = []
        for step, future in items:
            try:
                staged.append((future, step()))
            except BaseException as e:  # this request's own refusal or failure: the others go on
                out.append((future, None, e))
        if staged:
            try:
                self.flush()
                flushed: BaseException | None = None
            except BaseException as e:
                flushed = e
            for future, s in staged:
                try:
                    if flushed is None:
                        s.keep()
                        out.append((future, s.result, None))
                    else:
                        s.undo()
                        out.append((future, None, flushed))
                except BaseException as e:
                    out.append((future, None, e))
        self.batches += 1
        return out

    def _deliver(self, out: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop already closed: nobody is waiting
            self._loop.call_soon_threadsafe(_answer, out)


def _answer(out: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in out:
        if future.done():  # its request was cancelled meanwhile
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


__all__ = ["BATCH", "THREADS", "Intake", "Staged"]
