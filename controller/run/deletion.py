"""Deleting a finished job: what `DELETE /v1/jobs/{id}`, `ffswarm delete` and `serve`'s retention do.

A finished job (its run ended, it was cancelled before it ran, or `serve` refused it) loses its
uploads (``tenants/<t>/uploads/<job>/``), the outputs it wrote, its run folder, its inbox done/failed
file and, for a tenant's job, its signed-links record, retry marker, owner record, the webhook
deliveries kept beside it when it never had a run folder, and its entry in the tenant's job list
(controller/job/index.py). Nothing of another job is touched:

- an output goes only when this job wrote it: its result line says ok with that output and the file
  still has the size and sha256 that line recorded, or the output's claim (controller/job/claims.py)
  is this job's; an output another job claims now stays, and so does any file the job only read
  (shared inputs);
- a tenant's output goes only inside that tenant's area; a CLI job's never inside ``runs/``,
  ``models/``, ``inbox/`` or ``tenants/``;
- everything is removed through controller/volume.py and controller/folder.py, one name at a time
  relative to a folder's descriptor: a symlink on the way is never followed (an output behind a
  swapped-in link stays), a symlink where a folder was is removed as the link itself.

A packed job's pack (``runs/pack-…``, a tenant's ``runs/.tenants/<key>/pack-<key>-…``) goes once none
of its members' run folders remain.

The deletion starts by writing ``tenants/.jobs/<t>/<job>.deleting`` and ends by removing it after
the owner record: a deletion cut short is finished by the next one, even though the job's run folder
(which said it had finished) is gone by then. For a tenant's job the quota ledger's next walk of the
area is made due at once, so the freed bytes count on the next upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contract.layout import INBOX, RECORDS, RESERVED, TENANTS, RunLayout
from controller.config import Config
from controller.errors import FfswarmError, MissingInputError, UsageError
from controller.folder import remove_at
from controller.job import claims
from controller.job.index import JobIndex
from controller.job.ledger import Ledger
from controller.job.owners import JOB_ID, MAX_RECORD, JobRecord
from controller.run import status
from controller.run.fold import Fold
from controller.run.packed import pack_of
from controller.run.rundir import RunDir
from controller.volume import UnsafePath, Volume, read_nofollow

FINISHED = ("finished", "cancelled", "refused")
_PIECE = 1024 * 1024
_MEMBERS_LIMIT = 64 * 1024**2
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,79}")  # a CLI job's id, a pack's


class NotFinished(UsageError):
    """The job is queued or running: nothing was deleted."""

    def __init__(self, job: str, phase: str) -> None:
        super().__init__(f"job {job!r} is {phase}; delete it once it has finished (or cancel it first)")
        self.job = job
        self.phase = phase


class NoSuchJob(MissingInputError):
    """No run folder, inbox file or record names the job."""


@dataclass
class Deleted:
    """What one deletion removed (paths relative to the data root) and the outputs it kept, and why."""

    job: str
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _records(tenant: str) -> str:
    return f"{TENANTS}/{RECORDS}/{tenant}"


def _lexists(vol: Volume, rel: str) -> bool:
    try:
        with vol.parent(rel, "read") as (dfd, name):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except (OSError, UnsafePath):
        return False


def _inbox(vol: Volume, folder: str, job: str) -> list[str]:
    """Names in ``inbox/<folder>`` that are the job's: claimed (``running/<job>.<uuid>.yaml``), or
    ended, a second time under a new name (``done/<job>.<time>-<hex>.yaml``) and with its reason."""
    name = re.escape(job)
    if folder == "running":
        pattern = re.compile(rf"{name}\.[0-9a-f]{{32}}\.ya?ml")
    else:
        pattern = re.compile(rf"{name}(?:\.[0-9]{{8}}T[0-9]{{6}}-[0-9a-f]{{8}})?\.ya?ml(?:\.reason\.txt)?")
    try:
        fd = vol.open_dir(f"{INBOX}/{folder}", "list")
    except (OSError, UnsafePath):
        return []
    try:
        return sorted(n for n in os.listdir(fd) if pattern.fullmatch(n))
    finally:
        os.close(fd)


def _queued(vol: Volume, job: str) -> str | None:
    """``queued`` while the job's file waits in the inbox, ``running`` while `serve` holds it claimed."""
    if _lexists(vol, f"{INBOX}/{job}.yaml") or _lexists(vol, f"{INBOX}/{job}.yml"):
        return "queued"  # not claimed yet, or handed back for a retry
    return "running" if _inbox(vol, "running", job) else None


def read_record(config: Config, tenant: str, job: str) -> JobRecord | None:
    data = read_nofollow(config.data_root / _records(tenant) / f"{job}.json", MAX_RECORD)
    return None if data is None else JobRecord.parse(data, job, tenant)


def phase(config: Config, job: str, tenant: str | None) -> str:
    """``finished``, ``cancelled`` or ``refused`` (deletable); ``queued`` or ``running`` (not yet).
    NoSuchJob when nothing names the job (for a tenant: no owner record of its own)."""
    if not JOB_ID.fullmatch(job) and not _NAME.fullmatch(job):
        raise NoSuchJob(f"no job {job!r}")
    vol = Volume(config.data_root)
    rec = None
    if tenant is not None:
        rec = read_record(config, tenant, job)
        if rec is None:
            raise NoSuchJob(f"no job {job!r}")
        if _lexists(vol, f"{_records(tenant)}/{job}.deleting"):
            return "finished"  # a deletion cut short: its run folder may be gone already
    waiting = _queued(vol, job)
    if waiting is not None:
        return waiting
    rundir = RunDir(config.data_root, job)
    if rundir.exists():
        try:
            return "finished" if status.finished(rundir) else _unfinished(status.job_status(rundir)["phase"])
        except FfswarmError:
            return "running"  # unreadable now: the safe side
    if _lexists(vol, f"{INBOX}/failed/{job}.yaml"):
        return "refused"
    if rec is not None and rec.cancelled:
        return "cancelled"
    if _lexists(vol, f"{INBOX}/done/{job}.yaml"):
        return "finished"
    if rec is None:
        raise NoSuchJob(f"no job {job!r}")
    return "queued"  # handed over, not claimed yet (or being claimed this moment)


def _phase_now(config: Config, job: str) -> str | None:
    """The job's phase from the inbox and run folder alone, when it is not finished; None otherwise."""
    waiting = _queued(Volume(config.data_root), job)
    if waiting is not None:
        return waiting
    rundir = RunDir(config.data_root, job)
    try:
        return None if not rundir.exists() or status.finished(rundir) else "running"
    except FfswarmError:
        return "running"


def _unfinished(row_phase: object) -> str:
    """A run not over, as its status says it (a stopped run can be resumed: not finished either)."""
    return row_phase if row_phase in ("running", "stopped") else "running"


def finished_at(config: Config, job: str) -> float | None:
    """When the job finished: its report's mtime, else its done/failed file's (None: not known)."""
    vol = Volume(config.data_root)
    for rel in (str(RunLayout.relative(job).report), f"{INBOX}/done/{job}.yaml", f"{INBOX}/failed/{job}.yaml"):
        try:
            with vol.parent(rel, "read") as (dfd, name):
                return os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime
        except (OSError, UnsafePath):
            continue
    return None


def delete_job(config: Config, job: str, tenant: str | None, outputs: bool = True) -> Deleted:
    """Remove a finished job's files (see the module's docstring); NotFinished while it is queued or
    running, NoSuchJob when it is not there (or not ``tenant``'s)."""
    now = phase(config, job, tenant)
    if now not in FINISHED:
        raise NotFinished(job, now)
    vol = Volume(config.data_root)
    out = Deleted(job)
    if tenant is not None:
        marker = f"{_records(tenant)}/{job}.deleting"
        vol.write_atomic(marker, b"", durable=False)
        again = _phase_now(config, job)  # a retry handed back meanwhile keeps the job
        if again is not None:
            vol.unlink(marker)
            raise NotFinished(job, again)
    pack = None
    rundir = RunDir(config.data_root, job)
    if rundir.exists():
        pack = pack_of(rundir)
        if outputs:
            _outputs(config, vol, rundir, job, tenant, out)
    if tenant is not None:
        _remove(vol, f"{TENANTS}/{tenant}/uploads/{job}", out)
    _remove(vol, str(RunLayout.relative(job).dir), out)
    claims.release(config.data_root, job)
    for folder in ("done", "failed"):
        for name in _inbox(vol, folder, job):
            _remove(vol, f"{INBOX}/{folder}/{name}", out)
    if pack is not None:
        _remove_pack(config, vol, pack, out)
    if tenant is not None:
        rec = read_record(config, tenant, job)
        if rec is not None:  # out of the tenant's job list first (controller/job/index.py)
            JobIndex(vol, tenant).remove(job, rec.created)
        for suffix in (".links", ".retry", ".deliveries", ".json", ".deleting"):
            _remove(vol, f"{_records(tenant)}/{job}{suffix}", out)
        walk_now(config.data_root, tenant)
    return out


def walk_now(data_root: Path, tenant: str) -> None:
    """The tenant's quota ledger walks its area on the next request (the freed bytes count at once)."""
    ledger = Ledger(data_root, tenant)
    with contextlib.suppress(OSError, FfswarmError), ledger.transaction() as tx:
        counts = tx.counts
        if counts is None:
            return  # no ledger yet: the first request walks anyway
        counts.walked_at = counts.walk_started = -math.inf
        tx.save(counts)


def _remove(vol: Volume, rel: str, out: Deleted) -> None:
    """``rel`` removed, a folder with its tree; a link anywhere above it: left (never followed)."""
    try:
        with vol.parent(rel, "delete") as (dfd, name):
            try:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            remove_at(dfd, name)
    except (OSError, UnsafePath):
        return
    out.removed.append(rel)


def _remove_pack(config: Config, vol: Volume, pack: str, out: Deleted) -> None:
    """The pack's run folder, once no member's run folder is left."""
    raw = read_nofollow(RunLayout.host(config.data_root, pack).members, _MEMBERS_LIMIT)
    try:
        members = json.loads(raw) if raw else None
    except ValueError:
        members = None
    if not isinstance(members, dict):
        return  # cannot tell which jobs it ran: kept
    jobs = (m for m in members if isinstance(m, str) and _NAME.fullmatch(m))
    if any(_lexists(vol, str(RunLayout.relative(m).dir)) for m in jobs):
        return
    _remove(vol, str(RunLayout.relative(pack).dir), out)


def _written(config: Config, rundir: RunDir) -> Iterator[tuple[str, int | None, str | None]]:
    """(output relative to the data root, recorded size, recorded sha256) of every item committed ok."""
    try:
        fold = Fold.read(rundir.plan(), rundir)
    except (FfswarmError, OSError, ValueError):
        return
    for item in fold.plan.items:
        r = fold.result(item.id)
        if r is not None and r.output is not None and r.status.value == "ok":
            yield item.output, r.size, r.sha256
    for video in fold.plan.videos:
        j = fold.joined.get(video.id)
        if j is not None and j.output is not None and j.status.value == "ok":
            yield video.output, j.size, j.sha256  # the join's line: no digest, goes only with its own claim


def _inside(rel: str, tenant: str | None) -> bool:
    parts = rel.split("/")
    if ".." in parts or rel.startswith("/"):
        return False
    if tenant is not None:
        return len(parts) > 2 and parts[0] == TENANTS and parts[1] == tenant
    return parts[0] not in RESERVED


def _outputs(config: Config, vol: Volume, rundir: RunDir, job: str, tenant: str | None, out: Deleted) -> None:
    folders: set[str] = set()
    written = [w for w in _written(config, rundir) if _inside(w[0], tenant)]
    holders = claims.holders(config.data_root, [rel for rel, _, _ in written])
    for rel, size, digest in written:
        holder = holders.get(rel)
        if holder is not None and holder != job:
            out.kept.append(rel)  # another job claims it now
            continue
        if _remove_if_same(vol, rel, size, digest, mine=holder == job):
            out.removed.append(rel)
            folders.add(rel.rpartition("/")[0])
        elif _lexists(vol, rel):
            out.kept.append(rel)
    top = f"{TENANTS}/{tenant}" if tenant is not None else ""
    for folder in sorted(folders, key=len, reverse=True):  # now-empty folders up to the area's top
        while folder and folder != top and "/" in folder and vol.rmdir(folder):
            folder = folder.rpartition("/")[0]


def _remove_if_same(vol: Volume, rel: str, size: int | None, digest: str | None, mine: bool) -> bool:
    """Unlink the regular file ``rel`` if it is still what the result line recorded (or, ``mine``,
    the job's own claim): checked and unlinked in one folder descriptor, never through a link."""
    try:
        with vol.parent(rel, "delete") as (dfd, name):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                return False  # missing, a link, unreadable
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return False
                if not mine and (digest is None or size != st.st_size or _sha256(fd) != digest):
                    return False
            finally:
                os.close(fd)
            now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return False  # replaced meanwhile
            os.unlink(name, dir_fd=dfd)
            return True
    except (OSError, UnsafePath):
        return False


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    while block := os.read(fd, _PIECE):
        h.update(block)
    return h.hexdigest()


def tenant_of(config: Config, job: str) -> str | None:
    """The configured tenant whose owner record names the job (the run folder's ``owner`` first);
    None: a CLI job."""
    raw = read_nofollow(RunLayout.host(config.data_root, job).owner, 64)
    named = raw.decode("ascii", "replace").strip() if raw else None
    for tenant in ([named] if named in config.tenants else []) + sorted(config.tenants):
        if tenant is not None and read_record(config, tenant, job) is not None:
            return tenant
    return None
