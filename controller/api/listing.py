"""GET /v1/jobs: the tenant's jobs as status objects, newest first, a page at a time.

Pages come from the tenant's job index (controller/job/index.py), read from its newest end, so a
page costs the status reads of the jobs it looks at, never the tenant's whole history. The cursor is
the index entry of the last job looked at. Filters on ``phase`` and ``outcome`` need each job's
status, so a page looks at no more than ``max(limit, SCAN)`` jobs: filtered (or with jobs deleted
meanwhile) it may hold fewer than ``limit``, even none, with a ``next_cursor`` to go on from;
``next_cursor`` null is the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from controller.api import views
from controller.api.area import Area
from controller.api.errors import ApiError
from controller.config import Config
from controller.job.index import KEY, job_of, time_key
from controller.run.status import OUTCOMES

PHASES = ("queued", "running", "stopped", "finished", "cancelled", "refused", "unreadable")
SCAN = 200  # jobs a filtered page looks at, at least
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


class Query:
    """The list's query, checked: every field that is wrong named at once (400)."""

    def __init__(self, params: Mapping[str, str]) -> None:
        errors: list[tuple[str, str]] = []
        raw = params.get("limit", str(DEFAULT_LIMIT))
        self.limit = int(raw) if raw.isdigit() and 1 <= int(raw) <= MAX_LIMIT else 0
        if not self.limit:
            errors.append(("limit", f"limit must be an integer from 1 to {MAX_LIMIT}"))
        self.cursor = params.get("cursor") or None
        if self.cursor is not None and not KEY.fullmatch(self.cursor):
            errors.append(("cursor", "cursor must be a next_cursor this list returned"))
        self.phase = params.get("phase") or None
        if self.phase is not None and self.phase not in PHASES:
            errors.append(("phase", f"phase must be one of {', '.join(PHASES)}"))
        self.outcome = params.get("outcome") or None
        if self.outcome is not None and self.outcome not in OUTCOMES:
            errors.append(("outcome", f"outcome must be one of {', '.join(OUTCOMES)}"))
        self.after = _after(params.get("created_after"), errors)
        if errors:
            field, message = errors[0]
            text = "; ".join(m for _, m in errors)
            raise ApiError(400, "bad_request", text, field=field, errors=errors)

    def wants(self, row: Mapping[str, Any]) -> bool:
        return (self.phase is None or row.get("phase") == self.phase) and (
            self.outcome is None or row.get("outcome") == self.outcome
        )


def _after(raw: str | None, errors: list[tuple[str, str]]) -> str | None:
    """``created_after`` as the index's time prefix; None when not given."""
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        errors.append(("created_after", "created_after must be an RFC 3339 time with an offset: 2026-12-02T07:41:03Z"))
        return None
    return time_key(when.timestamp())


def list_page(config: Config, area: Area, query: Query) -> dict[str, Any]:
    """One page of the tenant's jobs (see the module's docstring)."""
    budget = max(query.limit, SCAN)  # jobs looked at, those filtered out or deleted meanwhile included
    jobs: list[dict[str, Any]] = []
    last: str | None = None
    entries = area.indexed().newest(query.cursor)
    for key in entries:
        if query.after is not None and key[: len(query.after)] <= query.after:
            return {"jobs": jobs, "next_cursor": None}  # older ones follow: none was created after
        if len(jobs) == query.limit or budget == 0:
            return {"jobs": jobs, "next_cursor": last}  # there is more
        budget -= 1
        last = key
        row = _row(config, area, key)
        if row is not None and query.wants(row):
            jobs.append(row)
    return {"jobs": jobs, "next_cursor": None}


def _row(config: Config, area: Area, key: str) -> dict[str, Any] | None:
    """The entry's status object; None for a job deleted meanwhile (its entry is removed)."""
    job = job_of(key)
    try:
        return views.job_view(config, area, job)
    except ApiError:
        if area.record(job) is None:  # the record is gone: a deletion cut short left the entry
            area.index.remove_key(key)
        return None
