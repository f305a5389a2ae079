"""A job resolved on a data root: globs expanded, outputs named, escapes and collisions refused,
outputs fenced (controller/job/fence.py: reserved areas, inputs, existing files, other jobs' claims)."""

from __future__ import annotations

import glob
import os
import stat
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contract.layout import RunLayout
from contract.manifest import FaceSelection
from contract.s3 import S3Url, is_s3
from controller.errors import FfswarmError, JobFileError, MissingInputError
from controller.job import claims, fence, owners, pairs, remote
from controller.job.files import raise_all
from controller.job.locations import within
from controller.job.paths import Resolver
from controller.job.spec import (
    DISTINCT_PLACEHOLDERS,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    JobSpec,
    Pair,
    TargetKind,
    expand_output,
    item_field,
    target_kind,
)

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store

Photo = Path | S3Url  # a source photo: a real file under the data root, or an object (checked with HEAD)


@dataclass(frozen=True)
class Target:
    """One matched input and where its output goes; host paths are real (symlink-free); an object in
    the store is its ``s3://`` URL in both the host and the relative field. Kept as
    strings (a Path per target costs ~1 s per 100,000 targets); ``input``/``output`` give Paths."""

    index: int  # 0-based, in the order of the globs, sorted within each
    input_host: str
    rel: str  # posix, relative to the data root
    output_host: str
    output_rel: str
    kind: TargetKind
    identity: int | None = None  # a pairs job: its person, an index into ResolvedJob.identities

    @property
    def input(self) -> Path:
        return Path(self.input_host)

    @property
    def output(self) -> Path:
        return Path(self.output_host)


@dataclass(frozen=True)
class ResolvedJob:
    sources: tuple[Photo, ...]  # every source photo (a pairs job: of every person, each once)
    reference: Path | None
    targets: tuple[Target, ...]
    identities: tuple[tuple[Photo, ...], ...] = ()  # a pairs job: each distinct person's photos

    @property
    def uses_s3(self) -> bool:
        """Whether a runner of this job reads or writes the object store."""
        return any(isinstance(s, S3Url) for s in self.sources) or any(
            is_s3(t.rel) or is_s3(t.output_rel) for t in self.targets
        )


Match = tuple[str, TargetKind, str, int | None]  # real path, kind, output template, identity


def resolve_job(
    spec: JobSpec,
    data_root: Path,
    file: str,
    *,
    job_id: str | None = None,
    tenant: str | None = None,
    max_pairs: int | None = None,
    store: S3Store | None = None,
) -> ResolvedJob:
    """Expand globs and outputs under ``data_root``; refuse escapes, collisions and missing inputs.

    ``job_id`` fills ``{job}`` (default: the job's name; ``--new`` gives ``name-2`` …). ``tenant``:
    the owner of an API job (controller/job/owners.py); its inputs and outputs must then all lie,
    symlinks resolved, in ``tenants/<tenant>/`` (controller/job/fence.py), the rows of its
    ``pairs_file`` name paths relative to that area, and an output's ``{dir}`` is the target's folder
    there: as the API saw the job when it checked it with the area as the root. ``max_pairs``: the
    policy's targets maximum, which bounds reading a ``pairs_file`` and listing an ``s3://`` glob.
    ``store``: the object store (``storage.s3``); without one an ``s3://`` path is refused.
    """
    remote.check_allowed(spec, file, store=store, tenant=tenant)
    root = Path(os.path.abspath(data_root))
    area = owners.area_rel(tenant) if tenant is not None else None
    resolver = Resolver(root, listings=_many_paths(spec))  # many: one read per folder, not 2 stats per path
    identities: tuple[tuple[Photo, ...], ...] = ()
    matches: list[Match] = []
    n = len(spec.source)  # 0 for pairs: their photos are checked pair by pair
    if spec.uses_pairs:
        identities, matches = _resolve_pairs(spec, root, file, resolver, area, max_pairs, store)
        sources = tuple(dict.fromkeys(p for photos in identities for p in photos))
    else:
        sources = tuple(
            _source(resolver, store, s, item_field("source", i, n), file) for i, s in enumerate(spec.source)
        )
    reference = None  # unused, so not looked for, unless faces: reference
    if spec.faces is FaceSelection.REFERENCE and spec.reference is not None:
        reference = _existing(resolver, spec.reference, "reference", file)
    for i, source in enumerate(sources[:n]):
        if isinstance(source, S3Url):
            continue
        fence.check_input_area(resolver.relative(str(source)), item_field("source", i, n), file, area)
    if reference is not None:
        fence.check_input_area(resolver.relative(str(reference)), "reference", file, area)
    if not spec.uses_pairs:
        found = _match_targets(spec, file, resolver, store, max_pairs)
        matches = [(p, kind, spec.output, None) for p, kind in found]
        names = {name for _, name, _, _ in string.Formatter().parse(spec.output) if name}
        if len(matches) > 1 and not names & set(DISTINCT_PLACEHOLDERS):
            reason = f"{spec.output!r} needs {{stem}}, {{name}} or {{index}}: the targets match {len(matches)} files"
            raise JobFileError(file, "output", reason)
    inputs = {m[0] for m in matches} | {str(s) for s in sources} | ({str(reference)} if reference else set())
    written: dict[str, str] = {}
    written_real: dict[str, str] = {}  # output, relative → its real host path
    targets: list[Target] = []
    job = job_id or spec.name
    for index, (path, kind, template, person) in enumerate(matches):
        rel = path if is_s3(path) else resolver.relative(path)
        if not is_s3(path):
            fence.check_input_area(rel, "targets", file, area)
        try:
            # a tenant's {dir} is the target's folder in its area, as the API expanded it when it accepted the job
            out_text = expand_output(template, rel if area is None else within(area, rel), index=index, job=job)
            out = out_text if is_s3(out_text) else resolver.inside_str(out_text, what="output")
        except ValueError as e:
            raise JobFileError(file, "output", f"for {rel!r}: {e}") from None
        if is_s3(out):  # an object: no folder to check, claimed by its URL
            if out in written:
                raise JobFileError(file, "output", f"{written[out]!r} and {rel!r} would both write {out}")
            if out in inputs:
                raise JobFileError(file, "output", f"{rel!r} would be written to {out}, an input of this job")
            if target_kind(out) is not kind:
                raise JobFileError(file, "output", f"{rel!r} is a {kind.value} but its output {out} is not")
            written[out] = rel
            targets.append(Target(index, path, rel, out, out, kind, person))
            continue
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
        targets.append(Target(index, path, rel, out, out_rel, kind, person))
    outputs = [t.output_rel for t in targets]
    if not (root / RunLayout.relative(job).plan).is_file():  # a new run, not the continuation of one
        if not spec.overwrite:
            files = [r for r in outputs if not is_s3(r)]  # an object's owner is in its metadata: the runner's check
            fence.check_overwrite(files, lambda r: resolver.isfile(written_real[r]), file)
        taken = claims.conflict(root, job, outputs)
        if taken is not None:
            raise claims.Claimed(file, *taken)
    return ResolvedJob(sources=sources, reference=reference, targets=tuple(targets), identities=identities)


def _resolve_pairs(
    spec: JobSpec,
    root: Path,
    file: str,
    resolver: Resolver,
    area: str | None,
    max_pairs: int | None,
    store: S3Store | None,
) -> tuple[tuple[tuple[Photo, ...], ...], list[Match]]:
    """Each pair's photos and target found under the root (no glob), its output template, and its
    person: pairs whose photos are the same files share one. Every pair's problem is collected
    (up to pairs.SHOWN_ERRORS), each naming the pair (``pairs[3].source``, or the file's line)."""
    listed: tuple[Pair, ...] = spec.pairs
    lines: tuple[int, ...] = ()
    shown = ""
    if spec.pairs_file is not None:
        shown = spec.pairs_file
        try:
            real = resolver.inside_str(shown, what="pairs_file")
        except ValueError as e:
            raise JobFileError(file, "pairs_file", str(e)) from None
        fence.check_input_area(resolver.relative(real), "pairs_file", file, area)
        listed, lines, bad = pairs.read_file(root, shown, file, has_output=bool(spec.output), limit=max_pairs)
        raise_all(bad)
        if area is not None:  # a tenant's own file: its rows name paths in its area, as it wrote them
            listed = tuple(pairs.under_folder(area, p) for p in listed)

    def where(i: int, key: str) -> tuple[str, str]:
        """(field, reason prefix) naming pair ``i``'s ``key``."""
        return ("pairs_file", f"{shown} line {lines[i]}: {key}: ") if lines else (f"pairs[{i}].{key}", "")

    errors: list[FfswarmError] = []
    photos: dict[str, Photo] = {}
    people: dict[tuple[Photo, ...], int] = {}
    matches: list[Match] = []
    for i, pair in enumerate(listed):
        if len(errors) > pairs.SHOWN_ERRORS:
            break
        try:
            if lines:
                remote.check_pair(pair, where, i, file, store=store, tenant=area)
            source = where(i, "source")
            person = tuple(_photo(root, resolver, photos, s, *source, file, area, store) for s in pair.source)
            if is_s3(pair.target):
                assert store is not None  # remote.check_allowed / refuse
                path, kind = remote.list_targets(store, pair.target, *where(i, "target")[:1], file, 1)[0]
            else:
                path, kind = _pair_target(resolver, pair.target, *where(i, "target"), file, area)
        except (JobFileError, MissingInputError) as e:
            errors.append(e)
            continue
        matches.append((path, kind, pair.output or spec.output, people.setdefault(person, len(people))))
    raise_all(errors)
    return tuple(people), matches


def _photo(
    root: Path,
    resolver: Resolver,
    seen: dict[str, Photo],
    rel: str,
    f: str,
    prefix: str,
    file: str,
    area: str | None,
    store: S3Store | None = None,
) -> Photo:
    if rel not in seen and is_s3(rel):
        assert store is not None  # remote.check_allowed / refuse
        seen[rel] = remote.head(store, rel, f, file, prefix)
    if rel not in seen:
        try:
            path = _existing(resolver, rel, f, file)
        except MissingInputError:
            raise MissingInputError(f"{file}: {f}: {prefix}{rel!r} does not exist under {root}") from None
        except JobFileError as e:
            raise JobFileError(file, f, prefix + e.reason) from None
        try:
            fence.check_input_area(resolver.relative(str(path)), f, file, area)
        except JobFileError as e:
            raise JobFileError(file, f, prefix + e.reason) from None
        seen[rel] = path
    return seen[rel]


def _pair_target(
    resolver: Resolver, rel: str, f: str, prefix: str, file: str, area: str | None
) -> tuple[str, TargetKind]:
    try:
        real = resolver.inside_str(rel, what=f)
    except ValueError as e:
        raise JobFileError(file, f, prefix + str(e)) from None
    if not resolver.isfile(real):
        if resolver.isdir(real):
            raise JobFileError(file, f, f"{prefix}{rel!r} is a folder, not a photo or video")
        raise MissingInputError(f"{file}: {f}: {prefix}{rel!r} does not exist under {resolver.root}")
    kind = target_kind(real)
    if kind is None:
        supported = " ".join(IMAGE_EXTENSIONS + VIDEO_EXTENSIONS)
        shown = resolver.relative(real)
        raise JobFileError(file, f, f"{prefix}{shown!r} is neither an image nor a video (supported: {supported})")
    try:
        fence.check_input_area(resolver.relative(real), f, file, area)
    except JobFileError as e:
        raise JobFileError(file, f, prefix + e.reason) from None
    return real, kind


FEW = 32  # paths a job may name and still have each looked at alone rather than its folder read


def _many_paths(spec: JobSpec) -> bool:
    """Whether the job may name enough paths that reading each folder once is cheaper than an lstat
    and a stat per path: a glob, a pairs file, or more than FEW targets or pairs. A few named files
    are looked at alone, so a one-photo job costs the same in a folder of ten photos or of 100,000."""
    if spec.pairs_file is not None or len(spec.pairs) > FEW or len(spec.targets) > FEW:
        return True
    return any(not is_s3(t) and glob.has_magic(t) for t in spec.targets)


def _source(resolver: Resolver, store: S3Store | None, rel: str, f: str, file: str) -> Photo:
    if is_s3(rel):
        assert store is not None  # remote.check_allowed
        return remote.head(store, rel, f, file)
    return _existing(resolver, rel, f, file)


def _existing(resolver: Resolver, rel: str, f: str, file: str) -> Path:
    try:
        path = resolver.inside(rel, what=f, listed=False)  # one photo: looked at alone, its folder not read
    except ValueError as e:
        raise JobFileError(file, f, str(e)) from None
    try:
        mode = os.stat(path).st_mode  # one stat answers both: there, and a file
    except (FileNotFoundError, NotADirectoryError):
        raise MissingInputError(f"{file}: {f}: {rel!r} does not exist under {resolver.root}") from None
    if not stat.S_ISREG(mode):
        raise JobFileError(file, f, f"{rel!r} is a folder, not a photo")
    return path


def _match_targets(
    spec: JobSpec, file: str, resolver: Resolver, store: S3Store | None, limit: int | None
) -> list[tuple[str, TargetKind]]:
    seen: set[str] = set()
    matches: list[tuple[str, TargetKind]] = []
    for i, pattern in enumerate(spec.targets):
        f = item_field("targets", i, len(spec.targets))
        if is_s3(pattern):
            assert store is not None  # remote.check_allowed
            bound = 100_000 if limit is None else limit
            matches += [(u, k) for u, k in remote.list_targets(store, pattern, f, file, bound) if u not in seen]
            seen.update(u for u, _ in matches)
            continue
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
