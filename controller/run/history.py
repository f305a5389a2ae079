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

from contract.attempt import TERMINATED, AttemptRecord
from contract.exits import RunnerExit
from controller.job.plan import ID, Plan
from controller.run.attempts import read_record
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.swarm.backend import TaskState

_STATES = ("queued", "running", "done", "failed", "cancelled", "unknown")
_ATTEMPT_KEYS: dict[str, tuple[type, ...]] = {
    "attempt": (int,),
    "service": (str,),
    "node": (str, type(None)),
    "exit_code": (int, type(None)),
    "outcome": (str,),
    "reason": (str, type(None)),
}
_EXIT_OUTCOME = {
    "OK": "done",
    "ITEMS_FAILED": "done",
    "BAD_MANIFEST": "user",
    "MISSING_INPUT": "user",
    "TEMPORARY": "infrastructure",
    TERMINATED: "infrastructure",
}
_OPEN = ("running", "unknown", None)  # an attempt whose ending its controller did not see
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


def recorded(rundir: RunDir, raw: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The chunk records state.json holds (every earlier run's, merged as they were written);
    ``raw``: its "chunks" as the caller has just read them (RunDir.enter), else read here."""
    chunks = (rundir.state() or {}).get("chunks") if raw is None else raw
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


def note_ended(records: dict[str, dict[str, Any]], chunk: str, attempt: str | None, task: TaskState | None) -> bool:
    """An attempt an earlier controller left open (it was stopped) whose service is still there: the
    node and exit code its task shows go into that record before the service is removed, so the
    history names where every attempt ran; an attempt the controller never recorded (stopped between
    making the service and writing state.json) is added. True when the records changed."""
    number = int(attempt) if attempt is not None and attempt.isdigit() and len(attempt) < 7 else None
    if task is None or number is None or not ID.fullmatch(chunk):
        return False
    rec = records.setdefault(chunk, {"state": "running", "failure": None, "reason": None, "avoid_nodes": []})
    atts = rec.setdefault("attempts", [])
    att = next((a for a in atts if a.get("attempt") == number), None)
    if att is not None and att.get("outcome") not in _OPEN:
        return False
    if att is None:
        att = {
            "attempt": number,
            "service": None,
            "node": None,
            "exit_code": None,
            "outcome": "running",
            "reason": None,
        }
        atts.append(att)
        atts.sort(key=lambda a: int(a.get("attempt") or 0))
        changed = True
    else:
        changed = False
    if att.get("node") is None and task.node_id:
        att["node"], changed = task.node_id[:100], True
    if att.get("exit_code") is None and task.exit_code is not None:
        att["exit_code"], changed = task.exit_code, True
    return changed


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


def _ending(record: AttemptRecord | None) -> tuple[str, int | None]:
    """An attempt's outcome and exit code as its runner recorded them ("unknown": no ending written)."""
    kind = record.exit if record is not None else None
    if kind is None:
        return "unknown", None
    code = RunnerExit[kind].value if kind in RunnerExit.__members__ else 143  # TERMINATED: SIGTERM
    return _EXIT_OUTCOME.get(kind, "internal"), code


def _close_open_attempts(rundir: RunDir, chunk: str, rec: dict[str, Any], all_committed: bool) -> None:
    """Attempts a stopped controller left open (Ctrl-C, killed) that ended without it: their ending
    from the runner's attempt record; the last one of a chunk whose items are all committed is done
    (a runner too old to write its record). Nothing is left reading "running" once it is over."""
    attempts = rec["attempts"]
    for n, att in enumerate(attempts):
        if att.get("outcome") not in _OPEN or not isinstance(att.get("attempt"), int):
            continue
        record = read_record(rundir, chunk, att["attempt"])
        outcome, code = _ending(record)
        if outcome == "unknown" and all_committed and n == len(attempts) - 1:
            outcome = "done"
        if outcome != "unknown":
            att["outcome"] = outcome
            att["exit_code"] = att.get("exit_code") if att.get("exit_code") is not None else code
        if outcome not in ("unknown", "done") and att.get("reason") is None and record is not None:
            att["reason"] = record.reason


def from_attempt_records(
    rundir: RunDir, plan: Plan, recorded_: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Attempts no controller recorded (none of ``recorded_`` names them), from their runners' attempt
    records: the stack path's chunks, a run folder whose state.json was lost, or an attempt whose
    controller stopped between making its service and writing state.json. Chunks ``recorded_`` has
    come back with those attempts added."""
    seen = {(cid, a.get("attempt")) for cid, rec in recorded_.items() for a in rec.get("attempts", [])}
    attempts: dict[str, list[dict[str, Any]]] = {}
    for _, name in rundir.attempt_logs():
        if (name.chunk, name.attempt) in seen:
            continue
        record = read_record(rundir, name.chunk, name.attempt)
        outcome, exit_code = _ending(record)
        attempts.setdefault(name.chunk, []).append(
            {
                "attempt": name.attempt,
                "service": None,
                "node": None,
                "exit_code": exit_code,
                "outcome": outcome,
                "reason": record.reason if record is not None else None,
            }
        )
    known = {c.id for c in plan.chunks}
    out = {}
    for cid, atts in attempts.items():
        if cid not in known:
            continue
        earlier = recorded_.get(cid)
        if earlier is not None:
            both = [*earlier.get("attempts", []), *atts]
            out[cid] = {**earlier, "attempts": sorted(both, key=lambda a: int(a.get("attempt") or 0))}
            continue
        atts.sort(key=lambda a: int(a["attempt"]))
        last = atts[-1]["outcome"]
        state = "done" if last == "done" else "failed" if last != "unknown" else "unknown"  # no ending written
        out[cid] = {"state": state, "failure": None, "reason": atts[-1]["reason"], "avoid_nodes": [], "attempts": atts}
    return out


def whole(
    rundir: RunDir,
    fold: Fold,
    now: Mapping[str, Mapping[str, Any]] | None = None,
    state_chunks: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every chunk's record over the job's life: state.json's (``state_chunks``: as the caller has
    just read them), with ``now`` (this run's) merged in, and the attempt records for chunks none of
    those name. A chunk an earlier controller left queued or running (it was stopped) whose items
    are all committed since is done."""
    merged = merge(recorded(rundir, state_chunks), now or {})
    merged.update(from_attempt_records(rundir, fold.plan, merged))
    items = {c.id: c.items for c in fold.plan.chunks}
    for cid, rec in merged.items():
        if cid in (now or {}) or cid not in items:
            continue
        all_committed = all(fold.committed(i) for i in items[cid])
        _close_open_attempts(rundir, cid, rec, all_committed)
        if rec["state"] in ("queued", "running", "unknown", "cancelled") and all_committed:
            rec["state"] = "done"
    return dict(sorted(merged.items()))
