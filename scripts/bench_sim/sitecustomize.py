"""SIMULATED runner, for orchestration benchmarks only (scripts/bench_orchestration.py).

Baked into the throwaway image ffswarm/runner-sim:bench (never used for real jobs). Python imports
it at start-up, before the runner: when /data/bench-sim.json exists it does what a runner does to
the run folder — waits the calibrated cold start, then per item waits the calibrated per-item time,
copies the input to the output atomically and appends a result line marked provider "simulated" —
and exits 0 without loading any model. The identity step runs the real runner.
"""

import json
import os
import sys
import time

_argv = sys.argv[1:]
_manifest_path = os.environ.get("FFSWARM_MANIFEST", "")
try:
    with open("/data/bench-sim.json") as _f:
        _sim = json.load(_f)
except OSError:
    _sim = None

if _sim is not None and _manifest_path and "identity" not in _argv:
    from runner_image.manifest import ItemResult, ItemStatus, Manifest

    _m = Manifest.from_json(open(_manifest_path).read())
    _attempt = int(os.environ.get("FFSWARM_ATTEMPT", "1"))
    time.sleep(float(_sim["cold_seconds"]))
    os.makedirs(f"{_m.run_dir}/results", exist_ok=True)
    _fd = os.open(_m.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for _item in _m.items:
        _t0 = time.time()
        time.sleep(float(_sim["item_seconds"]))
        os.makedirs(os.path.dirname(_item.output), exist_ok=True)
        _tmp = f"{os.path.dirname(_item.output)}/.{os.path.basename(_item.output)}.tmp-sim"
        with open(_item.input, "rb") as _src, open(_tmp, "wb") as _dst:
            _dst.write(_src.read())
        os.replace(_tmp, _item.output)
        _r = ItemResult(
            item=_item.id,
            status=ItemStatus.OK,
            attempt=_attempt,
            input=_item.input,
            output=_item.output,
            faces=1,
            gpu=os.environ.get("DOCKER_RESOURCE_GPU"),
            provider="simulated",
            started=_t0,
            finished=time.time(),
        )
        os.write(_fd, _r.to_line().encode())
    os.close(_fd)
    os._exit(0)
