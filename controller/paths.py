"""Containment under the data root.

Job files name paths relative to the shared volume, and everything the controller hands a runner is
a ``/data/...`` path. A job file must never make ffswarm read or write outside that volume, neither
with ``..`` nor through a symlink that points elsewhere, so every user path passes through here.
Errors are plain ``ValueError``s; callers know the file and field and wrap them into ``JobFileError``.
"""

from __future__ import annotations

import glob
import os
import posixpath
from pathlib import Path

from runner_image.manifest import CONTAINER_DATA_ROOT


def check_relative(rel: str, *, what: str) -> str:
    """Refuse what can be refused without looking at the disk; return ``rel`` normalised (posix).

    Lets a job file fail at load time, before any data root is known.
    """
    _check_form(rel, what=what)
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        raise ValueError(f"{rel!r} leads out of the data root")
    return norm


def resolve_inside(root: Path, rel: str, *, what: str) -> Path:
    """The real (symlink-free) host path of ``rel`` under ``root``, or ValueError if it leaves it.

    The path need not exist. ``root`` itself counts as inside.
    """
    _check_form(rel, what=what)
    root_abs = os.path.abspath(root)
    root_real = os.path.realpath(root)
    lexical = os.path.normpath(os.path.join(root_abs, rel))
    if not _is_within(lexical, root_abs):
        raise ValueError(f"{rel!r} escapes the data root {root}")
    real = os.path.realpath(os.path.join(root_abs, rel))
    if not _is_within(real, root_real):
        raise ValueError(f"{rel!r} resolves outside the data root through a symlink")
    return Path(real)


def to_container(root: Path, host_path: Path) -> str:
    """``/data/<rel>`` for a host path under ``root`` (as given, or with symlinks resolved)."""
    rel = relative_to_root(root, host_path)
    return CONTAINER_DATA_ROOT if rel == "." else f"{CONTAINER_DATA_ROOT}/{rel}"


def relative_to_root(root: Path, host_path: Path) -> str:
    """Normalised posix path of ``host_path`` relative to ``root`` ("." for the root itself)."""
    candidates = (
        (os.path.abspath(host_path), os.path.abspath(root)),
        (os.path.abspath(host_path), os.path.realpath(root)),
        (os.path.realpath(host_path), os.path.realpath(root)),
    )
    for host, base in candidates:
        if _is_within(host, base):
            return Path(os.path.relpath(host, base)).as_posix()
    raise ValueError(f"{str(host_path)!r} is not under the data root {root}")


def safe_glob(root: Path, pattern: str) -> list[Path]:
    """Files under ``root`` matching ``pattern`` (``**`` recurses), real paths, sorted.

    Folders and hidden names (temporary files being written, ``.``-prefixed) are left out; a match
    that is a symlink leading out of the root is refused rather than skipped, so a job never silently
    loses an input.
    """
    check_relative(pattern, what="glob pattern")
    found: set[Path] = set()
    for match in glob.glob(pattern, root_dir=root, recursive=True):
        if posixpath.basename(match.rstrip("/")).startswith("."):
            continue
        if match.split("/", 1)[0] in RESERVED_TOP and not pattern.startswith(match.split("/", 1)[0] + "/"):
            continue  # a broad glob (**/*.jpg) never picks up run folders or model packs
        real = resolve_inside(root, match, what="glob match")
        if real.is_file():
            found.add(real)
    return sorted(found)


RESERVED_TOP = ("runs", "models")


def _check_form(rel: str, *, what: str) -> None:
    if not isinstance(rel, str) or not rel.strip():
        raise ValueError(f"{what} is empty")
    if "\0" in rel:
        raise ValueError(f"{what} contains a NUL character: {rel!r}")
    if rel.startswith("/"):
        raise ValueError(f"absolute paths are not allowed: {rel!r}")


def _is_within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)
