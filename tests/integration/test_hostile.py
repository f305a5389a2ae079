"""The hostile-input corpus on the real single-node swarm (tests/fixtures/hostile.py makes the inputs).

- Bad targets fail ALONE: one job holds every hostile image next to good photos; each bad item gets
  its exact status and reason, every other item still completes, nothing half-written is left.
- Bad job files are refused by a real `ffswarm submit` before anything exists: exit code, file,
  field and reason, and no run folder, no service.
- A source photo without a face and a model pack with a wrong checksum are refused at submit (the
  identity step runs the runner image once), naming the photo / the file, leaving nothing behind.
- Chunk-level user errors (a manifest of an unknown schema version or not JSON at all, a pack with a
  wrong checksum) fail their chunk once, never retried, with a reason that names the cause.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from contract.results import ItemResult, ItemStatus, read_results
from controller.config import Config
from controller.run.chunks import Policy
from controller.run.failures import FailureClass
from controller.run.rundir import Control, RunDir
from controller.run.supervisor import Supervisor
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB, RunnerSettings
from tests.fixtures import hostile, photos
from tests.integration.conftest import Workspace, chown_tree

pytestmark = pytest.mark.integration

RESOURCES = "{gpus: 1, gpu_kind: GPU, memory: 2g}"


def owner(config: Config) -> tuple[int, int]:
    uid, gid = config.runner_uid_gid().split(":")
    return int(uid), int(gid)


def all_results(run: Path) -> list[ItemResult]:
    out: list[ItemResult] = []
    for f in sorted((run / "results").glob("*.jsonl")):
        out += read_results(f.read_text())
    return out


def temp_files(folder: Path) -> list[Path]:
    """Hidden files under the output folders: temporary names of writes that never completed."""
    return [p for p in folder.rglob("swapped/.*")]


def test_hostile_images_fail_alone(workspace: Workspace, swarm: DockerSwarm) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    good = photos.face_photos(ws.dir / "crowd", 3)
    paths = hostile.write_image_cases(ws.dir)
    # Not targets at all: a hidden half-upload and a folder with an image name.
    (ws.dir / "crowd" / ".upload-in-progress.jpg").write_bytes(hostile.face_jpeg()[:100])
    (ws.dir / "crowd" / "album.jpg").mkdir()
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    locked = ws.dir / "locked" / "swapped"  # where blocked.jpg's output goes: root's, read-only
    locked.mkdir()
    os.chown(locked, 0, 0)
    locked.chmod(0o555)
    hostile.apply_modes(paths)
    job_file = ws.write_job(f"""
name: {ws.job}
source: {ws.rel(star)}
targets: [{ws.rel(ws.dir / "crowd")}/*, {ws.rel(ws.dir / "locked")}/*.jpg]
output: "{{dir}}/swapped/{{stem}}{{ext}}"
no_face: copy
chunk_size: 8
max_concurrent: 2
providers: [cpu]
resources: {RESOURCES}
retries: 1
timeout: 10m
""")
    # A photo the runner may not read and an output folder it may not write: refused at submit, both
    # named, nothing created (controller/job/access.py); with the printed fix applied they run like any photo.
    refused = ws.ffswarm("submit", str(job_file))
    assert refused.returncode == 66, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert f"  {ws.rel(paths['secret.jpg'])}: input the runner cannot read (owner " in refused.stderr
    assert f"  {ws.rel(locked)}: output folder the runner cannot write (owner 0:0, mode 0555)" in refused.stderr
    assert not (ws.root / "runs" / ws.job).exists() and not (ws.dir / "crowd" / "swapped").exists()
    fix = next(ln for ln in refused.stderr.splitlines() if ln.startswith("fix (as root, in "))
    subprocess.run(fix.split(": ", 1)[1], shell=True, cwd=ws.root, check=True)
    cases = [
        dataclasses.replace(c, status="ok", reason=None) if c.reason == hostile.DENIED else c
        for c in hostile.IMAGE_CASES
    ]
    proc = ws.ffswarm("submit", str(job_file))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]  # failed items → exit 1

    run = ws.root / "runs" / ws.job
    report = json.loads((run / "report.json").read_text())
    planned = {i["input"] for i in report["items"].values()}
    n_cases = len(cases)
    assert len(planned) == n_cases + len(good), sorted(planned)
    assert ws.rel(ws.dir / "crowd" / ".upload-in-progress.jpg") not in planned
    assert ws.rel(ws.dir / "crowd" / "album.jpg") not in planned
    assert report["counts"]["chunks_done"] == report["counts"]["chunks"]  # no chunk died of a bad item
    assert report["counts"]["chunks_failed"] == 0

    results = all_results(run)
    final: dict[str, ItemResult] = {}
    for r in results:
        final[r.input.removeprefix("/data/")] = r
    assert set(final) == planned

    problems: list[str] = []
    for case in cases:
        src = paths[case.name]
        r = final[ws.rel(src)]
        out = src.parent / "swapped" / src.name
        if r.status.value != case.status:
            problems.append(f"{case.name} ({case.what}): expected {case.status}, got {r.status.value}: {r.reason}")
            continue
        if case.status == "error":
            if case.reason is None or not r.reason or case.reason not in r.reason or case.name not in r.reason:
                problems.append(f"{case.name} ({case.what}): reason {r.reason!r} lacks {case.reason!r} / the name")
            if out.exists():
                problems.append(f"{case.name}: an output was written for a failed item")
        elif case.status == "ok":
            img = cv2.imread(str(out), cv2.IMREAD_COLOR)
            if img is None or r.faces < case.min_faces:
                problems.append(f"{case.name} ({case.what}): output {out} missing/undecodable or faces={r.faces}")
        else:  # no_face with no_face: copy → the very bytes of the input
            if r.faces != 0 or not out.is_file() or out.read_bytes() != src.read_bytes():
                problems.append(f"{case.name} ({case.what}): no_face copy missing or different")
    assert not problems, "\n".join(problems)

    # Every good photo next to the hostile ones completed.
    for p in good:
        r = final[ws.rel(p)]
        assert r.status is ItemStatus.OK and r.faces >= 1, (p.name, r)
        assert cv2.imread(str(p.parent / "swapped" / p.name)) is not None

    # EXIF orientation: the output is upright (shape and pixels away from the swapped face).
    rotated = cv2.imread(str(paths["rotated.jpg"].parent / "swapped" / "rotated.jpg"), cv2.IMREAD_COLOR)
    upright = hostile.exif_rotated_upright()
    assert rotated.shape == upright.shape, "output is not upright: EXIF orientation ignored"
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    y1, y2 = y1 - 40, y2 - 40  # the upright picture lacks the astronaut's top 40 rows
    w, h = x2 - x1, y2 - y1
    far = np.ones(upright.shape[:2], bool)
    far[max(y1 - h, 0) : y2 + h, max(x1 - w, 0) : x2 + w] = False
    diff = np.abs(rotated.astype(np.int16) - upright.astype(np.int16)).mean(axis=2)
    assert diff[far].mean() < 6, f"rotated output differs from the upright picture ({diff[far].mean():.1f})"

    # Each item has exactly one final line; no temp files left anywhere; report agrees.
    finals = [r for r in results if not r.cached]
    assert len({r.item for r in finals}) == len(planned)
    assert temp_files(ws.dir) == []
    errors = {c.rel for c in cases if c.status == "error"}
    assert {f["input"].split(f"{ws.rel(ws.dir)}/", 1)[1] for f in report["failures"]} == errors
    assert report["counts"]["failed"] == len(errors)
    assert report["counts"]["no_face"] == sum(c.status == "no_face" for c in cases)
    assert report["counts"]["ok"] == sum(c.status == "ok" for c in cases) + len(good)
    assert swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}"}) == []


def test_hostile_job_files_are_refused_before_anything_is_created(
    workspace: Workspace, swarm: DockerSwarm, tmp_path: Path
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    crowd = ws.dir / "crowd"
    crowd.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (crowd / name).write_bytes(hostile.face_jpeg())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "elsewhere.jpg").write_bytes(hostile.face_jpeg())

    files: list[tuple[hostile.JobFileCase, str, Path]] = []
    for i, case in enumerate(hostile.JOB_FILE_CASES):
        base = ws.dir / "cases" / case.id
        base.mkdir(parents=True)
        name = f"{ws.job}-{i:02d}"
        lay = hostile.Layout(ws.root, ws.rel(base), name, ws.rel(star), ws.rel(crowd), outside)
        text = case.text(lay)
        path = base / f"{case.id}.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        files.append((case, name, path))
    chown_tree(ws.dir, ws.config.runner_uid_gid())

    def submit(path: Path) -> tuple[int, str]:
        proc = ws.ffswarm("submit", str(path), timeout=120)
        return proc.returncode, proc.stdout + proc.stderr

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            outcomes = list(pool.map(submit, [p for _, _, p in files]))
        problems = []
        for (case, name, path), (code, output) in zip(files, outcomes, strict=True):
            where = f"{path}: {case.field}: " if case.field else f"{path}: "
            if code != case.exit_code or where not in output or case.reason not in output:
                problems.append(
                    f"{case.id} ({case.what}): expected exit {case.exit_code} with {where!r}…{case.reason!r}, "
                    f"got exit {code}: {output.strip()[-400:]}"
                )
            if (ws.root / "runs" / name).exists():
                problems.append(f"{case.id}: a run folder was created")
        assert not problems, "\n".join(problems)
        labels = {s["Spec"].get("Labels", {}).get(LABEL_JOB, "") for s in swarm.client.api.services()}
        assert not {n for n in labels if n.startswith(ws.job)}, "a refused job created services"
    finally:
        for _, name, _ in files:
            for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={name}"}):
                swarm.remove_service(svc["ID"])
            shutil.rmtree(ws.root / "runs" / name, ignore_errors=True)


def bad_pack(ws: Workspace) -> str:
    """A copy of the default pack whose pack.yaml gives w600k_r50.onnx a wrong sha256; removed by the
    caller. Returns its name."""
    name = f"{ws.job}-pack"
    pack = ws.root / "models" / name
    shutil.copytree(ws.root / "models" / "default", pack)
    spec = yaml.safe_load((pack / "pack.yaml").read_text())
    spec["files"]["w600k_r50.onnx"]["sha256"] = "0" * 64
    (pack / "pack.yaml").write_text(yaml.safe_dump(spec))
    chown_tree(pack, ws.config.runner_uid_gid())
    return name


BAD_PACK_WHY = "w600k_r50.onnx has the wrong checksum"


def test_faceless_source_and_broken_pack_are_refused_at_submit(workspace: Workspace, swarm: DockerSwarm) -> None:
    """The source identity is computed once at submit (by the runner image): a source photo without a
    face is a job-file error naming the photo, a pack with a wrong checksum a missing input naming the
    file; either way nothing is left behind."""
    ws = workspace
    pack = bad_pack(ws)
    try:
        star = photos.astronaut(ws.dir / "faces")
        landscape = ws.dir / "faces" / "landscape.jpg"
        landscape.write_bytes(hostile.no_face_jpeg())
        photos.face_photos(ws.dir / "crowd", 2)
        chown_tree(ws.dir, ws.config.runner_uid_gid())
        common = f"targets: [{ws.rel(ws.dir / 'crowd')}/*.jpg]\nproviders: [cpu]\nresources: {RESOURCES}\nretries: 3\n"
        faceless = ws.write_job(
            f"name: {ws.job}\nsource: {ws.rel(landscape)}\noutput: {ws.rel(ws.dir)}/out1/{{stem}}{{ext}}\n" + common
        )
        broken = faceless.with_name("broken-pack.yaml")
        broken.write_text(
            f"name: {ws.job}-bp\nsource: {ws.rel(star)}\nmodels: {pack}\n"
            f"output: {ws.rel(ws.dir)}/out2/{{stem}}{{ext}}\n" + common
        )
        with ThreadPoolExecutor(max_workers=2) as pool:
            procs = list(pool.map(lambda f: ws.ffswarm("submit", str(f), timeout=300), [faceless, broken]))
        expected = [
            (faceless, ws.job, 65, f"{faceless}: source: ", f"{ws.rel(landscape)}: no face detected"),
            (broken, f"{ws.job}-bp", 66, f"{broken}: ", BAD_PACK_WHY),
        ]
        problems = []
        for proc, (file, job, code, where, why) in zip(procs, expected, strict=True):
            out = proc.stdout + proc.stderr
            if proc.returncode != code or where not in out or why not in out:
                problems.append(
                    f"{file.name}: expected exit {code}, {where!r}…{why!r}; got {proc.returncode}: {out[-600:]}"
                )
            if (ws.root / "runs" / job).exists():
                problems.append(f"{file.name}: a run folder was left behind")
            if swarm.client.api.services(filters={"label": f"{LABEL_JOB}={job}"}):
                problems.append(f"{file.name}: a service was left behind")
        assert not problems, "\n".join(problems)
        assert not (ws.dir / "out1").exists() and not (ws.dir / "out2").exists()
    finally:
        shutil.rmtree(ws.root / "models" / pack, ignore_errors=True)
        shutil.rmtree(ws.root / "runs" / f"{ws.job}-bp", ignore_errors=True)
        for svc in swarm.client.api.services(filters={"label": f"{LABEL_JOB}={ws.job}-bp"}):
            swarm.remove_service(svc["ID"])


def test_bad_manifests_and_a_broken_pack_fail_their_chunk_once(workspace: Workspace, swarm: DockerSwarm) -> None:
    """Hand-written manifests run by the real runner image through real chunk services under the
    real supervisor: unknown schema and not-JSON exit 65, a pack with a wrong checksum exits 66;
    none is retried (retries: 3), and each chunk's reason says why."""
    ws = workspace
    cfg = ws.config
    pack = bad_pack(ws)
    try:
        star = photos.astronaut(ws.dir / "faces")
        photos.face_photos(ws.dir / "crowd", 1)
        chown_tree(ws.dir, cfg.runner_uid_gid())
        rundir = RunDir(ws.root, ws.job, owner(cfg))
        for sub in ("chunks", "results", "logs"):
            (rundir.path / sub).mkdir(parents=True)
        base: dict[str, Any] = {
            "schema": 1,
            "job": ws.job,
            "run_dir": f"/data/runs/{ws.job}",
            "pack_dir": f"/data/models/{pack}",
            "source": [f"/data/{ws.rel(star)}"],
            "providers": ["cpu"],
            "items": [
                {
                    "id": "i000000",
                    "input": f"/data/{ws.rel(ws.dir)}/crowd/face_00.jpg",
                    "output": f"/data/{ws.rel(ws.dir)}/out/face_00.jpg",
                }
            ],
        }
        manifests = {
            "c0000": json.dumps({**base, "chunk": "c0000", "schema": 99}),
            "c0001": "{'this is': not JSON",
            "c0002": json.dumps({**base, "chunk": "c0002"}),
        }
        for cid, text in manifests.items():
            (rundir.path / "chunks" / f"{cid}.json").write_text(text)
        rundir.write_control(Control(max_concurrent=3))
        chown_tree(rundir.path, cfg.runner_uid_gid())

        settings = RunnerSettings(
            job=ws.job,
            image=swarm.resolve_image(cfg.image),
            constraints=("node.labels.ffswarm.gpu==true",),
            gpu_kind="GPU",
            gpus=1,
            memory_bytes=1 << 30,
            volume=cfg.volume,
            user=cfg.runner_uid_gid(),
        )
        policy = Policy(retries=3, schedule_timeout=60, poll=0.2, backoff_base=0.1)
        runs = Supervisor(swarm, rundir, settings, policy).run(list(manifests))
        expected = {
            "c0000": (65, "unknown manifest schema version 99"),
            "c0001": (65, "manifest is not JSON"),
            "c0002": (66, BAD_PACK_WHY),
        }
        for cid, (code, why) in expected.items():
            run = runs[cid]
            assert run.failure is FailureClass.USER, run.as_dict()
            assert [(a.attempt, a.exit_code) for a in run.attempts] == [(1, code)], run.as_dict()
            assert why in (run.reason or ""), run.as_dict()
            log = rundir.log_path(cid, 1).read_text()  # the runner's log, or its output kept by the supervisor
            assert why in log, log[-1000:]
        assert not (ws.dir / "out").exists()
    finally:
        shutil.rmtree(ws.root / "models" / pack, ignore_errors=True)
