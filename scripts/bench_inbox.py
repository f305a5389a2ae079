#!/usr/bin/env python3
"""What one poll of `serve`'s inbox costs while many requests wait: N job files in a temporary inbox,
then, side by side in one run, the seconds per poll of

  - restat: every entry lstat'ed on every poll (the inbox before the index, ae3bc90 … 245e27f),
  - indexed, first poll: the index built (one lstat per entry),
  - indexed, steady: later polls asking for the oldest 4 (serve asks for as many as it has free
    slots; one folder listing, no lstat of an entry already seen),
  - indexed, every path listed: the same, all 50,000 returned as paths,

and the claim of the oldest file with the index warm. The restat loop is re-stated here as that
inbox did it, so the two are measured on the same files in the same run.

    .venv/bin/python scripts/bench_inbox.py                  # 50,000 files, 5 polls each
    .venv/bin/python scripts/bench_inbox.py --files 100000 --polls 3

Bounded: at most 200,000 files in a temporary folder under --dir (default: the system's), removed at
the end. Local disk only unless --dir points at an NFS mount (then the ratio is what NFS gives).
Results: benchmarks/RESULTS.md (B-inbox).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.serve.inbox import JOB_SUFFIXES, SETTLE_SECONDS, Inbox  # noqa: E402

MAX_FILES = 200_000
FREE = 4  # job slots free: serve asks for the oldest this many


def restat_poll(path: Path, now: float) -> list[Path]:
    """The inbox's poll before the index: every entry lstat'ed, every time."""
    found: list[tuple[float, str]] = []
    with os.scandir(path) as entries:
        for e in entries:
            if e.name.startswith(".") or os.path.splitext(e.name)[1] not in JOB_SUFFIXES:
                continue
            try:
                mtime = e.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if now - mtime >= SETTLE_SECONDS:
                found.append((mtime, e.name))
    return [path / name for _, name in sorted(found)]


def timed(fn, polls: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    times, n = [], 0
    for _ in range(polls):
        t0 = time.perf_counter()
        n = len(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=50_000)
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    a = ap.parse_args()
    if not 1 <= a.files <= MAX_FILES:
        ap.error(f"--files is 1 … {MAX_FILES}")
    tmp = Path(tempfile.mkdtemp(prefix="ffswarm-bench-inbox-", dir=a.dir))
    try:
        box = tmp / "inbox"
        inbox = Inbox(box, max_bytes=65536)
        inbox.ensure()
        old = time.time() - 3600  # settled
        body = b"source: faces/me.jpg\ntargets: [in/x.jpg]\n"
        t0 = time.perf_counter()
        for i in range(a.files):
            p = box / f"req-{i:06d}.yaml"
            p.write_bytes(body)
            os.utime(p, (old + i * 1e-3, old + i * 1e-3))
        made = time.perf_counter() - t0
        now = time.time()
        restat, n1 = timed(lambda: restat_poll(box, now), a.polls)
        t0 = time.perf_counter()
        n2 = len(inbox.waiting(now, FREE))
        first = time.perf_counter() - t0
        steady, n3 = timed(lambda: inbox.waiting(now, FREE), a.polls)
        whole, n4 = timed(lambda: inbox.waiting(now), a.polls)
        assert n1 == n4 == a.files and n2 == n3 == FREE, (n1, n2, n3, n4)
        t0 = time.perf_counter()
        claimed = inbox.claim(inbox.waiting(time.time(), 1)[0])
        claim = time.perf_counter() - t0
        assert claimed is not None and claimed.name.startswith("req-000000.")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"inbox of {a.files:,} waiting files on {tmp.parent} (made in {made:.1f} s); median of {a.polls} polls")
    print(f"{'poll':<28}{'seconds':>10}{'vs restat':>12}")
    print(f"{'restat (before the index)':<28}{restat:>10.3f}{1.0:>11.2f}×")
    print(f"{'indexed, first poll':<28}{first:>10.3f}{restat / first:>11.2f}×")
    print(f"{'indexed, steady':<28}{steady:>10.3f}{restat / steady:>11.2f}×")
    print(f"{'indexed, every path listed':<28}{whole:>10.3f}{restat / whole:>11.2f}×")
    print(f"{'claim oldest (poll+claim)':<28}{claim:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
