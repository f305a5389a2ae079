"""A job before it runs: validate, plan, create or reopen the run folder (running it: usecase.py).

Everything that can be checked is checked before anything is created: every job file of a submit
is parsed and resolved against the data root first, and one bad file stops the whole submit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from contract.identity import IdentityResult
from contract.identity_table import identity_id
from contract.layout import PACK_PREFIX, RunLayout, may_own, run_tenant_key, tenant_runs_rel
from contract.s3 import S3Url, StorageAccess, is_s3
from controller import policy as admission
from controller.config import Config
from controller.errors import FfswarmError, JobFileError, MissingInputError, UsageError
from controller.job import access, claims, fence, owners, remote, video
from controller.job.files import parse_job_text, raise_all, read_jobs
from controller.job.keys import manifest_values
from controller.job.owners import area_rel, outputs_rel
from controller.job.pack_checks import check_pack
from controller.job.plan import AUTO_MAX_CHUNK, ID, ManifestSettings, Plan, TargetRef, chunk_manifests, make_plan
from controller.job.resolve import ResolvedJob, resolve_job
from controller.job.spec import JobSpec
from controller.run import identity, stores, timings, warmth
from controller.run.rundir import Control, RunDir, next_job_id
from controller.settings.fields import FieldError
from controller.swarm.backend import NodeSource, SwarmBackend
from controller.swarm.servicespec import (
    WHOLE_ROOT,
    DataMount,
    RunnerSettings,
    SecretMount,
    chunk_service,
    tenant_mounts,
)


@dataclass(frozen=True)
class PreparedJob:
    file: Path
    spec: JobSpec
    resolved: ResolvedJob | None  # None for a job reopened from its run folder
    plan: Plan
    job_id: str
    folders: tuple[str, ...] = ()  # output folders to create for the runner (access.check_job)
    # No identity step: each chunk's runner embeds the people its own items use (a pack: its members'
    # people are few per chunk, and the step's container would cost the pack seconds; controller/serve/packs.py)
    people_in_chunks: bool = False
    # seconds its runners wait for its next chunk (runners.linger) or a pack's next (packing.linger): run/lanes.py
    linger: float = 0.0
    tenant: str | None = None  # an API job's (or a pack's) tenant: its runners see only its area
    # Its stores honour conditions on CompleteMultipartUpload: conditional commits may go up in parts
    commit_in_parts: bool = False


SwarmFactory = Callable[[], NodeSource]  # the command's one backend (built when first asked for), or serve's nodes


B = TypeVar("B", bound=SwarmBackend)


def once(make: Callable[[], B]) -> Callable[[], B]:
    """A factory that builds its backend the first time it is called, then hands out that one."""
    made: list[B] = []

    def get() -> B:
        if not made:
            made.append(make())
        return made[0]

    return get


def prepare(
    config: Config, paths: Sequence[Path], new: bool, swarm: SwarmFactory | None = None, tenant: str | None = None
) -> list[PreparedJob]:
    """Every job file read, checked against the policy and the data root, and planned. Every error of
    every file is collected and raised together (controller/job/files.py: JobFileErrors), so one
    submit shows them all. ``swarm``: asked for the GPU slots the swarm advertises (None, or no swarm
    reachable: the job's max_concurrent alone sizes the chunks)."""
    out = []
    slots: list[int] = []

    def parallel(spec: JobSpec) -> int:
        """How many chunks can run at once: max_concurrent, and the GPU slots the swarm advertises."""
        if spec.resources.gpus == 0:
            return spec.max_concurrent
        if not slots:
            try:
                slots.append(sum(n.gpus for n in swarm().nodes() if n.usable) if swarm else spec.max_concurrent)
            except FfswarmError:
                slots.append(spec.max_concurrent)  # no swarm reachable (dry run): the window alone
        return max(1, min(spec.max_concurrent, slots[0] // spec.resources.gpus or 1))

    found, problems = read_jobs(paths, config.policy.limits.job_file)
    errors: list[FfswarmError] = list(problems)
    for file, spec in found:
        try:
            out.append(_prepare_one(config, file, spec, new, parallel, tenant))
        except (JobFileError, MissingInputError) as e:
            errors.append(e)
    raise_all(errors)
    return out


def _prepare_one(
    config: Config, file: Path, spec: JobSpec, new: bool, parallel: Callable[[JobSpec], int], tenant: str | None
) -> PreparedJob:
    webhooks = None if tenant is None else config.webhooks(tenant)
    admission.check_job(config.policy, spec, str(file), webhooks)  # nothing is looked at before the policy agrees
    job_id = next_job_id(config.data_root, spec.name, new)
    if job_id.startswith(PACK_PREFIX) or (tenant is None and run_tenant_key(job_id) is not None):
        # its run folder would be a pack's, or a tenant's while no tenant's record names this file (run_rel)
        why = f"{spec.name!r} has the shape of an id that only serve's packs and the API's jobs have"
        raise JobFileError(str(file), "name", why)
    check_same_job(config, job_id, file)
    limit = config.policy.limits.targets
    store = store_for(config, spec, tenant)
    resolved = resolve_job(
        spec, config.data_root, str(file), job_id=job_id, tenant=tenant, max_pairs=limit, store=store
    )
    admission.check_counts(config.policy, str(file), len(resolved.targets), 0)
    # the stores its outputs go to: probed (or their record read), refused where a commit is unsafe
    parts = store is not None and stores.commit_in_parts(config, store, [t.output_rel for t in resolved.targets])
    check_pack(config, spec, file)
    folders = access.check_job(config, resolved, str(file))  # the runner can read and write it all
    if tenant is not None:  # its runners can be given the folders its outputs go to (tenant_mounts)
        fence.writable_outputs(area_rel(tenant), access.output_folders(resolved), str(file))
    try:  # videos probed and cut into segments
        run_as = video.probe_user(config.runner_uid_gid())  # ffprobe as the runner, never as root
        targets = video.target_refs(resolved.targets, spec, config.policy.limits, run_as, store)
    except FieldError as e:
        raise JobFileError(str(file), e.field, e.reason) from None
    if resolved.identities:  # a pairs job: each item swaps in its own person
        people = [None if t.identity is None else identity_id(t.identity) for t in resolved.targets]
        targets = [dataclasses.replace(r, identity=p) for r, p in zip(targets, people, strict=True)]
    admission.check_counts(config.policy, str(file), len(targets), sum(len(t.segments) for t in targets))
    plan = make_plan(job_id, targets, spec.chunk_size, parallel(spec), chunk_cap(config, spec, targets))
    shared = warmth.shares_lanes(job_id, plan, tenant)
    warm = warmth.warmth(config.runners.linger, spec, plan, tenant, parallel(spec), shared)  # linger, people_in_chunks
    return PreparedJob(file, spec, resolved, plan, job_id, folders, tenant=tenant, commit_in_parts=parts, **warm)


def store_for(config: Config, spec: JobSpec, tenant: str | None = None) -> Any:
    """The object store, made (its credentials file read) only for a job that may name s3:// objects;
    for a tenant's job, bound to its area (tenants.<t>.s3) and reached with the tenant's credentials
    (Config.s3), or none when it has no area."""
    s3 = config.s3(tenant)
    if s3 is None or not (remote.s3_fields(spec) or spec.pairs_file is not None):
        return None
    from controller.storage.s3 import S3Store, make_client  # boto3: imported only by jobs that use it
    from controller.storage.tenant import TenantStore

    if tenant is None:
        return S3Store.from_settings(s3)
    area = config.tenants[tenant].s3
    assert area is not None  # Config.s3 gives none for a tenant without an area
    return TenantStore(s3, make_client(s3), area)


def output_links(config: Config, tenant: str | None = None) -> Callable[[str], str | None] | None:
    """For report.json: an s3:// output's presigned GET link (signed here with the job's credentials:
    the tenant's own for a tenant's job, Config.s3; valid storage.s3.link_ttl); None when no link can
    be made (the credentials file unreadable: said in the log, not the report)."""
    s3 = config.s3(tenant)
    if s3 is None:
        return None
    made: list[Any] = []

    def link(url: str) -> str | None:
        from controller.storage.s3 import S3Store

        try:
            if not made:
                made.append(S3Store.from_settings(s3))
            return str(made[0].presign_get(S3Url.parse(url)))
        except (FfswarmError, ValueError):
            return None

    return link


def uses_s3(job: PreparedJob) -> bool:
    """Whether the job's runners read or write the object store."""
    if job.resolved is not None:
        return job.resolved.uses_s3
    return bool(remote.s3_fields(job.spec)) or any(is_s3(i.input) or is_s3(i.output) for i in job.plan.items)


def check_same_job(config: Config, job_id: str, file: Path) -> None:
    """A job file continues a run only if it is the file that started it: never merged into
    another's run (its hooks, retries, placement and image would take over that job)."""
    existing = RunDir(config.data_root, job_id)
    if not existing.exists():
        return
    if existing.job_digest() != hashlib.sha256(file.read_bytes()).hexdigest():
        raise JobFileError(str(file), "name", f"job {job_id} exists with a different job file; use --new")


def chunk_cap(config: Config, spec: JobSpec, targets: Sequence[TargetRef]) -> int:
    """The largest chunk `auto` makes for this job: from what earlier jobs with its pack and
    providers measured (controller/run/timings.py), for photos; AUTO_MAX_CHUNK otherwise."""
    if spec.chunk_size != "auto" or any(t.kind == "video" for t in targets):
        return AUTO_MAX_CHUNK
    timing = timings.lookup(config.data_root, spec.models, spec.providers)
    return timing.chunk_cap(float(spec.timeout)) if timing else AUTO_MAX_CHUNK


def _rel(config: Config, p: Path | S3Url) -> str:
    if isinstance(p, S3Url):
        return str(p)
    return p.resolve().relative_to(config.data_root).as_posix()


_TUNING = typing.get_type_hints(ManifestSettings)  # a grouped setting's value object (masks: Masks …)


def job_file_settings(spec: JobSpec) -> dict[str, Any]:
    """The settings each job-file key fills (``manifest=`` beside its field, controller/job/spec.py)."""
    values = manifest_values(spec)
    return {k: _TUNING[k](**v) if isinstance(v, dict) else v for k, v in values.items()}


def manifest_settings(config: Config, job: PreparedJob, ident: IdentityResult | None = None) -> ManifestSettings:
    """With `ident`, the embeddings go into every manifest; without, runners read identity.json —
    unless the job's people are embedded by its chunks themselves (``people_in_chunks``)."""
    assert job.resolved is not None, "manifests are made at submit, from a resolved job"
    people = {identity_id(n): tuple(_rel(config, p) for p in ps) for n, ps in enumerate(job.resolved.identities)}
    return ManifestSettings(
        sources=() if people else tuple(_rel(config, s) for s in job.resolved.sources),
        identities=people,
        source_embedding=tuple(ident.source_embedding) if ident and ident.source_embedding else None,
        reference_embedding=ident.reference_embedding if ident else None,
        identity_timeout=None if ident or job.people_in_chunks else identity.wait_limit(config),
        **job_file_settings(job.spec),
        storage=storage_access(config, job.tenant, job.commit_in_parts) if job.resolved.uses_s3 else None,
        linger=job.linger,
    )


def runner_settings(config: Config, job: PreparedJob, image: str) -> RunnerSettings:
    res = job.spec.resources
    return RunnerSettings(
        job=job.job_id,
        image=image,
        constraints=admission.placement(config.policy, job.spec),
        nano_cpus=config.policy.limits.cpus * 10**9,
        gpu_kind=res.gpu_kind,
        gpus=res.gpus,
        memory_bytes=res.memory,
        volume=config.volume,
        user=config.runner_uid_gid(),
        data_mounts=data_mounts(config, job),
        **_storage_mounts(config, job),
    )


def data_mounts(config: Config, job: PreparedJob) -> tuple[DataMount, ...]:
    """What of the data root the job's runners see: a CLI job the whole root, a tenant's job only
    its area (writable where its outputs go), its run folder and its model pack (tenant_mounts); a
    tenant's pack or job that may run in a lane (``linger``, warmth.shares_lanes) its area's ``out/``
    writable and its tenant's folder of run folders in place of its own. A job whose id carries a
    tenant key but whose tenant is not known (its ``owner`` not believed: run_tenant) is refused: its
    runners never see more than one tenant's folders."""
    if job.tenant is None:
        if run_tenant_key(job.job_id) is not None:
            where = RunLayout.relative(job.job_id).owner
            why = "does not name the configured tenant whose key the job's id carries, so its runners are not started"
            raise UsageError(f"job {job.job_id}: {where} {why} (docs/operations.md#isolation)")
        return WHOLE_ROOT
    outputs = {posixpath.dirname(i.output) for i in job.plan.items if not is_s3(i.output)}
    lane = job.linger > 0 and warmth.shares_lanes(job.job_id, job.plan, job.tenant)  # takes later jobs' chunks
    return tenant_mounts(
        area_rel(job.tenant),
        str(RunLayout.relative(job.job_id).dir),
        f"models/{job.spec.models}",
        outputs | {outputs_rel(job.tenant)} if lane else outputs,  # a lane's later chunks write under out/
        runs=str(tenant_runs_rel(job.tenant)) if lane else "",
    )


def storage_access(config: Config, tenant: str | None, in_parts: bool = False) -> StorageAccess | None:
    """The store as the job's manifests name it: the credentials file is the Swarm secret its
    runners mount (_storage_mounts), the tenant's own for a tenant's job (Config.s3); ``in_parts``:
    its conditional commits may go up in parts (controller/run/stores.py)."""
    s3 = config.s3(tenant)
    return None if s3 is None else dataclasses.replace(s3.access(), conditional_complete=in_parts)


def _storage_mounts(config: Config, job: PreparedJob) -> dict[str, Any]:
    """A job that uses s3://: the credentials secret (mode 0400, the runner's own) and the operator's
    network to the store (docs/storage.md#network). A tenant's job mounts only its tenant's secret
    (the cluster's when its area names none) and a tenant without an area none; a CLI job the cluster's."""
    s3 = config.s3(job.tenant)
    if s3 is None or not uses_s3(job):
        return {}
    uid, gid = config.runner_uid_gid().split(":")
    mount = SecretMount(s3.credentials_secret, uid, gid)
    return {"secrets": (mount,), "storage_networks": (s3.network,) if s3.network else ()}


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


def owner(config: Config) -> tuple[int, int]:
    return access.parse_ids(config.runner_uid_gid())


def start_run(config: Config, job: PreparedJob, image: str) -> RunDir:
    """The job's run folder (created unless it exists). Its identity is still pending: supervise()
    runs the identity step beside the first chunks (ensure_identity() for callers that don't).
    The job's missing output folders are made first, owned by the runner (checked in prepare)."""
    made = access.make_folders(config.data_root, job.folders, owner(config), config.controller_ids())
    if job.resolved is not None:  # its outputs claimed cluster-wide (controller/job/claims.py)
        try:
            claims.claim(
                config.data_root,
                job.job_id,
                [t.output_rel for t in job.resolved.targets],
                str(job.file),
                config.controller_ids(),
            )
        except FfswarmError:
            access.remove_folders(config.data_root, made)
            raise
    rundir = RunDir(config.data_root, job.job_id, owner(config), config.controller_ids())
    rundir.made_folders = made
    if (new := not rundir.exists()) or rundir.made_for_pack():  # made for a pack, run alone now (serve/unmade.py)
        assert job.resolved is not None
        rundir.make_dirs()
        if job.tenant is not None and run_tenant_key(job.job_id) is not None:  # its id carries only a key
            write_owner(rundir, job.tenant)  # before plan.json: a complete pack's folder names its tenant
        request = identity.request_for(config, job.spec, job.resolved, job.job_id, job.tenant)
        identity.prepare(rundir, request, step=not job.people_in_chunks)
        manifests = chunk_manifests(job.plan if new else rundir.plan(), manifest_settings(config, job))
        if not new:  # a packed job's folder: its own plan (as its state and status know it) and files are there
            rundir.write_manifests(manifests)
        else:
            rundir.create(job.file.read_bytes(), job.plan, manifests, Control(job.spec.max_concurrent), image)
    return rundir


def write_owner(rundir: RunDir, tenant: str) -> None:
    """The run folder's ``owner``: the tenant whose job (or pack) it is (read back by run_tenant)."""
    if not may_own(rundir.job, tenant):  # a tenant's pack's id carries its tenant's key
        raise ValueError(f"pack {rundir.job} is not tenant {tenant!r}'s: its id carries another key")
    rundir.write_file(rundir.layout.owner, f"{tenant}\n".encode())


def run_tenant(config: Config, job: str) -> str | None:
    """The tenant whose API job (or pack) ``job``'s run folder is: the ``owner`` the controller wrote
    there (write_owner), when the run folder and that file are the controller's own (reached
    without links; owned by root or the controller, never the runner; writable by no one else; the
    file a regular one with one link) and it names a configured tenant — for a tenant's pack, the
    one whose key its id carries (contract/layout.py may_own). None otherwise: the job is a CLI job
    (its outputs may not enter ``tenants/``, its runners see the whole data root), and a tenant's
    pack is refused its runners (data_mounts). ``ffswarm render``, ``resume`` and ``retry`` reopen a
    job with it."""
    if not config.tenants or not ID.fullmatch(job):
        return None
    trusted = owners.trusted_uids(config.controller_ids()[0], owner(config)[0])
    rundir = RunDir(config.data_root, job)
    raw = rundir.volume.read_trusted(rundir.path, rundir.layout.owner.name, trusted, 64, 0o022)
    name = raw.decode("ascii", "replace").strip() if raw else ""
    return name if owners.TENANT.fullmatch(name) and name in config.tenants and may_own(job, name) else None


def open_run(config: Config, job_id: str) -> tuple[PreparedJob, RunDir]:
    """A job as its run folder recorded it (frozen job file, plan): what resume and retry continue."""
    rundir = RunDir(config.data_root, job_id, owner(config), config.controller_ids())
    if not rundir.exists():
        raise UsageError(f"no job {job_id!r}: {rundir.path} has no {rundir.layout.plan.name}")
    job_file = rundir.layout.job_file
    spec = parse_job_text(rundir.read_job_file().decode("utf-8", "replace"), str(job_file))
    return PreparedJob(job_file, spec, None, rundir.plan(), job_id, tenant=run_tenant(config, job_id)), rundir
