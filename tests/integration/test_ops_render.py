"""`ffswarm render` → real `docker stack deploy`: the same chunk services as the SDK path, and the job completes.

The stack's services are compared field by field with services controller.swarm.docker.DockerSwarm creates
from the same ServiceSpecs. The only differences allowed are the ones `docker stack deploy` always
adds (its namespace/image labels, an endpoint mode, empty privileges, the name prefix, aliases on the
network). Both name the runners' internal network, which `render` made (with its anchor) beforehand.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.results import ItemStatus
from controller.config import load_config
from controller.swarm.docker import DockerSwarm
from controller.swarm.render import render_runner_stack
from controller.swarm.servicespec import RUNNER_NETWORK
from tests.fixtures import photos
from tests.integration.conftest import CONFIG, Workspace, chown_tree

pytestmark = pytest.mark.integration
DOCKER_ENV = {**os.environ, "DOCKER_API_VERSION": "1.41"}  # CLI 28 against engine 20.10
STACK_LABELS = ("com.docker.stack.namespace", "com.docker.stack.image")


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, env=DOCKER_ENV, timeout=120)


@pytest.fixture
def stack(workspace: Workspace, swarm: DockerSwarm) -> Iterator[str]:
    name = f"st{workspace.job[-6:]}"  # STACK_SERVICE must stay within 63 characters
    yield name
    docker("stack", "rm", name)
    for svc in swarm.client.api.services(filters={"label": f"com.docker.stack.namespace={name}"}):
        swarm.remove_service(svc["ID"])


def normalize(spec: dict[str, Any], network_name: Callable[[str], str]) -> dict[str, Any]:
    """A service spec less what `docker stack deploy` adds on its own; asserts those additions."""
    s = copy.deepcopy(spec)
    s.pop("Name")
    s["Labels"] = {k: v for k, v in s.get("Labels", {}).items() if k not in STACK_LABELS}
    if s.get("EndpointSpec") == {"Mode": "vip"}:  # the engine's default for a service without ports
        s.pop("EndpointSpec")
    task = s["TaskTemplate"]
    nets = task.pop("Networks", None)
    assert [network_name(n["Target"]) for n in nets or []] == [RUNNER_NETWORK], nets
    c = task["ContainerSpec"]
    c["Labels"] = {k: v for k, v in c.get("Labels", {}).items() if k not in STACK_LABELS}
    c["Env"] = sorted(c.get("Env", []))
    if c.get("Privileges") == {"CredentialSpec": None, "SELinuxContext": None}:
        c.pop("Privileges")
    for m in c.get("Mounts", []):
        opts = m.get("VolumeOptions", {})
        labels = {k: v for k, v in opts.pop("Labels", {}).items() if k not in STACK_LABELS}
        if labels:
            opts["Labels"] = labels
    return s


def test_rendered_stack_makes_the_sdk_services_and_runs_the_job(
    workspace: Workspace, swarm: DockerSwarm, stack: str
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    faces = photos.face_photos(ws.dir / "crowd", 4)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "crowd")}/*.jpg]
output: {ws.rel(ws.dir / "out")}/{{stem}}{{ext}}
chunk_size: 2
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
""")
    stack_file = ws.dir / "stack.yml"
    t0 = time.monotonic()
    proc = ws.ffswarm("render", str(job_file), "--stack", stack, "-o", str(stack_file))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (ws.root / "runs" / ws.job / "chunks" / "c0001.json").is_file()  # manifests are there for the runners

    # The file is exactly these ServiceSpecs rendered (the specs the SDK path would create).
    from controller.cli.ops import job_services

    specs = job_services(load_config(str(CONFIG)), ws.job, 1)
    assert [s.name for s in specs] == [f"ffswarm-{ws.job}-c0000-a1", f"ffswarm-{ws.job}-c0001-a1"]
    assert stack_file.read_text() == render_runner_stack(specs, 1, stack)

    deploy = docker("stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), stack)
    assert deploy.returncode == 0, deploy.stderr
    api = swarm.client.api
    deadline = time.monotonic() + 300
    states: list[str] = []
    while time.monotonic() < deadline:
        svcs = api.services(filters={"label": f"com.docker.stack.namespace={stack}"})
        states = [t["Status"]["State"] for s in svcs for t in api.tasks(filters={"service": s["ID"]})]
        if len(svcs) == 2 and len(states) == 2 and all(x in ("complete", "failed", "rejected") for x in states):
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    assert states == ["complete", "complete"], states
    print(f"stack path: render + deploy + 2 chunks complete in {elapsed:.1f}s")

    # The job completed through the stack: every face has its output and an ok result.
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == sorted(p.name for p in faces)
    rundir_results = [r for c in ("c0000", "c0001") for r in _results(ws.root / "runs" / ws.job, c)]
    assert len(rundir_results) == 4 and {r.status for r in rundir_results} == {ItemStatus.OK}

    # Field by field against the SDK path, created from the same ServiceSpecs.
    def network_name(target: str) -> str:
        return str(api.inspect_network(target)["Name"])

    for spec in specs:
        from_stack = api.inspect_service(f"{stack}_{spec.name}")["Spec"]
        swarm.create_service(spec)
        try:
            from_sdk = api.inspect_service(spec.name)["Spec"]
        finally:
            swarm.remove_service(spec.name)
        assert from_stack["Labels"]["com.docker.stack.namespace"] == stack
        a, b = normalize(from_stack, network_name), normalize(from_sdk, network_name)
        for key in ("ContainerSpec", "Resources", "RestartPolicy", "Placement", "LogDriver"):
            assert a["TaskTemplate"][key] == b["TaskTemplate"][key], key
        assert a == b
        c = a["TaskTemplate"]["ContainerSpec"]
        assert c["Image"] == spec.image and c["Command"] == list(spec.command) and c["ReadOnly"] is True
        assert c["Mounts"][0]["VolumeOptions"]["DriverConfig"]["Options"] == dict(spec.volume.driver_options)


def _results(run: Path, chunk: str) -> list[Any]:
    from contract.results import chunk_results

    return list(chunk_results(run / "results", chunk).lines)  # every attempt's results file
