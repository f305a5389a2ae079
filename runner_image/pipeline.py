"""The items of one chunk, several at once, so that the accelerator never waits for the CPU.

Each item runs decode → detect → (embed) → processors → encode → write on one thread of a small
pool; ``inflight`` items are in progress at any moment. onnxruntime's ``run`` and OpenCV's decode,
warp, blur and encode release the GIL, so while one item's faces are being inferred the others are
decoded, pasted and encoded, and several inference calls are in flight at once (on a GPU the issue's
figures show ~45 % more throughput from four callers than from one). Sessions are created once per
chunk (models.load_models); every input is read once, and ``no_face: copy`` writes the bytes it
already holds.

Results are appended by the calling thread only, in completion order, each after its output is
committed (runner_image/safefs.py: no symlink followed on the way in or out; an existing file is
replaced only with the job's ``overwrite``; an ``s3://`` output by a PUT, objects.py and s3io.py),
with the committed file's size and sha256. A
chunk-level error (volume gone: Temporary; a bug; SIGTERM) stops new items from starting, lets the
running ones end (their outputs are atomic either way) and is re-raised.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from contract.manifest import Item, Manifest, NoFacePolicy
from contract.paths import user_path
from contract.results import ItemResult, ItemStatus
from contract.s3 import is_s3

from . import faces, media, processors, safefs, selector, video
from .errors import ItemError, Superseded, Temporary
from .genderage import GenderAge
from .objects import Objects
from .processors import Processor
from .volume import DataRoot, Intent, is_volume_error

STAGES = ("decode", "detect", "embed", "swap", "paste", "encode", "write")


@dataclass(frozen=True)
class Engine:
    """What every item of a chunk shares: read-only after construction, so safe across threads."""

    root: DataRoot
    manifest: Manifest
    detector: object
    recognizer: object
    processors: tuple[Processor, ...]
    attempt: int
    gpu: str | None
    provider: str
    writer: safefs.Writer | None = None  # names temporary files (the worker gives the chunk's)
    journal: Callable[[Intent], None] | None = None  # told each output just before its rename
    # Why this attempt may commit nothing more (a later attempt of the chunk has started), or None:
    # asked just before each commit, so an attempt given up while an item was in flight (its node
    # paused, then back) does not commit what the later attempt commits too.
    superseded: Callable[[], str | None] = lambda: None
    # A version 2 manifest (job-file ``pairs``): each person's processors, bound to their identity,
    # and why a person has none (no face in a source photo …): their items fail with that reason.
    people: Mapping[str, tuple[Processor, ...]] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    objects: Objects | None = None  # the store, when the manifest names s3:// objects (objects.py)
    genderage: GenderAge | None = None  # loaded when the manifest's selector filters by gender or age

    def outputs(self) -> safefs.Writer:
        return self.writer or safefs.Writer(self.manifest.job, self.manifest.chunk, self.attempt)

    def processors_for(self, item: Item) -> tuple[Processor, ...]:
        """The processors bound to the item's person (the chunk's own, for a version 1 manifest)."""
        if item.identity is None:
            return self.processors
        if item.identity in self.refused:
            raise ItemError(self.refused[item.identity])
        found = self.people.get(item.identity)
        if found is None:
            raise ItemError(f"identity {item.identity} has no embedding")
        return found


class Outcome(NamedTuple):
    """What one item came to, before it is a result line."""

    status: ItemStatus
    output: str | None
    faces: int
    digest: safefs.Digest | None = None
    note: str | None = None


@dataclass
class _ItemRun:
    """One item's progress: its timings and the stage running now (an error's reason names its file)."""

    engine: Engine
    item: Item
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    current: str = "prepare"

    def add(self, stage: str, seconds: float) -> None:
        self.timings[stage] += seconds

    def timed(self, stage: str) -> _Stage:
        self.current = stage
        return _Stage(self, stage)

    def run(self) -> ItemResult:
        started = time.time()
        outcome, reason = Outcome(ItemStatus.ERROR, None, 0), None
        try:
            outcome = self._process()
        except ItemError as e:
            shown = user_path(self._concerned())
            reason = str(e) if shown in str(e) else f"{shown}: {e}"  # an object's errors name its URL
        except OSError as e:
            if is_volume_error(e):
                raise Temporary(f"{user_path(self._concerned())}: shared volume error: {e.strerror or e}") from e
            verb = "cannot write output" if self._concerned() == self.item.output else "cannot read"
            reason = f"{user_path(self._concerned())}: {verb}: {e.strerror or e}"
        return ItemResult(
            item=self.item.id,
            status=outcome.status,
            attempt=self.engine.attempt,
            input=self.item.input,
            output=outcome.output,
            reason=reason,
            faces=outcome.faces,
            gpu=self.engine.gpu,
            provider=self.engine.provider,
            started=started,
            finished=time.time(),
            timings={k: round(v, 6) for k, v in self.timings.items()},
            size=None if outcome.digest is None else outcome.digest.size,
            sha256=None if outcome.digest is None else outcome.digest.sha256,
            note=outcome.note,
        )

    def _concerned(self) -> str:
        """The file a failure is about (its container path): the output while preparing, encoding or
        writing it. A reason names it as the user wrote it (contract/paths.py user_path)."""
        return self.item.output if self.current in ("prepare", "encode", "write") else self.item.input

    def _process(self) -> Outcome:
        eng, item = self.engine, self.item
        self.current = "identity"
        chain = eng.processors_for(item)  # before anything is read: a pair without a person fails alone
        self.current = "prepare"
        if item.kind == "video":  # a segment of a video target: the same steps on every frame
            steps = video.FrameSteps(eng.detector, self._select, chain, self.timed, self.add)
            if not is_s3(item.input):
                status, output, count, digest = video.process_segment(
                    item, eng.root, steps, eng.outputs(), before=self._fence
                )
                return Outcome(status, output, count, digest)
            self.current = "fetch"  # a failure names the input
            with self._store().seekable(item.input) as copy:
                status, output, count, digest = video.process_segment(
                    item, eng.root, steps, eng.outputs(), copy, self._fence
                )
            return Outcome(status, output, count, digest)
        ext = media.check_output_format(item.output)
        with eng.root.fd() as root_fd:
            return self._image(root_fd, ext, chain)

    def _image(self, root_fd: int, ext: str, chain: tuple[Processor, ...]) -> Outcome:
        eng, item, m = self.engine, self.item, self.engine.manifest
        with self.timed("decode"):
            if is_s3(item.input):
                decoded = media.decode_image(self._store().read(item.input, m.limits.max_file_bytes), m.limits)
            else:
                decoded = media.read_target(root_fd, item.input, m.limits)
        with self.timed("detect"):
            found = faces.detect(eng.detector, decoded.image)
        chosen = self._select(decoded.image, found) if found else []
        if not chosen:  # no face, or (faces: reference) none of the reference person
            if m.no_face is NoFacePolicy.FAIL:
                raise ItemError(selector.why_none(m, found))
            if m.no_face is NoFacePolicy.SKIP:
                return Outcome(ItemStatus.NO_FACE, None, 0)
            if processors.scale(chain) == 1 and m.photo_scale == 1:  # copied as it is, byte for byte
                with self.timed("write"):
                    digest = self._write(root_fd, decoded.data, ItemStatus.NO_FACE, 0)
                return Outcome(ItemStatus.NO_FACE, item.output, 0, digest)
        frame = decoded.image
        self.current = "swap"
        frame = processors.run(chain, frame, chosen, self.add)  # a frame enhancer: a new, larger frame
        if not chosen:  # (copied, but enhanced and/or scaled to the size every output of the job has)
            with self.timed("encode"):
                data, note = media.encode_output(frame, decoded, ext, m.photo_quality, m.photo_scale)
            with self.timed("write"):
                digest = self._write(root_fd, data, ItemStatus.NO_FACE, 0)
            return Outcome(ItemStatus.NO_FACE, item.output, 0, digest, note)
        with self.timed("encode"):
            data, note = media.encode_output(frame, decoded, ext, m.photo_quality, m.photo_scale)
        with self.timed("write"):
            digest = self._write(root_fd, data, ItemStatus.OK, len(chosen))
        return Outcome(ItemStatus.OK, item.output, len(chosen), digest, note)

    def _store(self) -> Objects:
        if self.engine.objects is None:  # connect() makes one whenever the manifest names an object
            raise ItemError("the store is not configured for this job")
        return self.engine.objects

    def _write(self, root_fd: int, data: bytes, status: ItemStatus, count: int) -> safefs.Digest:
        """Commit the output: a rename on the data volume, a PUT in the store (s3io.py)."""
        eng, item = self.engine, self.item
        journal, overwrite = self._journal(status, count), eng.manifest.overwrite
        if is_s3(item.output):
            return self._store().commit(item.output, data, item.id, eng.attempt, overwrite, journal)
        return eng.outputs().write(root_fd, item.output, data, overwrite, journal)

    def _journal(self, status: ItemStatus, count: int) -> Callable[[safefs.Digest], None]:
        """What the commit does just before the rename or PUT: the fence, then the engine's journal."""
        journal, item = self.engine.journal, self.item

        def before(d: safefs.Digest) -> None:
            self._fence(d)
            if journal is not None:
                journal(Intent(item.id, item.output, status, count, d.size, d.sha256))

        return before

    def _fence(self, _: safefs.Digest | None = None) -> None:
        """Superseded (the item unrecorded, its temporary output removed) once a later attempt of
        the chunk has started: that attempt commits the item."""
        if (why := self.engine.superseded()) is not None:
            raise Superseded(why)

    def _select(self, image: np.ndarray, found: list[faces.Face]) -> list[faces.Face]:
        """The job's faces and selector (selector.py), for a photo and for each frame of a video."""

        model = self.engine.genderage

        def embed(img: np.ndarray, kept: Sequence[faces.Face]) -> np.ndarray:
            with self.timed("embed"):
                return faces.embed(self.engine.recognizer, img, kept)

        def judge(img: np.ndarray, kept: Sequence[faces.Face]) -> list[tuple[int, int]]:
            assert model is not None  # selector.matching asks only when it is loaded
            with self.timed("detect"):  # judging gender and age is part of finding the faces to change
                return model.judge(img, kept)

        return selector.choose(image, found, self.engine.manifest, judge if model else None, embed)


@dataclass
class _Stage:
    run: _ItemRun
    name: str
    t: float = 0.0

    def __enter__(self) -> None:
        self.t = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.run.add(self.name, time.perf_counter() - self.t)


def process_one(engine: Engine, item: Item) -> ItemResult:
    return _ItemRun(engine, item).run()


def run_items(
    engine: Engine,
    items: Iterable[Item],
    inflight: int,
    on_result: Callable[[ItemResult], None],
    superseded: Callable[[], str | None] = lambda: None,
) -> None:
    """Process ``items`` with up to ``inflight`` at once; ``on_result`` runs on this thread. Before
    each item is taken, ``superseded`` says why no more may be (a later attempt of the chunk has
    started; the engine's fence asks the same before each commit): then the items in flight end,
    those that committed are recorded (the others commit nothing), and Superseded is raised."""
    pending = list(items)
    if inflight <= 1 or len(pending) == 1:
        for item in pending:
            if (why := superseded()) is not None:
                raise Superseded(why)
            on_result(process_one(engine, item))
        return
    queue = iter(pending)
    pool = cf.ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="item")
    running: set[cf.Future[ItemResult]] = set()
    stopped: str | None = None
    fenced: str | None = None  # an item in flight that committed nothing
    try:
        for item in queue:
            running.add(pool.submit(process_one, engine, item))
            if len(running) >= inflight:
                break
        while running:
            done, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in done:
                try:
                    on_result(future.result())  # re-raises a chunk-level error (or Terminated)
                except Superseded as e:  # its commit was fenced off; the others in flight still end
                    stopped = fenced = stopped or str(e)
                stopped = stopped or superseded()
                nxt = None if stopped is not None else next(queue, None)
                if nxt is not None:
                    running.add(pool.submit(process_one, engine, nxt))
        if fenced is not None or (stopped is not None and next(queue, None) is not None):
            raise Superseded(stopped)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
