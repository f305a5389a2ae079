"""A tenant's part of the object store (config ``tenants.<t>.s3: s3://BUCKET/PREFIX/``, docs/api.md#object-storage).

Pure data, no boto3: the config is parsed with it on hosts that never talk to S3. An area is a bucket
and a key prefix ending in ``/`` (or the whole bucket, ``s3://BUCKET/``). A URL lies in the area when
it names the same bucket and its fixed prefix (for a glob: the key up to its first ``*`` or ``?``)
starts with the area's prefix; so ``s3://media/acme-evil/x.jpg`` and ``s3://media/acme*/x.jpg`` are
outside ``s3://media/acme/``, and a glob can never list beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.s3 import SCHEME, S3Url, check_bucket
from controller.settings.fields import FieldError, show

__all__ = ["StorageArea", "parse_area"]


@dataclass(frozen=True)
class StorageArea:
    tenant: str
    bucket: str
    prefix: str  # "" (the whole bucket) or a key prefix ending in "/"

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
    """``s3://BUCKET/PREFIX/`` or ``s3://BUCKET/`` → StorageArea; hostile config: no glob, a valid
    bucket and key, ending in ``/``. A refusal is a FieldError naming ``field``."""
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
