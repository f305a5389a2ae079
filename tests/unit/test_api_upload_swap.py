"""A runner that owns the top of its tenant's area (an older ffswarm made it so, and an API not
running as root cannot take it back) can swap ``uploads`` for a link (or another folder) while an
upload arrives. Through the real API on loopback: the API writes nothing through the link, answers
409 ``unsafe_area`` with no traceback, keeps nothing of the upload, and a later upload into the
restored folder is accepted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from tests.builders import JPEG, Env, beat, make_config, serve_api, zip_bytes

BOUNDARY = "swapboundary0123456789"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config, key = make_config(tmp_path, quota={"upload": "4m"})
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


def _part(name: str, filename: str, data: bytes) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n\r\n'
    return head.encode() + data + b"\r\n"


def _wait_for_staging(uploads: Path) -> Path:
    """The staging folder of the upload in flight, once its first file has started to arrive."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [p for p in uploads.glob(".incoming-*") if (p / ".parts").is_dir()]
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError("the upload never reached its staging folder")


def _files(top: Path) -> list[str]:
    return sorted(p.relative_to(top).as_posix() for p in top.rglob("*"))


def _post(env: Env, body: Iterator[bytes]) -> httpx.Response:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    with capture_logs() as logs, env.client() as c:
        r = c.post("/v1/jobs", content=body, headers=headers)
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")], logs
    return r


def _body(swap: object = None) -> Iterator[bytes]:
    """A multipart body sent in two halves; ``swap()`` runs between them, mid-upload."""
    yield _part("source", "me.jpg", JPEG) + _part("targets", "photos.zip", b"")[:-2]
    yield zip_bytes({"a.jpg": JPEG, "set/b.jpg": JPEG})[:100]
    if callable(swap):
        swap()
    yield zip_bytes({"a.jpg": JPEG, "set/b.jpg": JPEG})[100:] + b"\r\n"
    yield _part("targets", "c.jpg", JPEG) + f"--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize("replacement", ["link", "folder"])
def test_uploads_swapped_mid_upload_writes_nothing_through_it_and_is_409(
    env: Env, tmp_path: Path, replacement: str
) -> None:
    area = env.area()
    uploads = area / "uploads"
    outside = tmp_path / "outside"  # a folder of the attacker's choosing, root's only
    outside.mkdir(mode=0o700)
    moved = area / "uploads-moved"

    def swap() -> None:
        _wait_for_staging(uploads)
        uploads.rename(moved)  # what a runner owning the area's top can do
        if replacement == "link":
            uploads.symlink_to(outside)
        else:
            uploads.mkdir()

    r = _post(env, _body(swap))
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "unsafe_area" and "Traceback" not in r.text
    assert _files(outside) == []  # nothing written through the link
    assert _files(moved) == []  # the real uploads folder: the staging folder and its lock are gone
    assert uploads.is_symlink() if replacement == "link" else _files(uploads) == []
    assert not list((env.root / "inbox").glob("*.yaml"))
    assert json.loads(env.client().get("/v1/jobs").text)["jobs"] == []

    # put right: the next upload is accepted and lands where it belongs
    if uploads.is_symlink():
        uploads.unlink()
    else:
        uploads.rmdir()
    moved.rename(uploads)
    ok = _post(env, _body())
    assert ok.status_code == 202, ok.text
    job = ok.json()["id"]
    assert [f for f in _files(uploads / job) if f.endswith(".jpg")] == [
        "source/me.jpg", "targets/c.jpg", "targets/photos/a.jpg", "targets/photos/set/b.jpg"
    ]  # fmt: skip
    assert _files(outside) == []


@pytest.mark.parametrize("placed", ["link", "file"])
def test_an_uploads_link_or_file_placed_before_the_upload_is_409_and_nothing_is_written(
    env: Env, tmp_path: Path, placed: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    env.area().mkdir(parents=True)
    if placed == "link":
        (env.area() / "uploads").symlink_to(outside)
    else:
        (env.area() / "uploads").write_bytes(b"not a folder")
    r = _post(env, _body())
    assert r.status_code == 409 and r.json()["error"]["code"] == "unsafe_area", r.text
    assert _files(outside) == []
    assert not list((env.root / "inbox").glob("*.yaml"))
