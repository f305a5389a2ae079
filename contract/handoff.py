"""A lingering runner's next chunk (``runners.linger``, ``packing.linger``). Standard library only.

A lane (a chunk service the controller started as one: ``FFSWARM_LANE=1`` in its environment) may
*linger*: after its chunk it keeps its models loaded and waits up to ``linger`` seconds (the
manifest's) for the controller to hand it another chunk (its job's next, or another pack's) instead of
exiting; a runner in any other service exits after its chunk whatever its manifest says. The
controller hands one over by replacing the hand-off file the manifest names (``chunks/<chunk>.lane.json``
in the run folder of the chunk that started the lane: only the controller writes there) with a
higher ``seq``; the runner runs that chunk exactly as a fresh service would (its own attempt record,
results, log), then waits again. ``manifest`` None with a higher ``seq``: stop now. The file exists
from the lane's start (``seq`` 0: nothing yet), so that NFS clients, which may cache a missing name,
re-read it promptly.

Manifest fields (both optional, absent at their defaults so that older runners read the file unchanged):
``linger`` (seconds, 0: exit after the chunk as always) and ``handoff`` (the file's container path).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError
from contract.layout import RUNS, TENANT_RUNS
from contract.paths import CONTAINER_DATA_ROOT, require_container_path

ENV_LANE = "FFSWARM_LANE"  # "1": this service is a lane, its runner lingers as its manifest says
LINGER_MAX = 600.0  # seconds a runner may wait for its next chunk
LINGER_FIELDS = ("linger", "handoff")
MAX_HANDOFF_BYTES = 4096
MAX_SEQ = 10**9
MAX_ATTEMPT = 100_000  # contract/attempt.py's (which imports the manifest, and so this module: not imported)
_ID = r"[a-z0-9][a-z0-9-]{0,79}"
_RUN = rf"{RUNS}/(?:{re.escape(TENANT_RUNS)}/{_ID}/)?{_ID}"  # contract/layout.py run_rel
_MANIFEST = re.compile(re.escape(CONTAINER_DATA_ROOT) + rf"/{_RUN}/chunks/{_ID}\.json")


def check_linger(linger: Any, handoff: Any) -> None:
    """The manifest's two fields; ManifestError naming the first one refused."""
    number = isinstance(linger, int | float) and not isinstance(linger, bool)
    if not number or not math.isfinite(linger) or not 0 <= linger <= LINGER_MAX:
        raise ManifestError(f"linger must be a number of seconds in [0, {LINGER_MAX:g}], got {linger!r}")
    if handoff is None:
        if linger > 0:
            raise ManifestError("linger needs handoff: the file the controller hands the next chunk over in")
        return
    if not isinstance(handoff, str):
        raise ManifestError(f"handoff must be a path, got {handoff!r}")
    require_container_path(handoff, "handoff")


def read_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The linger fields present in ``data`` (a parsed manifest), checked."""
    out: dict[str, Any] = {}
    if "linger" in data:
        out["linger"] = data["linger"]
    if data.get("handoff") is not None:
        out["handoff"] = data["handoff"]
    if out:
        check_linger(out.get("linger", 0.0), out.get("handoff"))
        if "linger" in out:
            out["linger"] = float(out["linger"])
    return out


@dataclass(frozen=True)
class Handoff:
    """What the controller has handed a lingering runner: the ``seq``-th chunk (0: none yet)."""

    seq: int
    manifest: str | None = None  # container path of runs/<job>/chunks/<chunk>.json; None: stop
    attempt: int = 1

    def __post_init__(self) -> None:
        for name, value, top in (("seq", self.seq, MAX_SEQ), ("attempt", self.attempt, MAX_ATTEMPT)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                raise ManifestError(f"hand-off {name} must be an integer in [0, {top}], got {value!r}")
        if self.attempt < 1:
            raise ManifestError("hand-off attempt must be at least 1")
        if self.manifest is not None and (not isinstance(self.manifest, str) or not _MANIFEST.fullmatch(self.manifest)):
            raise ManifestError(f"hand-off manifest must be a chunk manifest under /data/runs, got {self.manifest!r}")

    @property
    def stop(self) -> bool:
        return self.seq > 0 and self.manifest is None

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "manifest": self.manifest, "attempt": self.attempt}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Handoff:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ManifestError(f"hand-off is not JSON: {e}") from None
        if not isinstance(data, dict) or set(data) - {"seq", "manifest", "attempt"}:
            raise ManifestError("hand-off must be an object of seq, manifest, attempt")
        return cls(seq=data.get("seq"), manifest=data.get("manifest"), attempt=data.get("attempt", 1))  # type: ignore[arg-type]
