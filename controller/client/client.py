"""``Client``: the ffswarm HTTP API from Python (docs/client.md).

Every call is one request through ``Transport`` (retries: transport.py), answered with a typed value
(models.py) or an ``ApiError``. ``events`` follows a job's server-sent events and reconnects with
``Last-Event-ID`` when the connection drops, so an API that sends event ids continues where the
stream broke; ``wait`` reads the job's status until it has ended.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from controller.client import uploads
from controller.client.errors import ApiError, ClientError, LocalFileError, TransportError
from controller.client.models import Event, Job, Submitted, Usage
from controller.client.sse import Parser
from controller.client.transport import ALWAYS, IF_IDEMPOTENT, Transport, retry_after

PathLike = str | os.PathLike[str]
STREAM_READ = 60.0  # seconds without a byte (event or keep-alive) before an event stream counts as dropped
RECONNECT = 1.0  # seconds before reconnecting, until the stream's `retry:` says otherwise


def _job(job: str) -> str:
    if not job or "/" in job:
        raise ClientError(f"{job!r} is not a job id")
    return f"/v1/jobs/{quote(job, safe='')}"


class Client:
    """A tenant's view of one ffswarm API: ``Client("https://faces.example.com", token)``.

    ``retries``: how often a request is tried again when that is safe (transport.py); ``sleep`` and
    ``clock`` stand in for time in tests; ``transport``: an httpx transport (tests, proxies)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._t = Transport(
            url, token, timeout=timeout, retries=retries, backoff=backoff, sleep=sleep, transport=transport
        )
        self._clock = clock

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    # --- jobs -------------------------------------------------------------------------------------
    def submit(
        self,
        job: Mapping[str, Any] | None = None,
        *,
        source: PathLike | Sequence[PathLike] = (),
        files: Sequence[PathLike] = (),
        options: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Submitted:
        """A new job: ``job`` (job-file fields, paths in the tenant's area) as JSON, or an upload of
        local ``source`` photos and ``files`` (photos, videos, ZIP archives, folders) with ``options``
        (any job-file field but source and targets). One Idempotency-Key (``idempotency_key``, else a
        fresh one) goes with every try, so a retried submit never makes a second job."""
        key = idempotency_key or f"ffswarm-client-{uuid.uuid4().hex}"
        headers = {"Idempotency-Key": key}
        if job is not None:
            if files or source or options:
                raise ClientError("submit takes either job (JSON fields) or source/files/options (an upload)")
            data = dict(job)
            r = self._t.request("POST", "/v1/jobs", body=lambda _: {"json": data}, headers=headers)
            return Submitted.from_raw(r.json(), _replayed(r))
        sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        up = uploads.prepare(sources, list(files), options)
        try:
            r = self._t.request("POST", "/v1/jobs", body=up.body, headers=headers)
        finally:
            up.close()
        return Submitted.from_raw(r.json(), _replayed(r), tuple(up.notes))

    def get(self, job: str) -> Job:
        return Job.from_raw(self._t.request("GET", _job(job)).json())

    def list(
        self,
        *,
        phase: str | None = None,
        outcome: str | None = None,
        created_after: str | None = None,
        limit: int | None = None,
        page_size: int = 50,
    ) -> Iterator[Job]:
        """The tenant's jobs, newest first, page after page (``next_cursor``) until ``limit`` jobs
        (None: all). Filters go to the API and are applied here too, for an API that ignores them;
        an entry that is a bare id (an older API) is read with ``get``."""
        params: dict[str, Any] = {"limit": max(1, min(page_size, limit or page_size, 1000))}
        params.update({k: v for k, v in (("phase", phase), ("outcome", outcome),
                                          ("created_after", created_after)) if v is not None})  # fmt: skip
        given = 0
        while True:
            page = self._t.request("GET", "/v1/jobs", params=params).json()
            for entry in page.get("jobs") or []:
                found = self.get(entry) if isinstance(entry, str) else Job.from_raw(entry)
                if (phase is not None and found.phase != phase) or (outcome is not None and found.outcome != outcome):
                    continue
                yield found
                given += 1
                if limit is not None and given >= limit:
                    return
            cursor = page.get("next_cursor")
            if not isinstance(cursor, str) or not cursor:
                return
            params["cursor"] = cursor

    def report(self, job: str) -> dict[str, Any]:
        """The job's report.json (404 ``no_report`` until its first run has ended)."""
        data: dict[str, Any] = self._t.request("GET", f"{_job(job)}/report").json()
        return data

    def cancel(self, job: str) -> dict[str, Any]:
        data: dict[str, Any] = self._t.request("POST", f"{_job(job)}/cancel").json()
        return data

    def retry(self, job: str) -> Submitted:
        """The job's failed, cancelled and remaining items run again (committed ones never)."""
        r = self._t.request("POST", f"{_job(job)}/retry")
        return Submitted.from_raw(r.json())

    def scale(self, job: str, max_concurrent: int) -> dict[str, Any]:
        body = {"max_concurrent": max_concurrent}
        data: dict[str, Any] = self._t.request("POST", f"{_job(job)}/scale", body=lambda _: {"json": body}).json()
        return data

    def delete(self, job: str) -> None:
        """A finished job's files, outputs and records removed (409 ``not_finished`` while it runs)."""
        self._t.request("DELETE", _job(job))

    def usage(self, start: str | int | None = None, end: str | int | None = None) -> Usage:
        """What the tenant's jobs that ended in [start, end) used: unix seconds, a date or an ISO time."""
        params = {k: str(v) for k, v in (("from", start), ("to", end)) if v is not None}
        return Usage.from_raw(self._t.request("GET", "/v1/usage", params=params).json())

    def results(self, job: str, path: PathLike) -> Path:
        """results.zip (the job's committed outputs) written to ``path``: to a temporary name in the
        same folder first, renamed into place once whole; a download that breaks off starts again.
        A place that cannot be written is a ``LocalFileError``."""
        target = Path(path).expanduser()
        part = target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:8]}")
        tries = 0
        try:
            with part.open("wb") as out:  # before asking: a place that cannot be written costs no download
                while True:
                    out.seek(0)
                    out.truncate()
                    try:
                        with self._t.exchange("GET", f"{_job(job)}/results.zip") as r:
                            for chunk in r.iter_bytes():
                                out.write(chunk)
                        break
                    except httpx.TransportError:  # the body broke off: the whole ZIP again
                        if tries >= self._t.retries:
                            raise TransportError(
                                f"GET {_job(job)}/results.zip: the download kept breaking off"
                            ) from None
                        self._t.wait(tries, None)
                        tries += 1
            os.replace(part, target)
        except OSError as e:  # the place to write it: a missing folder, no permission, a full disk
            raise LocalFileError(f"cannot write {str(target)!r} ({e.strerror})") from None
        finally:
            part.unlink(missing_ok=True)
        return target

    # --- following a job --------------------------------------------------------------------------
    def events(self, job: str, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events (chunk, progress, end) until ``end``. A dropped connection (no byte for
        STREAM_READ seconds, a keep-alive included) is reconnected after the stream's ``retry:``
        delay with ``Last-Event-ID``; after ``retries`` reconnects in a row that bring no event,
        ``TransportError``."""
        parser = Parser(last_id=last_event_id)
        path = f"{_job(job)}/events"
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if parser.last_id is not None:
                headers["Last-Event-ID"] = parser.last_id
            hinted: float | None = None
            try:
                timeout = httpx.Timeout(self._t.http.timeout.connect, read=STREAM_READ, write=30.0, pool=30.0)
                with self._stream(path, headers, timeout) as r:
                    for line in r.iter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        yield event
                        if event.name == "end":
                            return
            except httpx.TransportError:
                pass  # dropped: reconnected below
            except ApiError as e:
                if e.status not in ALWAYS | IF_IDEMPOTENT:
                    raise
                hinted = e.retry_after
            if failures >= self._t.retries:
                raise TransportError(f"GET {path}: the event stream kept breaking off")
            self._t.sleep(hinted if hinted is not None else (parser.retry_ms or RECONNECT * 1000) / 1000)
            failures += 1

    @contextlib.contextmanager
    def _stream(self, path: str, headers: Mapping[str, str], timeout: httpx.Timeout) -> Iterator[httpx.Response]:
        """One connection to an event stream (an error answer raised as ApiError, none retried here)."""
        request = self._t.http.build_request("GET", path, headers=headers, timeout=timeout)
        r = self._t.http.send(request, stream=True)
        try:
            if r.status_code >= 400:
                r.read()
                try:
                    body = r.json()
                except ValueError:
                    body = None
                raise ApiError.from_body(r.status_code, body, retry_after(r.headers.get("retry-after"), time.time()))
            yield r
        finally:
            r.close()

    def wait(self, job: str, timeout: float | None = None, poll: float = 2.0) -> Job:
        """The job's status once it has ended (finished, cancelled, refused), read every ``poll``
        seconds; ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        start = self._clock()
        while True:
            found = self.get(job)
            if found.ended:
                return found
            left = None if timeout is None else timeout - (self._clock() - start)
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job} has not ended after {timeout} s (phase {found.phase})")
            self._t.sleep(poll if left is None else min(poll, left))


def _replayed(r: httpx.Response) -> bool:
    return str(r.headers.get("idempotent-replayed", "")).lower() == "true"
