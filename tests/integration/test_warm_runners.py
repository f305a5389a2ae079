"""Warm runners on the dev swarm (``runners.linger``, controller/run/lanes.py): ``ffswarm submit`` runs a
job's chunks one after another in the service whose runner loaded its models first, and a later job's
in the runners an earlier one left warm, instead of a cold service per chunk; nothing is left on the
swarm when the submit ends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import CONFIG, ServiceWatch, Workspace, chown_tree

pytestmark = pytest.mark.integration

CHUNKS = 4


def _warm_config(ws: Workspace) -> Path:
    """The dev config with warm runners (runners.linger), for this test alone."""
    data = yaml.safe_load(CONFIG.read_text())
    data["runners"] = {"linger": "30s"}
    config = ws.dir / "ffswarm.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def test_a_jobs_chunks_run_one_after_another_in_one_warm_runner(workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", CHUNKS)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    config = _warm_config(ws)
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
    with ServiceWatch(swarm, ws.job) as watch, ServiceWatch(swarm, f"lane-{ws.job}-c0000") as lanes:
        proc = ws.ffswarm("submit", str(job_file), config=config)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # One service ran the four chunks: a warm runner (a label of its own: the submit's, not the job's),
    # no chunk service and no identity step's (each chunk embeds the source photo itself)
    assert not watch.specs and not watch.step_specs, (list(watch.specs), list(watch.step_specs))
    (spec,) = lanes.step_specs.values()
    assert spec["Labels"]["io.ffswarm.role"] == "shared-lane"
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
    assert [s["Spec"]["Name"] for s in swarm.client.api.services() if ws.job in s["Spec"]["Name"]] == []
    ours = [
        c for c in swarm.client.containers.list(all=True, filters={"label": LABEL_JOB}) if ws.job in c.labels[LABEL_JOB]
    ]
    assert ours == [], ours


def test_a_submits_later_job_runs_in_the_runners_its_first_job_left_warm(
    workspace: Workspace, swarm: DockerSwarm
) -> None:
    """``ffswarm submit a.yaml b.yaml``: b's chunks run in the runners a's chunks started, models
    loaded; neither job runs an identity step (each chunk embeds the source itself); nothing is left."""
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    names = [f"{ws.job}-a", f"{ws.job}-b"]
    for name in names:
        photos.face_photos(ws.dir / name, 2)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    config = _warm_config(ws)
    files = []
    for name in names:
        files.append(ws.dir / f"{name}.yaml")
        files[-1].write_text(f"""
name: {name}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / name)}/*.jpg]
output: {ws.rel(ws.dir / "out")}/{name}/{{stem}}{{ext}}
chunk_size: 1
max_concurrent: 2
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
retries: 1
""")
    try:
        proc = ws.ffswarm("submit", *map(str, files), config=config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs = [ws.root / "runs" / name for name in names]
        records = [[json.loads(p.read_text()) for p in sorted((r / "attempts").glob("c*.json"))] for r in runs]
        assert [len(r) for r in records] == [2, 2] and all(x["exit"] == "OK" for r in records for x in r), records
        first = {x["process"] for x in records[0]}
        assert len(first) == 2 and {x["process"] for x in records[1]} == first  # b ran in a's two runners …
        assert all(x["cold_start_s"] < 1.0 for x in records[1]), records[1]  # … on the models a loaded
        assert not any((r / "logs" / "identity.log").exists() for r in runs)  # no identity step's container
        assert [len(list((ws.dir / "out" / name).iterdir())) for name in names] == [2, 2]
        # the warm runners were retired when the submit ended: no service or container of either job is left
        assert [s["Spec"]["Name"] for s in swarm.client.api.services() if ws.job in s["Spec"]["Name"]] == []
        ours = [
            c
            for c in swarm.client.containers.list(all=True, filters={"label": LABEL_JOB})
            if ws.job in c.labels[LABEL_JOB]
        ]
        assert ours == [], ours
    finally:
        for svc in swarm.client.api.services():
            if ws.job in svc["Spec"]["Name"]:
                swarm.remove_service(svc["ID"])
        for name in names:
            shutil.rmtree(ws.root / "runs" / name, ignore_errors=True)
