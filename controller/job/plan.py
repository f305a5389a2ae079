"""Items and chunks: a resolved job cut into chunk manifests (pure; no Docker, no files written).

A video target is planned as one ``PlannedVideo`` (what the user sees: input, output, outcome) plus
one work item per segment (kind ``segment``), which chunks like images do (``chunk_size`` counts
segments). Segment outputs live in the run folder and are joined by the controller
(controller/run/join.py) once all of a video's segments are committed.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from contract.errors import ManifestError
from contract.ffmpeg import SEGMENT_EXT
from contract.identity_table import IDENTITY_ID, Identity
from contract.layout import DataRootLayout, RunLayout
from contract.manifest import (
    DETECTOR_SIZE,
    DETECTOR_THRESHOLD,
    ENHANCER_BLEND,
    ENHANCER_MODEL,
    ENHANCER_WEIGHT,
    FRAME_ENHANCER_BLEND,
    IDENTITY_TIMEOUT,
    MASK_FEATHER,
    MASK_PADDING,
    REFERENCE_DISTANCE,
    SCHEMA_IDENTITIES,
    SCHEMA_VERSION,
    FaceSelection,
    Item,
    Manifest,
    NoFacePolicy,
    Segment,
)
from contract.masks import Masks
from contract.paths import CONTAINER_DATA_ROOT
from contract.photo import PhotoTuning
from contract.s3 import StorageAccess, is_s3
from contract.selector import Selector
from contract.swapper import SwapperTuning
from controller.job.chunk_size import AUTO_MAX_CHUNK as AUTO_MAX_CHUNK  # re-exported: callers name plan
from controller.job.chunk_size import auto_chunk_size as auto_chunk_size
from controller.job.paths import check_location

ID = re.compile(r"[a-z0-9-]+")  # job, chunk and item ids


@dataclass(frozen=True)
class PlannedItem:
    id: str  # i000042: stable across attempts and resubmits
    input: str  # path relative to the data root, or an object's s3:// URL
    output: str  # path relative to the data root, or an object's s3:// URL
    kind: str  # image | segment (of a video: see Plan.videos)
    parent: str | None = None  # segment: the video's item id
    segment: Segment | None = None
    identity: str | None = None  # a pairs job: its person (s000003), as in the manifests

    def to_dict(self) -> dict[str, Any]:
        # By hand, not dataclasses.asdict (which deep-copies): plan.json of 5,000 items is written
        # before the first chunk can start. An image item carries no video keys.
        data: dict[str, Any] = {"id": self.id, "input": self.input, "output": self.output, "kind": self.kind}
        if self.parent is not None:
            data["parent"] = self.parent
        if self.segment is not None:
            data["segment"] = asdict(self.segment)
        if self.identity is not None:
            data["identity"] = self.identity
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannedItem:
        seg = data.get("segment")
        return cls(**{**data, "segment": Segment(**seg) if seg else None})


@dataclass(frozen=True)
class PlannedVideo:
    """A video target: ``segments`` are the ids of its segment items, in order; ``error`` is set
    when probing failed at plan time (the item fails with that reason and has no segments)."""

    id: str
    input: str
    output: str
    segments: tuple[str, ...] = ()
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # probe facts: frames, fps, duration, audio …


@dataclass(frozen=True)
class Chunk:
    id: str  # c0007
    items: tuple[str, ...]  # item ids


@dataclass(frozen=True)
class Plan:
    job: str
    items: tuple[PlannedItem, ...]
    chunks: tuple[Chunk, ...]
    videos: tuple[PlannedVideo, ...] = ()

    def item(self, item_id: str) -> PlannedItem:
        return self._by_id[item_id]

    @cached_property
    def _by_id(self) -> dict[str, PlannedItem]:
        # Built once: the report looks up every item (rebuilding it per lookup made the report of a
        # 5,000-item job take 3 s).
        return {i.id: i for i in self.items}

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "job": self.job,
            "items": [i.to_dict() for i in self.items],
            "chunks": [{"id": c.id, "items": list(c.items)} for c in self.chunks],
        }
        if self.videos:
            data["videos"] = [asdict(v) for v in self.videos]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """plan.json read back from the shared volume, validated as hostile (ValueError naming what
        is wrong, never a traceback): ids reach service names, labels and stack files, so each must be
        an id (``^[a-z0-9-]+$``); paths reach the join and its clean-up, so each is relative and
        stays in the data root, and a segment's output is its own file in this job's run folder."""
        try:
            data = json.loads(text)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"plan.json is not JSON: {getattr(e, 'msg', None) or 'not UTF-8'}") from None
        return _plan_from_data(data)


MAX_PLAN_ENTRIES = 10_000_000  # items, chunks or videos: far above the policy's maxima
_ITEM_KEYS = {"id", "input", "output", "kind", "parent", "segment", "identity"}
_VIDEO_KEYS = {"id", "input", "output", "segments", "error", "info"}


def _id(value: Any) -> str:
    if not isinstance(value, str) or not ID.fullmatch(value) or len(value) > 200:
        raise ValueError(f"plan.json holds an id that is not a-z, 0-9 and - only: {value!r}")
    return value


def _list(data: dict[str, Any], key: str, required: bool = True) -> list[Any]:
    value = data.get(key, None if required else [])
    if not isinstance(value, list):
        raise ValueError(f"plan.json: {key} must be a list")
    if len(value) > MAX_PLAN_ENTRIES:
        raise ValueError(f"plan.json: {len(value)} {key}, over the limit of {MAX_PLAN_ENTRIES}")
    return value


def _item(data: Any, job: str) -> PlannedItem:
    if not isinstance(data, dict) or not {"id", "input", "output", "kind"} <= set(data) or set(data) - _ITEM_KEYS:
        raise ValueError("plan.json: an item is not {id, input, output, kind[, parent, segment, identity]}")
    iid = _id(data["id"])
    kind = data["kind"]
    if kind not in ("image", "segment"):
        raise ValueError(f"plan.json: item {iid}: kind {kind!r} is not image or segment")
    seg = data.get("segment")
    parent = data.get("parent")
    if (kind == "segment") != (seg is not None) or (kind == "segment") != (parent is not None):
        raise ValueError(f"plan.json: item {iid}: a segment item needs a segment and a parent, an image neither")
    segment = None
    if seg is not None:
        if not isinstance(seg, dict):
            raise ValueError(f"plan.json: item {iid}: segment must be an object")
        try:
            segment = Segment(**seg)
        except (TypeError, ManifestError) as e:
            raise ValueError(f"plan.json: item {iid}: bad segment ({type(e).__name__})") from None
    item = PlannedItem(
        id=iid,
        input=check_location(data["input"], f"plan.json: item {iid}: input"),
        output=check_location(data["output"], f"plan.json: item {iid}: output"),
        kind=kind,
        parent=None if parent is None else _id(parent),
        segment=segment,
        identity=_identity_id(data.get("identity"), iid),
    )
    if kind == "segment" and item.output != segment_output(job, iid):
        raise ValueError(f"plan.json: item {iid}: a segment's output must be {segment_output(job, iid)}")
    return item


def _identity_id(value: Any, iid: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not IDENTITY_ID.fullmatch(value)):
        raise ValueError(f"plan.json: item {iid}: identity is not an identity id")
    return value


def _video(data: Any, items: dict[str, PlannedItem]) -> PlannedVideo:
    if not isinstance(data, dict) or not {"id", "input", "output"} <= set(data) or set(data) - _VIDEO_KEYS:
        raise ValueError("plan.json: a video is not {id, input, output, segments, error, info}")
    vid = _id(data["id"])
    segments = _list(data, "segments", required=False)
    for s in segments:
        if not isinstance(s, str) or s not in items or items[s].parent != vid:
            raise ValueError(f"plan.json: video {vid}: segment {s!r} is not one of its segment items")
    error, info = data.get("error"), data.get("info", {})
    if error is not None and not isinstance(error, str) or not isinstance(info, dict):
        raise ValueError(f"plan.json: video {vid}: error must be text, info an object")
    return PlannedVideo(
        vid,
        check_location(data["input"], f"plan.json: video {vid}: input"),
        check_location(data["output"], f"plan.json: video {vid}: output"),
        tuple(segments),
        error,
        info,
    )


def _plan_from_data(data: Any) -> Plan:
    if not isinstance(data, dict):
        raise ValueError("plan.json must be a JSON object")
    job = _id(data.get("job"))
    raw_chunks = _list(data, "chunks")
    for c in raw_chunks:  # ids first: they are what a hostile file would smuggle into a stack
        _id(c.get("id") if isinstance(c, dict) else None)
    items = tuple(_item(i, job) for i in _list(data, "items"))
    by_id = {i.id: i for i in items}
    if len(by_id) != len(items):
        raise ValueError("plan.json: an item id appears twice")
    chunks: list[Chunk] = []
    placed: set[str] = set()
    for c in raw_chunks:
        members = c.get("items")
        if not isinstance(members, list) or not all(isinstance(i, str) and i in by_id for i in members):
            raise ValueError(f"plan.json: chunk {c['id']}: items must be ids of the plan's items")
        if placed & set(members) or len(set(members)) != len(members):
            raise ValueError(f"plan.json: chunk {c['id']}: an item is in more than one chunk")
        placed |= set(members)
        chunks.append(Chunk(id=c["id"], items=tuple(members)))
    if len({c.id for c in chunks}) != len(chunks):
        raise ValueError("plan.json: a chunk id appears twice")
    videos = tuple(_video(v, by_id) for v in _list(data, "videos", required=False))
    return Plan(job=job, items=items, chunks=tuple(chunks), videos=videos)


@dataclass(frozen=True)
class TargetRef:
    """What planning needs of a target: paths relative to the data root and its kind."""

    input: str
    output: str
    kind: str
    segments: tuple[Segment, ...] = ()  # video: its segments in order (controller/job/video.py)
    error: str | None = None  # video: why it cannot be processed (ffprobe's reason)
    info: dict[str, Any] = field(default_factory=dict)  # video: probe facts for the report
    identity: str | None = None  # a pairs job: its person's id (contract/identity_table.py)


def item_id(index: int) -> str:
    return f"i{index:06d}"


def chunk_id(index: int) -> str:
    return f"c{index:04d}"


def segment_output(job: str, segment_id: str) -> str:
    return str(RunLayout.relative(job).segment(segment_id, SEGMENT_EXT))


def make_plan(
    job: str, targets: list[TargetRef], chunk_size: int | str, parallel: int = 1, max_chunk: int = AUTO_MAX_CHUNK
) -> Plan:
    """Items in target order, cut into chunks of `chunk_size` (`auto`: see auto_chunk_size)."""
    if chunk_size == "auto":
        chunk_size = auto_chunk_size(len(targets), parallel, max_chunk)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError("chunk_size must be ≥ 1")
    work: list[PlannedItem] = []
    videos: list[PlannedVideo] = []
    for n, t in enumerate(targets):
        if t.kind != "video":
            work.append(PlannedItem(id=item_id(n), input=t.input, output=t.output, kind=t.kind, identity=t.identity))
            continue
        ids = tuple(f"{item_id(n)}-s{k:04d}" for k in range(len(t.segments)))
        videos.append(PlannedVideo(item_id(n), t.input, t.output, ids, t.error, dict(t.info)))
        for sid, seg in zip(ids, t.segments, strict=True):
            work.append(PlannedItem(sid, t.input, segment_output(job, sid), "segment", item_id(n), seg, t.identity))
    items = tuple(work)
    chunks = tuple(
        Chunk(id=chunk_id(n), items=tuple(i.id for i in items[start : start + chunk_size]))
        for n, start in enumerate(range(0, len(items), chunk_size))
    )
    return Plan(job=job, items=items, chunks=chunks, videos=tuple(videos))


@dataclass(frozen=True)
class ManifestSettings:
    """The job-wide part of every manifest."""

    pack: str
    sources: tuple[str, ...]  # relative to the data root
    processors: tuple[str, ...]
    providers: tuple[str, ...]
    faces: FaceSelection
    no_face: NoFacePolicy
    # The job's identity (contract/identity.py IdentityResult): given here, or — with
    # identity_timeout set — read by each runner from runs/<job>/identity.json, waiting up to that
    # many seconds for the submit-time identity step that runs beside the first chunks.
    source_embedding: tuple[float, ...] | None = None
    reference_embedding: tuple[float, ...] | None = None
    identity_timeout: float | None = None
    reference_distance: float = REFERENCE_DISTANCE
    # Tuning from the job file (detector, mask, face_enhancer); defaults as in the manifest.
    detector_threshold: float = DETECTOR_THRESHOLD
    detector_size: int = DETECTOR_SIZE
    mask_feather: float = MASK_FEATHER
    mask_padding: float = MASK_PADDING
    enhancer_blend: float = ENHANCER_BLEND
    enhancer_model: str = ENHANCER_MODEL
    enhancer_weight: float = ENHANCER_WEIGHT
    frame_enhancer_blend: float = FRAME_ENHANCER_BLEND
    overwrite: bool = False  # the job file's: outputs may replace files this job did not write
    selector: Selector = Selector()  # the job file's selector: face order, gender/age filters
    masks: Masks = Masks()  # the job file's mask.types and mask.regions
    swapper: SwapperTuning = SwapperTuning()  # the job file's face_swapper: model, pixel_boost, weight
    photo: PhotoTuning = PhotoTuning()  # the job file's photo: quality, scale
    # A pairs job: id → that person's photos (relative to the data root); ``sources`` is then empty
    # and the manifests are schema version 2, each with the identities its items use.
    identities: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # How runners reach the object store (the credentials file: the Swarm secret mounted in them);
    # given when the job names any s3:// object, and then in every manifest of the job.
    storage: StorageAccess | None = None
    # A pack with packing.linger: each chunk's runner may wait this long for the next pack, on the
    # hand-off file beside its manifest (contract/handoff.py, controller/run/lanes.py)
    linger: float = 0.0


def _c(rel: str) -> str:
    """A path relative to the data root as the runner sees it; an s3:// URL as it is."""
    return rel if is_s3(rel) else f"{CONTAINER_DATA_ROOT}/{rel}"


def _manifest_item(i: PlannedItem) -> Item:
    if i.segment is None:
        return Item(id=i.id, input=_c(i.input), output=_c(i.output), identity=i.identity)
    return Item(id=i.id, input=_c(i.input), output=_c(i.output), kind="video", segment=i.segment, identity=i.identity)


def _table(items: list[PlannedItem], settings: ManifestSettings) -> dict[str, Identity]:
    """The identities ``items`` use (a chunk's manifest carries only its own people)."""
    used = sorted({i.identity for i in items if i.identity is not None})
    return {k: Identity(tuple(_c(s) for s in settings.identities[k])) for k in used}


def chunk_manifests(plan: Plan, settings: ManifestSettings) -> dict[str, Manifest]:
    by_id = {i.id: i for i in plan.items}
    layout = RunLayout.container(plan.job)
    members = {c.id: [by_id[i] for i in c.items] for c in plan.chunks}
    schema = SCHEMA_IDENTITIES if settings.identities else SCHEMA_VERSION
    return {
        c.id: Manifest(
            job=plan.job,
            chunk=c.id,
            run_dir=str(layout.dir),
            pack_dir=str(DataRootLayout.container().pack(settings.pack)),
            source=tuple(_c(s) for s in settings.sources),
            items=tuple(_manifest_item(i) for i in members[c.id]),
            processors=settings.processors,
            providers=settings.providers,
            faces=settings.faces,
            no_face=settings.no_face,
            source_embedding=settings.source_embedding,
            reference_embedding=settings.reference_embedding,
            identity=None if settings.identity_timeout is None else str(layout.identity),
            identity_timeout=settings.identity_timeout or IDENTITY_TIMEOUT,
            reference_distance=settings.reference_distance,
            detector_threshold=settings.detector_threshold,
            detector_size=settings.detector_size,
            mask_feather=settings.mask_feather,
            mask_padding=settings.mask_padding,
            enhancer_blend=settings.enhancer_blend,
            enhancer_model=settings.enhancer_model,
            enhancer_weight=settings.enhancer_weight,
            frame_enhancer_blend=settings.frame_enhancer_blend,
            overwrite=settings.overwrite,
            **settings.selector.manifest_fields(),
            **settings.masks.manifest_fields(),
            **settings.swapper.manifest_fields(),
            **settings.photo.manifest_fields(),
            schema=schema,
            identities=_table(members[c.id], settings) if settings.identities else {},
            storage=settings.storage,
            linger=settings.linger,
            handoff=str(layout.lane_handoff(c.id)) if settings.linger > 0 else None,
        )
        for c in plan.chunks
    }
