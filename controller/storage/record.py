"""What each store honours, probed once and kept (docs/storage.md#what-ffswarm-records-about-a-store):
``ffswarm doctor --store`` and the first job that writes to a store whose record is missing or older
than ``storage.s3.probe_max_age`` probe it (controller/storage/probe.py) and record the answers;
later jobs read them, so a job is refused, or its commits take the safe path, by what the store
really does rather than by what it is assumed to do.

A record is ``runs/.stores/<sha256 of endpoint and bucket>.json`` on the data root, in a folder only
the controller writes (0700). It decides whether a commit may replace another job's object, so it is
trusted only as the controller's own: reached without following a link, a regular file with one
link, owned by root or the controller and never the runner, writable by no one else, at most
MAX_BYTES, naming this endpoint and bucket, probed in the past. Anything else (a runner's forgery, a
torn or corrupt file) is no record at all: the store is probed again and the record rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

from contract.layout import RUNS
from controller import log as ffswarm_log
from controller.storage.errors import StorageAccessError
from controller.storage.probe import Capabilities
from controller.storage.url import S3Url
from controller.volume import Owner, UnsafePath, Volume

FOLDER = f"{RUNS}/.stores"
MAX_BYTES = 16 * 1024
FOLDER_MODE, RECORD_MODE = 0o700, 0o600
CLOCK_SKEW = 300.0  # a record probed further in the future than this is not believed
_FIELDS = tuple(f.name for f in fields(Capabilities))


@dataclass(frozen=True)
class Record:
    """One store's answers, where they were probed (``endpoint`` as the config names it, ``bucket``)
    and when (unix time)."""

    endpoint: str
    bucket: str
    probed_at: float
    capabilities: Capabilities

    def to_json(self) -> bytes:
        data = {"endpoint": self.endpoint, "bucket": self.bucket, "probed_at": self.probed_at,
                "capabilities": asdict(self.capabilities)}  # fmt: skip
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Record | None:
        """The record, or None for anything that is not one (read as hostile)."""
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(data, dict) or set(data) != {"endpoint", "bucket", "probed_at", "capabilities"}:
            return None
        caps, at = data["capabilities"], data["probed_at"]
        if not isinstance(caps, dict) or set(caps) != set(_FIELDS):
            return None
        texts = [data["endpoint"], data["bucket"], *caps.values()]
        if not all(isinstance(t, str) and 0 < len(t) <= 512 for t in texts):
            return None
        if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
            return None
        return cls(data["endpoint"], data["bucket"], float(at), Capabilities(**caps))


def endpoint_of(endpoint_url: str | None, region: str) -> str:
    """A store's name in its records: the configured endpoint, or AWS S3's region."""
    return endpoint_url or f"aws-s3:{region}"


@dataclass(frozen=True)
class Records:
    """The records of one data root: written as ``owner`` (the controller), believed only when owned
    by one of ``trusted`` (controller/job/owners.py trusted_uids: root and the controller, never the
    runner)."""

    volume: Volume
    owner: Owner | None
    trusted: frozenset[int]
    clock: Callable[[], float] = time.time

    @staticmethod
    def path(endpoint: str, bucket: str) -> str:
        digest = hashlib.sha256("\n".join((endpoint, bucket)).encode()).hexdigest()
        return f"{FOLDER}/{digest}.json"

    def load(self, endpoint: str, bucket: str) -> Record | None:
        """The trusted record of ``bucket`` on ``endpoint``; None when there is none to believe."""
        raw = self.volume.read_trusted(
            FOLDER, self.path(endpoint, bucket).rsplit("/", 1)[1], self.trusted, MAX_BYTES, 0o077
        )
        if raw is None:
            return None
        found = Record.from_json(raw)
        if found is None or (found.endpoint, found.bucket) != (endpoint, bucket):
            return None
        return found if found.probed_at <= self.clock() + CLOCK_SKEW else None

    def save(self, endpoint: str, bucket: str, capabilities: Capabilities) -> Record:
        """Record ``capabilities`` as probed now (the folder made 0700 and the controller's, the file
        replaced atomically, 0600). A record that cannot be written is only logged: the answers
        still decide for this job, and the next one probes again."""
        record = Record(endpoint, bucket, round(self.clock(), 3), capabilities)
        try:
            self.volume.mkdirs(FOLDER, self.owner, FOLDER_MODE, enforce=True, exact=True)
            self.volume.write_atomic(self.path(endpoint, bucket), record.to_json(), self.owner, RECORD_MODE)
        except (OSError, UnsafePath) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            ffswarm_log.get().warning("store_record_not_written", file=FOLDER, bucket=bucket, reason=reason)
        return record

    def current(self, endpoint: str, bucket: str, max_age: float, probe: Callable[[], Capabilities]) -> Record:
        """The record when it is at most ``max_age`` seconds old; else ``probe()``'s answers, recorded."""
        found = self.load(endpoint, bucket)
        if found is not None and self.clock() - found.probed_at <= max_age:
            return found
        return self.save(endpoint, bucket, probe())


def commit_mode(
    records: Records, endpoint: str, max_age: float, outputs: Sequence[S3Url], probe: Callable[[S3Url], Capabilities]
) -> bool:
    """Whether the conditional commits of a job writing ``outputs`` may go up in parts (every
    output bucket honours conditions on CompleteMultipartUpload), after each bucket's record is
    read or probed (``probe(where)``, under the folder of its first output there; a probe these keys
    may not make there is logged and leaves that bucket to one PUT per commit). A bucket whose
    store lacks a guarantee that commits need refuses the job (StorageAccessError: exit 66), naming
    the store, the capability and the fix: there a commit could silently replace another's object."""
    firsts: dict[str, S3Url] = {}
    for url in outputs:
        firsts.setdefault(url.bucket, url)
    parts = True
    for bucket, url in sorted(firsts.items()):
        folder = url.key.rpartition("/")[0]
        where = S3Url(bucket, f"{folder}/") if folder else url  # scratch keys beside the job's own
        try:
            record = records.current(endpoint, bucket, max_age, functools.partial(probe, where))
        except StorageAccessError as e:  # refused or no bucket: the runner's own check of it says so (66)
            ffswarm_log.get().warning("store_not_probed", bucket=bucket, reason=e.reason)
            parts = False
            continue
        missing = record.capabilities.missing()
        if missing is not None:
            raise StorageAccessError(url, f"the store {endpoint} does not honour {missing} in bucket {bucket!r} "
                                     "(ffswarm doctor --store), so a commit could silently replace another "
                                     "object: use a store that honours conditional PUT")  # fmt: skip
        parts = parts and record.capabilities.conditional_complete
    return parts
