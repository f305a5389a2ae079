"""The run folder on the shared volume: the job's durable state (its paths: contract/layout.py).

Every file is written to a temporary name in the same folder and renamed into place, so a reader
(another controller, a runner on another node) sees the old file or the new one, never half of one.
Every write, chown and delete goes through controller/volume.py: resolved beneath the data root,
never through a symlink. What the controller acts on (the folder itself, job.yaml, plan.json, chunks/,
control.json, state.json, image.json, report.json, joins.jsonl) is the controller's (``controller_user``
or ffswarm's own uid), group the runner's, 0640/0750: runners read manifests, never change them. Only
the runner folders (contract/layout.py RUNNER_FOLDERS) are the runner's. Whatever is read back is
validated and bounded; a bad file is a RunFileError naming it, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from contract.errors import ManifestError
from contract.layout import AttemptLog, DataRootLayout, RunLayout, parse_attempt_log
from contract.manifest import Manifest
from contract.results import ChunkResults, ItemResult, chunk_results
from controller.errors import FfswarmError
from controller.folder import sync_filesystem
from controller.job.plan import ID, Plan
from controller.volume import DIR_MODE, SHARED_DIR_MODE, Owner, UnsafePath, Volume, read_nofollow

MiB = 1024**2
LIMITS = {"job.yaml": 64 * MiB, "plan.json": 256 * MiB, "manifest": 64 * MiB, "state.json": 256 * MiB,
          "report.json": 256 * MiB, "small": 64 * 1024}  # fmt: skip
MAX_CONCURRENT = 1_000_000
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,510}")

BULK_MANIFESTS = 64


class Stage(StrEnum):
    """Where the controller running a job is (state.json's "stage"; controller/run/usecase.py)."""

    IDENTITY = "identity"  # the identity step, before any chunk is watched
    CHUNKS = "chunks"  # chunk services (the identity step beside the first ones)
    VIDEOS = "videos"  # bad segments redone, videos joined
    REPORT = "report"  # report.json and the timing measurement
    HOOKS = "hooks"  # on_complete webhook and command
    ENDED = "ended"  # this run of the job is over (report written, hooks called)


@dataclass(frozen=True)
class Control:
    """control.json: what `ffswarm scale` and `ffswarm cancel` ask of a running job."""

    max_concurrent: int
    cancel: bool = False


class RunFileError(FfswarmError):
    """A run-folder file that is not what the controller wrote (edited, truncated, replaced): the
    message names it relative to the data root and says what is wrong, never its content."""


class RunDir:
    def __init__(self, data_root: Path, job: str, owner: Owner | None = None, controller: Owner | None = None) -> None:
        """``owner``: the runner's uid:gid (its folders; the group of the controller's files);
        ``controller``: who owns the controller's files (Config.controller_ids()). Neither given
        (status, scale, cancel): files keep the run folder's own owner and group."""
        self.data_root = data_root
        self.job = job
        self.layout = RunLayout.host(data_root, job)
        self.path = self.layout.dir
        self.owner = owner
        self.controller = controller
        self.volume = Volume(data_root)
        self.made_folders: list[str] = []  # output folders made for this job now (undone if it is refused)
        self.stage: Stage | None = None  # what this controller is doing with the job (written to state.json)
        # False: files are written without fsyncs, the caller syncs once (hundreds of packed jobs'
        # folders made or ended together: controller/serve/packs.py)
        self.durable = True
        self._plan: tuple[bytes, Plan] | None = None  # plan.json as last read, and the plan it holds

    def rel(self, path: Path) -> str:
        """How messages name a run-folder file: relative to the data root."""
        return self.volume.rel(path)

    def controller_owner(self) -> Owner | None:
        """uid:gid of the controller's files: the controller's uid, the runner's group (runners read
        manifests and requests, nothing more)."""
        if self.owner is None and self.controller is None:
            try:
                fd = self.volume.open_dir(self.path)
            except (OSError, UnsafePath):
                return None
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            return st.st_uid, st.st_gid
        uid = self.controller[0] if self.controller is not None else os.geteuid()
        gid = self.owner[1] if self.owner is not None else self.controller[1] if self.controller is not None else -1
        return uid, gid

    def runner_owner(self) -> Owner | None:
        """uid:gid of the runner folders: the runner's; a non-root controller cannot give a folder
        away, so it keeps it and shares it with the runner's group (SHARED_DIR_MODE)."""
        if self.owner is None:
            return None
        return self.owner if os.geteuid() == 0 else (os.geteuid(), self.owner[1])

    def exists(self) -> bool:
        """The run folder is complete (plan.json, a regular file, reached without links)."""
        try:
            fd = self.volume.open(self.layout.plan, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except NotADirectoryError as e:
            raise UnsafePath(f"{self.rel(self.layout.plan)}: {e.strerror}") from None
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def job_digest(self) -> str | None:
        """The sha256 of the job file that started this run (job.sha256, else the frozen job.yaml's,
        for run folders made before it was recorded); None when neither can be read. Read as hostile:
        no link followed, a bounded read, the digest's form checked."""
        recorded = read_nofollow(self.layout.job_sha256, 100)
        if recorded is not None and re.fullmatch(rb"[0-9a-f]{64}\n?", recorded):
            return recorded.decode().strip()
        frozen = read_nofollow(self.layout.job_file, LIMITS["job.yaml"])
        return hashlib.sha256(frozen).hexdigest() if frozen is not None else None

    def read_file(self, path: Path, limit: int) -> bytes | None:
        """A run-folder file's bytes (None: missing); RunFileError for a link, fifo or oversize file."""
        try:
            return self.volume.read(path, limit)
        except UnsafePath as e:
            raise RunFileError(str(e)) from None
        except OSError as e:
            raise RunFileError(f"{self.rel(path)}: cannot read: {e.strerror}") from None

    def _json(self, path: Path, limit: int) -> Any:
        """A run-folder JSON file (None: missing), parsed; RunFileError if it is not JSON."""
        data = self.read_file(path, limit)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise RunFileError(f"{self.rel(path)}: not valid JSON (edited or truncated?)") from None

    def read_job_file(self) -> bytes:
        data = self.read_file(self.layout.job_file, LIMITS["job.yaml"])
        if data is None:
            raise RunFileError(f"{self.rel(self.layout.job_file)}: missing")
        return data

    def _mkdir(self, path: Path, owner: Owner | None, mode: int) -> None:
        try:
            self.volume.mkdirs(path, owner, mode, enforce=True, exact=mode == SHARED_DIR_MODE)
        except UnsafePath as e:
            raise UnsafePath(f"run folder of job {self.job}: {e}") from None

    def _write(self, path: Path, data: bytes, durable: bool = True) -> None:
        self.volume.write_atomic(path, data, self.controller_owner(), durable=durable and self.durable)

    def write_file(self, path: Path, data: bytes) -> None:
        """Any other file of the run folder (``path``: one of self.layout's; atomic). The controller's
        own unless it lies in a runner folder (the identity step's pending answer)."""
        self._mkdir(self.path, self.controller_owner(), DIR_MODE)
        if path.parent in self.layout.runner_folders():
            self._mkdir(path.parent, self.runner_owner(), SHARED_DIR_MODE)
            self.volume.write_atomic(path, data, self.runner_owner(), durable=self.durable)
        else:
            self._write(path, data)

    def make_dirs(self) -> None:
        """The run folder (the controller's: runners cannot add, rename or replace files in it),
        chunks/ (the controller's) and the runner folders. Ownership and modes are set even on
        folders that exist: one a runner made first, or an older run folder, is taken back."""
        ctl = self.controller_owner()
        self.data_root.mkdir(parents=True, exist_ok=True)  # the operator's path (config): trusted
        self.volume.mkdirs(self.path.parent, ctl, DIR_MODE)  # runs/ (a tenant's too): made if missing, never taken over
        above = [self.path.parent, *self.path.parent.parents]  # runs/, and runs/.tenants/<key>/ for a tenant's pack
        for folder in reversed(above[: above.index(DataRootLayout.host(self.data_root).runs) + 1]):
            self._share_runs(ctl, folder)
        for folder in self.layout.controller_folders():
            self._mkdir(folder, ctl, DIR_MODE)
        for folder in self.layout.runner_folders():
            self._mkdir(folder, self.runner_owner(), SHARED_DIR_MODE)

    def _share_runs(self, ctl: Owner | None, folder: Path) -> None:
        """runs/ (or a tenant's runs/.tenants/<key>/) made by this controller (or by an earlier step:
        the output claims under runs/.claims) gets the controller's owner, the runner's group and
        DIR_MODE, so runners reach their run folders and an API running as ``controller_user`` reads
        them; one a root controller made as root's is handed to ``controller_user``; one someone else
        owns is left as it is."""
        if ctl is None:
            return
        fd = self.volume.open_dir(folder)
        try:
            st = os.fstat(fd)
            ours = st.st_uid == ctl[0] or (st.st_uid == 0 and os.geteuid() == 0)
            mode = stat.S_IMODE(st.st_mode)
            if ours and (st.st_uid != ctl[0] or st.st_gid != ctl[1] or mode & 0o050 != 0o050):
                os.fchown(fd, ctl[0], ctl[1])
                os.fchmod(fd, mode | 0o050)
        finally:
            os.close(fd)

    def create(
        self,
        job_file: bytes,
        plan: Plan,
        manifests: dict[str, Manifest],
        control: Control,
        image: str,
        packed: bool = False,
    ) -> None:
        """The complete run folder, plan.json last. ``packed``: a packed job's, whose chunks run in its
        pack: the folder without chunks/ and the runner folders (made_for_pack; controller/run/jobs.py
        start_run makes them, and the manifests, if it ever runs its own chunks)."""
        with self.volume.batch():  # one umask read for the folders and files below
            if packed:
                self._mkdir(self.path, self.controller_owner(), DIR_MODE)
            else:
                self.make_dirs()
            self._write(self.layout.job_file, job_file)
            self._write(self.layout.job_sha256, hashlib.sha256(job_file).hexdigest().encode() + b"\n")
            self.write_manifests(manifests)
            self.write_control(control)
            self.write_image(image)
            self._write(self.layout.plan, plan.to_json().encode())  # last: its presence means "created"

    def write_manifests(self, manifests: dict[str, Manifest]) -> None:
        """The chunks' manifests, on disk when this returns: a few fsynced one by one; thousands with one
        flush of the volume's filesystem (cheaper than thousands of fsyncs, dearer than a few)."""
        bulk = len(manifests) > BULK_MANIFESTS
        for chunk, manifest in manifests.items():
            self._write(self.layout.manifest(chunk), manifest.to_json().encode(), durable=not bulk)
        if bulk:
            sync_filesystem(self.data_root)

    def made_for_pack(self) -> bool:
        """A complete folder made for a packed job (create(packed=True)): its chunks have no manifests."""
        chunks = self.plan().chunks
        return bool(chunks) and not os.path.lexists(self.layout.manifest(chunks[-1].id))

    def plan(self) -> Plan:
        """The job's plan; parsed once while plan.json's bytes stay the same (each stage reads it)."""
        data = self.read_file(self.layout.plan, LIMITS["plan.json"])
        if data is None:
            raise RunFileError(f"{self.rel(self.layout.plan)}: missing")
        if self._plan is not None and self._plan[0] == data:
            return self._plan[1]
        try:
            plan = Plan.from_json(data)
        except ValueError as e:
            raise RunFileError(f"{self.rel(self.layout.plan)}: {str(e).removeprefix('plan.json: ')}") from None
        if plan.job != self.job:
            raise RunFileError(f"{self.rel(self.layout.plan)}: names job {plan.job}, not {self.job}")
        self._plan = (data, plan)
        return plan

    def manifest(self, chunk: str) -> Manifest:
        path = self.layout.manifest(chunk)
        data = self.read_file(path, LIMITS["manifest"])
        if data is None:
            raise RunFileError(f"{self.rel(path)}: missing")
        try:
            return Manifest.from_json(data.decode("utf-8"))
        except (ValueError, ManifestError) as e:
            raise RunFileError(f"{self.rel(path)}: {type(e).__name__}") from None

    def write_control(self, control: Control) -> None:
        """Only controller/run/control.py changes a job's control.json (and create() writes the first)."""
        self._write(
            self.layout.control,
            json.dumps({"max_concurrent": control.max_concurrent, "cancel": control.cancel}).encode(),
        )

    def control(self) -> Control:
        data = self._json(self.layout.control, LIMITS["small"])
        n = data.get("max_concurrent") if isinstance(data, dict) else None
        cancel = data.get("cancel", False) if isinstance(data, dict) else None
        if type(n) is not int or not 0 <= n <= MAX_CONCURRENT or not isinstance(cancel, bool):
            what = "missing" if data is None else f"not {{max_concurrent: 0…{MAX_CONCURRENT}, cancel: true|false}}"
            raise RunFileError(f"{self.rel(self.layout.control)}: {what}")
        return Control(max_concurrent=n, cancel=cancel)

    def chunk_results(self, chunk: str) -> ChunkResults:
        """Every attempt's results of a chunk, merged (contract/results.py chunk_results: a commit
        beats an error, the newest attempt wins; lines that do not parse are counted in .dropped)."""
        try:
            return chunk_results(self.layout.results_dir, chunk)
        except OSError:
            return ChunkResults({}, ())

    def results(self, chunk: str) -> list[ItemResult]:
        """Every parsed result line of a chunk, all attempts, oldest attempt first."""
        return list(self.chunk_results(chunk).lines)

    def latest_results(self, chunk: str) -> dict[str, ItemResult]:
        """The deciding result of each item over all attempts (chunk_results)."""
        return self.chunk_results(chunk).latest

    def results_dropped(self, chunk: str) -> int:
        """Result lines of a chunk that did not parse (for the report)."""
        return self.chunk_results(chunk).dropped

    def attempt_logs(self, chunk: str | None = None) -> list[tuple[Path, AttemptLog]]:
        """The runner logs of every attempt (of one chunk), in file-name order, with whose each is."""
        out = []
        for path in sorted(self.layout.logs_dir.glob(f"{chunk or '*'}.a*.log")):
            name = parse_attempt_log(path.name)
            if name is not None and (chunk is None or name.chunk == chunk):
                out.append((path, name))
        return out

    def last_attempt(self, chunk: str) -> int:
        """The highest attempt number an earlier run of this chunk used (from its runner logs)."""
        return max((name.attempt for _, name in self.attempt_logs(chunk)), default=0)

    def write_state(self, chunks: dict[str, Any]) -> None:
        data: dict[str, Any] = {"updated": time.time(), "chunks": chunks}
        if self.stage is not None:
            data["stage"] = self.stage.value
        self._write(self.layout.state, json.dumps(data, indent=1).encode())

    def enter(self, stage: Stage, chunks: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record the stage the job is in, keeping (and returning) state.json's chunk records; ``chunks``:
        as an earlier enter of this job's end returned them (only enter wrote state.json since)."""
        self.stage = stage
        kept = self.chunk_records() if chunks is None else chunks
        self.write_state(kept)
        return kept

    def chunk_records(self) -> dict[str, Any]:
        """state.json's chunk records ({} before it is written)."""
        kept = (self.state() or {}).get("chunks")
        return kept if isinstance(kept, dict) else {}

    def state(self) -> dict[str, Any] | None:
        """state.json (None: not written yet): an object whose chunks are an object keyed by chunk
        ids and whose stage is one of Stage; RunFileError otherwise."""
        data = self._json(self.layout.state, LIMITS["state.json"])
        if data is None:
            return None
        chunks, stage = (data.get("chunks", {}), data.get("stage")) if isinstance(data, dict) else (None, None)
        if (
            not isinstance(chunks, dict)
            or not all(ID.fullmatch(c) and isinstance(v, dict) for c, v in chunks.items())
            or (stage is not None and stage not in {s.value for s in Stage})
        ):
            raise RunFileError(f"{self.rel(self.layout.state)}: not a state the controller wrote")
        return dict(data)

    def log_path(self, chunk: str, attempt: int) -> Path:
        return self.layout.log(chunk, attempt)

    def write_image(self, image: str) -> None:
        self._write(self.layout.image, json.dumps({"image": image}).encode())

    def image(self) -> str:
        """The image (digest or ID) resolved at the first submit: every attempt runs the same one."""
        data = self._json(self.layout.image, LIMITS["small"])
        image = data.get("image") if isinstance(data, dict) else None
        if not isinstance(image, str) or not _IMAGE.fullmatch(image):
            raise RunFileError(f"{self.rel(self.layout.image)}: {'missing' if data is None else 'not an image'}")
        return image

    def write_report(self, report: dict[str, Any]) -> Path:
        self._write(self.layout.report, json.dumps(report, indent=1, sort_keys=True).encode())
        return self.layout.report

    def report(self) -> dict[str, Any] | None:
        data = self._json(self.layout.report, LIMITS["report.json"])
        if data is not None and not isinstance(data, dict):
            raise RunFileError(f"{self.rel(self.layout.report)}: not a report")
        return data


def next_job_id(data_root: Path, name: str, new: bool) -> str:
    """Job id = name; with --new the first free name-2, name-3 … when a run of that name exists."""
    runs = DataRootLayout.host(data_root).runs
    if not new or not os.path.lexists(runs / name):
        return name
    n = 2
    while os.path.lexists(runs / f"{name}-{n}"):
        n += 1
    return f"{name}-{n}"
