"""One HTTP exchange with the API, tried again when that is safe.

A request is tried again when the API could not be reached at all (the connection was refused or
timed out while connecting), and when it answered 429 or 503 (it did nothing: over a quota, no
controller serving), waiting as its ``Retry-After`` says. When the connection broke after the request
was sent, or a gateway answered 502/504, the API may have acted on it: such a request is tried again
only when doing it twice is harmless — a GET or DELETE, or a POST carrying an Idempotency-Key
(submit always sends one) — so a retried submit never makes two jobs; a 409
``idempotency_in_progress`` (the earlier try still being handled) is asked again after its
Retry-After. Waits grow from ``backoff``, doubling, each at most ``max_wait`` seconds; the clock and
the sleep are arguments, for tests.
"""

from __future__ import annotations

import contextlib
import email.utils
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from controller.client.errors import ApiError, TransportError

ALWAYS = frozenset({429, 503})  # the API did nothing
IF_IDEMPOTENT = frozenset({502, 504})  # a gateway: the request may have reached the API
SAFE_METHODS = frozenset({"GET", "HEAD", "DELETE"})

# Builds one try's request arguments for httpx (json=, files=, data=, content=); opening files there
# means each try sends them from their start.
Body = Callable[[contextlib.ExitStack], Mapping[str, Any]]


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After in seconds: a number of seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


class Transport:
    """The client's one httpx connection pool, its token and its retry rule."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_wait: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": "ffswarm-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport, follow_redirects=False
        )
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait
        self.sleep = sleep
        self.clock = clock

    def close(self) -> None:
        self.http.close()

    def wait(self, tried: int, hinted: float | None) -> None:
        """The pause before try number ``tried + 1``: the server's hint, else the growing backoff."""
        pause = hinted if hinted is not None else self.backoff * 2**tried
        self.sleep(min(max(pause, 0.0), self.max_wait))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Body | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The answer to one request (read whole); an error answer raises ``ApiError``."""
        with self.exchange(method, path, params=params, body=body, headers=headers, stream=False) as r:
            return r

    @contextlib.contextmanager
    def exchange(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Body | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = True,
        timeout: httpx.Timeout | None = None,
    ) -> Iterator[httpx.Response]:
        """The answer to one request, its body not read yet when ``stream`` (closed on leaving)."""
        idempotent = method in SAFE_METHODS or any(k.lower() == "idempotency-key" for k in headers or {})
        tried = 0
        while True:
            with contextlib.ExitStack() as files:
                kwargs = dict(body(files)) if body is not None else {}
                request = self.http.build_request(
                    method, path, params=params, headers=headers, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kwargs
                )
                try:
                    r = self.http.send(request, stream=stream)
                except httpx.TransportError as e:
                    reached = not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                    if tried >= self.retries or (reached and not idempotent):
                        raise TransportError(f"{method} {path}: {_why(e)}") from None
                    self.wait(tried, None)
                    tried += 1
                    continue
            try:
                status = r.status_code
                again = status in ALWAYS or (status in IF_IDEMPOTENT and idempotent) or _in_progress(r, headers)
                if again and tried < self.retries:
                    self.wait(tried, retry_after(r.headers.get("retry-after"), self.clock()))
                    tried += 1
                    continue
                if status >= 400:
                    raise _error(r)
                yield r
                return
            finally:
                r.close()


def _in_progress(r: httpx.Response, headers: Mapping[str, str] | None) -> bool:
    """A 409 ``idempotency_in_progress``: an earlier try of this very submit is still being handled
    (its connection broke while the API worked on it); its answer comes once it is done."""
    if r.status_code != 409 or not any(k.lower() == "idempotency-key" for k in headers or {}):
        return False
    try:
        r.read()
        body = r.json()
    except (ValueError, httpx.HTTPError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") == "idempotency_in_progress"


def _error(r: httpx.Response) -> ApiError:
    try:
        r.read()
        body = r.json()
    except (ValueError, httpx.HTTPError):  # not JSON, or broken off: named by its status alone
        body = None
    return ApiError.from_body(r.status_code, body, retry_after(r.headers.get("retry-after"), time.time()))


def _why(e: httpx.TransportError) -> str:
    """The kind of failure in words, never a request's content."""
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
        return "the API cannot be reached (connection refused or timed out)"
    if isinstance(e, httpx.TimeoutException):
        return "the API did not answer in time"
    return "the connection to the API broke off"
