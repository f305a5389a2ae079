"""The shared volume as the runner sees it: path mapping, the manifest, and the results files.

Manifests speak in container paths under ``/data`` (contract/paths.py CONTAINER_DATA_ROOT). In a runner
container that is where the volume is mounted, so paths map to themselves. ``FFSWARM_DATA_ROOT``
(or ``--data-root``) names another local folder to stand in for ``/data``; it exists only so that
tests and local runs can use a temporary folder, and changes nothing but this translation.

Failures to reach the volume are ``Temporary`` (exit 75): the controller retries elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from contract.manifest import ENV_MANIFEST, Manifest
from contract.paths import CONTAINER_DATA_ROOT
from contract.results import ChunkResults, ItemResult, ItemStatus, chunk_results, read_regular

from . import safefs
from .errors import BadManifest, MissingInput, Temporary

ENV_DATA_ROOT = "FFSWARM_DATA_ROOT"
ENV_SECRETS_ROOT = "FFSWARM_SECRETS_ROOT"  # a local folder standing in for /run/secrets (tests, local runs)

# errno values that mean "the volume itself is in trouble", not "this one file is bad".
VOLUME_ERRNOS = frozenset(
    {errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ENOSPC, errno.EDQUOT, errno.ETIMEDOUT, errno.EHOSTDOWN}
)


def is_volume_error(error: OSError) -> bool:
    """Whether an OSError should end the chunk as temporary rather than fail one item."""
    return error.errno in VOLUME_ERRNOS


@dataclass(frozen=True)
class DataRoot:
    """Where the container's ``/data`` lives on this machine (``/data`` itself in production)."""

    local: Path
    secrets: str | None = None  # where /run/secrets is, when not there (tests: the store's credentials)

    @classmethod
    def from_env(cls, env: Mapping[str, str], override: str | None = None) -> DataRoot:
        return cls(Path(override or env.get(ENV_DATA_ROOT) or CONTAINER_DATA_ROOT), env.get(ENV_SECRETS_ROOT) or None)

    def path(self, container_path: str) -> Path:
        """Translate a manifest path; the manifest already guarantees it is normalised under /data."""
        if container_path == CONTAINER_DATA_ROOT:
            return self.local
        prefix = CONTAINER_DATA_ROOT + "/"
        if not container_path.startswith(prefix):
            raise ValueError(f"{container_path!r} is not under {CONTAINER_DATA_ROOT}")
        return self.local / container_path[len(prefix) :]

    @contextlib.contextmanager
    def fd(self) -> Iterator[int]:
        """A descriptor of the data root, to walk beneath without following links (safefs.py)."""
        try:
            fd = safefs.open_root(self.local)
        except OSError as e:
            raise Temporary(f"data volume not available: {e.strerror or e}") from e
        try:
            yield fd
        finally:
            os.close(fd)

    def manifest_location(self, given: str) -> Path:
        """``FFSWARM_MANIFEST`` is a container path; a local path is accepted as-is for local runs."""
        if given == CONTAINER_DATA_ROOT or given.startswith(CONTAINER_DATA_ROOT + "/"):
            return self.path(given)
        return Path(given)


def read_manifest(root: DataRoot, given: str) -> Manifest:
    """Read and validate the chunk manifest, telling "volume not there" (75) from "no such
    manifest" (66) and "not a manifest" (65: ManifestError propagates from the contract)."""
    if not given:
        raise BadManifest(f"no manifest given (set {ENV_MANIFEST} or pass --manifest)")
    path = root.manifest_location(given)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if not root.local.is_dir():
            raise Temporary(f"data volume not mounted: {root.local} does not exist") from None
        # <run>/chunks/<chunk>.json: a missing run folder means the volume is not (fully) there.
        for folder in (path.parent.parent, path.parent):
            if not folder.is_dir():
                raise Temporary(f"manifest {given}: folder {folder} is absent (volume not available?)") from None
        raise MissingInput(f"manifest {given} not found in {path.parent}") from None
    except IsADirectoryError:
        raise BadManifest(f"manifest {given} is a directory") from None
    except OSError as e:
        raise Temporary(f"cannot read manifest {given}: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadManifest(f"manifest {given} is not UTF-8 text: {e}") from e
    return Manifest.from_json(text)


def previous_results(results_dir: Path, chunk: str) -> ChunkResults:
    """Result lines of every earlier attempt of the chunk (and of earlier runs of this attempt),
    merged (contract/results.py: a commit beats an error, the newest attempt wins); none if the
    folder is not there yet."""
    try:
        return chunk_results(results_dir, chunk)
    except FileNotFoundError:
        return ChunkResults({}, ())
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Temporary("the run folder's results/ is not a folder (a symlink?): not followed") from e
        raise Temporary(f"cannot read results in {results_dir}: {e.strerror or e}") from e


def committed(results: ChunkResults) -> dict[str, ItemResult]:
    """Item id -> the line saying the item is done (ok or no_face); errors are redone."""
    return {item: r for item, r in results.latest.items() if r.status.is_commit()}


_COMMITS = re.compile(r"(?P<chunk>[a-z0-9][a-z0-9-]*)\.a(?P<attempt>[0-9]{1,6})\.commits")
MAX_JOURNAL_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Intent:
    """A journal line: an output about to be renamed into place, as it was when it was renamed."""

    item: str
    output: str
    status: ItemStatus
    faces: int
    size: int
    sha256: str

    def to_line(self) -> str:
        data = {**asdict(self), "status": self.status.value}
        return json.dumps(data, sort_keys=True) + "\n"


def read_journal(results_dir: Path, chunk: str) -> dict[str, list[Intent]]:
    """Item id -> the outputs earlier attempts of ``chunk`` were about to commit (every attempt's
    ``<chunk>.a<n>.commits``; read as hostile: no symlink followed, lines that do not parse skipped)."""
    out: dict[str, list[Intent]] = {}
    try:
        dfd = os.open(results_dir, safefs.DIR_FLAGS)
    except OSError:
        return out
    try:
        for name in os.listdir(dfd):
            m = _COMMITS.fullmatch(name)
            got = read_regular(dfd, name, MAX_JOURNAL_BYTES) if m and m["chunk"] == chunk else None
            for line in (got[0] if got else b"").decode("utf-8", "replace").splitlines():
                try:
                    data = json.loads(line)
                    intent = Intent(**{**data, "status": ItemStatus(data["status"])})
                except (ValueError, TypeError, KeyError):
                    continue
                if isinstance(intent.size, int) and isinstance(intent.sha256, str) and isinstance(intent.faces, int):
                    out.setdefault(str(intent.item), []).append(intent)
    finally:
        os.close(dfd)
    return out


class ResultsLog:
    """This attempt's append-only results file (``results/<chunk>.a<n>.jsonl``: one writer).

    The controller creates it empty before the attempt's service (so NFS lookup caching cannot hide
    it from readers); a local run creates it. Opened without following a symlink, and refused when it
    is not a regular file. Each line goes out in ONE ``os.write`` on an ``O_APPEND`` descriptor, then
    ``fsync``: a reader on another node sees the line once it says the output is there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            dfd = os.open(path.parent, safefs.DIR_FLAGS)  # results/ itself never through a symlink
            try:
                self._fd: int | None = os.open(path.name, flags, 0o640, dir_fd=dfd)
            finally:
                os.close(dfd)
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(self._fd)
                raise OSError(errno.EINVAL, f"is {safefs.kind_of(st.st_mode)}, not a regular file")
            size = st.st_size
            # A writer killed mid-line leaves a fragment without "\n"; our first line must not be
            # glued onto it (the reader would drop both).
            self._torn = size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"
        except OSError as e:
            raise Temporary(f"cannot open results file {path}: {e.strerror or e}") from e

    def append(self, result: ItemResult) -> None:
        self.append_line(result.to_line())

    def append_line(self, line: str) -> None:
        """One line (ending in a newline), durably; safe from several threads (the commit journal)."""
        data = line.encode("utf-8")
        if self._fd is None:
            raise RuntimeError("results log is closed")
        with self._lock:
            if self._torn:
                data, self._torn = b"\n" + data, False
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write to results file ({written} of {len(data)} bytes)")
            os.fsync(self._fd)
        except OSError as e:
            raise Temporary(f"cannot append to results file {self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
