"""What `submit` and the other job commands say (issue 21, points 8, 9 and 11): every error of every job
file at once, a short human dry run, and the small slips (logs of an unknown chunk, no config, retry's
default, the stand-in pack, the Ctrl-C hint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.errors import JobFileError
from controller.job.files import JobFileErrors, load_jobs
from controller.job.plan import Chunk, Plan, PlannedItem, PlannedVideo
from controller.run import dryrun
from controller.run import jobs as jobs_mod
from controller.run.rundir import Control, RunDir
from tests.fixtures.standin_pack import build_pack
from tests.unit.test_policy import setup

FOUR_MISTAKES = """\
name: Holiday
source: faces/star.jpg
targets: [crowd/*.jpg]
output: out/{stem}{ext}
chunk_size: -5
retries: lots
procesors: [face_swapper]
"""


def test_every_error_of_a_job_file_is_reported_with_its_field_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(FOUR_MISTAKES + "max_concurrent: 0\n")
    with pytest.raises(JobFileErrors) as e:
        load_jobs([f])
    assert e.value.exit_code == 65
    fields = [(x.field, getattr(x, "line", None)) for x in e.value.errors]  # type: ignore[attr-defined]
    assert fields == [("name", 1), ("chunk_size", 5), ("retries", 6), ("procesors", 7), ("max_concurrent", 8)]
    text = str(e.value).splitlines()
    assert text[3] == f"{f}: procesors: unknown key (did you mean 'processors'?) (line 7)"
    assert all(line.startswith(f"{f}: ") for line in text) and len(text) == 5
    assert "lots" not in str(e.value).replace("'lots'", "")  # values named only as the field's own


def test_every_bad_file_of_a_folder_is_reported(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.yaml").write_text("name: a\nsource: faces/a.jpg\ntargets: x\noutput: o/{stem}{ext}\nretries: -1\n")
    (jobs / "b.yaml").write_text("name: b\nsource: faces/b.jpg\noutput: o/{stem}{ext}\n")
    with pytest.raises(JobFileErrors) as e:
        load_jobs([jobs])
    assert [(Path(x.file).name, x.field) for x in e.value.errors] == [("a.yaml", "retries"), ("b.yaml", "targets")]  # type: ignore[attr-defined]


def test_prepare_collects_the_errors_of_every_stage_of_every_file(tmp_path: Path) -> None:
    config, root = setup(tmp_path)
    bad_policy = tmp_path / "p.yaml"
    bad_policy.write_text("name: p\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"
                          "resources: {gpus: 4}\n")  # fmt: skip
    no_match = tmp_path / "m.yaml"
    no_match.write_text("name: m\nsource: faces/star.jpg\ntargets: [nothing/*.jpg]\noutput: out/{stem}{ext}\n")
    with pytest.raises(JobFileErrors) as e:
        jobs_mod.prepare(config, [bad_policy, no_match], new=False)
    assert [(Path(x.file).name, x.field) for x in e.value.errors] == [
        ("p.yaml", "resources.gpus"),
        ("m.yaml", "targets"),
    ]  # type: ignore[attr-defined]
    assert not (root / "runs").exists()


def test_one_error_reads_as_before(tmp_path: Path) -> None:
    f = tmp_path / "one.yaml"
    f.write_text("name: one\nsource: faces/a.jpg\ntargets: x\noutput: o/{stem}{ext}\nretries: -1\n")
    with pytest.raises(JobFileError) as e:
        load_jobs([f])
    assert not isinstance(e.value, JobFileErrors) and str(e.value) == f"{f}: retries: must be an integer ≥ 0, got -1"


# -- 9. dry run -------------------------------------------------------------------------------------------
def test_the_dry_run_is_a_short_plan_naming_a_videos_final_output(tmp_path: Path) -> None:
    config, _ = setup(tmp_path)
    f = tmp_path / "j.yaml"
    f.write_text("name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\nchunk_size: 2\n")
    (job,) = jobs_mod.prepare(config, [f], new=False)
    items = (
        *job.plan.items,
        PlannedItem("i000010", "clips/v.mp4", "runs/j/segments/i000010.mp4", "segment", parent="v000000"),
        PlannedItem("i000011", "clips/v.mp4", "runs/j/segments/i000011.mp4", "segment", parent="v000000"),
    )
    video = PlannedVideo("v000000", "clips/v.mp4", "out/v.mp4", ("i000010", "i000011"))
    plan = Plan("j", items, (*job.plan.chunks, Chunk("c0009", ("i000010", "i000011"))), (video,))
    job = type(job)(job.file, job.spec, job.resolved, plan, "j", job.folders)
    lines = dryrun.plan_lines(config, [job], lambda ref: "sha256:pinned")
    text = "\n".join(lines)
    assert lines[0] == f"job j ({f}): 4 items — 3 images, 1 video (2 segments)"
    assert "chunks: 3, at most 4 at once" in text
    assert "services: 3 one-shot (ffswarm-j-c0000-a1 … ffswarm-j-c0009-a1), image sha256:pinned" in text
    assert "constraints: node.labels.ffswarm.gpu==true" in text and "reserves: GPU×1, memory 6 GiB" in text
    assert "outputs: out/ (3 images)" in text and "video: clips/v.mp4 → out/v.mp4" in text
    assert "segments/" not in text and len(lines) < 15
    full = dryrun.plan_json(config, [job], lambda ref: "sha256:pinned")
    assert len(full["jobs"][0]["items"]) == 5 and json.dumps(full)  # --json: everything, as before


# -- 11. small slips --------------------------------------------------------------------------------------
@pytest.fixture
def cfg(tmp_path: Path) -> tuple[Path, Path]:
    config, root = setup(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    path.write_text(json.dumps({"data_root": str(root), "docker_host": "unix:///nonexistent/docker.sock"}))
    return path, root


def test_logs_of_an_unknown_chunk_names_the_jobs_chunks_and_exits_2(cfg: tuple[Path, Path]) -> None:
    path, root = cfg
    items = tuple(PlannedItem(f"i{n:06d}", f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(2))
    plan = Plan("j", items, (Chunk("c0000", ("i000000",)), Chunk("c0001", ("i000001",))))
    RunDir(root, "j").create(b"name: j\n", plan, {}, Control(1), "x")
    result = CliRunner().invoke(cli, ["--config", str(path), "logs", "j", "--chunk", "c9999"])
    assert getattr(result.exception, "exit_code", None) == 2
    assert "job j has no chunk 'c9999'; its 2 chunk(s): c0000, c0001" in str(result.exception)


def test_no_config_is_exit_78_and_says_how_to_name_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FFSWARM_CONFIG", raising=False)
    monkeypatch.setattr("sys.argv", ["ffswarm", "status"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 78


def test_no_config_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FFSWARM_CONFIG", raising=False)
    result = CliRunner().invoke(cli, ["status"])
    assert "export FFSWARM_CONFIG=" in str(result.exception)


def test_retry_needs_no_flag_and_still_takes_failed(cfg: tuple[Path, Path]) -> None:
    path, _ = cfg
    for args in (["retry", "nosuch"], ["retry", "nosuch", "--failed"]):
        result = CliRunner().invoke(cli, ["--config", str(path), *args])
        assert "no job 'nosuch'" in str(result.exception)  # got past the parsing: no "Missing option"


def test_models_verify_says_stand_in_and_lists_the_packs_that_exist(cfg: tuple[Path, Path]) -> None:
    path, root = cfg
    build_pack(root / "models" / "standin")
    result = CliRunner().invoke(cli, ["--config", str(path), "models", "verify", "standin"])
    assert result.exit_code == 0, result.output
    assert "standin: OK — the STAND-IN test pack: not real face swaps" in result.output.splitlines()[0]
    result = CliRunner().invoke(cli, ["--config", str(path), "models", "verify", "nosuch"])
    assert "no pack 'nosuch' under models/ (installed: default, standin)" in str(result.exception)
    assert getattr(result.exception, "exit_code", None) == 66


def test_an_interrupted_submit_names_the_real_job(cfg: tuple[Path, Path]) -> None:
    from controller.cli import jobs as cli_jobs
    from controller.errors import Interrupted

    def interrupted(_: object) -> None:
        raise KeyboardInterrupt

    import click

    with click.Context(cli, obj={"config_path": str(cfg[0]), "console": None}), pytest.raises(Interrupted) as e:
        cli_jobs._run_with_progress(interrupted, "ffswarm resume nc-intr2")
    assert str(e.value).endswith("Continue with: ffswarm resume nc-intr2") and "JOB" not in str(e.value)
