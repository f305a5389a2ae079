"""Object bodies the controller moves (docs/storage.md, videos): a commit's digest and its upload in
parts, and the errors of a read capped or conditional and of a commit refused. The client calls are
S3Store's (controller/storage/s3.py); this module holds what it needs beside them."""

from __future__ import annotations

import base64
import contextlib
import hashlib
from typing import IO, Any, NamedTuple

from contract.s3 import S3Url
from controller.errors import FfswarmError

BLOCK = 1024**2  # bytes read or hashed at a time
MULTIPART_THRESHOLD = 16 * 1024**2  # a larger commit goes up in parts (as the runner's)
PART_SIZE = 8 * 1024**2  # S3: at least 5 MiB a part but the last, at most 10,000 parts
MAX_PARTS = 10_000
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
    """An object at an output's key that this job did not write, without ``overwrite: true`` (an item error)."""

    exit_code = 1

    def __init__(self, url: S3Url) -> None:
        self.url = url
        super().__init__(f"{url}: {EXISTS}")


def multipart(
    client: Any, url: S3Url, f: IO[bytes], size: int, meta: dict[str, str], kind: str, condition: dict[str, str],
    part_size: int = PART_SIZE,
) -> None:  # fmt: skip
    """Parts each with its own SHA-256; the object exists only once CompleteMultipartUpload
    succeeds, and any error (or an interrupt) aborts the upload."""
    part_size = max(part_size, -(-size // MAX_PARTS))
    where = {"Bucket": url.bucket, "Key": url.key}
    made = client.create_multipart_upload(**where, Metadata=meta, ContentType=kind, ChecksumAlgorithm="SHA256")
    upload = made["UploadId"]
    try:
        parts: list[dict[str, Any]] = []
        while chunk := f.read(part_size):
            n, b64 = len(parts) + 1, _b64(hashlib.sha256(chunk).digest())
            answer = client.upload_part(
                **where, UploadId=upload, PartNumber=n, Body=chunk, ContentLength=len(chunk),
                ChecksumAlgorithm="SHA256", ChecksumSHA256=b64,
            )  # fmt: skip
            parts.append({"ETag": answer["ETag"], "PartNumber": n, "ChecksumSHA256": b64})
        client.complete_multipart_upload(**where, UploadId=upload, MultipartUpload={"Parts": parts}, **condition)
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(**where, UploadId=upload)
        raise


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
