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


class Resolver:
    """Containment checks for many paths under one root (planning 100,000 targets), sharing the real
    paths of their folders: one lstat per path instead of one per path component. Make a new one per
    planning pass, so a folder swapped for a symlink later is seen."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root_abs = os.path.abspath(root)
        self.root_real = os.path.realpath(root)
        self._dirs: dict[str, str] = {}

    def realpath(self, path: str) -> str:
        folder, name = os.path.split(path)
        if name in ("", ".", ".."):
            return os.path.realpath(path)
        real_folder = self._dirs.get(folder)
        if real_folder is None:
            real_folder = self._dirs[folder] = os.path.realpath(folder)
        full = os.path.join(real_folder, name)
        return os.path.realpath(full) if os.path.islink(full) else full

    def inside(self, rel: str, *, what: str) -> Path:
        return Path(self.inside_str(rel, what=what))

    def inside_str(self, rel: str, *, what: str) -> str:
        """The real (symlink-free) host path of ``rel`` under the root, or ValueError if it leaves it.

        The path need not exist. The root itself counts as inside.
        """
        _check_form(rel, what=what)
        lexical = os.path.normpath(os.path.join(self.root_abs, rel))
        if not _is_within(lexical, self.root_abs):
            raise ValueError(f"{rel!r} escapes the data root {self.root}")
        real = (
            self.realpath(lexical) if ".." not in rel.split("/") else os.path.realpath(os.path.join(self.root_abs, rel))
        )
        if not _is_within(real, self.root_real):
            raise ValueError(f"{rel!r} resolves outside the data root through a symlink")
        return real

    def relative(self, host_path: Path) -> str:
        """Normalised posix path of ``host_path`` relative to the root ("." for the root itself)."""
        host = os.path.abspath(host_path)
        for base in (self.root_abs, self.root_real, None):
            if base is None:
                host, base = os.path.realpath(host_path), self.root_real
            if host == base:
                return "."
            if host.startswith(base.rstrip(os.sep) + os.sep):
                return host[len(base.rstrip(os.sep)) + 1 :]
        raise ValueError(f"{str(host_path)!r} is not under the data root {self.root}")


def resolve_inside(root: Path, rel: str, *, what: str) -> Path:
    """The real (symlink-free) host path of ``rel`` under ``root``, or ValueError if it leaves it."""
    return Resolver(root).inside(rel, what=what)


def to_container(root: Path, host_path: Path) -> str:
    """``/data/<rel>`` for a host path under ``root`` (as given, or with symlinks resolved)."""
    rel = relative_to_root(root, host_path)
    return CONTAINER_DATA_ROOT if rel == "." else f"{CONTAINER_DATA_ROOT}/{rel}"


def relative_to_root(root: Path, host_path: Path) -> str:
    """Normalised posix path of ``host_path`` relative to ``root`` ("." for the root itself)."""
    return Resolver(root).relative(host_path)


def safe_glob(root: Path, pattern: str, resolver: Resolver | None = None) -> list[Path]:
    """Files under ``root`` matching ``pattern`` (``**`` recurses), real paths, sorted.

    Folders and hidden names (temporary files being written, ``.``-prefixed) are left out; a match
    that is a symlink leading out of the root is refused rather than skipped, so a job never silently
    loses an input.
    """
    check_relative(pattern, what="glob pattern")
    resolver = resolver or Resolver(root)
    found: set[str] = set()
    for match in glob.glob(pattern, root_dir=root, recursive=True):
        if posixpath.basename(match.rstrip("/")).startswith("."):
            continue
        if match.split("/", 1)[0] in RESERVED_TOP and not pattern.startswith(match.split("/", 1)[0] + "/"):
            continue  # a broad glob (**/*.jpg) never picks up run folders or model packs
        real = resolver.inside_str(match, what="glob match")
        if os.path.isfile(real):
            found.add(real)
    return [Path(p) for p in sorted(found)]


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
