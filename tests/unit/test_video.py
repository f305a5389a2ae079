"""Video targets without Docker: ffmpeg command lines as lists, segmenting, probe parsing, plans,
and (with the host's ffmpeg) one segment decoded/encoded and a video joined with its audio."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract import ffmpeg
from contract.errors import ManifestError
from contract.manifest import FaceSelection, Item, Manifest, NoFacePolicy, Segment
from contract.results import ItemResult
from controller.job import video
from controller.job.files import parse_job
from controller.job.plan import ManifestSettings, Plan, TargetRef, chunk_manifests, make_plan
from controller.job.resolve import resolve_job
from controller.run import join
from controller.run.chunks import ChunkRun
from controller.run.report import build_report
from controller.run.rundir import Control, RunDir
from runner_image import video as rvideo
from runner_image.errors import ItemError
from runner_image.volume import DataRoot

MOV = "mov,mp4,m4a,3gp,3g2,mj2"
SEG = Segment(start_frame=25, frame_count=25, fps="30000/1001", width=480, height=360, timescale=30000)

# --- command builders ------------------------------------------------------------------------------


WL = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi"
SAFE = ["-protocol_whitelist", "file", "-format_whitelist", WL]  # every input: files only, these demuxers only


def test_probe_cmd() -> None:
    assert ffmpeg.probe_cmd("/d/a.mp4") == [
        "ffprobe", "-v", "error", *SAFE, "-count_packets", "-show_format", "-show_streams", "-of", "json", "/d/a.mp4",
    ]  # fmt: skip
    assert ffmpeg.frame_times_cmd("/d/a.mkv", "matroska")[:9] == ["ffprobe", "-v", "error", *SAFE, "-f", "matroska"]


def test_decode_cmd_selects_exactly_the_frame_range() -> None:
    assert ffmpeg.decode_cmd("/data/in/a.mp4", SEG) == [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
        *SAFE, "-i", "/data/in/a.mp4", "-map", "0:v:0", "-an", "-sn", "-dn",
        "-vf", "select='between(n,25,49)'", "-fps_mode", "passthrough", "-frames:v", "25",
        "-f", "rawvideo", "-pix_fmt", "bgr24", "pipe:1",
    ]  # fmt: skip


def test_decode_cmd_seeks_when_the_plan_knows_the_segments_time() -> None:
    seg = Segment(**{**SEG.__dict__, "seek": "0.817483", "demuxer": "mov"})
    assert ffmpeg.decode_cmd("/data/in/a.mp4", seg) == [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
        "-ss", "0.817483", *SAFE, "-f", "mov", "-i", "/data/in/a.mp4", "-map", "0:v:0", "-an", "-sn", "-dn",
        "-fps_mode", "passthrough", "-frames:v", "25", "-f", "rawvideo", "-pix_fmt", "bgr24", "pipe:1",
    ]  # fmt: skip


def test_encode_cmd_keeps_rate_and_timebase() -> None:
    seg = Segment(0, 30, "25/1", 360, 480, 12800, sar="117/128", codec="libx265", crf=23, preset="fast")
    assert ffmpeg.encode_cmd("/data/runs/j/segments/.x.tmp", seg) == [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
        "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", "360x480", "-framerate", "25/1",
        "-protocol_whitelist", "pipe", "-i", "pipe:0",
        "-an", "-vf", "setsar=117/128", "-c:v", "libx265", "-crf", "23", "-preset", "fast",
        "-x265-params", "log-level=error",
        "-pix_fmt", "yuv420p", "-video_track_timescale", "12800", "-f", "mp4", "-y", "/data/runs/j/segments/.x.tmp",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("codec", "crf", "preset", "args"),
    [
        ("libx264", 18, "medium", ["-c:v", "libx264", "-crf", "18", "-preset", "medium"]),
        ("libvpx-vp9", 33, "veryfast",
         ["-c:v", "libvpx-vp9", "-crf", "33", "-b:v", "0", "-deadline", "good", "-cpu-used", "6", "-row-mt", "1"]),
        ("h264_nvenc", 20, "slow",
         ["-c:v", "h264_nvenc", "-preset", "p5", "-rc", "vbr", "-cq", "20", "-b:v", "0"]),
        ("hevc_nvenc", 28, "ultrafast",
         ["-c:v", "hevc_nvenc", "-preset", "p1", "-rc", "vbr", "-cq", "28", "-b:v", "0"]),
    ],
)  # fmt: skip
def test_each_encoder_gets_quality_and_speed_in_its_own_terms(
    codec: str, crf: int, preset: str, args: list[str]
) -> None:
    assert ffmpeg.video_codec_args(codec, crf, preset) == args


def test_join_cmd_copies_video_and_maps_audio() -> None:
    head = [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error",
        "-protocol_whitelist", "file", "-format_whitelist", f"concat,{WL}", "-f", "concat", "-safe", "0", "-i", "l.txt",
    ]  # fmt: skip
    assert ffmpeg.join_cmd("l.txt", "in.mov", "o.tmp", "mov", "copy", "mov") == [
        *head, *SAFE, "-f", "mov", "-i", "in.mov", "-map", "0:v:0", "-map", "1:a", "-c:v", "copy", "-c:a", "copy",
        "-movflags", "+faststart", "-f", "mov", "-y", "o.tmp",
    ]  # fmt: skip
    assert ffmpeg.join_cmd("l.txt", "in.mkv", "o.tmp", "matroska", None) == [
        *head, "-map", "0:v:0", "-c:v", "copy", "-an", "-f", "matroska", "-y", "o.tmp",
    ]  # fmt: skip
    assert ffmpeg.join_cmd("l.txt", "in.avi", "o.tmp", "webm", "libopus")[-8:] == [
        "-c:v", "copy", "-c:a", "libopus", "-f", "webm", "-y", "o.tmp",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="hls"):
        ffmpeg.join_cmd("l.txt", "in.mp4", "o.tmp", "mp4", "copy", "hls")


def test_concat_list_escapes_quotes() -> None:
    text = ffmpeg.concat_list(["/r/a.mp4", "/r/it's.mp4"])
    assert text == "ffconcat version 1.0\nfile '/r/a.mp4'\nfile '/r/it'\\''s.mp4'\n"


@pytest.mark.parametrize(
    "muxer, codec, expected",
    [
        ("mp4", "aac", "copy"),
        ("mp4", "pcm_s16le", "aac"),
        ("matroska", "pcm_s16le", "copy"),
        ("webm", "aac", "libopus"),
        ("webm", "opus", "copy"),
        ("avi", "vorbis", "aac"),
    ],
)
def test_audio_copy_when_the_container_allows(muxer: str, codec: str, expected: str) -> None:
    assert ffmpeg.audio_codec(muxer, codec) == expected


@pytest.mark.parametrize(
    "change",
    [
        {"fps": "30"},
        {"fps": "0/1"},
        {"frame_count": 0},
        {"start_frame": -1},
        {"codec": "-y"},
        {"preset": "fast;rm"},
        {"sar": "a/b"},
        {"crf": True},
        {"seek": "1e3"},
        {"seek": "-0.500000"},
        {"seek": "12"},
        {"seek": "0.5;rm -rf /"},
    ],
)
def test_segment_checks_itself(change: dict[str, Any]) -> None:
    fields = {**SEG.__dict__, **change}
    with pytest.raises(ManifestError):
        Segment(**fields)


def test_manifest_video_items_round_trip_and_image_items_unchanged() -> None:
    items = (
        Item("i000000", "/data/a.jpg", "/data/o/a.jpg"),
        Item("i000001-s0001", "/data/v.mp4", "/data/runs/j/segments/i000001-s0001.mp4", kind="video", segment=SEG),
    )
    m = Manifest("j", "c0000", "/data/runs/j", "/data/models/default", ("/data/s.jpg",), items)
    data = json.loads(m.to_json())
    assert data["items"][0] == {"id": "i000000", "input": "/data/a.jpg", "output": "/data/o/a.jpg"}
    assert data["items"][1]["kind"] == "video" and data["items"][1]["segment"]["fps"] == "30000/1001"
    assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(ManifestError):
        Item("i1", "/data/v.mp4", "/data/o.mp4", kind="video")
    data["items"][1]["segment"]["bogus"] = 1
    with pytest.raises(ManifestError):
        Manifest.from_dict(data)


# --- segmenting --------------------------------------------------------------------------------------


def test_segments_fall_on_frame_boundaries() -> None:
    assert video.segment_ranges(75, Fraction(25), 1.0) == [(0, 25), (25, 25), (50, 25)]
    assert video.segment_ranges(76, Fraction(25), 1.0) == [(0, 25), (25, 25), (50, 25), (75, 1)]
    assert video.segment_ranges(10, Fraction(25), 0.001) == [(i, 1) for i in range(10)]  # never 0 frames


@pytest.mark.parametrize("frames, seconds", [(90, 1.0), (100, 2.5), (17982, 30.0), (1, 30.0)])
def test_ntsc_segments_cover_every_frame_once(frames: int, seconds: float) -> None:
    ntsc = Fraction(30000, 1001)
    ranges = video.segment_ranges(frames, ntsc, seconds)
    assert [s for s, _ in ranges] == [sum(c for _, c in ranges[:i]) for i in range(len(ranges))]
    assert sum(c for _, c in ranges) == frames
    assert all(c == round(Fraction(repr(seconds)) * ntsc) for _, c in ranges[:-1])  # 30 s → 899 frames


# --- probe parsing -------------------------------------------------------------------------------------


def probe_json(video_stream: dict[str, Any] | None = None, audio: bool = True, **fmt: Any) -> str:
    v = {
        "index": 0,
        "codec_type": "video",
        "codec_name": "h264",
        "width": 480,
        "height": 360,
        "r_frame_rate": "30000/1001",
        "avg_frame_rate": "30000/1001",
        "time_base": "1/30000",
        "duration": "3.003000",
        "nb_frames": "90",
        "nb_read_packets": "90",
        "sample_aspect_ratio": "1:1",
        **(video_stream or {}),
    }
    streams: list[dict[str, Any]] = [v]
    if audio:
        streams.append({"index": 1, "codec_type": "audio", "codec_name": "aac", "duration": "3.000000"})
    return json.dumps({"streams": streams, "format": {"duration": "3.003000", "format_name": MOV, **fmt}})


def test_probe_ntsc_with_audio() -> None:
    info = video.parse_probe(probe_json())
    assert info.fps == Fraction(30000, 1001) and not info.variable_fps
    assert (info.frames, info.duration, info.rotation, info.upright_size) == (90, 3.003, 0, (480, 360))
    assert info.audio == (video.AudioStream(1, "aac", 3.0),)
    assert info.timescale == 30000
    assert info.as_dict()["fps"] == "30000/1001"


@pytest.mark.parametrize(
    "extra, rotation",
    [
        ({"side_data_list": [{"side_data_type": "Display Matrix", "rotation": -90}]}, 270),
        ({"side_data_list": [{"side_data_type": "Display Matrix", "rotation": 90}]}, 90),
        ({"tags": {"rotate": "180"}}, 180),
        ({}, 0),
    ],
)
def test_probe_rotation(extra: dict[str, Any], rotation: int) -> None:
    info = video.parse_probe(probe_json({**extra, "sample_aspect_ratio": "4:3"}))
    assert info.rotation == rotation
    turned = rotation in (90, 270)
    assert info.upright_size == ((360, 480) if turned else (480, 360))
    assert info.upright_sar == (Fraction(3, 4) if turned else Fraction(4, 3))


def test_probe_variable_rate_uses_the_average() -> None:
    info = video.parse_probe(probe_json({"r_frame_rate": "60/1", "avg_frame_rate": "2997/100"}))
    assert info.variable_fps and info.fps == Fraction(2997, 100)
    assert info.timescale == 2997 * 3  # 1/30000 does not give whole ticks per frame at this rate


def test_probe_counts_frames_from_duration_when_nothing_counted() -> None:
    info = video.parse_probe(probe_json({"nb_frames": None, "nb_read_packets": None, "time_base": "1/1000"}))
    assert info.frames == 90 and info.timescale == 30000  # mkv's 1/1000 cannot time NTSC frames exactly


@pytest.mark.parametrize(
    "text, reason",
    [
        (json.dumps({"streams": [{"codec_type": "audio"}], "format": {}}), "no video stream (streams: audio)"),
        (json.dumps({"streams": [], "format": {}}), "no video stream (streams: none)"),
        (probe_json({"disposition": {"attached_pic": 1}}), "no video stream"),
        (probe_json({"r_frame_rate": "0/0", "avg_frame_rate": "0/0"}), "no frame rate"),
        (probe_json({"nb_read_packets": "0", "nb_frames": None, "duration": None}, duration="0"), "no frames"),
        ("not json", "ffprobe gave no JSON"),
    ],
)
def test_probe_refusals_say_why(text: str, reason: str) -> None:
    with pytest.raises(video.ProbeError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        video.parse_probe(text)


# --- plans ---------------------------------------------------------------------------------------------


def video_target(name: str, frames: int, per: int = 25) -> TargetRef:
    segs = tuple(
        Segment(s, min(per, frames - s), "25/1", 64, 48, 12800, last=s + per >= frames) for s in range(0, frames, per)
    )
    return TargetRef(f"in/{name}.mp4", f"out/{name}.mp4", "video", segs, None, {"frames": frames})


def test_video_segments_are_chunked_like_images() -> None:
    targets = [
        TargetRef("in/a.jpg", "out/a.jpg", "image"),
        video_target("v", 75),
        TargetRef("in/bad.mp4", "out/bad.mp4", "video", error="ffprobe: moov atom not found"),
    ]
    plan = make_plan("j", targets, 2)
    assert [i.id for i in plan.items] == ["i000000", "i000001-s0000", "i000001-s0001", "i000001-s0002"]
    assert [c.items for c in plan.chunks] == [("i000000", "i000001-s0000"), ("i000001-s0001", "i000001-s0002")]
    v = plan.videos[0]
    assert (v.id, v.output, v.segments[-1], v.error) == ("i000001", "out/v.mp4", "i000001-s0002", None)
    assert plan.videos[1].segments == () and plan.videos[1].error
    assert plan.item("i000001-s0001").output == "runs/j/segments/i000001-s0001.mp4"
    assert Plan.from_json(plan.to_json()) == plan
    assert "parent" not in json.loads(plan.to_json())["items"][0]  # image items as before
    settings = ManifestSettings(
        "default", ("s.jpg",), ("face_swapper",), ("cpu",), FaceSelection.MANY, NoFacePolicy.COPY
    )
    m = chunk_manifests(plan, settings)["c0001"]
    assert [i.kind for i in m.items] == ["video", "video"]
    assert m.items[1].segment == plan.item("i000001-s0002").segment and m.items[1].input == "/data/in/v.mp4"


def test_image_only_plans_are_unchanged() -> None:
    plan = make_plan("j", [TargetRef("a.jpg", "o/a.jpg", "image")], 5)
    assert json.loads(plan.to_json()) == {
        "job": "j",
        "items": [{"id": "i000000", "input": "a.jpg", "output": "o/a.jpg", "kind": "image"}],
        "chunks": [{"id": "c0000", "items": ["i000000"]}],
    }


# --- with the host's ffmpeg ---------------------------------------------------------------------------


def test_ffmpeg_is_installed() -> None:
    """The tests below run the host's ffmpeg (scripts/dev-swarm.sh installs it): a missing one fails loudly."""
    assert shutil.which("ffmpeg") and shutil.which("ffprobe")


def make_clip(
    path: Path, *, rate: str = "25", seconds: float = 2, audio: bool = True, extra: tuple[str, ...] = ()
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc=size=64x48:rate={rate}"]
    if audio:
        cmd += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000", "-c:a", "aac"]
    cmd += ["-t", str(seconds), "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", *extra, str(path)]
    subprocess.run(cmd, check=True)
    return path


class NoFaces:
    def detect(self, image: np.ndarray, max_num: int = 0) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((0, 5)), np.zeros((0, 5, 2))


@contextmanager
def no_stage(name: str) -> Iterator[None]:
    yield


STEPS = rvideo.FrameSteps(NoFaces(), lambda image, found: found, (), no_stage, lambda stage, seconds: None)


def job_on(root: Path, **fields: Any) -> tuple[Any, Plan]:
    spec = parse_job(
        {"name": "j", "source": "s.jpg", "targets": ["in/*"], "output": "out/{stem}{ext}", **fields}, "job.yaml"
    )
    (root / "s.jpg").write_bytes(b"x")
    resolved = resolve_job(spec, root, "job.yaml")
    return spec, make_plan("j", video.target_refs(resolved.targets, spec), spec.chunk_size)


def run_segments(root: Path, plan: Plan, only: set[str] | None = None) -> RunDir:
    """Do what chunk services do, here: every segment through the runner's code, one result line each."""
    rundir = RunDir(root, plan.job)
    (rundir.path / "results").mkdir(parents=True, exist_ok=True)
    if not rundir.exists():
        rundir.create(b"", plan, {}, Control(2), "img")
    settings = ManifestSettings(
        "default", ("s.jpg",), ("face_swapper",), ("cpu",), FaceSelection.MANY, NoFacePolicy.COPY
    )
    for cid, m in chunk_manifests(plan, settings).items():
        with open(rundir.path / "results" / f"{cid}.a1.jsonl", "a") as f:
            for item in m.items:
                if only is None or item.id in only:
                    status, out, n, d = rvideo.process_segment(item, DataRoot(root), STEPS)
                    f.write(ItemResult(item.id, status, 1, item.input, out, faces=n, size=d.size,
                                       sha256=d.sha256).to_line())  # fmt: skip
    return rundir


def stream_facts(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        ["ffprobe", "-v", "error", "-count_packets", "-show_streams", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    streams: list[dict[str, Any]] = json.loads(proc.stdout)["streams"]
    return streams


def test_segment_decode_encode_is_frame_exact(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "v.mp4", rate="30000/1001", seconds=1.5)
    spec, plan = job_on(tmp_path, segment_seconds=0.5)
    assert [plan.item(s).segment.frame_count for s in plan.videos[0].segments] == [15, 15, 15]  # type: ignore[union-attr]
    run_segments(tmp_path, plan)
    for sid in plan.videos[0].segments:
        (v,) = stream_facts(tmp_path / plan.item(sid).output)
        assert v["nb_read_packets"] == "15" and v["r_frame_rate"] == "30000/1001" and v["time_base"] == "1/30000"
    assert not [p for p in (tmp_path / "runs/j/segments").iterdir() if p.name.startswith(".")]


def test_segment_of_a_broken_video_is_an_item_error(tmp_path: Path) -> None:
    clip = make_clip(tmp_path / "in" / "v.mp4")
    seg = Segment(0, 50, "25/1", 64, 48, 12800)
    item = Item("i0-s0000", "/data/in/v.mp4", "/data/out/s.mp4", kind="video", segment=seg)
    clip.write_bytes(clip.read_bytes()[:2000])
    with pytest.raises(ItemError, match="ffmpeg decoder failed|decoded 0 of the 50 frames"):
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    assert list((tmp_path / "out").iterdir()) == []  # no partial output, no temp file


def rerun_with(root: Path, plan: Plan, calls: list[list[str]]) -> Any:
    def rerun(chunks: list[str]) -> dict[str, ChunkRun]:
        calls.append(chunks)
        ids = {i for c in plan.chunks if c.id in chunks for i in c.items}
        missing = {i for i in ids if not (root / plan.item(i).output).exists()}
        run_segments(root, plan, only=missing)
        return {c: ChunkRun(c) for c in chunks}

    return rerun


def test_join_restores_audio_and_redoes_only_a_corrupt_segment(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "a.mkv", seconds=2)
    make_clip(tmp_path / "in" / "b.mp4", seconds=1, audio=False)
    upright = make_clip(tmp_path / "c.mp4", seconds=1)  # rotate metadata is kept on a stream copy only
    rotate = ["ffmpeg", "-v", "error", "-i", str(upright), "-c", "copy", "-metadata:s:v:0", "rotate=90"]
    subprocess.run([*rotate, str(tmp_path / "in" / "c.mp4")], check=True)
    (tmp_path / "in" / "d.mp4").write_bytes(b"")
    spec, plan = job_on(tmp_path, segment_seconds=0.4, chunk_size=3)
    rundir = run_segments(tmp_path, plan)
    a = plan.videos[0]
    corrupt = tmp_path / plan.item(a.segments[1]).output
    corrupt.write_bytes(corrupt.read_bytes()[:500])
    first = {s: (tmp_path / plan.item(s).output).stat().st_mtime_ns for s in a.segments}
    calls: list[list[str]] = []
    events: list[tuple[str, dict[str, Any]]] = []
    join.finish(plan, rundir, spec, rerun_with(tmp_path, plan, calls), {}, lambda e, **k: events.append((e, k)))
    assert calls == [[next(c.id for c in plan.chunks if a.segments[1] in c.items)]]
    redone = {s for s in a.segments if (tmp_path / plan.item(s).output).stat().st_mtime_ns != first[s]}
    assert redone == {a.segments[1]}
    assert [e for e, _ in events].count("video_joined") == 3

    v, au = stream_facts(tmp_path / "out" / "a.mkv")
    assert v["codec_type"] == "video" and au["codec_type"] == "audio" and au["codec_name"] == "aac"
    assert v["nb_read_packets"] == "50"
    (v,) = stream_facts(tmp_path / "out" / "b.mp4")  # no audio in, none out, no error
    assert v["nb_read_packets"] == "25"
    v, _ = stream_facts(tmp_path / "out" / "c.mp4")
    assert (v["width"], v["height"]) == (48, 64) and not v.get("side_data_list")  # stored upright

    report = build_report(plan, rundir, {}, "img", 0.0).to_dict()
    assert report["counts"]["items"] == 4 and report["counts"]["ok"] == 0 and report["counts"]["no_face"] == 3
    assert report["failures"] == [
        {"item": "i000003", "input": "in/d.mp4", "reason": "in/d.mp4: empty file (0 bytes)", "chunk": None}
    ]
    assert report["items"]["i000000"]["output"] == "out/a.mkv" and report["items"]["i000000"]["segments"] == 5

    calls.clear()  # a second finish (resume) joins nothing again and redoes nothing
    join.finish(plan, rundir, spec, rerun_with(tmp_path, plan, calls), {}, lambda e, **k: events.append((e, k)))
    assert calls == [] and [e for e, _ in events].count("video_joined") == 3


def test_a_segment_whose_bytes_are_not_the_ones_recorded_fails_its_video_naming_it(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "a.mp4", seconds=1)
    spec, plan = job_on(tmp_path, segment_seconds=0.4)
    rundir = run_segments(tmp_path, plan)
    first, second = (tmp_path / plan.item(s).output for s in plan.videos[0].segments[:2])
    first.write_bytes(second.read_bytes())  # a whole, readable segment of the right length: not the one committed
    events: list[tuple[str, dict[str, Any]]] = []
    join.finish(plan, rundir, spec, rerun_with(tmp_path, plan, []), {}, lambda e, **k: events.append((e, k)))
    (joined,) = [k for e, k in events if e == "video_joined"]
    shown = first.relative_to(tmp_path).as_posix()
    assert joined["status"] == "error"
    assert joined["reason"] == (f"out/a.mp4: segment {shown} does not match the sha256 its result recorded "
                                "(changed since it was committed); the video is not joined from it")  # fmt: skip
    assert not (tmp_path / "out" / "a.mp4").exists()


def test_skip_audio_and_a_failed_audio_restore(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "a.mp4", seconds=1)
    make_clip(tmp_path / "in" / "b.mp4", seconds=1)
    spec, plan = job_on(tmp_path, segment_seconds=0.5, skip_audio=True)
    rundir = run_segments(tmp_path, plan)
    join.finish(plan, rundir, spec, rerun_with(tmp_path, plan, []), {}, lambda e, **k: None)
    assert [s["codec_type"] for s in stream_facts(tmp_path / "out" / "a.mp4")] == ["video"]

    root = tmp_path / "r2"
    make_clip(root / "in" / "a.mp4", seconds=1)
    spec2, plan2 = job_on(root, segment_seconds=0.5)
    rundir2 = run_segments(root, plan2)
    make_clip(root / "in" / "a.mp4", seconds=1, audio=False)  # the audio vanished after planning
    join.finish(plan2, rundir2, spec2, rerun_with(root, plan2, []), {}, lambda e, **k: None)
    report = build_report(plan2, rundir2, {}, "img", 0.0).to_dict()
    (failure,) = report["failures"]
    assert "audio restore failed" in failure["reason"] and not (root / "out" / "a.mp4").exists()


@pytest.mark.parametrize(
    ("name", "rate", "encode", "seeks"),
    [
        ("bframes.mp4", "25", ("-c:v", "libx264", "-preset", "veryfast", "-bf", "3", "-g", "25"), True),
        ("ntsc.mp4", "30000/1001", ("-c:v", "libx264", "-preset", "veryfast", "-g", "48"), True),
        ("open-gop.mkv", "25", ("-c:v", "libx264", "-x264-params", "open-gop=1:keyint=30", "-bf", "3"), True),
        ("vp9.webm", "25", ("-c:v", "libvpx-vp9", "-deadline", "realtime", "-g", "20"), True),
        ("vfr.mp4", "25", ("-vf", "setpts='PTS+gt(N,30)*N*0.5/TB/25'", "-fps_mode", "vfr", "-c:v", "libx264"), True),
        ("offset.mp4", "25", ("-c:v", "libx264", "-bf", "3", "-output_ts_offset", "3.3"), True),
        ("rotated.mov", "24", ("-c:v", "libx264", "-bf", "2", "-metadata:s:v", "rotate=90"), True),
        ("packed.avi", "25", ("-c:v", "mpeg4", "-bf", "2", "-g", "12"), False),  # packets without times
    ],
)
def test_each_segment_decodes_exactly_its_frames(
    tmp_path: Path, name: str, rate: str, encode: tuple[str, ...], seeks: bool
) -> None:
    """A segment decodes from a seek just before its first frame (one GOP, not the whole video up to
    it), yet holds exactly the frames a decode of the whole video gives at its place — B-frames, open
    GOPs, NTSC and variable rates, a start time offset, rotation; where frame times cannot all be
    listed (AVI) it decodes from the start, picking frames by number, with the same result."""
    clip = tmp_path / "in" / name
    clip.parent.mkdir(parents=True)
    subprocess.run(
        ["ffmpeg", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=size=96x64:rate={rate}", "-t", "4",
         *encode, *(() if name.endswith(".avi") else ("-pix_fmt", "yuv420p")), str(clip)],
        check=True,
    )  # fmt: skip
    _, plan = job_on(tmp_path, segment_seconds=0.4, output="out/{stem}.mp4")
    segments = [plan.item(s).segment for s in plan.videos[0].segments]
    assert len(segments) >= 8 and all(s is not None for s in segments)
    width, height = segments[0].width, segments[0].height  # type: ignore[union-attr]
    whole = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(clip), "-map", "0:v:0", "-fps_mode", "passthrough",
         "-f", "rawvideo", "-pix_fmt", "bgr24", "pipe:1"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    frames = np.frombuffer(whole, np.uint8).reshape(-1, height, width, 3)
    assert sum(s.frame_count for s in segments) == len(frames)  # type: ignore[union-attr]
    for seg in segments:
        assert seg is not None
        assert (seg.seek is not None) == (seeks and seg.start_frame > 0)
        raw = subprocess.run(ffmpeg.decode_cmd(str(clip), seg), capture_output=True, check=True).stdout
        got = np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)
        expected = frames[seg.start_frame : seg.start_frame + seg.frame_count]
        assert got.shape == expected.shape and np.array_equal(got, expected), f"segment at frame {seg.start_frame}"


def test_several_videos_are_probed_at_once_and_keep_the_targets_order(tmp_path: Path) -> None:
    """Planning probes videos several at a time; the plan still lists targets in glob order, each
    with its own probe (a broken one carrying its own error)."""
    for n, seconds in ((0, 1), (2, 2), (3, 1)):
        make_clip(tmp_path / "in" / f"v{n}.mp4", seconds=seconds, audio=False)
    (tmp_path / "in" / "v1.jpg").write_bytes(b"x")
    (tmp_path / "in" / "v4.mp4").write_bytes(b"not a video")
    _, plan = job_on(tmp_path, segment_seconds=0.4)  # 10 frames of 25 fps
    assert [(v.id, v.error is None, len(v.segments)) for v in plan.videos] == [
        ("i000000", True, 3), ("i000002", True, 5), ("i000003", True, 3), ("i000004", False, 0),
    ]  # fmt: skip
    assert plan.item("i000001").input == "in/v1.jpg"


def test_ffmpeg_reasons_name_files_relative_to_the_data_root(tmp_path: Path) -> None:
    """ffmpeg names the files it was given (host or container paths); a reason names them as the job
    file does. The runner: a segment of a broken video. The controller: ffprobe's and the join's words."""
    clip = make_clip(tmp_path / "in" / "v.mp4")
    clip.write_bytes(clip.read_bytes()[:2000])
    seg = Segment(0, 50, "25/1", 64, 48, 12800)
    item = Item("i0-s0000", "/data/in/v.mp4", "/data/out/s.mp4", kind="video", segment=seg)
    with pytest.raises(ItemError) as e:
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    assert "ffmpeg decoder failed" in str(e.value) and "in/v.mp4: Invalid data" in str(e.value)
    assert str(tmp_path) not in str(e.value)

    host = "/srv/ffswarm/in/v.mp4"
    stderr = f"[in#0 @ 0x55d0] Error opening input: Invalid data\nError opening input file {host}.\n{host}: bad\n"
    assert video._reason(stderr, Path(host), {host: "in/v.mp4"}) == (
        "Error opening input: Invalid data; Error opening input file in/v.mp4.; bad"
    )
    bare = video._reason(stderr, Path(host))  # no names given: the file's bare name, never a host path
    assert bare == "Error opening input: Invalid data; Error opening input file v.mp4.; bad"
