#!/usr/bin/env python3
"""B1 efficiency, B2 chunks vs one service per image, B4 Swarm bookkeeping — on the dev swarm.

The chunk work is the SIMULATED runner (scripts/bench_sim: waits the per-item time and the cold
start measured from the real runner image on the test pack, copies input to output, writes result
lines marked provider "simulated"); everything else — submit, the identity step (real runner),
planning, services, GPU reservations, scheduling, watching, reports — is the real path.
Efficiency = ideal ÷ wall, ideal = items × per-item time ÷ K GPU slots.

    .venv/bin/python scripts/bench_orchestration.py --json bench-orch.json --plot bench-orch.png
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import cv2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.config import Config, load_config  # noqa: E402
from controller.run import attempts, jobs, usecase  # noqa: E402
from controller.run.lanes import Lanes, shared_lanes  # noqa: E402
from controller.run.rundir import RunDir  # noqa: E402
from controller.swarm.docker import DockerSwarm  # noqa: E402
from tests.fixtures import photos  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Bench:
    def __init__(self, config: Config, swarm: DockerSwarm, providers: tuple[str, ...] = ("cpu",)) -> None:
        self.config = config
        self.providers = providers
        self.swarm = swarm
        self.root = config.data_root
        self.dir = self.root / "bench" / uuid.uuid4().hex[:6]
        self.dir.mkdir(parents=True)
        self.owner = config.runner_uid_gid()
        self.kept: list[Path] = []  # run folders of jobs whose lanes may still be handed chunks
        self.star = photos.astronaut(self.dir / "faces")
        self.slots = sum(n.gpus for n in swarm.nodes() if n.usable)

    def chown(self, path: Path) -> None:
        uid, gid = (int(x) for x in self.owner.split(":"))
        for p in [path, *path.rglob("*")]:
            os.chown(p, uid, gid)

    def inputs(self, n: int, real: bool = False) -> str:
        """n target photos; hard links of one small JPEG for simulated runs."""
        d = self.dir / f"in-{n}-{'real' if real else 'sim'}"
        if not d.exists():
            if real:
                photos.face_photos(d, n)
            else:
                d.mkdir()
                small = d / "seed.jpg"
                cv2.imwrite(str(small), cv2.resize(cv2.imread(str(self.star)), (64, 64)))
                for i in range(n):
                    (d / f"p{i:05d}.jpg").hardlink_to(small)
                small.unlink()
            self.chown(self.dir)
        return f"{d.relative_to(self.root).as_posix()}/*.jpg"

    def forget_kept(self) -> None:
        """The run folders kept for the lanes they started, once those lanes are retired."""
        for path in self.kept:
            shutil.rmtree(path, ignore_errors=True)
        self.kept.clear()

    def run(
        self,
        name: str,
        targets: str,
        chunk_size: int,
        image: str,
        gpus: int = 1,
        max_concurrent: int | None = None,
        config: Config | None = None,
        output: str | None = None,
        lanes: Lanes | None = None,
    ) -> dict[str, Any]:
        """One job; ``config`` and ``output`` (a folder or an s3:// prefix) in place of the dev config's
        and the bench folder's; ``lanes``: warm runners shared with the jobs before and after it, as one
        `ffswarm submit` of several jobs shares them (its run folder is kept meanwhile: it may hold
        the hand-off file of a lane it started)."""
        config = config or self.config
        job_id = f"bench-{name}-{uuid.uuid4().hex[:4]}"
        out = self.dir / "out" / job_id
        where = f"{output}/{job_id}" if output else out.relative_to(self.root).as_posix()
        f = self.dir / f"{job_id}.yaml"
        f.write_text(
            json.dumps(
                {
                    "name": job_id,
                    "source": self.star.relative_to(self.root).as_posix(),
                    "targets": [targets],
                    "output": f"{where}/{{stem}}{{ext}}",
                    "chunk_size": chunk_size,
                    **({"max_concurrent": max_concurrent} if max_concurrent else {}),
                    "providers": list(self.providers),
                    "image": image,
                    "resources": {"gpus": gpus, "memory": "1g"},
                    "retries": 1,
                }
            )
        )
        events: list[tuple[float, str, dict[str, Any]]] = []

        def record(event: str, **fields: Any) -> None:
            events.append((time.perf_counter(), event, fields))

        cpu0, t0, wall0 = cpu_seconds(), time.perf_counter(), time.time()
        backend = DockerSwarm(config.docker_host)
        # As `ffswarm submit` does: the swarm's GPU slots size `chunk_size: auto` (without them auto
        # takes max_concurrent for the slots and cuts more chunks than there are GPUs).
        prepared = jobs.prepare(config, [f], new=False, swarm=lambda: backend)
        done = usecase.submit(config, backend, prepared, [lambda rundir, job: record], lanes=lanes)
        code, reports = max(r.exit_code() for r in done), [r.to_dict() for r in done]
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
        report = reports[0]
        first_running = next((t for t, e, _ in events if e == "chunk_running"), t0) - t0
        started = next((t for t, e, _ in events if e == "job_started"), t0) - t0
        identity_ready = next((t for t, e, _ in events if e == "identity_ready"), t0) - t0
        rundir = RunDir(self.root, job_id)
        results = []
        for chunk in rundir.plan().chunks:
            results += rundir.results(chunk.id)
        loaded = [attempts.cold_start(rundir, a.chunk, a.attempt, p) for p, a in rundir.attempt_logs()]
        if lanes is None:
            shutil.rmtree(rundir.path, ignore_errors=True)
        else:
            self.kept.append(rundir.path)
        shutil.rmtree(out, ignore_errors=True)
        f.unlink()
        first_item = min(x.started for x in results) - wall0
        last_item = max(x.finished for x in results) - wall0
        return {
            "first_item_s": round(first_item, 2),
            "last_item_s": round(last_item, 2),
            "tail_s": round(wall - last_item, 2),
            "job": job_id,
            "exit": code,
            "items": report["counts"]["items"],
            "ok": report["counts"]["ok"],
            "chunks": report["counts"]["chunks"],
            "chunk_size": chunk_size,
            "items_per_chunk": -(-report["counts"]["items"] // report["counts"]["chunks"]),
            "wall_s": round(wall, 2),
            # The profile of the wall time, seconds from the submit call: run folder written, first
            # chunk container running, identity step answered, first item begun, last item done.
            "job_started_s": round(started, 2),
            "first_task_running_s": round(first_running, 2),
            "identity_ready_s": round(identity_ready, 2),
            "controller_cpu_s": round(cpu, 2),
            "controller_cpu_per_chunk_s": round(cpu / report["counts"]["chunks"], 4),
            # chunk services started (a warm runner's chunks share one: runners.linger)
            "services": len({f.get("service") for _, e, f in events if e == "chunk_started"}),
            "results": results,
            "cold_s": [c[1] for c in loaded if c is not None],  # the runner's process age at models loaded
        }


SIM_IMAGE = "ffswarm/runner-sim:bench"


def bench_config(**extra: Any) -> Config:
    """The dev config, its policy.images allowing the simulated runner's tag, plus ``extra`` keys."""
    import tempfile

    import yaml

    data = yaml.safe_load((ROOT / "ffswarm.yaml").read_text())
    policy = data.setdefault("policy", {})
    policy["images"] = [*policy.get("images", []), SIM_IMAGE]
    data.update(extra)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(yaml.safe_dump(data))
    atexit.register(os.unlink, f.name)  # kept while the run lasts: the config's path is its own
    return load_config(f.name)


def b5_s3(b: Bench, targets: str, chunk_size: Any, image: str) -> dict[str, Any]:
    """B5's whole path again with the same photos as objects: targets and outputs on Ceph RGW
    (on the host, reached from the runners' storage network, tests/fixtures/s3_server.py), the source on the
    volume. The upload of the inputs is not timed."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from tests.fixtures import s3_server

    files = sorted((b.root / targets).parent.glob("*.jpg"))
    with (
        tempfile.TemporaryDirectory() as secrets,
        s3_server.running(b.swarm.client, b.config.image, Path(secrets)) as s3,
    ):
        c = s3.client()
        with ThreadPoolExecutor(8) as pool:
            put = lambda f: c.put_object(Bucket=s3_server.BUCKET, Key=f"b5/in/{f.name}", Body=f.read_bytes())  # noqa: E731
            list(pool.map(put, files))
        cfg = bench_config(storage=s3.storage())
        r = b.run("b5s3", f"s3://{s3_server.BUCKET}/b5/in/*.jpg", chunk_size, image, config=cfg,
                  output=f"s3://{s3_server.BUCKET}/b5/out")  # fmt: skip
    r.pop("results", None)
    r.pop("cold_s", None)
    r["items_per_s"] = round(r["items"] / r["wall_s"], 2)
    return r


def calibrate(b: Bench, image: str, n: int = 48) -> dict[str, float]:
    """Per-item time and cold start of the REAL runner image on the test pack, one chunk."""
    r = b.run("calib", b.inputs(n, real=True), n, image)
    rs = r.pop("results")
    first, last = min(x.started for x in rs), max(x.finished for x in rs)
    # Cold start as the runner process sees it: exec to models loaded (interpreter, imports, pack
    # check, sessions); container start, scheduling and the identity wait are real in every
    # simulated run too.
    return {
        "item_seconds": round((last - first) / len(rs), 4),
        "cold_seconds": round(max(r["cold_s"]), 2),
        "calibration_wall_s": r["wall_s"],
    }


def in_process(b: Bench, targets: str, n: int) -> dict[str, Any]:
    """The same photos and pack through the runner alone: one manifest holding every item, run as
    `python -m runner_image` in a child process on this machine's Python (cold start and the
    source's identity included) — what one node does with no Swarm, no services, no controller."""
    from contract.layout import RunLayout
    from contract.manifest import Item, Manifest
    from contract.results import read_results

    folder = b.root / targets.rsplit("/", 1)[0]
    photos_in = sorted(folder.glob("*.jpg"))[:n]
    name = f"inproc-{uuid.uuid4().hex[:4]}"
    run_dir = b.dir / name
    out = b.dir / "out" / name
    layout = RunLayout(run_dir)
    layout.chunks_dir.mkdir(parents=True)
    rel = run_dir.relative_to(b.root).as_posix()
    items = tuple(
        Item(
            f"i{i:06d}",
            f"/data/{p.relative_to(b.root).as_posix()}",
            f"/data/{out.relative_to(b.root).as_posix()}/{p.name}",
        )
        for i, p in enumerate(photos_in)
    )
    manifest = Manifest(
        job=name, chunk="c0000", run_dir=f"/data/{rel}", pack_dir="/data/models/default",
        source=(f"/data/{b.star.relative_to(b.root).as_posix()}",), items=items, providers=b.providers,
    )  # fmt: skip
    layout.manifest("c0000").write_text(manifest.to_json())
    cmd = [
        sys.executable,
        "-m",
        "runner_image",
        "--manifest",
        manifest.layout.manifest("c0000").as_posix(),
        "--data-root",
        str(b.root),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    results = read_results(layout.results("c0000", 1).read_text())
    ok = sum(1 for r in results if r.status.value == "ok")
    if proc.returncode != 0 or ok != len(items):
        raise SystemExit(f"in-process runner: exit {proc.returncode}, {ok}/{len(items)} ok\n{proc.stderr[-2000:]}")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return {"items": len(items), "wall_s": round(wall, 2), "items_per_s": round(len(items) / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--chunk-sizes", default="20,50,100,250,500", help="swept at 1,000 items")
    ap.add_argument("--default-chunk-size", default=None, help="(default: the job-file default, auto)")
    ap.add_argument("--b2-items", type=int, default=1000)
    ap.add_argument("--b4-chunks", type=int, default=0, help="first run one job of this many one-item chunks (no GPU)")
    ap.add_argument("--b5-items", type=int, default=500, help="real photos for B5 (the real runner, both ways)")
    ap.add_argument("--providers", default="cpu", help="of every job and of B5's in-process runner, e.g. cuda,cpu")
    ap.add_argument("--b5-s3", action="store_true", help="B5 also with targets and outputs on an S3 server (Ceph RGW)")
    ap.add_argument(
        "--warm", type=float, default=0.0, help="B1 and the sweep also with runners.linger this many s, side by side"
    )
    ap.add_argument("--skip", default="", help="comma list of b1,sweep,b2,b5,b4 to skip")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    config = bench_config()
    swarm = DockerSwarm(config.docker_host)
    swarm.check_manager()
    from controller.job.spec import JobSpec

    default_cs: Any = args.default_chunk_size or JobSpec.__dataclass_fields__["chunk_size"].default
    b = Bench(config, swarm, tuple(args.providers.split(",")))
    out: dict[str, Any] = {"machine": "2-core VM, dev swarm (single node), fake GPUs", "slots": b.slots}
    try:
        real = config.image  # by the tag policy.images allows; submit pins it to the image's ID
        cal = calibrate(b, real)
        out["calibration"] = cal
        print(
            f"calibration (real runner, test pack): {cal['item_seconds'] * 1000:.0f} ms/item, "
            f"cold start {cal['cold_seconds']:.2f} s; K = {b.slots} GPU slots"
        )
        (config.data_root / "bench-sim.json").write_text(json.dumps(cal))
        image, _ = swarm.client.images.build(
            path=str(ROOT / "scripts" / "bench_sim"),
            buildargs={"RUNNER_IMAGE": real},
            tag=SIM_IMAGE,
            rm=True,
        )
        sim = SIM_IMAGE

        def line(tag: str, r: dict[str, Any]) -> dict[str, Any]:
            r.pop("results", None)
            r.pop("cold_s", None)
            ideal = r["items"] * cal["item_seconds"] / b.slots
            r["ideal_s"] = round(ideal, 2)
            r["efficiency"] = round(ideal / r["wall_s"], 3)
            r["items_per_s"] = round(r["items"] / r["wall_s"], 2)
            print(
                f"{tag}: {r['items']} items, chunk_size {r['chunk_size']} "
                f"({r['chunks']} chunks of ≤{r['items_per_chunk']}): wall {r['wall_s']:.1f} s "
                f"vs ideal {ideal:.1f} s → efficiency {r['efficiency']:.3f}; "
                f"controller CPU {r['controller_cpu_per_chunk_s'] * 1000:.0f} ms/chunk, {r['services']} services\n"
                f"    profile (s from submit): run folder {r['job_started_s']:.2f}, first task running "
                f"{r['first_task_running_s']:.2f}, identity {r['identity_ready_s']:.2f}, "
                f"first item {r['first_item_s']:.2f}, last item {r['last_item_s']:.2f}, "
                f"end {r['wall_s']:.2f} (tail {r['tail_s']:.2f})"
            )
            return r

        warm = bench_config(runners={"linger": args.warm}) if args.warm else None

        def rows(tag: str, name: str, targets: str, chunk_size: Any) -> list[dict[str, Any]]:
            """The row, and with --warm its twin right after it with runners.linger, on runners a job of
            the same kind just before it left warm (one `submit` of the two jobs)."""
            got = [{**line(tag, b.run(name, targets, chunk_size, sim)), "warm": False}]
            if warm is not None:
                pool = shared_lanes(swarm, args.warm)
                try:
                    b.run(f"{name}u", b.inputs(20), 10, sim, config=warm, lanes=pool)  # two chunks: two runners
                    twin = b.run(f"{name}w", targets, chunk_size, sim, config=warm, lanes=pool)
                finally:
                    pool.close()  # the next cold row's services get the GPUs
                    b.forget_kept()
                got.append({**line(f"{tag} warm", twin), "warm": True})
            return got

        if "b1" not in skip:
            out["b1"] = [
                r for n in map(int, args.sizes.split(",")) for r in rows("B1", f"b1-{n}", b.inputs(n), default_cs)
            ]
        if "sweep" not in skip:
            out["sweep"] = [
                r
                for cs in map(int, args.chunk_sizes.split(","))
                for r in rows("B1 sweep", f"sw-{cs}", b.inputs(1000), cs)
            ]
        if "b2" not in skip:
            chunks = line("B2 ffswarm chunks", b.run("b2a", b.inputs(args.b2_items), default_cs, sim))
            naive = line("B2 one service per image", b.run("b2b", b.inputs(args.b2_items), 1, sim))
            out["b2"] = {
                "chunks": chunks,
                "per_image": naive,
                "ratio": round(chunks["items_per_s"] / naive["items_per_s"], 2),
            }
            print(
                f"B2: ffswarm {chunks['items_per_s']:.1f} items/s "
                f"vs one service per image {naive['items_per_s']:.2f} items/s "
                f"→ ratio {out['b2']['ratio']:.1f}"
            )
        if "b5" not in skip:
            # The REAL runner image on real photos and the test pack, both ways, back to back: the
            # whole path (submit → chunk services on this node's K slots → outputs → report) against
            # the runner in-process on the same machine. No GPU here: CPU provider on both sides.
            targets = b.inputs(args.b5_items, real=True)
            path = b.run("b5", targets, default_cs, real)
            path.pop("results", None)
            path.pop("cold_s", None)
            path["items_per_s"] = round(path["items"] / path["wall_s"], 2)
            alone = in_process(b, targets, args.b5_items)
            share = 1 - path["items_per_s"] / alone["items_per_s"]
            out["b5"] = {"path": path, "in_process": alone, "orchestration_share": round(share, 3)}
            print(
                f"B5 (CPU, real runner, {path['items']} photos): whole path {path['items_per_s']:.1f} items/s "
                f"({path['chunks']} chunks, wall {path['wall_s']:.1f} s) vs runner in-process "
                f"{alone['items_per_s']:.1f} items/s (wall {alone['wall_s']:.1f} s) → orchestration's share "
                f"{share * 100:.1f} %\n    profile (s from submit): first item {path['first_item_s']:.2f}, "
                f"last item {path['last_item_s']:.2f}, end {path['wall_s']:.2f}"
            )
            if args.b5_s3:
                objs = b5_s3(b, targets, default_cs, real)
                ratio = objs["items_per_s"] / path["items_per_s"]
                out["b5"]["s3"] = {**objs, "ratio_to_volume": round(ratio, 3)}
                print(
                    f"B5 with S3 (Ceph RGW on the host, same photos): whole path {objs['items_per_s']:.1f} items/s "
                    f"(wall {objs['wall_s']:.1f} s, {objs['ok']} ok) vs the data volume {path['items_per_s']:.1f} "
                    f"items/s → S3 ÷ volume {ratio:.2f}\n    profile (s from submit): first item "
                    f"{objs['first_item_s']:.2f}, last item {objs['last_item_s']:.2f}, end {objs['wall_s']:.2f}"
                )
        if "b4" not in skip:
            if args.b4_chunks:
                big = line("B4 job", b.run("b4", b.inputs(args.b4_chunks), 1, sim, gpus=0, max_concurrent=12))
                out["b4_job"] = big
            api = swarm.client.api
            ours = {"label": "io.ffswarm.job"}
            time.sleep(10)  # the task reaper drops removed services' task records a few seconds later
            left = {
                "services": len(api.services(filters=ours)),
                "tasks": sum(
                    1 for t in api.tasks() if "io.ffswarm.job" in (t["Spec"]["ContainerSpec"].get("Labels") or {})
                ),
                "containers": len(swarm.client.containers.list(all=True, filters=ours)),
            }
            out["b4"] = left
            print(f"B4: left on the swarm after these runs: {left}")
    finally:
        (config.data_root / "bench-sim.json").unlink(missing_ok=True)
        shutil.rmtree(b.dir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.plot and out.get("sweep"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cold = [r for r in out["sweep"] if not r["warm"]]
        xs = [r["chunk_size"] for r in cold]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [r["efficiency"] for r in cold], marker="o")
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])  # the swept sizes themselves, not powers of ten
        ax.minorticks_off()
        ax.set_xlabel("chunk_size (images per chunk service)")
        ax.set_ylabel("efficiency (ideal ÷ wall)")
        ax.set_title(f"1,000 items, K={b.slots} GPU slots, simulated runner")
        ax.axhline(0.95, ls="--", c="grey")
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    main()
