"""Can the runner read a job's inputs and write its outputs? Asked at submit, before anything exists.

Runner containers run as a non-root uid:gid (config.runner_uid_gid()); the controller runs as root
or as the data root's owner. A folder a user made as root (`mkdir -p hidden/in`) is fine for the
controller and fatal for every item of the runner, late. So `jobs.prepare` (submit, serve, render,
dry runs) judges the job's paths with the runner's ids — each distinct folder once, each input file
by one lstat — and refuses a job the runner could not do, naming every path with its owner, mode and
the fix; nothing is created then. `jobs.start_run` creates the output folders that do not exist yet,
owned by the runner, and the video join makes its output folder the same way (make_folders).

A tenant's area (``tenants/<t>/``) is the other way round: its top is the controller's (own_area),
only the folders outputs go to below it are the runner's. A runner that can write the data root
(a CLI job's sees all of it) could otherwise rename ``uploads/`` or another job's inputs there.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shlex
import stat
from collections.abc import Iterable
from enum import Enum
from pathlib import Path

from contract.layout import TENANTS
from contract.s3 import is_s3
from controller.config import Config
from controller.errors import MissingInputError
from controller.job.owners import TENANT
from controller.job.plan import Plan
from controller.job.resolve import ResolvedJob
from controller.volume import UnsafePath, Volume, own

Ids = tuple[int, int]
R, W, X = 4, 2, 1
MAX_LISTED = 10
OUTPUT_DIR_MODE = 0o755  # the user's area: readable as their other folders are
AREA_MODE = 0o755  # a tenant's area's top: the controller's; runners only pass through it to their files


def parse_ids(text: str) -> Ids:
    """`UID:GID` (or a bare `UID`, whose gid Docker takes to be the uid's own group)."""
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def allows(st: os.stat_result, ids: Ids, want: int) -> bool:
    """Whether `ids` get every bit of `want` (R|W|X) from the mode, as the kernel judges one uid and
    one gid: the owner's bits if the uid owns it, else the group's if the gid matches, else the
    others'. Supplementary groups and ACLs are not considered: the runner's extra groups come from
    the image's /etc/group, which the controller never sees, so a path open to the runner only
    through one of them is refused (the fix names chown and runner_user:)."""
    uid, gid = ids
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & want == want


class _Check:
    """One pass over a job's paths; folders are stat'ed once (cached) whatever the number of files."""

    def __init__(self, root: Path, ids: Ids) -> None:
        self.root = os.path.realpath(root)
        self.ids = ids
        self._stats: dict[str, os.stat_result | None] = {}
        self._enter: dict[str, bool] = {}
        self.problems: list[str] = []
        self.fix: set[str] = set()  # paths whose ownership the fix hands to the runner
        self.missing: set[str] = set()
        self._creatable: set[str] = set()

    def _stat(self, rel: str) -> os.stat_result | None:
        if rel not in self._stats:
            try:
                self._stats[rel] = os.lstat(f"{self.root}/{rel}" if rel else self.root)
            except (FileNotFoundError, NotADirectoryError):
                self._stats[rel] = None
        return self._stats[rel]

    def _problem(self, rel: str, what: str, st: os.stat_result, fix: str | None) -> None:
        self.problems.append(
            f"{rel or '.'}: {what} (owner {st.st_uid}:{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o})"
        )
        if fix is not None:
            self.fix.add(fix)

    def enter(self, folder: str) -> bool:
        """The runner can reach into `folder` ('' is the root); a refusal is reported once, at the
        highest folder that blocks. A missing folder is False without a report (callers know why)."""
        if folder not in self._enter:
            ok = folder == "" or self.enter(posixpath.dirname(folder))
            st = self._stat(folder) if ok else None
            if st is None:
                ok = False
            elif not stat.S_ISDIR(st.st_mode):
                self._problem(folder, "not a folder, but the job's paths go through it", st, None)
                ok = False
            elif not allows(st, self.ids, X):
                self._problem(folder, "folder the runner cannot enter", st, folder)
                ok = False
            self._enter[folder] = ok
        return self._enter[folder]

    def input(self, rel: str) -> None:
        folder = posixpath.dirname(rel)
        if not self.enter(folder):
            return
        try:
            st = os.lstat(f"{self.root}/{rel}")
        except OSError:
            return  # a missing input is resolve_job's to report (or the runner's, on resume)
        if not allows(st, self.ids, R):
            self._problem(rel, "input the runner cannot read", st, folder or rel)

    def output_folder(self, folder: str) -> None:
        parts = folder.split("/") if folder else []
        for n in range(len(parts) + 1):
            rel = "/".join(parts[:n])
            if self._stat(rel) is None:  # missing from here down: made at start_run, for the runner
                parent = "/".join(parts[: n - 1])
                if self.enter(parent):
                    self.missing.add(folder)
                    self._controller_can_create(parent)
                return
        if self.enter(folder):
            st = self._stat(folder)
            assert st is not None
            if not allows(st, self.ids, W | X):
                self._problem(folder, "output folder the runner cannot write", st, folder)

    def _controller_can_create(self, parent: str) -> None:
        """Not root: the controller makes the missing folders as itself, so it must be able to."""
        if os.geteuid() == 0 or parent in self._creatable:
            return
        self._creatable.add(parent)
        if not os.access(f"{self.root}/{parent}" if parent else self.root, os.W_OK | os.X_OK):
            st = self._stat(parent)
            assert st is not None
            self._problem(parent, f"ffswarm (uid {os.geteuid()}) cannot create the output folders in it", st, parent)

    def refusal(self, file: str, config: Config) -> MissingInputError:
        uid, gid = self.ids
        shown = list(dict.fromkeys(self.problems))
        lines = [f"{file}: the runner (uid:gid {uid}:{gid}) could not do this job; nothing was created:"]
        lines += [f"  {p}" for p in shown[:MAX_LISTED]]
        if len(shown) > MAX_LISTED:
            lines.append(f"  … and {len(shown) - MAX_LISTED} more")
        targets = sorted(self.fix)
        targets = [t for t in targets if not any(t != o and (o == "" or t.startswith(o + "/")) for o in targets)]
        if targets:
            paths = " ".join(shlex.quote(t or ".") for t in targets[:MAX_LISTED])
            more = " …" if len(targets) > MAX_LISTED else ""
            lines.append(
                f"fix (as root, in {self.root}): chown -R {uid}:{gid} {paths}{more} && chmod -R u+rwX {paths}{more}"
            )
        lines.append(
            f"or set runner_user: UID:GID in {config.path} to a user that can read the inputs and write the outputs"
        )
        return MissingInputError("\n".join(lines))


def check(config: Config, inputs: Iterable[str], output_folders: Iterable[str], file: str) -> tuple[str, ...]:
    """Paths relative to the data root (real, symlink-free, as resolve_job gives them): refuse the job
    (MissingInputError, exit 66) listing every problem, or return the output folders to create."""
    c = _Check(config.data_root, parse_ids(config.runner_uid_gid()))
    for rel in inputs:
        c.input(rel)
    for folder in dict.fromkeys(output_folders):
        c.output_folder(folder)
    if c.problems:
        raise c.refusal(file, config)
    return tuple(sorted(c.missing))


def check_job(config: Config, job: ResolvedJob, file: str) -> tuple[str, ...]:
    """At submit: sources, reference and targets are read; every target's output folder written."""
    root = Path(os.path.realpath(config.data_root))
    photos = [p for p in (*job.sources, *([job.reference] if job.reference else [])) if isinstance(p, Path)]
    inputs = [p.relative_to(root).as_posix() for p in photos] + [t.rel for t in job.targets if not is_s3(t.rel)]
    return check(config, inputs, output_folders(job), file)


def output_folders(job: ResolvedJob) -> list[str]:
    """The folders the job's outputs go to (objects have none), as its paths name them."""
    return [posixpath.dirname(t.output_rel) for t in job.targets if not is_s3(t.output_rel)]


def check_plan(config: Config, plan: Plan, chunks: Iterable[str], file: str) -> tuple[str, ...]:
    """On resume: the inputs of the chunks still to do, the output folders of their images and of
    every video (joined by the controller once its segments are in)."""
    todo = set(chunks)
    items = [plan.item(i) for c in plan.chunks if c.id in todo for i in c.items]
    outputs = [posixpath.dirname(i.output) for i in items if i.kind != "segment" and not is_s3(i.output)]
    outputs += [posixpath.dirname(v.output) for v in plan.videos if not is_s3(v.output)]
    return check(config, dict.fromkeys(i.input for i in items if not is_s3(i.input)), outputs, file)


class AreaTop(Enum):
    """Whose a tenant's area's top is once own_area looked at it."""

    OURS = "ours"  # this process's (made now, or so already): the runner cannot write there
    TAKEN_BACK = "taken back"  # it was the runner's uid's (an older ffswarm made it so), now this process's
    RUNNERS = "runner's"  # the runner's uid's still: only root may take it back
    ROOTS = "root's"  # made by a root serve for a non-root keeper (the API cannot add uploads/): root hands it over


def area_of(folder: str) -> str | None:
    """The tenant's area (``tenants/<t>``) that ``folder`` (relative to the data root) is in or is."""
    parts = folder.split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 and parts[0] == TENANTS and TENANT.fullmatch(parts[1]) else None


def own_area(root: Path, area: str, runner: Ids | None, keeper: Ids | None = None) -> AreaTop:
    """Make a tenant's ``area`` (``tenants/<t>``, relative to ``root``) if missing, as ``keeper``'s
    folder (the controller's ids, Config.controller_ids(): the API runs as them, so it can add
    ``uploads/``; default this process's), mode 0755 whatever the umask (runners read their inputs
    below it), never the runner's: only the folders its outputs go to are. An area someone else owns
    (the runner's uid, as an older ffswarm made it; root, as a root `serve` made it before it knew
    the keeper) is handed to the keeper (fchown, fchmod through a descriptor opened without following
    a link) when this process runs as root; else it is left as it is and RUNNERS or ROOTS says so.
    The API calls this on every request and serve before it makes output folders in an area, so both
    leave the area alike. UnsafePath for a link or a file where the area should be: never followed."""
    me = (os.geteuid(), os.getegid())
    keeper = keeper or me

    def state(st: os.stat_result) -> AreaTop:
        if st.st_uid == keeper[0] or st.st_uid == me[0] != 0:
            return AreaTop.OURS
        if runner is not None and st.st_uid == runner[0]:
            return AreaTop.RUNNERS
        if st.st_uid == 0:
            return AreaTop.ROOTS
        return AreaTop.OURS  # another non-root user's (an api given its own --api-user): left to it

    try:
        st = os.lstat(root / area)  # there already on every request but the first: nothing opened then
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{area} is not a folder (never followed)")
    if st is not None and state(st) is AreaTop.OURS:
        return AreaTop.OURS
    volume = Volume(root)
    give = keeper if me[0] == 0 and keeper != me else None
    if st is None:
        volume.mkdirs(TENANTS, give, 0o755)  # runners pass through it (a CLI job's, to outputs it names)
        volume.mkdirs(area, give, AREA_MODE, exact=True)  # made by another process meanwhile: left as it is
    fd = volume.open_dir(area, "owning the tenant's area")
    try:
        found = state(os.fstat(fd))
        if found is AreaTop.OURS:
            return AreaTop.OURS
        if me[0] != 0:
            return found
        own(fd, keeper, AREA_MODE, area)
        return AreaTop.TAKEN_BACK
    finally:
        os.close(fd)


def make_folders(root: Path, folders: Iterable[str], owner: Ids | None, keeper: Ids | None = None) -> list[str]:
    """Create each folder (relative to `root`, parents included) through controller/volume.py: one
    component at a time, never through a symlink, so a component swapped for a link since the check
    is refused, never followed out of the root. What is made here is handed to `owner` (the runner)
    when the controller runs as root, but a tenant's area itself, which own_area makes (or takes
    back) as the controller's first: so a tenant's ``out/`` made here is the runner's (a lane makes
    ``out/<job>/`` in it) while the area's top is not. Returns the folders it made, parents first
    (remove_folders undoes them); never the area, which stays the tenant's."""
    volume = Volume(root)
    chown = owner if owner is not None and os.geteuid() == 0 else None
    made_here: list[str] = []
    areas: set[str] = set()
    for folder in sorted(set(folders)):
        if ".." in folder.split("/"):
            raise MissingInputError(f"{folder}: output folder leads out of the data root")
        area = area_of(folder)
        if area is not None and area not in areas:
            areas.add(area)
            own_area(root, area, owner, keeper)
        try:
            made_here += volume.mkdirs(folder, chown, OUTPUT_DIR_MODE)
        except UnsafePath as e:
            if e.link is None:
                raise
            raise MissingInputError(
                f"{e.link}: cannot create output folder {folder}: a symlink is in the way"
            ) from None
    return made_here


def remove_folders(root: Path, made: Iterable[str]) -> None:
    """Undo make_folders for a job refused after it ran (its identity step said no): the folders it
    made, deepest first, each only while still empty; never through a symlink."""
    volume = Volume(root)
    for rel in sorted(set(made), key=lambda p: p.count("/"), reverse=True):
        with contextlib.suppress(UnsafePath):
            volume.rmdir(rel)  # not empty (something was written after all) or gone: left alone
