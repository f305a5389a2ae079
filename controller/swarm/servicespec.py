"""Chunk → Swarm service spec, as plain data (pure; no Docker import).

Only controller/swarm/docker.py turns a ServiceSpec into Docker API calls, so everything a chunk
service will be — its name, labels, constraints, GPU reservation, hardening, mounts — is decided
here and can be tested as data (and rendered into stack files from the same values).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from contract.layout import RunLayout
from contract.manifest import ENV_ATTEMPT, ENV_MANIFEST
from contract.paths import CONTAINER_DATA_ROOT, container_path
from controller.job.fence import writable_outputs

LABEL_JOB = "io.ffswarm.job"
LABEL_CHUNK = "io.ffswarm.chunk"
LABEL_ATTEMPT = "io.ffswarm.attempt"
LABEL_ROLE = "io.ffswarm.role"
ROLE_RUNNER = "runner"

RUNNER_COMMAND = ("/opt/ffswarm/bin/python", "-m", "runner_image")
TMPFS_BYTES = 512 * 1024 * 1024
LOG_OPTIONS: Mapping[str, str] = MappingProxyType({"max-size": "20m", "max-file": "3"})
RUNNER_NETWORK = "ffswarm-runners"  # the `internal` overlay network (no egress) runners are on; its anchor
# service keeps node attachments still so runners never cause a node update (controller/swarm/network.py)
ANCHOR_SERVICE = "ffswarm_runners_anchor"  # "_" never appears in a job id, so no job's prefix matches it
PIDS_LIMIT = 1024  # processes and threads per container: onnxruntime's and ffmpeg's threads fit well within
RUNNER_NANO_CPUS = 2 * 10**9  # CPU limit per container unless policy.limits.cpus says otherwise


def service_prefix(job: str) -> str:
    """What the names of a job's services start with (a longer job name can share it)."""
    return f"ffswarm-{job}-"


def service_name(job: str, chunk: str, attempt: int) -> str:
    """`ffswarm-<job>-c0007-a2`: the chunk id stays, the attempt number grows."""
    return f"{service_prefix(job)}{chunk}-a{attempt}"


@dataclass(frozen=True)
class VolumeSpec:
    """How runner containers mount the shared data root at /data.

    NFS in production; here (no NFS in the kernel) the same Mount shape with the `local` driver's
    bind options. The volume name carries a hash of its options: the local driver silently reuses
    an existing volume of the same name, so changed options must mean a new name.
    """

    driver_options: Mapping[str, str]
    driver: str = "local"
    target: str = CONTAINER_DATA_ROOT

    @property
    def name(self) -> str:
        digest = hashlib.sha256(json.dumps(dict(self.driver_options), sort_keys=True).encode()).hexdigest()[:10]
        return f"ffswarm-data-{digest}"

    @classmethod
    def nfs(cls, server: str, export: str, options: str = "nfsvers=4.1,hard") -> VolumeSpec:
        if not server or not export.startswith("/"):
            raise ValueError(f"NFS volume needs a server and an absolute export, got {server!r}:{export!r}")
        opts = f"addr={server}" + (f",{options}" if options else "")
        return cls(MappingProxyType({"type": "nfs", "o": opts, "device": f":{export}"}))

    @classmethod
    def bind(cls, host_dir: str) -> VolumeSpec:
        if not host_dir.startswith("/"):
            raise ValueError(f"bind volume needs an absolute host path, got {host_dir!r}")
        return cls(MappingProxyType({"type": "none", "o": "bind", "device": host_dir}))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as plain data (a config travels to the API's worker processes: controller/api/slow.py)."""
        return (_volume_spec, (dict(self.driver_options), self.driver, self.target))

    @property
    def is_bind(self) -> bool:
        return self.driver_options.get("o") == "bind"

    def device_of(self, rel: str) -> str:
        """The device (NFS ``:/export/rel``, or the bind's host folder) of a folder ``rel`` under the root."""
        device = self.driver_options["device"].rstrip("/")
        return device if rel in ("", ".") else f"{device}/{rel}"

    def sub(self, rel: str) -> VolumeSpec:
        """The same volume narrowed to the folder ``rel`` under the root: NFS mounts the export's
        sub-path (engine 20.10 has no volume sub-path of its own), a bind binds the sub-folder."""
        return VolumeSpec(MappingProxyType({**self.driver_options, "device": self.device_of(rel)}), self.driver)


def _volume_spec(options: dict[str, str], driver: str, target: str) -> VolumeSpec:
    return VolumeSpec(MappingProxyType(options), driver, target)


@dataclass(frozen=True)
class DataMount:
    """One folder of the data root as a runner sees it: ``rel`` under the root, mounted at the same
    place under /data (so manifests' paths mean the same thing), read-only unless ``writable``.
    ``rel`` "" is the whole data root, as a CLI job's runner mounts it."""

    rel: str
    writable: bool = False

    def __post_init__(self) -> None:
        parts = self.rel.split("/") if self.rel else []
        if self.rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"a data mount is a normalised folder under the data root, got {self.rel!r}")

    @property
    def target(self) -> str:
        return container_path(self.rel)

    def as_dict(self) -> dict[str, object]:
        return {"path": self.rel or ".", "writable": self.writable}


WHOLE_ROOT = (DataMount("", writable=True),)


SECRETS_DIR = "/run/secrets"


@dataclass(frozen=True)
class SecretMount:
    """A Swarm secret the runner reads as a file, ``/run/secrets/<name>``, readable by its user only
    (mode 0400). Only the secret's name is here; its value never is (docker.py looks up its ID)."""

    name: str
    uid: str
    gid: str
    mode: int = 0o400

    @property
    def path(self) -> str:
        return f"{SECRETS_DIR}/{self.name}"

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "file": self.path, "uid": self.uid, "gid": self.gid, "mode": oct(self.mode)}


@dataclass(frozen=True)
class ServiceSpec:
    """One chunk attempt as a one-shot service: replicated × 1 with restart condition `none`.

    Why not `replicated-job`: on engine 20.10 removing a running job service does not stop its
    container, and any update reruns the job (docs/architecture.md#engine-2010-facts-the-code-relies-on).
    Replicated × 1 with no restarts runs the container once (exit 0 → task `complete`, anything
    else → `failed` with the exit code), removal stops it, and retries stay with the controller as
    new `-a<n>` services.
    """

    name: str
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    labels: Mapping[str, str]
    constraints: tuple[str, ...]
    generic_resources: Mapping[str, int]
    memory_bytes: int
    volume: VolumeSpec
    user: str
    read_only: bool = True
    cap_drop: tuple[str, ...] = ("ALL",)
    tmpfs: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({"/tmp": TMPFS_BYTES}))
    restart_condition: str = "none"
    log_options: Mapping[str, str] = field(default_factory=lambda: LOG_OPTIONS)
    memory_reservation_bytes: int = 0  # 0: the limit (the scheduler only places it where it fits)
    pids_limit: int = PIDS_LIMIT
    nano_cpus: int = RUNNER_NANO_CPUS
    networks: tuple[str, ...] = (RUNNER_NETWORK,)  # no egress: runners need no network
    # A job that uses object storage: the operator's network that reaches the store (never made by
    # ffswarm: docs/storage.md#network) and the credentials secret.
    storage_networks: tuple[str, ...] = ()
    secrets: tuple[SecretMount, ...] = ()
    # What of the data root the runner sees (a tenant's job: its area, run folder and models only).
    data_mounts: tuple[DataMount, ...] = WHOLE_ROOT

    def __post_init__(self) -> None:
        if not self.data_mounts:
            raise ValueError("a chunk service mounts at least one folder of the data root")
        if self.memory_bytes <= 0:
            raise ValueError("a chunk service needs a memory limit")
        if self.memory_reservation_bytes == 0:
            object.__setattr__(self, "memory_reservation_bytes", self.memory_bytes)
        if not 0 < self.memory_reservation_bytes <= self.memory_bytes:
            raise ValueError("a memory reservation is above zero and at most the limit")
        if self.pids_limit <= 0 or self.nano_cpus <= 0:
            raise ValueError("a chunk service needs a pids limit and a CPU limit")
        if self.restart_condition != "none":
            raise ValueError("chunk services never restart themselves; the controller retries")
        if ":" not in self.user or self.user.split(":")[0] in ("0", "root"):
            raise ValueError(f"runner must run as a non-root uid:gid, got {self.user!r}")

    def as_dict(self) -> dict[str, object]:
        """Plain data, for --dry-run output and golden tests."""
        return {
            "name": self.name,
            "image": self.image,
            "command": list(self.command),
            "env": dict(self.env),
            "labels": dict(self.labels),
            "constraints": list(self.constraints),
            "generic_resources": dict(self.generic_resources),
            "memory_bytes": self.memory_bytes,
            "volume": {
                "name": self.volume.name,
                "driver": self.volume.driver,
                "options": dict(self.volume.driver_options),
                "target": self.volume.target,
            },
            "user": self.user,
            "read_only": self.read_only,
            "cap_drop": list(self.cap_drop),
            "tmpfs": dict(self.tmpfs),
            "restart_condition": self.restart_condition,
            "log_options": dict(self.log_options),
            "memory_reservation_bytes": self.memory_reservation_bytes,
            "pids_limit": self.pids_limit,
            "nano_cpus": self.nano_cpus,
            "networks": list(self.networks),
            **({"storage_networks": list(self.storage_networks)} if self.storage_networks else {}),
            **({"secrets": [m.as_dict() for m in self.secrets]} if self.secrets else {}),
            **({"data_mounts": [m.as_dict() for m in self.data_mounts]} if self.data_mounts != WHOLE_ROOT else {}),
        }


@dataclass(frozen=True)
class RunnerSettings:
    """What every chunk service of one job shares."""

    job: str
    image: str  # resolved image ID or digest, never a bare tag
    constraints: tuple[str, ...]
    gpu_kind: str
    gpus: int
    memory_bytes: int
    volume: VolumeSpec
    user: str
    command: tuple[str, ...] = RUNNER_COMMAND
    nano_cpus: int = RUNNER_NANO_CPUS  # policy.limits.cpus
    storage_networks: tuple[str, ...] = ()  # storage.s3.network, for a job that uses s3://
    secrets: tuple[SecretMount, ...] = ()  # the job's storage keys (a tenant's own, else storage.s3's)
    data_mounts: tuple[DataMount, ...] = WHOLE_ROOT  # tenant_mounts for a tenant's job


def chunk_service(
    settings: RunnerSettings, chunk: str, attempt: int, extra_constraints: tuple[str, ...] = ()
) -> ServiceSpec:
    labels = MappingProxyType(
        {
            LABEL_JOB: settings.job,
            LABEL_CHUNK: chunk,
            LABEL_ATTEMPT: str(attempt),
            LABEL_ROLE: ROLE_RUNNER,
        }
    )
    env = MappingProxyType(
        {
            ENV_MANIFEST: str(RunLayout.container(settings.job).manifest(chunk)),
            ENV_ATTEMPT: str(attempt),
        }
    )
    resources = MappingProxyType({settings.gpu_kind: settings.gpus} if settings.gpus > 0 else {})
    return ServiceSpec(
        name=service_name(settings.job, chunk, attempt),
        image=settings.image,
        command=settings.command,
        env=env,
        labels=labels,
        constraints=settings.constraints + extra_constraints,
        generic_resources=resources,
        memory_bytes=settings.memory_bytes,
        volume=settings.volume,
        user=settings.user,
        nano_cpus=settings.nano_cpus,
        storage_networks=settings.storage_networks,
        secrets=settings.secrets,
        data_mounts=settings.data_mounts,
    )


def tenant_mounts(
    area: str, run: str, models: str, output_folders: Iterable[str], runs: str = ""
) -> tuple[DataMount, ...]:
    """What a tenant's runner sees of the data root: its ``area`` read-only, the folders its outputs
    go to (each under the area) writable, its own ``run`` folder writable, and the model pack
    ``models`` read-only — never the data root. A lane's runner is handed the tenant's later packs,
    whose run folders and output folders do not exist yet when its service is made: it sees
    ``runs``, the folder that holds every run folder of the tenant's packs and nothing else
    (``runs/.tenants/<key>``, contract/layout.py), in place of ``run``, and its caller gives as
    output folders the one folder every pack it may be handed writes under (``<area>/out``: only
    such packs go to a lane, controller/run/warmth.py lane_allowed), so the rest of its area stays
    read-only (docs/operations.md#isolation)."""
    if runs and not run.startswith(runs + "/"):
        raise ValueError(f"a lane's run folder {run!r} is outside its tenant's folder of runs {runs!r}")
    inside = [f for f in dict.fromkeys(output_folders) if f != run and not f.startswith(run + "/")]
    for f in inside:
        if f != area and not f.startswith(area + "/"):
            raise ValueError(f"a tenant's output folder {f!r} is outside its area {area!r}")
    outputs = writable_outputs(area, inside)
    own = DataMount(runs or run, writable=True)
    if area in outputs:
        return (DataMount(area, writable=True), own, DataMount(models))
    writable = tuple(DataMount(f, writable=True) for f in outputs)
    return (DataMount(area), *writable, own, DataMount(models))
