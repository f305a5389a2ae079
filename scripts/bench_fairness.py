#!/usr/bin/env python3
"""Whether one tenant flooding `ffswarm api` with slow work slows another tenant's reads: a real
`ffswarm api` (uvicorn, its own process) on loopback over a temporary data root with two tenants.
Tenant ``reader`` reads 20 times a second, within its default quota (``GET /v1/jobs`` and
``GET /v1/jobs/{id}`` of a job of its own, in turn), first while tenant ``flood`` is idle, then while
``flood`` posts glob submits over a tree of FILES photos in its area and ZIP uploads of ZIP_PHOTOS
photos each, from its clients back to back; the reader's p50/p99 of both phases are printed side by
side, with what the flood got done meanwhile.

    .venv/bin/python scripts/bench_fairness.py                       # 20,000 files, 12 + 4 clients, 20 s a phase
    .venv/bin/python scripts/bench_fairness.py --files 2000 --seconds 5 --glob-clients 4 --zip-clients 2
    .venv/bin/python scripts/bench_fairness.py --slow-threads 2 --slow-per-tenant 1   # api.slow_threads*

Only the slow pool stands between the two tenants here: the flooding tenant's own door limits
(``quota.requests_per_second``, ``requests_in_flight``, ``jobs_queued``) are set out of the way.
Bounded and loopback only: 127.0.0.1, a temporary folder removed at the end, at most 200,000 files,
60 s a phase. A fresh heartbeat stands for `ffswarm serve`; nothing runs the jobs. No Docker.
Exit 0 when both phases ran and the reader got only 200s. Results: benchmarks/RESULTS.md (B-fairness).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_api import PACK, beat_until, free_port, percentile  # noqa: E402

from tests.builders import JPEG  # noqa: E402

KEYS = {"flood": "bench-flood-key", "reader": "bench-reader-key"}
OUT_OF_THE_WAY = {"jobs_queued": 1_000_000, "requests_per_second": 100_000, "requests_in_flight": 1000}


def data_root(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """(data root, config file): the two tenants, the slow pool as ``args`` say."""
    root = tmp / "root"
    (root / "models" / "default").mkdir(parents=True)
    (root / "models" / "default" / "pack.yaml").write_text(yaml.safe_dump({"name": "default", "files": PACK}))
    (root / "inbox").mkdir()
    if os.geteuid() == 0:  # as on a real volume: the data root is the runner's, not root's
        os.chown(root, 10001, 10001)
    config: dict[str, Any] = {
        "data_root": str(root),
        "api": {"slow_threads": args.slow_threads, "slow_threads_per_tenant": args.slow_per_tenant},
        "tenants": {
            "flood": {"api_keys_sha256": [hashlib.sha256(KEYS["flood"].encode()).hexdigest()], "quota": OUT_OF_THE_WAY},
            "reader": {"api_keys_sha256": [hashlib.sha256(KEYS["reader"].encode()).hexdigest()]},
        },
    }
    path = tmp / "ffswarm.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, path


def fill(area: Path, folder: str, files: int) -> None:
    """``files`` photos in ``area/folder/dNNNN/`` (200 a folder), as a runner would have left them."""
    made = [area / folder]
    for n in range(files):
        sub = area / folder / f"d{n // 200:04d}"
        if n % 200 == 0:
            sub.mkdir(parents=True)
            made.append(sub)
        made.append(sub / f"{n}.jpg")
        made[-1].write_bytes(JPEG)
    if os.geteuid() == 0:
        for p in made:
            os.chown(p, 10001, 10001)


def archive(photos: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for n in range(photos):
            zf.writestr(f"set/{n}.jpg", JPEG)
    return buf.getvalue()


async def read_loop(http: httpx.AsyncClient, job: str, until: float, rate: float) -> tuple[list[float], dict[int, int]]:
    """The reader's GETs, ``rate`` a second (within its default quota), until ``until``: each one's
    seconds, and the codes."""
    seconds: list[float] = []
    codes: dict[int, int] = {}
    paths = ("/v1/jobs", f"/v1/jobs/{job}")
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        t0 = time.perf_counter()
        r = await http.get(paths[len(seconds) % 2])
        seconds.append(time.perf_counter() - t0)
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
        await asyncio.sleep(max(0.0, start + len(seconds) / rate - now))
    return seconds, codes


async def flood_loop(http: httpx.AsyncClient, kind: str, zipped: bytes, until: float, done: dict[str, int]) -> None:
    """One flooding client: glob submits or ZIP uploads back to back until ``until``."""
    while time.monotonic() < until:
        if kind == "glob":
            r = await http.post("/v1/jobs", json={"source": "big/d0000/0.jpg", "targets": ["big/*/*.jpg"]})
        else:
            files = [("source", ("me.jpg", JPEG)), ("targets", ("set.zip", zipped))]
            r = await http.post("/v1/jobs", files=files)
        key = f"{kind} {r.status_code}"
        done[key] = done.get(key, 0) + 1


async def phase(url: str, job: str, args: argparse.Namespace, flooding: bool) -> dict[str, Any]:
    until = time.monotonic() + args.seconds
    done: dict[str, int] = {}
    zipped = archive(args.zip_photos)
    timeout = httpx.Timeout(120)
    reader = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['reader']}"}, timeout=timeout)
    limits = httpx.Limits(max_connections=args.glob_clients + args.zip_clients)
    flood = httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {KEYS['flood']}"}, timeout=timeout, limits=limits
    )
    async with reader, flood:
        floods = []
        if flooding:
            floods = [flood_loop(flood, "glob", zipped, until, done) for _ in range(args.glob_clients)]
            floods += [flood_loop(flood, "zip", zipped, until, done) for _ in range(args.zip_clients)]
        reading = asyncio.ensure_future(read_loop(reader, job, until, args.reader_rate))
        await asyncio.gather(*floods)
        seconds, codes = await reading
    ms = sorted(s * 1000 for s in seconds)
    return {"n": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": ms[-1], "codes": codes,
            "flood": dict(sorted(done.items()))}  # fmt: skip


def start_api(config: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "controller.cli", "--config", str(config), "api", "--listen", f"127.0.0.1:{port}"]
    log = open(tmp / "api.log", "wb")  # noqa: SIM115 (the child holds it; removed with the folder)
    server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if time.time() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("bench_fairness: the API did not start:\n" + (tmp / "api.log").read_text()[-2000:])
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="photos in the flooding tenant's tree")
    parser.add_argument("--glob-clients", type=int, default=12, help="clients posting glob submits over the tree")
    parser.add_argument("--zip-clients", type=int, default=4, help="clients posting ZIP uploads")
    parser.add_argument("--zip-photos", type=int, default=200, help="photos in each uploaded ZIP")
    parser.add_argument("--reader-rate", type=float, default=20, help="the reader's GETs a second (at most 40)")
    parser.add_argument("--seconds", type=float, default=20, help="length of each phase (at most 60)")
    parser.add_argument("--slow-threads", type=int, default=4, help="api.slow_threads")
    parser.add_argument("--slow-per-tenant", type=int, default=2, help="api.slow_threads_per_tenant")
    args = parser.parse_args()
    clients = args.glob_clients + args.zip_clients
    rate_ok = 0 < args.reader_rate <= 40
    if not (1 <= args.files <= 200_000 and 0 < args.seconds <= 60 and rate_ok and 0 <= clients <= 64):
        parser.error("--files is 1..200000, --seconds up to 60, --reader-rate up to 40, at most 64 flooding clients")
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-fairness-") as tmp_:
        tmp = Path(tmp_)
        root, config = data_root(tmp, args)
        stop = threading.Event()
        threading.Thread(target=beat_until, args=(root / "inbox", stop), daemon=True).start()
        server, url = start_api(config, tmp)
        try:
            for key in KEYS.values():  # each area made by the API on first use
                httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}).raise_for_status()
            t0 = time.perf_counter()
            fill(root / "tenants" / "flood", "big", args.files)
            fill(root / "tenants" / "reader", "in", 1)
            print(f"bench_fairness: a tree of {args.files} photos made in {time.perf_counter() - t0:.1f} s")
            headers = {"Authorization": f"Bearer {KEYS['reader']}"}
            body = {"source": "in/d0000/0.jpg", "targets": ["in/*/*.jpg"]}
            r = httpx.post(f"{url}/v1/jobs", json=body, headers=headers)
            if r.status_code != 202:
                print(f"bench_fairness: the reader's job was not accepted: {r.status_code} {r.text}", file=sys.stderr)
                print((tmp / "api.log").read_text(errors="replace")[-3000:], file=sys.stderr)  # the API's last words
                return 1
            job = r.json()["id"]
            idle = asyncio.run(phase(url, job, args, flooding=False))
            busy = asyncio.run(phase(url, job, args, flooding=True))
        finally:
            stop.set()
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
    print(f"bench_fairness: reader's GET /v1/jobs and GET /v1/jobs/{{id}} for {args.seconds:g} s a phase; flood: "
          f"{args.glob_clients} glob clients over {args.files} files, {args.zip_clients} ZIP clients "
          f"({args.zip_photos} photos each); api.slow_threads {args.slow_threads}, "
          f"per tenant {args.slow_per_tenant}")  # fmt: skip
    print("\n| reader's GETs | flood idle | flood on |\n|---|---|---|")
    print(f"| requests | {idle['n']} | {busy['n']} |")
    for key in ("p50", "p99", "max"):
        print(f"| {key} ms | {idle[key]:.1f} | {busy[key]:.1f} |")
    print(f"| answers | {idle['codes']} | {busy['codes']} |")
    print(f"\nflood's answers meanwhile: {busy['flood']}")
    ok = set(idle["codes"]) == {200} and set(busy["codes"]) == {200}
    print("bench_fairness: ok" if ok else "bench_fairness: FAILED (the reader got answers other than 200)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
