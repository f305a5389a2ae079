"""A request's hold on its tenant's quota ledger (controller/job/ledger.py): one job slot and the
bytes it may write, in ``open/.r-<hex>`` until the job is handed over or the request is refused.

The file is flocked by the request for as long as it runs, and its body is the bytes it holds —
the one record of them, so whoever adds bytes (a thread of the API, or a slow worker process the
descriptor is lent to) writes them there, under the ledger's lock, and whoever gives them back or
recounts reads them there. The kernel drops the lock when the request's process dies, so a recount
can tell a live reservation from an orphan.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.job.ledger import Ledger

PENDING = ".r-"  # a reservation's file name before it is bound to its job
FILE = os.O_NOFOLLOW | os.O_CLOEXEC
_WIDTH = 20  # the body's width: a count rewritten in place never leaves digits of a longer one behind

# The reservations this process holds, by (st_dev, st_ino): a process must never open (and then
# close) a reservation file it holds itself — on NFS flock is a per-process POSIX lock, which that
# close would drop.
_LIVE: dict[tuple[int, int], Reservation] = {}
_LIVE_LOCK = threading.Lock()


def bytes_in(fd: int) -> int:
    """The bytes a reservation file holds (0 when its body is not a count)."""
    data = os.pread(fd, 32, 0).strip()
    return int(data) if data.isdigit() else 0


def _set_bytes(fd: int, n: int) -> None:
    os.pwrite(fd, str(n).encode().ljust(_WIDTH), 0)


def add_bytes(fd: int, n: int) -> None:
    """``n`` more bytes recorded in the reservation file ``fd`` (under the ledger's lock)."""
    _set_bytes(fd, bytes_in(fd) + n)


class Reservation:
    """A request's job slot and bytes, held until committed (the job was handed over) or released."""

    def __init__(self, ledger: Ledger, name: str, fd: int) -> None:
        self.ledger = ledger
        self.name = name  # .r-<hex>, then the job's id once bound
        self.fd = fd
        self.bound_to_counted = False  # the job already had its file: this slot was given back
        self.done = False

    @classmethod
    def create(cls, ledger: Ledger, open_fd: int, nbytes: int, job: str | None = None) -> Reservation:
        """A new reservation file in ``open/`` (``open_fd``, under the ledger's lock), flocked, holding
        ``nbytes``; bound to ``job`` from the outset when its id is known (a new id: never counted)."""
        name = job or f"{PENDING}{secrets.token_hex(8)}"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | FILE, 0o644, dir_fd=open_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _set_bytes(fd, nbytes)
            st = os.fstat(fd)
            res = cls(ledger, name, fd)
            with _LIVE_LOCK:
                _LIVE[st.st_dev, st.st_ino] = res
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=open_fd)
            raise
        return res

    @property
    def bytes(self) -> int:
        """The bytes held, as its file says (a worker process may have added some)."""
        return bytes_in(self.fd)

    def _ours(self, open_fd: int) -> bool:
        """Whether ``open/<name>`` is still this reservation's file (a recount never removes a held
        one, but an operator might)."""
        try:
            st = os.stat(self.name, dir_fd=open_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def bind(self, job: str) -> None:
        """The slot becomes ``open/<job>`` — before the job reaches the inbox, so that its end (which
        may come at once) finds it. A job that is still counted (a retry) keeps its one slot."""
        if self.name == job:  # made bound (create)
            return
        with self.ledger.transaction() as tx:
            if exists(tx.open_fd, job):
                counts = tx.require()
                counts.jobs = max(counts.jobs - 1, 0)
                tx.save(counts)
                if self._ours(tx.open_fd):
                    os.unlink(self.name, dir_fd=tx.open_fd)
                self.bound_to_counted = True
            elif self._ours(tx.open_fd):
                os.rename(self.name, job, src_dir_fd=tx.open_fd, dst_dir_fd=tx.open_fd)
            self.name = job

    def reserve_bytes(self, n: int, limit: int) -> None:
        """``n`` more bytes for this request, refused (OverQuota "bytes") past ``limit``."""
        self.ledger.hold(self.fd, n, 0, limit)

    def release_bytes(self, n: int, kept: int = 0) -> None:
        """``n`` of this request's reserved bytes given back, ``kept`` of them now in the area."""
        with self.ledger.transaction() as tx:
            n = min(n, self.bytes)
            counts = tx.require()
            counts.reserved = max(counts.reserved - n, 0)
            counts.accepted += max(kept, 0)
            tx.save(counts)
            add_bytes(self.fd, -n)

    def commit(self, kept: int = 0) -> None:
        """The job was handed over: its slot stays (until the job ends), its reserved bytes become
        ``kept`` accepted bytes."""
        if self.done:
            return
        held = self.bytes
        if kept or held:  # a one-photo JSON submit holds none: no transaction
            self.release_bytes(held, kept)
        if self.name.startswith(PENDING):  # never bound to a job: nothing would give the slot back
            self.release()
            return
        self._close()

    def release(self) -> None:
        """Refused or failed: the slot and the bytes given back (those a worker process added
        included), the file removed."""
        if self.done:
            return
        try:
            with self.ledger.transaction() as tx:
                counts = tx.counts
                if counts is None:
                    return
                if not self.bound_to_counted and self._ours(tx.open_fd):  # else the slot went already
                    os.unlink(self.name, dir_fd=tx.open_fd)
                    counts.jobs = max(counts.jobs - 1, 0)
                counts.reserved = max(counts.reserved - self.bytes, 0)
                tx.save(counts)
        finally:
            self._close()

    def _close(self) -> None:
        self.done = True
        st = os.fstat(self.fd)
        with _LIVE_LOCK:  # out of _LIVE before the descriptor closes: ``held`` reads it under this lock
            _LIVE.pop((st.st_dev, st.st_ino), None)
            os.close(self.fd)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()  # a no-op once committed


def exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def held(dir_fd: int, name: str) -> int | None:
    """The bytes a reservation file holds while a live request holds it; None when no one does (a
    job's file, once committed, is held by no one)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    with _LIVE_LOCK:
        mine = _LIVE.get((st.st_dev, st.st_ino))
        if mine is not None:  # read through its own descriptor, never opened (and closed) here
            return mine.bytes
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):  # a live request holds it
                return bytes_in(fd)
        return None
    finally:
        os.close(fd)
