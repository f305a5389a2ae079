"""A job's history across runs: every attempt of every chunk, by whichever controller ran it.

Each run of a job (submit, a resume after Ctrl-C, `retry`, serve after a restart) supervises only the
chunks still pending, but what earlier runs recorded is kept: the chunk records in state.json are
merged — attempts appended, never overwritten — and a chunk that no controller watched (the stack
path: `docker stack deploy` of a render) is described from its runners' attempt records
(``attempts/<chunk>.a<n>.json``, controller/run/attempts.py). The report and `status` read this
merge, so they show the whole history after a resume or a retry that had nothing to do.

state.json lives in a run folder the runner's uid can write: its records are read back as hostile,
keeping only known keys of the expected types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.job.plan import Plan
from controller.run.attempts import read_record
from controller.run.fold import Fold
from controller.run.rundir import RunDir

_STATES = ("queued", "running", "done", "failed", "cancelled", "unknown")
_ATTEMPT_KEYS: dict[str, tuple[type, ...]] = {
    "attempt": (int,),
    "service": (str,),
    "node": (str, type(None)),
    "exit_code": (int, type(None)),
    "outcome": (str,),
    "reason": (str, type(None)),
}
_EXIT_OUTCOME = {"OK": "done", "ITEMS_FAILED": "done", "BAD_MANIFEST": "user", "MISSING_INPUT": "user"}
MAX_TEXT = 2000


def _attempt(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key, kinds in _ATTEMPT_KEYS.items():
        value = raw.get(key)
        if isinstance(value, kinds) and not isinstance(value, bool):
            out[key] = value[:MAX_TEXT] if isinstance(value, str) else value
        else:
            out[key] = None
    return out


def clean(raw: object) -> dict[str, Any] | None:
    """One chunk record as read back from state.json; None when it is not one."""
    if not isinstance(raw, dict) or raw.get("state") not in _STATES:
        return None
    attempts = raw.get("attempts")
    kept = [a for a in (_attempt(x) for x in (attempts if isinstance(attempts, list) else [])) if a]
    reason = raw.get("reason")
    failure = raw.get("failure")
    avoid = raw.get("avoid_nodes")
    return {
        "state": raw["state"],
        "failure": failure[:100] if isinstance(failure, str) else None,
        "reason": reason[:MAX_TEXT] if isinstance(reason, str) else None,
        "avoid_nodes": sorted(str(n)[:100] for n in avoid) if isinstance(avoid, list) else [],
        "attempts": kept,
    }


def recorded(rundir: RunDir) -> dict[str, dict[str, Any]]:
    """The chunk records state.json holds (every earlier run's, merged as they were written)."""
    chunks = (rundir.state() or {}).get("chunks")
    if not isinstance(chunks, dict):
        return {}
    out = {}
    for cid, raw in chunks.items():
        rec = clean(raw)
        if isinstance(cid, str) and rec is not None:
            out[cid] = rec
    return out


def last_attempt(records: Mapping[str, Mapping[str, Any]], chunk: str) -> int:
    """The highest attempt number an earlier run recorded for a chunk (0: none)."""
    numbers = [a.get("attempt") for a in records.get(chunk, {}).get("attempts", [])]
    return max((n for n in numbers if isinstance(n, int) and not isinstance(n, bool)), default=0)


def merge(earlier: Mapping[str, Mapping[str, Any]], now: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Earlier runs' chunk records with this run's: a chunk this run watched takes its state from
    this run, its attempts are the earlier ones followed by this run's (an attempt adopted again is
    this run's record of it)."""
    out = {cid: dict(rec) for cid, rec in earlier.items()}
    for cid, rec in now.items():
        mine = list(rec.get("attempts", []))
        numbers = {a.get("attempt") for a in mine}
        before = [a for a in out.get(cid, {}).get("attempts", []) if a.get("attempt") not in numbers]
        out[cid] = {**rec, "attempts": sorted([*before, *mine], key=lambda a: int(a.get("attempt") or 0))}
    return dict(sorted(out.items()))


def from_attempt_records(rundir: RunDir, plan: Plan, skip: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Chunks that no controller recorded (not in ``skip``), from their runners' attempt records:
    the stack path's chunks, or a run folder whose state.json was lost."""
    attempts: dict[str, list[dict[str, Any]]] = {}
    for _, name in rundir.attempt_logs():
        if name.chunk in skip:
            continue
        record = read_record(rundir, name.chunk, name.attempt)
        exit_kind = record.exit if record is not None else None
        attempts.setdefault(name.chunk, []).append(
            {
                "attempt": name.attempt,
                "service": None,
                "node": None,
                "exit_code": None,
                "outcome": _EXIT_OUTCOME.get(exit_kind or "", "internal" if exit_kind else "unknown"),
                "reason": record.reason if record is not None else None,
            }
        )
    known = {c.id for c in plan.chunks}
    out = {}
    for cid, atts in attempts.items():
        if cid not in known:
            continue
        atts.sort(key=lambda a: int(a["attempt"]))
        last = atts[-1]["outcome"]
        state = "done" if last == "done" else "failed" if last != "unknown" else "unknown"  # no ending written
        out[cid] = {"state": state, "failure": None, "reason": atts[-1]["reason"], "avoid_nodes": [], "attempts": atts}
    return out


def whole(rundir: RunDir, fold: Fold, now: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Every chunk's record over the job's life: state.json's, with ``now`` (this run's) merged in,
    and the attempt records for chunks none of those name. A chunk an earlier controller left
    queued or running (it was stopped) whose items are all committed since is done."""
    merged = merge(recorded(rundir), now or {})
    merged.update(from_attempt_records(rundir, fold.plan, merged))
    items = {c.id: c.items for c in fold.plan.chunks}
    for cid, rec in merged.items():
        stale = cid not in (now or {}) and rec["state"] in ("queued", "running", "unknown", "cancelled")
        if stale and cid in items and all(fold.committed(i) for i in items[cid]):
            rec["state"] = "done"
    return dict(sorted(merged.items()))
