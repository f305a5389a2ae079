"""`chunk_size: auto` from measured costs: what a job's runners measured, kept per pack and
provider on the data root, and the chunk size the next job gets from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.results import ItemResult, ItemStatus
from controller.config import Config
from controller.job.files import parse_job
from controller.job.plan import AUTO_MAX_CHUNK, Plan, TargetRef, auto_chunk_size, make_plan
from controller.run import jobs, timings
from controller.run.rundir import RunDir
from controller.run.timings import Timing
from controller.swarm.servicespec import VolumeSpec


def photos(n: int) -> list[TargetRef]:
    return [TargetRef(f"in/p{i}.jpg", f"out/p{i}.jpg", "image") for i in range(n)]


def finished_job(root: Path, colds: list[float], provider: str = "cuda") -> tuple[RunDir, Plan]:
    """A run folder as runners leave it: each chunk's log says when models were loaded, its
    results say when each item started and finished (0.2 s apart, two in flight at a time)."""
    plan = make_plan("j", photos(4 * len(colds)), 4)
    rundir = RunDir(root, "j")
    (rundir.path / "logs").mkdir(parents=True)
    (rundir.path / "results").mkdir()
    for chunk, cold in zip(plan.chunks, colds, strict=True):
        lines = [{"event": "attempt started"}, {"event": "models loaded", "provider": provider, "process_s": cold}]
        (rundir.path / "logs" / f"{chunk.id}.a1.log").write_text("".join(json.dumps(x) + "\n" for x in lines))
        with (rundir.path / "results" / f"{chunk.id}.jsonl").open("w") as f:
            for k, item in enumerate(chunk.items):
                start = 100.0 + 0.2 * (k // 2)
                r = ItemResult(item, ItemStatus.OK, 1, "/data/in", "/data/out", started=start, finished=start + 0.4)
                f.write(r.to_line())
    return rundir, plan


def test_a_finished_job_measures_its_cold_start_and_time_per_item(tmp_path: Path) -> None:
    rundir, plan = finished_job(tmp_path, [4.0, 6.0, 5.0])
    measured = timings.measure(rundir, plan)
    assert measured is not None
    provider, timing = measured
    assert provider == "cuda"
    assert timing.cold_start_s == 5.0  # the median runner
    assert timing.item_s == pytest.approx(0.15)  # 4 items (two in flight) between 100.0 and 100.6
    assert timing.job == "j"


def test_nothing_measured_records_nothing(tmp_path: Path) -> None:
    rundir = RunDir(tmp_path, "j")
    (rundir.path / "logs").mkdir(parents=True)
    assert timings.measure(rundir, make_plan("j", photos(8), 4)) is None


def test_the_latest_measurement_per_pack_and_provider_is_kept(tmp_path: Path) -> None:
    old = Timing(cold_start_s=1.0, item_s=0.05, job="a", measured_at=1.0)
    new = Timing(cold_start_s=6.0, item_s=0.01, job="b", measured_at=2.0)
    timings.record(tmp_path, "default", "cuda", old)
    timings.record(tmp_path, "default", "cuda", new)
    timings.record(tmp_path, "default", "cpu", old)
    assert timings.lookup(tmp_path, "default", ("cuda", "cpu")) == new
    assert timings.lookup(tmp_path, "default", ("cpu",)) == old
    assert timings.lookup(tmp_path, "other", ("cuda", "cpu")) is None
    (tmp_path / timings.FILE).write_text("{not json")
    assert timings.lookup(tmp_path, "default", ("cuda",)) is None  # a damaged file: as if none


def test_measurements_reached_through_a_link_are_not_read_and_the_link_is_replaced(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    timings.record(tmp_path, "default", "cuda", Timing(cold_start_s=1.0, item_s=0.05, job="a", measured_at=1.0))
    (tmp_path / timings.FILE).rename(elsewhere)
    (tmp_path / timings.FILE).symlink_to(elsewhere)  # planted where the controller keeps its measurements
    assert timings.lookup(tmp_path, "default", ("cuda",)) is None  # never followed
    new = Timing(cold_start_s=2.0, item_s=0.02, job="b", measured_at=2.0)
    timings.record(tmp_path, "default", "cpu", new)
    assert not (tmp_path / timings.FILE).is_symlink() and timings.lookup(tmp_path, "default", ("cpu",)) == new
    assert set(json.loads(elsewhere.read_text())) == {"default/cuda"}  # the link's target untouched


@pytest.mark.parametrize(
    ("cold", "item", "timeout", "cap"),
    [
        (5.0, 0.01, 1800, 9500),  # a GPU node: 5 s before the first item, 10 ms per photo
        (0.6, 0.026, 1800, AUTO_MAX_CHUNK),  # the dev VM: 1,000 already amortises 0.6 s
        (30.0, 1.0, 1800, 900),  # slow items: a chunk keeps within half its timeout
    ],
)
def test_the_chunk_cap_amortises_the_cold_start_within_the_timeout(
    cold: float, item: float, timeout: int, cap: int
) -> None:
    assert Timing(cold, item, "j", 0.0).chunk_cap(timeout) == cap


def test_auto_makes_fewer_waves_when_the_cold_start_calls_for_bigger_chunks() -> None:
    assert auto_chunk_size(100_000, 8) == 962  # 13 waves of ≤ 1,000 over 8 GPUs
    assert auto_chunk_size(100_000, 8, max_chunk=9500) == 6250  # 2 waves


def test_a_job_with_auto_gets_the_cap_its_pack_and_providers_measured(tmp_path: Path) -> None:
    config = Config(path=tmp_path / "ffswarm.yaml", data_root=tmp_path, volume=VolumeSpec.bind(str(tmp_path)))
    fields = {"name": "j", "source": "s.jpg", "targets": ["in/*"], "output": "out/{stem}{ext}"}
    spec = parse_job(fields, "j.yaml")
    assert jobs.chunk_cap(config, spec, photos(3)) == AUTO_MAX_CHUNK  # nothing measured yet
    timings.record(tmp_path, "default", "cuda", Timing(5.0, 0.01, "earlier", 0.0))
    assert jobs.chunk_cap(config, spec, photos(3)) == 9500
    assert jobs.chunk_cap(config, spec, [TargetRef("in/v.mp4", "out/v.mp4", "video")]) == AUTO_MAX_CHUNK
    fixed = parse_job({**fields, "chunk_size": 20}, "j.yaml")
    assert jobs.chunk_cap(config, fixed, photos(3)) == AUTO_MAX_CHUNK
