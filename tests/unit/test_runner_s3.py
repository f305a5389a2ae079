"""The runner's chunk with s3:// items, in-process: ``python -m runner_image``'s ``main`` on real photos
with the stand-in pack, reading and committing objects in Ceph RGW, a real S3 server on loopback
(scripts/s3-server.sh; real HTTP, the real boto3 client). One test also runs on moto, which hands the
ChecksumSHA256 header back (RGW ignores it: docs/storage.md), to show the runner sends the right one.

The manifest names the credentials file as the Swarm secret (/run/secrets/ffswarm-s3);
``FFSWARM_SECRETS_ROOT`` stands in a temporary folder for /run/secrets, as ``--data-root`` does for /data.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest

from contract.identity import IdentityRequest, IdentityResult
from contract.identity_table import Identity
from contract.manifest import SCHEMA_IDENTITIES, Item, Manifest, Segment
from contract.results import ItemResult, ItemStatus, chunk_results
from contract.s3 import StorageAccess
from runner_image.__main__ import main
from tests.fixtures import photos
from tests.fixtures.rgw_server import Rgw
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_video import make_clip

JOB, RUN = "job1", "/data/runs/job1"
KEY_ID, SECRET = "AKIAFFSWARMTEST00002", "Zq" + secrets.token_hex(16)  # searched for in every output


def client(endpoint: str, key_id: str = KEY_ID, secret: str = SECRET) -> Any:
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1")
    return session.client("s3", endpoint_url=endpoint)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("assets")
    build_pack(base / "models" / "default")
    inputs = base / "in"
    photos.no_face_photo(inputs)
    photos.face_photos(inputs, 3)
    shutil.copyfile(inputs / "face_01.jpg", inputs / "source.jpg")
    return base


class World:
    """A data root, a secrets folder and two buckets of this test's own (removed afterwards)."""

    def __init__(self, root: Path, secrets_dir: Path, endpoint: str, key_id: str, secret: str) -> None:
        self.root, self.secrets, self.endpoint, self.secret = root, secrets_dir, endpoint, secret
        (secrets_dir / "ffswarm-s3").write_text(f"AWS_ACCESS_KEY_ID={key_id}\nAWS_SECRET_ACCESS_KEY={secret}\n")
        self.s3 = client(endpoint, key_id, secret)
        tag = secrets.token_hex(5)
        self.media, self.results = f"ffswarm-media-{tag}", f"ffswarm-results-{tag}"
        for b in (self.media, self.results):
            self.s3.create_bucket(Bucket=b)
        for name in ("face_00.jpg", "face_02.jpg", "no_face.jpg", "source.jpg"):
            self.s3.put_object(Bucket=self.media, Key=f"crowd/{name}", Body=(root / "in" / name).read_bytes())

    def manifest(self, items: tuple[Item, ...], source: str | None = "", chunk: str = "c0001", **kw: Any) -> str:
        """``source``: the default (an object), a path or URL, or None (a pairs manifest has none)."""
        sources = () if source is None else (source or f"s3://{self.media}/crowd/source.jpg",)
        m = Manifest(
            job=JOB, chunk=chunk, run_dir=RUN, pack_dir="/data/models/default",
            source=sources, items=items, providers=("cpu",),
            storage=StorageAccess(endpoint_url=self.endpoint), **kw,
        )  # fmt: skip
        (self.root / "runs" / JOB / "chunks" / f"{chunk}.json").write_text(m.to_json())
        return f"{RUN}/chunks/{chunk}.json"

    def run(self, manifest: str, attempt: int = 1) -> int:
        argv = ["--manifest", manifest, "--attempt", str(attempt), "--data-root", str(self.root)]
        return main(argv, env={"FFSWARM_SECRETS_ROOT": str(self.secrets)})

    def lines(self, attempt: int | None = None) -> dict[str, ItemResult]:
        lines = chunk_results(self.root / "runs" / JOB / "results", "c0001").lines
        return {r.item: r for r in lines if attempt is None or r.attempt == attempt}

    def head(self, bucket: str, key: str) -> dict[str, Any]:
        head: dict[str, Any] = self.s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        return head

    def body(self, bucket: str, key: str) -> bytes:
        data: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data

    def photo(self, name: str) -> bytes:
        return (self.root / "in" / name).read_bytes()


def make_world(tmp_path: Path, assets: Path, endpoint: str, key_id: str, secret: str) -> Iterator[World]:
    root = tmp_path / "data"
    shutil.copytree(assets, root)
    (root / "runs" / JOB / "chunks").mkdir(parents=True)
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    w = World(root, secrets_dir, endpoint, key_id, secret)
    yield w
    for b in (w.media, w.results):
        for upload in w.s3.list_multipart_uploads(Bucket=b).get("Uploads", []):
            w.s3.abort_multipart_upload(Bucket=b, Key=upload["Key"], UploadId=upload["UploadId"])
        for obj in w.s3.list_objects_v2(Bucket=b).get("Contents", []):
            w.s3.delete_object(Bucket=b, Key=obj["Key"])
        w.s3.delete_bucket(Bucket=b)


@pytest.fixture
def world(tmp_path: Path, assets: Path, rgw: Rgw) -> Iterator[World]:
    yield from make_world(tmp_path, assets, rgw.endpoint, rgw.creds.access_key_id, rgw.creds.secret_access_key)


@pytest.fixture
def moto_world(tmp_path: Path, assets: Path, moto_endpoint: str) -> Iterator[World]:
    yield from make_world(tmp_path, assets, moto_endpoint, KEY_ID, SECRET)


def s3_items(w: World, names: list[str]) -> tuple[Item, ...]:
    return tuple(
        Item(f"i{n:06d}", f"s3://{w.media}/crowd/{name}", f"s3://{w.results}/out/{Path(name).stem}.png")
        for n, name in enumerate(names)
    )


def no_secret(w: World, *texts: str) -> None:
    for text in texts:
        assert SECRET not in text and w.secret not in text
    for path in w.root.joinpath("runs").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and w.secret.encode() not in data, path


@pytest.mark.parametrize("store", ["rgw", "moto"])
def test_photos_from_the_store_are_swapped_into_the_store_with_checksum_and_metadata(
    store: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    w: World = request.getfixturevalue("world" if store == "rgw" else "moto_world")
    items = s3_items(w, ["face_00.jpg", "face_02.jpg", "no_face.jpg"])
    assert w.run(w.manifest(items)) == 0
    lines = w.lines()
    assert [lines[i.id].status for i in items] == [ItemStatus.OK, ItemStatus.OK, ItemStatus.NO_FACE]
    for item in items:
        line = lines[item.id]
        assert (line.input, line.output, line.attempt, line.cached) == (item.input, item.output, 1, False)
        key = item.output.removeprefix(f"s3://{w.results}/")
        data, head = w.body(w.results, key), w.head(w.results, key)
        digest = hashlib.sha256(data)
        assert (line.size, line.sha256) == (len(data), digest.hexdigest())
        if store == "moto":  # RGW neither keeps nor returns the checksum header
            assert head["ChecksumSHA256"] == base64.b64encode(digest.digest()).decode()
        assert head["Metadata"] == {
            "ffswarm-job": JOB, "ffswarm-item": item.id, "ffswarm-attempt": "1", "ffswarm-sha256": digest.hexdigest(),
        }  # fmt: skip
        assert head["ContentType"] == "image/png"
    # a swapped face is not the input; no_face: copy is the input's bytes, unchanged
    assert w.body(w.results, "out/face_00.png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert w.body(w.results, "out/no_face.png") == w.photo("no_face.jpg")
    assert not (w.root / "out").exists()  # nothing went to the data root
    no_secret(w, capsys.readouterr().out)


def test_a_retried_chunk_skips_the_objects_it_committed(world: World) -> None:
    w = world
    items = s3_items(w, ["face_00.jpg", "no_face.jpg"])
    manifest = w.manifest(items)
    assert w.run(manifest) == 0
    before = {i.id: w.head(w.results, i.output.split("/", 3)[3]) for i in items}
    assert w.run(manifest, attempt=2) == 0
    second = w.lines(attempt=2)
    for item in items:
        first_line, line = w.lines(attempt=1)[item.id], second[item.id]
        assert (
            line.cached
            and line.output == item.output
            and (line.size, line.sha256)
            == (
                first_line.size,
                first_line.sha256,
            )
        )
        after = w.head(w.results, item.output.split("/", 3)[3])
        assert after["ETag"] == before[item.id]["ETag"] and after["Metadata"]["ffswarm-attempt"] == "1"


def test_another_jobs_object_at_an_output_key_fails_that_item_only_naming_it(world: World) -> None:
    w = world
    items = s3_items(w, ["face_00.jpg", "face_02.jpg"])
    theirs = {"ffswarm-job": "otherjob", "ffswarm-item": items[1].id, "ffswarm-attempt": "1"}
    w.s3.put_object(Bucket=w.results, Key="out/face_02.png", Body=b"not ours", Metadata=theirs)
    assert w.run(w.manifest(items)) == 3
    lines = w.lines()
    assert lines[items[0].id].status is ItemStatus.OK
    refused = lines[items[1].id]
    assert refused.status is ItemStatus.ERROR and refused.output is None
    assert (
        refused.reason
        == f"{items[1].output}: output exists and was not written by this job (set overwrite: true to replace it)"
    )
    assert w.body(w.results, "out/face_02.png") == b"not ours"


def test_overwrite_replaces_another_jobs_object(world: World) -> None:
    w = world
    items = s3_items(w, ["face_02.jpg"])
    w.s3.put_object(Bucket=w.results, Key="out/face_02.png", Body=b"not ours")
    assert w.run(w.manifest(items, overwrite=True)) == 0
    assert w.head(w.results, "out/face_02.png")["Metadata"]["ffswarm-job"] == JOB


def test_a_missing_input_object_fails_its_item_naming_the_url(world: World) -> None:
    w = world
    items = (
        *s3_items(w, ["face_00.jpg"]),
        Item("i000009", f"s3://{w.media}/crowd/gone.jpg", f"s3://{w.results}/out/gone.png"),
    )
    assert w.run(w.manifest(items)) == 3
    lines = w.lines()
    assert lines["i000000"].status is ItemStatus.OK
    gone = lines["i000009"]
    assert gone.status is ItemStatus.ERROR and gone.input == f"s3://{w.media}/crowd/gone.jpg"
    assert gone.reason == f"missing input s3://{w.media}/crowd/gone.jpg"
    assert "out/gone.png" not in [o["Key"] for o in w.s3.list_objects_v2(Bucket=w.results).get("Contents", [])]


def test_a_missing_output_bucket_ends_the_chunk_with_66_naming_it_before_any_work(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    w = world
    nowhere = f"ffswarm-nowhere-{secrets.token_hex(4)}"
    items = (
        *s3_items(w, ["face_00.jpg"]),
        Item("i000005", f"s3://{w.media}/crowd/face_02.jpg", f"s3://{nowhere}/x.png"),
    )
    assert w.run(w.manifest(items)) == 66
    failed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if '"runner failed"' in x]
    assert failed and f"bucket {nowhere} does not exist" in failed[-1]["error"]
    assert not list((w.root / "runs" / JOB).rglob("*.jsonl"))  # not one item started
    assert w.s3.list_objects_v2(Bucket=w.results).get("KeyCount", 0) == 0


def test_a_chunk_mixes_objects_and_data_root_files(world: World) -> None:
    w = world
    items = (
        Item("i000000", f"s3://{w.media}/crowd/face_00.jpg", "/data/out/face_00.png"),
        Item("i000001", "/data/in/face_02.jpg", f"s3://{w.results}/out/face_02.png"),
        Item("i000002", "/data/in/no_face.jpg", "/data/out/no_face.png"),
    )
    assert w.run(w.manifest(items, source="/data/in/source.jpg")) == 0
    lines = w.lines()
    assert [lines[i].status for i in ("i000000", "i000001", "i000002")] == [
        ItemStatus.OK, ItemStatus.OK, ItemStatus.NO_FACE,
    ]  # fmt: skip
    local = (w.root / "out" / "face_00.png").read_bytes()
    assert lines["i000000"].sha256 == hashlib.sha256(local).hexdigest()
    remote = w.body(w.results, "out/face_02.png")
    assert lines["i000001"].sha256 == hashlib.sha256(remote).hexdigest()
    assert (w.root / "out" / "no_face.png").read_bytes() == w.photo("no_face.jpg")


def test_wrong_credentials_end_the_chunk_with_66_naming_the_bucket_and_never_the_secret(
    world: World, rgw: Rgw, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner's client signs with the secret file's key: a wrong secret is refused by the server's
    SigV4 check before any item runs."""
    w = world
    (w.secrets / "ffswarm-s3").write_text(
        f"AWS_ACCESS_KEY_ID={rgw.creds.access_key_id}\nAWS_SECRET_ACCESS_KEY={SECRET}\n"
    )
    code = w.run(w.manifest(s3_items(w, ["face_00.jpg"])))
    assert code == 66
    out = capsys.readouterr().out
    failed = [json.loads(x) for x in out.splitlines() if '"runner failed"' in x]
    assert failed and w.results in failed[-1]["error"] and "refused by the store" in failed[-1]["error"]
    no_secret(w, out)
    assert not list((w.root / "runs" / JOB).rglob("*.jsonl"))


def test_a_video_in_the_store_is_read_through_a_temporary_copy_and_its_segments_stay_in_the_run_folder(
    world: World, tmp_path: Path
) -> None:
    """ffmpeg seeks, so the runner copies the object to its tmpfs (here: the system's temporary folder),
    once for the segments running at the same time, and removes the copy after the last of them."""
    w = world
    clip = make_clip(tmp_path / "clip.mp4", seconds=2, audio=False)
    w.s3.put_object(Bucket=w.media, Key="v/clip.mp4", Body=clip.read_bytes())
    copies_before = set(Path(tempfile.gettempdir()).glob(".ffswarm-s3-*"))
    segs = (
        Segment(0, 25, "25/1", 64, 48, 12800, demuxer="mov"),
        Segment(25, 25, "25/1", 64, 48, 12800, last=True, demuxer="mov"),
    )
    items = tuple(
        Item(f"i000000-s{n:04d}", f"s3://{w.media}/v/clip.mp4", f"{RUN}/segments/i000000-s{n:04d}.mp4", "video", seg)
        for n, seg in enumerate(segs)
    )
    assert w.run(w.manifest(items, source="/data/in/source.jpg")) == 0
    lines = w.lines()
    for item in items:
        line = lines[item.id]
        assert line.status is ItemStatus.NO_FACE and line.input == item.input  # testsrc has no face
        written = w.root / "runs" / JOB / "segments" / Path(item.output).name
        assert line.sha256 == hashlib.sha256(written.read_bytes()).hexdigest()
    assert set(Path(tempfile.gettempdir()).glob(".ffswarm-s3-*")) == copies_before


def test_a_missing_video_object_fails_its_segments_naming_the_url(world: World) -> None:
    w = world
    seg = Segment(0, 25, "25/1", 64, 48, 12800, last=True, demuxer="mov")
    gone = f"s3://{w.media}/v/gone.mp4"
    item = Item("i000000-s0000", gone, f"{RUN}/segments/i000000-s0000.mp4", "video", seg)
    assert w.run(w.manifest((item,), source="/data/in/source.jpg")) == 3
    assert w.lines()[item.id].reason == f"missing input {gone}"


def test_the_identity_step_reads_its_photos_from_the_store(world: World) -> None:
    """``python -m runner_image identity`` with s3:// sources: the same embedding as from the data root;
    a missing photo is the job's error naming its URL."""
    w = world
    output = f"{RUN}/identity.json"

    def identity(sources: tuple[str, ...], storage: StorageAccess | None) -> tuple[int, IdentityResult]:
        req = IdentityRequest(job=JOB, pack_dir="/data/models/default", sources=sources, output=output,
                              providers=("cpu",), storage=storage)  # fmt: skip
        (w.root / "runs" / JOB / "identity-request.json").write_text(req.to_json())
        argv = ["identity", "--request", f"{RUN}/identity-request.json", "--data-root", str(w.root)]
        code = main(argv, env={"FFSWARM_SECRETS_ROOT": str(w.secrets)})
        return code, IdentityResult.from_json((w.root / "runs" / JOB / "identity.json").read_text())

    storage = StorageAccess(endpoint_url=w.endpoint)
    code, remote = identity((f"s3://{w.media}/crowd/source.jpg",), storage)
    assert code == 0 and remote.answered
    code, local = identity(("/data/in/source.jpg",), None)
    assert code == 0 and remote.source_embedding == local.source_embedding
    gone = f"s3://{w.media}/crowd/gone.jpg"
    code, failed = identity((gone,), storage)
    assert code == 66 and failed.error == f"source photo {gone}: missing input {gone}"
    nowhere = f"s3://ffswarm-nowhere-{secrets.token_hex(4)}/a.jpg"
    code, failed = identity((nowhere,), storage)  # a whole bucket missing: still answered, naming it
    assert (
        code == 66 and failed.error is not None and f"bucket {nowhere[5:].split('/')[0]} does not exist" in failed.error
    )


def test_a_pairs_chunk_reads_each_persons_photos_from_the_store(world: World) -> None:
    w = world
    person = Identity((f"s3://{w.media}/crowd/source.jpg",))
    items = tuple(dataclasses.replace(i, identity="s000000") for i in s3_items(w, ["face_00.jpg", "face_02.jpg"]))
    manifest = w.manifest(items, source=None, schema=SCHEMA_IDENTITIES, identities={"s000000": person})
    assert w.run(manifest) == 0
    assert [r.status for r in w.lines().values()] == [ItemStatus.OK, ItemStatus.OK]


def test_an_object_committed_by_an_attempt_killed_before_its_result_line_is_recorded_not_redone(
    world: World,
) -> None:
    """The journal (results/<chunk>.a<n>.commits) names what the PUT committed: the next attempt finds the
    object as it was written, with this job's metadata, and records it as that item's commit."""
    w = world
    items = s3_items(w, ["face_00.jpg"])
    manifest = w.manifest(items)
    assert w.run(manifest) == 0
    etag = w.head(w.results, "out/face_00.png")["ETag"]
    (w.root / "runs" / JOB / "results" / "c0001.a1.jsonl").unlink()  # killed before its result line
    assert w.run(manifest, attempt=2) == 0
    line = w.lines(attempt=2)[items[0].id]
    assert line.status is ItemStatus.OK and not line.cached and line.output == items[0].output
    assert w.head(w.results, "out/face_00.png")["ETag"] == etag
