"""The frame enhancer: the whole frame upscaled by a Real-ESRGAN-contract model, after the face steps.

The contract (xinntao's Real-ESRGAN x2/x4 as exported to ONNX, e.g. FaceFusion's ``real_esrgan_x2``
and ``real_esrgan_x4``, fp16 variants too): one input ``[1, 3, H, W]``, RGB scaled to 0…1, any H and
W; one output ``[1, 3, s·H, s·W]`` in 0…1, ``s`` the model's scale (2 or 4, read from the model by
running it once on one tile when the chunk starts). A frame is cut into tiles of ``TILE`` pixels,
each run with ``MARGIN`` pixels of context on every side (edge-replicated at the frame's border) and
only its interior kept, so that a 4K frame never has to fit through the model at once and tiles meet
without seams for any model whose receptive field is within the margin. ``blend`` mixes the enhanced
frame with the frame resized to the same size (1.0: the model's output only).

The output frame is ``s`` times the size of the input: the image's file, and every frame of a video
segment, is written at that size (controller/job/plan.py records the scale for videos).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from .errors import MissingInput

TILE = 256  # pixels of a tile's interior (FaceFusion uses 256 for Real-ESRGAN)
MARGIN = 16  # context on each side of a tile, dropped from its output
SCALES = (2, 4)

Timer = Callable[[str, float], None]


@dataclass
class FrameEnhancer:
    session: Any  # onnxruntime.InferenceSession
    blend: float = 1.0
    tile: int = TILE
    margin: int = MARGIN
    name: str = "frame_enhancer"
    scale: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shape = list(inputs[0].shape) if len(inputs) == 1 else []
        if len(shape) != 4 or shape[1] != 3 or len(outputs) != 1:
            raise MissingInput(
                f"frame_enhancer model takes {shape or len(inputs)} inputs and gives {len(outputs)} outputs, "
                "not one [1, 3, H, W] image in and one out (the Real-ESRGAN contract)"
            )
        self._input, self._output = inputs[0].name, outputs[0].name
        self._dtype = np.float16 if inputs[0].type == "tensor(float16)" else np.float32
        side = self.tile + 2 * self.margin
        probe = np.zeros((1, 3, side, side), self._dtype)
        try:
            out = np.asarray(self.session.run([self._output], {self._input: probe})[0])
        except Exception as e:  # noqa: BLE001  (onnxruntime's own errors: a fixed or odd input shape)
            raise MissingInput(f"frame_enhancer model cannot take a [1, 3, {side}, {side}] tile: {e}") from None
        scale = out.shape[2] // side if out.ndim == 4 else 0
        if scale not in SCALES or tuple(out.shape) != (1, 3, side * scale, side * scale):
            raise MissingInput(
                f"frame_enhancer model turns a [1, 3, {side}, {side}] tile into {list(out.shape)}, "
                f"not a [1, 3, {side}·s, {side}·s] one with s in {SCALES}"
            )
        self.scale = scale

    def _run(self, tile: np.ndarray) -> np.ndarray:
        """One BGR uint8 tile (with its margins) → the model's BGR uint8 output."""
        blob = (tile[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255.0).astype(self._dtype)
        pred = np.asarray(self.session.run([self._output], {self._input: blob})[0], np.float32)[0]
        out: np.ndarray = np.rint(np.clip(pred, 0.0, 1.0) * 255.0).astype(np.uint8).transpose(1, 2, 0)[:, :, ::-1]
        return out

    def enhance(self, frame: np.ndarray, timer: Timer | None = None) -> np.ndarray:
        """The frame ``scale`` times larger (a new array; ``frame`` is not changed)."""
        t = time.perf_counter()
        h, w = frame.shape[:2]
        s, m, size = self.scale, self.margin, self.tile
        padded = cv2.copyMakeBorder(frame, m, m + size, m, m + size, cv2.BORDER_REPLICATE)
        out = np.empty((h * s, w * s, 3), np.uint8)
        for y in range(0, h, size):
            for x in range(0, w, size):
                th, tw = min(size, h - y), min(size, w - x)
                up = self._run(padded[y : y + size + 2 * m, x : x + size + 2 * m])
                out[y * s : (y + th) * s, x * s : (x + tw) * s] = up[m * s : (m + th) * s, m * s : (m + tw) * s]
        if self.blend < 1.0:
            plain = cv2.resize(frame, (w * s, h * s), interpolation=cv2.INTER_CUBIC)
            out = cv2.addWeighted(out, self.blend, plain, 1.0 - self.blend, 0.0)
        if timer is not None:
            timer("swap", time.perf_counter() - t)  # the pipeline's stage for inference
        return out
