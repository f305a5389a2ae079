"""Items and chunks: a resolved job cut into chunk manifests (pure; no Docker, no files written)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from runner_image.manifest import (
    CONTAINER_DATA_ROOT,
    REFERENCE_DISTANCE,
    FaceSelection,
    Item,
    Manifest,
    NoFacePolicy,
)


@dataclass(frozen=True)
class PlannedItem:
    id: str  # i000042: stable across attempts and resubmits
    input: str  # path relative to the data root
    output: str  # path relative to the data root
    kind: str  # image | video


@dataclass(frozen=True)
class Chunk:
    id: str  # c0007
    items: tuple[str, ...]  # item ids


@dataclass(frozen=True)
class Plan:
    job: str
    items: tuple[PlannedItem, ...]
    chunks: tuple[Chunk, ...]

    def item(self, item_id: str) -> PlannedItem:
        return self._by_id()[item_id]

    def _by_id(self) -> dict[str, PlannedItem]:
        return {i.id: i for i in self.items}

    def to_json(self) -> str:
        return json.dumps(
            {
                "job": self.job,
                "items": [asdict(i) for i in self.items],
                "chunks": [{"id": c.id, "items": list(c.items)} for c in self.chunks],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(
            job=data["job"],
            items=tuple(PlannedItem(**i) for i in data["items"]),
            chunks=tuple(Chunk(id=c["id"], items=tuple(c["items"])) for c in data["chunks"]),
        )


@dataclass(frozen=True)
class TargetRef:
    """What planning needs of a target: paths relative to the data root and its kind."""

    input: str
    output: str
    kind: str


def item_id(index: int) -> str:
    return f"i{index:06d}"


def chunk_id(index: int) -> str:
    return f"c{index:04d}"


def make_plan(job: str, targets: list[TargetRef], chunk_size: int) -> Plan:
    if chunk_size < 1:
        raise ValueError("chunk_size must be ≥ 1")
    items = tuple(
        PlannedItem(id=item_id(n), input=t.input, output=t.output, kind=t.kind) for n, t in enumerate(targets)
    )
    chunks = tuple(
        Chunk(id=chunk_id(n), items=tuple(i.id for i in items[start : start + chunk_size]))
        for n, start in enumerate(range(0, len(items), chunk_size))
    )
    return Plan(job=job, items=items, chunks=chunks)


@dataclass(frozen=True)
class ManifestSettings:
    """The job-wide part of every manifest."""

    pack: str
    sources: tuple[str, ...]  # relative to the data root
    processors: tuple[str, ...]
    providers: tuple[str, ...]
    faces: FaceSelection
    no_face: NoFacePolicy
    # From the identity subcommand run at submit (runner_image.manifest.IdentityResult).
    source_embedding: tuple[float, ...] | None = None
    reference_embedding: tuple[float, ...] | None = None
    reference_distance: float = REFERENCE_DISTANCE


def _c(rel: str) -> str:
    return f"{CONTAINER_DATA_ROOT}/{rel}"


def chunk_manifests(plan: Plan, settings: ManifestSettings) -> dict[str, Manifest]:
    by_id = {i.id: i for i in plan.items}
    return {
        c.id: Manifest(
            job=plan.job,
            chunk=c.id,
            run_dir=_c(f"runs/{plan.job}"),
            pack_dir=_c(f"models/{settings.pack}"),
            source=tuple(_c(s) for s in settings.sources),
            items=tuple(Item(id=i, input=_c(by_id[i].input), output=_c(by_id[i].output)) for i in c.items),
            processors=settings.processors,
            providers=settings.providers,
            faces=settings.faces,
            no_face=settings.no_face,
            source_embedding=settings.source_embedding,
            reference_embedding=settings.reference_embedding,
            reference_distance=settings.reference_distance,
        )
        for c in plan.chunks
    }
