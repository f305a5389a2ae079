"""Probe, then rely (docs/storage.md#what-ffswarm-records-about-a-store): what a store honours is
recorded per endpoint and bucket on the data root, believed only as the controller's own and while
younger than ``storage.s3.probe_max_age``; a job writing objects to a store without conditional PUT
is refused naming it, and its runners commit in parts only where CompleteMultipartUpload conditions
hold. The store here is Ceph RGW, a real S3 server (the ``s3`` fixture); what it answers to each probe
is in test_s3_probe.py."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from contract.manifest import Manifest
from contract.s3 import S3Url, StorageAccess
from controller.config import Config
from controller.doctor import check_store
from controller.errors import FfswarmError
from controller.job.plan import chunk_manifests
from controller.run import stores
from controller.run.jobs import manifest_settings, prepare
from controller.storage.errors import StorageAccessError
from controller.storage.probe import HONOURED, IGNORED, REFUSED, Capabilities
from controller.storage.record import FOLDER, Records, commit_mode
from controller.volume import Volume
from runner_image.objects import connect
from runner_image.volume import DataRoot
from tests.fixtures.rgw_server import Seeded
from tests.unit.test_s3_jobs import config, job

DAY = 86400.0
AWS_LIKE = Capabilities("http://store", HONOURED, HONOURED, HONOURED, HONOURED, HONOURED, HONOURED, HONOURED)
RGW_LIKE = dataclasses.replace(AWS_LIKE, if_match_quoted=REFUSED, complete_if_none_match=IGNORED,
                               complete_if_match=IGNORED, checksum_sha256=IGNORED)  # fmt: skip
NO_ATOMIC_CREATE = dataclasses.replace(RGW_LIKE, put_if_none_match=IGNORED)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Prober:
    """Stands in for the store's probe: counts the tries and answers ``found``."""

    def __init__(self, found: Capabilities) -> None:
        self.found, self.where = found, list[S3Url]()

    def __call__(self, where: S3Url) -> Capabilities:
        self.where.append(where)
        return self.found


def kept(root: Path, clock: Clock) -> Records:
    return Records(Volume(root), None, frozenset({os.geteuid()}), clock)


def test_a_record_is_read_back_as_written_in_a_folder_only_the_controller_may_use(tmp_path: Path) -> None:
    records = kept(tmp_path, Clock())
    records.save("http://store", "media", RGW_LIKE)
    back = records.load("http://store", "media")
    assert back is not None and back.capabilities == RGW_LIKE and back.probed_at == 1_000_000.0
    assert stat.S_IMODE((tmp_path / FOLDER).stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / records.path("http://store", "media")).stat().st_mode) == 0o600
    assert records.load("http://store", "other") is None and records.load("http://elsewhere", "media") is None


def test_a_fresh_record_is_relied_on_and_an_old_one_probed_again(tmp_path: Path) -> None:
    clock = Clock()
    records, probe = kept(tmp_path, clock), Prober(RGW_LIKE)
    outputs = [S3Url("media", "out/j/a.png"), S3Url("media", "out/j/b.png")]
    assert commit_mode(records, "http://store", 7 * DAY, outputs, probe) is False
    assert probe.where == [S3Url("media", "out/j/")]  # once per bucket, beside the job's own outputs
    clock.now += 7 * DAY
    commit_mode(records, "http://store", 7 * DAY, outputs, probe)
    assert len(probe.where) == 1  # seven days old: still believed
    clock.now += 1
    probe.found = AWS_LIKE
    assert commit_mode(records, "http://store", 7 * DAY, outputs, probe) is True
    assert len(probe.where) == 2
    again = records.load("http://store", "media")
    assert again is not None and again.probed_at == clock.now and again.capabilities == AWS_LIKE


@pytest.mark.parametrize("spoil", ["garbage", "truncated", "other_bucket", "future", "symlink", "runners"])
def test_a_record_that_cannot_be_believed_means_probing_again(tmp_path: Path, spoil: str) -> None:
    clock = Clock()
    records = kept(tmp_path, clock)
    records.save("http://store", "media", AWS_LIKE)
    path = tmp_path / records.path("http://store", "media")
    good = path.read_bytes()
    if spoil == "garbage":
        path.write_bytes(b"\x00not json")
    elif spoil == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif spoil == "other_bucket":  # another bucket's record copied over this one's
        path.write_bytes(json.dumps({**json.loads(good), "bucket": "elsewhere"}).encode())
    elif spoil == "future":
        path.write_bytes(json.dumps({**json.loads(good), "probed_at": clock.now + DAY}).encode())
    elif spoil == "symlink":  # never followed, even to a good record
        (tmp_path / "good.json").write_bytes(good)
        path.unlink()
        path.symlink_to(tmp_path / "good.json")
    else:  # written by another uid than the trusted ones (a runner)
        os.chown(path, 10001, 10001)
    probe = Prober(NO_ATOMIC_CREATE)
    with pytest.raises(StorageAccessError):  # the probe's answer, not the spoiled record's, decides
        commit_mode(records, "http://store", 7 * DAY, [S3Url("media", "a.png")], probe)
    assert probe.where == [S3Url("media", "a.png")]  # an output at the bucket's top: scratch keys beside it
    rewritten = records.load("http://store", "media")
    assert rewritten is not None and rewritten.capabilities == NO_ATOMIC_CREATE


def test_a_store_without_atomic_create_is_refused_naming_the_store_the_capability_and_the_fix(tmp_path: Path) -> None:
    records = kept(tmp_path, Clock())
    records.save("http://store", "media", NO_ATOMIC_CREATE)
    never = Prober(AWS_LIKE)
    with pytest.raises(StorageAccessError) as e:
        commit_mode(records, "http://store", 7 * DAY, [S3Url("media", "out/a.png")], never)
    assert e.value.exit_code == 66 and never.where == []
    said = str(e.value)
    assert "s3://media/out/a.png" in said and "http://store" in said and "PUT If-None-Match: *" in said
    assert "use a store that honours conditional PUT" in said
    no_if_match = dataclasses.replace(RGW_LIKE, if_match_unquoted=IGNORED, if_match_quoted=IGNORED)
    records.save("http://store", "bulk", no_if_match)
    with pytest.raises(StorageAccessError, match="does not honour PUT If-Match in bucket 'bulk'"):
        commit_mode(records, "http://store", 7 * DAY, [S3Url("bulk", "a.png")], never)


def test_parts_only_when_every_output_bucket_honours_conditional_completes(tmp_path: Path) -> None:
    records = kept(tmp_path, Clock())
    records.save("http://store", "aws", AWS_LIKE)
    records.save("http://store", "rgw", RGW_LIKE)
    never = Prober(NO_ATOMIC_CREATE)
    assert commit_mode(records, "http://store", DAY, [S3Url("aws", "a.mp4")], never) is True
    assert commit_mode(records, "http://store", DAY, [S3Url("aws", "a.mp4"), S3Url("rgw", "b.mp4")], never) is False
    half = dataclasses.replace(AWS_LIKE, complete_if_match=IGNORED)  # If-None-Match only
    records.save("http://store", "half", half)
    assert commit_mode(records, "http://store", DAY, [S3Url("half", "a.mp4")], never) is False
    assert never.where == []


def test_a_probe_the_keys_may_not_make_leaves_one_put_per_commit_and_no_record(tmp_path: Path) -> None:
    records = kept(tmp_path, Clock())

    def denied(where: S3Url) -> Capabilities:
        raise StorageAccessError(where, "access denied (S3 AccessDenied, HTTP 403)")

    assert commit_mode(records, "http://store", DAY, [S3Url("theirs", "a.mp4")], denied) is False
    assert records.load("http://store", "theirs") is None


# -- a job's submit, against Ceph RGW ------------------------------------------------------------------
def storage_of(cfg: Config, tmp_path: Path) -> list[StorageAccess | None]:
    (prepared,) = prepare(cfg, [job(tmp_path)], new=False)
    manifests = chunk_manifests(prepared.plan, manifest_settings(cfg, prepared))
    return [Manifest.from_json(m.to_json()).storage for m in manifests.values()]


def test_the_first_job_probes_the_store_records_it_and_leaves_no_scratch_key(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    before = {o["Key"] for o in s3.store()._client.list_objects_v2(Bucket="media").get("Contents", [])}
    found = storage_of(cfg, tmp_path)
    assert found and all(s is not None and s.conditional_complete is False for s in found)
    record = stores.records(cfg).load(s3.endpoint, "media")
    assert record is not None
    assert record.capabilities.put_if_none_match == HONOURED  # RGW: atomic create, If-Match ignored on
    assert record.capabilities.complete_if_match == IGNORED  # CompleteMultipartUpload: one PUT each
    after = {o["Key"] for o in s3.store()._client.list_objects_v2(Bucket="media").get("Contents", [])}
    assert after == before
    assert not s3.store()._client.list_multipart_uploads(Bucket="media").get("Uploads")


def test_a_job_writing_to_a_store_recorded_without_conditional_put_is_refused(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    stores.records(cfg).save(s3.endpoint, "media", NO_ATOMIC_CREATE)
    with pytest.raises(FfswarmError) as e:
        prepare(cfg, [job(tmp_path)], new=False)
    assert e.value.exit_code == 66
    assert "does not honour PUT If-None-Match: * in bucket 'media'" in str(e.value)
    assert "use a store that honours conditional PUT" in str(e.value)
    assert not (Path(cfg.data_root) / "runs" / "j").exists()


def test_an_old_record_is_probed_again_after_storage_s3_probe_max_age(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    settings = cfg.storage.s3
    assert settings is not None
    cfg = dataclasses.replace(
        cfg, storage=dataclasses.replace(cfg.storage, s3=dataclasses.replace(settings, probe_max_age=60))
    )
    old = Records(Volume(cfg.data_root), cfg.controller_ids(), stores.records(cfg).trusted, Clock(1000.0))
    old.save(s3.endpoint, "media", NO_ATOMIC_CREATE)  # long ago: probed again, and RGW has atomic create
    assert storage_of(cfg, tmp_path)
    record = stores.records(cfg).load(s3.endpoint, "media")
    assert record is not None and record.capabilities.put_if_none_match == HONOURED


def test_where_completes_are_conditional_the_runners_commit_in_parts(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    stores.records(cfg).save(s3.endpoint, "media", AWS_LIKE)
    found = storage_of(cfg, tmp_path)
    assert found and all(s is not None and s.conditional_complete for s in found)
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "ffswarm-s3").write_bytes(s3.cred_file.read_bytes())
    storage = found[0]
    assert storage is not None
    objects = connect(DataRoot(tmp_path, str(secrets_dir)), storage, ["s3://media/out/j/a.png"], "j")
    assert objects is not None and objects.store.config.conditional_complete is True
    safe = connect(DataRoot(tmp_path, str(secrets_dir)), dataclasses.replace(storage, conditional_complete=False),
                   ["s3://media/out/j/a.png"], "j")  # fmt: skip
    assert safe is not None and safe.store.config.conditional_complete is False


def test_doctor_store_records_what_it_found_for_the_jobs(tmp_path: Path, s3: Seeded) -> None:
    cfg = config(tmp_path, s3)
    waited: list[float] = []
    check = check_store(cfg, "s3://media/probe/", wait=waited.append)
    assert waited == [2.0] and "CompleteMultipartUpload If-Match: ignored" in check.line()
    record = stores.records(cfg).load(s3.endpoint, "media")
    assert record is not None and record.capabilities.presigned_expiry != "not checked (doctor --store checks it)"
    assert f"recorded for jobs: {FOLDER}/" in check.line()
