"""The only module that imports docker: ffswarm's view of a Swarm, in ffswarm's own types.

Docker errors are translated here into ffswarm errors (one translation point), and Docker's task
documents are reduced to TaskState so the supervisor never reads raw API dicts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import docker
import docker.errors
import requests.exceptions
from docker import types as dt

from controller.errors import CapacityError, EngineUnavailable, FfswarmError, MissingInputError
from controller.servicespec import LABEL_JOB, ServiceSpec, service_prefix

LABEL_SERVICE_NAME = "com.docker.swarm.service.name"  # set by the engine on every task's container


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


class SwarmBackend(Protocol):
    """What the supervisor needs from a Swarm; a real one below, an in-memory one in tests."""

    def create_service(self, spec: ServiceSpec) -> str: ...
    def services(self, job: str) -> list[ServiceState]: ...
    def remove_service(self, name: str) -> None: ...
    def remove_exited_containers(self, job: str, service: str | None = None) -> int: ...
    def containers_left(self, job: str) -> int: ...
    def service_logs(self, name: str, tail: int = 40) -> str: ...
    def nodes(self) -> list[NodeState]: ...
    def events(self, job: str) -> JobEvents | None: ...


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
        backend.remove_exited_containers(job)
        if backend.containers_left(job) == 0:
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


def _ts(value: str | None) -> float:
    if not value:
        return 0.0
    # Docker gives RFC 3339 with nanoseconds: trim to microseconds for fromisoformat.
    head, _, frac = value.rstrip("Z").partition(".")
    frac = (frac[:6] if frac else "0").ljust(6, "0")
    return datetime.fromisoformat(f"{head}.{frac}+00:00").timestamp()


def _task_state(task: Mapping[str, Any]) -> TaskState:
    status = task.get("Status", {})
    cstatus = status.get("ContainerStatus", {}) or {}
    code = cstatus.get("ExitCode")
    return TaskState(
        state=str(status.get("State", "")),
        desired_state=str(task.get("DesiredState", "")),
        exit_code=int(code) if code is not None and status.get("State") in ("complete", "failed") else None,
        message=str(status.get("Err") or status.get("Message") or ""),
        node_id=task.get("NodeID") or None,
        container_id=cstatus.get("ContainerID") or None,
        created=_ts(task.get("CreatedAt")),
        updated=_ts(task.get("UpdatedAt")),
    )


# What the engine answers while it (or its swarm manager) is stopping or starting again: worth waiting
# out, unlike an API error about the request itself.
_OUTAGE_STATUS = frozenset({500, 502, 503, 504})
_OUTAGE_WORDS = ("not a swarm manager", "code = Unavailable", "code = DeadlineExceeded", "connection refused")


def _outage(e: docker.errors.APIError) -> bool:
    text = str(e.explanation or e)
    return e.status_code in _OUTAGE_STATUS and any(w in text for w in _OUTAGE_WORDS)


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """The one translation point: nothing Docker or its HTTP transport raises gets past it."""
    try:
        yield
    except docker.errors.ImageNotFound as e:
        raise MissingInputError(f"{what}: {e.explanation or e}") from e
    except docker.errors.APIError as e:
        if _outage(e):
            raise EngineUnavailable(f"{what}: the swarm is not answering: {e.explanation or e}") from e
        raise FfswarmError(f"{what}: Docker said: {e.explanation or e}") from e
    except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
        raise EngineUnavailable(f"{what}: cannot reach the Docker engine: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    """requests' connection errors nest urllib3's whole repr; the user needs its gist."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    for cause in ("No such file or directory", "Connection refused", "Connection aborted", "Read timed out"):
        if cause in text:
            return cause
    return text[:200]


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


class DockerSwarm:
    """SwarmBackend over a real dockerd (docker-py)."""

    def __init__(self, base_url: str | None = None) -> None:
        self._connect: Callable[[], docker.DockerClient] = (
            (lambda: docker.DockerClient(base_url=base_url, version="auto"))
            if base_url
            else (lambda: docker.from_env(version="auto"))
        )
        self._client = self._new_client()

    def _new_client(self) -> docker.DockerClient:
        with _translated("connecting to Docker"):
            client = self._connect()
        if client.api.base_url.startswith("http+docker://"):  # a local socket: no proxy applies
            # requests scans the environment for proxy settings on every call: ~2 ms of CPU per API
            # call here, a fifth of the controller's CPU while it watches a job.
            client.api.trust_env = False
        return client

    def events(self, job: str) -> DockerEvents | None:
        """The job's events, on a connection of their own (a stream holds its connection); None
        when the engine will not stream them — the watch then polls alone."""
        try:
            client = self._new_client()
            return DockerEvents(client, job)
        except (FfswarmError, docker.errors.DockerException, requests.exceptions.RequestException):
            return None

    @property
    def client(self) -> docker.DockerClient:
        return self._client

    def check_manager(self) -> None:
        with _translated("checking the swarm"):
            info = self._client.info()
        swarm = info.get("Swarm", {})
        if swarm.get("LocalNodeState") != "active":
            raise CapacityError(
                "this Docker engine is not part of an active swarm (run scripts/dev-swarm.sh, or `docker swarm init`)"
            )
        if not swarm.get("ControlAvailable"):
            raise CapacityError("this Docker engine is a swarm worker; run ffswarm on a manager node")

    def resolve_image(self, ref: str) -> str:
        """A tag makes every task try a registry pull (FIELD-NOTES): pin a digest, else the image ID."""
        if "@sha256:" in ref or ref.startswith("sha256:"):
            return ref
        with _translated(f"image {ref}"):
            image = self._client.images.get(ref)
        digests = image.attrs.get("RepoDigests") or []
        return str(digests[0]) if digests else str(image.id)

    def create_service(self, spec: ServiceSpec) -> str:
        mounts = [
            dt.Mount(
                target=spec.volume.target,
                source=spec.volume.name,
                type="volume",
                driver_config=dt.DriverConfig(spec.volume.driver, dict(spec.volume.driver_options)),
            )
        ]
        mounts += [
            dt.Mount(target=path, source=None, type="tmpfs", tmpfs_size=size) for path, size in spec.tmpfs.items()
        ]
        container = dt.ContainerSpec(
            image=spec.image,
            command=list(spec.command),
            env=dict(spec.env),
            labels=dict(spec.labels),
            mounts=mounts,
            user=spec.user,
            read_only=spec.read_only,
            cap_drop=list(spec.cap_drop),
        )
        template = dt.TaskTemplate(
            container_spec=container,
            resources=dt.Resources(mem_limit=spec.memory_bytes, generic_resources=dict(spec.generic_resources) or None),
            restart_policy=dt.RestartPolicy(condition=spec.restart_condition, max_attempts=0),
            placement=dt.Placement(constraints=list(spec.constraints)),
            log_driver=dt.DriverConfig("json-file", dict(spec.log_options)),
        )
        with _translated(f"creating service {spec.name}"):
            result = self._client.api.create_service(
                template, name=spec.name, labels=dict(spec.labels), mode=dt.ServiceMode("replicated", replicas=1)
            )
        return str(result["ID"])

    def services(self, job: str) -> list[ServiceState]:
        with _translated(f"listing services of job {job}"):
            # Two calls whatever the number of services: the task list filters by the labels of the
            # tasks' services. A service removed between the calls is left out (it is gone).
            raw = self._client.api.services(filters={"label": f"{LABEL_JOB}={job}"})
            tasks: dict[str, list[Mapping[str, Any]]] = {svc["ID"]: [] for svc in raw}
            if raw:
                for t in self._client.api.tasks(filters={"label": f"{LABEL_JOB}={job}"}):
                    tasks.get(t.get("ServiceID", ""), []).append(t)
            out = [
                ServiceState(
                    name=svc["Spec"]["Name"],
                    service_id=svc["ID"],
                    labels=dict(svc["Spec"].get("Labels") or {}),
                    created=_ts(svc.get("CreatedAt")),
                    tasks=tuple(_task_state(t) for t in tasks[svc["ID"]]),
                )
                for svc in raw
            ]
        return out

    def remove_service(self, name: str) -> None:
        with _translated(f"removing service {name}"), contextlib.suppress(docker.errors.NotFound):
            self._client.api.remove_service(name)

    def remove_exited_containers(self, job: str, service: str | None = None) -> int:
        """Engines before 24 can leave exited task containers behind; remove this job's on this node
        (only `service`'s when given). Callers remove the services first: a "created" container is
        removed too, which is right for a removed service's but would kill a live one's the moment it
        starts (exit 137) — so a step that ends beside its job's chunks names its own service."""
        removed = 0
        filters: dict[str, Any] = {"label": [f"{LABEL_JOB}={job}"]}
        if service:
            filters["label"].append(f"{LABEL_SERVICE_NAME}={service}")
        with _translated(f"cleaning containers of job {job}"):
            # The low-level list: the high-level one inspects each container it lists, and a container
            # the engine removes meanwhile (a removed service's) fails the whole call with 404.
            for status in ("exited", "created", "dead"):
                for c in self._client.api.containers(all=True, filters={**filters, "status": status}):
                    try:
                        self._client.api.remove_container(c["Id"], force=True)
                        removed += 1
                    except docker.errors.NotFound:
                        pass
                    except docker.errors.APIError as e:
                        if e.status_code != 409:  # 409: being removed already (`ffswarm cancel` beside us)
                            raise
        return removed

    def containers_left(self, job: str) -> int:
        """This job's containers on this node, running or not."""
        with _translated(f"listing containers of job {job}"):
            return len(self._client.api.containers(all=True, filters={"label": f"{LABEL_JOB}={job}"}))

    def service_logs(self, name: str, tail: int = 40) -> str:
        """The last lines a service's containers wrote (kept for attempts that died before logging)."""
        try:
            chunks = self._client.api.service_logs(name, stdout=True, stderr=True, tail=tail, follow=False)
            return b"".join(chunks).decode("utf-8", "replace")
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return ""

    def nodes(self) -> list[NodeState]:
        with _translated("listing nodes"):
            raw = self._client.api.nodes()
        return [
            NodeState(
                n.node_id,
                n.hostname,
                n.state or "unknown",
                n.availability or "active",
                sum(n.generic_resources.values()),
            )
            for n in map(_node_info, raw)
        ]

    def service_spec_raw(self, name: str) -> dict[str, Any]:
        """The engine's own record of a service (tests inspect what was really created)."""
        with _translated(f"inspecting service {name}"):
            return dict(self._client.api.inspect_service(name))


# -- nodes and swarm settings (ffswarm nodes, ffswarm doctor) ---------------------------------------
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
class SwarmInfo:
    active: bool
    manager: bool
    node_id: str
    heartbeat_seconds: float | None  # the dispatcher heartbeat (None: not readable from a worker)


def _node_info(raw: Mapping[str, Any]) -> NodeInfo:
    resources: dict[str, int] = {}
    for res in (raw.get("Description", {}).get("Resources", {}) or {}).get("GenericResources") or []:
        named, discrete = res.get("NamedResourceSpec"), res.get("DiscreteResourceSpec")
        if named:
            resources[named["Kind"]] = resources.get(named["Kind"], 0) + 1
        elif discrete:
            resources[discrete["Kind"]] = resources.get(discrete["Kind"], 0) + int(discrete["Value"])
    spec = raw.get("Spec", {})
    return NodeInfo(
        node_id=str(raw["ID"]),
        hostname=str(raw.get("Description", {}).get("Hostname", "")),
        role=str(spec.get("Role", "")),
        state=str(raw.get("Status", {}).get("State", "")),
        availability=str(spec.get("Availability", "")),
        labels=dict(spec.get("Labels") or {}),
        generic_resources=resources,
    )


class SwarmAdmin(DockerSwarm):
    """Node and swarm-level calls that jobs never make; kept apart from the SwarmBackend surface."""

    def swarm_info(self) -> SwarmInfo:
        with _translated("reading the swarm state"):
            swarm = self._client.info().get("Swarm", {})
            manager = bool(swarm.get("ControlAvailable"))
            heartbeat = None
            if manager:
                period = self._client.api.inspect_swarm().get("Spec", {}).get("Dispatcher", {}).get("HeartbeatPeriod")
                heartbeat = period / 1e9 if period else None
        return SwarmInfo(swarm.get("LocalNodeState") == "active", manager, str(swarm.get("NodeID", "")), heartbeat)

    def node_infos(self) -> list[NodeInfo]:
        with _translated("listing nodes"):
            return [_node_info(n) for n in self._client.api.nodes()]

    def update_node_labels(self, node: str, add: Mapping[str, str], remove: tuple[str, ...] = ()) -> NodeInfo:
        """Add/replace and remove node labels in one update (at the node's current version)."""
        with _translated(f"labelling node {node}"):
            raw = self._client.api.inspect_node(node)
            spec = dict(raw["Spec"])
            labels = {k: v for k, v in (spec.get("Labels") or {}).items() if k not in remove}
            labels.update(add)
            spec["Labels"] = labels
            self._client.api.update_node(raw["ID"], raw["Version"]["Index"], spec)
            return _node_info(self._client.api.inspect_node(raw["ID"]))

    def image_id(self, ref: str) -> str | None:
        """The local image ID of ref on this engine, None when it is absent."""
        try:
            return str(self._client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise EngineUnavailable(f"image {ref}: cannot reach the Docker engine: {_first_line(e)}") from e
