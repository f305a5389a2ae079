"""Reading job files: ``yaml.safe_load`` only (job files are data), then the checked ``JobSpec``.

A reading error names the file, the field and the reason (``JobFileError``, exit 65).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from controller import yamlio
from controller.errors import FfswarmError, JobFileError
from controller.job import pairs
from controller.job.keys import key_names, readers
from controller.job.spec import JobSpec, Pair
from controller.settings.fields import (
    FieldError,
    Reader,
    check_keys,
    duplicate_key,
    same,
    show,
)

# the keys a job file must have: all four with source/targets; only name with pairs or pairs_file
REQUIRED = ("name", "source", "targets", "output")

_READERS: dict[str, Reader] = readers(JobSpec)


class JobFileErrors(JobFileError):
    """Every error of every job file of a submit (exit 65, or 66 when each is a missing input), as a
    compiler reports them: one line each with file, field and reason (and the line of a top-level
    key). ``file``, ``field`` and ``reason`` are the first one's."""

    def __init__(self, errors: Sequence[FfswarmError]) -> None:
        self.errors = tuple(errors)
        first = self.errors[0]
        super().__init__(*_parts(first))
        self.exit_code = 65 if any(isinstance(e, JobFileError) for e in self.errors) else first.exit_code
        Exception.__init__(self, "\n".join(_line(e) for e in self.errors))


def _parts(e: FfswarmError) -> tuple[str, str | None, str]:
    if isinstance(e, JobFileError):
        return e.file, e.field, e.reason
    return "", None, str(e)


def _line(e: FfswarmError) -> str:
    line = getattr(e, "line", None)
    return f"{e} (line {line})" if line else str(e)


def raise_all(errors: Sequence[FfswarmError]) -> None:
    """Nothing when there are none; one error as itself; several as JobFileErrors."""
    flat = [x for e in errors for x in (e.errors if isinstance(e, JobFileErrors) else (e,))]
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise JobFileErrors(flat)


_PLACEHOLDER: dict[str, object] = {"name": "x", "source": ("x.jpg",), "targets": ("x",), "output": "x"}
_PAIR_PLACEHOLDER = (Pair(("x.jpg",), "x.jpg", "x.jpg"),)


def _placeholders(data: dict[Any, Any]) -> dict[str, object]:
    """What a refused (or missing) required value is checked as, so that the others are checked."""
    if "pairs" not in data and "pairs_file" not in data:
        return _PLACEHOLDER
    out: dict[str, object] = {"name": "x"}
    out.update({"pairs": _PAIR_PLACEHOLDER} if "pairs" in data else {"pairs_file": "x.csv"})
    if "output" in data:
        out["output"] = "x"
    return out


def field_errors(data: dict[Any, Any]) -> tuple[JobSpec | None, list[FieldError]]:
    """Every field's error (not only the first): unknown keys, missing ones, each value, then the
    spec's own checks, re-run without each field it refused until it passes."""
    names = list(key_names(JobSpec))
    errors: list[FieldError] = []
    for key in data:
        try:
            check_keys({key: None}, names)
        except FieldError as e:
            errors.append(e)
    meant = {e.reason.split("'")[1] for e in errors if "did you mean" in e.reason}
    with_pairs = "pairs" in data or "pairs_file" in data  # instead of source/targets; output optional
    required = REQUIRED[:1] if with_pairs else REQUIRED
    placeholder = _placeholders(data)
    errors += [FieldError(k, "required key is missing") for k in required if k not in data and k not in meant]
    values: dict[str, Any] = dict(placeholder)  # a required key missing or refused: checked as if fine
    for key, value in data.items():
        if key == "pairs":
            values[key], refused = pairs.read_inline(value, has_output=bool(data.get("output")))
            errors += refused
            if refused:
                values[key] = placeholder[key]
        elif key in names:
            try:
                values[key] = _READERS.get(key, same)(value, key)
            except FieldError as e:
                errors.append(e)
    for _ in range(len(names) + 1):
        try:
            spec = JobSpec(**values)
        except FieldError as e:
            errors.append(e)
            top = re.split(r"[.\[]", e.field)[0] if e.field else None
            if top is None or top not in values:
                return None, errors
            if top in placeholder and values.get(top) is not placeholder[top]:
                values[top] = placeholder[top]
            else:
                del values[top]
            continue
        return (spec if not errors else None), errors
    return None, errors


def parse_job(
    data: object, file: str, lines: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
) -> JobSpec:
    """A job from already-parsed YAML data; ``file`` names it in errors (every error of the file:
    JobFileErrors when there are several; ``lines``: where each top-level key is, for them, or how
    to find out, asked only when there are errors)."""
    if not isinstance(data, dict):
        # never the file's text: a key file read as a job is one string
        got = "an empty file" if data is None else "a string" if isinstance(data, str) else show(data)
        raise JobFileError(file, None, f"the top level must be a mapping of job fields, got {got}")
    spec, errors = field_errors(data)
    where: Mapping[str, int] = {}
    if errors:
        where = (lines() if callable(lines) else lines) or {}
    found = []
    for e in errors:
        err = JobFileError(file, e.field, e.reason)
        top = re.split(r"[.\[]", e.field)[0] if e.field else None
        err.line = where.get(top or "")  # type: ignore[attr-defined]
        found.append(err)
    raise_all(sorted(found, key=lambda x: getattr(x, "line", None) or len(where) + 10**6))  # as in the file
    assert spec is not None
    return spec


def key_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each top-level key; composes nodes only (as safe as safe_load)."""
    try:
        root = yamlio.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in root.value if isinstance(k, yaml.ScalarNode)}


def parse_job_text(text: str, file: str) -> JobSpec:
    """A job from the text of a job file (``yaml.safe_load``: tags like ``!!python/object`` fail)."""
    try:
        data = yamlio.load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        hint = " (job files are plain data: YAML tags are not allowed)" if "constructor" in str(e.problem) else ""
        problem = re.sub(r"'[^']*'|\"[^\"]*\"", "…", str(e.problem or "a syntax error"))  # quoted bytes of the file
        raise JobFileError(file, None, f"invalid YAML{where}: {problem}{hint}") from None
    except yaml.YAMLError:
        raise JobFileError(file, None, "invalid YAML") from None
    twice = duplicate_key(text)
    if twice is not None:
        raise JobFileError(file, twice[0], f"key written twice (again at line {twice[1]})")
    return parse_job(data, file, lambda: key_lines(text))  # the text composed again only for an error


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

    Names must be unique across them: a job's name is its id. Every file is read: the errors of all
    of them are raised together (JobFileErrors)."""
    jobs, errors = read_jobs(paths, max_bytes)
    raise_all(errors)
    return jobs


def read_jobs(
    paths: Sequence[Path], max_bytes: int | None = None
) -> tuple[list[tuple[Path, JobSpec]], list[JobFileError]]:
    """The good job files and the errors of the others (every file is read)."""
    files: list[Path] = []
    errors: list[JobFileError] = []
    for p in paths:
        if p.is_dir():
            found = (x for x in p.iterdir() if x.suffix.lower() in (".yaml", ".yml") and not x.name.startswith("."))
            files.extend(sorted(x for x in found if x.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            errors.append(JobFileError(str(p), None, "no such file or folder"))
    unique: dict[str, Path] = {}  # a file named twice (itself and its folder) is one job
    for f in files:
        unique.setdefault(os.path.realpath(f), f)
    if not unique and not errors:
        raise JobFileError(", ".join(str(p) for p in paths) or "(no paths)", None, "no job files (*.yaml, *.yml)")
    jobs: list[tuple[Path, JobSpec]] = []
    by_name: dict[str, Path] = {}
    for f in unique.values():
        try:
            spec = load_job_file(f, max_bytes)
        except JobFileErrors as e:
            errors.extend(x for x in e.errors if isinstance(x, JobFileError))
            continue
        except JobFileError as e:
            errors.append(e)
            continue
        if spec.name in by_name:
            errors.append(
                JobFileError(str(f), "name", f"{spec.name!r} is also the name of the job in {by_name[spec.name]}")
            )
            continue
        by_name[spec.name] = f
        jobs.append((f, spec))
    return jobs, errors
