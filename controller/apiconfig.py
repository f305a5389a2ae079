"""The config's ``api:`` and ``tenants:`` sections (docs/api.md#config), parsed strictly.

Below the config, the API and `serve` alike: config.py parses these sections with it, the API serves
by them, and `serve` signs a tenant job's results link with ``api:``'s key. Pure data: nothing here
reads a key file or the disk (the API reads its key files when it starts, controller/api/auth.py), so
every other command keeps working on a config whose secrets live only where the API runs. Every
refusal is a ``FieldError`` naming ``api.<field>`` or ``tenants.<t>.<field>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.layout import tenant_key
from controller.policy import Webhooks, parse_webhooks
from controller.settings.fields import (
    FieldError,
    check_int,
    check_keys,
    check_number,
    check_str,
    parse_size,
    parse_ttl,
    show,
)
from controller.storage.area import StorageArea, parse_area

TENANT_NAME = r"[a-z0-9-]{1,40}"  # a folder under tenants/: no dots, so never a hidden name
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LISTEN = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})")
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_TENANT_CLAIM = "ffswarm_tenant"
DEFAULT_JWT_LIFETIME = 86400
MIN_HMAC_SECRET = 32  # bytes: a shorter HS* secret can be guessed offline from any one token it signed
_CLAIM = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,99}")
_REGISTERED_CLAIMS = ("sub", "iss", "aud", "exp", "iat", "nbf", "jti")  # say who and when, never which tenant
_PUBLIC_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?")


@dataclass(frozen=True)
class Quota:
    """Per tenant: GPU slots at once (None: no cap of its own), jobs not yet finished, bytes one
    request may upload, bytes its area may hold, requests a second and at once (per API replica)."""

    gpus: int | None = None
    jobs_queued: int = 100
    upload: int = 2 * 1024**3
    stored: int = 200 * 1024**3
    requests_per_second: float = 50.0
    requests_in_flight: int = 16


@dataclass(frozen=True)
class Tenant:
    name: str
    api_keys_sha256: tuple[str, ...] = ()
    quota: Quota = field(default_factory=Quota)
    weight: int = 1
    s3: StorageArea | None = None  # its part of the object store; None: its jobs name no s3:// object
    jwt_subjects: tuple[str, ...] = ()  # JWT ``sub`` values that mean this tenant (beside the tenant claim)
    webhooks: Webhooks = field(default_factory=Webhooks)  # its own hosts and signing key; default: off
    retention: int | None = None  # seconds after which `serve` deletes a finished job; None: kept


@dataclass(frozen=True)
class JwtSettings:
    """Tokens signed by an identity provider for this API (``audience`` is required: a token made
    for another service must not open this one). The tenant is the ``tenant_claim`` claim, or the
    tenant whose ``jwt_subjects`` lists the token's ``sub``; ``exp`` and ``iat`` are required and a
    token may live at most ``max_lifetime`` seconds. Only ``algorithms`` are accepted (HMAC ones with
    ``secret_file``, key pairs with ``public_key_file``, never both kinds: a public key must never be
    usable as an HMAC secret)."""

    algorithms: tuple[str, ...]
    key_file: Path
    audience: str
    issuer: str | None = None
    tenant_claim: str = DEFAULT_TENANT_CLAIM
    max_lifetime: int = DEFAULT_JWT_LIFETIME

    @property
    def hmac(self) -> bool:
        return self.algorithms[0] in HMAC_ALGORITHMS


MAX_WORKERS = 64


@dataclass(frozen=True)
class ApiSettings:
    listen: str = DEFAULT_LISTEN
    workers: int = 1  # API processes on the one listening socket (controller/api/workers.py)
    signing_key_file: Path | None = None  # signed download links; without it, links are off
    previous_signing_key_files: tuple[Path, ...] = ()  # still verify links during a key rotation
    link_ttl: int = 7 * 86400
    jwt: JwtSettings | None = None
    max_zip_entries: int = 10_000
    max_zip_bytes: int = 8 * 1024**3  # unpacked, per request
    max_zip_ratio: int = 200  # an entry, and a whole archive, may unpack to at most this many times its packed size
    max_zip_depth: int = 8  # folders an archive's entry may sit in
    max_zip_name_bytes: int = 255  # one folder or file name in an archive
    max_zip_path_bytes: int = 1024  # an archive entry's whole name
    max_request_bytes: int = 8 * 1024**3  # one upload request's files and unpacked archives together
    public_url: str | None = None  # e.g. https://faces.example.com: webhooks carry absolute links
    metrics_token_sha256: tuple[str, ...] = ()  # GET /metrics takes one of these tokens; none: /metrics is off
    slow_threads: int = 4  # threads for slow work (globs, uploads, thumbnails, results.zip): controller/api/slow.py
    slow_threads_per_tenant: int = 2  # of those, what one tenant may hold at once (below slow_threads)


def parse_listen(value: object, f: str = "listen") -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); an IPv6 host is written in brackets."""
    m = _LISTEN.fullmatch(value) if isinstance(value, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise FieldError(f, f"must be HOST:PORT like 127.0.0.1:8080, got {show(value)}")
    return m.group(1).strip("[]"), int(m.group(2))


def _mapping(value: object, f: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(f, f"must be a mapping, got {show(value)}")
    check_keys(value, known, parent=f)
    return value


def _abs_path(value: object, f: str) -> Path:
    text = check_str(value, f)
    if not text.startswith("/"):
        raise FieldError(f, f"must be an absolute path, got {show(value)}")
    return Path(text)


_UPLOAD_KEYS = ("max_zip_depth", "max_zip_name_bytes", "max_zip_path_bytes", "max_request_bytes")


def _upload_limits(data: dict[str, Any]) -> dict[str, int]:
    """The upload limits of ``api:`` beyond the first ZIP ones (ApiSettings' defaults when missing)."""
    d = ApiSettings()
    return {
        "max_zip_depth": check_int(data.get("max_zip_depth", d.max_zip_depth), "api.max_zip_depth", minimum=1),
        "max_zip_name_bytes": check_int(
            data.get("max_zip_name_bytes", d.max_zip_name_bytes), "api.max_zip_name_bytes", minimum=1
        ),
        "max_zip_path_bytes": check_int(
            data.get("max_zip_path_bytes", d.max_zip_path_bytes), "api.max_zip_path_bytes", minimum=1
        ),
        "max_request_bytes": parse_size(data.get("max_request_bytes", d.max_request_bytes), "api.max_request_bytes"),
    }


_SLOW_KEYS = ("slow_threads", "slow_threads_per_tenant")


def _slow_limits(data: dict[str, Any]) -> dict[str, int]:
    """The slow pool's size and one tenant's share of it; the share is below the size, so no tenant
    can hold every slow thread."""
    d = ApiSettings()
    threads = check_int(data.get("slow_threads", d.slow_threads), "api.slow_threads", minimum=2, maximum=256)
    share = check_int(
        data.get("slow_threads_per_tenant", d.slow_threads_per_tenant), "api.slow_threads_per_tenant", minimum=1
    )
    if share >= threads:
        raise FieldError(
            "api.slow_threads_per_tenant",
            f"must be below api.slow_threads ({threads}): one tenant must not hold every slow thread, got {share}",
        )
    return {"slow_threads": threads, "slow_threads_per_tenant": share}


def parse_api(value: object) -> ApiSettings:
    """``api:`` → ApiSettings; a missing section is the defaults (links and JWTs off)."""
    if value is None:
        return ApiSettings()
    known = ("listen", "workers", "signing_key_file", "previous_signing_key_files", "link_ttl", "jwt",
             "max_zip_entries", "max_zip_bytes", "max_zip_ratio", "metrics_token_sha256", "public_url",
             *_UPLOAD_KEYS, *_SLOW_KEYS)  # fmt: skip
    data = _mapping(value, "api", known)
    listen = data.get("listen", DEFAULT_LISTEN)
    parse_listen(listen, "api.listen")
    key = data.get("signing_key_file")
    return ApiSettings(
        listen=listen,
        workers=check_int(data.get("workers", 1), "api.workers", minimum=1, maximum=MAX_WORKERS),
        signing_key_file=None if key is None else _abs_path(key, "api.signing_key_file"),
        previous_signing_key_files=_previous_keys(data.get("previous_signing_key_files", []), key is not None),
        link_ttl=parse_ttl(data.get("link_ttl", 7 * 86400), "api.link_ttl"),
        jwt=None if data.get("jwt") is None else _jwt(data["jwt"]),
        max_zip_entries=check_int(data.get("max_zip_entries", 10_000), "api.max_zip_entries", minimum=1),
        max_zip_bytes=parse_size(data.get("max_zip_bytes", 8 * 1024**3), "api.max_zip_bytes"),
        max_zip_ratio=check_int(data.get("max_zip_ratio", 200), "api.max_zip_ratio", minimum=1),
        **_upload_limits(data),
        **_slow_limits(data),
        metrics_token_sha256=_digests(data.get("metrics_token_sha256", []), "api.metrics_token_sha256"),
        public_url=None if data.get("public_url") is None else parse_public_url(data["public_url"]),
    )


def _previous_keys(value: object, current: bool) -> tuple[Path, ...]:
    f = "api.previous_signing_key_files"
    if not isinstance(value, list):
        raise FieldError(f, f"must be a list of absolute paths, got {show(value)}")
    if value and not current:
        raise FieldError(f, "needs api.signing_key_file: previous keys only verify links beside a current one")
    return tuple(_abs_path(p, f"{f}[{i}]") for i, p in enumerate(value))


def parse_public_url(value: object, f: str = "api.public_url") -> str:
    """``https://faces.example.com`` (a path prefix allowed; no query, fragment or credentials) →
    the same without a trailing slash: what the webhook's links are made absolute with."""
    if not isinstance(value, str) or _PUBLIC_URL.fullmatch(value) is None:
        raise FieldError(f, f"must be an http(s) URL like https://faces.example.com, got {show(value)}")
    return value.rstrip("/")


def _digests(value: object, f: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise FieldError(f, f"must be a list of sha256 hex digests, got {show(value)}")
    for i, k in enumerate(value):
        if not isinstance(k, str) or not _SHA256.fullmatch(k.lower()):
            raise FieldError(f"{f}[{i}]", "must be 64 hex digits (sha256 of the token)")
    return tuple(k.lower() for k in value)


def _jwt(value: object) -> JwtSettings:
    known = ("algorithms", "secret_file", "public_key_file", "audience", "issuer", "tenant_claim", "max_lifetime")
    data = _mapping(value, "api.jwt", known)
    algs = data.get("algorithms")
    if not isinstance(algs, list) or not algs:
        raise FieldError("api.jwt.algorithms", f"must be a non-empty list like [RS256], got {show(algs)}")
    for i, a in enumerate(algs):
        if a not in HMAC_ALGORITHMS + KEY_ALGORITHMS:
            choices = ", ".join(HMAC_ALGORITHMS + KEY_ALGORITHMS)
            raise FieldError(f"api.jwt.algorithms[{i}]", f"unknown algorithm {show(a)} (choose from {choices})")
    hmac = [a in HMAC_ALGORITHMS for a in algs]
    if any(hmac) and not all(hmac):
        raise FieldError("api.jwt.algorithms", "mixes HMAC (HS*) and key-pair algorithms; list one kind")
    want, other = ("secret_file", "public_key_file") if hmac[0] else ("public_key_file", "secret_file")
    if other in data:
        raise FieldError(f"api.jwt.{other}", f"does not go with {algs[0]}: give {want}")
    if want not in data:
        raise FieldError(f"api.jwt.{want}", f"is required with {algs[0]}")
    audience, issuer = data.get("audience"), data.get("issuer")
    if audience is None:
        raise FieldError("api.jwt.audience", "is required: the aud a token must carry to be let in here (e.g. ffswarm)")
    claim = data.get("tenant_claim", DEFAULT_TENANT_CLAIM)
    if not isinstance(claim, str) or not _CLAIM.fullmatch(claim) or claim in _REGISTERED_CLAIMS:
        raise FieldError("api.jwt.tenant_claim", f"must be a private claim name like ffswarm_tenant, got {show(claim)}")
    return JwtSettings(
        algorithms=tuple(algs),
        key_file=_abs_path(data[want], f"api.jwt.{want}"),
        audience=check_str(audience, "api.jwt.audience"),
        issuer=None if issuer is None else check_str(issuer, "api.jwt.issuer"),
        tenant_claim=claim,
        max_lifetime=parse_ttl(data.get("max_lifetime", DEFAULT_JWT_LIFETIME), "api.jwt.max_lifetime"),
    )


def parse_tenants(value: object) -> Mapping[str, Tenant]:
    """``tenants:`` → name → Tenant; each tenant needs at least one way in (a key, or JWTs)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError("tenants", f"must be a mapping of tenant names, got {show(value)}")
    out: dict[str, Tenant] = {}
    seen_keys: dict[str, str] = {}
    seen_subjects: dict[str, str] = {}
    seen_folders: dict[str, str] = {}  # tenant key → tenant: a key names one tenant's packs (contract/layout.py)
    for name, body in value.items():
        if not isinstance(name, str) or not re.fullmatch(TENANT_NAME, name):
            raise FieldError("tenants", f"tenant name {show(name)} must be 1 to 40 characters of a-z, 0-9 and -")
        f = f"tenants.{name}"
        if tenant_key(name) in seen_folders:
            other = seen_folders[tenant_key(name)]
            raise FieldError(f, f"has the same packs' folder key as tenant {other!r} (runs/.tenants/): rename one")
        seen_folders[tenant_key(name)] = name
        known = ("api_keys_sha256", "quota", "weight", "s3", "jwt_subjects", "webhooks", "retention")
        data = _mapping(body if body is not None else {}, f, known)
        keys = data.get("api_keys_sha256", [])
        if not isinstance(keys, list):
            raise FieldError(f"{f}.api_keys_sha256", f"must be a list of sha256 hex digests, got {show(keys)}")
        for i, k in enumerate(keys):
            if not isinstance(k, str) or not _SHA256.fullmatch(k.lower()):
                raise FieldError(f"{f}.api_keys_sha256[{i}]", "must be 64 hex digits (sha256 of the key)")
            if k.lower() in seen_keys:
                raise FieldError(f"{f}.api_keys_sha256[{i}]", f"is also a key of tenant {seen_keys[k.lower()]!r}")
            seen_keys[k.lower()] = name
        out[name] = Tenant(
            name=name,
            api_keys_sha256=tuple(k.lower() for k in keys),
            quota=_quota(data.get("quota"), f"{f}.quota"),
            weight=check_int(data.get("weight", 1), f"{f}.weight", minimum=1, maximum=1000),
            s3=None if data.get("s3") is None else parse_area(data["s3"], name, f"{f}.s3"),
            jwt_subjects=_subjects(data.get("jwt_subjects", []), f"{f}.jwt_subjects", name, seen_subjects),
            webhooks=parse_webhooks(data.get("webhooks"), f"{f}.webhooks"),
            retention=None if data.get("retention") is None else parse_retention(data["retention"], f"{f}.retention"),
        )
    return out


def parse_retention(value: object, f: str) -> int:
    """``7d``, ``36h``, ``90m``, ``1d12h`` or whole seconds → seconds (parse_ttl's durations)."""
    try:
        return parse_ttl(value, f)
    except FieldError:
        raise FieldError(f, f"must be a duration like 7d, 36h or 90m, got {show(value)}") from None


def _subjects(value: object, f: str, tenant: str, seen: dict[str, str]) -> tuple[str, ...]:
    """JWT ``sub`` values that mean this tenant; one subject never means two tenants."""
    if not isinstance(value, list):
        raise FieldError(f, f"must be a list of JWT subjects, got {show(value)}")
    for i, sub in enumerate(value):
        check_str(sub, f"{f}[{i}]")
        if sub in seen:
            raise FieldError(f"{f}[{i}]", f"is also a subject of tenant {seen[sub]!r}")
        seen[sub] = tenant
    return tuple(value)


def check_tenant_storage(
    tenants: Mapping[str, Tenant],
    storage_configured: bool,
    cluster_secret: str | None = None,
    cluster_file: str | None = None,
) -> None:
    """A tenant's ``s3:`` area needs ``storage.s3`` (the endpoint and credentials) in the same config;
    areas never overlap, and a tenant's own credentials secret is neither the cluster's nor another
    tenant's (either would hand its runners keys that reach beyond its area)."""
    seen: list[StorageArea] = []
    for name, tenant in tenants.items():
        if tenant.s3 is None:
            continue
        if not storage_configured:
            raise FieldError(
                f"tenants.{name}.s3", "needs object storage: storage.s3 is not configured (docs/storage.md)"
            )
        for other in seen:  # one tenant's area inside another's would let either read the other's objects
            if str(tenant.s3).startswith(str(other)) or str(other).startswith(str(tenant.s3)):
                raise FieldError(f"tenants.{name}.s3", f"{tenant.s3} overlaps tenant {other.tenant}'s area {other}")
        secret = tenant.s3.credentials_secret
        if secret is not None:
            if secret == cluster_secret:
                raise FieldError(f"tenants.{name}.s3.credentials_secret",
                                 f"{secret!r} is storage.s3's secret: a tenant's own keys need a secret of their "
                                 "own (or give only the area URL)")  # fmt: skip
            if tenant.s3.credentials_file == cluster_file:
                raise FieldError(f"tenants.{name}.s3.credentials_file", "is storage.s3's credentials_file: a "
                                 "tenant's own keys need a file of their own")  # fmt: skip
            for other in seen:
                if other.credentials_secret == secret:
                    raise FieldError(f"tenants.{name}.s3.credentials_secret",
                                     f"{secret!r} is also tenant {other.tenant}'s secret")  # fmt: skip
        seen.append(tenant.s3)


def _quota(value: object, f: str) -> Quota:
    if value is None:
        return Quota()
    keys = ("gpus", "jobs_queued", "upload", "stored", "requests_per_second", "requests_in_flight")
    data = _mapping(value, f, keys)
    d = Quota()
    gpus = data.get("gpus")
    return Quota(
        gpus=None if gpus is None else check_int(gpus, f"{f}.gpus", minimum=0),
        jobs_queued=check_int(data.get("jobs_queued", d.jobs_queued), f"{f}.jobs_queued", minimum=1),
        upload=parse_size(data.get("upload", d.upload), f"{f}.upload"),
        stored=parse_size(data.get("stored", d.stored), f"{f}.stored"),
        requests_per_second=check_number(
            data.get("requests_per_second", d.requests_per_second), f"{f}.requests_per_second", above=0
        ),
        requests_in_flight=check_int(
            data.get("requests_in_flight", d.requests_in_flight), f"{f}.requests_in_flight", minimum=1
        ),
    )
