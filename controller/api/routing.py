"""The API's routes from the table of operations (controller/api/openapi.py), checked against it at
start; the framework's own refusals (unknown path, wrong method) in the API's one error shape; the
one translation point of every handler's errors (``guard``); a JSON body read within its cap."""

from __future__ import annotations

import json
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from controller.api.errors import ApiError
from controller.api.openapi import OPERATIONS
from controller.errors import volume_full

Handler = Callable[[Request], Awaitable[Response]]
VOLUME_FULL = {"error": {"code": "volume_full", "message": "the shared volume is full; try again later"}}  # + 30 s


def table_routes(handlers: dict[str, Handler]) -> list[Route]:
    """One route per path of the operations that have a handler here, each method to its handler:
    a path asked with another method answers 405 naming every method it takes."""
    left = dict(handlers)
    by_path: dict[str, dict[str, Handler]] = {}
    for op in OPERATIONS:
        if op.id in left:
            by_path.setdefault(op.path, {})[op.method] = left.pop(op.id)
    if left:
        raise ValueError(f"handlers without an operation in controller/api/openapi.py: {sorted(left)}")
    return [Route(path, _by_method(methods), methods=list(methods)) for path, methods in by_path.items()]


def _by_method(methods: dict[str, Handler]) -> Handler:
    async def run(request: Request) -> Response:
        return await methods["GET" if request.method == "HEAD" else request.method](request)

    return run


def check_documented(routes: Sequence[BaseRoute]) -> None:
    """Every route served is an operation of the document and every operation is served (the page's
    static files and the document itself aside): checked at start, so the two cannot drift."""
    served = {(m, r.path) for r in routes if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"}
    served -= {("GET", "/openapi.json"), ("GET", "/static/{name}")}
    documented = {(op.method, op.path) for op in OPERATIONS}
    if served != documented:
        raise ValueError(f"routes and OpenAPI operations differ: {sorted(served ^ documented)}")


async def framework_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, a method the path does not take, …) in the API's error
    shape; an error that escaped every handler (none should) as the 500 the handlers answer."""
    if not isinstance(exc, HTTPException):
        body = {"error": {"code": "internal", "message": "internal error; the API's log has the details"}}
        return JSONResponse(body, status_code=500)
    status, headers = exc.status_code, dict(exc.headers or {})
    if status == 404:
        err = ApiError(404, "not_found", f"no such path: {request.url.path[:200]}")
    elif status == 405:
        allowed = headers.get("Allow", "")
        err = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here; allowed: {allowed}")
    elif status == 413:
        err = ApiError(413, "too_large", "the request is too large")
    else:
        err = ApiError(status, "bad_request" if status == 400 else f"http_{status}", str(exc.detail)[:200])
    return JSONResponse(err.body(), status_code=status, headers=headers)


def guard(handler: Handler, log_: Any) -> Handler:
    """The one translation point: ApiError → its JSON; anything else → a 500 that says nothing more."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        except Exception as e:
            if volume_full(e):  # passes once space is freed: the caller is told to come back
                log_.warning("api_volume_full", path=request.url.path)
                return JSONResponse(VOLUME_FULL, status_code=503, headers={"Retry-After": "30"})
            # The traceback as text, never with local variables (a renderer that shows locals would
            # print the signing key and tokens held by the frames).
            trace = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            log_.error("api_internal_error", path=request.url.path, error=type(e).__name__, trace=trace)
            body = {"error": {"code": "internal", "message": "internal error; the API's log has the details"}}
            return JSONResponse(body, status_code=500)

    return run


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise ApiError(400, "bad_request", "the body is not JSON") from None


async def capped_body(request: Request, cap: int) -> bytes:
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > cap:
            raise ApiError(413, "too_large", f"a JSON job is at most {cap} bytes")
    return bytes(buf)


__all__ = ["capped_body", "check_documented", "framework_error", "guard", "json_body", "media_type", "table_routes"]
