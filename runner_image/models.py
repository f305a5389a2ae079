"""The model pack: verify it, pick execution providers, load the three models once per process.

A pack is ``<root>/models/<name>/pack.yaml`` plus ONNX files; pack.yaml names each file's role and
sha256. Every file is hashed before use: a truncated copy on NFS or a swapped file must fail the chunk
with exit 66 naming the file, not produce silently different faces.

Providers follow the manifest's list in order (``cuda`` → CUDAExecutionProvider on device 0: under
the NVIDIA runtime the container sees only the GPU Swarm assigned it; ``cpu`` → CPUExecutionProvider).
CPU is used only if listed; when CUDA cannot run and CPU is not allowed the attempt is temporary
(exit 75) so that the controller retries on another node.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from contract.pack import ROLES, Pack, sha256_file
from contract.swapper import SWAPPER_MODEL, contract_of

from . import genderage, masks, swappers
from .errors import MissingInput, Temporary
from .frame_enhancer import FrameEnhancer
from .insightface_lite import model_zoo
from .pack import verify_pack

__all__ = ["ROLES", "Models", "Pack", "load_models", "sha256_file", "verify_pack"]

ORT_NAMES = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
DET_SIZE = (640, 640)
DET_THRESH = 0.5
INSIGHTFACE_ROLES = ("detector", "recognizer", "swapper")  # loaded through insightface's model_zoo
# plain onnxruntime sessions (insightface has no class for these)
BARE_ROLES = ("enhancer", "frame_enhancer", "genderage", "occluder", "face_parser", "swapper_converter")


@dataclass(frozen=True)
class ProviderPlan:
    """What to ask onnxruntime for, and what we will report if it is granted."""

    name: str  # "cuda" | "cpu"
    ort_providers: list[str]
    ort_options: list[dict[str, str]]
    allow_cpu: bool
    fallback: str | None = None  # why the first requested provider is not used


def plan_providers(requested: Sequence[str], available: Sequence[str]) -> ProviderPlan:
    """Pure choice from the manifest's providers and onnxruntime's available list."""
    allow_cpu = "cpu" in requested
    skipped: list[str] = []
    for name in requested:
        if ORT_NAMES[name] not in available:
            skipped.append(f"{name} requested but {ORT_NAMES[name]} is not available (have {', '.join(available)})")
            continue
        providers, options = [ORT_NAMES[name]], [_provider_options(name)]
        if name != "cpu" and allow_cpu:
            providers.append(ORT_NAMES["cpu"])
            options.append({})
        return ProviderPlan(name, providers, options, allow_cpu, "; ".join(skipped) or None)
    raise Temporary("no usable execution provider: " + "; ".join(skipped))


def _provider_options(name: str) -> dict[str, str]:
    if name == "cuda":
        return {"device_id": "0"}
    return {}


def cpu_budget() -> int:
    """CPUs this process may use: affinity, capped by a cgroup CPU quota (Swarm's --limit-cpu)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, max(1, int(quota + 0.5)))
    return max(1, count)


def _cgroup_quota() -> float | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


def session_options(plan: ProviderPlan, threads: int) -> Any:
    so = ort.SessionOptions()
    # On CPU the pipeline runs one item per core (worker.inflight), each session call on one thread:
    # for these small convolutions item-level parallelism beats intra-op threads, and idle pool
    # threads must not spin against the other items.
    # On CUDA, CPU threads only run the odd CPU-placed node; a few are plenty.
    so.intra_op_num_threads = 1 if plan.name == "cpu" else min(threads, 4)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0" if plan.name == "cpu" else "1")
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return so


@dataclass
class Models:
    """The three loaded models and the provider that actually runs them."""

    detector: Any
    recognizer: Any
    swapper: Any  # insightface's INSwapper, or a swappers.SwapperModel (simswap, hyperswap, ghost); None unless loaded
    provider: str  # "cuda" | "cpu": what onnxruntime granted, not what was asked
    threads: int
    notes: list[str] = field(default_factory=list)  # fallbacks worth a warning line
    enhancer: Any = None  # a bare onnxruntime session (GFPGAN contract), when the job enhances
    frame_enhancer: Any = None  # a FrameEnhancer (Real-ESRGAN contract, its scale read once), when asked for
    genderage: Any = None  # a genderage.GenderAge, when the manifest's selector filters by gender or age
    occluder: Any = None  # a masks.Occluder, when the manifest's mask_types lists occlusion
    face_parser: Any = None  # a masks.FaceParser, when the manifest's mask_types lists region


def load_models(
    pack: Pack,
    requested: Sequence[str],
    *,
    det_size: int = DET_SIZE[0],
    det_thresh: float = DET_THRESH,
    roles: Sequence[str] = INSIGHTFACE_ROLES,
    swapper_model: str = SWAPPER_MODEL,
) -> Models:
    """Create the sessions once for the whole chunk. insightface prints to stdout, which is our
    JSON log stream, so its chatter is sent to stderr while it loads. ``swapper_model``: the
    manifest's; a model insightface does not know (simswap, hyperswap, ghost) is a plain session
    whose contract runner_image/swappers.py checks."""
    contract = contract_of(swapper_model)
    bare = BARE_ROLES if contract.family == "inswapper" else (*BARE_ROLES, "swapper")
    plan = plan_providers(requested, ort.get_available_providers())
    threads = cpu_budget()
    notes = [plan.fallback] if plan.fallback else []
    loaded: dict[str, Any] = {}
    with contextlib.redirect_stdout(sys.stderr):
        for role in roles:
            try:
                if role in bare:  # insightface has no class for these: plain sessions
                    model = _Bare(
                        ort.InferenceSession(
                            str(pack.files[role]),
                            sess_options=session_options(plan, threads),
                            providers=plan.ort_providers,
                            provider_options=plan.ort_options,
                        )
                    )
                else:
                    model = model_zoo.get_model(
                        str(pack.files[role]),
                        providers=plan.ort_providers,
                        provider_options=plan.ort_options,
                        sess_options=session_options(plan, threads),
                    )
            except Exception as e:
                if plan.name == "cuda":  # most likely the device or its libraries: another node may do
                    raise Temporary(f"cannot initialise CUDA for {pack.files[role].name}: {e}") from e
                # on CPU a file whose checksum matched but does not load is a broken pack
                raise MissingInput(f"model pack {pack.shown}: {pack.files[role].name} does not load: {e}") from e
            if model is None:
                raise MissingInput(f"model pack {pack.shown}: {pack.files[role].name} is not a recognised {role} model")
            loaded[role] = model
    granted = {loaded[role].session.get_providers()[0] for role in roles}
    provider = "cuda" if granted == {ORT_NAMES["cuda"]} else "cpu"
    if plan.name == "cuda" and provider != "cuda":
        if not plan.allow_cpu:
            raise Temporary(f"CUDAExecutionProvider failed to initialise (got {sorted(granted)}); cpu is not allowed")
        notes.append(f"CUDAExecutionProvider failed to initialise; running on {sorted(granted)}")
    _check_roles(pack, loaded)
    if "swapper" in bare and "swapper" in loaded:  # its contract (and its converter's) checked now
        bound: dict[str, Any] = {r: loaded[r].session for r in ("swapper", "swapper_converter") if r in loaded}
        loaded["swapper"] = swappers.load(contract, bound, pack.files, pack.shown)
    loaded["detector"].prepare(0, input_size=(det_size, det_size), det_thresh=det_thresh)
    enhancer = loaded["enhancer"].session if "enhancer" in loaded else None
    frame = None
    if "frame_enhancer" in loaded:  # its contract checked now, naming the file, before any item
        try:
            frame = FrameEnhancer(loaded["frame_enhancer"].session)
        except MissingInput as e:
            raise MissingInput(f"model pack {pack.shown}: {pack.files['frame_enhancer'].name}: {e}") from None
    models = Models(
        loaded["detector"], loaded["recognizer"], loaded.get("swapper"), provider, threads, notes, enhancer, frame
    )
    if "genderage" in loaded:  # its contract checked now, naming the file, before any item
        try:
            models.genderage = genderage.load(loaded["genderage"].session, pack.files["genderage"])
        except MissingInput as e:
            raise MissingInput(f"model pack {pack.shown}: {pack.files['genderage'].name}: {e}") from None
    sessions: dict[str, Any] = {r: loaded[r].session for r in ("occluder", "face_parser") if r in loaded}
    for role, model in masks.load(sessions, pack.files, pack.shown).items():  # contracts checked now
        setattr(models, role, model)
    return models


@dataclass(frozen=True)
class _Bare:
    session: Any


def _check_roles(pack: Pack, loaded: dict[str, Any]) -> None:
    """insightface routes by graph shape; a file in the wrong role is a broken pack, not a bug."""
    expected = {"detector": "SCRFD", "recognizer": "ArcFaceONNX", "swapper": "INSwapper"}
    for role, cls in expected.items():
        if role in loaded and isinstance(loaded[role], _Bare):
            continue  # not insightface's: runner_image/swappers.py checks it
        if role in loaded and type(loaded[role]).__name__ != cls:
            raise MissingInput(
                f"model pack {pack.shown}: {pack.files[role].name} loads as {type(loaded[role]).__name__}, not a {role}"
            )
    if not getattr(loaded["detector"], "use_kps", False):
        raise MissingInput(f"model pack {pack.shown}: {pack.files['detector'].name} gives no keypoints")
