"""The similarity transform insightface's ``face_align`` fits, without scikit-image.

insightface's ``face_align`` imports scikit-image at module level for one class,
``SimilarityTransform`` (``estimate`` and ``params``), which the runner reaches only for degenerate
landmarks (align.py). The runner image leaves scikit-image out, and with it scipy and networkx
(~165 MB): where scikit-image is not installed, insightface_lite registers this module as
``skimage.transform``. The estimate is Umeyama's least-squares fit, step by step as scikit-image
0.26 computes it (tests/unit/test_similarity.py compares the two).
"""

from __future__ import annotations

import numpy as np


def umeyama(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The (D+1)² matrix of the rotation, uniform scale and translation taking src onto dst in the
    least-squares sense (Umeyama 1991, eqs. 38-43); all NaN when the fit is not determined."""
    num, dim = src.shape
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_demean, dst_demean = src - src_mean, dst - dst_mean
    a = dst_demean.T @ src_demean / num
    d = np.ones((dim,), dtype=np.float64)
    if np.linalg.det(a) < 0:
        d[dim - 1] = -1
    t = np.eye(dim + 1, dtype=np.float64)
    u, s, v = np.linalg.svd(a)
    rank = np.count_nonzero(s > s.max() * max(a.shape) * np.finfo(float).eps)
    if rank == 0:
        return np.nan * t
    if rank == dim - 1 and np.linalg.det(u) * np.linalg.det(v) <= 0:
        flipped = d.copy()
        flipped[dim - 1] = -1
        t[:dim, :dim] = u @ np.diag(flipped) @ v
    elif rank == dim - 1:
        t[:dim, :dim] = u @ v
    else:
        t[:dim, :dim] = u @ np.diag(d) @ v
    scale = 1.0 / src_demean.var(axis=0).sum() * (s @ d)
    t[:dim, dim] = dst_mean - scale * (t[:dim, :dim] @ src_mean.T)
    t[:dim, :dim] *= scale
    return t


class SimilarityTransform:
    """scikit-image's ``SimilarityTransform``, the part insightface's face_align uses."""

    def __init__(self) -> None:
        self.params = np.eye(3, dtype=np.float64)

    def estimate(self, src: np.ndarray, dst: np.ndarray) -> bool:
        """Fit src onto dst; False (and NaN params) when the points do not determine a fit."""
        self.params = umeyama(np.asarray(src), np.asarray(dst))  # in the caller's dtype, as scikit-image does
        return not bool(np.any(np.isnan(self.params)))
