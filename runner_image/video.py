"""One video segment: decode its frames through an ffmpeg pipe, swap faces frame by frame, encode.

Frames never touch the shared volume: the decoder writes raw BGR to our stdin-side pipe and the
encoder reads raw BGR from another; only the encoded segment is written, under a temporary name
beside its final path, and renamed into place once ffmpeg has finished and the frame count is
right (a killed attempt leaves a stale temp file, which the next attempt of the chunk removes).
ffmpeg's messages go to files on the container's tmpfs (/tmp) so that neither pipe can stall on them.

ffmpeg never opens a path of the shared volume itself: the input is opened here without following
a symlink and must be a regular file, the temporary output is created here (O_EXCL|O_NOFOLLOW in a
folder reached without symlinks, runner_image/safefs.py), and ffmpeg gets both as
``/proc/self/fd/N`` of descriptors it inherits; the input with the planner's demuxer (``-f``) and
the whitelists of contract/ffmpeg.py.

Each frame goes through the image path's steps (detect, the job's selection rules, swap, paste);
a frame without a face is passed through unchanged. The segment's status is ``ok`` when any frame
had a face swapped, ``no_face`` otherwise (its file is still written: the controller joins every
segment, and applies the job's ``no_face`` policy to the whole video).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from contract.ffmpeg import decode_cmd, encode_cmd
from contract.manifest import Item, Segment
from contract.paths import user_path
from contract.results import ItemStatus

from . import faces, processors, safefs
from .errors import ItemError
from .processors import Processor, Timer
from .volume import DataRoot

Select = Callable[[np.ndarray, list[faces.Face]], list[faces.Face]]
Stage = Callable[[str], AbstractContextManager[None]]


@dataclass(frozen=True)
class FrameSteps:
    """The image path's per-frame steps, as the pipeline binds them for one item."""

    detector: Any
    select: Select  # the job's selection rules (many | one | reference)
    processors: Sequence[Processor]
    stage: Stage  # times a stage of this item
    timer: Timer  # adds seconds to a stage (processors report inference/paste this way)


def process_segment(
    item: Item,
    root: DataRoot,
    steps: FrameSteps,
    writer: safefs.Writer | None = None,
    copy: Path | None = None,
    before: Callable[[safefs.Digest], None] | None = None,
) -> tuple[ItemStatus, str | None, int, safefs.Digest]:
    """Swap faces in the item's frame range; returns (status, output, faces swapped in total, what
    was committed). A segment belongs to the job's own run folder, so it replaces what is there.
    ``copy``: the input as a file on the tmpfs (an s3:// video, objects.py), read instead of the volume.
    ``before``: told the digest just before the rename (the engine's fence), as safefs.Writer.temp."""
    seg = item.segment
    if seg is None:
        raise ItemError("video item without a segment")
    writer = writer or safefs.Writer("local", "c", 1)
    with root.fd() as rfd:
        src = os.open(copy, safefs.INPUT_FLAGS) if copy is not None else safefs.open_input(rfd, item.input)[0]
        try:
            with writer.temp(rfd, item.output, replace=True, before=before) as tmp:
                src_path = f"/proc/self/fd/{src}"
                names = {tmp.path: user_path(item.output), src_path: user_path(item.input)}  # in ffmpeg's words
                scale = processors.scale(steps.processors)  # a frame enhancer's: every frame that much larger
                with _pipes(src_path, tmp.path, seg, (src, tmp.fd), scale) as (decoder, encoder, messages):
                    frames, swapped = _frames(decoder, encoder, seg, steps)
                    with steps.stage("encode"):
                        _close(encoder, messages[1], "encoder", names)
                    _close(decoder, messages[0], "decoder", names)
                short = frames < seg.frame_count and not (seg.last and frames > 0)
                if short or frames > seg.frame_count:
                    last = seg.start_frame + seg.frame_count - 1
                    raise ItemError(f"decoded {frames} of the {seg.frame_count} frames {seg.start_frame}..{last}")
                with steps.stage("write"):
                    digest = tmp.commit()
        finally:
            os.close(src)
    return (ItemStatus.OK if swapped else ItemStatus.NO_FACE), item.output, swapped, digest


@contextlib.contextmanager
def _pipes(
    src: str, tmp: str, seg: Segment, fds: tuple[int, int], scale: int = 1
) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], tuple[IO[bytes], IO[bytes]]]]:
    """Decoder and encoder processes; both are killed on any way out (errors, SIGTERM)."""
    with tempfile.TemporaryFile() as dec_err, tempfile.TemporaryFile() as enc_err:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            try:
                procs.append(
                    subprocess.Popen(
                        decode_cmd(src, seg),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=dec_err,
                        pass_fds=fds[:1],
                    )
                )
                procs.append(
                    subprocess.Popen(
                        encode_cmd(tmp, seg, scale),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=enc_err,
                        pass_fds=fds[1:],
                    )
                )
            except FileNotFoundError as e:
                raise ItemError(f"ffmpeg is not installed in this runner image: {e}") from e
            yield procs[0], procs[1], (dec_err, enc_err)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                for stream in (p.stdin, p.stdout):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()


def _frames(
    decoder: subprocess.Popen[bytes],
    encoder: subprocess.Popen[bytes],
    seg: Segment,
    steps: FrameSteps,
) -> tuple[int, int]:
    """Pump frames decoder → swap → encoder; returns (frames, faces swapped)."""
    assert decoder.stdout is not None and encoder.stdin is not None
    size = seg.width * seg.height * 3
    frames = swapped = 0
    while True:
        with steps.stage("decode"):
            data = decoder.stdout.read(size)
        if not data:
            return frames, swapped
        if len(data) != size:
            raise ItemError(f"decoder gave a partial frame ({len(data)} of {size} bytes) at frame {frames}")
        frame = np.frombuffer(data, np.uint8).reshape(seg.height, seg.width, 3).copy()
        frame, count = swap_frame(frame, steps)
        swapped += count
        with steps.stage("encode"):
            try:
                encoder.stdin.write(frame.tobytes())
            except BrokenPipeError:
                raise ItemError("encoder stopped early (see its message)") from None
        frames += 1


def swap_frame(frame: np.ndarray, steps: FrameSteps) -> tuple[np.ndarray, int]:
    """Detect, select, run the job's processors in order; returns the frame (a new, larger one after
    a frame enhancer, which also enhances frames without faces) and the faces changed."""
    with steps.stage("detect"):
        found = faces.detect(steps.detector, frame)
    chosen = steps.select(frame, found) if found else []
    if not chosen and processors.scale(steps.processors) == 1:
        return frame, 0
    return processors.run(steps.processors, frame, chosen, steps.timer), len(chosen)


def _close(proc: subprocess.Popen[bytes], messages: IO[bytes], what: str, names: dict[str, str]) -> None:
    """Wait for ``proc``; ItemError with ffmpeg's last words, the files it names written as ``names``
    says (the user's data-root-relative paths, not the container's)."""
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    code = proc.wait()
    if code != 0:
        messages.seek(0)
        text = " ".join(messages.read()[-2000:].decode("utf-8", "replace").strip().splitlines()[-3:])
        for path, name in names.items():
            text = text.replace(path, name)
        raise ItemError(f"ffmpeg {what} failed (exit {code}): {text or 'no message'}")
