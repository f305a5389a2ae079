"""Watchers that sample the swarm in a background thread while a test drives a job, and waiting on
another thread or process with a deadline instead of a fixed sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

PATIENCE = 30.0  # seconds: a loaded machine (CI builds an image beside the tests) may run a thread late


def until(check: Callable[[], bool], what: str, seconds: float = PATIENCE) -> None:
    """Return once ``check()`` holds; fail naming ``what`` if it does not within ``seconds``. For a
    test that waits on another thread or process: it waits only as long as that one takes."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what} after {seconds:g}s"
        time.sleep(0.01)


class Polling:
    """Context manager: calls `self.poll()` every `interval` seconds in a thread until exit."""

    interval = 0.05
    _stop: threading.Event
    _thread: threading.Thread

    def __enter__(self) -> Any:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        raise NotImplementedError


def remove_container(container: Any) -> None:
    """Teardown removal that tolerates the engine removing the same container (a removed service's
    task) at the same moment: 404 gone, 409 removal already in progress."""
    import docker.errors

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as e:
        if e.status_code != 409:
            raise
