"""``Prefer: wait=N`` on POST /v1/jobs: a job that ends within N seconds is answered in one call.

After the job is accepted, the request waits (asynchronously: no thread is held between looks)
until the job has an outcome or N seconds have passed; then 200 with the final status object and
``Preference-Applied: wait=N``, else the usual 202. Each look stats the few files whose change can
end a job (the report, the control file, the lease, the inbox's refusal, the owner record), and the
status is computed again only when one of them changed (and every ``REFRESH`` seconds in any case).
A Prefer header without a valid ``wait`` (0 < N ≤ 60, whole seconds) is ignored, as RFC 7240 says.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

from contract.layout import DataRootLayout, RunLayout
from controller.api.area import JOB_ID, Area

MAX_WAIT = 60
POLL = 0.25  # seconds between looks at the files
REFRESH = 5.0  # the status computed again at least this often (a lease that expired changes no file)

Look = Callable[[str], Awaitable[dict[str, Any]]]


def preference(values: Iterable[str]) -> int | None:
    """The seconds a ``Prefer`` header's ``wait`` asks for (its first ``wait``), or None."""
    for value in values:
        for pref in value.split(","):
            name, _, raw = pref.split(";", 1)[0].partition("=")
            if name.strip().lower() != "wait":
                continue
            raw = raw.strip().strip('"')
            return int(raw) if raw.isdigit() and 0 < int(raw) <= MAX_WAIT else None
    return None


def marks(area: Area, job: str) -> tuple[tuple[int, int, int] | None, ...]:
    """What the files that change when a job ends look like now (inode, size, mtime; None: absent)."""
    if not JOB_ID.fullmatch(job):
        return ()
    run = RunLayout.host(area.root, job)
    box = DataRootLayout.host(area.root).inbox
    paths = (run.report, run.control, run.lease, box / f"{job}.yaml", box / "failed" / f"{job}.yaml",
             area.records / f"{job}.json")  # fmt: skip
    return tuple(_stamp(p) for p in paths)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


async def until_ended(
    answer: Response,
    seconds: int,
    area: Area,
    look: Look,
    clock: Callable[[], float] = time.monotonic,
    poll: float = POLL,
) -> Response:
    """``answer`` (a 202 accepting a job), or 200 with the job's status once it has an outcome
    within ``seconds``; ``look`` gives the status object as GET /v1/jobs/{job} does."""
    if answer.status_code != 202:
        return answer
    job = json.loads(bytes(answer.body))["id"]
    deadline = clock() + seconds
    before: object = None
    looked = -REFRESH
    while True:
        now = await asyncio.to_thread(marks, area, job)
        if now != before or clock() - looked >= REFRESH:
            before, looked = now, clock()
            row = await look(job)
            if row.get("outcome") is not None:
                headers = {"Preference-Applied": f"wait={seconds}", "Location": f"/v1/jobs/{job}"}
                return JSONResponse(row, status_code=200, headers=headers)
        left = deadline - clock()
        if left <= 0:
            return answer
        await asyncio.sleep(min(poll, left))
