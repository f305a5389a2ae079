"""Structured logging for one chunk attempt: JSON lines to stdout and to the attempt's log file.

Swarm keeps a container's stdout only as long as its task, so the same lines are also appended to
``<run>/logs/<chunk>.a<n>.log`` on the shared volume, where ``ffswarm logs`` finds them after the
service is gone. Every line carries job, chunk and attempt (bound through contextvars), so lines
from several attempts can be told apart when they are merged.

Configured once per process by ``configure``; tests may use ``structlog.testing.capture_logs``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog


class TeeSink:
    """The structlog "logger": writes each rendered line to a stream and, once attached, to a file.

    File lines go out in one ``os.write`` on an ``O_APPEND`` descriptor so that an orphaned earlier
    container appending to the same file cannot split a line. If the file stops being writable we
    keep logging to stdout rather than fail the chunk over its log.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._fd: int | None = None
        self.path: Path | None = None

    def attach(self, path: Path) -> str | None:
        """Start appending to ``path``; returns why not when its folder is not writable."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            return f"{path}: {e.strerror or e}"
        self.detach()
        self._fd, self.path = fd, path
        return None

    def detach(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self.path = None, None

    def msg(self, message: str) -> None:
        line = message + "\n"
        self._stream.write(line)
        self._stream.flush()
        if self._fd is not None:
            try:
                os.write(self._fd, line.encode("utf-8"))
            except OSError:
                self.detach()

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


def configure(stream: TextIO | None = None, level: int = logging.INFO) -> TeeSink:
    """Set structlog up for this process and return the sink (to attach the log file later).

    The stream is captured now, not looked up per line, so that temporarily redirecting
    ``sys.stdout`` (insightface prints to it) never diverts our own lines.
    """
    sink = TeeSink(stream if stream is not None else sys.stdout)
    structlog.contextvars.clear_contextvars()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *args: sink,
        cache_logger_on_first_use=False,
    )
    return sink


def reset() -> None:
    """Undo ``configure`` (in-process callers such as tests must not inherit our sink)."""
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def clear() -> None:
    """Forget the fields bound for the attempt that ended (a lingering runner's next one binds its own)."""
    structlog.contextvars.clear_contextvars()


def bind(**values: Any) -> None:
    """Add fields to every following line of this attempt (job, chunk, attempt, gpu …)."""
    structlog.contextvars.bind_contextvars(**values)


def get() -> Any:
    """The bound logger (typed Any: structlog's filtering wrapper class is generated at runtime)."""
    return structlog.get_logger("ffswarm.runner")


def process_age() -> float | None:
    """Seconds since this process was started (exec), from /proc: the runner's whole cold start,
    interpreter and imports included, which no log line written after them can see."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None
