"""A job's server-sent events (``GET /v1/jobs/{id}/events``): ``chunk``, ``progress`` and ``end``,
read from the run folder every 500 ms, resumable on any replica.

The API keeps no state, so an event's ``id`` carries what the client has been sent so far: a
sequence number (strictly increasing along the stream, and continued by a resumed one), a digest of
the last status object sent, whether ``end`` was sent, and each chunk's *step* as last sent (its
attempt and how far that attempt got, from the run folder's chunk records). A reconnect with
``Last-Event-ID`` (a browser's EventSource sends it by itself) decodes that and sends only what
differs from it now: each chunk whose step moved, the status object if it changed, then the rest of
the stream. The id is opaque to clients (compressed, so a job of thousands of chunks keeps it short).

Proxies and load balancers cut a connection that stays quiet (often after 60 s), and a long chunk
sends nothing for minutes: a comment line keeps the stream alive every ``KEEPALIVE`` seconds of
quiet. ``retry:`` at the start sets the browser's reconnection delay.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import os
import sys
import time
import zlib
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from contract.paths import user_text
from controller.api.area import Area
from controller.api.errors import ApiError
from controller.api.views import job_view
from controller.config import Config
from controller.errors import FfswarmError
from controller.run import history, status
from controller.run.fold import Fold
from controller.run.rundir import RunDir

EVENT_INTERVAL = 0.5  # the run folder is looked at every 500 ms: progress at most that often
KEEPALIVE = 15.0  # seconds of quiet before a comment line; read at each stream's start (tests lower it)
RETRY_MS = 3000  # the reconnection delay a client is told
ENDED = ("finished", "cancelled", "refused", "stopped")  # phases that end the stream
MAX_MESSAGE = 4096
MAX_ID = 65536  # characters of a Last-Event-ID read at most
_MAX_DECODED = 4 * 1024**2  # bytes an id may inflate to (a job of two million chunks fits)
MAX_STEP = 0xFFFF  # a step is kept in two bytes: attempt 13106 and beyond read alike
_VERSION = 1
_DIGEST = 8
_RANKS = {"started": 1, "running": 2, "retrying": 3}  # any other state (done, failed, cancelled): 4
_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}  # nginx: pass each event on at once


def _reason(config: Config, area: Area, text: str) -> str:
    """A reason as the report words it for the tenant: paths relative to its area, none of this host's."""
    return user_text(text, str(config.data_root)).replace(area.rel + "/", "")[:MAX_MESSAGE]


def _chunk_event(
    config: Config, area: Area, cid: str, rec: dict[str, Any], fold: Fold, items: tuple[str, ...]
) -> dict[str, Any] | None:
    """One chunk as a ``chunk`` event says it; None while it waits for its first attempt."""
    atts = rec["attempts"]
    last = atts[-1] if atts else None
    state, reason = rec["state"], rec["reason"]
    if state == "queued":  # queued again after an attempt that failed: waiting for its retry
        if last is None or last.get("outcome") in ("running", "done", None):
            return None
        state, reason = "retrying", last.get("reason")
    elif state == "running":  # placed on a node once its task is scheduled
        state = "running" if last is not None and last.get("node") else "started"
    elif state == "unknown":  # a runner's attempt record with no ending yet (a rendered stack's chunk)
        state = "running"
    event: dict[str, Any] = {"chunk": cid, "state": state, "attempt": last["attempt"] if last else 0}
    if state in ("done", "failed", "cancelled"):  # an item with no result: as the report counts it
        unended = "cancelled" if state == "cancelled" else "error"
        ended = Counter(r.status.value if r is not None else unended for r in (fold.result(i) for i in items))
        event["items"] = {"total": len(items), "ok": ended["ok"], "no_face": ended["no_face"],
                          "failed": ended["error"], "cancelled": ended["cancelled"]}  # fmt: skip
    if reason and state in ("failed", "retrying", "cancelled"):
        event["reason"] = _reason(config, area, reason)
    return event


def chunk_states(config: Config, area: Area, job: str) -> dict[int, dict[str, Any]]:
    """Every chunk of the job that has left the queue, by its place in the plan, as its ``chunk``
    event says it: from state.json as `status` reads it (controller/run/history.py, every run's
    records), and for a chunk no controller recorded there, the report's record of it (a packed
    job's one chunk, whose pack ran it: it shows only at the end)."""
    rundir = RunDir(config.data_root, job)
    if not rundir.exists():
        return {}
    plan = rundir.plan()
    fold = Fold.read(plan, rundir)
    records = history.whole(rundir, fold)
    reported = (rundir.report() or {}).get("chunks")
    for cid, raw in (reported if isinstance(reported, dict) else {}).items():
        rec = history.clean(raw)
        if isinstance(cid, str) and cid not in records and rec is not None:
            records[cid] = rec
    out = {}
    for n, chunk in enumerate(plan.chunks):
        rec = records.get(chunk.id)
        event = _chunk_event(config, area, chunk.id, rec, fold, chunk.items) if rec is not None else None
        if event is not None:
            out[n] = event
    return out


def chunk_step(event: dict[str, Any]) -> int:
    """How far a chunk has got, as a number that grows along its life: its attempt, then how far
    that attempt got (started, running, retrying, ended)."""
    attempt = event["attempt"] if isinstance(event.get("attempt"), int) else 0
    return 5 * attempt + _RANKS.get(event["state"], 4)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()


# --- the position an id carries ---------------------------------------------------------------
_HEADER = 2 + 4 + _DIGEST  # version, ended; the job's digest; the last status object's


@dataclass
class Position:
    """What a client has been sent, as an event id says it: ``steps[n]`` is the step of the plan's
    n-th chunk as last sent (0: none sent), two bytes each, so that a job of thousands of chunks
    costs one small compression per event (runs of equal steps shrink to little)."""

    seq: int = 0  # events sent so far, along every connection of the stream
    progress: bytes = b""  # digest of the last status object sent (empty: none)
    ended: bool = False
    steps: array[int] = field(default_factory=lambda: array("H"))

    def step(self, n: int) -> int:
        return self.steps[n] if n < len(self.steps) else 0

    def sent(self, n: int, value: int) -> None:
        if n >= len(self.steps):
            self.steps.extend(bytes(n + 1 - len(self.steps)))
        self.steps[n] = min(value, MAX_STEP)

    def id(self, job: str) -> str:
        steps = self.steps if sys.byteorder == "little" else array("H", self.steps)
        if steps is not self.steps:
            steps.byteswap()
        head = bytes([_VERSION, int(self.ended)]) + _digest(job)[:4] + self.progress.ljust(_DIGEST, b"\0")
        packed = base64.urlsafe_b64encode(zlib.compress(head + steps.tobytes())).rstrip(b"=").decode()
        return f"{self.seq}.{packed}"

    @classmethod
    def parse(cls, text: str, job: str) -> Position:
        """The position an id of this job's stream says; ValueError when it is not one."""
        seq_text, _, packed = text.partition(".")
        if not seq_text.isdigit() or len(seq_text) > 18 or not packed or len(text) > MAX_ID:
            raise ValueError("not an event id")
        try:
            inflate = zlib.decompressobj()
            body = inflate.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)), _MAX_DECODED)
        except (binascii.Error, zlib.error) as e:
            raise ValueError("not an event id") from e
        if inflate.unconsumed_tail or not inflate.eof or len(body) < _HEADER or (len(body) - _HEADER) % 2:
            raise ValueError("not an event id")
        if body[0] != _VERSION or body[1] not in (0, 1) or body[2:6] != _digest(job)[:4]:
            raise ValueError("not an event id of this job")
        progress = body[6:_HEADER]
        steps = array("H", body[_HEADER:])
        if sys.byteorder != "little":
            steps.byteswap()
        return cls(int(seq_text), b"" if progress == bytes(_DIGEST) else progress, bool(body[1]), steps)


def resumed_from(raw: str | None, job: str) -> Position:
    """Where a client resumes (``Last-Event-ID``, or ``last_event_id`` in the query): the start when
    none is given; 400 naming where it came from when it is no id of this job's stream."""
    if raw is None or not raw.strip():
        return Position()
    try:
        return Position.parse(raw.strip(), job)
    except ValueError:
        raise ApiError(
            400, "bad_request", "Last-Event-ID is not an id this job's event stream sent", field="Last-Event-ID"
        ) from None


# --- the stream -------------------------------------------------------------------------------
def _stamp(path: os.PathLike[str]) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _look(config: Config, area: Area, job: str, before: object) -> tuple[dict[str, Any], object, Any]:
    """The job's status row; its chunks again only when the row or state.json changed since ``before``
    (None: unchanged, or unreadable now)."""
    row = job_view(config, area, job)
    mark = (json.dumps(row, sort_keys=True), _stamp(RunDir(config.data_root, job).layout.state))
    if mark == before:
        return row, mark, None
    try:
        return row, mark, chunk_states(config, area, job)
    except FfswarmError:  # a run-folder file being replaced or odd: looked at again next time
        return row, None, None


def _sse(name: str, data: object, event_id: str) -> bytes:
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(data, sort_keys=True)}\n\n".encode()


class _Stream:
    """One connection's stream from ``at``: the events whose content differs from what was sent."""

    def __init__(self, config: Config, area: Area, job: str, at: Position) -> None:
        self.config, self.area, self.job, self.at = config, area, job, at
        self.seen: dict[int, dict[str, Any]] = {}  # chunks sent on this connection, as sent
        self.mark: object = None

    def look(self) -> list[bytes]:
        """One look at the run folder, and the events it makes (in a worker thread: the ids of a job
        of many chunks take a moment to compress)."""
        row, self.mark, chunks = _look(self.config, self.area, self.job, self.mark)
        return self.due(row, chunks)

    def due(self, row: dict[str, Any], chunks: dict[int, dict[str, Any]] | None) -> list[bytes]:
        """The events a look makes, each with the id of the position after it."""
        out = []
        for n, event in (chunks or {}).items():
            fresh = self.seen.get(n) != event if n in self.seen else self.at.step(n) != min(chunk_step(event), MAX_STEP)
            if fresh:
                self.seen[n] = event
                self.at.sent(n, chunk_step(event))
                out.append(self._event("chunk", event))
        text = json.dumps(row, sort_keys=True)
        if _digest(text) != self.at.progress:
            self.at.progress = _digest(text)
            out.append(self._event("progress", row))
        if row["phase"] in ENDED:
            self.at.ended = True
            out.append(self._event("end", {"job": self.job, "phase": row["phase"], "outcome": status.outcome_of(row)}))
        return out

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        self.at.seq += 1
        return _sse(name, data, self.at.id(self.job))


async def events(
    config: Config,
    area: Area,
    job: str,
    at: Position | None = None,
    poll: float = EVENT_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[bytes]:
    """``retry:``, then every look's events (on connecting, each chunk that has left the queue as it
    is, unless ``at`` says it was sent), a keep-alive comment after ``KEEPALIVE`` s of quiet, and
    ``end`` once the job has ended."""
    keepalive = KEEPALIVE
    stream = _Stream(config, area, job, at or Position())
    yield f"retry: {RETRY_MS}\n\n".encode()
    quiet_since = clock()
    while True:
        out = await asyncio.to_thread(stream.look)
        for event in out:
            yield event
        if stream.at.ended:
            return
        if out:
            quiet_since = clock()
        elif clock() - quiet_since >= keepalive:
            quiet_since = clock()
            yield b": keep-alive\n\n"
        await asyncio.sleep(poll)


def nothing_new(config: Config, area: Area, job: str, at: Position) -> bool:
    """Whether a client that was sent the end has nothing more to get: the job is still over and
    unchanged since (a job handed back by retry runs again, and its stream with it)."""
    stream = _Stream(config, area, job, Position(at.seq, at.progress, False, array("H", at.steps)))
    events = stream.look()
    return len(events) == 1 and stream.at.ended  # only the end again


async def respond(config: Config, area: Area, job: str, request: Request) -> Response:
    """The stream for ``request``, resumed after its ``Last-Event-ID`` (or ``last_event_id`` query,
    for clients without EventSource); 404 before any byte for a job that is not the caller's; 204
    to a client that was sent the end of a job that has not changed since (an EventSource stops
    reconnecting on a 204)."""
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    await asyncio.to_thread(job_view, config, area, job)
    at = resumed_from(raw, job)
    if at.ended and await asyncio.to_thread(nothing_new, config, area, job, at):
        return Response(status_code=204, headers=_HEADERS)
    return StreamingResponse(events(config, area, job, at), media_type="text/event-stream", headers=_HEADERS)
