"""``GET /v1/usage?from=&to=``: what a tenant used over a time range (docs/api.md#usage-and-metrics).

The sum of the ``usage`` objects (controller/run/usage.py) of the tenant's jobs whose report says they
ended in ``[from, to)``, with the jobs themselves a page at a time. Read from the run folders like
everything else the API answers; a job's report is read only when its file may be recent enough.
Its answer's shape is ``UsagePage`` in controller/api/schemas.py.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller.api.area import Area
from controller.api.errors import ApiError
from controller.api.page import ApiLike
from controller.errors import FfswarmError
from controller.run import usage
from controller.run.job_lease import rfc3339
from controller.run.rundir import RunDir

Handler = Callable[[Request], Awaitable[Response]]
CLOCK_SLACK = 86400.0  # a report file older than ``from`` by this much is not read (its job ended before)
MAX_TIME = 32_503_680_000.0  # the year 3000


def parse_time(raw: str | None, name: str, default: float) -> float:
    """Unix seconds, an ISO date (midnight UTC) or an ISO date-time (UTC when it names no zone)."""
    if raw is None or raw == "":
        return default
    try:
        value = float(raw) if raw.replace(".", "", 1).isdigit() else _iso(raw)
    except (ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_TIME:
        hint = "unix seconds, a date (2026-01-31) or a date-time (2026-01-31T12:00:00Z)"
        raise ApiError(400, "bad_request", f"{name} must be {hint}", field=name)
    return value


def _iso(raw: str) -> float:
    when = datetime.fromisoformat(raw)
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _ended(area: Area, job: str, start: float) -> tuple[float, dict[str, Any] | None] | None:
    """(when the job's report says it ended, its checked usage); None without a readable report."""
    if area.owns(job) is None:
        return None
    rundir = RunDir(area.root, job)
    try:
        if os.lstat(rundir.layout.report).st_mtime < start - CLOCK_SLACK:
            return None
        report = rundir.report()
    except (OSError, FfswarmError):
        return None
    finished = report.get("finished") if report is not None else None
    if not isinstance(finished, int | float) or isinstance(finished, bool) or not math.isfinite(finished):
        return None
    return float(finished), usage.of_report(report)


def tenant_usage(area: Area, start: float, end: float, limit: int, cursor: str | None) -> dict[str, Any]:
    total = usage.zero()
    jobs: list[dict[str, Any]] = []
    without = 0
    for job in area.jobs():
        ended = _ended(area, job, start)
        if ended is None or not start <= ended[0] < end:
            continue
        finished, used = ended
        if used is None:  # a report written before usage was measured
            without += 1
            continue
        total = usage.add(total, used)
        jobs.append({"job": job, "finished": finished, "finished_at": rfc3339(finished), "usage": used})
    page = [j for j in jobs if cursor is None or j["job"] > cursor]
    return {
        "tenant": area.tenant,
        "from": start,
        "to": end,
        "from_at": rfc3339(start),
        "to_at": rfc3339(end),
        "jobs": len(jobs),
        "jobs_without_usage": without,
        "usage": total,
        "job_usage": page[:limit],
        "next_cursor": page[limit - 1]["job"] if len(page) > limit else None,
    }


class UsageRoutes:
    def __init__(self, api: ApiLike) -> None:
        self.api = api

    async def get(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.api.area, self.api.tenant(request))
        q = request.query_params
        end = parse_time(q.get("to"), "to", time.time())
        start = parse_time(q.get("from"), "from", 0.0)
        if start > end:
            raise ApiError(400, "bad_request", "from must not be after to", field="from")
        raw = q.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise ApiError(400, "bad_request", "limit must be an integer from 1 to 1000", field="limit")
        found = await asyncio.to_thread(tenant_usage, area, start, end, int(raw), q.get("cursor"))
        return JSONResponse(found)


def routes(api: ApiLike, guard: Callable[[Handler], Handler]) -> list[Route]:
    return [Route("/v1/usage", guard(UsageRoutes(api).get), methods=["GET"])]


__all__ = ["parse_time", "routes", "tenant_usage"]
