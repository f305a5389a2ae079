#!/usr/bin/env python3
"""The controller's own work per small request, stage by stage, in one process and without a swarm.

What `ffswarm api` and `ffswarm serve` do for each one-photo request (bench_small.py's kind: its own
source photo and target photo, in a tenant's area) is timed here on a temporary data root, in wall
time and in the process's CPU time (what a loaded machine changes least):

  a  api      the real Starlette app in-process (httpx over ASGI): POST /v1/jobs — auth, quota,
              the job checked inside the area, owner record, inbox file;
  b  claim    serve's inbox: the listing (amortised per request) and the claim (checked bytes
              copied to running/, its lease counting the start);
  c  prepare  serve's job file: owner record read back, parse + validate + resolve + plan
              (usecase.one_job), run folder looked at, offered to the packer;
  d  pack     what packing does per member job, packs of --pack members: the pack built (divided
              among its members), each job's run folder (packs.job_folders: packed, owner, job.yaml,
              plan, control, image), each job's report and end (its results read through the pack),
              and serve's move of its inbox file to done/.

The runner's work is stood in for by result lines written into the pack's results files (not
timed). Prints the median and mean ms per request of each stage over --requests requests, the CPU
ms per request (and the totals), and with --profile the top of cProfile's cumulative listing of all
stages.

    .venv/bin/python scripts/bench_request.py                  # 200 requests, packs of 50
    .venv/bin/python scripts/bench_request.py --profile 30     # and the 30 hottest functions

Logs are JSON lines, as the stack's `api` and `serve` write them (`--json-logs`), into a file in
the temporary folder. No Docker, no network (the app is called in-process); everything lives in a
temporary folder, removed at the end. Results: benchmarks/RESULTS.md (B-request).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import TypeVar, cast

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.results import ItemResult, ItemStatus  # noqa: E402
from controller import log  # noqa: E402
from controller.api.app import make_app  # noqa: E402
from controller.config import Config  # noqa: E402
from controller.run import usecase  # noqa: E402
from controller.run.jobs import owner  # noqa: E402
from controller.run.rundir import Control, RunDir  # noqa: E402
from controller.serve import jobs as serve_jobs  # noqa: E402
from controller.serve import packs  # noqa: E402
from controller.serve.inbox import Inbox  # noqa: E402
from controller.serve.packing import Member, Packer  # noqa: E402
from controller.settings.packing import PackingSettings  # noqa: E402
from controller.swarm.backend import SwarmBackend  # noqa: E402
from tests.builders import JPEG, KEYS, beat, make_config  # noqa: E402

OPTIONS = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 1}
IMAGE = "sha256:" + "0" * 64
T = TypeVar("T")


class Stages:
    """Seconds spent per stage, per request."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.cpu: dict[str, float] = {}  # the process's CPU seconds per stage, all requests together

    @contextmanager
    def timed(self, stage: str, share: int = 1) -> Iterator[None]:
        """Time the block; ``share``: how many requests it served (each gets an equal part)."""
        t0, c0 = time.perf_counter(), time.process_time()
        yield
        self.times.setdefault(stage, []).extend([(time.perf_counter() - t0) / share] * share)
        self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - c0

    def add(self, stage: str, seconds: float, cpu: float) -> None:
        self.times.setdefault(stage, []).append(seconds)
        self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu


def make_photos(config: Config, n: int) -> None:
    area = config.data_root / "tenants" / "acme" / "in"
    area.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (area / f"s{i}.jpg").write_bytes(JPEG)
        (area / f"t{i}.jpg").write_bytes(JPEG)


def stage_api(config: Config, n: int, stages: Stages) -> list[str]:
    """(a) n JSON jobs posted one after the other to the app, in-process."""

    async def post_all() -> list[str]:
        app = make_app(config)
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {KEYS['acme']}"}
        jobs: list[str] = []
        async with (
            app.router.lifespan_context(app),  # its threads started, as uvicorn starts them
            httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as http,
        ):
            for i in range(n):
                body = {"name": "req", "source": f"in/s{i}.jpg", "targets": [f"in/t{i}.jpg"], **OPTIONS}
                t0, c0 = time.perf_counter(), time.process_time()
                r = await http.post("/v1/jobs", json=body)
                stages.add("a api", time.perf_counter() - t0, time.process_time() - c0)
                if r.status_code != 202:
                    raise SystemExit(f"post {i}: {r.status_code} {r.text[:300]}")
                jobs.append(r.json()["id"])
        return jobs

    return asyncio.run(post_all())


def stage_claim(inbox: Inbox, n: int, stages: Stages) -> list[Path]:
    """(b) every waiting file listed (one poll per serve loop, amortised) and claimed, oldest first."""
    past = time.time() - 5  # settled: serve waits SETTLE_SECONDS after the last write
    for p in inbox.path.glob("*.yaml"):
        os.utime(p, (past, past))
    claimed: list[Path] = []
    with stages.timed("b claim", share=n):
        waiting = inbox.waiting(time.time())
    for path in waiting:
        with stages.timed("b claim"):
            got = inbox.claim(path, starts=1)  # as serve's loop claims: the lease counts this start
            assert got is not None, path
        claimed.append(got)
    return claimed


def stage_prepare(config: Config, claimed: list[Path], packer: Packer, stages: Stages) -> list[Member]:
    """(c) what serve_jobs._run_job_file does before the job is packed."""
    members: list[Member] = []
    for path in claimed:
        with stages.timed("c prepare"):
            tenant = serve_jobs.job_owner(config, path)
            job = usecase.one_job(config, path, tenant=tenant)
            rundir = RunDir(config.data_root, job.job_id)
            fresh = not rundir.exists()
            member = Member(path, job, tenant)
            assert fresh and packer.offer(member), path
        members.append(member)
    return members


def stage_pack(config: Config, inbox: Inbox, members: list[Member], stages: Stages) -> None:
    """(d) one pack of ``members``: packs.start and PackRun.run without the swarm in between."""
    n = len(members)
    folder = inbox.path / "packs"
    with stages.timed("d1 pack build", share=n):
        pack_id = packs.new_pack_id(members[0].job.tenant)
        prepared, record = packs.build(config, members, pack_id, folder, 2)
        pack = RunDir(config.data_root, pack_id, owner(config), config.controller_ids())
        pack.create(prepared.file.read_bytes(), prepared.plan, {}, Control(prepared.spec.max_concurrent), IMAGE)
        pack.write_file(pack.layout.members, __import__("json").dumps(record).encode())
    with stages.timed("d2 job folder", share=n):  # packs.open_pack's job folders
        jobs = packs.job_folders(config, members, pack_id, record, IMAGE)
    # the runners' work, not timed: every item of the pack committed
    plan = pack.plan()
    now = time.time()
    for chunk in plan.chunks:
        lines = [
            ItemResult(i.id, ItemStatus.OK, 1, i.input, i.output, faces=1, started=now, finished=now).to_line()
            for i in plan.items
            if i.id in chunk.items
        ]
        pack.write_file(pack.layout.results(chunk.id, 1), "".join(lines).encode())
    run = packs.PackRun(config, cast(SwarmBackend, None), pack, jobs)
    run.image, run.plan = IMAGE, plan
    with stages.timed("d3 report, end", share=n):  # each job's results are read through the pack
        run.end_jobs(cancelled=False)
    for m in members:
        report = jobs[m.job.job_id].report
        with stages.timed("d4 inbox move"):
            outcome = serve_jobs._shown(config, serve_jobs.report_outcome(report))
            inbox.finish(m.claimed, outcome.ok, outcome.reason)
        assert outcome.ok, outcome.reason


def bench(tmp: Path, n: int, per_pack: int) -> Stages:
    config, _ = make_config(tmp, quota={"jobs_queued": n + 1, "requests_per_second": 10_000})  # none refused
    beat(config)
    make_photos(config, n)
    inbox = Inbox(config.data_root / "inbox", config.policy.limits.job_file)
    inbox.ensure()
    stages = Stages()
    stage_api(config, n, stages)
    claimed = stage_claim(inbox, n, stages)
    packer = Packer(PackingSettings(max_items=50, window=1.0), IMAGE)
    members = stage_prepare(config, claimed, packer, stages)
    for i in range(0, n, per_pack):
        stage_pack(config, inbox, members[i : i + per_pack], stages)
    done = len(list((inbox.path / "done").glob("*.yaml")))
    if done != n:
        raise SystemExit(f"{done} of {n} inbox files reached done/")
    return stages


def profiled(fn: Callable[[], T], top: int) -> T:
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    pstats.Stats(prof).strip_dirs().sort_stats("cumulative").print_stats(top)
    pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(top)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="one-photo requests (at most 5,000)")
    ap.add_argument("--pack", type=int, default=50, help="member jobs per pack")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP", help="print cProfile's TOP hottest functions")
    args = ap.parse_args()
    n = max(1, min(args.requests, 5000))
    tmp = Path(tempfile.mkdtemp(prefix="ffswarm-bench-request-"))
    log.setup(json_lines=True)  # as the stack runs them (controller/swarm/render.py: --json-logs)
    try:
        with open(tmp / "logs.jsonl", "w") as logs, redirect_stderr(logs):
            run = lambda: bench(tmp, n, max(1, args.pack))  # noqa: E731
            stages = profiled(run, args.profile) if args.profile else run()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{n} one-photo requests, packs of {args.pack}: ms per request (median; mean; CPU)")
    total_med = total_mean = total_cpu = 0.0
    for stage, values in stages.times.items():
        med, mean = statistics.median(values) * 1000, statistics.fmean(values) * 1000
        cpu = stages.cpu.get(stage, 0.0) * 1000 / len(values)
        total_med, total_mean, total_cpu = total_med + med, total_mean + mean, total_cpu + cpu
        print(f"  {stage:<18} {med:8.2f}  {mean:8.2f}  {cpu:8.2f}")
    print(f"  {'total':<18} {total_med:8.2f}  {total_mean:8.2f}  {total_cpu:8.2f}")


if __name__ == "__main__":
    main()
