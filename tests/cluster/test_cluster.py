"""ffswarm on a real three-node swarm (scripts/cluster.sh): placement, GPU limits, drain, node loss,
and the image every task ran. Order matters only for speed: the node-loss test runs last and
restarts the node it killed.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

from contract.results import ItemResult, ItemStatus, chunk_results, read_results
from tests.cluster.conftest import MANAGER, W1, W2, WORKERS, Cluster, Job, Watch
from tests.fixtures import photos

GPU_IDS = {"GPU-w1a", "GPU-w1b", "GPU-w2a", "GPU-w2b"}


def make_inputs(job: Job, n: int) -> tuple[Path, Path]:
    star = photos.astronaut(job.dir / "faces")
    photos.face_photos(job.dir / "crowd", n)
    job.chown()
    return star, job.dir / "crowd"


def job_body(job: Job, star: Path, crowd: Path, *, chunk_size: int, max_concurrent: int) -> str:
    return f"""source: {job.rel(star)}
targets: [{job.rel(crowd)}/*.jpg]
output: {job.rel(job.dir)}/out/{{stem}}{{ext}}
chunk_size: {chunk_size}
max_concurrent: {max_concurrent}
providers: [cpu]
resources: {{gpus: 1, gpu_kind: GPU, memory: 1g}}
placement: [node.labels.ffswarm.gpu==true]
retries: 3
timeout: 10m
"""


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return -1, f"controller still running after {timeout:.0f}s\n{out[-3000:]}\n{err[-3000:]}"
    return proc.returncode, out[-3000:] + err[-3000:]


def results(job: Job) -> list[ItemResult]:
    out: list[ItemResult] = []
    for f in sorted((job.run / "results").glob("*.jsonl")):
        out += read_results(f.read_text())
    return out


def assert_every_item_committed_once(job: Job, n: int) -> None:
    """Each item: exactly one line that committed an output (later attempts only re-acknowledge it,
    ``cached``), a final status ok, its output on disk, and no temporary file left anywhere."""
    rs = results(job)
    committed = Counter(r.item for r in rs if r.status is ItemStatus.OK and not r.cached)
    assert len(committed) == n and set(committed.values()) == {1}, committed
    final = {r.item: r for r in rs}
    assert {r.status for r in final.values()} == {ItemStatus.OK}
    out = job.dir / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in (job.dir / "crowd").iterdir()), names  # no .tmp files, none missing


def test_cluster_config_is_what_the_suite_reads(cluster: Cluster) -> None:
    """The written config points the controller at the manager by digest (what users get from up)."""
    text = cluster.config.read_text()
    assert f"image: {cluster.image}" in text and "docker_host: tcp://127.0.0.1:" in text
    assert cluster.node_state(MANAGER) == ("ready", "active")
    mgr = cluster.manager.client.api.inspect_node(cluster.node_ids[MANAGER])
    assert mgr["Spec"]["Labels"] == {"ffswarm.cpu-only": "true"}
    assert not mgr["Description"]["Resources"].get("GenericResources")
    for w in WORKERS:
        node = cluster.manager.client.api.inspect_node(cluster.node_ids[w])
        assert node["Spec"]["Labels"] == {"ffswarm.gpu": "true"}
        ids = {g["NamedResourceSpec"]["Value"] for g in node["Description"]["Resources"]["GenericResources"]}
        assert ids == {f"GPU-{w[-2:]}a", f"GPU-{w[-2:]}b"}
    print(json.dumps({"bring_up_s": cluster.bring_up_s}))


def test_gpu_chunks_only_on_gpu_workers_at_most_four_at_once_on_the_recorded_digest(cluster: Cluster, job: Job) -> None:
    star, crowd = make_inputs(job, 12)
    job_file = job.write_job(job_body(job, star, crowd, chunk_size=1, max_concurrent=8))
    t0 = time.monotonic()
    with Watch(cluster, job.name) as watch:
        code, output = finish(job.submit(job_file), timeout=300)
    wall = time.monotonic() - t0
    assert code == 0, output
    report = job.report()
    assert report["counts"]["ok"] == 12 and report["counts"]["chunks_done"] == 12

    # Placement: every task on a GPU-labelled worker, never on the cpu-only manager.
    nodes = Counter(t.node for t in watch.tasks.values())
    assert set(nodes) <= set(WORKERS) and MANAGER not in nodes, nodes
    assert set(nodes) == set(WORKERS), f"both workers should have taken chunks: {nodes}"
    assert {a["node"] for c in report["chunks"].values() for a in c["attempts"]} <= {
        cluster.node_ids[W1],
        cluster.node_ids[W2],
    }

    # GPUs: 8 services allowed, 4 GPUs exist → at most 4 ran at once, the rest waited for a GPU.
    assert watch.max_running == 4, watch.max_running
    assert watch.pending_while_full, "no task was seen pending while all four GPUs were busy"
    assert any("insufficient resources" in m for m in watch.pending_while_full), set(watch.pending_while_full)
    rs = [r for r in results(job) if not r.cached]
    assert {r.gpu for r in rs} == GPU_IDS
    spans = defaultdict(list)
    for r in rs:
        spans[r.gpu].append((r.started, r.finished))
    for gpu, s in spans.items():
        for a, b in combinations(s, 2):
            assert a[1] <= b[0] or b[1] <= a[0], f"{gpu} used by two chunks at once"

    # Image: the report records the digest; every task and every container ran exactly that.
    assert report["image"] == cluster.image and "@sha256:" in report["image"]
    assert {t.image for t in watch.tasks.values()} == {cluster.image}
    assert watch.containers, "no task container was seen on the workers"
    for node, config_image, image_id in watch.containers.values():
        assert config_image == cluster.image
        local = cluster.apis[node].client.api.inspect_image(cluster.image)
        assert image_id == local["Id"], (node, image_id, local["Id"])
        assert any(d.endswith(cluster.digest) for d in local["RepoDigests"])
    print(f"\ncluster: 12 one-item chunks on 4 GPUs in {wall:.1f} s")


def test_drained_node_gets_no_new_chunks(cluster: Cluster, job: Job) -> None:
    star, crowd = make_inputs(job, 16)
    job_file = job.write_job(job_body(job, star, crowd, chunk_size=2, max_concurrent=4))
    try:
        with Watch(cluster, job.name) as watch:
            proc = job.submit(job_file)
            deadline = time.monotonic() + 120
            while not watch.running_on(W2):
                assert time.monotonic() < deadline and proc.poll() is None, "no chunk ever ran on w2"
                time.sleep(0.1)
            cluster.set_availability(W2, "drain")
            drained_at = time.time()
            code, output = finish(proc, timeout=300)
        assert code == 0, output
        late = [t for t in watch.tasks.values() if t.first_seen > drained_at + 1.0]
        assert late, "no chunk started after the drain"
        assert {t.node for t in late} == {W1}, [(t.service, t.node) for t in late]
        assert job.report()["counts"]["ok"] == 16
        assert_every_item_committed_once(job, 16)
    finally:
        cluster.set_availability(W2, "active")


def test_worker_lost_mid_job_chunks_finish_elsewhere_once(cluster: Cluster, job: Job) -> None:
    n = 16
    star, crowd = make_inputs(job, n)
    job_file = job.write_job(job_body(job, star, crowd, chunk_size=4, max_concurrent=4))
    killed_chunk = ""
    try:
        with Watch(cluster, job.name) as watch:
            proc = job.submit(job_file)
            deadline = time.monotonic() + 120
            # Wait until a chunk on w2 has committed part of its items: then kill the whole node.
            while not killed_chunk:
                assert time.monotonic() < deadline and proc.poll() is None, "no chunk on w2 got going"
                for t in watch.running_on(W2):
                    if chunk_results(job.run / "results", t.chunk).lines:
                        killed_chunk = t.chunk
                time.sleep(0.05)
            subprocess.run(["docker", "kill", W2], check=True, capture_output=True)
            killed_at = time.monotonic()
            code, output = finish(proc, timeout=150)
            recovered = time.monotonic() - killed_at
        assert code == 0, f"job did not complete after {W2} was killed (node-loss handling?):\n{output}"
        report = job.report()
        attempts = report["chunks"][killed_chunk]["attempts"]
        assert attempts[0]["node"] == cluster.node_ids[W2] and attempts[0]["outcome"] != "done", attempts
        assert attempts[-1]["node"] == cluster.node_ids[W1] and attempts[-1]["outcome"] == "done", attempts
        assert report["counts"]["ok"] == n and report["counts"]["chunks_failed"] == 0
        # Items the lost attempt committed were not redone: re-acknowledged as cached.
        lines = chunk_results(job.run / "results", killed_chunk).lines  # every attempt's file
        assert any(r.cached for r in lines if r.attempt > 1), "the retry redid committed items"
        assert_every_item_committed_once(job, n)
        print(f"\ncluster: {W2} killed; job finished {recovered:.1f} s later")
        assert recovered < 90
    finally:
        subprocess.run(["docker", "start", W2], check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while cluster.node_state(W2)[0] != "ready":
            assert time.monotonic() < deadline, f"{W2} did not rejoin"
            time.sleep(0.5)
