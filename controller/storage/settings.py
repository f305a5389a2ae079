"""The config's ``storage:`` section (docs/storage.md#config), parsed strictly, and the credentials file.

Parsing is pure data: the credentials file is read only when a client is made (read_credentials), so
commands that never touch S3 work on a host without the secret. Refusals of the section are
``FieldError`` naming ``storage.s3.<key>``; a bad credentials file is a ``ConfigError`` naming the file
and the line, never a value read from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from contract.s3 import MAX_CREDENTIALS_BYTES, SECRETS_DIR, Credentials, StorageAccess, parse_credentials
from controller.errors import ConfigError
from controller.settings.fields import FieldError, check_choice, check_keys, check_str, parse_ttl, show
from controller.storage.area import SECRET_NAME, StorageArea

Addressing = Literal["path", "virtual"]
MAX_LINK_TTL = 7 * 86400  # SigV4 presigned URLs live at most 7 days
DEFAULT_PROBE_MAX_AGE = 7 * 86400
_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.-]+(:\d{1,5})?/?|https?://\[[0-9a-fA-F:]+\](:\d{1,5})?/?")
_REGION = r"[a-z0-9-]{1,32}"
NETWORK_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


@dataclass(frozen=True)
class S3Settings:
    """Where the objects are and how to reach them; the credentials themselves are not here."""

    credentials_secret: str  # the Swarm secret runners get at /run/secrets/<name>
    credentials_file: Path  # the controller's copy (same format)
    endpoint_url: str | None = None  # None: AWS S3 itself
    region: str = "us-east-1"
    addressing: Addressing = "path"
    link_ttl: int = 7 * 86400  # seconds a presigned result link lives
    # An attachable overlay network the operator made that reaches the store; runners of jobs that
    # use s3:// join it beside their internal one (docs/storage.md#network). None: none is joined.
    network: str | None = None
    # How long what a probe found about a store is believed (controller/storage/record.py); older,
    # the next job that writes there probes it again.
    probe_max_age: int = DEFAULT_PROBE_MAX_AGE
    credentials_field: str = "storage.s3.credentials_file"  # how errors about the file name it

    def access(self) -> StorageAccess:
        """The store as manifests name it: the credentials are the Swarm secret mounted in the runner."""
        secret = f"{SECRETS_DIR}{self.credentials_secret}"
        return StorageAccess(self.endpoint_url, self.region, self.addressing, credentials_file=secret)

    def for_area(self, area: StorageArea | None) -> S3Settings:
        """The store as a tenant's job reaches it: this endpoint, with the tenant's own credentials when
        its ``tenants.<t>.s3`` names them (the cluster's otherwise: the old string form)."""
        if area is None or area.credentials_secret is None or area.credentials_file is None:
            return self
        return replace(
            self,
            credentials_secret=area.credentials_secret,
            credentials_file=Path(area.credentials_file),
            credentials_field=f"tenants.{area.tenant}.s3.credentials_file",
        )


@dataclass(frozen=True)
class StorageSettings:
    s3: S3Settings | None = None  # None: s3:// URLs are refused


def parse_storage(value: object) -> StorageSettings:
    """``storage:`` → StorageSettings; a missing section means no object storage."""
    if value is None:
        return StorageSettings()
    if not isinstance(value, dict):
        raise FieldError("storage", f"must be a mapping, got {show(value)}")
    check_keys(value, ("s3",), parent="storage")
    return StorageSettings(s3=None if value.get("s3") is None else parse_s3(value["s3"]))


def parse_s3(value: object) -> S3Settings:
    f = "storage.s3"
    if not isinstance(value, dict):
        raise FieldError(f, f"must be a mapping, got {show(value)}")
    data: dict[str, Any] = value
    check_keys(data, ("endpoint_url", "region", "addressing", "credentials_secret", "credentials_file",
                      "link_ttl", "network", "probe_max_age"), parent=f)  # fmt: skip
    if "credentials_secret" not in data:
        raise FieldError(f"{f}.credentials_secret", "is required: the Swarm secret that holds the access key")
    secret = check_str(data["credentials_secret"], f"{f}.credentials_secret", pattern=SECRET_NAME,
                       hint="a Docker secret name (letters, digits, _ . -, at most 64)")  # fmt: skip
    cred_file = data.get("credentials_file", f"/run/secrets/{secret}")
    if not isinstance(cred_file, str) or not cred_file.startswith("/"):
        raise FieldError(f"{f}.credentials_file", f"must be an absolute path, got {show(cred_file)}")
    endpoint = data.get("endpoint_url")
    if endpoint is not None and (not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint)):
        # no path, query or user:password@ (a secret never goes in the config file)
        raise FieldError(f"{f}.endpoint_url", f"must be http(s)://HOST[:PORT], got {show(endpoint)}")
    ttl = parse_ttl(data.get("link_ttl", MAX_LINK_TTL), f"{f}.link_ttl")
    if ttl > MAX_LINK_TTL:
        raise FieldError(f"{f}.link_ttl", f"S3 presigned links live at most 7d, got {show(data['link_ttl'])}")
    style = check_choice(data.get("addressing", "path"), f"{f}.addressing", ("path", "virtual"), "addressing style")
    addressing: Addressing = "virtual" if style == "virtual" else "path"
    max_age = parse_ttl(data.get("probe_max_age", DEFAULT_PROBE_MAX_AGE), f"{f}.probe_max_age")
    network = data.get("network")
    if network is not None:
        network = check_str(network, f"{f}.network", pattern=NETWORK_NAME,
                            hint="the name of an attachable overlay network (docker network create)")  # fmt: skip
    return S3Settings(
        credentials_secret=secret,
        credentials_file=Path(cred_file),
        endpoint_url=None if endpoint is None else endpoint.rstrip("/"),
        region=check_str(
            data.get("region", "us-east-1"), f"{f}.region", pattern=_REGION, hint="a region like us-east-1"
        ),
        addressing=addressing,
        link_ttl=ttl,
        network=network,
        probe_max_age=max_age,
    )


def read_credentials(path: Path, field: str = "storage.s3.credentials_file") -> Credentials:
    """The credentials file (its format: contract/s3.py parse_credentials). Every error names the
    config key (``field``), the file and the line number, never a character of the line: a malformed
    line may well be the secret."""
    where = f"{field} {path}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CREDENTIALS_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or type(e).__name__}") from None
    try:
        return parse_credentials(raw)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
