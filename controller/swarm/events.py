"""Docker's event stream for one job's watch (controller/swarm/docker.py DockerSwarm.events): part of
the Swarm adapter, with docker.py, admin.py and network.py the only modules that import docker."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import docker

from controller.swarm.servicespec import LABEL_JOB, service_prefix

LABEL_SERVICE_NAME = "com.docker.swarm.service.name"  # set by the engine on every task's container


class DockerEvents:
    """Docker's event stream, read on a thread, for one job's watch.

    Swarm (engine 20.10) has no task events, and a manager hears only about its own engine's
    containers, so the watch keeps polling the swarm — less often — and these events make it look
    at once: one of the job's containers started or died here (container events carry the task's
    labels, ``io.ffswarm.job`` among them), a node changed, or one of the job's services was removed.
    """

    def __init__(self, client: docker.DockerClient, job: str) -> None:
        self.job = job
        self._client = client
        self._woken = threading.Event()
        self._nodes = threading.Event()
        self._exits: dict[str, int] = {}  # service name -> its container's exit code
        self._prefix = service_prefix(job)
        self._stream = client.api.events(filters={"type": ["container", "node", "service"]}, decode=True)
        self._alive = True
        self._thread = threading.Thread(target=self._read, name=f"docker-events-{job}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._alive

    def _read(self) -> None:
        try:
            for event in self._stream:
                if self._note(event):
                    self._woken.set()
        except Exception:  # noqa: BLE001 - closed, or the daemon went away: the watch polls on
            pass
        finally:
            self._alive = False
            self._woken.set()

    def _note(self, event: Mapping[str, Any]) -> bool:
        kind, action = event.get("Type"), event.get("Action", "")
        attributes = (event.get("Actor") or {}).get("Attributes") or {}
        if kind == "node":
            self._nodes.set()
            return True
        if kind == "service":
            return action == "remove" and str(attributes.get("name", "")).startswith(self._prefix)
        if kind != "container" or attributes.get(LABEL_JOB) != self.job:
            return False
        if action == "die":
            code = attributes.get("exitCode", "")
            service = str(attributes.get(LABEL_SERVICE_NAME, ""))
            self._exits[service] = int(code) if str(code).lstrip("-").isdigit() else -1
            return True
        return bool(action == "start")

    def wait(self, timeout: float) -> bool:
        woken = self._woken.wait(timeout) and self._alive
        self._woken.clear()
        return woken

    def exit_code(self, service: str) -> int | None:
        return self._exits.get(service)

    def nodes_changed(self) -> bool:
        changed = self._nodes.is_set()
        self._nodes.clear()
        return changed

    def close(self) -> None:
        # Shuts the socket down, which ends the reader's loop; if the daemon closed it first,
        # docker-py finds no socket left to shut.
        with contextlib.suppress(OSError, AttributeError):
            self._stream.close()
        self._thread.join(timeout=2)
        self._client.close()
