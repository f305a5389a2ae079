"""report.json and the end-of-job summary: what happened to every item, video and chunk.

`Report` is the typed report (report.json is its `to_dict`, read back with `from_dict`; its JSON
shape is what users and hooks read); `summary` is the one end-of-job text, for a terminal and for an
inbox's reason file. Per-item states come from the one fold of the run folder (controller/run/fold.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from contract.paths import user_text
from contract.results import ItemStatus
from contract.s3 import is_s3
from controller.job.plan import Plan
from controller.job.spec import JobSpec
from controller.run import history, usage
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.fold import Fold
from controller.run.job_lease import rfc3339
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
    output_url: str | None = None  # an s3:// output: a presigned GET link (storage.s3.link_ttl)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input": self.input, "output": self.output, "status": self.status, "reason": self.reason,
            "chunk": self.chunk,
        }  # fmt: skip
        if self.segments is not None:
            out.update(kind="video", segments=self.segments, info=dict(self.info or {}))
        if self.output_url is not None:
            out["output_url"] = self.output_url
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ItemEntry:
        video = d.get("kind") == "video"
        return cls(
            str(d["input"]), d.get("output"), str(d["status"]), d.get("reason"), d.get("chunk"),
            int(d["segments"]) if video else None, dict(d.get("info") or {}) if video else None,
            d.get("output_url") if isinstance(d.get("output_url"), str) else None,
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
    cancelled: int = 0  # items not run because the job was cancelled (not failures: `resume` runs them)
    segments: int = 0  # video segments (work items) beside the items the user submitted


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
    dropped_lines: Mapping[str, int] | None = None  # chunk id -> runner result lines that did not parse
    usage: Mapping[str, Any] | None = None  # what a platform bills by (controller/run/usage.py)
    reason: str | None = None  # why the controller ended the job itself (`serve` gave up on it); else None

    def exit_code(self) -> int:
        """CLI: 0 every item ok (no_face per policy is not a failure) · 1 failed items or chunks."""
        c = self.counts
        ended_well = c.failed == 0 and c.cancelled == 0 and c.chunks_failed == 0 and c.chunks_cancelled == 0
        return 0 if ended_well else 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "image": self.image,
            "started": self.started,
            "finished": self.finished,
            "started_at": rfc3339(self.started),  # the same times for people and JSON tools
            "finished_at": rfc3339(self.finished),
            "counts": dict(vars(self.counts)),
            "failures": [dict(vars(f)) for f in self.failures],
            "items": {k: e.to_dict() for k, e in self.items.items()},
            "chunks": {k: dict(v) for k, v in self.chunks.items()},
        }
        if self.timing is not None:
            out["timing"] = dict(self.timing)
        if self.hooks is not None:
            out["hooks"] = dict(self.hooks)
        if self.dropped_lines:
            out["dropped_result_lines"] = dict(self.dropped_lines)
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        if self.reason is not None:
            out["reason"] = self.reason
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
            dropped_lines=dict(d["dropped_result_lines"]) if d.get("dropped_result_lines") else None,
            usage=dict(d["usage"]) if d.get("usage") is not None else None,
            reason=d["reason"] if isinstance(d.get("reason"), str) else None,
        )


def summary(
    report: Report,
    report_path: PurePath | str,
    data_root: Path | None = None,
    pack: str | None = None,
    max_failures: int | None = None,
) -> list[str]:
    """The end of a job in words. For a terminal (`data_root` given): the counts, the output
    folders, the failures grouped by reason, the model pack and the report, one per line. For an
    inbox's reason file (no data root: paths as the user knows them): the counts with the report,
    then the first `max_failures` groups of failures. A reason shared by many items is one line
    (`14 × cannot write output: Permission denied: a.jpg, b.jpg, c.jpg … and 11 more; see
    report.json`), so 10,000 failures print a screen, not 10,000 lines."""
    c = report.counts
    cancelled = f", {c.cancelled} cancelled" if c.cancelled else ""
    head = f"job {report.job}: {c.ok} ok, {c.no_face} without a face, {c.failed} failed{cancelled} of {c.items} items"
    groups = failure_lines(report.failures, max_failures if data_root is None else max_failures or MAX_GROUPS)
    if c.cancelled:
        groups.append(f"cancelled: {c.cancelled} item(s) not run; `ffswarm resume {report.job}` runs them")
    if report.dropped_lines:
        n, chunks = sum(report.dropped_lines.values()), ", ".join(sorted(report.dropped_lines))
        groups.append(f"warning: {n} runner result line(s) could not be read (chunks {chunks}); see report.json")
    if data_root is None:
        return [f"{head}; report: {report_path}", *groups]
    outputs = sorted({str(Path(i.output).parent) for i in report.items.values() if i.output})
    return [
        f"{head} in {c.chunks} chunks",
        *(f"outputs: {data_root / o}" for o in outputs),
        *groups,
        *([f"model pack: {pack}"] if pack else []),
        f"report: {report_path}",
    ]


MAX_GROUPS = 20  # reasons on a terminal; the rest are in report.json
SHOWN_PATHS = 3  # inputs named per reason


def reason_key(failure: Failure) -> str:
    """What a failure's reason says without the item's own path: items failing for one reason share it."""
    reason = failure.reason or "no reason recorded"
    key = reason.replace(failure.input, "").strip(" :") if failure.input else reason
    return " ".join(key.replace(" : ", ": ").split()) or reason


def failure_lines(failures: tuple[Failure, ...], max_groups: int | None = None) -> list[str]:
    """One line per reason (in order of first appearance): a reason of one item names it
    (`failed: a.jpg: reason`); a shared one counts them and names the first few."""
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(reason_key(f), []).append(f)
    lines = []
    for key, members in groups.items():
        if len(members) == 1:
            lines.append(f"failed: {members[0].input}: {members[0].reason}")
            continue
        shown = ", ".join(m.input for m in members[:SHOWN_PATHS])
        more = len(members) - SHOWN_PATHS
        lines.append(
            f"failed: {len(members)} × {key}: {shown}" + (f" … and {more} more; see report.json" if more > 0 else "")
        )
    if max_groups is not None and len(lines) > max_groups:
        rest = sum(len(m) for m in list(groups.values())[max_groups:])
        lines = [*lines[:max_groups], f"… and {rest} more failed item(s) for other reasons; see report.json"]
    return lines


Links = Callable[[str], "str | None"]  # an s3:// output → its presigned GET link (None: none)


def build_report(
    plan: Plan,
    rundir: RunDir,
    runs: dict[str, ChunkRun],
    image: str,
    started: float,
    links: Links | None = None,
    fold: Fold | None = None,
    spec: JobSpec | None = None,
    state_chunks: Mapping[str, Any] | None = None,
) -> Report:
    """Every path in it is relative to the data root, as the job file names them: items' input and
    output come from the plan, and reasons name files that way (a runner writes them so; a result
    line of an older runner is rewritten here). An s3:// output written gets ``output_url`` from
    ``links``, signed now; a file output never does. ``fold``, ``spec``, ``state_chunks``: the job's
    results, job file and state.json's chunk records as the caller holds them (read from the run
    folder otherwise)."""
    fold = fold if fold is not None and fold.plan is plan else Fold.read(plan, rundir)
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
    if links is not None:
        for k, e in ordered.items():
            if e.output is not None and is_s3(e.output):
                ordered[k] = dataclasses.replace(e, output_url=links(e.output))
    failures = tuple(
        Failure(item_id, e.input, e.reason, e.chunk)
        for item_id, e in ordered.items()
        if e.status not in (*ENDED_WELL, "cancelled")
    )
    statuses = Counter(e.status for e in ordered.values())
    now = {cid: run.as_dict() for cid, run in runs.items()}
    chunks = history.whole(rundir, fold, now, state_chunks)  # every run's
    chunk_counts = Counter(str(c["state"]) for c in chunks.values())
    counts = Counts(
        items=len(items),
        ok=statuses["ok"],
        no_face=statuses["no_face"],
        failed=len(failures),
        chunks=len(plan.chunks),
        chunks_done=chunk_counts["done"],
        chunks_failed=chunk_counts["failed"],
        chunks_cancelled=chunk_counts["cancelled"],
        cancelled=statuses["cancelled"],
        segments=len(segments),
    )
    dropped = dict(fold.dropped) or None  # a runner wrote lines no reader understood: said, not hidden
    used = usage.measure(fold, rundir, vars(counts), spec)
    return Report(
        plan.job, image, started, time.time(), counts, failures, ordered, chunks, dropped_lines=dropped, usage=used
    )


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
