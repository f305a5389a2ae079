"""The spine end to end on the real single-node swarm: `ffswarm submit` → chunk services → outputs.

Real dockerd, real Swarm scheduling with two fake GPUs (generic resources GPU-a, GPU-b), the real
runner image running insightface/onnxruntime on the stand-in pack (real RetinaFace detector).
"""

from __future__ import annotations

import json
import time
from itertools import combinations
from pathlib import Path

import cv2
import numpy as np
import pytest

from contract.attempt import AttemptRecord
from contract.results import ItemResult, read_results
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos
from tests.integration.conftest import ServiceWatch, Workspace, chown_tree

pytestmark = pytest.mark.integration


def detector(root: Path):  # type: ignore[no-untyped-def]
    from insightface.model_zoo import get_model

    det = get_model(str(root / "models" / "default" / "det_10g.onnx"), providers=["CPUExecutionProvider"])
    det.prepare(ctx_id=-1, input_size=(640, 640), det_thresh=0.5)
    return det


def face_boxes(det, img: np.ndarray) -> list[tuple[int, int, int, int]]:  # type: ignore[no-untyped-def]
    bboxes, _ = det.detect(img, input_size=(640, 640))
    return [tuple(int(v) for v in b[:4]) for b in bboxes]


def test_image_job_end_to_end(workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    src = ws.dir / "faces"
    crowd = ws.dir / "crowd"
    star = photos.astronaut(src)
    faces = photos.face_photos(crowd, 12)
    empty = photos.no_face_photo(crowd)
    broken = photos.not_an_image(crowd)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    out_rel = ws.rel(ws.dir / "out")
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(crowd)}/*.jpg]
output: {out_rel}/{{stem}}{{ext}}
chunk_size: 5
max_concurrent: 2
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 2g}}
placement: [node.labels.ffswarm.gpu==true]
retries: 1
timeout: 10m
""")
    with ServiceWatch(swarm, ws.job) as watch:
        proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 1, proc.stderr[-3000:]  # the broken file is a failed item → exit 1
    assert "outputs:" in proc.stdout and "model pack: default" in proc.stdout

    # Window: never more than max_concurrent services, and the window was actually used.
    assert watch.max_alive == 2
    assert len(watch.specs) == 3  # 14 items / 5 = 3 chunks, one attempt each
    for name, spec in watch.specs.items():
        task = spec["TaskTemplate"]
        assert name.startswith(f"ffswarm-{ws.job}-c000") and name.endswith("-a1")
        assert spec["Labels"][LABEL_JOB] == ws.job and spec["Labels"]["io.ffswarm.role"] == "runner"
        assert task["Placement"]["Constraints"] == ["node.labels.ffswarm.gpu==true"]
        gen = task["Resources"]["Reservations"]["GenericResources"]
        assert gen == [{"DiscreteResourceSpec": {"Kind": "GPU", "Value": 1}}]
        assert task["Resources"]["Limits"]["MemoryBytes"] == 2 << 30
        assert task["RestartPolicy"]["Condition"] == "none"
        assert task["ContainerSpec"]["Image"].startswith("sha256:")  # resolved, never a tag

    # The identity step ran as its own one-shot service beside the first chunks, reserving no GPU.
    assert watch.identity_beside_chunks
    (step,) = watch.step_specs.values()
    assert step["Name"] == f"ffswarm-{ws.job}-identity" and step["Labels"]["io.ffswarm.role"] == "identity"
    assert "GenericResources" not in (step["TaskTemplate"]["Resources"].get("Reservations") or {})

    # Nothing of ours is left on the swarm.
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
    assert swarm.client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={ws.job}"}) == []

    run = ws.root / "runs" / ws.job
    report = json.loads((run / "report.json").read_text())
    assert "identity written" in (run / "logs" / "identity.log").read_text()  # the submit-time step's own log
    results: list[ItemResult] = []
    for f in sorted((run / "results").glob("*.jsonl")):
        results += read_results(f.read_text())
    by_input = {r.input.removeprefix("/data/"): r for r in results}
    assert len(by_input) == 14

    # Per-item outcomes with reasons; nothing else harmed.
    assert by_input[ws.rel(empty)].status.value == "no_face"
    bad = by_input[ws.rel(broken)]
    assert bad.status.value == "error" and bad.reason and "broken.jpg" in bad.reason
    assert not (ws.dir / "out" / "broken.jpg").exists()
    assert report["counts"] == {
        "items": 14,
        "ok": 12,
        "no_face": 1,
        "failed": 1,
        "chunks": 3,
        "chunks_done": 3,
        "chunks_failed": 0,
        "chunks_cancelled": 0,
        "cancelled": 0,
        "segments": 0,
    }
    assert [f["input"] for f in report["failures"]] == [ws.rel(broken)]
    assert report["image"].startswith("sha256:")

    # What the chunks cost is measured and kept for the next `chunk_size: auto` with this pack.
    timing = report["timing"]
    assert timing["provider"] == "cpu" and 0 < timing["cold_start_s"] < 60 and 0 < timing["item_s"] < 60
    kept = json.loads((ws.root / "runs" / ".timings.json").read_text())["default/cpu"]
    assert kept["job"] == ws.job and kept["cold_start_s"] == timing["cold_start_s"]
    # ... from each runner's record of its attempt (contract/attempt.py), written in the container.
    records = [AttemptRecord.from_json(p.read_text()) for p in sorted((run / "attempts").glob("*.json"))]
    assert [(r.chunk, r.attempt) for r in records] == [("c0000", 1), ("c0001", 1), ("c0002", 1)]
    assert all(r.provider == "cpu" and r.exit in ("OK", "ITEMS_FAILED") and r.cold_start_s for r in records)
    assert sum(r.items_done for r in records) == 13 and sum(r.items_failed for r in records) == 1
    out_files = sorted(p.name for p in (ws.dir / "out").iterdir())
    assert out_files == sorted([p.name for p in faces] + [empty.name])  # no temp files, no partial output
    assert (ws.dir / "out" / empty.name).read_bytes() == empty.read_bytes()  # no_face: copy

    # Faces changed inside every detected face box; the rest matches within JPEG tolerance.
    det = detector(ws.root)
    for p in faces:
        before = cv2.imread(str(p))
        after = cv2.imread(str(ws.dir / "out" / p.name))
        assert after is not None and after.shape == before.shape
        boxes = face_boxes(det, before)
        assert boxes, p.name
        diff = np.abs(after.astype(np.int16) - before.astype(np.int16)).mean(axis=2)
        far = np.ones(diff.shape, bool)
        for x1, y1, x2, y2 in boxes:
            w, h = x2 - x1, y2 - y1
            inner = diff[max(y1 + h // 4, 0) : y2 - h // 4, max(x1 + w // 4, 0) : x2 - w // 4]
            assert inner.mean() > 8, f"{p.name}: face at {(x1, y1, x2, y2)} unchanged ({inner.mean():.1f})"
            far[max(y1 - h, 0) : y2 + h, max(x1 - w, 0) : x2 + w] = False
        if far.any():
            assert diff[far].mean() < 2.5, f"{p.name}: background changed ({diff[far].mean():.2f})"

    # Each container saw a GPU id Swarm assigned; runners that overlapped in time saw distinct ones.
    assert {r.gpu for r in results} <= {"GPU-a", "GPU-b"} and None not in {r.gpu for r in results}
    chunks: dict[str, tuple[float, float, str | None]] = {}
    for f in sorted((run / "results").glob("*.jsonl")):
        rs = read_results(f.read_text())
        chunks[f.stem] = (min(r.started for r in rs), max(r.finished for r in rs), rs[0].gpu)
    overlapping = [(a, b) for a, b in combinations(chunks.values(), 2) if a[0] < b[1] and b[0] < a[1]]
    for a, b in overlapping:
        assert a[2] != b[2]


def test_unschedulable_job_fails_with_the_schedulers_reason(
    workspace: Workspace, swarm: DockerSwarm, tmp_path: Path
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", 1)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    config = tmp_path / "ffswarm.yaml"
    config.write_text(ws.config.path.read_text().replace("schedule_timeout: 5m", "schedule_timeout: 4s"))
    assert "schedule_timeout: 4s" in config.read_text()
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "crowd")}/*.jpg]
output: {ws.rel(ws.dir / "out")}/{{stem}}{{ext}}
providers: [cpu]
placement: [node.labels.ffswarm.nosuchlabel==true]
""")
    t0 = time.monotonic()
    proc = ws.ffswarm("submit", str(job_file), config=config)
    elapsed = time.monotonic() - t0
    # The job's first service (the submit-time identity step) already cannot be placed: the submit
    # fails with "capacity unavailable" and the scheduler's own words, within the configured time.
    assert proc.returncode == 69, proc.stderr[-2000:]
    assert "no suitable node (scheduling constraints not satisfied on 1 node)" in proc.stderr
    assert elapsed < 4 + 30
    assert not (ws.root / "runs" / ws.job).exists()  # a refused submit leaves no run folder
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []
