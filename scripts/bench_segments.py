#!/usr/bin/env python3
"""Video segments: decoding each segment from a seek just before it vs from the start of the file.

Makes a clip with ffmpeg (testsrc2, x264, one keyframe per 10 s like a camera or an encoder's
default GOP), plans it as `ffswarm submit` does (probe, frame times, segments), then decodes every
segment with the runner's own command both ways, back to back, reading all frames:
    .venv/bin/python scripts/bench_segments.py [--minutes 3] [--segment-seconds 10] [--json out.json]
The decode from the start is what every segment did before segments carried a seek: segment k
decodes the k segments before it too, so a video's total decode grows with the square of its length.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract import ffmpeg  # noqa: E402
from contract.manifest import Segment  # noqa: E402
from controller.job import video  # noqa: E402
from controller.job.files import parse_job  # noqa: E402
from controller.job.resolve import resolve_job  # noqa: E402


def decode_seconds(path: Path, seg: Segment) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(ffmpeg.decode_cmd(str(path), seg), stdout=subprocess.PIPE, check=True)
    elapsed = time.perf_counter() - t0
    assert len(proc.stdout) == seg.frame_count * seg.width * seg.height * 3, "wrong number of frames"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--segment-seconds", type=float, default=10.0)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ffswarm-bench-segments-", dir="/var/tmp"))
    try:
        clip = root / "in" / "clip.mp4"
        clip.parent.mkdir()
        t0 = time.perf_counter()
        subprocess.run(
            ["ffmpeg", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=size={args.size}:rate=25",
             "-t", str(args.minutes * 60), "-c:v", "libx264", "-preset", "veryfast", "-g", "250",
             "-pix_fmt", "yuv420p", str(clip)],
            check=True,
        )  # fmt: skip
        made = time.perf_counter() - t0
        (root / "s.jpg").write_bytes(b"x")
        spec = parse_job(
            {"name": "b", "source": "s.jpg", "targets": ["in/*"], "output": "out/{stem}{ext}",
             "segment_seconds": args.segment_seconds},
            "job.yaml",
        )  # fmt: skip
        t0 = time.perf_counter()
        (ref,) = video.target_refs(resolve_job(spec, root, "job.yaml").targets, spec)
        planned = time.perf_counter() - t0
        segments = list(ref.segments)
        assert all(s.seek for s in segments[1:]), "the plan found no frame times: nothing to compare"
        print(
            f"clip: {args.minutes:g} min {args.size} x264 (GOP 10 s) made in {made:.1f} s; planned in {planned:.2f} s "
            f"into {len(segments)} segments of {args.segment_seconds:g} s"
        )
        rows = []
        for n, seg in enumerate(segments):
            seek = decode_seconds(clip, seg)
            start = decode_seconds(clip, dataclasses.replace(seg, seek=None))
            rows.append(
                {
                    "segment": n,
                    "start_frame": seg.start_frame,
                    "seek_s": round(seek, 3),
                    "from_start_s": round(start, 3),
                }
            )
        total_seek = sum(r["seek_s"] for r in rows)
        total_start = sum(r["from_start_s"] for r in rows)
        for r in (rows[0], rows[len(rows) // 2], rows[-1]):
            print(
                f"segment {r['segment']:3d} (frame {r['start_frame']:6d}): seek {r['seek_s']:.2f} s, "
                f"from the start {r['from_start_s']:.2f} s"
            )
        print(
            f"all {len(rows)} segments: {total_seek:.1f} s of decoding with seeks vs {total_start:.1f} s from the "
            f"start → {total_start / total_seek:.1f}× less decoding ({os.cpu_count()} cores)"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"benchmark": "video segment decode", "minutes": args.minutes, "size": args.size,
                     "segment_seconds": args.segment_seconds, "plan_s": round(planned, 3), "segments": rows,
                     "total_seek_s": round(total_seek, 2), "total_from_start_s": round(total_start, 2)},
                    indent=1,
                )
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
