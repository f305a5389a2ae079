#!/usr/bin/env python3
"""Soak: the three-node cluster (scripts/cluster.sh) under a steady stream of three tenants' requests
while a random fault is injected every 15–45 s, then the checks — every request ended, ok outputs equal
a fault-free run's, nothing committed twice, nothing left behind, each job-end webhook once by id,
usage adds up. Needs Docker (the lead's machine); ``--dry-run`` only prints the plan.

    scripts/soak.py [--minutes 60] [--seed S] [--short] [--s3] [--gap 1.4] [--no-faults] [--keep] [--dry-run]

The seed is printed first; ``--seed`` replays a run's faults and requests. ``--short``: one fault of
each kind in about five minutes. ``--s3``: S3 jobs and the object-store fault, with Ceph RGW on
this host (scripts/s3-server.sh, started when it is not up). Results: a summary table, and
build/soak/<seed>-<time>.json.
What it does and checks: docs/development.md#soak.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.soak.plan import MEAN_GAP, describe, make_plan  # noqa: E402


def bounded(unit: str, top: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value <= top:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} above 0 and at most {top:g}, not {raw!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--minutes", type=bounded("minutes", 1440), help="length of the faulted run (default 60; --short: 5)"
    )
    ap.add_argument(
        "--gap", type=bounded("seconds", 60), default=MEAN_GAP, help=f"mean seconds between requests ({MEAN_GAP})"
    )
    ap.add_argument("--seed", type=int, default=None, help="replay the run of this seed (default: a new one)")
    ap.add_argument("--short", action="store_true", help="one fault of each kind, about five minutes")
    ap.add_argument(
        "--s3", action="store_true", help="S3 jobs and the store fault: Ceph RGW on this host (scripts/s3-server.sh)"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan (seed, faults, requests); touch nothing")
    ap.add_argument("--keep", action="store_true", help="leave the controller stack up afterwards")
    ap.add_argument("--no-faults", action="store_true", help="the same stream without faults (the rate to compare)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 31)
    length = args.minutes if args.minutes is not None else (5.0 if args.short else 60.0)
    plan = make_plan(seed, length, short=args.short, s3=args.s3, gap=args.gap)
    replay = f"--seed {seed} --minutes {length:g}" + (" --short" if args.short else "") + f" --gap {args.gap:g}"
    replay += " --s3" if args.s3 else ""
    print(f"soak: seed {seed} (replay: scripts/soak.py {replay})", flush=True)
    if args.dry_run:
        print(describe(plan))
        return 0
    from scripts.soak.run import soak  # Docker, httpx: only for a real run

    return soak(plan, keep=args.keep, no_faults=args.no_faults)


if __name__ == "__main__":
    sys.exit(main())
