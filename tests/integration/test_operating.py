"""Operating jobs on the real swarm: killed containers, retries by exit code, timeouts, a killed
controller, scale and cancel, completion webhooks, and the backend contract (fake vs real)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import (
    CONFIG,
    ROOT,
    ServiceWatch,
    Workspace,
    assert_committed_once,
    chown_tree,
    results_of,
)

pytestmark = pytest.mark.integration


def make_job(ws: Workspace, n: int, image: str, *, faults: dict[str, Any] | None = None, **fields: Any) -> Path:
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", n)
    if faults is not None:
        (ws.dir / "faults.json").write_text(json.dumps(faults))
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    body = {
        "name": ws.job,
        "source": ws.rel(star),
        "targets": [f"{ws.rel(ws.dir / 'crowd')}/*.jpg"],
        "output": f"{ws.rel(ws.dir / 'out')}/{{stem}}{{ext}}",
        "providers": ["cpu"],
        "resources": {"memory": "2g"},
        **({} if image == ws.config.image else {"image": image}),  # the config's image is the default
        **fields,
    }
    return ws.write_job(json.dumps(body))  # JSON is YAML


def report_of(ws: Workspace) -> dict[str, Any]:
    return json.loads((ws.root / "runs" / ws.job / "report.json").read_text())


def popen_submit(ws: Workspace, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(CONFIG), *args]
    # Ctrl-C as a terminal sends it: a suite started in the background (`scripts/test.sh &`) has SIGINT
    # ignored, which every child inherits, and Python then never raises KeyboardInterrupt
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_killed_runner_container_is_retried_and_completes(workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    job = make_job(ws, 12, ws.config.image, chunk_size=12, retries=2)
    proc = popen_submit(ws, "submit", str(job))
    results = ws.root / "runs" / ws.job / "results" / "c0000.a1.jsonl"
    wait_for(lambda: results.exists() and results.read_text().count("\n") >= 2, 120, "first results")
    # the chunk runner (the identity step's container may still be on its way out)
    (container,) = swarm.client.containers.list(filters={"label": [f"{LABEL_JOB}={ws.job}", "io.ffswarm.role=runner"]})
    container.kill()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    attempts = report_of(ws)["chunks"]["c0000"]["attempts"]
    assert [a["outcome"] for a in attempts] == ["infrastructure", "done"]
    assert attempts[0]["exit_code"] == 137
    assert any(r.cached for r in results_of(ws))  # the second attempt kept what the first committed
    assert_committed_once(ws, 12)


def test_retries_follow_exit_codes(workspace: Workspace, fault_image: str) -> None:
    ws = workspace
    faults = {"c0000": {"1": {"exit": 70}, "2": {"exit": 70}}, "c0001": {"1": {"exit": 65}}}
    job = make_job(ws, 4, fault_image, faults=faults, chunk_size=2, retries=3)
    proc = ws.ffswarm("submit", str(job))
    assert proc.returncode == 1, proc.stderr[-2000:]
    chunks = report_of(ws)["chunks"]
    assert [(a["attempt"], a["exit_code"], a["outcome"]) for a in chunks["c0000"]["attempts"]] == [
        (1, 70, "internal"),
        (2, 70, "internal"),
        (3, 0, "done"),
    ]
    assert chunks["c0001"]["state"] == "failed" and chunks["c0001"]["failure"] == "user"
    assert [a["exit_code"] for a in chunks["c0001"]["attempts"]] == [65]  # no retry
    assert "fault injected: exit 65" in chunks["c0001"]["reason"]  # the runner's last words reach the report
    assert report_of(ws)["counts"]["ok"] == 2 and report_of(ws)["counts"]["failed"] == 2
    assert_committed_once(ws, 2)


def test_timeout_removes_the_attempt_and_retries(workspace: Workspace, swarm: DockerSwarm, fault_image: str) -> None:
    ws = workspace
    job = make_job(ws, 2, fault_image, faults={"c0000": {"1": {"sleep": 120}}}, timeout="4s", retries=1, chunk_size=2)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = ws.ffswarm("submit", str(job))
    assert proc.returncode == 0, proc.stderr[-2000:]
    attempts = report_of(ws)["chunks"]["c0000"]["attempts"]
    assert attempts[0]["outcome"] == "infrastructure" and "timed out after 4s" in attempts[0]["reason"]
    assert attempts[1]["outcome"] == "done"
    assert watch.max_alive == 1  # the timed-out service was removed before the next attempt
    assert_committed_once(ws, 2)


def test_killed_controller_then_resume(workspace: Workspace, swarm: DockerSwarm, fault_image: str) -> None:
    ws = workspace
    job = make_job(ws, 8, fault_image, faults={"*": {"*": {"sleep": 2}}}, chunk_size=2, max_concurrent=1)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = popen_submit(ws, "submit", str(job))
        state = ws.root / "runs" / ws.job / "results" / "c0000.a1.jsonl"
        wait_for(lambda: state.exists() and state.read_text().count("\n") == 2, 120, "chunk c0000 committed")
        wait_for(lambda: "c0001" in "".join(watch.specs), 30, "chunk c0001 started")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        resumed = ws.ffswarm("resume", ws.job)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # One service per chunk: the live c0001 service was adopted, never duplicated.
    assert sorted(watch.specs) == [f"ffswarm-{ws.job}-c000{i}-a1" for i in range(4)]
    assert report_of(ws)["counts"]["ok"] == 8
    assert_committed_once(ws, 8)


def test_scale_up_live_then_cancel(workspace: Workspace, swarm: DockerSwarm, fault_image: str) -> None:
    ws = workspace
    job = make_job(ws, 10, fault_image, faults={"*": {"*": {"sleep": 4}}}, chunk_size=1, max_concurrent=1)
    with ServiceWatch(swarm, ws.job) as watch:
        proc = popen_submit(ws, "submit", str(job))
        wait_for(lambda: watch.max_alive >= 1, 60, "first service")
        assert ws.ffswarm("scale", ws.job, "3").returncode == 0
        wait_for(lambda: watch.max_alive >= 3, 10, "three services at once after scale")
        wait_for(lambda: any((ws.dir / "out").glob("*.jpg")), 120, "a committed output")
        cancelled = ws.ffswarm("cancel", ws.job)
        assert cancelled.returncode == 0, cancelled.stderr
        _, err = proc.communicate(timeout=60)
    assert watch.max_alive == 3
    assert proc.returncode == 1, err[-3000:]  # cancelled items are not ok
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
    kept = list((ws.dir / "out").glob("*.jpg"))
    assert kept and all(p.stat().st_size > 0 for p in kept)  # committed outputs stay
    status = ws.ffswarm("status", ws.job, "-o", "json")  # the job's status object, as GET /v1/jobs/{job}
    assert json.loads(status.stdout)["phase"] == "cancelled"


def test_webhook_receives_the_report(workspace: Workspace) -> None:
    ws = workspace
    received: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = ws.config_with(webhooks={"allow_hosts": ["127.0.0.1"], "allow_private": True})  # loopback: allowed here
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/done"
        job = make_job(ws, 2, ws.config.image, on_complete={"webhook": url})
        proc = ws.ffswarm("submit", str(job), config=config)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["type"] for r in received] == ["job.started", "job.finished"]  # the Standard Webhooks envelope
    finished = received[1]["data"]
    assert finished["job"] == ws.job and finished["items"]["ok"] == 2 and finished["outcome"] == "succeeded"
    assert report_of(ws)["hooks"]["webhook"] == "delivered"  # no status code: no oracle for the job's author
