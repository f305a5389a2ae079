"""Watchers that sample the swarm in a background thread while a test drives a job."""

from __future__ import annotations

import threading
from typing import Any


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
