"""The Python client (controller/client/) against a real `ffswarm api` on loopback, with a stand-in
`serve` that runs what the API hands over (tests/unit/standin_serve.py): submit as JSON and as an
upload of a folder and a ZIP, get, the list page by page, results.zip, cancel, retry, scale, delete,
usage, wait; a submit whose answer is lost on the way, retried with its Idempotency-Key; a 429's
Retry-After; the API's errors as ApiError."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from controller.client import ApiError, Client, ClientError
from controller.client.errors import LocalFileError
from tests.builders import JPEG, KEYS, PNG, Env, api_env, zip_bytes
from tests.unit.proxies import Proxy
from tests.unit.standin_serve import StandinServe, run_job


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 8})


def client(env: Env, url: str | None = None, **kw: object) -> Client:
    return Client(url or env.url, KEYS["acme"], sleep=lambda _: None, **kw)  # type: ignore[arg-type]


def in_area(env: Env, *rels: str) -> None:
    """Photos in the tenant's area (made by the API on first use)."""
    for rel in rels:
        path = env.area() / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(JPEG)


def json_job(env: Env, c: Client, **fields: object) -> str:
    list(c.list(limit=1))  # the area is made on first use
    in_area(env, "faces/me.jpg", "crowd/a.jpg", "crowd/b.jpg", "crowd/bad.jpg")
    body = {"source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "chunk_size": 2, "resources": {"gpus": 0}}
    return c.submit({**body, **fields}).id


def photos(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A source photo, a folder of two photos (one in a subfolder) and a note, and a ZIP of one photo."""
    me = tmp_path / "me.jpg"
    me.write_bytes(JPEG)
    folder = tmp_path / "party"
    (folder / "more").mkdir(parents=True)
    (folder / "a.jpg").write_bytes(JPEG)
    (folder / "more" / "b.png").write_bytes(PNG)
    (folder / "notes.txt").write_text("not a photo")
    archive = tmp_path / "extra.zip"
    archive.write_bytes(zip_bytes({"c.jpg": JPEG}))
    return me, folder, archive


def test_a_json_job_is_submitted_read_listed_and_its_results_downloaded(env: Env, tmp_path: Path) -> None:
    with client(env) as c:
        job = json_job(env, c)
        queued = c.get(job)
        assert queued.id == job and queued.phase == "queued" and not queued.ended and queued.items is None
        run_job(env.config, job, fails=lambda p: "bad" in p)
        done = c.get(job)
        assert done.phase == "finished" and done.ended
        assert done.items is not None and (done.items.total, done.items.ok, done.items.failed) == (3, 2, 1)
        assert done.raw["job"] == job and done.results_url is not None
        assert done.outcome in (None, "partial")  # the API's word when it says one; never guessed here
        assert [j.id for j in c.list()] == [job]
        assert c.report(job)["counts"]["failed"] == 1
        (tmp_path / "dl").mkdir()
        written = c.results(job, tmp_path / "dl" / "r.zip")
    with zipfile.ZipFile(written) as zf:
        assert sorted(Path(n).name for n in zf.namelist()) == ["a.jpg", "b.jpg"]
    assert [p.name for p in written.parent.iterdir()] == ["r.zip"]  # no partial file left beside it


def test_an_upload_of_a_folder_and_a_zip_becomes_one_job_with_every_photo(env: Env, tmp_path: Path) -> None:
    me, folder, archive = photos(tmp_path)
    with client(env) as c:
        sent = c.submit(source=me, files=[folder, archive], options={"name": "party", "chunk_size": 5})
        assert sent.id.startswith("party-") and not sent.replayed
        assert sent.notes == ("party/notes.txt: not a photo or video; not sent",)
        handed = yaml.safe_load(env.inbox_file(sent.id).read_text())
        assert handed["chunk_size"] == 5 and handed["source"] == [f"tenants/acme/uploads/{sent.id}/source/me.jpg"]
        uploaded = sorted(p.relative_to(env.area() / "uploads" / sent.id).as_posix()
                          for p in (env.area() / "uploads" / sent.id).rglob("*") if p.is_file())  # fmt: skip
        assert uploaded == ["source/me.jpg", "targets/extra/c.jpg", "targets/party/a.jpg", "targets/party/more/b.png"]
        run_job(env.config, sent.id)
        assert c.wait(sent.id).items.ok == 3  # type: ignore[union-attr]
        with zipfile.ZipFile(c.results(sent.id, tmp_path / "out.zip")) as zf:
            assert sorted(Path(n).name for n in zf.namelist()) == ["a.jpg", "b.png", "c.jpg"]


def test_local_files_that_cannot_be_sent_are_named_before_anything_is_sent(env: Env, tmp_path: Path) -> None:
    me, folder, _ = photos(tmp_path)
    with client(env) as c:
        with pytest.raises(LocalFileError, match="missing.jpg' does not exist"):
            c.submit(source=me, files=[tmp_path / "missing.jpg"])
        with pytest.raises(LocalFileError, match="is not a photo"):
            c.submit(source=folder / "notes.txt", files=[folder])
        with pytest.raises(ClientError, match="at least one source photo"):
            c.submit(files=[folder])
        with pytest.raises(ClientError, match="may not hold 'targets'"):
            c.submit(source=me, files=[folder], options={"targets": ["x"]})
    assert not list((env.root / "inbox").glob("*.yaml"))


def test_the_list_follows_next_cursor_page_by_page_and_stops_at_the_limit(env: Env) -> None:
    with client(env) as c:
        jobs = {json_job(env, c, name=f"n{i}") for i in range(5)}
        assert {j.id for j in c.list(page_size=2)} == jobs
        assert len(list(c.list(page_size=2, limit=3))) == 3
        assert [j.phase for j in c.list(phase="queued")] == ["queued"] * 5
        assert list(c.list(phase="finished")) == []


def test_cancel_retry_scale_delete_and_usage(env: Env) -> None:
    with client(env) as c:
        queued = json_job(env, c, name="later")
        assert c.scale(queued, 2) == {"job": queued, "max_concurrent": 2}
        assert c.cancel(queued)["cancelled"] is True
        assert c.get(queued).phase == "cancelled"
        job = json_job(env, c)
        run_job(env.config, job, fails=lambda p: "bad" in p)
        again = c.retry(job)
        assert again.id == job and again.raw["items"] == 1
        with pytest.raises(ApiError) as twice:
            c.retry(job)
        assert (twice.value.status, twice.value.code) == (409, "not_finished")
        run_job(env.config, job)
        assert c.wait(job).items.failed == 0  # type: ignore[union-attr]
        c.delete(job)
        with pytest.raises(ApiError) as gone:
            c.get(job)
        assert (gone.value.status, gone.value.code) == (404, "not_found")
        assert c.usage().tenant == "acme"


def test_the_apis_refusals_are_api_errors_with_code_message_and_field(env: Env) -> None:
    with client(env) as c:
        with pytest.raises(ApiError) as bad:
            json_job(env, c, faces="sometimes")
        e = bad.value
        assert (e.status, e.code, e.field) == (422, "invalid_job", "faces") and "faces" in e.message
        assert [f.field for f in e.errors] == ["faces"]
    with Client(env.url, "not-a-key", sleep=lambda _: None) as stranger, pytest.raises(ApiError) as who:
        stranger.get("anything")
    assert who.value.status == 401


def test_a_429_is_tried_again_after_its_retry_after_then_raised(env: Env) -> None:
    slept: list[float] = []
    with client(env) as c:
        for i in range(8):
            json_job(env, c, name=f"q{i}")
    with Client(env.url, KEYS["acme"], sleep=slept.append, retries=2) as c, pytest.raises(ApiError) as full:
        c.submit({"source": "faces/me.jpg", "targets": ["crowd/*.jpg"]})
    assert full.value.status == 429 and full.value.retry_after is not None
    assert slept == [full.value.retry_after] * 2


def test_a_submit_whose_answer_is_lost_is_sent_again_and_makes_one_job(env: Env, tmp_path: Path) -> None:
    me, folder, archive = photos(tmp_path)
    with Proxy(env.url, drop_answers=1) as proxy, client(env, proxy.url) as c:
        sent = c.submit(source=me, files=[folder, archive])
        assert proxy.dropped == 1 and proxy.requests == 2  # the first answer never came back
        assert sent.replayed  # the API had made the job; the retry learnt its id
        with client(env, proxy.url) as json_c:
            body = json_job(env, json_c)
            assert proxy.dropped == 1
    jobs = sorted(p.stem for p in (env.root / "inbox").glob("*.yaml"))
    assert jobs == sorted([sent.id, body])


def test_wait_reads_the_status_until_the_job_ends_or_the_timeout(env: Env) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with Client(env.url, KEYS["acme"], sleep=sleep, clock=lambda: now[0]) as c:
        job = json_job(env, c)
        with pytest.raises(TimeoutError, match=f"job {job} has not ended after 5"):
            c.wait(job, timeout=5, poll=2)
        assert now[0] == 5  # 2 + 2 + the 1 left
    with StandinServe(env.config), client(env) as c:
        assert c.wait(job, poll=0.05).phase == "finished"


def test_a_zip_built_from_a_folder_is_stored_not_compressed(tmp_path: Path) -> None:
    from controller.client import uploads

    _, folder, _ = photos(tmp_path)
    up = uploads.prepare([tmp_path / "me.jpg"], [folder], None)
    try:
        ((_, name, path),) = [p for p in up.parts if p[0] == "targets"]
        assert name == "party.zip"
        with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as zf:
            assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    finally:
        up.close()
    assert not path.exists()


def test_a_local_job_file_names_its_files_from_its_own_folder_and_sends_the_rest_as_options(tmp_path: Path) -> None:
    from controller.client import jobfile

    me, folder, _ = photos(tmp_path)
    (tmp_path / "jobs").mkdir()
    spec = tmp_path / "jobs" / "party.yaml"
    spec.write_text("name: party\nsource: ../me.jpg\ntargets: ['../party/**/*.*', ../extra.zip]\nfaces: one\n")
    local = jobfile.read(spec)
    assert local.source == (tmp_path / "jobs" / ".." / "me.jpg",)
    assert sorted(p.name for p in local.targets) == ["a.jpg", "b.png", "extra.zip", "notes.txt"]
    assert local.options == {"name": "party", "faces": "one"}
    spec.write_text("source: ../me.jpg\ntargets: [nowhere/*.jpg]\n")
    with pytest.raises(LocalFileError, match=r"targets: 'nowhere/\*.jpg' matches no file"):
        jobfile.read(spec)
    spec.write_text("pairs_file: lists/pairs.csv\n")
    with pytest.raises(ClientError, match="pairs_file: a pairs job is not uploaded"):
        jobfile.read(spec)


def test_results_to_a_folder_that_does_not_exist_is_a_local_file_error(env: Env, tmp_path: Path) -> None:
    with client(env) as c:
        job = json_job(env, c)
        run_job(env.config, job)
        with pytest.raises(LocalFileError, match="cannot write"):
            c.results(job, tmp_path / "no" / "such" / "r.zip")


def test_a_download_that_breaks_off_is_fetched_again_whole(env: Env, tmp_path: Path) -> None:
    with client(env) as c:
        job = json_job(env, c)
        run_job(env.config, job)
    with Proxy(env.url, cut_body="/results.zip") as proxy, client(env, proxy.url) as c:
        written = c.results(job, tmp_path / "r.zip")
        assert proxy.requests == 2
    with zipfile.ZipFile(written) as zf:
        assert zf.testzip() is None and len(zf.namelist()) == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".zip") or ".part" in p.name] == ["r.zip"]


def test_a_submit_whose_first_try_is_still_being_handled_asks_again_after_retry_after() -> None:
    """The API's 409 ``idempotency_in_progress`` (an earlier try of the same key not answered yet) is
    asked again with the same key; another 409 is the caller's to see."""
    keys: list[str] = []
    slept: list[float] = []

    def api(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("idempotency-key", ""))
        if len(keys) == 1:
            error = {"code": "idempotency_in_progress", "message": "still being handled"}
            return httpx.Response(409, json={"error": error}, headers={"Retry-After": "1"})
        if request.url.path.endswith("/retry"):
            return httpx.Response(409, json={"error": {"code": "not_finished", "message": "queued"}})
        return httpx.Response(202, json={"id": "job-aaaaaaaa"}, headers={"Idempotent-Replayed": "true"})

    with Client("http://api.test", "t", sleep=slept.append, transport=httpx.MockTransport(api)) as c:
        sent = c.submit({"source": "me.jpg", "targets": ["in/*.jpg"]})
        assert sent.id == "job-aaaaaaaa" and sent.replayed and slept == [1.0] and keys[0] == keys[1]
        with pytest.raises(ApiError) as refused:
            c.retry("job-aaaaaaaa")
    assert refused.value.code == "not_finished" and keys[2:] == [""]  # a retry carries no key: asked once
