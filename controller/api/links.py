"""Signed download links: ``?expires=UNIX&sig=HEX`` where sig is HMAC-SHA256, made with the API's key
(config ``api.signing_key_file``, shared by every replica), over ``METHOD\\nPATH\\nEXPIRES``. A valid
link needs no token; an expired one is 403 ``link_expired``, a tampered one 403 ``bad_signature``."""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlencode

from controller.api.errors import ApiError


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
