"""The OpenAPI 3.1 document served at /openapi.json, generated from a table of operations.

Each route the API serves, the web page's included, is one ``Operation`` here: its method and path,
operationId, tag, words, parameters, request body and every answer, errors included. The schemas are
the pydantic models of controller/api/schemas.py; the JSON body of ``POST /v1/jobs`` is the job
file's JSON Schema. app.py builds its routes from the same table, so a route cannot be served
undocumented, and adding one is one entry here plus its handler.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from controller.api import schemas
from controller.api.examples import EXAMPLES
from controller.api.operation import ITEM_ID, JOB_ID, LINK_PARAMS, REF, Answer, Auth, Operation, Param, Tag
from controller.job.schema import job_schema

ERROR_EXAMPLES = {
    400: ("bad_request", "limit must be an integer from 1 to 1000"),
    401: ("unauthorized", "a valid Authorization: Bearer token is required"),
    403: ("link_expired", "the link has expired"),
    404: ("not_found", "no job 'party-abcdefgh'"),
    405: ("method_not_allowed", "PUT is not allowed here; allowed: GET, POST"),
    409: ("finished", "job 'party-abcdefgh' already finished: nothing to cancel"),
    413: ("too_large", "a JSON job is at most 1048576 bytes"),
    415: ("unsupported_media", "send JSON (application/json) or multipart/form-data"),
    422: ("invalid_job", "job.yaml: targets: is required"),
    429: (
        "rate_limited",
        "over the tenant's quota.requests_per_second or quota.requests_in_flight; retry after Retry-After seconds",
    ),
    503: ("busy", "the API is busy, or the shared volume is full (volume_full); try again after Retry-After"),
}
ERROR_HEADERS = {
    401: {"WWW-Authenticate": 'Bearer realm="ffswarm"'},
    405: {"Allow": "the methods this path takes"},
    429: {"Retry-After": "seconds to wait before trying again"},
    503: {"Retry-After": "seconds to wait before trying again"},
}


def job_file_schema() -> dict[str, Any]:
    """The JSON body of ``POST /v1/jobs``: the job file's JSON Schema as a request (name and output
    may be left out); its ``$defs`` are moved into the components by ``document``."""
    schema = job_schema(request=True)
    schema["title"] = "JobFile"  # the component's (and a generated client's class) name
    schema["description"] = "A job file's keys (docs/job-file.md); paths are relative to the tenant's area."
    return schema


_IDEMPOTENCY_KEY = Param(
    "Idempotency-Key", "header", {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[\\x20-\\x7e]+$"},
    "the same key and body within 24 h answer the same job; another body is 422",
)  # fmt: skip
_PREFER = Param(
    "Prefer", "header", {"type": "string", "pattern": "^wait=[0-9]+$"},
    "`wait=N` (0 < N ≤ 60): answer 200 with the final status when the job ends within N s, else 202",
)  # fmt: skip
_MULTIPART = {
    "type": "object",
    "required": ["source", "targets"],
    "properties": {
        "job": {"type": "string", "description": "a JSON object of job file fields (no paths)"},
        "source": {"type": "array", "items": {"type": "string", "format": "binary"}, "description": "photos"},
        "targets": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "description": "photos, videos, or ZIPs of them (each ZIP's entries become targets)",
        },
    },
}
_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50})
_CURSOR = Param("cursor", "query", {"type": "string"}, "the `next_cursor` of the page before")
# anyOf, not oneOf: `format` only annotates (JSON Schema 2020-12), so any string matches both string forms
_TIME = {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "format": "date"},
                   {"type": "string", "format": "date-time"}]}  # fmt: skip
_EVENTS = """Server-sent events, looked at every 500 ms, from the run folder.

- `chunk` — a chunk of the job changed state: `{"chunk", "state", "attempt", "items"?, "reason"?}`.
  `state`: `started` (its service made, not yet on a node), `running` (on a node), `retrying` (an
  attempt failed; it runs again after a pause), `done`, `failed`, `cancelled`; `attempt`: its latest
  attempt's number (0: none of its own). `items` once it has ended: `{"total", "ok", "no_face",
  "failed", "cancelled"}` of its work items (photos, or video segments; one with no result counts as
  failed, or cancelled in a cancelled chunk, as in the report). `reason` for failed, retrying and
  cancelled, as the report words it (paths relative to your area). On connecting, one for each chunk
  that has left the queue, as it is now. A state shorter than a look may be skipped. A job packed
  with others (serve's packing) shows only its one chunk `c0000`, once, when it ends.
- `progress` — the job's status (as `GET /v1/jobs/{job}`) when it changed.
- `end` — `{"job", "phase", "outcome"}`: the job finished, was cancelled, refused or stopped; the stream closes.
"""


def _job_op(method: str, tail: str, op_id: str, summary: str, answers: Iterable[Answer], errors: Iterable[int],
            **kw: Any) -> Operation:  # fmt: skip
    params = kw.pop("params", ())
    return Operation(method, f"/v1/jobs/{{job}}{tail}", op_id, kw.pop("tag", Tag.JOBS), summary, tuple(answers),
                     tuple(errors), params=(JOB_ID, *params), **kw)  # fmt: skip


# The webhook deliveries' operations (served by controller/api/deliveries.py).
DELIVERIES: tuple[Operation, ...] = (
    _job_op("GET", "/deliveries", "listJobDeliveries", "The job's webhook deliveries, oldest first, with every try",
            (Answer(200, "the deliveries", schemas.DeliveryPage),), (404,), tag=Tag.WEBHOOKS),
    _job_op("POST", "/deliveries/{delivery}/redeliver", "redeliverJobDelivery",
            "Queue a delivery again under the same id; serve sends it",
            (Answer(202, "queued again", schemas.Delivery),), (404, 409), tag=Tag.WEBHOOKS,
            params=(Param("delivery", "path", {"type": "string"}, "the delivery's id (msg_…)", required=True),)),
)  # fmt: skip


_THUMB = Param(
    "thumb", "query", {"type": "integer", "minimum": 1, "maximum": 1024},
    "a JPEG thumbnail instead of the file: 1 (256 px) or the longer side, 32–1024 px",
)  # fmt: skip
_FILE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/tiff", "video/mp4", "video/x-matroska",
               "video/x-msvideo", "application/octet-stream")  # fmt: skip
# Each event of the stream (OpenAPI 3.1: a text/event-stream schema describes one event, its fields
# as the stream spells them); its data is JSON, as the operation's description says per event.
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["chunk", "progress", "end"]},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string", "description": "where to resume: send it back as `Last-Event-ID`"},
        "retry": {"type": "integer", "minimum": 0, "description": "the reconnection delay (ms)"},
    },
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}


def _item_file(which: str, op_id: str) -> Operation:
    once = " once committed" if which == "output" else ""
    return Operation(
        "GET", f"/v1/jobs/{{job}}/items/{{item}}/{which}", op_id, Tag.PAGE,
        f"An item's {which} file{once}, or its thumbnail",
        (Answer(200, "the file, or a JPEG thumbnail", content={t: _BINARY for t in _FILE_TYPES}),),
        (400, 403, 404, 422), params=(JOB_ID, ITEM_ID, _THUMB, *LINK_PARAMS), auth=Auth.TOKEN_OR_LINK,
    )  # fmt: skip


# The web page's operations (served by controller/api/page.py): the page, its events link, a job's
# items and item files.
PAGE: tuple[Operation, ...] = (
    Operation("GET", "/", "getStatusPage", Tag.PAGE, "The web status page",
              (Answer(200, "HTML", content={"text/html": {"schema": {"type": "string"}}}),), (), auth=Auth.NONE),
    Operation("POST", "/v1/jobs/{job}/events-link", "createJobEventsLink", Tag.PAGE,
              "A signed URL of the job's events, valid for 5 minutes (EventSource sends no token)",
              (Answer(200, "the link", schemas.EventsLink),), (404, 409), params=(JOB_ID,)),
    Operation("GET", "/v1/jobs/{job}/items", "listJobItems", Tag.PAGE,
              "The job's photos and videos with status and reason",
              (Answer(200, "a page of items", schemas.ItemPage),), (400, 404),
              params=(JOB_ID,
                      Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                      Param("cursor", "query", {"type": "string"}),
                      Param("status", "query", {"enum": ["ok", "no_face", "error", "pending"]}))),
    _item_file("input", "getJobItemInput"),
    _item_file("output", "getJobItemOutput"),
)  # fmt: skip


OPERATIONS: tuple[Operation, ...] = (
    # liveness and readiness first: the schema test asks them while the heartbeat is fresh
    Operation("GET", "/healthz", "getHealth", Tag.SERVICE, "Liveness", (Answer(200, "alive", schemas.Health),), (),
              auth=Auth.NONE),
    Operation("GET", "/readyz", "getReadiness", Tag.SERVICE,
              "Readiness: the data root, the API's record folders, the signing key, a live `serve`",
              (Answer(200, "ready", schemas.Readiness),
               Answer(503, "not ready: short reasons (with a token), no path outside the data root",
                      schemas.Readiness)),
              (401,), description="Without a token only `ready`; with a valid one also the short `reasons`.",
              auth=Auth.TOKEN_OR_NONE),
    Operation("POST", "/v1/jobs", "createJob", Tag.JOBS, "Submit a job (JSON job fields, or multipart uploads)",
              (Answer(202, "accepted (or, with an Idempotency-Key seen before, accepted then)", schemas.Accepted,
                      headers={"Location": "the job's status URL"}),
               Answer(200, "the job ended within `Prefer: wait=N`: its final status", schemas.JobStatus,
                      headers={"Preference-Applied": "wait=N"})),
              (400, 409, 413, 415, 422, 429, 503), params=(_IDEMPOTENCY_KEY, _PREFER),
              body={"application/json": {"$ref": REF.format(model="JobFile")}, "multipart/form-data": _MULTIPART},
              body_examples={"application/json": EXAMPLES["JobFile"]},
              description="A JSON body is the job file's fields, paths relative to your area; a multipart body "
                          "uploads the photos (`source`) and the targets (photos, videos, ZIPs) with the job's "
                          "options in a `job` part. 202 means the job is durable."),
    Operation("GET", "/v1/jobs", "listJobs", Tag.JOBS, "The tenant's jobs as status objects, newest first",
              (Answer(200, "a page of jobs", schemas.JobPage),), (400,),
              params=(_LIMIT, _CURSOR,
                      Param("phase", "query", {"$ref": REF.format(model="Phase")}, "only jobs in this phase"),
                      Param("outcome", "query", {"$ref": REF.format(model="Outcome")}, "only jobs that ended so"),
                      Param("created_after", "query", {"type": "string", "format": "date-time"},
                            "only jobs created after this time (RFC 3339)"))),
    _job_op("GET", "", "getJob", "One job's status (as an element of `ffswarm status --json`)",
            (Answer(200, "the job's status", schemas.JobStatus),), (404,)),
    _job_op("DELETE", "", "deleteJob", "Delete a finished job: its uploads, outputs, run folder, links and record",
            (Answer(204, "deleted"),), (404, 409)),
    _job_op("GET", "/report", "getJobReport", "The job's report.json (once it has ended)",
            (Answer(200, "the report", schemas.Report),), (404,)),
    _job_op("GET", "/events", "getJobEvents", "Server-sent events: chunk, progress (at most every 500 ms), end",
            (Answer(200, "the event stream", content={"text/event-stream": {"schema": _SSE_EVENT}}),),
            (403, 404), description=_EVENTS, params=LINK_PARAMS, auth=Auth.TOKEN_OR_LINK),
    _job_op("GET", "/results.zip", "getJobResults",
            "Committed outputs as a ZIP, streamed; a signed link needs no token",
            (Answer(200, "the ZIP", content={"application/zip": {"schema": {"type": "string", "format": "binary"}}},
                    headers={"Content-Disposition": "attachment; filename=\"<job>.zip\""}),),
            (403, 404, 409), tag=Tag.RESULTS, params=LINK_PARAMS, auth=Auth.TOKEN_OR_LINK),
    _job_op("POST", "/cancel", "cancelJob", "Cancel a job: a queued one leaves the queue, a running one is stopped",
            (Answer(200, "cancelled", schemas.Cancelled),), (404, 409)),
    _job_op("POST", "/scale", "scaleJob", "How many chunks of the job run at once (`ffswarm scale`)",
            (Answer(200, "scaled", schemas.Scaled),), (400, 404, 409, 413, 422),
            body={"application/json": {"$ref": REF.format(model="Scale")}},
            body_examples={"application/json": EXAMPLES["Scale"]}),
    _job_op("POST", "/retry", "retryJob", "Run a finished job's failed items again; committed ones are kept",
            (Answer(202, "handed back to the controller", schemas.Retried,
                    headers={"Location": "the job's status URL"}),),
            (404, 409, 503)),
    _job_op("POST", "/links/revoke", "revokeJobLinks", "Every signed link of the job made so far stops working",
            (Answer(200, "revoked", schemas.Revoked),), (404,), tag=Tag.RESULTS),
    Operation("GET", "/v1/usage", "getUsage", Tag.USAGE,
              "The tenant's usage summed over its jobs that ended in [from, to), and those jobs",
              (Answer(200, "the usage", schemas.UsagePage),), (400,),
              params=(Param("from", "query", _TIME, "inclusive; default 0"),
                      Param("to", "query", _TIME, "exclusive; default now"),
                      Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}),
                      _CURSOR)),
    Operation("GET", "/metrics", "getMetrics", Tag.SERVICE,
              "Prometheus metrics; takes a metrics token (api.metrics_token_sha256), not a tenant's",
              (Answer(200, "Prometheus text format", content={"text/plain": {"schema": {"type": "string"}}}),),
              (404,)),
    *PAGE,
    *DELIVERIES,
)  # fmt: skip


def _error_answer(status: int) -> dict[str, Any]:
    code, message = ERROR_EXAMPLES[status]
    out: dict[str, Any] = {
        "description": f"refused: {code}" if status < 500 else f"unavailable: {code}",
        "content": {
            "application/json": {
                "schema": {"$ref": REF.format(model="Error")},
                "example": {"error": {"code": code, "message": message}},
            }
        },
    }
    if status in ERROR_HEADERS:
        out["headers"] = _headers(ERROR_HEADERS[status])
    return out


def _headers(named: Mapping[str, str]) -> dict[str, Any]:
    return {k: {"description": v, "schema": {"type": "string"}} for k, v in named.items()}


def _answer(a: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"description": a.description}
    if a.model is not None:
        media: dict[str, Any] = {"schema": {"$ref": REF.format(model=a.model.__name__)}}
        if a.model.__name__ in EXAMPLES:
            media["example"] = EXAMPLES[a.model.__name__]
        out["content"] = {"application/json": media}
    elif a.content is not None:
        out["content"] = copy.deepcopy(dict(a.content))
    if a.headers:
        out["headers"] = _headers(a.headers)
    return out


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": op.id, "tags": [str(op.tag)], "summary": op.summary}
    if op.description:
        out["description"] = op.description
    if op.params:
        out["parameters"] = [p.spec() for p in op.params]
    if op.body is not None:
        content = {k: {"schema": v} for k, v in op.body.items()}
        for media, example in op.body_examples.items():
            content[media]["example"] = example
        out["requestBody"] = {"required": True, "content": content}
    errors = set(op.errors) | {429}  # any request carrying a tenant's token counts against its limits (api/fairness.py)
    if op.auth is not Auth.NONE:
        errors |= {401}
    errors |= {405}  # the path with another method
    answers = {str(a.status): _answer(a) for a in op.answers}
    answers |= {str(s): _error_answer(s) for s in sorted(errors) if str(s) not in answers}
    out["responses"] = dict(sorted(answers.items()))
    if op.auth is not Auth.TOKEN:
        out["security"] = op.auth.security()
    return out


def _hoist(schema: Mapping[str, Any], name: str, into: dict[str, Any]) -> None:
    """A JSON Schema document as component ``name``: its ``$defs`` become components of their own
    (a ``#/$defs/`` reference would point into the OpenAPI document's root otherwise)."""
    body = {k: v for k, v in schema.items() if k not in ("$defs", "$schema", "$id")}
    defs = dict(schema.get("$defs") or {})

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (REF.format(model=v[len("#/$defs/"):]) if k == "$ref" and isinstance(v, str)
                        and v.startswith("#/$defs/") else fix(v)) for k, v in node.items()}  # fmt: skip
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    for key, value in {name: body, **defs}.items():
        if key in into:
            raise ValueError(f"the schema component {key!r} is defined twice")
        into[key] = fix(value)


def components() -> dict[str, Any]:
    models: list[type[BaseModel]] = list(schemas.ANSWERS)
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    found: dict[str, Any] = dict(top.get("$defs", {}))
    _hoist(job_file_schema(), "JobFile", found)
    return dict(sorted(found.items()))


@functools.cache
def _document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ffswarm API",
            "version": "1",
            "description": "Batch face swapping on a Docker Swarm: submit jobs, follow them, fetch their results. "
            'Every error answers `{"error": {"code", "message", …}}`.',
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},  # pyproject.toml's
        },  # fmt: skip
        "servers": [{"url": "/", "description": "the host that serves this document"}],
        "tags": [{"name": str(t), "description": t.description} for t in Tag],
        "components": {"schemas": components(), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": Auth.TOKEN.security(),
        "paths": paths,
    }


def document() -> dict[str, Any]:
    """The document, built once per process (it depends on nothing but the code); a copy each call."""
    return copy.deepcopy(_document())


__all__ = ["DELIVERIES", "OPERATIONS", "components", "document", "job_file_schema"]
