"""What a person sees: raw terminal output replayed into a screen model (pyte), and how to tell the
progress bar's line from a log record's."""

from __future__ import annotations

import re

import pyte

LOG_RECORD = re.compile(r"\[(debug|info|warning|error|critical)\s*\]|\b\w+=\S")
# Any piece of a bar, this one's or the old `\r` one's (whose 100-column line a terminal wrapped).
BAR = re.compile(r"[━╸╺#]{3}|\d+/\d+ items|\d+ queued\b|\bETA [\d?]")
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def screen_lines(raw: bytes, columns: int = 80, rows: int = 24, onlcr: bool = False) -> list[str]:
    """Every line the screen showed, scrolled-off ones included, as it ended. `onlcr`: turn "\\n"
    into "\\r\\n" as a terminal's line discipline does (needed for output captured from a file,
    not from a pty)."""
    screen = pyte.HistoryScreen(columns, rows, history=100_000)
    stream = pyte.ByteStream(screen)
    stream.feed(raw.replace(b"\n", b"\r\n") if onlcr else raw)
    top = ["".join(line[x].data for x in range(columns)) for line in screen.history.top]
    return [line.rstrip() for line in [*top, *screen.display]]


def is_bar(line: str) -> bool:
    return bool(BAR.search(line))


def is_log(line: str) -> bool:
    return bool(LOG_RECORD.search(line))


def mixed(lines: list[str]) -> list[str]:
    """Lines that hold both the bar and a log record: the garbage this is about."""
    return [line for line in lines if is_bar(line) and is_log(line)]


def visible_widths(raw: str) -> list[int]:
    """The printed width of every stretch between line starts (newline or carriage return), control
    sequences left out: what a terminal would have to fit on one line."""
    return [len(piece) for piece in re.split(r"[\r\n]", CSI.sub("", raw))]


def colour_codes(raw: str) -> list[str]:
    """SGR sequences that set a foreground or background colour (bold, dim, reset are no colour)."""
    found = []
    for m in SGR.finditer(raw):
        params = [int(p) for p in m.group(1).split(";") if p.isdigit()]
        if any(30 <= p <= 49 and p not in (39, 49) or 90 <= p <= 107 for p in params):
            found.append(m.group(0))
    return found
