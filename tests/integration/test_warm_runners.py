"""Warm runners on the dev swarm (``runners.linger``, controller/run/lanes.py own_lanes): a job of several
chunks runs them one after another in the one service whose runner loaded its models first, instead of
a cold service per chunk, and leaves nothing on the swarm when it ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import CONFIG, ServiceWatch, Workspace, chown_tree

pytestmark = pytest.mark.integration

CHUNKS = 4


def test_a_jobs_chunks_run_one_after_another_in_one_warm_runner(workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", CHUNKS)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    data = yaml.safe_load(CONFIG.read_text())
    data["runners"] = {"linger": "30s"}
    config = ws.dir / "ffswarm.yaml"
    config.write_text(yaml.safe_dump(data))
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "crowd")}/*.jpg]
output: {ws.rel(ws.dir / "out")}/{{stem}}{{ext}}
chunk_size: 1
max_concurrent: 1
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 1
""")
    with ServiceWatch(swarm, ws.job) as watch:
        proc = ws.ffswarm("submit", str(job_file), config=config)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # One service ran the four chunks: the job's own lane, no chunk service of its own
    lanes = {n: s for n, s in watch.step_specs.items() if s["Labels"]["io.ffswarm.role"] == "job-lane"}
    assert len(lanes) == 1 and not watch.specs, (list(watch.step_specs), list(watch.specs))
    (spec,) = lanes.values()
    assert spec["Labels"][LABEL_JOB] == ws.job
    assert "FFSWARM_LANE=1" in spec["TaskTemplate"]["ContainerSpec"]["Env"]

    # … in one runner process, the models loaded once: every later chunk started warm
    run = ws.root / "runs" / ws.job
    records = [json.loads(p.read_text()) for p in sorted((run / "attempts").glob("c*.a1.json"))]
    assert [r["chunk"] for r in records] == [f"c{i:04d}" for i in range(CHUNKS)], records
    assert all(r["exit"] == "OK" and r["items_done"] == 1 for r in records), records
    assert len({r["process"] for r in records}) == 1, records
    assert all(r["cold_start_s"] < 1.0 for r in records[1:]), [r["cold_start_s"] for r in records]
    assert not list(run.glob("attempts/*.a2.json"))  # nothing ran twice
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == sorted(p.name for p in (ws.dir / "crowd").iterdir())
    assert all(Path(p).read_bytes()[:2] == b"\xff\xd8" for p in (ws.dir / "out").iterdir())

    # Retired when the job ended: nothing of it is left on the swarm
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
    assert swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
