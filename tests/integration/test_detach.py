"""`ffswarm submit --detach`: hand a job to a running `ffswarm serve` and return at once; refuse when
no controller serves the inbox."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest

from controller.run.handover import HEARTBEAT_DIR, Heartbeat, serving
from tests.integration.conftest import Serve, Workspace, free_port
from tests.integration.test_ops_serve import job_text, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def serve(workspace: Workspace) -> Iterator[Serve]:
    s = Serve(workspace.dir / "inbox", free_port())
    yield s
    s.kill()


def test_detached_submit_returns_at_once_and_serve_finishes_the_job(workspace: Workspace, serve: Serve) -> None:
    ws = workspace
    job = ws.write_job(job_text(ws, 3))  # 3 faces + 1 without a face = 4 items
    serve.start()
    deadline = time.monotonic() + 60
    while not serving(serve.inbox):
        assert serve.proc is not None and serve.proc.poll() is None, (ws.dir / "serve.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "serve wrote no heartbeat"
        time.sleep(0.2)

    t0 = time.monotonic()
    r = ws.ffswarm("submit", "--detach", "--inbox", str(serve.inbox), str(job), timeout=60)
    elapsed = time.monotonic() - t0
    print(f"submit --detach returned in {elapsed:.2f}s")
    assert r.returncode == 0, r.stderr
    assert elapsed < 5
    assert f"job {ws.job}: handed to the controller" in r.stdout
    assert f"ffswarm status {ws.job} --follow" in r.stdout and f"ffswarm logs {ws.job} -f" in r.stdout

    wait_for(serve.inbox / "done" / f"{ws.job}.yaml", 300, serve)
    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())  # the id it was told
    assert report["counts"]["items"] == 4 and report["counts"]["failed"] == 0
    assert sorted(p.name for p in (ws.dir / "out").iterdir()) == sorted(p.name for p in (ws.dir / "crowd").iterdir())

    serve.kill(signal.SIGTERM)  # a clean stop takes its heartbeat away
    assert serve.proc is not None and serve.proc.returncode == 0
    assert not list((serve.inbox / HEARTBEAT_DIR).iterdir())


def test_detached_submit_without_a_controller_refuses_and_leaves_nothing(workspace: Workspace) -> None:
    ws = workspace
    job = ws.write_job(job_text(ws, 1))
    inbox = ws.dir / "inbox"
    stale = inbox / HEARTBEAT_DIR / "killed-4242.json"  # what a controller killed a minute ago leaves
    stale.parent.mkdir(parents=True)
    stale.write_text(Heartbeat("killed", 4242, time.time() - 600, time.time() - 60, 1).to_json())

    r = ws.ffswarm("submit", "--detach", "--inbox", str(inbox), str(job), timeout=60)
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "no controller is serving the inbox" in r.stderr
    assert "ffswarm serve" in r.stderr and "ffswarm render --controller" in r.stderr
    assert sorted(p.name for p in inbox.iterdir()) == [HEARTBEAT_DIR]
    assert not (ws.root / "runs" / ws.job).exists()

    bad = ws.write_job(f"name: {ws.job}\nsource: [\n")  # a bad job file is still refused as one
    r = ws.ffswarm("submit", "--detach", "--inbox", str(inbox), str(bad), timeout=60)
    assert r.returncode == 65, (r.stdout, r.stderr)
    assert sorted(p.name for p in inbox.iterdir()) == [HEARTBEAT_DIR]
