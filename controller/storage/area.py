"""A tenant's part of the object store (config ``tenants.<t>.s3``, docs/api.md#object-storage): either
``s3://BUCKET/PREFIX/`` (the area, reached with the cluster's ``storage.s3`` credentials) or
``{area: s3://BUCKET/PREFIX/, credentials_secret: NAME, credentials_file: PATH}`` (the area and the
tenant's own keys: its runners get only that Swarm secret, the controller and the API read only that file).

Pure data, no boto3: the config is parsed with it on hosts that never talk to S3. An area is a bucket
and a key prefix ending in ``/`` (or the whole bucket, ``s3://BUCKET/``). A URL lies in the area when
it names the same bucket and its fixed prefix (for a glob: the key up to its first ``*`` or ``?``)
starts with the area's prefix; so ``s3://media/acme-evil/x.jpg`` and ``s3://media/acme*/x.jpg`` are
outside ``s3://media/acme/``, and a glob can never list beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.s3 import SCHEME, S3Url, check_bucket
from controller.settings.fields import FieldError, check_keys, check_str, show

__all__ = ["SECRET_NAME", "StorageArea", "parse_area"]

SECRET_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # a Docker secret name


@dataclass(frozen=True)
class StorageArea:
    tenant: str
    bucket: str
    prefix: str  # "" (the whole bucket) or a key prefix ending in "/"
    # The tenant's own keys: the Swarm secret its runners mount, and the controller's and the API's copy
    # (same format as storage.s3.credentials_file). None: the cluster's storage.s3 credentials.
    credentials_secret: str | None = None
    credentials_file: str | None = None

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"

    def holds(self, url: S3Url) -> bool:
        """Whether every object ``url`` can name (a glob: every object it can list) is in the area."""
        return url.bucket == self.bucket and url.prefix.startswith(self.prefix) and len(url.key) > len(self.prefix)

    def holds_template(self, text: str) -> bool:
        """An output template in the store: its literal part before the first placeholder (a prefix of
        every key it can expand to) must already lie in the area."""
        head = str(self)
        return text.split("{", 1)[0].startswith(head) and len(text) > len(head)

    def url(self, rel: str) -> str:
        """``rel`` (a key relative to the area, may hold placeholders) as an s3:// URL in the area."""
        return f"{self}{rel}"

    def relative(self, url: str) -> str | None:
        """An object's key relative to the area (how results.zip names it); None outside the area."""
        head = str(self)
        return url[len(head) :] if url.startswith(head) and len(url) > len(head) else None


def parse_area(value: object, tenant: str, field: str) -> StorageArea:
    """``tenants.<t>.s3``: the URL alone, or a mapping of the area and the tenant's own credentials.
    A refusal is a FieldError naming ``field`` or its key."""
    if not isinstance(value, dict):
        return _parse_url(value, tenant, field)
    check_keys(value, ("area", "credentials_secret", "credentials_file"), parent=field)
    if "area" not in value:
        raise FieldError(f"{field}.area", "is required: the tenant's s3://BUCKET/PREFIX/")
    area = _parse_url(value["area"], tenant, f"{field}.area")
    secret, cred_file = value.get("credentials_secret"), value.get("credentials_file")
    if secret is None:
        if cred_file is not None:  # the runners would mount the cluster's keys while the controller used these
            raise FieldError(f"{field}.credentials_secret", "is required with credentials_file: the Swarm "
                             "secret holding the same keys for the tenant's runners")  # fmt: skip
        return area
    secret = check_str(secret, f"{field}.credentials_secret", pattern=SECRET_NAME,
                       hint="a Docker secret name (letters, digits, _ . -, at most 64)")  # fmt: skip
    cred_file = f"/run/secrets/{secret}" if cred_file is None else cred_file
    if not isinstance(cred_file, str) or not cred_file.startswith("/"):
        raise FieldError(f"{field}.credentials_file", f"must be an absolute path, got {show(cred_file)}")
    return StorageArea(tenant, area.bucket, area.prefix, secret, cred_file)


def _parse_url(value: object, tenant: str, field: str) -> StorageArea:
    """``s3://BUCKET/PREFIX/`` or ``s3://BUCKET/`` → StorageArea; hostile config: no glob, a valid
    bucket and key, ending in ``/``."""
    if not isinstance(value, str) or not value.startswith(SCHEME):
        raise FieldError(field, f"must be an s3://BUCKET/PREFIX/ URL, got {show(value)}")
    if not value.endswith("/"):
        raise FieldError(field, f"must end with '/' (a prefix the tenant's objects share), got {show(value)}")
    bucket, _, key = value[len(SCHEME) :].partition("/")
    try:
        if key:
            url = S3Url.parse(value)
            if url.is_glob:
                raise ValueError("has a glob character ('*' or '?'): an area is one fixed prefix")
        else:
            check_bucket(bucket)
    except ValueError as e:
        raise FieldError(field, str(e)) from None
    return StorageArea(tenant, bucket, key)
