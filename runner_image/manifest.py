"""The chunk manifest: the one contract between the controller and the runner.

Stdlib only. The controller imports this module to write manifests; the runner imports it to read
them. Every path in a manifest is a *container* path (under ``/data``), never a host path, so a
manifest means the same thing on every node. A manifest never changes once written: retries of a
chunk read the same file, and the attempt number arrives through ``FFSWARM_ATTEMPT``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from typing import Any

SCHEMA_VERSION = 1
CONTAINER_DATA_ROOT = "/data"

ENV_MANIFEST = "FFSWARM_MANIFEST"
ENV_ATTEMPT = "FFSWARM_ATTEMPT"
ENV_GPU = "DOCKER_RESOURCE_GPU"

PROCESSORS = ("face_swapper", "face_enhancer")
PROVIDERS = ("cuda", "cpu")


class FaceSelection(StrEnum):
    MANY = "many"
    ONE = "one"
    REFERENCE = "reference"


class NoFacePolicy(StrEnum):
    COPY = "copy"  # output = input, item status no_face
    SKIP = "skip"  # no output written, item status no_face
    FAIL = "fail"  # item status error (runner exit 3)


class ItemStatus(StrEnum):
    OK = "ok"
    NO_FACE = "no_face"
    ERROR = "error"

    def is_failure(self) -> bool:
        return self is ItemStatus.ERROR


class ManifestError(ValueError):
    """The manifest is malformed or of an unknown schema version (runner exit 65)."""


@dataclass(frozen=True)
class Item:
    id: str  # stable across attempts, e.g. "i000042"
    input: str  # container path of the target
    output: str  # container path of the output file

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            _require_container_path(getattr(self, name), f"item {self.id}: {name}")
        if not self.id:
            raise ManifestError("item id is empty")


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 100 * 1024 * 1024
    max_pixels: int = 64_000_000


@dataclass(frozen=True)
class Manifest:
    job: str
    chunk: str  # "c0007"
    run_dir: str  # container path of runs/<job>
    pack_dir: str  # container path of models/<pack>
    source: tuple[str, ...]  # container paths of source photos (one person)
    items: tuple[Item, ...]
    processors: tuple[str, ...] = ("face_swapper",)
    providers: tuple[str, ...] = ("cuda", "cpu")
    faces: FaceSelection = FaceSelection.MANY
    no_face: NoFacePolicy = NoFacePolicy.COPY
    limits: Limits = field(default_factory=Limits)
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema != SCHEMA_VERSION:
            raise ManifestError(f"unknown manifest schema version {self.schema!r} (this runner reads {SCHEMA_VERSION})")
        if not self.items:
            raise ManifestError("manifest has no items")
        if not self.source:
            raise ManifestError("manifest has no source photo")
        for p in self.processors:
            if p not in PROCESSORS:
                raise ManifestError(f"unknown processor {p!r}")
        for p in self.providers:
            if p not in PROVIDERS:
                raise ManifestError(f"unknown provider {p!r}")
        for name in ("run_dir", "pack_dir"):
            _require_container_path(getattr(self, name), name)
        for s in self.source:
            _require_container_path(s, "source")
        ids = [i.id for i in self.items]
        if len(set(ids)) != len(ids):
            raise ManifestError("duplicate item ids")

    @property
    def results_path(self) -> str:
        return f"{self.run_dir}/results/{self.chunk}.jsonl"

    def log_path(self, attempt: int) -> str:
        return f"{self.run_dir}/logs/{self.chunk}.a{attempt}.log"

    def to_json(self) -> str:
        data = asdict(self)
        data["faces"] = self.faces.value
        data["no_face"] = self.no_face.value
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"manifest is not JSON: {e}") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise ManifestError("manifest must be a JSON object")
        if data.get("schema") != SCHEMA_VERSION:
            raise ManifestError(
                f"unknown manifest schema version {data.get('schema')!r} (this runner reads {SCHEMA_VERSION})"
            )
        try:
            return cls(
                job=_str(data, "job"),
                chunk=_str(data, "chunk"),
                run_dir=_str(data, "run_dir"),
                pack_dir=_str(data, "pack_dir"),
                source=tuple(str(s) for s in data["source"]),
                items=tuple(
                    Item(id=str(i["id"]), input=str(i["input"]), output=str(i["output"])) for i in data["items"]
                ),
                processors=tuple(str(p) for p in data.get("processors", ["face_swapper"])),
                providers=tuple(str(p) for p in data.get("providers", ["cuda", "cpu"])),
                faces=FaceSelection(data.get("faces", "many")),
                no_face=NoFacePolicy(data.get("no_face", "copy")),
                limits=Limits(**data.get("limits", {})),
                schema=int(data["schema"]),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"malformed manifest: {type(e).__name__}: {e}") from e


@dataclass(frozen=True)
class ItemResult:
    """One line of results/<chunk>.jsonl: one item, one attempt."""

    item: str
    status: ItemStatus
    attempt: int
    input: str
    output: str | None  # None when nothing was written (error, or no_face with skip)
    reason: str | None = None
    faces: int = 0
    cached: bool = False  # True: committed by an earlier attempt, not redone
    gpu: str | None = None  # DOCKER_RESOURCE_GPU the container saw
    provider: str | None = None
    started: float = 0.0  # unix time
    finished: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds

    def to_line(self) -> str:
        data = asdict(self)
        data["status"] = self.status.value
        return json.dumps(data, sort_keys=True) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ItemResult:
        data = json.loads(line)
        data["status"] = ItemStatus(data["status"])
        return cls(**data)


def read_results(text: str) -> list[ItemResult]:
    """Parse a results file; a torn last line (writer killed mid-append) is ignored."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(ItemResult.from_line(line))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def _str(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise ManifestError(f"manifest field {key!r} must be a non-empty string")
    return value


def _require_container_path(path: str, what: str) -> None:
    if not isinstance(path, str) or not (path == CONTAINER_DATA_ROOT or path.startswith(CONTAINER_DATA_ROOT + "/")):
        raise ManifestError(f"{what}: {path!r} is not a path under {CONTAINER_DATA_ROOT}")
    if "/../" in path + "/" or "/./" in path + "/":
        raise ManifestError(f"{what}: {path!r} is not normalised")


class RunnerExit(int, Enum):
    """The runner's exit codes (DESIGN.md): what kind of ending a chunk attempt had."""

    OK = 0  # every item ok, no_face (copy/skip), or already done
    ITEMS_FAILED = 3  # finished; some items failed for their own reasons
    BAD_MANIFEST = 65  # malformed manifest / unknown schema: no retry
    MISSING_INPUT = 66  # source photo or model pack missing or wrong checksum: no retry
    INTERNAL = 70  # bug: retry, counts against retries
    TEMPORARY = 75  # shared volume unavailable, GPU/provider init failed: retry elsewhere
