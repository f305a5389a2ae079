"""What chunks cost, measured by the runners and kept on the data root for `chunk_size: auto`.

Every chunk service pays a cold start before its first item (container start, the runner's
imports, pack check and model sessions: seconds on a GPU node, where CUDA and the model files load)
and its items amortise it. After each job the controller records what its runners measured — the
cold start (the runner's process age when its models were loaded, from its attempt record:
controller/run/attempts.py) and the time per item (each chunk's items' span over their number: items
overlap inside a runner) — per model pack and provider, in ``runs/.timings.json``. `auto` then sizes
image chunks so that the cold start is at most COLD_SHARE of a chunk's time, as long as a chunk stays
well inside its timeout.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from contract.layout import RUNS
from controller import log as ffswarm_log
from controller.job.plan import AUTO_MAX_CHUNK, Plan
from controller.run.attempts import cold_start
from controller.run.fold import Fold
from controller.run.rundir import RunDir
from controller.volume import read_nofollow, write_atomic

FILE = f"{RUNS}/.timings.json"
MAX_BYTES = 1 << 20  # one entry per model pack and provider: a few kB
COLD_SHARE = 0.05  # of a chunk's time, at most, spent before its first item
TIMEOUT_SHARE = 0.5  # of the chunk timeout, at most, that a chunk's items should take
SAMPLE = 50  # chunks read to measure a job (their attempt records and their results)


@dataclass(frozen=True)
class Timing:
    cold_start_s: float
    item_s: float
    job: str
    measured_at: float

    def chunk_cap(self, timeout_s: float) -> int:
        """The largest chunk `auto` makes: big enough that the cold start is ≤ COLD_SHARE of it
        (never below AUTO_MAX_CHUNK), small enough to take ≤ TIMEOUT_SHARE of the timeout."""
        amortised = math.ceil(self.cold_start_s * (1 - COLD_SHARE) / COLD_SHARE / self.item_s)
        in_time = max(1, math.floor(TIMEOUT_SHARE * timeout_s / self.item_s))
        return min(max(AUTO_MAX_CHUNK, amortised), in_time)


def measure(rundir: RunDir, plan: Plan) -> tuple[str, Timing] | None:
    """(provider, Timing) from a finished job's run folder; None when its chunks measured nothing
    usable (no runner loaded models, or no chunk had two items done)."""
    chunks = [c for c in plan.chunks if all(plan.item(i).kind == "image" for i in c.items)][:SAMPLE]
    cold: list[float] = []
    providers: list[str] = []
    for chunk in chunks:
        for log, name in rundir.attempt_logs(chunk.id):
            loaded = cold_start(rundir, name.chunk, name.attempt, log)
            if loaded is not None:
                providers.append(loaded[0])
                cold.append(loaded[1])
    per_item: list[float] = []
    fold = Fold.read(plan, rundir)  # the one reading of results: what the report and status count
    for chunk in chunks:
        results = (fold.result(i) for i in chunk.items)
        done = [r for r in results if r is not None and r.status.value == "ok" and not r.cached]
        if len(done) >= 2:
            span = max(r.finished for r in done) - min(r.started for r in done)
            if span > 0:
                per_item.append(span / len(done))
    if not cold or not per_item:
        return None
    provider = statistics.mode(providers)
    return provider, Timing(
        cold_start_s=round(statistics.median(cold), 3),
        item_s=round(statistics.median(per_item), 5),
        job=rundir.job,
        measured_at=round(time.time(), 3),
    )


def _key(pack: str, provider: str) -> str:
    return f"{pack}/{provider}"


def _read(root: Path) -> dict[str, Any]:
    """The measurements as kept; none when the file is missing, damaged, too big or reached through a link."""
    raw = read_nofollow(root / FILE, MAX_BYTES + 1)
    if raw is None or len(raw) > MAX_BYTES:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def record(root: Path, pack: str, provider: str, timing: Timing, owner: tuple[int, int] | None = None) -> None:
    """Keep the latest measurement per pack and provider (written atomically)."""
    data = _read(root)
    data[_key(pack, provider)] = asdict(timing)
    write_atomic(root / FILE, json.dumps(data, indent=1, sort_keys=True).encode(), owner)


def lookup(root: Path, pack: str, providers: tuple[str, ...]) -> Timing | None:
    """The latest measurement for the pack with the first of the job's providers that has one."""
    data = _read(root)
    for provider in providers:
        entry = data.get(_key(pack, provider))
        if entry is None:
            continue
        timing = checked(entry)
        if timing is not None:
            return timing
        ffswarm_log.get().warning("timing_ignored", file=FILE, key=_key(pack, provider), reason="not a measurement")
    return None


MAX_SECONDS = 86400.0  # a measurement above a day is not one


def checked(entry: object) -> Timing | None:
    """One entry of the shared runs/.timings.json (anyone with volume access can write it), checked:
    finite seconds in range and a job name, else None; a bad value is ignored, never fails a job."""
    if not isinstance(entry, dict) or set(entry) != {f.name for f in fields(Timing)}:
        return None
    cold, item, at, job = entry["cold_start_s"], entry["item_s"], entry["measured_at"], entry["job"]
    numbers = (cold, item, at)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in numbers):
        return None
    if not isinstance(job, str) or not 0 < item <= MAX_SECONDS or not 0 <= cold <= MAX_SECONDS:
        return None
    return Timing(cold_start_s=float(cold), item_s=float(item), job=job, measured_at=float(at))
