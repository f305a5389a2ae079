"""ffswarm's view of a Swarm, in its own types: what the supervisor, the identity step and doctor
need, as a protocol (SwarmBackend) with plain frozen records. controller/swarm/docker.py implements
it over a real engine, tests/fakes.py in memory; nothing here imports docker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from controller.swarm.servicespec import ServiceSpec

# Task states as the supervisor reads them (Swarm's own words).
PENDING_STATES = {"new", "pending", "allocated", "assigned"}
LOST_STATES = {"shutdown", "orphaned", "remove"}
ENDED = {"complete", "failed", "rejected", "shutdown", "orphaned"}


@dataclass(frozen=True)
class TaskState:
    """One Swarm task of a chunk service, reduced to what the supervisor decides on."""

    state: str  # new, pending, assigned, …, running, complete, failed, shutdown, rejected, orphaned
    desired_state: str
    exit_code: int | None
    message: str  # Status.Err or Status.Message: the scheduler's or the engine's own words
    node_id: str | None
    container_id: str | None
    created: float  # unix seconds
    updated: float


@dataclass(frozen=True)
class ServiceState:
    name: str
    service_id: str
    labels: Mapping[str, str]
    created: float
    tasks: tuple[TaskState, ...]

    def latest_task(self) -> TaskState | None:
        return max(self.tasks, key=lambda t: t.created) if self.tasks else None


@dataclass(frozen=True)
class NodeState:
    node_id: str
    hostname: str
    state: str  # ready | down | unknown | disconnected
    availability: str  # active | pause | drain
    gpus: int  # advertised generic resources (any kind)

    @property
    def usable(self) -> bool:
        return self.state == "ready" and self.availability == "active"


class NodeSource(Protocol):
    """What planning asks of a swarm: its nodes (a backend, or `serve`'s count kept up to date)."""

    def nodes(self) -> list[NodeState]: ...


class SwarmBackend(Protocol):
    """What the supervisor needs from a Swarm; a real one below, an in-memory one in tests."""

    def create_service(self, spec: ServiceSpec) -> str: ...
    def services(self, job: str) -> list[ServiceState]: ...
    def remove_service(self, name: str) -> None: ...
    def remove_exited_containers(self, job: str, service: str | None = None) -> int: ...  # how many are left
    def service_logs(self, name: str, tail: int = 40) -> str: ...
    def nodes(self) -> list[NodeState]: ...
    def events(self, job: str) -> JobEvents | None: ...
    def resolve_image(self, ref: str) -> str: ...
    def image_encoders(self, ref: str) -> frozenset[str] | None:
        """The video encoders the image's ffmpeg has (its io.ffswarm.encoders label); None: it does not say."""
        ...


def clear_containers(
    backend: SwarmBackend,
    job: str,
    wait: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = 0.05,
) -> bool:
    """Remove the job's exited containers on this engine until none of its containers is left or
    `wait` has passed: the swarm removes a removed service's container itself a moment later, and a
    stopped runner takes its grace period. True when none is left."""
    deadline = clock() + wait
    while True:
        if backend.remove_exited_containers(job) == 0:
            return True
        if clock() >= deadline:
            return False
        sleep(poll)


class JobEvents(Protocol):
    """What happened to a job on the swarm since the watch last looked, pushed rather than polled."""

    @property
    def alive(self) -> bool: ...  # still receiving (False: the watch polls as if there were none)
    def wait(self, timeout: float) -> bool: ...  # True as soon as something happened, else after timeout
    def exit_code(self, service: str) -> int | None: ...  # how its container exited (on this engine)
    def nodes_changed(self) -> bool: ...  # a node changed since the last call
    def close(self) -> None: ...


@dataclass(frozen=True)
class NodeInfo:
    """A Swarm node as `ffswarm nodes` and `doctor` see it."""

    node_id: str
    hostname: str
    role: str  # manager | worker
    state: str  # ready | down | unknown …
    availability: str  # active | pause | drain
    labels: Mapping[str, str]
    generic_resources: Mapping[str, int]  # kind -> how many this node's dockerd advertises


@dataclass(frozen=True)
class ImageInfo:
    """A local image as `doctor` shows it: what nodes must run, how big a pull it is, what is in it."""

    image_id: str
    size_bytes: int
    labels: Mapping[str, str]  # io.ffswarm.sbom.sha256: the SBOM's digest (scripts/build-runner-image.sh)


@dataclass(frozen=True)
class EndedContainer:
    """A job's container that has exited on this engine (``ffswarm nodes sweep``): its short ID, name,
    job and when it finished (epoch seconds)."""

    container_id: str
    name: str
    job: str
    finished_at: float


@dataclass(frozen=True)
class SwarmInfo:
    active: bool
    manager: bool
    node_id: str
    heartbeat_seconds: float | None  # the dispatcher heartbeat (None: not readable from a worker)
