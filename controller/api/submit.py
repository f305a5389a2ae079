"""``POST /v1/jobs``: a tenant's job, checked as the CLI checks a job file, handed to `serve`'s inbox.

The tenant writes paths relative to its area. The job is validated there — the same reader, policy
admission and resolution as `ffswarm submit` (controller/job/files.py, controller/policy.py,
controller/job/resolve.py), with the area standing as the data root, so nothing outside it can be
named — and then written to the inbox as an ordinary job file v1 whose paths are the same ones seen
from the data root (``tenants/<t>/…``), exactly as `ffswarm submit --detach` writes one: the keys the
job file's definition marks as paths (controller/job/keys.py path_keys). A ``pairs_file`` is the
tenant's own file and stays as written: `serve` reads its rows in the tenant's area
(controller/job/pairs.py). The owner record (controller/api/area.py) is written before the job
file, so the job is never unowned.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from contract.layout import PACK_PREFIX
from contract.s3 import is_s3
from controller import policy as admission
from controller import yamlio
from controller.api import quota
from controller.api.accept import Accepted, accept_json, hand_over, inbox, settle
from controller.api.area import Area, new_job_id
from controller.api.errors import ApiError
from controller.api.objects import Objects
from controller.api.quota import RETRY_AFTER
from controller.api.slow import Lent
from controller.api.sweep import Staging
from controller.api.unzip import Unpacked, ZipLimits, unpack
from controller.api.uploads import Budget, Part, Upload, too_large
from controller.apiconfig import Tenant
from controller.config import Config
from controller.errors import FfswarmError, JobFileError
from controller.folder import Folder
from controller.job import access, fence, remote
from controller.job.files import JobFileErrors, parse_job
from controller.job.keys import path_keys
from controller.job.locations import under
from controller.job.owners import OUTPUTS
from controller.job.pack_checks import check_pack
from controller.job.resolve import resolve_job
from controller.job.spec import JobSpec, Pair
from controller.storage.errors import StorageTemporaryError
from controller.storage.settings import S3Settings

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

_NAME = re.compile(r"[a-z0-9-]{1,31}")
_PATH_KEYS = path_keys(JobSpec)  # rebased from the area to the data root (pairs_file too; its rows stay the tenant's)
_PAIR_PATH_KEYS = path_keys(Pair)


def _name(data: Mapping[str, Any]) -> str:
    name = data.get("name", "job")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ApiError(422, "invalid_job", "must be 1 to 31 characters of a-z, 0-9 and - (ids keep 21)", field="name")
    if f"{name}-".startswith(PACK_PREFIX):  # the id would read as a pack's (contract/layout.py run_rel)
        why = f"must not be pack or start with {PACK_PREFIX!r}: those are packs' ids"
        raise ApiError(422, "invalid_job", why, field="name")
    return name


def fresh_id(area: Area, name: str) -> str:
    for _ in range(20):
        job = new_job_id(area.tenant, name)
        if not area.id_taken(job):
            return job
    raise ApiError(503, "busy", "no free job id was found; try again", headers={"Retry-After": "1"})


def _to_root(value: Any, area: str) -> Any:
    """A path key's value as the data root names it; an ``s3://`` URL is the same everywhere."""
    if isinstance(value, list):
        return [_to_root(v, area) for v in value]
    if isinstance(value, dict):  # one of `pairs`: the paths it names
        return {k: under(area, v) if k in _PAIR_PATH_KEYS else v for k, v in value.items()}
    return under(area, value)


def _errors(e: JobFileError, area: Area) -> ApiError:
    """The CLI's words (file, field, reason), with every error listed when there are several."""
    first = e.errors[0] if isinstance(e, JobFileErrors) else e
    field = first.field if isinstance(first, JobFileError) else None
    every = list(e.errors) if isinstance(e, JobFileErrors) else [e]
    lines = [str(x) for x in every]
    fields = [(x.field, tenant_text(x.reason, area)) for x in every if isinstance(x, JobFileError) and x.field]
    return ApiError(422, "invalid_job", tenant_text("; ".join(lines), area), field=field, errors=fields)


def tenant_text(text: str, area: Area) -> str:
    """Paths as the tenant knows them: relative to its area, never this host's data root."""
    for full, shown in ((str(area.path) + "/", ""), (str(area.path), "your area"), (area.rel + "/", "")):
        text = text.replace(full, shown)
    return text.replace(str(area.root) + "/", "").replace(str(area.root), "the data root")


def _store(config: Config, area: Area, spec: JobSpec, objects: Objects | None) -> S3Store | None:
    """The store bound to the tenant's area, for a job that may name objects; None without an area
    (then any s3:// path is refused, remote.check_allowed)."""
    if area.s3 is None or config.storage.s3 is None or not (remote.s3_fields(spec) or spec.pairs_file):
        return None
    return (objects or Objects(config.storage.s3)).store(area.s3)


def validate(config: Config, area: Area, data: dict[str, Any], job: str, objects: Objects | None = None) -> str:
    """The job checked inside the area (and the tenant's part of the store); returns the inbox job
    file's text (paths from the data root)."""
    try:
        spec = parse_job(data, "job")
        store = _store(config, area, spec, objects)
        remote.check_allowed(spec, "job", store=store, tenant=area.tenant)  # a tenant has its areas only
        admission.check_job(config.policy, spec, "job", config.webhooks(area.tenant))
        limit = config.policy.limits.targets
        resolved = resolve_job(spec, area.path, "job", job_id=job, max_pairs=limit, store=store)
        admission.check_counts(config.policy, "job", len(resolved.targets), 0)
        outputs = (f"{area.rel}/{f}" for f in access.output_folders(resolved))  # from the area here
        fence.writable_outputs(area.rel, outputs)  # its runner can be given the folders it writes
        check_pack(config, spec, Path("job"))
    except JobFileError as e:
        raise _errors(e, area) from None
    except StorageTemporaryError as e:  # the store did not answer: nothing was accepted, try again
        raise ApiError(503, "storage_unavailable", e.reason, headers={"Retry-After": RETRY_AFTER}) from None
    except FfswarmError as e:  # a missing input or pack: the CLI's words, paths as the tenant knows them
        raise ApiError(422, "invalid_job", tenant_text(str(e), area)) from None
    text = yamlio.dump(rebased(data, area.rel), sort_keys=False, allow_unicode=True)
    if len(text.encode()) > config.policy.limits.job_file:
        raise ApiError(422, "invalid_job", f"the job file would be over {config.policy.limits.job_file} bytes")
    return text


def rebased(data: dict[str, Any], area: str) -> dict[str, Any]:
    """The job's fields with every path as the data root names it (``tenants/<t>/…``): what serve
    reads back from the inbox file (the dump of JSON data loads as it). Not parsed again: a job
    valid in its area stays valid with its paths behind the area's folder (no check a prefix can
    fail: no ``..``, no leading ``/``, the same file names and placeholders)."""
    return {k: (_to_root(v, area) if k in _PATH_KEYS else v) for k, v in data.items()}


def default_output(area: Area, data: Mapping[str, Any], job: str) -> str:
    """``out/<job>/{stem}{ext}`` in the tenant's area; in its part of the store (``<s3 area>out/<job>/…``)
    when every target it names is an object there (``targets``, or every inline pair's ``target``)."""
    rel = f"{OUTPUTS}/{job}/{{stem}}{{ext}}"
    targets = data.get("targets", [])
    targets = [targets] if isinstance(targets, str) else targets
    pairs = data.get("pairs")
    if isinstance(pairs, list) and pairs:
        targets = [p.get("target") if isinstance(p, dict) else None for p in pairs]
    in_store = isinstance(targets, list) and targets and all(isinstance(t, str) and is_s3(t) for t in targets)
    return area.s3.url(rel) if area.s3 is not None and in_store else rel


def submit_json(
    config: Config,
    tenant: Tenant,
    area: Area,
    data: object,
    objects: Objects | None = None,
    slot: quota.Reservation | None = None,
) -> Accepted:
    """``slot``: the request's job slot (quota.reserve), taken here when not given; released by
    whoever took it unless the job is handed over."""
    if slot is None:
        with quota.reserve(config, tenant, area) as own:
            return submit_json(config, tenant, area, data, objects, own)
    job, text = checked_json(config, area, data, objects)
    return accept_json(config, area, job, text, slot).settle(config.data_root)


def json_id(area: Area, data: object) -> str:
    """A new id for a JSON submit's job, carrying its ``name`` (422 when that is not one)."""
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_job", "the body must be a JSON object of job fields")
    return fresh_id(area, _name(data))


def checked_json(
    config: Config, area: Area, data: object, objects: Objects | None = None, job: str | None = None
) -> tuple[str, str]:
    """(the job's id — ``job`` when given, else a new one —, its inbox file's text): the slow half of
    a JSON submit (globs resolved, inputs checked)."""
    job = job or json_id(area, data)
    assert isinstance(data, dict)  # json_id refused anything else
    fields = {**data, "name": job}
    fields.setdefault("output", default_output(area, data, job))
    return job, validate(config, area, fields, job, objects)


_MAGIC = re.compile(r"[*?[]")  # a glob's pattern characters (controller/job/paths.py safe_glob)


def walks(data: object) -> bool:
    """Whether checking a JSON submit may walk folders or read much: a glob or an ``s3://`` listing
    among its targets, or a ``pairs_file``. Only those are worth a worker process; checking a few
    named files costs less than the hop to one."""
    if not isinstance(data, dict):
        return False
    targets = data.get("targets")
    named = [targets] if isinstance(targets, str) else targets if isinstance(targets, list) else []
    return "pairs_file" in data or any(isinstance(t, str) and (_MAGIC.search(t) or is_s3(t)) for t in named)


def quick(data: object) -> bool:
    """Whether checking a JSON submit needs neither a worker process (``walks``) nor the store (an
    ``s3://`` anywhere in its values): then it is one intake step (controller/api/intake.py)."""
    return not walks(data) and not _names_store(data)


def _names_store(value: object) -> bool:
    if isinstance(value, dict | list):
        return any(_names_store(v) for v in (value.values() if isinstance(value, dict) else value))
    return is_s3(value)


def checked_json_apart(config: Config, area: Area, data: object) -> tuple[str, str]:
    """``checked_json`` as a slow worker process runs it (controller/api/slow.py ``run_apart``): the
    store reached through that process's own clients."""
    return checked_json(config, area, data, _worker_objects(config.storage.s3))


@functools.cache
def _worker_objects(settings: S3Settings | None) -> Objects:
    return Objects(settings)


def options(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        data = yamlio.load(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, yaml.YAMLError):
        raise ApiError(422, "invalid_job", "the job part is not JSON", field="job") from None
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_job", "the job part must be a JSON object", field="job")
    for key in ("source", "targets"):
        if key in data:
            raise ApiError(422, "invalid_job", "comes from the uploaded files, not the job part", field=key)
    return data


def request_budget(
    config: Config,
    tenant: Tenant,
    area: Area,
    slot: quota.Reservation | None = None,
    declared: str | None = None,
    book: quota.QuotaBook = quota.BOOK,
) -> Budget:
    """The bytes one upload request may leave in the area, its files and every archive's unpacked
    bytes together: the least of ``api.max_request_bytes``, the tenant's ``quota.upload`` and what is
    left of its ``quota.stored``. The one place the budget is decided.

    With the request's ``slot``, every byte charged to the budget is held in the tenant's ledger
    before it is written; the body's ``declared`` length (its Content-Length, up to the cap) is held
    at once, 429 when the area has no room for it."""
    left = tenant.quota.stored - book.stored(area, tenant.quota.stored)
    limits = [
        (config.api.max_request_bytes, "api.max_request_bytes"),
        (tenant.quota.upload, "this tenant's upload cap per request"),
        (left, "what is left of this tenant's stored quota"),
    ]
    cap, why = min(limits, key=lambda x: x[0])
    budget = Budget(max(cap, 0), why)
    if slot is not None:
        budget.claim = quota.claim(slot, tenant, area)
        held = min(int(declared), budget.cap) if declared is not None and declared.isdigit() else 0
        if held:  # held against other requests while it runs
            quota.reserve_bytes(slot, tenant, held)
            budget.held = held
    return budget


def unpack_targets(config: Config, lent: Lent, files: list[Part], budget: Budget) -> Targets:
    """The uploaded ``files`` (staged in the lent staging folder) with every archive among the
    targets unpacked beside it and then removed, each checked against the ``api.max_zip_*`` limits
    (``max_zip_bytes`` for all archives together) and its bytes charged to ``budget`` (and held
    through its claim). Plain data in and out: a slow worker process runs it (controller/api/slow.py
    ``run_apart``), and closes what was lent to it (the folder, the claim's reservation)."""
    try:
        with Folder(lent.fd, "the upload") as staged:
            return _unpack_targets(config, staged, files, budget)
    finally:
        budget.let_go()


def _unpack_targets(config: Config, staged: Folder, files: list[Part], budget: Budget) -> Targets:
    api = config.api
    limits = ZipLimits(api.max_zip_entries, api.max_zip_bytes, api.max_zip_ratio, api.max_zip_depth,
                       api.max_zip_name_bytes, api.max_zip_path_bytes)  # fmt: skip
    if not any(p.field == "source" for p in files):
        raise ApiError(422, "invalid_job", "at least one source photo is required", field="source")
    if not any(p.field == "targets" for p in files):
        raise ApiError(422, "invalid_job", "at least one target file is required", field="targets")
    out = Targets(budget)
    with staged.sub("targets") as folder:
        for p in files:
            if p.field != "targets":
                continue
            if p.kind != "zip":
                out.files.append(p.name)
                continue
            got: Unpacked = unpack(folder, p.name, p.name, limits, budget)
            limits = replace(limits, total_bytes=limits.total_bytes - got.total)  # per request
            out.notes += got.skipped
            out.files += got.files
            folder.remove(p.name)
            budget.release(p.size)
    return out


@dataclass
class Targets:
    """What ``unpack_targets`` left: the targets' files (relative to ``targets/``), notes for people
    (entries skipped), and the request's budget with the unpacked bytes charged and held."""

    budget: Budget
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def finish_upload(
    config: Config,
    area: Area,
    slot: quota.Reservation,
    job: str,
    up: Upload,
    unpacked: Targets | Budget,
    staging: Staging,
    objects: Objects | None = None,
) -> Accepted:
    """The rest of an upload, in one step: its id (with the name its job part asks for), its slot
    bound, its targets (``unpacked`` by ``unpack_targets`` when an archive was among them, else
    listed here within the request's budget), then ``submit_upload``, and the slot committed."""
    opts = options(up.job)
    if "name" in opts:  # the id carries the name the caller chose
        job = fresh_id(area, _name(opts))
    slot.bind(job)  # before the inbox: the job's end finds its slot
    got = unpacked if isinstance(unpacked, Targets) else _unpack_targets(config, up.folder, up.files, unpacked)
    accepted = submit_upload(config, area, job, up, got, opts, staging, objects)
    slot.commit()  # its reserved bytes given back: submit_upload counted them
    settle(inbox(config) / f"{accepted.job}.yaml")  # serve may take it at once
    return accepted


def submit_upload(
    config: Config,
    area: Area,
    job: str,
    up: Upload,
    unpacked: Targets,
    data: dict[str, Any],
    staging: Staging,
    objects: Objects | None = None,
) -> Accepted:
    """Uploaded files (staged in ``staging``, archives unpacked by ``unpack_targets``) checked
    against the budget by the bytes actually written, moved into ``uploads/<job>/``, then validated
    and handed over. Whatever fails, nothing of the job stays in the area."""
    placed = False
    budget, files, notes = unpacked.budget, unpacked.files, unpacked.notes
    sources = [p for p in up.files if p.field == "source"]
    try:
        written = up.folder.file_bytes()  # what is on the volume, whatever was counted on the way
        if written > budget.cap:
            raise too_large(budget, f"the upload ({written} bytes once unpacked)")
        if written > budget.held:  # more than the ledger let it write: never within the tenant's quota
            why = f"the upload ({written} bytes once unpacked) passed the {budget.held} bytes reserved for it"
            raise ApiError(413, "too_large", f"{why} in this tenant's stored quota")
        staging.place(job)
        placed = True
        rel = f"uploads/{job}"
        folders = {PurePosixPath("targets", f).parent.as_posix() for f in files}
        targets = sorted(f"{rel}/{d}/*" for d in folders)
        if not targets:
            raise ApiError(422, "invalid_job", "no photo or video among the targets", field="targets")
        stems = [PurePosixPath(f).stem for f in files]
        template = "{stem}{ext}" if len(stems) == len(set(stems)) else "{index}-{stem}{ext}"
        fields = {
            **data,
            "name": job,
            "source": [f"{rel}/source/{p.name}" for p in sources],
            "targets": targets,
        }
        fields.setdefault("output", f"{OUTPUTS}/{job}/{template}")
        text = validate(config, area, fields, job, objects)
        staging.confirm()
        hand_over(config, area, job, text, uploads=True)
        quota.BOOK.add_stored(area, written)
        return Accepted(job, tuple(notes))
    except BaseException:
        if placed:
            staging.discard(job)
        raise
