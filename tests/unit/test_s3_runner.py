"""runner_image.s3io against Ceph RGW, a real S3 server (scripts/s3-server.sh; the ``rgw`` fixture),
over HTTP with the real boto3 client: SigV4 is checked, so wrong credentials are the server's refusal.

moto is kept for two tests that need a store which records the ChecksumSHA256 header and hands it back
(RGW neither checks nor echoes it: docs/storage.md): that a commit sends the right one, and that the
reader refuses bytes that do not match a wrong one.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.server
import logging
import secrets
import socket
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.exits import RunnerExit
from contract.s3 import S3Url
from runner_image import s3io
from runner_image.errors import ItemError, MissingInput, Temporary, Terminated
from runner_image.s3io import S3Config, Store, item_url, read_credentials
from tests.fixtures.rgw_server import Rgw

SECRET = "Zq" + secrets.token_hex(16)  # distinctive: searched for in every error and log line
KEY_ID = "AKIAFFSWARMTEST00001"
MIB = 1024**2


@pytest.fixture
def endpoint(rgw: Rgw) -> str:
    return rgw.endpoint


def write_credentials(folder: Path, key_id: str = KEY_ID, secret: str = SECRET) -> Path:
    path = folder / "ffswarm-s3"
    path.write_text(f"AWS_ACCESS_KEY_ID={key_id}\nAWS_SECRET_ACCESS_KEY={secret}\n")
    return path


def config(endpoint: str, **kw: Any) -> S3Config:
    base: dict[str, Any] = dict(
        endpoint_url=endpoint, multipart_threshold=8 * MIB, part_size=5 * MIB, max_attempts=2, connect_timeout=5
    )
    return S3Config(**{**base, **kw})


@pytest.fixture
def store(rgw: Rgw, tmp_path: Path) -> Store:
    return Store.connect(config(rgw.endpoint), rgw.cred_file(tmp_path))


def _bucket(store: Store) -> Iterator[str]:
    name = f"ffswarm-t-{secrets.token_hex(6)}"
    store.client.create_bucket(Bucket=name)
    yield name
    for upload in store.client.list_multipart_uploads(Bucket=name).get("Uploads", []):
        store.client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
    for obj in store.client.list_objects_v2(Bucket=name).get("Contents", []):
        store.client.delete_object(Bucket=name, Key=obj["Key"])
    store.client.delete_bucket(Bucket=name)


@pytest.fixture
def bucket(store: Store) -> Iterator[str]:
    """A bucket of this test's own, emptied and removed afterwards (the server outlives the test)."""
    yield from _bucket(store)


@pytest.fixture
def moto_store(moto_endpoint: str, tmp_path: Path) -> Store:
    return Store.connect(config(moto_endpoint), write_credentials(tmp_path, KEY_ID, SECRET))


@pytest.fixture
def moto_bucket(moto_store: Store) -> Iterator[str]:
    yield from _bucket(moto_store)


def url(bucket: str, key: str) -> S3Url:
    return S3Url(bucket, key)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def no_secret(error: BaseException) -> None:
    text = "".join(traceback.format_exception(error)) + repr(error) + str(error)
    assert SECRET not in text


# --- commits ---------------------------------------------------------------------------------------


def test_commit_records_checksum_and_owner_and_a_recommit_is_cached(moto_store: Store, moto_bucket: str) -> None:
    """On moto, which records the checksum header and sends it back (RGW ignores it)."""
    store, bucket = moto_store, moto_bucket
    data = b"\xff\xd8\xff" + secrets.token_bytes(3000)
    first = store.commit(url(bucket, "out/a.jpg"), data, "job1", "i000001", 1, overwrite=False)
    assert (first.cached, first.digest) == (False, (len(data), sha(data)))
    head = store.client.head_object(Bucket=bucket, Key="out/a.jpg", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert head["Metadata"] == {
        "ffswarm-job": "job1", "ffswarm-item": "i000001", "ffswarm-attempt": "1", "ffswarm-sha256": sha(data)
    }  # fmt: skip
    assert head["ContentType"] == "image/jpeg"
    again = store.commit(url(bucket, "out/a.jpg"), data, "job1", "i000001", 2, overwrite=False)
    assert (again.cached, again.attempt, again.digest) == (True, 1, first.digest)
    assert store.client.head_object(Bucket=bucket, Key="out/a.jpg")["ETag"] == head["ETag"]  # not rewritten


def test_a_later_attempt_of_the_same_job_replaces_its_own_object(store: Store, bucket: str) -> None:
    store.commit(url(bucket, "b.png"), b"first", "job1", "i1", 1, overwrite=False)
    told: list[s3io.Digest] = []
    done = store.commit(url(bucket, "b.png"), b"second", "job1", "i1", 2, overwrite=False, before=told.append)
    assert not done.cached and told == [done.digest]
    assert store.client.get_object(Bucket=bucket, Key="b.png")["Body"].read() == b"second"
    assert store.probe(url(bucket, "b.png")) == (
        store.client.head_object(Bucket=bucket, Key="b.png")["ETag"],
        6,
        "job1",
        "i1",
        2,
        sha(b"second"),
    )


@pytest.mark.parametrize("metadata", [{}, {"ffswarm-job": "other", "ffswarm-item": "i1", "ffswarm-sha256": "0" * 64}])
def test_an_object_this_job_did_not_write_is_refused_unless_overwrite(
    store: Store, bucket: str, metadata: dict[str, str]
) -> None:
    store.client.put_object(Bucket=bucket, Key="keep.jpg", Body=b"theirs", Metadata=metadata)
    with pytest.raises(ItemError) as refused:
        store.commit(url(bucket, "keep.jpg"), b"ours", "job1", "i1", 1, overwrite=False)
    assert f"s3://{bucket}/keep.jpg" in str(refused.value) and "overwrite" in str(refused.value)
    assert store.client.get_object(Bucket=bucket, Key="keep.jpg")["Body"].read() == b"theirs"
    store.commit(url(bucket, "keep.jpg"), b"ours", "job1", "i1", 1, overwrite=True)
    assert store.client.get_object(Bucket=bucket, Key="keep.jpg")["Body"].read() == b"ours"


def test_an_object_that_appears_between_the_check_and_the_put_is_not_replaced(store: Store, bucket: str) -> None:
    """The race safefs's link closes: If-None-Match: * makes the check and the write one step."""

    def other_writer(**kw: Any) -> None:
        store.client.meta.events.unregister("before-call.s3.PutObject", other_writer)
        store.client.put_object(Bucket=bucket, Key="race.jpg", Body=b"theirs")

    store.client.meta.events.register("before-call.s3.PutObject", other_writer)
    with pytest.raises(ItemError, match=f"s3://{bucket}/race.jpg"):
        store.commit(url(bucket, "race.jpg"), b"ours", "job1", "i1", 1, overwrite=False)
    assert store.client.get_object(Bucket=bucket, Key="race.jpg")["Body"].read() == b"theirs"


def in_parts(store: Store, workers: int = 4) -> Store:
    """The store as one that honours If-None-Match on CompleteMultipartUpload (moto does; RGW does
    not: tests/unit/test_s3_commit_stores.py), so a large commit goes up in parts; nothing else
    writes these keys, so RGW's ignoring the condition changes nothing here."""
    return dataclasses.replace(store, config=dataclasses.replace(store.config, conditional_complete=True,
                                                                 part_workers=workers))  # fmt: skip


def test_a_large_file_goes_up_in_parts_and_reads_back(store: Store, bucket: str, tmp_path: Path) -> None:
    store = in_parts(store)
    data = secrets.token_bytes(11 * MIB + 123)
    video = tmp_path / "out.mp4"
    video.write_bytes(data)
    parts: list[int] = []
    store.client.meta.events.register("before-call.s3.UploadPart", lambda params, **kw: parts.append(1))
    done = store.commit(url(bucket, "v/out.mp4"), video, "job1", "i7", 1, overwrite=False)
    assert done.digest == (len(data), sha(data)) and len(parts) == 3  # 5 + 5 + 1 MiB
    head = store.client.head_object(Bucket=bucket, Key="v/out.mp4")
    assert head["ContentLength"] == len(data) and head["Metadata"]["ffswarm-sha256"] == sha(data)
    assert store.read_input(url(bucket, "v/out.mp4"), cap=len(data)) == data
    assert "Uploads" not in store.client.list_multipart_uploads(Bucket=bucket)
    assert store.commit(url(bucket, "v/out.mp4"), video, "job1", "i7", 2, overwrite=False).cached


@pytest.mark.parametrize("interruption", [Terminated, ConnectionResetError])
def test_an_upload_interrupted_after_its_first_part_leaves_no_object_and_no_open_upload(
    store: Store, bucket: str, interruption: type[BaseException]
) -> None:
    store = in_parts(store, workers=1)  # one part at a time: the second is the one interrupted
    data = secrets.token_bytes(12 * MIB)
    sent: list[int] = []

    def second_part(params: dict[str, Any], **kw: Any) -> None:
        sent.append(params["PartNumber"])
        if params["PartNumber"] == 2:
            raise interruption()

    store.client.meta.events.register("before-parameter-build.s3.UploadPart", second_part)
    with pytest.raises(interruption):
        store.commit(url(bucket, "cut.mp4"), data, "job1", "i1", 1, overwrite=False)
    assert sent == [1, 2]
    assert store.probe(url(bucket, "cut.mp4")) is None
    assert "Uploads" not in store.client.list_multipart_uploads(Bucket=bucket)
    store.client.meta.events.unregister("before-parameter-build.s3.UploadPart", second_part)
    assert not store.commit(url(bucket, "cut.mp4"), data, "job1", "i1", 2, overwrite=False).cached  # the retry


# --- reads -----------------------------------------------------------------------------------------


def test_a_photo_is_read_whole_up_to_its_cap(store: Store, bucket: str) -> None:
    store.client.put_object(Bucket=bucket, Key="in/p.jpg", Body=b"x" * 1000)
    assert store.read_input(url(bucket, "in/p.jpg"), cap=1000) == b"x" * 1000
    with pytest.raises(ItemError, match="too large: 1000 bytes exceeds limit 999"):
        store.read_input(url(bucket, "in/p.jpg"), cap=999)


def test_a_video_is_fetched_to_a_temporary_file_removed_afterwards(store: Store, bucket: str, tmp_path: Path) -> None:
    data = secrets.token_bytes(70_000)
    store.client.put_object(Bucket=bucket, Key="in/clip.mp4", Body=data)
    tmp_path = tmp_path / "tmpfs"
    tmp_path.mkdir()
    with store.fetch_seekable(url(bucket, "in/clip.mp4"), tmp_path, cap=len(data)) as path:
        assert path.parent == tmp_path and path.suffix == ".mp4" and path.read_bytes() == data
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ItemError, match="too large"), store.fetch_seekable(url(bucket, "in/clip.mp4"), tmp_path, 100):
        pass
    with pytest.raises(ItemError, match="missing input"), store.fetch_seekable(url(bucket, "no.mp4"), tmp_path, 100):
        pass
    assert list(tmp_path.iterdir()) == []


def test_bytes_that_do_not_match_the_recorded_checksum_fail_the_item(moto_store: Store, moto_bucket: str) -> None:
    """moto stores a wrong ChecksumSHA256 as given and sends it back (RGW stores nothing of it); the
    reader checks it."""
    store, bucket = moto_store, moto_bucket
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    store.client.put_object(
        Bucket=bucket, Key="bad.jpg", Body=b"hello", ChecksumAlgorithm="SHA256", ChecksumSHA256=wrong
    )
    with pytest.raises(ItemError, match=f"s3://{bucket}/bad.jpg: the bytes read do not match"):
        store.read_input(url(bucket, "bad.jpg"), cap=MIB)


def test_a_missing_input_object_fails_its_item_naming_the_url(store: Store, bucket: str) -> None:
    with pytest.raises(ItemError) as missing:
        store.read_input(url(bucket, "in/gone.jpg"), cap=MIB)
    assert str(missing.value) == f"missing input s3://{bucket}/in/gone.jpg"


def test_a_missing_bucket_ends_the_chunk_with_66_naming_it(store: Store) -> None:
    gone = url(f"ffswarm-nobucket-{secrets.token_hex(4)}", "x.jpg")
    for call in (
        lambda: store.read_input(gone, cap=MIB),
        lambda: store.commit(gone, b"data", "job1", "i1", 1, overwrite=False),
        lambda: store.check_bucket(gone),
    ):
        with pytest.raises(MissingInput) as refused:
            call()
        assert refused.value.exit_code is RunnerExit.MISSING_INPUT and gone.bucket in str(refused.value)
        no_secret(refused.value)


# --- failure classes -------------------------------------------------------------------------------


def test_wrong_credentials_end_the_chunk_with_66_and_never_show_the_secret(
    rgw: Rgw, store: Store, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The right key id with a wrong secret: the server's SigV4 check refuses every call."""
    wrong = Store.connect(config(rgw.endpoint), write_credentials(tmp_path, rgw.creds.access_key_id, SECRET))
    caplog.set_level(logging.DEBUG)
    store.commit(url(bucket, "ok.jpg"), b"fine", "job1", "i1", 1, overwrite=False)
    for call in (
        lambda: wrong.read_input(url(bucket, "ok.jpg"), cap=MIB),
        lambda: wrong.commit(url(bucket, "new.jpg"), b"data", "job1", "i2", 1, overwrite=False),
        lambda: wrong.check_bucket(url(bucket, "new.jpg")),
    ):
        with pytest.raises(MissingInput) as refused:
            call()
        assert refused.value.exit_code is RunnerExit.MISSING_INPUT and bucket in str(refused.value)
        no_secret(refused.value)
    assert SECRET not in caplog.text and rgw.creds.secret_access_key not in caplog.text
    assert store.probe(url(bucket, "new.jpg")) is None


class _SlowDown(http.server.BaseHTTPRequestHandler):
    """A store that answers every request with 503 SlowDown (throttling), counting them."""

    calls: list[str] = []

    def _answer(self) -> None:
        self.calls.append(self.command)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)) if self.command != "HEAD" else "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_throttling_is_temporary_after_botocores_retries(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _SlowDown.calls = []
    try:
        throttled = Store.connect(
            config(f"http://127.0.0.1:{server.server_port}", max_attempts=2), write_credentials(tmp_path)
        )
        with pytest.raises(Temporary) as slow:
            throttled.read_input(url("bkt", "p.jpg"), cap=MIB)
    finally:
        server.shutdown()
        server.server_close()
    assert slow.value.exit_code is RunnerExit.TEMPORARY and "s3://bkt/p.jpg" in str(slow.value)
    assert "SlowDown" in str(slow.value) and _SlowDown.calls == ["GET"] * 2
    no_secret(slow.value)


def test_an_unreachable_store_is_temporary(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = Store.connect(config(f"http://127.0.0.1:{port}", max_attempts=1), write_credentials(tmp_path))
    with pytest.raises(Temporary) as unreachable:
        down.commit(url("bkt", "o.jpg"), b"data", "job1", "i1", 1, overwrite=False)
    assert unreachable.value.exit_code is RunnerExit.TEMPORARY and "s3://bkt/o.jpg" in str(unreachable.value)
    no_secret(unreachable.value)


# --- credentials and URLs --------------------------------------------------------------------------


def test_credentials_are_read_from_the_secret_file_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(f'# ffswarm\nAWS_ACCESS_KEY_ID={KEY_ID}\nAWS_SECRET_ACCESS_KEY="{SECRET}"\nAWS_SESSION_TOKEN=tok\n')
    creds = read_credentials(path)
    assert (creds.access_key_id, creds.secret_access_key, creds.session_token) == (KEY_ID, SECRET, "tok")
    assert SECRET not in repr(creds) and "tok" not in repr(creds)
    path.write_text(f"AWS_ACCESS_KEY_ID={KEY_ID}\n{SECRET}\n")  # the secret pasted without its name
    with pytest.raises(MissingInput, match="line 2") as malformed:
        read_credentials(path)
    no_secret(malformed.value)
    path.write_text(f"AWS_ACCESS_KEY_ID={KEY_ID}\n")
    with pytest.raises(MissingInput, match="lacks AWS_SECRET_ACCESS_KEY"):
        read_credentials(path)
    with pytest.raises(MissingInput, match=str(tmp_path / "absent")):
        read_credentials(tmp_path / "absent")


def test_s3_urls_are_checked() -> None:
    assert item_url("s3://my-bucket/a/b c.jpg") == S3Url("my-bucket", "a/b c.jpg")
    assert str(S3Url("my-bucket", "a/b.jpg")) == "s3://my-bucket/a/b.jpg"
    for bad in ("/data/x.jpg", "s3://my-bucket", "s3://my-bucket/", "s3://UPPER/x", "s3://b/x", "s3://ok-b/a\nb"):
        with pytest.raises(ItemError):
            item_url(bad)
    with pytest.raises(ValueError, match="addressing"):
        S3Config(addressing="sideways")
    with pytest.raises(ValueError, match="part_size"):
        S3Config(part_size=MIB)
