"""The submit-time identity step beside the first chunks (controller/run/identity.py, jobs.supervise),
driven through the in-memory FakeSwarm: what runs when, what a refusal leaves, what resume redoes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.identity import IdentityRequest, IdentityResult
from controller.config import Config, parse_config
from controller.errors import FfswarmError, JobFileError
from controller.run import identity
from controller.run.jobs import PreparedJob, prepare, runner_settings, start_run
from controller.run.rundir import RunDir
from controller.run.usecase import supervise
from controller.swarm.backend import NodeState, ServiceState
from controller.swarm.servicespec import LABEL_ROLE
from tests import builders
from tests.fakes import FakeSwarm, Outcome
from tests.unit.test_submit_checks import setup

IMAGE = "sha256:" + "1" * 64
IDENTITY = "ffswarm-j-identity"
EMBEDDING = tuple([0.0] * 511 + [1.0])


def new_job(tmp_path: Path, extra: str = "") -> tuple[Config, PreparedJob, RunDir]:
    return job_from_text(
        tmp_path,
        "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\n"
        "chunk_size: 1\nmax_concurrent: 2\nretries: 0\n" + extra,
    )


def job_from_text(
    tmp_path: Path, text: str, adjust: Callable[[PreparedJob], PreparedJob] = lambda j: j
) -> tuple[Config, PreparedJob, RunDir]:
    """A job file's run folder, started, on a small data root (photos crowd/{a,b}.jpg, faces/*.jpg)."""
    root = setup(tmp_path, builders.PACK)
    for rel in ("crowd/b.jpg", "faces/ref.jpg", "faces/blank.jpg"):
        (root / rel).write_bytes(b"x")
    config = parse_config(
        tmp_path / "ffswarm.yaml",
        {"data_root": str(root), "docker_host": "unix:///nonexistent/docker.sock", "runner_user": "10001:10001"},
    )
    f = tmp_path / "job.yaml"
    f.write_text(text)
    (job,) = prepare(config, [f], new=False)
    job = adjust(job)
    return config, job, start_run(config, job, IMAGE)


def answer(rundir: RunDir, result: IdentityResult, log: list[list[str]], swarm: FakeSwarm) -> Callable[[], None]:
    def effect() -> None:
        log.append(sorted(swarm.alive()))
        rundir.layout.identity.write_text(result.to_json())

    return effect


def test_identity_runs_beside_the_first_chunks_on_the_cpu_without_a_gpu(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    assert IdentityResult.from_json(rundir.layout.identity.read_text()).pending
    manifest = rundir.manifest("c0000")
    assert manifest.identity == "/data/runs/j/identity/identity.json" and manifest.source_embedding is None
    assert manifest.identity_timeout == config.schedule_timeout + 600 + 60
    request = IdentityRequest.from_json((rundir.path / "identity-request.json").read_text())
    assert request.providers == ("cpu",) and request.sources == ("/data/faces/star.jpg",)

    swarm = FakeSwarm()
    alive_at_answer: list[list[str]] = []
    swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), alive_at_answer, swarm)
    supervise(config, swarm, job, rundir, IMAGE)

    assert alive_at_answer == [["ffswarm-j-c0000-a1", "ffswarm-j-c0001-a1", IDENTITY]]  # chunks did not wait
    step = next(s for s in swarm.created if s.name == IDENTITY)
    chunk = next(s for s in swarm.created if s.name == "ffswarm-j-c0000-a1")
    assert dict(step.generic_resources) == {} and dict(chunk.generic_resources) == {"GPU": 1}
    assert step.labels[LABEL_ROLE] == "identity" and step.constraints == chunk.constraints
    assert step.command[-3:] == ("identity", "--request", "/data/runs/j/identity-request.json")
    assert swarm.alive() == []
    assert IdentityResult.from_json(rundir.layout.identity.read_text()).source_embedding == EMBEDDING


def test_a_refused_identity_removes_the_jobs_services_and_run_folder(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    swarm = FakeSwarm(
        script={
            ("identity", 1): Outcome("failed", 66, "task: non-zero exit (66)"),
            ("c0000", 1): Outcome("running"),
            ("c0001", 1): Outcome("running"),
        }
    )
    alive_at_answer: list[list[str]] = []
    refusal = IdentityResult(error="source photo /data/faces/star.jpg: no face detected")
    swarm.on_end["identity"] = answer(rundir, refusal, alive_at_answer, swarm)
    with pytest.raises(JobFileError) as e:
        supervise(config, swarm, job, rundir, IMAGE)
    assert str(e.value).endswith("source: source photo faces/star.jpg: no face detected")
    assert e.value.exit_code == 65
    assert len(alive_at_answer[0]) == 3  # the chunks had started beside it…
    assert swarm.alive() == [] and not rundir.path.exists()  # …and nothing of the job is left


def test_a_refused_reference_photo_is_the_reference_fields_error(tmp_path: Path) -> None:
    """The step names photos as the job file does (faces/ref.jpg, not /data/faces/ref.jpg)."""
    config, job, rundir = new_job(tmp_path, "faces: reference\nreference: faces/ref.jpg\n")
    swarm = FakeSwarm(script={("identity", 1): Outcome("failed", 66, "task: non-zero exit (66)")})
    refusal = IdentityResult(error="reference photo faces/ref.jpg: no face detected")
    swarm.on_end["identity"] = answer(rundir, refusal, [], swarm)
    with pytest.raises(JobFileError) as e:
        supervise(config, swarm, job, rundir, IMAGE)
    assert str(e.value).endswith("reference: reference photo faces/ref.jpg: no face detected")


def test_resume_reruns_a_step_that_a_dead_controller_left_pending(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    swarm = FakeSwarm()
    stale_log: list[list[str]] = []
    swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), stale_log, swarm)
    # The first controller created the step and died: its service is still there, its answer pending.
    identity.Step(config, swarm, runner_settings(config, job, IMAGE), rundir, str(job.file))
    assert swarm.alive() == [IDENTITY]
    supervise(config, swarm, job, rundir, IMAGE)
    assert [s.name for s in swarm.created].count(IDENTITY) == 2  # removed and created afresh
    assert swarm.alive() == [] and len(stale_log) == 1


def test_a_job_whose_identity_is_known_runs_no_step(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    rundir.layout.identity.write_text(IdentityResult(source_embedding=EMBEDDING).to_json())
    swarm = FakeSwarm()
    supervise(config, swarm, job, rundir, IMAGE)
    assert IDENTITY not in [s.name for s in swarm.created]


def test_a_job_whose_chunks_embed_their_people_runs_no_step_and_no_chunk_waits(tmp_path: Path) -> None:
    """A pack (PreparedJob.people_in_chunks): its chunks start at once and embed their own people;
    resumed, it still runs no step (the decision is read back from its manifests)."""
    config, packed, rundir = job_from_text(
        tmp_path,
        "name: j\nsource: faces/star.jpg\ntargets: [crowd/*.jpg]\noutput: out/{stem}{ext}\nchunk_size: 1\n",
        lambda j: dataclasses.replace(j, people_in_chunks=True),
    )
    assert not rundir.layout.identity.exists()  # no "pending" answer for anyone to wait on
    assert rundir.layout.identity_request.exists()  # what the job read (usage's bytes in)
    assert all(rundir.manifest(c.id).identity is None for c in rundir.plan().chunks)
    swarm = FakeSwarm()
    supervise(config, swarm, packed, rundir, IMAGE)
    created = [s.name for s in swarm.created]
    assert created and not [n for n in created if n.endswith("-identity")], created
    assert identity.start(config, swarm, runner_settings(config, packed, IMAGE), rundir, "pack") is None


def test_a_step_ended_by_its_node_after_answering_counts_as_answered(tmp_path: Path) -> None:
    """Its node drained (task "shutdown") just after identity.json was written: the answer stands."""
    config, job, rundir = new_job(tmp_path)
    swarm = FakeSwarm(script={("identity", 1): Outcome("shutdown", None, "node drained")})
    swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), [], swarm)
    supervise(config, swarm, job, rundir, IMAGE)
    assert [s.name for s in swarm.created].count(IDENTITY) == 1
    assert swarm.alive() == [] and rundir.path.exists()


def test_a_step_ended_by_its_node_before_answering_runs_again(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    swarm = FakeSwarm(script={("identity", 1): Outcome("shutdown", None, "node drained")})

    write = answer(rundir, IdentityResult(source_embedding=EMBEDDING), [], swarm)

    def ended() -> None:
        if IDENTITY not in swarm.removed:  # the drained first service: ended without an answer
            swarm.script[("identity", 1)] = Outcome()  # the next one runs on a node that stays
            swarm.on_end["identity"] = ended
        else:
            write()

    swarm.on_end["identity"] = ended
    supervise(config, swarm, job, rundir, IMAGE)
    assert [s.name for s in swarm.created].count(IDENTITY) == 2
    assert IdentityResult.from_json(rundir.layout.identity.read_text()).source_embedding == EMBEDDING


def test_a_step_whose_node_dies_runs_again_on_another_node(tmp_path: Path) -> None:
    """Engine 20.10 leaves a dead node's task "running": the step is moved like a chunk would be, so
    the first chunks (holding GPUs while they wait) are not kept waiting for its whole timeout."""
    config, job, rundir = new_job(tmp_path)
    n1, n2 = NodeState("node-1", "n1", "ready", "active", 2), NodeState("node-2", "n2", "ready", "active", 2)
    swarm = FakeSwarm(node_states=[n1, n2], script={("identity", 1): Outcome("running")})
    polls = 0

    def dies_after_a_while() -> list[NodeState]:
        nonlocal polls
        polls += 1
        if polls == 3:  # node-1, where the step (and the chunks) run, goes down
            swarm.node_states = [dataclasses.replace(n1, state="down"), n2]
            swarm.script[("identity", 1)] = Outcome()
            swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), [], swarm)
        return list(swarm.node_states)

    swarm.nodes = dies_after_a_while  # type: ignore[method-assign]
    supervise(config, swarm, job, rundir, IMAGE)
    steps = [s for s in swarm.created if s.name == IDENTITY]
    assert len(steps) == 2
    assert IdentityResult.from_json(rundir.layout.identity.read_text()).source_embedding == EMBEDDING


def test_a_docker_error_after_the_identity_answered_keeps_the_run_folder(tmp_path: Path) -> None:
    """Only the identity step's refusal removes the job: a later error (the daemon unreachable for a
    moment) ends this controller, and the run folder with its committed results stays for resume."""
    config, job, rundir = new_job(tmp_path)
    (rundir.path / "results" / "c0000.jsonl").write_text("committed results\n")

    class Flaky(FakeSwarm):
        def services(self, job: str) -> list[ServiceState]:
            if IDENTITY in self.removed:  # the step has answered and gone
                raise FfswarmError("listing services of job j: Docker said: connection refused")
            return super().services(job)

    swarm = Flaky(script={("c0000", 1): Outcome("running"), ("c0001", 1): Outcome("running")})
    swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), [], swarm)
    with pytest.raises(FfswarmError, match="connection refused"):
        supervise(config, swarm, job, rundir, IMAGE)
    assert (rundir.path / "results" / "c0000.jsonl").read_text() == "committed results\n"
    assert sorted(swarm.alive()) == ["ffswarm-j-c0000-a1", "ffswarm-j-c0001-a1"]  # left for resume to adopt
