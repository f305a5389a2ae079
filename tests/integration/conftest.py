"""Integration fixtures: the real single-node dev swarm made by scripts/dev-swarm.sh.

Nothing here is mocked. Each test gets a unique job name; everything it creates (services,
containers, run folder, inputs and outputs under the data root) carries that name and is removed in
teardown.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import Config, load_config
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, RunnerSettings, ServiceSpec, chunk_service
from tests.polling import Polling, remove_container

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "ffswarm.yaml"
FAULT_IMAGE = "ffswarm/runner-faults:test"  # listed in the dev config's policy.images (scripts/dev-swarm.sh)


@pytest.fixture(scope="session")
def config() -> Config:
    if not CONFIG.is_file():
        pytest.fail(f"{CONFIG} missing: run scripts/dev-swarm.sh first (scripts/test.sh does)")
    return load_config(str(CONFIG))


@pytest.fixture(scope="session")
def swarm(config: Config) -> DockerSwarm:
    s = DockerSwarm(config.docker_host)
    s.check_manager()
    return s


@dataclass
class Workspace:
    job: str
    root: Path  # data root
    dir: Path  # <root>/tests/<job>: this test's inputs and outputs
    config: Config

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def write_job(self, text: str) -> Path:
        jobs = self.dir / "jobs"
        jobs.mkdir(exist_ok=True)
        path = jobs / f"{self.job}.yaml"
        path.write_text(text)
        return path

    def config_with(self, **policy: Any) -> Path:
        """The dev config with more in its ``policy:`` (hooks, webhooks), for this test alone."""
        data = yaml.safe_load(CONFIG.read_text())
        data["policy"] = {**(data.get("policy") or {}), **policy}
        path = self.dir / "ffswarm.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def ffswarm(self, *args: str, config: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(config or CONFIG), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def workspace(config: Config, swarm: DockerSwarm, request: pytest.FixtureRequest) -> Iterator[Workspace]:
    name = request.node.name.lower().replace("_", "-")
    job = f"t-{''.join(c for c in name if c.isalnum() or c == '-')[:24]}-{uuid.uuid4().hex[:6]}"
    d = config.data_root / "tests" / job
    d.mkdir(parents=True)
    ws = Workspace(job, config.data_root, d, config)
    yield ws
    for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
        swarm.remove_service(svc["ID"])
    for c in swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job}"}):
        remove_container(c)
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(config.data_root / "runs" / job, ignore_errors=True)


def chown_tree(path: Path, owner: str) -> None:
    """Inputs written by the test (as root) must be readable and outputs' folders writable by runners."""
    uid, gid = (int(x) for x in owner.split(":"))
    if os.geteuid() == 0:
        for p in [path, *path.rglob("*")]:
            os.chown(p, uid, gid)


@dataclass
class ServiceWatch(Polling):
    """Polls the swarm while a job runs: how many of its chunk (runner) services existed at once, and
    each one's spec. The submit-time identity step is a separate one-shot service, not counted: its
    spec is kept apart, with whether it was ever seen beside a chunk service."""

    swarm: DockerSwarm
    job: str
    max_alive: int = 0
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    step_specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    identity_beside_chunks: bool = False

    def poll(self) -> None:
        api = self.swarm.client.api
        svcs = api.services(filters={"label": f"{LABEL_JOB}={self.job}"})
        runners = [s for s in svcs if s["Spec"]["Labels"].get("io.ffswarm.role") == "runner"]
        steps = [s for s in svcs if s["Spec"]["Labels"].get("io.ffswarm.role") != "runner"]
        self.max_alive = max(self.max_alive, len(runners))
        self.identity_beside_chunks |= bool(runners) and bool(steps)
        for s in runners:
            self.specs.setdefault(s["Spec"]["Name"], s["Spec"])
        for s in steps:
            self.step_specs.setdefault(s["Spec"]["Name"], s["Spec"])


def shell_service(ws: Workspace, image: str, chunk: str, script: str, constraints: tuple[str, ...] = ()) -> ServiceSpec:
    """A chunk service exactly as ffswarm makes it (GPU, constraint, hardening, volume) whose command is
    a shell script instead of the runner: for proving how the engine treats such services."""
    settings = RunnerSettings(
        job=ws.job,
        image=image,
        constraints=("node.labels.ffswarm.gpu==true", *constraints),
        gpu_kind="GPU",
        gpus=1,
        memory_bytes=256 << 20,
        volume=ws.config.volume,
        user=ws.config.runner_uid_gid(),
    )
    return dataclasses.replace(chunk_service(settings, chunk, 1), command=("/bin/sh", "-c", script))


FAULTS = Path(__file__).parent / "faults"


@pytest.fixture(scope="session")
def fault_image(swarm: DockerSwarm, config: Config) -> str:
    """The real runner image plus test-only fault injection (tests/integration/faults), by the tag
    the dev config's policy.images allows (submit pins it to this image's ID)."""
    base = swarm.resolve_image(config.image)
    swarm.client.images.build(path=str(FAULTS), buildargs={"RUNNER_IMAGE": base}, tag=FAULT_IMAGE, rm=True)
    return FAULT_IMAGE


def results_of(ws: Workspace) -> list[Any]:
    from contract.results import read_results

    out = []
    for f in sorted((ws.root / "runs" / ws.job / "results").glob("*.jsonl")):
        out += read_results(f.read_text())
    return out


def assert_committed_once(ws: Workspace, expected_outputs: int) -> None:
    """Every item's output committed exactly once (one non-cached ok line per item), no temp files."""
    import collections

    done = collections.Counter(r.item for r in results_of(ws) if r.status.value == "ok" and not r.cached)
    assert done and set(done.values()) == {1}, done
    out = ws.dir / "out"
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == expected_outputs == len(done)
    assert not [n for n in names if n.startswith(".")], names
