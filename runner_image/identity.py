"""``python -m runner_image identity``: embed a job's source (and reference) photos once, at submit.

The controller runs this as a one-shot service (same image, hardening and volume as chunk services)
and copies the answer into every chunk manifest. Doing it once means every chunk and every video
segment swaps in exactly the same identity and selects by exactly the same reference, and a source
photo without a face (or with several) is a submit-time error naming the file, not a chunk failure.

The answer (contract/identity.py IdentityResult) is always written to the request's ``output`` when the request
itself could be read: with the embeddings, or with ``error`` saying which photo is wrong and why
(then the exit code is 66).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from contract.errors import ManifestError
from contract.exits import RunnerExit
from contract.identity import IdentityRequest, IdentityResult, SourceFaces
from contract.identity_table import MAX_ERROR, Identity
from contract.layout import RunLayout
from contract.manifest import FaceSelection, Limits
from contract.paths import user_path
from contract.s3 import is_s3

from . import align, faces, log, media, models, objects
from .errors import BadManifest, ItemError, MissingInput, Temporary
from .volume import DataRoot

IDENTITY_ROLES = ("detector", "recognizer")


def read_request(root: DataRoot, given: str) -> IdentityRequest:
    """Parse the request; a missing file is 66 (75 when its folder is gone: volume trouble)."""
    if not given:
        raise BadManifest("no identity request given (pass --request)")
    path = root.manifest_location(given)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise Temporary(f"identity request {given}: folder {path.parent} is absent (volume?)") from None
        raise MissingInput(f"identity request {given} not found") from None
    except UnicodeDecodeError as e:
        raise BadManifest(f"identity request {given} is not UTF-8 text: {e}") from e
    except OSError as e:
        raise Temporary(f"cannot read identity request {given}: {e.strerror or e}") from e
    return IdentityRequest.from_json(text)


def _photo_faces(
    root: DataRoot, limits: Limits, loaded: models.Models, path: str, store: objects.Objects | None = None
) -> tuple[Any, list[Any]]:
    decoded = objects.read_photo(root, store, path, limits)
    return decoded.image, faces.detect(loaded.detector, decoded.image)


def compute(
    root: DataRoot, req: IdentityRequest, loaded: models.Models, logger: Any, store: objects.Objects | None = None
) -> IdentityResult:
    """Embed every source (exactly one face each) and the reference (its largest face). ``error``
    names each photo as the user wrote it (contract/paths.py user_path): it is the job file's error."""
    errors: list[str] = []
    embeddings: list[np.ndarray] = []
    counts: list[SourceFaces] = []
    people = compute_people(root, req.limits, req.identities, loaded, store) if req.identities else {}
    for src in req.sources:
        shown = user_path(src)
        try:
            image, found = _photo_faces(root, req.limits, loaded, src, store)
        except ItemError as e:
            errors.append(f"source photo {shown}: {e}")
            counts.append(SourceFaces(path=src, faces=0))
            continue
        counts.append(SourceFaces(path=src, faces=len(found)))
        if not found:
            errors.append(f"source photo {shown}: no face detected")
        elif len(found) > 1:
            errors.append(f"source photo {shown}: {len(found)} faces found; a source photo must show one person only")
        else:
            embeddings.append(faces.embed(loaded.recognizer, image, found)[0])
    reference: tuple[float, ...] | None = None
    if req.reference is not None:
        try:
            image, found = _photo_faces(root, req.limits, loaded, req.reference, store)
            if not found:
                errors.append(f"reference photo {user_path(req.reference)}: no face detected")
            else:
                if len(found) > 1:
                    logger.warning("reference photo has several faces; using the largest", faces=len(found))
                chosen = faces.select(found, FaceSelection.ONE)
                reference = tuple(float(v) for v in faces.embed(loaded.recognizer, image, chosen)[0])
        except ItemError as e:
            errors.append(f"reference photo {user_path(req.reference)}: {e}")
    if errors:
        return IdentityResult(sources=tuple(counts), error="; ".join(errors), provider=loaded.provider)
    if people:
        failed = sum(p.error is not None for p in people.values())
        if failed:
            logger.warning("sources without exactly one face: only their pairs fail", people=failed)
        return IdentityResult(reference_embedding=reference, provider=loaded.provider, identities=people)
    identity = faces.identity(embeddings)
    return IdentityResult(
        source_embedding=tuple(float(v) for v in identity),
        reference_embedding=reference,
        sources=tuple(counts),
        provider=loaded.provider,
    )


EMBED_BATCH = 32  # face crops per recognizer run


def compute_people(
    root: DataRoot,
    limits: Limits,
    table: Mapping[str, Identity],
    loaded: models.Models,
    store: objects.Objects | None = None,
) -> dict[str, Identity]:
    """Each person's embedding (a job with ``pairs``): every distinct photo read and detected once,
    the crops of all of them embedded in batches, each person's photos averaged as for one job's
    sources. A person with a photo that has no face, several, or cannot be read gets ``error``
    instead, naming the photo as the user wrote it: only the items using it fail."""
    size = int(loaded.recognizer.input_size[0])
    crops: dict[str, np.ndarray] = {}
    problems: dict[str, str] = {}
    for path in sorted({p for person in table.values() for p in person.sources}):
        shown = user_path(path)
        try:
            image, found = _photo_faces(root, limits, loaded, path, store)
        except ItemError as e:
            problems[path] = f"source photo {shown}: {e}"
            continue
        if not found:
            problems[path] = f"source photo {shown}: no face detected"
        elif len(found) > 1:
            problems[path] = f"source photo {shown}: {len(found)} faces found; a source photo must show one person only"
        else:
            crops[path] = align.crop(image, found[0].kps, size)[0]
    vectors = dict(zip(crops, embed_batched(loaded.recognizer, list(crops.values())), strict=True))
    out: dict[str, Identity] = {}
    for pid, person in table.items():
        bad = [problems[p] for p in person.sources if p in problems]
        if bad:
            out[pid] = Identity(person.sources, error="; ".join(bad)[:MAX_ERROR])
            continue
        mean = faces.identity([vectors[p] for p in person.sources])
        out[pid] = Identity(person.sources, embedding=tuple(float(v) for v in mean))
    return out


def embed_batched(recognizer: Any, crops: list[np.ndarray]) -> list[np.ndarray]:
    """L2-normalised embeddings of aligned crops, EMBED_BATCH per run (one at a time for a model
    whose batch size is fixed)."""
    fixed = recognizer.session.get_inputs()[0].shape[0]
    batch = 1 if isinstance(fixed, int) else EMBED_BATCH
    out: list[np.ndarray] = []
    for start in range(0, len(crops), batch):
        part = crops[start : start + batch]
        feats = np.asarray(recognizer.get_feat(part), dtype=np.float32).reshape(len(part), -1)
        out.extend(faces.normalise_rows(feats))
    return out


def run_identity(root: DataRoot, given: str, sink: log.TeeSink) -> RunnerExit:
    """The whole subcommand; RunnerError/ManifestError propagate to ``__main__`` as exit codes."""
    logger = log.get()
    try:
        req = read_request(root, given)
    except ManifestError as e:
        raise BadManifest(f"identity request {given}: {e}") from e
    log.bind(job=req.job, chunk="identity")
    out = root.path(req.output)
    why_not = sink.attach(root.path(str(RunLayout.container(req.job).identity_log)))
    if why_not:
        logger.warning("log file not writable; logging to stdout only", reason=why_not)
    pack = models.verify_pack(root.path(req.pack_dir), (), user_path(req.pack_dir))
    loaded = models.load_models(
        pack, req.providers, det_size=req.detector_size, det_thresh=req.detector_threshold, roles=IDENTITY_ROLES
    )
    photos = [*req.sources, *([req.reference] if req.reference else [])]
    photos += [p for person in req.identities.values() for p in person.sources]
    try:
        store = objects.connect(root, req.storage, [p for p in photos if is_s3(p)], req.job)
        result = compute(root, req, loaded, logger, store)
    except MissingInput as e:  # the store refused the credentials or a bucket: the job's error, answered
        result = IdentityResult(error=str(e), provider=loaded.provider)
    try:
        media.atomic_write(out, result.to_json().encode("utf-8"))
    except OSError as e:
        raise Temporary(f"cannot write {user_path(req.output)}: {e.strerror or e}") from e
    if result.error:
        logger.error("identity failed", error=result.error, exit_code=int(RunnerExit.MISSING_INPUT))
        return RunnerExit.MISSING_INPUT
    logger.info(
        "identity written",
        output=req.output,
        sources=len(req.sources),
        people=len(req.identities),
        reference=req.reference,
    )
    return RunnerExit.OK
