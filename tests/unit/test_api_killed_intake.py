"""A 202 means the job is on the volume: SIGKILL a real `ffswarm api` while clients are posting, and
every job it answered 202 has its inbox file (complete, the job it accepted) and its owner record.

The API is the CLI's own process (uvicorn on 127.0.0.1) over a temporary data root, with a fresh
heartbeat standing for `serve`; several client threads post one-photo JSON jobs until the kill.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from controller.job.files import parse_job_text
from controller.job.owners import JobRecord
from tests.builders import JPEG, KEYS, beat, make_config
from tests.unit.test_api_killed_upload import ApiProcess

CLIENTS = 6
BEFORE_KILL = 24  # 202s received before the kill: the kill lands mid-stream, requests still arriving


def post_until_refused(url: str, accepted: list[str], broken: list[str], lock: threading.Lock) -> None:
    """Post one-photo jobs until the API stops answering; each 202's id into ``accepted``."""
    body = {"source": "in/face.jpg", "targets": ["in/p.jpg"]}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['acme']}"}, timeout=20) as http:
        while True:
            try:
                r = http.post("/v1/jobs", json=body)
            except httpx.TransportError as e:  # the API died while this request was in flight
                with lock:
                    broken.append(type(e).__name__)
                return
            assert r.status_code == 202, r.text
            with lock:
                accepted.append(str(r.json()["id"]))


def test_every_job_answered_202_survives_a_kill_9_of_the_api_under_load(tmp_path: Path) -> None:
    config = make_config(tmp_path)[0]
    root = config.data_root
    beat(config)
    api = ApiProcess(config, tmp_path / "api.log")
    try:
        area = root / "tenants" / "acme" / "in"
        area.mkdir(parents=True, exist_ok=True)
        for name in ("face.jpg", "p.jpg"):
            (area / name).write_bytes(JPEG)
        accepted: list[str] = []
        broken: list[str] = []
        lock = threading.Lock()
        url = f"http://127.0.0.1:{api.port}"
        clients = [
            threading.Thread(target=post_until_refused, args=(url, accepted, broken, lock), daemon=True)
            for _ in range(CLIENTS)
        ]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 60
        while len(accepted) < BEFORE_KILL and time.monotonic() < deadline and api.proc.poll() is None:
            time.sleep(0.01)
        os.kill(api.proc.pid, signal.SIGKILL)
        api.proc.wait(10)
        for c in clients:
            c.join(30)
    finally:
        api.stop()
    assert len(accepted) >= BEFORE_KILL, (tmp_path / "api.log").read_text()[-3000:]
    assert broken, "no request was in flight when the API was killed"
    assert len(set(accepted)) == len(accepted)
    records = root / "tenants" / ".jobs" / "acme"
    for job in accepted:
        text = (root / "inbox" / f"{job}.yaml").read_text(encoding="utf-8")
        spec = parse_job_text(text, f"inbox/{job}.yaml")  # complete: the job that was accepted
        assert spec.name == job and spec.source == ("tenants/acme/in/face.jpg",)
        record = JobRecord.parse((records / f"{job}.json").read_bytes(), job, "acme")
        assert record is not None and record.sha256 == hashlib.sha256(text.encode()).hexdigest()
