"""The attempt record: what a runner tells the controller about one chunk attempt, as typed data.

``attempts/<chunk>.a<n>.json`` (contract/layout.py), written by the runner atomically (temp name,
then rename) twice: when its models are loaded (so the cold start is known even if the attempt
later dies) and when it ends, with its exit kind and reason. The controller reads it for timings
(cold start, provider) and failure reasons instead of the runner's log lines, whose wording is for
people and free to change. Only an attempt that died before writing its record leaves the controller
to fall back on the log.

The controller reads it back from a shared volume another process wrote: ``from_json`` checks every
field, refuses unknown ones and absurd values, and its errors name fields, never the values read.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from contract.errors import RecordError
from contract.exits import RunnerExit
from contract.manifest import PROVIDERS

SCHEMA_VERSION = 1
TERMINATED = "TERMINATED"  # stopped by SIGTERM: no RunnerExit, the engine reports 143
EXIT_KINDS = frozenset({e.name for e in RunnerExit} | {TERMINATED})
MAX_BYTES = 64 * 1024  # a record is a few hundred bytes; a reader refuses anything larger
MAX_REASON = 2000
MAX_ATTEMPT = 100_000
MAX_THREADS = 4096
MAX_ITEMS = 10_000_000
MAX_COLD_START = 86_400.0
MAX_TIME = 32_503_680_000.0  # unix time of the year 3000
CLOCK_SLACK = 5.0  # seconds ``finished`` may precede ``started`` (a stepped wall clock)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PROCESS = re.compile(r"[0-9a-f]{16}")
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class AttemptRecord:
    """One chunk attempt as its runner saw it. Fields after ``started`` stay None/0 until known."""

    job: str
    chunk: str
    attempt: int
    started: float  # unix time the attempt began
    provider: str | None = None  # once models are loaded: "cuda" | "cpu"
    threads: int | None = None  # CPU threads the runner used
    cold_start_s: float | None = None  # process age when models were loaded: exec, imports, verify, load
    models_loaded_at: float | None = None  # unix time
    items_done: int = 0  # ok or no_face, cached included
    items_failed: int = 0
    exit: str | None = None  # once ended: a RunnerExit name, or TERMINATED
    reason: str | None = None  # why it failed, for people: files named relative to the data root
    finished: float | None = None  # unix time it ended
    # The runner process that ran it: a random id made at the process's start, so a lane's runner
    # (which runs several packs' attempts) is told apart from a fresh one by its records alone.
    process: str | None = None
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if _integer(self.schema) != SCHEMA_VERSION:
            raise RecordError(f"attempt record: unknown schema version (this controller reads {SCHEMA_VERSION})")
        for name in ("job", "chunk"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME.fullmatch(value):
                raise RecordError(f"attempt record: {name} must be a job or chunk id")
        _bounded_int(self.attempt, "attempt", 1, MAX_ATTEMPT)
        _time(self.started, "started")
        if self.provider is not None and self.provider not in PROVIDERS:
            raise RecordError(f"attempt record: provider must be one of {', '.join(PROVIDERS)}")
        if self.threads is not None:
            _bounded_int(self.threads, "threads", 1, MAX_THREADS)
        if self.cold_start_s is not None:
            _number(self.cold_start_s, "cold_start_s", 0.0, MAX_COLD_START)
        if self.models_loaded_at is not None:
            _time(self.models_loaded_at, "models_loaded_at")
        loaded = (self.provider is None, self.threads is None, self.models_loaded_at is None)
        if len(set(loaded)) != 1 or (self.cold_start_s is not None and self.provider is None):
            raise RecordError("attempt record: provider, threads and models_loaded_at come together")
        for name in ("items_done", "items_failed"):
            _bounded_int(getattr(self, name), name, 0, MAX_ITEMS)
        if self.exit is not None and self.exit not in EXIT_KINDS:
            raise RecordError("attempt record: exit must be a runner exit name")
        if self.reason is not None and (
            not isinstance(self.reason, str) or len(self.reason) > MAX_REASON or CONTROL_CHARS.search(self.reason)
        ):
            raise RecordError(f"attempt record: reason must be text of at most {MAX_REASON} characters")
        if self.finished is not None:
            _time(self.finished, "finished")
            if self.finished < self.started - CLOCK_SLACK:
                raise RecordError("attempt record: finished before it started")
        if self.process is not None and not (isinstance(self.process, str) and _PROCESS.fullmatch(self.process)):
            raise RecordError("attempt record: process must be 16 lowercase hex digits")
        if (self.exit is None) != (self.finished is None):
            raise RecordError("attempt record: exit and finished come together")

    @property
    def ended(self) -> bool:
        """Whether the runner wrote its ending (a record without one: the runner died, or still runs)."""
        return self.exit is not None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> AttemptRecord:
        """A record read back from the volume; RecordError for anything but a valid one."""
        if len(text) > MAX_BYTES:
            raise RecordError(f"attempt record is larger than {MAX_BYTES} bytes")
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            raise RecordError("attempt record is not JSON") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> AttemptRecord:
        if not isinstance(data, dict):
            raise RecordError("attempt record must be a JSON object")
        unknown = set(data) - _FIELDS
        if unknown:
            raise RecordError(f"attempt record has {len(unknown)} unknown field(s)")
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise RecordError(f"attempt record lacks {', '.join(missing)}")
        return cls(**data)


_FIELDS = frozenset(f.name for f in fields(AttemptRecord))
_REQUIRED = ("schema", "job", "chunk", "attempt", "started")


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bounded_int(value: object, name: str, lo: int, hi: int) -> None:
    number = _integer(value)
    if number is None or not lo <= number <= hi:
        raise RecordError(f"attempt record: {name} must be an integer in [{lo}, {hi}]")


def _number(value: object, name: str, lo: float, hi: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and lo <= value <= hi
    if not ok:
        raise RecordError(f"attempt record: {name} must be a number in [{lo:g}, {hi:g}]")


def _time(value: object, name: str) -> None:
    _number(value, name, 0.0, MAX_TIME)
