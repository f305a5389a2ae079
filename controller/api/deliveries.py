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
import copy
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.api.page import ApiLike
from controller.job.settings import WEBHOOK_EVENTS
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


# -- the OpenAPI entries (merged into /openapi.json like controller/api/usage.py's) -----------------------
_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_TIME = {"type": "string", "format": "date-time", "example": "2026-12-02T07:41:03Z"}
ATTEMPT_SCHEMA = {
    "type": "object",
    "required": ["at"],
    "properties": {
        "at": _TIME,
        "status": {"type": "integer", "minimum": 100, "maximum": 599, "description": "the receiver's HTTP status"},
        "error": {
            "type": "string",
            "description": "why no status was read: the error's class, e.g. ConnectionRefusedError",
        },
    },
}
DELIVERY_SCHEMA = {
    "type": "object",
    "required": ["id", "type", "created_at", "state", "next_attempt_at", "attempts"],
    "properties": {
        "id": {"type": "string", "pattern": "^msg_[0-9a-f]{32}$", "description": "webhook-id, the same on every try"},
        "type": {"type": "string", "enum": list(WEBHOOK_EVENTS)},
        "created_at": _TIME,
        "state": {"type": "string", "enum": ["pending", "delivered", "failed"]},
        "next_attempt_at": {**_TIME, "type": ["string", "null"]},
        "attempts": {"type": "array", "items": ATTEMPT_SCHEMA},
    },
}
_EXAMPLE = {
    "id": "msg_3f1c0a9e5b7d4c2a8e6f1b0d9c7a5e3f",
    "type": "job.finished",
    "created_at": "2026-12-02T07:41:03Z",
    "state": "pending",
    "next_attempt_at": "2026-12-02T07:43:38Z",
    "attempts": [{"at": "2026-12-02T07:41:03Z", "error": "ConnectionRefusedError"},
                 {"at": "2026-12-02T07:41:38Z", "status": 503}],
}  # fmt: skip
_JOB = {"name": "job", "in": "path", "required": True, "schema": {"type": "string"}}
_DELIVERY = {"name": "delivery", "in": "path", "required": True, "schema": {"type": "string"}}


def paths() -> dict[str, Any]:
    listed = {
        "type": "object",
        "required": ["job", "deliveries"],
        "properties": {"job": {"type": "string"}, "deliveries": {"type": "array", "items": DELIVERY_SCHEMA}},
    }
    return {
        "/v1/jobs/{job}/deliveries": {
            "get": {
                "operationId": "listJobDeliveries",
                "tags": ["webhooks"],
                "summary": "The job's webhook deliveries, oldest first, with every attempt",
                "parameters": [_JOB],
                "responses": {
                    "200": {
                        "description": "ok",
                        "content": {
                            "application/json": {
                                "schema": listed,
                                "example": {"job": "party-k3j5x2ma", "deliveries": [_EXAMPLE]},
                            }
                        },
                    },
                    **{str(c): _ERR for c in (401, 404)},
                },
            }
        },
        "/v1/jobs/{job}/deliveries/{delivery}/redeliver": {
            "post": {
                "operationId": "redeliverJobDelivery",
                "tags": ["webhooks"],
                "summary": "Queue a delivery again under the same id; serve sends it",
                "parameters": [_JOB, _DELIVERY],
                "responses": {
                    "202": {
                        "description": "queued again",
                        "content": {"application/json": {"schema": DELIVERY_SCHEMA, "example": _EXAMPLE}},
                    },
                    **{str(c): _ERR for c in (401, 404, 409)},
                },
            }
        },
    }


def extend(document: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    doc["paths"].update(paths())
    return doc


def with_paths(openapi: Handler) -> Handler:
    """The /openapi.json handler with this module's paths added to the document it answers."""

    async def run(request: Request) -> Response:
        answer = await openapi(request)
        if answer.status_code != 200:
            return answer
        return JSONResponse(extend(json.loads(bytes(answer.body))))

    return run
