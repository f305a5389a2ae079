"""Signed download links: ``?expires=UNIX&sig=HEX`` where sig is HMAC-SHA256, made with the API's key
(config ``api.signing_key_file``, shared by every replica), over ``METHOD\\nPATH\\nEXPIRES``. A valid
link needs no token; an expired one is 403 ``link_expired``, a tampered one 403 ``bad_signature``.

The API signs the links it answers with; `serve` signs the one a tenant job's completion webhook
carries (controller/run/hooks.py), with the same key file and ttl."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path
from urllib.parse import urlencode

from controller.api.errors import ApiError


def results_path(job: str) -> str:
    return f"/v1/jobs/{job}/results.zip"


def read_key(path: Path) -> bytes:
    """The signing key: the file's bytes, surrounding whitespace stripped (as the API reads it);
    OSError or ValueError (empty) name the file, never its content."""
    key = path.read_bytes().strip()
    if not key:
        raise ValueError(f"{path} is empty")
    return key


def absolute(public_url: str | None, link: str) -> str:
    """A link made absolute with ``api.public_url`` when it is set (the signature covers the API's
    own path, so a proxy that adds a path prefix still delivers a valid link)."""
    return link if public_url is None else public_url.rstrip("/") + link


def signature(key: bytes, method: str, path: str, expires: int) -> str:
    return hmac.new(key, f"{method.upper()}\n{path}\n{expires}".encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, ttl: int, now: float | None = None) -> str:
    """``path?expires=…&sig=…``, valid for ``ttl`` seconds."""
    expires = int((time.time() if now is None else now) + ttl)
    return f"{path}?{urlencode({'expires': expires, 'sig': signature(key, method, path, expires)})}"


def verify(key: bytes | None, method: str, path: str, expires: str, sig: str, now: float | None = None) -> None:
    if key is None:
        raise ApiError(401, "unauthorized", "signed links are off on this API (no api.signing_key_file)")
    if not expires.isdigit() or len(expires) > 12:
        raise ApiError(403, "bad_signature", "the link's expires is not a UNIX time")
    want = signature(key, method, path, int(expires))
    if not hmac.compare_digest(want.encode(), sig.lower().encode("utf-8", "replace")):  # any text, never a 500
        raise ApiError(403, "bad_signature", "the link's signature does not match")
    if int(expires) < (time.time() if now is None else now):
        raise ApiError(403, "link_expired", "the link has expired; ask for a new one")
