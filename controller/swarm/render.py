"""Stack files for `docker stack deploy`, rendered with jinja2 from the same data as the SDK path.

Ops teams deploy checked-in compose files; ffswarm must produce the SAME services either way. So a
runner stack is rendered from `ServiceSpec.as_dict()` (controller/swarm/servicespec.py), the value
that controller/swarm/docker.py turns into API calls, never from a second description of a chunk
service. The controller stack (`ffswarm serve` as a Swarm service, and with tenants `ffswarm api`
beside it) is rendered from the config's VolumeSpec so the controller sees the data volume exactly as
runners do. Pure: no Docker, no disk writes.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from controller.swarm.servicespec import WHOLE_ROOT, ServiceSpec, VolumeSpec

RUNNER_TEMPLATE = "runner.yml.j2"
CONTROLLER_TEMPLATE = "controller.yml.j2"
LOG_DRIVER = "json-file"  # what controller/swarm/docker.py create_service sets; the stack must match
VOLUME_KEY = "data"
CONTROLLER_ENTRYPOINT = ("/opt/ffswarm/bin/ffswarm",)
CONTAINER_CONFIG_PATH = "/etc/ffswarm/config.yaml"
DEFAULT_METRICS_PORT = 9108
DEFAULT_API_PORT = 8080  # published by the stack; the API listens on API_PORT inside its containers
DEFAULT_API_REPLICAS = 2
API_PORT = 8080
SECRETS_DIR = "/run/secrets"
DEFAULT_STACK = "ffs"  # short: stack deploy names services STACK_NAME, and Swarm allows 63 characters
MAX_SERVICE_NAME = 63
_SERVICE_NAME = re.compile(r"[a-z0-9-]+")
_SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def template_dirs() -> list[Path]:
    """stacks/ of a checkout, else the copy `pip install` puts under <prefix>/share/ffswarm/stacks."""
    return [Path(__file__).resolve().parents[2] / "stacks", Path(sys.prefix) / "share" / "ffswarm" / "stacks"]


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty field
        autoescape=False,
        keep_trailing_newline=True,
    )
    # JSON is YAML: every value is written as a JSON literal, so none can change the file's structure.
    env.filters["q"] = lambda value: json.dumps(value, sort_keys=True)
    env.filters["network_key"] = lambda name: "net_" + str(name).replace("-", "_")
    return env


def render_runner_stack(specs: Sequence[ServiceSpec], attempt: int = 1, stack: str = DEFAULT_STACK) -> str:
    """One job's chunk services (all sharing one data volume) as a version 3.9 compose file.

    `stack` is the name the file tells operators to deploy it under; checked here because Swarm
    refuses a `STACK_SERVICE` name over 63 characters only at deploy time, one service in.
    """
    if not specs:
        raise ValueError("nothing to render: the job has no pending chunks")
    longest = max(len(s.name) for s in specs) + len(stack) + 1
    if longest > MAX_SERVICE_NAME:
        raise ValueError(
            f"stack {stack!r}: service names would be {longest} characters and Swarm allows "
            f"{MAX_SERVICE_NAME}; use a stack name of at most {MAX_SERVICE_NAME - longest + len(stack)} characters"
        )
    for s in specs:  # ids come back from a run folder anyone with volume access can write
        if not _SERVICE_NAME.fullmatch(s.name):
            raise ValueError(f"refusing to render a service named {s.name!r}: names are a-z, 0-9 and - only")
    volumes = {s.volume.name for s in specs}  # the name is a hash of the options
    jobs = {s.labels.get("io.ffswarm.job", "") for s in specs}
    if len(volumes) != 1 or len(jobs) != 1:
        raise ValueError("a runner stack holds the chunks of one job, which share one data volume")
    volume = specs[0].volume
    mounts, extra = _narrowed_mounts(specs)
    return (
        _env()
        .get_template(RUNNER_TEMPLATE)
        .render(
            job=jobs.pop(),
            stack=stack,
            attempt=attempt,
            services=[s.as_dict() for s in specs],
            networks=sorted({n for s in specs for n in (s.networks or ("bridge",))}),
            volume=_volume_dict(volume),
            volume_key=VOLUME_KEY,
            mounts=mounts,
            extra_volumes=extra,
            log_driver=LOG_DRIVER,
        )
    )


def _narrowed_mounts(specs: Sequence[ServiceSpec]) -> tuple[dict[str, list[dict[str, object]]], dict[str, object]]:
    """A tenant's services see only some folders of the data root (servicespec.tenant_mounts): per
    service, its mounts as compose entries (a bind volume's folders as binds, an NFS volume's as
    volumes of their own over the export's sub-paths), and those volumes. Services that see the
    whole root are left out: they mount the one data volume."""
    mounts: dict[str, list[dict[str, object]]] = {}
    volumes: dict[str, object] = {}
    for spec in specs:
        if spec.data_mounts == WHOLE_ROOT:
            continue
        entries: list[dict[str, object]] = []
        for m in spec.data_mounts:
            entry: dict[str, object] = {"target": m.target, "read_only": not m.writable}
            if spec.volume.is_bind:
                entry.update(type="bind", source=spec.volume.device_of(m.rel))
            else:
                sub = spec.volume.sub(m.rel)
                key = f"{VOLUME_KEY}-{sub.name.removeprefix('ffswarm-data-')}"
                volumes[key] = _volume_dict(sub)
                entry.update(type="volume", source=key)
            entries.append(entry)
        mounts[spec.name] = entries
    return mounts, volumes


def _volume_dict(volume: VolumeSpec) -> dict[str, object]:
    return {"name": volume.name, "driver": volume.driver, "options": dict(volume.driver_options)}


@dataclass(frozen=True)
class ApiService:
    """`ffswarm api` replicas in the controller stack: what differs from the controller service.

    ``secrets``: names of external Swarm secrets (``docker secret create NAME FILE`` beforehand), each
    mounted at /run/secrets/NAME, readable by ``user`` alone: the config's key files must name them
    there (``api_secrets``)."""

    user: tuple[int, int]  # never root: the API has no business with the Docker socket or root's files
    publish_port: int = DEFAULT_API_PORT
    replicas: int = DEFAULT_API_REPLICAS
    secrets: tuple[str, ...] = ()
    memory: str = "512M"
    pids: int = 256

    def __post_init__(self) -> None:
        if 0 in self.user:
            raise ValueError("the api service never runs as root (uid or gid 0): set controller_user")
        if not 0 < self.publish_port < 65536:
            raise ValueError(f"api publish port out of range: {self.publish_port}")
        if self.replicas < 1:
            raise ValueError("api replicas must be at least 1")
        for name in self.secrets:
            if not _SECRET_NAME.fullmatch(name):
                raise ValueError(f"secret name {name!r}: letters, digits, _ . - only")

    def command(self) -> list[str]:
        return [*CONTROLLER_ENTRYPOINT, "--json-logs", "--config", CONTAINER_CONFIG_PATH, "api",
                "--listen", f"0.0.0.0:{API_PORT}"]  # fmt: skip

    def healthcheck(self) -> list[str]:
        probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{API_PORT}/healthz', timeout=3)"
        return ["CMD", str(Path(CONTROLLER_ENTRYPOINT[0]).with_name("python")), "-c", probe]


def api_secrets(key_files: Sequence[Path]) -> tuple[str, ...]:
    """The Swarm secrets that carry the API's key files: each must be ``/run/secrets/NAME`` in the
    config, since the config travels to the containers as it is (ValueError naming the fix if not)."""
    names = []
    for path in key_files:
        if str(path.parent) != SECRETS_DIR or not _SECRET_NAME.fullmatch(path.name):
            raise ValueError(
                f"{path}: in the controller stack serve and the API read their key files as Swarm secrets: name them "
                f"{SECRETS_DIR}/NAME in the config and create each with `docker secret create NAME FILE`"
            )
        names.append(path.name)
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class ControllerStack:
    """What the controller service needs; the config file itself travels as a Swarm config."""

    image: str
    config_file: Path  # the ffswarm.yaml the controller reads (path as seen by `docker stack deploy`)
    config_text: str  # its content: the Swarm config's name carries its hash (configs are immutable)
    data_root: str  # where the controller mounts the data volume: the config's data_root
    volume: VolumeSpec
    concurrent_jobs: int = 1
    metrics_port: int = DEFAULT_METRICS_PORT
    docker_socket: str = "/var/run/docker.sock"
    inbox: str | None = None  # default: <data_root>/inbox
    api: ApiService | None = None  # the config has tenants: `ffswarm api` beside `serve`
    # Swarm secrets `serve` reads (webhook signing keys, the link key for webhooks, object-store
    # credentials), mounted at /run/secrets/NAME for root alone: ``api_secrets`` of its key files.
    secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.concurrent_jobs < 1:
            raise ValueError("concurrent_jobs must be at least 1")
        if not 0 < self.metrics_port < 65536:
            raise ValueError(f"metrics_port out of range: {self.metrics_port}")
        for name in self.secrets:
            if not _SECRET_NAME.fullmatch(name):
                raise ValueError(f"secret name {name!r}: letters, digits, _ . - only")

    @property
    def config_name(self) -> str:
        return "ffswarm-config-" + hashlib.sha256(self.config_text.encode()).hexdigest()[:10]

    def command(self) -> list[str]:
        inbox = ["--inbox", self.inbox] if self.inbox else []
        return [
            *CONTROLLER_ENTRYPOINT,
            "--json-logs",
            "--config",
            CONTAINER_CONFIG_PATH,
            "serve",
            "--concurrent-jobs",
            str(self.concurrent_jobs),
            "--metrics-port",
            str(self.metrics_port),
            *inbox,
        ]


def render_controller_stack(stack: ControllerStack) -> str:
    return (
        _env()
        .get_template(CONTROLLER_TEMPLATE)
        .render(
            s=stack,
            command=stack.command(),
            api=stack.api,
            api_port=API_PORT,
            config_target=CONTAINER_CONFIG_PATH,
            volume=_volume_dict(stack.volume),
            volume_key=VOLUME_KEY,
            log_driver=LOG_DRIVER,
            all_secrets=tuple(dict.fromkeys((*stack.secrets, *(stack.api.secrets if stack.api else ())))),
        )
    )
