"""Object bodies the controller moves (docs/storage.md, videos): a commit's digest, and the errors of
a read capped or conditional and of a commit refused. The client calls are S3Store's
(controller/storage/s3.py); the upload itself is contract/s3put.py, shared with the runner."""

from __future__ import annotations

import base64
import hashlib
from typing import IO, NamedTuple

from contract.s3 import S3Url
from controller.errors import FfswarmError

BLOCK = 1024**2  # bytes read or hashed at a time
EXISTS = "output exists and was not written by this job (set overwrite: true to replace it)"


class Committed(NamedTuple):
    """A commit's outcome: the object's size and sha256, and whether it was this job's already (nothing sent)."""

    size: int
    sha256: str
    cached: bool


class ObjectTooLarge(FfswarmError):
    """An object over the cap the caller gave; refused before (or while) its body is read."""

    exit_code = 65

    def __init__(self, url: S3Url, size: int | None, cap: int) -> None:
        self.url, self.size, self.cap = url, size, cap
        said = f"{size} bytes" if size is not None else f"more than {cap} bytes"
        super().__init__(f"{url}: the object is {said}, over the limit of {cap} bytes")


class ObjectChanged(FfswarmError):
    """The object's ETag is no longer the one planned: it was replaced since (an item error)."""

    exit_code = 66

    def __init__(self, url: S3Url) -> None:
        self.url = url
        super().__init__(f"{url}: the object changed after the job was planned (its ETag differs)")


class ObjectExists(FfswarmError):
    """An object at an output's key that this job did not write, without ``overwrite: true``, or a
    commit the store cannot make without risk of replacing one (``why``): an item error."""

    exit_code = 1

    def __init__(self, url: S3Url, why: str = EXISTS) -> None:
        self.url = url
        super().__init__(f"{url}: {why}")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def digest(f: IO[bytes]) -> tuple[int, str, str]:
    """Size, sha256 (hex) and sha256 (base64, the ChecksumSHA256 header) of a file from its start."""
    f.seek(0)
    h, size = hashlib.sha256(), 0
    while block := f.read(BLOCK):
        h.update(block)
        size += len(block)
    return size, h.hexdigest(), _b64(h.digest())
