"""A tenant's packs and lanes see only that tenant (docs/operations.md#isolation): a pack of tenant
acme keeps its run folder under ``runs/.tenants/<acme's key>/`` (the first 10 hex digits of the
sha256 of "acme"), found from its id alone by status, a packed job's reads, resume and deletion, and
names acme in its ``owner``, which resume and metrics believe only for the tenant whose key the id
carries; a lane of acme mounts acme's area read-only but for its ``out/`` folder, that folder of
runs and the model pack, nothing else, so a pack of acme that writes elsewhere in its area never
goes to a lane; no other job's id can take a pack's form; a tenant's name may be as long as any.
Real files, the in-memory FakeSwarm (a fake runner writes only where its service mounts a folder
writable); the live lane service's mounts: tests/integration/test_packing_linger.py."""

from __future__ import annotations

import hashlib
import json
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from contract.attempt import AttemptRecord
from contract.handoff import Handoff
from contract.layout import RunLayout, may_own, pack_job_id, run_rel, run_tenant_key
from contract.results import ItemResult, ItemStatus
from controller import apiconfig
from controller.api import submit
from controller.api.area import Area
from controller.api.errors import ApiError
from controller.config import Config, parse_config
from controller.errors import ConfigError, JobFileError, MissingInputError, UsageError
from controller.job.plan import ID, Plan, TargetRef, make_plan
from controller.run import deletion, jobs, status, usecase
from controller.run.lanes import ROLE_LANE, Lanes, lane_key
from controller.run.metrics import Metrics
from controller.run.packed import pack_of
from controller.run.report import Report
from controller.run.rundir import RunDir
from controller.run.warmth import lane_allowed
from controller.serve import packs
from controller.serve.packing import Member
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_ROLE, ROLE_RUNNER, DataMount, ServiceSpec
from tests.builders import JPEG, make_config
from tests.fakes import FakeSwarm


def key(tenant: str) -> str:
    """A tenant's key as docs/operations.md#isolation tells an operator to work it out."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:10]


AREA = "tenants/acme"
RUNS = f"runs/.tenants/{key('acme')}"
MODELS = "models/default"
LONG = "a-tenant-whose-name-is-forty-characters-"  # the longest name a config takes


def packing_config(tmp_path: Path, linger: str = "0s", tenant: str = "acme") -> Config:
    """The test config with packing on and tenants acme (or ``tenant`` in its place) and globex."""
    config, _ = make_config(tmp_path)
    data = yaml.safe_load(config.path.read_text())
    data["tenants"][tenant] = data["tenants"].pop("acme")
    return parse_config(config.path, {**data, "packing": {"max_items": 5, "linger": linger}})


def tenant_members(
    tmp_path: Path, linger: str = "0s", tenant: str = "acme", outputs: tuple[str, str] = ("out/one", "out/two")
) -> tuple[Config, list[Member]]:
    """Tenant ``tenant``'s jobs ``one`` (a.jpg) and ``two`` (b.jpg), one photo each, as `serve` has
    them from the inbox: paths under the tenant's area, each job's output in its folder of ``outputs``."""
    config = packing_config(tmp_path, linger, tenant)
    area = f"tenants/{tenant}"
    for rel in ("in/a.jpg", "in/b.jpg", "faces/me.jpg"):
        (config.data_root / area / rel).parent.mkdir(parents=True, exist_ok=True)
        (config.data_root / area / rel).write_bytes(JPEG)
    out = []
    for (name, photo), folder in zip((("one", "a"), ("two", "b")), outputs, strict=True):
        path = config.data_root / "inbox" / f"{name}.yaml"
        path.write_text(
            f"name: {name}\nproviders: [cpu]\nsource: {area}/faces/me.jpg\ntargets: ['{area}/in/{photo}.jpg']\n"
            f"output: '{area}/{folder}/{{name}}'\n"
        )
        job = usecase.one_job(config, path, tenant=tenant)
        out.append(Member(path, job, tenant))
    return config, out


def commit(pack: RunDir, item: str, photo: str, job: str) -> None:
    """What the pack's runner appends for one of its items (attempt 1 of chunk c0000)."""
    now = time.time()
    line = ItemResult(
        item, ItemStatus.OK, 1, f"/data/{AREA}/in/{photo}.jpg", f"/data/{AREA}/out/{job}/{photo}.jpg",
        started=now, finished=now,
    ).to_line()  # fmt: skip
    pack.layout.results_dir.mkdir(parents=True, exist_ok=True)
    with pack.layout.results("c0000", 1).open("a") as f:
        f.write(line)


def visible(mounts: tuple[DataMount, ...]) -> dict[str, bool]:
    return {m.rel: m.writable for m in mounts}


def test_a_packs_id_carries_its_tenants_key_and_so_its_run_folder() -> None:
    acme = pack_job_id("acme", "abcdefgh")
    assert acme == f"pack-{key('acme')}-abcdefgh" and len(acme) == 24
    assert run_rel(acme).as_posix() == f"{RUNS}/{acme}"
    long = pack_job_id(LONG, "abcdefgh")  # any tenant name: the id stays 24 characters, a job id
    assert len(LONG) == 40 and len(long) == 24 and ID.fullmatch(long)
    assert run_rel(long).as_posix() == f"runs/.tenants/{key(LONG)}/{long}"
    assert run_tenant_key(acme) == key("acme") and run_tenant_key("pack-abcdefgh") is None
    assert run_rel(pack_job_id(None, "abcdefgh")).as_posix() == "runs/pack-abcdefgh"  # a CLI jobs' pack
    for job in ("holiday", "pack-abcdefgh", "pack-acme-abcdefgh", f"pack-{key('acme')}-abcdefg1", "acme-abcdefgh"):
        assert run_rel(job).as_posix() == f"runs/{job}", job
    # its owner file is believed for acme alone; any other job's for any tenant (checked elsewhere)
    assert may_own(acme, "acme") and not may_own(acme, "globex") and not may_own(acme, LONG)
    assert may_own("holiday", "globex") and may_own("pack-abcdefgh", "acme")
    assert RunLayout.container(acme).dir.as_posix() == f"/data/{RUNS}/{acme}"
    # a lingering runner is handed the next pack's manifest there, and nothing that leaves runs/
    manifest = f"/data/{RUNS}/{acme}/chunks/c0000.json"
    assert Handoff(1, manifest).manifest == manifest
    with pytest.raises(ValueError, match="hand-off manifest"):
        Handoff(1, f"/data/{RUNS}/../{acme}/chunks/c0000.json")


def test_a_tenants_pack_is_made_under_its_tenants_folder_and_status_finds_it(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    assert re.fullmatch(rf"pack-{key('acme')}-[a-z2-7]{{8}}", pack.job)
    assert pack.path == config.data_root / RUNS / pack.job and pack.layout.plan.is_file()
    assert not (config.data_root / "runs" / pack.job).exists()
    assert pack.layout.owner.read_text() == "acme\n"  # the tenant its id stands for
    manifest = json.loads(pack.layout.manifest("c0000").read_text())
    assert manifest["run_dir"] == f"/data/{RUNS}/{pack.job}"  # the runner's view of the same folder
    one = RunDir(config.data_root, "one")
    assert pack_of(one) == pack.job and jobs.run_tenant(config, pack.job) == "acme"
    commit(pack, "i000000", "a", "one")
    rows = {row["job"]: row for row in status.collect(config, None)}  # `ffswarm status`: every job
    assert set(rows) == {"one", "two", pack.job}
    assert rows["one"]["items"]["ok"] == 1 and rows[pack.job]["items"]["ok"] == 1  # read through the pack
    assert status.collect(config, pack.job)[0]["job"] == pack.job  # `ffswarm status <pack>`


def test_a_resumed_tenants_pack_ends_its_jobs_in_services_that_see_only_its_tenant(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)  # its serve stopped
    pack = runner.pack

    def chunk_ends() -> None:
        commit(pack, "i000000", "a", "one")
        commit(pack, "i000001", "b", "two")

    swarm.on_end["c0000"] = chunk_ends
    metrics = Metrics()
    reports = packs.resume(config, swarm, pack.job, [lambda r, j: metrics.sink(r, j.spec.resources.gpus)])
    assert reports["one"].counts.ok == 1 and reports["two"].counts.ok == 1
    (service,) = swarm.created
    assert visible(service.data_mounts) == {
        AREA: False,
        f"{AREA}/out/one": True,
        f"{AREA}/out/two": True,
        f"{RUNS}/{pack.job}": True,
        MODELS: False,
    }
    # the pack's items are billed to acme, the tenant its owner file names
    assert metrics.registry.get_sample_value("ffswarm_tenant_items_total", {"tenant": "acme", "status": "ok"}) == 2


@pytest.mark.parametrize("written", [b"globex\n", b"initech\n", None])
def test_a_pack_whose_owner_is_not_its_ids_tenant_is_never_run(tmp_path: Path, written: bytes | None) -> None:
    """Another configured tenant, one the config lacks, or none: the pack is not taken for globex's,
    nor for a CLI job's (whose runners see the whole data root); no service is started."""
    config, ms = tenant_members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    if written is None:
        pack.layout.owner.unlink()
    else:
        pack.write_file(pack.layout.owner, written)  # as the controller writes it: only its content is wrong
    assert jobs.run_tenant(config, pack.job) is None
    with pytest.raises(UsageError, match=f"job {pack.job}: {RUNS}/{pack.job}/owner does not name"):
        packs.resume(config, swarm, pack.job)
    assert swarm.created == []
    metrics = Metrics()  # nor is anything billed to the tenant it names
    sink = metrics.sink(pack)
    sink("job_started", pending=1)
    assert sink.tenant == ""


def test_a_tenant_with_a_long_name_gets_packs_too(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path, tenant=LONG)
    _, runner = packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    assert len(pack.job) == 24 and pack.path == config.data_root / "runs" / ".tenants" / key(LONG) / pack.job
    assert jobs.run_tenant(config, pack.job) == LONG


def test_deleting_a_tenants_packed_jobs_removes_their_pack_with_the_last_one(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path)
    swarm = FakeSwarm()
    _, runner = packs.open_pack(config, swarm, ms, config.data_root / "inbox" / "packs", 1)
    pack = runner.pack
    swarm.on_end["c0000"] = lambda: commit(pack, "i000000", "a", "one")
    packs.resume(config, swarm, pack.job)
    (config.data_root / "inbox" / "done").mkdir()
    for m in ms:  # as `serve` files them by their outcome
        m.claimed.rename(config.data_root / "inbox" / "done" / m.claimed.name)
    first = deletion.delete_job(config, "one", None, outputs=False)
    assert "runs/one" in first.removed and pack.path.is_dir()  # job two still reads through it
    second = deletion.delete_job(config, "two", None, outputs=False)
    assert f"{RUNS}/{pack.job}" in second.removed and not pack.path.exists()
    assert status.collect(config, None) == []


def test_a_tenants_lane_mounts_its_out_folder_its_packs_runs_and_the_models_and_nothing_else(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path, linger="20s")
    prepared, _ = packs.build(config, ms, packs.new_pack_id("acme"), config.data_root / "inbox" / "packs", 1)
    rundir = RunDir(config.data_root, prepared.job_id)
    rundir.make_dirs()
    swarm = FakeSwarm()
    lanes = Lanes(lambda: swarm, 20.0, owner="serve-1")
    settings = jobs.runner_settings(config, prepared, "sha256:" + "1" * 64)
    lane = lanes.open("acme/kind", rundir, settings, "c0000", 1)
    (spec,) = swarm.created
    assert spec.labels[LABEL_ROLE] == ROLE_LANE
    # its area read-only but out/, where every pack it may be handed writes; never runs/ nor the root
    assert visible(spec.data_mounts) == {AREA: False, f"{AREA}/out": True, RUNS: True, MODELS: False}
    # the tenant's next pack is in what the lane sees; another tenant's and a CLI job's are not
    later = packs.new_pack_id("acme")
    assert RunLayout.relative(later).dir.is_relative_to(RUNS)
    for other in (packs.new_pack_id("globex"), packs.new_pack_id(None), "one"):
        assert not RunLayout.relative(other).dir.is_relative_to(RUNS), other
    lanes.hand(lane, RunDir(config.data_root, later), "c0000", 1)
    handed = Handoff.from_json(rundir.layout.lane_handoff("c0000").read_text())
    assert handed.manifest == f"/data/{RUNS}/{later}/chunks/c0000.json"


def test_a_lanes_run_folder_outside_its_tenants_runs_is_refused() -> None:
    from controller.swarm.servicespec import tenant_mounts

    with pytest.raises(ValueError, match="outside its tenant's folder of runs"):
        tenant_mounts(AREA, "runs/pack-abcdefgh", MODELS, [], runs=RUNS)


@pytest.mark.parametrize("name", ["pack-acme-abcdefgh", "pack-x"])
def test_a_cli_job_whose_id_would_read_as_a_packs_is_refused(tmp_path: Path, name: str) -> None:
    config, _ = make_config(tmp_path)
    (config.data_root / "in.jpg").write_bytes(JPEG)
    path = config.data_root / "inbox" / "job.yaml"
    path.write_text(f"name: {name}\nproviders: [cpu]\nsource: in.jpg\ntargets: [in.jpg]\noutput: out/{{name}}\n")
    with pytest.raises(JobFileError) as e:
        usecase.one_job(config, path)
    assert e.value.field == "name" and "pack-" in str(e.value)
    assert not (config.data_root / "runs" / ".tenants").exists()


@pytest.mark.parametrize("name", ["pack", "pack-acme"])
def test_an_api_job_whose_id_would_read_as_a_packs_is_refused(tmp_path: Path, name: str) -> None:
    config, _ = make_config(tmp_path)
    area = Area(config.data_root, "acme")
    area.ensure(None)
    (area.path / "in.jpg").write_bytes(JPEG)
    data = {"name": name, "source": "in.jpg", "targets": ["in.jpg"], "providers": ["cpu"]}
    with pytest.raises(ApiError) as e:
        submit.submit_json(config, config.tenants["acme"], area, data)
    assert e.value.status == 422 and "pack" in str(e.value)


def test_two_tenants_with_one_key_refuse_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key names one tenant's packs' folder: two names whose sha256 begin alike (40 bits: a
    config will not meet it by chance) refuse the config rather than share a lane's view."""
    packing_config(tmp_path / "long", tenant=LONG)  # any name, packing on
    monkeypatch.setattr(apiconfig, "tenant_key", lambda name: "0123456789")
    with pytest.raises(ConfigError, match="tenants.globex: has the same packs' folder key as tenant 'acme'"):
        packing_config(tmp_path / "two")


def may_write(spec: ServiceSpec, rel: str) -> bool:
    """Whether a runner of ``spec`` may write ``rel`` (relative to the data root): the deepest folder it
    mounts that holds ``rel`` is mounted writable; a path under no mount is not there at all."""
    holding = [m for m in spec.data_mounts if m.rel == "" or rel.startswith(m.rel + "/")]
    return bool(holding) and max(holding, key=lambda m: len(m.rel)).writable


def fake_runner(config: Config, swarm: FakeSwarm) -> Callable[[], None]:
    """What the pack's runner does at its chunk's end, allowed only what its service mounts writable:
    each output written (or the item failed: EROFS), its results and its attempt record (a lane's
    attempt ends by that record) written in the pack's run folder."""

    def chunk_ends() -> None:
        spec = swarm.created[-1]
        pack = RunDir(config.data_root, str(pack_of(RunDir(config.data_root, "one"))))
        attempt, now = int(spec.labels[LABEL_ATTEMPT]), time.time()
        lines = []
        for item in pack.plan().items:
            done = may_write(spec, item.output)
            if done:
                (config.data_root / item.output).write_bytes(b"swapped")
            status, output = (ItemStatus.OK, f"/data/{item.output}") if done else (ItemStatus.ERROR, None)
            lines.append(ItemResult(item.id, status, attempt, f"/data/{item.input}", output, "EROFS" * (not done),
                                    started=now, finished=now).to_line())  # fmt: skip
        results = pack.layout.results("c0000", attempt)
        if not may_write(spec, results.relative_to(config.data_root).as_posix()):
            return  # no result recorded: the pack's items fail
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text("".join(lines))
        record = AttemptRecord(pack.job, "c0000", attempt, now, exit="OK", finished=now)
        pack.layout.attempt_record("c0000", attempt).write_text(record.to_json())

    return chunk_ends


def run_pack(config: Config, ms: list[Member]) -> tuple[FakeSwarm, Lanes, RunDir, dict[str, Report]]:
    """The tenant's pack started by `serve` with lanes (packing.linger), run to its end by the fake runner."""
    swarm = FakeSwarm()
    swarm.on_end["c0000"] = fake_runner(config, swarm)
    lanes = Lanes(lambda: swarm, 20.0, owner="serve-1")
    reports = packs.start(config, swarm, ms, config.data_root / "inbox" / "packs", 1, lanes=lanes)
    return swarm, lanes, RunDir(config.data_root, str(pack_of(RunDir(config.data_root, "one")))), reports


def test_a_tenants_pack_writing_under_its_out_folder_runs_in_a_lane_and_its_outputs_land(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path, linger="20s")
    swarm, lanes, pack, reports = run_pack(config, ms)
    assert reports["one"].counts.ok == 1 and reports["two"].counts.ok == 1
    (spec,) = swarm.created
    assert spec.labels[LABEL_ROLE] == ROLE_LANE
    assert visible(spec.data_mounts) == {AREA: False, f"{AREA}/out": True, RUNS: True, MODELS: False}
    assert (config.data_root / AREA / "out/one/a.jpg").read_bytes() == b"swapped"
    assert (config.data_root / AREA / "out/two/b.jpg").read_bytes() == b"swapped"
    # kept for the tenant's next pack or job of its kind: one whose chunk service would be the lane's
    again, _ = packs.build(config, ms, pack.job, tmp_path / "again", 1)
    assert lanes.take(lane_key(jobs.runner_settings(config, again, spec.image)), 600) is not None


def test_a_tenants_pack_writing_elsewhere_in_its_area_never_goes_to_a_lane_and_its_outputs_land(
    tmp_path: Path,
) -> None:
    """One job's output outside out/ (a job file may name any folder of the area): the whole pack
    runs in a service of its own, mounting exactly its output folders; its runner does not linger."""
    config, ms = tenant_members(tmp_path, linger="20s", outputs=("out/one", "done/two"))
    swarm, lanes, pack, reports = run_pack(config, ms)
    assert reports["one"].counts.ok == 1 and reports["two"].counts.ok == 1
    (spec,) = swarm.created
    assert spec.labels[LABEL_ROLE] == ROLE_RUNNER and lanes.drain() == []  # no lane opened, none waiting
    assert visible(spec.data_mounts) == {
        AREA: False,
        f"{AREA}/done/two": True,
        f"{AREA}/out/one": True,
        f"{RUNS}/{pack.job}": True,
        MODELS: False,
    }
    assert (config.data_root / AREA / "out/one/a.jpg").read_bytes() == b"swapped"
    assert (config.data_root / AREA / "done/two/b.jpg").read_bytes() == b"swapped"
    manifest = json.loads(pack.layout.manifest("c0000").read_text())
    assert manifest.get("linger", 0) == 0 and manifest.get("handoff") is None


def test_only_outputs_on_the_volume_outside_out_keep_a_tenants_pack_from_a_lane() -> None:
    def plan(*outputs: str) -> Plan:
        refs = [TargetRef(f"{AREA}/in/{k}.jpg", out, "photo") for k, out in enumerate(outputs)]
        return make_plan("pack-abcdefgh", refs, "auto", 1)

    assert lane_allowed(plan(f"{AREA}/out/one/0.jpg", "s3://bucket/acme/elsewhere/1.jpg"), "acme")  # no mount
    assert not lane_allowed(plan(f"{AREA}/out/one/0.jpg", f"{AREA}/done/1.jpg"), "acme")
    assert not lane_allowed(plan(f"{AREA}/outside/0.jpg"), "acme")  # out/ the folder, not a name's start
    assert lane_allowed(plan("anywhere/0.jpg"), None)  # a CLI jobs' pack: its lane mounts the data root


def test_a_pack_of_two_chunks_never_goes_to_a_lane(tmp_path: Path) -> None:
    config, ms = tenant_members(tmp_path, linger="20s")
    prepared, _ = packs.build(config, ms, packs.new_pack_id("acme"), config.data_root / "inbox" / "packs", 2)
    assert len(prepared.plan.chunks) == 2 and prepared.linger == 0
    assert RUNS not in visible(jobs.data_mounts(config, prepared))


def test_a_lanes_out_folder_is_made_for_the_runner_like_its_other_folders_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    config, ms = tenant_members(tmp_path, linger="20s")
    out = config.data_root / AREA / "out"
    assert not out.exists()
    packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    made, job = out.lstat(), (out / "one").lstat()
    assert stat.S_ISDIR(made.st_mode) and (made.st_uid, made.st_gid) == jobs.owner(config)
    assert stat.S_IMODE(made.st_mode) == stat.S_IMODE(job.st_mode)  # as out/<job> is made
    # a runner swapped out/ for a link since the jobs were checked: refused, nothing made through it
    config, ms = tenant_members(tmp_path / "again", linger="20s")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (config.data_root / AREA / "out").symlink_to(elsewhere)
    with pytest.raises(MissingInputError, match="symlink"):
        packs.open_pack(config, FakeSwarm(), ms, config.data_root / "inbox" / "packs", 1)
    assert list(elsewhere.iterdir()) == []
