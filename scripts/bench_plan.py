#!/usr/bin/env python3
"""B3 — planning at scale: 100,000 image targets and 1,000 video segments.

Creates the files (empty images are enough: planning never decodes them; the videos are real,
probed with ffprobe), then times each planning stage in a fresh child process and reports its peak
memory (ru_maxrss). Nothing touches Docker. Usage:
    .venv/bin/python scripts/bench_plan.py [--images 100000] [--videos 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_inputs(root: Path, images: int, videos: int, video_seconds: int) -> None:
    crowd = root / "crowd"
    for shard in range(0, images, 1000):
        d = crowd / f"{shard // 1000:03d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(shard, min(shard + 1000, images)):
            (d / f"p{i:06d}.jpg").touch()
    (root / "faces").mkdir(parents=True, exist_ok=True)
    (root / "faces" / "star.jpg").touch()
    clips = root / "clips"
    clips.mkdir(exist_ok=True)
    for v in range(videos):
        subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-y",
                "-f",
                "lavfi",
                "-i",
                f"testsrc=size=64x64:rate=5:duration={video_seconds}",
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-g",
                "5",
                str(clips / f"v{v:02d}.mp4"),
            ],
            check=True,
        )


def child(root: Path, job_file: Path) -> dict[str, float]:
    """One planning run, stage by stage (what `ffswarm submit` does before any Docker call)."""
    from controller.job import video
    from controller.job.files import load_job_file
    from controller.job.plan import ManifestSettings, chunk_manifests, make_plan
    from controller.job.resolve import resolve_job
    from controller.run.rundir import Control, RunDir

    t = {"start": time.perf_counter()}
    spec = load_job_file(job_file)
    t["parse"] = time.perf_counter()
    resolved = resolve_job(spec, root, str(job_file))
    t["resolve"] = time.perf_counter()
    refs = video.target_refs(resolved.targets, spec)
    t["probe"] = time.perf_counter()
    plan = make_plan(spec.name, refs, spec.chunk_size)
    t["plan"] = time.perf_counter()
    settings = ManifestSettings(
        pack="default",
        sources=("faces/star.jpg",),
        processors=("face_swapper",),
        providers=("cpu",),
        faces=spec.faces,
        no_face=spec.no_face,
        identity_timeout=960.0,  # as submit writes them: runners read the job's identity.json
    )
    manifests = chunk_manifests(plan, settings)
    t["manifests"] = time.perf_counter()
    RunDir(root, spec.name).create(job_file.read_bytes(), plan, manifests, Control(4), "sha256:bench")
    t["write"] = time.perf_counter()
    stages = ["parse", "resolve", "probe", "plan", "manifests", "write"]
    out = {s: round(t[s] - t[prev], 3) for prev, s in zip(["start", *stages], stages, strict=False)}
    out["total_s"] = round(t["write"] - t["start"], 3)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["items"] = len(plan.items)
    out["segments"] = sum(1 for i in plan.items if i.kind == "segment")
    out["chunks"] = len(plan.chunks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=100_000)
    ap.add_argument("--videos", type=int, default=10)
    ap.add_argument("--video-seconds", type=int, default=100)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=2, metavar=("ROOT", "JOB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]))))
        return
    root = Path(tempfile.mkdtemp(prefix="ffswarm-bench-plan-", dir="/var/tmp"))
    try:
        t0 = time.perf_counter()
        make_inputs(root, args.images, args.videos, args.video_seconds)
        print(
            f"made {args.images} images and {args.videos} × {args.video_seconds} s videos in "
            f"{time.perf_counter() - t0:.1f} s under {root}"
        )
        figures = {}
        for name, targets, seg in (("images", ["crowd/**/*.jpg"], 30), ("videos", ["clips/*.mp4"], 1)):
            if (name == "videos" and not args.videos) or (name == "images" and not args.images):
                continue
            job = root / f"{name}.yaml"
            job.write_text(
                json.dumps(
                    {
                        "name": f"bench-{name}",
                        "source": "faces/star.jpg",
                        "targets": targets,
                        "output": "out/{dir}/{stem}{ext}",
                        "chunk_size": 20,
                        "segment_seconds": seg,
                    }
                )
            )
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(root), str(job)], capture_output=True, text=True, check=True
            )
            figures[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            f = figures[name]
            print(
                f"B3 {name}: {f['items']} items ({f['segments']} segments) in {f['chunks']} chunks planned in "
                f"{f['total_s']:.2f} s, peak RSS {f['peak_rss_mb']:.0f} MB; stages "
                + ", ".join(f"{k} {f[k]:.2f}s" for k in ("parse", "resolve", "probe", "plan", "manifests", "write"))
            )
        if args.json:
            args.json.write_text(json.dumps({"benchmark": "B3 planning", "cpus": os.cpu_count(), **figures}, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
