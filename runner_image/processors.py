"""Processors: the face operations a job lists (``processors: [face_swapper, face_enhancer]``).

One small contract, in the spirit of FaceFusion's processor modules: a processor is built once per
chunk from the loaded models and the manifest by its factory (FACTORIES, keyed by the names of the
registry in contract/processors.py, which also says the pack roles it needs, checked before anything
loads), and changes the selected faces of one frame in place. Processors run in the order the job
lists them, each on the previous one's output, so ``[face_swapper, face_enhancer]`` enhances the
swapped face. ``apply`` must be thread-safe: the pipeline runs several items at once (onnxruntime
sessions are; all other state is per call). The face enhancer's models (GFPGAN, CodeFormer …) are
runner_image/face_enhancers.py's.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, cast

import numpy as np

from contract.manifest import Manifest
from contract.swapper import contract_of

from . import masks, pixel_boost, swap, swappers
from .errors import MissingInput
from .face_enhancers import FaceEnhancer
from .faces import Face
from .frame_enhancer import FrameEnhancer

Timer = Callable[[str, float], None]  # (stage, seconds): the pipeline's per-item timings


class Processor(Protocol):
    name: str

    def apply(self, frame: np.ndarray, faces: Sequence[Face], timer: Timer) -> None:
        """Change ``faces`` of ``frame`` in place, reporting inference as "swap", blending as "paste"."""


class FaceSwap(Protocol):
    """A swapper bound to the chunk's identity: swap.Swapper (inswapper) or swappers.EmbeddingSwapper."""

    @property
    def needs_target(self) -> bool: ...

    def swap(self, image: np.ndarray, face: Face, target: np.ndarray | None = None) -> swap.Swapped: ...


@dataclass
class FaceSwapper:
    swapper: FaceSwap
    feather: float
    padding: float
    name: str = "face_swapper"
    recognizer: Any = None  # the chunk's: each target face's embedding, for a weight below 1
    masker: masks.Masker | None = None  # mask.types occlusion/region (masks.bind), None: the box alone

    def apply(self, frame: np.ndarray, faces: Sequence[Face], timer: Timer) -> None:
        t = time.perf_counter()
        targets = pixel_boost.target_embeddings(self.recognizer, frame, faces, self.swapper.needs_target)
        if self.swapper.needs_target:  # a weight below 1: the faces' own embeddings, timed as "embed"
            timer("embed", time.perf_counter() - t)
            t = time.perf_counter()
        # every crop is taken from the unmodified frame, then all are blended in one pass over the
        # faces' own regions (never the whole frame)
        swapped = [self.swapper.swap(frame, f, e) for f, e in zip(faces, targets, strict=True)]
        extras = masks.extras(self.masker, frame, faces, swapped)  # from the unmodified frame too
        t1 = time.perf_counter()
        for s, extra in zip(swapped, extras, strict=True):
            swap.paste_back(frame, s, feather=self.feather, padding=self.padding, extra=extra)
        timer("swap", t1 - t)
        timer("paste", time.perf_counter() - t1)


Factory = Callable[[Manifest, Any, np.ndarray], Processor]  # (manifest, loaded models, identity)


def _face_swapper(manifest: Manifest, models: Any, identity: np.ndarray) -> Processor:
    boost, weight = manifest.swapper_pixel_boost, manifest.swapper_weight
    loaded = models.swapper
    if isinstance(loaded, swappers.SwapperModel) != (contract_of(manifest.swapper_model).family != "inswapper") or (
        isinstance(loaded, swappers.SwapperModel) and loaded.contract.model != manifest.swapper_model
    ):  # load_models reads the manifest's model; this guards models loaded by hand for another
        raise MissingInput(f"face_swapper: the loaded swapper is not the manifest's {manifest.swapper_model}")
    swapper: FaceSwap
    if isinstance(loaded, swappers.SwapperModel):
        swapper = swappers.EmbeddingSwapper(loaded, identity, pixel_boost=boost, weight=weight)
    else:
        swapper = swap.Swapper(loaded, identity, pixel_boost=boost, weight=weight)
    return FaceSwapper(swapper, manifest.mask_feather, manifest.mask_padding, recognizer=models.recognizer)


def _face_enhancer(manifest: Manifest, models: Any, identity: np.ndarray) -> Processor:
    return FaceEnhancer(
        models.enhancer,
        manifest.enhancer_blend,
        manifest.mask_feather,
        manifest.mask_padding,
        weight=manifest.enhancer_weight,
        model=manifest.enhancer_model,
    )


def _frame_enhancer(manifest: Manifest, models: Any, identity: np.ndarray) -> Processor:
    if models.frame_enhancer is None:  # the pack check requires the role; this guards a manifest by hand
        raise MissingInput("frame_enhancer: the model pack's frame_enhancer model is not loaded")
    step = copy.copy(models.frame_enhancer)  # its scale read once at load; the job's blend
    step.blend = manifest.frame_enhancer_blend
    return cast(Processor, step)


# One factory per name of the registry (contract/processors.py); test_runner_processors keeps them in step.
FACTORIES: Mapping[str, Factory] = MappingProxyType(
    {"face_swapper": _face_swapper, "face_enhancer": _face_enhancer, "frame_enhancer": _frame_enhancer}
)


def run(chain: Sequence[Processor], frame: np.ndarray, faces: Sequence[Face], timer: Timer) -> np.ndarray:
    """The chain in order on one frame: face steps change the faces in place (none without faces), a
    frame step (the frame enhancer, always last) returns a new, larger frame. Returns the frame."""
    for step in chain:
        if isinstance(step, FrameEnhancer):
            frame = step.enhance(frame, timer)
        elif faces:
            step.apply(frame, faces, timer)
    return frame


def scale(chain: Sequence[Processor]) -> int:
    """How many times larger than its input the chain's output frame is."""
    out = 1
    for step in chain:
        if isinstance(step, FrameEnhancer):
            out *= step.scale
    return out


def build(manifest: Manifest, models: Any, identity: np.ndarray) -> list[Processor]:
    """The manifest's processors, in its order, bound to this chunk's models and identity."""
    out: list[Processor] = []
    for name in manifest.processors:
        factory = FACTORIES.get(name)
        if factory is None:  # the manifest refuses names outside the registry; this guards a missing factory
            raise MissingInput(f"processor {name!r} is not implemented by this runner")
        out.append(masks.bind(factory(manifest, models, identity), manifest, models))
    return out
