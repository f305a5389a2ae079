"""A local job file read for an upload: its ``source`` and ``targets`` name files on this machine,
relative to the job file's own folder (globs allowed, as in a job file for the data root); every
other field goes to the API as the upload's options, where paths (a ``reference``, an ``output``)
are the tenant's area's, as in a JSON job.

``pairs`` and ``pairs_file`` are not uploaded: a pairs job names its photos in the tenant's area and
goes as JSON (``Client.submit(job)``)."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller import yamlio
from controller.client.errors import ClientError, LocalFileError

MAX_BYTES = 1024**2  # as the cluster's default policy.limits.job_file


@dataclass(frozen=True)
class LocalJob:
    source: tuple[Path, ...]
    targets: tuple[Path, ...]
    options: dict[str, Any]


def read(path: str | os.PathLike[str]) -> LocalJob:
    """The files and options of the job file at ``path``; errors name the file and the field."""
    where = Path(path)
    try:
        raw = where.read_bytes()[: MAX_BYTES + 1]
    except OSError as e:
        raise LocalFileError(f"{where}: cannot be read ({e.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise ClientError(f"{where}: over {MAX_BYTES} bytes; not a job file")
    try:
        data = yamlio.load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        raise ClientError(f"{where}: is not YAML (a job file: docs/job-file.md)") from None
    if not isinstance(data, dict):
        raise ClientError(f"{where}: a job file is a mapping of fields (docs/job-file.md)")
    for key in ("pairs", "pairs_file"):
        if key in data:
            raise ClientError(f"{where}: {key}: a pairs job is not uploaded; send it as JSON with paths in your area")
    base = where.parent
    source = _files(data.get("source"), base, where, "source")
    targets = _files(data.get("targets"), base, where, "targets")
    options = {k: v for k, v in data.items() if k not in ("source", "targets")}
    return LocalJob(source, targets, options)


def _files(value: Any, base: Path, where: Path, field: str) -> tuple[Path, ...]:
    """Each pattern's matches, sorted, relative to ``base``; a pattern matching nothing is an error."""
    if value is None:
        return ()
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise ClientError(f"{where}: {field}: must be a path or a list of paths")
    out: list[Path] = []
    for pattern in patterns:
        full = Path(pattern).expanduser()
        full = full if full.is_absolute() else base / full
        found = sorted(glob.glob(str(full), recursive=True)) if glob.has_magic(pattern) else [str(full)]
        found = [f for f in found if os.path.exists(f)]
        if not found:
            raise LocalFileError(f"{where}: {field}: {pattern!r} matches no file (relative to {base})")
        out += [Path(f) for f in found]
    return tuple(out)
