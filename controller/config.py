"""Cluster-wide settings: one config file, never job files (docs/operations.md#config)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller import log, yamlio
from controller.apiconfig import ApiSettings, Tenant, check_tenant_storage, parse_api, parse_tenants
from controller.errors import ConfigError
from controller.policy import Policy, Webhooks, parse_policy
from controller.settings.fields import FieldError, parse_duration
from controller.settings.packing import PackingSettings, parse_packing
from controller.settings.runners import RunnersSettings, parse_runners
from controller.settings.webhooks import WebhookSettings, parse_webhook_settings
from controller.storage.settings import S3Settings, StorageSettings, parse_storage
from controller.swarm.servicespec import VolumeSpec

DEFAULT_IMAGE = "ffswarm/runner:dev"
_KEYS = {
    "data_root",
    "volume",
    "image",
    "controller_image",
    "schedule_timeout",
    "runner_user",
    "controller_user",
    "docker_host",
    "engine_outage",
    "policy",
    "api",
    "tenants",
    "packing",
    "runners",
    "storage",
    "webhooks",
}
_VOLUME_KEYS = {"type", "server", "export", "options"}


@dataclass(frozen=True)
class Config:
    path: Path
    data_root: Path  # this host's view of the shared volume
    volume: VolumeSpec  # how runner containers mount it at /data
    image: str = DEFAULT_IMAGE
    controller_image: str | None = None  # the controller stack's image (Dockerfile.controller); unset: `image`
    schedule_timeout: int = 300  # seconds a chunk may stay unschedulable
    runner_user: str | None = None  # uid:gid for runners; default: the data root's owner
    controller_user: tuple[int, int] | None = None  # owner of the run folders' controller files; default: ffswarm's uid
    docker_host: str | None = None
    engine_outage: int = 120  # seconds a running job waits for a Docker engine that stopped answering
    policy: Policy = field(default_factory=Policy)  # what a job file may ask for (controller/policy.py)
    api: ApiSettings = field(default_factory=ApiSettings)  # `ffswarm api` (controller/apiconfig.py)
    tenants: Mapping[str, Tenant] = field(default_factory=dict)  # who may use the API (docs/api.md#config)
    packing: PackingSettings = field(
        default_factory=PackingSettings
    )  # `serve` packs small jobs (controller/serve/packing.py)
    runners: RunnersSettings = field(default_factory=RunnersSettings)  # a job's chunks in warm runners (run/lanes.py)
    storage: StorageSettings = field(default_factory=StorageSettings)  # s3:// inputs and outputs (docs/storage.md)
    # ``webhooks:``: the outbox's retry schedule (controller/run/outbox.py); hosts and keys are the policy's
    webhook_delivery: WebhookSettings = field(default_factory=WebhookSettings)

    def runner_uid_gid(self) -> str:
        """Runners run as the owner of the data root (a non-root runner must be able to write it)."""
        if self.runner_user:
            return self.runner_user
        st = self.data_root.stat()
        if st.st_uid == 0:
            raise ConfigError(
                f"{self.path}: the data root {self.data_root} is owned by root and runners never run as root: "
                "chown it to the runner's uid (the image's user is 10001) or set runner_user: UID:GID"
            )
        return f"{st.st_uid}:{st.st_gid}"

    def webhooks(self, tenant: str | None) -> Webhooks:
        """Where a job's webhook may post and what signs it: the cluster's ``policy.webhooks`` for a
        CLI job (tenant None); a tenant's own ``tenants.<t>.webhooks`` for its jobs (off for a tenant
        the config no longer names), never the cluster's."""
        if tenant is None:
            return self.policy.webhooks
        found = self.tenants.get(tenant)
        return found.webhooks if found is not None else Webhooks(name=f"tenants.{tenant}.webhooks")

    def s3(self, tenant: str | None) -> S3Settings | None:
        """How a job reaches the object store: the cluster's ``storage.s3`` for a CLI job (tenant None);
        for a tenant's job, the same endpoint with the tenant's own credentials when ``tenants.<t>.s3``
        names them, the cluster's when it is the plain area URL, and None for a tenant with no area
        (or one the config no longer names): its runners get no keys at all."""
        if self.storage.s3 is None or tenant is None:
            return self.storage.s3
        found = self.tenants.get(tenant)
        area = found.s3 if found is not None else None
        return None if area is None else self.storage.s3.for_area(area)

    def tenants_on_cluster_keys(self) -> tuple[str, ...]:
        """Tenants whose area is the plain ``tenants.<t>.s3: s3://…``: their runners mount storage.s3's
        secret, keys that reach beyond their area (other tenants' objects too). Such configs still run;
        ``ffswarm doctor`` warns, and serve and api log it once at start (warn_cluster_keys)."""
        if self.storage.s3 is None:
            return ()
        return tuple(n for n, t in self.tenants.items() if t.s3 is not None and t.s3.credentials_secret is None)

    def controller_ids(self) -> tuple[int, int]:
        """Who owns what the controller keeps in a run folder (job.yaml, plan.json, chunks/, state …):
        ``controller_user``, else the uid:gid ffswarm runs as. Never the runner's: a runner must not be
        able to change what the controller acts on (docs/operations.md#controller-user)."""
        return self.controller_user or (os.geteuid(), os.getegid())


def cluster_keys_fix(tenants: Iterable[str]) -> str:
    """How each of ``tenants`` gets keys of its own (docs/storage.md#tenant-keys)."""
    keys = ", ".join(f"tenants.{t}.s3.credentials_secret" for t in tenants)
    return (
        f"give each tenant keys of its own: {keys} (tenants.<t>.s3: {{area: s3://BUCKET/PREFIX/, "
        "credentials_secret: NAME}, docker secret create NAME FILE; docs/storage.md#tenant-keys)"
    )


def warn_cluster_keys(config: Config, component: str) -> None:
    """One warning, as serve or api starts, naming the tenants whose runners get the cluster's keys."""
    tenants = config.tenants_on_cluster_keys()
    if tenants:
        log.get(component=component).warning(
            "tenant_s3_cluster_keys", tenants=list(tenants), fix=cluster_keys_fix(tenants)
        )


def _ids(path: Path, data: dict[str, Any], key: str) -> tuple[int, int] | None:
    """``key: "UID:GID"`` as integers; neither may be 0 (root)."""
    user = data.get(key)
    if user is None:
        return None
    ids = re.fullmatch(r"(\d{1,10}):(\d{1,10})", user) if isinstance(user, str) else None
    if ids is None or int(ids.group(1)) == 0 or int(ids.group(2)) == 0 or max(map(int, ids.groups())) >= 2**32 - 1:
        raise ConfigError(f"{path}: {key} must be a non-root UID:GID (neither 0), got {user!r}")
    return int(ids.group(1)), int(ids.group(2))


def user_config_file() -> Path:
    """The user's own config file: ``$XDG_CONFIG_HOME/ffswarm/config.yaml``, else
    ``~/.config/ffswarm/config.yaml`` (the XDG base directory spec: an empty or relative
    ``XDG_CONFIG_HOME`` counts as unset)."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".config"
    return base / "ffswarm" / "config.yaml"


SEARCH_ORDER = "--config, $FFSWARM_CONFIG, ./ffswarm.yaml, $XDG_CONFIG_HOME/ffswarm/config.yaml (~/.config/ffswarm/)"


def find_config(explicit: str | None) -> Path:
    """The config file: ``explicit`` (--config) alone when given, else the first that exists of
    ``$FFSWARM_CONFIG``, ``./ffswarm.yaml`` and the user's own (user_config_file)."""
    candidates = [explicit] if explicit else [os.environ.get("FFSWARM_CONFIG"), "ffswarm.yaml", str(user_config_file())]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    if explicit:
        raise ConfigError(f"config file {explicit} does not exist")
    raise ConfigError(
        f"no ffswarm config found ({SEARCH_ORDER}); scripts/dev-swarm.sh writes one for a local dev swarm"
    )


def load_config(explicit: str | None = None) -> Config:
    path = find_config(explicit)
    try:
        data = yamlio.load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping")
    return parse_config(path, data)


def _controller_image(path: Path, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: controller_image must be an image reference (e.g. ffswarm/controller:1.0)")
    return value


def parse_config(path: Path, data: dict[str, Any]) -> Config:
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    if not isinstance(data.get("data_root"), str) or not data["data_root"].startswith("/"):
        raise ConfigError(f"{path}: data_root must be an absolute path")
    data_root = Path(data["data_root"])
    if not data_root.is_dir():
        raise ConfigError(f"{path}: data_root {data_root} is not a directory on this host")
    vol = data.get("volume") or {"type": "bind"}
    if not isinstance(vol, dict) or set(vol) - _VOLUME_KEYS:
        raise ConfigError(f"{path}: volume must be a mapping with keys {sorted(_VOLUME_KEYS)}")
    try:
        if vol.get("type") == "nfs":
            volume = VolumeSpec.nfs(
                str(vol.get("server", "")), str(vol.get("export", "")), str(vol.get("options", "nfsvers=4.1,hard"))
            )
        elif vol.get("type", "bind") == "bind":
            volume = VolumeSpec.bind(str(data_root))
        else:
            raise ValueError(f"volume.type must be nfs or bind, got {vol.get('type')!r}")
        timeout = parse_duration(data.get("schedule_timeout", 300), "schedule_timeout")
        outage = parse_duration(data.get("engine_outage", 120), "engine_outage")
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from e
    runner = _ids(path, data, "runner_user")
    user = None if runner is None else f"{runner[0]}:{runner[1]}"
    try:
        policy = parse_policy(data["policy"]) if "policy" in data else Policy()
        api, tenants = parse_api(data.get("api")), parse_tenants(data.get("tenants"))
        packing, runners = parse_packing(data.get("packing")), parse_runners(data.get("runners"))
        storage = parse_storage(data.get("storage"))
        delivery = parse_webhook_settings(data.get("webhooks"))
        s3 = storage.s3
        secret, cred_file = (None, None) if s3 is None else (s3.credentials_secret, str(s3.credentials_file))
        check_tenant_storage(tenants, s3 is not None, secret, cred_file)
    except FieldError as e:
        raise ConfigError(f"{path}: {e}") from None
    return Config(
        path=path,
        data_root=data_root.resolve(),
        volume=volume,
        image=str(data.get("image", DEFAULT_IMAGE)),
        controller_image=_controller_image(path, data.get("controller_image")),
        schedule_timeout=timeout,
        runner_user=user,
        controller_user=_ids(path, data, "controller_user"),
        docker_host=data.get("docker_host"),
        engine_outage=outage,
        policy=policy,
        api=api,
        tenants=tenants,
        packing=packing,
        runners=runners,
        storage=storage,
        webhook_delivery=delivery,
    )
