"""A job's identity is the job file that started it (issue 15 d): a different file under an existing
name is refused and the other user's run is untouched; the same file continues the run."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from controller.config import Config
from controller.errors import JobFileError
from controller.run import jobs as jobs_mod
from controller.run.rundir import Control, RunDir
from tests.unit.test_policy import job_file, setup


def started(tmp_path: Path) -> tuple[Config, Path, RunDir]:
    config, root = setup(tmp_path)
    alice = job_file(tmp_path, "retries: 1\n")
    job = jobs_mod.prepare(config, [alice], new=False)[0]
    rundir = RunDir(root, job.job_id)
    rundir.create(alice.read_bytes(), job.plan, {}, Control(4), "sha256:1")
    return config, alice, rundir


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_run_folder_records_the_job_files_digest(tmp_path: Path) -> None:
    _, alice, rundir = started(tmp_path)
    digest = hashlib.sha256(alice.read_bytes()).hexdigest()
    assert rundir.layout.job_sha256.read_text() == digest + "\n"
    assert rundir.job_digest() == digest


def test_a_different_job_file_under_an_existing_name_is_refused(tmp_path: Path) -> None:
    config, _, rundir = started(tmp_path)
    before = snapshot(rundir.path)
    bob = tmp_path / "bob.yaml"
    bob.write_text("name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\nretries: 5\n")
    with pytest.raises(JobFileError) as e:
        jobs_mod.prepare(config, [bob], new=False)
    assert str(e.value) == f"{bob}: name: job j exists with a different job file; use --new"
    assert e.value.exit_code == 65
    assert snapshot(rundir.path) == before  # Alice's run is untouched
    assert [j.job_id for j in jobs_mod.prepare(config, [bob], new=True)] == ["j-2"]


def test_the_same_job_file_continues_its_run(tmp_path: Path) -> None:
    config, alice, rundir = started(tmp_path)
    assert [j.job_id for j in jobs_mod.prepare(config, [alice], new=False)] == ["j"]
    frozen = rundir.layout.job_file  # what `render JOB` prepares again
    assert [j.job_id for j in jobs_mod.prepare(config, [frozen], new=False)] == ["j"]


def test_a_run_folder_without_job_sha256_is_compared_by_its_frozen_file(tmp_path: Path) -> None:
    config, alice, rundir = started(tmp_path)
    rundir.layout.job_sha256.unlink()
    assert [j.job_id for j in jobs_mod.prepare(config, [alice], new=False)] == ["j"]
    rundir.layout.job_sha256.write_text("not a digest\n")  # read back as hostile: ignored
    assert rundir.job_digest() == hashlib.sha256(alice.read_bytes()).hexdigest()


def test_a_symlinked_digest_is_not_followed(tmp_path: Path) -> None:
    config, alice, rundir = started(tmp_path)
    other = tmp_path / "other.sha256"
    other.write_text("0" * 64 + "\n")
    rundir.layout.job_sha256.unlink()
    os.symlink(other, rundir.layout.job_sha256)
    assert rundir.job_digest() == hashlib.sha256(alice.read_bytes()).hexdigest()
