"""What the client raises: every failure is a ``ClientError``; an answer of the API that refuses a
request is an ``ApiError`` carrying the API's error object (code, message, the fields it names), and
an API that could not be reached, after the retries, is a ``TransportError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ClientError(Exception):
    """Base of everything the client raises: a local file it cannot send, an API it cannot reach, a refusal."""


@dataclass(frozen=True)
class FieldError:
    """One field the API found wrong, as its ``errors`` list names it."""

    field: str
    message: str


class ApiError(ClientError):
    """The API answered with an error: its HTTP status and the ``{"error": {...}}`` body's parts.

    ``errors`` lists one entry per field when the API says so; an API that names only one
    ``field`` gives that one. ``retry_after`` is the Retry-After header in seconds (429, 503)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        errors: tuple[FieldError, ...] = (),
        *,
        field: str | None = None,
        file: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{message} ({status} {code})")
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors
        self.field = field
        self.file = file
        self.retry_after = retry_after

    @classmethod
    def from_body(cls, status: int, body: Any, retry_after: float | None = None) -> ApiError:
        """The API's error object; anything else (a proxy's HTML page) is named by its status alone,
        never echoed."""
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            return cls(status, f"http_{status}", f"the server answered HTTP {status}", retry_after=retry_after)
        field = err.get("field") if isinstance(err.get("field"), str) else None
        given = err.get("errors")
        listed: list[Any] = given if isinstance(given, list) else []
        errors = tuple(
            FieldError(str(e.get("field", "")), str(e.get("message", ""))) for e in listed if isinstance(e, dict)
        )
        if not errors and field is not None:
            errors = (FieldError(field, str(err.get("message", ""))),)
        return cls(
            status,
            str(err.get("code") or f"http_{status}"),
            str(err.get("message") or f"HTTP {status}"),
            errors,
            field=field,
            file=err.get("file") if isinstance(err.get("file"), str) else None,
            retry_after=retry_after,
        )


class LocalFileError(ClientError):
    """A local file or folder to send is missing or not what it must be (a source that is no photo)."""


class TransportError(ClientError):
    """The API could not be reached (or the connection kept dropping) after every retry."""
