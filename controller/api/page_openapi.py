"""The OpenAPI entries of the web page's routes (controller/api/page.py), added to the hand-written
document of controller/api/openapi.py: the page, its events link, a job's items and item files, and
the signed-link form of the events route."""

from __future__ import annotations

import copy
from typing import Any

_ERR = {"$ref": "#/components/schemas/Error"}
_JOB = {"name": "job", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}}
_ITEM = {"name": "item", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}}
_SIGNED = [
    {"name": "expires", "in": "query", "required": False, "schema": {"type": "integer"}},
    {"name": "sig", "in": "query", "required": False, "schema": {"type": "string"}},
]
_THUMB = {
    "name": "thumb",
    "in": "query",
    "required": False,
    "description": "a JPEG thumbnail instead of the file: 1 (256 px) or the longer side, 32–1024 px",
    "schema": {"type": "integer", "minimum": 1, "maximum": 1024},
}
_FILE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/tiff", "video/mp4", "video/x-matroska",
               "video/x-msvideo", "application/octet-stream")  # fmt: skip
_ITEM_ROW = {
    "type": "object",
    "required": ["id", "kind", "input", "output", "status", "reason", "has_output"],
    "properties": {
        "id": {"type": "string"},
        "kind": {"enum": ["image", "video"]},
        "input": {"type": ["string", "null"], "description": "relative to the tenant's area"},
        "output": {"type": ["string", "null"]},
        "status": {"enum": ["ok", "no_face", "error", None]},
        "reason": {"type": ["string", "null"]},
        "has_output": {"type": "boolean", "description": "the output is committed and can be fetched"},
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": _ERR}}} for c in codes}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": "ok", "content": {"application/json": {"schema": schema}}}


def _item_file(which: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": f"An item's {which} file{' once committed' if which == 'output' else ''}, or its thumbnail",
            "parameters": [_JOB, _ITEM, _THUMB, *_SIGNED],
            "security": [{"bearer": []}, {}],
            "responses": {
                "200": {"description": "the file, or a JPEG thumbnail", "content": {t: {} for t in _FILE_TYPES}},
                **_errors(400, 401, 403, 404, 422),
            },
        }
    }


def paths() -> dict[str, Any]:
    listing = {
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {"items": {"type": "array", "items": _ITEM_ROW}, "next_cursor": {"type": ["string", "null"]}},
    }
    link = {
        "type": "object",
        "required": ["url", "expires"],
        "properties": {"url": {"type": "string"}, "expires": {"type": "integer"}},
    }
    return {
        "/": {
            "get": {
                "summary": "The web status page",
                "security": [],
                "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
            }
        },
        "/v1/jobs/{job}/events-link": {
            "post": {
                "summary": "A signed URL of the job's events, valid for 5 minutes (EventSource sends no token)",
                "parameters": [_JOB],
                "responses": {"200": _json(link), **_errors(401, 404, 409)},
            }
        },
        "/v1/jobs/{job}/items": {
            "get": {
                "summary": "The job's photos and videos with status and reason",
                "parameters": [
                    _JOB,
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    {"name": "status", "in": "query", "schema": {"enum": ["ok", "no_face", "error", "pending"]}},
                ],
                "responses": {"200": _json(listing), **_errors(400, 401, 404)},
            }
        },
        "/v1/jobs/{job}/items/{item}/input": _item_file("input"),
        "/v1/jobs/{job}/items/{item}/output": _item_file("output"),
    }


def extend(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the page's paths added, and the events route taking a signed link too."""
    doc = copy.deepcopy(document)
    doc["paths"].update(paths())
    events = doc["paths"].get("/v1/jobs/{job}/events", {}).get("get")
    if events is not None:
        names = {p.get("name") for p in events.get("parameters", [])}
        events["parameters"] = [*events.get("parameters", []), *(p for p in _SIGNED if p["name"] not in names)]
        events["security"] = [{"bearer": []}, {}]
        events["responses"].setdefault("403", _errors(403)["403"])
    return doc
