"""CPU time of local processes, read from /proc, for the benchmarks that start ffswarm's own processes
(scripts/bench_api.py, scripts/bench_small.py): what a process tree used over a window, and what that
comes to per request.

A process's time is user + system over all its threads, plus that of the children it has waited for:
the kernel adds a child's time to its parent's only when the parent reaps it, so a tree's children
still running are read on their own. `serve` starts only short-lived children (hooks, ffprobe and
ffmpeg for videos) and waits for each, and `ffswarm api --workers N` forks N long-lived workers: both
are counted once, whether they end inside the window or not (``spent``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time: clock ticks a second


def cpu_seconds(pid: int, proc: Path = PROC) -> float:
    """CPU seconds of a process: utime, stime, cutime and cstime (fields 14 to 17 of /proc/<pid>/stat).
    OSError when the process is gone."""
    text = (proc / str(pid) / "stat").read_text()
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and ')'
    return sum(int(f) for f in fields[11:15]) / TICK


def tree(pid: int, proc: Path = PROC) -> list[int]:
    """``pid`` and the processes below it that are still there, parents before their children: the
    children of each of its threads (a child belongs to the thread that started it), theirs, and so on."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            tasks = sorted((proc / str(p) / "task").iterdir(), key=lambda t: int(t.name))
        except OSError:  # gone since its parent listed it
            continue
        if p in found:
            continue
        found.append(p)
        for task in tasks:
            with contextlib.suppress(OSError):  # a thread ended since the listing
                todo += [int(k) for k in (task / "children").read_text().split()]
    return found


def sample(pid: int, proc: Path = PROC) -> dict[int, float]:
    """{pid: CPU seconds} of ``pid``'s tree now, parents first; a process gone between the listing and
    its reading is left out (its time is in its parent's once reaped)."""
    out: dict[int, float] = {}
    for p in tree(pid, proc):
        with contextlib.suppress(OSError):
            out[p] = cpu_seconds(p, proc)
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds a tree used between two samples of it. A child started in between counts from zero;
    one that ended in between is in its parent's time for its whole life, so its reading before is
    taken off."""
    return sum(after.values()) - sum(before.values())


def per_request_ms(seconds: float, requests: int) -> float:
    """CPU milliseconds per request; a run with no request done shows its whole cost (as one)."""
    return 1000 * seconds / max(requests, 1)
