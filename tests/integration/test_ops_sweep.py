"""`ffswarm nodes sweep` on the real engine: it removes the job containers that ended long enough ago
(the ones an engine restarted mid-removal keeps for good, moby/moby#42723), and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from docker.models.containers import Container

from controller.config import Config
from controller.swarm.admin import SwarmAdmin
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB

pytestmark = pytest.mark.integration
MARK = "io.ffswarm-test.sweep"


@pytest.fixture
def ended(swarm: DockerSwarm, config: Config) -> Iterator[tuple[str, list[Container]]]:
    """Two ended containers of a job and one ended container of no job, on this engine."""
    job = f"t-sweep-{uuid.uuid4().hex[:6]}"
    image = swarm.resolve_image(config.image)
    labels = [{LABEL_JOB: job, MARK: "1"}, {LABEL_JOB: job, MARK: "1"}, {MARK: "1"}]
    made = [
        swarm.client.containers.run(
            image, entrypoint=["python3", "-c", ""], labels=lab, detach=True, network_mode="none"
        )
        for lab in labels
    ]
    for c in made:
        assert c.wait(timeout=60)["StatusCode"] == 0
    try:
        yield job, made
    finally:
        for c in swarm.client.containers.list(all=True, filters={"label": MARK}):
            c.remove(force=True)


def left(swarm: DockerSwarm) -> set[str]:
    return {c.id for c in swarm.client.containers.list(all=True, filters={"label": MARK})}


def test_a_job_s_ended_containers_go_once_old_enough_and_nothing_else_goes(
    swarm: DockerSwarm, ended: tuple[str, list[Container]]
) -> None:
    job, (a, b, other) = ended
    admin = SwarmAdmin()
    removed, kept = admin.sweep_ended_job_containers(3600, time.time())  # just ended: kept
    assert not [c for c in removed if c.job == job]
    assert {c.container_id for c in kept if c.job == job} == {a.id[:12], b.id[:12]}
    assert left(swarm) == {a.id, b.id, other.id}

    removed, _ = admin.sweep_ended_job_containers(3600, time.time() + 7200)  # two hours on
    assert {c.container_id for c in removed if c.job == job} == {a.id[:12], b.id[:12]}
    assert left(swarm) == {other.id}  # a container of no job is not the sweep's


def test_the_command_needs_no_config_and_a_dry_run_removes_nothing(
    swarm: DockerSwarm, ended: tuple[str, list[Container]]
) -> None:
    job, made = ended
    env = {k: v for k, v in os.environ.items() if k != "FFSWARM_CONFIG"}
    cmd = [sys.executable, "-m", "controller.cli", "nodes", "sweep", "--dry-run", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert not [c for c in answer["would_remove"] if c["job"] == job] and answer["kept"] >= 2
    assert left(swarm) == {c.id for c in made}
