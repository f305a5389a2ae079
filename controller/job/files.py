"""Reading job files: ``yaml.safe_load`` only (job files are data), then the checked ``JobSpec``.

A reading error names the file, the field and the reason (``JobFileError``, exit 65).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import yaml

from contract.manifest import FaceSelection, NoFacePolicy
from controller.errors import JobFileError
from controller.job.spec import (
    DetectorSettings,
    EnhancerSettings,
    JobSpec,
    MaskSettings,
    OnComplete,
    Resources,
    VideoSettings,
)
from controller.job.validate import (
    FieldError,
    Reader,
    as_enum,
    as_list,
    as_nested,
    check_keys,
    duplicate_key,
    parse_duration,
    parse_memory,
    same,
    show,
)

_REQUIRED = ("name", "source", "targets", "output")

_READERS: dict[str, Reader] = {
    "source": as_list("path", str_ok=True),
    "targets": as_list("glob", str_ok=True),
    "processors": as_list("processor"),
    "providers": as_list("provider"),
    "placement": as_list("constraint"),
    "faces": as_enum(FaceSelection, "face selection"),
    "no_face": as_enum(NoFacePolicy, "no-face policy"),
    "timeout": parse_duration,
    "video": as_nested(VideoSettings, {}),
    "resources": as_nested(Resources, {"memory": parse_memory}),
    "on_complete": lambda value, f: _on_complete(value, f),
    "detector": as_nested(DetectorSettings, {}),
    "mask": as_nested(MaskSettings, {}),
    "face_enhancer": as_nested(EnhancerSettings, {}),
}


def _on_complete(value: object, f: str) -> OnComplete:
    if isinstance(value, dict) and "command" in value:  # gone: a job file never names a program
        raise FieldError(
            f"{f}.command",
            "is no longer supported: a job names a hook the cluster's policy defines (did you mean 'hook'?)",
        )
    result: OnComplete = as_nested(OnComplete, {})(value, f)
    return result


def parse_job(data: object, file: str) -> JobSpec:
    """A job from already-parsed YAML data; ``file`` names it in errors."""
    try:
        if not isinstance(data, dict):
            got = "an empty file" if data is None else show(data)
            raise FieldError(None, f"the top level must be a mapping of job fields, got {got}")
        check_keys(data, (f.name for f in fields(JobSpec)))
        for key in _REQUIRED:
            if key not in data:
                raise FieldError(key, "required key is missing")
        return JobSpec(**{k: _READERS.get(k, same)(v, k) for k, v in data.items()})
    except FieldError as e:
        raise JobFileError(file, e.field, e.reason) from None


def parse_job_text(text: str, file: str) -> JobSpec:
    """A job from the text of a job file (``yaml.safe_load``: tags like ``!!python/object`` fail)."""
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        hint = " (job files are plain data: YAML tags are not allowed)" if "constructor" in str(e.problem) else ""
        raise JobFileError(file, None, f"invalid YAML{where}: {e.problem or e}{hint}") from None
    except yaml.YAMLError as e:
        raise JobFileError(file, None, f"invalid YAML: {e}") from None
    twice = duplicate_key(text)
    if twice is not None:
        raise JobFileError(file, twice[0], f"key written twice (again at line {twice[1]})")
    return parse_job(data, file)


def load_job_file(path: Path, max_bytes: int | None = None) -> JobSpec:
    """``max_bytes`` (policy.limits.job_file) is checked before anything is parsed."""
    try:
        if max_bytes is not None:
            with path.open("rb") as fh:
                raw = fh.read(max_bytes + 1)
            if len(raw) > max_bytes:
                size = max(path.stat().st_size, len(raw))
                raise JobFileError(
                    str(path),
                    None,
                    f"the file is {size} bytes, the limit is {max_bytes} (the cluster's policy.limits.job_file)",
                )
            text = raw.decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise JobFileError(str(path), None, "is not UTF-8 text") from None
    except OSError as e:
        raise JobFileError(str(path), None, f"cannot be read: {e.strerror or e}") from None
    return parse_job_text(text, str(path))


def load_jobs(paths: Sequence[Path], max_bytes: int | None = None) -> list[tuple[Path, JobSpec]]:
    """Job files named, or found in named folders (``*.yaml``/``*.yml``, not recursive), in order.

    Names must be unique across them: a job's name is its id.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = (x for x in p.iterdir() if x.suffix.lower() in (".yaml", ".yml") and not x.name.startswith("."))
            files.extend(sorted(x for x in found if x.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise JobFileError(str(p), None, "no such file or folder")
    unique: dict[str, Path] = {}  # a file named twice (itself and its folder) is one job
    for f in files:
        unique.setdefault(os.path.realpath(f), f)
    if not unique:
        raise JobFileError(", ".join(str(p) for p in paths) or "(no paths)", None, "no job files (*.yaml, *.yml)")
    jobs: list[tuple[Path, JobSpec]] = []
    by_name: dict[str, Path] = {}
    for f in unique.values():
        spec = load_job_file(f, max_bytes)
        if spec.name in by_name:
            raise JobFileError(str(f), "name", f"{spec.name!r} is also the name of the job in {by_name[spec.name]}")
        by_name[spec.name] = f
        jobs.append((f, spec))
    return jobs
