"""`ffswarm api` over real HTTP on loopback: auth, submitting (JSON, uploads, ZIPs), refusals."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import yaml

from contract.layout import run_rel, tenant_key
from controller.api.submit import quick, rebased
from controller.job.fence import MAX_OUTPUT_MOUNTS
from controller.job.files import parse_job, parse_job_text
from tests.builders import JPEG, JWT_SECRET, MP4, PNG, Env, api_env, leftovers, zip_bytes


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"upload": "64k", "jobs_queued": 3})


def token(sub: str = "acme", exp: float | None = None, alg: str = "HS256", key: bytes = JWT_SECRET) -> str:
    """A JWT naming the tenant ``sub`` in the tenant claim (the API's default, ffswarm_tenant)."""
    now = int(time.time())
    claims = {"sub": "user-1", "ffswarm_tenant": sub, "aud": "ffswarm", "iat": now,
              "exp": int(exp if exp is not None else now + 600)}  # fmt: skip
    return jwt.encode(claims, key, algorithm=alg)


def upload(env: Env, files: list[tuple[str, tuple[str, bytes]]], job: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    data = {"job": json.dumps(job)} if job is not None else None
    with env.client() as c:
        return c.post("/v1/jobs", files=files, data=data)


def test_no_token_a_bad_key_a_bad_or_expired_jwt_and_a_wrong_algorithm_are_401(env: Env) -> None:
    assert env.client(tenant=None).get("/v1/jobs").status_code == 401
    for bad in ("not-a-key", token(exp=time.time() - 5), token(key=b"another-secret-entirely-0123456789"),
                token(alg="HS512"), token(sub="nobody")):  # fmt: skip
        r = env.client(token=bad).get("/v1/jobs")
        assert r.status_code == 401, bad
        assert r.json()["error"]["code"] == "unauthorized" and bad not in r.text
    assert "expired" in env.client(token=token(exp=time.time() - 5)).get("/v1/jobs").json()["error"]["message"]
    none_alg = jwt.encode({"sub": "acme", "aud": "ffswarm", "exp": int(time.time()) + 60}, None, algorithm="none")
    assert env.client(token=none_alg).get("/v1/jobs").status_code == 401
    assert env.client(token=token()).get("/v1/jobs").status_code == 200  # a good JWT
    assert env.client("globex").get("/v1/jobs").json() == {"jobs": [], "next_cursor": None}


def test_a_json_job_is_accepted_and_its_inbox_file_is_a_valid_job_file(env: Env) -> None:
    area = env.area()
    with env.client() as c:
        c.get("/v1/jobs")  # the area is made on first use
        (area / "faces").mkdir()
        (area / "faces" / "me.jpg").write_bytes(JPEG)
        (area / "crowd").mkdir()
        (area / "crowd" / "a.jpg").write_bytes(JPEG)
        r = c.post("/v1/jobs", json={"name": "party", "source": "faces/me.jpg", "targets": ["crowd/*.jpg"],
                                     "resources": {"gpus": 0}})  # fmt: skip
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    # the id carries the tenant's key: its run folder will be in the tenant's folder of runs
    assert re.fullmatch(rf"party-{tenant_key('acme')}[a-z2-7]{{8}}", job), job
    assert run_rel(job).as_posix() == f"runs/.tenants/{tenant_key('acme')}/{job}"
    assert r.json() == {"id": job, "status_url": f"/v1/jobs/{job}", "events_url": f"/v1/jobs/{job}/events"}
    text = env.inbox_file(job).read_text()
    spec = parse_job_text(text, "inbox")
    assert spec.name == job and spec.source == ("tenants/acme/faces/me.jpg",)
    assert spec.targets == ("tenants/acme/crowd/*.jpg",) and spec.output == f"tenants/acme/out/{job}/{{stem}}{{ext}}"
    assert json.loads((env.root / "tenants" / ".jobs" / "acme" / f"{job}.json").read_text())["tenant"] == "acme"
    with env.client() as c:
        assert c.get(f"/v1/jobs/{job}").json()["phase"] == "queued"
        assert [j["job"] for j in c.get("/v1/jobs").json()["jobs"]] == [job]


def test_job_file_errors_are_422_in_the_clis_words_with_the_field(env: Env) -> None:
    with env.client() as c:
        r = c.post("/v1/jobs", json={"source": "faces/me.jpg", "targets": ["x/*.jpg"], "faces": "some"})
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "faces" and "unknown face selection 'some'" in r.json()["error"]["message"]
        r = c.post("/v1/jobs", json={"source": "../../etc/passwd.jpg", "targets": ["*.jpg"]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "source"
        assert "leads out of the data root" in r.json()["error"]["message"]
        r = c.post("/v1/jobs", json={"source": "faces/none.jpg", "targets": ["*.jpg"], "resources": {"gpus": 0}})
        assert r.status_code == 422 and str(env.root) not in r.text and "tenants/acme" not in r.text
        r = c.post("/v1/jobs", json={"source": "faces/me.jpg", "targets": ["s3://media/crowd/*.jpg"]})
        assert r.status_code == 422 and r.json()["error"]["field"].startswith("targets")
        assert "tenant without a storage area" in r.json()["error"]["message"]
    assert not list((env.root / "inbox").glob("*.yaml"))


def test_outputs_spread_over_more_top_folders_than_one_runner_may_write_are_422_on_output(env: Env) -> None:
    area = env.area()
    with env.client() as c:
        c.get("/v1/jobs")  # the area is made on first use
        (area / "faces").mkdir()
        (area / "faces" / "me.jpg").write_bytes(JPEG)
        for k in range(MAX_OUTPUT_MOUNTS + 1):
            (area / f"d{k:02d}").mkdir()
            (area / f"d{k:02d}" / "a.jpg").write_bytes(JPEG)
        job = {"source": "faces/me.jpg", "targets": ["d*/a.jpg"], "output": "{dir}/s/{name}", "resources": {"gpus": 0}}
        r = c.post("/v1/jobs", json=job)
        assert r.status_code == 422 and r.json()["error"]["field"] == "output", r.text
        assert f"{MAX_OUTPUT_MOUNTS + 1} folders at the top of the tenant's area" in r.json()["error"]["message"]
        assert "tenants/acme" not in r.text
        (area / "d00" / "a.jpg").unlink()  # one fewer: each output folder its runner's own mount
        assert c.post("/v1/jobs", json=job).status_code == 202
    assert len(list((env.root / "inbox").glob("*.yaml"))) == 1


def test_uploads_with_a_zip_are_unpacked_and_non_media_entries_are_noted(env: Env) -> None:
    archive = zip_bytes({"set/a.jpg": JPEG, "set/b.png": PNG, "set/readme.txt": b"hello", "clip.mp4": MP4})
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("photos.zip", archive)),
                     ("targets", ("c.jpg", JPEG))], job={"name": "agency", "resources": {"gpus": 0}})  # fmt: skip
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert r.json()["notes"] == ["set/readme.txt: not a photo or a video; skipped"]
    up = env.area() / "uploads" / job
    got = sorted(p.relative_to(up).as_posix() for p in up.rglob("*") if p.is_file())
    assert got == ["source/me.jpg", "targets/c.jpg", "targets/photos/clip.mp4", "targets/photos/set/a.jpg",
                   "targets/photos/set/b.png"]  # fmt: skip
    spec = parse_job_text(env.inbox_file(job).read_text(), "inbox")
    assert spec.source == (f"tenants/acme/uploads/{job}/source/me.jpg",)
    assert not list((env.area() / "uploads").glob(".incoming-*"))


def test_a_named_upload_of_photos_is_one_job_under_its_name_and_a_refused_one_gives_its_slot_back(env: Env) -> None:
    """Photos without an archive are finished in one step (no worker process): the job part's name,
    the slot bound to the job, the files moved; a refusal there leaves nothing and frees its slot."""
    files = [("source", ("me.jpg", JPEG)), ("targets", ("a.jpg", JPEG)), ("targets", ("b.jpg", JPEG))]
    r = upload(env, files, job={"name": "party", "resources": {"gpus": 0}})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert job.startswith("party-")
    up = env.area() / "uploads" / job
    assert sorted(p.relative_to(up).as_posix() for p in up.rglob("*") if p.is_file()) == [
        "source/me.jpg", "targets/a.jpg", "targets/b.jpg"
    ]  # fmt: skip
    assert parse_job_text(env.inbox_file(job).read_text(), "inbox").source == (
        f"tenants/acme/uploads/{job}/source/me.jpg",
    )
    ledger = env.root / "tenants" / ".quota" / "acme"
    assert [p.name for p in (ledger / "open").iterdir()] == [job]  # its slot, bound to it
    r = upload(env, [("source", ("me.jpg", JPEG))], job={"name": "lonely"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "targets"
    assert [p.name for p in (env.area() / "uploads").iterdir()] == [job]  # nothing of the refused one
    assert [p.name for p in (ledger / "open").iterdir()] == [job]
    assert json.loads((ledger / "ledger").read_text())["jobs"] == 1


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("../escape.jpg", "leads out of the archive"),
        ("/etc/abs.jpg", "is an absolute path"),
        ("inner.zip", "is an archive inside the archive"),
    ],
)
def test_a_zip_with_a_bad_entry_is_400_naming_it_and_leaves_nothing(env: Env, entry: str, words: str) -> None:
    inner = zip_bytes({"x.jpg": JPEG})
    archive = zip_bytes({"ok.jpg": JPEG, entry: inner if entry.endswith(".zip") else JPEG})
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("p.zip", archive))])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_zip" and entry in r.json()["error"]["message"] and words in r.text
    assert leftovers(env.area()) == [] and not list((env.root / "inbox").glob("*.yaml"))


def test_a_zip_symlink_entry_and_a_zip_bomb_are_refused(env: Env) -> None:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        link = zipfile.ZipInfo("link.jpg")
        link.create_system = 3
        link.external_attr = 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("l.zip", buf.getvalue()))])
    assert r.status_code == 400 and "'link.jpg' is a symbolic link" in r.json()["error"]["message"]
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("big.jpg", JPEG + b"\0" * (20 * 1024**2))
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("b.zip", bomb.getvalue()))])
    assert r.status_code == 400 and "'big.jpg'" in r.text and "times its packed size" in r.text
    assert leftovers(env.area()) == []


def test_an_upload_over_the_cap_is_413_and_nothing_stays(env: Env) -> None:
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("big.jpg", JPEG + b"\0" * 70_000))])
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    assert leftovers(env.area()) == []


def test_a_file_that_is_not_media_is_415_whatever_its_name(env: Env) -> None:
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("fake.jpg", b"#!/bin/sh\necho hi\n"))])
    assert r.status_code == 415 and r.json()["error"]["file"] == "fake.jpg" and "echo" not in r.text
    r = upload(env, [("source", ("clip.jpg", MP4)), ("targets", ("a.jpg", JPEG))])
    assert r.status_code == 415 and r.json()["error"]["field"] == "source"
    assert leftovers(env.area()) == []


def test_over_the_queued_jobs_quota_is_429_with_retry_after(env: Env) -> None:
    ids = []
    for n in range(3):
        r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", (f"{n}.jpg", JPEG))], job={"resources": {"gpus": 0}})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("x.jpg", JPEG))])
    assert r.status_code == 429 and r.headers["Retry-After"] == "30"
    with env.client() as c:
        page = c.get("/v1/jobs", params={"limit": 2}).json()
        rest = c.get("/v1/jobs", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [j["job"] for j in page["jobs"] + rest["jobs"]] == ids[::-1] and rest["next_cursor"] is None  # newest first


def test_without_a_serving_controller_nothing_is_accepted(env: Env) -> None:
    for hb in (env.root / "inbox" / ".heartbeat").iterdir():
        hb.unlink()
    r = upload(env, [("source", ("me.jpg", JPEG)), ("targets", ("a.jpg", JPEG))], job={"resources": {"gpus": 0}})
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert leftovers(env.area()) == [] and not list((env.root / "tenants" / ".jobs" / "acme").iterdir())


def test_the_openapi_document_is_served(env: Env) -> None:
    with env.client(tenant=None) as c:
        doc = c.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/v1/jobs/{job}/results.zip" in doc["paths"]
    assert yaml.safe_dump(doc)  # plain data


def test_an_area_swapped_for_a_link_after_it_was_used_is_refused_and_nothing_goes_through_it(env: Env) -> None:
    area = env.area()
    body = {"name": "selfie", "source": "in/me.jpg", "targets": ["in/me.jpg"]}
    with env.client() as c:
        c.get("/v1/jobs")
        (area / "in").mkdir()
        (area / "in" / "me.jpg").write_bytes(JPEG)
        first = c.post("/v1/jobs", json=body)
        assert first.status_code == 202, first.text
        elsewhere = env.root.parent / "elsewhere"
        area.rename(elsewhere)  # the same photos, now outside the data root, behind a link
        area.symlink_to(elsewhere)
        before = sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*"))
        r = c.post("/v1/jobs", json=body)
        assert r.status_code >= 500 and r.status_code != 202
        assert str(env.root) not in r.text and "Traceback" not in r.text
        assert sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*")) == before
        assert [p.name for p in (env.root / "inbox").glob("*.yaml")] == [f"{first.json()['id']}.yaml"]


@pytest.mark.parametrize(
    "fields",
    [
        {"source": "in/me.jpg", "targets": ["in/p1.jpg"], "output": "out/{job}/{stem}{ext}"},
        {"source": ["a b/ä.jpg", "x/./y.png"], "targets": "**/*.jpg", "output": "{dir}/{index}-{name}"},
        {"source": "s3://bucket/t/me.jpg", "targets": ["s3://bucket/t/in/*.jpg"], "output": "s3://bucket/t/o/{stem}{ext}"},
        {"source": "in/me.jpg", "targets": ["in/c.mp4"], "output": "out/{stem}.mp4", "faces": "reference",
         "reference": "in/ref.jpg"},
        {"pairs": [{"source": ["in/a.jpg"], "target": "in/b.jpg", "output": "o/{stem}{ext}"}, {"source": "in/c.jpg",
         "target": "in/d.jpg"}], "output": "o/{index}{ext}"},
        {"pairs_file": "lists/pairs.csv"},
    ],
)  # fmt: skip
def test_a_job_valid_in_its_area_is_valid_as_its_inbox_file_names_it(fields: dict[str, object]) -> None:
    """The API checks a job with the area as its root and does not check it again with its paths
    rebased for the inbox file: rebasing must never make a valid job invalid, nor leave a path
    outside the area."""
    data = {"name": "party-abcdefgh", **fields}
    inside = parse_job(data, "job")
    root = parse_job(yaml.safe_load(yaml.safe_dump(rebased(data, "tenants/acme"))), "inbox/party-abcdefgh.yaml")
    for spec in (inside, root):
        assert spec.name == "party-abcdefgh"
    names = [*root.source, *root.targets, root.output, root.reference, root.pairs_file]
    names += [p for pair in root.pairs for p in (*pair.source, pair.target, pair.output)]
    for name in (n for n in names if n):
        assert name.startswith(("tenants/acme/", "s3://")), name


@pytest.mark.parametrize(
    "where",
    ["runs/party-abcdefgh/", "inbox/party-abcdefgh.yaml", "inbox/party-abcdefgh.yml",
     "inbox/running/party-abcdefgh.yaml", "tenants/.jobs/globex/party-abcdefgh.json", "runs/party-abcdefgh"],
)  # fmt: skip
def test_an_id_in_use_anywhere_on_the_volume_is_never_given_again(tmp_path: Path, where: str) -> None:
    from controller.api.area import Area

    area = Area(tmp_path, "acme")
    assert not area.id_taken("party-abcdefgh")
    place = tmp_path / where
    place.parent.mkdir(parents=True, exist_ok=True)
    if where.endswith("/"):
        place.mkdir()
    elif where.startswith("runs/"):
        place.symlink_to(tmp_path / "gone")  # a dangling link holds the name too
    else:
        place.write_text("x")
    assert area.id_taken("party-abcdefgh") and not area.id_taken("party-bcdefghi")


@pytest.mark.parametrize(
    ("body", "one_step"),
    [
        ('{"source": "in/a.jpg", "targets": ["in/b.jpg", "in/c.jpg"]}', True),
        ('{"source": "s3:\\/\\/bucket\\/a.jpg", "targets": ["in/b.jpg"]}', False),  # JSON may escape the slashes
        ('{"pairs": [{"source": "in/a.jpg", "target": "s3://bucket/x.jpg"}]}', False),
        ('{"source": "in/a.jpg", "targets": ["in/*.jpg"]}', False),
        ('{"source": "in/a.jpg", "pairs_file": "lists/p.csv"}', False),
    ],
)
def test_only_a_job_of_named_files_on_the_volume_is_checked_in_one_intake_step(body: str, one_step: bool) -> None:
    """A glob, a pairs file or anything in the store is checked where the store's clients and worker
    processes are (its slow lane), however the JSON spells it."""
    assert quick(json.loads(body)) is one_step
