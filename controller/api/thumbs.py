"""Small JPEG thumbnails of a job's photos for the web page, made with Pillow under explicit caps.

The bytes come from the shared volume, so they are hostile: the size is capped before reading, and
the width and height are read from the header (JPEG, PNG, WebP, BMP) and capped *before* Pillow
decodes anything, so a small file that claims a huge canvas is refused without allocating it; the
size Pillow itself reads is checked against the same caps before any pixel is decoded. Big JPEGs
are decoded at 1/2, 1/4 or 1/8 scale (the decoder's own reduction, Pillow's draft mode), which is
also cheaper. The photo is turned upright as its EXIF orientation says; the thumbnail carries no
metadata. Pillow (the api extra), not OpenCV or numpy: the controller's install stays small.
"""

from __future__ import annotations

import io
import struct

from PIL import Image, ImageOps

MAX_BYTES = 64 * 1024**2  # a file larger than this gets no thumbnail
MAX_PIXELS = 50_000_000  # width × height as the header declares it
MAX_EDGE = 30_000
DEFAULT_SIZE = 256
QUALITY = 80


class NoThumbnail(ValueError):
    """The file cannot be made into a thumbnail; the message says why without echoing its bytes."""


def dimensions(head: bytes) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a JPEG, PNG, WebP or BMP; None when unknown."""
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        w, h = struct.unpack(">II", head[16:24])
        return w, h
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head.startswith(b"BM") and len(head) >= 26:
        w, h = struct.unpack("<ii", head[18:26])
        return abs(w), abs(h)
    if head.startswith(b"\xff\xd8"):
        return _jpeg(head)
    return None


def _webp(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8X" and len(head) >= 30:
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return w, h
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int] | None:
    """The frame header's size: segments are walked by their lengths up to the first SOFn."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            if i + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return w, h
        if length < 2:
            return None
        i += 2 + length
    return None


FORMATS = ("JPEG", "PNG", "WEBP", "BMP")  # what Pillow may open here: the formats the header check reads
_UNDECODABLE = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


def _check_size(w: int, h: int) -> None:
    if not (0 < w <= MAX_EDGE and 0 < h <= MAX_EDGE) or w * h > MAX_PIXELS:
        raise NoThumbnail(f"the photo is too large for a thumbnail ({w}x{h} pixels)")


def thumbnail(data: bytes, size: int = DEFAULT_SIZE) -> bytes:
    """A JPEG whose longer side is at most ``size`` pixels (never enlarged), upright."""
    if len(data) > MAX_BYTES:
        raise NoThumbnail(f"the file is larger than {MAX_BYTES // 1024**2} MiB")
    dims = dimensions(data[: 256 * 1024])
    if dims is None:
        raise NoThumbnail("not a photo a thumbnail can be made of (JPEG, PNG, WebP, BMP)")
    _check_size(*dims)
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:  # reads the header only
            _check_size(*image.size)
            if image.format == "JPEG":
                image.draft("RGB", (size, size))  # the largest 1/2, 1/4 or 1/8 reduction still >= size
            image.load()
            image.thumbnail((size, size), Image.Resampling.LANCZOS)
            upright = ImageOps.exif_transpose(image)
            rgb = upright.convert("RGB")  # alpha dropped, palettes and greys expanded: what JPEG holds
    except NoThumbnail:
        raise
    except _UNDECODABLE:
        raise NoThumbnail("the photo cannot be decoded") from None
    out = io.BytesIO()
    try:
        rgb.save(out, "JPEG", quality=QUALITY)
    except (OSError, ValueError):
        raise NoThumbnail("the thumbnail cannot be encoded") from None
    return out.getvalue()
