"""Image files in and out: safe decoding, encoding by extension, and atomic writes.

Targets are user files from a shared volume, so decoding is defensive: the magic bytes must name a
format we handle, and the file-size and pixel-count caps (contract/manifest.py Limits) are checked from the
file's size and its header BEFORE any pixel is decoded (a 30000x30000 PNG is a few kB on disk).
Pillow is used only to read headers (size, EXIF orientation); OpenCV decodes pixels.

EXIF orientation: we decode JPEG, PNG and WebP with IMREAD_IGNORE_ORIENTATION and apply the tag
ourselves (one code path, tested against Pillow's exif_transpose for all eight values). TIFF is the
exception: OpenCV's libtiff path orients TIFFs itself whatever the flags (checked with OpenCV 5.0).
Outputs carry no EXIF, so their pixels are stored upright.

Colour mode (docs/job-file.md, "Image handling"): faces are found and swapped on an 8-bit BGR copy;
the output gets back what the input had where its format can hold it — the alpha channel (PNG,
WebP, TIFF), grey (JPEG, PNG, BMP, TIFF) — and the item's result says what it could not keep (a
note: alpha into a .jpg, 16-bit samples, which are written as 8-bit). TIFFs are read as colour.

Inputs are opened without following a symlink and without blocking (runner_image/safefs.py); a
FIFO, device or folder is refused before a byte is read.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from contract.manifest import Limits
from contract.photo import PHOTO_QUALITY, PHOTO_SCALE, scaled_size

from . import safefs
from .errors import ItemError

MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"BM", 0, "BMP"),
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
)

# Output formats that hold an alpha channel, and those that hold a single grey channel.
KEEPS_ALPHA = frozenset({".png", ".webp", ".tif", ".tiff"})
KEEPS_GREY = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff"})

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
LOSSY = frozenset({".jpg", ".jpeg", ".webp"})  # the formats the job file's photo.quality applies to

EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class Decoded:
    """An upright 8-bit BGR image plus the exact bytes it came from (``no_face: copy`` writes those
    unchanged, so the file is never read twice), and what of the input's mode the output restores:
    its alpha channel (upright, 8-bit), whether it was grey, its bits per sample."""

    image: np.ndarray
    data: bytes
    format: str
    orientation: int
    alpha: np.ndarray | None = None
    grey: bool = False
    depth: int = 8


def sniff(head: bytes) -> str | None:
    """The format named by a file's first bytes, or None for anything we do not decode."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, offset, name in MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    return None


def read_image(path: Path, limits: Limits) -> Decoded:
    """Read and decode one file at a host path (its last component never a symlink, never blocking
    on a FIFO); every failure is an ItemError whose message is the cause."""
    try:
        fd = os.open(path, safefs.INPUT_FLAGS)
    except FileNotFoundError:
        raise ItemError("file not found") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ItemError("is a symbolic link: not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ItemError(f"is {safefs.kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limits.max_file_bytes:
            raise ItemError(f"file too large: {st.st_size} bytes exceeds limit {limits.max_file_bytes}")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limits.max_file_bytes + 1)
    finally:
        os.close(fd)
    return decode_image(data, limits)


def read_target(root_fd: int, container_path: str, limits: Limits) -> Decoded:
    """Read and decode a manifest's input beneath the data root's descriptor, every folder on the
    way reached without following a symlink (runner_image/safefs.py)."""
    return decode_image(safefs.read_input(root_fd, container_path, limits.max_file_bytes), limits)


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
    # TIFF is read as colour: OpenCV's libtiff path orients TIFFs itself with IMREAD_COLOR only.
    mode = cv2.IMREAD_COLOR if fmt == "TIFF" else cv2.IMREAD_UNCHANGED
    try:
        raw = cv2.imdecode(np.frombuffer(data, np.uint8), mode | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:
        raise ItemError(f"cannot decode {fmt} image: {str(e).strip().splitlines()[-1]}") from e
    if raw is None or raw.size == 0:
        raise ItemError(f"cannot decode {fmt} image (corrupt or truncated)")
    depth = 16 if raw.dtype == np.uint16 else 8
    grey = raw.ndim == 2 or raw.shape[2] == 1
    alpha = to_8bit(raw[:, :, 3]) if raw.ndim == 3 and raw.shape[2] == 4 else None
    image = to_bgr8(raw)
    if fmt != "TIFF":  # OpenCV's libtiff path orients TIFFs itself, whatever the flags (checked)
        image = apply_orientation(image, orientation)
        alpha = None if alpha is None else apply_orientation(alpha, orientation)
    return Decoded(image=image, data=data, format=fmt, orientation=orientation, alpha=alpha, grey=grey, depth=depth)


def to_8bit(samples: np.ndarray) -> np.ndarray:
    """16-bit samples by their high byte, floats (0..1) scaled; 8-bit ones as they are."""
    out: np.ndarray = samples
    if samples.dtype == np.uint16:
        out = (samples >> 8).astype(np.uint8)
    elif samples.dtype != np.uint8:
        scale = 255.0 if samples.dtype.kind == "f" else 1.0
        out = np.clip(samples.astype(np.float32) * scale, 0, 255).astype(np.uint8)
    return out


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
    image = to_8bit(image)
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


def encode_image(image: np.ndarray, ext: str, quality: int | None = None) -> bytes:
    """``image`` encoded as ``ext``; ``quality`` (1 … 100) replaces a JPEG/WebP encoder's 95, and
    the lossless formats ignore it (None: the table's own)."""
    encoder, params = ENCODERS[ext]
    if quality is not None and ext in LOSSY:
        params = [params[0], quality]
    ok, buf = cv2.imencode(encoder, image, params)
    if not ok:
        raise ItemError(f"cannot encode output as {ext}")
    return buf.tobytes()


def resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` at ``width`` × ``height``: INTER_AREA when shrinking, INTER_CUBIC when enlarging
    (itself when the size is already that)."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    shrinking = width * height < w * h
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)


def encode_output(
    image: np.ndarray, decoded: Decoded, ext: str, quality: int = PHOTO_QUALITY, scale: float = PHOTO_SCALE
) -> tuple[bytes, str | None]:
    """The processed 8-bit BGR ``image``, resized by ``scale`` (the job file's ``photo.scale``, whole
    pixels, at least 1), encoded as ``ext`` (``quality``: JPEG and WebP only) with the input's mode
    restored where the format can hold it (grey, alpha: resized to the output's size the same way);
    and a note for the item's result saying what it could not keep, or None."""
    notes = []
    out = image
    if scale != 1:
        out = resize(out, *scaled_size(out.shape[1], out.shape[0], scale))
    if decoded.grey and ext in KEEPS_GREY:
        out = cv2.cvtColor(out, cv2.COLOR_BGR2GRAY)
    if decoded.alpha is not None:
        if ext in KEEPS_ALPHA:
            colour = out if out.ndim == 3 else cv2.cvtColor(out, cv2.COLOR_GRAY2BGR)
            out = np.dstack([colour, resize(decoded.alpha, colour.shape[1], colour.shape[0])])
        else:
            notes.append(f"the input's alpha channel was dropped: a {ext} file cannot hold transparency")
    if decoded.depth == 16:
        notes.append("16-bit samples were written as 8-bit")
    return encode_image(out, ext, quality), "; ".join(notes) or None


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a
    part: a temp file in the same folder (never through a symlink at its name), fsync, rename,
    fsync of the folder. For the run folder's files (identity.json); the job's outputs are
    committed by safefs.Writer. The temp file is removed on any failure,
    including SIGTERM (errors.Terminated is a BaseException)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
