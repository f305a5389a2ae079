"""The API's routes from the table of operations (controller/api/openapi.py), checked against it at
start, and the framework's own refusals (unknown path, wrong method) in the API's one error shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from controller.api.errors import ApiError
from controller.api.openapi import OPERATIONS

Handler = Callable[[Request], Awaitable[Response]]


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


__all__ = ["check_documented", "framework_error", "table_routes"]
