"""What one API operation declares for the generated OpenAPI document (controller/api/openapi.py):
method, path, operationId, tag, words, parameters, request body, answers and the errors it may give."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from pydantic import BaseModel

REF = "#/components/schemas/{model}"


class Tag(StrEnum):
    """An operation's group in the document; its ``description`` is what a reader of the docs sees."""

    JOBS = "jobs"
    RESULTS = "results"
    USAGE = "usage"
    WEBHOOKS = "webhooks"
    PAGE = "page"
    SERVICE = "service"

    @property
    def description(self) -> str:
        return _TAG_WORDS[self]


_TAG_WORDS = {
    Tag.JOBS: "Submit jobs, follow them to their outcome, cancel, scale, retry and delete them",
    Tag.RESULTS: "A job's committed outputs as a ZIP, and the signed links that fetch them without a token",
    Tag.USAGE: "What the tenant's ended jobs used, summed over a time range",
    Tag.WEBHOOKS: "The webhook deliveries of a job (Standard Webhooks), and sending one again",
    Tag.PAGE: "What the web status page reads: a job's items, their files and thumbnails, a signed events link",
    Tag.SERVICE: "Liveness, readiness and metrics, for the operator",
}


class Auth(Enum):
    """Who may call: a tenant's token; a token or a signed link; a token or nobody; nobody needed."""

    TOKEN = "token"
    TOKEN_OR_LINK = "token_or_link"
    TOKEN_OR_NONE = "token_or_none"
    NONE = "none"

    def security(self) -> list[dict[str, list[str]]]:
        if self is Auth.TOKEN:
            return [{"bearer": []}]
        if self is Auth.NONE:
            return []
        return [{"bearer": []}, {}]


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path, query or header
    schema: Mapping[str, Any]
    description: str = ""
    required: bool = False

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "in": self.where, "required": self.required or self.where == "path"}
        if self.description:
            out["description"] = self.description
        out["schema"] = dict(self.schema)
        return out


@dataclass(frozen=True)
class Answer:
    """A success answer: a JSON body of ``model``, or ``content`` of other media types, or nothing."""

    status: int
    description: str
    model: type[BaseModel] | None = None
    content: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    id: str  # the operationId: the name a generated client's function gets
    tag: Tag
    summary: str
    answers: tuple[Answer, ...]
    # besides 429 (any call carrying a token), 401 (every call that needs one) and 405 (every path)
    errors: tuple[int, ...]
    description: str = ""
    params: tuple[Param, ...] = ()
    body: Mapping[str, Any] | None = None  # media type → JSON Schema
    body_examples: Mapping[str, Any] = field(default_factory=dict)  # media type → an example body
    auth: Auth = Auth.TOKEN


JOB_ID = Param("job", "path", {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}, "the job's id", required=True)
ITEM_ID = Param("item", "path", {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}, "the item's id", required=True)
LINK_PARAMS = (
    Param("expires", "query", {"type": "integer"}, "a signed link's expiry (unix seconds)"),
    Param("kid", "query", {"type": "string"}, "a signed link's key id"),
    Param("gen", "query", {"type": "integer"}, "a signed link's generation"),
    Param("sig", "query", {"type": "string"}, "a signed link's signature"),
)

__all__ = ["ITEM_ID", "JOB_ID", "LINK_PARAMS", "REF", "Answer", "Auth", "Operation", "Param", "Tag"]
