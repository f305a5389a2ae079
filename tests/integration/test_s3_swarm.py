"""Object storage on the real single-node swarm (issue 19, docs/storage.md): runners read targets from
and commit outputs to an S3 server, the controller lists, probes, joins and signs.

The S3 server is Ceph RGW on the host, reached by the runners on the engine's docker_gwbridge address
from the attachable overlay network they join (``storage.s3.network``): tests/fixtures/s3_server.py.

What this does not prove (docs/storage.md): AWS's own consistency and throttling, and stores that
differ from RGW where docs/storage.md says they do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import pytest
import yaml

from contract.results import ItemStatus
from contract.s3 import META_ATTEMPT, META_JOB, META_SHA256
from controller.config import Config
from controller.swarm.docker import DockerSwarm
from controller.swarm.servicespec import LABEL_JOB
from tests.fixtures import photos, s3_server
from tests.fixtures.s3_server import BUCKET, WRONG_SECRET, S3Server
from tests.integration.conftest import CONFIG, ServiceWatch, Workspace, chown_tree, results_of
from tests.integration.test_video import panned_clip, streams
from tests.polling import Polling

pytestmark = pytest.mark.integration

COMMON = """providers: [cpu]
resources: {gpus: 1, gpu_kind: GPU, memory: 2g}
placement: [node.labels.ffswarm.gpu==true]
timeout: 10m
"""


@pytest.fixture(scope="module")
def s3(swarm: DockerSwarm, config: Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server.running(swarm.client, config.image, tmp_path_factory.mktemp("s3-secrets")) as server:
        yield server


def config_with_s3(s3: S3Server, ws: Workspace, wrong: bool = False) -> Path:
    """The dev config with ``storage.s3`` pointing at the server, for this test alone."""
    data = yaml.safe_load(CONFIG.read_text())
    data["storage"] = s3.storage(wrong)
    path = ws.dir / "ffswarm-s3.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def put_inputs(s3: S3Server, prefix: str, files: list[Path]) -> None:
    c = s3.client()
    for f in files:
        c.put_object(Bucket=BUCKET, Key=f"{prefix}/{f.name}", Body=f.read_bytes())


def objects(s3: S3Server, prefix: str) -> dict[str, dict[str, Any]]:
    """Every object under ``prefix``: its bytes and metadata, read back in full."""
    c = s3.client()
    out = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            got = c.get_object(Bucket=BUCKET, Key=o["Key"])
            out[o["Key"]] = {"data": got["Body"].read(), "meta": got["Metadata"]}
    return out


def whole(obj: dict[str, Any]) -> bool:
    """An object is whole when its bytes hash to the sha256 its committer recorded."""
    return hashlib.sha256(obj["data"]).hexdigest() == obj["meta"].get(META_SHA256)


def test_photos_and_a_video_in_the_store_run_end_to_end(workspace: Workspace, swarm: DockerSwarm, s3: S3Server) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    made = photos.face_photos(ws.dir / "made", 3)
    clip = panned_clip(star, ws.dir / "made" / "pan.mp4", "25", 2)  # 50 frames, a sine-tone track
    put_inputs(s3, f"{ws.job}/in", [*made, clip])
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: ['s3://{BUCKET}/{ws.job}/in/*']\n"
        f"output: 's3://{BUCKET}/{ws.job}/out/{{stem}}{{ext}}'\nsegment_seconds: 1\nchunk_size: 2\n"
        f"max_concurrent: 2\nretries: 1\n{COMMON}"
    )
    with ServiceWatch(swarm, ws.job) as watch:
        proc = ws.ffswarm("submit", str(job_file), config=config_with_s3(s3, ws))
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = objects(s3, f"{ws.job}/out")
    assert sorted(out) == sorted(f"{ws.job}/out/{f.name}" for f in [*made, clip])
    for key, obj in out.items():
        assert whole(obj), key
        assert obj["meta"][META_JOB] == ws.job
    for f in made:  # a swap happened: the same size, a changed face
        before = cv2.imread(str(f))
        after = cv2.imdecode(np.frombuffer(out[f"{ws.job}/out/{f.name}"]["data"], np.uint8), cv2.IMREAD_COLOR)
        assert after is not None and after.shape == before.shape
        assert np.abs(after.astype(np.int16) - before.astype(np.int16)).max() > 20
    joined = ws.dir / "joined.mp4"
    joined.write_bytes(out[f"{ws.job}/out/pan.mp4"]["data"])
    kinds = [s["codec_type"] for s in streams(joined)]
    video = next(s for s in streams(joined) if s["codec_type"] == "video")
    assert int(video["nb_read_packets"]) == 50 and "audio" in kinds  # every frame, the original's sound
    segments = [r for r in results_of(ws) if "-" in r.item]
    assert len({r.item for r in segments}) == 2  # two segments of one second, joined by the controller

    report = json.loads((ws.root / "runs" / ws.job / "report.json").read_text())
    links = {Path(e["output"]).name: e["output_url"] for e in report["items"].values() if e.get("output_url")}
    assert sorted(links) == sorted(f.name for f in [*made, clip])
    for name, link in links.items():  # presigned: a real store checks the signature
        got = httpx.get(link, timeout=30)
        assert got.status_code == 200 and got.content == out[f"{ws.job}/out/{name}"]["data"], name
        tampered = link.replace("X-Amz-Signature=", "X-Amz-Signature=0")
        assert httpx.get(tampered, timeout=30).status_code == 403, name

    # the secret: in no file of the run folder, no line the controller printed, no service's spec
    assert watch.specs and all(spec["TaskTemplate"]["ContainerSpec"].get("Secrets") for spec in watch.specs.values())
    storage_net = swarm.client.networks.get(s3.network).id
    for spec in watch.specs.values():  # the store is reached through the operator's network, named in the config
        assert storage_net in {n["Target"] for n in spec["TaskTemplate"]["Networks"]}
    shown = proc.stdout + proc.stderr + json.dumps([watch.specs, watch.step_specs])
    for f in (ws.root / "runs" / ws.job).rglob("*"):
        if f.is_file() and not f.is_symlink():
            shown += f.read_bytes().decode("utf-8", errors="replace")
    assert s3.secret_key not in shown and s3.endpoint in shown  # (the endpoint: the text read is the real one)


def test_wrong_credentials_exit_66_naming_the_bucket(workspace: Workspace, s3: S3Server) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: ['s3://{BUCKET}/{ws.job}/in/*.jpg']\n"
        f"output: 's3://{BUCKET}/{ws.job}/out/{{stem}}{{ext}}'\nretries: 0\n{COMMON}"
    )
    proc = ws.ffswarm("submit", str(job_file), config=config_with_s3(s3, ws, wrong=True))
    assert proc.returncode == 66, proc.stderr[-3000:]
    assert f"bucket '{BUCKET}'" in proc.stderr and "credentials" in proc.stderr
    assert WRONG_SECRET not in proc.stderr + proc.stdout and s3.secret_key not in proc.stderr + proc.stdout


@dataclass
class KillAfterCommits(Polling):
    """Kills the job's runner container once ``after`` of its outputs are in the bucket, then at once
    reads the bucket back: what the killed runner left must be whole objects only."""

    swarm: DockerSwarm
    s3: S3Server
    job: str
    after: int
    interval = 0.1
    killed: bool = False
    seen_after_kill: dict[str, dict[str, Any]] = field(default_factory=dict)

    def poll(self) -> None:
        if self.killed:
            return
        listed = self.s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{self.job}/out/").get("KeyCount", 0)
        if listed < self.after:
            return
        for c in self.swarm.client.containers.list(filters={"label": f"{LABEL_JOB}={self.job}"}):
            if c.labels.get("io.ffswarm.role") == "runner":
                c.kill()
                self.killed = True
        if self.killed:
            self.seen_after_kill = objects(self.s3, f"{self.job}/out")


def test_a_runner_killed_mid_chunk_leaves_whole_objects_and_the_retry_never_writes_them_again(
    workspace: Workspace, swarm: DockerSwarm, s3: S3Server
) -> None:
    ws = workspace
    star = photos.astronaut(ws.dir / "faces")
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    made = photos.face_photos(ws.dir / "made", 60)  # long enough that the kill lands mid-chunk on a quiet VM
    put_inputs(s3, f"{ws.job}/in", made)
    job_file = ws.write_job(
        f"name: {ws.job}\nsource: {ws.rel(star)}\ntargets: ['s3://{BUCKET}/{ws.job}/in/*.jpg']\n"
        f"output: 's3://{BUCKET}/{ws.job}/out/{{stem}}{{ext}}'\nchunk_size: 60\nretries: 2\n{COMMON}"
    )
    with KillAfterCommits(swarm, s3, ws.job, after=3) as killer:
        proc = ws.ffswarm("submit", str(job_file), config=config_with_s3(s3, ws))
    assert killer.killed, "the runner finished before it could be killed: more photos are needed"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert killer.seen_after_kill and all(whole(o) for o in killer.seen_after_kill.values())

    out = objects(s3, f"{ws.job}/out")
    assert sorted(out) == sorted(f"{ws.job}/out/{f.name}" for f in made)
    assert all(whole(o) for o in out.values())
    first = {k for k, o in killer.seen_after_kill.items() if o["meta"][META_ATTEMPT] == "1"}
    assert first, killer.seen_after_kill.keys()
    for key in first:  # committed by the killed attempt, not written again by the retry
        assert out[key]["meta"][META_ATTEMPT] == "1" and out[key]["data"] == killer.seen_after_kill[key]["data"]
    # every object the killed attempt committed ends as an ok item and is never written again (its
    # metadata still says attempt 1, its bytes unchanged: asserted above), and its work is never redone:
    # the retry skips the item (its own ok line made it), says `cached`, or — killed between the PUT and
    # the result line — records it from the commit journal (its first line, so not `cached`); either way
    # the retry's line is written without processing the photo (started == finished)
    lines = results_of(ws)
    ok = {r.output.rsplit("/", 1)[-1] for r in lines if r.status is ItemStatus.OK and r.output}
    assert {k.rsplit("/", 1)[-1] for k in first} <= ok
    names = {k.rsplit("/", 1)[-1] for k in first}
    again = [r for r in lines if r.attempt > 1 and r.output and r.output.rsplit("/", 1)[-1] in names]
    assert all(r.started == r.finished for r in again), [(r.item, r.cached, r.started, r.finished) for r in again]
