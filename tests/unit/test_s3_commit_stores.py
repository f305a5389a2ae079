"""The runner's commit (runner_image/s3io.py Store.commit) against Ceph RGW, a real S3 server, and
against moto, with the same tests: RGW ignores conditions on CompleteMultipartUpload and refuses a
quoted If-Match (docs/storage.md), so these are the cases where a commit could replace another job's
object or refuse to replace its own.

Another job's write "between the HEAD and the commit" is made in ``before``, the hook the worker's
journal uses, which the commit calls after its HEAD and just before its write.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contract.s3 import S3Url
from runner_image.errors import ItemError
from runner_image.s3io import S3Config, Store
from tests.fixtures.rgw_server import Rgw

MIB = 1024**2
BIG = 20 * MIB  # over the multipart threshold below


@dataclass
class Server:
    name: str
    endpoint: str
    cred_file: Path
    cleanup: Any

    def store(self, **kw: Any) -> Store:
        base: dict[str, Any] = dict(
            endpoint_url=self.endpoint, multipart_threshold=8 * MIB, part_size=5 * MIB, max_attempts=2,
            connect_timeout=5,
        )  # fmt: skip
        return Store.connect(S3Config(**{**base, **kw}), self.cred_file)


@pytest.fixture(params=["rgw", "moto"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    if request.param == "rgw":
        rgw: Rgw = request.getfixturevalue("rgw")
        return Server("rgw", rgw.endpoint, rgw.cred_file(tmp_path), rgw.remove_bucket)
    endpoint = request.getfixturevalue("moto_endpoint")
    creds = tmp_path / "ffswarm-s3"
    creds.write_text("AWS_ACCESS_KEY_ID=AKIAFFSWARMTEST00001\nAWS_SECRET_ACCESS_KEY=moto-secret\n")
    return Server("moto", endpoint, creds, lambda name: None)


@pytest.fixture
def bucket(server: Server) -> Iterator[str]:
    store = server.store()
    name = f"ffswarm-t-{secrets.token_hex(6)}"
    store.client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        server.cleanup(name)


def other_job_writes(store: Store, bucket: str, key: str, body: bytes) -> None:
    store.client.put_object(Bucket=bucket, Key=key, Body=body,
                            Metadata={"ffswarm-job": "job2", "ffswarm-item": "i1", "ffswarm-attempt": "1",
                                      "ffswarm-sha256": hashlib.sha256(body).hexdigest()})  # fmt: skip


def content(store: Store, bucket: str, key: str) -> tuple[bytes, dict[str, str]]:
    answer = store.client.get_object(Bucket=bucket, Key=key)
    return answer["Body"].read(), answer["Metadata"]


@pytest.mark.parametrize("size", [3000, BIG])
def test_a_racing_commit_leaves_the_other_jobs_object_untouched_and_fails_naming_the_key(
    server: Server, bucket: str, size: int, tmp_path: Path
) -> None:
    store = server.store()
    ours = tmp_path / "out.mp4"
    ours.write_bytes(secrets.token_bytes(size))
    theirs = b"the other job's output"
    key = "race/out.mp4"
    with pytest.raises(ItemError, match=f"s3://{bucket}/{key}: output exists"):
        store.commit(S3Url(bucket, key), ours, "job1", "i1", 1, overwrite=False,
                     before=lambda _: other_job_writes(store, bucket, key, theirs))  # fmt: skip
    body, meta = content(store, bucket, key)
    assert body == theirs and meta["ffswarm-job"] == "job2"
    assert not store.client.list_multipart_uploads(Bucket=bucket).get("Uploads")


@pytest.mark.parametrize("size", [3000, BIG])
def test_overwrite_replaces_another_jobs_object(server: Server, bucket: str, size: int) -> None:
    store = server.store()
    key = "over/out.jpg"
    other_job_writes(store, bucket, key, b"old")
    data = secrets.token_bytes(size)
    done = store.commit(S3Url(bucket, key), data, "job1", "i1", 1, overwrite=True)
    assert not done.cached
    body, meta = content(store, bucket, key)
    assert body == data and meta["ffswarm-job"] == "job1"


@pytest.mark.parametrize("size", [3000, BIG])
def test_a_retry_with_new_bytes_replaces_its_own_earlier_commit(server: Server, bucket: str, size: int) -> None:
    store = server.store()
    key = "retry/out.png"
    store.commit(S3Url(bucket, key), secrets.token_bytes(size), "job1", "i1", 1, overwrite=False)
    second = secrets.token_bytes(size)  # a GPU's non-deterministic output: other bytes this time
    done = store.commit(S3Url(bucket, key), second, "job1", "i1", 2, overwrite=False)
    assert not done.cached and done.attempt == 2
    body, meta = content(store, bucket, key)
    assert body == second and meta["ffswarm-attempt"] == "2"


def test_an_object_replaced_after_the_head_is_not_replaced_again(server: Server, bucket: str) -> None:
    """Our earlier attempt's object, replaced by another job between our HEAD and our write: the
    If-Match on the ETag we saw refuses, whichever way the store wants the ETag quoted."""
    store = server.store()
    key = "retry/raced.png"
    store.commit(S3Url(bucket, key), b"attempt one", "job1", "i1", 1, overwrite=False)
    with pytest.raises(ItemError, match="output exists"):
        store.commit(S3Url(bucket, key), b"attempt two", "job1", "i1", 2, overwrite=False,
                     before=lambda _: other_job_writes(store, bucket, key, b"theirs"))  # fmt: skip
    assert content(store, bucket, key)[0] == b"theirs"


def test_parts_go_up_in_parallel_where_no_condition_is_asked(server: Server, bucket: str) -> None:
    store = server.store(conditional_writes=False, part_workers=3)
    in_flight: list[int] = []
    peak: list[int] = [0]

    def started(**kw: Any) -> None:
        in_flight.append(1)
        peak[0] = max(peak[0], len(in_flight))

    def finished(**kw: Any) -> None:
        in_flight.pop()

    store.client.meta.events.register("before-call.s3.UploadPart", started)
    store.client.meta.events.register("after-call.s3.UploadPart", finished)
    data = secrets.token_bytes(BIG)
    store.commit(S3Url(bucket, "par/out.mp4"), data, "job1", "i1", 1, overwrite=False)
    assert content(store, bucket, "par/out.mp4")[0] == data
    assert peak[0] > 1  # 4 parts of 5 MiB, 3 at a time


def test_a_big_conditional_commit_on_a_store_without_conditional_completes_is_one_put(
    server: Server, bucket: str
) -> None:
    store = server.store()
    calls: list[str] = []
    for op in ("PutObject", "CreateMultipartUpload"):
        store.client.meta.events.register(f"before-call.s3.{op}", lambda model, **kw: calls.append(model.name))
    store.commit(S3Url(bucket, "one/out.mp4"), secrets.token_bytes(BIG), "job1", "i1", 1, overwrite=False)
    assert calls == ["PutObject"]


def test_a_part_failing_while_others_are_in_flight_leaves_no_object_and_no_open_upload(
    server: Server, bucket: str
) -> None:
    store = server.store(conditional_writes=False, part_workers=3)

    def third_part(params: dict[str, Any], **kw: Any) -> None:
        if params["PartNumber"] == 3:
            raise ConnectionResetError()

    store.client.meta.events.register("before-parameter-build.s3.UploadPart", third_part)
    with pytest.raises(ConnectionResetError):  # raised in a part's thread, out of the commit
        store.commit(S3Url(bucket, "cut/out.mp4"), secrets.token_bytes(BIG), "job1", "i1", 1, overwrite=False)
    assert store.probe(S3Url(bucket, "cut/out.mp4")) is None
    assert not store.client.list_multipart_uploads(Bucket=bucket).get("Uploads")
