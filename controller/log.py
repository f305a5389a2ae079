"""structlog set up once: JSON lines off a terminal; on a terminal, records printed through one rich
Console on stderr, the Console the progress bar draws on, so that a record prints above the bar.

On a terminal the per-chunk info records (chunk_started, chunk_running, chunk_done, …) are left out
unless verbose: the bar already says them. A per-chunk record that says why something went wrong
(a `failure` or a `reason`: chunk_retry, chunk_failed, chunk_node_lost) is news the bar does not
carry, and is printed; so are warnings and errors, always. Colour is rich's to decide (NO_COLOR,
TERM=dumb, not a terminal); nothing here forces it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from rich.console import Console

from controller.redact import printable

# Fields that make a record one chunk's (or one item's) news rather than the job's, and those that
# make it worth a line on a terminal all the same.
PER_CHUNK_FIELDS = ("chunk", "item", "segment")
WHY_FIELDS = ("failure", "reason")
_STYLES = {"warning": "yellow", "warn": "yellow", "error": "bold red", "critical": "bold red"}


class ConsoleLogger:
    """structlog's logger on the console: console.print puts a record above a live bar (and wraps it
    at the terminal's width instead of letting the terminal break it)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def _print(self, level: str, message: str) -> None:
        self.console.print(message, style=_STYLES.get(level), markup=False, highlight=False, emoji=False)

    def __getattr__(self, level: str) -> Any:
        """msg, debug, info, warning, error, critical, exception …: structlog calls the method named
        after the record's level with the rendered line."""
        if level.startswith("_"):
            raise AttributeError(level)
        return lambda message: self._print(level, message)


def _hide_per_chunk(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    routine = method in ("debug", "info") and not any(event.get(f) for f in WHY_FIELDS)
    if routine and any(f in event for f in PER_CHUNK_FIELDS):
        raise structlog.DropEvent
    return event


def _printable(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Names and reasons on a terminal without their control characters: a file called
    ``\x1b]0;…`` must not retitle the window or move the cursor (JSON lines escape them already)."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value, newlines=key == "exception")
    return event


def setup(
    json_lines: bool | None = None,
    verbose: bool = False,
    level: int = logging.INFO,
    console: Console | None = None,
) -> Console | None:
    """Configure structlog for this process. Returns the Console that a progress bar must draw on,
    or None for JSON lines (off a terminal, or asked for): no bar then."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    common: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    if json_lines:
        structlog.configure(
            processors=[
                *common,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                # the traceback of log.exception(...) as text in "exception" (else only "exc_info": true)
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            # sys.stderr as it is at each call: a stream swapped since setup (and closed) is never written
            logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
            cache_logger_on_first_use=False,
        )
        return None
    out = console or Console(stderr=True, highlight=False)
    quiet: list[structlog.types.Processor] = [_hide_per_chunk] if out.is_terminal and not verbose else []
    structlog.configure(
        processors=[
            *common,
            *quiet,
            _printable,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            # plain_traceback: the default formatter (rich's, when rich is installed) forces colour.
            structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_: ConsoleLogger(out),
        cache_logger_on_first_use=False,
    )
    return out


def get(**bind: object) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger("ffswarm").bind(**bind)
    return logger
