"""Run a job: the one use case behind `submit`, `resume`, `retry`, `serve` and `render`.

Open or start the job's run folder, with the image ALWAYS the one its image.json records once the
folder exists (the tag is resolved only for a new run, so a restarted controller whose tag has
moved still runs the rest of a job on the image its first chunks ran); then the stages, each
recorded in state.json's "stage" for `ffswarm status`: identity (the step, beside the first chunks),
chunks, videos (redo bad segments, join), report (and the timing measurement), hooks. Every event
goes to every sink the caller gives (progress bar, metrics endpoint, metrics textfile).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from contract.s3 import is_s3
from controller import log
from controller.config import Config
from controller.errors import EngineUnavailable, FfswarmError, JobFileError
from controller.job import access, claims
from controller.job.plan import Plan
from controller.job.spec import OnComplete
from controller.run import control, identity, join, stores, timings, webhooks
from controller.run import job_lease as lease
from controller.run.chunks import ChunkRun, EventSink, Policy, Share
from controller.run.fold import Fold
from controller.run.hooks import NOT_DELIVERED, job_tenant, on_complete, results_link
from controller.run.jobs import PreparedJob, SwarmFactory, open_run, owner, prepare, runner_settings, start_run
from controller.run.jobs import output_links as jobs_links
from controller.run.lanes import Lanes, LaneSwarm, gpu_slots, in_shared, own_lanes, shared_lanes
from controller.run.launch import LaunchFactory
from controller.run.report import Report, build_report
from controller.run.rundir import RunDir, Stage
from controller.run.supervisor import Supervisor
from controller.swarm.backend import SwarmBackend, clear_containers

SinkFactory = Callable[[RunDir, PreparedJob], EventSink]  # one job's sink, made once its run folder exists
REFUSAL_GRACE = 15.0  # seconds for the first chunks' containers to stop after their services are removed


def fan_out(sinks: Sequence[EventSink]) -> EventSink:
    """One event to every sink, in order."""

    def emit(event: str, **fields: Any) -> None:
        for sink in sinks:
            sink(event, **fields)

    return emit


def open_or_start(config: Config, backend: SwarmBackend, job: PreparedJob) -> tuple[RunDir, str]:
    """The job's run folder (created unless it exists) and the image it runs: image.json's."""
    existing = RunDir(config.data_root, job.job_id)
    image = existing.image() if existing.exists() else backend.resolve_image(job.spec.image or config.image)
    if not existing.exists() and job.plan.videos:  # the image must have the job's video encoder
        check_encoder(job, image, backend.image_encoders(image))
    rundir = start_run(config, job, image)
    return rundir, rundir.image()  # a folder another controller created first pins its own


def one_job(config: Config, path: Path, swarm: SwarmFactory | None = None, tenant: str | None = None) -> PreparedJob:
    """The one job of an inbox file or a `render` argument, prepared as `submit` would (``swarm``:
    the caller's backend, built when first asked for: a bad file is refused before Docker is asked;
    ``tenant``: an API job's owner, whose area alone it may use)."""
    prepared = prepare(config, [path], new=False, swarm=swarm, tenant=tenant)
    if len(prepared) != 1:
        raise JobFileError(str(path), None, f"one job per file here, found {len(prepared)}")
    return prepared[0]


def run(
    config: Config,
    backend: SwarmBackend,
    job: PreparedJob,
    sinks: Sequence[SinkFactory] = (),
    *,
    uncancel: bool = False,
    share: Share | None = None,
    launch: LaunchFactory | None = None,
    on_round: Callable[[], None] | None = None,
) -> Report:
    """One prepared job start to report (`submit`, `serve`), continuing its run when the folder exists.
    The job's lease is held meanwhile: a job another controller runs is refused (exit 69). With
    `uncancel` (an explicit `submit` of the job's file), a cancelled job's remaining items run.
    ``launch``: what starts its chunks' attempts (lanes: controller/run/lanes.py; None: a fresh
    service each, controller/run/launch.py). ``on_round``: called every round of the watch (Policy.on_round)."""
    again = uncancel and RunDir(config.data_root, job.job_id).exists()  # submitted again after it ended?
    rundir, image = open_or_start(config, backend, job)
    if again:  # a new run (a run folder made just now has had none)
        webhooks.run_again(rundir)
    with lease.held(rundir):
        on_event = fan_out([make(rundir, job) for make in sinks])
        if uncancel:
            _uncancel(rundir, on_event)
        return supervise(config, backend, job, rundir, image, on_event, share, launch, on_round)


def submit(
    config: Config,
    backend: SwarmBackend,
    jobs: Sequence[PreparedJob],
    sinks: Sequence[SinkFactory] = (),
    lanes: Lanes | None = None,
) -> list[Report]:
    """`ffswarm submit`: each job from the start, or continued where its run folder says (a cancelled
    one included: submitting its file again is asking for the rest). With ``runners.linger`` its CLI
    jobs' chunks run in warm runners shared by its jobs (``lanes``, or a pool of this call's own,
    retired at its end: controller/run/lanes.py shared_lanes)."""
    pool = lanes
    if pool is None and config.runners.linger > 0 and any(j.tenant is None for j in jobs):
        pool = shared_lanes(cast(LaneSwarm, backend), config.runners.linger)
    wait = float(config.schedule_timeout)

    def launch(job: PreparedJob) -> LaunchFactory | None:
        if pool is None or job.tenant is not None or job.linger <= 0:  # a tenant's job: mounts of its own
            return None
        return in_shared(pool, float(job.spec.timeout), wait)

    try:
        return [run(config, backend, job, sinks, uncancel=True, launch=launch(job)) for job in jobs]
    finally:
        if pool is not None and lanes is None:
            pool.close()


def resume(
    config: Config,
    backend: SwarmBackend,
    job_id: str,
    sinks: Sequence[SinkFactory] = (),
    on_round: Callable[[], None] | None = None,
) -> Report:
    """Continue a job from its run folder (`resume`, `retry`): live services are adopted, committed
    items never redone, a cancelled job's remaining items run."""
    job, rundir = open_run(config, job_id)
    webhooks.run_again(rundir)  # a retry of a job that ended: its next end is a new announcement
    with lease.held(rundir):
        on_event = fan_out([make(rundir, job) for make in sinks])
        _uncancel(rundir, on_event)
        todo = Fold.read(job.plan, rundir).pending_chunks()
        access.make_folders(
            config.data_root,
            access.check_plan(config, job.plan, todo, str(job.file)),
            owner(config),
            config.controller_ids(),
        )
        return supervise(config, backend, job, rundir, rundir.image(), on_event, on_round=on_round)


def check_encoder(job: PreparedJob, image: str, encoders: frozenset[str] | None) -> None:
    """A job with videos is refused before anything is made when its runner image says which video
    encoders its ffmpeg has and ``video.codec`` is not one of them (an image that says nothing: not checked)."""
    codec = job.spec.video.codec
    if encoders is not None and codec not in encoders:
        has = ", ".join(sorted(encoders)) or "none of ffswarm's"
        reason = f"the runner image {image} has no {codec} encoder (it has: {has})"
        raise JobFileError(str(job.file), "video.codec", reason)


def _uncancel(rundir: RunDir, on_event: EventSink) -> None:
    """An explicit resume or submit of a cancelled job continues it: the cancel flag is cleared."""
    if control.uncancel(rundir):
        log.get(job=rundir.job).info("job_uncancelled")
        on_event("job_uncancelled")


def render_ready(
    config: Config, backend: SwarmBackend, path: Path, tenant: str | None = None
) -> tuple[PreparedJob, RunDir, str]:
    """`render JOB_FILE`: the run folder started (image pinned as for every run) and its identity
    answered, so that the stack's runners find their manifests and the answer. ``tenant``: the
    owner of an API job's run folder, as `serve` resolved it (controller/run/jobs.py run_tenant)."""
    job = one_job(config, path, lambda: backend, tenant=tenant)
    rundir, image = open_or_start(config, backend, job)
    ensure_identity(config, backend, job, rundir, image)
    return job, rundir, image


def _refused(backend: SwarmBackend, rundir: RunDir) -> None:
    """The identity step refused the job: no runner got past its wait, so nothing was committed.
    Remove the job's services, their containers once stopped (a runner still starting could else
    recreate a folder after it is gone) and the run folder: a refused submit leaves nothing behind."""
    for svc in backend.services(rundir.job):
        backend.remove_service(svc.name)
    clear_containers(backend, rundir.job, REFUSAL_GRACE)
    shutil.rmtree(rundir.path, ignore_errors=True)
    access.remove_folders(rundir.data_root, rundir.made_folders)
    claims.release(rundir.data_root, rundir.job)


def ensure_identity(config: Config, backend: SwarmBackend, job: PreparedJob, rundir: RunDir, image: str) -> None:
    """Run a pending identity step to its end (for `render`: the stack's runners wait for it)."""
    try:
        identity.ensure(config, backend, runner_settings(config, job, image), rundir, str(job.file))
    except FfswarmError:
        _refused(backend, rundir)
        raise


def supervise(
    config: Config,
    backend: SwarmBackend,
    job: PreparedJob,
    rundir: RunDir,
    image: str,
    on_event: EventSink | None = None,
    share: Share | None = None,
    launch: LaunchFactory | None = None,
    on_round: Callable[[], None] | None = None,
) -> Report:
    """The stages of a job whose run folder exists, each recorded in state.json as it starts."""
    plan = rundir.plan()
    started = time.time()
    logger = log.get(job=job.job_id)

    def emit(event: str, **fields: Any) -> None:
        logger.info(event, **fields)
        if on_event:
            on_event(event, **fields)

    webhooks.started(config, rundir, job.spec.on_complete)  # once per job: a resumed run says nothing
    sup, runs = _identity_and_chunks(config, backend, job, rundir, image, emit, started, share, launch, on_round)
    rundir.enter(Stage.VIDEOS)
    store = video_store(config, plan, job.tenant)
    runs = join.finish(plan, rundir, job.spec, sup.run, runs, emit, store)  # redo bad segments, join videos
    return end(config, job, rundir, plan, runs, image, started, emit)


def end(
    config: Config,
    job: PreparedJob,
    rundir: RunDir,
    plan: Plan,
    runs: dict[str, ChunkRun],
    image: str,
    started: float,
    emit: EventSink,
    reason: str | None = None,
) -> Report:
    """The one end of a job whose chunks have ended (``runs``): its report, its on_complete, stage
    ENDED and its output claims released. ``reason``: why the controller ends the job itself
    (controller/run/giveup.py): kept in the report, its webhook only queued for `serve`'s deliverer and its cost not
    measured (its chunks did not run to their end)."""
    kept = rundir.enter(Stage.REPORT)  # state.json's chunk records: read once for the whole end
    links = jobs_links(config, job.tenant)  # signed with the job's own credentials
    report = build_report(plan, rundir, runs, image, started, links, spec=job.spec, state_chunks=kept)
    if reason is None:
        report = _record_timing(config, job, rundir, plan, report, log.get(job=job.job_id))
    else:
        report = replace(report, reason=reason)
    path = rundir.write_report(report.to_dict())
    emit("job_finished", report=str(path), **vars(report.counts))
    report = call_hooks(config, job.spec.on_complete, rundir, report, path, try_now=reason is None)
    rundir.enter(Stage.ENDED, kept)
    claims.release(rundir.data_root, rundir.job)  # its outputs are its own now: no live job holds them
    return report


def video_store(config: Config, plan: Plan, tenant: str | None = None) -> Any:
    """The object store, for a plan with a video whose original or output is an ``s3://`` object
    (the join reads and writes it, with the job's credentials: Config.s3); None otherwise (boto3
    never imported)."""
    s3 = config.s3(tenant)
    if s3 is None or not any(is_s3(v.input) or is_s3(v.output) for v in plan.videos):
        return None
    from controller.storage.s3 import S3Store

    store = S3Store.from_settings(s3)
    store.upload = stores.join_upload(config, plan, store)  # in parts only where the store's record allows
    return store


def call_hooks(
    config: Config, hooks: OnComplete, rundir: RunDir, report: Report, path: Path, try_now: bool = True
) -> Report:
    """The job's on_complete (a ``job.finished`` or ``job.cancelled`` webhook, with a signed results
    link for a tenant's job; the hook), recorded in its report; the report unchanged when it has none.
    Without ``try_now`` the webhook is only queued (`serve`'s deliverer sends it)."""
    ended = "cancelled" if hooks.webhook and rundir.control().cancel else "finished"
    kind = webhooks.CANCELLED if ended == "cancelled" else webhooks.FINISHED
    if not webhooks.wanted(hooks, kind):  # the job's webhook_events leave this one out
        hooks = replace(hooks, webhook=None, webhook_events=None)
    if not (hooks.webhook or hooks.hook):
        return report
    rundir.enter(Stage.HOOKS)
    tenant = job_tenant(config.data_root, rundir.job)

    def deliver() -> tuple[str, str]:  # into the job's outbox (controller/run/webhooks.py), tried once now
        try:
            data = {**webhooks.status_data(config, rundir, ended), "tenant": tenant}  # whose job it is
        except FfswarmError as e:  # the job itself is done: a status that cannot be read is only a loss
            return NOT_DELIVERED, f"status unreadable: {e}"
        data.update(results_link(config.data_root, rundir.job, config.tenants, config.api))
        sent = webhooks.notify(config, rundir, hooks, kind, data, try_now)
        assert sent is not None  # wanted: checked above
        return sent

    done = on_complete(config.policy, hooks, report.to_dict(), path, None, config.webhooks(tenant), deliver)
    report = replace(report, hooks=done)
    rundir.write_report(report.to_dict())
    return report


def _identity_and_chunks(
    config: Config,
    backend: SwarmBackend,
    job: PreparedJob,
    rundir: RunDir,
    image: str,
    emit: EventSink,
    started: float,
    share: Share | None = None,
    launch: LaunchFactory | None = None,
    on_round: Callable[[], None] | None = None,
) -> tuple[Supervisor, dict[str, ChunkRun]]:
    """The identity step (when its answer is still pending) beside the pending chunks, to their ends."""
    plan = rundir.plan()
    # Warm runners (runners.linger): a `submit`'s shared ones (``launch``), or the job's own for a job with
    # more chunks than it runs at once. They keep their GPUs between chunks: no more chunks at once than slots.
    slots = gpu_slots(backend, job.spec.resources.gpus) if job.linger > 0 and len(plan.chunks) > 1 else 0
    width = min(slots or job.spec.max_concurrent, job.spec.max_concurrent)
    warm = launch is None and job.linger > 0 and len(plan.chunks) > width
    policy = Policy(
        retries=job.spec.retries,
        timeout=float(job.spec.timeout),
        schedule_timeout=float(config.schedule_timeout),
        engine_outage=float(config.engine_outage),
        share=share,
        on_round=on_round or Policy.on_round,
        gpu_slots=slots,
    )
    settings = runner_settings(config, job, image)
    sizes = {c.id: len(c.items) for c in plan.chunks}
    if warm:
        launch = own_lanes(job.linger, float(job.spec.timeout))
    launcher = launch(backend, rundir, settings) if launch is not None else None
    sup = Supervisor(backend, rundir, settings, policy, on_event=emit, sizes=sizes, launcher=launcher)
    fold = Fold.read(plan, rundir)
    todo = fold.pending_chunks()
    step = identity.start(config, backend, settings, rundir, str(job.file))
    rundir.enter(Stage.IDENTITY if step is not None else Stage.CHUNKS)
    segments = fold.segments()[0]
    # items: what the user submitted (images and videos), as job_finished and the summary count them
    emit(
        "job_started",
        chunks=len(plan.chunks),
        pending=len(todo),
        items=fold.user_total(),
        segments=segments,
        image=image,
    )

    refusal: list[FfswarmError] = []

    def identity_ready() -> bool:
        assert step is not None
        try:
            answer = step.poll()
        except EngineUnavailable:
            raise  # the engine, not the step: the watch waits for it
        except FfswarmError as e:
            refusal.append(e)
            raise
        if answer is not None:
            rundir.enter(Stage.CHUNKS)
            emit("identity_ready", seconds=round(time.time() - started, 3), provider=answer.provider)
        return answer is not None

    try:
        runs = sup.run(todo, gate=identity_ready if step else None, gate_service=step.spec.name if step else None)
    except FfswarmError as e:
        if refusal and e is refusal[0]:  # only the identity step's refusal: nothing was committed yet
            _refused(backend, rundir)
        raise
    finally:
        if step is not None:
            with contextlib.suppress(EngineUnavailable):  # gone with the engine: resume removes it
                step.abort()  # no-op once it answered; removes it after a cancel or an interrupt
    return sup, runs


def _record_timing(config: Config, job: PreparedJob, rundir: RunDir, plan: Plan, report: Report, logger: Any) -> Report:
    """What this job's chunks cost, into its report and runs/.timings.json for the next `auto`."""
    measured = timings.measure(rundir, plan)
    if measured is None:
        return report
    provider, timing = measured
    report = replace(
        report, timing={"provider": provider, "cold_start_s": timing.cold_start_s, "item_s": timing.item_s}
    )
    try:
        timings.record(config.data_root, job.spec.models, provider, timing, owner(config))
    except OSError as e:  # the job itself is done: a measurement that cannot be kept is only a loss
        logger.warning("timing_not_recorded", error=str(e))
    return report
