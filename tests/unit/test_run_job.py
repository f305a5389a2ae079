"""The one "run a job" use case (controller/run/usecase.py): the image pinned by the run folder, the
stages recorded in state.json, every event to every sink, driven through the in-memory FakeSwarm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.identity import IdentityResult
from controller.job import claims
from controller.run import usecase
from controller.run.metrics import Metrics
from controller.run.rundir import RunDir, Stage
from controller.run.status import job_status
from tests.fakes import FakeSwarm
from tests.unit.test_identity_step import EMBEDDING, IMAGE, answer, new_job

MOVED = "sha256:" + "2" * 64


def stages_of(rundir: RunDir, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    enter = rundir.enter

    def record(stage: Stage, chunks: dict[str, Any] | None = None) -> dict[str, Any]:
        seen.append(stage.value)
        return enter(stage, chunks)

    monkeypatch.setattr(rundir, "enter", record)
    return seen


def test_the_stages_are_recorded_in_state_json_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, job, rundir = new_job(tmp_path)
    swarm = FakeSwarm()
    swarm.on_end["identity"] = answer(rundir, IdentityResult(source_embedding=EMBEDDING), [], swarm)
    seen = stages_of(rundir, monkeypatch)
    usecase.supervise(config, swarm, job, rundir, IMAGE)
    assert seen == ["identity", "chunks", "videos", "report", "ended"]  # no hooks in this job
    assert (rundir.state() or {})["stage"] == "ended"
    assert job_status(rundir)["phase"] in ("finished", "stopped")


def test_a_resumed_job_whose_identity_is_known_starts_at_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, job, rundir = new_job(tmp_path)
    rundir.layout.identity.write_text(IdentityResult(source_embedding=EMBEDDING).to_json())
    seen = stages_of(rundir, monkeypatch)
    usecase.supervise(config, FakeSwarm(), job, rundir, IMAGE)
    assert seen[0] == "chunks"


def test_the_run_folder_pins_the_image_after_the_tag_moved(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)  # created with IMAGE in image.json
    swarm = FakeSwarm(images={config.image: MOVED})
    reopened, image = usecase.open_or_start(config, swarm, job)
    assert image == IMAGE and reopened.image() == IMAGE
    rundir.layout.identity.write_text(IdentityResult(source_embedding=EMBEDDING).to_json())
    report = usecase.run(config, swarm, job)
    assert report.image == IMAGE
    assert swarm.created and {s.image for s in swarm.created} == {IMAGE}


def test_a_new_run_resolves_the_tag_once_and_records_it(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path)
    claims.release(config.data_root, "j")  # j-2 plans j's outputs: j must let them go first
    job = type(job)(job.file, job.spec, job.resolved, job.plan, "j-2", job.folders)
    swarm = FakeSwarm(images={config.image: MOVED})
    fresh, image = usecase.open_or_start(config, swarm, job)
    assert image == MOVED and fresh.image() == MOVED and fresh.job == "j-2"


def test_every_sink_gets_every_event_and_the_textfile_the_jobs_gpu_count(tmp_path: Path) -> None:
    config, job, rundir = new_job(tmp_path, "resources: {gpus: 0}\n")  # the textfile path once said 1
    rundir.layout.identity.write_text(IdentityResult(source_embedding=EMBEDDING).to_json())
    events: dict[str, list[str]] = {"a": [], "b": []}
    metrics, textfile = Metrics(), tmp_path / "ffswarm.prom"
    made: list[Any] = []

    def recorder(name: str) -> usecase.SinkFactory:
        return lambda rd, j: lambda event, **fields: events[name].append(event)

    def textfile_sink(rd: RunDir, j: Any) -> Any:
        made.append(metrics.textfile_sink(rd, j.spec.resources.gpus, textfile))
        return made[-1]

    usecase.run(config, FakeSwarm(), job, [recorder("a"), recorder("b"), textfile_sink])
    assert events["a"] == events["b"] and events["a"][0] == "job_started" and events["a"][-1] == "job_finished"
    assert made[0].sink.state.gpus_per_chunk == 0
    assert "ffswarm_jobs_finished_total" in textfile.read_text()


def test_every_chunk_attempt_starts_through_the_launcher_the_caller_gives(tmp_path: Path) -> None:
    """`serve` hands a pack's use case its lanes this way (controller/run/lanes.py LaneLauncher)."""
    from controller.run.launch import FreshLauncher, Launched

    config, job, rundir = new_job(tmp_path)
    rundir.layout.identity.write_text(IdentityResult(source_embedding=EMBEDDING).to_json())
    started: list[tuple[str, int]] = []

    class Recording(FreshLauncher):
        def start(self, chunk: str, attempt: int, avoid: tuple[str, ...]) -> Launched:
            started.append((chunk, attempt))
            return super().start(chunk, attempt, avoid)

    swarm = FakeSwarm()
    usecase.run(config, swarm, job, launch=lambda backend, run, settings: Recording(backend, settings))
    assert started and started == [(c.id, 1) for c in job.plan.chunks]
