"""The controller's store (controller/storage/s3.py) against Ceph RGW, a real S3 server: what moto
cannot prove. A presigned link downloads, a tampered one and an expired one are refused by the
server; wrong credentials and another user's bucket are exit 66 naming the bucket; the join's commit
replaces what it may and nothing else (docs/storage.md).
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.s3 import Credentials, S3Url
from contract.s3put import Upload
from controller.storage.errors import StorageAccessError
from controller.storage.s3 import ObjectExists, S3Store, make_client
from controller.storage.settings import S3Settings
from tests.fixtures.rgw_server import REGION, Rgw, signing_clock_back

MIB = 1024**2


def settings(rgw: Rgw, cred_file: Path) -> S3Settings:
    return S3Settings(credentials_secret="ffswarm-s3", credentials_file=cred_file, endpoint_url=rgw.endpoint,
                      region=REGION, addressing="path", link_ttl=3600)  # fmt: skip


def store_for(rgw: Rgw, tmp_path: Path, creds: Credentials | None = None) -> S3Store:
    s = settings(rgw, rgw.cred_file(tmp_path))
    store = S3Store(s, make_client(s, creds or rgw.creds, max_attempts=1))
    store.upload = Upload(multipart_threshold=8 * MIB, part_size=5 * MIB)
    return store


@pytest.fixture
def bucket(rgw: Rgw) -> Iterator[str]:
    name = rgw.new_bucket()
    try:
        yield name
    finally:
        rgw.remove_bucket(name)


def test_a_presigned_link_downloads_and_a_tampered_or_expired_one_is_refused(
    rgw: Rgw, bucket: str, tmp_path: Path
) -> None:
    rgw.client().put_object(Bucket=bucket, Key="out/a.jpg", Body=b"photo")
    store = store_for(rgw, tmp_path)
    link = store.presign_get(S3Url(bucket, "out/a.jpg"))
    got = httpx.get(link, timeout=10)
    assert got.status_code == 200 and got.content == b"photo"
    tampered = link.replace("out/a.jpg", "out/b.jpg")
    assert httpx.get(tampered, timeout=10).status_code == 403
    with signing_clock_back(2):  # signed 2 s ago for 1 s: the server's clock decides, no waiting
        short = store.presign_get(S3Url(bucket, "out/a.jpg"), ttl=1)
    expired = httpx.get(short, timeout=10)
    assert expired.status_code == 403 and b"AccessDenied" in expired.content


def test_wrong_credentials_and_another_users_bucket_are_exit_66_naming_the_bucket(
    rgw: Rgw, bucket: str, tmp_path: Path
) -> None:
    secret = "Zq" + secrets.token_hex(16)
    wrong = store_for(rgw, tmp_path, Credentials(rgw.creds.access_key_id, secret))
    with pytest.raises(StorageAccessError) as e:
        wrong.list_matching(S3Url.parse(f"s3://{bucket}/in/*.jpg"), 10)
    assert e.value.exit_code == 66 and f"'{bucket}'" in str(e.value) and secret not in str(e.value)
    theirs = f"ffswarm-t-{secrets.token_hex(6)}"
    rgw.client(rgw.other).create_bucket(Bucket=theirs)
    try:
        with pytest.raises(StorageAccessError) as e:
            store_for(rgw, tmp_path).list_matching(S3Url.parse(f"s3://{theirs}/in/*.jpg"), 10)
        assert e.value.exit_code == 66 and f"'{theirs}'" in str(e.value)
    finally:
        rgw.client(rgw.other).delete_bucket(Bucket=theirs)


@pytest.mark.parametrize("size", [3000, 20 * MIB])
def test_the_joins_commit_replaces_its_own_or_with_overwrite_and_refuses_another_jobs(
    rgw: Rgw, bucket: str, tmp_path: Path, size: int
) -> None:
    store = store_for(rgw, tmp_path)
    url = S3Url(bucket, "out/clip.mp4")
    first, second, third = (secrets.token_bytes(size) for _ in range(3))
    store.commit_file(url, io.BytesIO(first), "job1", "v1", 1, overwrite=False)
    assert not store.commit_file(url, io.BytesIO(second), "job1", "v1", 2, overwrite=False).cached  # a retry
    assert rgw.client().get_object(Bucket=bucket, Key=url.key)["Body"].read() == second
    with pytest.raises(ObjectExists, match="out/clip.mp4: output exists"):
        store.commit_file(url, io.BytesIO(third), "job2", "v1", 1, overwrite=False)
    assert not store.commit_file(url, io.BytesIO(third), "job2", "v1", 1, overwrite=True).cached
    head = rgw.client().head_object(Bucket=bucket, Key=url.key)
    assert head["Metadata"]["ffswarm-job"] == "job2" and head["ContentLength"] == size
