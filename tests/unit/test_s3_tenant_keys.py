"""A tenant's own object-store keys (``tenants.<t>.s3: {area, credentials_secret, credentials_file}``,
docs/storage.md#tenant-keys): the config's two forms and their refusals; a tenant's job mounts only its
own secret, its manifests name that secret's file, and the controller lists its objects with its keys,
while a CLI job keeps the cluster's; the API signs a tenant's links and streams its results.zip with its
keys. Against Ceph RGW, a real S3 server (the ``s3`` fixture, tests/fixtures/rgw_server.py): the bucket
``forbidden`` is the second test user's, used as the tenant's keys, and the cluster's user is refused
it, so an object there is reached only with the tenant's keys."""

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
from urllib.parse import parse_qs, urlsplit

import boto3  # type: ignore[import-untyped]
import pytest
import yaml
from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]

from contract.manifest import Manifest
from contract.results import ItemResult, ItemStatus
from contract.s3 import META_ATTEMPT, META_ITEM, META_JOB, META_SHA256
from controller.api.area import Area
from controller.config import Config, parse_config
from controller.errors import ConfigError, FfswarmError
from controller.job.plan import Chunk, Plan, PlannedItem, PlannedVideo, chunk_manifests
from controller.run import identity
from controller.run.jobs import manifest_settings, output_links, prepare, runner_settings, store_for
from controller.run.rundir import Control, RunDir
from controller.run.usecase import video_store
from controller.swarm.servicespec import chunk_service
from tests import builders
from tests.builders import make_config, serve_api
from tests.fixtures.rgw_server import REGION, Seeded

IMAGE = "sha256:" + "1" * 64
AREA = "s3://forbidden/acme/"
JOB = "party-abcdefgh"


@dataclass(frozen=True)
class Keys:
    key_id: str
    secret: str
    file: Path

    def client(self, endpoint: str) -> Any:
        path = BotoConfig(s3={"addressing_style": "path"})
        return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=self.key_id,
                            aws_secret_access_key=self.secret, config=path)  # fmt: skip


@pytest.fixture(scope="module")
def acme(s3: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """The tenant's own key (its file as the tenant's credentials_file): the user owning ``forbidden``,
    with two objects in its area of that bucket, which the cluster's user is refused."""
    other = s3.rgw.other
    keys = Keys(other.access_key_id, other.secret_access_key, tmp_path_factory.mktemp("acme-secrets") / "acme-s3")
    keys.file.write_text(f"AWS_ACCESS_KEY_ID={keys.key_id}\nAWS_SECRET_ACCESS_KEY={keys.secret}\n")
    for name in ("a.jpg", "b.jpg"):
        keys.client(s3.endpoint).put_object(Bucket="forbidden", Key=f"acme/in/{name}", Body=b"photo")
    return keys


# --- config -------------------------------------------------------------------------------------


def tenants_config(tmp_path: Path, tenants: dict[str, Any], cred_file: str = "/secrets/s3") -> Config:
    data = {"data_root": str(tmp_path), "tenants": {t: {"s3": v} for t, v in tenants.items()},
            "storage": {"s3": {"credentials_secret": "ffswarm-s3", "credentials_file": cred_file}}}  # fmt: skip
    return parse_config(tmp_path / "c.yaml", data)


def test_a_tenants_own_keys_serve_its_jobs_and_the_plain_area_form_keeps_the_clusters(tmp_path: Path) -> None:
    c = tenants_config(tmp_path, {
        "acme": {"area": "s3://media/acme/", "credentials_secret": "acme-s3", "credentials_file": "/run/acme"},
        "globex": {"area": "s3://media/globex/", "credentials_secret": "globex-s3"},
        "initech": "s3://media/initech/",
        "hooli": None,
    })  # fmt: skip
    acme, globex, initech = c.s3("acme"), c.s3("globex"), c.s3("initech")
    assert acme is not None and (acme.credentials_secret, str(acme.credentials_file)) == ("acme-s3", "/run/acme")
    assert str(c.tenants["acme"].s3) == "s3://media/acme/"
    assert globex is not None and (globex.credentials_secret, str(globex.credentials_file)) == (
        "globex-s3", "/run/secrets/globex-s3")  # fmt: skip
    assert initech is not None and (initech.credentials_secret, str(initech.credentials_file)) == (
        "ffswarm-s3", "/secrets/s3")  # fmt: skip
    cluster = c.s3(None)
    assert cluster is not None and cluster.credentials_secret == "ffswarm-s3"
    assert c.s3("hooli") is None and c.s3("nobody") is None  # no area: no keys at all


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"credentials_secret": "acme-s3"}, "tenants.acme.s3.area: is required"),
        ({"area": "s3://media/acme"}, "tenants.acme.s3.area: must end with '/'"),
        ({"area": AREA, "credentials": "x"}, "tenants.acme.s3.credentials: unknown key"),
        ({"area": AREA, "credentials_file": "/run/acme"}, "tenants.acme.s3.credentials_secret: is required with"),
        ({"area": AREA, "credentials_secret": "acme s3"}, "tenants.acme.s3.credentials_secret: "),
        ({"area": AREA, "credentials_secret": "acme-s3", "credentials_file": "run/acme"},
         "tenants.acme.s3.credentials_file: must be an absolute path"),
        ({"area": AREA, "credentials_secret": "ffswarm-s3"},
         "tenants.acme.s3.credentials_secret: 'ffswarm-s3' is storage.s3's secret"),
        ({"area": AREA, "credentials_secret": "acme-s3", "credentials_file": "/secrets/s3"},
         "tenants.acme.s3.credentials_file: is storage.s3's credentials_file"),
    ],
)  # fmt: skip
def test_a_bad_tenant_s3_mapping_is_refused_naming_the_field(tmp_path: Path, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        tenants_config(tmp_path, {"acme": value})
    assert words in str(e.value)


def test_two_tenants_never_share_a_credentials_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tenants\.globex\.s3\.credentials_secret: 'keys' is also tenant acme's"):
        tenants_config(tmp_path, {"acme": {"area": "s3://media/acme/", "credentials_secret": "keys"},
                                  "globex": {"area": "s3://media/globex/", "credentials_secret": "keys"}})  # fmt: skip


# --- a tenant's job and a CLI job -----------------------------------------------------------------


def config(tmp_path: Path, m: Seeded, keys: Keys) -> Config:
    root = builders.data_root(tmp_path, photos=("tenants/acme/faces/me.jpg", "faces/star.jpg"))
    data: dict[str, Any] = {
        "data_root": str(root),
        "runner_user": "10001:10001",
        "tenants": {"acme": {"s3": {"area": AREA, "credentials_secret": "acme-s3",
                                    "credentials_file": str(keys.file)}}},
        "storage": {"s3": {"endpoint_url": m.endpoint, "credentials_secret": "ffswarm-s3",
                           "credentials_file": str(m.cred_file), "link_ttl": "1h"}},
    }  # fmt: skip
    return parse_config(tmp_path / "ffswarm.yaml", data)


def job_file(tmp_path: Path, source: str, target: str) -> Path:
    f = tmp_path / "job.yaml"
    f.write_text(f"name: j\nsource: {source}\ntargets: ['{target}']\noutput: 's3://forbidden/acme/out/{{job}}/"
                 "{stem}.png'\nresources: {gpus: 0}\n")  # fmt: skip
    return f


def test_a_tenants_job_lists_with_its_keys_mounts_only_its_secret_and_its_manifests_name_it(
    tmp_path: Path, s3: Seeded, acme: Keys
) -> None:
    cfg = config(tmp_path, s3, acme)
    f = job_file(tmp_path, "tenants/acme/faces/me.jpg", "s3://forbidden/acme/in/*.jpg")
    (prepared,) = prepare(cfg, [f], new=False, tenant="acme")  # listed with acme's keys: the cluster's are denied
    assert [i.input for i in prepared.plan.items] == ["s3://forbidden/acme/in/a.jpg", "s3://forbidden/acme/in/b.jpg"]
    spec: dict[str, Any] = chunk_service(runner_settings(cfg, prepared, IMAGE), "c0000", 1).as_dict()
    assert [(s["name"], s["file"]) for s in spec["secrets"]] == [("acme-s3", "/run/secrets/acme-s3")]
    assert "ffswarm-s3" not in json.dumps(spec)
    for m in chunk_manifests(prepared.plan, manifest_settings(cfg, prepared)).values():
        text = m.to_json()
        storage = Manifest.from_json(text).storage
        assert storage is not None and storage.credentials_file == "/run/secrets/acme-s3"
        assert acme.secret not in text and acme.key_id not in text
    assert prepared.resolved is not None  # the identity step's request reads its objects with the same secret
    request = identity.request_for(cfg, prepared.spec, prepared.resolved, prepared.job_id, "acme")
    assert request.storage is not None and request.storage.credentials_file == "/run/secrets/acme-s3"


def test_a_tenants_store_reads_only_its_credentials_file(tmp_path: Path, s3: Seeded, acme: Keys) -> None:
    cfg = config(tmp_path, s3, acme)
    f = job_file(tmp_path, "tenants/acme/faces/me.jpg", "s3://forbidden/acme/in/*.jpg")
    spec = prepare(cfg, [f], new=False, tenant="acme")[0].spec
    gone = tmp_path / "acme-s3-gone"
    moved = acme.file.rename(gone)
    try:
        with pytest.raises(FfswarmError) as e:
            store_for(cfg, spec, "acme")
    finally:
        moved.rename(acme.file)
    assert f"tenants.acme.s3.credentials_file {acme.file} cannot be read" in str(e.value)
    assert store_for(cfg, spec, None) is not None  # the cluster's file is there all along
    video = Plan("j", (), (), (PlannedVideo("v0000", f"{AREA}in/v.mp4", f"{AREA}out/v.mp4"),))
    joins = video_store(cfg, video, "acme")  # the controller joins a tenant's video with its keys
    assert joins is not None and joins.settings.credentials_file == acme.file
    link = output_links(cfg, "acme")
    assert link is not None
    signed = link("s3://forbidden/acme/out/j/a.png")
    assert signed is not None and credential(signed).startswith(acme.key_id + "/")


def test_a_cli_job_keeps_the_clusters_keys_and_secret(tmp_path: Path, s3: Seeded, acme: Keys) -> None:
    cfg = config(tmp_path, s3, acme)
    with pytest.raises(FfswarmError, match=r"access denied"):  # the cluster's user may not use this bucket
        prepare(cfg, [job_file(tmp_path, "faces/star.jpg", "s3://forbidden/acme/in/*.jpg")], new=False)
    (prepared,) = prepare(cfg, [job_file(tmp_path, "faces/star.jpg", "s3://media/crowd/*.jpg")], new=False)
    spec: dict[str, Any] = chunk_service(runner_settings(cfg, prepared, IMAGE), "c0000", 1).as_dict()
    assert [(s["name"], s["file"]) for s in spec["secrets"]] == [("ffswarm-s3", "/run/secrets/ffswarm-s3")]
    assert "acme-s3" not in json.dumps(spec)
    (m, *_) = chunk_manifests(prepared.plan, manifest_settings(cfg, prepared)).values()
    assert m.storage is not None and m.storage.credentials_file == "/run/secrets/ffswarm-s3"
    link = output_links(cfg)
    assert link is not None
    signed = link("s3://media/out/a.png")
    assert signed is not None and credential(signed).startswith(s3.creds.access_key_id + "/")


def credential(link: str) -> str:
    """The access key id and scope a presigned link was signed with (X-Amz-Credential)."""
    return parse_qs(urlsplit(link).query)["X-Amz-Credential"][0]


# --- the API ----------------------------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path, s3: Seeded, acme: Keys) -> Iterator[builders.Env]:
    config, signing = make_config(tmp_path)
    data = yaml.safe_load((tmp_path / "ffswarm.yaml").read_text())
    data["tenants"]["acme"]["s3"] = {"area": AREA, "credentials_secret": "acme-s3", "credentials_file": str(acme.file)}
    data["storage"] = {"s3": {"endpoint_url": s3.endpoint, "credentials_secret": "ffswarm-s3",
                              "credentials_file": str(s3.cred_file), "link_ttl": "1h"}}  # fmt: skip
    config = parse_config(tmp_path / "ffswarm.yaml", data)
    builders.beat(config)
    for url in serve_api(config):
        yield builders.Env(config, config.data_root, url, signing)


def finished_run(root: Path, outputs: list[str], bodies: list[bytes]) -> None:
    """A finished job of acme's: item n planned with outputs[n] and committed with bodies[n]."""
    area = Area(root, "acme")
    area.ensure(None)
    area.write_record(JOB, uploads=False)
    items = tuple(PlannedItem(f"i{n:06d}", f"{AREA}in/{n}.jpg", o, "image") for n, o in enumerate(outputs))
    rd = RunDir(root, JOB)
    rd.create(b"name: x\n", Plan(JOB, items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(2), "sha256:x")
    now = time.time()
    lines = [ItemResult(i.id, ItemStatus.OK, 1, i.input, i.output, started=now, finished=now, size=len(b),
                        sha256=hashlib.sha256(b).hexdigest()).to_line()
             for i, b in zip(items, bodies, strict=True)]  # fmt: skip
    (rd.path / "results" / "c0000.jsonl").write_text("".join(lines))
    rd.write_report(
        {"job": JOB, "items": {i.id: {"input": i.input, "output": i.output, "status": "ok"} for i in items}}
    )


def test_the_api_signs_a_tenants_links_and_streams_its_objects_with_its_own_keys(
    api: builders.Env, s3: Seeded, acme: Keys
) -> None:
    root = api.root
    bodies = [b"swapped 0 " * 200, b"swapped 1 " * 200]
    outputs = [f"{AREA}out/{JOB}/0.jpg", f"{AREA}out/{JOB}/1.jpg"]
    finished_run(root, outputs, bodies)
    tenant = acme.client(s3.endpoint)
    for n, (out, b) in enumerate(zip(outputs, bodies, strict=True)):
        meta = {META_JOB: JOB, META_ITEM: f"i{n:06d}", META_ATTEMPT: "1", META_SHA256: hashlib.sha256(b).hexdigest()}
        tenant.put_object(Bucket="forbidden", Key=out.removeprefix("s3://forbidden/"), Body=b, Metadata=meta)
    with api.client() as c:
        status = c.get(f"/v1/jobs/{JOB}")
        report = c.get(f"/v1/jobs/{JOB}/report")
        zipped = c.get(f"/v1/jobs/{JOB}/results.zip")
    assert status.status_code == report.status_code == zipped.status_code == 200, (status.text, report.text)
    links = [*status.json()["output_urls"].values(), *(e["output_url"] for e in report.json()["items"].values())]
    assert len(links) == 4 and all(credential(link).startswith(acme.key_id + "/") for link in links)
    for text in (status.text, report.text):
        assert s3.creds.access_key_id not in text and acme.secret not in text
    with zipfile.ZipFile(io.BytesIO(zipped.content)) as zf:  # the cluster's user is denied this bucket
        assert zf.read(f"out/{JOB}/0.jpg") == bodies[0] and zf.read(f"out/{JOB}/1.jpg") == bodies[1]
        assert "ffswarm-left-out.json" not in zf.namelist()
