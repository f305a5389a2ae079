"""Faces: detect them, embed them, and pick which ones a job swaps.

We keep our own small ``Face`` value instead of insightface's dict-like ``Face`` so that the rest of
the runner is typed and so that selection is a pure function tested as data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.manifest import FaceSelection

from . import align
from .errors import ItemError


@dataclass(frozen=True)
class Face:
    """One detection: box (x1, y1, x2, y2) in image pixels, score, five keypoints (5x2)."""

    box: tuple[float, float, float, float]
    score: float
    kps: np.ndarray

    @property
    def area(self) -> float:
        x1, y1, x2, y2 = self.box
        return max(0.0, x2 - x1) * max(0.0, y2 - y1)


def detect(detector: Any, image: np.ndarray) -> list[Face]:
    """All faces insightface's SCRFD finds (det_thresh and size set in models.load_models)."""
    boxes, kpss = detector.detect(image, max_num=0)
    faces = []
    for i in range(boxes.shape[0]):
        x1, y1, x2, y2, score = (float(v) for v in boxes[i])
        faces.append(Face((x1, y1, x2, y2), score, np.asarray(kpss[i], dtype=np.float32)))
    return faces


def select(faces: Sequence[Face], mode: FaceSelection) -> list[Face]:
    """Which faces to swap: ``many`` all of them (in detection order), ``one`` the largest box,
    ties broken left to right so the choice never depends on detector output order.
    ``reference`` needs embeddings: use ``by_reference``."""
    if mode is FaceSelection.MANY:
        return list(faces)
    if mode is FaceSelection.ONE:
        if not faces:
            return []
        return [min(faces, key=lambda f: (-f.area, f.box[0], f.box[1]))]
    raise ItemError("faces: reference needs the faces' embeddings (internal: use by_reference)")


def cosine_distance(embeddings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """1 − cosine similarity of each row to ``reference`` (rows and reference L2-normalised here)."""
    if embeddings.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    ref = normalise_rows(np.asarray(reference, dtype=np.float32).reshape(1, -1))[0]
    out: np.ndarray = 1.0 - normalise_rows(np.asarray(embeddings, dtype=np.float32)) @ ref
    return out


def by_reference(
    faces: Sequence[Face], embeddings: np.ndarray, reference: np.ndarray, max_distance: float
) -> list[Face]:
    """``faces: reference``: every face within ``max_distance`` (cosine) of the reference face, in
    detection order. The reference embedding comes from the manifest, so every chunk of a job picks
    by the same yardstick."""
    if len(faces) != embeddings.shape[0]:
        raise ValueError(f"{len(faces)} faces but {embeddings.shape[0]} embeddings")
    distances = cosine_distance(embeddings, reference)
    return [f for f, d in zip(faces, distances, strict=True) if float(d) <= max_distance]


def embed(recognizer: Any, image: np.ndarray, faces: Sequence[Face]) -> np.ndarray:
    """L2-normalised ArcFace embeddings, one row per face, in one batched run."""
    if not faces:
        return np.zeros((0, 512), dtype=np.float32)
    size = int(recognizer.input_size[0])
    crops = [align.crop(image, f.kps, size)[0] for f in faces]
    feats = np.asarray(recognizer.get_feat(crops), dtype=np.float32).reshape(len(faces), -1)
    return normalise_rows(feats)


def normalise_rows(feats: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(feats, axis=1, keepdims=True)
    out: np.ndarray = feats / np.maximum(norms, 1e-12)
    return out


def identity(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """One person from several photos: the mean of the normed embeddings, renormalised."""
    stacked = normalise_rows(np.stack([np.asarray(e, dtype=np.float32).ravel() for e in embeddings]))
    out: np.ndarray = normalise_rows(stacked.mean(axis=0, keepdims=True))[0]
    return out
