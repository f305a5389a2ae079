"""The runner's error kinds, each tied to the exit code a chunk attempt ends with (contract/exits.py;
what the controller makes of each: docs/failures.md#exit-codes).

Library modules raise these; only ``__main__`` turns them into a process exit, so every module stays
testable in-process. ``ItemError`` is deliberately not a ``RunnerError``: a bad target file fails its
own item (result status ``error``), never the whole chunk.
"""

from __future__ import annotations

from contract.exits import RunnerExit


class RunnerError(Exception):
    """A chunk-level failure; ``exit_code`` tells the controller whether a retry can help."""

    exit_code: RunnerExit = RunnerExit.INTERNAL


class BadManifest(RunnerError):
    """The manifest cannot be identified or used at all (no retry)."""

    exit_code = RunnerExit.BAD_MANIFEST


class MissingInput(RunnerError):
    """A source photo or the model pack is missing or wrong: retrying elsewhere cannot fix it."""

    exit_code = RunnerExit.MISSING_INPUT


class Temporary(RunnerError):
    """The shared volume or the accelerator is unavailable here: another node may succeed."""

    exit_code = RunnerExit.TEMPORARY


class Superseded(Temporary):
    """A later attempt of this chunk has started: the controller gave this one up (its node was lost
    or paused, its lane dropped) while it still ran. It takes no new item; the items in flight end and
    are recorded, and it exits so that two attempts do not go on working one chunk side by side."""


class ItemError(Exception):
    """One target failed for its own reasons; the message is the result line's ``reason``."""


class Terminated(BaseException):
    """SIGTERM arrived (service removed, timeout). A BaseException so that per-item handlers let it
    through while ``finally`` blocks still remove temporary files."""
