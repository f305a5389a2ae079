"""Face enhancers (processors ``face_enhancer``): FaceFusion's face_enhancer models behind one call.

Every model here (gfpgan_1.4, codeformer, gpen_bfr_512, restoreformer_plus_plus, as FaceFusion exports
them) restores an FFHQ-512 aligned face: one ``input`` [1, 3, 512, 512] RGB scaled to −1…1 in, the
same shape in −1…1 out; the crop is pasted back through the job's mask. CodeFormer's graph takes one
more input, ``weight`` (a one-element float64 tensor in FaceFusion's export): its fidelity, 0 the
most restored face, 1 the closest to the input.

The call is built from the session's own inputs, never from the model's name: an input named
``weight`` besides the image makes it the weighted (CodeFormer) call, fed the manifest's
``enhancer_weight`` in the dtype and rank the graph declares. The manifest's ``enhancer_model`` must
agree with that (codeformer ⇔ a ``weight`` input), so a job never silently runs another model than
it asked for, nor drops its weight; a disagreement, or an image input other than [1, 3, 512, 512], is
refused naming the role (exit 66) before any item.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from contract.manifest import ENHANCER_MODEL, ENHANCER_WEIGHT
from contract.processors import WEIGHTED_FACE_ENHANCERS

from . import swap
from .errors import MissingInput
from .faces import Face

# FFHQ 512 alignment template (five landmarks, fraction of the side): what GFPGAN was trained on, and
# FaceFusion's ``ffhq_512`` template for every model here.
FFHQ_512 = np.array(
    [
        [0.37691676, 0.46864664],
        [0.62285697, 0.46912813],
        [0.50123859, 0.61331904],
        [0.39308822, 0.72541100],
        [0.61150205, 0.72490465],
    ],
    dtype=np.float32,
)
ENHANCER_SIZE = 512
WEIGHT_INPUT = "weight"  # CodeFormer's fidelity input (FaceFusion: numpy.array([weight]).astype(double))

Timer = Callable[[str, float], None]  # (stage, seconds): the pipeline's per-item timings

_DTYPES = {"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(double)": np.float64}


def weight_feed(declared: Any, weight: float) -> np.ndarray:
    """``weight`` as the graph's ``weight`` input declares it: its float type (float64 unless it
    says float or float16) and rank (one element; FaceFusion's export: shape [1])."""
    dtype = _DTYPES.get(declared.type)
    if dtype is None:
        raise MissingInput(f"enhancer model's {WEIGHT_INPUT!r} input is {declared.type}, not a float tensor")
    rank = len(declared.shape) if declared.shape is not None else 1
    return np.full([1] * rank, weight, dtype=dtype)


@dataclass
class FaceEnhancer:
    """One FFHQ-512 face restorer: GFPGAN 1.4's contract, plus CodeFormer's ``weight`` when the
    graph takes one (see the module's docstring)."""

    session: Any
    blend: float
    feather: float
    padding: float
    weight: float = ENHANCER_WEIGHT
    model: str = ENHANCER_MODEL  # what the job asked for (manifest enhancer_model)
    name: str = "face_enhancer"
    masker: Any = None  # a masks.Masker: mask.types occlusion/region (masks.bind), None: the box alone
    _feeds: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        inputs = list(self.session.get_inputs())
        images = [i for i in inputs if i.name != WEIGHT_INPUT]
        weights = [i for i in inputs if i.name == WEIGHT_INPUT]
        shape = list(images[0].shape) if len(images) == 1 else []
        if len(shape) != 4 or shape[1:] != [3, ENHANCER_SIZE, ENHANCER_SIZE]:
            raise MissingInput(
                f"enhancer model takes {shape or len(inputs)} inputs, not one [1, 3, 512, 512] image "
                f"(and codeformer's {WEIGHT_INPUT!r})"
            )
        weighted = self.model in WEIGHTED_FACE_ENHANCERS
        if weighted != bool(weights):
            has = f"takes a {WEIGHT_INPUT!r} input (codeformer's contract)" if weights else "takes one image only"
            raise MissingInput(
                f"enhancer model {has}, but the job's face_enhancer.model is {self.model} "
                f"(set face_enhancer.model to what the pack's enhancer file is)"
            )
        self._input = images[0].name
        self._dtype = np.float16 if images[0].type == "tensor(float16)" else np.float32
        self._output = self.session.get_outputs()[0].name
        self._feeds = {WEIGHT_INPUT: weight_feed(weights[0], self.weight)} if weights else {}

    def enhance(self, frame: np.ndarray, face: Face) -> swap.Swapped:
        matrix = cv2.estimateAffinePartial2D(face.kps, FFHQ_512 * ENHANCER_SIZE, method=cv2.LMEDS)[0]
        crop = cv2.warpAffine(frame, matrix, (ENHANCER_SIZE, ENHANCER_SIZE), borderMode=cv2.BORDER_REPLICATE)
        blob = cv2.dnn.blobFromImage(crop, 1.0 / 127.5, (ENHANCER_SIZE, ENHANCER_SIZE), (127.5,) * 3, swapRB=True)
        feeds = {self._input: blob.astype(self._dtype), **self._feeds}
        pred = np.asarray(self.session.run([self._output], feeds)[0], np.float32)
        rgb = (np.clip(pred[0], -1.0, 1.0) + 1.0) * 127.5
        out = np.rint(rgb.transpose(1, 2, 0)[:, :, ::-1]).astype(np.uint8)
        return swap.Swapped(crop=np.ascontiguousarray(out), matrix=np.asarray(matrix, dtype=np.float64))

    def apply(self, frame: np.ndarray, faces: Sequence[Face], timer: Timer) -> None:
        t = time.perf_counter()
        enhanced = [self.enhance(frame, f) for f in faces]
        masker = self.masker  # occlusion/region masks of each face, as the enhanced frame stands
        extras = [None if masker is None else masker.extra(frame, f, e) for f, e in zip(faces, enhanced, strict=True)]
        t1 = time.perf_counter()
        for e, extra in zip(enhanced, extras, strict=True):
            swap.paste_back(frame, e, feather=self.feather, padding=self.padding, blend=self.blend, extra=extra)
        timer("swap", t1 - t)
        timer("paste", time.perf_counter() - t1)
