"""Golden tests: `nvidia-smi -L` output → daemon.json and the NVIDIA runtime's swarm-resource line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.errors import UsageError
from controller.swarm.gpuconfig import daemon_json, gpus_from_list, parse_nvidia_smi, render

GOLDEN = Path(__file__).parent / "golden"
ONE = "GPU 0: NVIDIA H200 (UUID: GPU-1d2f4b6a-0c1e-4b7e-9a55-0e6c3f2a9b11)\n"
TWO = (
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
    "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-0b9b1c8e-7f1a-3c2d-9e8f-6a5b4c3d2e1f)\n"
)
EIGHT = "".join(
    f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i})\n" for i in range(8)
)
MIG = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
    "  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de2-a7d5-7b0b7c26fc07)\n"
)


@pytest.mark.parametrize(("name", "text"), [("1gpu", ONE), ("2gpu", TWO), ("8gpu", EIGHT)])
def test_golden(name: str, text: str) -> None:
    got = render(parse_nvidia_smi(text))
    golden = GOLDEN / f"gpu-config-{name}.txt"
    assert got == golden.read_text(), f"differs from {golden}"


def test_eight_gpus_each_advertised_once_in_order() -> None:
    resources = daemon_json(parse_nvidia_smi(EIGHT))["node-generic-resources"]
    assert resources == [f"GPU=GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(8)]


def test_daemon_json_settings() -> None:
    d = daemon_json(parse_nvidia_smi(ONE))
    assert d["default-runtime"] == "nvidia"
    assert d["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}
    assert d["no-new-privileges"] is True
    assert 'swarm-resource = "DOCKER_RESOURCE_GPU"' in render(parse_nvidia_smi(ONE)).splitlines()


def test_mig_lines_are_refused_with_the_line_and_what_to_do() -> None:
    with pytest.raises(UsageError) as e:
        parse_nvidia_smi(MIG)
    msg = str(e.value)
    assert "line 2" in msg and "MIG instance" in msg and "mig 0" in msg and "--gpus" in msg


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no GPUs"),
        ("Failed to initialize NVML: Driver/library version mismatch\n", "not a `nvidia-smi -L`"),
        (ONE + ONE, "listed twice"),
    ],
)
def test_bad_input(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        parse_nvidia_smi(text)


def test_explicit_list() -> None:
    assert [g.uuid for g in gpus_from_list(["GPU-a1", " GPU-b2 "])] == ["GPU-a1", "GPU-b2"]
    with pytest.raises(UsageError, match="MIG"):
        gpus_from_list(["MIG-1"])
    with pytest.raises(UsageError, match="not a GPU UUID"):
        gpus_from_list(["0"])


def test_cli_stdin_file_list_and_out_dir(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["nodes", "gpu-config"], input=TWO)
    assert r.exit_code == 0 and r.output == (GOLDEN / "gpu-config-2gpu.txt").read_text()
    src = tmp_path / "smi.txt"
    src.write_text(ONE)
    r = runner.invoke(cli, ["nodes", "gpu-config", "--from", str(src), "--out-dir", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out" / "daemon.json").read_text()) == daemon_json(parse_nvidia_smi(ONE))
    assert (tmp_path / "out" / "nvidia-runtime.toml").read_text() == 'swarm-resource = "DOCKER_RESOURCE_GPU"\n'
    r = runner.invoke(cli, ["nodes", "gpu-config", "--gpus", "GPU-x1,GPU-x2"])
    assert '"GPU=GPU-x1"' in r.output and '"GPU=GPU-x2"' in r.output
    r = runner.invoke(cli, ["nodes", "gpu-config"], input=MIG)
    assert isinstance(r.exception, UsageError) and "MIG" in str(r.exception)
