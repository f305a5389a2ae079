"""Group commit: what the API's requests wrote made durable by one filesystem flush for many requests.

A job is accepted (202) only once its owner record and its inbox file survive a crash of the machine,
not only of the API. Each request writes both without an fsync, then calls `durable(data_root)`:
one request at a time flushes the data root's filesystem (syncfs(2); os.sync where there is none), and
every request whose writes were done before that flush began is durable when it ends. Requests that
arrive while a flush runs wait for the next one, which covers all of them together, so a burst of
requests costs a few flushes instead of four fsyncs each (file and folder, record and job file).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from controller.folder import sync_filesystem


class GroupCommit:
    """Callers' writes made durable by shared flushes: `sync()` returns once a flush that began after
    the call has ended. One flush runs at a time; a failed one is retried by the next caller waiting
    (its own caller gets the error)."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
        self._cv = threading.Condition()
        self._begun = 0  # flushes started
        self._done = 0  # the latest flush that ended well
        self._busy = False
        self.waiting = 0  # callers waiting for a flush to cover them (read by tests and metrics)

    def sync(self) -> None:
        with self._cv:
            need = self._begun + 1  # the running flush may have begun before this caller's writes
            while self._done < need:
                if self._busy:
                    self.waiting += 1
                    self._cv.wait()
                    self.waiting -= 1
                    continue
                self._busy = True
                self._begun += 1
                mine = self._begun
                ok = False
                self._cv.release()
                try:
                    self._flush()
                    ok = True
                finally:
                    self._cv.acquire()
                    self._busy = False
                    if ok:
                        self._done = mine
                    self._cv.notify_all()


_COMMITS: dict[Path, GroupCommit] = {}
_LOCK = threading.Lock()


def durable(data_root: Path) -> None:
    """Everything this process wrote under ``data_root`` before the call is on disk when it returns."""
    with _LOCK:
        commit = _COMMITS.get(data_root)
        if commit is None:
            commit = _COMMITS[data_root] = GroupCommit(lambda: sync_filesystem(data_root))
    commit.sync()
