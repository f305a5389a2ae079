"""Per-tenant fairness at the API's door: a request rate and a cap on requests in flight.

One tenant flooding the API must not slow another's answers, so every request that carries a
tenant's credentials is admitted (or not) before its handler runs, and so before its body is read:

- ``quota.requests_per_second``: a token bucket per tenant, refilled at that rate and holding at most
  one second's worth (at least one request), so short bursts pass and a flood is cut to the rate;
- ``quota.requests_in_flight``: requests of the tenant being handled at once (until the handler has
  its answer; a download or event stream already being sent does not count).

A refused request is 429 ``rate_limited`` with ``Retry-After`` and the ``RateLimit-Limit``,
``RateLimit-Remaining`` and ``RateLimit-Reset`` headers (IETF httpapi-ratelimit-headers draft);
admitted answers carry the three RateLimit headers too. The buckets live in this API process: with
several replicas, or several workers of one (``ffswarm api --workers``), each applies the limits to the
requests it receives.

Requests without credentials, or whose credentials do not name a tenant, pass untouched: their
handler answers them (401, a signed link, /healthz).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from controller.api.auth import Authenticator
from controller.api.errors import ApiError
from controller.apiconfig import Tenant

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class _Bucket:
    tokens: float
    at: float
    in_flight: int = 0


class Fairness:
    """The tenants' buckets in this process (thread-safe); ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, tenant: Tenant) -> dict[str, str]:
        """One request of ``tenant`` admitted (call ``done`` when its handler has answered): the
        RateLimit headers for its answer; 429 ``rate_limited`` when over either limit."""
        rate, cap = _rate(tenant)
        most = tenant.quota.requests_in_flight
        with self._lock:
            b = self._fill(tenant.name, rate, cap)
            if b.in_flight >= most:
                raise ApiError(
                    429, "rate_limited",
                    f"{most} requests of this tenant are being handled already (quota.requests_in_flight); "
                    "try again when one has finished",
                    headers={"Retry-After": "1", **_headers(b, rate, cap)},
                )  # fmt: skip
            if b.tokens < 1:
                wait = max(1, math.ceil((1 - b.tokens) / rate))
                raise ApiError(
                    429, "rate_limited",
                    f"this tenant may make {rate:g} requests a second (quota.requests_per_second); "
                    f"try again in {wait} s",
                    headers={"Retry-After": str(wait), **_headers(b, rate, cap)},
                )  # fmt: skip
            b.tokens -= 1
            b.in_flight += 1
            return _headers(b, rate, cap)

    def done(self, tenant: Tenant) -> None:
        with self._lock:
            b = self._buckets.get(tenant.name)
            if b is not None:
                b.in_flight = max(b.in_flight - 1, 0)

    def _fill(self, name: str, rate: float, cap: float) -> _Bucket:
        now = self.clock()
        b = self._buckets.get(name)
        if b is None:
            b = self._buckets[name] = _Bucket(cap, now)
        b.tokens = min(cap, b.tokens + max(now - b.at, 0.0) * rate)
        b.at = now
        return b

    def wrap(self, handler: Handler, auth: Authenticator) -> Handler:
        """``handler`` behind the tenant's limits; the tenant found is kept in ``request.state.tenant``
        so the handler does not check the credentials a second time."""

        async def run(request: Request) -> Response:
            header = request.headers.get("authorization")
            if not header:
                return await handler(request)
            try:
                tenant = auth.tenant(header)
            except ApiError:  # not a tenant's: the handler answers it (401, a metrics token)
                return await handler(request)
            request.state.tenant = tenant
            headers = self.admit(tenant)
            try:
                response = await handler(request)
            finally:
                self.done(tenant)
            response.headers.update(headers)
            return response

        return run


def _rate(tenant: Tenant) -> tuple[float, float]:
    """(tokens a second, the bucket's size: one second's worth, at least one request)."""
    rate = tenant.quota.requests_per_second
    return rate, max(rate, 1.0)


def _headers(b: _Bucket, rate: float, cap: float) -> dict[str, str]:
    return {
        "RateLimit-Limit": str(math.floor(cap)),
        "RateLimit-Remaining": str(max(math.floor(b.tokens), 0)),
        "RateLimit-Reset": str(math.ceil((cap - b.tokens) / rate)),  # seconds until the bucket is full
    }
