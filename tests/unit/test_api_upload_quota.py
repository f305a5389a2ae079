"""Concurrent uploads of one tenant at the edge of its ``quota.stored``, through the real API on
loopback: every byte an upload leaves in the area is reserved in the tenant's quota ledger before it
is written — its declared body, each archive's unpacked bytes, a chunked body as it arrives — so the
uploads that fit are accepted, the rest are refused with 413 naming the file or archive, and together
they never pass the quota; nothing staged is left and every reserved byte is given back."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from controller.api import quota as quota_book
from controller.api import submit
from controller.api.area import tree_bytes
from controller.config import parse_config
from controller.job.ledger import Counts, Ledger
from tests.builders import JPEG, Env, beat, make_config, serve_api
from tests.unit import slow_steps
from tests.unit.test_api_group_commit import until
from tests.unit.test_api_upload_limits import deflated

STORED = 1024**2  # quota.stored of the ZIP test: 1 MiB
UPLOADS = 4  # ZIP uploads at once; three fit
UNPACKED = 300_000  # what each one's archive unpacks to: four of them pass the quota, three do not


def _env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: dict[str, object], uploads_at_once: int = 2
) -> Iterator[Env]:
    """The API with acme's ``quota`` and ``uploads_at_once`` of its slow steps at once. Its clock for
    the quotas stands still: the area is walked once, at the first request, so the bytes of uploads in
    flight count by what they reserved, never also by a walk that happens to pass them."""
    monkeypatch.setattr(quota_book.BOOK, "clock", lambda: 1_000_000.0)
    config, key = make_config(tmp_path, quota=quota)
    data = yaml.safe_load(config.path.read_text())
    data["api"].update({"slow_threads": uploads_at_once + 1, "slow_threads_per_tenant": uploads_at_once})
    config.path.write_text(yaml.safe_dump(data))
    config = parse_config(config.path, data)
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, key)
        with env.client() as c:
            assert c.get("/v1/jobs").status_code == 200  # the area is made on first use
        yield env


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """quota.stored 1 MiB; all UPLOADS of acme at once in the slow steps."""
    yield from _env(tmp_path, monkeypatch, {"stored": STORED}, uploads_at_once=UPLOADS)


@pytest.fixture
def roomy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """quota.stored 8 MiB: room for a chunked body's bytes reserved a little ahead of them."""
    yield from _env(tmp_path, monkeypatch, {"stored": "8m"})


def ledger(env: Env) -> Counts:
    """The tenant's ledger (all zero before its first reservation)."""
    return Ledger(env.root, "acme").read() or Counts()


def staged(env: Env) -> list[str]:
    return [p.name for p in (env.area() / "uploads").iterdir() if p.name.startswith(".incoming")]


def photo(n: int, seed: int) -> bytes:
    """A photo of ``n`` bytes that deflates about twentyfold: well within the ratio."""
    return JPEG + bytes(random.Random(seed).choices(b"aaaaaaaaaaaaaaab", k=n - len(JPEG)))


def test_zip_uploads_that_together_pass_the_stored_quota_get_202_only_as_far_as_they_fit(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every upload is received, its budget decided and its body reserved, before any of them unpacks
    monkeypatch.setattr(submit, "unpack_targets", slow_steps.held_unpack_targets)  # sent by name
    archives = [deflated({"a.jpg": photo(UNPACKED, seed)}) for seed in range(UPLOADS)]
    assert all(len(a) < 30_000 for a in archives)  # held at once: four bodies, then three archives fit

    def post(archive: bytes) -> httpx.Response:
        with env.client() as c:
            return c.post("/v1/jobs", files=[("source", ("me.jpg", JPEG)), ("targets", ("p.zip", archive))])

    gate = slow_steps.gate(env.root)
    try:
        with ThreadPoolExecutor(UPLOADS) as clients:
            answers = [clients.submit(post, a) for a in archives]
            until(lambda: slow_steps.began(env.root) == UPLOADS, "every upload to be received")
            assert ledger(env).stored <= STORED
            os.close(gate)
            gate = -1
            got = [a.result(timeout=60) for a in answers]
    finally:
        if gate >= 0:
            os.close(gate)
    codes = sorted(r.status_code for r in got)
    assert codes == [202] * (UPLOADS - 1) + [413], [r.text for r in got]
    refused = next(r for r in got if r.status_code == 413).json()["error"]
    assert refused["code"] == "too_large" and refused["file"] == "p.zip"
    assert "archive 'p.zip'" in refused["message"] and "stored quota" in refused["message"]
    assert tree_bytes(env.area()) <= STORED  # what the accepted ones left
    assert staged(env) == []
    counts = ledger(env)
    assert counts.reserved == 0 and counts.jobs == UPLOADS - 1 and counts.stored <= STORED
    assert len(list((env.root / "inbox").glob("*.yaml"))) == UPLOADS - 1


BOUNDARY = "ffswarm-test-boundary"
TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()


def multipart(target: bytes) -> bytes:
    """A body with a source photo and one target photo, ending in TAIL (built by hand: sent chunked)."""

    def part(field: str, name: str, data: bytes) -> bytes:
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n\r\n'
        return head.encode() + data

    return part("source", "me.jpg", JPEG) + b"\r\n" + part("targets", "big.jpg", target) + TAIL


def chunked(client: httpx.Client, pieces: Iterator[bytes]) -> httpx.Response:
    """POST with no Content-Length: the body sent as it is drawn from ``pieces``."""
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    return client.post("/v1/jobs", content=pieces, headers=headers)


def test_a_chunked_upload_reserves_its_bytes_as_they_arrive_and_a_second_past_the_quota_is_413(
    roomy: Env,
) -> None:
    env = roomy
    first_body, second_body = multipart(photo(5_000_000, 1)), multipart(photo(5_000_000, 2))
    finish = threading.Event()

    def first_pieces() -> Iterator[bytes]:
        yield first_body[: -len(TAIL)]  # every byte of its files: held in the ledger as they arrive
        assert finish.wait(30), "the test never let the first upload finish"
        yield TAIL

    with ThreadPoolExecutor(1) as client, env.client() as c:
        first = client.submit(chunked, c, first_pieces())
        until(lambda: ledger(env).reserved >= 5_000_000, "the first upload's bytes to be reserved")
        with env.client() as other:
            second = chunked(other, iter([second_body]))
        finish.set()
        accepted = first.result(timeout=30)
    assert accepted.status_code == 202, accepted.text
    assert second.status_code == 413, second.text
    err = second.json()["error"]
    assert err["code"] == "too_large" and err["file"] == "big.jpg" and "stored quota" in err["message"]
    assert tree_bytes(env.area()) <= 8 * 1024**2
    assert staged(env) == []
    assert ledger(env).reserved == 0


def test_a_chunked_upload_past_what_is_left_of_the_quota_is_413_naming_its_file(env: Env) -> None:
    (env.area() / "old.jpg").write_bytes(b"\0" * 700_000)
    with env.client() as c:
        r = chunked(c, iter([multipart(photo(400_000, 3))]))
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["file"] == "big.jpg" and "what is left of this tenant's stored quota" in err["message"]
        assert staged(env) == [] and ledger(env).reserved == 0
        assert chunked(c, iter([multipart(photo(200_000, 4))])).status_code == 202
