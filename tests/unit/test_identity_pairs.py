"""The identity step of a pairs job (issue 18), driven through the in-memory FakeSwarm: one person
without a face does not refuse the job; an answer that leaves a person out does."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.identity import IdentityRequest, IdentityResult
from contract.identity_table import Identity
from controller.config import Config
from controller.errors import JobFileError
from controller.run.jobs import PreparedJob
from controller.run.rundir import RunDir
from controller.run.usecase import supervise
from tests.fakes import FakeSwarm
from tests.unit.test_identity_step import job_from_text

IMAGE = "sha256:" + "1" * 64
EMBEDDING = tuple([0.0] * 511 + [1.0])


def pairs_job(tmp_path: Path) -> tuple[Config, PreparedJob, RunDir]:
    return job_from_text(
        tmp_path,
        "name: j\noutput: out/{stem}{ext}\nchunk_size: 1\nretries: 0\npairs:\n"
        "  - {source: faces/star.jpg, target: crowd/a.jpg}\n"
        "  - {source: faces/blank.jpg, target: crowd/b.jpg}\n",
    )


def test_a_faceless_person_does_not_refuse_a_pairs_job(tmp_path: Path) -> None:
    config, job, rundir = pairs_job(tmp_path)
    request = IdentityRequest.from_json(rundir.layout.identity_request.read_text())
    assert {k: v.sources for k, v in request.identities.items()} == {
        "s000000": ("/data/faces/star.jpg",),
        "s000001": ("/data/faces/blank.jpg",),
    }
    people = {
        "s000000": Identity(("/data/faces/star.jpg",), embedding=EMBEDDING),
        "s000001": Identity(("/data/faces/blank.jpg",), error="source photo faces/blank.jpg: no face detected"),
    }
    swarm = FakeSwarm()
    swarm.on_end["identity"] = lambda: rundir.layout.identity.write_text(IdentityResult(identities=people).to_json())
    supervise(config, swarm, job, rundir, IMAGE)  # no JobFileError: the runners fail that pair alone
    assert rundir.path.exists() and swarm.alive() == []


def test_an_answer_that_leaves_a_person_out_refuses_the_job(tmp_path: Path) -> None:
    config, job, rundir = pairs_job(tmp_path)
    partial = {"s000000": Identity(("/data/faces/star.jpg",), embedding=EMBEDDING)}
    swarm = FakeSwarm()
    swarm.on_end["identity"] = lambda: rundir.layout.identity.write_text(IdentityResult(identities=partial).to_json())
    with pytest.raises(JobFileError, match="a person is missing"):
        supervise(config, swarm, job, rundir, IMAGE)
    assert not rundir.path.exists()
