"""What a person watching a job sees on a terminal: one rich progress bar on the bottom line.

The bar draws on the same rich Console as the log records (controller/log.py), so a record prints
above the bar and never onto its line. Two feeds draw the same bar: `Progress`, fed by the events of
the job this process runs (submit, resume, retry), and `follow`, which reads the run folder of a job
that runs elsewhere (`ffswarm status JOB --follow`). Off a terminal there is no bar: the JSON log
lines are the progress of a running job, and `follow` prints one JSON status line per change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, SpinnerColumn, TaskID, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from controller.errors import FfswarmError
from controller.run import join
from controller.run.rundir import RunDir
from controller.run.status import job_status


class NotRunning(FfswarmError):
    """`status --follow` of a job whose controller stopped without a report (exit 1: not done)."""

    exit_code = 1


@dataclass(frozen=True)
class Snapshot:
    """One drawing of the bar. Items are what the user submitted (images and videos, as `status`
    and the summary count them); the bar fills with work (images, video segments, joins), so that a
    video job moves before its first video is joined."""

    items: int
    done: int
    failed: int
    running: int  # chunks
    queued: int  # chunks
    work: int
    work_done: int

    def __post_init__(self) -> None:
        if not 0 <= self.done <= self.items or not 0 <= self.failed <= self.done:
            raise ValueError(f"inconsistent counts: {self}")

    def detail(self) -> str:
        failed = [f"{self.failed} failed"] if self.failed else []
        return " · ".join([*failed, f"chunks {self.running} running, {self.queued} queued"])


def snapshot(row: dict[str, Any]) -> Snapshot:
    """The bar of a `status.job_status` row: what `follow` reads from a run folder."""
    items, chunks, segments = row["items"], row["chunks"], row["segments"]
    done = min(max(items["total"] - items["pending"], 0), items["total"])  # read back: never trusted
    return Snapshot(
        items=items["total"],
        done=done,
        failed=min(items["failed"], done),
        running=int(chunks.get("running", 0)),
        queued=int(chunks.get("queued", 0)),
        work=items["total"] + segments["total"],
        work_done=done + segments["done"],
    )


class Bar:
    """rich's Progress with one task, kept on one line: the bar gets what the counts leave of the
    terminal's width (at most BAR_MAX); on a narrow terminal the chunk counts are cut short
    rather than let rich wrap the line (a wrapped live line is the garbage this replaced)."""

    BAR_MAX = 40
    BAR_MIN = 8
    ETA = 8  # TimeRemainingColumn(compact): "--:--", "MM:SS" or "H:MM:SS"

    def __init__(self, console: Console) -> None:
        self._console = console
        self._bar = BarColumn(bar_width=self.BAR_MIN)
        self._progress = RichProgress(
            SpinnerColumn(),
            self._bar,
            TextColumn("{task.fields[items]}"),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(compact=True, elapsed_when_finished=True),
            console=console,
            expand=False,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task("", total=None, items="", detail="")
        self._progress.start()
        self._stopped = False

    def show(self, s: Snapshot) -> None:
        items, detail = f"{s.done}/{s.items} items", s.detail()
        # spinner, then one space between each of the five columns
        room = self._console.width - (1 + 4 + len(items) + len(detail) + self.ETA)
        if room < self.BAR_MIN:
            keep = max(len(detail) - (self.BAR_MIN - room), 0)
            detail = detail[: keep - 1] + "…" if keep else ""
        self._bar.bar_width = min(max(room, self.BAR_MIN), self.BAR_MAX)
        self._progress.update(self._task, total=max(s.work, 1), completed=s.work_done, items=items, detail=detail)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._progress.stop()


def bar_for(console: Console | None) -> Bar | None:
    """A bar only where it can be redrawn in place: a terminal that is not TERM=dumb."""
    return Bar(console) if console is not None and console.is_interactive else None


class Progress:
    """The bar of a job this process runs, fed its events: progress(event, **fields), then close().

    Counts start from what the run folder already holds (a resumed job starts where it was) and
    each chunk is recounted from its results when it ends, so a retried chunk is never counted twice.
    """

    def __init__(self, rundir: RunDir, total_items: int, console: Console | None = None) -> None:
        self.rundir = rundir
        plan = rundir.plan()
        self.kinds = {i.id: i.kind for i in plan.items}
        self.images = sum(1 for k in self.kinds.values() if k != "segment")
        self.work = max(total_items, len(plan.items)) + len(plan.videos)
        self.videos = {v.id: v.error is not None for v in plan.videos}  # id -> failed, once ended
        self.videos_ended: dict[str, bool] = {vid: True for vid, err in self.videos.items() if err}
        for vid, r in join.joins(rundir).items():
            if vid in self.videos:
                self.videos_ended[vid] = r.status.is_failure()
        self.counted: dict[str, tuple[int, int, int]] = {}  # chunk -> (images ended, images failed, segments)
        for chunk in plan.chunks:
            self._count(chunk.id)
        self.running: set[str] = set()
        self.ended: set[str] = set()
        self.pending = 0
        self.bar = bar_for(console)
        self._draw()

    def _count(self, chunk: str) -> None:
        ended = failed = segments = 0
        for r in self.rundir.latest_results(chunk).values():
            if self.kinds.get(r.item) == "segment":
                segments += 1
            else:
                ended += 1
                failed += r.status.is_failure()
        self.counted[chunk] = (ended, failed, segments)

    def __call__(self, event: str, **fields: Any) -> None:
        chunk = fields.get("chunk")
        if event == "job_started":
            self.pending = int(fields.get("pending", 0))
        elif event in ("chunk_started", "chunk_adopted") and chunk:
            self.running.add(chunk)
        elif event in ("chunk_done", "chunk_failed", "chunk_retry") and chunk:
            self.running.discard(chunk)
            if event != "chunk_retry":
                self.ended.add(chunk)
            self._count(chunk)
        elif event == "video_joined" and fields.get("item") in self.videos:
            self.videos_ended[fields["item"]] = fields.get("status") == "error"
        self._draw()

    def snapshot(self) -> Snapshot:
        images, failed, segments = (sum(c[n] for c in self.counted.values()) for n in range(3))
        images = min(images, self.images)
        done = images + len(self.videos_ended)
        return Snapshot(
            items=self.images + len(self.videos),
            done=done,
            failed=min(failed, images) + sum(self.videos_ended.values()),
            running=len(self.running),
            queued=max(self.pending - len(self.ended) - len(self.running), 0),
            work=self.work,
            work_done=min(done + segments, self.work),
        )

    def _draw(self) -> None:
        if self.bar is not None:
            self.bar.show(self.snapshot())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def follow(
    rundir: RunDir,
    console: Console | None,
    out: Callable[[str], None],
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Watch a job that another process runs, from its run folder alone, until it ends; returns its
    report. On a terminal: the bar; else one JSON status line (as `status --json`) per change.

    A job has ended when its report is written and none of its chunks is queued or running: a job
    being retried still holds the report of its previous run."""
    row = job_status(rundir)  # no such job: said before any bar is drawn
    bar = bar_for(console)
    last: dict[str, Any] | None = None
    try:
        while True:
            report = rundir.report()
            if bar is not None:
                bar.show(snapshot(row))
            elif row != last:
                out(json.dumps(row, sort_keys=True))
                last = row
            active = row["chunks"].get("running", 0) + row["chunks"].get("queued", 0)
            if report is not None and not active:
                return report
            if report is None and row["phase"] == "stopped":  # its controller is gone: nothing will end it
                raise NotRunning(f"job {rundir.job} stopped: no controller runs it; `ffswarm resume {rundir.job}`")
            sleep(poll)
            row = job_status(rundir)
    finally:
        if bar is not None:
            bar.stop()
