"""The runners' attempt records (contract/attempt.py), read back as untrusted input.

A runner writes ``attempts/<chunk>.a<n>.json`` when its models are loaded and when it ends; the
controller takes cold starts, providers and failure reasons from it. Only for an attempt without a
record (a runner that died before writing it: a crash at import, a bad image, an older runner) does
it fall back on the runner's log.

The file was written by another process on a shared volume: it is opened without following links,
read up to a size cap, validated field by field, and must name the job, chunk and attempt it is filed
under; anything else counts as no record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from contract.attempt import MAX_BYTES, AttemptRecord
from contract.errors import RecordError
from contract.exits import RunnerExit
from controller.run.failures import last_words
from controller.run.rundir import RunDir
from controller.volume import read_nofollow, write_atomic


def read_record(rundir: RunDir, chunk: str, attempt: int) -> AttemptRecord | None:
    """The record of one attempt; None when there is none, or none that can be trusted."""
    data = _read_capped(rundir.layout.attempt_record(chunk, attempt))
    if data is None:
        return None
    try:
        record = AttemptRecord.from_json(data)
    except RecordError:
        return None
    if (record.job, record.chunk, record.attempt) != (rundir.job, chunk, attempt):
        return None
    return record


def _read_capped(path: Path) -> bytes | None:
    """A regular file's bytes, not following a link, None past MAX_BYTES or on any error."""
    data = read_nofollow(path, MAX_BYTES + 1)
    return None if data is None or len(data) > MAX_BYTES else data


def cold_start(rundir: RunDir, chunk: str, attempt: int, log: Path) -> tuple[str, float] | None:
    """The provider and cold start of an attempt that loaded its models: from its record, else (no
    record) from the runner's "models loaded" log line."""
    record = read_record(rundir, chunk, attempt)
    if record is None:
        return models_loaded(log)
    if record.provider is None or not record.cold_start_s:
        return None
    return record.provider, record.cold_start_s


def failure_reason(rundir: RunDir, chunk: str, attempt: int, log_text: str) -> str | None:
    """The runner's own reason for an attempt's ending: its record's, once it wrote its ending; None
    while it has not (still running, or killed: the controller's reason stands); the log's last
    words for an attempt that left no record at all."""
    record = read_record(rundir, chunk, attempt)
    if record is None:
        return last_words(log_text)
    return record.reason if record.ended else None


def runner_reason(rundir: RunDir, chunk: str, attempt: int, service_logs: Callable[[], str]) -> str | None:
    """The runner's own reason for an attempt that failed: its attempt record's. A runner that died
    before writing one leaves its last words in its log; one that died before opening its log file
    (bad image, crash at import) still leaves them: ``service_logs`` (its service's) are copied into
    the run folder, since removing the service loses them."""
    path = rundir.log_path(chunk, attempt)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = service_logs()
        if text:
            write_atomic(path, text.encode(), rundir.owner)
    return failure_reason(rundir, chunk, attempt, text)


def recorded_exit(rundir: RunDir, chunk: str, attempt: int) -> int | None:
    """The exit code an attempt's record says it ended with (None: not ended, or no record); an
    ending that is no runner exit code (terminated) reads as -1."""
    record = read_record(rundir, chunk, attempt)
    if record is None or record.exit is None:
        return None
    try:
        return int(RunnerExit[record.exit])
    except KeyError:
        return -1


def models_loaded(log: Path) -> tuple[str, float] | None:
    """The fallback: the provider and cold start a runner logged; its "models loaded" line comes early."""
    try:
        with log.open(encoding="utf-8", errors="replace") as f:
            for _, line in zip(range(40), f, strict=False):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("event") == "models loaded" and rec.get("process_s"):
                    return str(rec.get("provider", "")), float(rec["process_s"])
    except OSError:
        return None
    return None
