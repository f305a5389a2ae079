"""The API's one error shape: ``{"error": {"code", "message", "field"?, "file"?, "errors"?}}``.

``errors`` lists ``{"field", "message"}`` once per field at fault whenever a field is (a job file with
three wrong fields answers all three at once); ``field`` names the first of them.

Every refusal is an ``ApiError`` raised where it is found and turned into JSON in one place
(controller/api/app.py); anything else becomes a 500 whose body says only "internal error" (the
traceback goes to the log). Messages name paths relative to the tenant's area and never echo a
file's content, a token or a key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
        errors: Iterable[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.file = file
        self.headers = dict(headers or {})
        self.errors = by_field(errors) or ({field: message} if field is not None else {})

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole, so a refusal raised in a slow worker process reaches the caller unchanged."""
        fields = {"field": self.field, "file": self.file, "headers": self.headers, "errors": list(self.errors.items())}
        return (_rebuilt, (self.status, self.code, self.message, fields))

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            err["field"] = self.field
        if self.file is not None:
            err["file"] = self.file
        if self.errors:
            err["errors"] = [{"field": f, "message": m} for f, m in self.errors.items()]
        return {"error": err}


def _rebuilt(status: int, code: str, message: str, fields: dict[str, Any]) -> ApiError:
    return ApiError(status, code, message, **fields)


def by_field(errors: Iterable[tuple[str, str]]) -> dict[str, str]:
    """One message per field, in the order the fields first appear (two about one field: joined)."""
    out: dict[str, str] = {}
    for name, message in errors:
        out[name] = f"{out[name]}; {message}" if name in out else message
    return out


def unauthorized(message: str = "a valid Authorization: Bearer token is required") -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="ffswarm"'})


def not_found(job: str) -> ApiError:
    """Another tenant's job reads exactly as one that does not exist (never 403)."""
    return ApiError(404, "not_found", f"no job {job!r}")
