"""The genderage model (insightface buffalo_l's ``genderage.onnx``) for the face selector's gender and
age filters (contract/selector.py), on a plain onnxruntime session.

Its contract is insightface's ``Attribute`` class (model_zoo/attribute.py), reproduced here step by
step: the face's box, centred, scaled so that 1.5 × its longer side fills the 96-pixel input, no
rotation (face_align.transform with rotation 0 is exactly this one warp, border black); the crop fed
RGB through ``cv2.dnn.blobFromImage`` with the mean/std insightface picks from the graph (no
normalisation, 0 and 1, when one of the first eight nodes is a ``Sub``/``_minus`` and one a
``Mul``/``_mul``, or the first three include ``bn_data``; else 127.5 and 128). One output [1, 3]: the
first two are gender scores (argmax: 0 female, 1 male), the third is age / 100, rounded.
insightface's face_align.transform needs scikit-image's full SimilarityTransform, which the runner
image leaves out (similarity.py), so the matrix is written out here; a unit test compares the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .errors import MissingInput
from .faces import Face

SIZE = 96  # the model's input side
FEMALE, MALE = 0, 1
GENDERS = {"female": FEMALE, "male": MALE}


def input_norm(model_file: Path) -> tuple[float, float]:
    """(mean, std) as insightface's Attribute class decides them from the graph's first nodes."""
    import onnx  # only a job that filters pays for reading the graph

    model = onnx.load(str(model_file))
    find_sub = find_mul = False
    for nid, node in enumerate(model.graph.node[:8]):
        if node.name.startswith("Sub") or node.name.startswith("_minus"):
            find_sub = True
        if node.name.startswith("Mul") or node.name.startswith("_mul"):
            find_mul = True
        if nid < 3 and node.name == "bn_data":
            find_sub = find_mul = True
    return (0.0, 1.0) if find_sub and find_mul else (127.5, 128.0)


def crop_matrix(box: tuple[float, float, float, float], size: int = SIZE) -> np.ndarray:
    """insightface's face_align.transform(center, size, size / (1.5 · longer side), rotation 0)."""
    x1, y1, x2, y2 = box
    scale = size / (max(x2 - x1, y2 - y1) * 1.5)
    cx, cy = (x1 + x2) / 2 * scale, (y1 + y2) / 2 * scale
    return np.array([[scale, 0.0, size / 2 - cx], [0.0, scale, size / 2 - cy]], dtype=np.float64)


def crop(image: np.ndarray, box: tuple[float, float, float, float], size: int = SIZE) -> np.ndarray:
    """The model's view of one face: ``size``² BGR, black outside the frame."""
    return cv2.warpAffine(image, crop_matrix(box, size), (size, size), borderValue=0.0)


@dataclass(frozen=True)
class GenderAge:
    """A loaded genderage model: ``judge`` gives each face's (gender, age)."""

    session: Any
    mean: float = 127.5
    std: float = 128.0

    def __post_init__(self) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shape = list(inputs[0].shape) if len(inputs) == 1 else []
        if len(shape) != 4 or shape[1:] != [3, SIZE, SIZE] or len(outputs) != 1 or outputs[0].shape[-1:] != [3]:
            raise MissingInput(
                f"not a genderage model (wanted one input [1, 3, {SIZE}, {SIZE}] and one output [1, 3], "
                f"got inputs {[i.shape for i in inputs]} and outputs {[o.shape for o in outputs]})"
            )

    def judge(self, image: np.ndarray, faces: Sequence[Face]) -> list[tuple[int, int]]:
        """(gender: 0 female, 1 male; age in years) of each face, one run per face (the model's batch
        is fixed at 1, as insightface runs it)."""
        name = self.session.get_inputs()[0].name
        out: list[tuple[int, int]] = []
        for face in faces:
            blob = cv2.dnn.blobFromImage(
                crop(image, face.box), 1.0 / self.std, (SIZE, SIZE), (self.mean,) * 3, swapRB=True
            )
            pred = np.asarray(self.session.run(None, {name: blob})[0], dtype=np.float32).reshape(-1)
            out.append((int(np.argmax(pred[:2])), int(np.round(pred[2] * 100))))
        return out


def load(session: Any, model_file: Path) -> GenderAge:
    """The genderage role's session, its input normalisation read from its graph as insightface does."""
    mean, std = input_norm(model_file)
    return GenderAge(session, mean, std)
