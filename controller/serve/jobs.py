"""How `serve` runs one job file, or a pack of small ones (controller/serve/daemon.py is the inbox loop).

A file the HTTP API handed over (controller/api/submit.py) is a tenant's job when the API's owner
record claims it for exactly the bytes claimed (controller/job/owners.py): it is resolved inside
that tenant's area alone, and its run folder records ``owner``. Any other file is a CLI job, whose
outputs never enter ``tenants/``. Jobs share the swarm's GPUs by tenant weight (controller/serve/shares.py);
small ones may be packed together (controller/serve/packing.py, packs.py).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.layout import RunLayout
from controller import log
from controller.config import Config
from controller.errors import CapacityError, EngineUnavailable, FfswarmError, JobFileError, volume_full
from controller.job import owners
from controller.job.claims import Claimed
from controller.job.paths import relative_text
from controller.redact import printable
from controller.run import job_lease, usecase
from controller.run.jobs import PreparedJob, open_run, owner, write_owner
from controller.run.lanes import Lanes, beside, in_shared
from controller.run.launch import LaunchFactory
from controller.run.metrics import Metrics
from controller.run.packed import pack_of
from controller.run.report import Report, summary
from controller.run.rundir import RunDir, Stage
from controller.run.usecase import SinkFactory
from controller.run.warmth import shares_lanes
from controller.serve import packs, unmade
from controller.serve.inbox import original_name
from controller.serve.packing import Member, Packer
from controller.serve.shares import Share, ShareBook
from controller.storage.errors import StorageTemporaryError
from controller.swarm.backend import NodeState
from controller.swarm.docker import DockerSwarm
from controller.volume import read_nofollow

MAX_REASON_CHARS = 20_000


def kind(e: FfswarmError) -> str:
    """The error's kind as reason files name it (one or many job-file errors are a JobFileError)."""
    return "JobFileError" if isinstance(e, JobFileError) else type(e).__name__


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str | None
    retry: bool = False  # the swarm or the store could not take the job now (exit 69, 75): later, not failed/
    packed: bool = False  # held for a pack: the packer has the file now (controller/serve/packing.py)
    delay: float | None = None  # with retry: seconds before it is looked at again (None: the server's)


FULL = "the shared volume is full: the job waits in the inbox and goes on once there is room"


@dataclass(frozen=True)
class Running:
    """What `serve` lends a job file's run: the GPU share book, the packer (None: packing off), the
    job slots (a job that cannot pack takes one, or waits in the inbox) and the lanes."""

    book: ShareBook | None = None
    packer: Packer | None = None
    slots: threading.Semaphore | None = None
    gpus: SwarmGpus | None = None  # the swarm's nodes, as `auto` chunking asks for them
    lanes: Lanes | None = None  # warm runners shared by jobs of a kind (runners.linger: warmth.shares_lanes)


SLOT_WAIT_SECONDS = 2.0  # a job that cannot pack, while every job slot is busy, waits this long


def run_job_file(
    config: Config, path: Path, metrics: Metrics, book: ShareBook | None = None, running: Running | None = None
) -> Outcome:
    """One job file, start to report, as `ffswarm submit FILE` would run it (continuing its run).
    The reason names paths relative to the data root (inbox/running/NAME.yaml, hidden/in/a.jpg), as
    whoever dropped the file knows them: neither this host's data root nor the container's /data.
    ``book``: the GPU share book of the jobs this `serve` runs at once (controller/serve/shares.py)."""
    return _shown(config, _run_job_file(config, path, metrics, running or Running(book)))


def _shown(config: Config, outcome: Outcome) -> Outcome:
    if outcome.reason is None:
        return outcome
    reason = printable(relative_text(outcome.reason, config.data_root), newlines=True)[:MAX_REASON_CHARS]
    return dataclasses.replace(outcome, reason=reason)


def report_outcome(report: Report) -> Outcome:
    if report.exit_code() == 0:
        return Outcome(True, None)
    return Outcome(False, "\n".join(summary(report, RunLayout.relative(report.job).report, max_failures=50)))


def job_owner(config: Config, claimed: Path) -> str | None:
    """The tenant whose API job ``claimed`` is (its owner record names these very bytes), or None:
    a CLI job."""
    if not config.tenants:
        return None
    data = read_nofollow(claimed, config.policy.limits.job_file + 1)
    if data is None:
        return None
    job = os.path.splitext(original_name(claimed.name))[0]
    trusted = owners.trusted_uids(config.controller_ids()[0], int(config.runner_uid_gid().split(":")[0]))
    return owners.owner_of(config.data_root, job, data, sorted(config.tenants), trusted)


def record_owner(tenant: str) -> SinkFactory:
    """Writes ``owner`` into the job's run folder (the controller's file) as soon as it exists."""

    def make(rundir: RunDir, job: object) -> Callable[..., None]:
        write_owner(rundir, tenant)
        return lambda event, **fields: None

    return make


class SwarmGpus:
    """The GPUs the swarm advertises on usable nodes, asked at most every ``every`` seconds; the last
    answer while the engine does not answer (None before any: then only quotas limit). Its nodes()
    size a job's ``auto`` chunks as `submit` does, without asking the engine for every job file."""

    def __init__(self, config: Config, every: float = 10.0) -> None:
        self.config = config
        self.every = every
        self._at = -float("inf")
        self._nodes: list[NodeState] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> int | None:
        nodes = self._seen()
        return None if nodes is None else sum(n.gpus for n in nodes if n.usable)

    def nodes(self) -> list[NodeState]:
        nodes = self._seen()
        if nodes is None:
            raise EngineUnavailable("the swarm's nodes are not known yet")
        return nodes

    def _seen(self) -> list[NodeState] | None:
        with self._lock:
            if time.monotonic() - self._at >= self.every:
                self._at = time.monotonic()
                try:
                    self._nodes = DockerSwarm(self.config.docker_host).nodes()
                except FfswarmError as e:
                    log.get(component="serve").warning("gpus_not_counted", error=str(e))
            return self._nodes


def join_book(config: Config, book: ShareBook | None, key: str, tenant: str | None, gpus: int) -> Share | None:
    """A job's (or a pack's) seat in the share book, when it reserves GPUs: its tenant's weight and quota.gpus."""
    if book is None or gpus == 0:
        return None
    t = config.tenants.get(tenant) if tenant is not None else None
    return book.join(key, tenant, t.weight if t else 1, t.quota.gpus if t else None, gpus)


def _run_job_file(config: Config, path: Path, metrics: Metrics, running: Running) -> Outcome:
    share: Share | None = None
    slot = False
    try:
        tenant = job_owner(config, path)
        # a bad file is refused before Docker is asked; a tenant's job is resolved inside its area
        gpus = running.gpus
        job = usecase.one_job(config, path, None if gpus is None else lambda: gpus, tenant=tenant)
        rundir = RunDir(config.data_root, job.job_id)
        pack = pack_of(rundir)  # also in a half-made folder: its pack may have been cut while made
        if pack is not None and RunDir(config.data_root, pack).exists():
            return _packed_again(config, rundir, pack, metrics)
        if running.packer is not None and not rundir.exists() and running.packer.offer(Member(path, job, tenant)):
            return Outcome(True, None, packed=True)
        if running.slots is not None:
            if not running.slots.acquire(blocking=False):
                return Outcome(False, "every job slot is busy", retry=True, delay=SLOT_WAIT_SECONDS)
            slot = True
        backend = DockerSwarm(config.docker_host)
        backend.check_manager()
        sinks: list[SinkFactory] = [lambda rundir, job: metrics.sink(rundir, job.spec.resources.gpus)]
        if tenant is not None:
            sinks.insert(0, record_owner(tenant))
        share = join_book(config, running.book, job.job_id, tenant, job.spec.resources.gpus)
        report = usecase.run(config, backend, job, sinks, share=share, launch=_in_lanes(config, job, running.lanes))
    except (CapacityError, StorageTemporaryError) as e:  # the swarm or the object store, not now: it waits
        return Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}", retry=True)
    except Claimed as e:  # its outputs' claims may be a half-made pack's, made for this very job
        if (again := _half_made(config, e.holder)) is not None:
            return again
        return Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}")
    except FfswarmError as e:
        return Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}")
    except Exception as e:  # one job's failure must not stop the controller or its other jobs
        if volume_full(e):  # the job waits in the inbox and is continued (resumed) once there is room
            log.get(component="serve", file=path.name).warning("job_file_volume_full", error=str(e))
            return Outcome(False, FULL, retry=True)
        # the traceback goes to the controller's log, never into the reason file beside the job
        log.get(component="serve", file=path.name).exception("job_file_internal_error")
        return Outcome(False, f"internal error (exit 70): {type(e).__name__}; the controller's log has the details")
    finally:
        if share is not None:
            share.leave()
        if slot and running.slots is not None:
            running.slots.release()
    return report_outcome(report)


def _in_lanes(config: Config, job: PreparedJob, pool: Lanes | None) -> LaunchFactory | None:
    """A job's chunks handed to `serve`'s warm runners of its kind and tenant (controller/run/warmth.py
    shares_lanes: prepared with ``linger`` so), or run in fresh services made beside them; None: no
    warm runners in this `serve`, or the job's own (usecase)."""
    if pool is None:
        return None
    if job.linger > 0 and shares_lanes(job.job_id, job.plan, job.tenant):
        return in_shared(pool, float(job.spec.timeout), float(config.schedule_timeout), job.linger)
    return None if job.linger > 0 else beside(pool)


def _packed_again(config: Config, rundir: RunDir, pack: str, metrics: Metrics) -> Outcome:
    """A packed job's file claimed again (its controller stopped): the job ended with its pack, or
    the pack is continued here (its other jobs end with it; their files find their reports)."""
    done = rundir.report()
    if done is None and (again := _half_made(config, pack)) is not None:
        return again
    if done is None:
        if job_lease.holder(RunDir(config.data_root, pack)) is not None:  # another thread or controller has it
            return Outcome(False, f"its pack {pack} is being continued", retry=True, delay=SLOT_WAIT_SECONDS)
        try:
            reports = _resume_pack(config, pack, metrics)
        except job_lease.LeaseHeld:  # taken meanwhile by another of its jobs' files: it ends them all
            return Outcome(False, f"its pack {pack} is being continued", retry=True, delay=SLOT_WAIT_SECONDS)
        if rundir.job in reports:
            return report_outcome(reports[rundir.job])
        done = rundir.report()
    else:
        if (rundir.state() or {}).get("stage") != Stage.ENDED:  # its end was cut after its report
            _end_again(config, rundir.job, done)
        _end_left_pack(config, pack, metrics)
    counts = (done or {}).get("counts") or {}
    if not any(counts.get(k) for k in ("failed", "cancelled", "chunks_failed", "chunks_cancelled")):
        return Outcome(True, None)
    return Outcome(
        False, f"job {rundir.job} ended with failures (in {pack}): see {RunLayout.relative(rundir.job).report}"
    )


def _end_again(config: Config, job: str, done: dict[str, object]) -> None:
    """A packed job whose report was written but whose end stopped there (a full volume or a kill
    before Stage.ENDED): its on_complete again (a webhook keeps its id: delivered once), then
    ENDED and its lease let go — so its status no longer reads ``stopped`` for ever."""
    rundir = RunDir(config.data_root, job, owner(config), config.controller_ids())
    prepared, _ = open_run(config, job)
    with job_lease.held(rundir):
        usecase.call_hooks(config, prepared.spec.on_complete, rundir, Report.from_dict(done), rundir.layout.report)
        rundir.enter(Stage.ENDED)


def _half_made(config: Config, pack: str) -> Outcome | None:
    """A job's pack (or the holder of its outputs' claims) half made (controller/serve/unmade.py):
    unmade when it was cut, so the job's file, tried again, runs without it; looked at again later
    while it may still be being made. None for any other pack."""
    found = unmade.state(config, pack)
    if found == unmade.CUT:
        unmade.unmake(config, pack, DockerSwarm(config.docker_host))
        return Outcome(False, f"its pack {pack}: {unmade.REASON}", retry=True)
    if found == unmade.MAKING:
        return Outcome(False, f"its pack {pack} is being made", retry=True, delay=SLOT_WAIT_SECONDS)
    return None


def _end_left_pack(config: Config, pack: str, metrics: Metrics) -> None:
    """A job that ended with its pack still unended and unheld (its controller stopped after the job
    was cancelled): the pack is continued here so it ends too — its services removed, its report
    written — rather than left for ever. Best effort: the job's own end stands whatever happens."""
    pack_dir = RunDir(config.data_root, pack)
    try:
        if pack_dir.report() is None and job_lease.holder(pack_dir) is None:
            _resume_pack(config, pack, metrics)
    except CapacityError:  # another controller has it now (LeaseHeld): it ends it
        return
    except (OSError, FfswarmError) as e:
        log.get(component="serve", pack=pack).warning("pack_not_ended", error=str(e))


def _resume_pack(config: Config, pack: str, metrics: Metrics) -> dict[str, Report]:
    """The pack continued (or ended, when its jobs all have) by this controller: each job's report."""
    backend = DockerSwarm(config.docker_host)
    backend.check_manager()
    return packs.resume(config, backend, pack, [lambda r, j: metrics.sink(r, j.spec.resources.gpus)])


def run_pack(
    config: Config,
    members: Sequence[Member],
    metrics: Metrics,
    book: ShareBook | None,
    folder: Path,
    parallel: int | None = None,
    chunks_done: Callable[[], None] | None = None,
    lanes: Lanes | None = None,
) -> dict[str, Outcome]:
    """Small jobs as one pack, to its end: each job's outcome for its inbox file. ``parallel``: its
    chunk services at once (packing.width; None: as many as the swarm's GPUs allow). Once its chunks
    have ended it leaves the GPU share book and calls ``chunks_done``, while its jobs' reports are
    still being written."""
    share: Share | None = None
    names = [m.job.job_id for m in members]
    try:
        backend = DockerSwarm(config.docker_host)
        backend.check_manager()
        first = members[0].job
        gpus = first.spec.resources.gpus
        total = book.total() if book is not None else None
        slots = first.spec.max_concurrent if not gpus or total is None else max(1, total // gpus)
        if parallel is None:
            parallel = max(1, min(max(m.job.spec.max_concurrent for m in members), slots))
        tenants = {m.tenant for m in members}
        pack_tenant = tenants.pop() if len(tenants) == 1 else None
        share = join_book(config, book, f"pack:{names[0]}", pack_tenant, gpus)
        sink: SinkFactory = lambda rundir, job: metrics.sink(rundir, job.spec.resources.gpus)  # noqa: E731
        seat = share

        def released() -> None:
            if seat is not None:
                seat.leave()
            if chunks_done is not None:
                chunks_done()

        reports = packs.start(config, backend, members, folder, parallel, [sink], share, released, lanes)
    except (CapacityError, StorageTemporaryError) as e:
        return {n: Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}", retry=True) for n in names}
    except FfswarmError as e:
        return {n: _shown(config, Outcome(False, f"{kind(e)} (exit {e.exit_code}): {e}")) for n in names}
    except Exception as e:
        if volume_full(e):  # its jobs wait in the inbox; the first one claimed again continues the pack
            log.get(component="serve", pack=names[0]).warning("pack_volume_full", error=str(e))
            return {n: Outcome(False, FULL, retry=True) for n in names}
        log.get(component="serve", pack=names[0]).exception("pack_internal_error")
        why = f"internal error (exit 70): {type(e).__name__}; the controller's log has the details"
        return {n: Outcome(False, why) for n in names}
    finally:
        if share is not None:
            share.leave()
    missing = Outcome(False, "the pack ended without this job's report; the controller's log has the details")
    return {n: _shown(config, report_outcome(reports[n])) if n in reports else missing for n in names}
