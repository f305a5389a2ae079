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
- ``open/.r-<hex>``: a reservation in flight (controller/job/reservation.py), flocked by its request
  until it becomes ``open/<job>`` (bound) and is committed, or is released. Its body is the bytes it
  holds: every byte the request will leave in the area is added there, under the lock, before it is
  written (``Ledger.hold``). The kernel drops the lock when the request's process dies, so a recount
  can tell a live reservation from an orphan.

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
import fcntl
import json
import math
import os
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from contract.layout import TENANTS
from controller.job import reservation
from controller.job.owners import JOB_ID
from controller.job.reservation import FILE, PENDING, Reservation
from controller.volume import UnsafePath, Volume

LEDGER_DIR = ".quota"
RECOUNT_SECONDS = 600.0  # the fast count is recounted at least this often
STORED_SECONDS = 5.0  # the area's bytes are walked again at most this often (across replicas)
_MAX_LEDGER = 4096

# Locks of this process: flock on NFS is a per-process POSIX lock, so threads must also exclude each other.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
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
        super().__init__(what, have)  # its arguments: it crosses from a worker process as raised there
        self.what = what
        self.have = have

    def __str__(self) -> str:
        return f"over the {self.what} quota: {self.have}"


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
                fd = os.open("ledger", os.O_RDWR | os.O_CREAT | FILE, 0o644, dir_fd=dir_fd)
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
    def reserve(self, tx: _Tx, nbytes: int, job: str | None = None) -> Reservation:
        """One job slot and ``nbytes`` bytes taken in ``tx`` (the caller checked the limits), bound to
        the new ``job`` when given."""
        counts = tx.require()
        res = Reservation.create(self, tx.open_fd, nbytes, job)
        counts.jobs += 1
        counts.reserved += nbytes
        tx.save(counts)
        return res

    def hold(self, fd: int, need: int, ahead: int, limit: int) -> int:
        """``need`` more bytes added to the reservation whose file ``fd`` is (its own descriptor, or
        one lent to a worker process), and up to ``ahead`` more as far as they fit; refused
        (OverQuota "bytes") when ``need`` would take the tenant past ``limit``. The bytes taken."""
        with self.transaction() as tx:
            counts = tx.require()
            room = limit - counts.stored
            if need > room:
                raise OverQuota("bytes", counts.stored)
            take = need + max(min(ahead, room - need), 0)
            counts.reserved += take
            tx.save(counts)
            reservation.add_bytes(fd, take)
            return take

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
            return any(n.startswith(PENDING) and reservation.held(dir_fd, n) is None for n in os.listdir(dir_fd))
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
                    os.close(os.open(job, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE, 0o644, dir_fd=tx.open_fd))
                names.add(job)
        held = {n: b for n in names if (b := reservation.held(tx.open_fd, n)) is not None}
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
            self.open_fd = os.open("open", os.O_RDONLY | os.O_DIRECTORY | FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            os.mkdir("open", 0o755, dir_fd=dir_fd)
            self.open_fd = os.open("open", os.O_RDONLY | os.O_DIRECTORY | FILE, dir_fd=dir_fd)

    def require(self) -> Counts:
        if self.counts is None:
            raise RuntimeError("the ledger must be rebuilt first")
        return self.counts

    def save(self, counts: Counts) -> None:
        data = counts.to_json()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        self.counts = counts
