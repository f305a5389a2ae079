"""runner_image.media: safe decoding, orientation, encoding and atomic writes (no models needed)."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from contract.manifest import Limits
from runner_image import media
from runner_image.errors import ItemError, Terminated

LIMITS = Limits()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height but holds almost no data (a decompression bomb's
    first bytes): only header checks can stop it cheaply."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    )


def _asymmetric_rgb(h: int = 30, w: int = 50) -> np.ndarray:
    rng = np.random.default_rng(3)
    img = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
    img[:5, :5] = (255, 0, 0)
    return img


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "PNG"),
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "WEBP"),
        (b"BM\x00\x00", "BMP"),
        (b"II*\x00\x08\x00", "TIFF"),
        (b"MM\x00*\x00\x00", "TIFF"),
        (b"GIF89a", None),
        (b"this is not", None),
        (b"", None),
    ],
)
def test_sniff_names_only_supported_formats(head: bytes, fmt: str | None) -> None:
    assert media.sniff(head) == fmt


def test_text_with_image_name_is_rejected_by_magic_bytes(tmp_path: Path) -> None:
    p = tmp_path / "broken.jpg"
    p.write_text("hello, not a jpeg\n")
    with pytest.raises(ItemError, match=r"not an image \(unknown magic bytes\)"):
        media.read_image(p, LIMITS)


def test_pixel_cap_checked_from_header_before_decoding() -> None:
    data = _png_header_only(30000, 30000)
    assert len(data) < 200
    with pytest.raises(ItemError, match="image too large: 30000x30000 pixels exceeds limit 64000000"):
        media.decode_image(data, LIMITS)


def test_file_size_cap_checked_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "big.png"
    p.write_bytes(_png_header_only(10, 10) + b"\x00" * 5000)
    with pytest.raises(ItemError, match="file too large: .* exceeds limit 1000"):
        media.read_image(p, Limits(max_file_bytes=1000))


def test_truncated_image_is_an_item_error() -> None:
    ok, buf = cv2.imencode(".png", _asymmetric_rgb())
    assert ok
    with pytest.raises(ItemError, match="PNG"):
        media.decode_image(buf.tobytes()[:60], LIMITS)


def test_missing_file_is_an_item_error(tmp_path: Path) -> None:
    with pytest.raises(ItemError, match="file not found"):
        media.read_image(tmp_path / "nope.jpg", LIMITS)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "TIFF"])
def test_exif_orientation_matches_pillow(orientation: int, fmt: str) -> None:
    exif = Image.Exif()
    exif[media.EXIF_ORIENTATION] = orientation
    buf = io.BytesIO()
    Image.fromarray(_asymmetric_rgb()).save(buf, fmt, exif=exif if fmt == "TIFF" else exif.tobytes(), quality=95)
    decoded = media.decode_image(buf.getvalue(), LIMITS)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        expected_rgb = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    expected = expected_rgb[:, :, ::-1]
    assert decoded.orientation == orientation
    assert decoded.image.shape == expected.shape
    tolerance = 0 if fmt in ("PNG", "TIFF") else 40  # lossy codecs decode slightly differently
    assert np.abs(decoded.image.astype(int) - expected.astype(int)).mean() <= tolerance


@pytest.mark.parametrize(
    ("mode", "array"),
    [
        ("L", np.full((8, 9), 77, np.uint8)),
        ("RGBA", np.dstack([np.full((8, 9, 3), 77, np.uint8), np.full((8, 9), 10, np.uint8)])),
        ("I;16", np.full((8, 9), 77 * 257, np.uint16)),
    ],
)
def test_grey_alpha_and_16_bit_become_8_bit_bgr(mode: str, array: np.ndarray) -> None:
    if mode == "I;16":
        ok, buf = cv2.imencode(".png", array)
        data = buf.tobytes()
        assert ok
    else:
        out = io.BytesIO()
        Image.fromarray(array).save(out, "PNG")
        data = out.getvalue()
    decoded = media.decode_image(data, LIMITS)
    assert decoded.image.dtype == np.uint8
    assert decoded.image.shape == (8, 9, 3)
    assert np.all(np.abs(decoded.image.astype(int) - 77) <= 1)


def test_decoded_keeps_the_exact_bytes(tmp_path: Path) -> None:
    p = tmp_path / "a.png"
    cv2.imwrite(str(p), _asymmetric_rgb())
    assert media.read_image(p, LIMITS).data == p.read_bytes()


@pytest.mark.parametrize("ext", [".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"])
def test_encode_uses_the_output_extension(ext: str) -> None:
    image = _asymmetric_rgb()
    data = media.encode_image(image, media.check_output_format(f"/data/out/x{ext.upper()}"))
    decoded = media.decode_image(data, LIMITS)
    assert decoded.format == {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}.get(
        ext, "TIFF"
    )
    assert decoded.image.shape == image.shape


def test_unsupported_output_extension_is_an_item_error() -> None:
    with pytest.raises(ItemError, match="unsupported output extension '.gif'"):
        media.check_output_format("/data/out/x.gif")


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_atomic_write_creates_parents_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.jpg"
    media.atomic_write(target, b"first")
    media.atomic_write(target, b"second")
    assert target.read_bytes() == b"second"
    assert _leftovers(target.parent) == []


def test_atomic_write_failure_removes_temp_and_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.jpg"
    target.write_bytes(b"old")

    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", boom)
        with pytest.raises(OSError):
            media.atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_atomic_write_cleans_up_on_sigterm(tmp_path: Path) -> None:
    target = tmp_path / "out.jpg"

    def terminated(fd: int) -> None:
        raise Terminated()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", terminated)
        with pytest.raises(Terminated):
            media.atomic_write(target, b"new")
    assert not target.exists()
    assert _leftovers(tmp_path) == []


def test_atomic_write_onto_a_directory_cleans_temp(tmp_path: Path) -> None:
    (tmp_path / "out.jpg").mkdir()
    with pytest.raises(OSError):
        media.atomic_write(tmp_path / "out.jpg", b"x")
    assert _leftovers(tmp_path) == []


def test_empty_and_header_only_files_say_what_they_are() -> None:
    with pytest.raises(ItemError, match=r"^empty file \(0 bytes\)$"):
        media.decode_image(b"", Limits())
    with pytest.raises(ItemError, match=r"^cannot read PNG header: truncated or invalid$"):
        media.decode_image(b"\x89PNG\r\n\x1a\n", Limits())
