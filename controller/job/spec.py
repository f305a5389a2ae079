"""Job file v1 (docs/job-file.md) → a frozen, validated ``JobSpec``.

Every dataclass checks itself when built, so a spec made in code and one read from a file
(controller/job/files.py) fail the same way; reading a file adds the file name (``JobFileError``,
exit 65). Paths stay relative strings in the spec: only ``resolve_job`` (controller/job/resolve.py)
looks at a disk, where globs are expanded and outputs named.
"""

from __future__ import annotations

import posixpath
import re
import string
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

from contract.manifest import PROCESSORS, PROVIDERS, FaceSelection, NoFacePolicy
from contract.processors import check_order
from contract.s3 import S3Url, is_s3
from controller.job.paths import check_relative
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
)
from controller.settings.fields import (
    FieldError,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_str,
    check_unique,
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


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi")
PLACEHOLDERS = ("stem", "ext", "name", "index", "job", "dir")
DISTINCT_PLACEHOLDERS = ("stem", "name", "index")  # placeholders that tell targets apart
_NAME = r"[a-z0-9-]{1,40}"
# GPU kinds: no hyphen, `sh` drops DOCKER_RESOURCE_X-Y (docs/architecture.md#engine-2010-facts-the-code-relies-on)
_PACK = r"(?!\.)[A-Za-z0-9._-]+"  # a folder under models/: no '.', '..' or hidden names
_CONSTRAINT = r"\s*[A-Za-z0-9_.-]+\s*(==|!=)\s*[^\s=!]+\s*"


class TargetKind(StrEnum):
    IMAGE = "image"
    VIDEO = "video"


def target_kind(path: str | PurePosixPath | Path) -> TargetKind | None:
    """What a file is by its extension (any case); None when ffswarm cannot process it."""
    suffix = posixpath.splitext(str(path))[1].lower()
    if suffix in IMAGE_EXTENSIONS:
        return TargetKind.IMAGE
    if suffix in VIDEO_EXTENSIONS:
        return TargetKind.VIDEO
    return None


PAIRS_FILE_EXTENSIONS = (".csv", ".jsonl")
_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Pair:
    """One item of a ``pairs`` job: swap ``source`` (photos of one person) into ``target`` (one
    photo or video, no glob); ``output``: a template like the job's (None: the job's)."""

    source: tuple[str, ...]
    target: str
    output: str | None = None

    def __post_init__(self) -> None:
        for i, photo in enumerate(_items(self.source, "source", "photo")):
            _check_photo(photo, item_field("source", i, len(self.source)))
        target = _location(check_str(self.target, "target"), "target")
        if S3Url.parse(target).is_glob if is_s3(target) else any(c in target for c in _GLOB_CHARS):
            raise FieldError("target", f"{target!r} is a glob; a pair names one file (use targets: for globs)")
        if target_kind(target) is None:
            supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
            raise FieldError("target", f"{target!r} is neither an image nor a video (supported: {supported})")
        if self.output is not None:
            _check_output(self.output, "x")


@dataclass(frozen=True)
class JobSpec:
    """One job file, checked. ``timeout`` is in seconds (the file may say ``30m``). Sources and
    targets come either from ``source``/``targets`` (one person into every target) or from
    ``pairs``/``pairs_file`` (each target with its own person)."""

    name: str
    source: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    output: str = ""  # required with source/targets; with pairs, the default of pairs without one
    processors: tuple[str, ...] = ("face_swapper",)
    faces: FaceSelection = FaceSelection.MANY
    no_face: NoFacePolicy = NoFacePolicy.COPY
    reference: str | None = None
    reference_distance: float = 0.6
    chunk_size: int | str = "auto"  # images (or video segments) per chunk; auto: see plan.auto_chunk_size
    segment_seconds: float = 30.0
    video: VideoSettings = field(default_factory=VideoSettings)
    photo: PhotoSettings = field(default_factory=PhotoSettings)  # quality, scale of photo outputs
    skip_audio: bool = False
    max_concurrent: int = 4
    resources: Resources = field(default_factory=Resources)
    placement: tuple[str, ...] = ("node.labels.ffswarm.gpu==true",)
    retries: int = 3
    timeout: int = 30 * 60
    image: str | None = None
    models: str = "default"
    providers: tuple[str, ...] = ("cuda", "cpu")
    on_complete: OnComplete = field(default_factory=OnComplete)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    mask: MaskSettings = field(default_factory=MaskSettings)
    face_enhancer: EnhancerSettings = field(default_factory=EnhancerSettings)
    frame_enhancer: FrameEnhancerSettings = field(default_factory=FrameEnhancerSettings)
    selector: SelectorSettings = field(default_factory=SelectorSettings)  # face order, gender/age filters
    face_swapper: SwapperSettings = field(default_factory=SwapperSettings)  # model, pixel_boost, weight
    overwrite: bool = False  # true: outputs may replace files that exist before the job's first run
    licence: str = "any"  # commercial: every model the job loads must allow commercial use (checked at submit)
    pairs: tuple[Pair, ...] = ()
    pairs_file: str | None = None  # CSV or JSONL of pairs under the data root (controller/job/pairs.py)

    @property
    def uses_pairs(self) -> bool:
        return bool(self.pairs) or self.pairs_file is not None

    def __post_init__(self) -> None:
        check_str(self.name, "name", pattern=_NAME, hint="1 to 40 characters of a-z, 0-9 and -")
        if self.uses_pairs:
            self._check_pairs()
        else:
            for i, photo in enumerate(_items(self.source, "source", "photo")):
                _check_photo(photo, item_field("source", i, len(self.source)))
            for i, pattern in enumerate(_items(self.targets, "targets", "glob")):
                f = item_field("targets", i, len(self.targets))
                _location(check_str(pattern, f), f)
            _check_output(self.output, self.name)
        for i, p in enumerate(_items(self.processors, "processors", "processor")):
            check_choice(p, f"processors[{i}]", PROCESSORS, "processor")
        check_unique(self.processors, "processors")
        if (wrong := check_order(self.processors)) is not None:
            raise FieldError("processors", wrong)
        for i, p in enumerate(_items(self.providers, "providers", "provider")):
            check_choice(p, f"providers[{i}]", PROVIDERS, "provider")
        check_unique(self.providers, "providers")
        _check_kinds(self, (("faces", FaceSelection), ("no_face", NoFacePolicy)))
        if self.faces is FaceSelection.REFERENCE and self.reference is None:
            raise FieldError("reference", "is required with faces: reference")
        if self.reference is not None:  # allowed, and unused, with other face selections
            _check_photo(self.reference, "reference")
        distance = check_number(self.reference_distance, "reference_distance", above=0, at_most=2)
        object.__setattr__(self, "reference_distance", distance)
        size = self.chunk_size
        if size != "auto" and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise FieldError("chunk_size", f"must be an integer ≥ 1 or auto, got {show(self.chunk_size)}")
        object.__setattr__(self, "segment_seconds", check_number(self.segment_seconds, "segment_seconds", above=0))
        check_bool(self.skip_audio, "skip_audio")
        check_bool(self.overwrite, "overwrite")
        check_choice(self.licence, "licence", ("any", "commercial"), "licence requirement")
        check_int(self.max_concurrent, "max_concurrent", minimum=1)
        for i, c in enumerate(_items(self.placement, "placement", "constraint", minimum=0)):
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
        _check_kinds(self, nested)
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
            _check_output(self.output, self.name)
        if self.pairs_file is not None:
            rel = _relative(check_str(self.pairs_file, "pairs_file"), "pairs_file")
            if posixpath.splitext(rel)[1].lower() not in PAIRS_FILE_EXTENSIONS:
                raise FieldError("pairs_file", f"{rel!r} must be a .csv or .jsonl file")
        if not isinstance(self.pairs, tuple):
            raise FieldError("pairs", f"must be a tuple of pairs, got {show(self.pairs)}")
        for i, pair in enumerate(self.pairs):
            if not isinstance(pair, Pair):
                raise FieldError(f"pairs[{i}]", f"must be a Pair, got {show(pair)}")
            if pair.output is None and not self.output:
                raise FieldError(f"pairs[{i}].output", "is required: the job has no output template")


def _items(values: object, name: str, what: str, *, minimum: int = 1) -> tuple[object, ...]:
    if not isinstance(values, tuple):
        raise FieldError(name, f"must be a tuple of {what}s, got {show(values)}")
    if len(values) < minimum:
        raise FieldError(name, f"must list at least {minimum} {what}")
    return values


def item_field(name: str, i: int, count: int) -> str:
    return name if count == 1 else f"{name}[{i}]"


def _relative(rel: str, f: str) -> str:
    try:
        return check_relative(rel, what=f)
    except ValueError as e:
        raise FieldError(f, str(e)) from None


def _location(text: str, f: str) -> str:
    """A path relative to the data root, or an ``s3://bucket/key`` URL (a key glob allowed), checked."""
    if not is_s3(text):
        return _relative(text, f)
    try:
        S3Url.parse(text)
    except ValueError as e:
        raise FieldError(f, str(e)) from None
    return text


def _check_photo(value: object, f: str) -> None:
    if f == "reference" and is_s3(value):
        raise FieldError(f, "must be a file under the data root: an s3:// reference is not supported yet")
    _location(check_str(value, f), f)
    if is_s3(value) and S3Url.parse(value).is_glob:
        raise FieldError(f, f"{value!r} is a glob; a source names photos, not globs")
    if target_kind(str(value)) is not TargetKind.IMAGE:
        raise FieldError(f, f"{value!r} is not an image ({' '.join(IMAGE_EXTENSIONS)})")


def _check_kinds(spec: object, kinds: tuple[tuple[str, type], ...]) -> None:
    for name, kind in kinds:
        if not isinstance(getattr(spec, name), kind):
            raise FieldError(name, f"must be a {kind.__name__}, got {show(getattr(spec, name))}")


def _check_output(template: object, job: str) -> None:
    """Raises FieldError("output", …); a pair's output is checked the same way (``pairs[3].output``)."""
    if isinstance(template, dict):  # output: {stem}.png  is YAML for a mapping
        raise FieldError("output", "must be a string, got a mapping (quote a template that starts with '{')")
    template = check_str(template, "output")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise FieldError("output", f"{template!r} is not a valid template: {e}") from None
    for _literal, name, _spec, conversion in parts:
        if name is not None and name not in PLACEHOLDERS:
            known = " ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise FieldError("output", f"unknown placeholder {{{name}}} in {template!r} (known: {known})")
        if conversion:
            raise FieldError("output", f"conversions like !{conversion} are not supported in {template!r}")
    if is_s3(template):
        _check_s3_output(template)
    else:
        _relative(template, "output")
    if template.endswith("/"):
        raise FieldError("output", f"{template!r} names a folder, not a file")
    try:
        expand_output(template, PurePosixPath("d/x.jpg"), index=0, job=job)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise FieldError("output", f"{template!r} cannot be expanded: {e}") from None


def _check_s3_output(template: str) -> None:
    """``s3://bucket/key-template``: the bucket is literal, the key template has no glob."""
    bucket, _, key = template[len("s3://") :].partition("/")
    if "{" in bucket or "}" in bucket or any(c in key for c in "*?"):
        raise FieldError("output", f"{template!r}: write the bucket out, and no glob (one object per target)")
    try:
        S3Url.parse(f"s3://{bucket}/{key or 'x'}")
    except ValueError as e:
        raise FieldError("output", str(e)) from None


_SLASHES = re.compile("/+")


def expand_output(template: str, rel: str | PurePosixPath, *, index: int, job: str) -> str:
    """The output path (relative to the root, normalised) that ``template`` gives one target.

    An empty ``{dir}`` (a target in the root) leaves no ``//`` and no leading ``/`` behind. String
    functions, not PurePath objects: this runs once per target, 100,000 times for a big job.
    """
    rel = str(rel)
    if is_s3(rel):  # an object's {dir} is its key's folder (without the bucket)
        rel = S3Url.parse(rel).key
    folder, name = posixpath.split(rel)
    stem, ext = posixpath.splitext(name)
    if is_s3(template):
        bucket, _, key = template[len("s3://") :].partition("/")
        text = _SLASHES.sub("/", key.format(stem=stem, ext=ext, name=name, index=index, job=job, dir=folder))
        try:
            return str(S3Url(bucket, text.lstrip("/")))
        except ValueError as e:
            raise ValueError(f"{template!r} gives no valid object for {str(rel)!r}: {e}") from None
    text = template.format(stem=stem, ext=ext, name=name, index=index, job=job, dir=folder)
    if text.endswith("/"):
        raise ValueError(f"{template!r} gives a folder for {str(rel)!r}")
    text = _SLASHES.sub("/", text).lstrip("/")
    if not text:
        raise ValueError(f"{template!r} gives an empty path for {str(rel)!r}")
    return posixpath.normpath(text)
