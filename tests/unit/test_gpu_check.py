"""scripts/gpu-check.sh: on a machine without a usable NVIDIA GPU it says so in one line and exits 69;
its table (scripts/gpu_check.py) is Markdown rows ready for benchmarks/RESULTS.md.

The figures themselves need a GPU and minutes (docs/development.md#benchmarks): ``--cpu-only`` with
the dev venv runs the CPU rows here; no test times it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
EX_UNAVAILABLE = 69


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_ffswarm_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = _script("gpu_check")


def _run(args: list[str], path: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def _fake_nvidia_smi(folder: Path, code: int) -> Path:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho 'GPU 0: Fake'\nexit {code}\n")
    tool.chmod(0o755)
    return folder


def test_without_nvidia_smi_it_says_so_in_one_line_and_exits_69(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()  # no nvidia-smi, and no other program either: the check comes before any
    done = _run([], str(empty))
    assert done.returncode == EX_UNAVAILABLE
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["gpu-check: no usable NVIDIA GPU here: nvidia-smi not found"]


def test_a_failing_nvidia_smi_means_no_gpu(tmp_path: Path) -> None:
    done = _run(["--quick"], str(_fake_nvidia_smi(tmp_path / "bin", 9)))
    assert done.returncode == EX_UNAVAILABLE
    assert done.stderr.splitlines() == [
        "gpu-check: no usable NVIDIA GPU here: nvidia-smi failed (no driver or no device)"
    ]


def test_onnxruntime_without_cuda_means_no_gpu(tmp_path: Path) -> None:
    """The dev venv's onnxruntime is the CPU build: with a working nvidia-smi the venv's own check says so."""
    fake = _fake_nvidia_smi(tmp_path / "bin", 0)
    done = _run(["--venv", sys.prefix], f"{fake}:{os.environ['PATH']}")
    assert done.returncode == EX_UNAVAILABLE, done.stderr[-2000:]
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("gpu-check: no usable NVIDIA GPU here: onnxruntime")
    assert "lists no CUDAExecutionProvider (it has " in line and "CPUExecutionProvider" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option --bogus"),
        (["--venv"], "--venv needs a value"),
        (["--cpu-only", "--venv", "/nonexistent/venv"], "--venv /nonexistent/venv has no bin/python"),
    ],
)
def test_a_bad_option_is_named_and_exits_64(args: list[str], message: str) -> None:
    done = _run(args, os.environ["PATH"])
    assert done.returncode == 64
    assert done.stderr.splitlines() == [f"gpu-check: {message} (--help lists the options)"]


def test_a_full_run_measures_every_chain_on_cuda_and_the_swapper_on_cpu() -> None:
    full = gpu_check.cases(quick=False, cpu_only=False, cores=16)
    cuda = [c for c in full if c.provider == "cuda"]
    assert {(c.precision, c.photos) for c in cuda} == {(p, s) for p in ("fp32", "fp16") for s in ("one", "several")}
    assert len(cuda) == 4 * len(gpu_check.CHAINS)
    assert {c.chain for c in cuda} == {label for label, _, _ in gpu_check.CHAINS}
    cpu = [(c.precision, c.photos, c.count) for c in full if c.provider == "cpu"]
    assert cpu == [("fp32", "one", 8), ("fp16", "one", 8), ("fp32", "several", 1)]
    quick = gpu_check.cases(quick=True, cpu_only=False, cores=2)
    assert {c.chain for c in quick} == {"face_swapper"} and len(quick) == 5
    assert all(c.provider == "cpu" for c in gpu_check.cases(quick=True, cpu_only=True, cores=2))


def _result(images: int, faces: int, wall: float) -> dict[str, Any]:
    stages = {"decode": 0.1, "detect": 0.2, "embed": 0.0, "swap": 0.4, "paste": 0.1, "encode": 0.1, "write": 0.0}
    return {
        "images": images,
        "faces": faces,
        "wall": wall,
        "setup": 3.5,
        "stages": {k: v * images for k, v in stages.items()},
        "images_per_s": images / wall,
        "faces_per_s": faces / wall,
    }


def test_the_report_is_markdown_rows_with_heading_ceiling_and_ratios() -> None:
    swapper = gpu_check.CHAINS[0]
    cuda = gpu_check.Case("cuda", "fp16", "several", 12, swapper[0], swapper[1])
    cpu = gpu_check.Case("cpu", "fp32", "one", 2, swapper[0], swapper[1])
    masks = gpu_check.Case("cuda", "fp32", "one", 48, *gpu_check.CHAINS[2][:2])
    runs = [(cuda, _result(12, 72, 1.2)), (cpu, _result(2, 2, 20.0)), (masks, None)]
    alone = {("cuda", "fp16", 1): 400.0, ("cuda", "fp16", 4): 600.0, ("cpu", "fp32", 1): 0.125}
    text = gpu_check.report(runs, alone, "**2026-12-02** · machine · commit `abc1234` · `scripts/gpu-check.sh`")
    lines = text.splitlines()
    assert lines[0].startswith("**2026-12-02** · ") and lines[1] == ""
    rows = [line for line in lines if line.startswith("|")]
    assert {row.count("|") for row in rows} == {rows[0].count("|")}  # one cell per column in every row
    assert "289 (419 with 4+ callers)" in rows[2]
    assert rows[3].startswith("| cuda · fp16 · model alone, 1 caller |") and "| 400 |" in rows[3]
    assert rows[4].startswith("| cuda · fp16 · model alone, 4 callers |") and "| 2.08 |" in rows[4]  # 600 ÷ 289
    cells = [c.strip() for c in rows[6].strip("|").split("|")]
    assert cells[:7] == [
        "cuda · fp16 · six faces, 12 × 1280×886",
        "face_swapper",
        "10.0",
        "60.0",
        "0.10",
        "0.21",
        "3.5",
    ]
    assert cells[7:] == ["200", "0.00", "400", "100", "200"]  # ms per image: detect, embed, swap, paste, the rest
    cells = [c.strip() for c in rows[7].strip("|").split("|")]
    assert cells[:6] == ["cpu · fp32 · one face, 2 × 512²", "face_swapper", "0.100", "0.100", "0.80", "—"]
    assert rows[8].startswith("| cuda · fp32 · one face, 48 × 512² | face_swapper, mask box + region | failed |")
