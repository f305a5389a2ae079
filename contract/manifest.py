"""The chunk manifest: what one chunk service is asked to do.

The controller writes one per chunk (``chunks/<chunk>.json``, contract/layout.py); the runner reads
it. Every path in a manifest is a *container* path (under ``/data``, contract/paths.py), never a
host path, so a manifest means the same thing on every node; or, for inputs, image outputs and
photos, one object ``s3://bucket/key`` (contract/s3.py), with the ``storage`` block saying how to
reach the store (never a credential: the path of the Swarm secret's file). A manifest never changes once written:
retries of a chunk read the same file, and the attempt number arrives through ``FFSWARM_ATTEMPT``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from contract import processors
from contract.errors import ManifestError
from contract.handoff import LINGER_FIELDS, check_linger
from contract.identity_table import Identity, check_id, check_people, read_table, table_dict
from contract.layout import RunLayout
from contract.manifest_fields import optional_fields, text_field
from contract.masks import DEFAULT_TYPES, MASK_FIELDS, REGIONS, check_masks
from contract.paths import require_container_path
from contract.photo import PHOTO_FIELDS, PHOTO_QUALITY, PHOTO_SCALE, check_photo
from contract.s3 import StorageAccess, is_s3, require_location
from contract.selector import AGE_LIMITS, DEFAULT_ORDER, Selector
from contract.swapper import PIXEL_BOOST, SWAPPER_FIELDS, SWAPPER_MODEL, SWAPPER_WEIGHT, check_swapper

SCHEMA_VERSION = 1  # a job with one source for every target
SCHEMA_IDENTITIES = 2  # a job with ``pairs``: an identity table, each item names its identity
SCHEMA_VERSIONS = (SCHEMA_VERSION, SCHEMA_IDENTITIES)  # what this runner reads

ENV_MANIFEST = "FFSWARM_MANIFEST"
ENV_ATTEMPT = "FFSWARM_ATTEMPT"
ENV_GPU = "DOCKER_RESOURCE_GPU"

PROCESSORS = processors.PROCESSORS  # the registry's names (contract/processors.py)
PROVIDERS = ("cuda", "cpu")

# Per-job tuning defaults (job file: detector, mask, face_enhancer, reference_distance). The mask
# defaults reproduce insightface's own paste-back: erode by a tenth of the face, blur by a twentieth.
DETECTOR_THRESHOLD = 0.5
DETECTOR_SIZE = 640
MASK_FEATHER = 0.05
MASK_PADDING = 0.1
ENHANCER_BLEND = 0.8
ENHANCER_MODEL = "gfpgan_1.4"  # face_enhancer.model (processors.FACE_ENHANCER_MODELS)
ENHANCER_WEIGHT = 0.5  # face_enhancer.weight: codeformer's fidelity (0: most restored, 1: most faithful)
FRAME_ENHANCER_BLEND = 1.0
REFERENCE_DISTANCE = 0.6
DEMUXERS = ("mov", "matroska", "avi")  # the only input demuxers ffmpeg is let use (contract/ffmpeg.py)
IDENTITY_TIMEOUT = 960.0  # seconds a runner waits for the identity step (the controller sets it per job)


class FaceSelection(StrEnum):
    MANY = "many"
    ONE = "one"
    REFERENCE = "reference"


class NoFacePolicy(StrEnum):
    COPY = "copy"  # output = input, item status no_face
    SKIP = "skip"  # no output written, item status no_face
    FAIL = "fail"  # item status error (runner exit 3)


@dataclass(frozen=True)
class Segment:
    """A video item's frames [start_frame, start_frame + frame_count) and how to encode them.

    ``width``/``height``/``sar`` are of the upright frames the decoder delivers (rotation applied);
    ``fps`` is the exact rate as "num/den"; the segment's stream gets time base 1/``timescale``.
    ``last``: the video's final segment, which may decode fewer frames than planned.
    ``seek``: seconds (decimal text, from the file's start time) halfway between the presentation
    times of frame ``start_frame - 1`` and ``start_frame``: ffmpeg seeks to the keyframe before it
    and drops the frames before it, so the segment decodes one GOP or so instead of the whole video
    up to its start. None: decode from the start and pick the frames by number (the planner could
    not list every frame's time — AVI's packed B-frames — or the segment starts the video).
    """

    start_frame: int
    frame_count: int
    fps: str
    width: int
    height: int
    timescale: int
    sar: str = "1/1"
    last: bool = False
    codec: str = "libx264"
    crf: int = 18
    preset: str = "medium"
    seek: str | None = None
    # The demuxer the planner's probe found (contract/ffmpeg.py DEMUXERS): the runner decodes with
    # exactly it (``-f``), never one ffmpeg guesses from the content. None in older manifests.
    demuxer: str | None = None

    def __post_init__(self) -> None:
        if self.demuxer is not None and self.demuxer not in DEMUXERS:
            raise ManifestError(f"segment: demuxer must be one of {', '.join(DEMUXERS)}, got {self.demuxer!r}")
        if self.seek is not None and not re.fullmatch(r"\d{1,9}\.\d{6}", str(self.seek)):
            raise ManifestError(f"segment: seek must be seconds like '12.345678', got {self.seek!r}")
        ints = (self.start_frame, self.frame_count - 1, self.width - 1, self.height - 1, self.timescale - 1, self.crf)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            raise ManifestError(f"segment: bad frame range, size, timescale or crf in {self!r}")
        for name in ("fps", "sar"):
            num, _, den = str(getattr(self, name)).partition("/")
            if not (num.isdigit() and den.isdigit() and int(num) > 0 and int(den) > 0):
                raise ManifestError(f"segment: {name} must be a rational 'num/den', got {getattr(self, name)!r}")
        for name in ("codec", "preset"):
            value = getattr(self, name)
            if not value or value.startswith("-") or not all(c.isalnum() or c in "_.-" for c in value):
                raise ManifestError(f"segment: {name} {value!r} is not an encoder/preset name")


@dataclass(frozen=True)
class Item:
    id: str  # stable across attempts, e.g. "i000042"
    input: str  # container path of the target, or an object s3://bucket/key (Manifest.storage)
    output: str  # container path of the output file, or s3://bucket/key (not for a video's segment)
    kind: str = "image"  # image | video (a segment of a video target; ``segment`` says which)
    segment: Segment | None = None
    identity: str | None = None  # schema 2: the id of its person in the manifest's identity table

    def __post_init__(self) -> None:
        require_location(self.input, f"item {self.id}: input")
        # A video's segments are joined by the controller in the run folder: only its input may be s3://.
        require_location(self.output, f"item {self.id}: output", allow_s3=self.kind != "video")
        if not self.id:
            raise ManifestError("item id is empty")
        if self.identity is not None:
            check_id(self.identity)
        if self.kind not in ("image", "video") or (self.kind == "video") != (self.segment is not None):
            raise ManifestError(f"item {self.id}: kind {self.kind!r} needs a segment exactly when it is 'video'")

    @classmethod
    def from_dict(cls, i: Any) -> Item:
        seg = i.get("segment")
        segment = None if seg is None else Segment(**seg)
        return cls(
            id=str(i["id"]),
            input=str(i["input"]),
            output=str(i["output"]),
            kind=str(i.get("kind", "image")),
            segment=segment,
            identity=None if i.get("identity") is None else check_id(i["identity"]),
        )


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
    source: tuple[str, ...]  # container paths (or s3:// objects) of source photos (one person)
    items: tuple[Item, ...]
    processors: tuple[str, ...] = ("face_swapper",)
    providers: tuple[str, ...] = ("cuda", "cpu")
    faces: FaceSelection = FaceSelection.MANY
    no_face: NoFacePolicy = NoFacePolicy.COPY
    limits: Limits = field(default_factory=Limits)
    schema: int = SCHEMA_VERSION
    # Optional (absent in older manifests). Identity computed once per job (IdentityResult): either
    # given here, or `identity` names the job's identity.json, which the runner waits for (up to
    # identity_timeout seconds) while the submit-time identity step is still running. With neither,
    # the runner embeds the source photos itself.
    source_embedding: tuple[float, ...] | None = None
    reference_embedding: tuple[float, ...] | None = None  # with faces: reference, here or via identity
    identity: str | None = None  # container path of runs/<job>/identity.json
    identity_timeout: float = IDENTITY_TIMEOUT
    reference_distance: float = REFERENCE_DISTANCE  # max cosine distance to the reference face
    detector_threshold: float = DETECTOR_THRESHOLD
    detector_size: int = DETECTOR_SIZE  # square input side, a multiple of 32
    mask_feather: float = MASK_FEATHER  # blend-edge blur half-width, fraction of the face size
    mask_padding: float = MASK_PADDING  # how far the blend edge is pulled in, fraction of the face size
    mask_types: tuple[str, ...] = DEFAULT_TYPES  # box, occlusion, region: their minimum (contract/masks.py)
    mask_regions: tuple[str, ...] = REGIONS  # the face parser's regions, with the region type
    enhancer_blend: float = ENHANCER_BLEND  # 0: enhancer has no effect, 1: enhanced face only
    enhancer_model: str = ENHANCER_MODEL  # which face enhancer the job expects (runner_image/face_enhancers.py)
    enhancer_weight: float = ENHANCER_WEIGHT  # codeformer's ``weight`` input; other models have none
    # processors ``frame_enhancer``: the whole frame upscaled after the face steps; 0: a plain resize
    # to the model's scale, 1: the model's output only (runner_image/frame_enhancer.py)
    frame_enhancer_blend: float = FRAME_ENHANCER_BLEND
    # face_swapper (contract/swapper.py): the inswapper model expected, crop side, source identity share
    swapper_model: str = SWAPPER_MODEL
    swapper_pixel_boost: int = PIXEL_BOOST
    swapper_weight: float = SWAPPER_WEIGHT
    # Photo outputs (job file ``photo``, contract/photo.py): JPEG/WebP quality, resize after the processors
    photo_quality: int = PHOTO_QUALITY
    photo_scale: float = PHOTO_SCALE
    # True: an output may replace an existing file this job did not write (job file ``overwrite``).
    # False: such an item fails, naming the file; a file this job committed is recognised by its
    # result line (size and sha256), not by existing.
    overwrite: bool = False
    # The face selector (job file ``selector``, contract/selector.py): order and gender/age filters
    selector_order: str = DEFAULT_ORDER
    selector_gender: str = "any"
    selector_age: tuple[int, int] = AGE_LIMITS
    # Schema 2 (job-file ``pairs``): id → the person items swap in (contract/identity_table.py);
    # ``source`` is then empty and every item names its identity.
    identities: dict[str, Identity] = field(default_factory=dict, hash=False)
    # How to reach the store when any item, source or identity photo is s3:// (required then).
    storage: StorageAccess | None = None
    # A pack's chunk service may wait this long after its chunk for the next one (contract/handoff.py)
    linger: float = 0.0
    handoff: str | None = None  # container path of the hand-off file it waits on

    def __post_init__(self) -> None:
        if self.schema not in SCHEMA_VERSIONS:
            raise ManifestError(f"unknown manifest schema version {self.schema!r} (this runner reads {_READS})")
        if not self.items:
            raise ManifestError("manifest has no items")
        check_people(self.schema == SCHEMA_VERSION, self.identities, self.source, self.items)
        _check_tuning(self)  # the tuning fields' ranges, below
        for p in self.processors:
            if p not in PROCESSORS:
                raise ManifestError(f"unknown processor {p!r}")
        if (wrong := processors.check_order(self.processors)) is not None:
            raise ManifestError(f"processors: {wrong}")
        for p in self.providers:
            if p not in PROVIDERS:
                raise ManifestError(f"unknown provider {p!r}")
        for name in ("run_dir", "pack_dir"):
            require_container_path(getattr(self, name), name)
        for s in self.source:
            require_location(s, "source")
        if self.identity is not None:
            require_container_path(self.identity, "identity")
        check_linger(self.linger, self.handoff)
        if self.storage is not None and not isinstance(self.storage, StorageAccess):
            raise ManifestError("storage: not a StorageAccess")
        if self.storage is None and self.s3_urls():
            raise ManifestError(f"{self.s3_urls()[0]}: an s3:// object needs the manifest's storage block")
        ids = [i.id for i in self.items]
        if len(set(ids)) != len(ids):
            raise ManifestError("duplicate item ids")

    def s3_urls(self) -> list[str]:
        """Every s3:// input, output and photo this manifest names."""
        photos = [p for person in self.identities.values() for p in person.sources]
        texts = [*self.source, *photos, *(t for i in self.items for t in (i.input, i.output))]
        return [t for t in texts if is_s3(t)]

    @property
    def layout(self) -> RunLayout[PurePosixPath]:
        """The job's run folder, in container paths."""
        return RunLayout(PurePosixPath(self.run_dir))

    def results_path(self, attempt: int) -> str:
        """This chunk's results file for ``attempt`` (one file per attempt, contract/layout.py)."""
        return str(self.layout.results(self.chunk, attempt))

    def log_path(self, attempt: int) -> str:
        return str(self.layout.log(self.chunk, attempt))

    def to_json(self) -> str:
        # Shallow on purpose: dataclasses.asdict deep-copies every float of the embeddings, which made
        # planning 5,000 chunks take seconds.
        data = {f: getattr(self, f) for f in _FIELDS}
        data["items"] = [_item_dict(i) for i in self.items]
        data["limits"] = asdict(self.limits)
        data["faces"] = self.faces.value
        data["no_face"] = self.no_face.value
        data["source"] = list(self.source)
        if self.identities:
            data["identities"] = table_dict(self.identities)
        else:
            del data["identities"]  # a version 1 manifest, as older runners know it
        if self.storage is not None:
            data["storage"] = self.storage.to_dict()
        else:
            del data["storage"]  # no s3:// object: as older runners know manifests
        for name in _OPTIONAL:  # left out at their defaults: older runners read the file unchanged
            if data[name] == _FIELDS[name].default:
                del data[name]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"manifest is not JSON: {e}") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any, identities: dict[str, Identity] | None = None) -> Manifest:
        if not isinstance(data, dict):
            raise ManifestError("manifest must be a JSON object")
        if data.get("schema") not in SCHEMA_VERSIONS or isinstance(data.get("schema"), bool):
            raise ManifestError(f"unknown manifest schema version {data.get('schema')!r} (this runner reads {_READS})")
        try:
            if "identities" in data:
                rest = {k: v for k, v in data.items() if k != "identities"}
                return cls.from_dict(rest, read_table(data["identities"]))
            return cls(
                job=text_field(data, "job"),
                chunk=text_field(data, "chunk"),
                run_dir=text_field(data, "run_dir"),
                pack_dir=text_field(data, "pack_dir"),
                source=tuple(str(s) for s in data["source"]),
                items=tuple(Item.from_dict(i) for i in data["items"]),
                processors=tuple(str(p) for p in data.get("processors", ["face_swapper"])),
                providers=tuple(str(p) for p in data.get("providers", ["cuda", "cpu"])),
                faces=FaceSelection(data.get("faces", "many")),
                no_face=NoFacePolicy(data.get("no_face", "copy")),
                limits=Limits(**data.get("limits", {})),
                schema=int(data["schema"]),
                identities=identities or {},
                **optional_fields(data),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"malformed manifest: {type(e).__name__}: {e}") from e


_FIELDS = {f.name: f for f in fields(Manifest)}
_READS = ", ".join(str(v) for v in SCHEMA_VERSIONS)

# Left out of the JSON at their defaults: older runners read the file unchanged.
_OPTIONAL = (
    "source_embedding",
    "reference_embedding",
    "identity",
    "identity_timeout",
    "reference_distance",
    "detector_threshold",
    "detector_size",
    "mask_feather",
    "mask_padding",
    "enhancer_blend",
    "frame_enhancer_blend",
    "overwrite",
    "selector_order",
    "selector_gender",
    "selector_age",
    "enhancer_model",
    "enhancer_weight",
    *MASK_FIELDS,
    *SWAPPER_FIELDS,
    *PHOTO_FIELDS,
    *LINGER_FIELDS,
)


def _check_tuning(m: Manifest) -> None:
    """Ranges as the job file allows them (controller/job/spec.py); a manifest written by hand or by
    an older controller fails here (65) rather than as odd pixels."""
    for name in ("source_embedding", "reference_embedding"):
        emb = getattr(m, name)
        if emb is not None and (not emb or not all(isinstance(v, float) and math.isfinite(v) for v in emb)):
            raise ManifestError(f"{name} must be a non-empty tuple of finite floats")
    if m.source_embedding and m.reference_embedding and len(m.source_embedding) != len(m.reference_embedding):
        raise ManifestError("source_embedding and reference_embedding differ in length")
    if m.faces == "reference" and m.reference_embedding is None and m.identity is None:
        raise ManifestError("faces: reference needs reference_embedding or identity (computed at submit)")
    if not isinstance(m.overwrite, bool):
        raise ManifestError(f"overwrite must be true or false, got {m.overwrite!r}")
    object.__setattr__(m, "selector_age", Selector(m.selector_order, m.selector_gender, m.selector_age).age)
    if not 0 < m.identity_timeout <= 86400:
        raise ManifestError(f"identity_timeout must be in (0, 86400] seconds, got {m.identity_timeout!r}")
    checks = (
        ("reference_distance", m.reference_distance, 0.0, 2.0),
        ("detector_threshold", m.detector_threshold, 0.0, 1.0),
        ("mask_feather", m.mask_feather, 0.0, 0.5),
        ("mask_padding", m.mask_padding, 0.0, 0.5),
        ("enhancer_blend", m.enhancer_blend, 0.0, 1.0),
        ("enhancer_weight", m.enhancer_weight, 0.0, 1.0),
        ("frame_enhancer_blend", m.frame_enhancer_blend, 0.0, 1.0),
    )
    for name, value, lo, hi in checks:
        if not lo <= value <= hi:
            raise ManifestError(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")
    check_swapper(m.swapper_model, m.swapper_pixel_boost, m.swapper_weight)
    check_masks(m)  # mask_types, mask_regions
    check_photo(m.photo_quality, m.photo_scale)
    if m.enhancer_model not in processors.FACE_ENHANCER_MODELS:
        choices = ", ".join(processors.FACE_ENHANCER_MODELS)
        raise ManifestError(f"enhancer_model must be one of {choices}, got {m.enhancer_model!r}")
    if m.detector_size % 32 or not 160 <= m.detector_size <= 2048:
        raise ManifestError(f"detector_size must be a multiple of 32 from 160 to 2048, got {m.detector_size!r}")


def _item_dict(item: Item) -> dict[str, Any]:
    """An item as JSON data; an image item carries no kind or segment, as older runners read it."""
    data: dict[str, Any] = {"id": item.id, "input": item.input, "output": item.output}
    if item.kind != "image" or item.segment is not None:
        data["kind"] = item.kind
        data["segment"] = None if item.segment is None else _segment_dict(item.segment)
    if item.identity is not None:  # schema 2 only
        data["identity"] = item.identity
    return data


def _segment_dict(segment: Segment) -> dict[str, Any]:
    data = asdict(segment)
    if data["demuxer"] is None:  # as older runners know segments
        del data["demuxer"]
    return data
