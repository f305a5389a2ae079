"""Leases: a controller holds something (a job's run folder, a claimed inbox file) while it works on it.

One record for every lease (``Record``): who holds it (``Owner``: host, pid, boot id, pid namespace,
a random id per holder, a label people read), when it started, the heartbeat its holder renews every
``interval`` seconds, and a start counter only the inbox uses. Another controller takes a lease over
only when it has expired: ``EXPIRY`` heartbeats missed, or its holder was a process of this machine's
boot and pid namespace that has ended. Users: controller/run/job_lease.py (``runs/<job>/lease.json``)
and controller/serve/inbox.py (``running/.<claimed>.lease``).

A lease lives on the shared volume, where a compromised runner can write, so it is read back as
hostile input (``Record.parse``): at most ``MAX_BYTES``, every field's type and range checked, and a
heartbeat far in the future (a forged "forever" lease) counts as no lease at all.

Writes never go through a link and never leave a half-written lease: a lease is created with link()
of a fresh file (exclusive: of two creators one fails), renewed with rename() of a fresh file over it,
and taken over (``take_over``) by the one taker that links the expired lease to a name made of it,
without ever removing it: of any number of takers and creators, exactly one holds the lease after.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import math
import os
import socket
import stat
import sys
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.volume import read_nofollow

EXPIRY = 3  # heartbeats missed before a lease has expired
CLOCK_SLACK = 30.0  # seconds a heartbeat may lie ahead of this host's clock (NTP skew)
MAX_BYTES = 4096
MAX_PID = 2**31 - 1  # os.kill() overflows above it
MAX_STARTS = 10**6
TAKEOVER_STALE = 60.0  # seconds after which a take-over's marker is a killed taker's


def rfc3339(t: float) -> str:
    """A unix time as people and JSON tools read it: local time with its UTC offset, in seconds."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


_SELF = (0, "", "", "")  # Owner.me's pid, boot id, pid namespace and label: read once per process


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:64]
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")[:64]
    except OSError:
        return ""


def who() -> str:
    """This process as people read it in a lease: ``user (ffswarm COMMAND, pid N)``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    command = " ".join(["ffswarm", *command_of(sys.argv[1:])])
    return "".join(c if c.isprintable() else "?" for c in f"{user} ({command}, pid {os.getpid()})")[:200]


ROOT_VALUE_OPTIONS = ("--config",)  # options before the command that take a value (controller/cli/main.py)


def command_of(args: list[str]) -> list[str]:
    """The command a process runs (``["submit"]``), past the root options before it
    (``--json-logs --config F submit …``); none for a bare ``ffswarm``."""
    it = iter(args)
    for arg in it:
        if arg in ROOT_VALUE_OPTIONS:
            next(it, None)
        elif not arg.startswith("-"):
            return [arg]
    return []


@dataclass(frozen=True)
class Owner:
    """Who holds a lease. ``boot`` and ``pidns`` tell whether ``pid`` can be checked from here; ``id``
    tells this holder from any other (a renewal from a takeover); ``label`` is for people."""

    host: str
    pid: int
    boot: str
    pidns: str
    id: str
    label: str = ""

    @classmethod
    def me(cls) -> Owner:
        global _SELF
        if _SELF[0] != os.getpid():  # a new process (a fork's child too): what cannot change while it lives
            _SELF = (os.getpid(), _boot_id(), _pid_namespace(), who())
        pid, boot, pidns, label = _SELF
        return cls(socket.gethostname()[:255], pid, boot, pidns, uuid.uuid4().hex, label)

    def gone(self, here: Owner) -> bool:
        """True only when the holder was a process of this machine's boot and pid namespace that has
        ended; a holder elsewhere can only expire."""
        same = self.host == here.host and self.boot and self.boot == here.boot and self.pidns == here.pidns
        if not same or self.id == here.id:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except (OSError, OverflowError):
            return False
        return False


@dataclass(frozen=True)
class Record:
    """One lease as written to the volume (flat JSON: the owner's fields beside the times)."""

    owner: Owner
    heartbeat: float  # the holder's wall clock at its last renewal
    interval: float  # seconds between renewals
    starts: int = 0  # controller starts of a claimed inbox file, this one included (inbox only)
    started: float = 0.0  # when this holder took the lease

    def expired(self, now: float, here: Owner) -> bool:
        """The one expiry rule: EXPIRY heartbeats missed, or a holder here that has ended."""
        return now - self.heartbeat > EXPIRY * self.interval or self.owner.gone(here)

    def since(self) -> str:
        return rfc3339(self.started)

    def to_json(self) -> bytes:
        o = self.owner
        data = {"owner": o.label, "host": o.host, "pid": o.pid, "boot": o.boot, "pidns": o.pidns, "token": o.id}
        data |= {k: v for k, v in asdict(self).items() if k != "owner"}
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes | None, now: float) -> Record | None:
        """A lease read back from the volume, every field checked; None for anything a controller
        did not write, and for a heartbeat further ahead of ``now`` than CLOCK_SLACK."""
        if raw is None or len(raw) > MAX_BYTES:
            return None
        try:
            d = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        try:
            owner = Owner(
                host=_text(d["host"], 255, empty=False),
                pid=_int(d["pid"], 1, MAX_PID),
                boot=_text(d["boot"], 64),
                pidns=_text(d["pidns"], 64),
                id=_text(d["token"], 64, empty=False),
                label=_text(d["owner"], 200),
            )
            record = cls(
                owner,
                heartbeat=_number(d["heartbeat"]),
                interval=_number(d["interval"]),
                starts=_int(d["starts"], 0, MAX_STARTS),
                started=_number(d["started"]),
            )
        except (KeyError, ValueError):
            return None
        if not 0.01 <= record.interval <= 3600 or record.heartbeat > now + CLOCK_SLACK:
            return None  # a forged "forever" lease would otherwise keep every controller out
        return record


def _text(v: Any, limit: int, empty: bool = True) -> str:
    if not isinstance(v, str) or len(v) > limit or (not v and not empty) or not v.isprintable():
        raise ValueError(v)
    return v


def _int(v: Any, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(v)
    return v


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(v)  # NaN never expires: every comparison with it is false
    return float(v)


# -- the file ------------------------------------------------------------------------------------------
def read(path: Path, now: float) -> Record | None:
    """The lease at ``path`` as recorded (expired or not); None when there is none to trust."""
    return Record.parse(read_nofollow(path, MAX_BYTES + 1), now)


def write_new(path: Path, data: bytes, durable: bool = True) -> None:
    """A new file (O_EXCL, never through a link), written and (``durable``) fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _put(path: Path, record: Record, exclusive: bool, durable: bool = True) -> bool:
    """A fresh temporary file, then link() (``exclusive``: False when a lease exists) or rename() over
    the lease."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:  # a write that fails half-way (a full volume) leaves no temporary file behind either
        write_new(tmp, record.to_json(), durable)
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def create(path: Path, record: Record) -> bool:
    """The lease, created only if there is none: of two creators exactly one gets True."""
    return _put(path, record, exclusive=True)


def write(path: Path, record: Record, durable: bool = True) -> None:
    """The lease replaced by ``record`` (its holder's own update: a renewal, a start counted)."""
    _put(path, record, exclusive=False, durable=durable)


def renew(path: Path, owner: Owner, now: float, interval: float) -> bool:
    """A new heartbeat for ``owner``'s lease; False (and no write) when the lease is not ``owner``'s
    any more (taken over, removed, unreadable)."""
    current = read(path, now)
    if current is None or current.owner.id != owner.id:
        return False
    # Not fsynced: a renewal lost with the storage server's cache leaves the holder's own older lease,
    # renewed again at the next heartbeat. A holder renews every few seconds each lease it holds
    # (a serve holding a thousand queued files: hundreds a second), so an fsync each costs the volume dearly.
    write(path, replace(current, owner=owner, heartbeat=now, interval=interval), durable=False)
    return True


def take_over(path: Path, seen: Record | None, fresh: Record, now: float) -> bool:
    """Replace the lease at ``path``, read as ``seen`` and judged expired (None: unreadable), by
    ``fresh``; False when another controller takes it, or it was renewed since it was judged.

    The lease is first hard-linked to a name made of what was judged (``.<name>.takeover.<digest>``):
    link() fails when that name exists, so of all the takers of one expired lease only one gets it, and
    the linked file, written once and never changed, shows whether it is still the lease judged. Only
    that taker replaces the lease; the lease is never removed meanwhile, so a controller that finds no
    lease and creates one can never slip in. A taker killed half-way leaves its name behind; after
    TAKEOVER_STALE seconds it is set aside. An absent lease is not taken over here: ``create`` it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):  # a folder planted in the lease's place: moved aside, then created
        return _set_aside(path) and create(path, fresh)
    key = hashlib.sha256(seen.to_json()).hexdigest()[:32] if seen is not None else f"{st.st_dev:x}-{st.st_ino:x}"
    marker = path.with_name(f".{path.name}.takeover.{key}")
    if not _mark(path, marker):
        return False
    try:
        judged = read(marker, now) == seen  # an unreadable one still unreadable: not a taker's new lease
        if seen is None:
            m = os.lstat(marker)
            judged = judged and (m.st_dev, m.st_ino) == (st.st_dev, st.st_ino)
        if judged:
            write(path, fresh)
        return judged
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def _mark(path: Path, marker: Path) -> bool:
    """``marker`` linked to the lease now at ``path``: True for the one taker that made it."""
    for _ in range(2):
        try:
            os.link(path, marker, follow_symlinks=False)
            return True
        except FileExistsError:
            try:
                age = time.time() - os.lstat(marker).st_ctime  # link() set its ctime
            except FileNotFoundError:
                continue  # its taker has just finished
            except OSError:
                return False
            if age < TAKEOVER_STALE or not _set_aside(marker):
                return False  # another controller is taking the lease over now
        except OSError:
            return False
    return False


def _set_aside(path: Path) -> bool:
    """Rename ``path`` to a unique hidden name (only one controller can), then remove it if a file."""
    aside = path.with_name(f".{path.name}.stale.{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.unlink(aside)
    return True


def release(path: Path, owner: Owner, now: float) -> None:
    """Remove the lease if it is still ``owner``'s."""
    current = read(path, now)
    if current is not None and current.owner.id == owner.id:
        with contextlib.suppress(OSError):
            path.unlink()
