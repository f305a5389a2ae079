"""Who is asking: ``Authorization: Bearer <API key or JWT>`` → a configured tenant, or 401.

API keys are stored only as sha256 digests (config ``tenants.<t>.api_keys_sha256``); the digest of
the presented key is compared with every stored one in constant time. JWTs (PyJWT) are accepted
only with the configured algorithms (pinned: a token's own ``alg`` header never chooses), must carry
``exp`` and ``sub`` (the tenant), and ``aud``/``iss`` when configured. Key files are read once, when
the API starts. A 401 never says which tenants or keys exist.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt

from controller.api.errors import ApiError, unauthorized
from controller.api.settings import JwtSettings, Tenant
from controller.errors import ConfigError

MAX_TOKEN = 8192


def read_key_file(path: Path, what: str) -> bytes:
    """A secret or key file's bytes; the error names the file, never its content."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror or type(e).__name__}") from None
    if not data.strip():
        raise ConfigError(f"{what} {path} is empty")
    return data


@dataclass(frozen=True)
class JwtVerifier:
    settings: JwtSettings
    key: bytes | str

    @classmethod
    def load(cls, settings: JwtSettings) -> JwtVerifier:
        raw = read_key_file(settings.key_file, "api.jwt key file")
        return cls(settings, raw.strip() if settings.hmac else raw.decode("ascii", "replace"))

    def subject(self, token: str) -> str:
        s = self.settings
        try:
            claims = jwt.decode(
                token,
                self.key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                options={"require": ["exp", "sub"], "verify_aud": s.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise unauthorized("the token has expired") from None
        except jwt.InvalidTokenError:
            raise unauthorized("the token is not valid here (signature, algorithm, audience or claims)") from None
        sub = claims.get("sub")
        if not isinstance(sub, str):
            raise unauthorized("the token's sub is not a tenant")
        return sub


class Authenticator:
    def __init__(self, tenants: Mapping[str, Tenant], verifier: JwtVerifier | None) -> None:
        self.tenants = dict(tenants)
        self.verifier = verifier
        self._keys = [(bytes.fromhex(k), t) for t in tenants.values() for k in t.api_keys_sha256]

    def tenant(self, authorization: str | None) -> Tenant:
        if not authorization:
            raise unauthorized()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
            raise unauthorized()
        if token.count(".") == 2 and self.verifier is not None:
            sub = self.verifier.subject(token)
            found = self.tenants.get(sub)
            if found is None:
                raise unauthorized("the token's sub is not a tenant")
            return found
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        match: Tenant | None = None
        for key, t in self._keys:  # every key compared: the time taken says nothing about which matched
            if hmac.compare_digest(key, digest):
                match = t
        if match is None:
            raise unauthorized("the token is not valid here")
        return match


def require(cond: bool, error: ApiError) -> None:
    if not cond:
        raise error
