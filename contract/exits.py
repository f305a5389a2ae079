"""The runner's exit codes: its verdict on an attempt, carried to the controller by the engine.

docs/failures.md#exit-codes says what the controller does with each (controller/run/failures.py).
"""

from __future__ import annotations

from enum import Enum


class RunnerExit(int, Enum):
    """What kind of ending a chunk attempt had."""

    OK = 0  # every item ok, no_face (copy/skip), or already done
    ITEMS_FAILED = 3  # finished; some items failed for their own reasons
    BAD_MANIFEST = 65  # malformed manifest / unknown schema: no retry
    MISSING_INPUT = 66  # source photo or model pack missing or wrong checksum: no retry
    INTERNAL = 70  # bug: retry, counts against retries
    TEMPORARY = 75  # shared volume unavailable, GPU/provider init failed: retry elsewhere
