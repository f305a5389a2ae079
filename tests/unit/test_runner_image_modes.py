"""Image colour modes through a real chunk (issue 21 point 10): alpha kept, grey stays grey, 16-bit
converted and said so; where the output format cannot keep alpha the item's result says so."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from contract.manifest import Item
from contract.results import ItemResult, ItemStatus
from tests.fixtures import photos
from tests.unit.test_runner_chunk import results, run, write_manifest


def astronaut(root: Path) -> np.ndarray:
    image = cv2.imread(str(root / "in" / "astronaut.jpg"), cv2.IMREAD_COLOR)
    assert image is not None
    return image


def run_items(root: Path, pairs: list[tuple[str, str]]) -> dict[str, ItemResult]:
    items = tuple(Item(f"i{n:06d}", f"/data/in/{i}", f"/data/out/{o}") for n, (i, o) in enumerate(pairs))
    run(root, write_manifest(root, [], items=items))
    return {Path(r.output or r.input).name: r for r in results(root)}


def face_changed(before: np.ndarray, after: np.ndarray) -> bool:
    x1, y1, x2, y2 = photos.ASTRONAUT_FACE
    diff = np.abs(before[y1:y2, x1:x2].astype(int) - after[y1:y2, x1:x2].astype(int))
    return bool(diff.mean() > 2)


def test_png_alpha_is_kept_and_a_jpg_output_says_it_was_dropped(data: Path) -> None:
    bgr = astronaut(data)
    h, w = bgr.shape[:2]
    alpha = np.tile(np.linspace(0, 255, w, dtype=np.uint8), (h, 1))  # a gradient, transparent at the left
    cv2.imwrite(str(data / "in" / "rgba.png"), np.dstack([bgr, alpha]))
    got = run_items(data, [("rgba.png", "rgba.png"), ("rgba.png", "rgba.jpg"), ("rgba.png", "rgba.webp")])
    out = cv2.imread(str(data / "out" / "rgba.png"), cv2.IMREAD_UNCHANGED)
    assert got["rgba.png"].status is ItemStatus.OK and got["rgba.png"].note is None
    assert out.shape == (h, w, 4) and np.array_equal(out[:, :, 3], alpha)
    assert face_changed(bgr, out[:, :, :3])
    webp = cv2.imread(str(data / "out" / "rgba.webp"), cv2.IMREAD_UNCHANGED)
    assert webp.shape == (h, w, 4) and got["rgba.webp"].note is None
    assert got["rgba.jpg"].status is ItemStatus.OK
    assert got["rgba.jpg"].note == "the input's alpha channel was dropped: a .jpg file cannot hold transparency"


def test_grey_stays_grey_where_the_format_keeps_it(data: Path) -> None:
    grey = cv2.cvtColor(astronaut(data), cv2.COLOR_BGR2GRAY)
    cv2.imwrite(str(data / "in" / "grey.jpg"), grey)
    got = run_items(data, [("grey.jpg", "grey.jpg"), ("grey.jpg", "grey.png")])
    for name in ("grey.jpg", "grey.png"):
        out = cv2.imread(str(data / "out" / name), cv2.IMREAD_UNCHANGED)
        assert got[name].status is ItemStatus.OK and got[name].note is None
        assert out.ndim == 2, f"{name} came back with {out.shape[2]} channels"
        assert face_changed(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR), cv2.cvtColor(out, cv2.COLOR_GRAY2BGR))


def test_16_bit_input_is_written_as_8_bit_and_the_result_says_so(data: Path) -> None:
    deep = astronaut(data).astype(np.uint16) * 257
    cv2.imwrite(str(data / "in" / "deep.png"), deep)
    got = run_items(data, [("deep.png", "deep.png")])
    out = cv2.imread(str(data / "out" / "deep.png"), cv2.IMREAD_UNCHANGED)
    assert got["deep.png"].status is ItemStatus.OK and out.dtype == np.uint8
    assert got["deep.png"].note == "16-bit samples were written as 8-bit"


def test_no_face_copy_keeps_the_input_bytes_whatever_the_mode(data: Path) -> None:
    still = cv2.imread(str(data / "in" / "no_face.jpg"), cv2.IMREAD_COLOR)
    h, w = still.shape[:2]
    cv2.imwrite(str(data / "in" / "still.png"), np.dstack([still, np.full((h, w), 7, np.uint8)]))
    got = run_items(data, [("still.png", "still.png")])
    assert got["still.png"].status is ItemStatus.NO_FACE and got["still.png"].note is None
    assert (data / "out" / "still.png").read_bytes() == (data / "in" / "still.png").read_bytes()
