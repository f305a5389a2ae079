"""Chunk states and failure classes: what an ending means and what the controller does about it;
and the runner's own words on why it ended."""

from __future__ import annotations

import json
from enum import StrEnum

from contract.exits import RunnerExit
from contract.paths import user_text


class ChunkState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # runner finished (exit 0 or 3); item-level failures live in the results
    FAILED = "failed"  # no more attempts, or a failure that retrying cannot fix
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in (ChunkState.DONE, ChunkState.FAILED, ChunkState.CANCELLED)


class FailureClass(StrEnum):
    USER = "user"  # bad manifest, missing input or model pack: the same inputs fail again
    INTERNAL = "internal"  # runner bug (70): retried, counts against retries
    INFRASTRUCTURE = "infrastructure"  # killed, OOM, temporary, rejected, node lost, timed out
    UNSCHEDULABLE = "unschedulable"  # no node can take it within schedule_timeout

    def is_retryable(self) -> bool:
        return self in (FailureClass.INTERNAL, FailureClass.INFRASTRUCTURE)


def classify_exit(code: int) -> FailureClass | None:
    """None: the runner finished its chunk (0 every item ok, 3 some items failed on their own)."""
    if code in (RunnerExit.OK, RunnerExit.ITEMS_FAILED):
        return None
    if code in (RunnerExit.BAD_MANIFEST, RunnerExit.MISSING_INPUT):
        return FailureClass.USER
    if code == RunnerExit.INTERNAL:
        return FailureClass.INTERNAL
    return FailureClass.INFRASTRUCTURE  # 75 temporary, 137 killed/OOM, anything else the engine reports


def describe_exit(code: int) -> str:
    try:
        return f"runner exit {code} ({RunnerExit(code).name.lower().replace('_', ' ')})"
    except ValueError:
        return f"runner exit {code}" + (" (killed: out of memory or stopped)" if code == 137 else "")


def last_words(log_text: str) -> str | None:
    """The runner's reason for failing: the `error` of its last JSON log line that has one, else its
    last line of output (a traceback's last line, a shell's complaint). A reason the user reads, so
    the container paths in it are written relative to the data root (user_text)."""
    lines = [line for line in log_text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("error"):
            return user_text(str(data["error"]))[:500]
    return user_text(lines[-1])[:300] if lines else None
