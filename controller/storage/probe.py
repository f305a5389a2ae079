"""What an S3 store honours, found by trying it on scratch keys (``ffswarm doctor --store``;
docs/storage.md): commits lean on conditional writes, and stores differ (Ceph RGW ignores conditions
on CompleteMultipartUpload and refuses a quoted If-Match), so an operator sees which guarantees hold
before a job relies on them.

Every try is made on keys under ``<prefix>.ffswarm-probe-<random>/`` and removed afterwards; each
answer is kept as the store gave it (honoured / ignored / refused), never the store's text.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.s3 import S3Url
from contract.s3put import b64

HONOURED, IGNORED, REFUSED = "honoured", "ignored", "refuses a matching one"


@dataclass(frozen=True)
class Capabilities:
    """One store's answers: each a short phrase (HONOURED, IGNORED, REFUSED or what failed)."""

    endpoint: str
    put_if_none_match: str  # PUT If-None-Match: * on an existing key is 412
    if_match_quoted: str  # PUT If-Match "<etag>": a matching one passes, a wrong one is 412
    if_match_unquoted: str  # the same with the ETag unquoted
    complete_if_none_match: str  # CompleteMultipartUpload If-None-Match: * on an existing key is 412
    complete_if_match: str  # CompleteMultipartUpload If-Match with a wrong ETag is 412
    checksum_sha256: str  # a PUT with a wrong x-amz-checksum-sha256 is refused
    presigned_expiry: str  # an expired presigned GET is refused (checked only when asked: it waits)

    def lines(self) -> list[str]:
        return [
            f"PUT If-None-Match: *: {self.put_if_none_match}",
            f"PUT If-Match (quoted ETag): {self.if_match_quoted}",
            f"PUT If-Match (unquoted ETag): {self.if_match_unquoted}",
            f"CompleteMultipartUpload If-None-Match: *: {self.complete_if_none_match}",
            f"CompleteMultipartUpload If-Match: {self.complete_if_match}",
            f"x-amz-checksum-sha256 on PUT: {self.checksum_sha256}",
            f"presigned link expiry: {self.presigned_expiry}",
        ]

    @property
    def safe(self) -> bool:
        """Whether ffswarm's commits hold here: atomic create, and If-Match in one of its forms."""
        return self.missing() is None

    def missing(self) -> str | None:
        """The guarantee a conditional commit needs that this store does not give, in the doctor's
        words (None: both hold). Without it a commit could replace an object written meanwhile."""
        if self.put_if_none_match != HONOURED:
            return "PUT If-None-Match: *"
        if HONOURED not in (self.if_match_quoted, self.if_match_unquoted):
            return "PUT If-Match"
        return None

    @property
    def conditional_complete(self) -> bool:
        """Whether conditional commits may go up in parts: the store refuses a CompleteMultipartUpload
        whose If-None-Match or If-Match does not hold (Ceph RGW Pacific and moto do not both)."""
        return self.complete_if_none_match == HONOURED and self.complete_if_match == HONOURED


def _status(e: Exception) -> int:
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]  # the s3 extra: only when probing

    if isinstance(e, ClientError):
        return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def _answer(call: Callable[[], object]) -> int:
    """The HTTP status a call got: 200 when it went through."""
    from botocore.exceptions import ClientError

    try:
        call()
        return 200
    except ClientError as e:
        return _status(e) or 400


def _if_match(client: Any, bucket: str, key: str, etag: str) -> str:
    ok = _answer(lambda: client.put_object(Bucket=bucket, Key=key, Body=b"2", IfMatch=etag))
    etag = client.head_object(Bucket=bucket, Key=key)["ETag"]
    wrong = _answer(lambda: client.put_object(Bucket=bucket, Key=key, Body=b"3", IfMatch="0" * 32))
    if ok != 200:
        return REFUSED if ok == 412 else f"answers HTTP {ok}"
    return HONOURED if wrong == 412 else IGNORED


def probe(
    client: Any, url: S3Url, expiry: Callable[[str], bool] | None = None, presign: Callable[[str], str] | None = None
) -> Capabilities:
    """The store's answers, tried under ``url`` (a bucket and a key prefix); ``presign(key)`` and
    ``expiry(link)`` (True when the store refused a link signed to expire at once) check links."""
    from botocore.exceptions import BotoCoreError, ClientError

    base = f"{url.key}.ffswarm-probe-{secrets.token_hex(4)}/" if url.key else f".ffswarm-probe-{secrets.token_hex(4)}/"
    bucket, key = url.bucket, base + "object"
    made: list[str] = [key]
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
        again = _answer(lambda: client.put_object(Bucket=bucket, Key=key, Body=b"x", IfNoneMatch="*"))
        put_inm = HONOURED if again == 412 else IGNORED if again == 200 else f"answers HTTP {again}"
        quoted = _if_match(client, bucket, key, client.head_object(Bucket=bucket, Key=key)["ETag"])
        unquoted = _if_match(client, bucket, key, client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"'))
        complete = _complete(client, bucket, key, {"IfNoneMatch": "*"})
        complete_match = _complete(client, bucket, key, {"IfMatch": "0" * 32})
        bad = b64(hashlib.sha256(b"not these bytes").digest())
        made.append(base + "checksum")
        sent = _answer(lambda: client.put_object(Bucket=bucket, Key=base + "checksum", Body=b"these bytes",
                                                 ChecksumAlgorithm="SHA256", ChecksumSHA256=bad))  # fmt: skip
        checksum = HONOURED if sent == 400 else IGNORED if sent == 200 else f"answers HTTP {sent}"
        link = "not checked (doctor --store checks it)"
        if presign is not None and expiry is not None:
            link = HONOURED if expiry(presign(key)) else IGNORED
        return Capabilities(
            str(client.meta.endpoint_url), put_inm, quoted, unquoted, complete, complete_match, checksum, link
        )
    finally:
        for k in made:
            with contextlib.suppress(ClientError, BotoCoreError):
                client.delete_object(Bucket=bucket, Key=k)


def _complete(client: Any, bucket: str, key: str, condition: dict[str, str]) -> str:
    """Whether CompleteMultipartUpload under ``condition`` (which does not hold on the existing
    ``key``) is refused; a store that refuses multipart uploads themselves answers their status."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    except ClientError as e:
        return f"answers HTTP {_status(e) or 400}"
    try:
        part = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"multipart")
        done = _answer(lambda: client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, **condition,
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        ))  # fmt: skip
        return HONOURED if done == 412 else IGNORED if done == 200 else f"answers HTTP {done}"
    finally:
        with contextlib.suppress(ClientError, BotoCoreError):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)


def expired_is_refused(link: str, wait: Callable[[float], None]) -> bool:
    """Whether the store refuses ``link`` (signed for one second) once it has expired."""
    wait(2.0)
    try:
        with urllib.request.urlopen(link, timeout=10):  # noqa: S310 (the store's own endpoint, http(s) only)
            return False
    except urllib.error.HTTPError as e:
        return e.code == 403
