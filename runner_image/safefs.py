"""Files beneath /data reached without following a symlink, opened without blocking, committed by a
rename inside one folder.

The shared volume is writable by anyone with the runner's uid, so its paths are hostile: any folder
may have been replaced by a symlink since planning, any input by a FIFO, a device or a folder. Every
path is therefore walked from the data root's descriptor one component at a time with
O_NOFOLLOW|O_DIRECTORY; an input is opened O_NOFOLLOW|O_NONBLOCK (a FIFO opens at once and is then
refused, never read) and must be a regular file by fstat; an output is written to a temporary file
made with O_EXCL|O_NOFOLLOW inside its folder's descriptor, fsynced, renamed inside that same
descriptor, and the folder fsynced. Every refusal is an ItemError naming the path as the user wrote
it (relative to the data root).

Temporary names say whose they are (``.<name>.ffswarm-<job>-<chunk>-a<n>-<random>.tmp``), so an
attempt removes only what an earlier attempt of its own chunk left, never another writer's file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from contract.paths import CONTAINER_DATA_ROOT, user_path

from .errors import ItemError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
INPUT_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
OUTPUT_MODE = 0o644
EXISTS = "output exists and was not written by this job (set overwrite: true to replace it)"
FOLDER_MODE = 0o755


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def parts(container_path: str) -> list[str]:
    """The components of a container path beneath /data (the manifest has normalised it already;
    checked again because a wrong one here would escape the walk)."""
    prefix = CONTAINER_DATA_ROOT + "/"
    if not container_path.startswith(prefix):
        raise ItemError(f"{container_path!r} is not under {CONTAINER_DATA_ROOT}")
    out = container_path[len(prefix) :].split("/")
    if any(p in ("", ".", "..") for p in out):
        raise ItemError(f"{user_path(container_path)}: not a normalised path")
    return out


def _shown(components: list[str]) -> str:
    return "/".join(components) or "."


def open_root(local: os.PathLike[str] | str) -> int:
    """The data root itself (the mount point, or a test's stand-in) is the operator's: opened as given."""
    return os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def walk(root_fd: int, folders: list[str], create: bool = False) -> int:
    """A descriptor of ``folders`` beneath ``root_fd``, every component opened without following a
    symlink (``create``: missing folders are made). ItemError names the component that is a
    symlink or not a folder; FileNotFoundError when one is missing and not created."""
    fd = os.dup(root_fd)
    try:
        for n, name in enumerate(folders):
            try:
                nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, FOLDER_MODE, dir_fd=fd)
                nxt = _open_dir(fd, name, folders[: n + 1])
            except OSError as e:
                raise _not_a_folder(fd, name, folders[: n + 1], e) from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_dir(fd: int, name: str, shown: list[str]) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        raise _not_a_folder(fd, name, shown, e) from None


def _not_a_folder(fd: int, name: str, shown: list[str], error: OSError) -> Exception:
    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
        return error
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except OSError:
        return ItemError(f"{_shown(shown)} is not a folder")
    if stat.S_ISLNK(mode):
        return ItemError(f"folder {_shown(shown)} is a symbolic link: not followed")
    return ItemError(f"{_shown(shown)} is {'a file' if stat.S_ISREG(mode) else kind_of(mode)}, not a folder")


@contextlib.contextmanager
def folder(root_fd: int, container_path: str, create: bool = False) -> Iterator[tuple[int, str]]:
    """The descriptor of the folder holding ``container_path``, and the file's name in it."""
    comps = parts(container_path)
    fd = walk(root_fd, comps[:-1], create)
    try:
        yield fd, comps[-1]
    finally:
        os.close(fd)


def open_input(root_fd: int, container_path: str) -> tuple[int, os.stat_result]:
    """An input opened for reading: never through a symlink (folders included), never blocking; a
    regular file or ItemError. The caller closes the descriptor."""
    try:
        with folder(root_fd, container_path) as (dfd, name):
            try:
                fd = os.open(name, INPUT_FLAGS, dir_fd=dfd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise ItemError("is a symbolic link: not followed") from None
                raise
    except FileNotFoundError:
        raise ItemError("file not found") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ItemError(f"is {kind_of(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_input(root_fd: int, container_path: str, limit: int) -> bytes:
    """A whole regular input of at most ``limit`` bytes (ItemError naming the size otherwise)."""
    fd, st = open_input(root_fd, container_path)
    try:
        if st.st_size > limit:
            raise ItemError(f"file too large: {st.st_size} bytes exceeds limit {limit}")
        return _read_all(fd, limit + 1)
    finally:
        os.close(fd)


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0 and (block := os.read(fd, min(left, 8 << 20))):
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


class Digest(NamedTuple):
    """What a committed output is: its size and sha256 (recorded in its result line)."""

    size: int
    sha256: str


def digest_of(root_fd: int, container_path: str) -> Digest | None:
    """Size and sha256 of an existing regular output (no symlink followed); None if there is none."""
    try:
        fd, st = open_input(root_fd, container_path)
    except ItemError:
        return None
    try:
        h = hashlib.sha256()
        while block := os.read(fd, 8 << 20):
            h.update(block)
        return Digest(st.st_size, h.hexdigest())
    finally:
        os.close(fd)


def exists(root_fd: int, container_path: str) -> bool:
    """Whether anything (a file, a link, a folder) is at the output's name; a missing or
    symlinked folder on the way counts as nothing there (the commit will refuse the latter)."""
    try:
        with folder(root_fd, container_path) as (dfd, name):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return True
    except (FileNotFoundError, ItemError):
        return False


class Temp(NamedTuple):
    """A temporary output being written: its descriptor, a path to it another process can open
    (while it inherits ``fd``), and the commit."""

    fd: int
    path: str
    commit: Callable[[], Digest]


_TEMP = re.compile(r"\.(?P<name>.+)\.ffswarm-(?P<owner>[a-z0-9-]+-[a-z0-9-]+)-a(?P<attempt>[0-9]+)-[0-9a-f]+\.tmp")


@dataclass
class Writer:
    """Who writes outputs in this process (job, chunk, attempt): names its temporary files and
    removes those an earlier attempt of the same chunk left (once per folder per attempt)."""

    job: str
    chunk: str
    attempt: int
    _swept: set[tuple[int, int]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def temp_name(self, name: str) -> str:
        return f".{name}.ffswarm-{self.job}-{self.chunk}-a{self.attempt}-{secrets.token_hex(6)}.tmp"

    def sweep(self, dir_fd: int) -> None:
        """Remove temporary files of this chunk's earlier attempts from this folder (a kill skips
        cleanup); another job's, another chunk's, this attempt's and every other file stay."""
        st = os.fstat(dir_fd)
        with self._lock:
            if (st.st_dev, st.st_ino) in self._swept:
                return
            self._swept.add((st.st_dev, st.st_ino))
        mine = f"{self.job}-{self.chunk}"
        for entry in os.scandir(dir_fd):
            m = _TEMP.fullmatch(entry.name)
            if m and m["owner"] == mine and int(m["attempt"]) < self.attempt:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=dir_fd)

    @contextlib.contextmanager
    def temp(
        self, root_fd: int, container_path: str, replace: bool, before: Callable[[Digest], None] | None = None
    ) -> Iterator[Temp]:
        """A fresh temporary file beside the output, as a path another process (ffmpeg) may write
        through (``/proc/self/fd/N`` of our O_EXCL|O_NOFOLLOW descriptor, inherited), and ``commit``:
        fsync, rename into place inside the folder's descriptor (``replace`` False: a link, which
        never replaces a file that appeared meanwhile: ItemError EXISTS), fsync the folder; returns
        the output's digest. ``before`` is told the digest just before the rename (the worker's
        commit journal, so that a kill between the rename and the result line cannot make the file
        look like another writer's). Without ``commit`` the temporary file is removed."""
        with folder(root_fd, container_path, create=True) as (dfd, name):
            self.sweep(dfd)
            tmp = self.temp_name(name)
            fd = os.open(tmp, TEMP_FLAGS, OUTPUT_MODE, dir_fd=dfd)
            committed = False

            def commit() -> Digest:
                nonlocal committed
                os.fsync(fd)
                digest = _digest_fd(fd)
                if not replace and _exists(name, dfd):  # journaled only if it can commit: see _exists
                    raise ItemError(EXISTS)
                if before is not None:
                    before(digest)
                if replace:
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                else:
                    try:
                        os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                    except FileExistsError:
                        raise ItemError(EXISTS) from None
                    os.unlink(tmp, dir_fd=dfd)
                committed = True
                os.fsync(dfd)
                return digest

            try:
                yield Temp(fd, f"/proc/self/fd/{fd}", commit)
            finally:
                os.close(fd)
                if not committed:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=dfd)

    def write(
        self,
        root_fd: int,
        container_path: str,
        data: bytes,
        replace: bool,
        before: Callable[[Digest], None] | None = None,
    ) -> Digest:
        """``data`` as the output, atomically: readers see the old file or the whole new one."""
        with self.temp(root_fd, container_path, replace, before) as tmp:
            view = memoryview(data)
            while view:
                view = view[os.write(tmp.fd, view) :]
            return tmp.commit()


def _exists(name: str, dfd: int) -> bool:
    """Whether something is at ``name`` already (another attempt of this chunk running at once that
    committed it first, or another writer): then the item fails before its commit journal names the
    output, so the journal never vouches for a file this attempt did not write. The link still
    refuses a file that appears after this look."""
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _digest_fd(fd: int) -> Digest:
    h = hashlib.sha256()
    size = 0
    while block := os.pread(fd, 8 << 20, size):
        h.update(block)
        size += len(block)
    return Digest(size, h.hexdigest())
