"""Handing a job to the controller that serves an inbox: `ffswarm submit --detach`, and the heartbeat
`ffswarm serve` keeps so that a submit can tell whether anyone will run what it hands over.

A job file dropped in an inbox that no controller watches would wait there silently, so a detached
submit first looks for a live heartbeat: every serving controller rewrites
``<inbox>/.heartbeat/<host>-<pid>.json`` every few seconds and removes it when it stops cleanly. A
controller killed outright leaves its file behind; it stops counting once it is older than
``alive_window`` (three beats, at least 15 s), and the next `serve` on that inbox clears it away.

The heartbeat is read back from the shared volume, so it is parsed as hostile: opened without
following links, size-capped, every field type-checked; anything odd counts as "not serving".
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.errors import CapacityError, UsageError
from controller.job.files import parse_job_text
from controller.run.jobs import PreparedJob
from controller.volume import write_all

HEARTBEAT_DIR = ".heartbeat"
HEARTBEAT_SECONDS = 5.0  # how often `serve` rewrites its heartbeat
MIN_ALIVE_SECONDS = 15.0  # a heartbeat this recent always counts, whatever interval it states
_MAX_HEARTBEAT_BYTES = 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
START_HINT = (
    "start one with `ffswarm serve --inbox {inbox}` (on a manager), or deploy the "
    "controller stack: `ffswarm render --controller -o controller.yml && "
    "docker stack deploy --resolve-image never -c controller.yml ffswarm`"
)


def alive_window(interval: float) -> float:
    return max(3 * interval, MIN_ALIVE_SECONDS)


@dataclass(frozen=True)
class Heartbeat:
    """What one serving controller says about itself; `updated` is its wall clock (time.time())."""

    host: str
    pid: int
    started: float
    updated: float
    concurrent_jobs: int
    running: int = 0
    interval: float = HEARTBEAT_SECONDS

    def __post_init__(self) -> None:
        if not self.host or self.pid < 1 or self.concurrent_jobs < 1 or self.running < 0:
            raise ValueError("heartbeat: host, pid ≥ 1, concurrent_jobs ≥ 1 and running ≥ 0 required")
        if not 0 < self.interval <= 3600 or self.updated < self.started:
            raise ValueError("heartbeat: interval in (0, 3600] and updated ≥ started required")

    def alive(self, now: float) -> bool:
        """Beat within the window; a beat from further in the future than that is a broken clock."""
        return abs(now - self.updated) <= alive_window(self.interval)

    def to_json(self) -> str:
        return json.dumps(
            {
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "updated": self.updated,
                "concurrent_jobs": self.concurrent_jobs,
                "running": self.running,
                "interval": self.interval,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Heartbeat | None:
        """The heartbeat a file holds, or None when it is not one (garbage, wrong types, absurd values)."""
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        num = (int, float)
        ints = ("pid", "concurrent_jobs", "running")
        floats = ("started", "updated", "interval")
        if not isinstance(d.get("host"), str) or len(d["host"]) > 255:
            return None
        if any(type(d.get(k)) is not int for k in ints):  # bool is not a count
            return None
        if any(not isinstance(d.get(k), num) or isinstance(d.get(k), bool) for k in floats):
            return None
        try:
            return cls(
                host=d["host"],
                pid=d["pid"],
                started=float(d["started"]),
                updated=float(d["updated"]),
                concurrent_jobs=d["concurrent_jobs"],
                running=d["running"],
                interval=float(d["interval"]),
            )
        except ValueError:
            return None


class HeartbeatFile:
    """The heartbeat of the controller in this process, on one inbox."""

    def __init__(self, inbox: Path, concurrent_jobs: int, interval: float = HEARTBEAT_SECONDS) -> None:
        self.host = socket.gethostname() or "unknown"
        self.pid = os.getpid()
        self.started = time.time()
        self.concurrent_jobs = concurrent_jobs
        self.interval = interval
        self.folder = inbox / HEARTBEAT_DIR
        self.path = self.folder / f"{_UNSAFE.sub('_', self.host)[:64]}-{self.pid}.json"

    def beat(self, running: int, now: float | None = None) -> None:
        """Rewrite the heartbeat atomically (temporary hidden name, then rename)."""
        now = time.time() if now is None else now
        hb = Heartbeat(self.host, self.pid, min(self.started, now), now, self.concurrent_jobs, running, self.interval)
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{self.path.name}.tmp"
        tmp.write_text(hb.to_json() + "\n")
        tmp.chmod(0o644)  # submitters of any uid read it
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def clear_stale(self, now: float | None = None) -> int:
        """Remove heartbeats that stopped beating (controllers killed outright); returns how many."""
        now = time.time() if now is None else now
        gone = 0
        for path, hb in _heartbeat_files(self.folder.parent):
            if path != self.path and (hb is None or not hb.alive(now)):
                try:
                    path.unlink(missing_ok=True)
                except OSError:  # another user's file: it stays stale, and is ignored as stale
                    continue
                gone += 1
        return gone


def _read_capped(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_HEARTBEAT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _MAX_HEARTBEAT_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


FileKey = tuple[int, int, int, int]  # inode, size, mtime and ctime (ns): a file's content unchanged while the same
_READ: dict[str, dict[str, tuple[FileKey, Heartbeat | None]]] = {}  # folder → name → (key, what it held)


def _heartbeat_files(inbox: Path) -> list[tuple[Path, Heartbeat | None]]:
    """Every heartbeat file of the inbox and what it says (None: not a heartbeat). A file is read
    again only when its inode, size or times changed since this process last read it (a beat renames
    a new file into place), so asking on every request costs a listing and an lstat per file."""
    folder = inbox / HEARTBEAT_DIR
    try:  # the folder itself never through a link
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        names = sorted(e.name for e in os.scandir(fd) if not e.is_symlink())
        seen = _READ.get(str(folder), {})
        now: dict[str, tuple[FileKey, Heartbeat | None]] = {}
        out: list[tuple[Path, Heartbeat | None]] = []
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                out.append((folder / name, None))
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            known = seen.get(name)
            if known is not None and known[0] == key:
                hb = known[1]
            else:  # read after the lstat: a file replaced in between is read again next time (its key differs)
                text = _read_capped(folder / name)
                hb = Heartbeat.from_json(text) if text is not None else None
            now[name] = (key, hb)
            out.append((folder / name, hb))
    except OSError:
        return []
    finally:
        os.close(fd)
    _READ[str(folder)] = now
    return out


def serving(inbox: Path, now: float | None = None) -> list[Heartbeat]:
    """The controllers serving `inbox` now (live heartbeats), freshest first."""
    now = time.time() if now is None else now
    live = [hb for _, hb in _heartbeat_files(inbox) if hb is not None and hb.alive(now)]
    return sorted(live, key=lambda hb: -hb.updated)


def live_owners(inbox: Path, now: float | None = None) -> set[str]:
    """The names of the live controllers' heartbeat files (what their lanes' owner label says)."""
    now = time.time() if now is None else now
    return {path.stem for path, hb in _heartbeat_files(inbox) if hb is not None and hb.alive(now)}


@dataclass(frozen=True)
class HandedOver:
    job_id: str
    file: Path  # the job file in the inbox
    controller: Heartbeat  # the freshest controller serving the inbox when it was handed over


def _already_there(inbox: Path, job_id: str) -> Path | None:
    for folder in (inbox, inbox / "running"):
        for suffix in (".yaml", ".yml"):
            p = folder / f"{job_id}{suffix}"
            if os.path.lexists(p):
                return p
    return None


def _job_text(job: PreparedJob) -> str:
    """The job file's text, checked to still say what was validated (it is read a second time)."""
    try:
        text = job.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{job.file}: cannot be read again to hand it over: {e}") from None
    if parse_job_text(text, str(job.file)) != job.spec:
        raise UsageError(f"{job.file}: changed while it was being submitted; submit it again")
    return text


def place(inbox: Path, name: str, text: str) -> Path:
    """Write `text` as inbox/NAME without ever replacing a file there: a hidden temporary name (the
    controller ignores those), then a hard link to the final name, which fails if the name exists.
    Also the API's way into the inbox (controller/api/submit.py)."""
    final = inbox / name
    tmp = inbox / f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, text.encode("utf-8"))
            os.fchmod(fd, 0o644)  # submitters of any uid read it, whatever the umask
        finally:
            os.close(fd)
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise UsageError(f"{final} appeared while handing the job over; nothing was replaced") from None
        except OSError:  # a filesystem without hard links: check, then rename (a far narrower race)
            if os.path.lexists(final):
                raise UsageError(f"{final} appeared while handing the job over; nothing was replaced") from None
            os.rename(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def hand_over(inbox: Path, jobs: Sequence[PreparedJob], now: float | None = None) -> list[HandedOver]:
    """Put each validated job into the inbox a live controller serves, as ``<job-id>.yaml``.

    The controller runs an inbox file as `submit` without --new would (job id = the job's name), so a
    job whose id is not its name (--new) cannot be handed over. All jobs are checked before any file
    is written; a job already waiting or running there is refused rather than run twice at once.
    """
    for job in jobs:
        if job.job_id != job.spec.name:
            raise UsageError(
                f"job {job.job_id}: the controller would run it as {job.spec.name!r}; "
                "--detach cannot start a new run (--new): give the job file a new name instead"
            )
    controllers = serving(inbox, now)
    if not controllers:
        raise CapacityError(
            f"no controller is serving the inbox {inbox} (no heartbeat in {inbox / HEARTBEAT_DIR} newer than "
            f"{alive_window(HEARTBEAT_SECONDS):.0f} s); nothing was handed over: " + START_HINT.format(inbox=inbox)
        )
    for job in jobs:
        there = _already_there(inbox, job.job_id)
        if there is not None:
            raise UsageError(
                f"job {job.job_id} is already handed over ({there}); follow it with "
                f"`ffswarm status {job.job_id} --follow`, or give the job file another name"
            )
    texts = [_job_text(job) for job in jobs]
    placed: list[HandedOver] = []
    try:
        for job, text in zip(jobs, texts, strict=True):
            placed.append(HandedOver(job.job_id, place(inbox, f"{job.job_id}.yaml", text), controllers[0]))
    except PermissionError as e:
        _take_back(placed)
        try:
            st = os.stat(inbox)
            owner = f" (owner {st.st_uid}:{st.st_gid}, mode {stat.filemode(st.st_mode)})"
        except OSError:
            owner = ""
        raise CapacityError(
            f"cannot write to the inbox {inbox}{owner}: {e.strerror}; ask its operator for write access, "
            "or run `ffswarm submit` without --detach"
        ) from None
    except BaseException:
        _take_back(placed)
        raise
    return placed


def _take_back(placed: Sequence[HandedOver]) -> None:
    """Undo a partial hand-over; files younger than serve's settle time have not been claimed yet."""
    for h in placed:
        h.file.unlink(missing_ok=True)


def describe(handed: Sequence[HandedOver]) -> str:
    lines = []
    for h in handed:
        c = h.controller
        lines += [
            f"job {h.job_id}: handed to the controller on {c.host} (pid {c.pid}, {c.running} of "
            f"{c.concurrent_jobs} job(s) running) as {h.file}",
            f"  follow:  ffswarm status {h.job_id} --follow",
            f"  logs:    ffswarm logs {h.job_id} -f",
            f"  outcome: {h.file.parent / 'done'} or {h.file.parent / 'failed'} (+ {h.file.name}.reason.txt)",
        ]
    return "\n".join(lines)
