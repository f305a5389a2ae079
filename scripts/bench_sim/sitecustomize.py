"""SIMULATED runner, for orchestration benchmarks only (scripts/bench_orchestration.py).

Baked into the throwaway image ffswarm/runner-sim:bench (never used for real jobs). Python imports
it at start-up, before the runner: when /data/bench-sim.json exists it does what a runner does to
the run folder — waits until the calibrated cold start has passed since exec (the real runner's
imports and model loading), waits for the job's identity.json like the real runner, then gives each
item exactly the calibrated per-item time (copying the input to the output atomically and appending
a result line marked provider "simulated" within it) — and exits 0 without loading any model. In a
lane (``FFSWARM_LANE=1``, controller/run/lanes.py) it then writes the attempt's record and, like the
real runner, runs each chunk handed over within the manifest's ``linger``, cold start already paid.
The identity step runs the real runner.
"""

import json
import os
import sys
import time


def _load(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError:
        return None


def _simulate(sim: dict, manifest_path: str, attempt: int) -> "object":
    from contract.manifest import Manifest
    from contract.results import ItemResult, ItemStatus
    from runner_image.log import process_age

    with open(manifest_path) as f:
        m = Manifest.from_json(f.read())
    started = time.time()
    time.sleep(max(0.0, float(sim["cold_seconds"]) - (process_age() or 0.0)))  # exec → models loaded
    while m.identity and (_load(m.identity) or {"pending": True}).get("pending"):
        time.sleep(0.05)  # worker.await_identity polls at the same period
    os.makedirs(f"{m.run_dir}/results", exist_ok=True)
    fd = os.open(m.results_path(attempt), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    due = time.time()
    for item in m.items:
        t0 = due
        os.makedirs(os.path.dirname(item.output), exist_ok=True)
        tmp = f"{os.path.dirname(item.output)}/.{os.path.basename(item.output)}.tmp-sim"
        with open(item.input, "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp, item.output)
        due = t0 + float(sim["item_seconds"])
        time.sleep(max(0.0, due - time.time()))
        r = ItemResult(
            item=item.id,
            status=ItemStatus.OK,
            attempt=attempt,
            input=item.input,
            output=item.output,
            faces=1,
            gpu=os.environ.get("DOCKER_RESOURCE_GPU"),
            provider="simulated",
            started=t0,
            finished=time.time(),
        )
        os.write(fd, r.to_line().encode())
    os.close(fd)
    return m, started


def _record(m: "object", attempt: int, started: float) -> None:
    from contract.attempt import AttemptRecord

    done = time.time()
    record = AttemptRecord(m.job, m.chunk, attempt, started, items_done=len(m.items), exit="OK", finished=done)
    path = f"{m.run_dir}/attempts/{m.chunk}.a{attempt}.json"
    with open(f"{path}.tmp-sim", "w") as f:
        f.write(record.to_json())
    os.replace(f"{path}.tmp-sim", path)


def _lane(sim: dict, first: "object") -> None:
    """Each chunk handed over within ``linger`` (runner_image/linger.py's loop, simulated)."""
    from contract.handoff import Handoff

    seen = 0
    while True:
        deadline, handoff = time.monotonic() + first.linger, None
        while time.monotonic() < deadline:
            got = _load(first.handoff)
            if got is not None and got.get("seq", 0) > seen:
                handoff = Handoff(got["seq"], got.get("manifest"), got.get("attempt", 1))
                break
            time.sleep(0.05)
        if handoff is None or handoff.manifest is None:
            return
        seen = handoff.seq
        m, started = _simulate(sim, handoff.manifest, handoff.attempt)
        _record(m, handoff.attempt, started)


_sim = _load("/data/bench-sim.json")
_manifest = os.environ.get("FFSWARM_MANIFEST", "")
if _sim is not None and _manifest and "identity" not in sys.argv[1:]:
    _attempt = int(os.environ.get("FFSWARM_ATTEMPT", "1"))
    _m, _started = _simulate(_sim, _manifest, _attempt)
    if os.environ.get("FFSWARM_LANE") == "1" and _m.linger > 0 and _m.handoff:
        _record(_m, _attempt, _started)
        _lane(_sim, _m)
    os._exit(0)
