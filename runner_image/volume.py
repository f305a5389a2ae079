"""The shared volume as the runner sees it: path mapping, the manifest, and the results file.

Manifests speak in container paths under ``/data`` (contract/paths.py CONTAINER_DATA_ROOT). In a runner
container that is where the volume is mounted, so paths map to themselves. ``FFSWARM_DATA_ROOT``
(or ``--data-root``) names another local folder to stand in for ``/data``; it exists only so that
tests and local runs can use a temporary folder, and changes nothing but this translation.

Failures to reach the volume are ``Temporary`` (exit 75): the controller retries elsewhere.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.manifest import ENV_MANIFEST, Manifest
from contract.paths import CONTAINER_DATA_ROOT
from contract.results import ItemResult, ItemStatus, read_results

from .errors import BadManifest, MissingInput, Temporary

ENV_DATA_ROOT = "FFSWARM_DATA_ROOT"

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

    @classmethod
    def from_env(cls, env: Mapping[str, str], override: str | None = None) -> DataRoot:
        return cls(Path(override or env.get(ENV_DATA_ROOT) or CONTAINER_DATA_ROOT))

    def path(self, container_path: str) -> Path:
        """Translate a manifest path; the manifest already guarantees it is normalised under /data."""
        if container_path == CONTAINER_DATA_ROOT:
            return self.local
        prefix = CONTAINER_DATA_ROOT + "/"
        if not container_path.startswith(prefix):
            raise ValueError(f"{container_path!r} is not under {CONTAINER_DATA_ROOT}")
        return self.local / container_path[len(prefix) :]

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


def previous_results(path: Path) -> list[ItemResult]:
    """Result lines of earlier attempts (and earlier runs of this attempt); none if no file yet."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise Temporary(f"cannot read results {path}: {e.strerror or e}") from e
    return read_results(text)


def committed(results: Iterable[ItemResult]) -> dict[str, ItemResult]:
    """Item id -> the last line saying the item is done (ok or no_face); errors are redone."""
    done: dict[str, ItemResult] = {}
    for r in results:
        if r.status in (ItemStatus.OK, ItemStatus.NO_FACE):
            done[r.item] = r
    return done


class ResultsLog:
    """The chunk's append-only results file.

    Each line goes out in ONE ``os.write`` on an ``O_APPEND`` descriptor, then ``fsync``: writers
    of several attempts (an orphaned container may still run) never interleave inside a line, and a
    reader on another node sees the line once it says the output is there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            size = os.fstat(self._fd).st_size
            # A writer killed mid-line leaves a fragment without "\n"; our first line must not be
            # glued onto it (the reader would drop both).
            self._torn = size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"
        except OSError as e:
            raise Temporary(f"cannot open results file {path}: {e.strerror or e}") from e

    def append(self, result: ItemResult) -> None:
        data = result.to_line().encode("utf-8")
        if self._fd is None:
            raise RuntimeError("results log is closed")
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
