"""`serve` shares the swarm's GPUs between running jobs by tenant weight, within quotas
(controller/serve/shares.py): what each job's supervisor is allowed to run, round by round."""

from __future__ import annotations

import threading
from pathlib import Path

from controller.run.chunks import Policy
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.serve.shares import ShareBook
from controller.swarm.servicespec import ServiceSpec
from tests.fakes import FakeSwarm
from tests.unit.test_supervisor import Clock, settings


def book(total: int | None) -> ShareBook:
    return ShareBook(lambda: total)


def test_a_small_job_is_not_starved_by_a_big_one_of_another_tenant() -> None:
    b = book(2)
    big = b.join("big", "acme", 1, None, 1)
    small = b.join("small", "zeta", 1, None, 1)
    assert small.limit(asked=8, want=1, running=0) == 1
    assert big.limit(asked=8, want=500, running=0) == 1
    assert b.shares() == {"big": 1, "small": 1}


def test_shares_follow_the_weights() -> None:
    b = book(4)
    b.join("a", "heavy", 3, None, 1).limit(8, 100, 0)
    b.join("b", "light", 1, None, 1).limit(8, 100, 0)
    assert b.shares() == {"a": 3, "b": 1}


def test_what_one_tenant_does_not_want_goes_to_the_others() -> None:
    b = book(4)
    a = b.join("a", "acme", 1, None, 1)
    b.join("b", "zeta", 5, None, 1).limit(8, 1, 0)  # a heavy tenant with one chunk left
    assert a.limit(8, 100, 0) == 3
    assert b.shares() == {"a": 3, "b": 1}


def test_a_tenant_never_exceeds_its_gpu_quota_even_alone() -> None:
    b = book(8)
    a1 = b.join("a1", "acme", 1, 2, 1)
    a2 = b.join("a2", "acme", 1, 2, 1)
    assert a1.limit(8, 100, 0) + a2.limit(8, 100, 0) == 2
    assert sum(b.shares().values()) == 2


def test_jobs_of_one_tenant_split_its_share_evenly() -> None:
    b = book(4)
    b.join("a1", "acme", 1, None, 1).limit(8, 100, 0)
    b.join("a2", "acme", 1, None, 1).limit(8, 100, 0)
    b.join("z", "zeta", 1, None, 1).limit(8, 100, 0)
    assert b.shares() == {"a1": 1, "a2": 1, "z": 2}


def test_a_newcomer_starts_when_a_gpu_frees_and_the_big_job_does_not_take_it_back() -> None:
    b = book(2)
    big = b.join("big", "acme", 1, None, 1)
    assert big.limit(8, 100, 0) == 2  # alone: both GPUs
    small = b.join("small", "zeta", 1, None, 1)
    assert small.limit(8, 3, 0) == 0  # both GPUs busy: no pending service behind them
    assert big.limit(8, 98, 2) == 1  # over its share now: starts nothing more
    assert big.limit(8, 97, 1) == 1  # one of its chunks ended: it keeps one
    assert small.limit(8, 3, 0) == 1  # and the freed GPU is the newcomer's
    small.leave()
    assert big.limit(8, 97, 1) == 2  # the newcomer gone: the big job has both again


def test_two_jobs_asking_at_once_cannot_both_take_the_last_gpu() -> None:
    b = book(1)
    jobs = [b.join(f"j{i}", f"t{i}", 1, None, 1) for i in range(8)]
    answers: list[int] = []
    barrier = threading.Barrier(len(jobs))

    def ask(share: object) -> None:
        barrier.wait()
        answers.append(share.limit(4, 10, 0))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=ask, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [0] * 7 + [1]


def test_chunks_that_reserve_two_gpus_are_counted_in_gpus() -> None:
    b = book(4)
    wide = b.join("wide", "acme", 1, None, 2)
    narrow = b.join("narrow", "zeta", 1, None, 1)
    assert wide.limit(8, 100, 0) == 2  # alone at first: 2 chunks × 2 GPUs
    assert narrow.limit(8, 100, 0) == 0  # nothing free yet
    assert b.shares() == {"wide": 1, "narrow": 2}  # 2 GPUs each


def test_the_job_s_own_scale_is_still_the_upper_bound() -> None:
    b = book(8)
    assert b.join("a", "acme", 1, None, 1).limit(asked=2, want=100, running=0) == 2


def test_without_the_swarm_s_size_only_quotas_limit() -> None:
    b = book(None)
    assert b.join("a", "acme", 1, 3, 1).limit(8, 100, 0) == 3
    assert b.join("b", None, 1, None, 1).limit(8, 100, 0) == 8


def test_a_job_outside_the_book_and_a_policy_without_a_share_are_not_limited() -> None:
    assert Policy().limit(5, 100, 0) == 5
    b = book(1)
    share = b.join("a", "acme", 1, None, 1)
    share.leave()
    assert share.limit(5, 100, 0) == 5
    assert Policy(share=b.join("c", "acme", 1, 1, 1)).limit(5, 100, 0) == 1


def test_the_book_says_when_gpus_are_given_back() -> None:
    b = book(2)
    one, two = b.join("one", None, 1, None, 1), b.join("two", None, 1, None, 1)
    assert one.limit(1, 4, 0) == 1 and two.limit(1, 4, 0) == 1
    seen = one.freed()
    assert one.limit(1, 4, 1) == 1 and one.freed() == seen  # still holds what it held
    assert two.limit(1, 3, 0) == 1 and one.freed() == seen + 1  # its chunk ended: one given back
    two.leave()
    assert one.freed() == seen + 2


def test_a_job_waiting_for_a_share_starts_when_a_gpu_is_given_back_not_at_its_next_round(tmp_path: Path) -> None:
    """A pack made ready while every GPU is held waits in the book; the moment the other job gives
    its GPU back, its watch looks again (within ending_poll), not after its poll."""
    b = book(1)
    other = b.join("other", None, 1, None, 1)
    assert other.limit(1, 1, 0) == 1  # the one GPU is the other job's
    swarm = FakeSwarm()
    clock = Clock()
    started: list[float] = []
    create = swarm.create_service

    def create_service(spec: ServiceSpec) -> str:
        started.append(clock.now)
        return create(spec)

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.now >= 1.0 and other.freed() == 0:
            other.leave()  # its chunks ended at t = 1 s

    swarm.create_service = create_service  # type: ignore[method-assign]
    rundir = RunDir(tmp_path, "j")
    rundir.path.mkdir(parents=True)
    rundir.write_control(Control(1))
    policy = Policy(retries=0, timeout=60.0, schedule_timeout=10.0, poll=30.0, share=b.join("j", None, 1, None, 1))
    Supervisor(swarm, rundir, settings(), policy, clock=clock, sleep=sleep).run(["c0000"])
    assert started and 1.0 <= started[0] <= 1.0 + 2 * policy.ending_poll, started
