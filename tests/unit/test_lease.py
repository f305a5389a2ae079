"""The one lease (controller/run/lease.py) both the job lease and the inbox use: a hostile record
parser, one expiry rule, and a take-over of which exactly one of many takers wins."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.run import job_lease
from controller.run import lease as leases
from controller.run.lease import Owner, Record
from controller.serve.inbox import Inbox
from tests.unit.test_job_life import run_folder

TAKERS = 8


def _far(n: int = 0) -> Owner:
    return Owner("other-host", 4242 + n, "boot", "ns", f"{n:032x}", "someone (ffswarm serve, pid 4242)")


def _expired(path: Path, starts: int = 0) -> Record:
    """A lease its holder on another host stopped renewing a minute ago."""
    record = Record(_far(), time.time() - 60, 5.0, starts, time.time() - 120)
    path.write_bytes(record.to_json())
    return record


def _race(n: int, take: Callable[[int], bool]) -> list[bool]:
    """``take`` run by ``n`` threads at once; what each got."""
    barrier = threading.Barrier(n)
    got: list[bool | None] = [None] * n
    raised: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            got[i] = take(i)
        except BaseException as e:  # reported below: a taker must either win or be refused
            raised.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)  # generous: on a loaded machine eight threads may wait long for their turn
    assert not raised, raised
    assert None not in got, f"a taker did not finish: {got}"
    return [bool(g) for g in got]


def test_a_record_reads_back_as_written() -> None:
    record = Record(Owner.me(), time.time(), 5.0, 2, time.time() - 1)
    assert Record.parse(record.to_json(), time.time()) == record
    data = json.loads(record.to_json())
    assert set(data) >= {"owner", "host", "pid", "started", "heartbeat", "interval", "token", "boot", "pidns"}


@pytest.mark.parametrize(
    "change",
    [
        {"heartbeat": float("nan")},  # NaN never compares: a lease that would never expire
        {"heartbeat": time.time() + 10**9},  # a forged "forever" lease
        {"interval": 10**9},
        {"interval": 0},
        {"pid": True},
        {"pid": "12"},
        {"pid": 2**64},  # os.kill() would overflow
        {"pid": 0},
        {"starts": -1},
        {"starts": 1.5},
        {"heartbeat": "1e9"},
        {"host": "x" * 300},
        {"owner": "evil\x1b]0;owned\x07"},  # shown in the exit-69 message and by status
        {"token": ""},
        {"boot": ["a"]},
    ],
)
def test_a_hostile_field_makes_no_lease(change: dict[str, object]) -> None:
    good = json.loads(Record(_far(), time.time(), 5.0).to_json())
    raw = json.dumps({**good, **change}).encode()
    assert Record.parse(raw, time.time()) is None


def test_oversized_odd_or_incomplete_leases_are_none() -> None:
    good = json.loads(Record(_far(), time.time(), 5.0).to_json())
    now = time.time()
    assert Record.parse(json.dumps({**good, "pad": "x" * leases.MAX_BYTES}).encode(), now) is None
    assert Record.parse(b"[1, 2]", now) is None and Record.parse(b"\xff", now) is None
    assert Record.parse(None, now) is None
    for key in good:
        assert Record.parse(json.dumps({k: v for k, v in good.items() if k != key}).encode(), now) is None


def test_two_takers_of_one_expired_lease_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    seen = _expired(path)
    now = time.time()
    here = Owner.me()
    assert seen.expired(now, here) and leases.read(path, now) == seen
    first, second = Owner.me(), Owner.me()
    # both judged the same lease expired; the first replaces it, the second finds it is not the one judged
    assert leases.take_over(path, seen, Record(first, now, 5.0), now)
    assert not leases.take_over(path, seen, Record(second, now, 5.0), now)
    held = leases.read(path, time.time())
    assert held is not None and held.owner == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"]  # nothing left aside


def _takers_of_one_expired_lease(path: Path) -> None:
    seen = _expired(path)
    owners = [Owner.me() for _ in range(TAKERS)]
    now = time.time()
    got = _race(TAKERS, lambda i: leases.take_over(path, seen, Record(owners[i], now, 5.0), now))
    assert got.count(True) == 1
    held = leases.read(path, time.time())
    assert held is not None and held.owner == owners[got.index(True)]


def test_many_takers_at_once_exactly_one_wins(tmp_path: Path) -> None:
    for round_ in range(20):
        _takers_of_one_expired_lease(tmp_path / f"lease{round_}.json")
    assert not [p for p in tmp_path.iterdir() if ".takeover." in p.name or p.name.endswith(".tmp")]


def test_a_lease_renewed_after_it_was_judged_expired_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    seen = _expired(path)
    renewed = Record(seen.owner, time.time(), 5.0)
    path.write_bytes(renewed.to_json())  # its holder came back between the taker's look and its move
    assert not leases.take_over(path, seen, Record(Owner.me(), time.time(), 5.0), time.time())
    assert leases.read(path, time.time()) == renewed


def test_a_take_over_left_half_way_by_a_killed_taker_blocks_only_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lease.json"
    seen = _expired(path)
    marker = tmp_path / f".lease.json.takeover.{hashlib.sha256(seen.to_json()).hexdigest()[:32]}"
    os.link(path, marker)  # a taker got this far, then was killed
    me = Owner.me()
    assert not leases.take_over(path, seen, Record(me, time.time(), 5.0), time.time())  # one may be at work
    monkeypatch.setattr(leases, "TAKEOVER_STALE", -1.0)
    assert leases.take_over(path, seen, Record(me, time.time(), 5.0), time.time())
    held = leases.read(path, time.time())
    assert held is not None and held.owner == me
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json"]


def test_an_unreadable_lease_is_taken_over_once_and_an_absent_one_is_created(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    path.write_bytes(b"{not json")
    owners = [Owner.me() for _ in range(TAKERS)]
    now = time.time()
    got = _race(TAKERS, lambda i: leases.take_over(path, None, Record(owners[i], now, 5.0), now))
    assert got.count(True) == 1
    late = Owner.me()  # judged it unreadable before the winner wrote its lease
    assert not leases.take_over(path, None, Record(late, now, 5.0), now)
    held = leases.read(path, time.time())
    assert held is not None and held.owner == owners[got.index(True)]
    absent = tmp_path / "none.json"
    assert not leases.take_over(absent, None, Record(owners[0], now, 5.0), now)  # nothing to move
    got = _race(TAKERS, lambda i: leases.create(absent, Record(owners[i], now, 5.0)))
    assert got.count(True) == 1


def test_only_the_holder_renews_and_releases(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    me, other = Owner.me(), Owner.me()
    assert leases.create(path, Record(me, time.time() - 1, 5.0, 3))
    assert not leases.create(path, Record(other, time.time(), 5.0))
    assert not leases.renew(path, other, time.time(), 5.0)
    assert leases.renew(path, me, time.time(), 2.0)
    record = leases.read(path, time.time())
    assert record is not None and record.interval == 2.0 and record.starts == 3  # the counter is kept
    leases.release(path, other, time.time())
    assert path.exists()
    leases.release(path, me, time.time())
    assert not path.exists()


# -- the same race through both users ------------------------------------------------------------------
def test_two_controllers_taking_over_one_expired_job_lease_one_runs_it(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    _expired(rd.layout.lease)
    takers = [job_lease.Lease(rd) for _ in range(TAKERS)]
    refused: list[job_lease.LeaseHeld] = []

    def take(i: int) -> bool:
        try:
            takers[i].acquire()
        except job_lease.LeaseHeld as e:
            refused.append(e)
            return False
        return True

    got = _race(TAKERS, take)
    assert got.count(True) == 1 and len(refused) == TAKERS - 1
    winner = takers[got.index(True)]
    assert all(e.holder.owner == winner.owner and e.exit_code == 69 for e in refused)
    held = job_lease.holder(rd)
    assert held is not None and held.owner == winner.owner


def test_two_inboxes_taking_over_one_expired_file_one_resumes_it(tmp_path: Path) -> None:
    first = Inbox(tmp_path / "inbox", interval=5.0)
    first.ensure()
    job = first.path / "a.yaml"
    job.write_text("name: a\n")
    t = time.time() - 10
    os.utime(job, (t, t))
    claimed = first.claim(job)
    assert claimed is not None
    _expired(first.lease_file(claimed), starts=1)
    inboxes = [Inbox(first.path, interval=5.0) for _ in range(TAKERS)]
    got = _race(TAKERS, lambda i: inboxes[i].expired(time.time()) == [claimed])
    assert got.count(True) == 1
    winner = inboxes[got.index(True)]
    lease = winner.lease(claimed)
    assert lease is not None and lease.owner == winner.owner and lease.starts == 1
    assert winner.count_start(claimed) == 2
    assert sorted(p.name for p in first.running.iterdir()) == sorted([claimed.name, f".{claimed.name}.lease"])


@pytest.mark.parametrize("exclusive", [True, False])
def test_a_lease_write_that_meets_a_full_volume_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exclusive: bool
) -> None:
    path = tmp_path / ".job.yaml.lease"

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(leases.os, "fsync", full)
    write = leases.create if exclusive else leases.write
    with pytest.raises(OSError, match="No space left"):
        write(path, Record(Owner.me(), time.time(), 5.0))
    assert os.listdir(tmp_path) == []


def test_a_controller_meeting_a_take_over_in_progress_waits_and_names_its_winner(tmp_path: Path) -> None:
    """Another controller has marked the expired lease and not yet written its own (a slow volume, a
    busy machine): this one waits to see the winner instead of failing with "try again"."""
    rd = run_folder(tmp_path)
    seen = _expired(rd.layout.lease)
    key = hashlib.sha256(seen.to_json()).hexdigest()[:32]
    marker = rd.layout.lease.with_name(f".{rd.layout.lease.name}.takeover.{key}")
    os.link(rd.layout.lease, marker)  # the other taker's mark, made just now
    winner = _far(7)

    def finish() -> None:
        time.sleep(0.3)
        leases.write(rd.layout.lease, Record(winner, time.time(), 5.0, 0, time.time()))
        marker.unlink()

    t = threading.Thread(target=finish)
    t.start()
    try:
        with pytest.raises(job_lease.LeaseHeld) as held:
            job_lease.Lease(rd).acquire()
    finally:
        t.join()
    assert held.value.holder.owner == winner


def test_a_forked_process_holds_leases_as_itself_not_as_its_parent(tmp_path: Path) -> None:
    """What a holder is (pid, label) follows the process: a child forked after its parent held a lease
    (the API's worker processes) is another holder, and a lease of a parent that has ended is gone."""
    parent = Owner.me()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own Owner, written back to the parent
        try:
            os.write(write, json.dumps([Owner.me().pid, Owner.me().label]).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_pid, label = json.loads(os.read(read, 4096))
    os.close(read)
    os.waitpid(pid, 0)
    assert child_pid == pid != parent.pid and f"pid {pid}" in label and f"pid {parent.pid}" in parent.label
    child = Owner(parent.host, pid, parent.boot, parent.pidns, "child-id")
    assert child.gone(parent)  # the child has exited: a lease it held here is taken at once
