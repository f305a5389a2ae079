"""Safe file operations beneath the data root: the only way the controller writes, chowns or deletes
on the shared volume (docs/operations.md#trust-model).

Anything a runner can write, a compromised runner can turn into a symlink, a FIFO or a huge file,
and the controller runs as root next to the Docker socket. So every path is resolved beneath the
data root without following a single symlink: with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)
where the kernel has it, else one O_NOFOLLOW|O_DIRECTORY component at a time from the root's
descriptor. Every change then happens through descriptors: files are created O_EXCL|O_NOFOLLOW in
a directory descriptor, chowned and chmodded with fchown/fchmod, renamed and unlinked relative to
that descriptor, and the directory is fsynced after a rename. A symlink anywhere on a path is an
error (UnsafePath) naming the path relative to the data root; nothing is written through it.
``write_atomic`` and ``read_nofollow`` do the same for callers holding absolute paths (beneath "/").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import secrets
import stat
import threading
from collections.abc import Collection, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from controller.errors import MissingInputError

Owner = tuple[int, int]  # uid, gid (-1: leave as it is)

FILE_MODE = 0o640  # group: the runner's, so runners read manifests; others: nothing
DIR_MODE = 0o750
SHARED_DIR_MODE = 0o2770  # a folder both the runner and a non-root controller in its group write

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RENAME_NOREPLACE = 1
_openat2_works: bool | None = None if _SYS_OPENAT2 is not None else False


class UnsafePath(MissingInputError):
    """A path on the shared volume the controller refuses to use: a symlink on it, a non-regular
    file where a file belongs, a name that leads out of the data root. ``link``: the symlink found
    on the path (relative to the data root), if that is why."""

    def __init__(self, message: str, link: str | None = None) -> None:
        super().__init__(message)
        self.link = link


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


def _openat2(dir_fd: int, rel: str, flags: int, mode: int) -> int:
    creates = flags & os.O_CREAT or (_O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE)
    how = _OpenHow(flags, mode if creates else 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _lib().syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return int(fd)


def umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status), else the classic dance."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", "rb", buffering=0) as f:
            status = f.read(16384)  # a few hundred bytes to a few kB; read on every file written
        start = status.index(b"\nUmask:") + 7
        return int(status[start : status.index(b"\n", start)].strip(), 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def masked(mode: int, mask: int | None = None) -> int:
    """``mode`` narrowed by the umask (a stricter umask wins; the set-group-id bit is kept); ``mask``:
    the umask as already read (Volume.batch), else read now."""
    return (mode & ~0o777) | (mode & 0o777 & ~(umask() if mask is None else mask))


class Volume:
    """One data root. Paths are given relative to it (str or PurePosixPath), or as absolute Paths
    beneath it; either way they are checked lexically (no ``..``) and resolved without links."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._batch = threading.local()  # .umask: read once for a batch of this thread's writes (batch())

    def __getstate__(self) -> dict[str, Any]:  # sent to the API's worker processes: the root is all it is
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root = Path(state["root"])
        self._batch = threading.local()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Many files and folders written together (a run folder made, a job ended): the process
        umask is read once for all of them, not once for each (a read of /proc/self/status)."""
        outer = getattr(self._batch, "umask", None)
        self._batch.umask = umask() if outer is None else outer
        try:
            yield
        finally:
            self._batch.umask = outer

    def _masked(self, mode: int) -> int:
        return masked(mode, getattr(self._batch, "umask", None))

    def rel(self, path: str | PurePosixPath | Path) -> str:
        """The path relative to the data root, as errors name it; refused if it leads out."""
        text = os.fspath(path)
        base = str(self.root)
        if not text.startswith("/"):  # relative: the same parts Path would see, without making one
            return self._parts(text)
        if base != "/" and text.startswith(base + "/") and not text.startswith("//"):
            return self._parts(text[len(base) + 1 :])
        if text == base:
            return ""
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.relative_to(self.root)
            except ValueError:
                raise UnsafePath(f"{p.name}: not beneath the data root") from None
        return self._parts(p.as_posix())

    @staticmethod
    def _parts(rel: str) -> str:
        parts = [x for x in rel.split("/") if x not in ("", ".")]
        if ".." in parts:
            raise UnsafePath(f"{'/'.join(parts)}: leads out of the data root")
        return "/".join(parts)

    def _refuse(self, rel: str, e: OSError, what: str) -> UnsafePath | OSError:
        """An OSError from resolving ``rel``: a link on the path becomes UnsafePath naming it."""
        if e.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR, errno.EMLINK):
            link = self._first_link(rel)
            if link is not None:
                return UnsafePath(f"{rel}: {what} refused: {link} is a symbolic link (never followed)", link)
            if e.errno in (errno.ELOOP, errno.EXDEV):
                return UnsafePath(f"{rel}: {what} refused: the path leaves the data root")
        return e

    def _first_link(self, rel: str) -> str | None:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            parts = rel.split("/") if rel else []
            for n, name in enumerate(parts, 1):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    return None
                if stat.S_ISLNK(st.st_mode):
                    return "/".join(parts[:n])
                if not stat.S_ISDIR(st.st_mode) or n == len(parts):
                    return None
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = sub
            return None
        finally:
            os.close(fd)

    def open(self, path: str | PurePosixPath | Path, flags: int, mode: int = 0o600, what: str = "open") -> int:
        """A descriptor for ``path`` (O_CLOEXEC and O_NOFOLLOW added), never through a symlink."""
        rel = self.rel(path)
        try:
            return self._open(rel, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        except OSError as e:
            raise self._refuse(rel, e, what) from None

    def _open(self, rel: str, flags: int, mode: int) -> int:
        global _openat2_works
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not rel:
                return os.open(".", flags & ~(os.O_CREAT | os.O_EXCL), dir_fd=root)
            if _openat2_works is not False:
                for _ in range(3):
                    try:
                        fd = _openat2(root, rel, flags, mode)
                        _openat2_works = True
                        return fd
                    except OSError as e:
                        if e.errno == errno.EAGAIN:  # a rename raced the lookup: try again
                            continue
                        if e.errno in (errno.ENOSYS, errno.EPERM) and _openat2_works is None:
                            _openat2_works = False  # no openat2 here (old kernel, seccomp)
                            break
                        raise
            return self._walk(root, rel, flags, mode)
        finally:
            os.close(root)

    @staticmethod
    def _walk(root: int, rel: str, flags: int, mode: int) -> int:
        parts = rel.split("/")
        fd = os.dup(root)
        try:
            for name in parts[:-1]:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = sub
            return os.open(parts[-1], flags, mode, dir_fd=fd)
        finally:
            os.close(fd)

    def open_dir(self, path: str | PurePosixPath | Path, what: str = "open") -> int:
        return self.open(path, os.O_RDONLY | os.O_DIRECTORY, what=what)

    @contextlib.contextmanager
    def parent(self, path: str | PurePosixPath | Path, what: str) -> Iterator[tuple[int, str]]:
        """(descriptor of the folder, name in it) for an operation on ``path`` itself."""
        rel = self.rel(path)
        folder, _, name = rel.rpartition("/")
        if not name:
            raise UnsafePath(f"{rel or '.'}: cannot {what} the data root itself")
        fd = self.open_dir(folder, what)
        try:
            yield fd, name
        finally:
            os.close(fd)

    def mtime(self, path: str | PurePosixPath | Path) -> float | None:
        """When ``path`` itself last changed (a link's own time, never its target's); None when it
        cannot be looked at (missing, or a link on the way)."""
        try:
            with self.parent(path, "read") as (dfd, name):
                return os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime
        except (OSError, UnsafePath):
            return None

    def read_trusted(
        self, folder: str | PurePosixPath | Path, name: str, trusted: Collection[int], limit: int, closed: int
    ) -> bytes | None:
        """A small file the controller wrote, believed only when ``folder`` and the file are owned by
        one of ``trusted`` (never the runner's uid) and carry none of the mode bits ``closed`` (0o022:
        writable by no one else; 0o077: the owner's alone), the file a regular one with one link and
        at most ``limit`` bytes. None otherwise, or when either is missing or reached through a link."""

        def believed(st: os.stat_result) -> bool:
            return st.st_uid in trusted and not st.st_mode & closed

        try:
            dfd = self.open_dir(folder, "reading")
        except (OSError, UnsafePath):
            return None
        try:
            if not believed(os.fstat(dfd)):
                return None
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or not believed(st) or st.st_size > limit:
                return None
            return read_all(fd, limit, self.rel(folder))
        except (OSError, UnsafePath):
            return None
        finally:
            os.close(fd)

    def read(self, path: str | PurePosixPath | Path, limit: int) -> bytes | None:
        """A regular file's bytes (None if it does not exist); UnsafePath for a link on the path,
        a FIFO, a folder or a file over ``limit`` bytes."""
        rel = self.rel(path)
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK, what="reading")
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{rel}: not a regular file")
            if st.st_size > limit:
                raise UnsafePath(f"{rel}: {st.st_size} bytes, over the limit of {limit}")
            return read_all(fd, limit, rel)
        finally:
            os.close(fd)

    def mkdirs(
        self,
        path: str | PurePosixPath | Path,
        owner: Owner | None = None,
        mode: int = DIR_MODE,
        enforce: bool = False,
        exact: bool = False,
    ) -> list[str]:
        """Make ``path`` and its missing parents, one component at a time through O_NOFOLLOW
        descriptors; each folder made here gets ``owner`` and ``mode`` (umask-narrowed), and with
        ``enforce`` the last one gets them even if it existed; ``exact``: ``mode`` as given, not
        narrowed (a folder shared with the runner's group must stay group-writable). Returns the
        folders made, parents first. When the parent folder exists (the common case: a run folder's
        sub-folders) it is opened at once, without links, and only the last one is made there."""
        rel = self.rel(path)
        parts = rel.split("/") if rel else []
        made: list[str] = []
        fd, start = self._parent_or_root(parts)
        try:
            if not parts and enforce:
                own(fd, owner, mode if exact else self._masked(mode), ".")
            for n, name in enumerate(parts[start:], start + 1):
                where = "/".join(parts[:n])
                last = n == len(parts)
                try:
                    try:
                        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                        new = False
                    except FileNotFoundError:
                        final = (mode if exact else self._masked(mode)) if last else self._masked(DIR_MODE)
                        sub, new = _make_dir(fd, name, owner, final, where)
                except OSError as e:  # a link where the folder is (found, or made meanwhile): named
                    raise self._refuse(where, e, "creating a folder") from None
                os.close(fd)
                fd = sub
                if new:
                    made.append(where)
                elif enforce and last:
                    own(fd, owner, mode if exact else self._masked(mode), where)
        except OSError as e:
            if isinstance(e, UnsafePath):
                raise
            raise UnsafePath(f"{rel}: cannot create folder: {e.strerror}") from None
        finally:
            os.close(fd)
        return made

    def _parent_or_root(self, parts: list[str]) -> tuple[int, int]:
        """A descriptor to make ``parts`` from, and how many of them it already stands for: the
        parent folder's (reached without a link, as open reaches it), or the root's when the parent
        is missing or cannot be reached so (the walk then makes the parents, or refuses the link)."""
        if len(parts) > 1:
            with contextlib.suppress(OSError, UnsafePath):
                return self.open_dir("/".join(parts[:-1]), "creating a folder"), len(parts) - 1
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), 0

    def write_atomic(
        self,
        path: str | PurePosixPath | Path,
        data: bytes,
        owner: Owner | None = None,
        mode: int = FILE_MODE,
        durable: bool = True,
    ) -> None:
        """A unique temp name (O_EXCL|O_NOFOLLOW) in the folder's descriptor, written, chowned,
        chmodded (``mode`` narrowed by the umask, never wider), fsynced, renamed into place, and the
        folder fsynced. ``durable=False`` skips both fsyncs (the caller syncs once)."""
        with self.parent(path, "write") as (dfd, name):
            fd, tmp = create_temp(dfd, name)
            try:
                try:
                    write_all(fd, data)
                    own(fd, owner, self._masked(mode), self.rel(path))
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            if durable:
                os.fsync(dfd)

    def create_exclusive(
        self, path: str | PurePosixPath | Path, owner: Owner | None = None, mode: int = FILE_MODE
    ) -> int:
        """A new file (FileExistsError if the name is taken, even by a link); its descriptor."""
        with self.parent(path, "creating") as (dfd, name):
            return self.create_in(dfd, name, owner, mode, self.rel(path))

    def create_in(
        self, dfd: int, name: str, owner: Owner | None = None, mode: int = FILE_MODE, rel: str | None = None
    ) -> int:
        """create_exclusive of ``name`` in a folder already open (``dfd``, from open_dir): many files
        made in one folder without resolving its path for each. Made with its mode (the umask
        narrows it, as ``mode`` asks), so no chmod follows unless a chown or a default ACL needs one."""
        if name in ("", ".", "..") or "/" in name:
            raise UnsafePath(f"{name!r}: not a file name")
        wanted = self._masked(mode)
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, wanted, dir_fd=dfd)
        try:
            own(fd, owner, wanted, rel or name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def append(self, path: str | PurePosixPath | Path, data: bytes, owner: Owner | None = None) -> None:
        """Append to a regular file (made with ``owner`` and FILE_MODE if missing), fsynced."""
        rel = self.rel(path)
        fd = self.open(rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600, what="appending")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{rel}: not a regular file")
            if st.st_size == 0:
                own(fd, owner, self._masked(FILE_MODE), rel)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: str | PurePosixPath | Path, missing_ok: bool = True) -> None:
        """Remove a file (a symlink at the end is removed itself, never followed)."""
        with self.parent(path, "delete") as (dfd, name):
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                if not missing_ok:
                    raise
            except IsADirectoryError:
                raise UnsafePath(f"{self.rel(path)}: a folder, not a file") from None

    def rmdir(self, path: str | PurePosixPath | Path) -> bool:
        """Remove an empty folder; False if it is not empty or gone."""
        with contextlib.suppress(OSError), self.parent(path, "delete") as (dfd, name):
            os.rmdir(name, dir_fd=dfd)
            return True
        return False

    def chown(self, path: str | PurePosixPath | Path, owner: Owner, mode: int | None = None) -> None:
        """lchown-like: the file or folder itself (a symlink on the path is refused)."""
        fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK, what="chown")
        try:
            own(fd, owner, None if mode is None else self._masked(mode), self.rel(path))
        finally:
            os.close(fd)


def create_temp(dfd: int, name: str, mode: int = 0o600) -> tuple[int, str]:
    """A new file with a unique name beside ``name`` in folder ``dfd`` (mkstemp, in a descriptor)."""
    for _ in range(100):
        tmp = f".{name[:200]}.tmp-{secrets.token_hex(8)}"
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, mode, dir_fd=dfd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int, limit: int, rel: str) -> bytes:
    """At most ``limit`` bytes (UnsafePath if there are more); a network filesystem may answer in parts."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0 and (block := os.read(fd, left)):
        chunks.append(block)
        left -= len(block)
    if left <= 0:
        raise UnsafePath(f"{rel}: over the limit of {limit} bytes")
    return b"".join(chunks)


def own(fd: int, owner: Owner | None, mode: int | None, rel: str) -> None:
    """fchown (only what differs; a non-root controller may only change the group to one of its
    own), then fchmod (after: a chown may clear the set-group-id bit) unless the mode is already
    ``mode`` and nothing was chowned (a chmod is a metadata write even when it changes nothing)."""
    if owner is None and mode is None:
        return
    st = os.fstat(fd)
    chowned = False
    if owner is not None:
        uid = owner[0] if owner[0] not in (-1, st.st_uid) else -1
        gid = owner[1] if owner[1] not in (-1, st.st_gid) else -1
        if uid != -1 or gid != -1:
            chowned = True
            try:
                os.fchown(fd, uid, gid)
            except PermissionError:
                raise UnsafePath(
                    f"{rel or '.'}: ffswarm (uid {os.geteuid()}) cannot give it to {owner[0]}:{owner[1]}: run it as "
                    "root, or as controller_user in the runner's group (docs/operations.md#controller-user)"
                ) from None
    if mode is not None and (chowned or stat.S_IMODE(st.st_mode) != mode):
        os.fchmod(fd, mode)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _make_dir(dfd: int, name: str, owner: Owner | None, mode: int, rel: str) -> tuple[int, bool]:
    """Folder ``name`` in ``dfd``, opened, and whether it was made here: made under a temporary name,
    given ``owner`` and ``mode``, then renamed into place, so that no other process ever sees it
    half made (the controller's and 0700: a concurrent job's access check would refuse it as a
    folder the runner cannot enter). If another process made ``name`` meanwhile, that one is used."""
    tmp = f".ffswarm-new-{secrets.token_hex(6)}"
    os.mkdir(tmp, 0o700, dir_fd=dfd)
    try:
        sub = os.open(tmp, _DIR_FLAGS, dir_fd=dfd)
        try:
            own(sub, owner, mode, rel)
            _rename_noreplace(dfd, tmp, name)
        except BaseException:
            os.close(sub)
            raise
    except FileExistsError:
        os.rmdir(tmp, dir_fd=dfd)
        return os.open(name, _DIR_FLAGS, dir_fd=dfd), False
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(tmp, dir_fd=dfd)
        raise
    return sub, True


_renameat2_works = True


def _rename_noreplace(dfd: int, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` in ``dfd``; FileExistsError if ``dst`` exists. renameat2's
    RENAME_NOREPLACE where the filesystem has it; else (NFS, or a seccomp profile that refuses it) a
    check, then rename, which in that narrow race replaces an empty folder just made by another
    process with this one."""
    global _renameat2_works
    if _renameat2_works:
        if _lib().renameat2(dfd, os.fsencode(src), dfd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp profile without it
            raise OSError(err, os.strerror(err), dst)
        if err != errno.EPERM:  # the filesystem or kernel lacks it: for good (EPERM may be this folder's)
            _renameat2_works = False
    try:
        os.lstat(dst, dir_fd=dfd)
    except FileNotFoundError:
        try:
            os.rename(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)
            return
        except OSError as e:  # a folder made and filled meanwhile
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def proc_path(fd: int) -> str:
    """A name for an open descriptor that a child process (ffmpeg) can open: the very file, whatever
    happens to the path it was reached by."""
    return f"/proc/{os.getpid()}/fd/{fd}"


_SYSTEM = Volume(Path("/"))  # for callers holding absolute paths: no symlink anywhere on them


def write_atomic(path: Path, data: bytes, owner: Owner | None = None, durable: bool = True) -> None:
    """Temp name in the same folder (O_EXCL, in the folder's descriptor), then rename and fsync the
    folder; mode 0640 narrowed by the umask; never through a symlink on any part of ``path`` (an
    absolute path: callers outside a RunDir). `durable=False` skips the fsyncs, for bulk writes that
    the caller makes durable with one flush of the filesystem (planning 5,000 manifests)."""
    _SYSTEM.mkdirs(path.parent)
    _SYSTEM.write_atomic(path, data, owner, durable=durable)


def read_nofollow(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file, never through a symlink on any part of its path;
    None if it cannot be read (missing, a link, a folder, a fifo)."""
    try:
        fd = _SYSTEM.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, UnsafePath):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a fifo, a device: not a file we read
            return None
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (block := os.read(fd, left)):  # a network filesystem may answer in parts
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
