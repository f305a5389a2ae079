"""Integration fixtures: the real single-node dev swarm made by scripts/dev-swarm.sh.

Nothing here is mocked. Each test gets a unique job name; everything it creates (services,
containers, run folder, inputs and outputs under the data root) carries that name and is removed in
teardown. Also here: `ffswarm serve` as a process (``Serve``, the ``serve`` fixture) and the
two-tenant API set-up (``tenants``, ``api``; a module overrides ``tenant_settings`` or
``config_extra`` to configure them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from contract.layout import run_rel, tenant_runs_rel
from controller.config import Config, load_config
from controller.run.handover import serving
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


# --- `ffswarm serve` as a process, and the two-tenant API set-up ----------------------------------

LINK_TTL = 6  # seconds: the API's signed links expire soon (test_api.py waits for one to)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    """One `ffswarm serve` subprocess on a test's own inbox; killed in teardown."""

    def __init__(self, inbox: Path, port: int, concurrent_jobs: int = 2, config: Path = CONFIG) -> None:
        self.inbox, self.port, self.concurrent_jobs, self.config = inbox, port, concurrent_jobs, config
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(self.config), "serve",
               "--inbox", str(self.inbox), "--metrics-port", str(self.port), "--metrics-addr", "127.0.0.1",
               "--poll", "0.3", "--concurrent-jobs", str(self.concurrent_jobs)]  # fmt: skip
        log = open(self.inbox.parent / "serve.log", "a")  # noqa: SIM115  (the child keeps it; closed when it ends)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
        log.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


@pytest.fixture
def serve(workspace: Workspace) -> Iterator[Serve]:
    s = Serve(workspace.dir / "inbox", free_port())
    yield s
    s.kill()


@dataclass
class Tenants:
    a: str
    b: str
    keys: dict[str, str]


@dataclass
class Api:
    url: str
    proc: subprocess.Popen[str]
    log: Path

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def tenants(workspace: Workspace) -> Iterator[Tenants]:
    suffix = workspace.job[-6:]
    t = Tenants(f"a-{suffix}", f"b-{suffix}", {})
    t.keys = {t.a: f"key-a-{suffix}", t.b: f"key-b-{suffix}"}
    yield t
    root = workspace.root
    for name in (t.a, t.b):
        shutil.rmtree(root / "tenants" / name, ignore_errors=True)
        shutil.rmtree(root / "tenants" / ".jobs" / name, ignore_errors=True)
        shutil.rmtree(root / tenant_runs_rel(name), ignore_errors=True)  # its packs' and API jobs' run folders


@pytest.fixture
def tenant_settings() -> dict[str, dict[str, Any]]:
    """Each tenant's settings beyond its key (weight, quota), by name; a test module overrides it."""
    return {}


@pytest.fixture
def config_extra() -> dict[str, Any]:
    """Cluster config keys beyond the dev config's (packing …); a test module overrides it."""
    return {}


def _config(
    ws: Workspace, t: Tenants, secrets: Path, settings: dict[str, dict[str, Any]], extra: dict[str, Any]
) -> Path:
    """The dev config plus an API (signed links that expire soon) and the two tenants."""
    (secrets / "api").write_bytes(b"integration-signing-key-" + ws.job.encode())
    data = yaml.safe_load(CONFIG.read_text())
    data["api"] = {"signing_key_file": str(secrets / "api"), "link_ttl": LINK_TTL}
    data["tenants"] = {
        name: {"api_keys_sha256": [hashlib.sha256(key.encode()).hexdigest()], **settings.get(name, {})}
        for name, key in t.keys.items()
    }
    data.update(extra)
    path = secrets / "ffswarm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def api(
    workspace: Workspace,
    tenants: Tenants,
    tmp_path: Path,
    swarm: DockerSwarm,
    tenant_settings: dict[str, dict[str, Any]],
    config_extra: dict[str, Any],
) -> Iterator[Api]:
    config = _config(workspace, tenants, tmp_path, tenant_settings, config_extra)
    inbox = workspace.root / "inbox"
    serve = Serve(inbox, free_port())
    serve_log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(config), "serve",
           "--inbox", str(inbox), "--metrics-port", "0", "--poll", "0.3", "--concurrent-jobs", "2"]  # fmt: skip
    with open(serve_log, "a") as log:
        serve.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    port = free_port()
    api_log = tmp_path / "api.log"
    cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(config), "api",
           "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    with open(api_log, "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    running = Api(f"http://127.0.0.1:{port}", proc, api_log)
    jobs: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:  # the API answers and serve's heartbeat is fresh
            assert proc.poll() is None, api_log.read_text()[-3000:]
            assert serve.proc.poll() is None, serve_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "api or serve did not come up"
            try:
                if httpx.get(f"{running.url}/healthz", timeout=2).status_code == 200 and serving(inbox):
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield running
    finally:
        proc.terminate()
        proc.wait(30)
        serve.kill()
        for name in (tenants.a, tenants.b):
            folder = workspace.root / "tenants" / ".jobs" / name
            jobs += [p.stem for p in folder.glob("*.json")] if folder.is_dir() else []
        for job in jobs:
            for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
                swarm.remove_service(svc["ID"])
            for c in swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job}"}):
                remove_container(c)
            shutil.rmtree(workspace.root / run_rel(job), ignore_errors=True)
            for p in inbox.glob(f"**/{job}.yaml*"):
                p.unlink(missing_ok=True)
