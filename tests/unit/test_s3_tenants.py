"""A tenant's part of the object store (tenants.<t>.s3, issue 19): the config that gives it, the API
refusing every s3:// URL outside it, presigned output links, and results.zip streaming committed
objects — over real HTTP on loopback, against Ceph RGW, a real S3 server (the ``s3`` fixture,
tests/fixtures/rgw_server.py): the presigned link is checked by the server when downloaded."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3  # type: ignore[import-untyped]
import httpx
import pytest
import yaml
from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]

from contract.results import ItemResult, ItemStatus
from contract.s3 import META_ATTEMPT, META_ITEM, META_JOB, META_SHA256
from controller.api.area import Area
from controller.config import parse_config
from controller.errors import ConfigError
from controller.job.files import parse_job_text
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.rundir import Control, RunDir
from tests.builders import JPEG, Env, beat, make_config, serve_api
from tests.fixtures.rgw_server import REGION, Seeded

AREA = "s3://media/acme/"
JOB = "party-abcdefgh"


# --- config -------------------------------------------------------------------------------------

STORAGE = {"s3": {"credentials_secret": "ffswarm-s3", "credentials_file": "/secrets/s3"}}


def tenants_config(tmp_path: Path, areas: dict[str, Any], storage: bool = True):  # type: ignore[no-untyped-def]
    data: dict[str, Any] = {"data_root": str(tmp_path), "tenants": {t: {"s3": a} for t, a in areas.items()}}
    if storage:
        data["storage"] = STORAGE
    return parse_config(tmp_path / "c.yaml", data)


def test_a_tenants_area_is_read_and_areas_that_only_share_letters_do_not_overlap(tmp_path: Path) -> None:
    c = tenants_config(tmp_path, {"acme": AREA, "evil": "s3://media/acme-evil/", "whole": "s3://bulk/"})
    acme = c.tenants["acme"].s3
    assert acme is not None and (acme.tenant, acme.bucket, acme.prefix) == ("acme", "media", "acme/")
    assert str(c.tenants["whole"].s3) == "s3://bulk/"
    assert tenants_config(tmp_path, {"acme": None}).tenants["acme"].s3 is None


def test_an_area_without_storage_s3_is_a_config_error_naming_the_tenants_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tenants\.acme\.s3: needs object storage: storage\.s3 is not configured"):
        tenants_config(tmp_path, {"acme": AREA}, storage=False)


@pytest.mark.parametrize(("first", "second"), [(AREA, "s3://media/acme/sub/"), ("s3://media/acme/sub/", AREA),
                                               (AREA, AREA), ("s3://media/", AREA)])  # fmt: skip
def test_overlapping_areas_are_refused_naming_both_tenants(tmp_path: Path, first: str, second: str) -> None:
    with pytest.raises(ConfigError) as e:
        tenants_config(tmp_path, {"acme": first, "globex": second})
    assert f"tenants.globex.s3: {second} overlaps tenant acme's area {first}" in str(e.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("s3://media/acme", "must end with '/'"),
        ("s3://media/ac*/", "has a glob character"),
        ("s3://media/a?me/", "has a glob character"),
        ("s3://Media/acme/", "bucket 'Media' may hold only"),
        ("s3://ab/", "bucket 'ab' must be 3 to 63 characters"),
        ("s3://media//", "empty path segment"),
        ("s3://media/../", "'..' segment"),
        ("/data/acme/", "must be an s3://BUCKET/PREFIX/ URL"),
        (["s3://media/acme/"], "must be an s3://BUCKET/PREFIX/ URL"),
    ],
)
def test_a_bad_area_is_refused_naming_the_field(tmp_path: Path, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        tenants_config(tmp_path, {"acme": value})
    assert "tenants.acme.s3: " in str(e.value) and words in str(e.value)


# --- the API over loopback, with the store ----------------------------------------------------------


def client(m: Seeded) -> Any:
    """The runner's way in (the test user's keys)."""
    return boto3.client("s3", endpoint_url=m.endpoint, region_name=REGION, aws_access_key_id=m.creds.access_key_id,
                        aws_secret_access_key=m.creds.secret_access_key,
                        config=BotoConfig(s3={"addressing_style": "path"}))  # fmt: skip


@dataclass
class S3Env(Env):
    server: Seeded
    s3: Any

    def put(self, key: str, body: bytes, meta: dict[str, str] | None = None) -> None:
        self.s3.put_object(Bucket="media", Key=key, Body=body, Metadata=meta or {})

    def commit(self, key: str, body: bytes, job: str = JOB, item: str = "i000000") -> str:
        """An object as a runner commits it: its job, item, attempt and sha256 in its metadata."""
        digest = hashlib.sha256(body).hexdigest()
        self.put(key, body, {META_JOB: job, META_ITEM: item, META_ATTEMPT: "1", META_SHA256: digest})
        return digest

    def secrets(self) -> tuple[str, str]:
        return self.server.creds.secret_access_key, self.server.creds.access_key_id


@pytest.fixture
def env(tmp_path: Path, s3: Seeded) -> Iterator[S3Env]:
    _, signing = make_config(tmp_path)  # the data root, the pack, the API's secrets and two tenants, acme and globex
    data = yaml.safe_load((tmp_path / "ffswarm.yaml").read_text())
    data["tenants"]["acme"]["s3"] = AREA
    data["storage"] = {"s3": {"endpoint_url": s3.endpoint, "credentials_secret": "ffswarm-s3",
                              "credentials_file": str(s3.cred_file), "link_ttl": "1h"}}  # fmt: skip
    config = parse_config(tmp_path / "ffswarm.yaml", data)
    beat(config)
    for url in serve_api(config):
        yield S3Env(config, config.data_root, url, signing, s3, client(s3))


def post(env: S3Env, tenant: str = "acme", **fields: Any) -> httpx.Response:
    with env.client(tenant) as c:
        c.get("/v1/jobs")  # the area is made on first use
        (env.area(tenant) / "faces").mkdir(exist_ok=True)
        (env.area(tenant) / "faces" / "me.jpg").write_bytes(JPEG)
        photo = {} if "pairs" in fields else {"source": "faces/me.jpg"}
        return c.post("/v1/jobs", json={**photo, "resources": {"gpus": 0}, **fields})


def test_a_job_of_objects_in_the_area_is_accepted_and_its_outputs_default_into_the_area(env: S3Env) -> None:
    env.put("acme/in/a.jpg", JPEG)
    env.put("acme/in/b.jpg", JPEG)
    r = post(env, name="party", targets=["s3://media/acme/in/*.jpg"])
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    spec = parse_job_text(env.inbox_file(job).read_text(), "inbox")
    assert spec.targets == ("s3://media/acme/in/*.jpg",) and spec.source == ("tenants/acme/faces/me.jpg",)
    assert spec.output == f"s3://media/acme/out/{job}/{{stem}}{{ext}}"
    # a target on the volume among them: the default output stays on the volume
    r = post(env, targets=["s3://media/acme/in/a.jpg", "faces/me.jpg"])
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert parse_job_text(env.inbox_file(job).read_text(), "inbox").output == f"tenants/acme/out/{job}/{{stem}}{{ext}}"


@pytest.mark.parametrize(
    ("fields", "field", "url"),
    [
        ({"targets": ["s3://media/other/x.jpg"]}, "targets", "s3://media/other/x.jpg"),
        ({"targets": ["s3://media/acme-evil/x.jpg"]}, "targets", "s3://media/acme-evil/x.jpg"),
        ({"targets": ["s3://media/acme*/x.jpg"]}, "targets", "s3://media/acme*/x.jpg"),
        ({"targets": ["s3://bulk/acme/x.jpg"]}, "targets", "s3://bulk/acme/x.jpg"),
        ({"targets": ["s3://media/acme/in/a.jpg"], "source": "s3://media/other/me.jpg"}, "source",
         "s3://media/other/me.jpg"),
        ({"targets": ["s3://media/acme/in/a.jpg"], "output": "s3://media/other/{stem}{ext}"}, "output",
         "s3://media/other/{stem}{ext}"),
        ({"targets": ["s3://media/acme/in/a.jpg"], "output": "s3://media/acme{stem}{ext}"}, "output",
         "s3://media/acme{stem}{ext}"),
        ({"pairs": [{"source": "faces/me.jpg", "target": "s3://media/other/x.jpg"}]}, "pairs[0].target",
         "s3://media/other/x.jpg"),
    ],
)  # fmt: skip
def test_an_object_outside_the_area_is_422_naming_the_field(
    env: S3Env, fields: dict[str, Any], field: str, url: str
) -> None:
    env.put("acme/in/a.jpg", JPEG)
    env.put("other/x.jpg", JPEG)  # it exists: the refusal is the area's, not a missing object's
    env.put("acme-evil/x.jpg", JPEG)
    r = post(env, **fields)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"].startswith(field) and error["code"] == "invalid_job"
    assert f"{url} is outside tenant acme's storage area {AREA}" in error["message"]
    for secret in (*env.secrets(), str(env.root)):
        assert secret not in r.text
    assert not list((env.root / "inbox").glob("*.yaml"))


def test_a_tenant_without_an_area_may_name_no_object_at_all(env: S3Env) -> None:
    env.put("acme/in/a.jpg", JPEG)
    r = post(env, "globex", targets=["s3://media/acme/in/a.jpg"])
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("targets")
    assert "s3:// paths are not accepted in API jobs of a tenant without a storage area" in r.json()["error"]["message"]
    for secret in (*env.secrets(), str(env.root)):
        assert secret not in r.text


# --- a finished job's objects: links and results.zip --------------------------------------------


def finished_run(env: S3Env, outputs: list[str]) -> None:
    """A run folder as a finished job of acme's leaves it: item n planned with outputs[n], committed
    with the size and sha256 of ``body(n)``, and a report.json whose links were signed long ago."""
    area = Area(env.root, "acme")
    area.ensure(None)
    area.write_record(JOB, uploads=False)
    items = tuple(PlannedItem(f"i{n:06d}", f"s3://media/acme/in/{n}.jpg", o, "image") for n, o in enumerate(outputs))
    rd = RunDir(env.root, JOB)
    rd.create(b"name: x\n", Plan(JOB, items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(2), "sha256:x")
    lines, now = [], time.time()
    for n, item in enumerate(items):
        lines.append(ItemResult(item.id, ItemStatus.OK, 1, item.input, item.output, started=now, finished=now,
                                size=len(body(n)), sha256=hashlib.sha256(body(n)).hexdigest()).to_line())  # fmt: skip
    (rd.path / "results" / "c0000.jsonl").write_text("".join(lines))
    entries = {i.id: {"input": i.input, "output": i.output, "status": "ok", "reason": None, "chunk": "c0000",
                      "output_url": "https://stale.example/signed-when-it-ended"} for i in items}  # fmt: skip
    rd.write_report({"job": JOB, "items": entries})


def body(n: int) -> bytes:
    return f"swapped photo {n} ".encode() * 300


def test_status_and_report_link_only_the_objects_in_the_area_and_a_link_downloads(env: S3Env) -> None:
    outputs = [f"s3://media/acme/out/{JOB}/0.jpg", f"s3://media/acme/out/{JOB}/1.jpg", "s3://media/other/2.jpg",
               "s3://media/acme-evil/3.jpg"]  # fmt: skip
    finished_run(env, outputs)
    for n, url in enumerate(outputs):
        env.commit(url.removeprefix("s3://media/"), body(n), item=f"i{n:06d}")
    with env.client() as c:
        status = c.get(f"/v1/jobs/{JOB}")
        report = c.get(f"/v1/jobs/{JOB}/report")
        assert c.get(f"/v1/jobs/{JOB}", headers={"Authorization": "Bearer globex-secret-key"}).status_code == 404
    assert status.status_code == 200 and report.status_code == 200, (status.text, report.text)
    links = status.json()["output_urls"]
    assert sorted(links) == ["i000000", "i000001"]
    items = report.json()["items"]
    for n in (0, 1):
        link = items[f"i{n:06d}"]["output_url"]
        assert link.startswith(f"{env.server.endpoint}/media/acme/out/{JOB}/{n}.jpg?") and "X-Amz-Signature=" in link
        assert urlsplit(link).path == urlsplit(links[f"i{n:06d}"]).path
    for n in (2, 3):  # recorded outside the area: the stale link of report.json is taken away too
        assert "output_url" not in items[f"i{n:06d}"] and items[f"i{n:06d}"]["output"] == outputs[n]
    for text in (status.text, report.text):  # a link names the access key id (X-Amz-Credential), never the secret
        assert env.server.creds.secret_access_key not in text and str(env.root) not in text
    got = httpx.get(links["i000001"], timeout=10)
    assert got.status_code == 200 and got.content == body(1)


def test_results_zip_streams_committed_objects_and_lists_what_it_left_out(env: S3Env) -> None:
    out = f"s3://media/acme/out/{JOB}"
    outputs = [f"{out}/0.jpg", f"{out}/sub/1.jpg", f"{out}/2.jpg", f"{out}/3.jpg", f"{out}/4.jpg", f"{out}/5.jpg",
               "s3://media/other/6.jpg"]  # fmt: skip
    finished_run(env, outputs)
    env.commit(f"acme/out/{JOB}/0.jpg", body(0), item="i000000")
    env.commit(f"acme/out/{JOB}/sub/1.jpg", body(1), item="i000001")
    env.commit(f"acme/out/{JOB}/2.jpg", body(2), job="other-aaaaaaaa", item="i000002")  # replaced by another job
    env.commit(f"acme/out/{JOB}/3.jpg", b"x" + body(3)[1:], item="i000003")  # rewritten: its own sha256 now
    same = {META_JOB: JOB, META_ITEM: "i000004", META_ATTEMPT: "1", META_SHA256: hashlib.sha256(body(4)).hexdigest()}
    env.put(f"acme/out/{JOB}/4.jpg", b"x" + body(4)[1:], same)  # the metadata kept, the bytes not
    # 5.jpg: never written (gone); 6.jpg: outside the area, whatever its metadata says
    env.commit("other/6.jpg", body(6), item="i000006")
    with env.client() as c:
        r = c.get(f"/v1/jobs/{JOB}/results.zip")
        signed = c.get(f"/v1/jobs/{JOB}").json()["results_url"]
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    data = r.content
    with env.client(tenant=None) as anon, zipfile.ZipFile(io.BytesIO(anon.get(signed).content)) as zf:
        assert zf.read(f"out/{JOB}/sub/1.jpg") == body(1)  # a signed link, no token: the same objects
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        assert zf.read(f"out/{JOB}/0.jpg") == body(0) and zf.read(f"out/{JOB}/sub/1.jpg") == body(1)
        assert sorted(names) == sorted([f"out/{JOB}/0.jpg", f"out/{JOB}/sub/1.jpg", f"out/{JOB}/4.jpg",
                                        "ffswarm-left-out.json"])  # fmt: skip
        left = json.loads(zf.read("ffswarm-left-out.json"))
    assert left["job"] == JOB
    reasons = {e["item"]: e for e in left["left_out"]}
    assert sorted(reasons) == ["i000002", "i000003", "i000004", "i000005"]
    assert "not written by this job" in reasons["i000002"]["reason"]
    assert "its sha256 is not the one recorded" in reasons["i000003"]["reason"]
    # same metadata and size, other bytes: found only while sent, so its entry is there and named
    assert reasons["i000004"]["entry"] == f"out/{JOB}/4.jpg"
    assert "do not match the recorded sha256" in reasons["i000004"]["reason"]
    assert "no longer exists" in reasons["i000005"]["reason"]
    assert all(e["object"] == outputs[int(k[1:])] for k, e in reasons.items())
    assert body(2) not in data and body(6) not in data and b"s3://media/other" not in data
    for secret in env.secrets():
        assert secret.encode() not in data


def test_results_zip_leaves_out_an_object_whose_size_changed(env: S3Env) -> None:
    finished_run(env, [f"s3://media/acme/out/{JOB}/0.jpg"])
    same = {META_JOB: JOB, META_ITEM: "i000000", META_ATTEMPT: "1", META_SHA256: hashlib.sha256(body(0)).hexdigest()}
    env.put(f"acme/out/{JOB}/0.jpg", body(0) + b"appended", same)
    with env.client() as c:
        data = c.get(f"/v1/jobs/{JOB}/results.zip").content
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.namelist() == ["ffswarm-left-out.json"]
        (entry,) = json.loads(zf.read("ffswarm-left-out.json"))["left_out"]
    assert entry["item"] == "i000000" and "its size is not the one recorded" in entry["reason"]
