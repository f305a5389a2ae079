"""The HTTP API end to end on the dev swarm (issue 17): `ffswarm api` and `ffswarm serve` as real
processes on loopback, a tenant's ZIP of real photos run by real runners, results and signed links
read back over HTTP, and another tenant seeing none of it."""

from __future__ import annotations

import io
import json
import time
import zipfile
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from contract.layout import run_rel
from tests.fixtures import photos
from tests.integration.conftest import Api, Tenants, Workspace

pytestmark = pytest.mark.integration

PHOTOS = 20


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _events(api: Api, key: str, job: str, timeout: float) -> list[tuple[str, dict[str, Any]]]:
    """Every event of the job's stream until ``end``."""
    got: list[tuple[str, dict[str, Any]]] = []
    event = ""
    with api.client(key) as c, c.stream("GET", f"/v1/jobs/{job}/events", timeout=timeout) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                got.append((event, json.loads(line[len("data: ") :])))
                if event == "end":
                    return got
    raise AssertionError(f"the stream ended without an end event: {got[-3:]}")


def test_a_tenants_zip_runs_end_to_end_and_only_that_tenant_sees_it(
    workspace: Workspace, tenants: Tenants, api: Api
) -> None:
    ws = workspace
    src = ws.dir / "src"
    star = photos.astronaut(src / "faces")
    faces = photos.face_photos(src / "crowd", PHOTOS)
    empty = photos.no_face_photo(src / "crowd")
    good = {p.name: p.read_bytes() for p in [*faces, empty]}
    entries = {**good, "readme.txt": b"not a photo\n"}
    options = {"name": "holiday", "no_face": "skip", "chunk_size": 7, "max_concurrent": 3, "providers": ["cpu"],
               "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}}  # fmt: skip
    area = ws.root / "tenants" / tenants.a
    key_a, key_b = tenants.keys[tenants.a], tenants.keys[tenants.b]

    def post(zip_bytes: bytes) -> httpx.Response:
        files = [("source", ("me.jpg", star.read_bytes(), "image/jpeg")),
                 ("targets", ("photos.zip", zip_bytes, "application/zip"))]  # fmt: skip
        with api.client(key_a) as c:
            return c.post("/v1/jobs", files=files, data={"job": json.dumps(options)})

    # a ZIP with an entry that climbs out: refused naming it, nothing kept
    r = post(_zip({**entries, "../escape.jpg": good[faces[0].name]}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "bad_zip" and "'../escape.jpg'" in r.json()["error"]["message"]
    assert sorted(p.relative_to(area).as_posix() for p in area.rglob("*")) in ([], ["uploads"])
    assert not (ws.root / "tenants" / ".jobs" / tenants.a).is_dir() or not any(
        (ws.root / "tenants" / ".jobs" / tenants.a).iterdir()
    )

    # the same ZIP without it: accepted before it has run (the 202 is the inbox hand-over, not the
    # work), the non-image entry noted
    r = post(_zip(entries))
    assert r.status_code == 202, r.text
    body = r.json()
    job = body["id"]
    with api.client(key_a) as c:
        assert c.get(f"/v1/jobs/{job}").json()["phase"] in ("queued", "running")
    assert job.startswith("holiday-") and body["status_url"] == f"/v1/jobs/{job}"
    assert any("readme.txt" in n for n in body.get("notes", []))

    events = _events(api, key_a, job, timeout=600)
    end = ("end", {"job": job, "phase": "finished", "outcome": "succeeded"})
    assert events[-1] == end, (events[-3:], api.log.read_text()[-2000:])
    assert any(e == "progress" for e, _ in events)

    with api.client(key_a) as c:
        row = c.get(f"/v1/jobs/{job}").json()
        assert row["phase"] == "finished" and row["owner"] == tenants.a, row
        assert row["items"]["ok"] == PHOTOS and row["items"]["no_face"] == 1 and row["items"]["failed"] == 0, row
        report = c.get(f"/v1/jobs/{job}/report").json()
        assert report["job"] == job
        assert [j["job"] for j in c.get("/v1/jobs").json()["jobs"]] == [job]
        results = c.get(f"/v1/jobs/{job}/results.zip")
    assert (ws.root / run_rel(job) / "owner").read_text() == f"{tenants.a}\n"  # serve recorded the owner

    # results.zip: exactly one output per photo with a face, each a swapped photo (not the input)
    assert results.status_code == 200 and results.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(results.content)) as zf:
        names = sorted(zf.namelist())
        assert names == sorted(f"out/{job}/{p.name}" for p in faces)
        for p in faces:
            out = zf.read(f"out/{job}/{p.name}")
            assert out[:2] == b"\xff\xd8" and out != good[p.name]

    # a signed link works without a token, then stops working once expired
    link = row["results_url"]
    expires = int(parse_qs(urlsplit(link).query)["expires"][0])
    with api.client(None) as anon:
        assert anon.get(f"/v1/jobs/{job}/results.zip").status_code == 401
        signed = anon.get(link)
        assert signed.status_code == 200 and sorted(zipfile.ZipFile(io.BytesIO(signed.content)).namelist()) == names
        time.sleep(max(0.0, expires - time.time()) + 1.5)
        late = anon.get(link)
        assert late.status_code == 403 and late.json()["error"]["code"] == "link_expired"

    # tenant B: A's job does not exist on any route
    with api.client(key_b) as c:
        for path in ("", "/report", "/events", "/results.zip"):
            r = c.get(f"/v1/jobs/{job}{path}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
        assert c.post(f"/v1/jobs/{job}/cancel").status_code == 404
        assert c.get("/v1/jobs").json()["jobs"] == []
