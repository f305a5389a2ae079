"""The soak's pure parts (scripts/soak/): its plan from a seed, and the end checks run on data roots
built on disk as a finished soak would leave them."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from contract.layout import run_rel
from contract.results import ItemResult, ItemStatus
from contract.s3 import META_JOB, parse_credentials
from controller.cli.ops import _api_service, _serve_secrets
from controller.config import load_config
from controller.storage.area import parse_area
from controller.swarm.render import ApiService, ControllerStack, render_controller_stack
from controller.swarm.servicespec import VolumeSpec
from scripts.soak import checks, deploy, run
from scripts.soak.faults import S3_SERVER, Faults, RgwSwitch
from scripts.soak.plan import FAULT_GAP, FAULT_KINDS, TENANTS, Fault, Plan, Request, make_plan
from scripts.soak.stream import Receiver, Record, Stream, body, upload_inputs
from tests.builders import JPEG, KEYS, MP4, Env, api_env, data_root
from tests.fixtures.rgw_server import Rgw

ROOT = Path(__file__).resolve().parents[2]


# --- the plan --------------------------------------------------------------------------------------


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    assert make_plan(7, 10).to_json() == make_plan(7, 10).to_json()
    assert make_plan(7, 10).faults != make_plan(8, 10).faults
    assert make_plan(7, 10).requests != make_plan(8, 10).requests


def test_an_hour_has_every_fault_kind_often_15_to_45_s_apart_and_a_steady_stream() -> None:
    plan = make_plan(1234, 60, s3=True)
    counts = plan.fault_counts()
    assert set(counts) == set(FAULT_KINDS)
    assert min(counts.values()) >= 10, counts
    gaps = [b.at - a.at for a, b in zip(plan.faults, plan.faults[1:], strict=False)]
    assert all(FAULT_GAP[0] <= g <= FAULT_GAP[1] for g in gaps)
    assert plan.faults[-1].at < 59 * 60  # the last fault ends before the stream stops
    assert len(plan.requests) >= 2000
    assert {r.tenant for r in plan.requests} == set(TENANTS)
    assert {"photo", "zip", "pairs", "video", "s3", "cancel", "retry"} <= set(plan.request_counts())


def test_short_mode_is_one_fault_of_each_kind_in_about_five_minutes() -> None:
    plan = make_plan(99, 5, short=True)
    assert sorted(f.kind for f in plan.faults) == sorted(k for k in FAULT_KINDS if k != "stop_store")
    assert plan.minutes <= 7
    assert "s3" not in plan.request_counts()  # no object store given: no S3 requests, no store fault


def test_reference_runs_each_distinct_request_once() -> None:
    plan = make_plan(5, 30)
    keys = [r.key for r in plan.distinct()]
    assert len(keys) == len(set(keys))
    assert set(keys) == {r.key for r in plan.requests if r.kind not in ("cancel", "retry")}


def test_dry_run_prints_the_seed_and_the_plan_without_docker(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--dry-run", "--short", "--seed", "42"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/nonexistent"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "seed 42" in proc.stdout and "kill_serve" in proc.stdout and "requests:" in proc.stdout
    again = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--dry-run", "--short", "--seed", "42"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/nonexistent"}, timeout=60,
    )  # fmt: skip
    assert again.stdout == proc.stdout


def test_a_bad_minutes_value_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--dry-run", "--minutes", "0"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "--minutes" in proc.stderr and "Traceback" not in proc.stderr


# --- a finished soak's data root -------------------------------------------------------------------


def line(item: str, attempt: int, out: str | None, status: ItemStatus = ItemStatus.OK, **kw: object) -> str:
    inp = kw.pop("input", f"/data/tenants/soak-a/in/{item}.jpg")
    return ItemResult(item, status, attempt, str(inp), out, **kw).to_line()  # type: ignore[arg-type]


def write_run(root: Path, job: str, files: dict[str, str], **extra: str) -> Path:
    run = root / run_rel(job)
    (run / "results").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (run / "results" / name).write_text(text)
    for name, text in extra.items():
        (run / name).write_text(text)
    return run


def output(root: Path, rel: str, data: bytes) -> str:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return f"/data/{rel}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return data_root(tmp_path, photos=())


def test_a_job_stuck_running_or_unknown_to_the_api_fails_the_ended_check() -> None:
    statuses: dict[str, dict[str, object] | None] = {
        "a-1": {"phase": "finished", "outcome": "succeeded"},
        "a-2": {"phase": "cancelled", "outcome": "cancelled"},
        "a-3": {"phase": "running", "outcome": None},
        "a-4": None,
    }
    check = checks.ended(["a-1", "a-2", "a-3", "a-4"], statuses)
    assert not check.ok and check.looked_at == 4
    assert check.problems == ["a-3: stuck running (outcome None)", "a-4: lost (the API does not know it)"]
    assert checks.ended(["a-1", "a-2"], statuses).ok


def photo(seed: int, nudge: int = 0, far: int = 0) -> bytes:
    """A 64×64 PNG of noise from ``seed``; ``nudge`` values one level up; ``far`` values 100 levels up."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 150, (64, 64, 3), dtype=np.uint8)
    flat = pixels.reshape(-1)
    flat[:nudge] += 1
    flat[nudge : nudge + far] += 100
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_outputs_equal_to_the_reference_pass_and_a_changed_picture_fails(root: Path) -> None:
    ref = {"photo-0": {"in/p.jpg": "tenants/soak-a/out/ref/p.png"}}
    output(root, "tenants/soak-a/out/ref/p.png", photo(1))
    for job, data in (("j-same", photo(1)), ("j-close", photo(1, nudge=15)), ("j-bad", photo(1, far=200))):
        out = output(root, f"tenants/soak-a/out/{job}/p.png", data)
        write_run(root, job, {"c0000.a1.jsonl": line("i000000", 1, out, input="/data/tenants/soak-a/in/p.jpg")})
    same = checks.identical(root, {"j-same": ("soak-a", "photo-0")}, ref)
    assert same.ok and same.notes == []
    close = checks.identical(root, {"j-same": ("soak-a", "photo-0"), "j-close": ("soak-a", "photo-0")}, ref)
    assert close.ok and close.notes == [
        "1 of 2 outputs equal the reference within the runner's rounding, not byte for byte"
    ]
    bad = checks.identical(root, {"j-same": ("soak-a", "photo-0"), "j-bad": ("soak-a", "photo-0")}, ref)
    assert len(bad.problems) == 1
    assert bad.problems[0].startswith(
        "j-bad: tenants/soak-a/out/j-bad/p.png differs from the reference of photo-0 (in/p.jpg): a different picture"
    )


def test_a_truncated_output_is_not_the_same_picture(root: Path) -> None:
    (root / "a.png").write_bytes(photo(2))
    (root / "b.png").write_bytes(photo(2)[:200])
    assert checks.compare(root, "a.png", "a.png") is None
    assert checks.compare(root, "a.png", "b.png") == "cannot be decoded (OSError)"
    (root / "b.png").write_bytes(photo(3))
    assert (checks.compare(root, "a.png", "b.png") or "").startswith("a different picture")
    assert checks.compare(root, "a.png", "gone.png") == "gone.png is missing or not a regular file"


def test_reference_rounds_that_differ_only_by_rounding_count_as_deterministic(root: Path) -> None:
    for n, data in enumerate((photo(4), photo(4, nudge=10), photo(4)), 1):
        output(root, f"r{n}/p.png", data)
    rounds = [{"photo-1": {"p.jpg": f"r{n}/p.png"}} for n in (1, 2, 3)]
    check = checks.deterministic(root, rounds)
    assert check.ok and check.looked_at == 2
    assert check.notes == ["1 byte-identical, 1 within the runner's rounding, of 2"]
    output(root, "r4/p.png", photo(5))
    bad = checks.deterministic(root, [rounds[0], {"photo-1": {"p.jpg": "r4/p.png"}}])
    assert not bad.ok and bad.problems[0].startswith(
        "photo-1: round 2's p.jpg differs from round 1: a different picture"
    )


def test_uploaded_inputs_are_named_inside_their_upload_so_two_uploads_compare(root: Path) -> None:
    for job in ("z-1", "z-2"):
        out = output(root, f"tenants/soak-b/out/{job}/a.jpg", b"x")
        inp = f"/data/tenants/soak-b/uploads/{job}/targets/a.jpg"
        write_run(root, job, {"c0000.a1.jsonl": line("i000000", 1, out, input=inp)})
    jobs = {"z-1": ("soak-b", "zip-3"), "z-2": ("soak-b", "zip-3")}
    check = checks.identical(root, jobs, {"zip-3": {"targets/a.jpg": "tenants/soak-b/out/z-1/a.jpg"}})
    assert check.ok and check.looked_at == 2


def test_a_retry_that_only_reacknowledges_is_committed_once(root: Path) -> None:
    out = output(root, "tenants/soak-a/out/j/a.jpg", b"1")
    write_run(
        root,
        "j",
        {
            "c0000.a1.jsonl": line("i000000", 1, out),
            "c0000.a2.jsonl": line("i000000", 2, out, cached=True),
            "c0000.a1.commits": json.dumps({"item": "i000000", "output": out}) + "\n",
        },
    )
    assert checks.committed_once(root).ok


def test_an_item_written_by_two_attempts_or_journaled_after_its_commit_fails(root: Path) -> None:
    out = output(root, "tenants/soak-a/out/j/a.jpg", b"1")
    write_run(root, "j", {"c0000.a1.jsonl": line("i000000", 1, out), "c0000.a2.jsonl": line("i000000", 2, out)})
    out2 = output(root, "tenants/soak-a/out/k/b.jpg", b"1")
    write_run(
        root,
        "k",
        {
            "c0000.a1.jsonl": line("i000001", 1, out2),
            "c0000.a2.commits": json.dumps({"item": "i000001", "output": out2}) + "\n",
        },
    )
    assert checks.committed_once(root).problems == [
        "j: i000000 committed 2 times",
        "k: i000001 journaled again by attempt 2 after its commit",
    ]


def test_a_file_committed_by_two_jobs_fails_but_a_packed_jobs_copy_of_its_pack_does_not(root: Path) -> None:
    out = output(root, "tenants/soak-a/out/shared/a.jpg", b"1")
    write_run(root, "pack-x", {"c0000.a1.jsonl": line("i000000", 1, out)})
    write_run(root, "member", {"c0000.a1.jsonl": line("i000000", 1, out)}, packed="pack-x")
    assert checks.committed_once(root).ok
    write_run(root, "intruder", {"c0000.a1.jsonl": line("i000004", 1, out)})
    assert checks.committed_once(root).problems == [
        "tenants/soak-a/out/shared/a.jpg: committed by 2 jobs (intruder, pack-x)"
    ]


def test_a_clean_volume_passes_and_each_leftover_is_named(root: Path) -> None:
    (root / "tenants" / "soak-a" / "uploads").mkdir(parents=True)
    (root / "inbox" / "done").mkdir(parents=True)
    (root / "inbox" / "done" / "j.yaml").write_text("name: j\n")
    write_run(root, "j", {})
    (root / "tenants" / ".quota" / "soak-a" / "open").mkdir(parents=True)
    (root / "tenants" / ".quota" / "soak-a" / "ledger").write_text(json.dumps({"jobs": 0}))
    (root / "inbox" / "packs").mkdir()
    (root / "inbox" / "packs" / "pack-1.yaml").write_text("name: pack-1\n")
    clean = checks.left_on_volume(root)
    assert clean.ok and clean.notes == ["1 pack job files kept in inbox/packs/"]

    (root / "tenants" / "soak-a" / "uploads" / ".incoming-abc").mkdir()
    (root / "tenants" / "soak-a" / "out" / "j").mkdir(parents=True)
    (root / "tenants" / "soak-a" / "out" / "j" / ".a.jpg.ffswarm-j-c0000-a1-0a1b2c.tmp").write_bytes(b"")
    (root / "runs" / "j" / "lease.json").write_text("{}")
    (root / "inbox" / "running").mkdir()
    (root / "inbox" / "running" / "k.1234.yaml").write_text("name: k\n")
    (root / "runs" / ".outbox").mkdir()
    (root / "runs" / ".outbox" / "j~msg_1~0").write_text("")
    (root / "tenants" / ".quota" / "soak-a" / "ledger").write_text(json.dumps({"jobs": 1}))
    (root / "tenants" / ".quota" / "soak-a" / "open" / "k").write_text("")
    assert checks.left_on_volume(root).problems == [
        "tenants/soak-a/uploads/.incoming-abc: upload staging left",
        "tenants/soak-a/out/j/.a.jpg.ffswarm-j-c0000-a1-0a1b2c.tmp: temporary file left",
        "runs/j/lease.json: lease left",
        "inbox/running/k.1234.yaml: still in the inbox",
        "runs/.outbox/j~msg_1~0: webhook delivery still pending",
        "tenants/.quota/soak-a/ledger: counts 1 unfinished jobs",
        "tenants/.quota/soak-a/open/k: quota slot held",
    ]


def test_a_job_service_or_container_left_in_the_swarm_is_named() -> None:
    stack = {"Spec": {"Name": "ffswarm_api", "Labels": {"io.ffswarm.role": "api"}}}
    lane = {"Spec": {"Name": "ffswarm-lane-1", "Labels": {"io.ffswarm.job": "lane", "io.ffswarm.role": "lane"}}}
    box = {"Id": "f" * 64, "Names": ["/ffswarm-j-c0000.1.x"], "State": "exited", "Labels": {"io.ffswarm.job": "j"}}
    assert checks.left_in_swarm([stack], {"ffswarm-w1": [{"Id": "a", "Labels": {}}]}).ok
    assert checks.left_in_swarm([stack, lane], {"ffswarm-w1": [box]}).problems == [
        "service ffswarm-lane-1 (lane) left",
        "ffswarm-w1: container ffswarm-j-c0000.1.x (exited) left",
    ]


def delivery(root: Path, job: str, did: str, kind: str = "job.finished", state: str = "delivered") -> None:
    folder = root / run_rel(job) / "deliveries"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{did}.json").write_text(json.dumps({"id": did, "job": job, "type": kind, "state": state}))


def test_each_job_end_delivered_once_by_id_and_a_redelivered_id_is_only_noted(root: Path) -> None:
    delivery(root, "j", "msg_1")
    delivery(root, "j", "msg_0", kind="job.started")
    delivery(root, "r", "msg_2")
    delivery(root, "r", "msg_3")  # r was retried: it ended twice
    got = [{"id": "msg_1", "type": "job.finished", "job": "j"}] * 2
    got += [{"id": "msg_2", "type": "job.finished", "job": "r"}, {"id": "msg_3", "type": "job.finished", "job": "r"}]
    check = checks.webhooks_once(root, {"j": 1, "r": 2, "never-started": None}, got)
    assert check.ok, check.problems
    assert check.notes == ["1 ids redelivered (same id, deduplicated): msg_1"]


def test_a_refused_jobs_end_is_found_beside_its_owner_record(root: Path) -> None:
    folder = root / "tenants" / ".jobs" / "soak-b" / "video-x.deliveries"
    folder.mkdir(parents=True)
    (folder / "msg_7.json").write_text(json.dumps({"id": "msg_7", "job": "video-x", "type": "job.finished",
                                                   "state": "delivered"}))  # fmt: skip
    got = [{"id": "msg_7", "type": "job.finished", "job": "video-x"}]
    check = checks.webhooks_once(root, {"video-x": None}, got)
    assert check.ok, check.problems


def test_a_missing_pending_or_extra_webhook_fails(root: Path) -> None:
    delivery(root, "j", "msg_1", state="pending")
    delivery(root, "k", "msg_2")
    delivery(root, "k", "msg_3")
    got = [{"id": "msg_2", "type": "job.finished", "job": "k"}, {"id": "msg_9", "type": "job.cancelled", "job": "x"}]
    assert checks.webhooks_once(root, {"j": 1, "k": 1}, got).problems == [
        "j: job.finished msg_1 not delivered (pending)",
        "j: receiver got 0 distinct end ids for 1 end(s)",
        "k: 2 end deliveries in its outbox for 1 end(s)",
        "k: job.finished msg_3 marked delivered, never received",
        "msg_9: received but in no job's outbox",
    ]


def test_usage_that_adds_up_passes_and_a_lost_gpu_second_fails() -> None:
    jobs = {
        "soak-a": [
            {"gpu_seconds": 10.5, "runner_seconds": 10.5, "attempts": 2, "bytes_in": 100, "bytes_out": 90,
             "items": {"ok": 1, "no_face": 0, "failed": 0, "cancelled": 0}},
            {"gpu_seconds": 4.0, "runner_seconds": 4.0, "attempts": 1, "bytes_in": 50, "bytes_out": 0,
             "items": {"ok": 0, "no_face": 0, "failed": 1, "cancelled": 0}},
            None,
        ]
    }  # fmt: skip
    total = {"gpu_seconds": 14.5, "runner_seconds": 14.5, "attempts": 3, "bytes_in": 150, "bytes_out": 90,
             "items": {"ok": 1, "no_face": 0, "failed": 1, "cancelled": 0}}  # fmt: skip
    assert checks.usage_adds_up({"soak-a": total}, jobs).ok
    short = checks.usage_adds_up({"soak-a": {**total, "gpu_seconds": 13.5}}, jobs)
    assert short.problems == ["soak-a: gpu_seconds 13.5 in /v1/usage, 14.5 over its jobs"]


# --- the soak's requests against the API as it is, and its webhook receiver ------------------------


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 1000})


def soak_inputs(area: Path) -> None:
    """Stand-ins of make_inputs' files: the API checks that inputs exist, never what they show."""
    for rel in ("soak/faces/s0.jpg", "soak/faces/s1.jpg", *(f"soak/in/p{i:02d}.jpg" for i in range(12))):
        (area / rel).parent.mkdir(parents=True, exist_ok=True)
        (area / rel).write_bytes(JPEG)
    (area / "soak" / "video").mkdir(parents=True, exist_ok=True)
    for v in (0, 1):
        (area / "soak" / "video" / f"v{v}.mp4").write_bytes(MP4)


def test_every_kind_of_soak_request_is_accepted_and_cancel_and_retry_reach_back(env: Env) -> None:
    for tenant in KEYS:
        env.client(tenant).get("/v1/jobs").raise_for_status()  # the API makes the area
        soak_inputs(env.area(tenant))
    record = Record()
    stream = Stream(env.root, [env.url], dict(KEYS), None, record)
    jobs = [stream.offer(Request(0, "acme", kind, 1), 0.0) for kind in ("photo", "zip", "pairs", "video")]
    assert all(jobs), record.answers
    assert stream.offer(Request(0, "globex", "photo", 3), 1.0, reference=True)
    assert {a.key for a in record.accepted.values() if a.tenant == "acme"} == {"photo-1", "zip-1", "pairs-1", "video-1"}
    assert stream.offer(Request(0, "acme", "cancel", 1), 2.0) is None
    assert record.cancelled == {jobs[-1]} and record.answers["cancel 200"] == 1
    status = stream.status("acme", str(jobs[-1]))
    assert status is not None and status["phase"] == "cancelled"
    assert stream.offer(Request(0, "acme", "retry", 1), 3.0) is None  # never the cancelled one: the latest other
    assert record.answers["retry 409"] == 1 and not record.retried  # still queued: not finished
    assert stream.offer(Request(0, "globex", "cancel", 5), 4.0) is None and record.answers["cancel none"] == 1
    listed = {j["job"] for j in stream.jobs("acme")}
    assert listed == set(j for j in jobs if j)
    assert stream.usage("acme") is not None


def test_the_receiver_records_each_delivery_by_id_and_verifies_its_tenants_signature() -> None:
    import httpx

    from controller.run.hooks import sign

    secret = base64.b64encode(b"k" * 32).decode()
    receiver = Receiver("127.0.0.1", {"soak-a": f"whsec_{secret}"})
    try:
        for tenant, key in (("soak-a", b"k" * 32), ("soak-a", b"wrong-key-of-32-bytes-0123456789")):
            body = json.dumps({"type": "job.finished", "data": {"job": "j-1", "tenant": tenant}}).encode()
            now = int(time.time())
            headers = {
                "webhook-id": "msg_1",
                "webhook-timestamp": str(now),
                "webhook-signature": sign(key, "msg_1", now, body),
            }
            assert httpx.post(receiver.url, content=body, headers=headers).status_code == 204
        got = receiver.received()
        assert [(d["id"], d["type"], d["job"], d["verified"]) for d in got] == [
            ("msg_1", "job.finished", "j-1", True),
            ("msg_1", "job.finished", "j-1", False),
        ]
    finally:
        receiver.close()


def test_the_soaks_stack_is_the_rendered_one_with_host_mode_api_ports_and_serves_secrets() -> None:
    api = ApiService((10002, 10001), publish_port=8080, replicas=2, secrets=("soak-api-signing-1",))
    stack = ControllerStack(
        image="reg:5000/ffswarm/controller@sha256:" + "a" * 64,
        config_file=Path("/build/soak/ffswarm.yaml"),
        config_text="data_root: /srv/d\n",
        data_root="/srv/d",
        volume=VolumeSpec.bind("/srv/d"),
        api=api,
    )
    rendered = yaml.safe_load(render_controller_stack(stack))
    doc = yaml.safe_load(deploy.adapt(render_controller_stack(stack), ["soak-api-signing-1", "soak-hook-soak-a-2"]))
    svc = doc["services"]["api"]
    assert svc["ports"] == [{"target": 8080, "published": 8080, "protocol": "tcp", "mode": "host"}]
    assert svc["deploy"]["placement"]["max_replicas_per_node"] == 1 and svc["deploy"]["replicas"] == 2
    assert svc["secrets"] == rendered["services"]["api"]["secrets"]  # the API's own, as rendered
    serve = doc["services"]["controller"]
    assert [(s["target"], s["uid"], s["mode"]) for s in serve["secrets"]] == [
        ("soak-api-signing-1", "0", 0o400),
        ("soak-hook-soak-a-2", "0", 0o400),
    ]
    assert {s["source"] for s in serve["secrets"]} <= set(doc["secrets"])
    assert all(doc["secrets"][s["source"]] == {"external": True, "name": s["target"]} for s in serve["secrets"])
    rest = {k: v for k, v in serve.items() if k != "secrets"}
    assert rest == rendered["services"]["controller"]  # nothing else of serve changed
    assert doc["volumes"] == rendered["volumes"] and doc["configs"] == rendered["configs"]


def test_the_stream_sends_each_request_at_its_second_and_the_drain_sees_what_is_not_ended(env: Env) -> None:
    for tenant in KEYS:
        env.client(tenant).get("/v1/jobs").raise_for_status()
        soak_inputs(env.area(tenant))
    reqs = (Request(0.0, "acme", "photo", 0), Request(0.3, "globex", "zip", 2), Request(4.0, "acme", "cancel", 1))
    plan = Plan(1, 0.01, False, False, (), reqs)
    record = Record()
    stream = Stream(env.root, ["http://127.0.0.1:9"], dict(KEYS), None, record)  # replaced before the first request
    took = run.faulted(plan, stream, None, lambda: [env.url])
    assert 4.0 <= took < 60
    assert dict(record.answers) == {"photo 202": 1, "zip 202": 1, "cancel 200": 1}
    jobs = {a.job: a.tenant for a in record.accepted.values()}
    statuses = run.wait_ended(stream, {**jobs, "photo-lost0000": "acme"}, timeout=0, lost_after=0)
    phases = {job: (s or {}).get("phase") for job, s in statuses.items()}
    assert sorted(phases.values(), key=str) == [None, "cancelled", "queued"]  # no serve here: one stays queued
    assert checks.ended(list(statuses), statuses).problems[0].endswith("(outcome None)")


# --- S3: the config, the request, the checks on a store, the store fault ---------------------------


def test_dry_run_with_s3_plans_s3_requests_and_the_store_fault_and_says_how_to_replay_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--dry-run", "--short", "--seed", "42", "--s3"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/nonexistent"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--seed 42 --minutes 5 --short --gap 1.4 --s3)" in proc.stdout
    assert "S3 on" in proc.stdout and "stop_store" in proc.stdout and '"s3":' in proc.stdout


STORE = deploy.ObjectStore("http://10.9.0.1:7480", "ffswarm-soak-7", "SOAKACCESSKEY", "soak-secret-key")


def test_the_soaks_config_with_s3_reaches_the_store_on_the_gateway_with_its_keys_as_a_secret(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cluster_config = tmp_path / "cluster.yaml"
    cluster_config.write_text(yaml.safe_dump({"data_root": str(tmp_path / "data"), "volume": {"type": "bind"},
                                              "docker_host": "tcp://127.0.0.1:1"}))  # fmt: skip
    c = deploy.Cluster(tmp_path / "data", cluster_config, {}, {}, "10.9.0.1", False)
    made: dict[str, bytes] = {}

    def make_secret(name: str, value: bytes) -> str:
        made[f"soak-{name}-x"] = value
        return f"soak-{name}-x"

    d = deploy.write_config(c, "reg/ctl@sha256:" + "a" * 64, "10.9.0.1", 7, STORE, make_secret, tmp_path / "out")
    config = load_config(str(d.config))
    s3 = config.storage.s3
    assert s3 is not None and (s3.endpoint_url, s3.addressing, s3.network) == (
        "http://10.9.0.1:7480", "path", deploy.S3_NETWORK,
    )  # fmt: skip
    assert s3.credentials_secret == "soak-s3-x" and str(s3.credentials_file) == "/run/secrets/soak-s3-x"
    creds = parse_credentials(made["soak-s3-x"])
    assert (creds.access_key_id, creds.secret_access_key) == ("SOAKACCESSKEY", "soak-secret-key")
    assert {t: str(config.tenants[t].s3) for t in TENANTS} == {t: f"s3://ffswarm-soak-7/{t}/" for t in TENANTS}
    assert "soak-s3-x" in d.secret_names  # removed with the stack
    api = _api_service(config, 8080, 2, None)
    assert api is not None and "soak-s3-x" in api.secrets and "soak-s3-x" in _serve_secrets(config)
    without = load_config(str(deploy.write_config(c, "img", "10.9.0.1", 7, None, make_secret, tmp_path / "o2").config))
    assert without.storage.s3 is None and all(t.s3 is None for t in without.tenants.values())


def test_an_s3_request_names_objects_in_its_tenants_area_and_its_output_goes_there() -> None:
    area = STORE.area("soak-b")
    got = body(Request(0, "soak-b", "s3", 2), "http://10.9.0.1:9/hook", area)
    assert got["source"] == "s3://ffswarm-soak-7/soak-b/soak/faces/s0.jpg"
    assert got["targets"] == ["s3://ffswarm-soak-7/soak-b/soak/in/p06.jpg"]
    assert "output" not in got  # an object target's output: <area>out/<job>/{stem}{ext} (docs/api.md)
    assert got["on_complete"] == {"webhook": "http://10.9.0.1:9/hook"} and got["providers"] == ["cpu"]
    fence = parse_area(area, "soak-b", "tenants.soak-b.s3")
    assert all(fence.relative(u) is not None for u in [got["source"], *got["targets"]])
    record = Record()
    stream = Stream(Path("/nonexistent"), ["http://127.0.0.1:9"], {"soak-c": "k"}, None, record)
    assert stream.offer(Request(0, "soak-c", "s3", 0), 0.0) is None  # no area: never sent
    assert dict(record.answers) == {"s3 error ValueError": 1}


@pytest.fixture
def store(rgw: Rgw) -> Any:
    return rgw.client()


@pytest.fixture
def bucket(rgw: Rgw) -> Iterator[str]:
    """A bucket of this test's own on Ceph RGW (the ``rgw`` fixture), removed with what it holds."""
    name = rgw.new_bucket()
    try:
        yield name
    finally:
        rgw.remove_bucket(name)


def s3_job(root: Path, s3: Any, bucket: str, job: str, data: bytes | None, target: str = "p04.jpg") -> str:
    """A committed s3 job: its result line, and (``data``) its object as the runner puts it."""
    url = f"s3://{bucket}/soak-a/out/{job}/{target}"
    if data is not None:
        s3.put_object(Bucket=bucket, Key=url.split("/", 3)[3], Body=data, Metadata={META_JOB: job})
    inp = f"s3://{bucket}/soak-a/soak/in/{target}"
    write_run(root, job, {"c0000.a1.jsonl": line("i000000", 1, url, input=inp)})
    return url


def test_s3_outputs_compare_with_the_reference_read_from_the_store(root: Path, store: Any, bucket: str) -> None:
    ref = s3_job(root, store, bucket, "ref-1", photo(6))
    assert checks.outputs(root, "soak-a", "ref-1") == {"soak/in/p04.jpg": ref}
    s3_job(root, store, bucket, "same", photo(6))
    s3_job(root, store, bucket, "close", photo(6, nudge=12))
    bad = s3_job(root, store, bucket, "bad", photo(7))
    gone = s3_job(root, store, bucket, "gone", None)
    reference = {"s3-1": checks.outputs(root, "soak-a", "ref-1")}
    jobs = {j: ("soak-a", "s3-1") for j in ("same", "close", "bad", "gone")}
    check = checks.identical(root, jobs, reference, store)
    assert check.looked_at == 4 and check.notes == [
        "1 of 4 outputs equal the reference within the runner's rounding, not byte for byte"
    ]
    assert len(check.problems) == 2
    assert check.problems[0].startswith(f"bad: {bad} differs from the reference of s3-1 (soak/in/p04.jpg): a different")
    assert check.problems[1] == (
        f"gone: {gone} differs from the reference of s3-1 (soak/in/p04.jpg): {gone} is missing or not a regular file"
    )
    rounds = [reference, {"s3-1": checks.outputs(root, "soak-a", "close")}]
    again = checks.deterministic(root, rounds, store)
    assert again.ok and again.notes == ["0 byte-identical, 1 within the runner's rounding, of 1"]


def test_an_object_committed_by_two_jobs_fails_committed_once(root: Path, store: Any, bucket: str) -> None:
    s3_job(root, store, bucket, "j1", b"1")
    assert checks.committed_once(root).ok
    url = s3_job(root, store, bucket, "j1", b"1")
    write_run(root, "j2", {"c0000.a1.jsonl": line("i000000", 1, url, input=f"s3://{bucket}/soak-a/soak/in/x.jpg")})
    assert checks.committed_once(root).problems == [f"{url}: committed by 2 jobs (j1, j2)"]


def test_the_store_holds_only_inputs_and_recorded_outputs_and_no_open_upload(
    root: Path, store: Any, bucket: str, tmp_path: Path
) -> None:
    area = tmp_path / "area"
    for rel in ("soak/faces/s0.jpg", "soak/in/p04.jpg"):
        (area / rel).parent.mkdir(parents=True, exist_ok=True)
        (area / rel).write_bytes(JPEG)
    put = upload_inputs(area, store, f"s3://{bucket}/soak-a/")
    assert put == [f"s3://{bucket}/soak-a/soak/faces/s0.jpg", f"s3://{bucket}/soak-a/soak/in/p04.jpg"]
    assert store.get_object(Bucket=bucket, Key="soak-a/soak/in/p04.jpg")["Body"].read() == JPEG
    s3_job(root, store, bucket, "j1", b"out")
    killed = f"s3://{bucket}/soak-a/out/k1/p05.jpg"  # put by an attempt killed before its result line
    store.put_object(Bucket=bucket, Key="soak-a/out/k1/p05.jpg", Body=b"o", Metadata={META_JOB: "k1"})
    write_run(root, "k1", {"c0000.a1.commits": json.dumps({"item": "i000000", "output": killed}) + "\n"})
    inputs = ["soak-a/soak/"]
    clean = checks.left_in_store(root, store, bucket, inputs)
    assert clean.ok and clean.looked_at == 4, clean.problems

    store.put_object(Bucket=bucket, Key="soak-a/out/j1/.p04.jpg.tmp", Body=b"t")
    upload = store.create_multipart_upload(Bucket=bucket, Key="soak-b/out/j9/v.mp4")["UploadId"]
    store.put_object(Bucket=bucket, Key="soak-a/out/j1/p04.jpg", Body=b"x", Metadata={META_JOB: "intruder"})
    assert checks.left_in_store(root, store, bucket, inputs).problems == [
        f"s3://{bucket}/soak-b/out/j9/v.mp4: multipart upload {upload[:12]} left",
        f"s3://{bucket}/soak-a/out/j1/.p04.jpg.tmp: no job recorded this object (a temporary or stray object)",
        f"s3://{bucket}/soak-a/out/j1/p04.jpg: its metadata names job intruder, recorded by j1",
    ]


def test_the_store_fault_stops_radosgw_alone_for_its_duration_then_starts_it_and_waits(tmp_path: Path) -> None:
    commands: list[tuple[str, ...]] = []
    slept: list[float] = []
    fail_on: set[str] = set()

    def runner(*cmd: str, timeout: float) -> str:
        commands.append(cmd)
        if cmd[1] in fail_on:
            raise RuntimeError(f"{cmd[1]} failed")
        return ""

    c = deploy.Cluster(tmp_path, tmp_path / "c.yaml", {}, {}, "10.9.0.1", False)
    stream = Stream(tmp_path, [], {}, None, Record())
    faults = Faults(c, stream, RgwSwitch("10.9.0.1", run=runner), sleep=slept.append)
    faults.inject(Fault(5.0, "stop_store", 0, 30.0), time.monotonic())
    script = str(S3_SERVER)
    assert commands == [(script, "gateway-kill"), (script, "start", "--also", "10.9.0.1")]
    assert slept == [30.0]
    done = faults.done[0]
    assert (done.injected, done.target, done.note) == (True, "rgw:10.9.0.1", "stopped 30s")

    commands.clear()
    fail_on.add("gateway-kill")  # a stop that fails half-way: the gateway is started all the same
    faults.inject(Fault(9.0, "stop_store", 0, 30.0), time.monotonic())
    assert commands == [(script, "gateway-kill"), (script, "start", "--also", "10.9.0.1")]
    assert not faults.done[1].injected and faults.done[1].note == "failed: RuntimeError: gateway-kill failed"

    bare = Faults(c, stream, None, sleep=slept.append)
    bare.inject(Fault(1.0, "stop_store", 0, 30.0), time.monotonic())
    assert not bare.done[0].injected and bare.done[0].note == "skipped: no object store (a soak without --s3)"


def test_overlapping_pauses_take_different_workers_and_a_failed_freeze_is_tried_again(tmp_path: Path) -> None:
    commands: list[tuple[str, ...]] = []
    refuse_freeze = {"ffswarm-w2"}  # runc's "unable to freeze" once for this node
    later: list[Fault] = []

    def run(*cmd: str, check: bool = True, timeout: float = 300) -> str:
        commands.append(cmd)
        if cmd[1] == "pause" and cmd[2] in refuse_freeze:
            refuse_freeze.discard(cmd[2])
            raise RuntimeError("docker pause … failed (1): unable to freeze")
        return ""

    def sleep(seconds: float) -> None:  # while a pause lasts, the next planned fault comes
        if seconds == 40.0 and later:
            faults.inject(later.pop(0), time.monotonic())

    c = deploy.Cluster(tmp_path, tmp_path / "c.yaml", {}, {}, "10.9.0.1", False)
    faults = Faults(c, Stream(tmp_path, [], {}, None, Record()), None, sleep=sleep, run=run)
    later += [Fault(20.0, "pause_worker", 0, 40.0), Fault(30.0, "pause_worker", 0, 40.0)]
    faults.inject(Fault(10.0, "pause_worker", 0, 40.0), time.monotonic())
    assert commands == [
        ("docker", "pause", "ffswarm-w1"),
        ("docker", "pause", "ffswarm-w2"),  # w1 is held: the second pause takes the other worker
        ("docker", "pause", "ffswarm-w2"),  # its freeze failed once: tried again
        ("docker", "unpause", "ffswarm-w2"),
        ("docker", "unpause", "ffswarm-w1"),
    ]
    notes = [(d.target, d.injected, d.note) for d in faults.done]
    assert notes == [
        ("", False, "skipped: every worker is paused already"),
        ("ffswarm-w2", True, "paused 40s"),
        ("ffswarm-w1", True, "paused 40s"),
    ]


def test_the_s3_server_never_listens_on_every_address(tmp_path: Path) -> None:
    for bad in ("0.0.0.0", "10.0.0.1;true", "::"):
        proc = subprocess.run([str(S3_SERVER), "start", "--also", bad], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "FFSWARM_RGW_STATE": str(tmp_path / "rgw")})  # fmt: skip
        assert proc.returncode == 2 and f"--also {bad}: give one IPv4 address of this host" in proc.stderr
    assert not (tmp_path / "rgw" / "also").exists()  # nothing remembered, nothing installed or started


def test_a_packed_jobs_outputs_are_read_through_its_pack_and_never_another_jobs(root: Path) -> None:
    mine = output(root, "tenants/soak-a/out/j-1/p.jpg", b"mine")
    other = output(root, "tenants/soak-a/out/j-2/q.jpg", b"other")
    write_run(
        root,
        "pack-abc",
        {"c0000.a1.jsonl": line("i000000", 1, mine, input="/data/tenants/soak-a/in/p.jpg")
         + line("i000001", 1, other, input="/data/tenants/soak-a/in/q.jpg")},
        **{"members.json": json.dumps({"j-1": {"tenant": "soak-a", "items": {"i000000": "i000000"}},
                                       "j-2": {"tenant": "soak-a", "items": {"i000001": "i000000"}}})},
    )  # fmt: skip
    write_run(root, "j-1", {}, packed="pack-abc\n")
    assert checks.outputs(root, "soak-a", "j-1") == {"in/p.jpg": "tenants/soak-a/out/j-1/p.jpg"}
    write_run(root, "j-3", {}, packed="pack-abc\n")  # named by no member entry: sees nothing
    assert checks.outputs(root, "soak-a", "j-3") == {}


def test_a_server_error_fails_the_soak_but_the_designed_503_does_not() -> None:
    """A 500 is a bug whatever fault was in flight (the soak once saw ZIP uploads answered 500 while a
    root serve held a tenant's area); 503 is the full volume's or serve's designed answer."""
    assert checks.no_internal_errors({"photo 202": 40, "zip 503": 3, "error ConnectError": 2}, []).ok
    assert checks.no_internal_errors({}, ["upload answered 503", "upload answered RemoteProtocolError"]).ok
    found = checks.no_internal_errors({"photo 202": 40, "zip 500": 2}, ["upload answered 500"])
    assert found.problems == ["2 × zip 500", "a fault's request: upload answered 500"]
    assert found.looked_at == 42
