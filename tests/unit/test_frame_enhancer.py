"""The frame enhancer (runner_image/frame_enhancer.py) on stand-ins with the Real-ESRGAN contract
(tests/fixtures/standin_frame.py): the frame comes out s times larger, tiled without seams, blended
as asked; a model of another shape is refused naming the role."""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from runner_image.errors import MissingInput
from runner_image.frame_enhancer import MARGIN, FrameEnhancer
from tests.fixtures.standin_frame import frame_enhancer_model
from tests.fixtures.standin_pack import enhancer_model


def session(model: object) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]


def photo(h: int = 300, w: int = 520) -> np.ndarray:
    rng = np.random.default_rng(7)
    small = rng.integers(0, 256, (h // 10, w // 10, 3), dtype=np.uint8)
    base = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    cv2.circle(base, (w // 2, h // 2), h // 4, (40, 200, 90), -1)
    return base


@pytest.mark.parametrize("scale", [2, 4])
def test_the_frame_is_upscaled_by_the_models_scale_and_tiles_meet_without_seams(scale: int) -> None:
    s = session(frame_enhancer_model(scale))
    fe = FrameEnhancer(s, tile=96)  # small tiles: a 300×520 frame is 4×6 of them, cut mid-frame
    frame = photo()
    out = fe.enhance(frame)
    assert fe.scale == scale and out.shape == (300 * scale, 520 * scale, 3)
    # the whole frame through the model at once (with the same replicated border) is the reference
    m = MARGIN
    padded = cv2.copyMakeBorder(frame, m, m, m, m, cv2.BORDER_REPLICATE)
    blob = padded[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255.0
    whole = s.run(None, {"input": blob})[0][0].transpose(1, 2, 0)[:, :, ::-1]
    whole = np.rint(np.clip(whole, 0, 1) * 255)[m * scale : (m + 300) * scale, m * scale : (m + 520) * scale]
    assert np.abs(out.astype(np.int16) - whole.astype(np.int16)).max() <= 1
    # and it is the frame, larger: close to a plain resize, sharper than it
    plain = cv2.resize(frame, (520 * scale, 300 * scale), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out.astype(np.int16) - plain.astype(np.int16)).mean() < 8
    assert cv2.Laplacian(out, cv2.CV_64F).var() > cv2.Laplacian(plain, cv2.CV_64F).var()


def test_blend_mixes_the_enhanced_frame_with_the_frame_resized() -> None:
    s = session(frame_enhancer_model(2))
    frame = photo(200, 200)
    full, none = FrameEnhancer(s, blend=1.0).enhance(frame), FrameEnhancer(s, blend=0.0).enhance(frame)
    half = FrameEnhancer(s, blend=0.5).enhance(frame)
    plain = cv2.resize(frame, (400, 400), interpolation=cv2.INTER_CUBIC)
    assert np.array_equal(none, plain)
    mid = (full.astype(np.float32) + plain.astype(np.float32)) / 2
    assert np.abs(half.astype(np.float32) - mid).max() <= 1.0


def test_a_model_of_another_contract_is_refused_naming_the_role() -> None:
    with pytest.raises(MissingInput) as e:
        FrameEnhancer(session(enhancer_model()))  # GFPGAN's fixed 512×512 face crop
    assert "frame_enhancer model" in str(e.value)
