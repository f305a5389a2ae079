"""What `ffswarm submit`, `resume` and `status` do: validate, plan, create the run folder, supervise.

Everything that can be checked is checked before anything is created: every job file of a submit
is parsed and resolved against the data root first, and one bad file stops the whole submit.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import PackError
from contract.identity import IdentityResult
from contract.pack import missing_roles
from contract.results import ItemStatus
from controller import log
from controller.config import Config
from controller.errors import EngineUnavailable, FfswarmError, MissingInputError, UsageError
from controller.job import access, video
from controller.job.files import load_jobs, parse_job_text
from controller.job.plan import AUTO_MAX_CHUNK, ManifestSettings, Plan, TargetRef, chunk_manifests, make_plan
from controller.job.resolve import ResolvedJob, resolve_job
from controller.job.spec import JobSpec
from controller.models import read_spec
from controller.run import identity, join, timings
from controller.run.chunks import Policy
from controller.run.hooks import on_complete
from controller.run.report import build_report, exit_code
from controller.run.rundir import Control, RunDir, next_job_id
from controller.run.supervisor import Supervisor
from controller.swarm.backend import SwarmBackend, clear_containers
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import RunnerSettings, chunk_service


@dataclass(frozen=True)
class PreparedJob:
    file: Path
    spec: JobSpec
    resolved: ResolvedJob | None  # None for a job reopened from its run folder
    plan: Plan
    job_id: str
    folders: tuple[str, ...] = ()  # output folders to create for the runner (access.check_job)


def prepare(config: Config, paths: Sequence[Path], new: bool) -> list[PreparedJob]:
    out = []
    slots: list[int] = []

    def parallel(spec: JobSpec) -> int:
        """How many chunks can run at once: max_concurrent, and the GPU slots the swarm advertises."""
        if spec.resources.gpus == 0:
            return spec.max_concurrent
        if not slots:
            try:
                slots.append(sum(n.gpus for n in DockerSwarm(config.docker_host).nodes() if n.usable))
            except FfswarmError:
                slots.append(spec.max_concurrent)  # no swarm reachable (dry run): the window alone
        return max(1, min(spec.max_concurrent, slots[0] // spec.resources.gpus or 1))

    for file, spec in load_jobs(paths):
        job_id = next_job_id(config.data_root, spec.name, new)
        resolved = resolve_job(spec, config.data_root, str(file), job_id=job_id)
        check_pack(config, spec, file)
        folders = access.check_job(config, resolved, str(file))  # the runner can read and write it all
        targets = video.target_refs(resolved.targets, spec)  # videos probed and cut into segments
        plan = make_plan(job_id, targets, spec.chunk_size, parallel(spec), chunk_cap(config, spec, targets))
        out.append(PreparedJob(file, spec, resolved, plan, job_id, folders))
    return out


def chunk_cap(config: Config, spec: JobSpec, targets: Sequence[TargetRef]) -> int:
    """The largest chunk `auto` makes for this job: from what earlier jobs with its pack and
    providers measured (controller/run/timings.py), for photos; AUTO_MAX_CHUNK otherwise."""
    if spec.chunk_size != "auto" or any(t.kind == "video" for t in targets):
        return AUTO_MAX_CHUNK
    timing = timings.lookup(config.data_root, spec.models, spec.providers)
    return timing.chunk_cap(float(spec.timeout)) if timing else AUTO_MAX_CHUNK


def check_pack(config: Config, spec: JobSpec, file: Path) -> None:
    """The pack exists and has a file for every role the job's processors need (no hashing here:
    the identity step verifies every checksum on a GPU node, where the files are read anyway)."""
    shown = f"models/{spec.models}"  # reasons name paths relative to the data root, as users know them
    pack_dir = config.data_root / shown
    if not (pack_dir / "pack.yaml").is_file():
        raise MissingInputError(
            f"{file}: models: pack {spec.models!r} not found: {shown}/pack.yaml does not exist "
            f"(install one with `ffswarm models fetch` or see docs/operations.md#models)"
        )
    try:
        missing_roles(pack_dir, read_spec(pack_dir, shown), spec.processors, shown)
    except PackError as e:
        raise MissingInputError(f"{file}: models: {e}") from None


def _rel(config: Config, p: Path) -> str:
    return p.resolve().relative_to(config.data_root).as_posix()


def manifest_settings(config: Config, job: PreparedJob, ident: IdentityResult | None = None) -> ManifestSettings:
    """With `ident`, the embeddings go into every manifest; without, runners read identity.json."""
    assert job.resolved is not None, "manifests are made at submit, from a resolved job"
    return ManifestSettings(
        pack=job.spec.models,
        sources=tuple(_rel(config, s) for s in job.resolved.sources),
        processors=tuple(job.spec.processors),
        providers=tuple(job.spec.providers),
        faces=job.spec.faces,
        no_face=job.spec.no_face,
        source_embedding=tuple(ident.source_embedding) if ident and ident.source_embedding else None,
        reference_embedding=ident.reference_embedding if ident else None,
        identity_timeout=None if ident else identity.wait_limit(config),
        reference_distance=job.spec.reference_distance,
        detector_threshold=job.spec.detector.threshold,
        detector_size=job.spec.detector.size,
        mask_feather=job.spec.mask.feather,
        mask_padding=job.spec.mask.padding,
        enhancer_blend=job.spec.face_enhancer.blend,
    )


def runner_settings(config: Config, job: PreparedJob, image: str) -> RunnerSettings:
    res = job.spec.resources
    return RunnerSettings(
        job=job.job_id,
        image=image,
        constraints=tuple(job.spec.placement),
        gpu_kind=res.gpu_kind,
        gpus=res.gpus,
        memory_bytes=res.memory,
        volume=config.volume,
        user=config.runner_uid_gid(),
    )


def dry_run(config: Config, jobs: list[PreparedJob], image_of: Callable[[str], str]) -> dict[str, Any]:
    """The plan and the services that would be created; nothing is created."""
    out: dict[str, Any] = {"jobs": []}
    for job in jobs:
        image = image_of(job.spec.image or config.image)
        settings = runner_settings(config, job, image)
        out["jobs"].append(
            {
                "job": job.job_id,
                "file": str(job.file),
                "items": [{"id": i.id, "input": i.input, "output": i.output, "kind": i.kind} for i in job.plan.items],
                "chunks": [{"id": c.id, "items": list(c.items)} for c in job.plan.chunks],
                "max_concurrent": job.spec.max_concurrent,
                "services": [chunk_service(settings, c.id, 1).as_dict() for c in job.plan.chunks],
            }
        )
    return out


def _owner(config: Config) -> tuple[int, int]:
    return access.parse_ids(config.runner_uid_gid())


def _pending_chunks(rundir: RunDir, plan: Plan) -> list[str]:
    """Chunks with an item that has no ok/no_face result yet (a resubmit redoes nothing committed)."""
    todo = []
    for chunk in plan.chunks:
        latest = rundir.latest_results(chunk.id)
        if any(i not in latest or latest[i].status is ItemStatus.ERROR for i in chunk.items):
            todo.append(chunk.id)
    return todo


def start_run(config: Config, job: PreparedJob, image: str) -> RunDir:
    """The job's run folder (created unless it exists). Its identity is still pending: supervise()
    runs the identity step beside the first chunks (ensure_identity() for callers that don't).
    The job's missing output folders are made first, owned by the runner (checked in prepare)."""
    made = access.make_folders(config.data_root, job.folders, _owner(config))
    rundir = RunDir(config.data_root, job.job_id, _owner(config))
    rundir.made_folders = made
    if not rundir.exists():
        assert job.resolved is not None
        rundir.make_dirs()
        identity.prepare(rundir, identity.request_for(config, job.spec, job.resolved, job.job_id))
        manifests = chunk_manifests(job.plan, manifest_settings(config, job))
        rundir.create(job.file.read_bytes(), job.plan, manifests, Control(job.spec.max_concurrent), image)
    return rundir


REFUSAL_GRACE = 15.0  # seconds for the first chunks' containers to stop after their services are removed


def _refused(backend: SwarmBackend, rundir: RunDir) -> None:
    """The identity step refused the job: no runner got past its wait, so nothing was committed.
    Remove the job's services, their containers once stopped (a runner still starting could else
    recreate a folder after it is gone) and the run folder: a refused submit leaves nothing behind."""
    for svc in backend.services(rundir.job):
        backend.remove_service(svc.name)
    clear_containers(backend, rundir.job, REFUSAL_GRACE)
    shutil.rmtree(rundir.path, ignore_errors=True)
    access.remove_folders(rundir.data_root, rundir.made_folders)


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
    on_event: Callable[..., None] | None = None,
) -> dict[str, Any]:
    plan = rundir.plan()
    started = time.time()
    policy = Policy(
        retries=job.spec.retries,
        timeout=float(job.spec.timeout),
        schedule_timeout=float(config.schedule_timeout),
        engine_outage=float(config.engine_outage),
    )
    logger = log.get(job=job.job_id)

    def emit(event: str, **fields: Any) -> None:
        logger.info(event, **fields)
        if on_event:
            on_event(event, **fields)

    settings = runner_settings(config, job, image)
    sizes = {c.id: len(c.items) for c in plan.chunks}
    sup = Supervisor(backend, rundir, settings, policy, on_event=emit, sizes=sizes)
    todo = _pending_chunks(rundir, plan)
    step = identity.start(config, backend, settings, rundir, str(job.file))
    emit("job_started", chunks=len(plan.chunks), pending=len(todo), items=len(plan.items), image=image)

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
    runs = join.finish(plan, rundir, job.spec, sup.run, runs, emit)  # redo bad segments, join videos
    report = build_report(plan, rundir, runs, image, started)
    _record_timing(config, job, rundir, plan, report, logger)
    path = rundir.write_report(report)
    emit("job_finished", report=str(path), **report["counts"])
    hooks = job.spec.on_complete
    if hooks.webhook or hooks.command:
        report["hooks"] = on_complete(hooks.webhook, hooks.command, report, path)
        rundir.write_report(report)
    return report


def _record_timing(
    config: Config, job: PreparedJob, rundir: RunDir, plan: Plan, report: dict[str, Any], logger: Any
) -> None:
    """What this job's chunks cost, into its report and runs/.timings.json for the next `auto`."""
    measured = timings.measure(rundir, plan)
    if measured is None:
        return
    provider, timing = measured
    report["timing"] = {"provider": provider, "cold_start_s": timing.cold_start_s, "item_s": timing.item_s}
    try:
        timings.record(config.data_root, job.spec.models, provider, timing, _owner(config))
    except OSError as e:  # the job itself is done: a measurement that cannot be kept is only a loss
        logger.warning("timing_not_recorded", error=str(e))


ProgressFactory = Callable[[RunDir, int], Callable[..., None]]


def submit(
    config: Config, jobs: list[PreparedJob], progress: ProgressFactory | None = None
) -> tuple[int, list[dict[str, Any]]]:
    backend = DockerSwarm(config.docker_host)
    backend.check_manager()
    reports = []
    for job in jobs:
        existing = RunDir(config.data_root, job.job_id)
        image = existing.image() if existing.exists() else backend.resolve_image(job.spec.image or config.image)
        rundir = start_run(config, job, image)
        on_event = progress(rundir, len(job.plan.items)) if progress else None
        reports.append(supervise(config, backend, job, rundir, image, on_event))
    worst = max((exit_code(r) for r in reports), default=0)
    return worst, reports


def open_run(config: Config, job_id: str) -> tuple[PreparedJob, RunDir]:
    """A job as its run folder recorded it (frozen job file, plan): what resume and retry continue."""
    rundir = RunDir(config.data_root, job_id, _owner(config))
    if not rundir.exists():
        raise UsageError(f"no job {job_id!r}: {rundir.path} has no {rundir.layout.plan.name}")
    job_file = rundir.layout.job_file
    spec = parse_job_text(job_file.read_text(), str(job_file))
    return PreparedJob(job_file, spec, None, rundir.plan(), job_id), rundir


def resume(config: Config, job_id: str, progress: ProgressFactory | None = None) -> tuple[int, dict[str, Any]]:
    """Continue a job from its run folder: live services are adopted, committed items never redone."""
    job, rundir = open_run(config, job_id)
    backend = DockerSwarm(config.docker_host)
    backend.check_manager()
    if rundir.control().cancel:
        raise UsageError(f"job {job_id} was cancelled; submit it again with --new to run it afresh")
    todo = _pending_chunks(rundir, job.plan)
    access.make_folders(config.data_root, access.check_plan(config, job.plan, todo, str(job.file)), _owner(config))
    on_event = progress(rundir, len(job.plan.items)) if progress else None
    report = supervise(config, backend, job, rundir, rundir.image(), on_event)
    return exit_code(report), report


def cancel(config: Config, job_id: str) -> int:
    """Flag the job cancelled (a running controller stops) and remove its services now, so a job
    whose controller is gone stops too. Committed outputs stay."""
    job, rundir = open_run(config, job_id)
    current = rundir.control()
    rundir.write_control(Control(current.max_concurrent, cancel=True))
    backend = DockerSwarm(config.docker_host)
    services = backend.services(job_id)
    for svc in services:
        backend.remove_service(svc.name)
    backend.remove_exited_containers(job_id)
    return len(services)


def clear_cancel(config: Config, job_id: str) -> None:
    _, rundir = open_run(config, job_id)
    current = rundir.control()
    rundir.write_control(Control(current.max_concurrent, cancel=False))


def scale(config: Config, job_id: str, n: int) -> None:
    _, rundir = open_run(config, job_id)
    current = rundir.control()
    rundir.write_control(Control(n, cancel=current.cancel))
