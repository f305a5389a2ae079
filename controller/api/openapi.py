"""The OpenAPI 3.1 document served at /openapi.json, written by hand: it is the API's contract."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": "string"},
                "file": {"type": "string"},
                "errors": {"type": "array", "items": {"type": "object", "required": ["field", "message"]}},
            },
        }
    },
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "the same key and body within 24 h answer the same job; another body is 422",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[\\x20-\\x7e]+$"},
}
_SCALE = {
    "type": "object",
    "required": ["max_concurrent"],
    "properties": {"max_concurrent": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_READY = {
    "type": "object",
    "required": ["ready"],
    "properties": {"ready": {"type": "boolean"}, "reasons": {"type": "array", "items": {"type": "string"}}},
}
_EVENTS = """Looked at every 500 ms, from the run folder.

- `chunk` — a chunk of the job changed state: `{"chunk", "state", "attempt", "items"?, "reason"?}`.
  `state`: `started` (its service made, not yet on a node), `running` (on a node), `retrying` (an
  attempt failed; it runs again after a pause), `done`, `failed`, `cancelled`; `attempt`: its latest
  attempt's number (0: none of its own). `items` once it has ended: `{"total", "ok", "no_face",
  "failed", "cancelled"}` of its work items (photos, or video segments; one with no result counts as
  failed, or cancelled in a cancelled chunk, as in the report). `reason` for failed, retrying and
  cancelled, as the report words it (paths relative to your area). On connecting, one for each chunk
  that has left the queue, as it is now. A state shorter than a look may be skipped. A job packed
  with others (serve's packing) shows only its one chunk `c0000`, once, when it ends.
- `progress` — the job's status (as `GET /v1/jobs/{id}`) when it changed.
- `end` — `{"job", "phase"}`: the job finished, was cancelled, refused or stopped; the stream closes.
"""
_JOB_ID = {"name": "job", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {
            "description": "error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for c in codes
    }


def _json(schema: dict[str, Any], description: str = "ok") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document() -> dict[str, Any]:
    when = {"type": ["string", "null"], "format": "date-time"}
    job_obj = {
        "type": "object",
        "required": ["job", "phase"],
        "properties": {
            "job": {"type": "string"},
            "phase": {"type": "string"},
            "outcome": {"enum": ["succeeded", "partial", "failed", "cancelled", None]},
            "created_at": when,
            "started_at": when,
            "finished_at": when,
        },
    }
    accepted = {
        "type": "object",
        "required": ["id", "status_url", "events_url"],
        "properties": {
            "id": {"type": "string"},
            "status_url": {"type": "string"},
            "events_url": {"type": "string"},
            "notes": {"type": "array", "items": {"type": "string"}},
        },
    }
    multipart = {
        "type": "object",
        "required": ["source", "targets"],
        "properties": {
            "job": {"type": "string", "description": "JSON object of job file v1 options"},
            "source": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "targets": {"type": "array", "items": {"type": "string", "format": "binary"}},
        },
    }
    signed = [
        {"name": "expires", "in": "query", "required": False, "schema": {"type": "integer"}},
        {"name": "kid", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "gen", "in": "query", "required": False, "schema": {"type": "integer"}},
        {"name": "sig", "in": "query", "required": False, "schema": {"type": "string"}},
    ]
    return {
        "openapi": "3.1.0",
        "info": {"title": "ffswarm API", "version": "1"},
        "components": {
            "schemas": {"Error": _ERROR, "Job": job_obj},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {  # liveness and readiness first: the schema test asks them while its heartbeat is fresh
            "/healthz": {
                "get": {"summary": "Liveness", "security": [], "responses": {"200": _json({"type": "object"})}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: the data root, the API's record folders, the signing key, a live `serve`",
                    "description": "Without a token only `ready`; with a valid one also the short `reasons`.",
                    "security": [{"bearer": []}, {}],
                    "responses": {
                        "200": _json(_READY, "ready"),
                        "503": _json(_READY, "not ready: short reasons (with a token), no path outside the data root"),
                        **_errors(401),
                    },
                }
            },
            "/v1/jobs": {
                "post": {
                    "summary": "Submit a job (JSON job fields, or multipart uploads)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"type": "object"}},
                            "multipart/form-data": {"schema": multipart},
                        },
                    },
                    "parameters": [_IDEMPOTENCY_KEY],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Job"}, "Prefer: wait=N and the job ended in time"),
                        "202": _json(accepted, "accepted (or, with an Idempotency-Key seen before, accepted then)"),
                        **_errors(400, 401, 409, 413, 415, 422, 429, 503),
                    },
                },
                "get": {
                    "summary": "The tenant's jobs",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                        {"name": "phase", "in": "query", "schema": {"type": "string"}},
                        {"name": "outcome", "in": "query", "schema": {"type": "string"}},
                        {"name": "created_after", "in": "query", "schema": {"type": "string", "format": "date-time"}},
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["jobs"],
                                "properties": {
                                    "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                                    "next_cursor": {"type": ["string", "null"]},
                                },
                            }
                        ),
                        **_errors(400, 401),
                    },
                },
            },
            "/v1/jobs/{job}": {
                "get": {
                    "summary": "One job's status (as `ffswarm status --json`)",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json({"$ref": "#/components/schemas/Job"}), **_errors(401, 404)},
                },
                "delete": {
                    "operationId": "deleteJob",
                    "summary": "Delete a finished job: its uploads, the outputs it wrote, run folder, links, record",
                    "parameters": [_JOB_ID],
                    "responses": {"204": {"description": "deleted"}, **_errors(401, 404, 409)},
                },
            },
            "/v1/jobs/{job}/report": {
                "get": {
                    "summary": "report.json",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json({"type": "object"}), **_errors(401, 404)},
                }
            },
            "/v1/jobs/{job}/events": {
                "get": {
                    "summary": "Server-sent events: chunk, progress (at most every 500 ms), end",
                    "description": _EVENTS,
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": {"description": "event stream", "content": {"text/event-stream": {}}},
                        **_errors(401, 404),
                    },
                }
            },
            "/v1/jobs/{job}/results.zip": {
                "get": {
                    "summary": "Committed outputs as a ZIP, streamed; a signed link needs no token",
                    "parameters": [_JOB_ID, *signed],
                    "security": [{"bearer": []}, {}],
                    "responses": {
                        "200": {"description": "ZIP", "content": {"application/zip": {}}},
                        **_errors(401, 403, 404),
                    },
                }
            },
            "/v1/jobs/{job}/links/revoke": {
                "post": {
                    "summary": "Every signed link of the job made so far stops working (403 link_revoked)",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["id", "links_revoked"],
                                "properties": {"id": {"type": "string"}, "links_revoked": {"type": "boolean"}},
                            }
                        ),
                        **_errors(401, 404),
                    },
                }
            },
            "/v1/jobs/{job}/cancel": {
                "post": {
                    "summary": "Cancel a job",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _json({"type": "object"}), **_errors(401, 404, 409)},
                }
            },
            "/v1/jobs/{job}/scale": {
                "post": {
                    "summary": "How many chunks of the job run at once (`ffswarm scale`); a queued job starts so",
                    "parameters": [_JOB_ID],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _SCALE}},
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["job", "max_concurrent"],
                                "properties": {"job": {"type": "string"}, "max_concurrent": {"type": "integer"}},
                            }
                        ),
                        **_errors(400, 401, 404, 409, 413, 422),
                    },
                }
            },
            "/v1/jobs/{job}/retry": {
                "post": {
                    "summary": "Run a finished job's failed items again (`ffswarm retry`); committed ones are kept",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "202": _json(
                            {
                                "type": "object",
                                "required": ["id", "status_url", "events_url", "items"],
                                "properties": {
                                    "id": {"type": "string"},
                                    "status_url": {"type": "string"},
                                    "events_url": {"type": "string"},
                                    "items": {"type": "integer", "description": "items to run again"},
                                },
                            },
                            "handed back to the controller",
                        ),
                        **_errors(401, 404, 409, 429, 503),
                    },
                }
            },
        },
    }
