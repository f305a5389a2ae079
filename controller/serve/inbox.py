"""The inbox `ffswarm serve` takes job files from, read as a hostile folder.

The inbox is on the shared volume, where a compromised runner (the data root's uid) can write, so a
name ending in .yaml may be a symlink to root's key, a FIFO that blocks the reader, a folder, a huge
file or a hard link to a file its dropper cannot read. Only regular files with one link are taken:
looked at with lstat, opened O_NOFOLLOW|O_NONBLOCK, fstat-checked and read up to the policy's
``limits.job_file``; anything else is moved aside to failed/ with a reason that names it, never its
content or its target. A name that vanishes between listing and claiming is skipped.

A claim never replaces a file. The bytes that were checked are written, O_EXCL, to
``running/<name>.<uuid>.yaml`` (owned by the controller: its dropper cannot change them later), and
the dropped file is removed only if it is still the one that was read; of two claimers, the one
whose removal fails backs out. done/, failed/ and a put-back inbox file are placed by link(), which
fails rather than replaces, with a unique suffix on a collision.

Each claim has a lease (controller/run/lease.py), ``running/.<claimed>.lease``: who holds it (host,
pid, boot and pid namespace, a per-controller id), when it was last renewed, at what interval, and how
many times a controller has started the file. The holder renews it while the job runs; another
controller takes a file over only once the lease has expired (unrenewed for EXPIRY intervals, or at
once when its holder was a process on this machine and namespace that no longer exists), never a live
controller's.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import re
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from controller.errors import UsageError
from controller.redact import printable
from controller.run import lease as leases
from controller.run.lease import EXPIRY, Owner, Record, write_new

__all__ = ["JOB_SUFFIXES", "Inbox", "Refused", "original_name"]

JOB_SUFFIXES = (".yaml", ".yml")
SETTLE_SECONDS = 1.0  # a file younger than this may still be being written (write NAME.tmp, then rename)
DEFAULT_MAX_BYTES = 1024**2
_CLAIMED = re.compile(r"(?P<stem>.+)\.[0-9a-f]{32}(?P<suffix>\.ya?ml)")


def original_name(claimed: str) -> str:
    """The name a file was dropped as (``nightly.yaml``) from its claimed name (``nightly.<uuid>.yaml``)."""
    m = _CLAIMED.fullmatch(claimed)
    return f"{m['stem']}{m['suffix']}" if m else claimed


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


class Refused(Exception):
    """A dropped entry that is not taken; the reason names it, never its content or target."""


class Inbox:
    def __init__(self, path: Path, max_bytes: int | None = None, interval: float = 5.0) -> None:
        self.path = path
        self.max_bytes = max_bytes  # policy.limits.job_file (the server sets it)
        self.interval = interval  # lease renewal interval (the server's heartbeat)
        self.owner = Owner.me()
        self._index: dict[str, tuple[int, float]] = {}  # waiting entries: name -> (inode, mtime) when first seen
        # told the job's id when its file reaches done/ or failed/ (the API's quota ledger; the
        # server sets it); must not raise
        self.on_end: Callable[[str], None] | None = None

    @property
    def running(self) -> Path:
        return self.path / "running"

    @property
    def done(self) -> Path:
        return self.path / "done"

    @property
    def failed(self) -> Path:
        return self.path / "failed"

    def ensure(self) -> None:
        """The folders, each a real folder (a symlink in their place is refused, not followed)."""
        for d in (self.path, self.running, self.done, self.failed):
            with contextlib.suppress(FileExistsError):
                d.mkdir(parents=True, mode=0o755)
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise UsageError(f"{d} is not a folder (a symlink or file in its place is never followed)")

    # -- taking files ----------------------------------------------------------------------------------
    def waiting(self, now: float, limit: int | None = None) -> list[Path]:
        """Entries named *.yaml/*.yml ready to look at, oldest first (by lstat: a symlink is never
        followed); hidden and half-written ones are left alone, vanished ones skipped. At most
        ``limit`` of them (the oldest), when given.

        Indexed: each entry is stat'ed once, when first listed (or when its inode changes, or while
        it is still settling); later polls read the folder's names and inode numbers only (getdents),
        so 50,000 waiting requests cost one listing per poll, not 50,000 stat calls."""
        index: dict[str, tuple[int, float]] = {}
        with os.scandir(self.path) as entries:
            for e in entries:
                if e.name.startswith(".") or not e.name.endswith(JOB_SUFFIXES):
                    continue
                known = self._index.get(e.name)
                if known is not None and known[0] == e.inode() and now - known[1] >= SETTLE_SECONDS:
                    index[e.name] = known
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:  # claimed by another controller since the listing
                    continue
                index[e.name] = (st.st_ino, st.st_mtime)
        self._index = index
        ready = ((mtime, name) for name, (_, mtime) in index.items() if now - mtime >= SETTLE_SECONDS)
        oldest = sorted(ready) if limit is None else heapq.nsmallest(limit, ready)
        return [self.path / name for _, name in oldest]

    def claim(self, path: Path, starts: int = 0) -> Path | None:
        """``running/<name>.<uuid>.yaml`` holding the checked bytes of ``path``, with this
        controller's lease; None when the file vanished or another controller took it. An entry that
        is not a regular file, or is too big, is moved to failed/ with its reason (and None).
        ``starts``: the starts its lease records from the outset (1: this claim is the file's first
        start, counted without a second write of the lease)."""
        try:
            raw, st = self._read(path)
        except FileNotFoundError:
            return None
        except Refused as e:
            self.refuse(path, str(e))
            return None
        if time.time() - st.st_mtime < SETTLE_SECONDS:  # written again since it was listed: let it settle
            return None
        stem, suffix = os.path.splitext(path.name)
        claimed = self.running / f"{stem}.{uuid.uuid4().hex}{suffix}"
        if not leases.create(self.lease_file(claimed), self._fresh(starts)):
            return None
        try:
            write_new(claimed, raw)
            if not _same_file(path, st):  # replaced since it was read, or claimed by another: not ours
                raise FileNotFoundError(path)
            os.unlink(path)
        except OSError:
            self._drop(claimed)
            return None
        return claimed

    def _read(self, path: Path) -> tuple[bytes, os.stat_result]:
        limit = self.max_bytes or DEFAULT_MAX_BYTES
        before = os.lstat(path)
        if not stat.S_ISREG(before.st_mode):  # never opened: a FIFO would block, a device could act
            raise Refused(f"is {_kind(before.st_mode)}; only regular files are taken")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused("is a symbolic link; only regular files are taken") from None
            if e.errno == errno.ENOENT:
                raise
            raise Refused(f"cannot be read ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"is {_kind(st.st_mode)}; only regular files are taken")
            if st.st_nlink != 1:
                raise Refused("has other hard links; copy a job file into the inbox, do not link it")
            if st.st_size > limit:
                raise Refused(f"is {st.st_size} bytes, the limit is {limit} (the cluster's policy.limits.job_file)")
            chunks: list[bytes] = []
            left = limit + 1
            while left > 0 and (block := os.read(fd, left)):
                chunks.append(block)
                left -= len(block)
        finally:
            os.close(fd)
        raw = b"".join(chunks)
        if len(raw) > limit:  # it grew while being read
            raise Refused(f"is over {limit} bytes, the limit (the cluster's policy.limits.job_file)")
        return raw, st

    def refuse(self, path: Path, why: str) -> Path | None:
        """Move a dropped entry aside to failed/ with its reason; None if it vanished first."""
        try:
            moved = _place(path, self.failed, path.name)
        except FileNotFoundError:
            return None
        self.write_reason(moved, f"{self._shown(moved)}: {why}")
        self._ended(path.name)
        return moved

    # -- leases ----------------------------------------------------------------------------------------
    def lease_file(self, claimed: Path) -> Path:
        return self.running / f".{claimed.name}.lease"

    def lease(self, claimed: Path) -> Record | None:
        return leases.read(self.lease_file(claimed), time.time())

    def _fresh(self, starts: int) -> Record:
        now = time.time()
        return Record(self.owner, now, self.interval, starts, started=now)

    def count_start(self, claimed: Path) -> int:
        """How many times a controller has started this claimed file, this time included (kept in its
        lease: a file that kills the controller would otherwise be resumed forever)."""
        lease = self.lease(claimed)
        starts = (lease.starts if lease else 0) + 1
        leases.write(self.lease_file(claimed), self._fresh(starts))
        return starts

    def renew(self, claimed: Path) -> bool:
        """Renew this controller's lease; False (and no write) when it is no longer ours. A file that
        ended (moved to done/, failed/ or back to the inbox) while the renewal was being written has
        its lease removed again: the renewal may have put it back after the end removed it."""
        if not leases.renew(self.lease_file(claimed), self.owner, time.time(), self.interval):
            return False
        if not os.path.lexists(claimed):  # claimed names are never reused: it has ended for good
            self._forget(claimed)
            return False
        return True

    def expired(self, now: float) -> list[Path]:
        """Claimed files whose lease has expired (their controller is gone), taken over by this one:
        of two controllers looking, one wins. A live controller's files are never among them."""
        taken: list[Path] = []
        with os.scandir(self.running) as entries:
            found = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        names = sorted(n for n in found if not n.startswith("."))
        for name in names:
            if os.path.splitext(name)[1] in JOB_SUFFIXES and self._take_over(self.running / name, now):
                taken.append(self.running / name)
        self._orphans([n for n in found if n.startswith(".") and n.endswith(".lease")], set(names), now)
        return taken

    def _orphans(self, lease_names: list[str], claimed: set[str], now: float) -> None:
        """Remove the expired leases of files no longer claimed: a controller killed between a claim's
        lease and its file leaves one (the claimed name is never used again). A fresh one may be a
        claim under way: it is left until it expires."""
        for name in lease_names:
            if name[1 : -len(".lease")] in claimed:
                continue
            path = self.running / name
            lease = leases.read(path, now)
            try:
                age = now - os.lstat(path).st_mtime
                if lease.expired(now, self.owner) if lease else age >= EXPIRY * self.interval:
                    os.unlink(path)
            except FileNotFoundError:
                continue

    def _take_over(self, claimed: Path, now: float) -> bool:
        lease_file = self.lease_file(claimed)
        lease = leases.read(lease_file, now)
        if lease is not None and (lease.owner.id == self.owner.id or not lease.expired(now, self.owner)):
            return False
        fresh = self._fresh(lease.starts if lease else 0)
        if lease is not None:
            return leases.take_over(lease_file, lease, fresh, now)
        try:  # no lease, or an unreadable one: a claimer may be between its two writes
            if now - os.lstat(claimed).st_mtime < EXPIRY * self.interval:
                return False
            if os.path.lexists(lease_file):
                return leases.take_over(lease_file, None, fresh, now)
            return leases.create(lease_file, fresh)
        except OSError:
            return False

    # -- endings ---------------------------------------------------------------------------------------
    def put_back(self, claimed: Path, delay: float) -> Path:
        """Return a claimed file to the inbox (under its name, unless a new file took it), not to be
        picked again for `delay` seconds (its mtime is set into the future: `waiting` only takes
        files that have settled)."""
        target = _place(claimed, self.path, original_name(claimed.name))
        self._forget(claimed)
        later = time.time() + delay
        os.utime(target, (later, later), follow_symlinks=False)
        return target

    def finish(self, claimed: Path, ok: bool, reason: str | None) -> Path:
        """Move a claimed file to done/ or failed/ under its dropped name (a unique one when that is
        taken: never replaced), with the reason naming it where it now is."""
        folder = self.done if ok else self.failed
        target = _place(claimed, folder, original_name(claimed.name))
        self._forget(claimed)
        self._ended(claimed.name)
        if reason is not None:
            where = f"{self.running.name}/{claimed.name}"
            self.write_reason(target, reason.replace(where, f"{folder.name}/{target.name}"))
        return target

    def _ended(self, name: str) -> None:
        stem, suffix = os.path.splitext(original_name(name))
        if self.on_end is not None and suffix in JOB_SUFFIXES:
            self.on_end(stem)

    def write_reason(self, target: Path, reason: str) -> Path:
        """``<target>.reason.txt``, created anew (a planted file or link of that name is removed, not
        followed), control characters escaped."""
        path = target.with_name(f"{target.name}.reason.txt")
        data = (printable(reason.rstrip(), newlines=True) + "\n").encode()
        try:
            write_new(path, data)
        except FileExistsError:
            os.unlink(path)
            write_new(path, data)
        return path

    def _forget(self, claimed: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.lease_file(claimed))

    def _drop(self, claimed: Path) -> None:
        for p in (claimed, self.lease_file(claimed)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    def _shown(self, path: Path) -> str:
        """``<inbox>/failed/NAME`` as a reason names it (the inbox folder's name and below)."""
        return printable(f"{self.path.name}/{path.relative_to(self.path)}")


def _same_file(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _place(src: Path, folder: Path, name: str) -> Path:
    """Move ``src`` (never followed: a symlink moves as itself) into ``folder`` as ``name``, or as
    ``<stem>.<time>-<hex><suffix>`` when that name is taken: link() then unlink(), which never
    replaces a file. An entry that cannot be linked (a folder) is renamed to a fresh unique name."""
    stem, suffix = os.path.splitext(name)
    candidates = [name] + [f"{stem}.{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}{suffix}" for _ in range(5)]
    for candidate in candidates:
        target = folder / candidate
        try:
            os.link(src, target, follow_symlinks=False)
        except FileExistsError:
            continue
        except FileNotFoundError:
            raise
        except OSError:  # a folder, or a file this uid may not link (protected_hardlinks)
            target = folder / f"{stem}.{uuid.uuid4().hex}{suffix}"  # fresh: there is nothing to replace
            os.rename(src, target)
            return target
        with contextlib.suppress(FileNotFoundError):
            os.unlink(src)
        return target
    raise FileExistsError(f"no free name for {name} in {folder}")
