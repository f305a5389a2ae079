"""The one module that talks to S3 (boto3), and the one place its errors become ours.

At plan time the controller lists globs (paginated, bounded by the policy's targets maximum), checks
single objects with HEAD, and signs result links. It reads and writes bodies for videos only: a video
target is fetched once (streamed, capped) to be probed, and a joined video is committed by PUT like a
runner's output (runner_image/s3io.py does the same for the runners' own). The client is made from
the config and the credentials file, with botocore's 'standard' retries (throttling, 5xx and
connection errors, with backoff) and timeouts; after those retries the error is ours:
StorageTemporaryError (75), StorageAccessError (66), ObjectMissing (item).
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import boto3  # type: ignore[import-untyped]
from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    HTTPClientError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from contract.s3 import CACHED, META_ATTEMPT, META_ITEM, META_JOB, META_SHA256, Credentials, S3Url, commit_condition
from contract.s3put import UnsafeCommit, Upload, put
from controller.errors import FfswarmError, InternalError
from controller.storage.errors import ObjectMissing, StorageAccessError, StorageTemporaryError, TooManyObjects
from controller.storage.probe import Capabilities, probe
from controller.storage.settings import MAX_LINK_TTL, S3Settings, read_credentials
from controller.storage.transfer import (
    BLOCK,
    Committed,
    ObjectChanged,
    ObjectExists,
    ObjectTooLarge,
    digest,
)

__all__ = [
    "Committed",
    "ObjectChanged",
    "ObjectExists",
    "ObjectTooLarge",
    "S3Object",
    "S3Settings",
    "S3Store",
    "S3Url",
    "make_client",
]

CONNECT_TIMEOUT = 10  # seconds to open a connection to the endpoint
READ_TIMEOUT = 60  # seconds to wait for bytes of an answer
MAX_ATTEMPTS = 5  # botocore 'standard' mode: tries in all, with exponential backoff and jitter
PAGE_SIZE = 1000  # keys per ListObjectsV2 page (S3's own maximum)

_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
                "InvalidSecurity", "MissingSecurityHeader"}  # fmt: skip
_DENIED = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"}
_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}
_TEMPORARY = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
              "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted"}  # fmt: skip


@dataclass(frozen=True)
class S3Object:
    url: S3Url
    size: int
    etag: str
    metadata: Mapping[str, str] = field(default_factory=dict)  # x-amz-meta-*, from HEAD only

    def committed_by(self, job: str, item: str) -> bool:
        """Whether its metadata says it is ``job``'s commit of ``item`` (hostile: a malformed digest is not)."""
        meta = {k.lower(): v for k, v in self.metadata.items()}
        sha = meta.get(META_SHA256, "")
        mine = meta.get(META_JOB) == job and meta.get(META_ITEM) == item
        return mine and re.fullmatch(r"[0-9a-f]{64}", sha) is not None

    @property
    def sha256(self) -> str | None:
        return {k.lower(): v for k, v in self.metadata.items()}.get(META_SHA256)


def make_client(
    settings: S3Settings, credentials: Credentials | None = None, *, max_attempts: int = MAX_ATTEMPTS
) -> Any:
    """A boto3 S3 client for the config; credentials from its credentials file (the cluster's
    ``storage.s3.credentials_file`` or a tenant's, S3Settings.for_area) unless given.

    A session of its own: nothing comes from ~/.aws, a profile or AWS_* variables of this process."""
    creds = credentials
    if creds is None:
        creds = read_credentials(settings.credentials_file, settings.credentials_field)
    config = BotoConfig(
        region_name=settings.region,
        signature_version="s3v4",
        s3={"addressing_style": settings.addressing},
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        user_agent_extra="ffswarm",
    )
    session = boto3.session.Session(
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        aws_session_token=creds.session_token,
        region_name=settings.region,
    )
    return session.client("s3", endpoint_url=settings.endpoint_url, config=config)


class S3Store:
    """Listing, HEAD and presigned links on one S3 endpoint; every error comes out as ours."""

    def __init__(self, settings: S3Settings, client: Any) -> None:
        self.settings = settings
        self._client = client
        self._buckets_seen: set[str] = set()  # buckets known to exist: a HEAD 404 there is a missing object

    @classmethod
    def from_settings(cls, settings: S3Settings, credentials: Credentials | None = None) -> S3Store:
        return cls(settings, make_client(settings, credentials))

    def __repr__(self) -> str:
        return f"S3Store(endpoint={self.settings.endpoint_url or 'AWS'!r}, region={self.settings.region!r})"

    def list_matching(self, url: S3Url, limit: int, *, page_size: int = PAGE_SIZE) -> list[S3Object]:
        """The objects a glob (or a plain key) names, in key order, at most ``limit`` of them.

        Lists only under the glob's fixed prefix (with delimiter ``/`` when the glob stays in one
        folder); folder markers (keys ending in ``/``) never match. More than ``limit`` matches, or a
        prefix holding more than ten times that many keys to look through, is TooManyObjects."""
        scan_limit = max(10 * limit, 10_000)
        kwargs: dict[str, Any] = {"Bucket": url.bucket, "Prefix": url.prefix}
        if url.is_glob and url.one_level:
            kwargs["Delimiter"] = "/"
        found: list[S3Object] = []
        scanned = 0
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                **kwargs, PaginationConfig={"PageSize": page_size}
            )
            for page in pages:
                for entry in page.get("Contents", []):
                    key = entry["Key"]
                    scanned += 1
                    if key.endswith("/") or not _valid_key(key) or not url.matches(key):
                        continue
                    found.append(S3Object(url.child(key), int(entry.get("Size", 0)), str(entry.get("ETag", ""))))
                    if len(found) > limit:
                        raise TooManyObjects(
                            url, f"matches more than {limit} objects, the limit (policy.limits.targets)"
                        )
                if scanned > scan_limit:
                    raise TooManyObjects(
                        url,
                        f"more than {scan_limit} objects under s3://{url.bucket}/{url.prefix} to look through "
                        "for the glob: give a longer fixed prefix",
                    )
        except (ClientError, BotoCoreError) as e:
            raise translate(e, url, "list") from None
        self._buckets_seen.add(url.bucket)
        return found

    def head(self, url: S3Url) -> S3Object:
        """One object's size, ETag and metadata; ObjectMissing if it does not exist (its bucket does)."""
        if url.is_glob:
            raise ValueError(f"{url} is a glob: list it, HEAD names one object")
        try:
            answer = self._client.head_object(Bucket=url.bucket, Key=url.key)
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                self._check_bucket(url)  # HEAD answers a bare 404 for a missing bucket too
                raise ObjectMissing(url) from None
            raise translate(e, url, "read") from None
        self._buckets_seen.add(url.bucket)
        meta = answer.get("Metadata") or {}
        return S3Object(url, int(answer.get("ContentLength", 0)), str(answer.get("ETag", "")), dict(meta))

    def presign_get(self, url: S3Url, ttl: int | None = None) -> str:
        """A GET link for one object, valid ``ttl`` seconds (default ``storage.s3.link_ttl``).

        Signed locally: nothing is asked of the server, so the object need not exist yet."""
        seconds = self.settings.link_ttl if ttl is None else ttl
        if url.is_glob or not 0 < seconds <= MAX_LINK_TTL:
            raise ValueError(f"a link names one object for 1 s to 7 d, got {url} for {seconds} s")
        try:
            link: str = self._client.generate_presigned_url(
                "get_object", Params={"Bucket": url.bucket, "Key": url.key}, ExpiresIn=seconds
            )
        except (ClientError, BotoCoreError) as e:
            raise translate(e, url, "sign a link for") from None
        return link

    def probe(self, url: S3Url) -> S3Object | None:
        """What is at ``url`` now (HEAD), or None; a missing bucket is StorageAccessError."""
        try:
            return self.head(url)
        except ObjectMissing:
            return None

    def download(self, url: S3Url, out: IO[bytes], cap: int, *, if_match: str | None = None) -> S3Object:
        """The object streamed into ``out``, at most ``cap`` bytes: an answer whose length is over the
        cap is refused before a byte is read, one that sends more than it said is cut at the cap
        (ObjectTooLarge either way). ``if_match``: the ETag it must still have (ObjectChanged)."""
        extra = {"IfMatch": if_match} if if_match else {}
        try:
            answer = self._client.get_object(Bucket=url.bucket, Key=url.key, **extra)
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("PreconditionFailed", "412"):
                raise ObjectChanged(url) from None
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                self._check_bucket(url)
                raise ObjectMissing(url) from None
            raise translate(e, url, "read") from None
        body = answer["Body"]
        total = 0
        try:
            size = int(answer.get("ContentLength") or 0)
            if size > cap:
                raise ObjectTooLarge(url, size, cap)
            while block := body.read(BLOCK):
                total += len(block)
                if total > cap:
                    raise ObjectTooLarge(url, None, cap)
                out.write(block)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, url, "read") from None
        finally:
            body.close()
        self._buckets_seen.add(url.bucket)
        return S3Object(url, total, str(answer.get("ETag", "")), dict(answer.get("Metadata") or {}))

    def commit_file(self, url: S3Url, f: IO[bytes], job: str, item: str, attempt: int, overwrite: bool) -> Committed:
        """``f`` (a finished file, read from its start) as the object at ``url``, by the runner's rule:
        this job's commit of ``item`` with the same bytes is kept (cached); another job's object is
        ObjectExists unless ``overwrite``. The PUT carries its SHA-256 and the job's metadata and is
        conditional (If-None-Match: * for a new key, If-Match for a replaced one), so an object written
        meanwhile is never replaced. The upload is contract/s3put.py's: one PUT unless the store is
        known to honour conditions on CompleteMultipartUpload (``upload``), parts aborted on any error:
        the object appears whole or not at all."""
        size, sha, b64 = digest(f)
        found = self.probe(url)
        seen = (
            None
            if found is None
            else (found.etag, found.committed_by(job, item), (found.size, found.sha256) == (size, sha))
        )
        condition = commit_condition(seen, overwrite)
        if condition == CACHED:
            return Committed(size, sha, cached=True)
        if isinstance(condition, str):  # REFUSED: another job's object
            raise ObjectExists(url)
        meta = {META_JOB: job, META_ITEM: item, META_ATTEMPT: str(attempt), META_SHA256: sha}
        kind = mimetypes.guess_type(url.key)[0] or "application/octet-stream"
        try:
            f.seek(0)
            put(self._client, url.bucket, url.key, f, size, b64, meta, kind, condition, self.upload)
        except UnsafeCommit as e:
            raise ObjectExists(url, f"not committed: {e}") from None
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise ObjectExists(url) from None
            raise translate(e, url, "write") from None
        self._buckets_seen.add(url.bucket)
        return Committed(size, sha, cached=False)

    upload = Upload()  # per store: tests make parts small; a job's store honours conditional completes or not

    def capabilities(self, where: S3Url) -> Capabilities:
        """What the store honours, tried on scratch keys under ``where`` (controller/storage/probe.py;
        no presigned link is waited for); a refusal or an unreachable store comes out as ours."""
        try:
            return probe(self._client, where)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, where, "write") from None

    def _check_bucket(self, url: S3Url) -> None:
        if url.bucket in self._buckets_seen:
            return
        try:
            self._client.head_bucket(Bucket=url.bucket)
        except (ClientError, BotoCoreError) as e:
            if _code(e) in ("404", "NoSuchBucket", "NotFound"):
                raise _no_bucket(url) from None
            raise translate(e, url, "read") from None
        self._buckets_seen.add(url.bucket)


def translate(error: Exception, url: S3Url, action: str) -> FfswarmError:
    """A botocore error as ours; the text names the URL, the S3 error code and HTTP status, and never
    the server's own message or anything of the request (its headers carry the signature)."""
    if isinstance(error, BotoConnectionError | HTTPClientError):
        return StorageTemporaryError(url, f"could not {action} it: no answer from the storage endpoint "
                                     f"({type(error).__name__})")  # fmt: skip
    if not isinstance(error, ClientError):
        return InternalError(f"{url}: could not {action} it: {type(error).__name__}")
    code, status = _code(error), _status(error)
    said = f"S3 {code}, HTTP {status}"
    if code in _CREDENTIALS:
        return StorageAccessError(url, f"the storage refused the credentials ({said}): check the access key in "
                                  f"storage.s3.credentials_file; bucket {url.bucket!r}, key {url.key!r}")  # fmt: skip
    if code == "NoSuchBucket":
        return _no_bucket(url)
    if code in _DENIED:
        return StorageAccessError(url, f"access denied ({said}): the access key may not {action} bucket "
                                  f"{url.bucket!r}, key {url.key!r}, or the credentials are wrong")  # fmt: skip
    if code in _REGION:
        return StorageAccessError(url, f"bucket {url.bucket!r} is not reachable with storage.s3.region / "
                                  f"endpoint_url ({said})")  # fmt: skip
    if code in _TEMPORARY or status >= 500 or status == 429:
        return StorageTemporaryError(url, f"the storage could not {action} it now ({said})")
    if code in ("NoSuchKey", "404"):
        return ObjectMissing(url)
    return StorageAccessError(url, f"the storage refused to {action} it ({said}); bucket {url.bucket!r}, "
                              f"key {url.key!r}")  # fmt: skip


def _no_bucket(url: S3Url) -> StorageAccessError:
    return StorageAccessError(url, f"bucket {url.bucket!r} does not exist (key {url.key!r})")


def _code(error: Exception) -> str:
    if not isinstance(error, ClientError):
        return ""
    return str(error.response.get("Error", {}).get("Code", ""))


def _status(error: ClientError) -> int:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status if isinstance(status, int) else 0


def _valid_key(key: str) -> bool:
    """A listed key we can name as an S3Url (a hostile or odd key is skipped, never planned)."""
    try:
        S3Url("aaa", key)
    except ValueError:
        return False
    return True
