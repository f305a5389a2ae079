"""One chunk attempt: read the manifest, load models once, run every item, write one result line each.

Idempotence is what makes retries cheap and safe: an item whose ok/no_face line is already in the
results file (and whose output still exists) is not redone, only re-acknowledged with
``cached: true``. Outputs appear by rename only, so a killed attempt leaves either the old state or
a complete file, and the result line is written after the output is in place.

Exit: 0 when every item is ok/no_face (cached included), 3 when some items failed on their own.
Chunk-level problems raise errors.RunnerError subclasses that ``__main__`` maps to exit codes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from . import faces, log, media, models, swap
from .errors import BadManifest, ItemError, MissingInput, Temporary
from .manifest import ENV_GPU, FaceSelection, Item, ItemResult, ItemStatus, Manifest, NoFacePolicy, RunnerExit
from .volume import DataRoot, ResultsLog, committed, is_volume_error, previous_results, read_manifest

SUPPORTED_PROCESSORS = ("face_swapper",)
STAGES = ("decode", "detect", "embed", "swap", "paste", "encode", "write")


@dataclass(frozen=True)
class Invocation:
    """Everything the process was told: manifest location, attempt, where /data is, its GPU."""

    manifest: str
    attempt: int
    root: DataRoot
    gpu: str | None


def invocation_from_env(
    env: Mapping[str, str], manifest: str | None, attempt: int, data_root: str | None
) -> Invocation:
    return Invocation(
        manifest=manifest or "",
        attempt=attempt,
        root=DataRoot.from_env(env, data_root),
        gpu=env.get(ENV_GPU) or None,
    )


def run_attempt(inv: Invocation, sink: log.TeeSink) -> RunnerExit:
    """The whole attempt. Raises RunnerError (or ManifestError) for chunk-level endings."""
    log.bind(attempt=inv.attempt, gpu=inv.gpu)
    manifest = read_manifest(inv.root, inv.manifest)
    log.bind(job=manifest.job, chunk=manifest.chunk)
    logger = log.get()
    why_not = sink.attach(inv.root.path(manifest.log_path(inv.attempt)))
    if why_not:
        logger.warning("log file not writable; logging to stdout only", reason=why_not)
    if manifest.processors != SUPPORTED_PROCESSORS:
        # Skipping a processor silently would hand back outputs that look finished but are not.
        raise BadManifest(f"processors {list(manifest.processors)} not supported by this runner (only face_swapper)")
    logger.info(
        "attempt started",
        items=len(manifest.items),
        faces=manifest.faces.value,
        no_face=manifest.no_face.value,
        providers=list(manifest.providers),
    )

    results_path = inv.root.path(manifest.results_path)
    done = committed(previous_results(results_path))
    with ResultsLog(results_path) as results:
        pending: list[Item] = []
        for item in manifest.items:
            prior = _reusable(inv.root, item, done.get(item.id))
            if prior is None:
                pending.append(item)
            else:
                now = time.time()
                results.append(
                    ItemResult(
                        item=item.id,
                        status=prior.status,
                        attempt=inv.attempt,
                        input=item.input,
                        output=prior.output,
                        reason=prior.reason,
                        faces=prior.faces,
                        cached=True,
                        gpu=inv.gpu,
                        provider=prior.provider,
                        started=now,
                        finished=now,
                    )
                )
        if len(pending) < len(manifest.items):
            logger.info("items already done by an earlier attempt", cached=len(manifest.items) - len(pending))
        failed = _run_pending(inv, manifest, pending, results, logger) if pending else 0
    logger.info("attempt finished", items=len(manifest.items), failed=failed, cached=len(manifest.items) - len(pending))
    return RunnerExit.ITEMS_FAILED if failed else RunnerExit.OK


def _reusable(root: DataRoot, item: Item, prior: ItemResult | None) -> ItemResult | None:
    if prior is None:
        return None
    if prior.output is None:
        return prior if prior.status is ItemStatus.NO_FACE else None
    if prior.output != item.output or not root.path(prior.output).is_file():
        return None
    return prior


def _run_pending(inv: Invocation, manifest: Manifest, pending: list[Item], results: ResultsLog, logger: Any) -> int:
    t0 = time.perf_counter()
    pack = models.verify_pack(inv.root.path(manifest.pack_dir))
    t_verify = time.perf_counter() - t0
    loaded = models.load_models(
        pack, manifest.providers, det_size=manifest.detector_size, det_thresh=manifest.detector_threshold
    )
    cv2.setNumThreads(loaded.threads)
    log.bind(provider=loaded.provider)
    for note in loaded.notes:
        logger.warning("provider fallback", reason=note)
    t_load = time.perf_counter() - t0 - t_verify
    logger.info(
        "models loaded",
        pack=str(pack.dir),
        standin=pack.standin,
        provider=loaded.provider,
        gpu=inv.gpu,
        threads=loaded.threads,
        verify_s=round(t_verify, 3),
        load_s=round(t_load, 3),
    )
    identity = source_identity(inv.root, manifest, loaded, logger)
    ctx = _Context(inv, manifest, loaded, swap.Swapper(loaded.swapper, identity))
    failed = 0
    for item in pending:
        result = ctx.process(item)
        results.append(result)
        failed += result.status.is_failure()
        logger.info(
            "item",
            item=item.id,
            status=result.status.value,
            faces=result.faces,
            reason=result.reason,
            seconds=round(result.finished - result.started, 4),
        )
    return failed


def source_identity(root: DataRoot, manifest: Manifest, loaded: models.Models, logger: Any) -> np.ndarray:
    """The source identity: from the manifest when the controller computed it at submit (the
    identity subcommand), else embedded here once: the largest face of each photo, averaged."""
    if manifest.source_embedding is not None:
        given: np.ndarray = faces.normalise_rows(np.asarray(manifest.source_embedding, np.float32).reshape(1, -1))[0]
        return given
    embeddings = []
    for src in manifest.source:
        try:
            decoded = media.read_image(root.path(src), manifest.limits)
        except ItemError as e:
            raise MissingInput(f"source photo {src}: {e}") from e
        except OSError as e:
            if is_volume_error(e):
                raise Temporary(f"source photo {src}: {e.strerror or e}") from e
            raise MissingInput(f"source photo {src}: {e.strerror or e}") from e
        found = faces.detect(loaded.detector, decoded.image)
        if not found:
            raise MissingInput(f"source photo {src}: no face detected")
        if len(found) > 1:
            logger.warning("source photo has several faces; using the largest", source=src, faces=len(found))
        chosen = faces.select(found, FaceSelection.ONE)
        embeddings.append(faces.embed(loaded.recognizer, decoded.image, chosen)[0])
    return faces.identity(embeddings)


@dataclass
class _Context:
    inv: Invocation
    manifest: Manifest
    models: models.Models
    swapper: swap.Swapper
    timings: dict[str, float] = field(default_factory=dict)
    current: str = "prepare"  # the stage running now: an error's reason names its file

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.current = name
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] += time.perf_counter() - t

    def process(self, item: Item) -> ItemResult:
        self.timings = dict.fromkeys(STAGES, 0.0)
        self.current = "prepare"
        started = time.time()
        status, output, reason, count = ItemStatus.ERROR, None, None, 0
        try:
            status, output, count = self._process(item)
        except ItemError as e:
            reason = f"{self._concerned(item)}: {e}"
        except OSError as e:
            if is_volume_error(e):
                raise Temporary(f"{self._concerned(item)}: shared volume error: {e.strerror or e}") from e
            verb = "cannot write output" if self._concerned(item) == item.output else "cannot read"
            reason = f"{self._concerned(item)}: {verb}: {e.strerror or e}"
        return ItemResult(
            item=item.id,
            status=status,
            attempt=self.inv.attempt,
            input=item.input,
            output=output,
            reason=reason,
            faces=count,
            gpu=self.inv.gpu,
            provider=self.models.provider,
            started=started,
            finished=time.time(),
            timings={k: round(v, 6) for k, v in self.timings.items()},
        )

    def _select(self, image: np.ndarray, found: list[faces.Face]) -> list[faces.Face]:
        m = self.manifest
        if m.faces is not FaceSelection.REFERENCE:
            return faces.select(found, m.faces)
        assert m.reference_embedding is not None  # the manifest refuses reference without it
        with self.stage("embed"):
            embeddings = faces.embed(self.models.recognizer, image, found)
        return faces.by_reference(found, embeddings, np.asarray(m.reference_embedding), m.reference_distance)

    def _concerned(self, item: Item) -> str:
        """The file a failure is about: the output while preparing, encoding or writing it."""
        return item.output if self.current in ("prepare", "encode", "write") else item.input

    def _process(self, item: Item) -> tuple[ItemStatus, str | None, int]:
        root, policy = self.inv.root, self.manifest.no_face
        ext = media.check_output_format(item.output)
        out = root.path(item.output)
        media.remove_stale_temps(out)
        with self.stage("decode"):
            decoded = media.read_image(root.path(item.input), self.manifest.limits)
        with self.stage("detect"):
            found = faces.detect(self.models.detector, decoded.image)
        chosen = self._select(decoded.image, found) if found else []
        if not chosen:  # no face, or (faces: reference) none of the reference person
            if policy is NoFacePolicy.FAIL:
                raise ItemError("no face detected" if not found else "no face matches the reference")
            if policy is NoFacePolicy.SKIP:
                return ItemStatus.NO_FACE, None, 0
            with self.stage("write"):
                media.atomic_write(out, decoded.data)
            return ItemStatus.NO_FACE, item.output, 0
        frame = decoded.image
        with self.stage("swap"):
            swapped = [self.swapper.swap(frame, f) for f in chosen]
        with self.stage("paste"):
            for s in swapped:
                swap.paste_back(frame, s)
        with self.stage("encode"):
            data = media.encode_image(frame, ext)
        with self.stage("write"):
            media.atomic_write(out, data)
        return ItemStatus.OK, item.output, len(chosen)
