"""Job file v1 (docs/job-file.md) → a frozen, validated ``JobSpec``.

Every dataclass checks itself when built, so a spec made in code and one read from a file
(controller/job/files.py) fail the same way; reading a file adds the file name (``JobFileError``,
exit 65). Paths stay relative strings in the spec: only ``resolve_job`` (controller/job/resolve.py)
looks at a disk, where globs are expanded and outputs named.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from contract.manifest import PROCESSORS, PROVIDERS, FaceSelection, NoFacePolicy
from contract.processors import check_order
from contract.s3 import S3Url, is_s3
from controller.job.keys import DURATION, Pack, about, one_or_more
from controller.job.locations import (
    DISTINCT_PLACEHOLDERS,
    IMAGE_EXTENSIONS,
    PLACEHOLDERS,
    VIDEO_EXTENSIONS,
    TargetKind,
    check_output,
    check_photo,
    expand_output,
    location,
    relative,
    target_kind,
)
from controller.job.settings import (
    DetectorSettings,
    EnhancerSettings,
    FrameEnhancerSettings,
    MaskSettings,
    OnComplete,
    PhotoSettings,
    Resources,
    SelectorSettings,
    SwapperSettings,
    VideoSettings,
    read_on_complete,
)
from controller.settings.fields import (
    FieldError,
    as_enum,
    as_list,
    check_bool,
    check_choice,
    check_int,
    check_items,
    check_kinds,
    check_number,
    check_str,
    check_unique,
    item_field,
    parse_duration,
    show,
)

# the job file's sections live in controller/job/settings.py; callers name them here
__all__ = [
    "DISTINCT_PLACEHOLDERS",
    "DetectorSettings",
    "EnhancerSettings",
    "FrameEnhancerSettings",
    "IMAGE_EXTENSIONS",
    "JobSpec",
    "MaskSettings",
    "OnComplete",
    "PAIRS_FILE_EXTENSIONS",
    "PLACEHOLDERS",
    "Pair",
    "PhotoSettings",
    "Resources",
    "SelectorSettings",
    "SwapperSettings",
    "TargetKind",
    "VIDEO_EXTENSIONS",
    "VideoSettings",
    "expand_output",
    "item_field",
    "target_kind",
]


_NAME = r"[a-z0-9-]{1,40}"
# GPU kinds: no hyphen, `sh` drops DOCKER_RESOURCE_X-Y (docs/architecture.md#engine-2010-facts-the-code-relies-on)
_PACK = r"(?!\.)[A-Za-z0-9._-]+"  # a folder under models/: no '.', '..' or hidden names
_CONSTRAINT = r"\s*[A-Za-z0-9_.-]+\s*(==|!=)\s*[^\s=!]+\s*"
LICENCES = ("any", "commercial")
SHARED, OWN, FIRST = Pack.SHARED, Pack.OWN, Pack.FIRST
_TEXT = {"type": "string", "minLength": 1}
_PHOTOS = one_or_more(_TEXT)


PAIRS_FILE_EXTENSIONS = (".csv", ".jsonl")
_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Pair:
    """One item of a ``pairs`` job: swap ``source`` (photos of one person) into ``target`` (one
    photo or video, no glob); ``output``: a template like the job's (None: the job's)."""

    source: tuple[str, ...] = field(metadata=about("a photo, or a list of photos of one person", path=True, **_PHOTOS))
    target: str = field(metadata=about("one photo or video (no glob)", path=True))
    output: str | None = field(
        default=None, metadata=about("an output template like the job's (left out: the job's)", path=True)
    )

    def __post_init__(self) -> None:
        for i, photo in enumerate(check_items(self.source, "source", "photo")):
            check_photo(photo, item_field("source", i, len(self.source)))
        target = location(check_str(self.target, "target"), "target")
        if S3Url.parse(target).is_glob if is_s3(target) else any(c in target for c in _GLOB_CHARS):
            raise FieldError("target", f"{target!r} is a glob; a pair names one file (use targets: for globs)")
        if target_kind(target) is None:
            supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
            raise FieldError("target", f"{target!r} is neither an image nor a video (supported: {supported})")
        if self.output is not None:
            check_output(self.output, "x")


@dataclass(frozen=True)
class JobSpec:
    """One job file, checked. ``timeout`` is in seconds (the file may say ``30m``). Sources and
    targets come either from ``source``/``targets`` (one person into every target) or from
    ``pairs``/``pairs_file`` (each target with its own person)."""

    name: str = field(
        metadata=about("the job's id: 1 to 40 characters of a-z, 0-9 and -", pattern=f"^{_NAME}$", pack=OWN)
    )
    source: tuple[str, ...] = field(
        default=(),
        metadata=about(
            "a photo, or photos of one person (their embeddings averaged)",
            read=as_list("path", str_ok=True),
            **_PHOTOS,
            pack=OWN,
            path=True,
        ),
    )
    targets: tuple[str, ...] = field(
        default=(),
        metadata=about(
            "globs of photos and videos under the data root (or s3:// URLs), sorted",
            read=as_list("glob", str_ok=True),
            **one_or_more(_TEXT),
            pack=OWN,
            path=True,
        ),
    )
    # required with source/targets; with pairs, the default of pairs without one
    output: str = field(
        default="", metadata=about("the output template: {stem} {ext} {name} {index} {job} {dir}", pack=OWN, path=True)
    )
    processors: tuple[str, ...] = field(
        default=("face_swapper",),
        metadata=about(
            "the steps run on each face or frame, in this order",
            manifest="processors",
            read=as_list("processor"),
            items={"enum": list(PROCESSORS)},
            minItems=1,
            uniqueItems=True,
            pack=SHARED,
        ),
    )
    faces: FaceSelection = field(
        default=FaceSelection.MANY,
        metadata=about(
            "which faces are changed: many, one (the first by selector.order) or reference",
            manifest="faces",
            read=as_enum(FaceSelection, "face selection"),
            pack=SHARED,
        ),
    )
    no_face: NoFacePolicy = field(
        default=NoFacePolicy.COPY,
        metadata=about(
            "a target without a face: copy (output = input), skip or fail",
            manifest="no_face",
            read=as_enum(NoFacePolicy, "no-face policy"),
            pack=SHARED,
        ),
    )
    reference: str | None = field(
        default=None,
        metadata=about("with faces: reference, only faces close to this person are changed", pack=OWN, path=True),
    )
    reference_distance: float = field(
        default=0.6,
        metadata=about(
            "the largest cosine distance to the reference",
            manifest="reference_distance",
            exclusiveMinimum=0,
            maximum=2,
            pack=FIRST,
        ),
    )
    chunk_size: int | str = field(  # images (or video segments) per chunk; auto: see plan.auto_chunk_size
        default="auto",
        metadata=about(
            "images (or video segments) per chunk service, or auto",
            anyOf=[{"type": "integer", "minimum": 1}, {"const": "auto"}],
            pack=OWN,
        ),
    )
    segment_seconds: float = field(
        default=30.0,
        metadata=about("video targets are cut into segments of this length", exclusiveMinimum=0, pack=FIRST),
    )
    video: VideoSettings = field(
        default_factory=VideoSettings, metadata=about("how video segments are encoded", pack=FIRST)
    )
    photo: PhotoSettings = field(
        default_factory=PhotoSettings, metadata=about("how photo outputs are written", pack=SHARED)
    )
    skip_audio: bool = field(default=False, metadata=about("true: video outputs carry no audio", pack=FIRST))
    max_concurrent: int = field(
        default=4, metadata=about("chunk services at once (ffswarm scale changes it live)", minimum=1, pack=OWN)
    )
    resources: Resources = field(
        default_factory=Resources, metadata=about("what each chunk service reserves", pack=SHARED)
    )
    placement: tuple[str, ...] = field(
        default=("node.labels.ffswarm.gpu==true",),
        metadata=about(
            "Swarm placement constraints of the chunk services",
            read=as_list("constraint"),
            items={"type": "string", "pattern": f"^{_CONSTRAINT}$"},
            pack=SHARED,
        ),
    )
    retries: int = field(
        default=3, metadata=about("attempts after the first, per chunk, for retryable failures", minimum=0, pack=OWN)
    )
    timeout: int = field(
        default=30 * 60,
        metadata=about(
            "hard limit per chunk attempt: 30m, 90s, 2h, 1h30m or seconds",
            read=parse_duration,
            **DURATION,
            default="30m",
            pack=OWN,
        ),
    )
    image: str | None = field(
        default=None,
        metadata=about(
            "the runner image, one of the policy's images (left out: the config's image)", pattern=r"^\S+$", pack=SHARED
        ),
    )
    models: str = field(
        default="default",
        metadata=about(
            "the model pack: a folder in the data root's models/", manifest="pack", pattern=f"^{_PACK}$", pack=SHARED
        ),
    )
    providers: tuple[str, ...] = field(
        default=("cuda", "cpu"),
        metadata=about(
            "onnxruntime providers in order of preference (cpu only if listed)",
            manifest="providers",
            read=as_list("provider"),
            items={"enum": list(PROVIDERS)},
            minItems=1,
            uniqueItems=True,
            pack=SHARED,
        ),
    )
    on_complete: OnComplete = field(
        default_factory=OnComplete, metadata=about("who is told when the job ends", read=read_on_complete, pack=OWN)
    )
    detector: DetectorSettings = field(
        default_factory=DetectorSettings, metadata=about("the face detector's threshold and input size", pack=SHARED)
    )
    mask: MaskSettings = field(
        default_factory=MaskSettings, metadata=about("where changed faces are pasted back", pack=SHARED)
    )
    face_enhancer: EnhancerSettings = field(
        default_factory=EnhancerSettings, metadata=about("the face_enhancer processor's model and blend", pack=SHARED)
    )
    frame_enhancer: FrameEnhancerSettings = field(
        default_factory=FrameEnhancerSettings,
        metadata=about("the frame_enhancer processor's model and blend", pack=SHARED),
    )
    selector: SelectorSettings = field(
        default_factory=SelectorSettings,
        metadata=about("the order of a frame's faces and gender/age filters", pack=SHARED),
    )
    face_swapper: SwapperSettings = field(
        default_factory=SwapperSettings, metadata=about("the swapper model, pixel boost and weight", pack=SHARED)
    )
    overwrite: bool = field(
        default=False,
        metadata=about(
            "true: outputs may replace files that exist before the job's first run", manifest="overwrite", pack=SHARED
        ),
    )
    licence: str = field(
        default="any",
        metadata=about(
            "commercial: every model the job loads must allow commercial use", enum=list(LICENCES), pack=FIRST
        ),
    )
    pairs: tuple[Pair, ...] = field(
        default=(),
        metadata=about("instead of source/targets: each target with its own source", minItems=1, pack=OWN, path=True),
    )
    pairs_file: str | None = field(
        default=None,
        metadata=about(
            "instead of source/targets: a CSV or JSONL file of pairs under the data root", pack=OWN, path=True
        ),
    )  # controller/job/pairs.py

    @property
    def uses_pairs(self) -> bool:
        return bool(self.pairs) or self.pairs_file is not None

    def __post_init__(self) -> None:
        check_str(self.name, "name", pattern=_NAME, hint="1 to 40 characters of a-z, 0-9 and -")
        if self.uses_pairs:
            self._check_pairs()
        else:
            for i, photo in enumerate(check_items(self.source, "source", "photo")):
                check_photo(photo, item_field("source", i, len(self.source)))
            for i, pattern in enumerate(check_items(self.targets, "targets", "glob")):
                f = item_field("targets", i, len(self.targets))
                location(check_str(pattern, f), f)
            check_output(self.output, self.name)
        for i, p in enumerate(check_items(self.processors, "processors", "processor")):
            check_choice(p, f"processors[{i}]", PROCESSORS, "processor")
        check_unique(self.processors, "processors")
        if (wrong := check_order(self.processors)) is not None:
            raise FieldError("processors", wrong)
        for i, p in enumerate(check_items(self.providers, "providers", "provider")):
            check_choice(p, f"providers[{i}]", PROVIDERS, "provider")
        check_unique(self.providers, "providers")
        check_kinds(self, (("faces", FaceSelection), ("no_face", NoFacePolicy)))
        if self.faces is FaceSelection.REFERENCE and self.reference is None:
            raise FieldError("reference", "is required with faces: reference")
        if self.reference is not None:  # allowed, and unused, with other face selections
            check_photo(self.reference, "reference")
        distance = check_number(self.reference_distance, "reference_distance", above=0, at_most=2)
        object.__setattr__(self, "reference_distance", distance)
        size = self.chunk_size
        if size != "auto" and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise FieldError("chunk_size", f"must be an integer ≥ 1 or auto, got {show(self.chunk_size)}")
        object.__setattr__(self, "segment_seconds", check_number(self.segment_seconds, "segment_seconds", above=0))
        check_bool(self.skip_audio, "skip_audio")
        check_bool(self.overwrite, "overwrite")
        check_choice(self.licence, "licence", LICENCES, "licence requirement")
        check_int(self.max_concurrent, "max_concurrent", minimum=1)
        for i, c in enumerate(check_items(self.placement, "placement", "constraint", minimum=0)):
            check_str(c, f"placement[{i}]", pattern=_CONSTRAINT, hint="a constraint like node.labels.ffswarm.gpu==true")
        check_int(self.retries, "retries", minimum=0)
        check_int(self.timeout, "timeout", minimum=1)
        if self.image is not None:
            check_str(self.image, "image", pattern=r"\S+", hint="an image reference without spaces")
        check_str(self.models, "models", pattern=_PACK, hint="a pack name of A-Z, a-z, 0-9, '.', '_' and '-'")
        nested = (
            ("video", VideoSettings),
            ("photo", PhotoSettings),
            ("resources", Resources),
            ("on_complete", OnComplete),
            ("detector", DetectorSettings),
            ("mask", MaskSettings),
            ("face_enhancer", EnhancerSettings),
            ("frame_enhancer", FrameEnhancerSettings),
            ("selector", SelectorSettings),
            ("face_swapper", SwapperSettings),
        )
        check_kinds(self, nested)
        if self.video.on_gpu and (self.resources.gpus < 1 or "cuda" not in self.providers):
            raise FieldError("video.codec", f"{self.video.codec} encodes on the GPU: the job needs "
                             "resources.gpus of at least 1 and cuda in providers")  # fmt: skip

    def _check_pairs(self) -> None:
        for name in ("source", "targets"):
            if getattr(self, name):
                given = "pairs" if self.pairs else "pairs_file"
                raise FieldError(name, f"cannot be given with {given}: each pair names its own source and target")
        if self.pairs and self.pairs_file is not None:
            raise FieldError("pairs_file", "cannot be given with pairs: list the pairs in one place")
        if self.output:
            check_output(self.output, self.name)
        if self.pairs_file is not None:
            rel = relative(check_str(self.pairs_file, "pairs_file"), "pairs_file")
            if posixpath.splitext(rel)[1].lower() not in PAIRS_FILE_EXTENSIONS:
                raise FieldError("pairs_file", f"{rel!r} must be a .csv or .jsonl file")
        if not isinstance(self.pairs, tuple):
            raise FieldError("pairs", f"must be a tuple of pairs, got {show(self.pairs)}")
        for i, pair in enumerate(self.pairs):
            if not isinstance(pair, Pair):
                raise FieldError(f"pairs[{i}]", f"must be a Pair, got {show(pair)}")
            if pair.output is None and not self.output:
                raise FieldError(f"pairs[{i}].output", "is required: the job has no output template")
