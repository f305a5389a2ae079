"""The config's api: and tenants: sections, parsed strictly (docs/api.md#config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.config import parse_config
from controller.errors import ConfigError, UsageError

KEY = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def config(tmp_path: Path, **extra: Any):  # type: ignore[no-untyped-def]
    return parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path), **extra})


def test_tenants_and_api_are_read_with_their_defaults(tmp_path: Path) -> None:
    c = config(
        tmp_path,
        api={
            "listen": "0.0.0.0:9000",
            "link_ttl": "7d",
            "jwt": {"algorithms": ["RS256"], "public_key_file": "/k.pub", "audience": "ffswarm"},
        },
        tenants={
            "acme": {"api_keys_sha256": [KEY.upper()], "quota": {"upload": "2GiB", "jobs_queued": 5}, "weight": 3}
        },
    )
    acme = c.tenants["acme"]
    assert acme.api_keys_sha256 == (KEY,) and acme.weight == 3
    assert acme.quota.upload == 2 * 1024**3 and acme.quota.jobs_queued == 5 and acme.quota.stored == 200 * 1024**3
    assert c.api.link_ttl == 7 * 86400 and c.api.jwt is not None and c.api.jwt.key_file == Path("/k.pub")
    assert config(tmp_path).tenants == {}
    assert c.api.workers == 1 and config(tmp_path, api={"workers": 4}).api.workers == 4


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tenants": {"Acme!": {}}}, "tenant name 'Acme!'"),
        ({"tenants": {"acme": {"api_keys_sha256": ["abc"]}}}, "tenants.acme.api_keys_sha256[0]: must be 64 hex"),
        (
            {"tenants": {"acme": {"quota": {"uploads": "1g"}}}},
            "tenants.acme.quota.uploads: unknown key (did you mean 'upload'?)",
        ),
        (
            {"tenants": {"a": {"api_keys_sha256": [KEY]}, "b": {"api_keys_sha256": [KEY]}}},
            "is also a key of tenant 'a'",
        ),
        ({"api": {"jwt": {"algorithms": ["HS256", "RS256"], "secret_file": "/s"}}}, "mixes HMAC"),
        (
            {"api": {"jwt": {"algorithms": ["RS256"], "secret_file": "/s"}}},
            "api.jwt.secret_file: does not go with RS256",
        ),
        ({"api": {"jwt": {"algorithms": ["none"], "secret_file": "/s"}}}, "unknown algorithm 'none'"),
        ({"api": {"listen": "8080"}}, "api.listen: must be HOST:PORT"),
        ({"api": {"link_ttl": "soon"}}, "api.link_ttl: must be a duration"),
        ({"api": {"workers": 0}}, "api.workers: must be an integer from 1 to 64, got 0"),
    ],
)
def test_a_bad_section_is_refused_naming_the_field(tmp_path: Path, extra: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        config(tmp_path, **extra)
    assert words in str(e.value)


def test_the_api_command_refuses_a_bad_listen_address_and_a_config_without_tenants(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"data_root: {tmp_path}\ntenants: {{acme: {{api_keys_sha256: [{KEY}]}}}}\n")
    r = CliRunner().invoke(cli, ["--config", str(path), "api", "--listen", "nowhere"])
    assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2  # main() exits with it
    assert "--listen: must be HOST:PORT" in str(r.exception)
    path.write_text(f"data_root: {tmp_path}\n")
    r = CliRunner().invoke(cli, ["--config", str(path), "api"])
    assert isinstance(r.exception, UsageError) and "no tenants" in str(r.exception)
