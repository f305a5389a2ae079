"""The web status page at ``/`` and the routes it needs beside the API's own (docs/api.md#web-page).

The page is three static files (controller/api/static/: HTML, CSS, JS; no CDN, no build step) served
by the API itself under a strict Content-Security-Policy. It signs in with a tenant's token, kept in
the tab's sessionStorage and sent as ``Authorization: Bearer`` on every fetch.

EventSource cannot send that header, and a token must never travel in a URL (proxy and browser logs
keep URLs). So the page asks ``POST /v1/jobs/{id}/events-link`` (with its token) for a signed events
URL (controller/run/links.py, the same HMAC as download links) valid for a few minutes and only for
that job's events; the events route accepts such a URL instead of a token. A stream once open runs to
the job's end; a browser reconnecting after the link expired gets 403 and the page asks for a new one.

Item files (``GET /v1/jobs/{id}/items/{item}/input|output[?thumb=N]``) take a token or a signed link.
They are served with ``Content-Security-Policy: sandbox`` and ``nosniff`` and typed only by their
sniffed first bytes, so a hostile file on the volume cannot run as a page of this origin.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from controller.api import items, thumbs
from controller.api.area import Area
from controller.api.errors import ApiError, not_found
from controller.api.slow import Lane, Lent, SlowWork
from controller.apiconfig import Tenant
from controller.config import Config

Handler = Callable[[Request], Awaitable[Response]]
EVENTS_LINK_TTL = 300  # seconds: long enough to connect (and reconnect), short enough to be useless later
THUMB_MIN, THUMB_MAX = 32, 1024
THUMBS_AT_ONCE = 2  # decodes in flight: each may hold up to thumbs.MAX_PIXELS × 3 bytes
STATIC = Path(__file__).parent / "static"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
FILE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "private, max-age=60",
}


class ApiLike(Protocol):
    """What the page needs of controller/api/app.py's Api (a protocol: no import cycle)."""

    config: Config
    slow: SlowWork  # thumbnails and file downloads run in the owner's share of it

    def area(self, tenant: Tenant) -> Area: ...

    def tenant(self, request: Request) -> Tenant: ...

    def link_area(self, request: Request, job: str) -> Area: ...

    def sign_link(self, area: Area, path: str, job: str, ttl: int) -> str | None: ...


async def caller_area(api: ApiLike, request: Request, job: str) -> Area:
    """The area whose job is asked for: the caller's (a token), or, for a URL carrying
    ``expires`` and ``sig``, the job owner's once the signature over this very path checks out."""
    q = request.query_params
    if "sig" in q or "expires" in q:
        return await asyncio.to_thread(api.link_area, request, job)
    return await asyncio.to_thread(api.area, api.tenant(request))


def _thumb_size(raw: str | None) -> int | None:
    """``thumb`` absent: the file itself; ``1``: the default size; else the longer side in pixels."""
    if raw is None:
        return None
    if raw.isdigit() and (int(raw) == 1 or THUMB_MIN <= int(raw) <= THUMB_MAX):
        return thumbs.DEFAULT_SIZE if int(raw) == 1 else int(raw)
    raise ApiError(400, "bad_request", f"thumb is 1 or a size from {THUMB_MIN} to {THUMB_MAX}", field="thumb")


class Page:
    def __init__(self, api: ApiLike) -> None:
        self.api = api
        self.files = {name: (STATIC / name).read_bytes() for name in FILES}
        self.decoding = asyncio.Semaphore(THUMBS_AT_ONCE)

    async def index(self, request: Request) -> Response:
        return self._static("index.html")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES:
            raise ApiError(404, "not_found", "no such file")
        return self._static(name)

    def _static(self, name: str) -> Response:
        headers = {
            "Content-Security-Policy": PAGE_CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        }
        return Response(self.files[name], media_type=FILES[name], headers=headers)

    async def events_link(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.api.area, self.api.tenant(request))
        job = request.path_params["job"]
        if await asyncio.to_thread(area.owns, job) is None:
            raise not_found(job)
        url = await asyncio.to_thread(self.api.sign_link, area, f"/v1/jobs/{job}/events", job, EVENTS_LINK_TTL)
        if url is None:
            raise ApiError(409, "links_off", "signed links are off on this API (no api.signing_key_file)")
        expires = int(url.split("expires=", 1)[1].split("&", 1)[0])
        return JSONResponse({"url": url, "expires": expires}, headers={"Cache-Control": "no-store"})

    async def list_items(self, request: Request) -> Response:
        area = await asyncio.to_thread(self.api.area, self.api.tenant(request))
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise ApiError(400, "bad_request", "limit must be an integer from 1 to 1000", field="limit")
        cursor = request.query_params.get("cursor")
        status = request.query_params.get("status")
        if status is not None and status not in items.STATUSES:
            raise ApiError(400, "bad_request", f"status is one of {', '.join(items.STATUSES)}", field="status")
        job = request.path_params["job"]
        found = await asyncio.to_thread(items.list_items, self.api.config, area, job, int(raw), cursor, status)
        return JSONResponse(found)

    async def item_file(self, request: Request) -> Response:
        job, item = request.path_params["job"], request.path_params["item"]
        which = request.url.path.rsplit("/", 1)[-1]
        size = _thumb_size(request.query_params.get("thumb"))
        area = await caller_area(self.api, request, job)
        config = self.api.config
        rel, kind = await asyncio.to_thread(items.item_file, config, area, job, item, which)
        shown = items.shown_path(area, rel)
        opened = await asyncio.to_thread(items.open_file, config, rel, shown)
        lane = self.api.slow.lane(area.tenant)
        if size is None:
            return self._whole(opened, shown, lane)
        try:
            async with self.decoding:  # decoded in a worker, through the file held open
                data = await lane.run_apart(thumbnail, Lent(opened.fd), kind, size)
        except thumbs.NoThumbnail as e:
            raise ApiError(422, "no_thumbnail", f"{shown}: {e}", file=shown) from None
        finally:
            opened.close()
        return Response(data, media_type="image/jpeg", headers=FILE_HEADERS)

    def _whole(self, opened: items.Opened, shown: str, lane: Lane) -> Response:
        headers = {**FILE_HEADERS, "Content-Length": str(opened.size)}
        name = shown.rsplit("/", 1)[-1].replace('"', "")
        if opened.media_type is None:  # not a photo or video: a download, never shown inline
            headers["Content-Disposition"] = f'attachment; filename="{name}"'
        media = opened.media_type or "application/octet-stream"
        return StreamingResponse(lane.pieces(opened.pieces()), media_type=media, headers=headers)


def thumbnail(lent: Lent, kind: str, size: int) -> bytes:
    """The thumbnail of the lent open file (``kind``: what its first bytes are), as a slow worker
    process makes it (controller/api/slow.py ``run_apart``)."""
    opened = items.Opened(lent.fd, os.fstat(lent.fd).st_size, None)
    try:
        if kind != "image":
            raise thumbs.NoThumbnail("videos have no thumbnail")
        if opened.size > thumbs.MAX_BYTES:
            raise thumbs.NoThumbnail(f"the file is larger than {thumbs.MAX_BYTES // 1024**2} MiB")
        return thumbs.thumbnail(opened.read(thumbs.MAX_BYTES + 1), size)
    finally:
        opened.close()


def routes(api: ApiLike, guard: Callable[[Handler], Handler]) -> list[Route]:
    page = Page(api)
    return [
        Route("/", guard(page.index), methods=["GET"]),
        Route("/static/{name}", guard(page.static), methods=["GET"]),
        Route("/v1/jobs/{job}/events-link", guard(page.events_link), methods=["POST"]),
        Route("/v1/jobs/{job}/items", guard(page.list_items), methods=["GET"]),
        Route("/v1/jobs/{job}/items/{item}/input", guard(page.item_file), methods=["GET"]),
        Route("/v1/jobs/{job}/items/{item}/output", guard(page.item_file), methods=["GET"]),
    ]


__all__ = ["Page", "caller_area", "routes"]
