"""Slow work in its own bounded pool (controller/api/slow.py): one tenant's blocked globs never hold
the threads that answer other tenants, nor more than its share of the slow pool; its further slow
steps wait in its own queue. First the pool on its own, then through the real API."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controller.api import submit
from controller.api.errors import ApiError
from controller.api.slow import NICE, Lane, Lent, SlowWork
from controller.api.uploads import Budget, Part
from controller.config import parse_config
from controller.errors import ConfigError
from tests.builders import JPEG, Env, api_env, make_config, zip_bytes
from tests.unit import slow_steps
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
    # acme's glob checks wait, in the slow workers, on a gate this test holds shut
    monkeypatch.setattr(submit, "checked_json_apart", slow_steps.held_checked_json)  # sent by name
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

    gate = slow_steps.gate(env.root)
    try:
        with ThreadPoolExecutor(FLOOD) as clients:
            flood = [clients.submit(post, "acme") for _ in range(FLOOD)]
            # all of acme's submits in: two on its share of the slow pool, the other ten waiting without a worker
            until(lambda: "acme" in lanes and lanes["acme"].waiting == FLOOD - 2, "acme's submits to be in flight")
            until(lambda: slow_steps.began(env.root) == 2, "acme's two glob checks to reach the gate")
            assert lanes["acme"].running == 2
            with env.client("globex") as c:
                r = c.get("/v1/jobs")
                assert r.status_code == 200 and r.json()["jobs"] == []
                accepted = c.post("/v1/jobs", json=job)  # its own glob gets a slow worker acme does not hold
                assert accepted.status_code == 202
                assert c.get(f"/v1/jobs/{accepted.json()['id']}").status_code == 200
            assert lanes["acme"].running == 2 and slow_steps.began(env.root) == 2
            os.close(gate)
            gate = -1
            answers = [f.result(timeout=30) for f in flood]
    finally:
        if gate >= 0:
            os.close(gate)
    assert [a.status_code for a in answers] == [202] * FLOOD
    assert slow_steps.began(env.root) == FLOOD


# --- steps in worker processes ---------------------------------------------------------------------


@pytest.fixture
def started() -> Iterator[SlowWork]:
    """A slow pool with its worker processes, as the app's start makes it."""
    slow = SlowWork(threads=2, per_tenant=1)
    slow.start()
    yield slow
    slow.close()


def test_a_step_sent_apart_runs_in_another_process_that_yields_the_cpu_to_the_api(started: SlowWork) -> None:
    async def body() -> tuple[int, int]:
        lane = started.lane("acme")
        return await lane.run_apart(os.getpid), await lane.run_apart(os.nice, 0)

    pid, niceness = in_loop(body)
    assert pid != os.getpid()
    assert niceness == min(19, os.nice(0) + NICE)


def _bad_crc_zip() -> bytes:
    data = zip_bytes({"ok.jpg": JPEG, "a.jpg": JPEG})
    at = data.index(b"a.jpg") + len("a.jpg") + 100  # a byte of a.jpg's content (stored)
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def test_a_refusal_raised_in_a_worker_reaches_the_caller_as_the_same_400(started: SlowWork, tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    files = [Part("source", "me.jpg", "me.jpg", kind="image"), Part("targets", "p.zip", "p.zip", kind="zip")]

    def staged(name: str) -> int:  # an upload's staging folder holding the damaged archive, opened
        (tmp_path / name / "targets").mkdir(parents=True)
        (tmp_path / name / "targets" / "p.zip").write_bytes(_bad_crc_zip())
        return os.open(tmp_path / name, os.O_RDONLY | os.O_DIRECTORY)

    def refusal(step: Callable[[], Any]) -> ApiError:
        with pytest.raises(ApiError) as e:
            step()
        return e.value

    here = refusal(lambda: submit.unpack_targets(config, Lent(staged("here")), files, Budget(10**6, "cap")))
    fd = staged("apart")
    try:
        lane = started.lane("acme")
        apart = refusal(
            lambda: in_loop(
                lambda: lane.run_apart(submit.unpack_targets, config, Lent(fd), files, Budget(10**6, "cap"))
            )
        )
    finally:
        os.close(fd)
    assert (apart.status, apart.body(), apart.headers) == (here.status, here.body(), here.headers)
    message = "p.zip: entry 'a.jpg' is damaged (its CRC-32 does not match)"
    assert apart.body() == {"error": {"code": "bad_zip", "message": message, "file": "p.zip"}}


def test_a_worker_that_dies_mid_step_is_a_503_to_try_again_and_the_next_step_runs(started: SlowWork) -> None:
    async def body() -> tuple[ApiError, int]:
        lane = started.lane("acme")
        with pytest.raises(ApiError) as e:
            await lane.run_apart(os._exit, 1)  # as a worker killed for memory
        return e.value, await lane.run_apart(os.getpid)

    died, pid = in_loop(body)
    assert (died.status, died.code, died.headers) == (503, "busy", {"Retry-After": "1"})
    assert pid != os.getpid()


@pytest.mark.parametrize(
    ("data", "walks"),
    [
        ({"source": "in/face.jpg", "targets": ["in/a.jpg", "in/b.jpg"]}, False),
        ({"source": "in/face.jpg", "targets": "in/a.jpg"}, False),
        ({"source": "in/face.jpg", "targets": ["in/a.jpg", "in/**/*.jpg"]}, True),
        ({"source": "in/face.jpg", "targets": "in/shoot-[12].jpg"}, True),
        ({"source": "in/face.jpg", "targets": ["s3://bucket/acme/in/"]}, True),
        ({"source": "in/face.jpg", "pairs_file": "in/pairs.csv"}, True),
        (["not", "an", "object"], False),
    ],
)
def test_only_json_submits_that_walk_folders_or_list_a_store_go_to_a_worker_process(data: object, walks: bool) -> None:
    assert submit.walks(data) is walks
