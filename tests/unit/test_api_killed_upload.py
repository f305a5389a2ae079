"""A killed API process mid-upload leaves nothing, and no replica's sweep touches a live upload.

Real `ffswarm api` processes (the CLI, uvicorn, on 127.0.0.1) share one temporary data root, as API
replicas share the volume: one is SIGKILLed while a multipart body is still arriving, another is
receiving an upload of its own, and a third starts on the same root (its start-up sweep).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.api.sweep import LOCK_SUFFIX, Staging, every, sweep_uploads
from controller.config import Config
from controller.volume import UnsafePath
from tests.builders import JPEG, KEYS, beat, make_config

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY = "killedupload0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiProcess:
    """`ffswarm --config CFG api --listen 127.0.0.1:PORT` in its own process."""

    def __init__(self, config: Config, log: Path, args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.log = log
        argv = [sys.executable, "-c", "from controller.cli.main import main; main()", "--config", str(config.path),
                "api", "--listen", f"127.0.0.1:{self.port}", *args]  # fmt: skip
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"ffswarm api did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


class SlowUpload:
    """A multipart POST sent in chunks (Transfer-Encoding: chunked), as slowly as the test likes."""

    def __init__(self, port: int, tenant: str = "acme") -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        self.conn.putrequest("POST", "/v1/jobs")
        self.conn.putheader("Authorization", f"Bearer {KEYS[tenant]}")
        self.conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
        self.conn.putheader("Transfer-Encoding", "chunked")
        self.conn.endheaders()

    def send(self, data: bytes) -> None:
        self.conn.send(b"%x\r\n%s\r\n" % (len(data), data))

    def part(self, field: str, filename: str | None, head: bytes) -> None:
        """The start of a part: its headers and the first bytes of its content."""
        disposition = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename else "")
        self.send(f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + head)

    def finish(self) -> tuple[int, dict[str, object]]:
        self.send(f"\r\n--{BOUNDARY}--\r\n".encode())
        self.conn.send(b"0\r\n\r\n")
        r = self.conn.getresponse()
        body = json.loads(r.read())
        self.conn.close()
        return r.status, body


def stagings(uploads: Path) -> list[str]:
    return sorted(p.name for p in uploads.iterdir() if p.name.startswith(".incoming-")) if uploads.is_dir() else []


def wait_for_bytes(uploads: Path) -> str:
    """The staging folder whose first part file has received bytes."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for name in stagings(uploads):
            part = uploads / name / ".parts" / "0"
            if not name.endswith(LOCK_SUFFIX) and part.is_file() and part.stat().st_size:
                return name
        time.sleep(0.02)
    pytest.fail(f"no upload reached {uploads}")


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path, quota={"upload": "8m"})[0]


@pytest.fixture
def apis(tmp_path: Path) -> Iterator[list[ApiProcess]]:
    started: list[ApiProcess] = []
    yield started
    for api in started:
        api.stop()


def test_a_killed_api_mid_upload_leaves_nothing_and_a_live_replicas_upload_is_kept(
    config: Config, apis: list[ApiProcess], tmp_path: Path
) -> None:
    root = config.data_root
    uploads = root / "tenants" / "acme" / "uploads"
    records = root / "tenants" / ".jobs" / "acme"

    killed = ApiProcess(config, tmp_path / "killed.log")
    apis.append(killed)
    doomed = SlowUpload(killed.port)
    doomed.part("source", "me.jpg", JPEG + b"\x00" * 65536)
    left = wait_for_bytes(uploads)
    os.kill(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait(10)
    doomed.conn.close()
    # what the kill leaves: the half-received folder and its (now unlocked) lock file
    assert stagings(uploads) == [left, left + LOCK_SUFFIX]

    live = ApiProcess(config, tmp_path / "live.log")  # its own start-up sweep removes the leftover
    apis.append(live)
    assert stagings(uploads) == []
    receiving = SlowUpload(live.port)
    receiving.part("source", "me.jpg", JPEG + b"\x01" * 65536)
    kept = wait_for_bytes(uploads)

    fresh = ApiProcess(config, tmp_path / "fresh.log")  # a new replica on the same root: it sweeps at start
    apis.append(fresh)
    assert stagings(uploads) == [kept, kept + LOCK_SUFFIX]  # the live replica's upload is still there
    assert not records.exists() or list(records.iterdir()) == []
    assert not list((root / "inbox").glob("*.yaml"))

    beat(config)  # a controller serves the inbox: the live upload completes and is accepted
    receiving.send(f"\r\n--{BOUNDARY}\r\n".encode())
    receiving.send(b'Content-Disposition: form-data; name="targets"; filename="a.jpg"\r\n\r\n' + JPEG)
    receiving.send(f'\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="job"\r\n\r\n'.encode())
    receiving.send(json.dumps({"resources": {"gpus": 0}}).encode())
    status, body = receiving.finish()
    assert status == 202, body
    job = str(body["id"])
    assert (root / "inbox" / f"{job}.yaml").is_file() and (records / f"{job}.json").is_file()
    assert (uploads / job / "source" / "me.jpg").stat().st_size == len(JPEG) + 65536
    assert sorted(p.name for p in uploads.iterdir()) == [job]  # no staging folder, no lock file


def test_the_sweep_never_follows_a_link_in_the_runner_writable_area(config: Config, tmp_path: Path) -> None:
    root = config.data_root
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.txt").write_text("keep")
    uploads = root / "tenants" / "acme" / "uploads"
    uploads.mkdir(parents=True)
    (uploads / ".incoming-link").symlink_to(outside)  # a planted link with no lock: removed, not followed
    (uploads / ".incoming-x.lock").symlink_to(outside / "sub" / "keep.txt")  # a lock that is a link
    (uploads / ".incoming-x").mkdir()
    (uploads / ".incoming-x" / "into").symlink_to(outside / "sub")
    assert sorted(sweep_uploads(root, "acme")) == [".incoming-link", ".incoming-x"]
    assert list(uploads.iterdir()) == [] and (outside / "sub" / "keep.txt").read_text() == "keep"

    globex = root / "tenants" / "globex"
    globex.mkdir()
    (globex / "uploads").symlink_to(outside)  # the uploads folder itself a link: nothing beyond it is touched
    (outside / ".incoming-y").mkdir()
    with pytest.raises(UnsafePath):
        sweep_uploads(root, "globex")
    assert (outside / ".incoming-y").is_dir()


def test_this_process_own_live_upload_is_not_swept_and_ends_with_nothing_left(config: Config) -> None:
    root = config.data_root
    uploads = root / "tenants" / "acme" / "uploads"
    (root / "tenants" / "acme").mkdir(parents=True)
    with Staging(root, "acme", "job-aaaaaaaa") as folder:
        (folder / "part").write_bytes(b"x" * 10)
        assert sweep_uploads(root, "acme") == []
        assert (folder / "part").is_file()
    assert list(uploads.iterdir()) == []


def test_a_leftover_without_a_lock_file_is_an_older_apis_and_is_removed_after_an_hour(config: Config) -> None:
    root = config.data_root
    old = root / "tenants" / "acme" / "uploads" / ".incoming-old"
    old.mkdir(parents=True)
    assert sweep_uploads(root, "acme") == []
    assert sweep_uploads(root, "acme", now=time.time() + 3601) == [".incoming-old"] and not old.exists()


def test_the_sweep_runs_again_and_again_while_the_app_serves() -> None:
    calls: list[int] = []

    async def main() -> None:
        async with every(lambda: calls.append(1), seconds=0.01)(object()):
            while len(calls) < 3:
                await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(calls) >= 3
