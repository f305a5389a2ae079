"""Image files in and out: safe decoding, encoding by extension, and atomic writes.

Targets are user files from a shared volume, so decoding is defensive: the magic bytes must name a
format we handle, and the file-size and pixel-count caps (contract/manifest.py Limits) are checked from the
file's size and its header BEFORE any pixel is decoded (a 30000x30000 PNG is a few kB on disk).
Pillow is used only to read headers (size, EXIF orientation); OpenCV decodes pixels.

EXIF orientation: we decode JPEG, PNG and WebP with IMREAD_IGNORE_ORIENTATION and apply the tag
ourselves (one code path, tested against Pillow's exif_transpose for all eight values). TIFF is the
exception: OpenCV's libtiff path orients TIFFs itself whatever the flags (checked with OpenCV 5.0).
Outputs carry no EXIF, so their pixels are stored upright.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from contract.manifest import Limits

from .errors import ItemError

MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"BM", 0, "BMP"),
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
)

# Output extension -> (OpenCV encoder extension, encoder parameters).
ENCODERS: dict[str, tuple[str, list[int]]] = {
    ".jpg": (".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95]),
    ".jpeg": (".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95]),
    ".png": (".png", [cv2.IMWRITE_PNG_COMPRESSION, 3]),
    ".webp": (".webp", [cv2.IMWRITE_WEBP_QUALITY, 95]),
    ".bmp": (".bmp", []),
    ".tif": (".tiff", []),
    ".tiff": (".tiff", []),
}

EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class Decoded:
    """An upright 8-bit BGR image plus the exact bytes it came from (``no_face: copy`` writes those
    unchanged, so the file is never read twice)."""

    image: np.ndarray
    data: bytes
    format: str
    orientation: int


def sniff(head: bytes) -> str | None:
    """The format named by a file's first bytes, or None for anything we do not decode."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, offset, name in MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    return None


def read_image(path: Path, limits: Limits) -> Decoded:
    """Read and decode one target; every failure is an ItemError whose message is the cause."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ItemError("file not found") from None
    except IsADirectoryError:
        raise ItemError("is a directory, not an image") from None
    try:
        st = os.fstat(fd)
        if st.st_size > limits.max_file_bytes:
            raise ItemError(f"file too large: {st.st_size} bytes exceeds limit {limits.max_file_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limits.max_file_bytes + 1)
    finally:
        os.close(fd)
    return decode_image(data, limits)


def decode_image(data: bytes, limits: Limits) -> Decoded:
    if len(data) > limits.max_file_bytes:
        raise ItemError(f"file too large: more than {limits.max_file_bytes} bytes")
    if not data:
        raise ItemError("empty file (0 bytes)")
    fmt = sniff(data[:16])
    if fmt is None:
        raise ItemError("not an image (unknown magic bytes)")
    width, height, orientation = _probe_header(data, fmt)
    if width * height > limits.max_pixels:
        raise ItemError(f"image too large: {width}x{height} pixels exceeds limit {limits.max_pixels}")
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:
        raise ItemError(f"cannot decode {fmt} image: {str(e).strip().splitlines()[-1]}") from e
    if image is None or image.size == 0:
        raise ItemError(f"cannot decode {fmt} image (corrupt or truncated)")
    image = to_bgr8(image)
    if fmt != "TIFF":  # OpenCV's libtiff path orients TIFFs itself, whatever the flags (checked)
        image = apply_orientation(image, orientation)
    return Decoded(image=image, data=data, format=fmt, orientation=orientation)


def _probe_header(data: bytes, fmt: str) -> tuple[int, int, int]:
    """Width, height and EXIF orientation from the header alone (Pillow opens lazily)."""
    # Our cap (manifest.limits) replaces Pillow's process-wide bomb limit, which would otherwise
    # refuse large images before we can report their size; restored right after.
    bomb_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as im:
            width, height = im.size
            try:
                orientation = int(im.getexif().get(EXIF_ORIENTATION, 1))
            except Exception:  # a broken EXIF block must not cost the image: treat as upright
                orientation = 1
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        # Pillow's message names its own BytesIO object ("cannot identify image file <_io…>"): say
        # what it means instead.
        why = "truncated or invalid" if "cannot identify image file" in str(e) else str(e)
        raise ItemError(f"cannot read {fmt} header: {why}") from e
    finally:
        Image.MAX_IMAGE_PIXELS = bomb_limit
    return width, height, orientation if 1 <= orientation <= 8 else 1


def to_bgr8(image: np.ndarray) -> np.ndarray:
    """Grey, alpha and 16-bit/float images as 8-bit 3-channel BGR (IMREAD_COLOR mostly does this;
    this is the safety net so later stages can rely on it)."""
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        image = np.clip(image.astype(np.float32) * (255.0 if image.dtype.kind == "f" else 1.0), 0, 255).astype(np.uint8)
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.shape[2] == 1:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    return image


def apply_orientation(image: np.ndarray, orientation: int) -> np.ndarray:
    """Turn stored pixels upright per the EXIF orientation tag (1 = already upright)."""
    if orientation == 2:
        return cv2.flip(image, 1)
    if orientation == 3:
        return cv2.rotate(image, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(image, 0)
    if orientation == 5:
        return cv2.transpose(image)
    if orientation == 6:
        return cv2.rotate(image, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.rotate(cv2.transpose(image), cv2.ROTATE_180)
    if orientation == 8:
        return cv2.rotate(image, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return image


def check_output_format(path: str) -> str:
    """The output's lower-case extension, or ItemError before any work is spent on the item."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in ENCODERS:
        raise ItemError(f"unsupported output extension {ext or '(none)'!r} (use one of {', '.join(sorted(ENCODERS))})")
    return ext


def encode_image(image: np.ndarray, ext: str) -> bytes:
    encoder, params = ENCODERS[ext]
    ok, buf = cv2.imencode(encoder, image, params)
    if not ok:
        raise ItemError(f"cannot encode output as {ext}")
    return buf.tobytes()


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")


def remove_stale_temps(path: Path) -> None:
    """Drop temp files a killed earlier attempt left next to this output (a kill skips cleanup)."""
    pattern = os.path.join(glob.escape(str(path.parent)), f".{glob.escape(path.name)}.tmp-*")
    for stale in glob.glob(pattern):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a
    part: a temp file in the same folder, fsync, rename. The temp file is removed on any failure,
    including SIGTERM (errors.Terminated is a BaseException)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
