"""Many small requests through the API, packed by `serve` into shared chunk services (issue 18).

40 one-photo jobs from two tenants, each with its own source photo, arrive within a packing window:
they run in at most 4 chunk services (observed on the swarm), and each job keeps its own id,
status, report, output and results.zip. Two jobs with the same target photo and different sources
get different outputs (each item swapped its own job's person); a job whose source photo has no face
fails alone, naming that photo.
"""

from __future__ import annotations

import io
import json
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from contract.layout import run_rel, tenant_runs_rel
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, ROLE_RUNNER
from tests.fixtures import photos
from tests.integration.conftest import Api, Tenants, Workspace, chown_tree
from tests.polling import remove_container

pytestmark = pytest.mark.integration

JOBS = 40  # 20 per tenant


@pytest.fixture
def config_extra() -> dict[str, Any]:
    return {"packing": {"max_items": 5, "window": "5s"}}


def _pack_services(swarm: DockerSwarm, role: str = ROLE_RUNNER) -> set[str]:
    """Chunk services of packs (runner role, job label pack-…) that exist now; with ``role``
    "identity", their identity steps."""
    found = set()
    for svc in swarm.client.api.services(filters={"label": f"{LABEL_ROLE}={role}"}):
        labels = svc["Spec"].get("Labels") or {}
        if str(labels.get(LABEL_JOB, "")).startswith("pack-"):
            found.add(svc["Spec"]["Name"])
    return found


def _any_services(swarm: DockerSwarm, jobs: list[str]) -> set[str]:
    found = set()
    for job in jobs:
        for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
            found.add(svc["Spec"]["Name"])
    return found


def test_forty_small_jobs_of_two_tenants_share_a_few_chunk_services_each_keeping_its_own(
    workspace: Workspace,
    tenants: Tenants,
    api: Api,
    swarm: DockerSwarm,
) -> None:
    ws = workspace
    root = ws.root
    packs: set[str] = set()
    try:
        _run(ws, tenants, api, swarm, packs)
    finally:
        remove_packs(swarm, root, packs)


def remove_packs(swarm: DockerSwarm, root: Path, packs: set[str], labels: tuple[str, ...] = ()) -> None:
    """Teardown: the packs' services and containers (and those of ``labels``), run folders, job files."""
    for label in (*packs, *labels):
        for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={label}"}):
            swarm.remove_service(svc["ID"])
        for c in swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={label}"}):
            remove_container(c)
    for pack in packs:
        shutil.rmtree(root / run_rel(pack), ignore_errors=True)
        (root / "inbox" / "packs" / f"{pack}.yaml").unlink(missing_ok=True)


def _run(ws: Workspace, tenants: Tenants, api: Api, swarm: DockerSwarm, packs: set[str]) -> None:
    keys = {tenants.a: tenants.keys[tenants.a], tenants.b: tenants.keys[tenants.b]}
    faces = photos.face_photos(ws.dir / "src", JOBS + 4)
    blank = photos.no_face_photo(ws.dir / "src")
    people, crowd = faces[:4], faces[4:]
    for name, key in keys.items():  # each tenant's area, made by the API, then its photos
        with api.client(key) as c:
            assert c.get("/v1/jobs").status_code == 200
        area = ws.root / "tenants" / name / "in"
        area.mkdir(exist_ok=True)
        for p in [*people, *crowd, blank]:
            shutil.copy(p, area / p.name)
        chown_tree(area, ws.config.runner_uid_gid())
    options = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 0}

    posted: list[tuple[str, str, dict[str, Any]]] = []  # (tenant, job id, the job asked)
    for n in range(JOBS):
        tenant = tenants.a if n % 2 == 0 else tenants.b
        source = f"in/{people[n % 4].name}" if n != 7 else f"in/{blank.name}"
        target = f"in/{crowd[n].name}" if n != 1 else f"in/{crowd[0].name}"  # jobs 0 and 1: same photo
        if n == 1:
            tenant = tenants.a  # so that jobs 0 and 1 (one tenant) share their target photo
        body = {**options, "name": f"small{n}", "source": source, "targets": [target]}
        with api.client(keys[tenant]) as c:
            r = c.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        posted.append((tenant, r.json()["id"], body))
    jobs = [job for _, job, _ in posted]

    seen: set[str] = set()
    steps: set[str] = set()
    deadline = time.monotonic() + 420
    while True:
        seen |= _pack_services(swarm)
        steps |= _pack_services(swarm, "identity")
        assert not _any_services(swarm, jobs), "a small job ran in chunk services of its own"
        phases = {}
        for tenant, job, _ in posted:
            with api.client(keys[tenant]) as c:
                phases[job] = c.get(f"/v1/jobs/{job}").json()["phase"]
        if all(p in ("finished", "refused") for p in phases.values()):
            break
        assert time.monotonic() < deadline, (phases, api.log.read_text()[-3000:])
        time.sleep(0.5)
    packs |= {(ws.root / run_rel(job) / "packed").read_text().strip() for job in jobs}
    assert all(p == "finished" for p in phases.values()), phases
    assert 1 <= len(seen) <= 4, f"{len(seen)} chunk services: {sorted(seen)}"
    by_tenant: dict[str, set[str]] = {}
    for pack in packs:  # packs never mix tenants: each holds one tenant's jobs (both tenants posted)
        members = json.loads((ws.root / run_rel(pack) / "members.json").read_text())
        (owner,) = {m["tenant"] for m in members.values()}
        assert run_rel(pack).parent == tenant_runs_rel(owner), pack  # its tenant's folder alone
        assert (ws.root / run_rel(pack) / "owner").read_text() == f"{owner}\n"  # which names the tenant
        by_tenant.setdefault(owner, set()).add(pack)
    assert sorted(by_tenant) == sorted({tenants.a, tenants.b}), by_tenant
    assert all(len(p) <= 2 for p in by_tenant.values()), by_tenant  # a window's worth, or two
    assert not steps, f"a pack ran an identity step ({sorted(steps)}): its chunks embed their own people"

    outputs: dict[str, bytes] = {}
    for n, (tenant, job, body) in enumerate(posted):
        with api.client(keys[tenant]) as c:
            row = c.get(f"/v1/jobs/{job}").json()
            report = c.get(f"/v1/jobs/{job}/report").json()
            results = c.get(f"/v1/jobs/{job}/results.zip")
        assert report["job"] == job and list(report["items"]) == ["i000000"], report
        item = report["items"]["i000000"]
        assert item["input"] == f"tenants/{tenant}/{body['targets'][0]}", item
        if n == 7:  # its source photo has no face: this job alone fails, naming the photo
            assert row["items"]["failed"] == 1 and item["status"] == "error", row
            assert blank.name in item["reason"], item
            assert results.status_code == 200 and zipfile.ZipFile(io.BytesIO(results.content)).namelist() == []
            continue
        assert row["items"]["ok"] == 1 and row["items"]["failed"] == 0, (job, row)
        own = ws.root / run_rel(job) / "results"  # read through its pack: nothing copied into the job's folder
        assert not own.is_dir() or not any(p.stat().st_size for p in own.iterdir()), sorted(own.iterdir())
        assert item["output"] == f"tenants/{tenant}/out/{job}/{Path(body['targets'][0]).name}", item
        with zipfile.ZipFile(io.BytesIO(results.content)) as zf:
            assert zf.namelist() == [f"out/{job}/{Path(body['targets'][0]).name}"], zf.namelist()
            outputs[job] = zf.read(zf.namelist()[0])
        assert (ws.root / item["output"]).read_bytes() == outputs[job]
    # jobs 0 and 1: the same target photo, different people: each got its own swap
    assert outputs[jobs[0]] != outputs[jobs[1]]
    assert json.loads((ws.root / run_rel(jobs[0]) / "report.json").read_text())["counts"]["ok"] == 1
