"""A commit's upload to an S3-compatible store, shared by the runner (runner_image/s3io.py) and the
controller's join (controller/storage/s3.py), so both write objects the one safe way (docs/storage.md).

The client is any boto3 S3 client, passed in: this module imports no S3 library and translates no
error (each side does, in its own words). What it decides is *how* a commit goes up so that a
condition from contract/s3.py ``commit_condition`` really holds on the store:

- A single PutObject carries the condition, and every store that has conditional writes honours it
  there. ``If-Match`` is sent with the ETag unquoted first (Ceph RGW compares it verbatim and answers
  412 to the quoted form), then, only on 412, quoted (an RFC-strict store): both tries are
  conditional, so a refusal is never turned into an overwrite.
- CompleteMultipartUpload ignores ``If-None-Match``/``If-Match`` on some stores (Ceph RGW Pacific
  overwrites). A conditional commit therefore goes up in parts only when the store is known to
  honour them there (``conditional_complete``); otherwise it is one PutObject up to ``MAX_PUT`` and
  anything larger is refused (UnsafeCommit) rather than risk replacing another job's object.
- Parts go up ``workers`` at a time: the body is read in order by the calling thread, at most
  ``workers`` parts are held in memory, and any error (an interrupt included) aborts the upload, so
  the object appears whole or not at all.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, Any

MIN_PART = 5 * 1024**2  # S3's smallest part (all but the last)
MAX_PARTS = 10_000
MAX_PUT = 5 * 1024**3  # the largest single PutObject on AWS and Ceph RGW (rgw_max_put_size)


class UnsafeCommit(Exception):
    """A conditional commit that this store cannot make safely (too large for one PUT, and the store
    does not honour conditions on CompleteMultipartUpload); the message names the fix."""


@dataclass(frozen=True)
class Upload:
    """How commits go up: sizes, parallel parts, and what the store is known to honour."""

    multipart_threshold: int = 16 * 1024**2
    part_size: int = 8 * 1024**2
    workers: int = 4  # parts in flight at once (each holds part_size bytes)
    conditional_complete: bool = False  # the store honours If-None-Match / If-Match on CompleteMultipartUpload

    def __post_init__(self) -> None:
        if self.part_size < MIN_PART or self.workers < 1 or self.multipart_threshold < 1:
            raise ValueError(f"part_size must be at least {MIN_PART}; workers and multipart_threshold positive")


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def match_tries(condition: dict[str, str]) -> list[dict[str, str]]:
    """The conditions to send in turn: ``If-Match`` unquoted, then as seen (quoted) after a 412."""
    etag = condition.get("IfMatch")
    if etag is None:
        return [condition]
    bare = etag.strip('"')
    return [{"IfMatch": bare}] + ([{"IfMatch": etag}] if bare != etag else [])


def is_precondition_failed(error: BaseException) -> bool:
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code == "PreconditionFailed" or status == 412


def put(
    client: Any, bucket: str, key: str, f: IO[bytes], size: int, sha256_b64: str, meta: dict[str, str], kind: str,
    condition: dict[str, str], upload: Upload,
) -> None:  # fmt: skip
    """``f`` (read from its current position, ``size`` bytes) as the object ``bucket/key`` under
    ``condition`` ({} for none); a condition that fails raises the client's 412 error."""
    start = f.tell()
    conditional = bool(condition)
    if size <= upload.multipart_threshold or (conditional and not upload.conditional_complete):
        if size > MAX_PUT:
            raise UnsafeCommit(
                f"{size} bytes is over the {MAX_PUT}-byte limit of one PUT, and the store is not known to "
                "honour conditions on CompleteMultipartUpload (ffswarm doctor --store shows what it honours), "
                "so a commit in parts could replace another job's object"
            )
        tries = match_tries(condition)
        for n, cond in enumerate(tries, 1):
            f.seek(start)
            try:
                client.put_object(
                    Bucket=bucket, Key=key, Body=f, ContentLength=size, ContentType=kind, Metadata=meta,
                    ChecksumAlgorithm="SHA256", ChecksumSHA256=sha256_b64, **cond,
                )  # fmt: skip
                return
            except Exception as e:
                if n == len(tries) or not is_precondition_failed(e):
                    raise
        return
    multipart(client, bucket, key, f, size, meta, kind, condition, upload)


def multipart(
    client: Any, bucket: str, key: str, f: IO[bytes], size: int, meta: dict[str, str], kind: str,
    condition: dict[str, str], upload: Upload,
) -> None:  # fmt: skip
    """Parts of ``part_size`` (more when the body needs over 10,000), each with its own SHA-256,
    ``workers`` at a time; the object exists only once CompleteMultipartUpload succeeds, and any
    error aborts the upload."""
    part_size = max(upload.part_size, -(-size // MAX_PARTS))
    where = {"Bucket": bucket, "Key": key}
    upload_id = client.create_multipart_upload(**where, Metadata=meta, ContentType=kind, ChecksumAlgorithm="SHA256")[
        "UploadId"
    ]

    def send(n: int, chunk: bytes) -> dict[str, Any]:
        digest = b64(hashlib.sha256(chunk).digest())
        answer = client.upload_part(
            **where, UploadId=upload_id, PartNumber=n, Body=chunk, ContentLength=len(chunk),
            ChecksumAlgorithm="SHA256", ChecksumSHA256=digest,
        )  # fmt: skip
        return {"ETag": answer["ETag"], "PartNumber": n, "ChecksumSHA256": digest}

    try:
        with ThreadPoolExecutor(upload.workers, thread_name_prefix="s3-part") as pool:
            parts = _send_all(pool, f, part_size, upload.workers, send)
        parts.sort(key=lambda p: int(p["PartNumber"]))
        _complete(client, where, upload_id, parts, condition)
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(**where, UploadId=upload_id)
        raise


def _send_all(
    pool: ThreadPoolExecutor, f: IO[bytes], part_size: int, workers: int, send: Callable[[int, bytes], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Read parts in order and send them, never more than ``workers`` read but unsent; the first
    failure stops the reading and is raised."""
    pending: set[Future[dict[str, Any]]] = set()
    done: list[dict[str, Any]] = []
    n = 0
    try:
        while chunk := f.read(part_size):
            n += 1
            pending.add(pool.submit(send, n, chunk))
            if len(pending) >= workers:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                done.extend(fut.result() for fut in finished)
        finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
        done.extend(fut.result() for fut in finished)
        return done
    finally:
        for fut in pending:
            fut.cancel()


def _complete(
    client: Any, where: dict[str, str], upload_id: str, parts: list[dict[str, Any]], condition: dict[str, str]
) -> None:
    tries = match_tries(condition)
    for n, cond in enumerate(tries, 1):
        try:
            client.complete_multipart_upload(**where, UploadId=upload_id, MultipartUpload={"Parts": parts}, **cond)
            return
        except Exception as e:
            if n == len(tries) or not is_precondition_failed(e):
                raise
