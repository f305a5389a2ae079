"""Lanes on the dev swarm (packing.linger, controller/run/lanes.py): a pack's chunk service waits for
the next pack and runs it on the models it already loaded, instead of a service of its own; a lane
whose runner died is not trusted — the next pack runs its chunk as always, and finishes.

Four rounds of small API jobs, each round one pack. The second runs in the lane the first started:
one lane service seen for both, no pack runner service, the second pack's attempt record without a
cold start; its job whose source has no face fails alone, and the chunk is not run again for it. The
lane's container is then killed, and the third round still ends with every output. A fifth round,
of another tenant, never runs in the first tenant's lane: its pack has a service and a runner process
of its own. A lane no live `serve` owns is removed (what the next `serve` does with a dead one's), a
live one's is kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from contract.layout import run_rel, tenant_key
from controller.run.handover import live_owners
from controller.run.lanes import ROLE_LANE, remove_left
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, LABEL_ROLE, ROLE_RUNNER
from tests.fixtures import photos
from tests.integration.conftest import Api, Tenants, Workspace, chown_tree
from tests.integration.test_api_packing import remove_packs

pytestmark = pytest.mark.integration

ROUND = 3  # jobs per round: one pack each


@pytest.fixture
def config_extra() -> dict[str, Any]:
    return {"packing": {"max_items": 5, "window": "1s", "linger": "60s"}}


def lane_view(tenant: str) -> dict[str, bool]:
    """What any lane of ``tenant`` mounts, each target read-only or not (docs/operations.md#isolation)."""
    return {
        f"/data/tenants/{tenant}": True,
        f"/data/tenants/{tenant}/out": False,
        f"/data/runs/.tenants/{tenant_key(tenant)}": False,
        "/data/models/default": True,
    }


def data_mounts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A live service spec's mounts of the data root (its tmpfs left out)."""
    return [m for m in spec["TaskTemplate"]["ContainerSpec"]["Mounts"] if m["Type"] != "tmpfs"]


def _services(swarm: DockerSwarm, role: str, prefix: str) -> set[str]:
    found = set()
    for svc in swarm.client.api.services(filters={"label": f"{LABEL_ROLE}={role}"}):
        if str((svc["Spec"].get("Labels") or {}).get(LABEL_JOB, "")).startswith(prefix):
            found.add(svc["Spec"]["Name"])
    return found


def test_a_second_pack_runs_in_the_first_packs_lingering_service_and_a_dead_lane_is_not_trusted(
    workspace: Workspace,
    tenants: Tenants,
    api: Api,
    swarm: DockerSwarm,
) -> None:
    ws = workspace
    packs: set[str] = set()
    try:
        _run(ws, tenants, api, swarm, packs)
    finally:
        remove_packs(swarm, ws.root, packs, tuple(f"lane-{p}-c0000" for p in packs))


def _round(
    tenants: Tenants,
    api: Api,
    swarm: DockerSwarm,
    n: int,
    seen: dict[str, set[str]],
    faceless: bool = False,
    tenant: str | None = None,
) -> list[str]:
    """One round of ROUND jobs of ``tenant`` (default: the first), to their ends; with ``faceless``
    the first one's source has no face."""
    key = tenants.keys[tenant or tenants.a]
    jobs = []
    options = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 1}
    for k in range(ROUND):
        source, target = f"in/src{(n * ROUND + k) % 4}.jpg", f"in/t{n}{k}.jpg"
        source = "in/blank.jpg" if faceless and k == 0 else source
        body = {**options, "name": f"r{n}j{k}", "source": source, "targets": [target]}
        with api.client(key) as c:
            r = c.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        jobs.append(r.json()["id"])
    deadline = time.monotonic() + 300
    while True:
        seen["lanes"] |= _services(swarm, ROLE_LANE, "lane-pack-")
        seen["runners"] |= _services(swarm, ROLE_RUNNER, "pack-")
        with api.client(key) as c:
            phases = [c.get(f"/v1/jobs/{j}").json()["phase"] for j in jobs]
        if all(p == "finished" for p in phases):
            break
        assert time.monotonic() < deadline, (phases, api.log.read_text()[-3000:])
        time.sleep(0.3)
    for k, job in enumerate(jobs):
        with api.client(key) as c:
            row = c.get(f"/v1/jobs/{job}").json()
            results = c.get(f"/v1/jobs/{job}/results.zip")
            report = c.get(f"/v1/jobs/{job}/report").json()
        if faceless and k == 0:  # fails alone, naming the photo, and its chunk is not run again for it
            assert row["items"]["failed"] == 1 and "blank.jpg" in report["items"]["i000000"]["reason"], report
            continue
        assert row["items"]["ok"] == 1 and row["items"]["failed"] == 0, (job, row)
        with zipfile.ZipFile(io.BytesIO(results.content)) as zf:
            assert len(zf.namelist()) == 1 and zf.read(zf.namelist()[0])[:2] == b"\xff\xd8", zf.namelist()
    return jobs


def _run(ws: Workspace, tenants: Tenants, api: Api, swarm: DockerSwarm, packs: set[str]) -> None:
    faces = photos.face_photos(ws.dir / "faces", 4 + 5 * ROUND)
    blank = photos.no_face_photo(ws.dir / "blank")
    for tenant in (tenants.a, tenants.b):
        with api.client(tenants.keys[tenant]) as c:  # the tenant's area, made by the API
            assert c.get("/v1/jobs").status_code == 200
        area = ws.root / "tenants" / tenant / "in"
        area.mkdir(exist_ok=True)
        for i, f in enumerate(faces[:4]):
            shutil.copy(f, area / f"src{i}.jpg")
        shutil.copy(blank, area / "blank.jpg")
        for i, f in enumerate(faces[4:]):
            shutil.copy(f, area / f"t{i // ROUND}{i % ROUND}.jpg")
        chown_tree(area, ws.config.runner_uid_gid())
    seen: dict[str, set[str]] = {"lanes": set(), "runners": set()}

    def pack_of(job: str) -> str:
        return (ws.root / run_rel(job) / "packed").read_text().strip()

    first = _round(tenants, api, swarm, 0, seen)
    second = _round(tenants, api, swarm, 1, seen, faceless=True)
    packs |= {pack_of(j) for j in first + second}
    assert len({pack_of(j) for j in first}) == 1 and len({pack_of(j) for j in second}) == 1, packs
    assert len(seen["lanes"]) == 1, seen  # the second pack ran in the first pack's service …
    assert not seen["runners"], seen  # … and neither started a chunk service of its own
    record = json.loads((ws.root / run_rel(pack_of(second[0])) / "attempts" / "c0000.a1.json").read_text())
    assert record["exit"] == "ITEMS_FAILED" and record["cold_start_s"] < 1.0, record  # its models were loaded
    assert not (ws.root / run_rel(pack_of(second[0])) / "attempts" / "c0000.a2.json").exists()  # run once

    (lane,) = seen["lanes"]
    containers = swarm.client.containers.list(filters={"label": f"com.docker.swarm.service.name={lane}"})
    assert containers, "the lane's runner is not waiting"
    for c in containers:
        c.kill()
    third = _round(tenants, api, swarm, 2, seen)
    packs |= {pack_of(j) for j in third}
    assert seen["runners"], seen  # the dead lane was not trusted: the pack ran its chunk as always
    assert Path(ws.root / run_rel(pack_of(third[0])) / "report.json").is_file()

    # a lane whose serve is alive is left to it; one no live serve owns (it stopped, or died) is removed
    fourth = _round(tenants, api, swarm, 3, seen)  # a fresh lane, waiting now
    packs |= {pack_of(j) for j in fourth}

    # another tenant's pack of the same kind: never handed to the first tenant's lane (a service and a
    # runner process of its own: its services' names, and the process in its attempt records)
    before = set(seen["lanes"]) | set(seen["runners"])
    fifth = _round(tenants, api, swarm, 4, seen, tenant=tenants.b)
    packs |= {pack_of(j) for j in fifth}
    (other,) = {pack_of(j) for j in fifth}
    members = json.loads((ws.root / run_rel(other) / "members.json").read_text())
    assert {m["tenant"] for m in members.values()} == {tenants.b}, members
    new = (seen["lanes"] | seen["runners"]) - before
    assert new and all(other in name for name in new), (new, before)
    own = {pack_of(j) for j in first + second + third + fourth}
    processes = {
        json.loads(r.read_text()).get("process")
        for p in own
        for r in (ws.root / run_rel(p) / "attempts").glob("*.json")
    }
    theirs = [json.loads(r.read_text()) for r in (ws.root / run_rel(other) / "attempts").glob("*.json")]
    assert None not in processes and len(processes) >= 2, processes  # the killed lane's and the later ones
    assert theirs and all(r["process"] not in processes for r in theirs), (theirs, processes)

    waiting = _services(swarm, ROLE_LANE, "lane-pack-")
    assert waiting and remove_left(swarm, live_owners(ws.root / "inbox")) == 0
    assert remove_left(swarm, set()) == len(waiting) and not _services(swarm, ROLE_LANE, "lane-pack-")


def test_a_tenants_lane_mounts_only_its_area_its_packs_run_folders_and_the_models(
    workspace: Workspace,
    tenants: Tenants,
    api: Api,
    swarm: DockerSwarm,
) -> None:
    """The live lane service of tenant a (docs/operations.md#isolation): its data mounts are exactly
    a's area read-only, a's out/ writable (where the API puts its jobs' outputs: its later packs'
    output folders do not exist yet), a's folder of pack run folders runs/.tenants/<a's key>
    (writable: their run folders neither; the key worked out as the docs tell an operator) and the
    model pack read-only — never runs/, another tenant's area or the data root; and its pack's run
    folder is inside it, its owner file naming a."""
    ws = workspace
    packs: set[str] = set()
    try:
        faces = photos.face_photos(ws.dir / "faces", 4 + ROUND)
        with api.client(tenants.keys[tenants.a]) as c:  # the tenant's area, made by the API
            assert c.get("/v1/jobs").status_code == 200
        area = ws.root / "tenants" / tenants.a / "in"
        area.mkdir(exist_ok=True)
        for i, f in enumerate(faces[:4]):
            shutil.copy(f, area / f"src{i}.jpg")
        for k, f in enumerate(faces[4:]):
            shutil.copy(f, area / f"t0{k}.jpg")
        chown_tree(area, ws.config.runner_uid_gid())
        seen: dict[str, set[str]] = {"lanes": set(), "runners": set()}
        jobs = _round(tenants, api, swarm, 0, seen)
        packs |= {(ws.root / run_rel(j) / "packed").read_text().strip() for j in jobs}
        (pack,) = packs
        key = hashlib.sha256(tenants.a.encode()).hexdigest()[:10]  # docs/operations.md#isolation
        assert (ws.root / "runs" / ".tenants" / key / pack / "report.json").is_file()
        assert (ws.root / "runs" / ".tenants" / key / pack / "owner").read_text() == f"{tenants.a}\n"
        assert not (ws.root / "runs" / pack).exists()
        (lane,) = seen["lanes"]
        data = data_mounts(swarm.client.api.inspect_service(lane)["Spec"])
        assert {m["Target"]: bool(m.get("ReadOnly")) for m in data} == lane_view(tenants.a), data
        allowed = [ws.root / "tenants" / tenants.a, ws.root / "runs" / ".tenants" / key, ws.root / "models"]
        for m in data:  # where each comes from on the host: a bind's folder, or an NFS volume's sub-path
            source = m["Source"] if m["Type"] == "bind" else m["VolumeOptions"]["DriverConfig"]["Options"]["device"]
            assert any(source == str(p) or source.startswith(f"{p}/") or source.endswith(
                "/" + str(p.relative_to(ws.root))) for p in allowed), m  # fmt: skip
    finally:
        remove_packs(swarm, ws.root, packs, tuple(f"lane-{p}-c0000" for p in packs))
