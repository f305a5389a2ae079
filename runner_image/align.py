"""Face crops aligned to the ArcFace 5-point template, for the recognizer and the swapper.

insightface's ``face_align`` fits the similarity transform with scikit-image's
``SimilarityTransform``, whose module imports ``scipy.spatial`` on first use: 0.3 s on the first
face of every chunk and of the identity step (cProfile in the runner image), paid before the first
output. OpenCV's ``estimateAffinePartial2D`` fits the same four-degree-of-freedom transform
(rotation, uniform scale, translation); with a reprojection threshold far above any residual every
landmark is an inlier, and its Levenberg–Marquardt refinement ends on the same least-squares fit:
within 0.001 px of insightface's (tests/unit/test_runner_parts.py). The template and its scaling
for 112- and 128-pixel models are insightface's (``face_align.arcface_dst``).
"""

from __future__ import annotations

import cv2
import numpy as np

from .insightface_lite import face_align

_ALL_INLIERS = 1e4  # pixels: no landmark of a real face is this far off the fit


def template(size: int) -> np.ndarray:
    """Where the eyes, nose and mouth corners go in a ``size``² crop (112 or 128 multiples)."""
    if size % 112 == 0:
        return np.asarray(face_align.arcface_dst, dtype=np.float32) * (size / 112.0)
    if size % 128 != 0:
        raise ValueError(f"no ArcFace template for a {size}-pixel crop")
    scale = size / 128.0
    points = np.asarray(face_align.arcface_dst, dtype=np.float32) * scale
    points[:, 0] += 8.0 * scale  # the 112 template centred in 128
    return points


def estimate(landmarks: np.ndarray, size: int) -> np.ndarray:
    """The 2×3 matrix taking the face's five landmarks onto the template."""
    points = np.asarray(landmarks, dtype=np.float32).reshape(5, 2)
    matrix, _ = cv2.estimateAffinePartial2D(
        points, template(size), method=cv2.RANSAC, ransacReprojThreshold=_ALL_INLIERS
    )
    if matrix is None:  # degenerate landmarks (all on one point): OpenCV finds no fit
        return np.asarray(face_align.estimate_norm(points, size), dtype=np.float64)
    return np.asarray(matrix, dtype=np.float64)


def onto(landmarks: np.ndarray, points: np.ndarray, size: int) -> np.ndarray:
    """The 2×3 similarity taking five landmarks onto ``points`` (fractions of the side) of a ``size``²
    crop, fitted as FaceFusion 3.x's ``estimate_matrix_by_face_landmark_5`` fits it (RANSAC, threshold
    100 px); degenerate landmarks (OpenCV finds no fit) get the least-squares similarity instead."""
    src = np.asarray(landmarks, dtype=np.float32).reshape(5, 2)
    dst = np.asarray(points, dtype=np.float32).reshape(5, 2) * np.float32(size)
    matrix, _ = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=100)
    if matrix is not None:
        return np.asarray(matrix, dtype=np.float64)
    # u = a·x − b·y + tx, v = b·x + a·y + ty, solved for (a, b, tx, ty); lstsq copes with a rank loss
    rows = [[x, -y, 1.0, 0.0] for x, y in src] + [[y, x, 0.0, 1.0] for x, y in src]
    a, b, tx, ty = np.linalg.lstsq(np.asarray(rows, np.float64), np.r_[dst[:, 0], dst[:, 1]], rcond=None)[0]
    return np.array([[a, -b, tx], [b, a, ty]], dtype=np.float64)


def crop_onto(image: np.ndarray, landmarks: np.ndarray, points: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The face warped onto a template's ``points`` in a ``size``² crop as FaceFusion 3.x warps a
    swapper's crop (``warp_face_by_face_landmark_5``: edge pixels replicated, area interpolation),
    and the matrix that made it."""
    matrix = onto(landmarks, points, size)
    out = cv2.warpAffine(image, matrix, (size, size), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_AREA)
    return out, matrix


def crop(image: np.ndarray, landmarks: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The aligned ``size``² crop and the matrix that made it (to paste the result back)."""
    matrix = estimate(landmarks, size)
    return cv2.warpAffine(image, matrix, (size, size), borderValue=0.0), matrix
