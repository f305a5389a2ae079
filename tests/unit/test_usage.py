"""Usage accounting (controller/run/usage.py): GPU-seconds from the runners' own records, items and
bytes in report.json; a tenant's sum over a time range at GET /v1/usage; `serve`'s per-tenant
counters. Real run folders in a temporary data root."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from contract.attempt import AttemptRecord
from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.chunks import ChunkRun
from controller.run.failures import ChunkState
from controller.run.metrics import Metrics
from controller.run.report import Report, build_report
from controller.run.rundir import Control, RunDir
from tests.builders import Env, make_config, serve_api

JOB_FILE = b"name: j\nsource: in/face.jpg\ntargets: [in/*.jpg]\noutput: out/{stem}{ext}\n" + (
    b"resources: {gpus: 2}\ntimeout: 600\n"
)


def run_folder(root: Path, job: str = "j", prefix: str = "") -> RunDir:
    """Three photos in two chunks; the inputs exist with known sizes (100, 200, 300 bytes)."""
    items = tuple(PlannedItem(f"i00000{n}", f"{prefix}in/{n}.jpg", f"{prefix}out/{n}.jpg", "image") for n in range(3))
    plan = Plan(job, items, (Chunk("c0000", ("i000000", "i000001")), Chunk("c0001", ("i000002",))))
    rd = RunDir(root, job)
    rd.create(JOB_FILE, plan, {}, Control(2), "sha256:pinned")
    for n, item in enumerate(items):
        (root / item.input).parent.mkdir(parents=True, exist_ok=True)
        (root / item.input).write_bytes(b"x" * 100 * (n + 1))
    return rd


def result(
    item: str, status: ItemStatus, attempt: int, started: float, finished: float, size: int | None = None
) -> str:
    out = f"/data/out/{item}.jpg" if status is not ItemStatus.ERROR else None
    return ItemResult(item, status, attempt, f"/data/in/{item}", out, started=started, finished=finished,
                      size=size).to_line()  # fmt: skip


def append(rd: RunDir, chunk: str, attempt: int, *lines: str) -> None:
    with rd.layout.results(chunk, attempt).open("a") as f:
        f.write("".join(lines))


def record(rd: RunDir, chunk: str, attempt: int, started: float, finished: float | None, **kw: object) -> None:
    rec = AttemptRecord(job=rd.job, chunk=chunk, attempt=attempt, started=started, finished=finished,
                        exit=None if finished is None else kw.pop("exit", "OK"), **kw)  # type: ignore[arg-type]  # fmt: skip
    rd.layout.attempt_record(chunk, attempt).write_text(rec.to_json())


def a_job_with_a_retry(rd: RunDir) -> Report:
    """c0000: attempt 1 fails after 10 s (the GPUs were held), attempt 2 does both photos in 30 s;
    c0001: attempt 1 was killed (no ending in its record; its last result 7 s in), attempt 2 left no
    record (an older runner): the span of its result lines, 4 s."""
    record(rd, "c0000", 1, 1000.0, 1010.0, exit="TEMPORARY", reason="CUDA out of memory")
    append(rd, "c0000", 1, result("i000000", ItemStatus.ERROR, 1, 1001.0, 1002.0))
    record(rd, "c0000", 2, 1100.0, 1130.0)
    append(rd, "c0000", 2, result("i000000", ItemStatus.OK, 2, 1105.0, 1110.0, size=1000),
           result("i000001", ItemStatus.NO_FACE, 2, 1110.0, 1120.0, size=50))  # fmt: skip
    record(rd, "c0001", 1, 2000.0, None)
    append(rd, "c0001", 1, result("i000002", ItemStatus.ERROR, 1, 2003.0, 2007.0))
    append(rd, "c0001", 2, result("i000002", ItemStatus.ERROR, 2, 3001.0, 3005.0))
    runs = {"c0001": ChunkRun("c0001", state=ChunkState.FAILED, reason="runner exit 65")}
    return build_report(rd.plan(), rd, runs, "sha256:pinned", 1.0)


def test_usage_counts_every_attempt_by_its_runners_clock_times_the_gpus_reserved(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    report = a_job_with_a_retry(rd)
    u = report.to_dict()["usage"]
    assert u["attempt_seconds"] == {"c0000.a1": 10.0, "c0000.a2": 30.0, "c0001.a1": 7.0, "c0001.a2": 4.0}
    assert (u["runner_seconds"], u["gpus_per_chunk"], u["gpu_seconds"]) == (51.0, 2, 102.0)
    assert (u["attempts"], u["attempts_untimed"]) == (4, 0)
    assert u["items"] == {"ok": 1, "no_face": 1, "failed": 1, "cancelled": 0}
    assert u["bytes_in"] == 100 + 200 + 300  # every input read once, whatever the attempts
    assert u["bytes_out"] == 1000 + 50  # committed outputs, by the size their runner recorded
    rd.write_report(report.to_dict())
    assert Report.from_dict(json.loads(rd.layout.report.read_text())).usage == u


def test_an_attempt_that_left_no_timing_counts_nothing_and_is_named_and_a_wild_one_is_capped(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    rd.layout.log("c0000", 1).write_text("crashed at import\n")  # a runner that died before its record
    record(rd, "c0001", 1, 1000.0, 1000.0 + 10 * 86400)  # claims ten days: at most the timeout + 120 s
    u = build_report(rd.plan(), rd, {}, "sha256:pinned", 1.0).usage
    assert u is not None
    assert u["attempt_seconds"] == {"c0000.a1": 0.0, "c0001.a1": 720.0} and u["attempts_untimed"] == 1
    assert u["gpu_seconds"] == 1440.0 and u["bytes_in"] == 0 and u["bytes_out"] == 0  # nothing ran to a result


def tenant_job(root: Path, job: str, finished: float, gpu_seconds: float, tenant: str = "acme") -> None:
    area = Area(root, tenant)
    area.ensure(None)
    area.write_record(job, uploads=False)
    rd = run_folder(root, job, prefix=f"tenants/{tenant}/{job}/")
    (rd.path / "owner").write_text(f"{tenant}\n")
    used = {"gpu_seconds": gpu_seconds, "runner_seconds": gpu_seconds, "attempts": 1, "attempts_untimed": 0,
            "bytes_in": 10, "bytes_out": 5, "items": {"ok": 2, "no_face": 0, "failed": 1, "cancelled": 0},
            "gpus_per_chunk": 1, "attempt_seconds": {"c0000.a1": gpu_seconds}}  # fmt: skip
    rd.write_report({"job": job, "finished": finished, "usage": used})


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    config, key = make_config(tmp_path)
    root = config.data_root
    tenant_job(root, "jan-aaaaaaaa", 1767225600.0 + 86400, 100.0)  # 2026-01-02
    tenant_job(root, "jan-bbbbbbbb", 1767225600.0 + 20 * 86400, 50.5)  # 2026-01-21
    tenant_job(root, "feb-cccccccc", 1769904000.0 + 3600, 7.0)  # 2026-02-01 01:00
    tenant_job(root, "other-dddddddd", 1767225600.0 + 86400, 999.0, tenant="globex")
    for url in serve_api(config):
        yield Env(config, root, url, key)


def test_a_tenants_usage_over_a_range_sums_its_jobs_that_ended_in_it(env: Env) -> None:
    with env.client() as c:
        jan = c.get("/v1/usage", params={"from": "2026-01-01", "to": "2026-02-01"}).json()
        assert (jan["tenant"], jan["jobs"], jan["from_at"], jan["to_at"]) == (
            "acme", 2, "2026-01-01T00:00:00+00:00", "2026-02-01T00:00:00+00:00",
        )  # fmt: skip
        assert jan["usage"] == {"gpu_seconds": 150.5, "runner_seconds": 150.5, "attempts": 2, "attempts_untimed": 0,
                                "bytes_in": 20, "bytes_out": 10,
                                "items": {"ok": 4, "no_face": 0, "failed": 2, "cancelled": 0}}  # fmt: skip
        assert [j["job"] for j in jan["job_usage"]] == ["jan-aaaaaaaa", "jan-bbbbbbbb"]  # never globex's
        everything = c.get("/v1/usage").json()
        assert everything["jobs"] == 3 and everything["usage"]["gpu_seconds"] == 157.5
        unix = c.get("/v1/usage", params={"from": "1769904000", "to": "1769990400.5"}).json()
        assert [j["job"] for j in unix["job_usage"]] == ["feb-cccccccc"]
        zoned = c.get("/v1/usage", params={"from": "2026-02-01T02:00:00+01:00"}).json()  # 01:00 UTC: inclusive
        assert zoned["jobs"] == 1
        page = c.get("/v1/usage", params={"limit": "1"}).json()
        assert [j["job"] for j in page["job_usage"]] == ["feb-cccccccc"] and page["next_cursor"] == "feb-cccccccc"
        page2 = c.get("/v1/usage", params={"limit": "1", "cursor": page["next_cursor"]}).json()
        assert [j["job"] for j in page2["job_usage"]] == ["jan-aaaaaaaa"] and page2["usage"] == everything["usage"]
        for bad in ({"from": "yesterday"}, {"to": "-5"}, {"from": "2026-02-01", "to": "2026-01-01"}, {"limit": "0"}):
            r = c.get("/v1/usage", params=bad)
            assert r.status_code == 400 and r.json()["error"]["field"] in bad, bad
        assert c.get("/v1/jobs/jan-aaaaaaaa").json()["usage"]["gpu_seconds"] == 100.0
        assert c.get("/v1/jobs/other-dddddddd").status_code == 404
    assert env.client(tenant=None).get("/v1/usage").status_code == 401
    assert env.client("globex").get("/v1/usage").json()["usage"]["gpu_seconds"] == 999.0


def test_the_openapi_document_names_usage_and_metrics(env: Env) -> None:
    doc = env.client().get("/openapi.json").json()
    assert "/v1/usage" in doc["paths"] and "/metrics" in doc["paths"] and "/v1/jobs/{job}/items" in doc["paths"]


def counters(m: Metrics) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(m.registry).decode()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("ffswarm_tenant_") and s.name.endswith("_total")
    }


def test_serve_counts_usage_by_tenant_once_across_a_resume(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    (rd.path / "owner").write_text("acme\n")
    m = Metrics()
    sink = m.sink(rd, gpus_per_chunk=2)
    sink("job_started", pending=2)
    report = a_job_with_a_retry(rd)
    rd.write_report(report.to_dict())
    sink("job_finished", failed=1)
    first = counters(m)
    assert first["ffswarm_tenant_gpu_seconds_total[('tenant', 'acme')]"] == 102.0
    assert first["ffswarm_tenant_items_total[('status', 'ok'), ('tenant', 'acme')]"] == 1
    assert first["ffswarm_tenant_items_total[('status', 'failed'), ('tenant', 'acme')]"] == 1

    again = m.sink(rd, gpus_per_chunk=2)  # a resume: c0001 runs a third time and its photo is done
    again("job_started", pending=1)
    record(rd, "c0001", 3, 4000.0, 4008.0)
    append(rd, "c0001", 3, result("i000002", ItemStatus.OK, 3, 4001.0, 4006.0, size=7))
    rd.write_report(build_report(rd.plan(), rd, {}, "sha256:pinned", 1.0).to_dict())
    again("job_finished", failed=0)
    second = counters(m)
    assert second["ffswarm_tenant_gpu_seconds_total[('tenant', 'acme')]"] == 102.0 + 16.0  # only the new attempt
    assert second["ffswarm_tenant_items_total[('status', 'ok'), ('tenant', 'acme')]"] == 2
    assert second["ffswarm_tenant_items_total[('status', 'failed'), ('tenant', 'acme')]"] == 1


def test_a_cli_job_counts_under_no_tenant(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    m = Metrics()
    sink = m.sink(rd)
    sink("job_started", pending=2)
    rd.write_report(a_job_with_a_retry(rd).to_dict())
    sink("job_finished", failed=1)
    assert counters(m)["ffswarm_tenant_gpu_seconds_total[('tenant', '')]"] == 102.0
