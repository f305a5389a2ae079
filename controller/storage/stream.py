"""Reading one object's body in pieces, for the HTTP API (results.zip, thumbnails): one GET, its
metadata checked before a byte is used, the body never held whole.

The object is hostile like any file on the shared volume: whether it is still the job's commit is
decided from the GET's own answer (its ``x-amz-meta-ffswarm-*`` and length, atomic with the body), and
a digest is kept while it streams so a body that does not match the recorded sha256 is known by the end.
Errors come out as ours (controller/storage/s3.py translate), never the server's text.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

from contract.s3 import META_ITEM, META_JOB, META_SHA256, S3Url
from controller.storage.errors import ObjectMissing, StorageTemporaryError
from controller.storage.s3 import translate

__all__ = ["ObjectBody", "open_object"]

PIECE = 256 * 1024


@dataclass
class ObjectBody:
    """An open GET: what the store said about the object, and its body to read once."""

    url: S3Url
    size: int
    modified: float  # unix time (Last-Modified)
    metadata: Mapping[str, str]
    body: Any
    digest: Any = field(default_factory=hashlib.sha256)
    read_bytes: int = 0

    def not_committed_by(self, job: str, item: str | None, size: int | None, sha256: str | None) -> str | None:
        """Why this object is not ``job``'s commit of ``item`` (None: any item) as its result line
        recorded it; None when it is."""
        meta = {str(k).lower(): str(v) for k, v in self.metadata.items()}
        if meta.get(META_JOB) != job or (item is not None and meta.get(META_ITEM) != item):
            return "the object there now was not written by this job (its metadata names another)"
        if sha256 is not None and meta.get(META_SHA256) != sha256:
            return "the object changed since it was committed (its sha256 is not the one recorded)"
        if size is not None and self.size != size:
            return "the object changed since it was committed (its size is not the one recorded)"
        return None

    def pieces(self, size: int = PIECE) -> Iterator[bytes]:
        """The body in pieces of at most ``size`` bytes, hashed as they go; a broken stream is
        StorageTemporaryError. Closes the body when done."""
        try:
            while True:
                try:
                    piece = self.body.read(size)
                except (BotoCoreError, OSError, ValueError) as e:
                    raise StorageTemporaryError(self.url, f"the body stopped after {self.read_bytes} bytes "
                                                f"({type(e).__name__})") from None  # fmt: skip
                if not piece:
                    return
                self.digest.update(piece)
                self.read_bytes += len(piece)
                yield piece
        finally:
            self.close()

    def read(self, cap: int) -> bytes:
        """At most ``cap`` + 1 bytes of the body (a caller refusing more than ``cap`` can tell)."""
        out = bytearray()
        for piece in self.pieces(min(PIECE, cap + 1)):
            out += piece
            if len(out) > cap:
                break
        self.close()
        return bytes(out[: cap + 1])

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a body already closed or broken: nothing to free
            self.body.close()


def open_object(client: Any, url: S3Url) -> ObjectBody:
    """GET ``url``; ObjectMissing when it is gone (its bucket exists or not: either way not there)."""
    try:
        answer = client.get_object(Bucket=url.bucket, Key=url.key)
    except (ClientError, BotoCoreError) as e:
        code = str(e.response.get("Error", {}).get("Code", "")) if isinstance(e, ClientError) else ""
        if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
            raise ObjectMissing(url) from None
        raise translate(e, url, "read") from None
    modified = answer.get("LastModified")
    return ObjectBody(
        url,
        int(answer.get("ContentLength") or 0),
        modified.timestamp() if hasattr(modified, "timestamp") else 0.0,
        dict(answer.get("Metadata") or {}),
        answer["Body"],
    )
