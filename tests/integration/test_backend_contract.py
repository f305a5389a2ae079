"""One contract, two backends: the in-memory FakeSwarm that unit tests drive the supervisor with
must behave like the real daemon in every way the supervisor relies on, so the fake cannot drift."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from controller.swarm.backend import ServiceState, SwarmBackend
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fakes import FakeSwarm
from tests.integration.conftest import Workspace, shell_service

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fake", "real"])
def backend(request: pytest.FixtureRequest, swarm: DockerSwarm) -> Iterator[SwarmBackend]:
    yield FakeSwarm() if request.param == "fake" else swarm


def settle(backend: SwarmBackend, job: str, name: str, until: set[str], timeout: float = 30) -> ServiceState:
    deadline = time.monotonic() + timeout
    while True:
        svc = {s.name: s for s in backend.services(job)}[name]
        task = svc.latest_task()
        if task is not None and task.state in until:
            return svc
        assert time.monotonic() < deadline, f"{name} never reached {until}"
        time.sleep(0.2)


def test_contract(backend: SwarmBackend, workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    image = swarm.resolve_image(ws.config.image)
    ok = shell_service(ws, image, "c0000", "exit 0")
    bad = shell_service(ws, image, "c0001", "exit 3")
    stuck = shell_service(ws, image, "c0002", "exit 0", ("node.labels.nosuch==true",))
    for s in (ok, bad, stuck):
        backend.create_service(s)

    names = {s.name for s in backend.services(ws.job)}
    assert names == {ok.name, bad.name, stuck.name}
    assert all(s.labels["io.ffswarm.job"] == ws.job for s in backend.services(ws.job))
    assert backend.services(f"{ws.job}-other") == []  # filtered by the job label

    done = settle(backend, ws.job, ok.name, {"complete"}).latest_task()
    assert done is not None and done.exit_code == 0 and done.node_id
    failed = settle(backend, ws.job, bad.name, {"failed"}).latest_task()
    assert failed is not None and failed.exit_code == 3
    pending = settle(backend, ws.job, stuck.name, {"pending"}).latest_task()
    assert pending is not None and "no suitable node" in pending.message

    nodes = backend.nodes()
    assert any(n.usable and n.gpus > 0 for n in nodes)
    assert done.node_id in {n.node_id for n in nodes}

    for s in (ok, bad, stuck):
        backend.remove_service(s.name)
    backend.remove_service(ok.name)  # removing twice is harmless
    assert backend.services(ws.job) == []
    deadline = time.monotonic() + 30  # the containers of removed services go, with the clean-up's help
    while True:
        if backend.remove_exited_containers(ws.job) == 0:
            break
        assert time.monotonic() < deadline, "containers of removed services never went away"
        time.sleep(0.2)


def test_docker_events_name_the_jobs_containers_that_died(workspace: Workspace, swarm: DockerSwarm) -> None:
    """The event stream the watch wakes on: a container of this job that exits is reported by its
    service's name, with its exit code; another job's is not."""
    ws = workspace
    image = swarm.resolve_image(ws.config.image)
    base = shell_service(ws, image, "c0001", "exit 0")
    other_job = f"{ws.job}x"
    other = dataclasses.replace(base, name=f"{base.name}x", labels={**base.labels, LABEL_JOB: other_job})
    mine = shell_service(ws, image, "c0000", "exit 3")
    events = swarm.events(ws.job)
    assert events is not None and events.alive
    try:
        swarm.create_service(other)  # ends first: its die event is in the stream before ours
        settle(swarm, other_job, other.name, {"complete"})
        swarm.create_service(mine)
        deadline = time.monotonic() + 60
        while events.exit_code(mine.name) is None:
            assert time.monotonic() < deadline, "the job's container died but no event said so"
            events.wait(1.0)
        assert events.exit_code(mine.name) == 3 and events.exit_code(other.name) is None
    finally:
        events.close()
        swarm.remove_service(other.name)
        for c in swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={other_job}"}):
            c.remove(force=True)
    assert not events.alive  # closed: the watch would poll on its own
