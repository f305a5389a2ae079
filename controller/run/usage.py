"""What a job used, as a platform bills it: GPU-seconds, items, bytes in and out (report.json ``usage``).

GPU-seconds are measured by the runners, never by the controller's clock: each chunk attempt's wall
seconds (its attempt record's ``finished - started``, contract/attempt.py) times the GPUs the chunk
reserved (the job's ``resources.gpus``). Every attempt counts, failed and retried ones included: the
GPUs were held. An attempt whose runner never wrote its ending (killed, its node lost) counts up to
its last sign of life: its latest result line, else its models being loaded; one with no record at
all (an older runner, a crash at import) counts the span of its own result lines, else nothing and
is named ``untimed``. Each attempt counts at most the job's timeout plus STOP_GRACE. The identity
step runs without a GPU and is not counted.

Items are the report's counts (what the user submitted). Bytes in are the sizes of the distinct files
the runners read: each input of an item or video that has a result, and the job's source and
reference photos (identity-request.json); bytes out are the committed outputs, by the size their
runner recorded (else as found on the volume). Files are opened without following links.

Everything read here (attempt records, result lines, the run folder) was written where a runner
may write: it is parsed as hostile, and a value that does not check out counts as nothing.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from contract.attempt import AttemptRecord
from contract.identity import IdentityRequest
from contract.layout import parse_attempt_log, parse_results_name
from contract.paths import user_path
from contract.results import ItemResult
from controller.errors import FfswarmError
from controller.job.files import parse_job_text
from controller.job.spec import JobSpec, Resources
from controller.run.attempts import read_record
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.volume import Volume

STOP_GRACE = 120.0  # seconds past the job's timeout an attempt may run while it is stopped
ITEM_KEYS = ("ok", "no_face", "failed", "cancelled")
NUMBER_KEYS = ("gpu_seconds", "runner_seconds", "attempts", "attempts_untimed", "bytes_in", "bytes_out")
MAX_REQUEST = 16 * 1024**2


def job_resources(rundir: RunDir) -> tuple[int, float]:
    """(GPUs each chunk reserved, the longest an attempt may count) from the run folder's job file;
    the job file defaults when it cannot be read (a run folder of an older version)."""
    try:
        spec = parse_job_text(rundir.read_job_file().decode("utf-8", "replace"), "job.yaml")
    except (FfswarmError, ValueError, TypeError, KeyError, RecursionError):
        return Resources().gpus, JobSpec.timeout + STOP_GRACE
    return spec.resources.gpus, spec.timeout + STOP_GRACE


def attempts_of(rundir: RunDir) -> set[tuple[str, int]]:
    """Every (chunk, attempt) the run folder shows: an attempt record, a results file or a log."""
    found: set[tuple[str, int]] = set()
    layout = rundir.layout
    for folder, parse in ((layout.attempts_dir, _record_name), (layout.results_dir, parse_results_name),
                          (layout.logs_dir, parse_attempt_log)):  # fmt: skip
        try:
            names = [e.name for e in os.scandir(folder) if e.is_file(follow_symlinks=False)]
        except OSError:
            continue
        for name in names:
            whose = parse(name)
            if whose is not None and whose.attempt > 0:
                found.add((whose.chunk, whose.attempt))
    return found


def _record_name(name: str) -> Any:
    if not name.endswith(".json"):
        return None
    return parse_attempt_log(name[: -len(".json")] + ".log")


def attempt_seconds(record: AttemptRecord | None, lines: Iterable[ItemResult], cap: float) -> float | None:
    """One attempt's runner wall seconds (None: it left no timing at all), at most ``cap``."""
    own = [r for r in lines if not r.cached and _finite(r.started, r.finished) and r.finished >= r.started > 0]
    if record is not None:
        if record.finished is not None:
            end = record.finished
        else:  # never wrote its ending: up to its last sign of life
            end = max([record.started, record.models_loaded_at or 0.0, *(r.finished for r in own)])
        seconds = end - record.started
    elif own:
        seconds = max(r.finished for r in own) - min(r.started for r in own)
    else:
        return None
    return min(max(seconds, 0.0), cap)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def gpu_time(rundir: RunDir, cap: float) -> tuple[dict[str, float], int]:
    """Each attempt's runner seconds (``c0007.a2`` → s) and how many attempts left no timing."""
    lines: dict[tuple[str, int], list[ItemResult]] = {}
    attempts = attempts_of(rundir)
    for chunk in {chunk for chunk, _ in attempts}:
        for r in rundir.chunk_results(chunk).lines:
            lines.setdefault((chunk, r.attempt), []).append(r)
    seconds: dict[str, float] = {}
    untimed = 0
    for chunk, attempt in sorted(attempts):
        s = attempt_seconds(read_record(rundir, chunk, attempt), lines.get((chunk, attempt), ()), cap)
        if s is None:
            untimed += 1
            s = 0.0
        seconds[f"{chunk}.a{attempt}"] = round(s, 3)
    return seconds, untimed


def _size(vol: Volume, rel: str) -> int:
    """A regular file's size under the data root (0: none, a link on the way, not a regular file)."""
    try:
        fd = vol.open(rel, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, FfswarmError):
        return 0
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _sources(rundir: RunDir) -> set[str]:
    """The job's source and reference photos, relative to the data root (none without a request)."""
    try:
        data = rundir.read_file(rundir.layout.identity_request, MAX_REQUEST)
        if data is None:
            return set()
        request = IdentityRequest.from_json(data.decode("utf-8"))
    except (FfswarmError, ValueError, TypeError, KeyError, RecursionError):
        return set()
    paths = [*request.sources, *(p for who in request.identities.values() for p in who.sources)]
    if request.reference is not None:
        paths.append(request.reference)
    return {user_path(p) for p in paths}


def bytes_in_out(fold: Fold, rundir: RunDir) -> tuple[int, int]:
    vol = Volume(rundir.data_root)
    plan = fold.plan
    read = {plan.item(i).input for i in fold.results if plan.item(i).kind == "image"}
    read |= {v.input for v in plan.videos if any(s in fold.results for s in v.segments)}
    if fold.results:
        read |= _sources(rundir)
    out = 0
    for item in plan.items:
        r = fold.result(item.id)
        if item.kind == "image" and r is not None and not r.status.is_failure() and r.output is not None:
            out += r.size if r.size is not None else _size(vol, item.output)
    for video in plan.videos:
        joined = fold.joined.get(video.id)
        if joined is not None and not joined.status.is_failure() and joined.output is not None:
            out += _size(vol, video.output)
    return sum(_size(vol, rel) for rel in sorted(read)), out


def measure(fold: Fold, rundir: RunDir, counts: Mapping[str, int], spec: JobSpec | None = None) -> dict[str, Any]:
    """The ``usage`` object of report.json; ``counts``: the report's item counts; ``spec``: the
    job's, when the caller holds it (else read from the run folder's job file)."""
    gpus, cap = job_resources(rundir) if spec is None else (spec.resources.gpus, spec.timeout + STOP_GRACE)
    seconds, untimed = gpu_time(rundir, cap)
    runner = sum(seconds.values())
    bytes_in, bytes_out = bytes_in_out(fold, rundir)
    return {
        "gpus_per_chunk": gpus,
        "gpu_seconds": round(runner * gpus, 3),
        "runner_seconds": round(runner, 3),
        "attempts": len(seconds),
        "attempts_untimed": untimed,
        "attempt_seconds": seconds,
        "items": {k: int(counts.get(k, 0)) for k in ITEM_KEYS},
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
    }


def of_report(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A report's usage checked (report.json is the controller's, yet on a shared volume): the
    totals only, or None when it has none (no report yet, or one written before usage existed)."""
    raw = report.get("usage") if isinstance(report, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    out: dict[str, Any] = {}
    for key in NUMBER_KEYS:
        value = raw.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            return None
        out[key] = value
    items = raw.get("items")
    if not isinstance(items, Mapping):
        return None
    counts = {k: items.get(k) for k in ITEM_KEYS}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
        return None
    return {**out, "items": counts}


def of_rundir(rundir: RunDir) -> dict[str, Any] | None:
    """The usage in the job's report.json (as of that report), or None."""
    try:
        return of_report(rundir.report())
    except FfswarmError:
        return None


def zero() -> dict[str, Any]:
    return {**dict.fromkeys(NUMBER_KEYS, 0), "items": dict.fromkeys(ITEM_KEYS, 0)}


def add(total: Mapping[str, Any], one: Mapping[str, Any]) -> dict[str, Any]:
    """Two checked usages (of_report) summed, as a tenant's usage over its jobs."""
    out: dict[str, Any] = {k: total[k] + one[k] for k in NUMBER_KEYS}
    for k in ("gpu_seconds", "runner_seconds"):
        out[k] = round(out[k], 3)
    out["items"] = {k: total["items"][k] + one["items"][k] for k in ITEM_KEYS}
    return out
