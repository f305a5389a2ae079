"""Many small jobs at once through `ffswarm serve`: a healthy swarm needs no retries.

Seen on ae3bc90: 30 one-photo jobs through `serve --concurrent-jobs 4` finished, but a few first
attempts ended with exit 137 ~0.1 s after running. Cause: the identity step's clean-up force-removed
every container of its job that was "created" at that moment, which included a chunk's container
that the swarm was just starting. Every attempt of every job here must be its first and only one.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import Serve, Workspace, chown_tree
from tests.integration.test_ops_serve import drop

pytestmark = pytest.mark.integration

JOBS = 24


@pytest.fixture
def names(workspace: Workspace, swarm: DockerSwarm, serve: Serve) -> Iterator[list[str]]:
    """The jobs' ids; each one's services, containers and run folder are removed in teardown (the
    workspace fixture removes only its own job id's) — after serve is stopped, or it makes more."""
    ids = [f"{workspace.job}-{n:02d}" for n in range(JOBS)]
    yield ids
    serve.kill()
    for job in ids:
        for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
            swarm.remove_service(svc["ID"])
        swarm.remove_exited_containers(job)
        shutil.rmtree(workspace.root / "runs" / job, ignore_errors=True)


def test_many_small_jobs_through_serve_retry_nothing(workspace: Workspace, serve: Serve, names: list[str]) -> None:
    ws = workspace
    # Each job its own source photo; the wide crops (every 3rd round of variants) show two faces.
    sources = [p for i, p in enumerate(photos.face_photos(ws.dir / "faces", 42)) if (i // 7) % 3 != 1][:JOBS]
    targets = photos.face_photos(ws.dir / "crowd", JOBS)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    serve.concurrent_jobs = 4
    serve.start()
    t0 = time.monotonic()
    for name, src, target in zip(names, sources, targets, strict=True):
        drop(
            serve.inbox,
            f"{name}.yaml",
            f"name: {name}\nsource: {ws.rel(src)}\ntargets: [{ws.rel(target)}]\n"
            f"output: {ws.rel(ws.dir / 'out')}/{name}{{ext}}\nproviders: [cpu]\n"
            "resources: {gpus: 1, gpu_kind: GPU, memory: 2g}\n",
        )
    pending = set(names)
    while pending:
        assert time.monotonic() - t0 < 420, (serve.inbox.parent / "serve.log").read_text()[-3000:]
        for name in list(pending):
            failed = serve.inbox / "failed" / f"{name}.yaml.reason.txt"
            assert not failed.exists(), failed.read_text()
            if (serve.inbox / "done" / f"{name}.yaml").exists():
                pending.discard(name)
        assert serve.proc is not None and serve.proc.poll() is None
        time.sleep(0.3)
    elapsed = time.monotonic() - t0
    attempts = {}
    for name in names:
        report = json.loads((ws.root / "runs" / name / "report.json").read_text())
        assert report["counts"]["ok"] == 1, report["failures"]
        for cid, chunk in report["chunks"].items():
            attempts[f"{name}/{cid}"] = [(a["attempt"], a["outcome"], a["reason"]) for a in chunk["attempts"]]
    retried = {k: v for k, v in attempts.items() if len(v) != 1}
    print(f"serve: {JOBS} one-photo jobs, 4 at a time, in {elapsed:.1f}s ({JOBS / elapsed:.2f} jobs/s)")
    assert len(attempts) == JOBS
    assert retried == {}, retried
