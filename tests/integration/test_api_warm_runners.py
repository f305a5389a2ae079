"""Warm runners for a tenant's own API jobs (``runners.linger`` in `serve`, controller/run/warmth.py
shares_lanes): a job too big to pack is a job of its own, yet its chunk runs in the runner that an
earlier pack or job of the same tenant and kind left warm — its models loaded, no identity step's
container — instead of a cold service of its own.

Tenant a posts a one-photo request (packed: its pack's chunk starts a lane), then three two-photo
jobs one after another (too big to pack): they run in that same lane (one lane service, no chunk
service of their own, one runner process, a warm start). The lane sees only what any lane of a sees
(a's area read-only, a's out/ writable, a's folder of run folders, the model pack). A job of a that
writes outside out/ runs in a service of its own that mounts exactly its folders, and a job of
tenant b never runs in a's lane.
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
from tests.integration.test_packing_linger import data_mounts, lane_view

pytestmark = pytest.mark.integration

OPTIONS = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 1}


@pytest.fixture
def config_extra() -> dict[str, Any]:
    # a request of one photo is packed (its pack's chunk in a lane); one of two runs as a job of its own
    return {"runners": {"linger": "60s"}, "packing": {"max_items": 1, "window": "1s", "linger": "60s"}}


def _services(swarm: DockerSwarm, role: str, keys: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The live services of ``role`` whose job label carries one of the tenant ``keys`` (this test's
    tenants' jobs, packs and lanes: lane-<job>-<chunk>)."""
    found = {}
    for svc in swarm.client.api.services(filters={"label": f"{LABEL_ROLE}={role}"}):
        if any(k in str((svc["Spec"].get("Labels") or {}).get(LABEL_JOB, "")) for k in keys):
            found[svc["Spec"]["Name"]] = svc["Spec"]
    return found


def _post_and_wait(api: Api, key: str, body: dict[str, Any], swarm: DockerSwarm, seen: dict[str, Any]) -> str:
    """One job posted and run to its end, the lane and chunk services seen meanwhile noted in ``seen``."""
    with api.client(key) as c:
        r = c.post("/v1/jobs", json={**OPTIONS, **body})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 240
    while True:
        seen["lanes"].update(_services(swarm, ROLE_LANE, seen["keys"]))
        seen["runners"].update(_services(swarm, ROLE_RUNNER, seen["keys"]))
        with api.client(key) as c:
            row = c.get(f"/v1/jobs/{job}").json()
        if row["phase"] in ("finished", "failed"):
            break
        assert time.monotonic() < deadline, (row, api.log.read_text()[-3000:])
        time.sleep(0.3)
    assert row["phase"] == "finished" and row["items"]["ok"] == len(body["targets"]), row
    return job


def _records(root: Path, job: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / run_rel(job) / "attempts").glob("c*.json"))]


def test_a_tenants_later_api_jobs_run_in_the_runner_its_first_request_left_warm(
    workspace: Workspace, tenants: Tenants, api: Api, swarm: DockerSwarm
) -> None:
    ws = workspace
    seen: dict[str, Any] = {"lanes": {}, "runners": {}, "keys": (tenant_key(tenants.a), tenant_key(tenants.b))}
    packs: set[str] = set()
    try:
        faces = photos.face_photos(ws.dir / "faces", 12)
        for tenant in (tenants.a, tenants.b):
            with api.client(tenants.keys[tenant]) as c:  # the tenant's area, made by the API
                assert c.get("/v1/jobs").status_code == 200
            area = ws.root / "tenants" / tenant / "in"
            area.mkdir(exist_ok=True)
            for i, f in enumerate(faces):
                shutil.copy(f, area / f"p{i}.jpg")
            chown_tree(area, ws.config.runner_uid_gid())
        a, b = tenants.keys[tenants.a], tenants.keys[tenants.b]
        key = tenant_key(tenants.a)

        first = _post_and_wait(api, a, {"name": "one", "source": "in/p0.jpg", "targets": ["in/p1.jpg"]}, swarm, seen)
        pack = (ws.root / run_rel(first) / "packed").read_text().strip()
        packs.add(pack)
        assert len(seen["lanes"]) == 1, list(seen["lanes"])  # the pack's chunk started a lane
        pairs = [[f"in/p{2 + 2 * k}.jpg", f"in/p{3 + 2 * k}.jpg"] for k in range(3)]
        bodies = [{"name": f"w{k}", "source": "in/p0.jpg", "targets": t, "chunk_size": 2} for k, t in enumerate(pairs)]
        warm = [_post_and_wait(api, a, body, swarm, seen) for body in bodies]
        assert all((ws.root / "runs" / ".tenants" / key / j / "report.json").is_file() for j in warm)
        assert not any((ws.root / run_rel(j) / "packed").exists() for j in warm)  # each ran as a job of its own …
        # … in the pack's lane: no other lane, no chunk service of their own
        assert len(seen["lanes"]) == 1 and not seen["runners"], (list(seen["lanes"]), list(seen["runners"]))
        records = _records(ws.root, pack) + [r for j in warm for r in _records(ws.root, j)]
        assert [(r["exit"], r["items_done"]) for r in records] == [("OK", 1)] + [("OK", 2)] * 3, records
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
        data = data_mounts(spec)
        assert {m["Target"]: bool(m.get("ReadOnly")) for m in data} == lane_view(tenants.a), data

        # a job of a that writes outside out/: a service of its own, mounting exactly its folders
        lanes_before, processes = set(seen["lanes"]), {r["process"] for r in records}
        body = {"name": "own", "source": "in/p0.jpg", "targets": ["in/p8.jpg", "in/p9.jpg"], "chunk_size": 2,
                "output": "elsewhere/{stem}{ext}"}  # fmt: skip
        own = _post_and_wait(api, a, body, swarm, seen)
        assert set(seen["lanes"]) == lanes_before and len(seen["runners"]) == 1, (seen["lanes"], seen["runners"])
        (runner,) = seen["runners"].values()
        assert runner["Labels"][LABEL_JOB] == own
        targets = {m["Target"]: bool(m.get("ReadOnly")) for m in data_mounts(runner)}
        assert targets[f"/data/tenants/{tenants.a}/elsewhere"] is False and f"/data/runs/.tenants/{key}" not in targets
        assert all(r["process"] not in processes for r in _records(ws.root, own))

        # tenant b's job of the same kind never runs in a's lane
        body = {"name": "b0", "source": "in/p0.jpg", "targets": ["in/p10.jpg", "in/p11.jpg"], "chunk_size": 2}
        other = _post_and_wait(api, b, body, swarm, seen)
        theirs = _records(ws.root, other)
        assert theirs and all(r["process"] not in processes for r in theirs), (theirs, processes)
        assert (ws.root / "runs" / ".tenants" / tenant_key(tenants.b) / other / "report.json").is_file()
    finally:  # the lanes (by their labels), the pack's services, run folder and file
        remove_packs(swarm, ws.root, packs, tuple(spec["Labels"][LABEL_JOB] for spec in seen["lanes"].values()))
