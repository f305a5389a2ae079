"""``s3://`` paths of a job file at plan time (docs/storage.md): who may use them, globs listed,
single objects checked, all as job-file errors naming the field.

The job file's own checks (the URL's form) are controller/job/spec.py's; here the store is asked.
Errors of the store itself keep their class: StorageAccessError (wrong credentials, a missing bucket:
exit 66, naming the bucket), StorageTemporaryError (75).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract.s3 import S3Url, is_s3
from controller.errors import JobFileError, MissingInputError
from controller.job.spec import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, JobSpec, TargetKind, item_field, target_kind
from controller.storage.errors import ObjectMissing, TooManyObjects

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

__all__ = ["check_allowed", "head", "is_s3", "list_targets", "s3_fields"]


def s3_fields(spec: JobSpec) -> list[str]:
    """The fields of the job file that name ``s3://`` objects (``targets[2]``, ``pairs[0].output`` …)."""
    found: list[str] = []
    for name in ("source", "targets"):
        values: tuple[str, ...] = getattr(spec, name)
        found += [item_field(name, i, len(values)) for i, v in enumerate(values) if is_s3(v)]
    if is_s3(spec.output):
        found.append("output")
    for i, pair in enumerate(spec.pairs):
        found += [f"pairs[{i}].source" for s in pair.source[:1] if any(is_s3(p) for p in pair.source)]
        found += [f"pairs[{i}].{k}" for k in ("target", "output") if is_s3(getattr(pair, k))]
    return found


def check_allowed(spec: JobSpec, file: str, *, configured: bool, tenant: str | None) -> None:
    """An API tenant's job may use only its area; any other job needs ``storage.s3`` in the config.
    (A ``pairs_file``'s rows are checked as they are read: resolve.py.)"""
    fields = s3_fields(spec)
    if fields:
        refuse(fields[0], file, configured=configured, tenant=tenant)


def refuse(field: str, file: str, *, configured: bool, tenant: str | None) -> None:
    if tenant is not None:
        reason = "s3:// paths are not accepted in API jobs: a tenant's job may use only its area"
        raise JobFileError(file, field, reason)
    if not configured:
        raise JobFileError(file, field, "s3:// paths need object storage, and storage.s3 is not configured "
                           "in the cluster's config (docs/storage.md#config)")  # fmt: skip


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
        if kind is TargetKind.VIDEO:
            raise JobFileError(file, field, f"{obj!r} is a video: videos in object storage are not supported yet "
                               "(give it under the data root)")  # fmt: skip
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
