"""Metrics from supervisor events: counters, gauges and the per-item histogram, read back as Prometheus text."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from contract.results import ItemResult, ItemStatus
from controller.job.plan import TargetRef, make_plan
from controller.run.metrics import Metrics
from controller.run.rundir import RunDir


def make_run(tmp_path: Path, items: int = 5, chunk_size: int = 2) -> RunDir:
    rundir = RunDir(tmp_path, "holiday")
    plan = make_plan("holiday", [TargetRef(f"in/{i}.jpg", f"out/{i}.jpg", "image") for i in range(items)], chunk_size)
    (rundir.path / "results").mkdir(parents=True)
    (rundir.path / "plan.json").write_text(plan.to_json())
    return rundir


def results(
    rundir: RunDir, chunk: str, statuses: dict[str, ItemStatus], attempt: int = 1, seconds: float = 0.5
) -> None:
    with (rundir.path / "results" / f"{chunk}.jsonl").open("a") as f:
        for item, status in statuses.items():
            f.write(
                ItemResult(
                    item=item,
                    status=status,
                    attempt=attempt,
                    input="i",
                    output=None,
                    started=100.0,
                    finished=100.0 + seconds,
                ).to_line()
            )


def samples(m: Metrics) -> dict[str, float]:
    from prometheus_client import generate_latest

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def test_a_job_with_a_retry_and_a_failed_chunk(tmp_path: Path) -> None:
    rundir = make_run(tmp_path)  # chunks c0000 (i0,i1) c0001 (i2,i3) c0002 (i4)
    plan = rundir.plan()
    ids = [i.id for i in plan.items]
    m = Metrics()
    sink = m.sink(rundir, gpus_per_chunk=1)
    sink("job_started", chunks=3, pending=3, items=5)
    assert samples(m)["ffswarm_chunks_queued"] == 3 and samples(m)["ffswarm_jobs_running"] == 1
    sink("chunk_started", chunk="c0000", attempt=1)
    sink("chunk_started", chunk="c0001", attempt=1)
    sink("chunk_running", chunk="c0000", attempt=1)
    s = samples(m)
    assert (s["ffswarm_chunks_queued"], s["ffswarm_chunks_running"], s["ffswarm_gpu_slots_in_use"]) == (1, 2, 1)

    results(rundir, "c0000", {ids[0]: ItemStatus.OK, ids[1]: ItemStatus.ERROR}, seconds=0.3)
    sink("chunk_done", chunk="c0000", attempt=1, exit_code=3)
    sink("chunk_retry", chunk="c0001", attempt=1, failure="infrastructure", reason="killed")
    s = samples(m)
    assert s["ffswarm_items_done_total"] == 1 and s["ffswarm_items_failed_total"] == 1
    assert (s["ffswarm_chunks_queued"], s["ffswarm_chunks_running"], s["ffswarm_gpu_slots_in_use"]) == (2, 0, 0)

    sink("chunk_started", chunk="c0001", attempt=2)
    sink("chunk_running", chunk="c0001", attempt=2)
    results(rundir, "c0001", {ids[2]: ItemStatus.OK, ids[3]: ItemStatus.NO_FACE}, attempt=2, seconds=2.0)
    sink("chunk_done", chunk="c0001", attempt=2, exit_code=0)
    sink("chunk_started", chunk="c0002", attempt=1)
    sink("chunk_failed", chunk="c0002", attempt=1, failure="user", reason="exit 66")
    sink("job_finished", items=5, ok=2, no_face=1, failed=2, chunks_failed=1)

    s = samples(m)
    assert s["ffswarm_items_done_total"] == 3  # ok + no_face
    assert s["ffswarm_items_failed_total"] == 2  # the error item + the failed chunk's item with no result
    assert s["ffswarm_chunk_attempts_total{failure_class=none,outcome=done}"] == 2
    assert s["ffswarm_chunk_attempts_total{failure_class=infrastructure,outcome=retry}"] == 1
    assert s["ffswarm_chunk_attempts_total{failure_class=user,outcome=failed}"] == 1
    assert s["ffswarm_item_seconds_count"] == 4 and abs(s["ffswarm_item_seconds_sum"] - (0.6 + 4.0)) < 1e-9
    assert s["ffswarm_item_seconds_bucket{le=0.5}"] == 2
    assert s["ffswarm_jobs_finished_total{result=failed_items}"] == 1
    assert (s["ffswarm_jobs_running"], s["ffswarm_chunks_queued"], s["ffswarm_chunks_running"]) == (0, 0, 0)


def test_two_jobs_add_up_and_registries_stay_apart(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    m, other = Metrics(), Metrics()
    sa, sb = m.sink(a, gpus_per_chunk=2), m.sink(b, gpus_per_chunk=1)
    sa("job_started", pending=3)
    sb("job_started", pending=3)
    for sink in (sa, sb):
        sink("chunk_started", chunk="c0000", attempt=1)
        sink("chunk_running", chunk="c0000", attempt=1)
    s = samples(m)
    assert s["ffswarm_gpu_slots_in_use"] == 3 and s["ffswarm_chunks_running"] == 2 and s["ffswarm_chunks_queued"] == 4
    assert samples(other)["ffswarm_chunks_running"] == 0


def test_textfile_for_node_exporter(tmp_path: Path) -> None:
    rundir = make_run(tmp_path, items=1)
    m = Metrics()
    sink = m.sink(rundir)
    sink("job_started", pending=1)
    results(rundir, "c0000", {rundir.plan().items[0].id: ItemStatus.OK})
    sink("chunk_done", chunk="c0000", attempt=1)
    path = tmp_path / "ffswarm.prom"
    m.write_textfile(path)
    text = path.read_text()
    assert "ffswarm_items_done_total 1.0" in text and "# TYPE ffswarm_item_seconds histogram" in text
    assert not list(tmp_path.glob("*.prom.*"))  # written to a temporary name and renamed


def test_the_grafana_dashboard_asks_only_for_metrics_that_exist() -> None:
    import json
    import re

    from prometheus_client import generate_latest

    exposed = {
        line.split()[2]
        for line in generate_latest(Metrics().registry).decode().splitlines()
        if line.startswith("# TYPE")
    }
    names = {n + s for n in exposed for s in ("", "_total", "_bucket", "_sum", "_count")}
    dashboard = json.loads((Path(__file__).parents[2] / "stacks" / "grafana-dashboard.json").read_text())
    used = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"ffswarm_[a-z_]+", t["expr"])}
    assert used and used <= names, used - names
