"""One chunk attempt: read the manifest, load models once, run every item, write one result line each.

Idempotence is what makes retries cheap and safe: an item whose ok/no_face line is already in a
results file of this chunk (any attempt) and whose output still has the size and sha256 that line
records is not redone, only re-acknowledged with ``cached: true`` (or that the commit journal,
``results/<chunk>.a<n>.commits``, recorded just before the rename of an attempt killed before its
result line). An output that exists without such a record was not written by this job: the item
fails, naming it, unless the job says ``overwrite: true``. Outputs appear by rename only, so a killed
attempt leaves either the old state or a complete file, and the result line is written after the
output is in place.

Exit: 0 when every item is ok/no_face (cached included), 3 when some items failed on their own.
Chunk-level problems raise errors.RunnerError subclasses that ``__main__`` maps to exit codes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from contract import processors as registry
from contract.errors import ManifestError
from contract.exits import RunnerExit
from contract.identity import IdentityResult
from contract.identity_table import Identity
from contract.manifest import ENV_GPU, FaceSelection, Item, Manifest
from contract.paths import user_path
from contract.results import ItemResult, ItemStatus

from . import faces, identity, log, models, objects, pipeline, processors, reuse, safefs, selector
from .errors import ItemError, MissingInput, Temporary
from .record import AttemptRecorder
from .volume import (
    DataRoot,
    ResultsLog,
    committed,
    is_volume_error,
    previous_results,
    read_journal,
    read_manifest,
)

STAGES = pipeline.STAGES
# The models of this process's last chunk, by what loaded them: a lingering runner's next chunk of the
# same kind (contract/handoff.py) runs on them without verifying and loading the pack again.
_KEPT: dict[tuple[Any, ...], tuple[Any, models.Models]] = {}


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


def run_attempt(inv: Invocation, sink: log.TeeSink, recorder: AttemptRecorder | None = None) -> RunnerExit:
    """The whole attempt. Raises RunnerError (or ManifestError) for chunk-level endings; the caller
    writes the ending into ``recorder`` (the attempt record, record.py)."""
    recorder = AttemptRecorder() if recorder is None else recorder
    log.bind(attempt=inv.attempt, gpu=inv.gpu)
    manifest = read_manifest(inv.root, inv.manifest)
    log.bind(job=manifest.job, chunk=manifest.chunk)
    logger = log.get()
    recorder.begin(inv.root, manifest, inv.attempt, logger)
    why_not = sink.attach(inv.root.path(manifest.log_path(inv.attempt)))
    if why_not:
        logger.warning("log file not writable; logging to stdout only", reason=why_not)
    logger.info(
        "attempt started",
        items=len(manifest.items),
        faces=manifest.faces.value,
        no_face=manifest.no_face.value,
        providers=list(manifest.providers),
    )

    store = objects.connect(inv.root, manifest.storage, manifest.s3_urls(), manifest.job)
    if store is not None:  # a missing or forbidden output bucket ends the chunk now (66), before any work
        store.check_buckets(i.output for i in manifest.items)
    earlier = previous_results(inv.root.path(str(manifest.layout.results_dir)), manifest.chunk)
    if earlier.dropped:
        logger.warning("unreadable result lines of earlier attempts ignored", dropped=earlier.dropped)
    done = committed(earlier)
    intents = read_journal(inv.root.path(str(manifest.layout.results_dir)), manifest.chunk)
    with ResultsLog(inv.root.path(manifest.results_path(inv.attempt))) as results, inv.root.fd() as root_fd:
        pending: list[Item] = []
        refused: list[str] = []
        for item in manifest.items:
            prior = reuse.decide(root_fd, store, manifest, item, done.get(item.id), intents.get(item.id, []))
            now = time.time()
            if prior.refused:
                refusal = f"{user_path(item.output)}: {safefs.EXISTS}"
                results.append(ItemResult(item.id, ItemStatus.ERROR, inv.attempt, item.input, None, refusal,
                                          gpu=inv.gpu, started=now, finished=now))  # fmt: skip
                recorder.count(failed=True)
                refused.append(item.id)
            elif prior.result is None:
                pending.append(item)
            else:
                # A commit only the journal knows of (its attempt was killed before its result line) is
                # recorded now for the first time: that line is the item's commit, not a cached one.
                p = prior.result
                results.append(ItemResult(item.id, p.status, inv.attempt, item.input, p.output, p.reason, p.faces,
                                          cached=prior.cached, gpu=inv.gpu, provider=p.provider, started=now,
                                          finished=now, size=p.size, sha256=p.sha256, note=p.note))  # fmt: skip
        cached = len(manifest.items) - len(pending) - len(refused)
        if cached:
            logger.info("items already done by an earlier attempt", cached=cached)
        if refused:
            logger.warning("outputs exist that this job did not write", items=len(refused))
        recorder.count(done=cached)
        failed = _run_pending(inv, manifest, pending, results, logger, recorder, store) if pending else 0
    failed += len(refused)
    logger.info("attempt finished", items=len(manifest.items), failed=failed, cached=cached)
    return RunnerExit.ITEMS_FAILED if failed else RunnerExit.OK


def _run_pending(
    inv: Invocation,
    manifest: Manifest,
    pending: list[Item],
    results: ResultsLog,
    logger: Any,
    recorder: AttemptRecorder,
    store: objects.Objects | None = None,
) -> int:
    t0 = time.perf_counter()
    filters = selector.of(manifest).filters  # gender/age: the genderage model too
    pack_dir, shown = inv.root.path(manifest.pack_dir), user_path(manifest.pack_dir)
    mask_types = manifest.mask_types  # occlusion, region: the occluder, the face parser too
    swapper = manifest.swapper_model  # simswap_256, ghost_256: its embedding converter too
    roles = registry.roles(manifest.processors, filters=filters, masks=mask_types, swapper=swapper)
    lingering = manifest.linger > 0
    key = (str(pack_dir), _pack_files(pack_dir), manifest.processors, manifest.providers, manifest.detector_size,
           manifest.detector_threshold, tuple(roles), swapper, filters, mask_types) if lingering else ()  # fmt: skip
    # a lingering runner's models from its earlier chunk (contract/handoff.py), its pack's files unchanged
    kept = _KEPT.get(key) if lingering else None
    if kept is not None:
        pack, loaded = kept
        t_verify = 0.0
    else:
        _KEPT.clear()
        pack = models.verify_pack(
            pack_dir, manifest.processors, shown, filters=filters, masks=mask_types, swapper=swapper
        )
        t_verify = time.perf_counter() - t0
        loaded = models.load_models(
            pack,
            manifest.providers,
            det_size=manifest.detector_size,
            det_thresh=manifest.detector_threshold,
            roles=roles,
            swapper_model=swapper,
        )
        if lingering:
            _KEPT[key] = (pack, loaded)
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
        # the cold start: exec, imports, verify, load (a lingering runner's next chunk: none but this attempt's)
        process_s=(cold_start := log.process_age() if kept is None else round(time.time() - recorder.started, 3)),
        kept=kept is not None,
    )
    recorder.models_loaded(loaded.provider, loaded.threads, cold_start, logger)
    manifest = await_identity(inv.root, manifest, logger)
    people, refused = people_processors(inv.root, manifest, loaded, logger, store)
    chain: tuple[processors.Processor, ...] = ()
    if not manifest.identities:  # version 1: one person for every item
        vector = source_identity(inv.root, manifest, loaded, logger, store)
        chain = tuple(processors.build(manifest, loaded, vector))
    journal = ResultsLog(inv.root.path(str(manifest.layout.commits(manifest.chunk, inv.attempt))))
    later = inv.root.path(str(manifest.layout.results(manifest.chunk, inv.attempt + 1)))

    def superseded() -> str | None:
        """The controller makes each attempt's results file before its service: once the next
        attempt's is there, this one was given up."""
        if not os.path.lexists(later):
            return None
        return f"attempt {inv.attempt + 1} of chunk {manifest.chunk} has started: this attempt commits no more"

    engine = pipeline.Engine(
        root=inv.root,
        manifest=manifest,
        detector=loaded.detector,
        recognizer=loaded.recognizer,
        processors=chain,
        people=people,
        refused=refused,
        attempt=inv.attempt,
        gpu=inv.gpu,
        provider=loaded.provider,
        writer=safefs.Writer(manifest.job, manifest.chunk, inv.attempt),
        journal=lambda intent: journal.append_line(intent.to_line()),
        objects=store,
        genderage=loaded.genderage,
        superseded=superseded,
    )
    failed = 0

    def record(result: ItemResult) -> None:
        nonlocal failed
        results.append(result)
        failed += result.status.is_failure()
        recorder.count(done=not result.status.is_failure(), failed=result.status.is_failure())
        logger.info(
            "item",
            item=result.item,
            status=result.status.value,
            faces=result.faces,
            reason=result.reason,
            seconds=round(result.finished - result.started, 4),
        )

    with journal:
        pipeline.run_items(engine, pending, inflight(loaded.provider, loaded.threads), record, superseded)
    return failed


def _pack_files(pack_dir: Any) -> tuple[tuple[str, int, int, int], ...]:
    """Each file of the pack folder as it is now (name, size, mtime, inode; links not followed)."""
    try:
        with os.scandir(pack_dir) as entries:
            files = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
    except OSError:
        return ()
    return tuple(sorted((n, st.st_size, st.st_mtime_ns, st.st_ino) for n, st in files))


def inflight(provider: str, threads: int) -> int:
    """Items in progress at once. On CUDA: enough callers to keep the GPU busy while CPU threads
    decode/paste/encode. On CPU: one item per core (sessions run single-threaded, models.py), at
    least two so that one item's inference overlaps another's decode/paste/encode."""
    if provider == "cuda":
        return max(4, min(8, threads))
    return max(2, threads)


IDENTITY_POLL = 0.05  # seconds between reads of identity.json while the identity step runs


def await_identity(
    root: DataRoot,
    manifest: Manifest,
    logger: Any,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Manifest:
    """The manifest with the job's identity filled in. The first chunks start beside the submit-time
    identity step (controller/run/identity.py): their models are loaded by now, and they wait here for
    identity.json to stop saying "pending". Nothing is written before that, so a job whose identity
    fails leaves no output. A step that answers with an error is the job's input problem (66); one
    that never answers within identity_timeout is temporary (75: retried, and the controller will
    have re-run the step)."""
    if manifest.identities and all(p.embedding or p.error for p in manifest.identities.values()):
        return manifest
    if manifest.source_embedding is not None or manifest.identity is None:
        return manifest
    path, shown = root.path(manifest.identity), user_path(manifest.identity)
    start = clock()
    while True:
        try:
            result: IdentityResult | None = IdentityResult.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            result = None  # not written yet (or a folder made by hand): wait like for "pending"
        except ManifestError:
            result = None  # a half-visible copy on a network filesystem: read it again
        except OSError as e:
            if is_volume_error(e):
                raise Temporary(f"identity {shown}: {e.strerror or e}") from e
            raise MissingInput(f"identity {shown}: {e.strerror or e}") from e
        waited = clock() - start
        if result is not None and result.error:
            raise MissingInput(f"the job's identity step failed: {result.error}")
        if result is not None and not result.pending:
            if not result.answered:
                raise MissingInput(f"identity {shown} holds no source embedding")
            logger.info("identity ready", waited_s=round(waited, 3), provider=result.provider)
            if manifest.identities:
                return with_answers(manifest, result)
            return dataclasses.replace(
                manifest,
                source_embedding=result.source_embedding,
                reference_embedding=result.reference_embedding or manifest.reference_embedding,
            )
        if waited > manifest.identity_timeout:
            raise Temporary(f"identity {shown} still pending after {manifest.identity_timeout:.0f}s")
        sleep(IDENTITY_POLL)


def with_answers(manifest: Manifest, result: IdentityResult) -> Manifest:
    """A version 2 manifest with each of its people's embedding (or error) from the step's answer."""
    table = {}
    for pid, person in manifest.identities.items():
        answer = result.identities.get(pid)
        if answer is None or answer.sources != person.sources or not (answer.embedding or answer.error):
            answer = Identity(person.sources, error="the identity step gave no answer for these source photos")
        table[pid] = answer
    return dataclasses.replace(
        manifest,
        identities=table,
        reference_embedding=result.reference_embedding or manifest.reference_embedding,
    )


def people_processors(
    root: DataRoot, manifest: Manifest, loaded: models.Models, logger: Any, store: objects.Objects | None = None
) -> tuple[dict[str, tuple[processors.Processor, ...]], dict[str, str]]:
    """A version 2 manifest: the processors bound to each person's identity, and why a person has
    none (their items fail, naming the photo). People without an answer (a manifest made without
    the identity step) are embedded here, once each."""
    if not manifest.identities:
        return {}, {}
    table = dict(manifest.identities)
    missing = {k: v for k, v in table.items() if not (v.embedding or v.error)}
    if missing:
        table.update(identity.compute_people(root, manifest.limits, missing, loaded, store))
    refused = {k: v.error for k, v in table.items() if v.error}
    if refused:
        logger.warning("people without an identity: their items fail", people=len(refused))
    people = {}
    for pid, person in table.items():
        if person.embedding:
            vector = faces.normalise_rows(np.asarray(person.embedding, np.float32).reshape(1, -1))[0]
            people[pid] = tuple(processors.build(manifest, loaded, vector))
    return people, refused


def source_identity(
    root: DataRoot, manifest: Manifest, loaded: models.Models, logger: Any, store: objects.Objects | None = None
) -> np.ndarray:
    """The source identity: from the manifest when the controller computed it at submit (the
    identity subcommand), else embedded here once: the largest face of each photo, averaged."""
    if manifest.source_embedding is not None:
        given: np.ndarray = faces.normalise_rows(np.asarray(manifest.source_embedding, np.float32).reshape(1, -1))[0]
        return given
    embeddings = []
    for src in manifest.source:
        shown = user_path(src)
        try:
            decoded = objects.read_photo(root, store, src, manifest.limits)
        except ItemError as e:
            raise MissingInput(f"source photo {shown}: {e}") from e
        found = faces.detect(loaded.detector, decoded.image)
        if not found:
            raise MissingInput(f"source photo {shown}: no face detected")
        if len(found) > 1:
            logger.warning("source photo has several faces; using the largest", source=src, faces=len(found))
        chosen = faces.select(found, FaceSelection.ONE)
        embeddings.append(faces.embed(loaded.recognizer, decoded.image, chosen)[0])
    return faces.identity(embeddings)
