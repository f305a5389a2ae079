"""Fault injection for integration tests, baked only into the test image ffswarm/runner-faults.

Python imports sitecustomize at start-up (PYTHONPATH=/opt/faults), before the runner runs. It reads
/data/tests/<job>/faults.json, written by the test, and for this chunk and attempt may sleep first
and/or exit with a chosen code — so tests drive real services through real failures:
  {"c0000": {"1": {"exit": 70}}, "*": {"*": {"sleep": 3}}}
"""

import json
import os
import sys
import time

_manifest = os.environ.get("FFSWARM_MANIFEST", "")
_parts = _manifest.split("/")  # /data/runs/<job>/chunks/<chunk>.json
if len(_parts) == 6 and _parts[2] == "runs":
    _job, _chunk = _parts[3], _parts[5].removesuffix(".json")
    _attempt = os.environ.get("FFSWARM_ATTEMPT", "1")
    try:
        with open(f"/data/tests/{_job}/faults.json") as _f:
            _faults = json.load(_f)
    except (OSError, ValueError):
        _faults = {}
    _rule = {
        **_faults.get("*", {}).get("*", {}),
        **_faults.get(_chunk, {}).get("*", {}),
        **_faults.get(_chunk, {}).get(_attempt, {}),
    }
    if "sleep" in _rule:
        time.sleep(float(_rule["sleep"]))
    if "exit" in _rule:
        print(f"fault injected: exit {_rule['exit']}", file=sys.stderr, flush=True)
        os._exit(int(_rule["exit"]))
