"""Job file v1 (DESIGN.md) → a frozen, validated ``JobSpec``, and its resolution on a data root.

Job files are data: they are read with ``yaml.safe_load`` only. Every dataclass checks itself when
built, so a spec made in code and one read from a file fail the same way; reading a file adds the
file name (``JobFileError``, exit 65). Paths stay relative strings in the spec: only
``resolve_job`` looks at a disk, where globs are expanded and outputs named.
"""

from __future__ import annotations

import os
import posixpath
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from pathlib import Path, PurePosixPath

import yaml

from contract.manifest import (
    DETECTOR_SIZE,
    DETECTOR_THRESHOLD,
    ENHANCER_BLEND,
    MASK_FEATHER,
    MASK_PADDING,
    PROCESSORS,
    PROVIDERS,
    FaceSelection,
    NoFacePolicy,
)
from controller.errors import JobFileError, MissingInputError
from controller.paths import Resolver, check_relative, resolve_inside
from controller.validate import (
    FieldError,
    Reader,
    as_enum,
    as_list,
    as_nested,
    check_bool,
    check_choice,
    check_int,
    check_keys,
    check_number,
    check_str,
    check_unique,
    duplicate_key,
    parse_duration,
    parse_memory,
    same,
    show,
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi")
PLACEHOLDERS = ("stem", "ext", "name", "index", "job", "dir")
_DISTINCT = ("stem", "name", "index")  # placeholders that tell targets apart
_NAME = r"[a-z0-9-]{1,40}"
_GPU_KIND = r"[A-Za-z0-9_]+"  # no hyphen: sh drops DOCKER_RESOURCE_X-Y (FIELD-NOTES)
_PACK = r"(?!\.)[A-Za-z0-9._-]+"  # a folder under models/: no '.', '..' or hidden names
_TOKEN = r"[A-Za-z0-9_.-]+"  # codec and preset reach ffmpeg's argv
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


@dataclass(frozen=True)
class VideoSettings:
    """How video segments are encoded."""

    codec: str = "libx264"
    crf: int = 18
    preset: str = "medium"

    def __post_init__(self) -> None:
        check_str(self.codec, "codec", pattern=_TOKEN, hint="an encoder name like libx264")
        check_int(self.crf, "crf", minimum=0, maximum=51)
        check_str(self.preset, "preset", pattern=_TOKEN, hint="a preset name like medium")


@dataclass(frozen=True)
class DetectorSettings:
    """Face detector: score threshold and square input size (a multiple of 32)."""

    threshold: float = DETECTOR_THRESHOLD
    size: int = DETECTOR_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", check_number(self.threshold, "threshold", above=0, at_most=1))
        check_int(self.size, "size", minimum=160, maximum=2048)
        if self.size % 32:
            raise FieldError("size", f"must be a multiple of 32, got {show(self.size)}")


@dataclass(frozen=True)
class MaskSettings:
    """Paste-back mask, as fractions of the face size: ``feather`` blurs the edge, ``padding`` pulls
    it in. The defaults reproduce insightface's own paste-back."""

    feather: float = MASK_FEATHER
    padding: float = MASK_PADDING

    def __post_init__(self) -> None:
        for name in ("feather", "padding"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 0.5
            if not ok:  # 0 is allowed: a hard edge / no pull-in
                raise FieldError(name, f"must be a number in [0, 0.5], got {show(value)}")
            object.__setattr__(self, name, float(value))


@dataclass(frozen=True)
class EnhancerSettings:
    """face_enhancer: how much of the enhanced face is blended in (0 … 1)."""

    blend: float = ENHANCER_BLEND

    def __post_init__(self) -> None:
        object.__setattr__(self, "blend", check_number(self.blend, "blend", above=0, at_most=1))


@dataclass(frozen=True)
class Resources:
    """What one chunk service reserves; ``memory`` is in bytes (the file may say ``6g``)."""

    gpus: int = 1
    gpu_kind: str = "GPU"
    memory: int = 6 * 1024**3

    def __post_init__(self) -> None:
        check_int(self.gpus, "gpus", minimum=0)
        check_str(self.gpu_kind, "gpu_kind", pattern=_GPU_KIND, hint="letters, digits and _ only (no -)")
        check_int(self.memory, "memory", minimum=1)


@dataclass(frozen=True)
class OnComplete:
    webhook: str | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_str(self.webhook, "webhook", pattern=r"https?://\S+", hint="an http:// or https:// URL")
        if self.command is not None:
            check_str(self.command, "command")


@dataclass(frozen=True)
class JobSpec:
    """One job file, checked. ``timeout`` is in seconds (the file may say ``30m``)."""

    name: str
    source: tuple[str, ...]
    targets: tuple[str, ...]
    output: str
    processors: tuple[str, ...] = ("face_swapper",)
    faces: FaceSelection = FaceSelection.MANY
    no_face: NoFacePolicy = NoFacePolicy.COPY
    reference: str | None = None
    reference_distance: float = 0.6
    chunk_size: int | str = "auto"  # images (or video segments) per chunk; auto: see plan.auto_chunk_size
    segment_seconds: float = 30.0
    video: VideoSettings = field(default_factory=VideoSettings)
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

    def __post_init__(self) -> None:
        check_str(self.name, "name", pattern=_NAME, hint="1 to 40 characters of a-z, 0-9 and -")
        for i, photo in enumerate(_items(self.source, "source", "photo")):
            _check_photo(photo, _item_field("source", i, len(self.source)))
        for i, pattern in enumerate(_items(self.targets, "targets", "glob")):
            f = _item_field("targets", i, len(self.targets))
            _relative(check_str(pattern, f), f)
        _check_output(self.output, self.name)
        for i, p in enumerate(_items(self.processors, "processors", "processor")):
            check_choice(p, f"processors[{i}]", PROCESSORS, "processor")
        check_unique(self.processors, "processors")
        for i, p in enumerate(_items(self.providers, "providers", "provider")):
            check_choice(p, f"providers[{i}]", PROVIDERS, "provider")
        check_unique(self.providers, "providers")
        _check_enum(self.faces, FaceSelection, "faces")
        _check_enum(self.no_face, NoFacePolicy, "no_face")
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
            ("resources", Resources),
            ("on_complete", OnComplete),
            ("detector", DetectorSettings),
            ("mask", MaskSettings),
            ("face_enhancer", EnhancerSettings),
        )
        for name, kind in nested:
            if not isinstance(getattr(self, name), kind):
                raise FieldError(name, f"must be a {kind.__name__}, got {show(getattr(self, name))}")


def _items(values: object, name: str, what: str, *, minimum: int = 1) -> tuple[object, ...]:
    if not isinstance(values, tuple):
        raise FieldError(name, f"must be a tuple of {what}s, got {show(values)}")
    if len(values) < minimum:
        raise FieldError(name, f"must list at least {minimum} {what}")
    return values


def _item_field(name: str, i: int, count: int) -> str:
    return name if count == 1 else f"{name}[{i}]"


def _relative(rel: str, f: str) -> str:
    try:
        return check_relative(rel, what=f)
    except ValueError as e:
        raise FieldError(f, str(e)) from None


def _check_photo(value: object, f: str) -> None:
    _relative(check_str(value, f), f)
    if target_kind(str(value)) is not TargetKind.IMAGE:
        raise FieldError(f, f"{value!r} is not an image ({' '.join(IMAGE_EXTENSIONS)})")


def _check_enum(value: object, kind: type[Enum], f: str) -> None:
    if not isinstance(value, kind):
        raise FieldError(f, f"must be a {kind.__name__}, got {show(value)}")


def _check_output(template: object, job: str) -> None:
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
    _relative(template, "output")
    if template.endswith("/"):
        raise FieldError("output", f"{template!r} names a folder, not a file")
    try:
        expand_output(template, PurePosixPath("d/x.jpg"), index=0, job=job)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise FieldError("output", f"{template!r} cannot be expanded: {e}") from None


_SLASHES = re.compile("/+")


def expand_output(template: str, rel: str | PurePosixPath, *, index: int, job: str) -> str:
    """The output path (relative to the root, normalised) that ``template`` gives one target.

    An empty ``{dir}`` (a target in the root) leaves no ``//`` and no leading ``/`` behind. String
    functions, not PurePath objects: this runs once per target, 100,000 times for a big job.
    """
    rel = str(rel)
    folder, name = posixpath.split(rel)
    stem, ext = posixpath.splitext(name)
    text = template.format(stem=stem, ext=ext, name=name, index=index, job=job, dir=folder)
    if text.endswith("/"):
        raise ValueError(f"{template!r} gives a folder for {str(rel)!r}")
    text = _SLASHES.sub("/", text).lstrip("/")
    if not text:
        raise ValueError(f"{template!r} gives an empty path for {str(rel)!r}")
    return posixpath.normpath(text)


# --- reading job files -------------------------------------------------------------------------

_REQUIRED = ("name", "source", "targets", "output")

_READERS: dict[str, Reader] = {
    "source": as_list("path", str_ok=True),
    "targets": as_list("glob", str_ok=True),
    "processors": as_list("processor"),
    "providers": as_list("provider"),
    "placement": as_list("constraint"),
    "faces": as_enum(FaceSelection, "face selection"),
    "no_face": as_enum(NoFacePolicy, "no-face policy"),
    "timeout": parse_duration,
    "video": as_nested(VideoSettings, {}),
    "resources": as_nested(Resources, {"memory": parse_memory}),
    "on_complete": as_nested(OnComplete, {}),
    "detector": as_nested(DetectorSettings, {}),
    "mask": as_nested(MaskSettings, {}),
    "face_enhancer": as_nested(EnhancerSettings, {}),
}


def parse_job(data: object, file: str) -> JobSpec:
    """A job from already-parsed YAML data; ``file`` names it in errors."""
    try:
        if not isinstance(data, dict):
            got = "an empty file" if data is None else show(data)
            raise FieldError(None, f"the top level must be a mapping of job fields, got {got}")
        check_keys(data, (f.name for f in fields(JobSpec)))
        for key in _REQUIRED:
            if key not in data:
                raise FieldError(key, "required key is missing")
        return JobSpec(**{k: _READERS.get(k, same)(v, k) for k, v in data.items()})
    except FieldError as e:
        raise JobFileError(file, e.field, e.reason) from None


def parse_job_text(text: str, file: str) -> JobSpec:
    """A job from the text of a job file (``yaml.safe_load``: tags like ``!!python/object`` fail)."""
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        hint = " (job files are plain data: YAML tags are not allowed)" if "constructor" in str(e.problem) else ""
        raise JobFileError(file, None, f"invalid YAML{where}: {e.problem or e}{hint}") from None
    except yaml.YAMLError as e:
        raise JobFileError(file, None, f"invalid YAML: {e}") from None
    twice = duplicate_key(text)
    if twice is not None:
        raise JobFileError(file, twice[0], f"key written twice (again at line {twice[1]})")
    return parse_job(data, file)


def load_job_file(path: Path) -> JobSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise JobFileError(str(path), None, "is not UTF-8 text") from None
    except OSError as e:
        raise JobFileError(str(path), None, f"cannot be read: {e.strerror or e}") from None
    return parse_job_text(text, str(path))


def load_jobs(paths: Sequence[Path]) -> list[tuple[Path, JobSpec]]:
    """Job files named, or found in named folders (``*.yaml``/``*.yml``, not recursive), in order.

    Names must be unique across them: a job's name is its id.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = (x for x in p.iterdir() if x.suffix.lower() in (".yaml", ".yml") and not x.name.startswith("."))
            files.extend(sorted(x for x in found if x.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise JobFileError(str(p), None, "no such file or folder")
    unique: dict[str, Path] = {}  # a file named twice (itself and its folder) is one job
    for f in files:
        unique.setdefault(os.path.realpath(f), f)
    if not unique:
        raise JobFileError(", ".join(str(p) for p in paths) or "(no paths)", None, "no job files (*.yaml, *.yml)")
    jobs: list[tuple[Path, JobSpec]] = []
    by_name: dict[str, Path] = {}
    for f in unique.values():
        spec = load_job_file(f)
        if spec.name in by_name:
            raise JobFileError(str(f), "name", f"{spec.name!r} is also the name of the job in {by_name[spec.name]}")
        by_name[spec.name] = f
        jobs.append((f, spec))
    return jobs


# --- resolution on a data root -----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One matched input and where its output goes; host paths are real (symlink-free). Kept as
    strings (a Path per target costs ~1 s per 100,000 targets); ``input``/``output`` give Paths."""

    index: int  # 0-based, in the order of the globs, sorted within each
    input_host: str
    rel: str  # posix, relative to the data root
    output_host: str
    output_rel: str
    kind: TargetKind

    @property
    def input(self) -> Path:
        return Path(self.input_host)

    @property
    def output(self) -> Path:
        return Path(self.output_host)


@dataclass(frozen=True)
class ResolvedJob:
    sources: tuple[Path, ...]
    reference: Path | None
    targets: tuple[Target, ...]


def resolve_job(spec: JobSpec, data_root: Path, file: str, *, job_id: str | None = None) -> ResolvedJob:
    """Expand globs and outputs under ``data_root``; refuse escapes, collisions and missing inputs.

    ``job_id`` fills ``{job}`` (default: the job's name; ``--new`` gives ``name-2`` …).
    """
    root = Path(os.path.abspath(data_root))
    n = len(spec.source)
    sources = tuple(_existing(root, s, _item_field("source", i, n), file) for i, s in enumerate(spec.source))
    reference = None  # unused, so not looked for, unless faces: reference
    if spec.faces is FaceSelection.REFERENCE and spec.reference is not None:
        reference = _existing(root, spec.reference, "reference", file)
    resolver = Resolver(root, listings=True)  # one folder read per folder, not 2 stats per path
    matches = _match_targets(spec, file, resolver)
    names = {name for _, name, _, _ in string.Formatter().parse(spec.output) if name}
    if len(matches) > 1 and not names & set(_DISTINCT):
        reason = f"{spec.output!r} needs {{stem}}, {{name}} or {{index}}: the targets match {len(matches)} files"
        raise JobFileError(file, "output", reason)
    inputs = {p for p, _ in matches} | {str(s) for s in sources} | ({str(reference)} if reference else set())
    written: dict[str, str] = {}
    targets: list[Target] = []
    job = job_id or spec.name
    for index, (path, kind) in enumerate(matches):
        rel = resolver.relative(path)
        try:
            out_text = expand_output(spec.output, rel, index=index, job=job)
            out = resolver.inside_str(out_text, what="output")
        except ValueError as e:
            raise JobFileError(file, "output", f"for {rel!r}: {e}") from None
        out_rel = resolver.relative(out)
        if out in inputs:
            raise JobFileError(file, "output", f"{rel!r} would be written to {out_rel}, an input of this job")
        if out in written:
            raise JobFileError(file, "output", f"{written[out]!r} and {rel!r} would both write {out_rel}")
        if resolver.isdir(out):
            raise JobFileError(file, "output", f"{rel!r} would be written to {out_rel}, which is a folder")
        if target_kind(out_rel) is not kind:
            raise JobFileError(file, "output", f"{rel!r} is a {kind.value} but its output {out_rel} is not")
        written[out] = rel
        targets.append(Target(index, path, rel, out, out_rel, kind))
    return ResolvedJob(sources=sources, reference=reference, targets=tuple(targets))


def _existing(root: Path, rel: str, f: str, file: str) -> Path:
    try:
        path = resolve_inside(root, rel, what=f)
    except ValueError as e:
        raise JobFileError(file, f, str(e)) from None
    if not path.exists():
        raise MissingInputError(f"{file}: {f}: {rel!r} does not exist under {root}")
    if not path.is_file():
        raise JobFileError(file, f, f"{rel!r} is a folder, not a photo")
    return path


def _match_targets(spec: JobSpec, file: str, resolver: Resolver) -> list[tuple[str, TargetKind]]:
    seen: set[str] = set()
    matches: list[tuple[str, TargetKind]] = []
    for i, pattern in enumerate(spec.targets):
        f = _item_field("targets", i, len(spec.targets))
        try:
            found = resolver.glob(pattern)
        except ValueError as e:
            raise JobFileError(file, f, str(e)) from None
        if not found:
            raise JobFileError(file, f, f"{pattern!r} matches no file under {resolver.root}")
        for path in found:
            if path in seen:
                continue
            kind = target_kind(path)
            if kind is None:
                rel = resolver.relative(path)
                supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
                raise JobFileError(file, f, f"{rel!r} is neither an image nor a video (supported: {supported})")
            seen.add(path)
            matches.append((path, kind))
    return matches
