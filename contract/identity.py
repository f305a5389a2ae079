"""The identity step's request and answer: who to swap in, decided once per job.

The controller writes the request (``identity-request.json``) and a pending answer
(``identity.json``, contract/layout.py); ``python -m runner_image identity`` replaces the answer;
every chunk runner waits for it and reads it (docs/architecture.md, "The identity step").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from contract.errors import ManifestError
from contract.identity_table import Identity, check_table, read_table, table_dict
from contract.manifest import (
    DETECTOR_SIZE,
    DETECTOR_THRESHOLD,
    PROVIDERS,
    SCHEMA_IDENTITIES,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    Limits,
)
from contract.manifest_fields import number_field, text_field
from contract.paths import require_container_path
from contract.s3 import StorageAccess, is_s3, require_location


@dataclass(frozen=True)
class IdentityRequest:
    """What ``python -m runner_image identity`` embeds once per job at submit (container paths).

    The controller writes it to ``runs/<job>/identity-request.json``; the answer (IdentityResult)
    goes to ``output``, and its embeddings into every chunk manifest, so every chunk (and every
    video segment) swaps in and selects the same person.
    """

    job: str
    pack_dir: str
    sources: tuple[str, ...]
    output: str  # e.g. /data/runs/<job>/identity.json
    providers: tuple[str, ...] = ("cuda", "cpu")
    reference: str | None = None
    detector_threshold: float = DETECTOR_THRESHOLD
    detector_size: int = DETECTOR_SIZE
    limits: Limits = field(default_factory=Limits)
    schema: int = SCHEMA_VERSION
    # Schema 2 (job-file ``pairs``): every distinct person, id → photos; ``sources`` is then empty
    # and the answer holds one embedding (or one error) per id.
    identities: dict[str, Identity] = field(default_factory=dict, hash=False)
    # How to reach the store when a photo is s3:// (required then; contract/s3.py).
    storage: StorageAccess | None = None

    def __post_init__(self) -> None:
        if self.schema not in SCHEMA_VERSIONS:
            raise ManifestError(f"unknown identity request schema version {self.schema!r}")
        if not self.job:
            raise ManifestError("identity request: job is empty")
        if (self.schema == SCHEMA_IDENTITIES) != bool(self.identities) or (bool(self.sources) == bool(self.identities)):
            raise ManifestError("identity request: version 1 names source photos, version 2 an identity table")
        check_table(self.identities)
        for p in self.providers:
            if p not in PROVIDERS:
                raise ManifestError(f"unknown provider {p!r}")
        for s in self.sources:
            require_location(s, "source")
        require_container_path(self.pack_dir, "pack_dir")
        require_container_path(self.output, "output")
        if self.reference is not None:
            require_location(self.reference, "reference")
        if self.storage is not None and not isinstance(self.storage, StorageAccess):
            raise ManifestError("storage: not a StorageAccess")
        photos = [*self.sources, *([self.reference] if self.reference else []),
                  *(p for person in self.identities.values() for p in person.sources)]  # fmt: skip
        if self.storage is None and any(is_s3(p) for p in photos):
            raise ManifestError("identity request: an s3:// photo needs the request's storage block")
        if not 0.0 <= self.detector_threshold <= 1.0:
            raise ManifestError(f"detector_threshold must be in [0, 1], got {self.detector_threshold!r}")
        if self.detector_size % 32 or not 160 <= self.detector_size <= 2048:
            raise ManifestError(f"detector_size must be a multiple of 32 from 160 to 2048, got {self.detector_size!r}")

    def to_json(self) -> str:
        data = {f: getattr(self, f) for f in ("job", "pack_dir", "sources", "output", "providers", "reference")}
        data.update(detector_threshold=self.detector_threshold, detector_size=self.detector_size, schema=self.schema)
        data["limits"] = asdict(self.limits)
        if self.identities:
            data["identities"] = table_dict(self.identities)
        if self.storage is not None:
            data["storage"] = self.storage.to_dict()
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IdentityRequest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"identity request is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ManifestError("identity request must be a JSON object")
        if data.get("schema") not in SCHEMA_VERSIONS or isinstance(data.get("schema"), bool):
            raise ManifestError(f"unknown identity request schema version {data.get('schema')!r}")
        try:
            ref = data.get("reference")
            return cls(
                job=text_field(data, "job"),
                pack_dir=text_field(data, "pack_dir"),
                sources=tuple(str(s) for s in data["sources"]),
                output=text_field(data, "output"),
                providers=tuple(str(p) for p in data.get("providers", ["cuda", "cpu"])),
                reference=None if ref is None else str(ref),
                detector_threshold=number_field(
                    data.get("detector_threshold", DETECTOR_THRESHOLD), "detector_threshold"
                ),
                detector_size=int(data.get("detector_size", DETECTOR_SIZE)),
                limits=Limits(**data.get("limits", {})),
                schema=int(data["schema"]),
                identities=read_table(data.get("identities", {})),
                storage=None if data.get("storage") is None else StorageAccess.from_dict(data["storage"]),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"malformed identity request: {type(e).__name__}: {e}") from e


@dataclass(frozen=True)
class SourceFaces:
    path: str  # container path of one photo
    faces: int  # faces found in it


@dataclass(frozen=True)
class IdentityResult:
    """The answer to an IdentityRequest. ``error`` set: the job cannot run (the subcommand exits 66)
    and it says which photo and why; the embeddings are then empty/None. ``pending``: the step has
    not answered yet (what the controller writes when it creates the run folder)."""

    source_embedding: tuple[float, ...] = ()  # mean of the sources' normed embeddings, renormalised
    reference_embedding: tuple[float, ...] | None = None
    sources: tuple[SourceFaces, ...] = ()
    error: str | None = None
    provider: str | None = None
    pending: bool = False
    # A job with ``pairs``: id → that person's embedding, or the error that fails only the items
    # using it (no face, several faces, an unreadable photo). ``error`` stays for the whole job's
    # problems (the reference photo).
    identities: dict[str, Identity] = field(default_factory=dict, hash=False)

    @property
    def answered(self) -> bool:
        """The step has answered with the embeddings (not pending, no error)."""
        return not self.pending and not self.error and (bool(self.source_embedding) or bool(self.identities))

    def to_json(self) -> str:
        names = ("source_embedding", "reference_embedding", "error", "provider", "pending")
        data = {f: getattr(self, f) for f in names}
        data["sources"] = [asdict(s) for s in self.sources]
        if self.identities:
            data["identities"] = table_dict(self.identities)
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IdentityResult:
        try:
            data = json.loads(text)
            ref = data.get("reference_embedding")
            return cls(
                source_embedding=tuple(float(v) for v in data.get("source_embedding", ())),
                reference_embedding=None if ref is None else tuple(float(v) for v in ref),
                sources=tuple(SourceFaces(path=str(s["path"]), faces=int(s["faces"])) for s in data.get("sources", ())),
                error=data.get("error"),
                provider=data.get("provider"),
                pending=bool(data.get("pending", False)),
                identities=read_table(data.get("identities", {})),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ManifestError(f"malformed identity result: {type(e).__name__}: {e}") from e
