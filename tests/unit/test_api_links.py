"""Signed links at a real `ffswarm api` on loopback: the expiry is capped at verify by api.link_ttl,
links carry a key id so a previous key still verifies during a rotation, and a job's links can be
revoked (a record beside its owner record, written without following links)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.config import Config, parse_config
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import links
from controller.run.hooks import results_link
from controller.run.rundir import Control, RunDir
from tests.builders import JPEG, Env, beat, make_config, serve_api

JOB = "party-abcdefgh"
OLD_KEY = b"the-key-before-the-rotation-0123456789"


def configured(tmp_path: Path, **api: Any) -> Config:
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    data["api"].update(api)
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    (tmp_path / "old").write_bytes(OLD_KEY)
    config = configured(tmp_path, previous_signing_key_files=[str(tmp_path / "old")])
    beat(config)
    assert config.api.signing_key_file is not None
    key = config.api.signing_key_file.read_bytes().strip()
    for url in serve_api(config):
        yield Env(config, config.data_root, url, key)


def finished(env: Env, job: str = JOB, tenant: str = "acme") -> None:
    area = Area(env.root, tenant)
    area.ensure(None)
    area.write_record(job, uploads=False)
    item = PlannedItem("i000000", f"tenants/{tenant}/in/0.jpg", f"tenants/{tenant}/out/{job}/0.jpg", "image")
    rd = RunDir(env.root, job)
    rd.create(b"name: x\n", Plan(job, (item,), (Chunk("c0000", (item.id,)),)), {}, Control(1), "sha256:x")
    for rel in (item.input, item.output):
        (env.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (env.root / rel).write_bytes(JPEG)
    line = ItemResult(item.id, ItemStatus.OK, 1, f"/data/{item.input}", f"/data/{item.output}", started=1, finished=2)
    (rd.path / "results" / "c0000.jsonl").write_text(line.to_line())
    rd.write_report({"job": job, "items": {"ok": 1}})
    rd.write_file(rd.layout.owner, f"{tenant}\n".encode())  # serve wrote it when the run started


def results_url(env: Env, job: str = JOB) -> str:
    with env.client() as c:
        url: str = c.get(f"/v1/jobs/{job}").json()["results_url"]
    return url


def anon_get(env: Env, url: str) -> tuple[int, str | None]:
    with env.client(tenant=None) as anon:
        r = anon.get(url)
    return r.status_code, None if r.status_code == 200 else r.json()["error"]["code"]


def test_a_far_future_expiry_signed_with_the_key_is_refused(env: Env) -> None:
    finished(env)
    path = links.results_path(JOB)
    keys = links.SigningKeys(env.signing_key)
    assert anon_get(env, links.sign(keys, "GET", path, ttl=3600 - 5)) == (200, None)  # within link_ttl (1h)
    assert anon_get(env, links.sign(keys, "GET", path, ttl=10 * 365 * 86400)) == (403, "bad_link")
    assert anon_get(env, links.sign(keys, "GET", path, ttl=3600 + 120)) == (403, "bad_link")


def test_a_link_of_the_previous_key_verifies_during_a_rotation_and_an_unknown_or_missing_kid_does_not(
    env: Env,
) -> None:
    finished(env)
    path = links.results_path(JOB)
    made = results_url(env)
    assert f"kid={links.key_id(env.signing_key)}" in made  # the current key signs
    assert anon_get(env, made) == (200, None)
    old = links.sign(links.SigningKeys(OLD_KEY), "GET", path, ttl=600)
    assert f"kid={hashlib.sha256(OLD_KEY).hexdigest()[:12]}" in old
    assert anon_get(env, old) == (200, None)  # api.previous_signing_key_files
    other = links.sign(links.SigningKeys(b"a-key-this-api-never-had-0123456789"), "GET", path, ttl=600)
    assert anon_get(env, other) == (403, "bad_signature")
    expires = int(time.time()) + 600
    unkeyed = links.signature(env.signing_key, "GET", path, expires, "", 0)
    assert anon_get(env, f"{path}?expires={expires}&sig={unkeyed}") == (403, "bad_signature")  # made before key ids
    forged = made.replace(f"kid={links.key_id(env.signing_key)}", f"kid={hashlib.sha256(OLD_KEY).hexdigest()[:12]}")
    assert anon_get(env, forged) == (403, "bad_signature")  # the signature is the current key's
    assert anon_get(env, f"{path}?expires={expires}&kid=%C3%A9&gen=0&sig={unkeyed}") == (403, "bad_signature")


def test_revoking_a_jobs_links_refuses_every_link_made_before_and_none_made_after(env: Env) -> None:
    finished(env)
    finished(env, "other-abcdefgh")
    before = results_url(env)
    other_before = results_url(env, "other-abcdefgh")
    with env.client() as c:
        events_before = c.post(f"/v1/jobs/{JOB}/events-link").json()["url"]
    hooked = results_link(env.root, JOB, env.config.tenants, env.config.api)["results_url"]  # serve's webhook link
    assert anon_get(env, before) == (200, None) and anon_get(env, hooked) == (200, None)
    with env.client("globex") as c:  # another tenant's job is not found, and nothing changes
        assert c.post(f"/v1/jobs/{JOB}/links/revoke").status_code == 404
    assert anon_get(env, before) == (200, None)
    with env.client() as c:
        r = c.post(f"/v1/jobs/{JOB}/links/revoke")
    assert r.status_code == 200 and r.json() == {"id": JOB, "links_revoked": True}
    for url in (before, events_before, hooked):
        assert anon_get(env, url) == (403, "link_revoked"), url
    assert anon_get(env, other_before) == (200, None)  # another job's links are untouched
    after = results_url(env)
    assert anon_get(env, after) == (200, None)
    assert anon_get(env, results_link(env.root, JOB, env.config.tenants, env.config.api)["results_url"]) == (200, None)
    with env.client() as c:  # twice: the first revoke's links go too
        c.post(f"/v1/jobs/{JOB}/links/revoke")
    assert anon_get(env, after) == (403, "link_revoked")
    record = env.root / "tenants" / ".jobs" / "acme" / f"{JOB}.links"
    assert record.is_file() and not record.is_symlink()


def test_a_revoke_record_is_written_without_following_a_link(env: Env, tmp_path: Path) -> None:
    finished(env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    record = env.root / "tenants" / ".jobs" / "acme" / f"{JOB}.links"
    before = results_url(env)
    record.symlink_to(elsewhere)
    assert anon_get(env, before) == (403, "link_revoked")  # a record that is not a plain file revokes them
    with env.client() as c:
        assert c.post(f"/v1/jobs/{JOB}/links/revoke").status_code == 200
    assert elsewhere.read_text() == "untouched" and not record.is_symlink()
    assert anon_get(env, results_url(env)) == (200, None)
    assert anon_get(env, before) == (403, "link_revoked")


def test_previous_keys_need_a_current_one_and_absolute_paths(tmp_path: Path) -> None:
    from controller.errors import ConfigError

    with pytest.raises(ConfigError, match=r"api\.previous_signing_key_files\[0\]: must be an absolute path"):
        configured(tmp_path, previous_signing_key_files=["old.key"])
