"""Processors and the face selector on the real single-node swarm (issue 20), what a user would see.

- The gender filter: of a photo's three faces (tests/unit/test_selector.py three_faces: two the
  stand-in genderage model judges female, one male), `selector: {gender: male}` changes only the male
  face and `{gender: female}` only the other two; in a video of that photo too, in every frame.
- The 256-pixel swapper models (simswap_256, hyperswap_1a_256, ghost_256): one job per source each
  changes the face, differently per source, and nothing far from it.
- The face enhancer models: CodeFormer's fidelity weight changes what comes out (weight 0 and 1 differ),
  while a GFPGAN-contract model ignores it; a job naming a model other than its pack's is refused.

Each test's pack is the stand-in pack made under models/<job>/ (every processor's stand-in).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.fixtures import photos, standin_enhancers, standin_pack
from tests.integration.conftest import Workspace, chown_tree
from tests.integration.test_video import frames
from tests.unit.test_selector import THIRDS, three_faces

pytestmark = pytest.mark.integration

COMMON = """providers: [cpu]
resources: {gpus: 1, gpu_kind: GPU, memory: 2g}
retries: 0
timeout: 10m
no_face: copy
"""


@pytest.fixture
def pack(workspace: Workspace) -> Iterator[Path]:
    folder = workspace.root / "models" / workspace.job
    standin_pack.build_pack(folder, workspace.job)
    chown_tree(folder, workspace.config.runner_uid_gid())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def changed(before: np.ndarray, after: np.ndarray, noise: float = 1.5) -> list[str]:
    return [name for name, (a, b) in zip(("left", "middle", "right"), THIRDS, strict=True)
            if np.abs(before[:, a:b].astype(int) - after[:, a:b].astype(int)).mean() > noise]  # fmt: skip


def run_job(
    ws: Workspace, name: str, source: Path, targets: str, out: str, extra: str
) -> subprocess.CompletedProcess[str]:
    f = ws.dir / "jobs" / f"{name}.yaml"
    f.parent.mkdir(exist_ok=True)
    f.write_text(
        f"name: {name}\nsource: {ws.rel(source)}\ntargets: [{targets}]\noutput: {out}/{{stem}}{{ext}}\n"
        f"models: {ws.job}\n{COMMON}{extra}"
    )
    try:
        return ws.ffswarm("submit", str(f))
    finally:
        shutil.rmtree(ws.root / "runs" / name, ignore_errors=True)


def test_the_gender_filter_changes_only_the_matching_faces_in_photos_and_video(
    workspace: Workspace, pack: Path
) -> None:
    ws = workspace
    photo = three_faces(ws.dir / "in")
    (ws.dir / "in" / "astronaut.jpg").unlink()  # three_faces' own material, not a target
    subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-y", "-loop", "1", "-framerate", "10", "-i", str(photo), "-t", "1",
         "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv444p",
         str(ws.dir / "in" / "three.mp4")],
        check=True,
    )  # fmt: skip
    source = photos.face_photos(ws.dir / "src", 2)[1]
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    before = cv2.imread(str(photo))
    clip_before = frames(ws.dir / "in" / "three.mp4")
    for gender, expected in (("male", ["right"]), ("female", ["left", "middle"])):
        out = f"{ws.rel(ws.dir)}/out-{gender}"
        proc = run_job(
            ws, f"{ws.job}-{gender}", source, f"{ws.rel(ws.dir / 'in')}/*", out, f"selector: {{gender: {gender}}}\n"
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert changed(before, cv2.imread(str(ws.root / out / "three.png"))) == expected, gender
        clip_after = frames(ws.root / out / "three.mp4")
        assert len(clip_after) == len(clip_before) == 10
        for k, (b, a) in enumerate(zip(clip_before, clip_after, strict=True)):
            assert (
                changed(b[: before.shape[0], : before.shape[1]], a[: before.shape[0], : before.shape[1]], 3) == expected
            ), k


def test_codeformers_weight_changes_the_face_and_a_gfpgan_contract_model_ignores_it(
    workspace: Workspace, pack: Path
) -> None:
    ws = workspace
    target = photos.astronaut(ws.dir / "in")
    source = photos.face_photos(ws.dir / "src", 2)[1]
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    outputs: dict[tuple[str, float], np.ndarray] = {}
    for model in ("codeformer", "gpen_bfr_512"):
        standin_enhancers.add_enhancer(pack, model)
        chown_tree(pack, ws.config.runner_uid_gid())
        for weight in (0.0, 1.0):
            out = f"{ws.rel(ws.dir)}/out-{model}-{int(weight)}"
            settings = f"{{model: {model}, blend: 1.0, weight: {weight}}}"
            extra = f"processors: [face_swapper, face_enhancer]\nface_enhancer: {settings}\n"
            proc = run_job(ws, f"{ws.job}-{model[:4]}{int(weight)}", source, ws.rel(target), out, extra)
            assert proc.returncode == 0, proc.stderr[-3000:]
            outputs[(model, weight)] = cv2.imread(str(ws.root / out / target.name)).astype(int)
    assert np.abs(outputs[("codeformer", 0.0)] - outputs[("codeformer", 1.0)]).max() > 20
    assert np.abs(outputs[("gpen_bfr_512", 0.0)] - outputs[("gpen_bfr_512", 1.0)]).max() == 0

    out = f"{ws.rel(ws.dir)}/out-wrong"
    extra = "processors: [face_swapper, face_enhancer]\nface_enhancer: {model: restoreformer_plus_plus}\n"
    proc = run_job(ws, f"{ws.job}-wrong", source, ws.rel(target), out, extra)  # the pack's is gpen_bfr_512
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "face_enhancer.model" in proc.stderr and "not restoreformer_plus_plus" in proc.stderr


def patched(ws: Workspace) -> dict[str, Path]:
    """The astronaut with a green patch over part of her face (the stand-in occluder hides green) and
    one with a red patch over her mouth (the stand-in parser calls red the mouth)."""
    from tests.unit.test_masks import GREEN, RED

    image = cv2.imread(str(photos.astronaut(ws.dir / "raw")))
    out = {}
    for name, (y0, y1, x0, x1), bgr in (("green", GREEN, (40, 200, 40)), ("red", RED, (40, 40, 210))):
        p = image.copy()
        p[y0:y1, x0:x1] = bgr
        (ws.dir / name).mkdir()
        cv2.imwrite(str(ws.dir / name / f"{name}.png"), p)
        out[name] = ws.dir / name / f"{name}.png"
    return out


def test_occlusion_and_region_masks_change_what_a_user_would_expect(workspace: Workspace, pack: Path) -> None:
    from tests.unit.test_masks import GREEN, RED

    ws = workspace
    photo = patched(ws)
    source = photos.face_photos(ws.dir / "src", 2)[1]
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    runs = {
        "box": ("green", "mask: {types: [box]}\n"),
        "occl": ("green", "mask: {types: [box, occlusion]}\n"),
        "mouth": ("red", "mask: {types: [region], regions: [mouth]}\n"),
    }
    got: dict[str, np.ndarray] = {}
    for key, (name, extra) in runs.items():
        out = f"{ws.rel(ws.dir)}/out-{key}"
        proc = run_job(ws, f"{ws.job}-{key}", source, ws.rel(photo[name]), out, extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[key] = cv2.imread(str(ws.root / out / f"{name}.png")).astype(int)
    green, red = (cv2.imread(str(photo[n])).astype(int) for n in ("green", "red"))
    y0, y1, x0, x1 = GREEN
    centre = (slice(y0 + 4, y1 - 4), slice(x0 + 4, x1 - 4))
    assert np.abs(got["box"] - green)[centre].max() > 20  # the box alone swaps over the patch
    assert np.array_equal(got["occl"][centre], green[centre])  # occluded: the target's own pixels
    assert (np.abs(got["occl"] - green).max(axis=2) > 0).sum() > 10_000  # the rest of the face swapped
    changed = np.abs(got["mouth"] - red).max(axis=2) > 0
    y0, y1, x0, x1 = RED
    assert changed[y0 + 6 : y1 - 6, x0 + 6 : x1 - 6].all()  # the mouth swapped …
    outside = np.ones(changed.shape, bool)
    outside[y0 - 2 : y1 + 2, x0 - 2 : x1 + 2] = False
    assert not (changed & outside).any()  # … and nothing else


def test_pixel_boost_swaps_the_face_in_more_detail_and_nothing_else(workspace: Workspace, pack: Path) -> None:
    ws = workspace
    target = photos.astronaut(ws.dir / "in")
    source = photos.face_photos(ws.dir / "src", 2)[1]
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    got = {}
    for boost in (128, 256):
        out = f"{ws.rel(ws.dir)}/out-{boost}"
        extra = f"face_swapper: {{pixel_boost: {boost}}}\n"
        proc = run_job(ws, f"{ws.job}-{boost}", source, ws.rel(target), f"{out}", extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[boost] = cv2.imread(str(ws.root / out / target.name))
    before = cv2.imread(str(target))
    face = photos.ASTRONAUT_FACE
    x1, y1, x2, y2 = face
    region = (slice(y1, y2), slice(x1, x2))
    sharp = {b: cv2.Laplacian(cv2.cvtColor(g[region], cv2.COLOR_BGR2GRAY), cv2.CV_64F).var() for b, g in got.items()}
    assert np.abs(got[256].astype(int) - got[128].astype(int))[region].max() > 10  # the face differs …
    assert sharp[256] > sharp[128]  # … in more detail
    far = np.ones(before.shape[:2], bool)
    far[max(0, y1 - (y2 - y1)) : y2 + (y2 - y1), max(0, x1 - (x2 - x1)) : x2 + (x2 - x1)] = False
    assert np.abs(got[256].astype(int) - got[128].astype(int))[far].max() <= 3  # the rest of the photo alike


@pytest.mark.parametrize("model", ["simswap_256", "hyperswap_1a_256", "ghost_256"])
def test_each_256_swapper_model_swaps_the_face_per_source_and_leaves_the_rest(workspace: Workspace, model: str) -> None:
    """face_swapper.model simswap_256 / hyperswap_1a_256 / ghost_256 on the swarm: the pack holds that
    model's stand-in (and its embedding converter, tests/fixtures/standin_swappers.py); one job per
    source person changes the astronaut's face, differently per source, and not the far background."""
    ws = workspace
    folder = ws.root / "models" / f"{ws.job}-{model[:4]}"
    standin_pack.build_pack(folder, folder.name, swapper=model)
    chown_tree(folder, ws.config.runner_uid_gid())
    try:
        target = photos.astronaut(ws.dir / "in")
        people = photos.face_photos(ws.dir / "src", 2)
        chown_tree(ws.dir, ws.config.runner_uid_gid())
        got = []
        for n, source in enumerate(people):
            out = f"{ws.rel(ws.dir)}/out-{model[:4]}-{n}"
            name = f"{ws.job}-{model[:4]}{n}"
            f = ws.dir / "jobs" / f"{name}.yaml"
            f.parent.mkdir(exist_ok=True)
            f.write_text(
                f"name: {name}\nsource: {ws.rel(source)}\ntargets: [{ws.rel(target)}]\noutput: {out}/{{stem}}{{ext}}\n"
                f"models: {folder.name}\n{COMMON}face_swapper: {{model: {model}, pixel_boost: 512}}\n"
            )
            try:
                proc = ws.ffswarm("submit", str(f))
            finally:
                shutil.rmtree(ws.root / "runs" / name, ignore_errors=True)
            assert proc.returncode == 0, proc.stderr[-3000:]
            got.append(cv2.imread(str(ws.root / out / target.name)).astype(int))
        before = cv2.imread(str(target)).astype(int)
        x1, y1, x2, y2 = photos.ASTRONAUT_FACE
        region = (slice(y1, y2), slice(x1, x2))
        assert np.abs(got[0] - before)[region].mean() > 5  # the face changed …
        assert np.abs(got[0] - got[1])[region].mean() > 2  # … and differently for each source
        far = np.ones(before.shape[:2], bool)
        far[max(0, y1 - (y2 - y1)) : y2 + (y2 - y1), max(0, x1 - (x2 - x1)) : x2 + (x2 - x1)] = False
        # the rest of the photo as it was: alike in both outputs, and the input's but for JPEG's re-encoding
        assert np.abs(got[0] - got[1])[far].max() <= 3
        for out_image in got:
            assert np.abs(out_image - before)[far].mean() <= 1.0, np.abs(out_image - before)[far].mean()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
