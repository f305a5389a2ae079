"""A tenant's ``pairs_file`` job through the API and then `serve`: the rows name files in the tenant's
area, as the tenant wrote them, both when the API checks the job and when `serve` resolves the job
file the API handed over (claimed, its owner checked, prepared as serve does). Rows that would leave
the area, and pairs files that are links or outside the area, are refused naming the file and line."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config import Config
from controller.errors import JobFileError
from controller.run import usecase
from controller.run.jobs import PreparedJob
from controller.serve import daemon as serve
from controller.serve.inbox import Inbox
from tests.builders import JPEG, Env, api_env

PHOTOS = ("u/1.jpg", "u/2.jpg", "s/a.jpg", "s/b.jpg", "s/deep/c.jpg")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 20})


def files(env: Env, tenant: str = "acme", extra: dict[str, str] | None = None) -> Path:
    """The tenant's area (made by a first request) with PHOTOS, and ``extra`` text files by path."""
    with env.client(tenant) as c:
        c.get("/v1/jobs")
    area = env.area(tenant)
    for rel in PHOTOS:
        (area / rel).parent.mkdir(parents=True, exist_ok=True)
        (area / rel).write_bytes(JPEG)
    for rel, text in (extra or {}).items():
        (area / rel).parent.mkdir(parents=True, exist_ok=True)
        (area / rel).write_text(text)
    return area


def post(env: Env, **fields: object) -> tuple[int, dict[str, object]]:
    with env.client() as c:
        r = c.post("/v1/jobs", json={"name": "pf", "resources": {"gpus": 0}, **fields})
    return r.status_code, r.json()


def served(config: Config, job: str) -> PreparedJob:
    """What `serve` makes of ``inbox/<job>.yaml``: claimed once settled, owned by the tenant whose
    record names these bytes, and prepared inside that tenant's area."""
    box = Inbox(config.data_root / "inbox", config.policy.limits.job_file)
    box.ensure()
    path = config.data_root / "inbox" / f"{job}.yaml"
    settled = time.time() - 10
    os.utime(path, (settled, settled))
    claimed = box.claim(path)
    assert claimed is not None
    tenant = serve.job_owner(config, claimed)
    assert tenant == "acme"
    return usecase.one_job(config, claimed, tenant=tenant)


def ran(config: Config, prepared: PreparedJob) -> list[tuple[tuple[str, ...], str, str]]:
    """Each item as serve would run it: its person's photos, its target and its output, from the data root."""
    resolved = prepared.resolved
    assert resolved is not None
    out = []
    for t in resolved.targets:
        assert t.identity is not None
        photos = tuple(Path(str(p)).relative_to(config.data_root).as_posix() for p in resolved.identities[t.identity])
        out.append((photos, t.rel, t.output_rel))
    return out


CSV = "source,target,output\nu/1.jpg,s/a.jpg,\nu/2.jpg,s/b.jpg,o/{stem}-two{ext}\n"


def test_a_pairs_file_job_runs_on_the_tenants_own_files_as_it_wrote_them(env: Env) -> None:
    files(env, extra={"lists/pairs.csv": CSV})
    status, body = post(env, pairs_file="lists/pairs.csv")
    assert status == 202, body
    job = str(body["id"])
    assert ran(env.config, served(env.config, job)) == [
        (("tenants/acme/u/1.jpg",), "tenants/acme/s/a.jpg", f"tenants/acme/out/{job}/a.jpg"),
        (("tenants/acme/u/2.jpg",), "tenants/acme/s/b.jpg", "tenants/acme/o/b-two.jpg"),
    ]


def test_a_jsonl_pairs_file_and_inline_pairs_run_on_the_same_files(env: Env) -> None:
    rows = [{"source": ["u/1.jpg", "u/2.jpg"], "target": "s/a.jpg"}, {"source": "u/2.jpg", "target": "s/b.jpg"}]
    files(env, extra={"p.jsonl": "".join(json.dumps(r) + "\n" for r in rows)})
    status, body = post(env, pairs_file="p.jsonl", output="o/{stem}{ext}")
    assert status == 202, body
    from_file = ran(env.config, served(env.config, str(body["id"])))
    status, body = post(env, pairs=rows, output="o2/{stem}{ext}")
    assert status == 202, body
    inline = ran(env.config, served(env.config, str(body["id"])))
    first = (("tenants/acme/u/1.jpg", "tenants/acme/u/2.jpg"), "tenants/acme/s/a.jpg")
    second = (("tenants/acme/u/2.jpg",), "tenants/acme/s/b.jpg")
    assert [x[:2] for x in from_file] == [x[:2] for x in inline] == [first, second]
    assert [x[2] for x in inline] == ["tenants/acme/o2/a.jpg", "tenants/acme/o2/b.jpg"]
    assert [x[2] for x in from_file] == ["tenants/acme/o/a.jpg", "tenants/acme/o/b.jpg"]


def test_an_output_template_with_dir_lands_in_the_targets_folder_in_the_area(env: Env) -> None:
    files(env, extra={"p.csv": "u/1.jpg,s/deep/c.jpg,{dir}/done/{stem}{ext}\n"})
    status, body = post(env, pairs_file="p.csv")
    assert status == 202, body
    assert ran(env.config, served(env.config, str(body["id"])))[0][2] == "tenants/acme/s/deep/done/c.jpg"
    status, body = post(env, source="u/1.jpg", targets="s/deep/*.jpg", output="{dir}/plain/{stem}{ext}")
    assert status == 202, body
    resolved = served(env.config, str(body["id"])).resolved
    assert resolved is not None and [t.output_rel for t in resolved.targets] == ["tenants/acme/s/deep/plain/c.jpg"]


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ("../globex/u/1.jpg,s/a.jpg", "p.csv line 2: source: "),
        ("u/1.jpg,../globex/s/a.jpg", "p.csv line 2: target: "),
        ("/etc/hostname,s/a.jpg", "p.csv line 2: source: "),
        ("u/1.jpg,s/a.jpg,../globex/o/{stem}{ext}", "p.csv line 2: output: "),
        ("u/1.jpg,s/a.jpg,../../runs/{stem}{ext}", "p.csv line 2: output: "),
    ],
)
def test_a_row_that_leaves_the_area_is_refused_naming_the_file_and_line(env: Env, row: str, said: str) -> None:
    files(env, extra={"p.csv": f"u/2.jpg,s/b.jpg\n{row}\n"})
    files(env, "globex")  # the other tenant's files exist: refused for where they are, not for missing
    status, body = post(env, pairs_file="p.csv", output="o/{stem}{ext}")
    assert status == 422, body
    error = body["error"]
    assert isinstance(error, dict) and error["field"] == "pairs_file"
    assert said in error["message"]
    assert str(env.root) not in error["message"] and "s/b.jpg" not in error["message"]  # no other row's text
    assert not list((env.root / "inbox").glob("*.yaml"))  # nothing handed over


def test_a_pairs_file_that_is_a_link_or_outside_the_area_is_refused(env: Env) -> None:
    area = files(env, extra={"p.csv": "u/1.jpg,s/a.jpg\n"})
    files(env, "globex", extra={"theirs.csv": "u/1.jpg,s/a.jpg\n"})
    (area / "link.csv").symlink_to(area / "p.csv")
    (area / "away.csv").symlink_to(env.area("globex") / "theirs.csv")
    for name in ("link.csv", "away.csv", "../globex/theirs.csv", "/etc/p.csv"):
        status, body = post(env, pairs_file=name, output="o/{stem}{ext}")
        assert status == 422, (name, body)
        error = body["error"]
        assert isinstance(error, dict) and error["field"] == "pairs_file", (name, error)
        assert str(env.root) not in error["message"]
    assert not [p for p in (env.root / "inbox").iterdir() if p.suffix == ".yaml"]


def test_a_pairs_file_changed_after_acceptance_still_cannot_leave_the_area(env: Env) -> None:
    area = files(env, extra={"p.csv": "u/1.jpg,s/a.jpg\n"})
    files(env, "globex")
    status, body = post(env, pairs_file="p.csv", output="o/{stem}{ext}")
    assert status == 202, body
    (area / "p.csv").write_text("../globex/u/1.jpg,s/a.jpg\ntenants/globex/u/2.jpg,s/b.jpg\n")
    with pytest.raises(JobFileError) as e:
        served(env.config, str(body["id"]))
    assert "p.csv line 1: source" in str(e.value)


def test_every_path_key_of_a_tenants_job_is_served_from_its_area(env: Env) -> None:
    files(env)
    status, body = post(env, source="u/1.jpg", targets=["s/*.jpg"], faces="reference", reference="u/2.jpg")
    assert status == 202, body
    job = str(body["id"])
    resolved = served(env.config, job).resolved
    assert resolved is not None
    assert [Path(str(p)).relative_to(env.root).as_posix() for p in resolved.sources] == ["tenants/acme/u/1.jpg"]
    assert resolved.reference == env.area() / "u/2.jpg"
    assert [(t.rel, t.output_rel) for t in resolved.targets] == [
        ("tenants/acme/s/a.jpg", f"tenants/acme/out/{job}/a.jpg"),
        ("tenants/acme/s/b.jpg", f"tenants/acme/out/{job}/b.jpg"),
    ]
