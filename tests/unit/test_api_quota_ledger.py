"""The per-tenant quota ledger (controller/job/ledger.py, controller/api/quota.py): job slots taken
atomically by threads, processes and the real API at the quota's edge, given back when a job ends
(`serve`) or a request is refused, counts that survive a restart, drift healed by the recount, bytes
held for a request from a worker process, and a submit whose cost does not grow with the tenant's
queued jobs."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from controller.api.area import Area
from controller.api.errors import ApiError
from controller.api.quota import Claim, QuotaBook, claim, reserve_bytes
from controller.config import Config, load_config
from controller.job.ledger import Ledger, OverQuota
from controller.run.metrics import Metrics
from controller.serve.daemon import Outcome, Server
from controller.serve.inbox import Inbox
from tests.builders import JPEG, Env, beat, make_config, serve_api

QUOTA = 5
TRIES = 40  # reservations each of two processes tries at once


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Config, Area]:
    config, _ = make_config(tmp_path, quota={"jobs_queued": QUOTA, "stored": "1m"})
    area = Area(config.data_root, "acme")
    area.ensure(None)
    return config, area


def take(book: QuotaBook, config: Config, area: Area, job: str) -> None:
    """What a submit does: a slot, bound to the job, the job's file in the inbox, committed."""
    slot = book.reserve(config, config.tenants["acme"], area)
    slot.bind(job)
    (config.data_root / "inbox" / f"{job}.yaml").write_text("x")
    area.write_record(job, uploads=False)
    slot.commit()


def jobs_counted(area: Area) -> int:
    counts = Ledger(area.root, area.tenant).read()
    assert counts is not None
    return counts.jobs


def test_parallel_requests_at_the_edge_get_exactly_the_quota_through_the_api(tmp_path: Path) -> None:
    config, key = make_config(tmp_path, quota={"jobs_queued": QUOTA})
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, key)
        with env.client() as c:
            c.get("/v1/jobs")  # the area is made on first use
        (env.area() / "me.jpg").write_bytes(JPEG)
        body = {"source": "me.jpg", "targets": ["me.jpg"], "resources": {"gpus": 0}}

        def post(env: Env, body: dict[str, object]) -> int:
            with env.client() as c:
                return c.post("/v1/jobs", json=body).status_code

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(post, [env] * 16, [body] * 16))
    assert sorted(codes) == [202] * QUOTA + [429] * (16 - QUOTA)
    assert len(list((config.data_root / "inbox").glob("*.yaml"))) == QUOTA


def test_many_threads_at_the_edge_get_exactly_the_quota_and_refusals_give_their_slot_back(
    setup: tuple[Config, Area],
) -> None:
    config, area = setup
    book = QuotaBook()
    gate = threading.Barrier(24)

    def one(_: int) -> object:
        gate.wait()
        try:
            return book.reserve(config, config.tenants["acme"], area)
        except ApiError as e:
            return e.status

    with ThreadPoolExecutor(24) as pool:
        got = list(pool.map(one, range(24)))
    slots = [g for g in got if not isinstance(g, int)]
    assert len(slots) == QUOTA and sorted(g for g in got if isinstance(g, int)) == [429] * (24 - QUOTA)
    assert jobs_counted(area) == QUOTA
    for slot in slots:
        slot.release()  # type: ignore[attr-defined]
    assert jobs_counted(area) == 0
    assert os.listdir(config.data_root / "tenants" / ".quota" / "acme" / "open") == []


def _reserve_in_child(config_file: str, out: Any, ready: Any, done: Any) -> None:
    config = load_config(config_file)  # the same config file, read by another process
    area = Area(config.data_root, "acme")
    book = QuotaBook()

    def one(_: int) -> int:
        try:
            book.reserve(config, config.tenants["acme"], area)  # held: never released
            return 202
        except ApiError as e:
            return e.status

    ready.wait()  # both processes start together
    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(one, range(TRIES)))
    out.put((codes.count(202), codes.count(429)))
    done.wait()  # the slots held until the parent has counted


def test_two_processes_at_the_edge_get_exactly_the_quota_and_a_killed_ones_slots_come_back(
    setup: tuple[Config, Area],
) -> None:
    config, area = setup
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no lock of this one inherited
    out, ready, done = ctx.Queue(), ctx.Barrier(3), ctx.Event()
    kids = [ctx.Process(target=_reserve_in_child, args=(str(config.path), out, ready, done)) for _ in range(2)]
    for k in kids:
        k.start()
    ready.wait(60)
    results = [out.get(timeout=30) for _ in kids]
    assert sum(r[0] for r in results) == QUOTA and sum(r[1] for r in results) == 2 * TRIES - QUOTA
    assert jobs_counted(area) == QUOTA
    book = QuotaBook()
    with pytest.raises(ApiError) as e:  # the children still hold every slot
        book.reserve(config, config.tenants["acme"], area)
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "30"}
    for k in kids:  # killed, not released: the kernel drops their locks, the recount their slots
        k.kill()
        k.join(10)
    assert book.give_back_orphans(config, area)  # the API's minute sweep, before any new request
    assert jobs_counted(area) == 0
    assert not os.listdir(config.data_root / "tenants" / ".quota" / "acme" / "open")
    assert not book.give_back_orphans(config, area)  # nothing left to give back: no recount
    slot = book.reserve(config, config.tenants["acme"], area)
    assert jobs_counted(area) == 1
    slot.release()


def test_a_job_that_ended_without_its_decrement_is_healed_by_the_recount(setup: tuple[Config, Area]) -> None:
    config, area = setup
    book = QuotaBook()
    jobs = [f"j{n}-abcdefgh" for n in range(QUOTA)]
    for job in jobs:
        take(book, config, area, job)
    with pytest.raises(ApiError):
        book.reserve(config, config.tenants["acme"], area)
    done = config.data_root / "inbox" / "done"
    done.mkdir()
    os.rename(config.data_root / "inbox" / f"{jobs[0]}.yaml", done / f"{jobs[0]}.yaml")  # ended, never told
    assert jobs_counted(area) == QUOTA  # the fast count drifted
    book.reserve(config, config.tenants["acme"], area).release()  # the recount found the slot
    assert jobs_counted(area) == QUOTA - 1


def test_a_queued_job_cancelled_through_the_api_gives_its_slot_back_at_once(tmp_path: Path) -> None:
    config, key = make_config(tmp_path, quota={"jobs_queued": 1})
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, key)
        with env.client() as c:
            c.get("/v1/jobs")  # the area is made on first use
            (env.area() / "me.jpg").write_bytes(JPEG)
            body = {"source": "me.jpg", "targets": ["me.jpg"], "resources": {"gpus": 0}}
            first = c.post("/v1/jobs", json=body)
            assert first.status_code == 202 and c.post("/v1/jobs", json=body).status_code == 429
            assert c.post(f"/v1/jobs/{first.json()['id']}/cancel").json()["cancelled"] is True
            area = Area(config.data_root, "acme")
            assert jobs_counted(area) == 0  # at once: not left to the next recount
            assert not list((config.data_root / "tenants" / ".quota" / "acme" / "open").iterdir())
            assert c.post("/v1/jobs", json=body).status_code == 202
        assert jobs_counted(area) == 1


def test_serve_gives_the_slot_back_once_when_the_job_ends(setup: tuple[Config, Area]) -> None:
    config, area = setup
    beat(config)
    book = QuotaBook()
    take(book, config, area, "a-abcdefgh")
    take(book, config, area, "b-abcdefgh")
    assert jobs_counted(area) == 2

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        return Outcome(True, None)

    server = Server(config, Inbox(config.data_root / "inbox"), Metrics(), poll=0.05, run=run, heartbeat_every=0.1)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    os.utime(config.data_root / "inbox" / "a-abcdefgh.yaml", (0, 0))  # settled
    os.utime(config.data_root / "inbox" / "b-abcdefgh.yaml", (0, 0))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while len(list((config.data_root / "inbox" / "done").glob("*.yaml"))) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        server.stop.set()
        t.join(5)
    assert jobs_counted(area) == 0
    assert not Ledger(config.data_root, "acme").job_ended("a-abcdefgh")  # a second end subtracts nothing
    assert jobs_counted(area) == 0


def test_a_new_book_after_a_restart_sees_the_same_counts(setup: tuple[Config, Area]) -> None:
    config, area = setup
    for n in range(3):
        take(QuotaBook(), config, area, f"j{n}-abcdefgh")
    slot = QuotaBook().reserve(config, config.tenants["acme"], area, nbytes=1000)
    assert jobs_counted(area) == 4
    again = QuotaBook()  # another process or replica: nothing in memory
    assert again.stored(area, 10**9) == 1000  # the reserved bytes count for everyone
    reserve_bytes(slot, config.tenants["acme"], 5000)
    assert again.stored(area, 10**9) == 6000
    with pytest.raises(ApiError) as e:
        reserve_bytes(slot, config.tenants["acme"], 1024**2)  # past quota.stored (1 MiB)
    assert e.value.status == 429
    slot.bind("j3-abcdefgh")
    (config.data_root / "inbox" / "j3-abcdefgh.yaml").write_text("x")
    slot.commit(kept=2000)
    assert again.stored(area, 10**9) == 2000 and jobs_counted(area) == 4
    held = again.reserve(config, config.tenants["acme"], area)  # the fifth of 5
    with pytest.raises(ApiError):
        again.reserve(config, config.tenants["acme"], area)
    held.release()


def test_a_torn_ledger_is_rebuilt_from_the_tenants_records(setup: tuple[Config, Area]) -> None:
    config, area = setup
    for n in range(3):
        take(QuotaBook(), config, area, f"j{n}-abcdefgh")
    (config.data_root / "tenants" / ".quota" / "acme" / "ledger").write_bytes(b'{"jobs": 1, "res')
    os.unlink(config.data_root / "inbox" / "j0-abcdefgh.yaml")  # ended (withdrawn) meanwhile
    QuotaBook().reserve(config, config.tenants["acme"], area).release()
    assert jobs_counted(area) == 2


def counting(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Counts the calls that touch the volume by name (stat, lstat, open, scandir, listdir)."""
    calls = [0]
    for name in ("stat", "lstat", "open", "scandir", "listdir"):
        real = getattr(os, name)

        def wrapped(*a: Any, _real: Any = real, **k: Any) -> Any:
            calls[0] += 1
            return _real(*a, **k)

        monkeypatch.setattr(os, name, wrapped)
    return lambda: calls[0]


def test_a_submit_costs_the_same_with_10_or_200_jobs_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = make_config(tmp_path, quota={"jobs_queued": 1000})
    area = Area(config.data_root, "acme")
    area.ensure(None)
    now = [1000.0]
    book = QuotaBook(clock=lambda: now[0])  # the area's walk and the recount not due in between
    cost = {}
    n = 0
    for queued in (10, 200):
        while n < queued:
            take(book, config, area, f"j{n}-abcdefgh")
            n += 1
        with monkeypatch.context() as m:
            calls = counting(m)
            take(book, config, area, f"j{n}-abcdefgh")
            n += 1
            cost[queued] = calls()
    assert cost[10] == cost[200] and cost[10] < 40, cost


def test_jobs_queued_before_the_ledger_existed_count_from_the_first_submit(setup: tuple[Config, Area]) -> None:
    config, area = setup
    for n in range(QUOTA):  # an API without the ledger accepted these: records and inbox files only
        area.write_record(f"old{n}-abcdefgh", uploads=False)
        (config.data_root / "inbox" / f"old{n}-abcdefgh.yaml").write_text("x")
    book = QuotaBook()
    assert book.stored(area, 10**9) == 0  # a budget read first makes the ledger, counting nothing yet
    with pytest.raises(ApiError) as e:
        book.reserve(config, config.tenants["acme"], area)
    assert e.value.status == 429 and f"{QUOTA} jobs are not finished" in e.value.message


def test_a_refused_submit_gives_its_slot_back(tmp_path: Path) -> None:
    config, key = make_config(tmp_path, quota={"jobs_queued": 1})
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, key)
        with env.client() as c:
            c.get("/v1/jobs")
            (env.area() / "me.jpg").write_bytes(JPEG)
            for _ in range(3):  # each refused after it took the only slot
                bad = c.post("/v1/jobs", json={"source": "me.jpg", "targets": ["missing/*.jpg"]})
                assert bad.status_code == 422, bad.text
            ok = c.post("/v1/jobs", json={"source": "me.jpg", "targets": ["me.jpg"], "resources": {"gpus": 0}})
            assert ok.status_code == 202, ok.text
            assert c.post("/v1/jobs", json={"source": "me.jpg", "targets": ["me.jpg"]}).status_code == 429
    assert jobs_counted(Area(config.data_root, "acme")) == 1


def _hold_in_child(claim: Claim, n: int) -> int:
    """What a slow worker does with a request's lent reservation: bytes held, its copy closed."""
    try:
        return claim.hold(n)
    finally:
        claim.lent.close()


def test_bytes_a_worker_process_holds_for_a_request_survive_a_recount_and_go_back_with_the_request(
    setup: tuple[Config, Area],
) -> None:
    config, area = setup
    tenant = config.tenants["acme"]
    book = QuotaBook()
    slot = book.reserve(config, tenant, area, nbytes=1000)
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(1, ctx) as worker:  # the reservation's descriptor lent, as to a slow worker
        assert worker.submit(_hold_in_child, claim(slot, tenant, area), 600_000).result(timeout=60) == 600_000
        with pytest.raises(OverQuota):  # 1 MiB is the quota: 601,000 held, 500,000 more do not fit
            worker.submit(_hold_in_child, claim(slot, tenant, area), 500_000).result(timeout=60)
    ledger = Ledger(area.root, area.tenant)
    with ledger.transaction() as tx:  # a recount keeps what the live request holds
        assert ledger.recount(tx, lambda jobs: jobs, 0.0).reserved == 601_000
    with pytest.raises(ApiError) as e:  # another request sees them
        book.reserve(config, tenant, area, nbytes=500_000)
    assert e.value.status == 429
    slot.release()
    counts = ledger.read()
    assert counts is not None and (counts.reserved, counts.jobs) == (0, 0)


def test_a_slot_made_bound_to_its_job_counts_as_one_through_a_recount_and_its_end(setup: tuple[Config, Area]) -> None:
    """A JSON submit takes its slot under the job's id at once (no bind afterwards): held, it counts
    as one; committed with the job queued, a recount keeps it; the job's end gives it back."""
    config, area = setup
    book, acme, job = QuotaBook(), config.tenants["acme"], "quick-abcdefgh"
    open_ = config.data_root / "tenants" / ".quota" / "acme" / "open"
    slot = book.reserve(config, acme, area, job=job)
    assert [p.name for p in open_.iterdir()] == [job]  # no pending name, no rename to come
    slot.bind(job)  # already bound: nothing changes
    (config.data_root / "inbox" / f"{job}.yaml").write_text("x")
    area.write_record(job, uploads=False)
    with Ledger(area.root, area.tenant).transaction() as tx:  # a recount while the request holds it
        assert Ledger(area.root, area.tenant).recount(tx, lambda js: [], time.time()).jobs == 1
    slot.commit()
    with Ledger(area.root, area.tenant).transaction() as tx:  # committed: counted as the queued job it is
        assert Ledger(area.root, area.tenant).recount(tx, lambda js: list(js), time.time()).jobs == 1
    assert Ledger(area.root, area.tenant).job_ended(job) and jobs_counted(area) == 0
    assert not list(open_.iterdir())
    slot = book.reserve(config, acme, area, job="refused-abcdefgh")
    slot.release()  # a refused request: its bound slot goes, nothing counted
    assert jobs_counted(area) == 0 and not list(open_.iterdir())
