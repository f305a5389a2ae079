"""``s3://`` paths of a job file at plan time (docs/storage.md): who may use them (a tenant's job only
its storage area, docs/api.md#object-storage), globs listed, single objects checked, all as job-file
errors naming the field.

The job file's own checks (the URL's form) are controller/job/spec.py's; here the store is asked.
Errors of the store itself keep their class: StorageAccessError (wrong credentials, a missing bucket:
exit 66, naming the bucket), StorageTemporaryError (75).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from contract.s3 import S3Url, is_s3
from controller.errors import JobFileError, MissingInputError
from controller.job.spec import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, JobSpec, Pair, TargetKind, item_field, target_kind
from controller.storage.area import StorageArea
from controller.storage.errors import ObjectMissing, TooManyObjects

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

__all__ = ["area_of", "check_allowed", "check_pair", "head", "is_s3", "list_targets", "s3_fields"]

NO_AREA = ("s3:// paths are not accepted in API jobs of a tenant without a storage area "
           "(tenants.<t>.s3 in the cluster's config)")  # fmt: skip
NOT_CONFIGURED = ("s3:// paths need object storage, and storage.s3 is not configured in the cluster's config "
                  "(docs/storage.md#config)")  # fmt: skip


def s3_values(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, URL) of every ``s3://`` object or template the job file names (``targets[2]``,
    ``pairs[0].output`` …), in the order of the file."""
    found: list[tuple[str, str]] = []
    for name in ("source", "targets"):
        values: tuple[str, ...] = getattr(spec, name)
        found += [(item_field(name, i, len(values)), v) for i, v in enumerate(values) if is_s3(v)]
    if is_s3(spec.output):
        found.append(("output", spec.output))
    for i, pair in enumerate(spec.pairs):
        found += [(f"pairs[{i}].source", p) for p in pair.source if is_s3(p)]
        found += [(f"pairs[{i}].{k}", getattr(pair, k)) for k in ("target", "output") if is_s3(getattr(pair, k))]
    return found


def s3_fields(spec: JobSpec) -> list[str]:
    """The fields of the job file that name ``s3://`` objects (``targets[2]``, ``pairs[0].output`` …)."""
    return list(dict.fromkeys(f for f, _ in s3_values(spec)))


def area_of(store: S3Store | None) -> StorageArea | None:
    """The tenant's area a store was made for (controller/storage/tenant.py); None: any bucket."""
    area = getattr(store, "area", None)
    return area if isinstance(area, StorageArea) else None


def check_allowed(spec: JobSpec, file: str, *, store: S3Store | None, tenant: str | None) -> None:
    """A job made for a tenant (``tenant`` set, or a store bound to a tenant's area) may name objects
    only in that tenant's area, and none without one; any other job needs ``storage.s3`` in the config.
    (A ``pairs_file``'s rows are checked as they are read: check_pair.)"""
    for field, text in s3_values(spec):
        check_url(field, text, file, store=store, tenant=tenant, template=field.endswith("output"))


def check_pair(pair: Pair, where: Callable[[int, str], tuple[str, str]], i: int, file: str, *,
               store: S3Store | None, tenant: str | None) -> None:  # fmt: skip
    """One row of a ``pairs_file`` (pair ``i``), as check_allowed checks the job file; ``where(i, key)``
    gives the field and the reason's prefix naming the row."""
    named = [("source", s) for s in pair.source] + [("target", pair.target), ("output", pair.output or "")]
    for key, text in named:
        if is_s3(text):
            field, prefix = where(i, key)
            check_url(field, text, file, store=store, tenant=tenant, template=key == "output", prefix=prefix)


def check_url(field: str, text: str, file: str, *, store: S3Store | None, tenant: str | None, template: bool,
              prefix: str = "") -> None:  # fmt: skip
    area = area_of(store)
    if area is not None:
        if not (area.holds_template(text) if template else _holds(area, text)):
            raise JobFileError(file, field, f"{prefix}{text} is outside tenant {area.tenant}'s storage area {area}")
    elif tenant is not None:
        raise JobFileError(file, field, prefix + NO_AREA)
    elif store is None:
        raise JobFileError(file, field, prefix + NOT_CONFIGURED)


def _holds(area: StorageArea, text: str) -> bool:
    try:
        return area.holds(S3Url.parse(text))
    except ValueError:
        return False


def list_targets(store: S3Store, text: str, field: str, file: str, limit: int) -> list[tuple[str, TargetKind]]:
    """A ``targets`` entry in the store: its objects (a glob listed, a plain key checked with HEAD),
    in key order, each with its kind; no match, an unusable object or more than ``limit`` is a
    JobFileError on ``field``."""
    url = S3Url.parse(text)
    if url.is_glob:
        try:
            found = [str(o.url) for o in store.list_matching(url, limit)]
        except TooManyObjects as e:
            raise JobFileError(file, field, str(e)) from None
        if not found:
            raise JobFileError(file, field, f"{text!r} matches no object in bucket {url.bucket!r}")
    else:
        found = [str(head(store, text, field, file))]
    out: list[tuple[str, TargetKind]] = []
    for obj in found:
        kind = target_kind(obj)
        if kind is None:
            supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
            raise JobFileError(file, field, f"{obj!r} is neither an image nor a video (supported: {supported})")
        out.append((obj, kind))
    return out


def head(store: S3Store, text: str, field: str, file: str, prefix: str = "") -> S3Url:
    """One object that must exist (a source photo, a pair's target); missing: MissingInputError
    naming the field, as the CLI does for a missing file."""
    url = S3Url.parse(text)
    try:
        store.head(url)
    except ObjectMissing:
        raise MissingInputError(f"{file}: {field}: {prefix}{text!r} does not exist") from None
    return url
