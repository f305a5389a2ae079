"""`ffswarm api --workers 2`: two processes on one address take every job exactly once.

The API is the CLI's own process tree (a parent and two uvicorn workers on 127.0.0.1) over a
temporary data root, with a fresh heartbeat standing for `serve`; client threads post on their own
connections, so the kernel hands them to both workers.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.config import parse_config
from tests.builders import JPEG, KEYS, beat, make_config
from tests.unit.test_api_killed_upload import ROOT, ApiProcess, free_port

METRICS_TOKEN = "workers-scrape-token"
BODY = {"source": "in/face.jpg", "targets": ["in/p.jpg"]}
THREADS = 6
EACH = 10


class Workers(ApiProcess):
    root: Path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Workers]:
    config = make_config(tmp_path)[0]
    data = yaml.safe_load(config.path.read_text())
    data["api"]["metrics_token_sha256"] = [hashlib.sha256(METRICS_TOKEN.encode()).hexdigest()]
    config.path.write_text(yaml.safe_dump(data))
    config = parse_config(config.path, data)
    beat(config)
    area = config.data_root / "tenants" / "acme" / "in"
    area.mkdir(parents=True, exist_ok=True)
    for name in ("face.jpg", "p.jpg"):
        (area / name).write_bytes(JPEG)
    proc = Workers(config, tmp_path / "api.log", ("--workers", "2"))
    proc.root = config.data_root
    deadline = time.monotonic() + 30
    while len(children(proc.proc.pid)) < 2 and time.monotonic() < deadline:  # both forked
        time.sleep(0.02)
    yield proc
    proc.stop()


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def post(url: str, headers: dict[str, str], out: list[httpx.Response], lock: threading.Lock, n: int) -> None:
    for _ in range(n):
        with httpx.Client(base_url=url, timeout=30) as http:  # a new connection each: any worker may take it
            r = http.post("/v1/jobs", json=BODY, headers={"Authorization": f"Bearer {KEYS['acme']}", **headers})
        with lock:
            out.append(r)


def post_from_threads(api: ApiProcess, headers: dict[str, str], n: int) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    lock = threading.Lock()
    url = f"http://127.0.0.1:{api.port}"
    threads = [threading.Thread(target=post, args=(url, headers, out, lock, n)) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_two_workers_accept_every_job_once_and_metrics_count_them_all(api: Workers) -> None:
    assert len(children(api.proc.pid)) == 2, api.log.read_text()[-2000:]
    answers = post_from_threads(api, {}, EACH)
    assert [r.status_code for r in answers] == [202] * THREADS * EACH, answers[0].text
    ids = [r.json()["id"] for r in answers]
    assert len(set(ids)) == len(ids)
    root = api.root
    assert sorted(p.stem for p in (root / "inbox").glob("*.yaml")) == sorted(ids)
    # /metrics sums both workers, whichever answers the scrape
    for _ in range(4):
        r = httpx.get(f"http://127.0.0.1:{api.port}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert r.status_code == 200
        accepted = {
            s.labels["tenant"]: s.value
            for f in text_string_to_metric_families(r.text)
            for s in f.samples
            if s.name == "ffswarm_api_jobs_accepted_total"
        }
        assert accepted == {"acme": THREADS * EACH}


def test_one_idempotency_key_makes_one_job_across_workers(api: Workers) -> None:
    answers = post_from_threads(api, {"Idempotency-Key": "campaign-42"}, 3)
    made = {r.json()["id"] for r in answers if r.status_code == 202}
    assert len(made) == 1
    assert {r.status_code for r in answers} <= {202, 409}
    root = api.root
    assert [p.stem for p in (root / "inbox").glob("*.yaml")] == list(made)
    again = post_from_threads(api, {"Idempotency-Key": "campaign-42"}, 1)
    assert {r.json()["id"] for r in again} == made and {r.status_code for r in again} == {202}


def test_ctrl_c_stops_every_worker_cleanly(api: Workers) -> None:
    workers = children(api.proc.pid)
    os.kill(api.proc.pid, signal.SIGINT)
    assert api.proc.wait(30) == 0
    assert wait_gone(workers)
    log = api.log.read_text()
    assert "Traceback" not in log, log[-2000:]


def test_a_busy_address_is_one_line_before_any_worker_starts(tmp_path: Path) -> None:
    config = make_config(tmp_path)[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-c", "from controller.cli.main import main; main()", "--config", str(config.path),
                "api", "--listen", f"127.0.0.1:{port}", "--workers", "2"]  # fmt: skip
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr.lower(), done.stderr


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def wait_gone(pids: list[int], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_a_worker_that_dies_stops_the_service(api: Workers) -> None:
    first, second = children(api.proc.pid)
    os.kill(first, signal.SIGKILL)
    assert api.proc.wait(30) == 70  # the supervisor restarts the service whole
    assert wait_gone([second])
    log = api.log.read_text()
    assert "api_worker_exited" in log and "ffswarm: API worker 0 exited on its own (code -9)" in log, log[-2000:]
    assert "Traceback" not in log


def test_a_parent_killed_outright_leaves_no_worker_serving(api: Workers) -> None:
    workers = children(api.proc.pid)
    os.kill(api.proc.pid, signal.SIGKILL)
    api.proc.wait(10)
    assert wait_gone(workers), "a worker outlived its parent"


def test_a_stop_while_the_workers_start_stops_them_all(tmp_path: Path) -> None:
    """SIGTERM to the parent the moment its workers exist (still starting): none is left serving."""
    config = make_config(tmp_path)[0]
    for attempt in range(3):
        port = free_port()
        argv = [sys.executable, "-c", "from controller.cli.main import main; main()", "--config", str(config.path),
                "api", "--listen", f"127.0.0.1:{port}", "--workers", "2"]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.002)
            workers = children(proc.pid)
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0, f"attempt {attempt}"
            assert wait_gone(workers), f"attempt {attempt}: a worker kept serving"
        finally:
            if proc.poll() is None:
                for pid in children(proc.pid):
                    os.kill(pid, signal.SIGKILL)
                proc.kill()
                proc.wait(10)
            assert proc.stderr is not None
            proc.stderr.close()
