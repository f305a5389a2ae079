"""``chunk_size: auto`` (docs/job-file.md): how many items each chunk of a job gets. controller/job/plan.py
uses it and re-exports it."""

from __future__ import annotations

AUTO_MAX_CHUNK = 1000


def auto_chunk_size(items: int, parallel: int, max_chunk: int = AUTO_MAX_CHUNK) -> int:
    """`chunk_size: auto`: as few equal waves of chunks across the job's parallel GPU slots as keep
    every chunk at most `max_chunk` items (AUTO_MAX_CHUNK, or what the measured cold start and
    per-item time of earlier jobs call for: controller/run/timings.py).

    Each chunk service pays a fixed cost before its first item (a container start, the runner's
    imports and model load) that its items amortise, so efficiency climbs with chunk size until the
    slots run out of chunks (benchmarks/RESULTS.md, "Orchestration: B1 and the chunk-size sweep"). So: as few
    chunks as keep every slot busy, but no chunk above AUTO_MAX_CHUNK items, so that a huge job
    still spreads over a growing cluster and a lost chunk costs little (committed items are never
    redone anyway).
    """
    parallel = max(1, parallel)
    waves = max(1, -(-items // (parallel * max(1, max_chunk))))  # full waves: no slot idles in the last one
    return max(1, -(-items // (parallel * waves)))
