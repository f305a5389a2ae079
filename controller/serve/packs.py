"""A pack: small jobs run together as one pairs job, each job still its own (controller/serve/packing.py).

The pack is an ordinary job with its own run folder (``runs/pack-<id>/``, a tenant's pack's
``runs/.tenants/<key>/pack-<key>-<id>/``, ``<key>`` the tenant's: contract/layout.py run_rel, its
``owner`` naming the tenant): a pairs job whose every target swaps in its own job's person and
writes its own job's output, planned, retried and resumed like any other; its ``members.json`` says
which job each of its items belongs to. A pack runs no identity step: each of its chunks embeds the
people its own items use, once each, after its models load (a source photo without exactly one face
fails that person's items, naming the photo), which spares every pack a container start and a model
load. Each packed job keeps a run folder of its own, created with its own plan and a ``packed`` file
naming the pack. Nothing is copied into it while the pack runs: everything that reads a job (status,
the API's events, report, results.zip) reads a packed job's results through its pack
(controller/run/packed.py, by the one fold), exactly like one that ran alone. When the pack ends,
each job gets its own report and on_complete, and `serve` moves each job's inbox file to done/ or
failed/.

At every round of the pack's watch (Policy.on_round) ``PackRun.watch`` looks at its jobs: a
packed job cancelled while its pack runs ends at once as cancelled (its report says which items
were not done); the pack goes on for the other jobs, and items of the cancelled job already in a
running chunk may still be committed (as a cancelled job's committed outputs are kept anyway). The
same look renews the jobs' leases.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.identity_table import identity_id
from contract.layout import pack_job_id
from contract.s3 import S3Url
from controller import log, yamlio
from controller.config import Config
from controller.errors import FfswarmError
from controller.folder import sync_filesystem
from controller.job.files import parse_job_text
from controller.job.keys import Pack, packed
from controller.job.owners import outputs_rel
from controller.job.plan import AUTO_MAX_CHUNK, ID, Plan, TargetRef, item_id, make_plan
from controller.job.resolve import Photo, ResolvedJob, Target
from controller.job.spec import JobSpec
from controller.run import control, giveup, job_lease, usecase, webhooks
from controller.run.chunks import ChunkRun, ended_runs
from controller.run.failures import ChunkState
from controller.run.fold import Fold
from controller.run.jobs import PreparedJob, open_run, owner, write_owner
from controller.run.lanes import Lanes, beside, in_shared
from controller.run.packed import PackView, own_items, read_members
from controller.run.report import Report, build_report
from controller.run.rundir import Control, RunDir, Stage
from controller.run.usecase import SinkFactory
from controller.run.warmth import lane_allowed
from controller.serve.packing import Member
from controller.serve.shares import Share
from controller.swarm.backend import SwarmBackend

# Keys of a job file that are each job's own, never the pack's (``pack=OWN`` beside their fields)
OWN_KEYS = frozenset(packed(JobSpec, Pack.OWN))
LOOK = 1.0  # seconds between PackRun.watch's looks at the jobs' cancel flags


def new_pack_id(tenant: str | None) -> str:
    """A fresh pack id; a tenant's carries the tenant's key, so its run folder is under the tenant's
    own folder of pack run folders (contract/layout.py run_rel)."""
    return pack_job_id(tenant, base64.b32encode(os.urandom(5)).decode().lower())


def build(
    config: Config, members: Sequence[Member], pack_id: str, folder: Path, parallel: int
) -> tuple[PreparedJob, dict[str, Any]]:
    """The pack as a prepared pairs job, written to ``folder/<pack_id>.yaml``, and its members record."""
    people: dict[tuple[str, ...], int] = {}
    identities: list[tuple[Photo, ...]] = []
    targets: list[Target] = []
    refs: list[TargetRef] = []
    pairs: list[dict[str, Any]] = []
    record: dict[str, Any] = {}
    for m in members:
        r = m.job.resolved
        assert r is not None
        persons = r.identities or (r.sources,)
        items: dict[str, str] = {}
        for k, t in enumerate(r.targets):
            person = persons[t.identity if r.identities and t.identity is not None else 0]
            key = tuple(str(p) for p in person)
            if key not in people:
                people[key] = len(identities)
                identities.append(person)
            idx, n = people[key], len(targets)
            targets.append(dataclasses.replace(t, index=n, identity=idx))
            refs.append(TargetRef(t.rel, t.output_rel, t.kind.value, identity=identity_id(idx)))
            items[item_id(n)] = m.job.plan.items[k].id
            escaped = t.output_rel.replace("{", "{{").replace("}", "}}")
            pairs.append({"source": [_rel(config, p) for p in person], "target": t.rel, "output": escaped})
        record[m.job.job_id] = {"tenant": m.tenant, "items": items}
    first = members[0].job
    base = yamlio.load(first.file.read_bytes())
    text = yamlio.dump(
        {
            **{k: v for k, v in (base if isinstance(base, dict) else {}).items() if k not in OWN_KEYS},
            "name": pack_id,
            "pairs": pairs,
            "retries": max(m.job.spec.retries for m in members),
            "timeout": max(m.job.spec.timeout for m in members),
            "max_concurrent": max(m.job.spec.max_concurrent for m in members),
        },
        sort_keys=False,
    )
    folder.mkdir(mode=0o755, exist_ok=True)
    file = folder / f"{pack_id}.yaml"
    file.write_text(text)
    spec = parse_job_text(text, str(file))
    sources = tuple(dict.fromkeys(p for person in identities for p in person))
    resolved = ResolvedJob(sources=sources, reference=None, targets=tuple(targets), identities=tuple(identities))
    plan = make_plan(pack_id, refs, "auto", parallel, AUTO_MAX_CHUNK)
    tenants = {m.job.tenant for m in members}
    if len(tenants) != 1:  # packing.pack_key keys on the tenant: never reached
        raise ValueError(f"a pack holds one tenant's jobs, got {sorted(map(str, tenants))}")
    tenant = tenants.pop()
    lane = config.packing.linger > 0 and lane_allowed(plan, tenant)
    linger = config.packing.linger if lane else 0.0  # its runner waits for the next pack only in a lane
    # a tenant's lane mounts <area>/out writable: made (for the runner, never through a link) if absent
    out = {outputs_rel(tenant)} if lane and tenant is not None else set()
    folders = tuple(sorted({f for m in members for f in m.job.folders} | out))
    prepared = PreparedJob(
        file, spec, resolved, plan, pack_id, folders, people_in_chunks=True, linger=linger, tenant=tenant
    )
    return prepared, record


def _rel(config: Config, p: Photo) -> str:
    if isinstance(p, S3Url):  # never: a tenant's job names no s3:// object (controller/job/remote.py)
        return str(p)
    return Path(p).relative_to(config.data_root).as_posix()


@dataclass
class _Job:
    """One packed job while its pack runs."""

    rundir: RunDir
    spec: Any
    plan: Plan
    items: dict[str, str]  # pack item -> this job's item
    lease: job_lease.Lease | None = None
    report: Report | None = None


class PackRun:
    """Runs a pack (new or resumed) and ends each of its jobs; ``run`` maps each job to its report
    once the pack has ended."""

    def __init__(
        self,
        config: Config,
        backend: SwarmBackend,
        pack: RunDir,
        jobs: dict[str, _Job],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.backend, self.pack = config, backend, pack
        self.jobs = jobs
        self.log = log.get(job=pack.job, component="pack")
        self.clock = clock
        self._looked = self._beat = -math.inf
        self._stopping = False  # the pack's own cancel flagged: every one of its jobs had ended
        self.image = ""
        self.plan: Plan | None = None

    def _running(self) -> list[_Job]:
        return [job for job in self.jobs.values() if job.report is None]

    # -- each round of the pack's watch --------------------------------------------------------------
    def watch(self) -> None:
        """A look at the jobs while the pack runs (Policy.on_round), at most every LOOK seconds:
        a job whose cancel flag is set ends now, as cancelled; the others' leases are renewed every
        job_lease.INTERVAL. A job that cannot be read now is looked at again next time."""
        now = self.clock()
        if now - self._looked < LOOK:
            return
        self._looked = now
        for job in self._running():
            try:
                if job.rundir.control().cancel:
                    self.finish(job, cancelled=True)
            except (OSError, ValueError, FfswarmError) as e:
                self.log.warning("packed_job_not_looked_at", packed=job.rundir.job, error=str(e))
        if self.jobs and not self._running() and not self._stopping:  # all cancelled: the pack stops now
            try:
                control.flag_cancel(self.pack)
                self._stopping = True
            except (OSError, FfswarmError) as e:  # looked at again next time
                self.log.warning("pack_not_cancelled", error=str(e))
        if now - self._beat < job_lease.INTERVAL:
            return
        self._beat = now
        for job in self._running():
            try:
                if job.lease is not None:
                    job.lease.renew()
            except OSError as e:  # the next beat tries again, well before the lease expires
                self.log.warning("packed_job_lease_not_renewed", packed=job.rundir.job, error=str(e))

    # -- a job's end ---------------------------------------------------------------------------------
    def finish(
        self,
        job: _Job,
        cancelled: bool = False,
        chunks: dict[str, ChunkRun] | None = None,
        view: PackView | None = None,
    ) -> None:
        """The one end of a packed job: its chunks as its items ended in the pack (read through it;
        ``view``: the pack as read once for all its jobs), its report, on_complete, Stage.ENDED, its
        lease released."""
        fold = Fold.read(job.plan, job.rundir, view)
        own = ((c.id, c.items) for c in job.plan.chunks)  # the job's own chunks, as its items ended in the pack
        why = lambda missing: self._why(job, chunks or {}, missing)  # noqa: E731
        runs = ended_runs(own, lambda i: fold.result(i) is not None, cancelled, why)
        with job.rundir.volume.batch():  # one umask read for the end's writes
            kept = job.rundir.chunk_records()  # no "report" stage: an end cut after it is ended again (jobs.py)
            started = job.lease.started if job.lease else time.time()
            report = build_report(
                job.plan, job.rundir, runs, self.image, started, fold=fold, spec=job.spec, state_chunks=kept
            )
            path = job.rundir.write_report(report.to_dict())
            report = usecase.call_hooks(self.config, job.spec.on_complete, job.rundir, report, path)
            job.rundir.enter(Stage.ENDED, kept)
        job.report = report
        if job.lease is not None:
            job.lease.release()
        self.log.info("packed_job_finished", packed=job.rundir.job, **vars(report.counts))

    def _why(self, job: _Job, chunks: dict[str, ChunkRun], missing: set[str]) -> str:
        """Why a job's items have no result: the reason the pack's chunk holding them failed."""
        plan = self.plan or self.pack.plan()
        mine = {p for p, own in job.items.items() if own in missing}
        for chunk in plan.chunks:
            run = chunks.get(chunk.id)
            if mine & set(chunk.items) and run is not None and run.reason:
                return f"{run.reason} (in pack {plan.job}, chunk {chunk.id})"
        return f"no result recorded in pack {plan.job}"

    # -- the pack ------------------------------------------------------------------------------------
    def run(self, start: Callable[[Callable[[], None]], Report]) -> dict[str, Report]:
        """Take every job's lease, run the pack (``start``, given ``watch`` for its watch's rounds),
        then end each job still running."""
        self.plan = self.pack.plan()
        self.image = self.pack.image()
        try:  # every job's lease, or none: another controller may be continuing this pack
            for job in self.jobs.values():
                lease = job_lease.Lease(job.rundir)
                lease.acquire()
                job.lease = lease
        except FfswarmError:
            for job in self.jobs.values():
                if job.lease is not None:
                    job.lease.release()
                    job.lease = None
            raise
        self._beat = self.clock()
        for job in self.jobs.values():
            job.rundir.enter(Stage.CHUNKS)
            webhooks.started(self.config, job.rundir, job.spec.on_complete, try_now=False)  # serve's deliverer sends it
        try:
            report = start(self.watch)
            self.end_jobs(report.counts.cancelled > 0)
        except BaseException:  # the jobs are let go of: whoever gives up on them (or continues them) may take them
            for job in self._running():
                if job.lease is not None:
                    job.lease.release()
            raise
        return {name: job.report for name, job in self.jobs.items() if job.report is not None}

    def end_jobs(self, cancelled: bool) -> None:
        """Each job still running ended, once the pack's chunks have ended (``cancelled``: the pack
        was); the pack is read once for all of them."""
        chunks = _chunk_runs(self.pack)
        view = PackView(self.pack)
        for job in self._running():  # a cancel since the last look ends its job as cancelled too
            self.finish(job, cancelled=cancelled or job.rundir.control().cancel, chunks=chunks, view=view)
        sync_filesystem(self.config.data_root)  # the jobs' folders were written without fsyncs (_Job.rundir.durable)


def _chunk_runs(pack: RunDir) -> dict[str, ChunkRun]:
    """The pack's chunks as its watch last recorded them (state and reason), for a job's failures."""
    state = pack.state() or {}
    out: dict[str, ChunkRun] = {}
    for cid, c in (state.get("chunks") or {}).items():
        if isinstance(c, dict) and isinstance(c.get("state"), str):
            try:
                out[cid] = ChunkRun(cid, state=ChunkState(c["state"]), reason=c.get("reason"))
            except ValueError:
                continue
    return out


def open_pack(
    config: Config,
    backend: SwarmBackend,
    members: Sequence[Member],
    folder: Path,
    parallel: int,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[PreparedJob, PackRun]:
    """A new pack's run folder, its members.json and its jobs' folders, nothing started yet."""
    pack_id = new_pack_id(members[0].job.tenant)
    prepared, record = build(config, members, pack_id, folder, parallel)
    pack, _ = usecase.open_or_start(config, backend, prepared)
    pack.write_file(pack.layout.members, json.dumps(record).encode())
    jobs = job_folders(config, members, pack_id, record, pack.image())
    return prepared, PackRun(config, backend, pack, jobs, clock)


def job_folders(
    config: Config, members: Sequence[Member], pack_id: str, record: dict[str, Any], image: str
) -> dict[str, _Job]:
    """Each member's run folder (``packed`` first, its owner, its plan); one flush of the volume at the end."""
    runner, controller = owner(config), config.controller_ids()  # the same for every member
    jobs: dict[str, _Job] = {}
    for job, tenant in ((m.job, m.tenant) for m in members):
        rundir = RunDir(config.data_root, job.job_id, runner, controller)
        rundir.durable = False  # hundreds at once: one flush of the volume below, not six fsyncs each
        with rundir.volume.batch():  # one umask read for the job's folders and files
            rundir.write_file(rundir.layout.packed, f"{pack_id}\n".encode())  # first: the pack it belongs to
            if tenant is not None:
                write_owner(rundir, tenant)
            if not rundir.exists():  # without chunks/ and runner folders: its chunks run in the pack's
                rundir.create(job.file.read_bytes(), job.plan, {}, Control(job.spec.max_concurrent), image, packed=True)
        jobs[job.job_id] = _Job(rundir, job.spec, job.plan, record[job.job_id]["items"])
    sync_filesystem(config.data_root)
    return jobs


def start(
    config: Config,
    backend: SwarmBackend,
    members: Sequence[Member],
    folder: Path,
    parallel: int,
    sinks: Sequence[SinkFactory] = (),
    share: Share | None = None,
    chunks_done: Callable[[], None] | None = None,
    lanes: Lanes | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Report]:
    """Make the pack and its jobs' folders, then run it to its end; each job's report. ``chunks_done``
    is called once the pack's chunks have ended, before its jobs' reports are written (`serve` gives
    the pack's GPUs to the next pack meanwhile); ``clock`` paces PackRun.watch."""
    prepared, runner = open_pack(config, backend, members, folder, parallel, clock)

    # a one-chunk pack's chunk (build: lane_allowed) to a warm runner of its kind, a pack's or a job's; any
    # other pack's in fresh services made beside the lanes
    launch = None if lanes is None else beside(lanes)
    if lanes is not None and prepared.linger > 0:
        launch = in_shared(lanes, float(prepared.spec.timeout), float(config.schedule_timeout), prepared.linger)

    def run_pack(on_round: Callable[[], None]) -> Report:
        try:
            return usecase.run(config, backend, prepared, sinks, share=share, launch=launch, on_round=on_round)
        finally:
            if chunks_done is not None:
                chunks_done()

    return runner.run(run_pack)


def resume(config: Config, backend: SwarmBackend, pack_id: str, sinks: Sequence[SinkFactory] = ()) -> dict[str, Report]:
    """A pack whose controller stopped: continued from its run folder, its jobs' folders as they are."""
    pack = RunDir(config.data_root, pack_id, owner(config), config.controller_ids())
    record = read_members(pack)
    pack_plan = pack.plan()
    jobs: dict[str, _Job] = {}
    for name, entry in record.items():
        if not ID.fullmatch(name):  # not a job id: not a job this pack ran
            continue
        rundir = RunDir(config.data_root, name, owner(config), config.controller_ids())
        rundir.durable = False
        if rundir.report() is not None:  # ended with the earlier controller: nothing left to do
            continue
        prepared, _ = open_run(config, name)
        jobs[name] = _Job(rundir, prepared.spec, prepared.plan, own_items(entry, prepared.plan, pack_plan))
    if not jobs:  # every job ended (cancelled) before the pack did: it ends now, nothing run for nobody
        if pack.report() is None:
            control.flag_cancel(pack)
            giveup.give_up(config, pack_id, "every job of the pack had ended", backend)
        return {}
    runner = PackRun(config, backend, pack, jobs)
    return runner.run(lambda on_round: usecase.resume(config, backend, pack_id, sinks, on_round))
