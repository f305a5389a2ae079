"""A pack's jobs read through the pack (controller/serve/packs.py, controller/run/packed.py): each
job's status and fold show its items as the pack commits them, nothing copied into the job's folder;
a job cancelled while its pack runs ends at once, the pack going on for the others; a resumed pack
ends its jobs; a job never sees an item of another job, whatever members.json says. The pack runs
on the in-memory FakeSwarm; its runner is stood in for by the result lines a chunk's end writes."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from contract.results import ItemResult, ItemStatus
from controller.config import Config
from controller.run import control, job_lease
from controller.run.fold import Fold
from controller.run.packed import PackView, pack_of
from controller.run.rundir import RunDir, RunFileError
from controller.run.status import job_status
from controller.serve import packs
from controller.serve.packing import Member
from tests.builders import JPEG, make_config
from tests.fakes import FakeSwarm
from tests.unit.test_packing import _job

FILES = {"in/a.jpg": JPEG, "in/b.jpg": JPEG, "faces/me.jpg": JPEG, "faces/you.jpg": JPEG}


def members(tmp_path: Path) -> tuple[Config, list[Member]]:
    """Jobs ``one`` (in/a.jpg) and ``two`` (in/b.jpg), one photo each: pack items i000000 and i000001."""
    config, _ = make_config(tmp_path)
    jobs = [
        _job(
            config,
            name,
            f"source: faces/{face}.jpg\ntargets: ['in/{photo}.jpg']\noutput: 'out/{name}/{{name}}'\n",
            FILES,
        )
        for name, face, photo in (("one", "me", "a"), ("two", "you", "b"))
    ]
    return config, [Member(j.file, j, None) for j in jobs]


def commit(pack: RunDir, item: str, photo: str, job: str, status: ItemStatus = ItemStatus.OK) -> None:
    """What the pack's runner appends for one of its items (attempt 1 of chunk c0000)."""
    now = time.time()
    out = f"/data/out/{job}/{photo}.jpg" if status is ItemStatus.OK else None
    line = ItemResult(item, status, 1, f"/data/in/{photo}.jpg", out, started=now, finished=now).to_line()
    with pack.layout.results("c0000", 1).open("a") as f:
        f.write(line)


def rundir(config: Config, job: str) -> RunDir:
    return RunDir(config.data_root, job)


def own_results(config: Config, job: str) -> list[str]:
    folder = rundir(config, job).layout.results_dir
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_packed_job_shows_its_items_as_the_pack_commits_them(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    pack.layout.results_dir.mkdir(parents=True, exist_ok=True)
    commit(pack, "i000001", "b", "two")  # the pack's second item: job two's only one
    two = rundir(config, "two")
    assert job_status(two)["items"] | {"total": 1, "ok": 1, "pending": 0} == job_status(two)["items"]
    r = Fold.read(two.plan(), two).result("i000000")
    assert r is not None and r.status is ItemStatus.OK and r.item == "i000000" and r.output == "/data/out/two/b.jpg"
    one = rundir(config, "one")
    assert job_status(one)["items"]["ok"] == 0 and job_status(one)["items"]["pending"] == 1
    commit(pack, "i000000", "a", "one", ItemStatus.ERROR)  # then job one's fails in the pack
    assert job_status(one)["items"]["failed"] == 1
    assert own_results(config, "one") == own_results(config, "two") == []  # read through, nothing copied


def test_a_members_record_naming_another_jobs_item_shows_it_to_no_other_job(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    pack.layout.results_dir.mkdir(parents=True, exist_ok=True)
    commit(pack, "i000001", "b", "two")
    record = json.loads(pack.layout.members.read_bytes())
    # job one's entry claims job two's pack item, and items that are no one's
    record["one"]["items"] = {"i000001": "i000000", "i000009": "i000000", "i000000": "i000005"}
    pack.write_file(pack.layout.members, json.dumps(record).encode())
    one, two = rundir(config, "one"), rundir(config, "two")
    assert Fold.read(one.plan(), one).results == {}
    assert job_status(one)["items"]["ok"] == 0
    assert job_status(two)["items"]["ok"] == 1  # its own entry still names it


def test_a_members_record_that_is_not_one_is_named_never_shown(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    runner.pack.write_file(runner.pack.layout.members, b'["one", "two"]')
    two = rundir(config, "two")
    with pytest.raises(RunFileError, match=rf"runs/{runner.pack.job}/members.json: not a members record"):
        job_status(two)


def test_a_job_cancelled_while_its_pack_runs_ends_cancelled_at_once_and_the_pack_goes_on(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    one, two = rundir(config, "one"), rundir(config, "two")
    swarm = FakeSwarm()
    seen: dict[str, Any] = {}

    def cancel_one(_: RunDir, __: Any) -> Any:
        def on_event(event: str, **fields: Any) -> None:
            if event == "chunk_running":  # the user cancels job one while the pack's chunk runs
                control.flag_cancel(one)

        return on_event

    def chunk_ends() -> None:  # the pack's runner: job two's item done; what the jobs look like meanwhile
        pack = RunDir(config.data_root, str(pack_of(one)))
        commit(pack, "i000001", "b", "two")
        seen["one"] = (one.report(), job_lease.holder(one), job_status(one)["phase"])
        seen["two"] = job_status(two)

    swarm.on_end["c0000"] = chunk_ends
    ticks = itertools.count(0.0, 10.0)  # every round of the watch is a look at the jobs
    packs_folder = config.data_root / "inbox" / "packs"
    reports = packs.start(config, swarm, ms, packs_folder, 1, [cancel_one], clock=lambda: next(ticks))
    report, holder, phase = seen["one"]
    assert report is not None and holder is None and phase == "cancelled"  # ended before the pack's chunk did
    assert report["counts"]["cancelled"] == 1
    assert seen["two"]["phase"] == "running" and seen["two"]["items"]["ok"] == 1  # read through the running pack
    assert reports["one"].counts.cancelled == 1 and reports["two"].counts.ok == 1
    assert job_status(one)["outcome"] == "cancelled" and job_status(two)["outcome"] == "succeeded"
    assert job_lease.holder(two) is None and own_results(config, "two") == []


def test_a_resumed_pack_ends_each_of_its_jobs_from_the_packs_results(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)  # its serve stopped
    pack = runner.pack

    def chunk_ends() -> None:
        commit(pack, "i000000", "a", "one")
        commit(pack, "i000001", "b", "two", ItemStatus.ERROR)

    swarm.on_end["c0000"] = chunk_ends
    reports = packs.resume(config, swarm, pack.job)
    assert reports["one"].counts.ok == 1 and reports["two"].counts.failed == 1
    assert job_status(rundir(config, "one"))["outcome"] == "succeeded"
    assert job_status(rundir(config, "two"))["outcome"] == "failed"
    assert packs.resume(config, swarm, pack.job) == {}  # every job ended: nothing left to run


def test_a_pack_whose_every_job_is_cancelled_stops_at_once(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    one, two = rundir(config, "one"), rundir(config, "two")
    swarm = FakeSwarm()

    def cancel_both(_: RunDir, __: Any) -> Any:
        def on_event(event: str, **fields: Any) -> None:
            if event == "chunk_running":  # the users cancel both jobs while the pack's chunk runs
                control.flag_cancel(one)
                control.flag_cancel(two)

        return on_event

    swarm.on_end["c0000"] = lambda: pytest.fail("the pack's chunk ran to its end for no job")
    ticks = itertools.count(0.0, 10.0)
    reports = packs.start(config, swarm, ms, config.data_root / "inbox" / "packs", 1, [cancel_both],
                          clock=lambda: next(ticks))  # fmt: skip
    assert reports["one"].counts.cancelled == 1 and reports["two"].counts.cancelled == 1
    pack = RunDir(config.data_root, str(pack_of(one)))
    assert (pack.report() or {})["counts"]["chunks_cancelled"] == 1 and swarm.removed  # its service stopped


def test_a_pack_left_behind_by_its_ended_jobs_is_ended_when_resumed_and_runs_nothing(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)
    for job in runner.jobs.values():  # both cancelled and ended; then the pack's controller stopped
        runner.finish(job, cancelled=True)
    assert packs.resume(config, swarm, runner.pack.job) == {}
    assert swarm.created == []  # no chunk started for jobs that have ended
    assert job_status(runner.pack)["outcome"] == "cancelled"
    assert all((rundir(config, j).report() or {})["counts"]["cancelled"] == 1 for j in ("one", "two"))


def test_a_job_read_with_another_packs_view_still_sees_its_own_packs_results(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    folder = config.data_root / "inbox" / "packs"
    _, first = packs.open_pack(config, FakeSwarm(), ms[:1], folder, 1)  # job one alone in a pack
    _, second = packs.open_pack(config, FakeSwarm(), ms[1:], folder, 1)  # job two in another
    for runner, photo, job in ((first, "a", "one"), (second, "b", "two")):
        runner.pack.layout.results_dir.mkdir(parents=True, exist_ok=True)
        commit(runner.pack, "i000000", photo, job)  # each pack's only item
    two = rundir(config, "two")
    r = Fold.read(two.plan(), two, PackView(first.pack)).result("i000000")  # the view is job one's pack
    assert r is not None and r.output == "/data/out/two/b.jpg"


def test_a_packs_end_reports_every_job_from_one_reading_of_the_pack(tmp_path: Path) -> None:
    config, ms = members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    runner.pack.layout.results_dir.mkdir(parents=True, exist_ok=True)
    commit(runner.pack, "i000000", "a", "one")  # job two's item has no result: its chunk failed in the pack
    runner.plan, runner.image = runner.pack.plan(), runner.pack.image()
    runner.end_jobs(cancelled=False)
    one, two = runner.jobs["one"].report, runner.jobs["two"].report
    assert one is not None and one.counts.ok == 1 and one.counts.failed == 0
    assert two is not None and two.counts.failed == 1 and two.counts.chunks_failed == 1
    assert two.failures[0].reason == f"chunk c0000 failed: no result recorded in pack {runner.pack.job}"
    assert job_status(rundir(config, "one"))["outcome"] == "succeeded"
    assert job_status(rundir(config, "two"))["outcome"] == "failed"
