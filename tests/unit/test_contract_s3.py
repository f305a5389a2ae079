"""The manifest contract for s3:// items (issue "Object storage"): what the controller may write and the
runner reads — objects as inputs, outputs and photos, and the ``storage`` block saying how to reach them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract.errors import ManifestError
from contract.identity import IdentityRequest
from contract.identity_table import Identity
from contract.manifest import SCHEMA_IDENTITIES, Item, Manifest, Segment
from contract.s3 import StorageAccess, is_s3

STORAGE = StorageAccess(endpoint_url="http://minio.internal:9000", credentials_file="/run/secrets/ffswarm-s3")


def manifest(items: tuple[Item, ...], **kw: Any) -> Manifest:
    fields: dict[str, Any] = dict(
        job="j1",
        chunk="c0001",
        run_dir="/data/runs/j1",
        pack_dir="/data/models/default",
        source=("s3://media/people/ann.jpg",),
        items=items,
        storage=STORAGE,
    )
    fields.update(kw)
    return Manifest(**fields)


ITEMS = (
    Item("i000000", "s3://media/crowd/a.jpg", "s3://results/out/a.png"),
    Item("i000001", "/data/in/b.jpg", "s3://results/out/b.png"),
    Item("i000002", "s3://media/crowd/c.jpg", "/data/out/c.png"),
)


def test_a_manifest_with_s3_items_round_trips_with_its_storage_block() -> None:
    m = manifest(ITEMS)
    data = json.loads(m.to_json())
    assert data["storage"] == {
        "endpoint_url": "http://minio.internal:9000",
        "region": "us-east-1",
        "addressing": "path",
        "credentials_file": "/run/secrets/ffswarm-s3",
    }
    assert [i["input"] for i in data["items"]] == ["s3://media/crowd/a.jpg", "/data/in/b.jpg", "s3://media/crowd/c.jpg"]
    back = Manifest.from_json(m.to_json())
    assert back == m and back.storage == STORAGE
    assert back.s3_urls() == [
        "s3://media/people/ann.jpg",
        "s3://media/crowd/a.jpg",
        "s3://results/out/a.png",
        "s3://results/out/b.png",
        "s3://media/crowd/c.jpg",
    ]


def test_a_manifest_without_objects_has_no_storage_key_as_older_runners_know_it() -> None:
    m = manifest((Item("i000000", "/data/in/a.jpg", "/data/out/a.png"),), source=("/data/in/s.jpg",), storage=None)
    assert "storage" not in json.loads(m.to_json())
    assert Manifest.from_json(m.to_json()).storage is None


def test_the_manifest_holds_the_credentials_file_path_never_a_secret() -> None:
    text = manifest(ITEMS).to_json()
    assert "/run/secrets/ffswarm-s3" in text
    for word in ("AWS_", "secret_access", "access_key", "session_token", "password"):
        assert word.lower() not in text.lower()


@pytest.mark.parametrize(
    "where",
    ["input", "output", "source", "identity photo"],
)
def test_an_object_without_the_storage_block_is_refused(where: str) -> None:
    plain = Item("i000000", "/data/in/a.jpg", "/data/out/a.png")
    obj = "s3://media/x/a.jpg"
    with pytest.raises(ManifestError, match=r"s3://media/x/a\.jpg: an s3:// object needs the manifest's storage"):
        if where == "input":
            manifest((Item("i000000", obj, "/data/out/a.png"),), source=("/data/in/s.jpg",), storage=None)
        elif where == "output":
            manifest((Item("i000000", "/data/in/a.jpg", obj),), source=("/data/in/s.jpg",), storage=None)
        elif where == "source":
            manifest((plain,), source=(obj,), storage=None)
        else:
            item = Item("i000000", "/data/in/a.jpg", "/data/out/a.png", identity="s000000")
            manifest((item,), source=(), storage=None, schema=SCHEMA_IDENTITIES,
                     identities={"s000000": Identity((obj,))})  # fmt: skip
    # and the same read from JSON
    data = json.loads(manifest(ITEMS).to_json())
    del data["storage"]
    with pytest.raises(ManifestError, match="needs the manifest's storage block"):
        Manifest.from_dict(data)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://media/crowd/*.jpg", "is a glob"),
        ("s3://media/crowd/**/a.jpg", "is a glob"),
        ("s3://media/crowd/img_?.jpg", "is a glob"),
        ("s3://Media/a.jpg", "may hold only a-z"),
        ("s3://media", "names a bucket but no key"),
        ("s3://media/a/../b.jpg", r"'\.' or '\.\.' segment"),
        ("s3://media/folder/", "names a folder, not an object"),
    ],
)
def test_a_glob_or_a_bad_url_is_refused_naming_the_item(url: str, says: str) -> None:
    with pytest.raises(ManifestError, match=f"item i000000: input: .*{says}"):
        manifest((Item("i000000", url, "s3://results/a.png"),))


def test_a_video_segment_may_read_an_object_but_writes_into_the_run_folder() -> None:
    seg = Segment(start_frame=0, frame_count=10, fps="25/1", width=64, height=64, timescale=12800)
    ok = Item("i000000", "s3://media/v/clip.mp4", "/data/runs/j1/segments/i000000.mkv", kind="video", segment=seg)
    assert Manifest.from_json(manifest((ok,)).to_json()).items == (ok,)
    with pytest.raises(ManifestError, match="item i000001: output: 's3://results/v.mkv' is not a path under /data"):
        Item("i000001", "s3://media/v/clip.mp4", "s3://results/v.mkv", kind="video", segment=seg)


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ("nope", "storage: must be an object"),
        ({"endpoint_url": "http://u:p@minio:9000"}, "storage.endpoint_url"),
        ({"endpoint_url": "http://minio:9000/path"}, "storage.endpoint_url"),
        ({"endpoint_url": "ftp://minio"}, "storage.endpoint_url"),
        ({"endpoint_url": 9000}, "storage.endpoint_url: must be a string"),
        ({"region": "US EAST"}, "storage.region"),
        ({"addressing": "auto"}, "storage.addressing: must be one of path, virtual"),
        ({"credentials_file": "/etc/passwd"}, "storage.credentials_file: must be a normalised file path under"),
        ({"credentials_file": "/run/secrets/../../etc/shadow"}, "storage.credentials_file"),
        ({"credentials_file": "/run/secrets/"}, "storage.credentials_file"),
        ({"aws_secret_access_key": "x"}, "storage.aws_secret_access_key: unknown field"),
        ({"conditional_complete": "yes"}, "storage.conditional_complete: must be true or false"),
    ],
)
def test_a_bad_storage_block_is_refused_naming_the_field(block: Any, field: str) -> None:
    data = json.loads(manifest(ITEMS).to_json())
    data["storage"] = block
    with pytest.raises(ManifestError, match=field.replace(".", r"\.").replace("(", r"\(")) as e:
        Manifest.from_dict(data)
    assert "u:p" not in str(e.value)  # a credential in the endpoint is never echoed


def test_storage_access_defaults_and_virtual_addressing() -> None:
    assert StorageAccess().to_dict() == {
        "region": "us-east-1",
        "addressing": "path",
        "credentials_file": "/run/secrets/ffswarm-s3",
    }
    virtual = StorageAccess.from_dict({"addressing": "virtual", "region": "eu-west-1", "endpoint_url": None})
    assert virtual == StorageAccess(None, "eu-west-1", "virtual")
    in_parts = StorageAccess(conditional_complete=True)  # said only when the controller found it holds
    assert (
        in_parts.to_dict()["conditional_complete"] is True and StorageAccess.from_dict(in_parts.to_dict()) == in_parts
    )
    assert is_s3("s3://a/b") and not is_s3("/data/s3://x") and not is_s3(None)


def test_an_identity_request_reads_photos_from_the_store_with_its_storage_block() -> None:
    req = IdentityRequest(
        job="j1",
        pack_dir="/data/models/default",
        sources=("s3://media/people/ann.jpg", "/data/in/ann2.jpg"),
        output="/data/runs/j1/identity.json",
        reference="s3://media/people/ref.jpg",
        storage=STORAGE,
    )
    back = IdentityRequest.from_json(req.to_json())
    assert back == req and back.storage == STORAGE
    data = json.loads(req.to_json())
    del data["storage"]
    with pytest.raises(ManifestError, match="an s3:// photo needs the request's storage block"):
        IdentityRequest.from_json(json.dumps(data))
    data["storage"] = {"addressing": "sideways"}
    with pytest.raises(ManifestError, match="storage.addressing"):
        IdentityRequest.from_json(json.dumps(data))
    with pytest.raises(ManifestError, match="source: .*is a glob"):
        IdentityRequest(job="j1", pack_dir="/data/models/default", sources=("s3://media/p/*.jpg",),
                        output="/data/runs/j1/identity.json", storage=STORAGE)  # fmt: skip


def test_the_commit_rule_both_sides_follow() -> None:
    from contract.s3 import CACHED, REFUSED, commit_condition

    assert commit_condition(None, overwrite=False) == {"IfNoneMatch": "*"}  # a new key: only if still absent
    assert commit_condition(("e1", True, True), overwrite=False) == CACHED  # ours, same bytes: nothing sent
    assert commit_condition(("e1", True, False), overwrite=False) == {"IfMatch": "e1"}  # ours, other bytes
    assert commit_condition(("e1", False, True), overwrite=False) == REFUSED  # another job's object
    assert commit_condition(("e1", False, False), overwrite=True) == {"IfMatch": "e1"}  # … replaced if asked
