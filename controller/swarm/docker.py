"""The Swarm adapter: ffswarm's view of a Swarm (controller/swarm/backend.py) over docker-py.

With controller/swarm/admin.py, events.py and network.py, the only modules that import docker
(tests/unit/test_import_graph.py).
Docker errors are translated here into ffswarm errors (``translated``: one translation point), and
Docker's task documents are reduced to TaskState so the supervisor never reads raw API dicts.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker import types as dt

from controller.errors import CapacityError, ConfigError, EngineUnavailable, FfswarmError, MissingInputError
from controller.swarm import network
from controller.swarm.backend import ENDED, NodeInfo, NodeState, ServiceState, TaskState
from controller.swarm.events import LABEL_SERVICE_NAME, DockerEvents
from controller.swarm.imageref import pinned_image
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, DataMount, ServiceSpec, VolumeSpec


def engine_time(value: str | None) -> float:
    """An engine timestamp (RFC 3339 with nanoseconds) as epoch seconds; 0 for none."""
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
        created=engine_time(task.get("CreatedAt")),
        updated=engine_time(task.get("UpdatedAt")),
    )


# What the engine answers while it (or its swarm manager) is stopping or starting again: worth waiting
# out, unlike an API error about the request itself.
_OUTAGE_STATUS = frozenset({500, 502, 503, 504})
_OUTAGE_WORDS = ("not a swarm manager", "code = Unavailable", "code = DeadlineExceeded", "connection refused")


def _outage(e: docker.errors.APIError) -> bool:
    text = str(e.explanation or e)
    return e.status_code in _OUTAGE_STATUS and any(w in text for w in _OUTAGE_WORDS)


@contextmanager
def translated(what: str) -> Iterator[None]:
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
        raise EngineUnavailable(f"{what}: cannot reach the Docker engine: {first_line(e)}") from e


def first_line(e: BaseException) -> str:
    """requests' connection errors nest urllib3's whole repr; the user needs its gist."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    for cause in ("No such file or directory", "Connection refused", "Connection aborted", "Read timed out"):
        if cause in text:
            return cause
    return text[:200]


# What this process learnt of each engine (by address): the API version docker-py negotiated (later
# clients skip that request), and when it last answered as a swarm manager.
_VERSIONS: dict[str, str] = {}
_MANAGER_SEEN: dict[str, float] = {}
MANAGER_RECHECK = 10.0

ENCODERS_LABEL = "io.ffswarm.encoders"  # the runner image's video encoders (scripts/build-runner-image.sh)


class DockerSwarm:
    """SwarmBackend over a real dockerd (docker-py)."""

    def __init__(self, base_url: str | None = None) -> None:
        self._base_url = base_url
        self._engine = base_url or os.environ.get("DOCKER_HOST", "")  # its key in _VERSIONS
        self._client = self._new_client()
        self._networks: set[str] = set()  # networks known to exist (ensure_network)

    def _new_client(self) -> docker.DockerClient:
        version = _VERSIONS.get(self._engine, "auto")  # "auto" asks the engine (GET /version) first
        with translated("connecting to Docker"):
            url = self._base_url
            client = docker.DockerClient(base_url=url, version=version) if url else docker.from_env(version=version)
        _VERSIONS[self._engine] = client.api.api_version
        if client.api.base_url.startswith("http+docker://"):  # a local socket: no proxy applies
            # requests scans the environment for proxy settings on every call: a large share of the
            # controller's CPU while it watches a job.
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
        """A clear error unless the engine is a manager of an active swarm; an engine that answered so
        within MANAGER_RECHECK seconds is not asked again (serve checks before every pack)."""
        if time.monotonic() - _MANAGER_SEEN.get(self._engine, -math.inf) < MANAGER_RECHECK:
            return
        with translated("checking the swarm"):
            info = self._client.info()
        swarm = info.get("Swarm", {})
        if swarm.get("LocalNodeState") != "active":
            raise CapacityError(
                "this Docker engine is not part of an active swarm (run scripts/dev-swarm.sh, or `docker swarm init`)"
            )
        if not swarm.get("ControlAvailable"):
            raise CapacityError("this Docker engine is a swarm worker; run ffswarm on a manager node")
        _MANAGER_SEEN[self._engine] = time.monotonic()

    def resolve_image(self, ref: str) -> str:
        """A tag makes every task try a registry pull (docs/architecture.md#engine-2010-facts-the-code-relies-on): pin a
        digest, else the image ID."""
        if "@sha256:" in ref or ref.startswith("sha256:"):
            return ref
        with translated(f"image {ref}"):
            image = self._client.images.get(ref)
        return pinned_image(ref, str(image.id), image.attrs.get("RepoDigests") or [])

    def image_encoders(self, ref: str) -> frozenset[str] | None:
        """The image's ``io.ffswarm.encoders`` label (scripts/build-runner-image.sh), as a set; None when
        the image has no such label (an image built elsewhere) or is not on this manager (the GPU nodes
        pull it, a manager need not hold it): nothing is checked then."""
        with translated(f"image {ref}"):
            try:
                labels = self._client.images.get(ref).attrs.get("Config", {}).get("Labels") or {}
            except docker.errors.ImageNotFound:
                return None
        text = labels.get(ENCODERS_LABEL)
        return None if text is None else frozenset(e for e in str(text).split(",") if e)

    def ensure_network(self, name: str, image: str, user: str) -> None:
        """The runners' internal overlay network and its anchor (controller/swarm/network.py), made
        once per controller, before a job's first runner."""
        if name in self._networks:
            return
        with translated(f"making the runners' network {name}"):
            network.ensure(self._client, name, image, user)
        self._networks.add(name)

    def ensure_storage_network(self, name: str, image: str, user: str) -> None:
        """The anchor of the operator's storage network (controller/swarm/network.py), once per controller."""
        key = f"storage:{name}"
        if key in self._networks:
            return
        with translated(f"anchoring the storage network {name}"):
            network.ensure_storage(self._client, name, image, user)
        self._networks.add(key)

    def create_service(self, spec: ServiceSpec) -> str:
        container = dt.ContainerSpec(
            secrets=self.secret_references(spec) or None,
            image=spec.image,
            command=list(spec.command),
            env=dict(spec.env),
            labels=dict(spec.labels),
            mounts=service_mounts(spec),
            user=spec.user,
            read_only=spec.read_only,
            cap_drop=list(spec.cap_drop),
        )
        resources = dt.Resources(
            mem_limit=spec.memory_bytes,
            mem_reservation=spec.memory_reservation_bytes,
            cpu_limit=spec.nano_cpus,
            generic_resources=dict(spec.generic_resources) or None,
        )
        resources["Limits"]["Pids"] = spec.pids_limit  # API 1.41; docker-py's Resources has no field for it
        for net in spec.networks:
            self.ensure_network(net, spec.image, spec.user)
        for net in spec.storage_networks:
            self.ensure_storage_network(net, spec.image, spec.user)
        template = dt.TaskTemplate(
            container_spec=container,
            resources=resources,
            networks=[*spec.networks, *spec.storage_networks] or None,  # the operator's network: never made here
            restart_policy=dt.RestartPolicy(condition=spec.restart_condition, max_attempts=0),
            placement=dt.Placement(constraints=list(spec.constraints)),
            log_driver=dt.DriverConfig("json-file", dict(spec.log_options)),
        )
        with translated(f"creating service {spec.name}"):
            result = self._client.api.create_service(
                template, name=spec.name, labels=dict(spec.labels), mode=dt.ServiceMode("replicated", replicas=1)
            )
        return str(result["ID"])

    def secret_references(self, spec: ServiceSpec) -> list[dt.SecretReference]:
        """The spec's secrets by ID (the engine's), never by value: a missing one is the operator's
        to create (``docker secret create``), named with the config key."""
        if not spec.secrets:
            return []
        with translated("looking up the storage credentials secret"):
            found = {s.get("Spec", {}).get("Name"): s.get("ID") for s in self._client.api.secrets()}
        missing = [m.name for m in spec.secrets if not found.get(m.name)]
        if missing:
            raise ConfigError(
                f"the Swarm secret {missing[0]!r} (storage.s3.credentials_secret, or a tenant's "
                f"tenants.<t>.s3.credentials_secret) does not exist: create it with "
                f"`docker secret create {missing[0]} FILE` (docs/storage.md#config)"
            )
        return secret_references(spec, {m.name: str(found[m.name]) for m in spec.secrets})

    def services(self, job: str) -> list[ServiceState]:
        with translated(f"listing services of job {job}"):
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
                    created=engine_time(svc.get("CreatedAt")),
                    tasks=tuple(_task_state(t) for t in tasks[svc["ID"]]),
                )
                for svc in raw
            ]
        return out

    def role_services(self, role: str) -> list[tuple[str, dict[str, str], bool]]:
        """Every service with this role label: its name, labels, and whether all its tasks have ended
        (`serve`'s lanes: controller/run/lanes.py)."""
        label = {"label": f"{LABEL_ROLE}={role}"}
        with translated(f"listing {role} services"):
            raw = self._client.api.services(filters=label)
            if not raw:
                return []
            states: dict[str, list[str]] = {svc["ID"]: [] for svc in raw}
            for t in self._client.api.tasks(filters=label):
                states.get(t.get("ServiceID", ""), []).append(_task_state(t).state)
        return [
            (svc["Spec"]["Name"], dict(svc["Spec"].get("Labels") or {}), bool(states[svc["ID"]])
             and all(st in ENDED for st in states[svc["ID"]]))
            for svc in raw
        ]  # fmt: skip

    def remove_service(self, name: str) -> None:
        with translated(f"removing service {name}"), contextlib.suppress(docker.errors.NotFound):
            self._client.api.remove_service(name)

    def remove_exited_containers(self, job: str, service: str | None = None) -> int:
        """Engines before 24 can leave exited task containers behind; remove this job's on this node
        (only `service`'s when given) and say how many of its containers are left (running, starting,
        being removed): one listing. Callers remove the services first: a "created" container is
        removed too, which is right for a removed service's but would kill a live one's the moment it
        starts (exit 137) — so a step that ends beside its job's chunks names its own service."""
        left = 0
        filters: dict[str, Any] = {"label": [f"{LABEL_JOB}={job}"]}
        if service:
            filters["label"].append(f"{LABEL_SERVICE_NAME}={service}")
        with translated(f"cleaning containers of job {job}"):
            # The low-level list: the high-level one inspects each container it lists, and a container
            # the engine removes meanwhile (a removed service's) fails the whole call with 404.
            for c in self._client.api.containers(all=True, filters=filters):
                if c.get("State") not in ("exited", "created", "dead"):
                    left += 1
                    continue
                try:
                    self._client.api.remove_container(c["Id"], force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as e:
                    if e.status_code != 409:  # 409: being removed already (`ffswarm cancel` beside us)
                        raise
                    left += 1
        return left

    def service_logs(self, name: str, tail: int = 40) -> str:
        """The last lines a service's containers wrote (kept for attempts that died before logging)."""
        try:
            chunks = self._client.api.service_logs(name, stdout=True, stderr=True, tail=tail, follow=False)
            return b"".join(chunks).decode("utf-8", "replace")
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return ""

    def nodes(self) -> list[NodeState]:
        with translated("listing nodes"):
            raw = self._client.api.nodes()
        return [
            NodeState(
                n.node_id,
                n.hostname,
                n.state or "unknown",
                n.availability or "active",
                sum(n.generic_resources.values()),
            )
            for n in map(node_info, raw)
        ]

    def service_spec_raw(self, name: str) -> dict[str, Any]:
        """The engine's own record of a service (tests inspect what was really created)."""
        with translated(f"inspecting service {name}"):
            return dict(self._client.api.inspect_service(name))


def secret_references(spec: ServiceSpec, ids: Mapping[str, str]) -> list[dt.SecretReference]:
    """docker-py's references for the spec's secrets (``ids``: name → the engine's secret ID)."""
    return [
        dt.SecretReference(ids[m.name], m.name, filename=m.name, uid=m.uid, gid=m.gid, mode=m.mode)
        for m in spec.secrets
    ]


def node_info(raw: Mapping[str, Any]) -> NodeInfo:
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


def service_mounts(spec: ServiceSpec) -> list[dt.Mount]:
    """docker-py's mounts for the spec's container: its folders of the data root, then its tmpfs."""
    mounts = [_data_mount(spec.volume, m) for m in spec.data_mounts]
    return mounts + [
        dt.Mount(target=path, source=None, type="tmpfs", tmpfs_size=size) for path, size in spec.tmpfs.items()
    ]


def _data_mount(volume: VolumeSpec, mount: DataMount) -> dt.Mount:
    """One folder of the data root in a runner. The whole root is the volume itself; a folder of a
    bind volume is a plain bind of the host folder (no volume object per folder left behind); a
    folder of an NFS volume is a volume of its own over the export's sub-path."""
    if mount.rel == "":
        target = volume
    elif volume.is_bind:
        return dt.Mount(
            target=mount.target, source=volume.device_of(mount.rel), type="bind", read_only=not mount.writable
        )
    else:
        target = volume.sub(mount.rel)
    return dt.Mount(
        target=mount.target,
        source=target.name,
        type="volume",
        read_only=not mount.writable,
        driver_config=dt.DriverConfig(target.driver, dict(target.driver_options)),
    )
