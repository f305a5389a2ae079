"""`ffswarm serve` as a process: inbox → done/failed, metrics scraped while a job runs, resume after a kill."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import Serve, Workspace, chown_tree

pytestmark = pytest.mark.integration


def drop(inbox: Path, name: str, text: str) -> None:
    """As an operator should: write a hidden temporary name, then rename into the inbox."""
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(inbox / name)


def wait_for(path: Path, timeout: float, serve: Serve) -> None:
    deadline = time.monotonic() + timeout
    failed = serve.inbox / "failed" / path.name
    while not path.exists():
        assert not failed.exists() or path == failed, (serve.inbox / "failed" / f"{path.name}.reason.txt").read_text()
        assert serve.proc is not None and serve.proc.poll() is None, (serve.inbox.parent / "serve.log").read_text()[
            -3000:
        ]
        assert time.monotonic() < deadline, (
            f"{path} did not appear; log: {(serve.inbox.parent / 'serve.log').read_text()[-3000:]}"
        )
        time.sleep(0.2)


def job_text(ws: Workspace, n: int) -> str:
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", n)
    photos.no_face_photo(ws.dir / "crowd")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    return f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "crowd")}/*.jpg]
output: {ws.rel(ws.dir / "out")}/{{stem}}{{ext}}
chunk_size: 2
max_concurrent: 2
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
"""


def test_serve_runs_inbox_files_and_metrics_rise_to_the_totals(workspace: Workspace, serve: Serve) -> None:
    ws = workspace
    text = job_text(ws, 5)  # 5 faces + 1 without a face = 6 items, 3 chunks
    serve.start()
    drop(serve.inbox, "bad.yaml", f"name: {ws.job}-bad\nsource: [\n")
    drop(serve.inbox, f"{ws.job}.yaml", text)
    seen: list[tuple[float, float, float]] = []
    done = serve.inbox / "done" / f"{ws.job}.yaml"
    t0 = time.monotonic()
    while not done.exists():
        assert time.monotonic() - t0 < 300, (serve.inbox.parent / "serve.log").read_text()[-3000:]
        why = serve.inbox / "failed" / f"{ws.job}.yaml.reason.txt"
        assert not why.exists(), why.read_text()
        try:
            m = serve.metrics()
            seen.append((m["ffswarm_items_done_total"], m["ffswarm_chunks_running"], m["ffswarm_gpu_slots_in_use"]))
        except OSError:
            pass  # not listening yet
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    final = serve.metrics()
    print(f"serve: 6-item job through the inbox in {elapsed:.1f}s; {len(seen)} scrapes")
    assert final["ffswarm_items_done_total"] == 6 and final["ffswarm_items_failed_total"] == 0
    assert final["ffswarm_item_seconds_count"] == 6
    assert final["ffswarm_chunks_running"] == 0 and final["ffswarm_jobs_running"] == 0
    done_counts = [d for d, _, _ in seen]
    assert done_counts == sorted(done_counts)  # counters only rise
    assert any(0 < d < 6 for d in done_counts), done_counts  # seen mid-job, not only at the end
    assert max(r for _, r, _ in seen) >= 1 and max(g for _, _, g in seen) >= 1
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == sorted(p.name for p in (ws.dir / "crowd").iterdir())
    assert not (serve.inbox / "done" / f"{ws.job}.yaml.reason.txt").exists()

    reason = serve.inbox / "failed" / "bad.yaml.reason.txt"
    wait_for(reason, 30, serve)
    assert (serve.inbox / "failed" / "bad.yaml").is_file()
    assert "JobFileError (exit 65)" in reason.read_text() and "bad.yaml" in reason.read_text()
    assert list((serve.inbox / "running").iterdir()) == []


def test_a_restarted_serve_continues_its_job(workspace: Workspace, serve: Serve, swarm: DockerSwarm) -> None:
    ws = workspace
    text = job_text(ws, 5)
    serve.start()
    drop(serve.inbox, f"{ws.job}.yaml", text)
    deadline = time.monotonic() + 60

    # Wait for a CHUNK service (not the submit-time identity service): the kill lands mid-supervision.
    def chunk_services() -> list[str]:
        svcs = swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"})
        return [s["Spec"]["Name"] for s in svcs if re.search(r"-c\d{4}-a\d+$", s["Spec"]["Name"])]

    while not chunk_services():
        assert time.monotonic() < deadline, "no chunk service appeared"
        time.sleep(0.1)
    serve.kill()  # SIGKILL mid-job: chunk services keep running, the file stays in running/
    (claimed,) = (serve.inbox / "running").glob(f"{ws.job}.*.yaml")  # claimed under a unique name, with a lease
    assert claimed.is_file() and (serve.inbox / "running" / f".{claimed.name}.lease").is_file()
    serve.start()
    wait_for(serve.inbox / "done" / f"{ws.job}.yaml", 300, serve)
    report = (ws.root / "runs" / ws.job / "report.json").read_text()
    assert '"failed": 0' in report and '"items": 6' in report
    assert len(list((ws.dir / "out").iterdir())) == 6
