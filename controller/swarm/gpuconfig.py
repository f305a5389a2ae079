"""A GPU node's Docker settings, generated from `nvidia-smi -L` rather than edited by hand (pure).

Swarm schedules GPUs only as generic resources the node's dockerd advertises
(`node-generic-resources: ["GPU=<uuid>", …]`), and the NVIDIA runtime turns the id Swarm assigned
(env `DOCKER_RESOURCE_GPU`) into the device the container sees, but only when its config.toml says
`swarm-resource = "DOCKER_RESOURCE_GPU"`. A typo in either file makes jobs pend forever or every
task see every GPU, so both come from here. The kind is `GPU` (no hyphen: `sh` drops
`DOCKER_RESOURCE_NVIDIA-GPU`; docs/architecture.md#engine-2010-facts-the-code-relies-on).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from controller.errors import UsageError

GPU_KIND = "GPU"
RUNTIME_PATH = "nvidia-container-runtime"
NVIDIA_RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?) \(UUID: (?P<uuid>GPU-[0-9A-Za-z-]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s*MIG\b.*\(UUID: (?P<uuid>MIG-[^)]*)\)")
_UUID = re.compile(r"^GPU-[0-9A-Za-z-]+$")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi -L` lines → GPUs. MIG instances are refused: see the message for why."""
    gpus: list[Gpu] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if _MIG_LINE.match(line):
            raise UsageError(
                f"line {n}: {line.strip()!r} is a MIG instance, and ffswarm schedules whole GPUs only (one "
                "generic resource = one GPU; a chunk's memory and speed are planned per GPU). Disable MIG on this "
                "node (nvidia-smi -i <gpu> -mig 0, then reset the GPU), or pass the whole GPUs to use with --gpus."
            )
        m = _GPU_LINE.match(line)
        if not m:
            raise UsageError(f"line {n}: not a `nvidia-smi -L` GPU line: {line.strip()!r}")
        gpus.append(Gpu(int(m["index"]), m["name"], m["uuid"]))
    if not gpus:
        raise UsageError("no GPUs in the input: expected `nvidia-smi -L` lines like 'GPU 0: NAME (UUID: GPU-…)'")
    _check_unique([g.uuid for g in gpus])
    return gpus


def gpus_from_list(uuids: Sequence[str]) -> list[Gpu]:
    """An explicit list (`--gpus GPU-a,GPU-b`), e.g. to leave a GPU out of Swarm's reach."""
    out = []
    for i, u in enumerate(x.strip() for x in uuids if x.strip()):
        if u.startswith("MIG-"):
            raise UsageError(f"{u}: MIG instances are not supported; list whole GPUs (GPU-…)")
        if not _UUID.match(u):
            raise UsageError(f"{u!r} is not a GPU UUID (GPU-…, as `nvidia-smi -L` prints)")
        out.append(Gpu(i, "", u))
    if not out:
        raise UsageError("--gpus: no GPU UUIDs given")
    _check_unique([g.uuid for g in out])
    return out


def _check_unique(uuids: list[str]) -> None:
    dup = sorted({u for u in uuids if uuids.count(u) > 1})
    if dup:
        raise UsageError(f"GPU listed twice: {', '.join(dup)}")


def daemon_json(gpus: Sequence[Gpu], kind: str = GPU_KIND) -> dict[str, object]:
    """/etc/docker/daemon.json for a GPU node (merge by hand if the node already has one)."""
    return {
        "default-runtime": "nvidia",
        "runtimes": {"nvidia": {"path": RUNTIME_PATH, "runtimeArgs": []}},
        "node-generic-resources": [f"{kind}={g.uuid}" for g in gpus],
        # Engine 20.10 has no per-service no-new-privileges: it is a daemon setting
        # (docs/architecture.md#engine-2010-facts-the-code-relies-on).
        "no-new-privileges": True,
    }


def runtime_toml_line(kind: str = GPU_KIND) -> str:
    """The top-level line for /etc/nvidia-container-runtime/config.toml (commented out by default)."""
    return f'swarm-resource = "DOCKER_RESOURCE_{kind}"'


def render(gpus: Sequence[Gpu], kind: str = GPU_KIND) -> str:
    """What `ffswarm nodes gpu-config` prints: both files, each under a header naming where it goes."""
    return (
        f"# /etc/docker/daemon.json ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})\n"
        + json.dumps(daemon_json(gpus, kind), indent=2)
        + f"\n# {NVIDIA_RUNTIME_CONFIG} (top level, before any [section])\n"
        + runtime_toml_line(kind)
        + "\n"
    )
