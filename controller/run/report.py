"""report.json and the end-of-job summary: what happened to every item, video and chunk.

`Report` is the typed report (report.json is its `to_dict`, read back with `from_dict`; its JSON
shape is what users and hooks read); `summary` is the one end-of-job text, for a terminal and for an
inbox's reason file. Per-item states come from the one fold of the run folder (controller/run/fold.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from contract.paths import user_text
from contract.results import ItemStatus
from controller.job.plan import Plan
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.fold import Fold
from controller.run.rundir import RunDir

ENDED_WELL = (ItemStatus.OK.value, ItemStatus.NO_FACE.value)


@dataclass(frozen=True)
class ItemEntry:
    """One item the user submitted (an image, or a video with its segments' count and probe facts)."""

    input: str
    output: str | None
    status: str  # ok | no_face | error | cancelled
    reason: str | None
    chunk: str | None
    segments: int | None = None  # set for a video
    info: Mapping[str, Any] | None = None  # a video's probe facts

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input": self.input, "output": self.output, "status": self.status, "reason": self.reason,
            "chunk": self.chunk,
        }  # fmt: skip
        if self.segments is not None:
            out.update(kind="video", segments=self.segments, info=dict(self.info or {}))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ItemEntry:
        video = d.get("kind") == "video"
        return cls(
            str(d["input"]), d.get("output"), str(d["status"]), d.get("reason"), d.get("chunk"),
            int(d["segments"]) if video else None, dict(d.get("info") or {}) if video else None,
        )  # fmt: skip


@dataclass(frozen=True)
class Failure:
    item: str
    input: str
    reason: str | None
    chunk: str | None


@dataclass(frozen=True)
class Counts:
    items: int
    ok: int
    no_face: int
    failed: int
    chunks: int
    chunks_done: int = 0
    chunks_failed: int = 0
    chunks_cancelled: int = 0


@dataclass(frozen=True)
class Report:
    job: str
    image: str
    started: float
    finished: float
    counts: Counts
    failures: tuple[Failure, ...]
    items: Mapping[str, ItemEntry]
    chunks: Mapping[str, Mapping[str, Any]]  # chunk id -> its record (ChunkRun.as_dict)
    timing: Mapping[str, Any] | None = None  # what the job's chunks cost (controller/run/timings.py)
    hooks: Mapping[str, str] | None = None  # on_complete outcomes

    def exit_code(self) -> int:
        """CLI: 0 every item ok (no_face per policy is not a failure) · 1 failed items or chunks."""
        c = self.counts
        return 0 if c.failed == 0 and c.chunks_failed == 0 and c.chunks_cancelled == 0 else 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "image": self.image,
            "started": self.started,
            "finished": self.finished,
            "counts": dict(vars(self.counts)),
            "failures": [dict(vars(f)) for f in self.failures],
            "items": {k: e.to_dict() for k, e in self.items.items()},
            "chunks": {k: dict(v) for k, v in self.chunks.items()},
        }
        if self.timing is not None:
            out["timing"] = dict(self.timing)
        if self.hooks is not None:
            out["hooks"] = dict(self.hooks)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """report.json as written by to_dict (a KeyError or TypeError on anything else)."""
        return cls(
            job=str(d["job"]),
            image=str(d["image"]),
            started=float(d["started"]),
            finished=float(d["finished"]),
            counts=Counts(**d["counts"]),
            failures=tuple(Failure(**f) for f in d["failures"]),
            items={k: ItemEntry.from_dict(v) for k, v in d["items"].items()},
            chunks={k: dict(v) for k, v in d["chunks"].items()},
            timing=dict(d["timing"]) if d.get("timing") is not None else None,
            hooks=dict(d["hooks"]) if d.get("hooks") is not None else None,
        )


def summary(
    report: Report,
    report_path: PurePath | str,
    data_root: Path | None = None,
    pack: str | None = None,
    max_failures: int | None = None,
) -> list[str]:
    """The end of a job in words. For a terminal (`data_root` given): the counts, the output
    folders, every failure, the model pack and the report, one per line. For an inbox's reason
    file (no data root: paths as the user knows them): the counts with the report, then the first
    `max_failures` failures."""
    c = report.counts
    head = f"job {report.job}: {c.ok} ok, {c.no_face} without a face, {c.failed} failed of {c.items} items"
    failures = [f"failed: {f.input}: {f.reason}" for f in report.failures[:max_failures]]
    if data_root is None:
        return [f"{head}; report: {report_path}", *failures]
    outputs = sorted({str(Path(i.output).parent) for i in report.items.values() if i.output})
    return [
        f"{head} in {c.chunks} chunks",
        *(f"outputs: {data_root / o}" for o in outputs),
        *failures,
        *([f"model pack: {pack}"] if pack else []),
        f"report: {report_path}",
    ]


def build_report(plan: Plan, rundir: RunDir, runs: dict[str, ChunkRun], image: str, started: float) -> Report:
    """Every path in it is relative to the data root, as the job file names them: items' input and
    output come from the plan, and reasons name files that way (a runner writes them so; a result
    line of an older runner is rewritten here)."""
    fold = Fold.read(plan, rundir)
    items: dict[str, ItemEntry] = {}
    segments: dict[str, ItemEntry] = {}  # a video's segments are reported as the video
    for chunk in plan.chunks:
        run = runs.get(chunk.id)
        for item_id in chunk.items:
            planned = plan.item(item_id)
            r = fold.result(item_id)
            if r is not None:
                status, reason, output = r.status.value, r.reason and user_text(r.reason), r.output
            elif run is not None and run.state is ChunkState.FAILED:
                status, reason, output = "error", f"chunk {chunk.id} failed: {run.reason}", None
            elif run is not None and run.state is ChunkState.CANCELLED:
                status, reason, output = "cancelled", "job cancelled", None
            else:
                status, reason, output = "error", f"no result recorded by chunk {chunk.id}", None
            entry = ItemEntry(planned.input, planned.output if output else None, status, reason, chunk.id)
            (segments if planned.kind == "segment" else items)[item_id] = entry
    items.update(report_items(fold, segments))
    ordered = dict(sorted(items.items()))
    failures = tuple(
        Failure(item_id, e.input, e.reason, e.chunk) for item_id, e in ordered.items() if e.status not in ENDED_WELL
    )
    statuses = Counter(e.status for e in ordered.values())
    chunk_counts = Counter(r.state.value for r in runs.values())
    counts = Counts(
        items=len(items),
        ok=statuses["ok"],
        no_face=statuses["no_face"],
        failed=len(failures),
        chunks=len(plan.chunks),
        chunks_done=chunk_counts["done"],
        chunks_failed=chunk_counts["failed"],
        chunks_cancelled=chunk_counts["cancelled"],
    )
    chunks = {cid: run.as_dict() for cid, run in sorted(runs.items())}
    return Report(plan.job, image, started, time.time(), counts, failures, ordered, chunks)


def report_items(fold: Fold, segments: dict[str, ItemEntry]) -> dict[str, ItemEntry]:
    """One report entry per video target, from the plan, its segments' entries and the join."""
    out: dict[str, ItemEntry] = {}
    for v in fold.plan.videos:
        seg_entries = [segments[s] for s in v.segments if s in segments]
        bad = [(s, e) for s, e in zip(v.segments, seg_entries, strict=False) if e.status not in ENDED_WELL]
        joined = fold.joined.get(v.id)
        output: str | None = None
        chunk: str | None = None
        reason: str | None
        if v.error is not None:
            status, reason = "error", f"{v.input}: {v.error}"
        elif bad:
            sid, e = bad[0]
            status = "cancelled" if all(e.status == "cancelled" for _, e in bad) else "error"
            reason, chunk = f"segment {sid}: {e.reason}", e.chunk
        elif joined is None:
            status, reason = "error", "segments done but not joined"
        else:
            output = v.output if joined.output else None
            status, reason = joined.status.value, joined.reason
        out[v.id] = ItemEntry(v.input, output, status, reason, chunk, len(v.segments), dict(v.info))
    return out
