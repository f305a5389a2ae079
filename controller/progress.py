"""What a person watching `ffswarm submit` sees: one redrawn status line on a terminal.

Off a terminal the structlog JSON lines (one per chunk event) are the progress; this stays silent.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from controller.rundir import RunDir


class Progress:
    def __init__(self, rundir: RunDir, total_items: int, stream: TextIO = sys.stderr) -> None:
        self.rundir = rundir
        self.total = total_items
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()
        self.running: set[str] = set()
        self.done_chunks: set[str] = set()
        self.ok = 0
        self.pending_chunks = 0
        self.failed = 0

    def __call__(self, event: str, **fields: Any) -> None:
        chunk = fields.get("chunk")
        if event == "job_started":
            self.pending_chunks = int(fields.get("pending", 0))
        if event in ("chunk_started", "chunk_adopted") and chunk:
            self.running.add(chunk)
        elif event in ("chunk_done", "chunk_failed", "chunk_retry") and chunk:
            self.running.discard(chunk)
            if event == "chunk_done":
                self.done_chunks.add(chunk)
                results = self.rundir.latest_results(chunk).values()
                self.ok += sum(1 for r in results if not r.status.is_failure())
                self.failed += sum(1 for r in results if r.status.is_failure())
        self.draw()

    def draw(self) -> None:
        if not self.enabled:
            return
        done = self.ok + self.failed
        elapsed = time.monotonic() - self.started
        eta = f"{(self.total - done) * elapsed / done:.0f}s" if done else "?"
        rate = done / elapsed if elapsed > 0 else 0.0
        queued = max(self.pending_chunks - len(self.done_chunks) - len(self.running), 0)
        width = 24
        filled = int(width * done / self.total) if self.total else width
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(
            f"\r[{bar}] {done}/{self.total} items ({self.failed} failed) · "
            f"chunks {len(self.running)} running, {queued} queued · {rate:.1f} items/s · ETA {eta}   "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
