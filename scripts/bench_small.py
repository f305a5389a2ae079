#!/usr/bin/env python3
"""Many small requests end to end on the dev swarm: one-photo jobs offered through `ffswarm api` at a
steady rate, run by `ffswarm serve`, side by side in one run:

  ceiling  one job holding all N pairs (each its own source and target), posted at once;
  packed   N one-photo requests at --rate per second, `serve` packing them (packing.max_items 50):
           its latency is the goal's (p99 at an offered 10/s); its done/s cannot exceed the rate;
  packed-burst  the same N requests offered at 100/s, faster than any path finishes them: packing's
           throughput at saturation, to set beside the ceiling's (posted at once);
  lingering  as packed, with packing.linger 30s: a pack's chunk service waits for the next pack and
           runs it on the models it loaded (controller/run/lanes.py); lingering-burst: offered at 100/s;
  alone    M one-photo requests at the same rate, `serve` without packing: every request its own
           identity step and chunk service (the path before packing; M is small because it is slow).
  alone-warm  as alone, with runners.linger 30s: every request its own job, its chunk handed to a
           runner an earlier request of the tenant left warm (controller/run/warmth.py shares_lanes).
  packed-2t, lingering-2t  as packed and lingering, the requests alternating between two tenants:
           what keeping tenants apart costs (a pack and a lane hold one tenant's photos only).

REPEAT (``--repeat N``): each phase but the ceiling runs N times, the phases in turn (all of them,
then all again), and its row is its median run by control CPU, every run listed below the table:
on a small shared VM one run of a phase can differ from the next by more than the change it judges.

For each: completed requests/s (requests / from the first post to the last report), the p50/p99
end-to-end latency (post → the job's report.json written), and the control plane's CPU per request
done: the API's, serve's and their sum ("API ms/req", "serve ms/req", "control ms/req"; from /proc,
every thread and child, from the first request offered to the last seen done; the ceiling's per pair).
Every request has its own source photo (from a pool of 40 faces) and target photo. The table comes
twice: aligned, and as Markdown rows for benchmarks/RESULTS.md.

    scripts/dev-swarm.sh   # first: the dev swarm, its config (ffswarm.yaml) and data root
    .venv/bin/python scripts/bench_small.py                       # N=1000 at 10/s, M=30
    .venv/bin/python scripts/bench_small.py --requests 200 --alone 20

Bounded and loopback only: its own tenant under the dev data root (removed at the end, with every
run folder it made), an API on 127.0.0.1, at most 5,000 requests, a deadline per phase. Uses the
Docker engine (run it alone: `flock -o /tmp/ffswarm-docker.lock …` beside tests). Results:
benchmarks/RESULTS.md (B-small).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.layout import run_rel  # noqa: E402
from scripts.bench_api import free_port  # noqa: E402
from scripts.proc_cpu import per_request_ms, sample, spent  # noqa: E402
from tests.fixtures import photos  # noqa: E402

KEY = "bench-small-key"
KEYS = (KEY, "bench-small-key-2")  # the first tenant's, the second's (the -2t phases)
PHASES = ("ceiling", "packed", "packed-burst", "lingering", "lingering-burst", "alone", "alone-warm", "packed-2t",
          "lingering-2t")  # fmt: skip
OPTIONS = {"providers": ["cpu"], "resources": {"gpus": 1, "gpu_kind": "GPU", "memory": "2g"}, "retries": 1}
POOL = 40


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """REPEAT: of a phase's runs, the one whose control CPU per request is the median (the lower
    middle of an even number): a run as measured, its columns from one run, never mixed."""
    return sorted(runs, key=lambda r: r["control_ms"])[(len(runs) - 1) // 2]


def control_cpu(api_s: float, serve_s: float, requests: int) -> dict[str, float]:
    """The control plane's CPU per request done, in ms: the API's, serve's, and both together."""
    api, serve = per_request_ms(api_s, requests), per_request_ms(serve_s, requests)
    return {"api_ms": api, "serve_ms": serve, "control_ms": api + serve}


COLUMNS = ("path", "requests", "done/s", "× ceiling", "× alone", "p50 s", "p99 s",
           "API ms/req", "serve ms/req", "control ms/req")  # fmt: skip
WIDTHS = (16, 9, 9, 11, 9, 8, 8, 12, 14, 16)


def cells(rows: dict[str, dict[str, float]]) -> list[list[str]]:
    """Each phase's figures as text, in COLUMNS' order (× alone "-" when alone was not run)."""
    ceiling = rows["ceiling"]["per_s"]
    out = []
    for name, r in rows.items():
        alone = f"{r['per_s'] / rows['alone']['per_s']:.1f}×" if "alone" in rows else "-"
        out.append([name, f"{int(r['items']):,}", f"{r['per_s']:.2f}", f"{r['per_s'] / ceiling:.2f}×", alone,
                    f"{r['p50']:.1f}", f"{r['p99']:.1f}", f"{r['api_ms']:.1f}", f"{r['serve_ms']:.1f}",
                    f"{r['control_ms']:.1f}"])  # fmt: skip
    return out


def table(rows: dict[str, dict[str, float]]) -> list[str]:
    """The phases' rows aligned for a terminal, under their header."""

    def align(row: list[str]) -> list[str]:
        return [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, WIDTHS, strict=True))]

    return ["".join(align(row)) for row in [list(COLUMNS), *cells(rows)]]


def markdown(rows: dict[str, dict[str, float]]) -> list[str]:
    """The phases' rows as a Markdown table for benchmarks/RESULTS.md (latencies in s)."""
    lines = ["| " + " | ".join(c.removesuffix(" s") for c in COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for row in cells(rows):
        row[5:7] = [f"{row[5]} s", f"{row[6]} s"]  # p50, p99: their unit in each cell, as RESULTS.md has it
        lines.append("| " + " | ".join(row) + " |")
    return lines


# How often the bench looks for finished requests. A request's time is its report's own mtime, so
# looking less often changes no figure; a look at 1,000 pending requests costs ~30 ms of CPU, taken
# from the cores the runners and the control plane share.
LOOK = 1.0


class Bench:
    def __init__(self, tmp: Path, dev_config: Path, concurrent_jobs: int = 4) -> None:
        base = yaml.safe_load(dev_config.read_text())
        self.root = Path(base["data_root"])
        tag = os.urandom(3).hex()
        self.tenants = [f"bench-{tag}", f"bench-{tag}-2"]
        self.areas = [self.root / "tenants" / t for t in self.tenants]
        self.area = self.areas[0]
        # the bursts offer 100/s, over the default quota.requests_per_second (50) and, once the API
        # lags, quota.requests_in_flight (16): the door's limits are not what this bench measures
        quota = {"jobs_queued": 100_000, "requests_per_second": 10_000, "requests_in_flight": 10_000}
        tenants = {t: {"api_keys_sha256": [hashlib.sha256(k.encode()).hexdigest()], "quota": quota}
                   for t, k in zip(self.tenants, KEYS, strict=True)}  # fmt: skip
        self.configs = {}
        for name, extra in (
            ("alone", {}),
            ("warm", {"runners": {"linger": "30s"}}),
            ("packed", {"packing": {"max_items": 50, "window": "1s"}}),
            ("lingering", {"packing": {"max_items": 50, "window": "1s", "linger": "30s"}}),
        ):
            data = {**base, "tenants": tenants, **extra}
            self.configs[name] = tmp / f"{name}.yaml"
            self.configs[name].write_text(yaml.safe_dump(data))
        self.tmp = tmp
        self.concurrent_jobs = concurrent_jobs  # serve's --concurrent-jobs
        self.jobs: list[str] = []
        self.packs: dict[str, dict[str, float]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, config: str = "alone") -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "controller.cli", "--config", str(self.configs[config]), *args]
        log = open(self.tmp / f"{args[0]}-{config}.log", "ab")  # noqa: SIM115  (the child keeps it)
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        self.procs.append(p)
        return p

    def photos(self) -> tuple[list[str], list[str]]:
        # one face each: the wide crops (every third round of seven variants) show two people
        made = photos.face_photos(self.tmp / "faces", POOL * 4)
        faces = [p for i, p in enumerate(made) if (i // 7) % 3 != 1][: POOL * 2]
        st = self.root.stat()  # the runner's uid:gid (dev-swarm.sh gives it the data root)
        uid, gid = st.st_uid, st.st_gid
        for area in self.areas:
            (area / "in").mkdir(parents=True, exist_ok=True)
            for p in faces:
                shutil.copy(p, area / "in" / p.name)
            for f in [area / "in", *(area / "in").iterdir()]:
                os.chown(f, uid, gid)
        names = [f"in/{p.name}" for p in faces]
        return names[:POOL], names[POOL:]

    def finished(self, job: str) -> float | None:
        """When the job's report was written; None while it runs. A request that failed (serve refused
        its file, or an item or chunk failed) ends the bench: a failure is not a result."""
        if (self.root / "inbox" / "failed" / f"{job}.yaml").exists():
            raise SystemExit(f"request {job} failed: serve refused its job file (see serve's log: --logs)")
        report = self.root / run_rel(job) / "report.json"
        try:
            at = report.stat().st_mtime
        except FileNotFoundError:
            return None
        counts = json.loads(report.read_text())["counts"]
        if counts["failed"] or counts["chunks_failed"] or counts["ok"] + counts["no_face"] != counts["items"]:
            raise SystemExit(f"request {job} failed: {counts} (see serve's log: --logs)")
        return at

    async def offer(self, url: str, bodies: list[dict[str, Any]], rate: float) -> list[tuple[str, float]]:
        """Each body posted at its time (rate per second), by the tenant its ``_tenant`` names (0: the
        first); (job id, wall time of the post)."""
        out: list[tuple[str, float]] = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            t0 = time.monotonic()

            async def one(n: int, body: dict[str, Any]) -> None:
                body = dict(body)
                key = KEYS[body.pop("_tenant", 0)]
                await asyncio.sleep(max(0.0, t0 + n / rate - time.monotonic()))
                posted = time.time()
                r = await http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})
                if r.status_code != 202:
                    raise SystemExit(f"post {n}: {r.status_code} {r.text[:300]}")
                out.append((r.json()["id"], posted))

            await asyncio.gather(*(one(n, b) for n, b in enumerate(bodies)))
        return out

    def wait(self, posted: list[tuple[str, float]], deadline: float) -> dict[str, float]:
        done: dict[str, float] = {}
        self.jobs += [j for j, _ in posted]
        while len(done) < len(posted):
            for job, _ in posted:
                if job not in done and (t := self.finished(job)) is not None:
                    done[job] = t
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(posted) - len(done)} of {len(posted)} requests unfinished at the deadline")
            time.sleep(LOOK)
        return done

    def phase(
        self, name: str, url: str, api: int, bodies: list[dict[str, Any]], rate: float, limit: float
    ) -> dict[str, float]:
        """One row: ``bodies`` offered at ``rate`` to the API (process ``api``) and run by a serve of its own."""
        config = next((c for c in ("packed", "lingering") if name.startswith(c)), "alone")
        config = "warm" if name == "alone-warm" else config
        serve = self.start("serve", "--concurrent-jobs", str(self.concurrent_jobs), "--poll", "0.3", config=config)
        time.sleep(3)  # its heartbeat: the API hands jobs only to a live serve
        try:
            cpu0 = sample(api), sample(serve.pid)  # serve's start-up and idle polling before: not counted
            posted = asyncio.run(self.offer(url, bodies, rate))
            done = self.wait(posted, time.monotonic() + limit)
            cpu = sample(api), sample(serve.pid)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
        first = min(t for _, t in posted)
        lat = [done[j] - t for j, t in posted]
        items = sum(len(b.get("pairs", [])) or 1 for b in bodies)
        row = {"items": items, "per_s": items / (max(done.values()) - first), "p50": pct(lat, 50), "p99": pct(lat, 99),
               **control_cpu(spent(cpu0[0], cpu[0]), spent(cpu0[1], cpu[1]), items)}  # fmt: skip
        if config in ("packed", "lingering"):
            self.packs[name] = self.pack_times([j for j, _ in posted], self.tmp / f"serve-{config}.log")
        return row

    def pack_times(self, jobs: list[str], serve_log: Path) -> dict[str, float]:
        """Where the packs' chunk services spent their time, summed over every pack of ``jobs``: from
        the service's creation (serve's log) to the runner's start, to its models loaded, to its
        end (the runner's attempt records), and to serve seeing it done. What a runner that stays up
        for the next pack (issue 18's packing.linger) could save is the first two."""
        packs = {(self.root / run_rel(j) / "packed").read_text().strip() for j in jobs
                 if (self.root / run_rel(j) / "packed").is_file()}  # fmt: skip
        created: dict[tuple[str, str], float] = {}
        seen: dict[tuple[str, str], float] = {}
        for line in serve_log.read_text().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("job") in packs and d.get("chunk") and d.get("event") in ("chunk_started", "chunk_done"):
                at = datetime.fromisoformat(d["timestamp"].replace("Z", "+00:00")).timestamp()
                started = d["event"] == "chunk_started"  # a service made, or a lane handed the chunk
                (created if started else seen)[(d["job"], d["chunk"])] = at
        out = {"packs": float(len(packs)), "chunks": 0.0, "start_s": 0.0, "load_s": 0.0, "work_s": 0.0, "seen_s": 0.0}
        for pack in packs:
            for record in (self.root / run_rel(pack) / "attempts").glob("*.json"):
                r = json.loads(record.read_text())
                key = (pack, r["chunk"])
                if key not in created or not r.get("models_loaded_at") or not r.get("finished"):
                    continue
                out["chunks"] += 1
                out["start_s"] += r["started"] - created[key]
                out["load_s"] += r["models_loaded_at"] - r["started"]
                out["work_s"] += r["finished"] - r["models_loaded_at"]
                out["seen_s"] += seen.get(key, r["finished"]) - r["finished"]
        return out

    def clean(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        packs = {(self.root / run_rel(j) / "packed").read_text().strip() for j in self.jobs
                 if (self.root / run_rel(j) / "packed").is_file()}  # fmt: skip
        for job in [*self.jobs, *packs]:
            shutil.rmtree(self.root / run_rel(job), ignore_errors=True)
            (self.root / "inbox" / "packs" / f"{job}.yaml").unlink(missing_ok=True)
            for sub in ("done", "failed"):
                for p in (self.root / "inbox" / sub).glob(f"{job}.yaml*"):
                    p.unlink(missing_ok=True)
        for tenant, area in zip(self.tenants, self.areas, strict=True):
            shutil.rmtree(area, ignore_errors=True)
            shutil.rmtree(self.root / "tenants" / ".jobs" / tenant, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--alone", type=int, default=30)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--config", type=Path, default=REPO / "ffswarm.yaml")
    ap.add_argument("--concurrent-jobs", type=int, default=4, help="serve's job slots (a GPU pack needs none)")
    ap.add_argument("--logs", type=Path, help="copy the api's and serves' logs into this folder at the end")
    ap.add_argument("--phases", default=",".join(PHASES[:7]), help=f"which rows, of {','.join(PHASES)}")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run each phase but the ceiling this many times, in turn (REPEAT below)"
    )
    a = ap.parse_args()
    phases = [p for p in a.phases.split(",") if p]
    if "ceiling" not in phases or any(p not in PHASES for p in phases):
        ap.error(f"--phases: ceiling and any of {','.join(PHASES)}")
    if not (1 <= a.requests <= 5000 and 1 <= a.alone <= 500 and 0.1 <= a.rate <= 200 and 1 <= a.repeat <= 9):
        ap.error("--requests 1..5000, --alone 1..500, --rate 0.1..200, --repeat 1..9")
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-small-") as tmp:
        bench = Bench(Path(tmp), a.config, a.concurrent_jobs)
        try:
            port = free_port()
            api = bench.start("api", "--listen", f"127.0.0.1:{port}")
            url = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    if httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200:
                        break  # up, and the tenant's area made
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            assert api.poll() is None
            sources, targets = bench.photos()

            def one(n: int, tenants: int = 1) -> dict[str, Any]:
                body = {**OPTIONS, "name": "s", "source": sources[n % POOL], "targets": [targets[(n * 7) % POOL]]}
                return {**body, "_tenant": n % tenants}

            pairs = [{"source": sources[n % POOL], "target": targets[(n * 7) % POOL],
                      "output": f"out/ceiling/{n:05d}.jpg"} for n in range(a.requests)]  # fmt: skip
            n, burst = a.requests, 100.0
            offers: dict[str, tuple[list[dict[str, Any]], float]] = {
                "ceiling": ([{**OPTIONS, "name": "ceiling", "pairs": pairs}], 1.0),
                "packed": ([one(k) for k in range(n)], a.rate),
                # offered faster than any path finishes them: what packing does at saturation, like the ceiling
                "packed-burst": ([one(k) for k in range(n)], burst),
                # packed at the rate, each pack's chunk service waiting 30 s for the next (packing.linger)
                "lingering": ([one(k) for k in range(n)], a.rate),
                "lingering-burst": ([one(k) for k in range(n)], burst),
                "alone": ([one(k) for k in range(a.alone)], a.rate),
                "alone-warm": ([one(k) for k in range(a.alone)], a.rate),
                # two tenants' requests, alternating: packs and lanes never mix them
                "packed-2t": ([one(k, 2) for k in range(n)], a.rate),
                "lingering-2t": ([one(k, 2) for k in range(n)], a.rate),
            }
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in PHASES if p in phases}
            for turn in range(a.repeat):  # in turn, not back to back: a phase's runs see the same drift
                for p in runs if turn == 0 else [p for p in runs if p != "ceiling"]:
                    runs[p].append(bench.phase(p, url, api.pid, *offers[p], 1800))
            rows = {p: median_run(r) for p, r in runs.items()}
        finally:
            bench.clean()
            if a.logs is not None:
                a.logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, a.logs / log.name)
    print(f"one-photo requests on the dev swarm, offered at {a.rate:g}/s (ceiling: one job of all pairs)")
    print("\n".join(table(rows)))
    print("\n" + "\n".join(markdown(rows)) + "\n")
    if a.repeat > 1:
        print(f"each row: the median of {a.repeat} runs by control ms/req; every run, in turn:")
        for p, r in ((p, r) for p, r in runs.items() if len(r) > 1):
            each = (f"{x['per_s']:.2f}/s p99 {x['p99']:.1f} s {x['control_ms']:.1f} ms" for x in r)
            print(f"{p:<16}" + " · ".join(each))
        print()
    print("packs' chunk services, time summed over them (created → runner started → models loaded → ended → seen):")
    for name, t in bench.packs.items():
        total = t["start_s"] + t["load_s"] + t["work_s"] + t["seen_s"]
        if not t["chunks"] or total <= 0:
            continue
        keys = ("start_s", "load_s", "work_s", "seen_s")
        parts = "  ".join(f"{k[:-2]} {t[k]:.1f} s ({t[k] / total:.0%})" for k in keys)
        print(f"{name:<16}{int(t['packs'])} packs, {int(t['chunks'])} chunks: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
