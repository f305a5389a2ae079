"""The API's own Prometheus metrics at ``GET /metrics`` (docs/api.md#usage-and-metrics).

A pure ASGI middleware counts every request by its route *template* (``/v1/jobs/{job}``, never the
path with its ids: one series per route, however many jobs there are), method and status code,
times it up to its response's headers (a stream's length is the caller's, not the API's), and for
``POST /v1/jobs`` counts the body bytes received and the jobs accepted, by tenant.

``/metrics`` names tenants, so it is not public: it answers only a bearer token whose sha256 is in
``api.metrics_token_sha256`` (a tenant's key is not one), and is off (404) while none is configured.
Each ApiMetrics owns its registry (no process-global state): apps made in one process stay apart.
With ``ffswarm api --workers N`` the counters live in a folder the workers share and ``/metrics``
answers their sums, whichever worker serves it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.api.auth import Authenticator
from controller.api.errors import ApiError, unauthorized

Handler = Callable[[Request], Awaitable[Response]]
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # any path no route serves: one series, not one per path a scanner tries
SUBMIT = "/v1/jobs"


class ApiMetrics:
    def __init__(self, auth: Authenticator, token_digests: Sequence[str]) -> None:
        self.auth = auth
        self.digests = tuple(bytes.fromhex(d) for d in token_digests)
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "ffswarm_api_requests", "Requests by route template, method and status code", ["route", "method", "code"],
            registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "ffswarm_api_request_seconds", "Seconds until a request's response headers, by route template",
            ["route", "method"], buckets=SECONDS_BUCKETS, registry=r,
        )  # fmt: skip
        self.upload_bytes = Counter(
            "ffswarm_api_upload_bytes", "Body bytes received by POST /v1/jobs, by tenant and outcome",
            ["tenant", "outcome"], registry=r,
        )  # fmt: skip
        self.jobs_accepted = Counter(
            "ffswarm_api_jobs_accepted", "Jobs accepted (202) by POST /v1/jobs, by tenant", ["tenant"], registry=r
        )

    @staticmethod
    def template(scope: Scope) -> str:
        """The template of the app's route that serves the request (a wrong method included)."""
        routes: list[BaseRoute] = getattr(scope.get("app"), "routes", [])
        for route in routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE and isinstance(route, Route):
                return route.path
        return UNMATCHED

    def middleware(self) -> Middleware:
        """The middleware for ``Starlette(middleware=[…])``: labels requests by the app's routes."""
        return Middleware(MetricsMiddleware, metrics=self)

    def route(self, guard: Callable[[Handler], Handler]) -> Route:
        return Route("/metrics", guard(self.exposition), methods=["GET"])

    async def exposition(self, request: Request) -> Response:
        if not self.digests:
            raise ApiError(404, "metrics_off", "metrics are off on this API (no api.metrics_token_sha256)")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        matched = False
        for d in self.digests:  # every digest compared: the time taken says nothing about which
            matched |= hmac.compare_digest(d, digest)
        if scheme.lower() != "bearer" or not token.strip() or not matched:
            raise unauthorized("GET /metrics takes a metrics token (api.metrics_token_sha256)")
        return Response(generate_latest(self.exposed()), media_type=CONTENT_TYPE_LATEST)

    def exposed(self) -> CollectorRegistry:
        """This process's registry; with several workers (PROMETHEUS_MULTIPROC_DIR set, see
        controller/api/workers.py), every worker's counters summed from that folder."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return self.registry
        summed = CollectorRegistry()
        MultiProcessCollector(summed)  # type: ignore[no-untyped-call]
        return summed

    def count_upload(self, scope: Scope, received: int, code: int) -> None:
        """A submission's bytes and acceptance under its tenant; nothing for an unknown caller."""
        header = dict(scope.get("headers") or []).get(b"authorization")
        try:
            tenant = self.auth.tenant(header.decode("latin-1") if header is not None else None)
        except ApiError:
            return
        self.upload_bytes.labels(tenant.name, "accepted" if code == 202 else "refused").inc(received)
        if code == 202:
            self.jobs_accepted.labels(tenant.name).inc()


class MetricsMiddleware:
    """Pure ASGI: the request's body and the response pass through untouched, only counted."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.m = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.m.template(scope)
        method = scope["method"] if scope["method"] in METHODS else "other"
        started = time.perf_counter()
        seen: dict[str, Any] = {"bytes": 0, "code": 500, "timed": False}

        async def counted_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
            return message

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not seen["timed"]:
                seen["code"], seen["timed"] = int(message["status"]), True
                self.m.seconds.labels(route, method).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, counted_receive, timed_send)
        finally:
            if not seen["timed"]:  # no response started: an exception the server answers with 500
                self.m.seconds.labels(route, method).observe(time.perf_counter() - started)
            self.m.requests.labels(route, method, str(seen["code"])).inc()
            if route == SUBMIT and method == "POST":
                self.m.count_upload(scope, seen["bytes"], seen["code"])


__all__ = ["ApiMetrics", "MetricsMiddleware"]
