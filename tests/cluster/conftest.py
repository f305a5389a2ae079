"""The three-node test swarm (scripts/cluster.sh) as pytest fixtures.

The session fixture brings the cluster up and tears it down again, unless it was already up when the
session started (then it is reused and left as found) or FFSWARM_CLUSTER_KEEP=1 is set. Each test
gets a unique job name; its services, task containers on every node, run folder and files are
removed in teardown. Nothing is mocked: the controller runs as the `ffswarm` CLI against the
manager's API on loopback, runners run on the worker nodes' dockerd.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.polling import Polling, remove_container

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "build" / "cluster" / "state.json"
MANAGER, W1, W2 = "ffswarm-mgr", "ffswarm-w1", "ffswarm-w2"
WORKERS = (W1, W2)
RUNNER_OWNER = (10001, 10001)


@dataclass
class Cluster:
    config: Path
    data_root: Path
    image: str  # registry reference by digest, as the config names it
    digest: str
    node_ids: dict[str, str]  # container name → swarm node id
    apis: dict[str, DockerSwarm]  # container name → that node's engine
    bring_up_s: float | None  # None when the cluster was already up

    @property
    def manager(self) -> DockerSwarm:
        return self.apis[MANAGER]

    def node_name(self, node_id: str | None) -> str:
        return {v: k for k, v in self.node_ids.items()}.get(node_id or "", f"?{node_id}")

    def node_state(self, name: str) -> tuple[str, str]:
        node = self.manager.client.api.inspect_node(self.node_ids[name])
        return str(node["Status"]["State"]), str(node["Spec"]["Availability"])

    def set_availability(self, name: str, availability: str) -> None:
        api = self.manager.client.api
        node = api.inspect_node(self.node_ids[name])
        spec = dict(node["Spec"], Availability=availability)
        api.update_node(self.node_ids[name], node["Version"]["Index"], spec)


def _script(action: str) -> None:
    proc = subprocess.run([str(ROOT / "scripts" / "cluster.sh"), action], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/cluster.sh {action} failed:\n{proc.stdout}\n{proc.stderr}")
    sys.stderr.write(proc.stdout)


def _running(name: str) -> bool:
    proc = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True)
    return proc.stdout.strip() == "true"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reuse = STATE.is_file() and _running(MANAGER)
    t0 = time.monotonic()
    if not reuse:
        _script("up")
    bring_up = None if reuse else time.monotonic() - t0
    state = json.loads(STATE.read_text())
    apis = {name: DockerSwarm(url) for name, url in state["apis"].items()}
    c = Cluster(
        config=Path(state["config"]),
        data_root=Path(state["data_root"]),
        image=state["image"],
        digest=state["digest"],
        node_ids=dict(state["node_ids"]),
        apis=apis,
        bring_up_s=bring_up,
    )
    if bring_up is not None:
        sys.stderr.write(f"\ncluster: bring-up {bring_up:.1f} s\n")
    try:
        yield c
    finally:
        if not reuse and os.environ.get("FFSWARM_CLUSTER_KEEP") != "1":
            _script("down")


@dataclass
class Job:
    """One test's job name and its folder on the shared data root."""

    name: str
    cluster: Cluster
    dir: Path

    @property
    def root(self) -> Path:
        return self.cluster.data_root

    @property
    def run(self) -> Path:
        return self.root / "runs" / self.name

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def write_job(self, body: str) -> Path:
        path = self.dir / "job.yaml"
        path.write_text(f"name: {self.name}\n{body}")
        return path

    def chown(self) -> None:
        for p in [self.dir, *self.dir.rglob("*")]:
            os.chown(p, *RUNNER_OWNER)

    def submit(self, job_file: Path) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(self.cluster.config)]
        return subprocess.Popen(
            [*cmd, "submit", str(job_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )

    def report(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run / "report.json").read_text())
        return data


@pytest.fixture
def job(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Job]:
    short = "".join(c for c in request.node.name.lower().replace("_", "-") if c.isalnum() or c == "-")
    name = f"k-{short.removeprefix('test-')[:20]}-{uuid.uuid4().hex[:6]}"
    d = cluster.data_root / "tests" / name
    d.mkdir(parents=True)
    yield Job(name, cluster, d)
    mgr = cluster.manager
    for svc in mgr.client.api.services(filters={"label": f"{LABEL_JOB}={name}"}):
        mgr.remove_service(svc["ID"])
    for node, api in cluster.apis.items():
        if not _running(node):
            continue
        for c in api.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={name}"}):
            remove_container(c)
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(cluster.data_root / "runs" / name, ignore_errors=True)


@dataclass
class TaskRecord:
    service: str
    chunk: str
    node: str  # container name of the node
    image: str  # ContainerSpec.Image of the task
    first_seen: float
    states: list[str] = field(default_factory=list)


@dataclass
class Watch(Polling):
    """Polls the manager while a job runs: every task (node, image, states), how many chunks ran at once,
    whether tasks waited pending while the GPUs were full, and the task containers on each worker."""

    cluster: Cluster
    job: str
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    max_running: int = 0
    pending_while_full: list[str] = field(default_factory=list)  # scheduler messages seen then
    containers: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id → (node, Config.Image, Image)
    interval = 0.2

    def running_on(self, node: str) -> list[TaskRecord]:
        return [t for t in self.tasks.values() if t.node == node and t.states and t.states[-1] == "running"]

    def poll(self) -> None:
        # A node being killed makes single calls fail; the next poll sees the new state.
        with contextlib.suppress(Exception):
            self._poll(self.cluster.manager.client.api)

    def _poll(self, api: Any) -> None:
        services = {s["ID"]: s for s in api.services(filters={"label": f"{LABEL_JOB}={self.job}"})}
        running = 0
        pending: list[str] = []
        now = time.time()
        for sid, svc in services.items():
            for t in api.tasks(filters={"service": sid}):
                state = t["Status"]["State"]
                rec = self.tasks.setdefault(
                    t["ID"],
                    TaskRecord(
                        service=svc["Spec"]["Name"],
                        chunk=svc["Spec"]["Labels"].get("io.ffswarm.chunk", ""),
                        node="",
                        image=t["Spec"]["ContainerSpec"]["Image"],
                        first_seen=now,
                    ),
                )
                if t.get("NodeID"):
                    rec.node = self.cluster.node_name(t["NodeID"])
                if not rec.states or rec.states[-1] != state:
                    rec.states.append(state)
                gpu_chunk = svc["Spec"]["Labels"].get("io.ffswarm.role") == "runner"  # not the identity step
                if state == "running" and t["DesiredState"] == "running" and gpu_chunk:
                    running += 1
                elif state == "pending":
                    pending.append(str(t["Status"].get("Err") or t["Status"].get("Message") or ""))
        self.max_running = max(self.max_running, running)
        if running >= 4 and pending:
            self.pending_while_full.extend(pending)
        for node in WORKERS:
            try:
                found = self.cluster.apis[node].client.api.containers(
                    all=True, filters={"label": f"{LABEL_JOB}={self.job}"}
                )
            except Exception:
                continue
            for c in found:
                if c["Id"] not in self.containers:
                    info = self.cluster.apis[node].client.api.inspect_container(c["Id"])
                    self.containers[c["Id"]] = (node, info["Config"]["Image"], info["Image"])
