"""`serve` cuts a job's ``auto`` chunks for the GPUs the swarm advertises, as `ffswarm submit` does:
a job of a few hundred photos on a 2-GPU swarm runs in one wave of two chunks, not in two waves of
max_concurrent's four (each chunk paying a cold start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import parse_config
from controller.run import usecase
from controller.run.jobs import PreparedJob
from controller.run.metrics import Metrics
from controller.serve import jobs
from tests.builders import data_root
from tests.fakes import FakeSwarm

PHOTOS = [f"in/p{n:03d}.jpg" for n in range(400)]


def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: jobs.Running) -> PreparedJob:
    root = data_root(tmp_path, photos=["faces/star.jpg", *PHOTOS])
    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(root)})
    (root / "inbox").mkdir()
    path = root / "inbox" / "big.yaml"
    path.write_text("name: big\nsource: faces/star.jpg\ntargets: [in/*.jpg]\noutput: out/big/{name}\n")
    monkeypatch.setattr(jobs, "DockerSwarm", lambda _host: FakeSwarm())  # one ready node with 2 GPUs
    prepared: list[PreparedJob] = []
    real = usecase.one_job

    def one_job(*args: object, **kwargs: object) -> PreparedJob:
        prepared.append(real(*args, **kwargs))  # type: ignore[arg-type]
        raise SystemExit  # planned: nothing to start here

    monkeypatch.setattr(usecase, "one_job", one_job)
    with pytest.raises(SystemExit):
        jobs.run_job_file(config, path, Metrics(), running=running)
    return prepared[0]


def test_serve_sizes_auto_chunks_by_the_swarms_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(tmp_path / "c.yaml", {"data_root": str(tmp_path)})
    job = planned(tmp_path, monkeypatch, jobs.Running(gpus=jobs.SwarmGpus(config)))
    assert job.spec.max_concurrent == 4 and len(job.plan.items) == 400
    assert [len(c.items) for c in job.plan.chunks] == [200, 200]


def test_without_the_swarms_count_max_concurrent_alone_sizes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = planned(tmp_path, monkeypatch, jobs.Running())
    assert [len(c.items) for c in job.plan.chunks] == [100] * 4
