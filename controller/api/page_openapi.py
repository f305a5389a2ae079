"""The operations of the web page's routes (controller/api/page.py) in the table the OpenAPI document
is generated from (controller/api/openapi.py): the page, its events link, a job's items and item files."""

from __future__ import annotations

from controller.api import schemas
from controller.api.operation import ITEM_ID, JOB_ID, LINK_PARAMS, Answer, Auth, Operation, Param, Tag

_THUMB = Param(
    "thumb", "query", {"type": "integer", "minimum": 1, "maximum": 1024},
    "a JPEG thumbnail instead of the file: 1 (256 px) or the longer side, 32–1024 px",
)  # fmt: skip
_FILE_TYPES = ("image/jpeg", "image/png", "image/webp", "image/bmp", "image/tiff", "video/mp4", "video/x-matroska",
               "video/x-msvideo", "application/octet-stream")  # fmt: skip
_BINARY = {"schema": {"type": "string", "format": "binary"}}


def _item_file(which: str, op_id: str) -> Operation:
    once = " once committed" if which == "output" else ""
    return Operation(
        "GET", f"/v1/jobs/{{job}}/items/{{item}}/{which}", op_id, Tag.PAGE,
        f"An item's {which} file{once}, or its thumbnail",
        (Answer(200, "the file, or a JPEG thumbnail", content={t: _BINARY for t in _FILE_TYPES}),),
        (400, 403, 404, 422), params=(JOB_ID, ITEM_ID, _THUMB, *LINK_PARAMS), auth=Auth.TOKEN_OR_LINK,
    )  # fmt: skip


OPERATIONS: tuple[Operation, ...] = (
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

__all__ = ["OPERATIONS"]
