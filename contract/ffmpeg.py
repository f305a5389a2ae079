"""ffmpeg/ffprobe command lines as pure functions returning argv lists (never a shell string).

The runner decodes and encodes segments with them, the controller probes and joins with them: both
must agree on the segments' format, so the commands are part of the contract. Tests compare the lists.

Why these flags:
- decode: ``select='between(n,S,E)'`` picks frames by their index in decode order, so a segment is
  exact whatever the timestamps (NTSC, variable rate); ``-frames:v`` stops decoding at the end of
  the range; ``-fps_mode passthrough`` forbids ffmpeg to duplicate or drop frames. ffmpeg's
  default autorotate turns rotated inputs upright before ``select`` (faces are found upright, and
  the output, stored upright without a display matrix, plays with the input's orientation).
- encode: raw BGR frames at the exact input rate; ``-video_track_timescale`` keeps the input's time
  base, so the segments concatenate with ``-c copy`` into a stream with the original timing.
- join: the concat demuxer with ``-c copy`` (no re-encode); the audio of the original is mapped in
  and copied, or re-encoded when the output container cannot hold its codec.
- every input, always: ``-protocol_whitelist`` (``file``; ``pipe`` for raw frames) and
  ``-format_whitelist`` (the demuxers in INPUT_FORMATS), and the probed demuxer named with ``-f``
  where it is known. ffmpeg otherwise picks a demuxer from the content, and an ``.mp4`` that is an
  HLS playlist (or a concat script) makes it read any file or URL the playlist names. A probe of a
  file of another format fails with "Format not on whitelist" before anything it names is opened.
"""

from __future__ import annotations

from contract.manifest import DEMUXERS, Segment

FFMPEG = "ffmpeg"
FFPROBE = "ffprobe"
QUIET = ("-nostdin", "-hide_banner", "-loglevel", "error")

# The input demuxers ffmpeg may use, by the names ffprobe's format_name gives (comma-separated),
# and the one ``-f`` names for each family.
INPUT_FORMATS = {
    "mov": ("mov", "mp4", "m4a", "3gp", "3g2", "mj2"),
    "matroska": ("matroska", "webm"),
    "avi": ("avi",),
}
assert tuple(INPUT_FORMATS) == DEMUXERS
FORMAT_WHITELIST = ",".join(name for names in INPUT_FORMATS.values() for name in names)
SAFE_INPUT = ("-protocol_whitelist", "file", "-format_whitelist", FORMAT_WHITELIST)
REFUSED_FORMAT = "Format not on whitelist"  # ffmpeg's words when a file's content is another format


def demuxer_for(format_name: str) -> str | None:
    """The allowed demuxer (for ``-f``) that ffprobe's ``format_name`` names, or None: a format
    ffswarm does not read (hls, concat, image2, tty …)."""
    names = set(format_name.split(","))
    for demuxer, family in INPUT_FORMATS.items():
        if names and names <= set(family):
            return demuxer
    return None


# Output extension → muxer name (ffmpeg -f).
MUXERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm", ".avi": "avi"}
SEGMENT_EXT = ".mp4"

# Audio codecs each container takes as-is (ffmpeg's muxers; anything else is re-encoded).
AUDIO_COPY_OK = {
    "mp4": frozenset({"aac", "mp3", "ac3", "eac3", "opus", "alac", "flac"}),
    "mov": frozenset({"aac", "mp3", "ac3", "eac3", "alac", "pcm_s16le", "pcm_s16be", "pcm_s24le", "pcm_f32le"}),
    "matroska": frozenset(
        {"aac", "mp3", "ac3", "eac3", "opus", "vorbis", "flac", "alac", "dts", "pcm_s16le", "pcm_s24le", "pcm_f32le"}
    ),
    "webm": frozenset({"opus", "vorbis"}),
    "avi": frozenset({"mp3", "ac3", "pcm_s16le", "aac"}),
}
# What audio is re-encoded to when it cannot be copied.
AUDIO_REENCODE = {"webm": "libopus"}
AUDIO_REENCODE_DEFAULT = "aac"
# Video codecs a container can hold (checked at plan time for the segments' encoder).
VIDEO_OK = {"webm": frozenset({"libvpx", "libvpx-vp9", "libaom-av1", "libsvtav1", "librav1e"})}


def probe_cmd(path: str) -> list[str]:
    """Everything planning needs, as JSON: streams (with packet counts, which cost a demux but no
    decode) and the container."""
    return [
        FFPROBE, "-v", "error", *SAFE_INPUT, "-count_packets", "-show_format", "-show_streams", "-of", "json", path,
    ]  # fmt: skip


def frame_times_cmd(path: str, demuxer: str | None = None) -> list[str]:
    """Every packet of the first video stream as a CSV line "pts,flags" (in the stream's time base,
    which the probe gives): a demux, no decode. Planning turns them into segments' seeks."""
    return [
        FFPROBE, "-v", "error", *SAFE_INPUT, *_format(demuxer), "-select_streams", "v:0",
        "-show_entries", "packet=pts,flags", "-of", "csv=p=0", path,
    ]  # fmt: skip


def _format(demuxer: str | None) -> list[str]:
    if demuxer is None:
        return []
    if demuxer not in INPUT_FORMATS:
        raise ValueError(f"demuxer {demuxer!r} is not one ffswarm reads")
    return ["-f", demuxer]


def decode_cmd(path: str, seg: Segment) -> list[str]:
    """Frames [start, start + count) of the first video stream as raw BGR on stdout: from a seek
    just before the segment's first frame when the plan knows its time (ffmpeg decodes from the
    keyframe before it and drops what precedes it), else from the start, picked by number."""
    end = seg.start_frame + seg.frame_count - 1
    source = [*SAFE_INPUT, *_format(seg.demuxer), "-i", path]
    if seg.seek is not None:
        where = ["-ss", seg.seek, *source]
        pick: list[str] = []
    else:
        where = source
        pick = ["-vf", f"select='between(n,{seg.start_frame},{end})'"]
    return [
        FFMPEG,
        *QUIET,
        *where,
        "-map",
        "0:v:0",
        "-an",
        "-sn",
        "-dn",
        *pick,
        "-fps_mode",
        "passthrough",
        "-frames:v",
        str(seg.frame_count),
        "-f",
        "rawvideo",
        "-pix_fmt",
        "bgr24",
        "pipe:1",
    ]


def encode_cmd(path: str, seg: Segment, scale: int = 1) -> list[str]:
    """Raw BGR frames on stdin → one video-only segment file (mp4) at ``path``; ``scale``: the frames
    are that many times the segment's size (a frame enhancer's)."""
    return [
        FFMPEG,
        *QUIET,
        "-f",
        "rawvideo",
        "-pix_fmt",
        "bgr24",
        "-s",
        f"{seg.width * scale}x{seg.height * scale}",
        "-framerate",
        seg.fps,
        "-protocol_whitelist",
        "pipe",
        "-i",
        "pipe:0",
        "-an",
        "-vf",
        f"setsar={seg.sar}",
        *video_codec_args(seg.codec, seg.crf, seg.preset),
        "-pix_fmt",
        "yuv420p",
        "-video_track_timescale",
        str(seg.timescale),
        "-f",
        "mp4",
        "-y",
        path,
    ]


# The video encoders a job may name (video.codec) and how each is told crf and preset. x264/x265 take
# both as they are; VP9 (libvpx) takes crf 0…63 in constant-quality mode (-b:v 0) and a speed for the
# preset; NVENC (on the GPU) takes a constant-quality level (-cq, 0…51) and presets p1 (fastest) … p7.
X26X = ("libx264", "libx265")
NVENC = ("h264_nvenc", "hevc_nvenc")
VIDEO_CODECS = (*X26X, "libvpx-vp9", *NVENC)
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
NVENC_PRESETS = dict(zip(PRESETS, ("p1", "p1", "p2", "p3", "p3", "p4", "p5", "p6", "p7"), strict=True))
VP9_SPEEDS = dict(zip(PRESETS, (8, 7, 6, 5, 4, 3, 2, 1, 0), strict=True))


def video_codec_args(codec: str, crf: int, preset: str) -> list[str]:
    """``-c:v`` and its quality and speed options, in each encoder's own terms."""
    if codec in NVENC:
        return ["-c:v", codec, "-preset", NVENC_PRESETS.get(preset, "p4"), "-rc", "vbr", "-cq", str(crf), "-b:v", "0"]
    if codec == "libvpx-vp9":
        speed = str(VP9_SPEEDS.get(preset, 3))
        return ["-c:v", codec, "-crf", str(crf), "-b:v", "0", "-deadline", "good", "-cpu-used", speed, "-row-mt", "1"]
    extra = ["-x265-params", "log-level=error"] if codec == "libx265" else []
    return ["-c:v", codec, "-crf", str(crf), "-preset", preset, *extra]


def concat_list(paths: list[str]) -> str:
    """An ffconcat script naming ``paths`` in order (single quotes escaped the demuxer's way)."""
    lines = ["ffconcat version 1.0"]
    for p in paths:
        escaped = p.replace("'", "'\\''")
        lines.append(f"file '{escaped}'")
    return "\n".join(lines) + "\n"


def audio_codec(muxer: str, source_codec: str) -> str:
    """``copy`` when ``muxer`` holds ``source_codec`` as it is, else the encoder to use."""
    if source_codec in AUDIO_COPY_OK.get(muxer, frozenset()):
        return "copy"
    return AUDIO_REENCODE.get(muxer, AUDIO_REENCODE_DEFAULT)


def join_cmd(
    list_file: str, original: str, out: str, muxer: str, audio: str | None, demuxer: str | None = None
) -> list[str]:
    """Segments (an ffconcat list) → ``out`` without re-encoding video; ``audio`` None: no audio,
    else the codec for every audio stream of ``original`` (``copy`` or an encoder), read with
    ``demuxer`` (the probe's; the allow-list alone when None). The list's entries are opened by
    the concat demuxer with the same whitelists (the segments are mp4)."""
    segments = ("-protocol_whitelist", "file", "-format_whitelist", f"concat,{FORMAT_WHITELIST}")
    cmd = [FFMPEG, *QUIET, *segments, "-f", "concat", "-safe", "0", "-i", list_file]
    if audio is not None:
        cmd += [*SAFE_INPUT, *_format(demuxer), "-i", original]
    cmd += ["-map", "0:v:0"]
    if audio is not None:
        cmd += ["-map", "1:a"]
    cmd += ["-c:v", "copy"]
    cmd += ["-an"] if audio is None else ["-c:a", audio]
    if muxer in ("mp4", "mov"):
        cmd += ["-movflags", "+faststart"]
    cmd += ["-f", muxer, "-y", out]
    return cmd
