"""A pack's life through `ffswarm serve` on the dev swarm (issue 18): a serve killed while its pack runs
is replaced and the pack continues (no committed item redone, every job ends with its own report);
a job cancelled while packed ends cancelled alone, the others of its pack end done.
Jobs are CLI jobs dropped in the inbox (the API's path into serve is the same: test_api_packing.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import CONFIG, ROOT, Workspace, chown_tree
from tests.integration.test_ops_serve import drop
from tests.polling import remove_container

pytestmark = pytest.mark.integration


class Serve:
    def __init__(self, ws: Workspace, config: Path) -> None:
        self.ws, self.config, self.inbox = ws, config, ws.dir / "inbox"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(self.config), "serve",
               "--inbox", str(self.inbox), "--metrics-port", "0", "--poll", "0.3",
               "--concurrent-jobs", "1"]  # fmt: skip
        with open(self.ws.dir / "serve.log", "a") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def log(self) -> str:
        return (self.ws.dir / "serve.log").read_text()[-4000:]


@pytest.fixture
def packing(workspace: Workspace, swarm: DockerSwarm) -> Iterator[Serve]:
    data = yaml.safe_load(CONFIG.read_text())
    data["packing"] = {"max_items": 5, "window": "1s"}
    config = workspace.dir / "ffswarm.yaml"
    config.write_text(yaml.safe_dump(data))
    serve = Serve(workspace, config)
    yield serve
    serve.kill()
    jobs = {p.name for p in workspace.root.joinpath("runs").iterdir() if p.name.startswith(workspace.job)}
    for name in list(jobs):
        packed = workspace.root / "runs" / name / "packed"
        if packed.is_file():
            jobs.add(packed.read_text().strip())
    for job in jobs:
        for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
            swarm.remove_service(svc["ID"])
        for c in swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job}"}):
            remove_container(c)
        shutil.rmtree(workspace.root / "runs" / job, ignore_errors=True)


def _jobs(ws: Workspace, n: int, photos_each: int) -> list[str]:
    people = photos.face_photos(ws.dir / "people", 3)
    crowd = photos.face_photos(ws.dir / "crowd", n * photos_each)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    names = []
    for k in range(n):
        name = f"{ws.job}-{k:02d}"
        targets = ", ".join(ws.rel(p) for p in crowd[k * photos_each : (k + 1) * photos_each])
        text = (
            f"name: {name}\nsource: {ws.rel(people[k % 3])}\ntargets: [{targets}]\n"
            f"output: {ws.rel(ws.dir / 'out')}/{name}/{{name}}\nproviders: [cpu]\nretries: 1\n"
            "resources: {gpus: 1, gpu_kind: GPU, memory: 2g}\n"
        )
        drop(ws.dir / "inbox", f"{name}.yaml", text)
        names.append(name)
    return names


def _pause_runner(pack: str, deadline: float, serve: Serve) -> Any:
    """The pack's first runner container, paused as soon as it runs (before its models have loaded)."""
    client = docker.from_env()
    while True:
        assert time.monotonic() < deadline, serve.log()
        for c in client.containers.list(filters={"name": pack}):
            with contextlib.suppress(docker.errors.APIError):  # it ended meanwhile: try the next one
                c.pause()
                return c
        time.sleep(0.02)


def _why(serve: Serve, name: str) -> str:
    reason = serve.inbox / "failed" / f"{name}.yaml.reason.txt"
    return (reason.read_text() if reason.exists() else "") + serve.log()[-1500:]


def _wait(serve: Serve, names: list[str], deadline: float) -> None:
    """Until every job's file is in done/ or failed/."""
    inbox = serve.inbox
    while not all((inbox / "done" / f"{n}.yaml").exists() or (inbox / "failed" / f"{n}.yaml").exists() for n in names):
        assert time.monotonic() < deadline, serve.log()
        assert serve.proc is not None and serve.proc.poll() is None, serve.log()
        time.sleep(0.3)


def test_a_pack_whose_serve_was_killed_is_continued_by_the_next_one(workspace: Workspace, packing: Serve) -> None:
    ws = workspace
    names = _jobs(ws, 10, 5)  # 50 photos in one pack
    packing.start()
    deadline = time.monotonic() + 300
    pack: str | None = None
    while True:  # until the pack's runners have committed something
        marks = [ws.root / "runs" / n / "packed" for n in names]
        if pack is None and marks[0].is_file():
            pack = marks[0].read_text().strip()
        if pack and any(p.stat().st_size for p in (ws.root / "runs" / pack / "results").glob("*.jsonl")):
            break
        assert time.monotonic() < deadline, packing.log()
        time.sleep(0.1)
    packing.kill()
    packing.start()
    _wait(packing, names, deadline)
    for n in names:
        assert (ws.dir / "inbox" / "done" / f"{n}.yaml").exists(), (n, _why(packing, n))
        report = json.loads((ws.root / "runs" / n / "report.json").read_text())
        assert report["counts"]["ok"] == 5 and report["counts"]["failed"] == 0, report
        assert (ws.root / "runs" / n / "packed").read_text().strip() == pack  # the same pack, continued
        assert len(list((ws.dir / "out" / n).iterdir())) == 5
    # no committed item was redone: each of the pack's items has one fresh commit, later lines say cached
    fresh: dict[str, int] = {}
    for f in (ws.root / "runs" / str(pack) / "results").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["status"] == "ok" and not r.get("cached"):
                fresh[r["item"]] = fresh.get(r["item"], 0) + 1
    assert len(fresh) == 50 and set(fresh.values()) == {1}, fresh


def test_a_job_cancelled_while_packed_ends_alone_and_the_others_finish(workspace: Workspace, packing: Serve) -> None:
    """The victim's pack's runner is frozen (docker pause) while the victim is cancelled: the job ends
    at once as cancelled with its photos not done, without waiting for the pack; the others finish."""
    ws = workspace
    names = _jobs(ws, 4, 2)
    packing.start()
    deadline = time.monotonic() + 300
    victim = ws.root / "runs" / names[1]
    while not (victim / "packed").is_file() or not (victim / "plan.json").is_file():
        assert time.monotonic() < deadline, packing.log()
        time.sleep(0.05)
    pack = (victim / "packed").read_text().strip()
    frozen = _pause_runner(pack, deadline, packing)
    try:
        cancel = subprocess.run(
            [sys.executable, "-m", "controller.cli", "--config", str(packing.config), "cancel", names[1]],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cancel.returncode == 0, cancel.stderr
        while not (victim / "report.json").is_file():  # ended while its pack's runner cannot move
            assert time.monotonic() < deadline, packing.log()
            time.sleep(0.1)
    finally:
        frozen.unpause()
    _wait(packing, names, deadline)
    report = json.loads((victim / "report.json").read_text())
    assert report["counts"]["cancelled"] == 2 and report["counts"]["ok"] == 0, report
    assert (ws.dir / "inbox" / "failed" / f"{names[1]}.yaml").exists()
    for n in (names[0], names[2], names[3]):
        assert (ws.dir / "inbox" / "done" / f"{n}.yaml").exists(), (n, _why(packing, n))
        ok = json.loads((ws.root / "runs" / n / "report.json").read_text())["counts"]
        assert ok["ok"] == 2 and ok["failed"] == 0 and ok["cancelled"] == 0, ok
