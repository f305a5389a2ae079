"""`-o json|yaml` on the read commands: the same objects the HTTP API answers (a script written for
one works against the other), the old `--json` as a hidden alias, and text for people by default."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.cli import cli
from controller.cli.ops import node_data
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.report import build_report
from controller.run.rundir import Control, RunDir
from controller.swarm.backend import NodeInfo
from tests.builders import Env, api_env
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_policy import job_file, setup

JOB = "party-abcdefgh"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def tenant_job(env: Env, job: str = JOB) -> None:
    """A tenant's job as a runner leaves it mid-way: three photos planned, one ok, one failed."""
    area = Area(env.root, "acme")
    area.ensure(None)
    area.write_record(job, uploads=False)
    items = tuple(
        PlannedItem(f"i{n:06d}", f"tenants/acme/in/{n}.jpg", f"tenants/acme/out/{n}.jpg", "image") for n in range(3)
    )
    rd = RunDir(env.root, job)
    rd.create(b"name: x\n", Plan(job, items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(2), "sha256:x")
    now = time.time()
    lines = [
        ItemResult(items[0].id, ItemStatus.OK, 1, "/data/in/0.jpg", "/data/out/0.jpg", started=now, finished=now),
        ItemResult(
            items[1].id, ItemStatus.ERROR, 1, "/data/in/1.jpg", None, reason="no face", started=now, finished=now
        ),
    ]
    (rd.path / "results" / "c0000.jsonl").write_text("".join(line.to_line() for line in lines))


def ffswarm(env_or_config: Env | Path, *args: str) -> Result:
    config = env_or_config.config.path if isinstance(env_or_config, Env) else env_or_config
    return CliRunner().invoke(cli, ["--config", str(config), *args])


def code(result: Result) -> int | None:
    """The exit code `ffswarm` ends with: a usage or ffswarm error's own (main() exits with it)."""
    return getattr(result.exception, "exit_code", None)


def data(result: Result, fmt: str = "json") -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if fmt == "json" else yaml.safe_load(result.stdout)


def test_status_of_a_job_is_the_apis_status_object_in_json_and_yaml(env: Env) -> None:
    tenant_job(env)
    mine = data(ffswarm(env, "status", JOB, "-o", "json"))
    with env.client() as c:
        theirs = c.get(f"/v1/jobs/{JOB}").json()
    assert mine["job"] == JOB and mine["items"]["ok"] == 1 and mine["items"]["failed"] == 1
    assert {k: theirs[k] for k in mine} == mine  # every field the CLI prints, as the API answers it
    assert data(ffswarm(env, "status", JOB, "-o", "yaml"), "yaml") == mine
    assert data(ffswarm(env, "status", JOB, "--json")) == mine  # the old flag: the same output


def test_status_without_a_job_is_a_job_list_like_the_apis(env: Env) -> None:
    tenant_job(env)
    tenant_job(env, "other-abcdefgh")
    listed = data(ffswarm(env, "status", "-o", "json"))
    assert set(listed) == {"jobs", "next_cursor"} and listed["next_cursor"] is None
    assert sorted(j["job"] for j in listed["jobs"]) == ["other-abcdefgh", JOB]
    assert data(ffswarm(env, "status", JOB, "-o", "json")) in listed["jobs"]
    assert data(ffswarm(env, "status", "-o", "yaml"), "yaml") == listed


def test_text_stays_the_default_and_the_old_flag_is_hidden(env: Env) -> None:
    tenant_job(env)
    text = ffswarm(env, "status", JOB)
    assert text.exit_code == 0 and text.stdout.startswith(f"{JOB}: ") and "items 1/3 done, 1 failed" in text.stdout
    assert ffswarm(env, "status", JOB, "-o", "text").stdout == text.stdout
    shown = CliRunner().invoke(cli, ["status", "--help"]).output
    assert "-o, --output [text|json|yaml]" in shown and "--json" not in shown


def test_conflicting_or_misplaced_formats_are_usage_errors(env: Env) -> None:
    tenant_job(env)
    both = ffswarm(env, "status", JOB, "--json", "-o", "yaml")
    assert code(both) == 2 and "--json is -o json: it cannot go with -o yaml" in str(both.exception)
    follow = ffswarm(env, "status", JOB, "--follow", "-o", "yaml")
    assert code(follow) == 2 and "use -o json" in str(follow.exception)
    unknown = ffswarm(env, "status", JOB, "-o", "xml")
    assert unknown.exit_code == 2 and "'xml' is not one of 'text', 'json', 'yaml'" in unknown.output


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    _, root = setup(tmp_path)
    build_pack(root / "models" / "standin")
    path = tmp_path / "ffswarm.yaml"
    path.write_text(json.dumps({"data_root": str(root), "docker_host": "unix:///nonexistent/docker.sock"}))
    return path


def test_a_dry_run_prints_its_plan_as_json_or_yaml_and_only_a_dry_run_does(cfg: Path, tmp_path: Path) -> None:
    f = job_file(tmp_path)
    plan = data(ffswarm(cfg, "submit", "--dry-run", "-o", "json", str(f)))
    (job,) = plan["jobs"]
    assert job["job"] == "j" and len(job["items"]) == 3 and job["services"][0]["name"] == "ffswarm-j-c0000-a1"
    assert data(ffswarm(cfg, "submit", "--dry-run", "-o", "yaml", str(f)), "yaml") == plan
    assert data(ffswarm(cfg, "submit", "--dry-run", "--json", str(f))) == plan
    text = ffswarm(cfg, "submit", "--dry-run", str(f))
    assert text.exit_code == 0 and "`-o json` (or yaml) prints every item, chunk and service" in text.stdout
    refused = ffswarm(cfg, "submit", "-o", "yaml", str(f))
    assert code(refused) == 2 and "-o yaml goes with --dry-run" in str(refused.exception)
    assert not (tmp_path / "root" / "runs").exists()


def test_models_list_and_verify_as_data(cfg: Path) -> None:
    assert data(ffswarm(cfg, "models", "list", "-o", "json")) == {
        "packs": [{"name": "default", "standin": False}, {"name": "standin", "standin": True}]
    }
    text = ffswarm(cfg, "models", "list")
    assert text.stdout.splitlines()[0] == "default" and "STAND-IN" in text.stdout.splitlines()[1]
    report = data(ffswarm(cfg, "models", "verify", "standin", "-o", "yaml"), "yaml")
    assert report["pack"] == "standin" and report["ok"] is True and report["standin"] is True
    assert report["problems"] == [] and all(f["ok"] for f in report["files"]) and len(report["files"]) >= 3
    broken = ffswarm(cfg, "models", "verify", "default", "-o", "json")  # its checksums are stand-ins
    assert broken.exit_code == 66 and json.loads(broken.stdout)["ok"] is False


def test_doctor_as_data_lists_every_check_and_keeps_its_exit_code(cfg: Path) -> None:
    result = ffswarm(cfg, "doctor", "-o", "json")
    assert code(result) == 69  # no Docker engine at that socket
    found = json.loads(result.stdout)  # the checks alone on stdout; the failure line is not mixed in
    assert found["ok"] is False and [c["name"] for c in found["checks"]][-1] == "swarm"
    swarm = found["checks"][-1]
    assert swarm["ok"] is False and swarm["fix"] == "start dockerd; docker swarm init"
    assert set(swarm) == {"name", "ok", "detail", "fix", "warning"} and swarm["warning"] is False


def test_following_a_job_as_json_prints_status_objects_alone_on_stdout(cfg: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    items = tuple(PlannedItem(f"i{n:06d}", f"crowd/{n}.jpg", f"out/{n}.jpg", "image") for n in range(2))
    rd = RunDir(root, "j")
    job = job_file(tmp_path).read_bytes()
    rd.create(job, Plan("j", items, (Chunk("c0000", tuple(i.id for i in items)),)), {}, Control(1), "sha256:x")
    now = time.time()
    results = [
        ItemResult(i.id, ItemStatus.OK, 1, f"/data/{i.input}", f"/data/{i.output}", started=now, finished=now)
        for i in items
    ]
    (rd.path / "results" / "c0000.jsonl").write_text("".join(r.to_line() for r in results))
    chunks = {"c0000": ChunkRun("c0000", state=ChunkState.DONE)}
    rd.write_state({"c0000": {"state": "done", "attempts": [{"node": "n1"}]}})
    rd.write_report(build_report(rd.plan(), rd, chunks, "sha256:x", 1.0).to_dict())
    followed = ffswarm(cfg, "status", "j", "--follow", "-o", "json")
    assert followed.exit_code == 0, followed.output
    (line,) = followed.stdout.splitlines()  # the summary went to stderr: stdout is JSON lines
    assert json.loads(line)["phase"] == "finished" and json.loads(line)["items"]["ok"] == 2
    assert followed.stderr.startswith("job j: ")


def test_the_shell_completes_the_formats() -> None:
    env = {"_FFSWARM_COMPLETE": "bash_complete", "COMP_WORDS": "ffswarm status -o ", "COMP_CWORD": "3"}
    result = CliRunner().invoke(cli, [], prog_name="ffswarm", env=env)
    assert result.exit_code == 0 and result.output.split() == ["plain,text", "plain,json", "plain,yaml"]


def test_a_node_as_data_names_its_resources_and_labels_in_order() -> None:
    node = NodeInfo(
        "abcdef123456789", "gpu-1", "worker", "ready", "active", {"z": "1", "ffswarm.gpu": "true"}, {"GPU": 2}
    )
    assert node_data(node) == {
        "id": "abcdef123456789",
        "hostname": "gpu-1",
        "role": "worker",
        "state": "ready",
        "availability": "active",
        "generic_resources": {"GPU": 2},
        "labels": {"ffswarm.gpu": "true", "z": "1"},
    }
    assert list(node_data(node)["labels"]) == ["ffswarm.gpu", "z"]
