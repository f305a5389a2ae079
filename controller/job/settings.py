"""The job file's tuning sections (docs/job-file.md): video encoding, detector, mask, enhancers,
resources, on_complete. Each checks itself when built (a FieldError naming its key); JobSpec
(controller/job/spec.py) holds them and re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

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
from contract.processors import FACE_ENHANCER_MODELS
from contract.selector import AGE_LIMITS, DEFAULT_ORDER, GENDERS, ORDERS, age_problem
from controller.job.validate import FieldError, check_choice, check_int, check_number, check_str, show

_NAME = r"[a-z0-9-]{1,40}"
_GPU_KIND = r"[A-Za-z0-9_]+"
_TOKEN = r"[A-Za-z0-9_.-]+"  # codec and preset reach ffmpeg's argv
# The frame enhancer's models (Real-ESRGAN's ONNX exports, FaceFusion's names); the pack's file decides
# what runs, the name is checked against its pack.yaml ``model:`` when that records one
FRAME_ENHANCER_MODELS = ("real_esrgan_x2", "real_esrgan_x2_fp16", "real_esrgan_x4", "real_esrgan_x4_fp16")


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
    """face_enhancer: which model the job expects (checked against the pack's ``model:``), how much of
    the enhanced face is blended in (0 … 1) and codeformer's fidelity ``weight`` (0: most restored,
    1: closest to the input; accepted and unused with the other models, as in FaceFusion)."""

    blend: float = ENHANCER_BLEND  # first: EnhancerSettings(0.5) is the blend, as before models
    model: str = ENHANCER_MODEL
    weight: float = ENHANCER_WEIGHT

    def __post_init__(self) -> None:
        check_choice(self.model, "model", FACE_ENHANCER_MODELS, "face_enhancer model")
        object.__setattr__(self, "blend", check_number(self.blend, "blend", above=0, at_most=1))
        ok = isinstance(self.weight, int | float) and not isinstance(self.weight, bool) and 0 <= self.weight <= 1
        if not ok:  # both ends allowed: FaceFusion's range
            raise FieldError("weight", f"must be a number in [0, 1], got {show(self.weight)}")
        object.__setattr__(self, "weight", float(self.weight))


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
    """``hook`` names a program the cluster's policy defines; a job file never names a program."""

    webhook: str | None = None
    hook: str | None = None

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_str(self.webhook, "webhook", pattern=r"https?://\S+", hint="an http:// or https:// URL")
        if self.hook is not None:
            check_str(self.hook, "hook", pattern=_NAME, hint="the name of a hook in the cluster's policy")


@dataclass(frozen=True)
class FrameEnhancerSettings:
    """frame_enhancer: which Real-ESRGAN model the job expects and how much of its output is kept
    (1: the model's only; 0: a plain resize to the same size)."""

    model: str | None = None
    blend: float = FRAME_ENHANCER_BLEND

    def __post_init__(self) -> None:
        if self.model is not None:
            check_choice(self.model, "model", FRAME_ENHANCER_MODELS, "frame_enhancer model")
        ok = isinstance(self.blend, int | float) and not isinstance(self.blend, bool) and 0 <= self.blend <= 1
        if not ok:  # 0 is allowed: the frame resized to the model's scale, nothing of its output
            raise FieldError("blend", f"must be a number in [0, 1], got {show(self.blend)}")
        object.__setattr__(self, "blend", float(self.blend))


@dataclass(frozen=True)
class SelectorSettings:
    """selector: the order a frame's faces are taken in (``faces: one`` takes the first) and the
    gender/age a face must have to be changed (contract/selector.py; filtering needs the pack's
    genderage model). ``age`` is [min, max], both included."""

    order: str = DEFAULT_ORDER
    gender: str = "any"
    age: tuple[int, int] = AGE_LIMITS

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
