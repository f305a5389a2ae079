"""Thumbnails for the web page, made with Pillow: small upright JPEGs, hostile bytes refused with a
reason, and the API served by a process that cannot import OpenCV or numpy (they are not in the
controller's install)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from controller.api.thumbs import MAX_PIXELS, NoThumbnail, thumbnail

ROOT = Path(__file__).resolve().parents[2]


def jpeg(width: int, height: int, orientation: int | None = None) -> bytes:
    """A real JPEG: a gradient with a white disc; ``orientation``: its EXIF Orientation tag."""
    img = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    ImageDraw.Draw(img).ellipse((width // 4, height // 4, width // 2, height // 2), fill="white")
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    out = io.BytesIO()
    img.save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


def size_of(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "JPEG"
        return img.size


def test_a_thumbnail_is_a_jpeg_whose_longer_side_is_the_size_and_never_enlarged() -> None:
    assert size_of(thumbnail(jpeg(1600, 1200))) == (256, 192)
    assert size_of(thumbnail(jpeg(1600, 1200), 64)) == (64, 48)
    assert size_of(thumbnail(jpeg(120, 90))) == (120, 90)


def test_a_photo_taken_sideways_is_shown_upright_without_its_metadata() -> None:
    thumb = thumbnail(jpeg(640, 480, orientation=6))  # the camera was turned: shown 480 wide, 640 high
    assert size_of(thumb) == (192, 256)
    with Image.open(io.BytesIO(thumb)) as img:
        assert 0x0112 not in img.getexif()  # no EXIF carried over (nor a location)


def test_png_with_alpha_webp_and_bmp_become_jpegs() -> None:
    for fmt, mode in (("PNG", "RGBA"), ("PNG", "P"), ("WEBP", "RGB"), ("BMP", "RGB")):
        out = io.BytesIO()
        Image.new(mode, (300, 150)).save(out, fmt)
        assert size_of(thumbnail(out.getvalue())) == (256, 128), fmt


def test_a_canvas_over_the_cap_is_refused_before_decoding_and_junk_is_named_not_echoed() -> None:
    side = int(MAX_PIXELS**0.5) + 10
    frame = b"\xff\xc0\x00\x11\x08"  # the SOF0 header: its height and width follow
    big = jpeg(64, 64).replace(frame + b"\x00\x40\x00\x40", frame + side.to_bytes(2, "big") * 2)
    with pytest.raises(NoThumbnail, match=f"{side}x{side} pixels"):
        thumbnail(big)
    with pytest.raises(NoThumbnail, match="cannot be decoded") as truncated:
        thumbnail(jpeg(640, 480)[:700])
    assert "\\x" not in str(truncated.value)
    with pytest.raises(NoThumbnail, match="not a photo"):
        thumbnail(b"<html><script>alert(1)</script></html>")
    with pytest.raises(NoThumbnail, match="not a photo"):  # a PNG cut inside its header
        thumbnail(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00")


BLOCKED = textwrap.dedent(
    """
    import io, sys, tempfile
    from pathlib import Path

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("cv2", "numpy"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Blocked())
    from PIL import Image
    from controller.api.area import Area
    from controller.cli.main import cli  # every command's module, the api's among them
    from controller.job.plan import Chunk, Plan, PlannedItem
    from controller.run.rundir import Control, RunDir
    from tests.builders import api_env

    photo = io.BytesIO()
    Image.new("RGB", (640, 480), "teal").save(photo, "JPEG")
    with tempfile.TemporaryDirectory() as tmp:
        for env in api_env(Path(tmp)):
            Area(env.root, "acme").ensure(None)
            Area(env.root, "acme").write_record("snap-abcdefgh", uploads=False)
            item = PlannedItem("i000000", "tenants/acme/in/0.jpg", "tenants/acme/out/0.jpg", "image")
            (env.root / item.input).parent.mkdir(parents=True)
            (env.root / item.input).write_bytes(photo.getvalue())
            plan = Plan("snap-abcdefgh", (item,), (Chunk("c0000", (item.id,)),))
            RunDir(env.root, "snap-abcdefgh").create(b"name: x\\n", plan, {}, Control(1), "sha256:x")
            with env.client() as c:
                r = c.get("/v1/jobs/snap-abcdefgh/items/i000000/input", params={"thumb": 1})
                assert r.status_code == 200, r.text
                print("thumb", Image.open(io.BytesIO(r.content)).size)
    print("loaded", sorted(m for m in sys.modules if m.partition(".")[0] in ("cv2", "numpy")))
    """
)


def test_the_api_serves_thumbnails_in_a_process_that_cannot_import_opencv_or_numpy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["thumb (256, 192)", "loaded []"]
