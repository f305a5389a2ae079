"""One error base carrying the CLI exit code (sysexits-style; docs/failures.md#exit-codes)."""

from __future__ import annotations

import errno


class FfswarmError(Exception):
    """Base of every error ffswarm reports to a user; ``exit_code`` is what the CLI exits with."""

    exit_code = 70


class UsageError(FfswarmError):
    exit_code = 2


class JobFileError(FfswarmError):
    """A job file is malformed; the message names file, field and reason."""

    exit_code = 65

    def __init__(self, file: str, field: str | None, reason: str) -> None:
        self.file = file
        self.field = field
        self.reason = reason
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {reason}")


class ConfigError(FfswarmError):
    """The cluster config is missing or wrong (EX_CONFIG; a job file's errors are 65)."""

    exit_code = 78


class MissingInputError(FfswarmError):
    exit_code = 66


class CapacityError(FfswarmError):
    """The swarm cannot run the job: no engine, not a manager, no GPU capacity."""

    exit_code = 69


class EngineUnavailable(CapacityError):
    """The Docker engine did not answer (stopped, restarting, socket gone): a job's watch rides this
    out for a while (Policy.engine_outage), then gives up with exit 69 and how to resume."""


class InternalError(FfswarmError):
    exit_code = 70


class Interrupted(FfswarmError):
    exit_code = 130


class MissingExtra(FfswarmError):
    """A command needs an optional part of ffswarm that is not installed (EX_UNAVAILABLE, like a
    Swarm that is not there); the message names the extra and the pip command that adds it."""

    exit_code = 69


def volume_full(e: BaseException) -> bool:
    """A write refused because the shared volume (or a filesystem quota) is full: a state that passes
    once space is freed, so the work is tried again later (serve) or the caller told to (the API)."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
