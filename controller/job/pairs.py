"""Job-file ``pairs`` and ``pairs_file``: each target with its own source.

``pairs:`` is read with the rest of the job file (controller/job/files.py); ``pairs_file:`` names a
CSV (``source,target[,output]``, an optional header row of those words) or JSONL file (one object
``{"source", "target", "output"?}`` per line; ``source`` may be a list of photos of one person)
under the data root, read when the job is resolved (controller/job/resolve.py): without following
a link, a regular file, at most MAX_FILE_BYTES, at most the policy's targets maximum of pairs, and
every row checked like an inline pair. Every bad row is reported at once (up to SHOWN_ERRORS),
each naming its line; never the file's content.

The rows name paths as the job file does, relative to the data root; a tenant's pairs file (an API
job's) is the tenant's own and names them relative to its area, which the API checks the job
against and `serve` resolves it in (under_folder). The API cannot rewrite the file as it rewrites
the job file's keys (controller/api/submit.py), and inlining its rows would outgrow the job file.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import posixpath
from pathlib import Path
from typing import Any

from controller.errors import JobFileError, MissingInputError
from controller.job.keys import path_keys
from controller.job.locations import under
from controller.job.spec import Pair
from controller.settings.fields import FieldError, check_keys, show
from controller.volume import UnsafePath, Volume

MAX_FILE_BYTES = 64 * 1024**2
SHOWN_ERRORS = 20  # bad rows named in one refusal; the rest are counted
_KEYS = ("source", "target", "output")
_PATH_KEYS = path_keys(Pair)


def pair_from_value(value: object, has_output: bool) -> Pair:
    """One pair as YAML or JSON gave it (a mapping), or FieldError naming the key."""
    if not isinstance(value, dict):
        raise FieldError(None, f"must be a mapping of source, target and output, got {show(value)}")
    check_keys(value, _KEYS)
    for key in ("source", "target"):
        if key not in value:
            raise FieldError(key, "required key is missing")
    source = value["source"]
    if isinstance(source, str):
        source = (source,)
    elif isinstance(source, list):
        source = tuple(source)
    else:
        raise FieldError("source", f"must be a photo or a list of photos of one person, got {show(source)}")
    output = value.get("output")
    pair = Pair(source=source, target=value["target"], output=output)
    if output is None and not has_output:
        raise FieldError("output", "is required: the job has no output template")
    return pair


def under_folder(folder: str, pair: Pair) -> Pair:
    """``pair`` with every path it names (Pair's ``path`` keys) taken as relative to ``folder`` of the
    data root (a tenant's area), as the data root names them; ``s3://`` URLs unchanged. The pair was
    checked as written, and a folder in front changes nothing those checks look at, so it is not
    checked again (that would double the cost of reading a big file)."""
    moved = copy.copy(pair)
    for key in _PATH_KEYS:
        object.__setattr__(moved, key, under(folder, getattr(pair, key)))
    return moved


def read_inline(value: object, has_output: bool) -> tuple[tuple[Pair, ...], list[FieldError]]:
    """``pairs:`` of a job file: the pairs, and every bad one's error (``pairs[3].target: …``)."""
    if not isinstance(value, list) or not value:
        return (), [FieldError("pairs", f"must be a non-empty list of pairs, got {show(value)}")]
    pairs: list[Pair] = []
    errors: list[FieldError] = []
    for i, row in enumerate(value):
        try:
            pairs.append(pair_from_value(row, has_output))
        except FieldError as e:
            errors.append(e.within(f"pairs[{i}]"))
    return tuple(pairs), errors


def read_file(
    root: Path, rel: str, file: str, *, has_output: bool, limit: int | None
) -> tuple[tuple[Pair, ...], tuple[int, ...], list[JobFileError]]:
    """The pairs of ``pairs_file`` (``rel``: relative to ``root``), the line of each, and every bad
    row's error; JobFileError when the file as a whole is unusable, MissingInputError when there is
    none."""
    try:
        data = Volume(root).read(rel, MAX_FILE_BYTES)
    except UnsafePath as e:
        raise JobFileError(file, "pairs_file", str(e)) from None
    except OSError as e:
        raise JobFileError(file, "pairs_file", f"{rel} cannot be read: {e.strerror or type(e).__name__}") from None
    if data is None:
        raise MissingInputError(f"{file}: pairs_file: {rel!r} does not exist under {root}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise JobFileError(file, "pairs_file", f"{rel} is not UTF-8 text") from None
    jsonl = posixpath.splitext(rel)[1].lower() == ".jsonl"
    rows = _jsonl_rows(text) if jsonl else _csv_rows(text)
    if not rows:
        raise JobFileError(file, "pairs_file", f"{rel} holds no pairs")
    if limit is not None and len(rows) > limit:
        reason = f"{rel} holds {len(rows)} pairs, over the limit of {limit} (the cluster's policy.limits.targets)"
        raise JobFileError(file, "pairs_file", reason)
    pairs: list[Pair] = []
    lines: list[int] = []
    errors: list[JobFileError] = []
    for line, row in rows:
        try:
            if isinstance(row, FieldError):
                raise row
            pairs.append(pair_from_value(row, has_output))
            lines.append(line)
        except FieldError as e:
            where = f"{e.field}: " if e.field else ""
            errors.append(JobFileError(file, "pairs_file", f"{rel} line {line}: {where}{e.reason}"))
    shown = errors[:SHOWN_ERRORS]
    if len(errors) > SHOWN_ERRORS:
        shown.append(JobFileError(file, "pairs_file", f"{rel}: {len(errors) - SHOWN_ERRORS} more bad rows not shown"))
    return tuple(pairs), tuple(lines), shown


Row = tuple[int, "dict[str, Any] | FieldError"]


def _csv_rows(text: str) -> list[Row]:
    rows: list[Row] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for cells in reader:
            line = reader.line_num
            cells = [c.strip() for c in cells]
            if not any(cells):
                continue
            if not rows and [c.lower() for c in cells] in (list(_KEYS[:2]), list(_KEYS)):
                continue  # the header row
            if not 2 <= len(cells) <= 3:
                rows.append((line, FieldError(None, f"{len(cells)} columns; a row is source,target[,output]")))
                continue
            row: dict[str, Any] = dict(zip(_KEYS, cells, strict=False))
            if row.get("output") == "":
                del row["output"]
            rows.append((line, row))
    except csv.Error as e:
        rows.append((reader.line_num, FieldError(None, f"not CSV ({e})")))
    return rows


def _jsonl_rows(text: str) -> list[Row]:
    rows: list[Row] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            rows.append((n, FieldError(None, "not a JSON object")))
            continue
        if not isinstance(value, dict):
            rows.append((n, FieldError(None, f"must be a JSON object, got {show(value)}")))
            continue
        rows.append((n, value))
    return rows
