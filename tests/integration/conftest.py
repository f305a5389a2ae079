"""Integration fixtures: the real single-node dev swarm made by scripts/dev-swarm.sh.

Nothing here is mocked. Each test gets a unique job name; everything it creates (services,
containers, run folder, inputs and outputs under the data root) carries that name and is removed in
teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller.config import Config, load_config
from controller.servicespec import LABEL_JOB
from controller.swarm import DockerSwarm

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "ffswarm.yaml"


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
        c.remove(force=True)
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(config.data_root / "runs" / job, ignore_errors=True)


def chown_tree(path: Path, owner: str) -> None:
    """Inputs written by the test (as root) must be readable and outputs' folders writable by runners."""
    uid, gid = (int(x) for x in owner.split(":"))
    if os.geteuid() == 0:
        for p in [path, *path.rglob("*")]:
            os.chown(p, uid, gid)


@dataclass
class ServiceWatch:
    """Polls the swarm while a job runs: how many of its chunk (runner) services existed at once, and
    each one's spec. The submit-time identity step is a separate one-shot service, not counted."""

    swarm: DockerSwarm
    job: str
    max_alive: int = 0
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ServiceWatch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _loop(self) -> None:
        api = self.swarm.client.api
        while not self._stop.is_set():
            svcs = api.services(filters={"label": [f"{LABEL_JOB}={self.job}", "io.ffswarm.role=runner"]})
            self.max_alive = max(self.max_alive, len(svcs))
            for s in svcs:
                self.specs.setdefault(s["Spec"]["Name"], s["Spec"])
            time.sleep(0.05)


FAULTS = Path(__file__).parent / "faults"


@pytest.fixture(scope="session")
def fault_image(swarm: DockerSwarm, config: Config) -> str:
    """The real runner image plus test-only fault injection (tests/integration/faults)."""
    base = swarm.resolve_image(config.image)
    image, _ = swarm.client.images.build(
        path=str(FAULTS), buildargs={"RUNNER_IMAGE": base}, tag="ffswarm/runner-faults:test", rm=True
    )
    return str(image.id)


def results_of(ws: Workspace) -> list[Any]:
    from runner_image.manifest import read_results

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
