"""Image benchmark (not a test): size and cold start of runner images, measured side by side.

    .venv/bin/python scripts/bench_image.py IMAGE [IMAGE ...] [--runs 7] [--json PATH]

For each image: its size (``docker image inspect``) and ``--runs`` cold starts, the images taken in
turn (A B A B …) so that every image sees the same machine state. A cold start is one chunk of one
photo on the stand-in pack with the CPU provider, run with ``docker run`` and a real chunk's
hardening (read-only root, tmpfs /tmp, no capabilities, uid 10001, no network), timed from the
``docker run`` call to the runner's "models loaded" line on the container's stdout: container
creation and start, interpreter, imports, the pack's sha256 check and the ONNX sessions. The
runner's own part of it (``process_s`` of that line: process start to models loaded) is shown
beside it; "run" is the whole container, to its exit. Run it alone on the machine's Docker engine
(docs/development.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures import photos  # noqa: E402
from tests.fixtures.standin_pack import build_pack  # noqa: E402

RUNNER_UID = 10001


def prepare(root: Path) -> None:
    """The stand-in pack and one photo under a fresh data root the runner's uid owns."""
    build_pack(root / "models" / "default")
    photos.astronaut(root / "in")
    shutil.chown(root, RUNNER_UID, RUNNER_UID)
    for path in root.rglob("*"):
        os.chown(path, RUNNER_UID, RUNNER_UID, follow_symlinks=False)


def manifest(root: Path, job: str) -> str:
    """A minimal schema-1 chunk manifest (only fields every runner version reads), as a container path."""
    run = root / "runs" / job
    (run / "chunks").mkdir(parents=True)
    data = {
        "schema": 1, "job": job, "chunk": "c0000", "run_dir": f"/data/runs/{job}",
        "pack_dir": "/data/models/default", "source": ["/data/in/astronaut.jpg"], "providers": ["cpu"],
        "items": [{"id": "i000000", "input": "/data/in/astronaut.jpg", "output": f"/data/out/{job}/astronaut.jpg"}],
    }  # fmt: skip
    (run / "chunks" / "c0000.json").write_text(json.dumps(data))
    for path in (root / "runs", run, run / "chunks", run / "chunks" / "c0000.json"):
        os.chown(path, RUNNER_UID, RUNNER_UID)
    return f"/data/runs/{job}/chunks/c0000.json"


def cold_start(image: str, root: Path, job: str) -> dict[str, Any]:
    cmd = [
        "docker", "run", "--rm", "--name", f"ffswarm-bench-image-{job}", "--read-only", "--tmpfs", "/tmp",
        "--cap-drop", "ALL", "--user", f"{RUNNER_UID}:{RUNNER_UID}", "--network", "none",
        "-v", f"{root}:/data", "-e", f"FFSWARM_MANIFEST={manifest(root, job)}", image,
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    loaded: float | None = None
    process_s: float | None = None
    for line in proc.stdout:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if loaded is None and isinstance(rec, dict) and rec.get("event") == "models loaded":
            loaded = time.perf_counter() - t0
            process_s = float(rec["process_s"])
    code = proc.wait()
    wall = time.perf_counter() - t0
    stderr = proc.stderr.read() if proc.stderr else ""
    if code != 0 or loaded is None:
        raise SystemExit(f"{image}: runner exited {code} (models loaded seen: {loaded is not None})\n{stderr[-2000:]}")
    return {"cold_s": round(loaded, 3), "process_s": process_s, "run_s": round(wall, 3)}


def size_mb(image: str) -> float:
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"no image {image}: {out.stderr.strip()}")
    return round(int(out.stdout) / 1e6, 1)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = {image: size_mb(image) for image in args.images}
    runs: dict[str, list[dict[str, Any]]] = {image: [] for image in args.images}
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-image-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        prepare(root)
        for image in args.images:  # one unmeasured start each: page cache and image layers warm for all
            cold_start(image, root, f"warm{len(runs[image])}-{args.images.index(image)}")
        for i in range(args.runs):
            for n, image in enumerate(args.images):
                runs[image].append(cold_start(image, root, f"r{i}-{n}"))
    print(f"{'image':40} {'size MB':>8}  {'cold start s':>18}  {'in process s':>18}  {'run s':>18}")
    for image in args.images:
        r = runs[image]
        print(
            f"{image:40} {sizes[image]:8.0f}  {summary([x['cold_s'] for x in r]):>18}  "
            f"{summary([x['process_s'] for x in r]):>18}  {summary([x['run_s'] for x in r]):>18}"
        )
    print(f"median (min–max) of {args.runs} runs each, images in turn")
    if args.json:
        args.json.write_text(json.dumps({"sizes_mb": sizes, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
