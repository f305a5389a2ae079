"""Object storage as the controller and the runner both see it (issue "Object storage", docs/storage.md).

``s3://bucket/key`` URLs and their prefix globs, checked when parsed; the credentials file's format
(the Swarm secret both read); the metadata names that make an object a job's commit. Pure: no
client, no network (the controller's client: controller/storage/s3.py; the runner's: runner_image/s3io.py).

A glob (``*``, ``?``, ``**``) may appear only in the key; the listing prefix is the key up to its first
glob character, so ``s3://b/crowd/img_*.jpg`` lists only under ``crowd/img_``. ``*`` and ``?`` never
cross a ``/``; ``**`` is a whole segment and matches any number of segments (none included). Every
other character, ``[`` and ``]`` among them, is literal.
"""

from __future__ import annotations

import functools
import ipaddress
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError
from contract.paths import require_container_path

SCHEME = "s3://"
# An object committed by a runner carries these (x-amz-meta-…): whose commit it is, and its digest.
META_JOB, META_ITEM, META_ATTEMPT, META_SHA256 = "ffswarm-job", "ffswarm-item", "ffswarm-attempt", "ffswarm-sha256"
MAX_KEY_BYTES = 1024
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BAD_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BAD_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_GLOB_CHARS = "*?"


CACHED = "cached"  # commit_condition: this job's commit with these bytes is there already: nothing to send
REFUSED = "refused"  # another job's object, and no overwrite


def commit_condition(found: tuple[str, bool, bool] | None, overwrite: bool) -> dict[str, str] | str:
    """The one rule by which a runner (runner_image/s3io.py) and the controller's join
    (controller/storage/s3.py) commit an object: ``found`` is (ETag, whether its metadata says it is
    this job's commit of this item, whether it has the same size and sha256), or None when nothing is
    at the key. Returns CACHED, REFUSED, or the PUT's precondition: If-None-Match for a new key,
    If-Match on the ETag seen for one replaced (an earlier attempt of ours, or with ``overwrite``), so
    an object written meanwhile is never replaced."""
    if found is None:
        return {"IfNoneMatch": "*"}
    etag, mine, same = found
    if mine and same:
        return CACHED
    if not mine and not overwrite:
        return REFUSED
    return {"IfMatch": etag}


def is_s3(text: object) -> bool:
    """Whether a manifest's path is an object in the store rather than a container path."""
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    """A bucket and a key (or, for a glob, a key pattern); valid by construction."""

    bucket: str
    key: str

    def __post_init__(self) -> None:
        check_bucket(self.bucket)
        check_key(self.key)

    @classmethod
    def parse(cls, text: object) -> S3Url:
        """``s3://bucket/key`` → S3Url; a refusal is a ValueError saying what is wrong."""
        if not isinstance(text, str) or not text.startswith(SCHEME):
            raise ValueError("must be an s3://bucket/key URL")
        bucket, sep, key = text[len(SCHEME) :].partition("/")
        if not sep or not key:
            raise ValueError(f"s3://{bucket} names a bucket but no key (write s3://{bucket}/KEY)")
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def is_glob(self) -> bool:
        return any(c in self.key for c in _GLOB_CHARS)

    @property
    def prefix(self) -> str:
        """What to list under: the key up to its first glob character (the whole key if none)."""
        cut = min((i for i, c in enumerate(self.key) if c in _GLOB_CHARS), default=len(self.key))
        return self.key[:cut]

    @property
    def one_level(self) -> bool:
        """The glob part never crosses a ``/``: a listing with delimiter ``/`` sees every match."""
        rest = self.key[len(self.prefix) :]
        return "/" not in rest and "**" not in rest

    def matches(self, key: str) -> bool:
        """A listed key against this URL: the glob for a glob, the key itself otherwise."""
        return _pattern(self.key).fullmatch(key) is not None if self.is_glob else key == self.key

    def child(self, key: str) -> S3Url:
        """The object ``key`` in the same bucket (what a glob's listing yields)."""
        return S3Url(self.bucket, key)


def check_bucket(bucket: str) -> None:
    """The S3 bucket naming rules (the strict ones every S3-compatible store accepts)."""
    if not isinstance(bucket, str) or not bucket:
        raise ValueError("the bucket name is empty")
    if not 3 <= len(bucket) <= 63:
        raise ValueError(f"bucket {bucket!r} must be 3 to 63 characters long")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(
            f"bucket {bucket!r} may hold only a-z, 0-9, '.' and '-', and must begin and end with a letter or digit"
        )
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        raise ValueError(f"bucket {bucket!r} must not have '..', '.-' or '-.'")
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        pass
    else:
        raise ValueError(f"bucket {bucket!r} must not be an IP address")
    if bucket.startswith(_BAD_BUCKET_PREFIXES) or bucket.endswith(_BAD_BUCKET_SUFFIXES):
        raise ValueError(f"bucket {bucket!r} uses a prefix or suffix S3 reserves")


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError("the key is empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ValueError(f"the key is longer than {MAX_KEY_BYTES} bytes (UTF-8)")
    bad = next((c for c in key if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000), None)
    if bad is not None:
        raise ValueError(f"the key holds a control character (U+{ord(bad):04X})")
    segments = key.split("/")
    if key.startswith("/") or "" in segments[:-1]:
        raise ValueError(f"the key {key!r} has an empty path segment ('//' or a leading '/')")
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"the key {key!r} has a '.' or '..' segment")
    for s in segments:
        if "**" in s and s != "**":
            raise ValueError(f"'**' must be a whole path segment (like crowd/**/*.jpg), got segment {s!r}")


@functools.lru_cache(maxsize=256)  # a listing matches thousands of keys against one glob
def _pattern(glob: str) -> re.Pattern[str]:
    """A key glob as a regular expression."""
    parts: list[str] = []
    segments = glob.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            parts.append(".*" if last else "(?:[^/]*/)*")  # any number of whole segments, none included
            continue
        out = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in seg)
        parts.append(out if last else out + "/")
    return re.compile("".join(parts), re.DOTALL)


# -- credentials ----------------------------------------------------------------------------------
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MAX_CREDENTIALS_BYTES = 64 * 1024
_CRED_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)")


@dataclass(frozen=True, repr=False)
class Credentials:
    """An access key pair; ``repr`` and ``str`` never show any part of it."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return "Credentials(<hidden>)"

    __str__ = __repr__


def parse_credentials(raw: bytes) -> Credentials:
    """The Swarm secret's ``AWS_ACCESS_KEY_ID=…`` / ``AWS_SECRET_ACCESS_KEY=…`` (/ ``AWS_SESSION_TOKEN=…``)
    lines; blank lines, ``#`` comments, ``export`` and quotes allowed. A ValueError names the line
    number or the key, never a character of a line: a malformed line may well be the secret itself.
    The caller reads the file (at most MAX_CREDENTIALS_BYTES) and names it."""
    if len(raw) > MAX_CREDENTIALS_BYTES:
        raise ValueError(f"is larger than {MAX_CREDENTIALS_BYTES} bytes: not a credentials file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    found: dict[str, str] = {}
    keys = ", ".join(CREDENTIAL_KEYS)
    for n, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        m = _CRED_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"line {n} is not KEY=value (keys: {keys})")
        key, val = m.group(1), _unquote(m.group(2).strip())
        if key not in CREDENTIAL_KEYS:
            raise ValueError(f"line {n} has an unknown key (keys: {keys})")
        if key in found:
            raise ValueError(f"line {n} gives {key} a second time")
        if not val or any(c.isspace() or not c.isprintable() for c in val):
            raise ValueError(f"line {n}: the value of {key} is empty or holds spaces or control characters")
        found[key] = val
    missing = [k for k in CREDENTIAL_KEYS[:2] if k not in found]
    if missing:
        raise ValueError(f"lacks {' and '.join(missing)}")
    return Credentials(found[CREDENTIAL_KEYS[0]], found[CREDENTIAL_KEYS[1]], found.get(CREDENTIAL_KEYS[2]))


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


# -- how a runner reaches the store (a manifest's ``storage`` block) ----------------------------------
SECRETS_DIR = "/run/secrets/"
ADDRESSING = ("path", "virtual")
_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?/?")
_REGION = re.compile(r"[a-z0-9-]{1,32}")
_STORAGE_KEYS = ("endpoint_url", "region", "addressing", "credentials_file", "conditional_complete")


@dataclass(frozen=True)
class StorageAccess:
    """The store as a manifest names it: where it is and which file (the Swarm secret, mounted in
    the runner) holds the credentials. Never a key or a secret itself. Checked as hostile when built;
    a refusal is a ManifestError naming the field (``storage.addressing``)."""

    endpoint_url: str | None = None  # None: AWS S3 itself
    region: str = "us-east-1"
    addressing: str = "path"  # path | virtual
    credentials_file: str = "/run/secrets/ffswarm-s3"
    # The controller probed the store: it refuses a CompleteMultipartUpload whose condition fails, so
    # conditional commits may go up in parts (contract/s3put.py); False: one PUT, up to 5 GiB.
    conditional_complete: bool = False

    def __post_init__(self) -> None:
        e = self.endpoint_url
        if e is not None and (not isinstance(e, str) or not _ENDPOINT.fullmatch(e)):
            raise ManifestError("storage.endpoint_url: must be http(s)://host[:port] (no path, query or user)")
        if not isinstance(self.region, str) or not _REGION.fullmatch(self.region):
            raise ManifestError("storage.region: must be 1 to 32 characters of a-z, 0-9 and '-'")
        if self.addressing not in ADDRESSING:
            raise ManifestError(f"storage.addressing: must be one of {', '.join(ADDRESSING)}")
        f = self.credentials_file
        if (
            not isinstance(f, str)
            or not f.startswith(SECRETS_DIR)
            or len(f) > 255
            or posixpath.normpath(f) != f
            or not re.fullmatch(r"[A-Za-z0-9._/-]+", f)
            or f == SECRETS_DIR.rstrip("/")
        ):
            raise ManifestError(f"storage.credentials_file: must be a normalised file path under {SECRETS_DIR}")
        if not isinstance(self.conditional_complete, bool):
            raise ManifestError("storage.conditional_complete: must be true or false")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: getattr(self, k) for k in _STORAGE_KEYS}
        if self.endpoint_url is None:
            del data["endpoint_url"]
        if not self.conditional_complete:  # the safe path: as manifests were before the store was probed
            del data["conditional_complete"]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> StorageAccess:
        if not isinstance(data, dict):
            raise ManifestError("storage: must be an object")
        unknown = sorted(str(k)[:40] for k in data if k not in _STORAGE_KEYS)
        if unknown:
            raise ManifestError(f"storage.{unknown[0]}: unknown field (known: {', '.join(_STORAGE_KEYS)})")
        for key in _STORAGE_KEYS:
            if key == "conditional_complete" or key not in data:
                continue  # a bool, checked when built
            if not isinstance(data[key], str) and not (key == "endpoint_url" and data[key] is None):
                raise ManifestError(f"storage.{key}: must be a string")
        return cls(**data)


def require_location(text: object, what: str, allow_s3: bool = True) -> None:
    """A manifest's input, output or photo: a container path under /data, or (``allow_s3``) one
    object ``s3://bucket/key`` (no glob: the controller lists globs at plan time)."""
    if allow_s3 and is_s3(text):
        try:
            url = S3Url.parse(text)
        except ValueError as e:
            raise ManifestError(f"{what}: {e}") from None
        if url.is_glob:
            raise ManifestError(f"{what}: {text!r} is a glob; a manifest names single objects")
        if url.key.endswith("/"):
            raise ManifestError(f"{what}: {text!r} names a folder, not an object")
        return
    require_container_path(text, what)  # type: ignore[arg-type]  # it refuses a non-string itself
