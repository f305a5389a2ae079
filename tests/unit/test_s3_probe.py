"""``ffswarm doctor --store``: what a store honours, tried on scratch keys (controller/storage/probe.py)
against Ceph RGW, whose differences from AWS are known (docs/storage.md), and moto."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from contract.s3 import S3Url
from controller.cli.main import cli
from controller.config import load_config
from controller.doctor import check_store
from controller.storage.probe import HONOURED, IGNORED, REFUSED, probe
from tests.fixtures.moto_server import Moto
from tests.fixtures.rgw_server import Rgw


@pytest.fixture
def bucket(rgw: Rgw) -> Iterator[str]:
    name = rgw.new_bucket()
    try:
        yield name
    finally:
        rgw.remove_bucket(name)


def rgw_config(rgw: Rgw, tmp_path: Path) -> Path:
    path = tmp_path / "ffswarm.yaml"
    path.write_text(
        f"data_root: {tmp_path}\nstorage:\n  s3: {{endpoint_url: '{rgw.endpoint}', credentials_secret: ffswarm-s3, "
        f"credentials_file: '{rgw.cred_file(tmp_path)}'}}\n"
    )
    return path


def test_rgw_answers_as_documented_and_the_probe_leaves_nothing(rgw: Rgw, bucket: str) -> None:
    found = probe(rgw.client(), S3Url(bucket, "probe/"))
    assert found.put_if_none_match == HONOURED
    assert found.if_match_quoted == REFUSED and found.if_match_unquoted == HONOURED
    assert found.complete_if_none_match == IGNORED and found.checksum_sha256 == IGNORED
    assert found.safe
    assert rgw.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert not rgw.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_moto_honours_conditional_completes(moto: Moto) -> None:
    found = probe(moto.store()._client, S3Url("media", "probe/"))
    assert found.put_if_none_match == HONOURED and found.complete_if_none_match == HONOURED and found.safe


def test_doctor_prints_the_stores_answers_with_link_expiry(rgw: Rgw, bucket: str, tmp_path: Path) -> None:
    config = load_config(str(rgw_config(rgw, tmp_path)))
    waited: list[float] = []

    def wait(seconds: float) -> None:  # the link is signed for 1 s; the store's clock decides
        waited.append(seconds)
        time.sleep(seconds)

    check = check_store(config, f"s3://{bucket}/probe/", wait=wait)
    assert check.ok and waited == [2.0]
    assert "CompleteMultipartUpload If-None-Match: *: ignored" in check.line()
    assert "PUT If-Match (quoted ETag): refuses a matching one" in check.line()
    assert "presigned link expiry: honoured" in check.line()


def test_doctor_store_refusals_name_what_to_fix(rgw: Rgw, tmp_path: Path) -> None:
    config = load_config(str(rgw_config(rgw, tmp_path)))
    bad = check_store(config, "media/probe/")
    assert not bad.ok and "--store 'media/probe/'" in bad.detail and "s3://BUCKET/PREFIX/" in bad.fix
    missing = check_store(config, "s3://no-such-bucket-ffswarm/probe/")
    assert not missing.ok and "no-such-bucket-ffswarm" in missing.line()
    assert rgw.creds.secret_access_key not in missing.line()
    result = CliRunner().invoke(cli, ["doctor", "--help"])
    assert result.exit_code == 0 and "--store" in result.output
