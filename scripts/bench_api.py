#!/usr/bin/env python3
"""How fast `ffswarm api` takes jobs: posts N one-photo JSON jobs (or multipart uploads of the two photos,
``--upload``) from C concurrent clients to a real
`ffswarm api` (uvicorn, its own process) on loopback over a temporary data root, then prints accepted/s
and the p50/p99 submit latency, and checks that none is lost: every 202 became its inbox file. It also
prints the API's CPU per accepted request (from /proc: its processes, all threads, over the posting only;
scripts/proc_cpu.py), and with ``--strace`` the volume operations per request: strace attaches to the running
API for the posting only (start-up imports not counted) and counts file, fsync, rename and flock calls.

    .venv/bin/python scripts/bench_api.py                    # 1,000 jobs, 50 clients
    .venv/bin/python scripts/bench_api.py --jobs 200 --clients 10
    .venv/bin/python scripts/bench_api.py --strace           # + syscalls per request (slower: traced)
    .venv/bin/python scripts/bench_api.py --upload           # the photos uploaded (multipart), not named
    .venv/bin/python scripts/bench_api.py --workers 1,2      # `ffswarm api --workers`: 1 and 2, side by side

Bounded and loopback only: 127.0.0.1, a temporary folder removed at the end, at most 20,000 jobs and
200 clients, a deadline on the whole run. A fresh heartbeat stands for `ffswarm serve` (the API hands
jobs only to a live one); nothing runs the jobs. Exit 0 only when every job was accepted and found.
Results: benchmarks/RESULTS.md (B-api).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.run.handover import HeartbeatFile  # noqa: E402
from scripts.proc_cpu import per_request_ms, sample, spent, tree  # noqa: E402

KEY = "bench-secret-key"
TENANT = "bench"
PACK = {
    "det_10g.onnx": {"role": "detector", "sha256": "0" * 64},
    "w600k_r50.onnx": {"role": "recognizer", "sha256": "0" * 64},
    "inswapper_128.onnx": {"role": "swapper", "sha256": "0" * 64},
}


def data_root(tmp: Path) -> tuple[Path, Path]:
    """(data root, config file): one tenant whose area holds a source and a target photo."""
    root = tmp / "root"
    (root / "models" / "default").mkdir(parents=True)
    (root / "models" / "default" / "pack.yaml").write_text(yaml.safe_dump({"name": "default", "files": PACK}))
    (root / "inbox").mkdir()
    if os.geteuid() == 0:  # as on a real volume: the data root is the runner's, not root's
        os.chown(root, 10001, 10001)
    config = {
        "data_root": str(root),
        "tenants": {
            TENANT: {
                "api_keys_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
                # the bench is one tenant flooding on purpose: its fairness limits out of the way
                "quota": {"jobs_queued": 1_000_000, "requests_per_second": 100_000, "requests_in_flight": 1000},
            }
        },
    }
    path = tmp / "ffswarm.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, path


def photo(shade: int) -> bytes:
    """A real 64×64 JPEG (the API checks the job as `submit` does: paths, globs, pack; not faces)."""
    import cv2
    import numpy as np

    ok, buf = cv2.imencode(".jpg", np.full((64, 64, 3), 20 * shade, np.uint8))
    assert ok
    return bytes(buf.tobytes())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def beat_until(inbox: Path, stop: threading.Event) -> None:
    heart = HeartbeatFile(inbox, concurrent_jobs=4)
    while not stop.is_set():
        heart.beat(running=0)
        stop.wait(2.0)


NO_ANSWER = 0  # in the answers' counts: requests that got no HTTP answer at all


FACE = b""  # the upload's photos, made once (photo())
PHOTOS: list[bytes] = []


async def post_all(
    url: str, jobs: int, clients: int, upload: bool = False, rate: float = 0.0
) -> tuple[list[float], dict[int, int], list[str], float]:
    """Every job posted by ``clients`` concurrent clients: (latencies, answers by code, ids, when the
    first request was sent); ``rate`` > 0: the n-th job not before n/rate seconds from the start (an
    offered rate, as a campaign's trickle), else as fast as the clients go. Each client is its own
    connection (httpx's pool looks at every one of its connections on each request: shared by 50, it
    cost the benchmark more CPU than the API), made before the clock starts (a client's set-up is not
    the API's latency)."""
    latencies: list[float] = []
    codes: dict[int, int] = {}
    ids: list[str] = []
    next_job = iter(range(jobs))
    headers = {"Authorization": f"Bearer {KEY}"}
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    https = [
        httpx.AsyncClient(base_url=url, headers=headers, limits=one, timeout=60, verify=False) for _ in range(clients)
    ]

    async def client(http: httpx.AsyncClient) -> None:
        async with http:
            for n in next_job:
                if rate > 0:
                    await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
                body = {"name": "bench", "source": "in/face.jpg", "targets": [f"in/p{n % 10}.jpg"]}
                t0 = time.perf_counter()
                try:
                    if upload:  # the photos in the body: a source and one target, as multipart/form-data
                        files = [
                            ("source", ("face.jpg", FACE, "image/jpeg")),
                            ("targets", (f"p{n}.jpg", PHOTOS[n % 10], "image/jpeg")),
                        ]
                        r = await http.post("/v1/jobs", files=files, data={"job": '{"name": "bench"}'})
                    else:
                        r = await http.post("/v1/jobs", json=body)
                except httpx.TransportError:  # no answer (a connection closed under the request): counted, not fatal
                    codes[NO_ANSWER] = codes.get(NO_ANSWER, 0) + 1
                    continue
                latencies.append(time.perf_counter() - t0)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code == 202:
                    ids.append(r.json()["id"])

    started = time.perf_counter()
    await asyncio.gather(*(client(h) for h in https))
    return latencies, codes, ids, started


VOLUME_CALLS = "trace=%file,fsync,fdatasync,syncfs,sync,rename,renameat,renameat2,flock,getdents64"


def trace(pids: list[int], out: Path) -> subprocess.Popen[bytes]:
    """strace counting the API's volume calls from now on (all threads of all its processes); stopped
    with SIGINT."""
    cmd = ["strace", "-f", "-c", "-e", VOLUME_CALLS, "-o", str(out), *(f"-p{pid}" for pid in pids)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def syscalls(summary: IO[str]) -> dict[str, int]:
    """{syscall: calls} from strace -c's table."""
    counts: dict[str, int] = {}
    for line in summary:
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def bench(args: argparse.Namespace, workers: int, rate: float = 0.0) -> dict[str, float] | None:
    """One run against an API of ``workers`` processes on a fresh data root, offered ``rate`` jobs/s
    (0: as fast as the clients go): its figures printed and returned (None when it did not start or a
    job went missing)."""
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-api-") as tmp:
        root, config = data_root(Path(tmp))
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "controller.cli", "--config", str(config), "api", "--listen", f"127.0.0.1:{port}",
               "--workers", str(workers)]  # fmt: skip
        log = open(Path(tmp) / "api.log", "wb")  # noqa: SIM115 (closed once the API has stopped)
        server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
        stop = threading.Event()
        heart = threading.Thread(target=beat_until, args=(root / "inbox", stop), daemon=True)
        heart.start()
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 30
            while True:
                try:
                    up = httpx.get(f"{url}/healthz", timeout=1).status_code == 200
                    forked = 1 if workers == 1 else workers + 1  # uvicorn workers (each with its slow ones)
                    if up and len(tree(server.pid)) >= forked:
                        break
                except httpx.TransportError:
                    pass
                if time.time() > deadline or server.poll() is not None:
                    print("bench_api: the API did not start", file=sys.stderr)
                    return None
                time.sleep(0.1)
            area = root / "tenants" / TENANT / "in"
            area.mkdir(parents=True, exist_ok=True)
            for n, name in enumerate(["face.jpg"] + [f"p{n}.jpg" for n in range(10)]):
                (area / name).write_bytes(photo(n))
            pids = tree(server.pid)
            tracer = trace(pids, Path(tmp) / "strace.txt") if args.strace else None
            if tracer is not None:
                time.sleep(1.0)  # attached to every thread before the first request
            before = sample(server.pid)
            latencies, codes, ids, t0 = asyncio.run(
                asyncio.wait_for(post_all(url, args.jobs, args.clients, args.upload, rate), timeout=args.deadline)
            )
            after = sample(server.pid)
            wall, cpu = time.perf_counter() - t0, spent(before, after)
            each = [after.get(p, 0.0) - c for p, c in before.items()]
            calls: dict[str, int] = {}
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(30)
                with open(Path(tmp) / "strace.txt") as summary:
                    calls = syscalls(summary)
        except BaseException:
            print((Path(tmp) / "api.log").read_text(errors="replace")[-3000:], file=sys.stderr)  # the API's last words
            raise
        finally:
            stop.set()
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
        inbox = root / "inbox"
        lost = [j for j in ids if not (inbox / f"{j}.yaml").is_file()]
        dupes = len(ids) - len(set(ids))
        accepted = codes.get(202, 0)
        ms = sorted(x * 1000 for x in latencies)
        procs = f"an API of {workers} workers" if workers > 1 else "an API of 1 process"
        what = "one-photo multipart uploads" if args.upload else "one-photo JSON jobs"
        offered = f" offered at {rate:g}/s" if rate > 0 else ""
        print(f"bench_api: {args.jobs} {what} from {args.clients} clients{offered} on loopback to {procs} "
              f"in {wall:.2f} s")  # fmt: skip
        print(f"  accepted/s      {accepted / wall:.1f}")
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        print(f"  submit latency  p50 {p50:.1f} ms · p99 {p99:.1f} ms · max {ms[-1]:.1f} ms")
        print(f"  answers         {dict(sorted(codes.items()))}" + (" (0: no answer)" if NO_ANSWER in codes else ""))
        per = max(accepted, 1)
        cpu_ms = per_request_ms(cpu, accepted)
        print(f"  API CPU         {cpu_ms:.1f} ms per accepted request ({cpu:.1f} s over {wall:.1f} s)")
        if len(each) > 1:  # how evenly the kernel spread the connections: the parent, then each worker
            print(f"  CPU by process  {' · '.join(f'{c:.1f} s' for c in each)} (the parent first)")
        if args.strace:  # traced: the CPU and rate above are the traced ones (slower)
            top = sorted(calls.items(), key=lambda kv: -kv[1])
            shown = " · ".join(f"{name} {n / per:.1f}" for name, n in top[:12])
            print(f"  volume calls    {sum(calls.values()) / per:.1f} per accepted request: {shown}")
        print(f"  lost            {len(lost)} (accepted but no inbox file) · duplicate ids {dupes}")
        if NO_ANSWER in codes:  # the job may or may not have been accepted: the client cannot tell
            print(f"  no answer       {codes[NO_ANSWER]} (the run's figures stand; the verdict does not)")
        ok = accepted == args.jobs and not lost and not dupes
        print("bench_api: ok: every job accepted and in the inbox" if ok else "bench_api: FAILED")
        if not ok:
            return None
        return {"workers": workers, "offered": rate, "rate": accepted / wall, "p50": p50, "p99": p99, "cpu_ms": cpu_ms}


def number_list(kind: type[int] | type[float], low: float, high: float, what: str) -> Callable[[str], list[Any]]:
    """An argparse type: comma-separated numbers of ``kind``, each within low..high (``what`` names them)."""

    def parse(text: str) -> list[Any]:
        try:
            values = [kind(n) for n in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} separated by commas, got {text!r}") from None
        if not values or any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"each of the {what} is {low:g}..{high:g}, got {text!r}")
        return values

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to post (at most 20000)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (at most 200)")
    parser.add_argument("--deadline", type=float, default=600, help="seconds the whole run may take")
    parser.add_argument("--strace", action="store_true", help="count the API's volume syscalls per request")
    parser.add_argument("--upload", action="store_true", help="post each job's two photos as a multipart upload")
    parser.add_argument(
        "--workers", type=number_list(int, 1, 16, "worker counts"), default=[1], metavar="N[,M…]",
        help="the API's worker processes (ffswarm api --workers); several: one run each, side by side",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=number_list(float, 0, 10_000, "rates in jobs/s (0: as fast as the clients go)"),
        default=[0.0], metavar="R[,S…]",
        help="jobs offered per second (0: as fast as the clients go); several: one run each, side by side "
        "(the API's CPU per request at a trickle against a burst)",
    )  # fmt: skip
    args = parser.parse_args()
    if not (1 <= args.jobs <= 20_000 and 1 <= args.clients <= 200):
        parser.error("--jobs is 1..20000, --clients 1..200")
    global FACE
    FACE, PHOTOS[:] = photo(0), [photo(n + 1) for n in range(10)]
    runs = [(n, r) for n in args.workers for r in args.rate]
    rows = [bench(args, n, r) for n, r in runs]
    if len(rows) > 1:
        print("\n| workers | offered | accepted/s | p50 ms | p99 ms | API CPU ms/request |\n|---|---|---|---|---|---|")
        for (n, r), row in zip(runs, rows, strict=True):
            offered = f"{r:g}/s" if r > 0 else "all at once"
            if row is None:
                print(f"| {n} | {offered} | failed | | | |")
            else:
                figures = f"{row['rate']:.1f} | {row['p50']:.1f} | {row['p99']:.1f} | {row['cpu_ms']:.1f}"
                print(f"| {n} | {offered} | {figures} |")
    return 0 if all(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
