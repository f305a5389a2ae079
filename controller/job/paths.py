"""Containment under the data root.

Job files name paths relative to the shared volume, and everything the controller hands a runner is
a ``/data/...`` path. A job file must never make ffswarm read or write outside that volume, neither
with ``..`` nor through a symlink that points elsewhere, so every user path passes through here.
Errors are plain ``ValueError``s; callers know the file and field and wrap them into ``JobFileError``.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
import re
import stat
from pathlib import Path
from typing import Any

from contract.layout import MODELS, RUNS
from contract.paths import CONTAINER_DATA_ROOT, user_text
from contract.s3 import S3Url, is_s3

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # control characters


def check_rel_path(path: Any, what: str) -> str:
    """A path relative to the data root that stays in it: not absolute, no ``..`` or ``.`` parts,
    no empty parts, no control characters (ValueError naming ``what``)."""
    if not isinstance(path, str) or not path or len(path) > 4096:
        raise ValueError(f"{what}: not a path")
    if _CONTROL.search(path):
        raise ValueError(f"{what}: a path with control characters")
    if path.startswith("/"):
        raise ValueError(f"{what}: an absolute path ({path!r}); paths are relative to the data root")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"{what}: {path!r} leads out of the data root or is not normalised")
    return path


def check_location(path: Any, what: str) -> str:
    """``check_rel_path``, or one object's ``s3://bucket/key`` URL (no glob, not a folder)."""
    if not is_s3(path):
        return check_rel_path(path, what)
    try:
        url = S3Url.parse(path)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if url.is_glob or url.key.endswith("/") or str(url) != path:
        raise ValueError(f"{what}: {path!r} is not one object")
    return str(url)


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
    """Containment checks for many paths under one root (planning 100,000 targets): each folder's
    real path and lexical containment are worked out once, then a path costs a dictionary look-up
    and, with ``listings``, no system call at all. Make a new one per planning pass, so a folder
    swapped for a symlink later is seen."""

    def __init__(self, root: Path, *, listings: bool = False) -> None:
        """``listings``: read each folder once (``os.scandir``, whose entries carry their type) and
        answer "is it a symlink / file / folder" from that, instead of an lstat and a stat per path;
        for planning many targets, not for looking up a few paths in big folders."""
        self.root = root
        self.root_abs = os.path.abspath(root)
        self.root_real = os.path.realpath(root)
        self._real_prefix = self.root_real.rstrip(os.sep) + os.sep
        self._folders: dict[str, str] = {}  # folder as given (relative) → its real host path
        self._listings: dict[str, dict[str, str] | None] | None = {} if listings else None

    def _kind(self, real_folder: str, name: str) -> str | None:
        """'link', 'dir', 'file', 'other' or '' (absent) from the folder's listing; None: not known
        (no listings kept, or the folder could not be read)."""
        if self._listings is None:
            return None
        if real_folder not in self._listings:
            self._listings[real_folder] = _listing(real_folder)
        listing = self._listings[real_folder]
        return None if listing is None else listing.get(name, "")

    def isfile(self, real: str) -> bool:
        """``os.path.isfile`` of a real path this resolver returned."""
        folder, _, name = real.rpartition("/")
        kind = self._kind(folder or "/", name)
        return os.path.isfile(real) if kind in (None, "link") else kind == "file"

    def isdir(self, real: str) -> bool:
        """``os.path.isdir`` of a real path this resolver returned."""
        folder, _, name = real.rpartition("/")
        kind = self._kind(folder or "/", name)
        return os.path.isdir(real) if kind in (None, "link") else kind == "dir"

    def glob(self, pattern: str) -> list[str]:
        """``safe_glob`` as real host path strings."""
        return _glob(self, pattern)

    def inside(self, rel: str, *, what: str, listed: bool = True) -> Path:
        return Path(self.inside_str(rel, what=what, listed=listed))

    def inside_str(self, rel: str, *, what: str, listed: bool = True) -> str:
        """The real (symlink-free) host path of ``rel`` under the root, or ValueError if it leaves it.

        The path need not exist. The root itself counts as inside. ``listed=False``: the name is
        looked at alone (an lstat), never by reading its folder, whatever the resolver keeps (a few
        paths in what may be a big folder).
        """
        _check_form(rel, what=what)
        folder, _, name = rel.rpartition("/")
        if name in ("", ".", ".."):
            real = self._lexically_inside(rel, rel)
        else:
            real_folder = self._folders.get(folder)
            if real_folder is None:
                real_folder = self._folders[folder] = self._lexically_inside(folder, rel)
            full = f"{real_folder}/{name}" if real_folder != "/" else f"/{name}"
            kind = self._kind(real_folder, name) if listed else None
            if kind == "link" or (kind is None and os.path.islink(full)):
                full = os.path.realpath(full)
            real = full
        if not _is_within(real, self.root_real):
            raise ValueError(f"{rel!r} resolves outside the data root through a symlink")
        return real

    def _lexically_inside(self, part: str, rel: str) -> str:
        """The real path of ``part`` (``rel`` or its folder), refusing a ``rel`` that leaves the root
        by its spelling (``..``) whatever the disk holds."""
        if not _is_within(os.path.normpath(os.path.join(self.root_abs, part)), self.root_abs):
            raise ValueError(f"{rel!r} escapes the data root {self.root}")
        return self._realpath(part)

    def _realpath(self, part: str) -> str:
        """``os.path.realpath`` of ``part`` under the root, looking only at ``part``'s own components
        (the root's real path is known): the same answer, without an lstat per folder above the root.
        Any link, ``.`` or ``..`` on the way: os.path.realpath of the whole path, as before."""
        names = part.split("/")
        if any(n in ("", ".", "..") for n in names):
            return os.path.realpath(os.path.join(self.root_abs, part))
        real = self.root_real.rstrip(os.sep)
        for name in names:
            real = f"{real}/{name}"
            try:
                link = stat.S_ISLNK(os.lstat(real).st_mode)
            except OSError:  # missing (or unreadable): realpath keeps such a name as written
                link = False
            if link:
                return os.path.realpath(os.path.join(self.root_abs, part))
        return real

    def relative(self, host_path: Path | str) -> str:
        """Normalised posix path of ``host_path`` relative to the root ("." for the root itself)."""
        if isinstance(host_path, str) and host_path.startswith(self._real_prefix):
            return host_path[len(self._real_prefix) :]  # a real path this resolver returned
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


def relative_text(text: str, root: Path) -> str:
    """``text`` with the paths in it under the data root, the container's (``/data``) or this host's
    ``root``, written relative to it as a job file names them: what a reason shows a user."""
    return user_text(text, os.path.abspath(root), os.path.realpath(root))


def relative_to_root(root: Path, host_path: Path) -> str:
    """Normalised posix path of ``host_path`` relative to ``root`` ("." for the root itself)."""
    return Resolver(root).relative(host_path)


def safe_glob(root: Path, pattern: str, resolver: Resolver | None = None) -> list[Path]:
    """Files under ``root`` matching ``pattern`` (``**`` recurses), real paths, sorted.

    Folders and hidden names (temporary files being written, ``.``-prefixed) are left out; a match
    that is a symlink leading out of the root is refused rather than skipped, so a job never silently
    loses an input.
    """
    return [Path(p) for p in (resolver or Resolver(root)).glob(pattern)]


def _glob(resolver: Resolver, pattern: str) -> list[str]:
    check_relative(pattern, what="glob pattern")
    found: set[str] = set()
    for match in _walk(resolver.root_abs, pattern):
        if posixpath.basename(match.rstrip("/")).startswith("."):
            continue
        top = match.split("/", 1)[0]
        if top in RESERVED_TOP and not pattern.startswith(top + "/"):
            continue  # a broad glob (**/*.jpg) never picks up run folders or model packs
        real = resolver.inside_str(match, what="glob match")
        if resolver.isfile(real):
            found.add(real)
    return sorted(found)


GLOB_WALK_LIMIT = 1_000_000  # folder entries one glob may look at (a deep ``**`` over a huge tree)


class _Walk:
    """One glob's walk of the data root: wildcards never descend into a symlinked folder (a link
    loop, or a link to a big tree, would otherwise multiply the walk; three ``l -> .`` links gave
    77,000 matches and climbing), and the walk stops with a refusal after GLOB_WALK_LIMIT entries.
    A symlinked folder named literally (``alias/*.jpg``) is followed, and its matches are checked
    for containment like any other path."""

    def __init__(self, root: str, pattern: str) -> None:
        self.root, self.pattern, self.seen = root, pattern, 0

    def entries(self, rel: str) -> list[tuple[str, bool, bool]]:
        """(name, is a folder, is a symlink) of one folder, hidden names left out."""
        out = []
        try:
            with os.scandir(os.path.join(self.root, rel) if rel else self.root) as it:
                for e in it:
                    self.seen += 1
                    if self.seen > GLOB_WALK_LIMIT:
                        raise ValueError(
                            f"{self.pattern!r} looks at more than {GLOB_WALK_LIMIT:,} files and folders "
                            f"(the limit for one pattern); name a narrower folder"
                        )
                    if not e.name.startswith("."):
                        link = e.is_symlink()
                        out.append((e.name, e.is_dir(follow_symlinks=True), link))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        return out

    def descend(self, rel: str, name: str, link: bool) -> str:
        child = f"{rel}/{name}" if rel else name
        if link:
            raise ValueError(
                f"{self.pattern!r} reaches the symlinked folder {child!r}: wildcards do not follow "
                f"symlinked folders (name the folder it points to, or remove the link)"
            )
        return child

    def match(self, rel: str, parts: list[str]) -> list[str]:
        if not parts:
            return [rel]
        head, rest = parts[0], parts[1:]
        if head == "**":
            out = self.match(rel, rest) if rest else []
            for name, is_dir, link in self.entries(rel):
                if not rest and not is_dir:
                    out.append(f"{rel}/{name}" if rel else name)
                if is_dir:
                    out += self.match(self.descend(rel, name, link), parts)
            return out
        if not glob.has_magic(head):
            child = f"{rel}/{head}" if rel else head
            return self.match(child, rest) if rest or os.path.lexists(os.path.join(self.root, child)) else []
        out = []
        for name, is_dir, link in self.entries(rel):
            if fnmatch.fnmatchcase(name, head):
                if rest and is_dir:
                    out += self.match(self.descend(rel, name, link), rest)
                elif not rest:
                    out.append(f"{rel}/{name}" if rel else name)
        return out


def _walk(root: str, pattern: str) -> list[str]:
    """Relative paths under ``root`` matching ``pattern`` as ``glob.glob(recursive=True)`` would,
    without following symlinked folders below a wildcard (_Walk)."""
    parts = [p for p in posixpath.normpath(pattern).split("/") if p not in ("", ".")]
    return _Walk(root, pattern).match("", parts)


def _listing(folder: str) -> dict[str, str] | None:
    """Name → 'link' / 'dir' / 'file' / 'other' for one folder ({} if it does not exist, None if it
    cannot be read). DirEntry knows the type from the folder read itself on local filesystems and NFS."""
    listing: dict[str, str] = {}
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_symlink():
                    listing[e.name] = "link"
                elif e.is_dir(follow_symlinks=False):
                    listing[e.name] = "dir"
                else:
                    listing[e.name] = "file" if e.is_file(follow_symlinks=False) else "other"
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError:
        return None
    return listing


RESERVED_TOP = (RUNS, MODELS)  # never in a broad glob's matches


def _check_form(rel: str, *, what: str) -> None:
    if not isinstance(rel, str) or not rel.strip():
        raise ValueError(f"{what} is empty")
    if "\0" in rel:
        raise ValueError(f"{what} contains a NUL character: {rel!r}")
    if rel.startswith("/"):
        raise ValueError(f"absolute paths are not allowed: {rel!r}")


def _is_within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)
