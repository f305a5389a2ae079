"""The cluster's policy (config ``policy:``): what a job file may ask for (docs/operations.md#policy).

The operator writes the policy; a job file only asks within it and never widens it. Defaults are
safe: with no ``policy:`` a job may not name an image, hooks are off, webhooks are off, and the
maxima below apply. Every refusal is a ``JobFileError`` (exit 65) naming the file, the field, the
value asked for and the limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from controller.errors import JobFileError
from controller.settings.fields import (
    FieldError,
    check_bool,
    check_int,
    check_keys,
    check_str,
    parse_duration,
    parse_memory,
    show,
)

if TYPE_CHECKING:
    from controller.job.spec import JobSpec

_CONSTRAINT = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(==|!=)\s*([^\s=!]+)\s*")
JOB_PLACEMENT_PREFIX = "node.labels."  # the only constraints a job may add
_USER = re.compile(r"(\d+):(\d+)")


@dataclass(frozen=True)
class Limits:
    """Maxima per job; ``memory`` and ``job_file`` in bytes, ``timeout`` in seconds."""

    gpus: int = 1
    max_concurrent: int = 64
    memory: int = 16 * 1024**3
    retries: int = 5
    timeout: int = 6 * 3600
    targets: int = 200_000
    segments: int = 20_000
    job_file: int = 1024**2
    video_pixels: int = 8_847_360  # 4096×2160
    video_frames: int = 1_000_000
    video_bytes: int = 8 * 1024**3  # an s3:// video target, fetched at plan time to be probed
    cpus: int = 2  # CPU limit of each runner container (a node refuses one above its own CPU count)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_int(getattr(self, f.name), f.name, minimum=0 if f.name in ("gpus", "retries") else 1)


@dataclass(frozen=True)
class Hook:
    """A program the operator allows ``on_complete: {hook: NAME}`` to run: fixed argv, no shell,
    an unprivileged uid:gid, a timeout in seconds."""

    command: tuple[str, ...]
    uid: int
    gid: int
    timeout: int = 60

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise FieldError("command", f"must be a non-empty list of strings, got {show(list(self.command))}")
        if not self.command[0].startswith("/"):
            raise FieldError("command", f"must start with an absolute program path, got {self.command[0]!r}")
        if self.uid == 0 or self.gid == 0:
            raise FieldError("user", "hooks never run as root (uid 0 or gid 0)")
        check_int(self.timeout, "timeout", minimum=1)


@dataclass(frozen=True)
class Webhooks:
    """Where a job's webhook may post and the key it is signed with: ``policy.webhooks`` for CLI
    jobs, ``tenants.<t>.webhooks`` for that tenant's jobs (never the cluster's: a tenant's deliveries
    are signed with a key only that tenant holds, and go only to its own hosts)."""

    allow_hosts: tuple[str, ...] = ()  # empty: webhooks off
    allow_private: bool = False  # loopback, link-local, private and metadata ranges refused unless true
    secret_file: Path | None = None  # HMAC-SHA256 signing key
    name: str = "policy.webhooks"  # the config section, as errors name it


@dataclass(frozen=True)
class Policy:
    images: tuple[str, ...] = ()
    placement: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    hooks: Mapping[str, Hook] = field(default_factory=dict)
    webhooks: Webhooks = field(default_factory=Webhooks)  # CLI (untenanted) jobs only
    allow_overwrite: bool = False  # whether a job file may say overwrite: true
    configured: bool = False  # whether the config has a policy: section (doctor says which applies)

    def describe(self) -> list[str]:
        """The policy in force, one line per part, for `ffswarm doctor`."""
        lim = self.limits
        return [
            f"policy: {'from the config' if self.configured else 'none in the config: safe defaults'}",
            f"images a job may name: {', '.join(self.images) or 'none (jobs use the config image)'}",
            f"placement on every chunk: {', '.join(self.placement) or 'none'}; jobs may add node.labels.* only",
            f"limits: gpus {lim.gpus}, max_concurrent {lim.max_concurrent}, memory {size_text(lim.memory)}, "
            f"retries {lim.retries}, timeout {lim.timeout}s, targets {lim.targets}, segments {lim.segments}, "
            f"job_file {size_text(lim.job_file)}, video_pixels {lim.video_pixels}, video_frames {lim.video_frames}, "
            f"cpus {lim.cpus} per runner",
            f"hooks: {', '.join(sorted(self.hooks)) or 'off'}",
            f"webhooks: {'to ' + ', '.join(self.webhooks.allow_hosts) if self.webhooks.allow_hosts else 'off'}"
            + (" (private addresses allowed)" if self.webhooks.allow_hosts and self.webhooks.allow_private else ""),
        ]


def size_text(n: int) -> str:
    for unit, size in (("t", 1024**4), ("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


def parse_policy(data: object) -> Policy:
    """``policy:`` as the config gives it; raises FieldError naming ``policy.<field>``."""
    try:
        return _parse(data)
    except FieldError as e:
        raise e.within("policy") from None


def _parse(data: object) -> Policy:
    if data is None:
        return Policy(configured=True)
    if not isinstance(data, dict):
        raise FieldError(None, f"must be a mapping, got {show(data)}")
    check_keys(data, ("images", "placement", "limits", "hooks", "webhooks", "allow_overwrite"))
    images = tuple(check_str(x, f"images[{i}]") for i, x in enumerate(_list(data.get("images"), "images")))
    placement = _list(data.get("placement"), "placement")
    for i, c in enumerate(placement):
        if not isinstance(c, str) or not _CONSTRAINT.fullmatch(c):
            raise FieldError(
                f"placement[{i}]", f"must be a constraint like node.labels.ffswarm.gpu==true, got {show(c)}"
            )
    return Policy(
        images=images,
        placement=tuple(str(c) for c in placement),
        limits=_limits(data.get("limits")),
        hooks=_hooks(data.get("hooks")),
        webhooks=parse_webhooks(data.get("webhooks"), name="policy.webhooks"),
        allow_overwrite=check_bool(data.get("allow_overwrite", False), "allow_overwrite"),
        configured=True,
    )


def _list(value: object, f: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(f, f"must be a list, got {show(value)}")
    return value


def _mapping(value: object, f: str, known: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(f, f"must be a mapping, got {show(value)}")
    check_keys(value, known, parent=f)
    return value


def _limits(value: object) -> Limits:
    data = _mapping(value, "limits", tuple(f.name for f in fields(Limits)))
    out: dict[str, int] = {}
    for k, v in data.items():
        if k in ("memory", "job_file", "video_bytes"):
            out[k] = parse_memory(v.lower().removesuffix("ib") if isinstance(v, str) else v, f"limits.{k}")
        elif k == "timeout":
            out[k] = parse_duration(v, "limits.timeout")
        else:
            out[k] = v
    try:
        return Limits(**out)
    except FieldError as e:
        raise e.within("limits") from None


def _hooks(value: object) -> dict[str, Hook]:
    data = {} if value is None else value
    if not isinstance(data, dict):
        raise FieldError("hooks", f"must be a mapping of hook names, got {show(data)}")
    out: dict[str, Hook] = {}
    for name, spec in data.items():
        f = f"hooks.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9-]{1,40}", name):
            raise FieldError(f, "a hook name is 1 to 40 characters of a-z, 0-9 and -")
        h = _mapping(spec, f, ("command", "user", "timeout"))
        command = _list(h.get("command"), f"{f}.command")
        user = h.get("user")
        m = _USER.fullmatch(user) if isinstance(user, str) else None
        if m is None:
            raise FieldError(f"{f}.user", f"must be a numeric UID:GID, got {show(user)}")
        try:
            out[name] = Hook(
                tuple(command), int(m.group(1)), int(m.group(2)), parse_duration(h.get("timeout", 60), "timeout")
            )
        except FieldError as e:
            raise e.within(f) from None
    return out


def parse_webhooks(value: object, f: str = "webhooks", name: str | None = None) -> Webhooks:
    """``policy.webhooks`` (CLI jobs) or ``tenants.<t>.webhooks`` (that tenant's jobs): the same shape."""
    data = _mapping(value, f, ("allow_hosts", "allow_private", "secret_file"))
    hosts = tuple(
        check_str(h, f"{f}.allow_hosts[{i}]").lower()
        for i, h in enumerate(_list(data.get("allow_hosts"), f"{f}.allow_hosts"))
    )
    secret = data.get("secret_file")
    if secret is not None and (not isinstance(secret, str) or not secret.startswith("/")):
        raise FieldError(f"{f}.secret_file", f"must be an absolute path, got {show(secret)}")
    return Webhooks(
        allow_hosts=hosts,
        allow_private=check_bool(data.get("allow_private", False), f"{f}.allow_private"),
        secret_file=Path(secret) if secret else None,
        name=name or f,
    )


# -- what a job asks for --------------------------------------------------------------------------------
def _over(file: str, f: str, asked: str, limit: str) -> JobFileError:
    return JobFileError(file, f, f"asks for {asked}, the limit is {limit} (the cluster's policy.limits)")


def check_job(policy: Policy, spec: JobSpec, file: str, webhooks: Webhooks | None = None) -> None:
    """Refuse a job that asks for more than the policy allows (before anything is planned).
    ``webhooks``: a tenant's own section (``tenants.<t>.webhooks``) for a tenant's job; None for a
    CLI job, which the cluster's ``policy.webhooks`` serves."""
    if spec.overwrite and not policy.allow_overwrite:
        raise JobFileError(
            file,
            "overwrite",
            "true is not allowed: the cluster's policy.allow_overwrite is false (outputs never replace "
            "files this job did not write)",
        )
    if spec.image is not None:
        if not policy.images:
            raise JobFileError(
                file,
                "image",
                f"{spec.image!r} is not allowed: the cluster's policy lists no images a job may "
                "name (leave image: out to use the cluster's image)",
            )
        if spec.image not in policy.images:
            raise JobFileError(
                file, "image", f"{spec.image!r} is not in the cluster's policy.images ({', '.join(policy.images)})"
            )
    for i, c in enumerate(spec.placement):
        m = _CONSTRAINT.fullmatch(c)
        key = m.group(1) if m else c
        if not key.startswith(JOB_PLACEMENT_PREFIX):
            raise JobFileError(
                file, f"placement[{i}]", f"{c!r} is not allowed: a job may add node.labels.* constraints only"
            )
    lim, res = policy.limits, spec.resources
    if res.gpus > lim.gpus:
        raise _over(file, "resources.gpus", str(res.gpus), str(lim.gpus))
    if res.memory > lim.memory:
        raise _over(file, "resources.memory", size_text(res.memory), size_text(lim.memory))
    if spec.max_concurrent > lim.max_concurrent:
        raise _over(file, "max_concurrent", str(spec.max_concurrent), str(lim.max_concurrent))
    if spec.retries > lim.retries:
        raise _over(file, "retries", str(spec.retries), str(lim.retries))
    if spec.timeout > lim.timeout:
        raise _over(file, "timeout", f"{spec.timeout}s", f"{lim.timeout}s")
    hook = spec.on_complete.hook
    if hook is not None and hook not in policy.hooks:
        known = ", ".join(sorted(policy.hooks)) or "none: hooks are off"
        raise JobFileError(file, "on_complete.hook", f"{hook!r} is not a hook in the cluster's policy ({known})")
    webhook = spec.on_complete.webhook
    hooks = policy.webhooks if webhooks is None else webhooks
    if webhook is not None:
        host = (urlsplit(webhook).hostname or "").lower()
        if not hooks.allow_hosts:
            off = "the cluster's policy allows no hosts" if webhooks is None else f"{hooks.name}.allow_hosts lists none"
            raise JobFileError(file, "on_complete.webhook", f"webhooks are off: {off}")
        if host not in hooks.allow_hosts:
            allowed = ", ".join(hooks.allow_hosts)
            where = "the cluster's policy.webhooks" if webhooks is None else hooks.name
            raise JobFileError(file, "on_complete.webhook", f"host {host!r} is not in {where}.allow_hosts ({allowed})")


def check_counts(policy: Policy, file: str, targets: int, segments: int) -> None:
    """Targets and video segments a planned job has, against the limits."""
    if targets > policy.limits.targets:
        raise _over(file, "targets", f"{targets} files", str(policy.limits.targets))
    if segments > policy.limits.segments:
        raise _over(file, "segment_seconds", f"{segments} video segments", str(policy.limits.segments))


def placement(policy: Policy, spec: JobSpec) -> tuple[str, ...]:
    """The constraints a chunk carries: the policy's always, then the job's own (node.labels.* only)."""
    return tuple(dict.fromkeys((*policy.placement, *spec.placement)))
