"""A job resolved on a data root: globs expanded, outputs named, escapes and collisions refused,
outputs fenced (controller/job/fence.py: reserved areas, inputs, existing files, other jobs' claims)."""

from __future__ import annotations

import os
import string
from dataclasses import dataclass
from pathlib import Path

from contract.layout import RunLayout
from contract.manifest import FaceSelection
from controller.errors import JobFileError, MissingInputError
from controller.job import claims, fence, owners
from controller.job.paths import Resolver, resolve_inside
from controller.job.spec import (
    DISTINCT_PLACEHOLDERS,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    JobSpec,
    TargetKind,
    expand_output,
    item_field,
    target_kind,
)


@dataclass(frozen=True)
class Target:
    """One matched input and where its output goes; host paths are real (symlink-free). Kept as
    strings (a Path per target costs ~1 s per 100,000 targets); ``input``/``output`` give Paths."""

    index: int  # 0-based, in the order of the globs, sorted within each
    input_host: str
    rel: str  # posix, relative to the data root
    output_host: str
    output_rel: str
    kind: TargetKind

    @property
    def input(self) -> Path:
        return Path(self.input_host)

    @property
    def output(self) -> Path:
        return Path(self.output_host)


@dataclass(frozen=True)
class ResolvedJob:
    sources: tuple[Path, ...]
    reference: Path | None
    targets: tuple[Target, ...]


def resolve_job(
    spec: JobSpec, data_root: Path, file: str, *, job_id: str | None = None, tenant: str | None = None
) -> ResolvedJob:
    """Expand globs and outputs under ``data_root``; refuse escapes, collisions and missing inputs.

    ``job_id`` fills ``{job}`` (default: the job's name; ``--new`` gives ``name-2`` …). ``tenant``:
    the owner of an API job (controller/job/owners.py); its inputs and outputs must then all lie,
    symlinks resolved, in ``tenants/<tenant>/`` (controller/job/fence.py).
    """
    root = Path(os.path.abspath(data_root))
    area = owners.area_rel(tenant) if tenant is not None else None
    resolver = Resolver(root, listings=True)  # one folder read per folder, not 2 stats per path
    n = len(spec.source)
    sources = tuple(_existing(root, s, item_field("source", i, n), file) for i, s in enumerate(spec.source))
    reference = None  # unused, so not looked for, unless faces: reference
    if spec.faces is FaceSelection.REFERENCE and spec.reference is not None:
        reference = _existing(root, spec.reference, "reference", file)
    for i, source in enumerate(sources):
        fence.check_input_area(resolver.relative(str(source)), item_field("source", i, n), file, area)
    if reference is not None:
        fence.check_input_area(resolver.relative(str(reference)), "reference", file, area)
    matches = _match_targets(spec, file, resolver)
    names = {name for _, name, _, _ in string.Formatter().parse(spec.output) if name}
    if len(matches) > 1 and not names & set(DISTINCT_PLACEHOLDERS):
        reason = f"{spec.output!r} needs {{stem}}, {{name}} or {{index}}: the targets match {len(matches)} files"
        raise JobFileError(file, "output", reason)
    inputs = {p for p, _ in matches} | {str(s) for s in sources} | ({str(reference)} if reference else set())
    written: dict[str, str] = {}
    written_real: dict[str, str] = {}  # output, relative → its real host path
    targets: list[Target] = []
    job = job_id or spec.name
    for index, (path, kind) in enumerate(matches):
        rel = resolver.relative(path)
        fence.check_input_area(rel, "targets", file, area)
        try:
            out_text = expand_output(spec.output, rel, index=index, job=job)
            out = resolver.inside_str(out_text, what="output")
        except ValueError as e:
            raise JobFileError(file, "output", f"for {rel!r}: {e}") from None
        out_rel = resolver.relative(out)
        fence.check_area(out_rel, rel, file, area)
        if out in inputs:
            fence.check_not_input(out_rel, rel, {out_rel}, file)
        if out in written:
            raise JobFileError(file, "output", f"{written[out]!r} and {rel!r} would both write {out_rel}")
        if resolver.isdir(out):
            raise JobFileError(file, "output", f"{rel!r} would be written to {out_rel}, which is a folder")
        if target_kind(out_rel) is not kind:
            raise JobFileError(file, "output", f"{rel!r} is a {kind.value} but its output {out_rel} is not")
        written[out] = rel
        written_real[out_rel] = out
        targets.append(Target(index, path, rel, out, out_rel, kind))
    outputs = [t.output_rel for t in targets]
    if not (root / RunLayout.relative(job).plan).is_file():  # a new run, not the continuation of one
        if not spec.overwrite:
            fence.check_overwrite(outputs, lambda r: resolver.isfile(written_real[r]), file)
        taken = claims.conflict(root, job, outputs)
        if taken is not None:
            raise JobFileError(file, "output", claims.refusal(*taken))
    return ResolvedJob(sources=sources, reference=reference, targets=tuple(targets))


def _existing(root: Path, rel: str, f: str, file: str) -> Path:
    try:
        path = resolve_inside(root, rel, what=f)
    except ValueError as e:
        raise JobFileError(file, f, str(e)) from None
    if not path.exists():
        raise MissingInputError(f"{file}: {f}: {rel!r} does not exist under {root}")
    if not path.is_file():
        raise JobFileError(file, f, f"{rel!r} is a folder, not a photo")
    return path


def _match_targets(spec: JobSpec, file: str, resolver: Resolver) -> list[tuple[str, TargetKind]]:
    seen: set[str] = set()
    matches: list[tuple[str, TargetKind]] = []
    for i, pattern in enumerate(spec.targets):
        f = item_field("targets", i, len(spec.targets))
        try:
            found = resolver.glob(pattern)
        except ValueError as e:
            raise JobFileError(file, f, str(e)) from None
        if not found:
            raise JobFileError(file, f, f"{pattern!r} matches no file under {resolver.root}")
        for path in found:
            if path in seen:
                continue
            kind = target_kind(path)
            if kind is None:
                rel = resolver.relative(path)
                supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
                raise JobFileError(file, f, f"{rel!r} is neither an image nor a video (supported: {supported})")
            seen.add(path)
            matches.append((path, kind))
    return matches
