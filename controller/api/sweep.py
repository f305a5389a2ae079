"""Upload staging folders that prove their receiver is alive, and the sweep that removes the others.

Several API replicas share the volume, so an upload's age says nothing about whether its receiver is
still at work. Each staging folder ``tenants/<t>/uploads/.incoming-<id>/`` has a lock file beside it,
``.incoming-<id>.lock``, created (O_EXCL) and locked (flock, exclusive) BEFORE the folder is made and
unlocked only AFTER the folder is gone (renamed into place or removed). The kernel drops the lock
when its process dies, however it dies, so a lock anyone can take means its owner is gone: the sweep
(at API start, then every minute) removes that folder at once, while a live replica's upload is never
touched. On NFS v4 flock is carried by the server's byte-range locks (a dead client's locks end with
its lease, ~90 s).

NFS turns flock into POSIX locks, which belong to a PROCESS: a second descriptor in the owner process
would get the lock too, and closing it would drop the owner's. So a process never opens the lock
files of its own live uploads (``_LIVE``, process-wide on purpose: the lock is the process's).

The uploads folder is in the tenant's area, whose top an older ffswarm gave the runner's uid (an API
not running as root cannot take it back: controller/job/access.py own_area): it is reached from
the data root one O_NOFOLLOW component at a time (controller/volume.py), every entry is looked at
without following links, and removals go through the folder's descriptor (shutil.rmtree with
``dir_fd``, which never follows a link). A folder with no lock file at all was left by an API older
than this scheme; it is removed once it is an hour old (an older replica may still be receiving it
during a rolling update).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from contract.layout import TENANTS
from controller.api.errors import ApiError
from controller.folder import Folder, remove_at
from controller.volume import UnsafePath, Volume

PREFIX = ".incoming-"
LOCK_SUFFIX = ".lock"
SWEEP_SECONDS = 60.0
UNLOCKED_STALE_SECONDS = 3600.0
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_LIVE: set[tuple[int, int, str]] = set()  # (st_dev, st_ino of the uploads folder, staging name)
_LIVE_LOCK = threading.Lock()


def _key(dir_fd: int, name: str) -> tuple[int, int, str]:
    st = os.fstat(dir_fd)
    return st.st_dev, st.st_ino, name


def _live(key: tuple[int, int, str]) -> bool:
    with _LIVE_LOCK:
        return key in _LIVE


class Staging:
    """``with Staging(data_root, tenant, id) as folder:`` a new, empty staging folder, held (locked)
    by this process until the block ends; at the end whatever is left of it is removed, then the lock.

    The uploads folder sits in the tenant's area, whose top is the API's, but one an older ffswarm
    made is the runner's until a root API takes it back: a runner may then swap ``uploads`` for a
    link at any moment. So the uploads folder is opened once (no link anywhere on
    its path) and everything after goes through descriptors: the staging folder is ``staged`` (a
    ``Folder``), ``place`` renames it into place in the folder held open, and then checks that the
    path still leads there; else the job's folder is removed and the upload refused (409)."""

    def __init__(self, data_root: Path, tenant: str, upload_id: str) -> None:
        self.volume = Volume(data_root)
        self.rel = f"{TENANTS}/{tenant}/uploads"
        self.folder = data_root / self.rel / f"{PREFIX}{upload_id}"
        self.name = self.folder.name
        self.dir_fd = -1
        self.lock_fd = -1
        self.key: tuple[int, int, str] | None = None
        self.staged = Folder(-1, f"{self.rel}/{self.name}")

    def __enter__(self) -> Path:
        try:
            self.volume.mkdirs(self.rel, mode=0o755)  # runners read uploads/<job>/: 0755
            self.dir_fd = self.volume.open_dir(self.rel, "staging an upload")
        except UnsafePath as e:
            mode = _lmode(self.folder.parent)
            if e.link is None and (mode == 0 or stat.S_ISDIR(mode)):
                raise  # not a link or a file put there (no space, no permission): the server's fault
            raise _swapped() from None
        try:
            self.key = _key(self.dir_fd, self.name)
            with _LIVE_LOCK:  # before the lock file exists: this process's sweep never opens it
                _LIVE.add(self.key)
            self._lock()
            os.mkdir(self.name, 0o755, dir_fd=self.dir_fd)
            self.staged = Folder(os.open(self.name, _DIR, dir_fd=self.dir_fd), self.staged.rel)
        except BaseException:
            self._release()
            raise
        return self.folder

    def intact(self) -> bool:
        """Whether the uploads folder's path still leads, without a link, to the folder held open."""
        try:
            fd = self.volume.open_dir(self.rel, "checking the uploads folder")
        except (OSError, UnsafePath):  # gone, or a link on its path
            return False
        try:
            uploads = os.fstat(self.dir_fd)
            now = os.fstat(fd)
            return (uploads.st_dev, uploads.st_ino) == (now.st_dev, now.st_ino)
        finally:
            os.close(fd)

    def place(self, job: str) -> None:
        """The staging folder renamed to ``uploads/<job>`` in the uploads folder held open; 409 (and
        the job's folder removed) when the uploads folder's path no longer leads there."""
        self.confirm()
        self.staged.close()
        holder = Folder(self.dir_fd, self.rel)
        holder.move(self.name, holder, job)
        if not self.intact():
            self.discard(job)
            raise _swapped()

    def confirm(self) -> None:
        """409 when the uploads folder's path no longer leads to the folder held open (checked again
        just before the job is handed over: its files are named by that path from then on)."""
        if not self.intact():
            raise _swapped()

    def discard(self, job: str) -> None:
        """``uploads/<job>`` (placed by this upload) removed through the folder held open."""
        if self.dir_fd >= 0:
            remove_at(self.dir_fd, job)

    def _lock(self) -> None:
        lock = self.name + LOCK_SUFFIX
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.lock_fd = os.open(lock, flags, 0o600, dir_fd=self.dir_fd)
        except FileExistsError:
            raise _busy() from None
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # a sweep may have taken the fresh file between create and lock and removed it: then this
            # lock proves nothing (the name is gone or another file's), and the upload is refused
            if not _same(self.lock_fd, lock, self.dir_fd):
                raise BlockingIOError
        except BlockingIOError:
            os.close(self.lock_fd)
            self.lock_fd = -1
            raise _busy() from None
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        os.write(self.lock_fd, json.dumps(owner).encode() + b"\n")  # for people; the lock is the proof

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        self.staged.close()
        try:
            if self.dir_fd >= 0 and self.lock_fd >= 0:
                _remove(self.dir_fd, self.name)  # gone already when it was moved into place
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.name + LOCK_SUFFIX, dir_fd=self.dir_fd)  # still holding the lock
        finally:
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1
            if self.key is not None:
                with _LIVE_LOCK:
                    _LIVE.discard(self.key)
                self.key = None


def _lmode(path: Path) -> int:
    """The mode of ``path`` itself (0 when it is gone); its parents are the API's own folders."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0


def _swapped() -> ApiError:
    """The uploads folder replaced (by a link, or another folder) in the area a runner may write:
    nothing is written through it, and retrying will not help until it is put right, so no Retry-After."""
    return ApiError(
        409, "unsafe_area", "uploads: not the area's own uploads folder (a link or a replaced folder); "
        "nothing was written through it and nothing of this upload was kept",
    )  # fmt: skip


def _busy() -> ApiError:
    return ApiError(503, "busy", "the upload could not be staged; try again", headers={"Retry-After": "1"})


def _same(fd: int, name: str, dir_fd: int) -> bool:
    """Whether ``name`` in ``dir_fd`` is still the file open as ``fd``."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _remove(dir_fd: int, name: str) -> None:
    """``name`` in ``dir_fd`` removed without following a link: a folder's tree, or the entry itself."""
    remove_at(dir_fd, name)


def sweep_uploads(data_root: Path, tenant: str, now: float | None = None) -> list[str]:
    """Remove the tenant's staging folders (and lock files) whose receiver is gone; their names."""
    now = time.time() if now is None else now
    try:
        fd = Volume(data_root).open_dir(f"{TENANTS}/{tenant}/uploads", "sweeping uploads")
    except FileNotFoundError:
        return []
    try:
        names = os.listdir(fd)
        stagings = {n[: -len(LOCK_SUFFIX)] if n.endswith(LOCK_SUFFIX) else n for n in names if n.startswith(PREFIX)}
        return [name for name in sorted(stagings) if _sweep_one(fd, name, now)]
    finally:
        os.close(fd)


def _sweep_one(dir_fd: int, name: str, now: float) -> bool:
    if _live(_key(dir_fd, name)):
        return False  # this process's own upload: its lock must not be touched (see the module doc)
    lock = name + LOCK_SUFFIX
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return _sweep_unlocked(dir_fd, name, now)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        # not a file a receiver made (a link, a folder, a FIFO): its receiver, if any, is not live
        _remove(dir_fd, name)
        _remove(dir_fd, lock)
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: no receiver made it
            _remove(dir_fd, name)
            _remove(dir_fd, lock)
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its receiver is alive
        if not _same(fd, lock, dir_fd):
            return False  # removed (and perhaps made again) since it was opened: look next time
        _remove(dir_fd, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock, dir_fd=dir_fd)  # while holding the lock: no receiver can have it now
        return True
    finally:
        os.close(fd)


def _sweep_unlocked(dir_fd: int, name: str, now: float) -> bool:
    """A staging folder without a lock file: an older API's; removed when an hour old."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode) and now - st.st_mtime <= UNLOCKED_STALE_SECONDS:
        return False
    _remove(dir_fd, name)
    return True


def every(
    fn: Callable[[], Any], seconds: float = SWEEP_SECONDS, on_error: Callable[[Exception], Any] | None = None
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """A Starlette lifespan that runs ``fn`` (blocking: in a thread) every ``seconds`` while the app serves."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(seconds)
                try:
                    await asyncio.to_thread(fn)
                except Exception as e:  # one failed sweep must not end the API or the next sweeps
                    if on_error is not None:
                        on_error(e)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan
