"""Objects in an S3-compatible store (``s3://bucket/key``), read and committed with the data volume's
guarantees (safefs.py; issue "Object storage", DESIGN.md).

The PUT is the commit, made by contract/s3put.py (the controller's join uses the same code): one
conditional PutObject, or, where the store honours conditions on CompleteMultipartUpload too
(``conditional_complete``; Ceph RGW does not) or no condition is asked, a multipart upload for a body
over ``multipart_threshold``, its parts sent ``part_workers`` at a time, invisible until
CompleteMultipartUpload and aborted on any error (``Terminated`` included); a runner killed outright
leaves an open upload, never an object (the bucket's AbortIncompleteMultipartUpload rule removes it).
Each object carries its SHA-256 as the S3 checksum (a store that checks it refuses wrong bytes; per
part for multipart) and, with whose commit it is, in its metadata ``ffswarm-job/-item/-attempt/-sha256``:
the metadata is the commit journal. An object is this job's only when it names this job and item
(same sha256: cached; another: replaced by this later attempt); anything else is refused unless
``overwrite``. Conditional writes (If-None-Match: *, If-Match: <etag>) make check and write one step.

Errors (errors.py): wrong credentials, access refused, a missing bucket: MissingInput (66); throttling,
5xx, connection errors after botocore's retries: Temporary (75); a missing input object fails its
item. Messages name bucket and key, never credentials nor the store's text (raised ``from None``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import mimetypes
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple

import boto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from contract.s3 import (
    CACHED,
    MAX_CREDENTIALS_BYTES,
    META_ATTEMPT,
    META_ITEM,
    META_JOB,
    META_SHA256,
    Credentials,
    S3Url,
    commit_condition,
    parse_credentials,
)
from contract.s3put import MIN_PART, UnsafeCommit, Upload, put

from .errors import ItemError, MissingInput, Temporary
from .safefs import EXISTS, Digest
from .volume import is_volume_error

BLOCK = 1024**2

# Codes that mean "these credentials may not do this here" or "the configuration is wrong": the same on
# every node, so no retry (66); then codes a retry later or elsewhere can fix, beyond any 5xx (75).
REFUSED = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "InvalidSecurity", "AuthorizationHeaderMalformed",
    "PermanentRedirect", "InvalidBucketName", "NoSuchBucket"})  # fmt: skip
TRANSIENT = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "InternalError", "ServiceUnavailable", "OperationAborted", "BadDigest", "XAmzContentSHA256Mismatch",
    "NoSuchUpload", "ConditionalRequestConflict"})  # fmt: skip
UNREACHABLE = (HTTPClientError, BotoConnectionError, IncompleteReadError, FlexibleChecksumError)


def item_url(text: str) -> S3Url:
    """An item's ``s3://bucket/key`` (contract/s3.py); a bad one fails its item, naming what is wrong."""
    try:
        return S3Url.parse(text)
    except ValueError as e:
        raise ItemError(f"{text!r}: {e}") from None


def read_credentials(path: str | os.PathLike[str]) -> Credentials:
    """The Swarm secret (its format: contract/s3.py parse_credentials). Errors name the file and the line
    number or the key, never a value: a malformed line may well be the secret itself."""
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: refused, never read
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise MissingInput(f"storage credentials {shown}: not a regular file")
            raw = f.read(MAX_CREDENTIALS_BYTES + 1)
    except OSError as e:
        raise MissingInput(f"storage credentials {shown}: {e.strerror or 'cannot read'}") from None
    try:
        return parse_credentials(raw)
    except ValueError as e:
        raise MissingInput(f"storage credentials {shown}: {e}") from None


@dataclass(frozen=True)
class S3Config:
    """How to reach the store (cluster config ``storage.s3``) and how to upload; checked when built."""

    endpoint_url: str | None = None  # None: AWS itself
    region: str = "us-east-1"
    addressing: str = "path"  # path | virtual | auto
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    max_attempts: int = 5  # botocore's 'standard' retries: backoff with jitter, throttling and 5xx
    max_pool_connections: int = 16  # at least the items in flight (worker.inflight)
    multipart_threshold: int = 16 * 1024**2
    part_size: int = 8 * 1024**2
    part_workers: int = 4  # parts sent at once by one commit
    conditional_writes: bool = True  # If-None-Match / If-Match on the commit (off for stores without them)
    conditional_complete: bool = False  # the store honours them on CompleteMultipartUpload too (not RGW)

    def __post_init__(self) -> None:
        if self.addressing not in ("path", "virtual", "auto"):
            raise ValueError(f"addressing must be path, virtual or auto, not {self.addressing!r}")
        if self.endpoint_url is not None and not re.fullmatch(r"https?://[^\s/?#]+/?", self.endpoint_url):
            raise ValueError("endpoint_url must be http(s)://host[:port]")
        if self.part_size < MIN_PART or min(self.connect_timeout, self.read_timeout, self.max_attempts) <= 0:
            raise ValueError(f"part_size must be at least {MIN_PART}; timeouts and max_attempts positive")
        if self.part_workers < 1:
            raise ValueError("part_workers must be at least 1")

    def upload(self) -> Upload:
        return Upload(self.multipart_threshold, self.part_size, self.part_workers, self.conditional_complete)


def make_client(config: S3Config, credentials: Credentials) -> Any:
    """A boto3 S3 client (thread-safe; one per process). The endpoint is the config's alone: endpoint
    variables and files in the environment are ignored."""
    session = boto3.session.Session(
        aws_access_key_id=credentials.access_key_id, aws_secret_access_key=credentials.secret_access_key,
        aws_session_token=credentials.session_token, region_name=config.region,
    )  # fmt: skip
    # request_checksum_calculation: we send SHA-256 ourselves (botocore would add a CRC32 of its own).
    settings = Config(
        region_name=config.region, signature_version="s3v4", s3={"addressing_style": config.addressing},
        retries={"mode": "standard", "total_max_attempts": config.max_attempts}, connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout, max_pool_connections=config.max_pool_connections,
        ignore_configured_endpoint_urls=True, request_checksum_calculation="when_required",
        response_checksum_validation="when_supported",
    )  # fmt: skip
    return session.client("s3", endpoint_url=config.endpoint_url, config=settings)


class Existing(NamedTuple):
    """An object at an output's key and whose commit its metadata says it is (hostile: malformed is None)."""

    etag: str
    size: int
    job: str | None
    item: str | None
    attempt: int | None
    sha256: str | None

    def mine(self, job: str, item: str) -> bool:
        return self.job == job and self.item == item and self.sha256 is not None


class Committed(NamedTuple):
    """What a commit came to: the object's digest, whether it was already there, whose attempt it is."""

    digest: Digest
    cached: bool
    attempt: int | None


Body = bytes | Path


def _code(e: ClientError) -> tuple[str, int]:
    """The error code (letters and digits only, capped: it is the server's text) and HTTP status."""
    err, meta = e.response.get("Error", {}), e.response.get("ResponseMetadata", {})
    code = re.sub(r"[^A-Za-z0-9]", "", str(err.get("Code", "")))[:64] or "unknown"
    return code, int(meta.get("HTTPStatusCode") or 0)


def translate(e: Exception, url: S3Url, reading: bool) -> Exception:
    """The runner's error for a botocore one; ``reading``: a missing object is the item's input."""
    if isinstance(e, ClientError):
        code, status = _code(e)
        if reading and code in ("NoSuchKey", "404", "NotFound"):
            return ItemError(f"missing input {url}")
        if code == "NoSuchBucket":
            return MissingInput(f"bucket {url.bucket} does not exist ({url})")
        if code in REFUSED or status in (401, 403):
            return MissingInput(f"{url}: refused by the store ({code}): check the credentials and the bucket's policy")
        if code == "PreconditionFailed" or status == 412:
            return ItemError(f"{url}: {EXISTS}")
        if code in TRANSIENT or status >= 500 or status == 429:
            return Temporary(f"{url}: the store is unavailable ({code}, HTTP {status}) after retries")
        return ItemError(f"{url}: refused by the store ({code}, HTTP {status})")
    if isinstance(e, FlexibleChecksumError):
        return ItemError(f"{url}: the bytes read do not match the object's SHA-256 checksum")
    return Temporary(f"{url}: cannot reach the store ({type(e).__name__}) after retries")


@contextlib.contextmanager
def calling(url: S3Url, reading: bool = False) -> Iterator[None]:
    """Run store calls, turning botocore's errors into ours (without their text or chain)."""
    try:
        yield
    except (ClientError, *UNREACHABLE) as e:
        raise translate(e, url, reading) from None


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _opened(body: Body) -> IO[bytes]:
    return io.BytesIO(body) if isinstance(body, bytes) else open(body, "rb")  # noqa: SIM115 (the caller's with)


def digest_of(body: Body) -> tuple[Digest, str]:
    """Size and sha256 (hex, and base64 for the ChecksumSHA256 header) of bytes or a file's content."""
    h, size = hashlib.sha256(), 0
    with _opened(body) as f:
        while block := f.read(8 * BLOCK):
            h.update(block)
            size += len(block)
    return Digest(size, h.hexdigest()), _b64(h.digest())


def _copy_capped(stream: Any, out: Callable[[bytes], object], cap: int, url: S3Url) -> None:
    """Copy a response body to ``out``, refusing more than ``cap`` bytes whatever the length header said."""
    total = 0
    while block := stream.read(BLOCK):
        total += len(block)
        if total > cap:
            raise ItemError(f"{url}: object too large: more than {cap} bytes (limit {cap})")
        out(block)


@dataclass(frozen=True)
class Store:
    """The store as this runner reaches it: one client, shared by every item thread."""

    client: Any
    config: S3Config

    @classmethod
    def connect(cls, config: S3Config, credentials_file: str | os.PathLike[str]) -> Store:
        return cls(make_client(config, read_credentials(credentials_file)), config)

    def check_bucket(self, url: S3Url) -> None:
        """Fail the chunk early (66) when an output's bucket is missing or these credentials may not
        use it; HEAD answers without a body, so a 404 here is the bucket's."""
        with calling(url):
            try:
                self.client.head_bucket(Bucket=url.bucket)
            except ClientError as e:
                if _code(e)[1] == 404:
                    raise MissingInput(f"bucket {url.bucket} does not exist ({url})") from None
                raise

    def read_input(self, url: S3Url, cap: int) -> bytes:
        """A whole object of at most ``cap`` bytes (a photo), read as a stream: no copy on disk."""
        chunks: list[bytes] = []
        with self._get(url, cap) as body:
            _copy_capped(body, chunks.append, cap, url)
        return b"".join(chunks)

    @contextlib.contextmanager
    def fetch_seekable(self, url: S3Url, dest_dir: str | os.PathLike[str], cap: int) -> Iterator[Path]:
        """The object as a temporary file in ``dest_dir`` (the runner's tmpfs), for readers that seek
        (ffmpeg on a video); at most ``cap`` bytes; removed when the block ends, error or not."""
        suffix = m[0] if (m := re.fullmatch(r"\.[A-Za-z0-9]{1,8}", PurePosixPath(url.key).suffix)) else ""
        fd, name = tempfile.mkstemp(prefix=".ffswarm-s3-", suffix=suffix, dir=dest_dir)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f, self._get(url, cap) as body:
                try:
                    _copy_capped(body, f.write, cap, url)
                except OSError as e:
                    if is_volume_error(e):
                        raise Temporary(f"{url}: temporary copy in {dest_dir}: {e.strerror or e}") from None
                    raise
            yield path
        finally:
            path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _get(self, url: S3Url, cap: int) -> Iterator[Any]:
        with calling(url, reading=True):
            response = self.client.get_object(Bucket=url.bucket, Key=url.key, ChecksumMode="ENABLED")
        body = response["Body"]
        try:
            size = int(response.get("ContentLength") or 0)
            if size > cap:
                raise ItemError(f"{url}: object too large: {size} bytes exceeds limit {cap}")
            with calling(url, reading=True):
                yield body
        finally:
            body.close()

    def probe(self, url: S3Url) -> Existing | None:
        """What is at ``url`` now (HEAD), or None; the worker asks this before redoing an item."""
        with calling(url):
            try:
                head = self.client.head_object(Bucket=url.bucket, Key=url.key)
            except ClientError as e:
                if _code(e)[1] == 404:
                    return None  # a HEAD has no body to tell a missing bucket apart: the PUT will
                raise
        meta = {str(k).lower(): str(v) for k, v in (head.get("Metadata") or {}).items()}
        attempt, sha = meta.get(META_ATTEMPT, ""), meta.get(META_SHA256, "")
        return Existing(
            str(head.get("ETag", "")), int(head.get("ContentLength") or 0), meta.get(META_JOB), meta.get(META_ITEM),
            int(attempt) if re.fullmatch(r"[0-9]{1,6}", attempt) else None,
            sha if re.fullmatch(r"[0-9a-f]{64}", sha) else None,
        )  # fmt: skip

    def commit(self, url: S3Url, body: Body, job: str, item: str, attempt: int, overwrite: bool,
               before: Callable[[Digest], None] | None = None) -> Committed:  # fmt: skip
        """``body`` (bytes, or a finished file such as ffmpeg's output) as the object at ``url``, or
        the object already there when it is this job's commit of this item with the same content.
        ``before`` is told the digest just before the write (the worker's journal, as safefs)."""
        digest, b64 = digest_of(body)
        found = self.probe(url)
        seen = None if found is None else (found.etag, found.mine(job, item), (found.size, found.sha256) == digest)
        rule = commit_condition(seen, overwrite)
        if rule == CACHED and found is not None:  # this job's commit of the item, the same bytes
            return Committed(digest, cached=True, attempt=found.attempt)
        if isinstance(rule, str):  # REFUSED
            raise ItemError(f"{url}: {EXISTS}")
        condition = rule if self.config.conditional_writes else {}
        meta = {META_JOB: job, META_ITEM: item, META_ATTEMPT: str(attempt), META_SHA256: digest.sha256}
        content_type = mimetypes.guess_type(url.key)[0] or "application/octet-stream"
        if before is not None:
            before(digest)
        try:
            with calling(url), _opened(body) as f:
                put(self.client, url.bucket, url.key, f, digest.size, b64, meta, content_type, condition,
                    self.config.upload())  # fmt: skip
        except UnsafeCommit as e:
            raise ItemError(f"{url}: not committed: {e}") from None
        return Committed(digest, cached=False, attempt=attempt)
