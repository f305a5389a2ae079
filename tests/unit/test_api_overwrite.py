"""``overwrite: true`` from an API tenant is gated by the same ``policy.allow_overwrite`` as a job
file given to the CLI or the inbox: a 422 naming the field and the policy key, over real HTTP."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.config import parse_config
from tests.builders import JPEG, Env, beat, make_config, serve_api


def post(tmp_path: Path, allow: bool | None) -> tuple[int, dict[str, object]]:
    config, key = make_config(tmp_path)
    if allow is not None:
        data = yaml.safe_load((tmp_path / "ffswarm.yaml").read_text())
        data["policy"] = {"allow_overwrite": allow}
        config = parse_config(tmp_path / "ffswarm.yaml", data)
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, key)
        with env.client() as c:
            c.get("/v1/jobs")  # the area is made on first use
            for rel in ("faces/me.jpg", "crowd/a.jpg"):
                (env.area() / rel).parent.mkdir(parents=True, exist_ok=True)
                (env.area() / rel).write_bytes(JPEG)
            body = {"source": "faces/me.jpg", "targets": ["crowd/*.jpg"], "overwrite": True, "resources": {"gpus": 0}}
            r = c.post("/v1/jobs", json=body)
        return r.status_code, r.json()
    raise AssertionError("the API did not start")


def test_a_tenants_overwrite_true_is_refused_by_default_naming_the_field_and_the_policy_key(tmp_path: Path) -> None:
    status, body = post(tmp_path, None)
    error = body["error"]
    assert status == 422 and isinstance(error, dict) and error["field"] == "overwrite"
    assert "policy.allow_overwrite" in error["message"]


def test_a_tenants_overwrite_true_is_accepted_when_the_operator_allows_it(tmp_path: Path) -> None:
    status, body = post(tmp_path, True)
    assert status == 202, body
