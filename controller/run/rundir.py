"""The run folder on the shared volume: the job's durable state (its paths: contract/layout.py).

Every file is written to a temporary name in the same folder and renamed into place, so a reader
(another controller, a runner on another node) sees the old file or the new one, never half of one.
When the controller runs as root, what it creates is handed to the runner's uid:gid so that the
non-root runner can append results and logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from contract.layout import RUNS, AttemptLog, RunLayout, parse_attempt_log
from contract.manifest import Manifest
from contract.results import ItemResult, read_results
from controller.job.plan import Plan

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


def write_atomic(path: Path, data: bytes, owner: tuple[int, int] | None = None, durable: bool = True) -> None:
    """Temp name in the same folder, then rename. `durable=False` skips the fsync, for bulk writes
    that the caller makes durable with one os.sync() (planning 5,000 manifests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if owner and os.geteuid() == 0:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_nofollow(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file, never through a symlink; None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a fifo, a device: not a file we read
            return None
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (block := os.read(fd, left)):  # a network filesystem may answer in parts
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


class RunDir:
    def __init__(self, data_root: Path, job: str, owner: tuple[int, int] | None = None) -> None:
        self.data_root = data_root
        self.job = job
        self.layout = RunLayout.host(data_root, job)
        self.path = self.layout.dir
        self.owner = owner
        self.made_folders: list[str] = []  # output folders made for this job now (undone if it is refused)
        self.stage: Stage | None = None  # what this controller is doing with the job (written to state.json)

    def exists(self) -> bool:
        return self.layout.plan.is_file()

    def job_digest(self) -> str | None:
        """The sha256 of the job file that started this run (job.sha256, else the frozen job.yaml's,
        for run folders made before it was recorded); None when neither can be read. Read as hostile:
        no link followed, a bounded read, the digest's form checked."""
        recorded = read_nofollow(self.layout.job_sha256, 100)
        if recorded is not None and re.fullmatch(rb"[0-9a-f]{64}\n?", recorded):
            return recorded.decode().strip()
        frozen = read_nofollow(self.layout.job_file, 64 * 1024**2)
        return hashlib.sha256(frozen).hexdigest() if frozen is not None else None

    def _mkdir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.owner and os.geteuid() == 0:
            os.chown(path, *self.owner)

    def _write(self, path: Path, data: bytes) -> None:
        write_atomic(path, data, self.owner)

    def write_file(self, path: Path, data: bytes) -> None:
        """Any other file of the run folder (``path``: one of self.layout's; atomic, owned by the
        runner's user)."""
        self._mkdir(self.path)
        self._write(path, data)

    def make_dirs(self) -> None:
        """The run folder's sub-folders, owned by the runner's user (runners append to them)."""
        for folder in self.layout.subfolders():
            self._mkdir(folder)

    def create(self, job_file: bytes, plan: Plan, manifests: dict[str, Manifest], control: Control, image: str) -> None:
        self.make_dirs()
        self._write(self.layout.job_file, job_file)
        self._write(self.layout.job_sha256, hashlib.sha256(job_file).hexdigest().encode() + b"\n")
        # Every manifest on disk before the plan says the run folder is complete: a few are fsynced
        # one by one; thousands get one os.sync() (which flushes every filesystem of the machine:
        # cheaper than thousands of fsyncs, dearer than a few).
        bulk = len(manifests) > BULK_MANIFESTS
        for chunk, manifest in manifests.items():
            write_atomic(self.layout.manifest(chunk), manifest.to_json().encode(), self.owner, durable=not bulk)
        self.write_control(control)
        self.write_image(image)
        if bulk:
            os.sync()
        self._write(self.layout.plan, plan.to_json().encode())  # last: its presence means "created"

    def plan(self) -> Plan:
        return Plan.from_json(self.layout.plan.read_text())

    def manifest(self, chunk: str) -> Manifest:
        return Manifest.from_json(self.layout.manifest(chunk).read_text())

    def write_control(self, control: Control) -> None:
        self._write(
            self.layout.control,
            json.dumps({"max_concurrent": control.max_concurrent, "cancel": control.cancel}).encode(),
        )

    def control(self) -> Control:
        data = json.loads(self.layout.control.read_text())
        return Control(max_concurrent=int(data["max_concurrent"]), cancel=bool(data.get("cancel", False)))

    def results(self, chunk: str) -> list[ItemResult]:
        try:
            return read_results(self.layout.results(chunk).read_text())
        except FileNotFoundError:
            return []

    def latest_results(self, chunk: str) -> dict[str, ItemResult]:
        """The last recorded result of each item (later attempts supersede earlier ones)."""
        out: dict[str, ItemResult] = {}
        for r in self.results(chunk):
            out[r.item] = r
        return out

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

    def enter(self, stage: Stage) -> None:
        """Record the stage the job is in, keeping the chunk records state.json already holds."""
        self.stage = stage
        current = self.state() or {}
        chunks = current.get("chunks")
        self.write_state(chunks if isinstance(chunks, dict) else {})

    def state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.layout.state.read_text())
            return data
        except FileNotFoundError:
            return None

    def log_path(self, chunk: str, attempt: int) -> Path:
        return self.layout.log(chunk, attempt)

    def write_image(self, image: str) -> None:
        self._write(self.layout.image, json.dumps({"image": image}).encode())

    def image(self) -> str:
        """The image (digest or ID) resolved at the first submit: every attempt runs the same one."""
        return str(json.loads(self.layout.image.read_text())["image"])

    def write_report(self, report: dict[str, Any]) -> Path:
        self._write(self.layout.report, json.dumps(report, indent=1, sort_keys=True).encode())
        return self.layout.report

    def report(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.layout.report.read_text())
            return data
        except FileNotFoundError:
            return None


def next_job_id(data_root: Path, name: str, new: bool) -> str:
    """Job id = name; with --new the first free name-2, name-3 … when a run of that name exists."""
    if not new or not (data_root / RUNS / name).exists():
        return name
    n = 2
    while (data_root / RUNS / f"{name}-{n}").exists():
        n += 1
    return f"{name}-{n}"
