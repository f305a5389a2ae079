"""Where a job file's paths point: what a target is by its extension, the checks of photos, globs and
output templates (``output:``, a pair's ``output``), and a template expanded per target."""

from __future__ import annotations

import posixpath
import re
import string
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from contract.s3 import S3Url, is_s3
from controller.job.paths import check_relative
from controller.settings.fields import FieldError, check_str

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi")
PLACEHOLDERS = ("stem", "ext", "name", "index", "job", "dir")
DISTINCT_PLACEHOLDERS = ("stem", "name", "index")  # placeholders that tell targets apart


def relative(rel: str, f: str) -> str:
    """A path relative to the data root, checked, or FieldError naming ``f``."""
    try:
        return check_relative(rel, what=f)
    except ValueError as e:
        raise FieldError(f, str(e)) from None


def under(folder: str, value: Any) -> Any:
    """``value`` (a path, glob or output template, or a list or tuple of them; None stays None)
    written relative to ``folder``, as the data root names it: ``folder/value``. An ``s3://`` URL
    is the same everywhere."""
    if isinstance(value, str):
        return value if is_s3(value) else f"{folder}/{value}"
    if isinstance(value, (list, tuple)):
        return type(value)(under(folder, v) for v in value)
    return value


def within(folder: str, rel: str) -> str:
    """``rel`` (relative to the data root, inside ``folder``) as ``folder`` names it; an ``s3://``
    URL, or a path not inside ``folder``, as it is."""
    return rel[len(folder) + 1 :] if rel.startswith(folder + "/") else rel


class TargetKind(StrEnum):
    IMAGE = "image"
    VIDEO = "video"


def target_kind(path: str | PurePosixPath | Path) -> TargetKind | None:
    """What a file is by its extension (any case); None when ffswarm cannot process it."""
    suffix = posixpath.splitext(str(path))[1].lower()
    if suffix in IMAGE_EXTENSIONS:
        return TargetKind.IMAGE
    if suffix in VIDEO_EXTENSIONS:
        return TargetKind.VIDEO
    return None


def location(text: str, f: str) -> str:
    """A path relative to the data root, or an ``s3://bucket/key`` URL (a key glob allowed), checked."""
    if not is_s3(text):
        return relative(text, f)
    try:
        S3Url.parse(text)
    except ValueError as e:
        raise FieldError(f, str(e)) from None
    return text


def check_photo(value: object, f: str) -> None:
    if f == "reference" and is_s3(value):
        raise FieldError(f, "must be a file under the data root: an s3:// reference is not supported yet")
    location(check_str(value, f), f)
    if is_s3(value) and S3Url.parse(value).is_glob:
        raise FieldError(f, f"{value!r} is a glob; a source names photos, not globs")
    if target_kind(str(value)) is not TargetKind.IMAGE:
        raise FieldError(f, f"{value!r} is not an image ({' '.join(IMAGE_EXTENSIONS)})")


def check_output(template: object, job: str) -> None:
    """Raises FieldError("output", …); a pair's output is checked the same way (``pairs[3].output``)."""
    if isinstance(template, dict):  # output: {stem}.png  is YAML for a mapping
        raise FieldError("output", "must be a string, got a mapping (quote a template that starts with '{')")
    template = check_str(template, "output")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise FieldError("output", f"{template!r} is not a valid template: {e}") from None
    for _literal, name, _spec, conversion in parts:
        if name is not None and name not in PLACEHOLDERS:
            known = " ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise FieldError("output", f"unknown placeholder {{{name}}} in {template!r} (known: {known})")
        if conversion:
            raise FieldError("output", f"conversions like !{conversion} are not supported in {template!r}")
    if is_s3(template):
        _check_s3_output(template)
    else:
        relative(template, "output")
    if template.endswith("/"):
        raise FieldError("output", f"{template!r} names a folder, not a file")
    try:
        expand_output(template, PurePosixPath("d/x.jpg"), index=0, job=job)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise FieldError("output", f"{template!r} cannot be expanded: {e}") from None


def _check_s3_output(template: str) -> None:
    """``s3://bucket/key-template``: the bucket is literal, the key template has no glob."""
    bucket, _, key = template[len("s3://") :].partition("/")
    if "{" in bucket or "}" in bucket or any(c in key for c in "*?"):
        raise FieldError("output", f"{template!r}: write the bucket out, and no glob (one object per target)")
    try:
        S3Url.parse(f"s3://{bucket}/{key or 'x'}")
    except ValueError as e:
        raise FieldError("output", str(e)) from None


_SLASHES = re.compile("/+")


def expand_output(template: str, rel: str | PurePosixPath, *, index: int, job: str) -> str:
    """The output path (relative to the root, normalised) that ``template`` gives one target.

    An empty ``{dir}`` (a target in the root) leaves no ``//`` and no leading ``/`` behind. String
    functions, not PurePath objects: this runs once per target, 100,000 times for a big job.
    """
    rel = str(rel)
    if is_s3(rel):  # an object's {dir} is its key's folder (without the bucket)
        rel = S3Url.parse(rel).key
    folder, name = posixpath.split(rel)
    stem, ext = posixpath.splitext(name)
    if is_s3(template):
        bucket, _, key = template[len("s3://") :].partition("/")
        text = _SLASHES.sub("/", key.format(stem=stem, ext=ext, name=name, index=index, job=job, dir=folder))
        try:
            return str(S3Url(bucket, text.lstrip("/")))
        except ValueError as e:
            raise ValueError(f"{template!r} gives no valid object for {str(rel)!r}: {e}") from None
    text = template.format(stem=stem, ext=ext, name=name, index=index, job=job, dir=folder)
    if text.endswith("/"):
        raise ValueError(f"{template!r} gives a folder for {str(rel)!r}")
    text = _SLASHES.sub("/", text).lstrip("/")
    if not text:
        raise ValueError(f"{template!r} gives an empty path for {str(rel)!r}")
    return posixpath.normpath(text)
