"""The identity table of a version 2 manifest: who each item swaps in (job-file ``pairs``).

A job with ``pairs`` swaps a different person into each target. Its manifests (schema version 2)
carry a table ``id → Identity``: the photos of one person, and either the embedding itself or
nothing, when the job's identity step (identity.json, ``Manifest.identity``) holds it under the same
id. Each item names its identity. A person whose photos show no face (or several) has ``error`` set
in the step's answer: only the items that use it fail, each naming the photo.

Standard library only; parsed as hostile (ids, container paths, sizes, finite numbers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.errors import ManifestError
from contract.s3 import require_location

IDENTITY_ID = re.compile(r"s[0-9]{6,9}")  # s000042: the 43rd distinct source of a job
MAX_IDENTITIES = 1_000_000  # far above the policy's targets maximum
MAX_PHOTOS = 64  # photos of one person
MAX_EMBEDDING = 4096
MAX_ERROR = 4096


def identity_id(index: int) -> str:
    return f"s{index:06d}"


@dataclass(frozen=True)
class Identity:
    """One person: container paths (or s3:// objects) of their photos, and their embedding when it is known here
    (else the job's identity.json has it under the same id). ``error``: why it has none (no face,
    several faces, an unreadable photo), naming the photo as the user wrote it."""

    sources: tuple[str, ...]
    embedding: tuple[float, ...] | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sources, tuple) or not 1 <= len(self.sources) <= MAX_PHOTOS:
            raise ManifestError(f"an identity needs 1 to {MAX_PHOTOS} source photos")
        for s in self.sources:
            require_location(s, "identity source")
        if self.embedding is not None:
            check_embedding(self.embedding, "identity embedding")
        if self.error is not None and (not isinstance(self.error, str) or len(self.error) > MAX_ERROR):
            raise ManifestError(f"an identity's error must be text of at most {MAX_ERROR} characters")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"sources": list(self.sources)}
        if self.embedding is not None:
            data["embedding"] = list(self.embedding)
        if self.error is not None:
            data["error"] = self.error
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Identity:
        if not isinstance(data, dict) or not {"sources"} <= set(data) <= {"sources", "embedding", "error"}:
            raise ManifestError("an identity is not {sources[, embedding, error]}")
        sources = data["sources"]
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise ManifestError("an identity's sources must be a list of paths")
        embedding = data.get("embedding")
        return cls(
            sources=tuple(sources),
            embedding=None if embedding is None else check_embedding(embedding, "identity embedding"),
            error=data.get("error"),
        )


def check_embedding(value: Any, name: str) -> tuple[float, ...]:
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_EMBEDDING:
        raise ManifestError(f"{name} must be a list of 1 to {MAX_EMBEDDING} numbers")
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if not ok:
        raise ManifestError(f"{name} must hold finite numbers only")
    return tuple(float(v) for v in value)


def check_id(value: Any) -> str:
    if not isinstance(value, str) or not IDENTITY_ID.fullmatch(value):
        raise ManifestError(f"identity id {str(value)[:40]!r} is not s followed by 6 to 9 digits")
    return value


def read_table(data: Any) -> dict[str, Identity]:
    """A table as JSON gave it: an object of id → identity."""
    if not isinstance(data, dict) or len(data) > MAX_IDENTITIES:
        raise ManifestError(f"identities must be an object of at most {MAX_IDENTITIES} entries")
    return {check_id(k): Identity.from_dict(v) for k, v in data.items()}


def table_dict(table: Mapping[str, Identity]) -> dict[str, Any]:
    return {k: v.to_dict() for k, v in sorted(table.items())}


def check_table(table: Mapping[str, Identity]) -> None:
    """A table built in code: ids and entries of the right kinds (entries check themselves)."""
    if len(table) > MAX_IDENTITIES:
        raise ManifestError(f"more than {MAX_IDENTITIES} identities")
    for k, v in table.items():
        check_id(k)
        if not isinstance(v, Identity):
            raise ManifestError(f"identity {k}: not an Identity")


def check_people(version_1: bool, table: Any, source: tuple[str, ...], items: Iterable[Any]) -> None:
    """A manifest's people. Version 1: the job's source photos, no identities. Version 2: an
    identity table, every item (``.id``, ``.identity``) naming one of its entries, no job-wide source."""
    if version_1:
        if table or any(i.identity is not None for i in items):
            raise ManifestError("identities need manifest schema version 2")
        if not source:
            raise ManifestError("manifest has no source photo")
        return
    if not isinstance(table, dict) or not table:
        raise ManifestError("manifest schema version 2 needs an identity table (identities)")
    check_table(table)
    if source:
        raise ManifestError("a version 2 manifest names its photos in the identity table, not in source")
    for i in items:
        if i.identity is None or i.identity not in table:
            raise ManifestError(f"item {i.id}: identity {i.identity!r} is not in the manifest's identity table")
