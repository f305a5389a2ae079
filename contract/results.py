"""Result lines: what a runner appends to ``results/<chunk>.a<n>.jsonl`` for each item of attempt n,
and what the controller appends to ``joins.jsonl`` for each joined video (contract/layout.py).

Read back by the controller (watch, report, status, video join, timings) and by later attempts, from
files a runner can write: every line is parsed as hostile (types checked, unknown keys refused) and
a line that does not parse is counted, never silently dropped. ``chunk_results`` is the one reader
of a chunk's results: it merges all attempts (``merge_attempts``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from contract.layout import parse_results_name

MAX_RESULTS_BYTES = 256 * 1024**2  # one attempt's file; a larger one is read up to here (the rest counted)
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ItemStatus(StrEnum):
    OK = "ok"
    NO_FACE = "no_face"
    ERROR = "error"

    def is_failure(self) -> bool:
        return self is ItemStatus.ERROR

    def is_commit(self) -> bool:
        """The item is done (its output, if any, was committed)."""
        return self is not ItemStatus.ERROR


@dataclass(frozen=True)
class ItemResult:
    """One line of results/<chunk>.a<n>.jsonl: one item, one attempt."""

    item: str
    status: ItemStatus
    attempt: int
    input: str  # container path, as in the manifest
    output: str | None  # None when nothing was written (error, or no_face with skip)
    reason: str | None = None  # for people: names files relative to the data root (user_path)
    faces: int = 0
    cached: bool = False  # True: committed by an earlier attempt, not redone
    gpu: str | None = None  # DOCKER_RESOURCE_GPU the container saw
    provider: str | None = None
    started: float = 0.0  # unix time
    finished: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    # The committed output as written (absent in lines of older runners): a later attempt counts an
    # existing output as this job's only while it still has this size and digest.
    size: int | None = None
    sha256: str | None = None
    note: str | None = None  # for people: what the output could not keep (alpha, 16-bit), if anything

    def to_line(self) -> str:
        data = asdict(self)
        data["status"] = self.status.value
        for name in _NEW_OPTIONAL:  # left out when unset: lines stay as older readers know them
            if data[name] is None:
                del data[name]
        return json.dumps(data, sort_keys=True) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ItemResult:
        """ValueError for anything but a line as to_line writes it (types checked, no extra keys)."""
        data = json.loads(line)
        if not isinstance(data, dict) or not set(data) <= _NAMES:
            raise ValueError("not a result line")
        data["status"] = ItemStatus(data["status"])
        result = cls(**data)
        _check(result)
        return result


_NAMES = frozenset(f.name for f in fields(ItemResult))
_NEW_OPTIONAL = ("size", "sha256", "note")


def _number(value: Any, types: tuple[type, ...] = (int, float)) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


def _text(value: Any, optional: bool = True) -> bool:
    return isinstance(value, str) or (optional and value is None)


def _check(r: ItemResult) -> None:
    ok = (
        _text(r.item, False)
        and bool(r.item)
        and _number(r.attempt, (int,))
        and r.attempt >= 0
        and _text(r.input, False)
        and all(_text(v) for v in (r.output, r.reason, r.gpu, r.provider, r.note))
        and _number(r.faces, (int,))
        and isinstance(r.cached, bool)
        and _number(r.started)
        and _number(r.finished)
        and isinstance(r.timings, dict)
        and (r.size is None or (_number(r.size, (int,)) and r.size >= 0))
        and (r.sha256 is None or (isinstance(r.sha256, str) and _SHA256.fullmatch(r.sha256) is not None))
    )
    if not ok:
        raise ValueError("a result line field has the wrong type")


def parse_results(text: str) -> tuple[list[ItemResult], int]:
    """The lines of one results file, and how many lines did not parse (a torn last line included)."""
    out, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(ItemResult.from_line(line))
        except (ValueError, TypeError, KeyError, RecursionError):
            bad += 1
    return out, bad


def read_results(text: str) -> list[ItemResult]:
    """Parse a results file, skipping what does not parse (``parse_results`` counts it)."""
    return parse_results(text)[0]


@dataclass(frozen=True)
class ChunkResults:
    """A chunk's results over all its attempts: each item's deciding line, and the lines dropped."""

    latest: dict[str, ItemResult]
    lines: tuple[ItemResult, ...]  # every parsed line, oldest attempt first
    dropped: int = 0  # lines that did not parse, or claimed another attempt than their file's


def merge_attempts(files: Iterable[tuple[int, str]]) -> ChunkResults:
    """Merge results files given as (attempt, text); attempt 0 is the pre-attempt single file, whose
    lines carry their own attempt numbers. For each item a commit (ok, no_face, cached) beats an
    error whatever the order; among commits, or among errors, the newest attempt wins, then the
    later line. A late error line of an orphaned earlier attempt therefore never hides a commit."""
    lines: list[ItemResult] = []
    dropped = 0
    for attempt, text in sorted(files, key=lambda f: f[0]):
        parsed, bad = parse_results(text)
        dropped += bad
        for r in parsed:
            if attempt and r.attempt != attempt:
                dropped += 1  # a line in another attempt's file: not this attempt's to say
                continue
            lines.append(r)
    return merge_lines(lines, dropped)


def merge_lines(lines: Iterable[ItemResult], dropped: int = 0) -> ChunkResults:
    """Result lines already parsed, in file order (oldest attempt first), merged by merge_attempts'
    rule: a commit beats an error; among commits, or among errors, the newest attempt, then the
    later line, wins."""
    ranked: dict[str, tuple[tuple[bool, int, int], ItemResult]] = {}
    kept = tuple(lines)
    for order, r in enumerate(kept, 1):
        key = (r.status.is_commit(), r.attempt, order)
        if r.item not in ranked or key > ranked[r.item][0]:
            ranked[r.item] = (key, r)
    return ChunkResults({item: r for item, (_, r) in ranked.items()}, kept, dropped)


def read_regular(dir_fd: int, name: str, limit: int) -> tuple[bytes, bool] | None:
    """A regular file of the folder ``dir_fd`` (never through a symlink; a FIFO or device is not
    opened for reading, so it cannot block): up to ``limit`` bytes, and whether it was longer.
    None when it is not a regular file or cannot be read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts: list[bytes] = []
        left = limit + 1
        while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
            parts.append(block)
            left -= len(block)
        data = b"".join(parts)
        return data[:limit], len(data) > limit
    except OSError:
        return None
    finally:
        os.close(fd)


def chunk_results(results_dir: Path, chunk: str, limit: int = MAX_RESULTS_BYTES) -> ChunkResults:
    """Every attempt's results file of ``chunk`` in ``results_dir`` (and the pre-attempt
    ``<chunk>.jsonl`` as attempt 0), merged. The folder is opened without following a symlink;
    entries that are not regular files are skipped; a file cut at ``limit`` counts one dropped line.
    OSError when the folder itself cannot be opened (FileNotFoundError: no results yet)."""
    dfd = os.open(results_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        files: list[tuple[int, str]] = []
        cut = 0
        for name in os.listdir(dfd):
            whose = parse_results_name(name)
            if whose is None or whose.chunk != chunk:
                continue
            got = read_regular(dfd, name, limit)
            if got is None:
                cut += 1
                continue
            data, longer = got
            cut += longer
            files.append((whose.attempt, data.decode("utf-8", "replace")))
    finally:
        os.close(dfd)
    merged = merge_attempts(files)
    return ChunkResults(merged.latest, merged.lines, merged.dropped + cut)
