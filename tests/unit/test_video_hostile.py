"""Hostile video targets (issue 16): ffmpeg/ffprobe with a protocol and demuxer allow-list, targets
opened without following links or blocking, ffprobe as the runner's uid when the controller is root,
and caps on a video's pixels and frames as that item's error. With the host's ffmpeg, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.manifest import Item, Segment
from controller.job import video
from controller.job.files import parse_job
from controller.job.plan import TargetRef
from controller.job.resolve import resolve_job
from controller.policy import Limits
from runner_image import video as rvideo
from runner_image.errors import ItemError, Superseded
from runner_image.volume import DataRoot
from tests.unit.test_video import STEPS, make_clip


@pytest.fixture
def alarm() -> Iterator[None]:
    """A hang (a FIFO opened for reading) fails the test instead of stalling it."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refs(root: Path, limits: Limits | None = None, **fields: object) -> dict[str, TargetRef]:
    spec = parse_job({"name": "j", "source": "s.jpg", "targets": ["in/*"], "output": "out/{stem}{ext}", **fields}, "j")
    (root / "s.jpg").write_bytes(b"x")
    resolved = resolve_job(spec, root, "job.yaml")
    return {Path(t.input).name: t for t in video.target_refs(resolved.targets, spec, limits)}


def hls_playlist(path: Path, names: Path) -> Path:
    """An ``.mp4`` that is really an HLS playlist naming ``names`` by its absolute path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:1.0,\n{names}\n#EXT-X-ENDLIST\n")
    return path


def read_since(path: Path) -> bool:
    """Whether ``path`` was read since ``untouched`` (relatime updates an atime older than mtime)."""
    return path.stat().st_atime_ns > path.stat().st_mtime_ns


def untouched(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A real video outside the data root, and proof that this filesystem shows a read in its atime:
    plain ffprobe (no allow-list, what ffswarm ran before) reads it through the playlist."""
    secret = make_clip(tmp_path / "host" / "secret.ts", seconds=1, audio=False, extra=("-f", "mpegts"))
    probe = hls_playlist(tmp_path / "probe" / "p.mp4", secret)
    untouched(secret)
    plain = subprocess.run(["ffprobe", "-v", "error", "-show_format", str(probe)], capture_output=True, text=True)
    if plain.returncode != 0 or not read_since(secret):
        pytest.skip("this filesystem does not record reads in atime (or ffprobe lacks hls)")
    assert "format_name=hls" in plain.stdout
    untouched(secret)
    return secret


def test_an_mp4_that_is_an_hls_playlist_is_refused_at_plan_time_and_nothing_it_names_is_read(
    tmp_path: Path, outside: Path
) -> None:
    root = tmp_path / "root"
    hls_playlist(root / "in" / "evil.mp4", outside)
    make_clip(root / "in" / "good.mp4", seconds=1)
    got = refs(root)
    assert got["evil.mp4"].error == (
        "not a video format ffswarm reads (mp4/mov, mkv/webm or avi): refused without reading what it names"
    )
    assert got["evil.mp4"].segments == ()
    assert got["good.mp4"].error is None and got["good.mp4"].segments[0].demuxer == "mov"
    assert not read_since(outside)


def test_the_runner_decodes_with_the_planned_demuxer_only(tmp_path: Path, outside: Path) -> None:
    """A target swapped for a playlist after planning: decoded as the probe's mov, it is an error,
    and the file the playlist names is not read."""
    hls_playlist(tmp_path / "in" / "v.mp4", outside)
    seg = Segment(0, 25, "25/1", 64, 48, 12800, last=True, demuxer="mov")
    item = Item("i0-s0000", "/data/in/v.mp4", "/data/runs/j/segments/i0-s0000.mp4", kind="video", segment=seg)
    with pytest.raises(ItemError, match="ffmpeg decoder failed"):
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    assert not read_since(outside)
    assert [p.name for p in (tmp_path / "runs" / "j" / "segments").iterdir()] == []


def test_matroska_is_probed_and_decoded_with_its_own_demuxer(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "v.mkv", seconds=1)
    ref = refs(tmp_path)["v.mkv"]
    assert ref.error is None and {s.demuxer for s in ref.segments} == {"matroska"}
    item = Item("i0-s0000", "/data/in/v.mkv", "/data/runs/j/segments/s.mp4", kind="video", segment=ref.segments[0])
    status, out, _, digest = rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    assert out == item.output and digest.size == (tmp_path / "runs/j/segments/s.mp4").stat().st_size


def test_fifo_and_symlinked_videos_are_refused_at_plan_time_without_a_hang(tmp_path: Path, alarm: None) -> None:
    clip = make_clip(tmp_path / "elsewhere" / "c.mp4", seconds=1)
    os.mkfifo(tmp_path / "f.mp4")
    with pytest.raises(video.ProbeError, match=r"^is a FIFO \(named pipe\), not a regular file$"):
        video.probe(tmp_path / "f.mp4")
    (tmp_path / "l.mp4").symlink_to(clip)
    with pytest.raises(video.ProbeError, match="^is a symbolic link: not followed$"):
        video.probe(tmp_path / "l.mp4")
    with pytest.raises(video.ProbeError, match="a folder"):
        video.probe(tmp_path / "elsewhere")


def test_the_runner_refuses_a_fifo_or_symlinked_video_without_a_hang(tmp_path: Path, alarm: None) -> None:
    make_clip(tmp_path / "in" / "real.mp4", seconds=1)
    os.mkfifo(tmp_path / "in" / "v.mp4")
    seg = Segment(0, 25, "25/1", 64, 48, 12800, last=True, demuxer="mov")
    item = Item("i0-s0000", "/data/in/v.mp4", "/data/runs/j/segments/s.mp4", kind="video", segment=seg)
    with pytest.raises(ItemError, match=r"^is a FIFO \(named pipe\), not a regular file$"):
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    os.unlink(tmp_path / "in" / "v.mp4")
    (tmp_path / "in" / "v.mp4").symlink_to(tmp_path / "in" / "real.mp4")
    with pytest.raises(ItemError, match="^is a symbolic link: not followed$"):
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS)
    (tmp_path / "runs" / "j").mkdir(parents=True)
    (tmp_path / "runs" / "j" / "segments").symlink_to(tmp_path / "in")  # segments/ planted as a link
    ok = Item("i0-s0000", "/data/in/real.mp4", "/data/runs/j/segments/s.mp4", kind="video", segment=seg)
    with pytest.raises(ItemError, match="^folder runs/j/segments is a symbolic link: not followed$"):
        rvideo.process_segment(ok, DataRoot(tmp_path), STEPS)
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["real.mp4", "v.mp4"]


def test_a_video_over_the_pixel_or_frame_caps_is_that_items_error_with_the_numbers(tmp_path: Path) -> None:
    make_clip(tmp_path / "in" / "v.mp4", seconds=2)  # 64x48, 50 frames
    (tmp_path / "in" / "p.jpg").write_bytes(b"\xff\xd8\xff")
    got = refs(tmp_path, Limits(video_pixels=64 * 48 - 1))
    assert got["v.mp4"].error == (
        "video too large: 64x48 = 3072 pixels a frame, the limit is 3071 (the cluster's policy.limits.video_pixels)"
    )
    assert got["v.mp4"].segments == () and got["p.jpg"].error is None  # the job's other targets still run
    got = refs(tmp_path, Limits(video_frames=49))
    assert got["v.mp4"].error == "video too long: 50 frames, the limit is 49 (the cluster's policy.limits.video_frames)"
    assert refs(tmp_path, Limits(video_pixels=64 * 48, video_frames=50))["v.mp4"].error is None


@pytest.mark.skipif(os.geteuid() != 0, reason="running ffprobe as another uid needs root")
def test_ffprobe_runs_as_the_runners_uid_when_the_controller_is_root(tmp_path: Path) -> None:
    clip = make_clip(tmp_path / "v.mp4", seconds=1)
    os.chmod(clip, 0o600)  # root's file: the runner's uid may not read it
    assert video.probe(clip).frames == 25
    with pytest.raises(video.ProbeError, match="Permission denied"):
        video.probe(clip, "v.mp4", run_as=(65534, 65534))
    os.chown(clip, 65534, 65534)
    assert video.probe(clip, "v.mp4", run_as=(65534, 65534)).frames == 25
    assert video.probe_user("10001:10002") == (10001, 10002)


def test_the_probe_reports_the_format_it_refuses(tmp_path: Path) -> None:
    probe = {"streams": [{"codec_type": "video", "r_frame_rate": "25/1", "width": 2, "height": 2, "nb_frames": "1"}]}
    for name in ("hls", "concat", "image2", "mov,mp4,m4a,3gp,3g2,mj2,hls", ""):
        with pytest.raises(video.ProbeError, match="not a video format ffswarm reads"):
            video.parse_probe(json.dumps({**probe, "format": {"format_name": name}}))
    assert video.parse_probe(json.dumps({**probe, "format": {"format_name": "avi"}})).demuxer == "avi"


def test_a_segment_fenced_off_at_its_commit_leaves_no_file(tmp_path: Path) -> None:
    """The engine's fence (a later attempt of the chunk has started) refuses the segment's rename: the
    encoded segment is neither committed nor left as a temporary file; without the fence it commits."""
    make_clip(tmp_path / "in" / "v.mkv", seconds=1)
    ref = refs(tmp_path)["v.mkv"]
    item = Item("i0-s0000", "/data/in/v.mkv", "/data/runs/j/segments/s.mp4", kind="video", segment=ref.segments[0])

    def fence(_: object) -> None:
        raise Superseded("attempt 2 of chunk c0001 has started: this attempt commits no more")

    with pytest.raises(Superseded):
        rvideo.process_segment(item, DataRoot(tmp_path), STEPS, before=fence)
    assert list((tmp_path / "runs" / "j" / "segments").iterdir()) == []
    seen: list[int] = []
    _, out, _, digest = rvideo.process_segment(item, DataRoot(tmp_path), STEPS, before=lambda d: seen.append(d.size))
    assert seen == [digest.size] and [p.name for p in (tmp_path / "runs" / "j" / "segments").iterdir()] == ["s.mp4"]
