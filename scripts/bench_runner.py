"""Runner benchmark (not a test): a plain insightface loop vs the ffswarm runner, same images/models.

    .venv/bin/python scripts/bench_runner.py [--json PATH] [--small-n 24] [--big-n 2] [--no-big]
    .venv/bin/python scripts/bench_runner.py --per-processor [--small-n 24] [--providers cuda,cpu]

(a) insightface's own FaceAnalysis (detector + recogniser only, as benchmarks/RESULTS.md says) +
INSwapper.get with paste_back=True, with cv2.imread/imwrite around it; (b) ``python -m runner_image``
in-process on a temporary data root with the same pack and photos. Each side runs in its own
subprocess, so the cold start (process start → first item written) includes imports and model
loading.

Packs: the small stand-in test pack, and a generated stand-in with inswapper_128's publicly
reconstructed layout and size (138.6M parameters, benchmarks/RESULTS.md; random weights, built in
a temp folder at run time and never kept). Photo sets: one face (astronaut variants), several faces
(t1.jpg variants). Stage times are per item summed; with several items in flight the runner's stage
sums can exceed its wall time, which is the point ("inference s per wall s" > 1: calls overlapped).

``--per-processor``: the runner alone on the stand-in pack (every processor's stand-in) and the
one-face photos, once per processor chain — the swapper alone, with the face enhancer, with the frame
enhancer — side by side in one run, each as images/s and as a ratio to the swapper alone. The
stand-ins have the real models' I/O contracts but not their cost: the figures say what the runner's
own work per processor is (alignment, tiling, paste-back, encoding larger frames), not what the real
models cost; on a GPU (``--providers cuda,cpu``) with real files in a pack they would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures import photos  # noqa: E402
from tests.fixtures.standin_pack import build_pack  # noqa: E402

INFERENCE = ("detect", "embed", "swap")


def make_photos(dest: Path, kind: str, n: int) -> list[Path]:
    """n distinct variants (flip, brightness) of astronaut (one face) or t1 (six faces)."""
    tmp = dest / "src"
    base = cv2.imread(str(photos.astronaut(tmp) if kind == "one" else photos.group(tmp)))
    assert base is not None
    out = []
    for i in range(n):
        img = base[:, ::-1] if i % 2 else base
        img = np.clip(img.astype(np.int16) + (i * 7) % 30 - 15, 0, 255).astype(np.uint8)
        path = dest / f"{kind}_{i:03d}.jpg"
        cv2.imwrite(str(path), np.ascontiguousarray(img), [cv2.IMWRITE_JPEG_QUALITY, 92])
        out.append(path)
    shutil.rmtree(tmp)
    return out


def big_swapper(path: Path, seed: int = 0, fp16: bool = False) -> None:
    """inswapper_128's reconstructed layout: encoder to 1024ch at 32x32, 6 residual blocks of two 3x3
    1024-ch convs each modulated (AdaIN-style) by Linear 512->2048 of the latent, decoder to 128.
    ``fp16``: weights, activations and I/O in float16, as inswapper_128_fp16 (half the file)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    dtype, elem = (np.float16, TensorProto.FLOAT16) if fp16 else (np.float32, TensorProto.FLOAT)
    inits: list[Any] = []
    nodes: list[Any] = []

    def w(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape, np.float32) * scale).astype(dtype), name))
        return name

    def conv(x: str, cin: int, cout: int, name: str, stride: int = 1) -> str:
        wt = w(f"{name}.w", (cout, cin, 3, 3), (2.0 / (cin * 9)) ** 0.5)
        bs = w(f"{name}.b", (cout,), 0.0)
        nodes.append(helper.make_node("Conv", [x, wt, bs], [name], pads=[1, 1, 1, 1], strides=[stride, stride]))
        nodes.append(helper.make_node("LeakyRelu", [name], [f"{name}.a"], alpha=0.2))
        return f"{name}.a"

    x = conv("target", 3, 128, "e0")
    x = conv(x, 128, 256, "e1", 2)
    x = conv(x, 256, 512, "e2", 2)
    x = conv(x, 512, 1024, "e3")
    inits.append(numpy_helper.from_array(np.array([1, 1024, 1, 1], np.int64), "shape4"))
    for b in range(6):
        skip = x
        for c in range(2):
            name = f"r{b}.{c}"
            y = conv(x, 1024, 1024, name)
            for part in ("scale", "bias"):
                style = w(f"{name}.{part}", (512, 1024), 0.02)
                nodes.append(helper.make_node("MatMul", ["source", style], [f"{name}.{part}.v"]))
                nodes.append(helper.make_node("Reshape", [f"{name}.{part}.v", "shape4"], [f"{name}.{part}.m"]))
            nodes.append(helper.make_node("Mul", [y, f"{name}.scale.m"], [f"{name}.sy"]))
            nodes.append(helper.make_node("Add", [f"{name}.sy", f"{name}.bias.m"], [f"{name}.out"]))
            x = f"{name}.out"
        nodes.append(helper.make_node("Add", [x, skip], [f"r{b}.res"]))
        x = f"r{b}.res"
    for i, (cin, cout) in enumerate(((1024, 512), (512, 256))):
        nodes.append(helper.make_node("Resize", [x, "", "up"], [f"u{i}"], mode="nearest"))
        x = conv(f"u{i}", cin, cout, f"d{i}")
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up"))
    wt, bs = w("out.w", (3, 256, 3, 3), 0.01), w("out.b", (3,), 0.0)
    nodes.append(helper.make_node("Conv", [x, wt, bs], ["logits"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Sigmoid", ["logits"], ["output"]))
    emap = np.linalg.qr(rng.standard_normal((512, 512)))[0].astype(np.float32)
    inits.append(numpy_helper.from_array(emap.astype(dtype), "emap"))  # LAST: insightface reads initializer[-1]
    nodes.append(helper.make_node("MatMul", ["source", "emap"], ["unused_latent"]))
    graph = helper.make_graph(
        nodes,
        "bench_inswapper_layout",
        [
            helper.make_tensor_value_info("target", elem, [1, 3, 128, 128]),
            helper.make_tensor_value_info("source", elem, [1, 512]),
        ],
        [helper.make_tensor_value_info("output", elem, [1, 3, 128, 128])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def big_pack(small: Path, dest: Path, *, fp16: bool = False, face_enhancer: bool = False) -> Path:
    """The small pack's models with the inswapper-layout stand-in as swapper (``fp16``: its float16
    export, as inswapper_128_fp16.onnx); the face enhancer's stand-in only when asked for."""
    import hashlib

    import yaml

    dest.mkdir(parents=True)
    spec = yaml.safe_load((small / "pack.yaml").read_text())
    for name, entry in list(spec["files"].items()):
        if entry["role"] == "swapper" or (entry["role"] == "enhancer" and not face_enhancer):
            del spec["files"][name]
        else:
            shutil.copyfile(small / name, dest / name)
    swapper = "inswapper_128_fp16.onnx" if fp16 else "inswapper_128.onnx"
    big_swapper(dest / swapper, fp16=fp16)
    digest = hashlib.sha256((dest / swapper).read_bytes()).hexdigest()
    spec["files"][swapper] = {"role": "swapper", "sha256": digest}
    (dest / "pack.yaml").write_text(yaml.safe_dump(spec))
    return dest


# --- the two sides (each in its own process) -------------------------------------------------------


def side_insightface(pack: Path, images: list[Path], source: Path, out: Path, spawned: float) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore")
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        from insightface.app import FaceAnalysis
        from insightface.model_zoo import model_zoo

        fa_root = out / "fa"
        (fa_root / "models" / "bench").mkdir(parents=True)
        for name in ("det_10g.onnx", "w600k_r50.onnx"):
            os.symlink(pack / name, fa_root / "models" / "bench" / name)
        app = FaceAnalysis(name="bench", root=str(fa_root), providers=["CPUExecutionProvider"])
        app.prepare(ctx_id=-1, det_size=(640, 640))
        swapper = model_zoo.get_model(str(pack / "inswapper_128.onnx"), providers=["CPUExecutionProvider"])
        src_img = cv2.imread(str(source))
        src = app.get(src_img)[0]
    stages = dict.fromkeys(("decode", "detect+embed", "swap+paste", "encode", "write"), 0.0)
    n_faces, first = 0, None
    t0 = time.perf_counter()
    for p in images:
        t = time.perf_counter()
        img = cv2.imread(str(p))
        t1 = time.perf_counter()
        found = app.get(img)
        t2 = time.perf_counter()
        for f in found:
            img = swapper.get(img, f, src, paste_back=True)
        t3 = time.perf_counter()
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        t4 = time.perf_counter()
        (out / p.name).write_bytes(buf.tobytes())
        t5 = time.perf_counter()
        for k, a, b in (("decode", t, t1), ("detect+embed", t1, t2), ("swap+paste", t2, t3), ("encode", t3, t4)):
            stages[k] += b - a
        stages["write"] += t5 - t4
        n_faces += len(found)
        first = first or time.time()
    wall = time.perf_counter() - t0
    return {"wall": wall, "images": len(images), "faces": n_faces, "stages": stages, "cold": (first or 0) - spawned}


def side_runner(pack: Path, images: list[Path], source: Path, out: Path, spawned: float) -> dict[str, Any]:
    from contract.layout import RunLayout
    from contract.manifest import Item, Manifest
    from contract.results import read_results
    from runner_image.__main__ import main

    root = out / "data"
    (root / "in").mkdir(parents=True)
    shutil.copytree(pack, root / "models")  # real files: the runner follows no link on the volume
    for p in [*images, source]:
        shutil.copyfile(p, root / "in" / p.name)
    items = tuple(Item(f"i{i:06d}", f"/data/in/{p.name}", f"/data/out/{p.name}") for i, p in enumerate(images))
    chain = tuple(os.environ.get("BENCH_PROCESSORS", "face_swapper").split(","))
    providers = tuple(os.environ.get("BENCH_PROVIDERS", "cpu").split(","))
    tuning = {
        k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(os.environ.get("BENCH_TUNING", "{}")).items()
    }
    m = Manifest(
        job="bench", chunk="c0000", run_dir=str(RunLayout.container("bench").dir), pack_dir="/data/models",
        source=(f"/data/in/{source.name}",), items=items, providers=providers, processors=chain, **tuning,
    )  # fmt: skip
    layout = RunLayout.host(root, "bench")
    layout.chunks_dir.mkdir(parents=True)
    layout.manifest("c0000").write_text(m.to_json())
    t0 = time.perf_counter()
    start = time.time()
    log = out / "runner.log"
    with open(log, "w") as sink:
        old, sys.stdout = sys.stdout, sink
        try:
            code = main(["--manifest", str(m.layout.manifest("c0000")), "--data-root", str(root)], env={})
        finally:
            sys.stdout = old
    if code != 0:
        raise SystemExit(f"runner exit {code}: {log.read_text()[-2000:]}")
    wall_all = time.perf_counter() - t0
    results = read_results(layout.results("c0000", 1).read_text())
    assert code == 0 and len(results) == len(images), (code, len(results))
    stages: dict[str, float] = {}
    for r in results:
        for k, v in r.timings.items():
            stages[k] = stages.get(k, 0.0) + v
    first_start = min(r.started for r in results)
    wall = max(r.finished for r in results) - first_start  # items only: like the loop above
    return {
        "wall": wall,
        "setup": first_start - start,
        "wall_with_setup": wall_all,
        "images": len(results),
        "faces": sum(r.faces for r in results),
        "stages": stages,
        "cold": min(r.finished for r in results) - spawned,
    }


def run_side(
    side: str, pack: Path, images: list[Path], source: Path, work: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    out = work / f"{side}-{time.monotonic_ns()}"
    out.mkdir()
    args = [sys.executable, __file__, "--side", side, str(pack), str(source), str(out), *map(str, images)]
    spawned = time.time()
    env = {**os.environ, **(env or {}), "BENCH_SPAWNED": str(spawned)}
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def summarise(r: dict[str, Any]) -> dict[str, Any]:
    r["images_per_s"] = r["images"] / r["wall"]
    r["faces_per_s"] = r["faces"] / r["wall"]
    inf = sum(v for k, v in r["stages"].items() if k in INFERENCE or k == "detect+embed")
    r["inference_s_per_wall_s"] = inf / r["wall"]
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--small-n", type=int, default=24)
    ap.add_argument("--big-n", type=int, default=2)
    ap.add_argument("--no-big", action="store_true")
    ap.add_argument("--per-processor", action="store_true", help="the runner per processor chain, side by side")
    ap.add_argument("--providers", default="cpu", help="the runner's, with --per-processor (e.g. cuda,cpu)")
    ap.add_argument("--side")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.per_processor and not a.side:
        return per_processor(a.small_n, a.providers, a.json)
    if a.side:
        pack, source, out, *imgs = (Path(x) for x in a.rest)
        spawned = float(os.environ["BENCH_SPAWNED"])
        fn = side_insightface if a.side == "insightface" else side_runner
        print(json.dumps(fn(pack, imgs, source, out, spawned)))
        return 0
    report: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-") as tmp:
        work = Path(tmp)
        small = build_pack(work / "small", enhancer=False).parent
        packs = [("test pack", small, a.small_n)]
        if not a.no_big:
            print("generating the inswapper-layout stand-in (138.6M params) …", file=sys.stderr)
            packs.append(("inswapper-layout stand-in", big_pack(small, work / "big"), a.big_n))
        src_dir = work / "source"
        photos.face_photos(src_dir, 2)
        source = src_dir / "face_01.jpg"
        for label, pack, n in packs:
            for kind in ("one", "several"):
                count = n if kind == "one" else max(1, n // 3)
                images = make_photos(work / f"{label[:4]}-{kind}", kind, count)
                base = summarise(run_side("insightface", pack, images, source, work))
                ours = summarise(run_side("runner", pack, images, source, work))
                row = {"pack": label, "set": f"{kind} face(s)/photo", "insightface": base, "runner": ours}
                row["ratio_images_per_s"] = ours["images_per_s"] / base["images_per_s"]
                report.append(row)
                print_row(row)
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return 0


CHAINS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (  # processors, manifest tuning
    (("face_swapper",), {}),
    (("face_swapper",), {"swapper_pixel_boost": 256}),
    (("face_swapper",), {"swapper_weight": 0.5}),
    (("face_swapper",), {"mask_types": ["box", "occlusion"]}),
    (("face_swapper",), {"mask_types": ["box", "region"]}),
    (("face_swapper",), {"selector_gender": "female"}),
    (("face_swapper",), {"swapper_model": "simswap_256", "swapper_pixel_boost": 256}),  # each its own pack
    (("face_swapper",), {"swapper_model": "hyperswap_1a_256", "swapper_pixel_boost": 256}),
    (("face_swapper",), {"swapper_model": "ghost_256", "swapper_pixel_boost": 256}),
    (("face_swapper", "face_enhancer"), {}),
    (("face_swapper", "frame_enhancer"), {}),
    (("face_swapper", "face_enhancer", "frame_enhancer"), {}),
)


def per_processor(n: int, providers: str, json_path: Path | None) -> int:
    """The runner on the same one-face photos once per chain of CHAINS, printed side by side."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ffswarm-bench-") as tmp:
        work = Path(tmp)
        packs = {"inswapper_128": build_pack(work / "pack").parent}  # every processor's stand-in
        photos.face_photos(work / "source", 2)
        source = work / "source" / "face_01.jpg"
        images = make_photos(work / "one", "one", n)
        for chain, tuning in CHAINS:
            model = str(tuning.get("swapper_model", "inswapper_128"))
            if model not in packs:  # that swapper's stand-in (and its converter) in place of inswapper's
                packs[model] = build_pack(work / f"pack-{model}", swapper=model).parent
            pack = packs[model]
            env = {
                "BENCH_PROCESSORS": ",".join(chain),
                "BENCH_PROVIDERS": providers,
                "BENCH_TUNING": json.dumps(tuning),
            }
            r = summarise(run_side("runner", pack, images, source, work, env))
            rows.append({"processors": list(chain), "tuning": tuning, **r})
    base = rows[0]["images_per_s"]
    print(f"\nrunner in-process, stand-in pack, {n} one-face photos, providers {providers}")
    print(f"{'processors and tuning':70}{'images/s':>10}{'× swapper':>11}{'cold s':>9}")
    for r in rows:
        r["ratio_to_swapper"] = round(r["images_per_s"] / base, 3)
        name = " + ".join(r["processors"]) + "".join(f" {k}={v}" for k, v in r["tuning"].items())
        print(f"{name:70}{r['images_per_s']:>10.2f}{r['ratio_to_swapper']:>11.2f}{r['cold']:>9.2f}")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1))
    return 0


def print_row(row: dict[str, Any]) -> None:
    b, r = row["insightface"], row["runner"]
    print(f"\n== {row['pack']} · {row['set']} · {b['images']} images, {b['faces']} faces")
    print(f"{'':24}{'insightface loop':>20}{'ffswarm runner':>20}")
    for key, fmt in (("images_per_s", "{:.2f}"), ("faces_per_s", "{:.2f}"), ("cold", "{:.2f} s")):
        print(f"{key:24}{fmt.format(b[key]):>20}{fmt.format(r[key]):>20}")
    print(f"{'inference s / wall s':24}{b['inference_s_per_wall_s']:>20.2f}{r['inference_s_per_wall_s']:>20.2f}")
    print(f"{'ratio (runner ÷ loop)':24}{row['ratio_images_per_s']:>40.2f}")
    print("stage seconds (summed over items):")
    for k, v in b["stages"].items():
        print(f"  loop   {k:14}{v:8.3f}  ({100 * v / b['wall']:.0f}% of wall)")
    for k, v in r["stages"].items():
        print(f"  runner {k:14}{v:8.3f}  ({100 * v / r['wall']:.0f}% of wall)")


if __name__ == "__main__":
    sys.exit(main())
