"""Work inside one open folder of the shared volume through its descriptor (controller/volume.py
resolves paths from the data root; this keeps working once a folder is open).

A folder whose path a runner can change (a tenant area's top is the runner's) is opened once, without
following a link; from then on every mkdir, create, rename and removal is made relative to that
descriptor, one name at a time, files created O_EXCL|O_NOFOLLOW, so a folder on the path swapped for
a link afterwards redirects nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat
from typing import Any

from controller.volume import UnsafePath


def sync_filesystem(path: os.PathLike[str] | str) -> None:
    """Flush the filesystem holding ``path`` at once — one syncfs(2) (os.sync where there is none)
    instead of an fsync per file, each of which waits for its own journal commit."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        syncfs = _syncfs()
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Any:
    """libc's syncfs, looked up once (the API flushes for every group of requests); None without one."""
    return getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _component(name: str) -> str:
    """``name`` if it is one plain path component; anything else is refused before any system call."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise UnsafePath(f"{name[:80]!r}: not a single file name")
    return name


def remove_at(dir_fd: int, name: str) -> None:
    """``name`` in ``dir_fd`` removed without following a link: a folder's tree, or the entry itself."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)  # fd-based on Linux: links inside are unlinked, never followed
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


class Folder:
    """An open folder, and what is done in it: one name at a time relative to its descriptor, files
    created O_EXCL|O_NOFOLLOW, nothing through a link. Once it is open, a folder on its path swapped
    for a link (a runner owns a tenant area's top) changes nothing for whoever holds it."""

    def __init__(self, fd: int, rel: str) -> None:
        self.fd = fd
        self.rel = rel  # for messages only

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def sub(self, name: str, create: bool = False, mode: int = 0o755) -> Folder:
        """The folder ``name`` in this one, made first (``mode``, umask-narrowed) with ``create``;
        OSError when it is missing, a link or not a folder."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(_component(name), mode, dir_fd=self.fd)
        return Folder(os.open(_component(name), _DIR_FLAGS, dir_fd=self.fd), f"{self.rel}/{name}")

    def create(self, name: str, mode: int = 0o644) -> int:
        """A new file's descriptor (write-only); FileExistsError if the name is taken, even by a link."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(_component(name), flags, mode, dir_fd=self.fd)

    def open_file(self, name: str) -> int:
        """A regular file's descriptor for reading; UnsafePath for a link, a FIFO or a folder."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(_component(name), flags, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(f"{self.rel}/{name}: a symbolic link (never followed)") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafePath(f"{self.rel}/{name}: not a regular file")
        return fd

    def exists(self, name: str) -> bool:
        try:
            os.stat(_component(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def move(self, name: str, to: Folder, new: str) -> None:
        """``name`` renamed to ``new`` in folder ``to`` (renameat); FileExistsError if ``new`` is taken:
        never replaced (the caller owns ``to``, so no one else makes names there meanwhile)."""
        if to.exists(new):
            raise FileExistsError(errno.EEXIST, "already exists", new)
        os.rename(_component(name), _component(new), src_dir_fd=self.fd, dst_dir_fd=to.fd)

    def remove(self, name: str) -> None:
        remove_at(self.fd, _component(name))

    def clear(self) -> None:
        """Everything in the folder removed (the folder stays)."""
        for name in os.listdir(self.fd):
            remove_at(self.fd, name)

    def same(self, fd: int) -> bool:
        """Whether ``fd`` is this very folder."""
        a, b = os.fstat(self.fd), os.fstat(fd)
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def file_bytes(self) -> int:
        """Bytes of the regular files beneath it, walked through descriptors (links not followed)."""
        total = 0
        for name in os.listdir(self.fd):
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
            elif stat.S_ISDIR(st.st_mode):
                with self.sub(name) as sub:
                    total += sub.file_bytes()
        return total
