"""`ffswarm --api URL …` (the CLI's remote mode) on a machine with no Docker and no data root: the
command runs as its own process with ``DOCKER_HOST`` at a socket that does not exist, no config
anywhere, and only the API's URL and a token; a real API on loopback and a stand-in `serve`
(tests/unit/standin_serve.py) on the other side. It uploads a folder, follows the job to its end,
exits 0 or 1 as a local `submit` does, and downloads the results."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from rich.console import Console

from controller.cli import remote_run
from controller.cli.main import cli, main
from controller.client import Client
from tests.builders import JPEG, KEYS, PNG, Env, api_env
from tests.screen import is_bar, screen_lines
from tests.unit.standin_serve import StandinServe
from tests.unit.test_client import json_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


@pytest.fixture
def laptop(tmp_path: Path) -> Path:
    """A working folder with a face and a folder of photos (one named bad), and nothing of ffswarm's."""
    home = tmp_path / "laptop"
    (home / "photos" / "sub").mkdir(parents=True)
    (home / "me.jpg").write_bytes(JPEG)
    (home / "photos" / "a.jpg").write_bytes(JPEG)
    (home / "photos" / "sub" / "bad.png").write_bytes(PNG)
    return home


def ffswarm(
    laptop: Path, *args: str, api: str | None = None, token: str = KEYS["acme"]
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(laptop),
        "XDG_CONFIG_HOME": str(laptop / ".config"),
        "DOCKER_HOST": f"unix://{laptop}/no-docker.sock",
        "PYTHONPATH": str(ROOT),
        "FFSWARM_TOKEN": token,
    }
    if api is not None:
        env["FFSWARM_API_URL"] = api
    cmd = [sys.executable, "-m", "controller.cli", *args]
    return subprocess.run(cmd, cwd=laptop, env=env, capture_output=True, text=True, timeout=120, check=False)


def accepted(out: str) -> str:
    found = re.search(r"^job (\S+): accepted", out, re.M)
    assert found, out
    return found.group(1)


def test_a_folder_submitted_to_the_api_is_followed_to_exit_0_and_its_results_downloaded(env: Env, laptop: Path) -> None:
    with StandinServe(env.config):
        r = ffswarm(laptop, "submit", "--source", "me.jpg", "photos", "--name", "party", api=env.url)
    assert r.returncode == 0, r.stdout + r.stderr
    job = accepted(r.stdout)
    assert job.startswith("party-")
    assert f"job {job}: 2 ok, 0 without a face, 0 failed of 2 items" in r.stdout
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["phase"] == "finished"  # off a terminal: a JSON status line per change
    assert not (laptop / ".config").exists() and not (laptop / "no-docker.sock").exists()
    got = ffswarm(laptop, "--api", env.url, "results", job, "-o", "out.zip")
    assert got.returncode == 0, got.stderr
    with zipfile.ZipFile(laptop / "out.zip") as zf:
        assert sorted(Path(n).name for n in zf.namelist()) == ["a.jpg", "bad.png"]


def test_failed_items_exit_1_with_their_reasons_and_a_retry_runs_them_to_exit_0(env: Env, laptop: Path) -> None:
    with StandinServe(env.config, fails=lambda path: "bad" in path):
        r = ffswarm(laptop, "submit", "--source", "me.jpg", "photos", api=env.url)
        assert r.returncode == 1, r.stdout + r.stderr
        job = accepted(r.stdout)
        assert f"job {job}: 1 ok, 0 without a face, 1 failed of 2 items" in r.stdout
        assert "no face found" in r.stdout and "bad.png" in r.stdout
        logs = ffswarm(laptop, "logs", job, api=env.url)
        assert logs.returncode == 0 and re.search(r"bad\.png: no face found", logs.stdout), logs.stdout
        again = ffswarm(laptop, "retry", job, api=env.url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"job {job}: queued again (1 item(s) to run)" in again.stdout
    assert f"job {job}: 2 ok, 0 without a face, 0 failed of 2 items" in again.stdout


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def inproc(laptop: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`ffswarm …` in this process (faster than a process each), with the laptop's environment."""
    monkeypatch.chdir(laptop)
    for name in ("FFSWARM_CONFIG", "FFSWARM_API_URL", "FFSWARM_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(laptop / ".config"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{laptop}/no-docker.sock")

    def run(*args: str, api: str | None = None, token: str = KEYS["acme"]) -> Ran:
        monkeypatch.setenv("FFSWARM_TOKEN", token)
        if api is not None:
            monkeypatch.setenv("FFSWARM_API_URL", api)
        monkeypatch.setattr(sys, "argv", ["ffswarm", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def test_a_job_file_is_uploaded_with_its_settings_and_listed(
    env: Env, laptop: Path, inproc: Callable[..., Ran]
) -> None:
    (laptop / "holiday.yaml").write_text("name: holiday\nsource: me.jpg\ntargets: [photos/*.jpg]\nchunk_size: 7\n")
    r = inproc("submit", "holiday.yaml", "--detach", api=env.url)
    assert r.returncode == 0, r.stderr
    job = accepted(r.stdout)
    handed = (env.root / "inbox" / f"{job}.yaml").read_text()
    assert "chunk_size: 7" in handed and job.startswith("holiday-")
    listed = inproc("status", "--json", api=env.url)
    assert listed.returncode == 0 and [row["job"] for row in json.loads(listed.stdout)["jobs"]] == [job]
    text = inproc("status", job, api=env.url)
    assert text.stdout.strip() == f"{job}: queued"
    cancelled = inproc("cancel", job, api=env.url)
    assert cancelled.returncode == 0 and inproc("status", job, api=env.url).stdout.startswith(f"{job}: cancelled")


@pytest.mark.parametrize(
    ("args", "token", "code", "words"),
    [
        (["submit", "--source", "me.jpg", "photos", "--name", "Bad Name"], KEYS["acme"], 65, "name: must be"),
        (["status", "nope-aaaaaaaa"], KEYS["acme"], 2, "no job 'nope-aaaaaaaa'"),
        (["status"], "wrong", 78, "FFSWARM_TOKEN"),
        (["results", "x"], KEYS["acme"], 2, "--api URL"),
        (["submit", "photos"], KEYS["acme"], 2, "--source PHOTO"),
    ],
)
def test_refusals_exit_with_the_clis_codes(
    env: Env, inproc: Callable[..., Ran], args: list[str], token: str, code: int, words: str
) -> None:
    r = inproc(*args, api=None if args[0] == "results" else env.url, token=token)
    assert r.returncode == code, r.stdout + r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_on_a_terminal_a_followed_job_draws_the_same_bar_as_a_local_run(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, force_interactive=True, width=80)
    with Client(env.url, KEYS["acme"]) as c:
        job = json_job(env, c)
        ctx = click.Context(cli, obj={"console": console})
        with ctx, StandinServe(env.config, fails=lambda path: "bad" in path):
            code = remote_run.follow(ctx, c, job)
    assert code == 1
    shown = screen_lines(buf.getvalue().encode(), onlcr=True)
    assert any(is_bar(line) and "3/3 items" in line and "1 failed" in line for line in shown), shown
    assert f"job {job}: 2 ok, 0 without a face, 1 failed of 3 items" in capsys.readouterr().out
