"""Packing small jobs (controller/serve/packing.py, packs.py): which jobs pack together, when a pack is
launched, and the pack a set of jobs becomes. The pack running on the swarm, each job keeping its own
status, report and outputs: tests/integration/test_api_packing.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from controller.config import Config
from controller.job.files import parse_job_text
from controller.run import usecase
from controller.run.jobs import PreparedJob
from controller.serve import packs
from controller.serve.packing import LANE_ITEMS, PACK_CHUNK_ITEMS, Member, Packer, pack_key, width
from controller.settings.fields import FieldError
from controller.settings.packing import PackingSettings, parse_packing
from tests.builders import JPEG, make_config

ON = PackingSettings(max_items=5, window=1.0)


def _job(where: Path | Config, name: str, text: str, files: dict[str, bytes]) -> PreparedJob:
    config = where if isinstance(where, Config) else make_config(where)[0]
    for rel, data in files.items():
        (config.data_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (config.data_root / rel).write_bytes(data)
    path = config.data_root / "inbox" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"name: {name}\nproviders: [cpu]\n" + text)
    return usecase.one_job(config, path)


def test_packing_settings_are_checked_and_named() -> None:
    assert parse_packing(None) == PackingSettings()
    assert not PackingSettings().on
    s = parse_packing({"max_items": 50, "window": "500ms"})
    assert s.on and s.window == 0.5 and s.max_items == 50
    assert parse_packing({"max_items": 1, "window": 2}).window == 2.0
    assert parse_packing({"max_items": 1}).linger == 0.0
    assert parse_packing({"max_items": 1, "linger": "20s"}).linger == 20
    for bad, where in (
        ({"max_items": -1}, "packing.max_items"),
        ({"max_items": 5, "window": "soon"}, "packing.window"),
        ({"max_items": 5, "window": 600}, "packing.window"),
        ({"max_items": 5, "linger": "soon"}, "packing.linger"),
        ({"max_items": 5, "linger": 601}, "packing.linger"),
        ({"max_items": 5, "extra": 1}, "packing"),
        ({"max_items": 5, "pack_items": 0}, "packing.pack_items"),
    ):
        with pytest.raises(FieldError) as e:
            parse_packing(bad)
        assert e.value.field == where, bad


def test_two_tenants_jobs_never_share_a_pack(tmp_path: Path) -> None:
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    one = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: out/one/{name}\n", files)
    acme, globex = dataclasses.replace(one, tenant="acme"), dataclasses.replace(one, tenant="globex")
    assert pack_key(acme, ON, "img") is not None
    assert pack_key(acme, ON, "img") == pack_key(dataclasses.replace(one, tenant="acme"), ON, "img")
    assert len({pack_key(acme, ON, "img"), pack_key(globex, ON, "img"), pack_key(one, ON, "img")}) == 3
    now = [100.0]
    packer = Packer(ON, "img", clock=lambda: now[0])
    for job in (acme, globex, acme):
        assert packer.offer(Member(tmp_path / "inbox" / f"{job.tenant}.yaml", job, job.tenant))
    now[0] += 10  # past the window: every bucket is due
    tenants = [{m.tenant for m in pack} for pack in packer.due(slots=9, free_gpus=None)]
    assert sorted(map(sorted, tenants)) == [["acme"], ["globex"]]


def test_only_small_photo_jobs_that_agree_on_what_the_runner_loads_pack_together(tmp_path: Path) -> None:
    files = {f"in/{n}.jpg": JPEG for n in range(8)} | {"faces/me.jpg": JPEG, "faces/you.jpg": JPEG}
    one = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: out/one/{name}\n", files)
    other = _job(tmp_path / "b", "two", "source: faces/you.jpg\ntargets: [in/1.jpg]\noutput: o/{name}\n", files)
    assert pack_key(one, ON, "img") is not None
    assert pack_key(one, ON, "img") == pack_key(other, ON, "img")  # own person, output, name: still packs
    assert pack_key(one, PackingSettings(), "img") is None  # packing off
    big = _job(tmp_path / "c", "big", "source: faces/me.jpg\ntargets: ['in/*.jpg']\noutput: o/{name}\n", files)
    assert pack_key(big, ON, "img") is None  # 8 photos: over max_items
    for extra in ("no_face: skip\n", "faces: one\n", "models: other\n", "detector: {threshold: 0.6}\n"):
        spec = parse_job_text(
            f"name: x\nproviders: [cpu]\nsource: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{{name}}\n{extra}", "x"
        )
        assert pack_key(dataclasses.replace(one, spec=spec), ON, "img") != pack_key(one, ON, "img"), extra


def test_a_bucket_launches_after_its_window_and_a_burst_fills_fewer_bigger_packs(tmp_path: Path) -> None:
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    job = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n", files)
    now = [0.0]
    packer = Packer(PackingSettings(max_items=5, window=1.0, pack_items=3), "img", clock=lambda: now[0])
    members = [
        Member(Path(f"/inbox/running/j{n}.yaml"), dataclasses.replace(job, job_id=f"j{n}"), None) for n in range(7)
    ]
    for m in members[:2]:
        assert packer.offer(m)
    assert packer.due(2) == []  # the window has not passed
    now[0] = 1.5
    assert packer.offer(members[2])
    assert packer.due(0) == []  # no free slot: the bucket waits (and keeps taking jobs)
    assert packer.offer(members[3])  # 4th item: over pack_items, a new bucket opens for it
    assert packer.waiting() == 4 and len(packer.held()) == 4
    launched = packer.due(2)
    assert [len(p) for p in launched] == [3]  # the full bucket; the new one's window has not passed
    now[0] = 3.0
    assert [[m.job.job_id for m in p] for p in packer.due(2)] == [["j3"]]
    assert packer.waiting() == 0


def test_packs_launch_only_into_gpus_no_other_pack_holds_and_run_one_chunk_per_fifty_photos(tmp_path: Path) -> None:
    """On 2 GPUs, packs launched into job slots alone queued their chunks behind one another's, each
    chunk paying a container start and a model load for a handful of photos (bench_small)."""
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    gpu = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n", files)
    cpu_spec = parse_job_text(
        "name: c\nproviders: [cpu]\nsource: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n"
        "resources: {gpus: 0}\n",
        "c",
    )
    cpu = dataclasses.replace(gpu, spec=cpu_spec, job_id="c")
    assert gpu.spec.resources.gpus == 1 and pack_key(gpu, ON, "img") != pack_key(cpu, ON, "img")
    now = [0.0]
    packer = Packer(PackingSettings(max_items=5, window=1.0, pack_items=1), "img", clock=lambda: now[0])
    for n in range(3):  # pack_items 1: each its own full bucket
        assert packer.offer(Member(Path(f"/inbox/running/g{n}.yaml"), dataclasses.replace(gpu, job_id=f"g{n}"), None))
    assert packer.offer(Member(Path("/inbox/running/c.yaml"), cpu, None))
    now[0] = 2.0  # every window has passed
    assert [[m.job.job_id for m in p] for p in packer.due(4, free_gpus=1)] == [["g0"], ["c"]]  # one GPU free
    assert packer.due(4, free_gpus=0) == []  # every GPU held by packs: the GPU packs wait, and keep filling
    assert [[m.job.job_id for m in p] for p in packer.due(4, free_gpus=None)] == [["g1"], ["g2"]]  # unknown

    assert width(12, 1, free=2, max_concurrent=4) == 1  # a handful of photos: one cold start, not two
    assert width(120, 1, free=2, max_concurrent=4) == 2  # three chunks' worth, two GPUs free
    assert width(120, 1, free=None, max_concurrent=2) == 2
    assert width(400, 2, free=5, max_concurrent=8) == 2  # 2-GPU chunks: two fit in five
    assert width(400, 0, free=0, max_concurrent=3) == 3  # CPU-only packs take no GPU
    assert width(100, 1, free=2, max_concurrent=4, lanes=True) == 1  # one chunk, in a lane
    assert width(120, 1, free=2, max_concurrent=4, lanes=True) == 2  # more than a lane takes whole


def test_a_pack_is_a_pairs_job_whose_every_item_keeps_its_job_s_person_and_output(tmp_path: Path) -> None:
    files = {"in/a.jpg": JPEG, "in/b{x}.jpg": JPEG, "faces/me.jpg": JPEG, "faces/you.jpg": JPEG}
    config, _ = make_config(tmp_path)
    jobs = []
    for name, source, target in (("one", "me", "a"), ("two", "you", "b{x}"), ("three", "me", "b{x}")):
        text = f"source: faces/{source}.jpg\ntargets: ['in/{target}.jpg']\noutput: 'out/{name}/{{name}}'\n"
        jobs.append(_job(config, name, text, files))
    members = [Member(j.file, j, None) for j in jobs]
    prepared, record = packs.build(config, members, "pack-abcdefgh", config.data_root / "inbox" / "packs", 2)
    assert prepared.job_id == "pack-abcdefgh" and prepared.spec.uses_pairs
    assert [(i.input, i.output, i.identity) for i in prepared.plan.items] == [
        ("in/a.jpg", "out/one/a.jpg", "s000000"),
        ("in/b{x}.jpg", "out/two/b{x}.jpg", "s000001"),
        ("in/b{x}.jpg", "out/three/b{x}.jpg", "s000000"),  # the same person as job one: embedded once
    ]
    assert prepared.resolved is not None and len(prepared.resolved.identities) == 2
    assert record == {
        "one": {"tenant": None, "items": {"i000000": "i000000"}},
        "two": {"tenant": None, "items": {"i000001": "i000000"}},
        "three": {"tenant": None, "items": {"i000002": "i000000"}},
    }
    # the frozen job file is a job file like any other: its pairs name the outputs literally
    again = parse_job_text(prepared.file.read_text(), "pack")
    assert [p.output for p in again.pairs] == ["out/one/a.jpg", "out/two/b{{x}}.jpg", "out/three/b{{x}}.jpg"]
    assert again.providers == ("cpu",) and again.name == "pack-abcdefgh"


def test_every_job_file_key_is_either_shared_by_a_pack_or_a_jobs_own() -> None:
    """A key missing from both lists would let jobs with different settings share one manifest."""
    from dataclasses import fields

    from controller.job.spec import JobSpec
    from controller.serve.packing import NOT_SHARED, SHARED_KEYS

    names = {f.name for f in fields(JobSpec)}
    assert set(SHARED_KEYS) | set(NOT_SHARED) == names and not set(SHARED_KEYS) & set(NOT_SHARED)


def test_jobs_with_different_selectors_are_not_packed_together(tmp_path: Path) -> None:
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    text = "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: out/{name}/{stem}{ext}\n"
    one = _job(tmp_path, "one", text, files)
    other = _job(tmp_path / "b", "two", text + "selector: {order: left-right}\n", files)
    assert pack_key(one, ON, "img") is not None and pack_key(other, ON, "img") is not None
    assert pack_key(one, ON, "img") != pack_key(other, ON, "img")


def test_a_lane_is_handed_only_a_pack_of_its_kind_while_its_runner_still_waits(tmp_path: Path) -> None:
    """controller/run/lanes.py's book of idle lanes: by pack key, within the runner's linger (less a
    margin), never older than the pack's chunk timeout; expired ones are given up."""
    from controller.run.lanes import MARGIN, Lane, Lanes
    from controller.run.rundir import RunDir

    now = [100.0]
    lanes = Lanes(lambda: None, linger=30.0, clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    home = RunDir(tmp_path, "pack-abcdefgh")
    lane = Lane("key-a", "ffswarm-lane-pack-abcdefgh-c0000", "lane-pack-abcdefgh-c0000", home, "c0000", born=now[0])
    lanes.give_back(lane)
    assert lanes.take("key-b", max_age=600) is None  # another kind of pack: its models differ
    assert lanes.take("key-a", max_age=600) is lane and lanes.take("key-a", max_age=600) is None  # one at a time
    lanes.give_back(lane)
    now[0] += 30 - MARGIN + 0.1  # its runner stops waiting too soon for a pack to reach it
    assert lanes.take("key-a", max_age=600) is None
    assert lanes.expired() == []  # … but it still waits: not given up yet
    now[0] += MARGIN
    assert lanes.expired() == [lane]  # its runner has exited: the caller removes its service
    lanes.give_back(lane)  # used again later: too old for a pack whose chunk timeout has passed since it began
    assert lanes.take("key-a", max_age=now[0] - lane.born) is None
    assert lanes.take("key-a", max_age=now[0] - lane.born + 1) is lane


def test_a_pack_with_linger_tells_its_chunk_runners_to_wait_on_their_hand_off_file(tmp_path: Path) -> None:
    import yaml

    from controller.job.plan import chunk_manifests
    from controller.run.jobs import manifest_settings

    files = {"in/a.jpg": JPEG, "faces/me.jpg": JPEG}
    config, _ = make_config(tmp_path)
    config = dataclasses.replace(config, packing=parse_packing({"max_items": 5, "linger": "20s"}))
    job = _job(config, "one", "source: faces/me.jpg\ntargets: ['in/a.jpg']\noutput: 'out/{name}'\n", files)
    prepared, _ = packs.build(config, [Member(job.file, job, None)], "pack-abcdefgh", tmp_path / "packs", 1)
    (manifest,) = chunk_manifests(prepared.plan, manifest_settings(config, prepared)).values()
    assert manifest.linger == 20.0 and manifest.handoff == "/data/runs/pack-abcdefgh/chunks/c0000.lane.json"
    (alone,) = chunk_manifests(job.plan, manifest_settings(config, job)).values()
    assert alone.linger == 0.0 and alone.handoff is None  # a job that runs alone never lingers
    assert yaml.safe_load(prepared.file.read_text())["name"] == "pack-abcdefgh"


def test_a_new_lane_starts_only_where_a_gpu_is_not_held_by_another_lane(tmp_path: Path) -> None:
    """Lanes hold their GPUs while they wait: a new one would sit pending behind them. So with every GPU
    held by a lane, a pack waits for one of its kind to be idle, or retires an idle one of another kind."""
    from controller.run.lanes import Lane, Lanes
    from controller.run.rundir import RunDir

    class Removed:  # what the book asks of the swarm here: removing a retired lane's service
        def __init__(self) -> None:
            self.names: list[str] = []

        def remove_service(self, name: str) -> None:
            self.names.append(name)

    removed = Removed()
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    lanes = Lanes(lambda: removed, linger=30.0, capacity=lambda: 2, clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type,return-value]
    assert lanes.obtain("a", 600, 1, wait=0) == (None, True)  # room: start one
    assert lanes.obtain("a", 600, 1, wait=0) == (None, True)  # and a second, on the second GPU
    assert lanes.obtain("a", 0.0 + 600, 1, wait=0.2) == (None, False)  # both GPUs held: none came in time
    assert now[0] >= 0.2  # it waited on the injected clock
    home = RunDir(tmp_path, "pack-abcdefgh")
    home.make_dirs()
    mine = Lane("a", "ffswarm-lane-1", "lane-1", home, "c0000", born=lanes.clock())
    theirs = Lane("b", "ffswarm-lane-2", "lane-2", home, "c0001", born=lanes.clock())
    lanes.give_back(mine)
    lanes.give_back(theirs)
    assert lanes.obtain("a", 600, 1, wait=0) == (mine, False)  # an idle one of its kind: handed over
    assert lanes.obtain("c", 600, 1, wait=0) == (None, True)  # another kind's idle lane retired for it
    assert removed.names == ["ffswarm-lane-2"]
    assert (home.layout.dir / "chunks" / "c0001.lane.json").read_text().count('"manifest": null') == 1  # told to stop


def test_a_chunk_service_that_is_no_lane_retires_an_idle_lane_holding_the_gpu_it_needs(tmp_path: Path) -> None:
    """A job (or pack) that cannot use `serve`'s lanes gets a fresh service (lanes.beside); while idle
    lanes hold every GPU it would sit pending behind them for up to their linger, so the idle lane
    whose runner stops waiting first is told to stop and removed before the service is made."""
    from controller.run.lanes import Lane, Lanes, beside
    from controller.run.rundir import RunDir
    from controller.swarm.servicespec import chunk_service
    from tests.fakes import FakeSwarm
    from tests.unit.test_lanes import settings

    swarm = FakeSwarm()
    now = [0.0]
    total: list[int | None] = [2]
    lanes = Lanes(lambda: swarm, linger=30.0, capacity=lambda: total[0], clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    home = RunDir(tmp_path, "pack-abcdefgh")
    home.make_dirs()
    soon = Lane("a", "ffswarm-lane-1", "lane-1", home, "c0000", born=0.0)
    later = Lane("b", "ffswarm-lane-2", "lane-2", home, "c0001", born=0.0)
    for lane in (soon, later):  # their services, on the swarm
        swarm.create_service(dataclasses.replace(chunk_service(settings("x"), lane.chunk, 1), name=lane.service))
    lanes.give_back(soon)
    now[0] = 5.0
    lanes.give_back(later)
    job = settings("own-job")  # one GPU
    launcher = beside(lanes)(swarm, home, job)
    launched = launcher.start("c0000", 1, ())  # both GPUs held by idle lanes: the sooner one goes
    assert [s.name for s in swarm.created[2:]] == [launched.service] == ["ffswarm-own-job-c0000-a1"]
    assert swarm.removed == ["ffswarm-lane-1"]
    assert (home.layout.dir / "chunks" / "c0000.lane.json").read_text().count('"manifest": null') == 1  # told to stop
    assert lanes.take("b", 600) is later  # the other still waits for a chunk of its kind
    lanes.give_back(later)
    launcher.start("c0001", 1, ())  # one lane on two GPUs: room for the service, nothing retired
    total[0] = None
    launcher.start("c0002", 1, ())  # the swarm's GPUs unknown: nothing retired
    assert swarm.removed == ["ffswarm-lane-1"] and lanes.take("b", 600) is later


def test_a_burst_on_a_small_swarm_makes_packs_of_one_chunk_per_gpu_not_one_for_the_gpu_free_now(
    tmp_path: Path,
) -> None:
    """250 one-photo jobs arrive while the swarm's 2 GPUs are busy: the packs are of at most one
    chunk per GPU (2 × PACK_CHUNK_ITEMS), so the next GPU to come free takes 100 photos and the
    other the next 100, instead of one GPU taking all 250 while the other goes idle."""
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    job = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n", files)
    assert job.spec.resources.gpus == 1
    now = [0.0]
    packer = Packer(PackingSettings(max_items=5, window=1.0), "img", clock=lambda: now[0], gpus=lambda: 2)
    for n in range(250):
        assert packer.offer(Member(Path(f"/inbox/running/j{n}.yaml"), dataclasses.replace(job, job_id=f"j{n}"), None))
    assert packer.room() == 2 * 2 * PACK_CHUNK_ITEMS - 250 < 0  # serve takes no more files from the inbox
    now[0] += 2
    assert [len(p) for p in packer.due(slots=9)] == [2 * PACK_CHUNK_ITEMS, 2 * PACK_CHUNK_ITEMS, 50]
    assert packer.room() == 2 * 2 * PACK_CHUNK_ITEMS  # launched: two packs' worth may be taken again
    unknown = Packer(PackingSettings(max_items=5, window=1.0), "img", clock=lambda: now[0], gpus=lambda: None)
    for n in range(250):
        assert unknown.offer(Member(Path(f"/inbox/running/j{n}.yaml"), dataclasses.replace(job, job_id=f"j{n}"), None))
    now[0] += 2
    assert [len(p) for p in unknown.due(slots=9)] == [250]  # the swarm's size unknown: pack_items alone


def test_with_lanes_a_burst_on_a_big_swarm_makes_packs_of_one_lane_chunk_each(tmp_path: Path) -> None:
    """With lanes (packing.linger) on a swarm of 4 GPUs, a burst of 450 one-photo jobs makes packs of at
    most LANE_ITEMS photos: each runs as one chunk in a lane (width 1), so the burst flows through warm
    lanes; packs of one chunk per GPU (4 × PACK_CHUNK_ITEMS) would each start fresh chunk services that
    pay a cold start and exit after their chunk."""
    files = {"in/0.jpg": JPEG, "faces/me.jpg": JPEG}
    job = _job(tmp_path, "one", "source: faces/me.jpg\ntargets: [in/0.jpg]\noutput: o/{name}\n", files)
    now = [0.0]
    settings = PackingSettings(max_items=5, window=1.0, linger=30.0)
    packer = Packer(settings, "img", clock=lambda: now[0], gpus=lambda: 4)
    for n in range(450):
        assert packer.offer(Member(Path(f"/inbox/running/j{n}.yaml"), dataclasses.replace(job, job_id=f"j{n}"), None))
    now[0] += 2
    packs = [len(p) for p in packer.due(slots=9)]
    assert packs == [LANE_ITEMS] * 4 + [50]
    assert {width(n, 1, 4, 8, lanes=True) for n in packs} == {1}
    assert packer.room() == 2 * LANE_ITEMS  # two packs' worth, as a lane takes them
    without = Packer(PackingSettings(max_items=5, window=1.0), "img", clock=lambda: now[0], gpus=lambda: 4)
    for n in range(450):
        without.offer(Member(Path(f"/inbox/running/j{n}.yaml"), dataclasses.replace(job, job_id=f"j{n}"), None))
    now[0] += 2
    assert [len(p) for p in without.due(slots=9)] == [4 * PACK_CHUNK_ITEMS] * 2 + [50]  # no lanes: a chunk per GPU
