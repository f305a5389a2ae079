"""report.json and the counts the CLI prints: what happened to every item, video and chunk."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from contract.paths import user_text
from contract.results import ItemStatus
from controller.job.plan import Plan
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.join import joins
from controller.run.rundir import RunDir


def build_report(plan: Plan, rundir: RunDir, runs: dict[str, ChunkRun], image: str, started: float) -> dict[str, Any]:
    """Every path in it is relative to the data root, as the job file names them: items' input and
    output come from the plan, and reasons name files that way (a runner writes them so; a result
    line of an older runner is rewritten here)."""
    items: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    segments: dict[str, dict[str, Any]] = {}  # a video's segments are reported as the video
    for chunk in plan.chunks:
        results = rundir.latest_results(chunk.id)
        run = runs.get(chunk.id)
        for item_id in chunk.items:
            planned = plan.item(item_id)
            r = results.get(item_id)
            if r is not None:
                status, reason, output = r.status.value, r.reason and user_text(r.reason), r.output
            elif run is not None and run.state is ChunkState.FAILED:
                status, reason, output = "error", f"chunk {chunk.id} failed: {run.reason}", None
            elif run is not None and run.state is ChunkState.CANCELLED:
                status, reason, output = "cancelled", "job cancelled", None
            else:
                status, reason, output = "error", f"no result recorded by chunk {chunk.id}", None
            entry: dict[str, Any] = {
                "input": planned.input,
                "output": planned.output if output else None,
                "status": status,
                "reason": reason,
                "chunk": chunk.id,
            }
            if planned.kind == "segment":
                segments[item_id] = entry
            else:
                items[item_id] = entry
    items.update(report_items(plan, rundir, segments))
    for item_id, entry in sorted(items.items()):
        counts[entry["status"]] += 1
        if entry["status"] not in (ItemStatus.OK.value, ItemStatus.NO_FACE.value):
            failures.append(
                {"item": item_id, "input": entry["input"], "reason": entry["reason"], "chunk": entry["chunk"]}
            )
    chunk_counts = Counter(r.state.value for r in runs.values())
    return {
        "job": plan.job,
        "image": image,
        "started": started,
        "finished": time.time(),
        "counts": {
            "items": len(items),
            "ok": counts["ok"],
            "no_face": counts["no_face"],
            "failed": len(failures),
            "chunks": len(plan.chunks),
            "chunks_done": chunk_counts["done"],
            "chunks_failed": chunk_counts["failed"],
            "chunks_cancelled": chunk_counts["cancelled"],
        },
        "failures": failures,
        "items": items,
        "chunks": {cid: run.as_dict() for cid, run in sorted(runs.items())},
    }


def exit_code(report: dict[str, Any]) -> int:
    """CLI: 0 every item ok (no_face per policy is not a failure) · 1 failed items or chunks."""
    c = report["counts"]
    return 0 if c["failed"] == 0 and c["chunks_failed"] == 0 and c["chunks_cancelled"] == 0 else 1


def report_items(plan: Plan, rundir: RunDir, segments: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One report entry per video target, from the plan, its segments' entries and the join."""
    joined_all = joins(rundir)
    out: dict[str, dict[str, Any]] = {}
    for v in plan.videos:
        entry: dict[str, Any] = {"input": v.input, "output": None, "kind": "video", "segments": len(v.segments)}
        seg_entries = [segments[s] for s in v.segments if s in segments]
        bad = [(s, e) for s, e in zip(v.segments, seg_entries, strict=False) if e["status"] not in ("ok", "no_face")]
        joined = joined_all.get(v.id)
        if v.error is not None:
            entry.update(status="error", reason=f"{v.input}: {v.error}", chunk=None)
        elif bad:
            sid, e = bad[0]
            status = "cancelled" if all(e["status"] == "cancelled" for _, e in bad) else "error"
            entry.update(status=status, reason=f"segment {sid}: {e['reason']}", chunk=e["chunk"])
        elif joined is None:
            entry.update(status="error", reason="segments done but not joined", chunk=None)
        else:
            output = v.output if joined.output else None
            entry.update(status=joined.status.value, reason=joined.reason, output=output, chunk=None)
        entry["info"] = v.info
        out[v.id] = entry
    return out
