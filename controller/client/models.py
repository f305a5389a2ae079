"""The typed answers of the API, as a program using the client reads them.

Each keeps the fields a caller reads most and the whole answer as ``raw`` (a read-only mapping), so a
field the API adds later is there before this module names it. A field the API does not send (an
older API, or a job that has not got that far) is None: nothing is guessed from other fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Phases after which a job changes no more unless it is retried.
ENDED = frozenset({"finished", "cancelled", "refused"})


def _frozen(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(raw))


def _str(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _int(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Items:
    """How a job's items (photos and videos) stand."""

    total: int
    ok: int
    no_face: int
    failed: int
    cancelled: int
    pending: int

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Items:
        return cls(*(_int(raw, k) for k in ("total", "ok", "no_face", "failed", "cancelled", "pending")))


@dataclass(frozen=True)
class Job:
    """A job's status object (``GET /v1/jobs/{id}``, and each entry of ``GET /v1/jobs``).

    ``phase``: queued, running, stopped, finished, cancelled, refused, unreadable. ``outcome``:
    succeeded, partial, failed, cancelled, or None until the job has ended (and from an API that
    does not say). Times are RFC 3339 UTC strings."""

    id: str
    phase: str | None
    outcome: str | None
    items: Items | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    reason: str | None
    results_url: str | None
    raw: Mapping[str, Any]

    @property
    def ended(self) -> bool:
        """Whether the job has ended (finished, cancelled or refused)."""
        return self.phase in ENDED

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Job:
        items = raw.get("items")
        return cls(
            id=_str(raw, "job") or _str(raw, "id") or "",
            phase=_str(raw, "phase"),
            outcome=_str(raw, "outcome"),
            items=Items.from_raw(items) if isinstance(items, Mapping) else None,
            created_at=_str(raw, "created_at"),
            started_at=_str(raw, "started_at"),
            finished_at=_str(raw, "finished_at"),
            reason=_str(raw, "reason"),
            results_url=_str(raw, "results_url"),
            raw=_frozen(raw),
        )


@dataclass(frozen=True)
class Submitted:
    """A job the API accepted (``POST /v1/jobs`` or ``…/retry``: 202): its id and where to read it.

    ``replayed``: the API answered a request it had already seen (the same Idempotency-Key), so no
    second job was made. ``notes``: what was left out (the API's notes on archive entries that are
    not photos or videos, and the client's on files of a folder it did not send)."""

    id: str
    status_url: str
    events_url: str
    notes: tuple[str, ...]
    replayed: bool
    raw: Mapping[str, Any]

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], replayed: bool = False, notes: tuple[str, ...] = ()) -> Submitted:
        job = _str(raw, "id") or _str(raw, "job") or ""
        listed = raw.get("notes")
        server = tuple(str(n) for n in listed) if isinstance(listed, list) else ()
        return cls(
            id=job,
            status_url=_str(raw, "status_url") or f"/v1/jobs/{job}",
            events_url=_str(raw, "events_url") or f"/v1/jobs/{job}/events",
            notes=notes + server,
            replayed=replayed,
            raw=_frozen(raw),
        )


@dataclass(frozen=True)
class Event:
    """One server-sent event of a job's stream: ``name`` is chunk, progress or end; ``data`` its
    JSON (the text itself when it is not JSON); ``id`` the event's id (None from an API that sends
    none), which ``Last-Event-ID`` resumes after."""

    name: str
    data: Any
    id: str | None


@dataclass(frozen=True)
class Usage:
    """``GET /v1/usage``: what the tenant's jobs that ended in the period used (``usage``: gpu_seconds,
    runner_seconds, items, bytes_in, bytes_out …), over ``jobs`` jobs."""

    tenant: str | None
    jobs: int
    usage: Mapping[str, Any]
    raw: Mapping[str, Any]

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Usage:
        usage = raw.get("usage")
        return cls(_str(raw, "tenant"), _int(raw, "jobs"), _frozen(usage if isinstance(usage, Mapping) else {}),
                   _frozen(raw))  # fmt: skip
