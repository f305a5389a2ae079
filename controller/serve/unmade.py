"""A pack cut while it was being made, and how its jobs get free of it.

`serve` makes a pack in steps (controller/serve/packs.py open_pack): the pack's run folder with its
plan and claims on every member's outputs, its ``members.json``, then each member's run folder
(``packed`` first). A `serve` killed between those steps leaves a pack that never started and whose
members are half made: one has ``packed`` and nothing else, the next has no folder at all. Resuming
such a pack fails (a member without a plan), and its claims refuse each member planned afresh for
the very outputs the pack was to write for it — every member would end failed for nothing.

So a pack that never started (no chunk attempt: nothing in its ``results/`` or ``attempts/``), has
no report, no live lease and a member whose folder is not complete with ``packed`` naming it is
*cut*, once its ``members.json`` is older than CUT_AFTER (making one takes seconds; a younger one may
be being made right now). Unmaking it: each unended member's ``packed`` naming it is removed (a
complete member folder then runs as a job of its own, a half-made one is planned afresh), and the
pack is ended cancelled (its report written, its claims released), so its jobs run without it.
"""

from __future__ import annotations

import os
import time

from controller import log
from controller.config import Config
from controller.errors import FfswarmError
from controller.job.plan import ID
from controller.run import control, giveup, job_lease
from controller.run.jobs import owner
from controller.run.packed import pack_of, read_members
from controller.run.rundir import RunDir, RunFileError
from controller.swarm.backend import SwarmBackend
from controller.volume import UnsafePath

CUT_AFTER = 60.0  # seconds since its members.json: a pack still half made after this was cut

REASON = "the pack was cut while it was being made (its controller stopped): its jobs run without it"


def _rundir(config: Config, job: str) -> RunDir:
    return RunDir(config.data_root, job, owner(config), config.controller_ids())


def _age(pack: RunDir, now: float) -> float | None:
    made = pack.volume.mtime(pack.layout.members)
    return None if made is None else now - made


def _started(pack: RunDir) -> bool:
    for folder in (pack.layout.results_dir, pack.layout.attempts_dir):
        try:
            fd = pack.volume.open_dir(folder, "read")
        except FileNotFoundError:
            continue
        except (OSError, UnsafePath):
            return True  # cannot tell: the safe side is to leave the pack as it is
        try:
            if os.listdir(fd):
                return True
        finally:
            os.close(fd)
    return False


CUT, MAKING = "cut", "making"


def state(config: Config, pack_id: str, now: float | None = None) -> str | None:
    """CUT: ``pack_id`` was cut while it was being made (module docstring); MAKING: it is half made
    but younger than CUT_AFTER (being made now, or cut a moment ago: look again later); None: neither
    (it started, ended, is held, or every member of it is made)."""
    pack = _rundir(config, pack_id)
    try:
        if not pack.exists() or pack.report() is not None or job_lease.holder(pack) is not None:
            return None
        age = _age(pack, time.time() if now is None else now)
        if age is None or _started(pack):
            return None
        members = read_members(pack)
    except (OSError, UnsafePath, FfswarmError):
        return None
    for name in members:
        if not ID.fullmatch(name):
            continue
        job = _rundir(config, name)
        if job.report() is None and (not job.exists() or pack_of(job) != pack_id):
            return CUT if age >= CUT_AFTER else MAKING
    return None


def unmake(config: Config, pack_id: str, backend: SwarmBackend | None = None) -> None:
    """Free the jobs of a cut pack (state CUT): each unended member's ``packed`` naming it removed, the
    pack ended cancelled with REASON (its services, if any, removed; its claims released)."""
    pack = _rundir(config, pack_id)
    try:
        members = read_members(pack)
    except RunFileError:
        members = {}
    for name in members:
        if not ID.fullmatch(name):
            continue
        job = _rundir(config, name)
        if job.report() is None and pack_of(job) == pack_id:
            job.volume.unlink(job.layout.packed)
    control.flag_cancel(pack)
    giveup.give_up(config, pack_id, REASON, backend)
    log.get(component="serve", pack=pack_id).warning("pack_unmade", members=len(members), reason=REASON)
