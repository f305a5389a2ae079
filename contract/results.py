"""Result lines: what a runner appends to ``results/<chunk>.jsonl`` for each item of each attempt,
and what the controller appends to ``joins.jsonl`` for each joined video (contract/layout.py).

Read back by the controller (watch, report, status, video join, timings), so a reader skips a torn
last line (a writer killed mid-append) rather than failing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum


class ItemStatus(StrEnum):
    OK = "ok"
    NO_FACE = "no_face"
    ERROR = "error"

    def is_failure(self) -> bool:
        return self is ItemStatus.ERROR


@dataclass(frozen=True)
class ItemResult:
    """One line of results/<chunk>.jsonl: one item, one attempt."""

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

    def to_line(self) -> str:
        data = asdict(self)
        data["status"] = self.status.value
        return json.dumps(data, sort_keys=True) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ItemResult:
        data = json.loads(line)
        data["status"] = ItemStatus(data["status"])
        return cls(**data)


def read_results(text: str) -> list[ItemResult]:
    """Parse a results file; a torn last line (writer killed mid-append) is ignored."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(ItemResult.from_line(line))
        except (ValueError, TypeError, KeyError):
            continue
    return out
