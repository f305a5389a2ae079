"""API jobs in `serve` (issue 17): the owner record decides whose job an inbox file is, the job is then
resolved inside that tenant's area alone, and its run folder records ``owner``. Real files, real
symlinks, real ownership (chown needs root: those cases are skipped otherwise)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from contract.layout import tenant_key
from controller.api import submit
from controller.api.area import Area
from controller.config import Config
from controller.errors import JobFileError
from controller.job import owners
from controller.job.fence import MAX_OUTPUT_MOUNTS
from controller.run import usecase
from controller.run.jobs import PreparedJob, data_mounts, prepare, runner_settings
from controller.run.lanes import lane_key
from controller.run.rundir import RunDir
from controller.run.warmth import shares_lanes
from controller.serve import daemon as serve
from controller.serve.inbox import Inbox
from controller.settings.runners import RunnersSettings
from tests.builders import JPEG, beat, make_config

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another uid")


def _handed_over(tmp_path: Path, tenant: str = "acme") -> tuple[Config, str, Path]:
    """A tenant's JSON job accepted by the API, then claimed by serve's inbox: (config, job, claimed)."""
    config, _ = make_config(tmp_path)
    beat(config)
    area = Area(config.data_root, tenant)
    area.ensure(None)
    for rel in ("faces/me.jpg", "crowd/a.jpg", "crowd/b.jpg"):
        (area.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (area.path / rel).write_bytes(JPEG)
    data = {"name": "party", "source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "providers": ["cpu"]}
    job = submit.submit_json(config, config.tenants[tenant], area, data).job
    inbox = Inbox(config.data_root / "inbox")
    inbox.ensure()
    settled = time.time() - 10  # serve claims only a file that has settled
    os.utime(inbox.path / f"{job}.yaml", (settled, settled))
    claimed = inbox.claim(inbox.path / f"{job}.yaml")
    assert claimed is not None
    return config, job, claimed


def test_an_api_job_is_its_tenants_and_runs_inside_its_area_alone(tmp_path: Path) -> None:
    config, job, claimed = _handed_over(tmp_path)
    assert serve.job_owner(config, claimed) == "acme"
    prepared = usecase.one_job(config, claimed, tenant="acme")
    assert [t.output_rel for t in prepared.resolved.targets] == [  # type: ignore[union-attr]
        f"tenants/acme/out/{job}/a.jpg",
        f"tenants/acme/out/{job}/b.jpg",
    ]
    with pytest.raises(JobFileError) as e:  # the same file as a CLI job: its id is the API's …
        usecase.one_job(config, claimed)
    assert e.value.field == "name" and "the API's jobs" in e.value.reason
    renamed = claimed.with_name("renamed.yaml")
    text = claimed.read_text()
    assert f"name: {job}\n" in text
    renamed.write_text(text.replace(f"name: {job}\n", "name: renamed\n"))
    with pytest.raises(JobFileError) as e:  # … and, named otherwise, its outputs: tenants/ stays reserved
        usecase.one_job(config, renamed)
    assert e.value.field == "output" and "tenants/" in e.value.reason
    with pytest.raises(JobFileError) as e:  # nor is it another tenant's
        usecase.one_job(config, claimed, tenant="globex")
    assert "outside the tenant's area tenants/globex/" in e.value.reason


def test_a_tenants_api_jobs_of_one_kind_share_warm_runners_and_no_other_job_does(tmp_path: Path) -> None:
    """With runners.linger, `serve` hands a tenant's API job that writes under out/ to the warm runners
    of its kind (controller/run/lanes.py lane_key: the same chunk service but for the job's name), each
    chunk embedding its own source; another tenant's job of the same kind, or one of acme's that writes
    elsewhere in its area, never shares them: their services differ (another area; exact folders)."""
    config = dataclasses.replace(make_config(tmp_path)[0], runners=RunnersSettings(linger=10.0))
    beat(config)
    inbox = Inbox(config.data_root / "inbox")

    def handed(tenant: str, name: str, **extra: str) -> PreparedJob:
        area = Area(config.data_root, tenant)
        area.ensure(None)
        for rel in ("faces/me.jpg", "crowd/a.jpg"):
            (area.path / rel).parent.mkdir(parents=True, exist_ok=True)
            (area.path / rel).write_bytes(JPEG)
        data = {"name": name, "source": "faces/me.jpg", "targets": ["crowd/a.jpg"], "providers": ["cpu"], **extra}
        job = submit.submit_json(config, config.tenants[tenant], area, data).job
        inbox.ensure()
        settled = time.time() - 10
        os.utime(inbox.path / f"{job}.yaml", (settled, settled))
        claimed = inbox.claim(inbox.path / f"{job}.yaml")
        assert claimed is not None and serve.job_owner(config, claimed) == tenant
        return usecase.one_job(config, claimed, tenant=tenant)

    one, two, theirs = handed("acme", "one"), handed("acme", "two"), handed("globex", "one")
    elsewhere = handed("acme", "own", output="elsewhere/{stem}{ext}")
    assert all(shares_lanes(j.job_id, j.plan, j.tenant) for j in (one, two, theirs))
    assert not shares_lanes(elsewhere.job_id, elsewhere.plan, elsewhere.tenant)
    assert (one.linger, one.people_in_chunks, elsewhere.linger, elsewhere.people_in_chunks) == (10.0, True, 0.0, False)

    def kind(job: PreparedJob) -> str:
        return lane_key(runner_settings(config, job, "sha256:" + "1" * 64))

    assert kind(one) == kind(two) and kind(theirs) != kind(one) and kind(elsewhere) != kind(one)
    assert {m.rel: m.writable for m in data_mounts(config, two)} == {
        "tenants/acme": False,
        "tenants/acme/out": True,
        f"runs/.tenants/{tenant_key('acme')}": True,  # every acme job's run folder, and nothing else of runs/
        "models/default": False,
    }
    runs = config.data_root / "runs" / ".tenants" / tenant_key("acme")
    assert RunDir(config.data_root, two.job_id).path.parent == runs


def test_serve_records_the_owner_in_the_run_folder_as_the_controllers_file(tmp_path: Path) -> None:
    config, job, _ = _handed_over(tmp_path)
    rundir = RunDir(config.data_root, job, (10001, 10001), config.controller_ids())
    serve.record_owner("acme")(rundir, None)  # type: ignore[arg-type]  # the job is not looked at
    path = rundir.layout.owner
    assert path.read_text() == "acme\n"
    st = os.lstat(path)
    assert st.st_uid == config.controller_ids()[0] and not st.st_mode & 0o022


def test_a_file_dropped_under_an_api_jobs_name_with_other_content_is_nobodys(tmp_path: Path) -> None:
    config, job, claimed = _handed_over(tmp_path)
    text = claimed.read_text().replace(f"tenants/acme/out/{job}", "tenants/acme/crowd")  # over the originals
    claimed.write_text(text)
    assert serve.job_owner(config, claimed) is None
    with pytest.raises(JobFileError):
        usecase.one_job(config, claimed)


def test_a_record_replaced_by_a_symlink_counts_for_nothing(tmp_path: Path) -> None:
    config, job, claimed = _handed_over(tmp_path)
    record = config.data_root / "tenants" / ".jobs" / "acme" / f"{job}.json"
    copy = tmp_path / "copy.json"
    copy.write_bytes(record.read_bytes())
    record.unlink()
    record.symlink_to(copy)
    assert serve.job_owner(config, claimed) is None


@ROOT_ONLY
@pytest.mark.parametrize("folder", ["tenants", "tenants/.jobs", "tenants/.jobs/acme"])
def test_records_in_a_folder_the_runner_owns_count_for_nothing(tmp_path: Path, folder: str) -> None:
    config, job, claimed = _handed_over(tmp_path)
    os.chown(config.data_root / folder, 10001, 10001)  # a runner could have planted the record there
    assert serve.job_owner(config, claimed) is None


@ROOT_ONLY
def test_a_record_the_runner_owns_or_others_may_write_counts_for_nothing(tmp_path: Path) -> None:
    config, job, claimed = _handed_over(tmp_path)
    record = config.data_root / "tenants" / ".jobs" / "acme" / f"{job}.json"
    os.chown(record, 10001, 10001)
    assert serve.job_owner(config, claimed) is None
    os.chown(record, 0, 0)
    assert serve.job_owner(config, claimed) == "acme"
    record.chmod(0o666)
    assert serve.job_owner(config, claimed) is None


def test_a_record_in_another_tenants_folder_names_that_tenant_only(tmp_path: Path) -> None:
    config, job, claimed = _handed_over(tmp_path)
    theirs = config.data_root / "tenants" / ".jobs" / "globex"
    theirs.mkdir(mode=0o755)
    (theirs / f"{job}.json").write_bytes((config.data_root / "tenants" / ".jobs" / "acme" / f"{job}.json").read_bytes())
    trusted = owners.trusted_uids(os.geteuid(), 10001)
    assert owners.read_record(config.data_root, "globex", job, trusted) is None  # it says tenant: acme
    assert owners.owner_of(config.data_root, job, claimed.read_bytes(), ["globex", "acme"], trusted) == "acme"


def test_without_tenants_configured_no_record_is_looked_for(tmp_path: Path) -> None:
    config, _, claimed = _handed_over(tmp_path)
    assert serve.job_owner(dataclasses.replace(config, tenants={}), claimed) is None


def test_a_job_whose_outputs_spread_over_too_many_top_folders_of_its_area_is_refused_at_submit(tmp_path: Path) -> None:
    """Its runner would otherwise be given the whole area writable, uploads/ included (tenant_mounts)."""
    config, _ = make_config(tmp_path)
    beat(config)
    area = Area(config.data_root, "acme")
    area.ensure(None)
    many = MAX_OUTPUT_MOUNTS + 1
    for k in range(many):
        (area.path / f"d{k:02d}" / "a.jpg").parent.mkdir(parents=True)
        (area.path / f"d{k:02d}" / "a.jpg").write_bytes(JPEG)
    (area.path / "faces").mkdir()
    (area.path / "faces" / "me.jpg").write_bytes(JPEG)
    job = config.data_root / "job.yaml"
    fields = "source: tenants/acme/faces/me.jpg\ntargets: [tenants/acme/d*/a.jpg]\n"
    fields += "output: 'tenants/acme/{dir}/s/{name}'"
    job.write_text(f"name: spread\n{fields}\n")
    before = sorted(p.relative_to(config.data_root) for p in config.data_root.rglob("*"))
    with pytest.raises(JobFileError) as e:
        prepare(config, [job], new=False, tenant="acme")
    assert e.value.field == "output" and f"{many} folders at the top of the tenant's area" in e.value.reason
    assert sorted(p.relative_to(config.data_root) for p in config.data_root.rglob("*")) == before  # nothing made
    (area.path / "d00" / "a.jpg").unlink()  # one top folder fewer: accepted, each output folder its own mount
    (prepared,) = prepare(config, [job], new=False, tenant="acme")
    assert len(prepared.resolved.targets) == MAX_OUTPUT_MOUNTS  # type: ignore[union-attr]
