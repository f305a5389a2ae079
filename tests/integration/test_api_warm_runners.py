"""Warm runners for a tenant's own API jobs (``runners.linger`` in `serve`, controller/run/lanes.py
shares_lanes): with packing off, every request is a job of its own, yet a later job's chunk runs in
the runner an earlier job of the same tenant and kind left warm — its models loaded, no identity
step's container — instead of a cold service of its own.

Tenant a posts three one-photo jobs one after another: the second and third run in the first one's
lane (one lane service, no chunk service of their own, one runner process, a warm start). The lane
sees only what any lane of a sees (a's area read-only, a's out/ writable, a's folder of run folders,
the model pack). A job of a that writes outside out/ runs in a service of its own that mounts exactly
its folders, and a job of tenant b never runs in a's lane.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from contract.layout import run_rel, tenant_key
from controller.run.lanes import ROLE_LANE
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, ROLE_RUNNER
from tests.fixtures import photos
from tests.integration.conftest import Api, Tenants, Workspace, chown_tree
from tests.integration.test_api_packing import remove_packs

pytestmark = pytest.mark.integration

OPTIONS = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 1}


@pytest.fixture
def config_extra() -> dict[str, Any]:
    return {"runners": {"linger": "60s"}}  # and packing off: each request a job of its own


def _services(swarm: DockerSwarm, role: str, jobs: list[str]) -> dict[str, dict[str, Any]]:
    """The live services of ``role`` whose job label names one of ``jobs`` (a lane's: lane-<job>-…)."""
    found = {}
    for svc in swarm.client.api.services(filters={"label": f"{LABEL_ROLE}={role}"}):
        label = str((svc["Spec"].get("Labels") or {}).get(LABEL_JOB, ""))
        if any(j in label for j in jobs):
            found[svc["Spec"]["Name"]] = svc["Spec"]
    return found


def _post_and_wait(api: Api, key: str, body: dict[str, Any], swarm: DockerSwarm, seen: dict[str, Any]) -> str:
    """One job posted and run to its end, the lane and runner services seen meanwhile noted in ``seen``."""
    with api.client(key) as c:
        r = c.post("/v1/jobs", json={**OPTIONS, **body})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    seen["jobs"].append(job)
    deadline = time.monotonic() + 240
    while True:
        seen["lanes"].update(_services(swarm, ROLE_LANE, seen["jobs"]))
        seen["runners"].update(_services(swarm, ROLE_RUNNER, seen["jobs"]))
        with api.client(key) as c:
            row = c.get(f"/v1/jobs/{job}").json()
        if row["phase"] in ("finished", "failed"):
            break
        assert time.monotonic() < deadline, (row, api.log.read_text()[-3000:])
        time.sleep(0.3)
    assert row["phase"] == "finished" and row["items"]["ok"] == 1, row
    return job


def _records(root: Path, job: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / run_rel(job) / "attempts").glob("c*.json"))]


def test_a_tenants_later_api_jobs_run_in_the_runner_its_first_job_left_warm(
    workspace: Workspace, tenants: Tenants, api: Api, swarm: DockerSwarm
) -> None:
    ws = workspace
    seen: dict[str, Any] = {"jobs": [], "lanes": {}, "runners": {}}
    try:
        faces = photos.face_photos(ws.dir / "faces", 6)
        for tenant in (tenants.a, tenants.b):
            with api.client(tenants.keys[tenant]) as c:  # the tenant's area, made by the API
                assert c.get("/v1/jobs").status_code == 200
            area = ws.root / "tenants" / tenant / "in"
            area.mkdir(exist_ok=True)
            for i, f in enumerate(faces):
                shutil.copy(f, area / f"p{i}.jpg")
            chown_tree(area, ws.config.runner_uid_gid())
        a, b = tenants.keys[tenants.a], tenants.keys[tenants.b]

        bodies = [{"name": f"w{k}", "source": "in/p0.jpg", "targets": [f"in/p{k + 1}.jpg"]} for k in range(3)]
        warm = [_post_and_wait(api, a, body, swarm, seen) for body in bodies]
        key = tenant_key(tenants.a)
        assert all((ws.root / "runs" / ".tenants" / key / j / "report.json").is_file() for j in warm)
        # one lane service ran all three jobs' chunks; none of them had a chunk service of its own
        assert len(seen["lanes"]) == 1 and not seen["runners"], (list(seen["lanes"]), list(seen["runners"]))
        records = [r for j in warm for r in _records(ws.root, j)]
        assert [r["exit"] for r in records] == ["OK"] * 3, records
        assert len({r["process"] for r in records}) == 1, records  # one runner process …
        assert all(r["cold_start_s"] < 1.0 for r in records[1:]), [r["cold_start_s"] for r in records]  # … warm
        # each chunk embedded its own source: no identity step's container
        assert not any((ws.root / run_rel(j) / "logs" / "identity.log").exists() for j in warm)
        for j in warm:
            with api.client(a) as c:
                out = c.get(f"/v1/jobs/{j}/results.zip")
            assert out.status_code == 200 and len(out.content) > 100, out.status_code

        # the lane sees of the data root only what any lane of tenant a sees
        (spec,) = seen["lanes"].values()
        data = [m for m in spec["TaskTemplate"]["ContainerSpec"]["Mounts"] if m["Type"] != "tmpfs"]
        assert {m["Target"]: bool(m.get("ReadOnly")) for m in data} == {
            f"/data/tenants/{tenants.a}": True,
            f"/data/tenants/{tenants.a}/out": False,
            f"/data/runs/.tenants/{key}": False,
            "/data/models/default": True,
        }, data

        # a job of a that writes outside out/: a service of its own, mounting exactly its folders
        lanes_before, processes = set(seen["lanes"]), {r["process"] for r in records}
        body = {"name": "own", "source": "in/p0.jpg", "targets": ["in/p4.jpg"], "output": "elsewhere/{stem}{ext}"}
        own = _post_and_wait(api, a, body, swarm, seen)
        assert set(seen["lanes"]) == lanes_before and len(seen["runners"]) == 1, (seen["lanes"], seen["runners"])
        (runner,) = seen["runners"].values()
        targets = {m["Target"]: bool(m.get("ReadOnly")) for m in runner["TaskTemplate"]["ContainerSpec"]["Mounts"]
                   if m["Type"] != "tmpfs"}  # fmt: skip
        assert targets[f"/data/tenants/{tenants.a}/elsewhere"] is False and f"/data/runs/.tenants/{key}" not in targets
        assert all(r["process"] not in processes for r in _records(ws.root, own))

        # tenant b's job of the same kind never runs in a's lane
        other = _post_and_wait(api, b, {"name": "b0", "source": "in/p0.jpg", "targets": ["in/p5.jpg"]}, swarm, seen)
        theirs = _records(ws.root, other)
        assert theirs and all(r["process"] not in processes for r in theirs), (theirs, processes)
        assert (ws.root / "runs" / ".tenants" / tenant_key(tenants.b) / other / "report.json").is_file()
    finally:
        labels = tuple(f"lane-{j}-c0000" for j in seen["jobs"])
        remove_packs(swarm, ws.root, set(), labels)
