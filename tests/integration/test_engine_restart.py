"""The manager's dockerd restarts under a running job (a routine package upgrade does this).

Seen on ae3bc90: `ffswarm submit` died with a raw requests traceback from a service removal, exit 1.
Now the watch rides the outage out (reconnects, re-adopts its services by their labels, re-runs the
chunks whose containers the restart killed without counting them against `retries`) and finishes;
an engine away for longer than `engine_outage` ends the submit with exit 69 and one line saying how
to resume, and `ffswarm resume` then finishes the job with nothing redone.

These tests stop and start the engine the dev swarm runs on, with the same command line and
environment it was started with (read from /proc), and wait until the swarm answers again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.fixtures import photos
from tests.integration.conftest import CONFIG, ROOT, Workspace, chown_tree

pytestmark = pytest.mark.integration

PHOTOS = 24


class Engine:
    """The dev swarm's dockerd, as it was started (scripts/dev-swarm.sh)."""

    def __init__(self) -> None:
        self.pid = int(Path("/var/run/docker.pid").read_text())
        self.argv = [a.decode() for a in Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0") if a]
        raw = Path(f"/proc/{self.pid}/environ").read_bytes().decode().split("\0")
        self.env = dict(kv.split("=", 1) for kv in raw if "=" in kv)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 90
        while Path(f"/proc/{self.pid}").exists():
            assert time.monotonic() < deadline, "dockerd did not stop"
            time.sleep(0.1)

    def start(self) -> None:
        Path("/var/run/docker.pid").unlink(missing_ok=True)
        with open("/var/log/ffswarm-dockerd.log", "ab") as log:
            # `setsid -f`: the engine is not this test's child (a child would linger as a zombie once
            # stopped, and outlive nothing it should), as it was not when dev-swarm started it.
            subprocess.run(["setsid", "-f", *self.argv], env=self.env, stdout=log, stderr=log, check=True)
        deadline = time.monotonic() + 90
        while not Path("/var/run/docker.pid").is_file() or not Path("/var/run/docker.pid").read_text().strip():
            assert time.monotonic() < deadline, "dockerd wrote no pid file"
            time.sleep(0.05)
        self.pid = int(Path("/var/run/docker.pid").read_text())
        while True:
            try:
                client = docker.from_env()
                try:
                    swarm = client.info().get("Swarm", {})
                    if swarm.get("LocalNodeState") == "active" and swarm.get("ControlAvailable"):
                        client.api.services()  # the manager's store answers too
                        client.api.nodes()
                        return
                finally:
                    client.close()
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert time.monotonic() < deadline, "dockerd did not come back with an active swarm"
            time.sleep(0.2)


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    if not Path(f"/proc/{e.pid}").exists():  # a failed test must not leave the next ones without an engine
        e.start()


def job(ws: Workspace, **extra: str) -> Path:
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", PHOTOS)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    more = "".join(f"{k}: {v}\n" for k, v in extra.items())
    return ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: [{ws.rel(ws.dir / 'crowd')}/*.jpg]\n"
        f"output: {ws.rel(ws.dir / 'out')}/{{stem}}{{ext}}\nchunk_size: 3\nmax_concurrent: 2\n"
        "providers: [cpu]\nresources: {gpus: 1, gpu_kind: GPU, memory: 2g}\n" + more
    )


def ffswarm(config: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(config), *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def items_done(ws: Workspace) -> int:
    results = ws.root / "runs" / ws.job / "results"
    if not results.is_dir():
        return 0
    return sum(f.read_text().count("\n") for f in results.glob("*.jsonl"))


def wait_mid_job(ws: Workspace, proc: subprocess.Popen[str]) -> None:
    """Until a few items are committed and more are to come: the restart lands mid-job."""
    deadline = time.monotonic() + 180
    while items_done(ws) < 3:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.05)
    assert items_done(ws) < PHOTOS - 3, "the job was nearly over before the restart: make it longer"


def test_submit_rides_out_an_engine_restart_and_finishes(workspace: Workspace, engine: Engine) -> None:
    ws = workspace
    path = job(ws, retries="0")  # the chunks the restart kills are re-run all the same: not the chunk's fault
    proc = ffswarm(CONFIG, "submit", str(path))
    wait_mid_job(ws, proc)
    engine.stop()
    time.sleep(2)  # the engine stays away a moment, as during an upgrade
    engine.start()
    out, err = proc.communicate(timeout=400)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    assert report["counts"]["ok"] == PHOTOS and report["counts"]["failed"] == 0
    assert len(list((ws.dir / "out").iterdir())) == PHOTOS
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    for r in records:  # the timeline, for `pytest -s`
        print(r["timestamp"][11:23], r["event"], r.get("chunk", ""), r.get("attempt", ""), r.get("reason", ""))
    events = [r["event"] for r in records]
    assert "engine_unavailable" in events and "engine_back" in events, events


def test_an_engine_away_too_long_ends_submit_with_69_then_resume_finishes(workspace: Workspace, engine: Engine) -> None:
    ws = workspace
    path = job(ws)
    short = ws.dir / "ffswarm.yaml"
    short.write_text(CONFIG.read_text() + "engine_outage: 5s\n")
    proc = ffswarm(short, "submit", str(path))
    wait_mid_job(ws, proc)
    engine.stop()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        engine.start()
    assert proc.returncode == 69, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("ffswarm:")]
    assert len(said) == 1 and f"ffswarm resume {ws.job}" in said[0], err[-3000:]
    done_before = items_done(ws)
    resumed = ws.ffswarm("resume", ws.job)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    assert report["counts"]["ok"] == PHOTOS
    assert len(list((ws.dir / "out").iterdir())) == PHOTOS
    assert done_before >= 3
