"""A tenant's quota ledger on the shared volume: its unfinished jobs and its bytes, read in O(1).

A submit must know how many of the tenant's jobs are not finished and how many bytes its area holds,
without looking at every job or file the tenant ever had, and two requests at the quota's edge (in
two threads, two processes or two API replicas on the same volume) must not both get the last slot.
So the counts are kept, not recounted, in ``tenants/.quota/<t>/`` (the controller's folders, beside
the owner records of ``tenants/.jobs/``, which runners cannot write):

- ``ledger``: one small JSON object — ``jobs`` (unfinished plus in flight), ``reserved`` (bytes
  promised to requests in flight), ``walked``/``walked_at`` (the area's bytes at its last walk) and
  ``accepted`` (bytes accepted since that walk began), ``counted_at`` (its last recount). Every change
  is read-modify-write under ``flock`` on that file (opened without following links), inside a
  per-process thread lock as well: on NFS flock becomes a POSIX lock, which a process holds for all
  its threads at once.
- ``open/<job>``: one empty file per job the ledger counts, created when the API hands the job over
  and removed when the job ends (`serve`, Inbox.finish), so a job is subtracted exactly once: only the
  unlink that removes the file decrements.
- ``open/.r-<hex>``: a reservation in flight, flocked by its request until it becomes ``open/<job>``
  (bound) and is committed, or is released. Its body is the bytes it holds. The kernel drops the lock
  when the request's process dies, so a recount can tell a live reservation from an orphan.

The fast counts may drift upwards (a process killed between a job's end and its decrement, a job
that ended by a path that does not decrement); never silently downwards except for the race noted
in ``Ledger.recount``. A recount rebuilds them from ``open/``: each file is kept while its request
holds it or its job is still unfinished (the caller says which), and the rest are removed. The API
recounts whenever the fast count says "over quota" and every RECOUNT_SECONDS, so drift never keeps a
tenant out. A missing or torn ledger is rebuilt from the caller's list of the tenant's jobs.

Writes are not fsynced: after a crash of the machine the ledger may be behind, and the next periodic
recount (or a torn file's rebuild) sets it right.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import secrets
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from contract.layout import TENANTS
from controller.job.owners import JOB_ID
from controller.volume import UnsafePath, Volume

LEDGER_DIR = ".quota"
RECOUNT_SECONDS = 600.0  # the fast count is recounted at least this often
STORED_SECONDS = 5.0  # the area's bytes are walked again at most this often (across replicas)
_PENDING = ".r-"
_MAX_LEDGER = 4096
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC

# Locks of this process: flock on NFS is a per-process POSIX lock, so threads must also exclude each
# other, and a process must never open (and then close) a reservation file it holds itself.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_LIVE: dict[tuple[int, int], Reservation] = {}  # by (st_dev, st_ino): the reservations this process holds
_GLOBAL = threading.Lock()

Unfinished = Callable[[Collection[str]], Collection[str]]  # of these jobs, those not yet ended


@dataclass
class Counts:
    jobs: int = 0
    reserved: int = 0
    walked: int = 0
    walked_at: float = -math.inf
    walk_started: float = -math.inf
    accepted: int = 0
    counted_at: float = -math.inf

    @property
    def stored(self) -> int:
        """Bytes held or promised: the last walk, what was accepted since, what is reserved."""
        return self.walked + self.accepted + self.reserved

    def to_json(self) -> bytes:
        d = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in vars(self).items()}
        return json.dumps(d).encode()

    @classmethod
    def parse(cls, data: bytes) -> Counts | None:
        """The counts a ledger file holds; None when it is not one (torn, garbage, wrong types)."""
        try:
            d = json.loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        out = cls()
        for name, default in ((f.name, f.default) for f in fields(cls)):
            v = d.get(name)
            if isinstance(default, int) and not isinstance(default, bool):
                if type(v) is not int or v < 0:
                    return None
                setattr(out, name, v)
            elif v is not None:
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    return None
                setattr(out, name, float(v))
        return out


class OverQuota(Exception):
    """A reservation refused: ``what`` is "jobs" or "bytes", ``have`` what the tenant holds."""

    def __init__(self, what: str, have: int) -> None:
        super().__init__(f"over the {what} quota: {have}")
        self.what = what
        self.have = have


class Ledger:
    """One tenant's ledger under a data root."""

    def __init__(self, data_root: Path, tenant: str) -> None:
        self.volume = Volume(data_root)
        self.rel = f"{TENANTS}/{LEDGER_DIR}/{tenant}"
        with _GLOBAL:
            self._lock = _THREAD_LOCKS.setdefault(str(data_root / self.rel), threading.Lock())

    # -- the ledger file ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Tx]:
        """The ledger locked (threads and processes) for a read-modify-write."""
        with self._lock:
            try:
                dir_fd = self.volume.open_dir(self.rel, "keep the quota ledger")
            except FileNotFoundError:
                self.volume.mkdirs(f"{self.rel}/open", mode=0o755)
                dir_fd = self.volume.open_dir(self.rel, "keep the quota ledger")
            try:
                fd = os.open("ledger", os.O_RDWR | os.O_CREAT | _FILE, 0o644, dir_fd=dir_fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    tx = _Tx(dir_fd, fd)
                    try:
                        yield tx
                    finally:
                        os.close(tx.open_fd)
                finally:
                    os.close(fd)  # the lock goes with it
            finally:
                os.close(dir_fd)

    def read(self) -> Counts | None:
        with self.transaction() as tx:
            return tx.counts

    # -- reservations ---------------------------------------------------------------------------------
    def reserve(self, tx: _Tx, nbytes: int) -> Reservation:
        """One job slot and ``nbytes`` bytes taken in ``tx`` (the caller checked the limits)."""
        counts = tx.require()
        name = f"{_PENDING}{secrets.token_hex(8)}"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE, 0o644, dir_fd=tx.open_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, str(nbytes).encode())
            st = os.fstat(fd)
            res = Reservation(self, name, fd, nbytes)
            with _GLOBAL:
                _LIVE[st.st_dev, st.st_ino] = res
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=tx.open_fd)
            raise
        counts.jobs += 1
        counts.reserved += nbytes
        tx.save(counts)
        return res

    def job_ended(self, job: str) -> bool:
        """A job of this tenant ended: its ``open/<job>`` removed and the count lowered, once.
        False when the ledger did not count it (another tenant's, or already subtracted)."""
        if not JOB_ID.fullmatch(job):
            return False
        try:
            os.lstat(self.volume.root / self.rel / "open" / job)  # the common miss costs one lstat
        except OSError:
            return False
        with self.transaction() as tx:
            try:
                os.unlink(job, dir_fd=tx.open_fd)
            except FileNotFoundError:
                return False
            counts = tx.counts
            if counts is not None:
                counts.jobs = max(counts.jobs - 1, 0)
                tx.save(counts)
            return True

    def orphaned(self) -> bool:
        """Whether ``open/`` holds a reservation whose request's process died (a recount frees it)."""
        try:
            dir_fd = self.volume.open_dir(f"{self.rel}/open", "read the quota ledger")
        except (OSError, UnsafePath):
            return False
        try:
            return any(n.startswith(_PENDING) and _held(dir_fd, n) is None for n in os.listdir(dir_fd))
        finally:
            os.close(dir_fd)

    def recount(self, tx: _Tx, unfinished: Unfinished, now: float, also: Iterable[str] = ()) -> Counts:
        """``jobs`` and ``reserved`` rebuilt from ``open/``: a reservation counts while its request
        holds it, a job while its request holds it or ``unfinished`` says so; the others are removed.
        ``also``: jobs to mark first (a rebuild: the tenant's jobs that have no file yet).

        A job whose inbox file is being moved while ``unfinished`` looks may be missed: it then stops
        counting early, until it ends."""
        counts = tx.counts or Counts()
        names = set(os.listdir(tx.open_fd))
        for job in also:
            if JOB_ID.fullmatch(job) and job not in names:
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(job, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE, 0o644, dir_fd=tx.open_fd))
                names.add(job)
        held = {n: b for n in names if (b := _held(tx.open_fd, n)) is not None}
        jobs = [n for n in names if JOB_ID.fullmatch(n) and n not in held]
        alive = set(unfinished(jobs))
        for name in names - held.keys() - alive:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=tx.open_fd)
        counts.jobs = len(held) + len(alive)
        counts.reserved = sum(held.values())
        counts.counted_at = now
        tx.save(counts)
        return counts


def job_ended(data_root: Path, tenants: Iterable[str], job: str) -> bool:
    """`serve` ended ``job``: subtracted from the ledger of the tenant that counts it (an lstat per
    tenant to find it; a CLI job is in none)."""
    return any(Ledger(data_root, t).job_ended(job) for t in tenants)


class _Tx:
    """An open, locked ledger: its counts (None when missing or torn) and its ``open/`` folder."""

    def __init__(self, dir_fd: int, fd: int) -> None:
        self.fd = fd
        data = os.pread(fd, _MAX_LEDGER + 1, 0)
        self.counts = Counts.parse(data) if data else None
        try:
            self.open_fd = os.open("open", os.O_RDONLY | os.O_DIRECTORY | _FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            os.mkdir("open", 0o755, dir_fd=dir_fd)
            self.open_fd = os.open("open", os.O_RDONLY | os.O_DIRECTORY | _FILE, dir_fd=dir_fd)

    def require(self) -> Counts:
        if self.counts is None:
            raise RuntimeError("the ledger must be rebuilt first")
        return self.counts

    def save(self, counts: Counts) -> None:
        data = counts.to_json()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        self.counts = counts


class Reservation:
    """A request's job slot and bytes, held until committed (the job was handed over) or released."""

    def __init__(self, ledger: Ledger, name: str, fd: int, nbytes: int) -> None:
        self.ledger = ledger
        self.name = name  # .r-<hex>, then the job's id once bound
        self.fd = fd
        self.bytes = nbytes
        self.bound_to_counted = False  # the job already had its file: this slot was given back
        self.done = False

    def _ours(self, tx: _Tx) -> bool:
        """Whether ``open/<name>`` is still this reservation's file (a recount never removes a held
        one, but an operator might)."""
        try:
            st = os.stat(self.name, dir_fd=tx.open_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def bind(self, job: str) -> None:
        """The slot becomes ``open/<job>`` — before the job reaches the inbox, so that its end (which
        may come at once) finds it. A job that is still counted (a retry) keeps its one slot."""
        with self.ledger.transaction() as tx:
            if _exists(tx.open_fd, job):
                counts = tx.require()
                counts.jobs = max(counts.jobs - 1, 0)
                tx.save(counts)
                if self._ours(tx):
                    os.unlink(self.name, dir_fd=tx.open_fd)
                self.bound_to_counted = True
            elif self._ours(tx):
                os.rename(self.name, job, src_dir_fd=tx.open_fd, dst_dir_fd=tx.open_fd)
            self.name = job

    def reserve_bytes(self, n: int, limit: int) -> None:
        """``n`` more bytes for this request, refused (OverQuota "bytes") past ``limit``."""
        with self.ledger.transaction() as tx:
            counts = tx.require()
            if counts.stored + n > limit:
                raise OverQuota("bytes", counts.stored)
            counts.reserved += n
            tx.save(counts)
            self.bytes += n
            os.pwrite(self.fd, str(self.bytes).encode().ljust(20), 0)

    def release_bytes(self, n: int, kept: int = 0) -> None:
        """``n`` of this request's reserved bytes given back, ``kept`` of them now in the area."""
        n = min(n, self.bytes)
        with self.ledger.transaction() as tx:
            counts = tx.require()
            counts.reserved = max(counts.reserved - n, 0)
            counts.accepted += max(kept, 0)
            tx.save(counts)
            self.bytes -= n
            os.pwrite(self.fd, str(self.bytes).encode().ljust(20), 0)

    def commit(self, kept: int = 0) -> None:
        """The job was handed over: its slot stays (until the job ends), its reserved bytes become
        ``kept`` accepted bytes."""
        if self.done:
            return
        if self.bytes or kept:
            self.release_bytes(self.bytes, kept)
        if self.name.startswith(_PENDING):  # never bound to a job: nothing would give the slot back
            self.release()
            return
        self._close()

    def release(self) -> None:
        """Refused or failed: the slot and the bytes given back, the file removed."""
        if self.done:
            return
        try:
            with self.ledger.transaction() as tx:
                counts = tx.counts
                if counts is None:
                    return
                if not self.bound_to_counted and self._ours(tx):  # else the slot went already
                    os.unlink(self.name, dir_fd=tx.open_fd)
                    counts.jobs = max(counts.jobs - 1, 0)
                counts.reserved = max(counts.reserved - self.bytes, 0)
                tx.save(counts)
        finally:
            self._close()

    def _close(self) -> None:
        self.done = True
        st = os.fstat(self.fd)
        with _GLOBAL:
            _LIVE.pop((st.st_dev, st.st_ino), None)
        os.close(self.fd)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()  # a no-op once committed


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _held(dir_fd: int, name: str) -> int | None:
    """The bytes a reservation file holds while a live request holds it; None when no one does (a
    job's file, once committed, is held by no one)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    with _GLOBAL:
        mine = _LIVE.get((st.st_dev, st.st_ino))
    if mine is not None:  # never opened (and closed) here: on NFS that would drop this process's own lock
        return mine.bytes
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):  # a live request holds it
                data = os.pread(fd, 32, 0).strip()
                return int(data) if data.isdigit() else 0
        return None
    finally:
        os.close(fd)
