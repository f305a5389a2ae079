"""Signed links: ``?expires=UNIX&kid=K&gen=G&sig=HEX``, valid without a token; made here, checked
by the API (controller/api/auth.py ``verify_link``).

``sig`` is HMAC-SHA256 over ``METHOD\\nPATH\\nEXPIRES\\nKID\\nGEN`` made with the API's key (config
``api.signing_key_file``, shared by every replica). ``kid`` names the key: the first hex digits of
its sha256, so a link made with a key listed in ``api.previous_signing_key_files`` still verifies
while the key is being rotated. ``gen`` is the job's link generation: ``POST
/v1/jobs/{id}/links/revoke`` raises it (a record beside the job's owner record,
``tenants/.jobs/<t>/<job>.links``, written only here), and every link of a lower generation is
refused from then on; links made after the revoke carry the new one.

The API signs the links it answers with; `serve` signs the one a tenant job's completion webhook
carries (controller/run/hooks.py), with the same key file and ttl: so this sits below both."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from contract.layout import RECORDS, TENANTS
from controller.job.owners import JOB_ID
from controller.volume import read_nofollow, write_atomic

KID_LENGTH = 12  # hex digits of the key's sha256: names the key, says nothing usable about it
MAX_GENERATION = 10**9
_REVOKED_FOREVER = MAX_GENERATION + 1  # a record that cannot be read back: no link of the job counts


def results_path(job: str) -> str:
    return f"/v1/jobs/{job}/results.zip"


def read_key(path: Path) -> bytes:
    """The signing key: the file's bytes, surrounding whitespace stripped (as the API reads it);
    OSError or ValueError (empty) name the file, never its content."""
    key = path.read_bytes().strip()
    if not key:
        raise ValueError(f"{path} is empty")
    return key


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:KID_LENGTH]


@dataclass(frozen=True)
class SigningKeys:
    """The key links are made with, and the previous ones that still verify during a rotation."""

    current: bytes
    previous: tuple[bytes, ...] = ()

    def find(self, kid: str) -> bytes | None:
        """The key named ``kid`` (any text a client sent: compared as bytes, never a 500)."""
        asked = kid.encode("utf-8", "replace")
        for key in (self.current, *self.previous):
            if hmac.compare_digest(key_id(key).encode(), asked):
                return key
        return None


def absolute(public_url: str | None, link: str) -> str:
    """A link made absolute with ``api.public_url`` when it is set (the signature covers the API's
    own path, so a proxy that adds a path prefix still delivers a valid link)."""
    return link if public_url is None else public_url.rstrip("/") + link


def signature(key: bytes, method: str, path: str, expires: int, kid: str, generation: int) -> str:
    text = f"{method.upper()}\n{path}\n{expires}\n{kid}\n{generation}"
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(keys: SigningKeys, method: str, path: str, ttl: int, generation: int = 0, now: float | None = None) -> str:
    """``path?expires=…&kid=…&gen=…&sig=…``, valid for ``ttl`` seconds, made with the current key."""
    expires = int((time.time() if now is None else now) + ttl)
    kid = key_id(keys.current)
    sig = signature(keys.current, method, path, expires, kid, generation)
    return f"{path}?{urlencode({'expires': expires, 'kid': kid, 'gen': generation, 'sig': sig})}"


# -- revocation ------------------------------------------------------------------------------------------
def revocation_file(data_root: Path, tenant: str, job: str) -> Path:
    """Beside the job's owner record: the API's folder, which no runner can write."""
    if not JOB_ID.fullmatch(job):
        raise ValueError("not a job id")
    return data_root / TENANTS / RECORDS / tenant / f"{job}.links"


def generation(data_root: Path, tenant: str, job: str) -> int:
    """The job's link generation: 0 until its links were first revoked. A record that is there but
    cannot be read back as one (a link, a folder, other content) revokes every link."""
    path = revocation_file(data_root, tenant, job)
    data = read_nofollow(path, 256)
    if data is None:
        return 0 if not _lexists(path) else _REVOKED_FOREVER
    try:
        value = json.loads(data)["generation"]
    except (ValueError, KeyError, TypeError):
        return _REVOKED_FOREVER
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GENERATION
    return value if ok else _REVOKED_FOREVER


def revoke(data_root: Path, tenant: str, job: str) -> int:
    """Every link of the job issued so far stops working; returns the new generation."""
    new = min(generation(data_root, tenant, job) + 1, MAX_GENERATION)
    write_atomic(revocation_file(data_root, tenant, job), json.dumps({"job": job, "generation": new}).encode())
    return new


def _lexists(path: Path) -> bool:
    try:
        path.lstat()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
