"""Cluster-wide claims on outputs: two live jobs never write the same file.

Every controller on every manager sees the same data root, so the record lives there, in two forms:
- ``runs/.claims/<xx>/<sha256 of the output path>`` holds the id of the job that claims that one
  output, created O_EXCL (of two jobs claiming at once, one creates it; the other reads the winner's id);
- a job writing more than FOLDER_AT outputs into one folder claims them there with one file,
  ``runs/.claims/dirs/<sha256 of the folder>/<job>``, listing their names (a 1,000-photo job: one
  file to write and to remove, not 1,000). A job writes its claims of both forms first, then
  looks for the other form's (``conflict``): of two jobs claiming at once, the one that looks
  second sees the first (both may refuse; neither writes what the other claims).
``runs/.claims/jobs/<job>`` lists a job's claims so that ``release`` removes only its own.

A claim binds while its job is live. A job is not live once its run says it ended (state.json's
stage ``ended``), once it is cancelled, or when its run folder never appeared (a submit refused
after claiming, or a controller that died first) and the claim is older than ``ORPHAN_SECONDS``;
such a claim is taken over. Everything is read back as hostile (no link followed, sizes capped,
ids checked) through controller/volume.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from contract.layout import RUNS, RunLayout
from controller.errors import JobFileError
from controller.folder import sync_filesystem
from controller.job import claim_folders as folders
from controller.job.claim_folders import JOB_ID, LIMIT, key
from controller.volume import Owner, UnsafePath, Volume

CLAIMS = f"{RUNS}/.claims"
JOBS = f"{CLAIMS}/jobs"
FOLDER_AT = 16  # a job's outputs in one folder beyond this many are claimed by one file (a folder claim)
_FOLDER_LINE = "folder "  # an index line naming one of the job's folder claims
ORPHAN_SECONDS = 600.0  # a claim whose job has no run folder after this long is an orphan
FSYNC_EACH = 16  # claims made durable one by one; more are written, then their filesystem synced once
SHOWN = 3  # outputs named in a refusal
_STATE_LIMIT = 64 * 1024**2


def _claim_path(digest: str) -> str:
    return f"{CLAIMS}/{digest[:2]}/{digest}"


def _read_holder(vol: Volume, path: str) -> str | None:
    try:
        raw = vol.read(path, 512)
    except (UnsafePath, OSError):
        return None
    text = (raw or b"").decode("ascii", "replace").split("\n", 1)[0]
    return text if JOB_ID.fullmatch(text) else None


def holders(data_root: Path, outputs: Iterable[str]) -> dict[str, str]:
    """The job whose claim on each of ``outputs`` (relative to the data root) exists now, by output;
    an output no job claims is left out."""
    vol = Volume(data_root)
    found: dict[str, str] = {}
    for folder, names in folders.by_folder(outputs).items():
        for other, theirs, _ in folders.read_all(vol, folder):
            found.update({folders.join(folder, n): other for n in names & theirs})
        for rel in (folders.join(folder, n) for n in names):
            if rel not in found and (holder := _read_holder(vol, _claim_path(key(rel)))) is not None:
                found[rel] = holder
    return found


def holder_of(data_root: Path, output_rel: str) -> str | None:
    """The job whose claim on ``output_rel`` (relative to the data root) exists now; None: no claim."""
    return holders(data_root, [output_rel]).get(output_rel)


def live(data_root: Path, job: str, claimed_at: float | None = None, now: float | None = None) -> bool:
    """Whether ``job`` may still write its outputs: its run has not ended and was not cancelled.
    A job without a run folder is live only while its claim is younger than ORPHAN_SECONDS."""
    vol = Volume(data_root)
    layout = RunLayout.relative(job)
    try:
        if not _exists(vol, str(layout.plan)):
            age = (now or time.time()) - (claimed_at or 0.0)
            return age < ORPHAN_SECONDS
        state = vol.read(layout.state, _STATE_LIMIT)
        control = vol.read(layout.control, 4096)
    except (UnsafePath, OSError):
        return True  # cannot tell: keep the claim (refusing is the safe side)
    try:
        if state and json.loads(state).get("stage") == "ended":
            return False
        if control and json.loads(control).get("cancel") is True:
            return False
    except (ValueError, AttributeError):
        return True
    return True


def _exists(vol: Volume, rel: str) -> bool:
    try:
        fd = vol.open(rel, os.O_RDONLY | os.O_NONBLOCK, what="reading")
    except FileNotFoundError:
        return False
    os.close(fd)
    return True


DIRECT = 32  # outputs at most whose claims `conflict` reads one by one instead of listing every shard


def conflict(data_root: Path, job: str, outputs: Sequence[str]) -> tuple[list[str], str] | None:
    """The outputs (relative to the data root) another live job claims, and that job; None when
    none does: each output's own claim, and its folder's folder claims. A job of a few outputs reads
    their claims alone (a one-photo request among 50,000 claimed outputs: one read, not 256
    listings); a bigger one reads one listing per shard folder, then only the claims that exist."""
    return _conflict(Volume(data_root), data_root, job, outputs, outputs)


def _conflict(
    vol: Volume, data_root: Path, job: str, each: Sequence[str], by_folder: Sequence[str]
) -> tuple[list[str], str] | None:
    """conflict, reading the own claims of ``each`` and the folder claims on ``by_folder``'s folders."""
    existing = {key(rel) for rel in each} if len(each) <= DIRECT else _existing_claims(data_root)
    alive: dict[str, bool] = {}
    taken: dict[str, list[str]] = {}
    for rel in each:
        digest = key(rel)
        if digest not in existing:
            continue
        path = _claim_path(digest)
        holder = _read_holder(vol, path)
        if holder is None or holder == job:
            continue
        if holder not in alive:
            alive[holder] = live(data_root, holder, vol.mtime(path))
        if alive[holder]:
            taken.setdefault(holder, []).append(rel)
    for folder, names in folders.by_folder(by_folder).items():
        for other, theirs, written in folders.read_all(vol, folder):
            both = names & theirs
            if other == job or not both:
                continue
            if other not in alive:
                alive[other] = live(data_root, other, written)
            if alive[other]:
                taken.setdefault(other, []).extend(sorted(folders.join(folder, n) for n in both))
    if not taken:
        return None
    holder, rels = next(iter(taken.items()))
    return rels, holder


def _existing_claims(data_root: Path) -> set[str]:
    found: set[str] = set()
    base = data_root / CLAIMS
    try:
        shards = [e.name for e in os.scandir(base) if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for shard in shards:
        with contextlib.suppress(OSError), os.scandir(base / shard) as entries:
            found.update(e.name for e in entries if e.name.startswith(shard) and len(e.name) == 64)
    return found


class Claimed(JobFileError):
    """A job's output another live job claims: ``holder``, that job (serve looks whether it is a pack
    cut while being made, whose claims would otherwise refuse its own jobs for ever)."""

    def __init__(self, file: str, rels: list[str], holder: str) -> None:
        super().__init__(file, "output", refusal(rels, holder))
        self.holder = holder


def refusal(rels: list[str], holder: str) -> str:
    shown = ", ".join(rels[:SHOWN]) + (f" and {len(rels) - SHOWN} more" if len(rels) > SHOWN else "")
    return (
        f"{len(rels)} output(s) are claimed by job {holder}, which has not finished: {shown} "
        f"(wait for it, cancel it, or choose another output)"
    )


def claim(data_root: Path, job: str, outputs: Iterable[str], file: str, owner: Owner | None = None) -> int:
    """Claim every output for ``job`` (idempotent for its own claims); how many it claims anew.
    JobFileError (exit 65), naming the other job, if a live one holds any; then this call's new
    claims are undone. ``owner``: the controller's uid:gid, given to the claims' folders (also ones
    made earlier by someone else, e.g. a root ``serve``), so that an API running as
    ``controller_user`` can release a job's claims when it deletes or cancels the job."""
    vol = Volume(data_root)
    wanted = sorted(set(outputs))
    whole = {f: names for f, names in folders.by_folder(wanted).items() if len(names) > FOLDER_AT}
    digests = sorted((key(rel), rel) for rel in wanted if rel.rpartition("/")[0] not in whole)
    if owner is not None:
        vol.mkdirs(CLAIMS, owner, enforce=True)
    _write_index(vol, job, [d for d, _ in digests] + [_FOLDER_LINE + key(f) for f in whole], owner)
    made: list[str] = []
    before: dict[str, set[str] | None] = {}  # a folder claim written here: the names it held before
    each = len(digests) + len(whole) <= FSYNC_EACH
    try:
        with vol.batch():  # the umask read once for every claim, not once a file
            _claim_each(vol, data_root, job, digests, file, each, owner, made)
            for folder, names in sorted(whole.items()):
                before[folder] = held = folders.read(vol, folder, job)
                folders.write(vol, folder, job, names | (held or set()), owner, durable=each)
            # written first, then looked for: of two jobs claiming at once, the later looker sees the
            # other (two outputs' own claims need no look: O_EXCL chose between them)
            in_whole = [folders.join(f, n) for f, names in whole.items() for n in sorted(names)]
            taken = _conflict(vol, data_root, job, in_whole, wanted)
            if taken is not None:
                raise Claimed(file, *taken)
    except JobFileError:
        for digest in made:
            _unlink_if_mine(vol, _claim_path(digest), job)
        for folder, held in before.items():
            _restore_folder(vol, job, folder, held, owner)
        raise
    if (made or before) and not each:
        sync_filesystem(data_root)  # every claim just written made durable at once
    return len(made) + sum(len(whole[f] - (held or set())) for f, held in before.items())


def _claim_each(
    vol: Volume,
    data_root: Path,
    job: str,
    digests: list[tuple[str, str]],
    file: str,
    durable: bool,
    owner: Owner | None,
    made: list[str],
) -> None:
    """Each output's own claim, created O_EXCL in its shard folder (opened once for all of its
    claims); ``made``: the digests of those this call created."""
    shards: dict[str, list[tuple[str, str]]] = {}
    for digest, rel in digests:
        shards.setdefault(_claim_path(digest).rpartition("/")[0], []).append((digest, rel))
    for shard, mine in shards.items():
        vol.mkdirs(shard, owner, enforce=owner is not None)
        dfd = vol.open_dir(shard, "claiming")
        try:
            for digest, rel in mine:
                if _claim_one(vol, dfd, data_root, job, digest, rel, file, durable, owner):
                    made.append(digest)
        finally:
            os.close(dfd)


def _restore_folder(vol: Volume, job: str, folder: str, held: set[str] | None, owner: Owner | None) -> None:
    """A refused claim's folder claim taken back: as it was before (``held``), or removed."""
    with contextlib.suppress(OSError, UnsafePath):
        if held is None:
            vol.unlink(folders.path_of(folder, job))
        else:
            folders.write(vol, folder, job, held, owner)


def _claim_one(
    vol: Volume,
    shard: int,
    data_root: Path,
    job: str,
    digest: str,
    rel: str,
    file: str,
    durable: bool = True,
    owner: Owner | None = None,
) -> bool:
    """True if this call created the claim; False if ``job`` already held it. ``shard``: its folder,
    made and opened by the caller. ``durable``: fsynced here (else the caller syncs the filesystem
    once for all its claims)."""
    path = _claim_path(digest)
    for _ in range(3):
        try:
            fd = vol.create_in(shard, digest, owner, rel=path)
        except FileExistsError:
            holder = _read_holder(vol, path)
            if holder == job:
                return False
            if holder is not None and live(data_root, holder, vol.mtime(path)):
                raise Claimed(file, [rel], holder) from None
            _take_aside(vol, path, holder)
            continue
        try:
            os.write(fd, f"{job}\n{rel}\n".encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return True
    raise JobFileError(file, "output", f"{rel}: its claim keeps changing; try again")


def _take_aside(vol: Volume, path: str, stale: str | None) -> None:
    """Move a stale claim out of the way; if it changed since it was read (another job took it over
    first), put it back: only the one that moved the stale claim goes on."""
    with vol.parent(path, "take over") as (dfd, name):
        aside = f".{name}.{uuid.uuid4().hex}"
        try:
            os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            return
        try:
            fd = os.open(aside, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            try:
                now = os.read(fd, 512).decode("ascii", "replace").split("\n", 1)[0]
            finally:
                os.close(fd)
            if now != (stale or now):
                with contextlib.suppress(FileExistsError):
                    os.link(aside, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside, dir_fd=dfd)


def _unlink_if_mine(vol: Volume, path: str, job: str) -> None:
    if _read_holder(vol, path) == job:
        with contextlib.suppress(OSError, UnsafePath):
            vol.unlink(path)


def _write_index(vol: Volume, job: str, digests: list[str], owner: Owner | None = None) -> None:
    vol.mkdirs(JOBS, owner, enforce=owner is not None)
    before = _read_index(vol, job)
    vol.write_atomic(f"{JOBS}/{job}", "\n".join(sorted(set(before) | set(digests))).encode() + b"\n", owner)


def _read_index(vol: Volume, job: str) -> list[str]:
    """The job's claims as its index lists them: output digests, and ``folder <digest>`` lines."""
    try:
        raw = vol.read(f"{JOBS}/{job}", LIMIT)
    except (UnsafePath, OSError):
        return []
    lines = (raw or b"").decode("ascii", "replace").split("\n")
    return [line for line in lines if re.fullmatch(f"({_FOLDER_LINE})?[0-9a-f]{{64}}", line)]


def release(data_root: Path, job: str) -> int:
    """Remove ``job``'s claims (its report is written, or it was cancelled or refused); claims that
    another job holds now are left alone. Returns how many outputs were let go of."""
    if not JOB_ID.fullmatch(job):
        return 0
    vol = Volume(data_root)
    removed = 0
    for line in _read_index(vol, job):
        if line.startswith(_FOLDER_LINE):  # a folder claim: only this job ever writes it
            removed += folders.remove(vol, line.removeprefix(_FOLDER_LINE), job)
            continue
        path = _claim_path(line)
        if _read_holder(vol, path) == job:
            with contextlib.suppress(OSError, UnsafePath):
                vol.unlink(path)
                removed += 1
    with contextlib.suppress(OSError, UnsafePath):
        vol.unlink(f"{JOBS}/{job}")
    return removed
