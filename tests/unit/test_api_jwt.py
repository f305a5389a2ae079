"""JWTs at a real `ffswarm api` on loopback, with real tokens made by PyJWT: the audience is required,
the tenant comes from the tenant claim or a listed subject (never the bare ``sub``), a token lives at
most ``max_lifetime`` from its ``iat``, and a short HMAC secret never gets the API started."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml

from controller.api.app import make_app
from controller.config import Config, parse_config
from controller.errors import ConfigError
from tests.builders import JWT_SECRET, Env, beat, make_config, serve_api


def reconfigured(tmp_path: Path, change: Any) -> Config:
    """make_config's config with ``change(data)`` applied to the file's data."""
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data)


def with_subjects(data: dict[str, Any]) -> None:
    data["tenants"]["globex"]["jwt_subjects"] = ["alice@idp.example"]
    data["api"]["jwt"]["max_lifetime"] = "2h"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config = reconfigured(tmp_path, with_subjects)
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, b"")


def token(**claims: Any) -> str:
    now = int(time.time())
    base: dict[str, Any] = {"aud": "ffswarm", "iat": now, "exp": now + 600}
    return jwt.encode({k: v for k, v in {**base, **claims}.items() if v is not None}, JWT_SECRET, algorithm="HS256")


def status(env: Env, bearer: str) -> int:
    with env.client(token=bearer) as c:
        return c.get("/v1/jobs").status_code


def test_the_tenant_is_the_tenant_claim_or_a_listed_subject_never_the_bare_sub(env: Env) -> None:
    with env.client() as c:  # acme has a job; globex has none
        c.get("/v1/jobs")
    assert status(env, token(sub="acme")) == 401  # a sub that happens to be a tenant's name is no one
    assert status(env, token(ffswarm_tenant="acme")) == 200
    assert status(env, token(sub="alice@idp.example")) == 200  # globex lists this subject
    with env.client(token=token(sub="alice@idp.example")) as c:
        assert c.get("/v1/jobs").json() == {"jobs": [], "next_cursor": None}
    assert status(env, token(sub="alice@idp.example", ffswarm_tenant="acme")) == 401  # the two disagree
    assert status(env, token(sub="alice@idp.example", ffswarm_tenant="globex")) == 200  # they agree
    assert status(env, token(ffswarm_tenant="nobody")) == 401
    assert status(env, token(ffswarm_tenant=["acme"])) == 401
    assert status(env, token(sub="bob@idp.example")) == 401


def test_audience_iat_and_the_lifetime_are_enforced(env: Env) -> None:
    now = int(time.time())
    assert status(env, token(ffswarm_tenant="acme", aud="another-service")) == 401
    assert status(env, token(ffswarm_tenant="acme", aud=None)) == 401  # no aud at all
    assert status(env, token(ffswarm_tenant="acme", iat=None)) == 401  # iat is required
    assert status(env, token(ffswarm_tenant="acme", iat=now - 60, exp=now - 60 + 2 * 3600)) == 200  # exactly 2h
    assert status(env, token(ffswarm_tenant="acme", iat=now - 60, exp=now - 60 + 2 * 3600 + 1)) == 401
    assert status(env, token(ffswarm_tenant="acme", iat=now + 3600, exp=now + 3600 + 600)) == 401  # iat ahead
    with env.client(token=token(ffswarm_tenant="acme", exp=now + 30 * 86400)) as c:
        r = c.get("/v1/jobs")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert "longer than this API allows" in r.json()["error"]["message"]


def test_a_custom_tenant_claim_is_the_only_claim_that_names_the_tenant(tmp_path: Path) -> None:
    config = reconfigured(tmp_path, lambda d: d["api"]["jwt"].update(tenant_claim="org"))
    beat(config)
    for url in serve_api(config):
        env = Env(config, config.data_root, url, b"")
        assert status(env, token(org="acme")) == 200
        assert status(env, token(ffswarm_tenant="acme")) == 401


def test_the_default_lifetime_is_a_day(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    assert config.api.jwt is not None and config.api.jwt.max_lifetime == 86400
    assert config.api.jwt.tenant_claim == "ffswarm_tenant"


def test_a_jwt_section_without_an_audience_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"api\.jwt\.audience: is required"):
        reconfigured(tmp_path, lambda d: d["api"]["jwt"].pop("audience"))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tenant_claim": "sub"}, "api.jwt.tenant_claim: must be a private claim name"),
        ({"max_lifetime": "forever"}, "api.jwt.max_lifetime: must be a duration"),
    ],
)
def test_bad_jwt_settings_are_refused_naming_the_key(tmp_path: Path, change: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        reconfigured(tmp_path, lambda d: d["api"]["jwt"].update(change))
    assert words in str(e.value)


def test_one_subject_cannot_mean_two_tenants(tmp_path: Path) -> None:
    def both(d: dict[str, Any]) -> None:
        d["tenants"]["acme"]["jwt_subjects"] = ["alice@idp.example"]
        d["tenants"]["globex"]["jwt_subjects"] = ["alice@idp.example"]

    with pytest.raises(ConfigError, match=r"tenants\.globex\.jwt_subjects\[0\]: is also a subject of tenant 'acme'"):
        reconfigured(tmp_path, both)


def test_an_hmac_secret_under_32_bytes_stops_the_api_at_start_without_showing_it(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)
    assert config.api.jwt is not None
    config.api.jwt.key_file.write_bytes(b"short-secret-31-bytes-long-xxxx\n")
    with pytest.raises(ConfigError) as e:
        make_app(config)
    assert "api.jwt.secret_file" in str(e.value) and "at least 32" in str(e.value)
    assert "short-secret" not in str(e.value)
    config.api.jwt.key_file.write_bytes(b"s" * 32)
    make_app(config)  # 32 bytes will do
