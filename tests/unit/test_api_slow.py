"""Slow work in its own bounded pool (controller/api/slow.py): one tenant's blocked globs never hold
the threads that answer other tenants, nor more than its share of the slow pool; its further slow
steps wait in its own queue. First the pool on its own, then through the real API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controller.api import submit
from controller.api.slow import Lane, SlowWork
from controller.config import parse_config
from controller.errors import ConfigError
from controller.job import resolve
from tests.builders import JPEG, Env, api_env, make_config
from tests.unit.test_api_group_commit import until


class Blocker:
    """A slow step that holds its thread until ``gate`` is set; counts how many hold one at once."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0
        self.began = 0

    def __call__(self, value: int = 0) -> int:
        with self.lock:
            self.inside += 1
            self.began += 1
            self.peak = max(self.peak, self.inside)
        self.entered.release()
        try:
            assert self.gate.wait(10), "the test never opened the gate"
            return value
        finally:
            with self.lock:
                self.inside -= 1


def in_loop(body: Callable[[], Any]) -> Any:
    """``body()`` awaited on a fresh loop whose quick pool (the default executor) has one thread."""

    async def main() -> Any:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        return await body()

    return asyncio.run(main())


def test_a_tenants_blocked_slow_steps_queue_behind_its_share_and_others_get_threads() -> None:
    slow = SlowWork(threads=2, per_tenant=1)
    blocked = Blocker()

    async def body() -> None:
        acme = slow.lane("acme")
        mine = [asyncio.create_task(acme.run(blocked, n)) for n in range(3)]
        assert await asyncio.to_thread(blocked.entered.acquire, True, 10)  # the quick pool still answers
        assert (acme.running, acme.waiting) == (1, 2)  # its share is one thread; the rest wait, holding none
        assert await slow.lane("globex").run(lambda: "globex's glob") == "globex's glob"
        assert await asyncio.to_thread(lambda: "a quick read") == "a quick read"
        assert blocked.began == 1
        blocked.gate.set()
        assert await asyncio.gather(*mine) == [0, 1, 2]
        assert (acme.running, acme.waiting) == (0, 0)

    in_loop(body)
    slow.close()
    assert blocked.peak == 1


def test_a_cancelled_slow_step_keeps_its_thread_and_slot_until_it_has_ended() -> None:
    slow = SlowWork(threads=2, per_tenant=1)
    blocked = Blocker()
    order: list[str] = []

    def after() -> None:
        order.append("next step began")

    async def body() -> None:
        acme = slow.lane("acme")
        first = asyncio.create_task(acme.run(blocked))
        assert await asyncio.to_thread(blocked.entered.acquire, True, 10)
        first.cancel()  # its client gone: the step cannot be stopped on its thread
        second = asyncio.create_task(acme.run(after))
        assert await asyncio.to_thread(lambda: "a quick read") == "a quick read"
        assert not first.done() and order == [] and acme.running == 1
        blocked.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        order.insert(0, "first step ended")
        await second

    in_loop(body)
    slow.close()
    assert order == ["first step ended", "next step began"]


def test_a_download_is_drawn_piece_by_piece_empty_pieces_included() -> None:
    slow = SlowWork(threads=2, per_tenant=1)

    def zip_pieces() -> Iterator[bytes]:
        yield b"PK"
        yield b""  # a piece with nothing piled up yet: not the end
        yield b"\x03\x04"

    async def body() -> list[bytes]:
        return [p async for p in slow.lane("acme").pieces(zip_pieces())]

    assert in_loop(body) == [b"PK", b"", b"\x03\x04"]
    slow.close()


@pytest.mark.parametrize(
    ("api", "words"),
    [
        ({"slow_threads": 4, "slow_threads_per_tenant": 4}, "api.slow_threads_per_tenant"),
        ({"slow_threads": 1}, "api.slow_threads"),
        ({"slow_threads_per_tenant": 0}, "api.slow_threads_per_tenant"),
    ],
)
def test_a_share_that_would_let_one_tenant_take_the_whole_slow_pool_is_refused(
    tmp_path: Path, api: dict[str, int], words: str
) -> None:
    config, _ = make_config(tmp_path)
    data = yaml.safe_load(config.path.read_text())
    data["api"].update(api)
    with pytest.raises(ConfigError) as e:
        parse_config(config.path, data)
    assert words in str(e.value)


def test_the_slow_pool_defaults_to_four_threads_two_per_tenant(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    assert (config.api.slow_threads, config.api.slow_threads_per_tenant) == (4, 2)


FLOOD = 12  # acme's glob submits at once: twice the quick pool asyncio gives a 2-core machine


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"requests_per_second": 1000, "requests_in_flight": FLOOD})


def test_one_tenants_blocked_glob_submits_leave_another_tenants_reads_and_submits_answered(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = Blocker()
    real = resolve.resolve_job

    def blocked_resolve(spec: Any, base: Path, *args: Any, **kwargs: Any) -> Any:
        if base.name == "acme":
            blocked()
        return real(spec, base, *args, **kwargs)

    monkeypatch.setattr(submit, "resolve_job", blocked_resolve)  # as the API's submit finds it
    lanes: dict[str, Lane] = {}
    make_lane = SlowWork.lane

    def seen_lane(self: SlowWork, tenant: str) -> Lane:  # each tenant's lane, to see what waits in it
        lanes[tenant] = make_lane(self, tenant)
        return lanes[tenant]

    monkeypatch.setattr(SlowWork, "lane", seen_lane)
    for tenant in ("acme", "globex"):
        with env.client(tenant) as c:
            assert c.get("/v1/jobs").status_code == 200  # the area is made on first use
        (env.area(tenant) / "crowd").mkdir()
        for n in range(3):
            (env.area(tenant) / "crowd" / f"{n}.jpg").write_bytes(JPEG)
    job = {"source": "crowd/0.jpg", "targets": ["crowd/*.jpg"]}

    def post(tenant: str) -> httpx.Response:
        with env.client(tenant) as c:
            return c.post("/v1/jobs", json=job)

    with ThreadPoolExecutor(FLOOD) as clients:
        flood = [clients.submit(post, "acme") for _ in range(FLOOD)]
        # all of acme's submits in: two on its share of the slow pool, the other ten waiting without a thread
        until(lambda: "acme" in lanes and lanes["acme"].waiting == FLOOD - 2, "acme's submits to be in flight")
        assert blocked.inside == 2
        with env.client("globex") as c:
            r = c.get("/v1/jobs")
            assert r.status_code == 200 and r.json()["jobs"] == []
            accepted = c.post("/v1/jobs", json=job)  # its own glob gets a slow thread acme does not hold
            assert accepted.status_code == 202
            assert c.get(f"/v1/jobs/{accepted.json()['id']}").status_code == 200
        assert blocked.inside == 2 and blocked.began == 2
        blocked.gate.set()
        answers = [f.result(timeout=30) for f in flood]
    assert [a.status_code for a in answers] == [202] * FLOOD
    assert blocked.peak == 2 and blocked.began == FLOOD
