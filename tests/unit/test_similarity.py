"""runner_image/similarity.py stands in for scikit-image's SimilarityTransform in the runner image.

The image has no scikit-image (nor scipy, networkx: issue 22); insightface's face_align imports it at
module level. The stand-in must fit exactly what scikit-image fits, including where the fit fails,
and insightface_lite must register it only where scikit-image is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from skimage.transform import SimilarityTransform as Theirs

from runner_image.similarity import SimilarityTransform as Ours

ROOT = Path(__file__).resolve().parents[2]
ARCFACE = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]])


def cases() -> list[np.ndarray]:
    rng = np.random.default_rng(22)
    out = [rng.uniform(-200, 800, (5, 2)) for _ in range(200)]  # anything, mirrored fits included
    for _ in range(50):  # faces: the template turned, scaled, moved, with a little noise
        angle = rng.uniform(-np.pi, np.pi)
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        out.append(ARCFACE @ rot.T * rng.uniform(0.3, 6) + rng.uniform(-100, 600, 2) + rng.normal(0, 1, (5, 2)))
    line = rng.uniform(0, 100, 5)
    out.append(np.stack([line, 2 * line + 1], axis=1))  # collinear: rank 1
    out.append(np.tile(rng.uniform(0, 100, 2), (5, 1)))  # one point five times: no fit
    return out + [c.astype(np.float32) for c in out]  # landmarks arrive as float32


@pytest.mark.parametrize("size", [112, 128])
def test_fits_exactly_what_scikit_image_fits(size: int) -> None:
    dst = ARCFACE * (size / 112)
    for src in cases():
        theirs, ours = Theirs(), Ours()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scikit-image 0.26 deprecates estimate() for from_estimate()
            ok_theirs = theirs.estimate(src, dst)
        assert ours.estimate(src, dst) == ok_theirs
        assert np.array_equal(np.isnan(ours.params), np.isnan(theirs.params))
        if ok_theirs:
            np.testing.assert_allclose(ours.params, theirs.params, rtol=0, atol=1e-9)


PROBE = """
import json, sys
import numpy as np
sys.modules["skimage"] = None  # as in the runner image: no scikit-image installed
from runner_image.align import estimate
from runner_image.insightface_lite import face_align
kps = np.array(json.loads(sys.argv[1]), dtype=np.float32)
print(json.dumps({
    "module": face_align.trans.__name__,
    "insightface": face_align.estimate_norm(kps, 112).tolist(),
    "runner": estimate(kps, 112).tolist(),
}))
"""


def test_the_runner_aligns_faces_without_scikit_image() -> None:
    kps = (ARCFACE * 2.5 + [300.0, 120.0]).astype(np.float32)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(kps.tolist())], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["module"] == "runner_image.similarity"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from insightface.utils import face_align

        expected = face_align.estimate_norm(kps, 112)
    np.testing.assert_allclose(got["insightface"], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got["runner"], expected, atol=1e-3)
