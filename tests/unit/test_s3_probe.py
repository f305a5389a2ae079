"""``ffswarm doctor --store``: what a store honours, tried on scratch keys (controller/storage/probe.py)
against Ceph RGW, whose differences from AWS are known (docs/storage.md), and moto."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import boto3  # type: ignore[import-untyped]
import pytest
from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]
from click.testing import CliRunner

from contract.s3 import S3Url
from controller.cli.main import cli
from controller.config import load_config
from controller.doctor import check_store
from controller.storage.probe import HONOURED, IGNORED, REFUSED, probe
from tests.fixtures.rgw_server import REGION, Rgw, signing_clock_back


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


def test_moto_honours_conditional_completes(moto_endpoint: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION, aws_access_key_id="k",
                      aws_secret_access_key="s", config=BotoConfig(s3={"addressing_style": "path"}))  # fmt: skip
    bucket = f"ffswarm-probe-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    found = probe(s3, S3Url(bucket, "probe/"))
    assert found.put_if_none_match == HONOURED and found.complete_if_none_match == HONOURED and found.safe


def test_doctor_prints_the_stores_answers_with_link_expiry(rgw: Rgw, bucket: str, tmp_path: Path) -> None:
    config = load_config(str(rgw_config(rgw, tmp_path)))
    waited: list[float] = []

    with signing_clock_back(2):  # its 1 s link signed 2 s ago: the store's clock finds it expired, no waiting
        check = check_store(config, f"s3://{bucket}/probe/", wait=waited.append)
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
