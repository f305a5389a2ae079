"""`submit --dry-run`: the plan in a few lines a person reads (`-o json|yaml`: everything, as data).

Per job: its items by kind, its chunks, the services that would be created (how many, their image,
constraints and reservations) and where the outputs go — a video's final output, not its segments.
Nothing is created.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Callable
from typing import Any

from controller.config import Config
from controller.run.jobs import PreparedJob, dry_run, runner_settings
from controller.swarm.servicespec import chunk_service

SHOWN = 3  # videos named per job


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def plan_lines(config: Config, jobs: list[PreparedJob], image_of: Callable[[str], str]) -> list[str]:
    lines: list[str] = []
    for job in jobs:
        image = image_of(job.spec.image or config.image)
        settings = runner_settings(config, job, image)
        plan = job.plan
        kinds = Counter(i.kind for i in plan.items)
        segments = kinds.pop("segment", 0)
        parts = [f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in sorted(kinds.items())]
        if plan.videos:
            parts.append(f"{len(plan.videos)} video{'s' if len(plan.videos) != 1 else ''} ({segments} segments)")
        total = sum(kinds.values()) + len(plan.videos)
        lines.append(f"job {job.job_id} ({job.file}): {total} items — {', '.join(parts) or 'none'}")
        lines.append(f"  chunks: {len(plan.chunks)}, at most {job.spec.max_concurrent} at once")
        if plan.chunks:
            first = chunk_service(settings, plan.chunks[0].id, 1)
            last = chunk_service(settings, plan.chunks[-1].id, 1).name
            names = first.name if len(plan.chunks) == 1 else f"{first.name} … {last}"
            reserve = [f"{kind}×{n}" for kind, n in sorted(first.generic_resources.items())]
            reserve.append(f"memory {_size(first.memory_bytes)}")
            lines.append(f"  services: {len(plan.chunks)} one-shot ({names}), image {image}")
            lines.append(f"    constraints: {', '.join(first.constraints) or 'none'}")
            lines.append(f"    reserves: {', '.join(reserve)}")
        images = [i.output for i in plan.items if i.kind != "segment"]
        folders = Counter(posixpath.dirname(o) or "." for o in images)
        for folder, n in sorted(folders.items()):
            lines.append(f"  outputs: {folder}/ ({n} image{'s' if n != 1 else ''})")
        for v in plan.videos[:SHOWN]:
            lines.append(f"  video: {v.input} → {v.output}" + (f" (refused: {v.error})" if v.error else ""))
        if len(plan.videos) > SHOWN:
            lines.append(f"  … and {len(plan.videos) - SHOWN} more videos")
    lines.append("nothing was created; `-o json` (or yaml) prints every item, chunk and service")
    return lines


def plan_json(config: Config, jobs: list[PreparedJob], image_of: Callable[[str], str]) -> dict[str, Any]:
    return dry_run(config, jobs, image_of)
