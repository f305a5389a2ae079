"""The job file's tuning sections (docs/job-file.md): video encoding, photo outputs, detector, mask,
enhancers, resources, on_complete. Each checks itself when built (a FieldError naming its key); JobSpec
(controller/job/spec.py) holds them and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.ffmpeg import NVENC, PRESETS, VIDEO_CODECS
from contract.manifest import (
    DETECTOR_SIZE,
    DETECTOR_THRESHOLD,
    ENHANCER_BLEND,
    ENHANCER_MODEL,
    ENHANCER_WEIGHT,
    FRAME_ENHANCER_BLEND,
    MASK_FEATHER,
    MASK_PADDING,
)
from contract.masks import DEFAULT_TYPES, MASK_TYPES, REGIONS, regions_problem, types_problem
from contract.photo import PHOTO_QUALITY, PHOTO_SCALE, QUALITY_RANGE, SCALE_RANGE, quality_problem, scale_problem
from contract.processors import FACE_ENHANCER_MODELS
from contract.selector import AGE_LIMITS, DEFAULT_ORDER, GENDERS, ORDERS, age_problem
from contract.swapper import PIXEL_BOOSTS, SWAPPER_MODEL, SWAPPER_MODELS, SWAPPER_WEIGHT, own_boost, pixel_boost_problem
from controller.job.keys import SIZE, about
from controller.settings.fields import (
    FieldError,
    as_nested,
    check_choice,
    check_int,
    check_number,
    check_range,
    check_str,
    parse_memory,
    show,
)

_NAME = r"[a-z0-9-]{1,40}"
_GPU_KIND = r"[A-Za-z0-9_]+"
# The frame enhancer's models (Real-ESRGAN's ONNX exports, FaceFusion's names); the pack's file decides
# what runs, the name is checked against its pack.yaml ``model:`` when that records one
FRAME_ENHANCER_MODELS = ("real_esrgan_x2", "real_esrgan_x2_fp16", "real_esrgan_x4", "real_esrgan_x4_fp16")
_PRESETS = (*PRESETS, "placebo")


@dataclass(frozen=True)
class VideoSettings:
    """How video segments are encoded."""

    codec: str = field(default="libx264", metadata=about("the encoder of video segments", enum=list(VIDEO_CODECS)))
    crf: int = field(
        default=18, metadata=about("constant-quality level: 0 … 51 (0 … 63 for libvpx-vp9)", minimum=0, maximum=63)
    )
    preset: str = field(
        default="medium",
        metadata=about("x264's preset names, given to each encoder in its own terms", enum=list(_PRESETS)),
    )

    def __post_init__(self) -> None:
        check_choice(self.codec, "codec", VIDEO_CODECS, "video encoder")
        check_int(self.crf, "crf", minimum=0, maximum=63 if self.codec == "libvpx-vp9" else 51)
        check_choice(self.preset, "preset", _PRESETS, "preset")

    @property
    def on_gpu(self) -> bool:
        """NVENC encodes on the node's GPU (the job must reserve one and allow cuda)."""
        return self.codec in NVENC


@dataclass(frozen=True)
class PhotoSettings:
    """photo: how photo outputs are written (contract/photo.py). ``quality``: the JPEG/WebP encoder's,
    1 … 100 (PNG, BMP and TIFF are lossless and ignore it); ``scale``: every photo output resized by
    it after the processors, frame enhancer included. Videos keep ``video.crf``. (Not ``image:``,
    which names the runner image.)"""

    quality: int = field(
        default=PHOTO_QUALITY,
        metadata=about(
            "JPEG/WebP quality of photo outputs (PNG, BMP, TIFF are lossless)",
            manifest="photo.quality",
            minimum=QUALITY_RANGE[0],
            maximum=QUALITY_RANGE[1],
        ),
    )
    scale: float = field(
        default=PHOTO_SCALE,
        metadata=about(
            "every photo output is resized by this after the processors",
            manifest="photo.scale",
            minimum=SCALE_RANGE[0],
            maximum=SCALE_RANGE[1],
        ),
    )

    def __post_init__(self) -> None:
        for name, why in (("quality", quality_problem(self.quality)), ("scale", scale_problem(self.scale))):
            if why is not None:
                raise FieldError(name, f"{why}, got {show(getattr(self, name))}")
        object.__setattr__(self, "scale", float(self.scale))


@dataclass(frozen=True)
class DetectorSettings:
    """Face detector: score threshold and square input size (a multiple of 32)."""

    threshold: float = field(
        default=DETECTOR_THRESHOLD,
        metadata=about("a face's least detector score", manifest="detector_threshold", exclusiveMinimum=0, maximum=1),
    )
    size: int = field(
        default=DETECTOR_SIZE,
        metadata=about(
            "the detector's square input side, a multiple of 32",
            manifest="detector_size",
            minimum=160,
            maximum=2048,
            multipleOf=32,
        ),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", check_number(self.threshold, "threshold", above=0, at_most=1))
        check_int(self.size, "size", minimum=160, maximum=2048)
        if self.size % 32:
            raise FieldError("size", f"must be a multiple of 32, got {show(self.size)}")


@dataclass(frozen=True)
class MaskSettings:
    """Paste-back mask, as fractions of the face size: ``feather`` blurs the edge, ``padding`` pulls
    it in. The defaults reproduce insightface's own paste-back. ``types``: the masks whose minimum
    limits the paste-back (box: the feathered box; occlusion: the occluder model's; region: the face
    parser's ``regions``), contract/masks.py."""

    feather: float = field(
        default=MASK_FEATHER,
        metadata=about(
            "the box's blurred edge, a fraction of the face size", manifest="mask_feather", minimum=0, maximum=0.5
        ),
    )
    padding: float = field(
        default=MASK_PADDING,
        metadata=about(
            "how far the box's edge is pulled in, a fraction of the face size",
            manifest="mask_padding",
            minimum=0,
            maximum=0.5,
        ),
    )
    types: tuple[str, ...] = field(
        default=DEFAULT_TYPES,
        metadata=about(
            "the masks whose minimum limits the paste-back",
            manifest="masks.types",
            items={"enum": list(MASK_TYPES)},
            minItems=1,
            uniqueItems=True,
        ),
    )
    regions: tuple[str, ...] = field(
        default=REGIONS,
        metadata=about(
            "the face parts the region mask keeps (with types: region)",
            manifest="masks.regions",
            items={"enum": list(REGIONS)},
            minItems=1,
            uniqueItems=True,
        ),
    )

    def __post_init__(self) -> None:
        for name, problem in (("types", types_problem(self.types)), ("regions", regions_problem(self.regions))):
            if problem is not None:
                raise FieldError(name if problem[0] is None else f"{name}[{problem[0]}]", problem[1])
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("feather", "padding"):  # 0 is allowed: a hard edge / no pull-in
            object.__setattr__(self, name, check_range(getattr(self, name), name, 0, 0.5))


@dataclass(frozen=True)
class EnhancerSettings:
    """face_enhancer: which model the job expects (checked against the pack's ``model:``), how much of
    the enhanced face is blended in (0 … 1) and codeformer's fidelity ``weight`` (0: most restored,
    1: closest to the input; accepted and unused with the other models, as in FaceFusion)."""

    # blend first: a positional EnhancerSettings(0.5) is the blend
    blend: float = field(
        default=ENHANCER_BLEND,
        metadata=about(
            "the share of the enhanced face blended in", manifest="enhancer_blend", exclusiveMinimum=0, maximum=1
        ),
    )
    model: str = field(
        default=ENHANCER_MODEL,
        metadata=about(
            "the enhancer model the job expects (checked against the pack)",
            manifest="enhancer_model",
            enum=list(FACE_ENHANCER_MODELS),
        ),
    )
    weight: float = field(
        default=ENHANCER_WEIGHT,
        metadata=about(
            "codeformer's fidelity: 0 most restored, 1 closest to the input",
            manifest="enhancer_weight",
            minimum=0,
            maximum=1,
        ),
    )

    def __post_init__(self) -> None:
        check_choice(self.model, "model", FACE_ENHANCER_MODELS, "face_enhancer model")
        object.__setattr__(self, "blend", check_number(self.blend, "blend", above=0, at_most=1))
        object.__setattr__(self, "weight", check_range(self.weight, "weight", 0, 1))  # FaceFusion's range


@dataclass(frozen=True)
class Resources:
    """What one chunk service reserves; ``memory`` is in bytes (the file may say ``6g``)."""

    gpus: int = field(default=1, metadata=about("GPUs each chunk service reserves", minimum=0))
    gpu_kind: str = field(
        default="GPU", metadata=about("the nodes' generic resource kind (letters, digits, _)", pattern=f"^{_GPU_KIND}$")
    )
    memory: int = field(
        default=6 * 1024**3,
        metadata=about(
            "memory each chunk service reserves: 6g, 512m, 1024k or bytes", read=parse_memory, **SIZE, default="6g"
        ),
    )

    def __post_init__(self) -> None:
        check_int(self.gpus, "gpus", minimum=0)
        check_str(self.gpu_kind, "gpu_kind", pattern=_GPU_KIND, hint="letters, digits and _ only (no -)")
        check_int(self.memory, "memory", minimum=1)


WEBHOOK_EVENTS = ("job.started", "job.finished", "job.cancelled")


@dataclass(frozen=True)
class OnComplete:
    """``hook`` names a program the cluster's policy defines; a job file never names a program.
    ``webhook_events``: the event types the webhook receives (None: all of WEBHOOK_EVENTS)."""

    webhook: str | None = field(
        default=None,
        metadata=about(
            "a URL that receives the report (its host must be allowed by the policy)", pattern=r"^https?://\S+$"
        ),
    )
    hook: str | None = field(
        default=None, metadata=about("the name of a hook in the cluster's policy", pattern=f"^{_NAME}$")
    )
    webhook_events: tuple[str, ...] | None = field(
        default=None,
        metadata=about(
            "the event types the webhook receives (default: all of them)",
            items={"enum": list(WEBHOOK_EVENTS)},
            minItems=1,
            uniqueItems=True,
        ),
    )

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_str(self.webhook, "webhook", pattern=r"https?://\S+", hint="an http:// or https:// URL")
        if self.webhook_events is not None:
            if self.webhook is None:
                raise FieldError("webhook_events", "needs webhook: the URL the events are sent to")
            events = self.webhook_events
            if not isinstance(events, list | tuple) or not events:
                raise FieldError("webhook_events", f"must be a list of one or more of {', '.join(WEBHOOK_EVENTS)}")
            for n, event in enumerate(events):
                check_choice(event, f"webhook_events[{n}]", WEBHOOK_EVENTS, "webhook event type")
            object.__setattr__(self, "webhook_events", tuple(events))
        if self.hook is not None:
            check_str(self.hook, "hook", pattern=_NAME, hint="the name of a hook in the cluster's policy")


def read_on_complete(value: object, f: str) -> OnComplete:
    """``on_complete:`` as the file gives it; ``command`` is refused by name (a job never names a program)."""
    if isinstance(value, dict) and "command" in value:
        raise FieldError(
            f"{f}.command",
            "is no longer supported: a job names a hook the cluster's policy defines (did you mean 'hook'?)",
        )
    result: OnComplete = as_nested(OnComplete, {})(value, f)
    return result


@dataclass(frozen=True)
class FrameEnhancerSettings:
    """frame_enhancer: which Real-ESRGAN model the job expects and how much of its output is kept
    (1: the model's only; 0: a plain resize to the same size)."""

    model: str | None = field(
        default=None,
        metadata=about(
            "the Real-ESRGAN model the job expects (checked against the pack)", enum=list(FRAME_ENHANCER_MODELS)
        ),
    )
    blend: float = field(
        default=FRAME_ENHANCER_BLEND,
        metadata=about(
            "the share of the model's output kept (0: a plain resize)",
            manifest="frame_enhancer_blend",
            minimum=0,
            maximum=1,
        ),
    )

    def __post_init__(self) -> None:
        if self.model is not None:
            check_choice(self.model, "model", FRAME_ENHANCER_MODELS, "frame_enhancer model")
        # 0 is allowed: the frame resized to the model's scale, nothing of its output
        object.__setattr__(self, "blend", check_range(self.blend, "blend", 0, 1))


@dataclass(frozen=True)
class SwapperSettings:
    """face_swapper: which swapper model the job expects (checked against the pack's ``model:``;
    contract/swapper.py CONTRACTS), the aligned crop's side (``pixel_boost``: left out, the model's
    own — 128 for inswapper, 256 for the others; larger ones are swapped as interleaved tiles of the
    model's side) and how much of the source identity goes in (``weight``: 1 all of it, 0 the target
    face's own). The defaults are the swap as it always was."""

    model: str = field(
        default=SWAPPER_MODEL,
        metadata=about(
            "the swapper model the job expects (checked against the pack)",
            manifest="swapper.model",
            enum=list(SWAPPER_MODELS),
        ),
    )
    pixel_boost: int | None = field(
        default=None,
        metadata=about(
            "the face crop's side (left out: the model's own)", manifest="swapper.pixel_boost", enum=list(PIXEL_BOOSTS)
        ),
    )
    weight: float = field(
        default=SWAPPER_WEIGHT,
        metadata=about(
            "the share of the source's identity (1: the plain swap)", manifest="swapper.weight", minimum=0, maximum=1
        ),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or self.model not in SWAPPER_MODELS:
            why = f"choose from {', '.join(SWAPPER_MODELS)}"
            raise FieldError("model", f"unknown face_swapper model {show(self.model)} ({why})")
        object.__setattr__(self, "pixel_boost", own_boost(self.model, self.pixel_boost))
        if (boost := pixel_boost_problem(self.pixel_boost, self.model)) is not None:
            raise FieldError("pixel_boost", f"{boost}, got {show(self.pixel_boost)}")
        # both ends allowed: 0 keeps the target's identity, 1 is the source's alone
        object.__setattr__(self, "weight", check_range(self.weight, "weight", 0, 1))


@dataclass(frozen=True)
class SelectorSettings:
    """selector: the order a frame's faces are taken in (``faces: one`` takes the first) and the
    gender/age a face must have to be changed (contract/selector.py; filtering needs the pack's
    genderage model). ``age`` is [min, max], both included."""

    order: str = field(
        default=DEFAULT_ORDER,
        metadata=about("the order a frame's faces are taken in", manifest="selector.order", enum=list(ORDERS)),
    )
    gender: str = field(
        default="any",
        metadata=about("only faces of this gender are changed", manifest="selector.gender", enum=list(GENDERS)),
    )
    age: tuple[int, int] = field(
        default=AGE_LIMITS,
        metadata=about(
            "[min, max] age of the faces changed, both included",
            manifest="selector.age",
            items={"type": "integer", "minimum": AGE_LIMITS[0], "maximum": AGE_LIMITS[1]},
        ),
    )

    def __post_init__(self) -> None:
        check_choice(self.order, "order", ORDERS, "face order")
        check_choice(self.gender, "gender", GENDERS, "gender")
        if (why := age_problem(self.age)) is not None:
            raise FieldError("age", f"{why}, got {_show_age(self.age)}")
        object.__setattr__(self, "age", (self.age[0], self.age[1]))

    @property
    def filters(self) -> bool:
        """Whether faces are dropped by gender or age (the pack must then have genderage)."""
        return self.gender != "any" or self.age != AGE_LIMITS


def _show_age(value: object) -> str:
    if isinstance(value, list | tuple) and len(value) <= 4:
        return "[" + ", ".join(show(v) for v in value) + "]"
    return show(value)
