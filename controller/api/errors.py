"""The API's one error shape: ``{"error": {"code", "message", "field"?, "file"?}}``.

Every refusal is an ``ApiError`` raised where it is found and turned into JSON in one place
(controller/api/app.py); anything else becomes a 500 whose body says only "internal error" (the
traceback goes to the log). Messages name paths relative to the tenant's area and never echo a
file's content, a token or a key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        file: str | None = None,
        headers: Mapping[str, str] | None = None,
        errors: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.file = file
        self.headers = dict(headers or {})
        self.errors = tuple(errors)  # (field, message), one per field of the request that was wrong

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            err["field"] = self.field
        if self.file is not None:
            err["file"] = self.file
        if self.errors:
            err["errors"] = [{"field": f, "message": m} for f, m in self.errors]
        return {"error": err}


def unauthorized(message: str = "a valid Authorization: Bearer token is required") -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="ffswarm"'})


def not_found(job: str) -> ApiError:
    """Another tenant's job reads exactly as one that does not exist (never 403)."""
    return ApiError(404, "not_found", f"no job {job!r}")
