"""Who is asking: ``Authorization: Bearer <API key or JWT>`` → a configured tenant, or 401.

API keys are stored only as sha256 digests (config ``tenants.<t>.api_keys_sha256``); the digest of
the presented key is compared with every stored one in constant time. JWTs (PyJWT) are accepted
only with the configured algorithms (pinned: a token's own ``alg`` header never chooses), must carry
the configured ``aud`` (and ``iss`` when configured), ``exp`` and ``iat``, and may live at most
``api.jwt.max_lifetime`` (``exp − iat``; an ``iat`` in the future is refused). The tenant is the
token's ``api.jwt.tenant_claim`` claim, or the tenant whose ``jwt_subjects`` lists its ``sub``
(when both are there they must agree); a bare ``sub`` naming a tenant is not enough: an identity
provider's subjects are its users, not this API's tenants. Key files are read once, when the API
starts; an HMAC secret under 32 bytes is refused then. A 401 never says which tenants or keys exist.

A signed link (controller/run/links.py) lets its holder in without a token, to that one path only.
Refusals: 403 ``link_expired`` (past its expiry), ``bad_link`` (an expiry further away than
``api.link_ttl``, however well signed), ``bad_signature`` (tampered, an unknown key, or no key id)
and ``link_revoked``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from controller.api.errors import ApiError, unauthorized
from controller.apiconfig import MIN_HMAC_SECRET, JwtSettings, Tenant
from controller.errors import ConfigError
from controller.run import links

MAX_TOKEN = 8192
CLOCK_SKEW = 60  # seconds an iat may lie ahead of this host's clock


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
        if settings.hmac and len(raw.strip()) < MIN_HMAC_SECRET:
            raise ConfigError(
                f"api.jwt.secret_file {settings.key_file} holds a secret of fewer than {MIN_HMAC_SECRET} bytes: "
                f"an HMAC secret for {settings.algorithms[0]} must be at least {MIN_HMAC_SECRET} random bytes"
            )
        return cls(settings, raw.strip() if settings.hmac else raw.decode("ascii", "replace"))

    def claims(self, token: str, now: float | None = None) -> dict[str, Any]:
        """The token's claims once its signature, algorithm, audience, issuer and lifetime check out."""
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self.key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                options={"require": ["exp", "iat"]},
            )
        except jwt.ExpiredSignatureError:
            raise unauthorized("the token has expired") from None
        except jwt.InvalidTokenError:
            raise unauthorized("the token is not valid here (signature, algorithm, audience or claims)") from None
        exp, iat = claims["exp"], claims["iat"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (exp, iat)):
            raise unauthorized("the token's exp and iat must be numbers")
        if iat > (time.time() if now is None else now) + CLOCK_SKEW:
            raise unauthorized("the token's iat is in the future")
        if exp - iat > s.max_lifetime:
            raise unauthorized(f"the token lives longer than this API allows ({s.max_lifetime} s from iat to exp)")
        return claims


class Authenticator:
    def __init__(self, tenants: Mapping[str, Tenant], verifier: JwtVerifier | None) -> None:
        self.tenants = dict(tenants)
        self.verifier = verifier
        self._keys = [(bytes.fromhex(k), t) for t in tenants.values() for k in t.api_keys_sha256]
        self._subjects = {sub: t for t in tenants.values() for sub in t.jwt_subjects}

    def tenant(self, authorization: str | None) -> Tenant:
        if not authorization:
            raise unauthorized()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN:
            raise unauthorized()
        if token.count(".") == 2 and self.verifier is not None:
            return self._jwt_tenant(self.verifier.claims(token), self.verifier.settings.tenant_claim)
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        match: Tenant | None = None
        for key, t in self._keys:  # every key compared: the time taken says nothing about which matched
            if hmac.compare_digest(key, digest):
                match = t
        if match is None:
            raise unauthorized("the token is not valid here")
        return match

    def _jwt_tenant(self, claims: Mapping[str, Any], claim: str) -> Tenant:
        named = claims.get(claim)
        sub = claims.get("sub")
        by_sub = self._subjects.get(sub) if isinstance(sub, str) else None
        if named is None and by_sub is None:
            raise unauthorized(f"the token names no tenant (claim {claim}, or a sub in tenants.<t>.jwt_subjects)")
        if named is not None and (not isinstance(named, str) or named not in self.tenants):
            raise unauthorized(f"the token's {claim} is not a tenant here")
        if named is not None and by_sub is not None and by_sub.name != named:
            raise unauthorized(f"the token's {claim} and sub name different tenants")
        found = self.tenants[named] if isinstance(named, str) else by_sub
        if found is None:
            raise unauthorized("the token names no tenant")
        return found


def require(cond: bool, error: ApiError) -> None:
    if not cond:
        raise error


# -- signed links ----------------------------------------------------------------------------------------
def _number(text: str, what: str, digits: int) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > digits:
        raise ApiError(403, "bad_signature", f"the link's {what} is not a number")
    return int(text)


def verify_link(
    keys: links.SigningKeys | None,
    method: str,
    path: str,
    query: Mapping[str, str],
    ttl: int,
    now: float | None = None,
) -> int:
    """The link's generation, once its key, signature and expiry check out (its job's owner and
    revocation are the caller's to check, with ``check_link_generation``); raises a 401/403 ApiError."""
    if keys is None:
        raise ApiError(401, "unauthorized", "signed links are off on this API (no api.signing_key_file)")
    expires = _number(query.get("expires", ""), "expires", 12)
    kid = query.get("kid", "")
    if not kid:
        raise ApiError(403, "bad_signature", "the link has no key id (made by an older version); ask for a new one")
    key = keys.find(kid)
    if key is None:
        raise ApiError(403, "bad_signature", "the link's key is not accepted here (rotated out); ask for a new one")
    generation = _number(query.get("gen", ""), "gen", len(str(links.MAX_GENERATION)))
    want = links.signature(key, method, path, expires, kid, generation)
    sig = query.get("sig", "")
    if not hmac.compare_digest(want.encode(), sig.lower().encode("utf-8", "replace")):  # any text, never a 500
        raise ApiError(403, "bad_signature", "the link's signature does not match")
    current = time.time() if now is None else now
    if expires < current:
        raise ApiError(403, "link_expired", "the link has expired; ask for a new one")
    if expires > current + ttl:
        raise ApiError(403, "bad_link", "the link's expiry is further away than this API allows (api.link_ttl)")
    return generation


def check_link_generation(data_root: Path, tenant: str, job: str, link_generation: int) -> None:
    """403 ``link_revoked`` for a link made before the job's links were last revoked."""
    if link_generation < links.generation(data_root, tenant, job):
        raise ApiError(403, "link_revoked", "the job's links were revoked; ask for a new one")
