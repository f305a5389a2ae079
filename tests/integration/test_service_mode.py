"""Why chunk services are `replicated` × 1 with restart condition `none` (not `replicated-job`):
proven on the real engine. Also: the hardening every runner container really gets."""

from __future__ import annotations

import time

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, ServiceSpec
from tests.integration.conftest import Workspace, shell_service

pytestmark = pytest.mark.integration


def spec(ws: Workspace, swarm: DockerSwarm, chunk: str, script: str) -> ServiceSpec:
    return shell_service(ws, swarm.resolve_image(ws.config.image), chunk, script)


def wait_task(swarm: DockerSwarm, ws: Workspace, name: str, states: set[str], timeout: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        svc = {s.name: s for s in swarm.services(ws.job)}[name]
        task = svc.latest_task()
        if task and task.state in states:
            return svc
        time.sleep(0.2)
    raise AssertionError(f"{name}: no task reached {states} in {timeout}s")


def test_one_shot_runs_once_and_is_never_restarted(workspace: Workspace, swarm: DockerSwarm) -> None:
    ok = spec(workspace, swarm, "c0000", "exit 0")
    bad = spec(workspace, swarm, "c0001", "exit 3")
    swarm.create_service(ok)
    swarm.create_service(bad)
    wait_task(swarm, workspace, ok.name, {"complete"})
    wait_task(swarm, workspace, bad.name, {"failed"})
    time.sleep(6)  # Swarm's default restart delay is 5 s: a restart would have happened by now
    svcs = {s.name: s for s in swarm.services(workspace.job)}
    assert [t.state for t in svcs[ok.name].tasks] == ["complete"]
    assert [(t.state, t.exit_code) for t in svcs[bad.name].tasks] == [("failed", 3)]


def test_removing_a_running_service_stops_its_container(workspace: Workspace, swarm: DockerSwarm) -> None:
    s = spec(workspace, swarm, "c0000", "sleep 300")
    swarm.create_service(s)
    wait_task(swarm, workspace, s.name, {"running"})
    running = swarm.client.containers.list(filters={"label": f"{LABEL_JOB}={workspace.job}"})
    assert len(running) == 1
    swarm.remove_service(s.name)
    deadline = time.monotonic() + 20
    while swarm.client.containers.list(filters={"label": f"{LABEL_JOB}={workspace.job}"}):
        assert time.monotonic() < deadline, "container of a removed service still running"
        time.sleep(0.3)


def test_runner_container_hardening(workspace: Workspace, swarm: DockerSwarm) -> None:
    s = spec(workspace, swarm, "c0000", "sleep 300")
    swarm.create_service(s)
    wait_task(swarm, workspace, s.name, {"running"})
    (container,) = swarm.client.containers.list(filters={"label": f"{LABEL_JOB}={workspace.job}"})
    host = container.attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["Memory"] == 256 << 20
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "20m", "max-file": "3"}}
    assert container.attrs["Config"]["User"] == workspace.config.runner_uid_gid() != "0:0"
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert set(mounts) == {"/data", "/tmp"}  # only the data volume (+ scratch); no docker socket
    assert mounts["/tmp"]["Type"] == "tmpfs"
    status = container.exec_run(["cat", "/proc/1/status"]).output.decode()
    assert "NoNewPrivs:\t1" in status
    assert "CapEff:\t0000000000000000" in status
    rc, out = container.exec_run(["touch", "/x"])
    assert rc != 0 and b"Read-only file system" in out
    assert container.exec_run(["sh", "-c", "env"]).output.decode().count("DOCKER_RESOURCE_GPU=GPU-") == 1
