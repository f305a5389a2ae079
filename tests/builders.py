"""What tests build, in one place: manifests, job specs, data roots, and the two-tenant API set-up.

The API set-up is a real `ffswarm api` server (uvicorn on 127.0.0.1, a random port) over a temporary
data root, with two tenants, JWTs and signed links configured, and a fresh heartbeat standing for
`serve` (``api_env``; a test module's ``env`` fixture yields from it)."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from contract.manifest import Item, Manifest
from controller.api.app import make_app
from controller.config import Config, parse_config
from controller.job.spec import JobSpec
from controller.run.handover import HeartbeatFile
from tests.polling import until

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x11" * 200
PNG = b"\x89PNG\r\n\x1a\n" + b"\x22" * 200
MP4 = b"\x00\x00\x00\x18ftypmp42" + b"\x33" * 200
KEYS = {"acme": "acme-secret-key", "globex": "globex-secret-key"}
JWT_SECRET = b"jwt-hs256-secret-for-tests-only-" + b"0123456789abcdef" * 3
RUNNER_JOB = "job1"  # the job whose run folder the runner tests' data roots hold (tests/conftest.py: data)
PACK = {
    "det_10g.onnx": {"role": "detector", "sha256": "0" * 64},
    "w600k_r50.onnx": {"role": "recognizer", "sha256": "0" * 64},
    "inswapper_128.onnx": {"role": "swapper", "sha256": "0" * 64},
}


def manifest(**kw: Any) -> Manifest:
    """A one-photo chunk manifest of job ``j``; ``kw``: the fields a test is about."""
    fields: dict[str, Any] = {
        "job": "j",
        "chunk": "c0001",
        "run_dir": "/data/runs/j",
        "pack_dir": "/data/models/default",
        "source": ("/data/s.jpg",),
        "items": (Item("i000000", "/data/a.jpg", "/data/out/a.png"),),
    }
    return Manifest(**{**fields, **kw})


def job_spec(**kw: Any) -> JobSpec:
    """A job ``j``: faces/a.jpg onto in/*.jpg, outputs under out/; ``kw``: the fields a test is about."""
    fields: dict[str, Any] = {"name": "j", "source": ("faces/a.jpg",), "targets": ("in/*.jpg",), "output": "out/{name}"}
    return JobSpec(**{**fields, **kw})


def data_root(
    tmp_path: Path, pack_files: Mapping[str, object] = PACK, photos: Iterable[str] = ("faces/star.jpg", "crowd/a.jpg")
) -> Path:
    """``tmp_path/root``: the default model pack listing ``pack_files`` (stand-in checksums) and a
    stand-in file at each of ``photos``; the root belongs to the runner's uid when this runs as root
    (runners run as the data root's owner, never root, as scripts/dev-swarm.sh sets it up)."""
    root = tmp_path / "root"
    (root / "models" / "default").mkdir(parents=True, exist_ok=True)
    (root / "models" / "default" / "pack.yaml").write_text(yaml.safe_dump({"name": "default", "files": pack_files}))
    for rel in photos:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    if os.geteuid() == 0:
        os.chown(root, 10001, 10001)
    return root


@dataclass
class Env:
    config: Config
    root: Path
    url: str
    signing_key: bytes

    def client(self, tenant: str | None = "acme", token: str | None = None) -> httpx.Client:
        headers = {}
        if token is not None or tenant is not None:
            headers["Authorization"] = f"Bearer {token if token is not None else KEYS[str(tenant)]}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def area(self, tenant: str = "acme") -> Path:
        return self.root / "tenants" / tenant

    def inbox_file(self, job: str) -> Path:
        return self.root / "inbox" / f"{job}.yaml"


def make_config(tmp_path: Path, quota: dict[str, object] | None = None) -> tuple[Config, bytes]:
    root = data_root(tmp_path, photos=())
    (root / "inbox").mkdir()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "jwt").write_bytes(JWT_SECRET)
    signing = b"links-signing-key-for-tests"
    (secrets / "api").write_bytes(signing)
    data = {
        "data_root": str(root),
        "api": {
            "signing_key_file": str(secrets / "api"),
            "link_ttl": "1h",
            "jwt": {"algorithms": ["HS256"], "secret_file": str(secrets / "jwt"), "audience": "ffswarm"},
        },
        "tenants": {
            name: {"api_keys_sha256": [hashlib.sha256(key.encode()).hexdigest()], **({"quota": quota} if quota else {})}
            for name, key in KEYS.items()
        },
    }
    path = tmp_path / "ffswarm.yaml"
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data), signing


def serve_api(config: Config) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # lifespan on, as served: the app starts and stops its slow worker processes (controller/api/slow.py)
    server = uvicorn.Server(uvicorn.Config(make_app(config), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    # a loaded machine may take seconds to start it: waited for (up to 30 s), never used unstarted
    until(lambda: server.started or not thread.is_alive(), "the API to start")
    assert server.started, "the API did not start (its thread ended)"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


def beat(config: Config) -> None:
    # fresh for an hour: a module's tests may run long after it was written (the schema test's /readyz)
    HeartbeatFile(config.data_root / "inbox", concurrent_jobs=2, interval=3600).beat(running=0)


def api_env(tmp_path: Path, quota: dict[str, object] | None = None, heartbeat: bool = True) -> Iterator[Env]:
    """The two-tenant API served over a fresh data root (each tenant's ``quota``), for as long as the
    caller iterates; ``heartbeat``: a live `serve` stands behind the inbox."""
    config, key = make_config(tmp_path, quota)
    if heartbeat:
        beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def leftovers(area: Path) -> list[str]:
    """Files and folders under the area other than the empty uploads/ folder."""
    if not area.exists():
        return []
    return sorted(
        p.relative_to(area).as_posix() for p in area.rglob("*") if p.relative_to(area).as_posix() != "uploads"
    )
