"""Two tenants' jobs share the dev swarm's 2 GPUs (observed on the swarm): a tenant with a big job
does not keep a newcomer's small job waiting behind it (controller/serve/shares.py).

Equal weights on 2 GPUs give one GPU each; how weights split more GPUs (3:1 of 4, quotas, chunks of
two GPUs) is proven on the share book itself (tests/unit/test_gpu_shares.py): the dev swarm has two.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from controller.swarm.backend import ENDED
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_ROLE, ROLE_RUNNER
from tests.fixtures import photos
from tests.integration.conftest import Api, Tenants, Workspace

pytestmark = pytest.mark.integration

BIG, SMALL = 10, 3  # one-photo chunks


@pytest.fixture
def tenant_settings(tenants: Tenants) -> dict[str, dict[str, Any]]:
    return {tenants.a: {"weight": 1}, tenants.b: {"weight": 1}}


def _live_chunks(swarm: DockerSwarm, job: str) -> int:
    """The job's chunk services whose task has not ended: running, or waiting for a GPU."""
    live = 0
    for s in swarm.services(job):
        task = s.latest_task()
        if s.labels.get(LABEL_ROLE) == ROLE_RUNNER and (task is None or task.state not in ENDED):
            live += 1
    return live


def test_a_newcomer_gets_a_gpu_as_soon_as_one_frees_and_never_waits_behind_a_big_job(
    workspace: Workspace,
    tenants: Tenants,
    api: Api,
    swarm: DockerSwarm,
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    crowd = photos.face_photos(ws.dir / "crowd", BIG)
    options = {"chunk_size": 1, "max_concurrent": 4, "providers": ["cpu"],
               "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}}  # fmt: skip

    def post(key: str, name: str, targets: list[Any]) -> str:
        files = [("source", ("me.jpg", star.read_bytes(), "image/jpeg"))]
        files += [("targets", (p.name, p.read_bytes(), "image/jpeg")) for p in targets]
        with api.client(key) as c:
            r = c.post("/v1/jobs", files=files, data={"job": json.dumps({**options, "name": name})})
        assert r.status_code == 202, (r.text, api.log.read_text()[-3000:])
        return str(r.json()["id"])

    def phase(key: str, job: str) -> str:
        with api.client(key) as c:
            return str(c.get(f"/v1/jobs/{job}").json()["phase"])

    key_a, key_b = tenants.keys[tenants.a], tenants.keys[tenants.b]
    big = post(key_a, "big", crowd)
    deadline = time.monotonic() + 300
    while _live_chunks(swarm, big) < 2:  # alone, the big job takes both GPUs
        assert time.monotonic() < deadline and phase(key_a, big) not in ("finished", "refused"), api.log.read_text()
        time.sleep(0.2)

    small = post(key_b, "small", crowd[:SMALL])
    samples: list[tuple[int, int]] = []  # (big's live chunks, small's), from the small job's first chunk on
    while (small_phase := phase(key_b, small)) != "finished":
        assert small_phase != "refused" and time.monotonic() < deadline, api.log.read_text()[-3000:]
        a, b = _live_chunks(swarm, big), _live_chunks(swarm, small)
        if b or samples:
            samples.append((a, b))
        time.sleep(0.2)
    big_phase = phase(key_a, big)

    assert samples, "the small job's chunks were never seen"
    # From its first chunk to its end, the newcomer held one GPU and the big job the other: it never
    # queued a second service behind the big job's, and the big job never went back to both.
    assert max(b for _, b in samples) == 1, samples
    assert max(a for a, _ in samples) <= 1, samples
    assert big_phase != "finished", "the big job ended first: nothing was shared"

    while (p := phase(key_a, big)) != "finished":
        assert p != "refused" and time.monotonic() < deadline, api.log.read_text()[-3000:]
        time.sleep(0.5)
    with httpx.Client(base_url=api.url, timeout=30) as c:
        for key, job, n in ((key_a, big, BIG), (key_b, small, SMALL)):
            row = c.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {key}"}).json()
            assert row["items"]["ok"] == n and row["items"]["failed"] == 0, row
