"""A job's webhook deliveries: ``GET /v1/jobs/{job}/deliveries`` and
``POST /v1/jobs/{job}/deliveries/{delivery}/redeliver`` (docs/api.md#webhooks).

Read from and written to the job's outbox on the volume (controller/run/outbox.py), like everything
else the API answers. The caller's own jobs only: another tenant's job reads as one that does not
exist. A delivery is shown without its URL or body (the URL may carry a token; the body is the
status the caller can read anyway). A redelivery keeps the delivery's id, so a receiver that already
has it can tell; `serve`'s deliverer sends it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.api.page import ApiLike
from controller.run import webhooks
from controller.run.outbox import DELIVERY_ID, OutboxError

Handler = Callable[[Request], Awaitable[Response]]


def _no_delivery(job: str, delivery: str) -> ApiError:
    return ApiError(404, "not_found", f"job {job!r} has no delivery {delivery!r}")


class DeliveryRoutes:
    def __init__(self, api: ApiLike) -> None:
        self.api = api

    def listed(self, area: Area, job: str) -> dict[str, Any]:
        if area.owns(job) is None:
            raise not_found(job)
        found = webhooks.outbox(self.api.config).deliveries(job)
        return {"job": job, "deliveries": [d.view() for d in found]}

    def queued_again(self, area: Area, job: str, delivery: str) -> dict[str, Any]:
        if area.owns(job) is None:
            raise not_found(job)
        if not DELIVERY_ID.fullmatch(delivery):
            raise _no_delivery(job, delivery[:40])
        try:
            d = webhooks.outbox(self.api.config).redeliver(job, delivery)
        except OutboxError:
            raise ApiError(409, "unreadable", f"delivery {delivery} of job {job!r} cannot be read") from None
        if d is None:
            raise _no_delivery(job, delivery)
        return d.view()

    async def list(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.api.area, self.api.tenant(request))
        return JSONResponse(await asyncio.to_thread(self.listed, area, request.path_params["job"]))

    async def redeliver(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.api.area, self.api.tenant(request))
        p = request.path_params
        out = await asyncio.to_thread(self.queued_again, area, p["job"], p["delivery"])
        return JSONResponse(out, status_code=202)


def routes(api: ApiLike, guard: Callable[[Handler], Handler]) -> list[Route]:
    r = DeliveryRoutes(api)
    return [
        Route("/v1/jobs/{job}/deliveries", guard(r.list), methods=["GET"]),
        Route("/v1/jobs/{job}/deliveries/{delivery}/redeliver", guard(r.redeliver), methods=["POST"]),
    ]
