"""The run folder on the shared volume: the job's durable state (DESIGN.md layout).

Every file is written to a temporary name in the same folder and renamed into place, so a reader
(another controller, a runner on another node) sees the old file or the new one, never half of one.
When the controller runs as root, what it creates is handed to the runner's uid:gid so that the
non-root runner can append results and logs.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.plan import Plan
from runner_image.manifest import ItemResult, Manifest, read_results

BULK_MANIFESTS = 64


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


class RunDir:
    def __init__(self, data_root: Path, job: str, owner: tuple[int, int] | None = None) -> None:
        self.data_root = data_root
        self.job = job
        self.path = data_root / "runs" / job
        self.owner = owner
        self.made_folders: list[str] = []  # output folders made for this job now (undone if it is refused)

    def exists(self) -> bool:
        return (self.path / "plan.json").is_file()

    def _mkdir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.owner and os.geteuid() == 0:
            os.chown(path, *self.owner)

    def _write(self, rel: str, data: bytes) -> None:
        write_atomic(self.path / rel, data, self.owner)

    def write_file(self, rel: str, data: bytes) -> None:
        """Any other file of the run folder (atomic, owned by the runner's user)."""
        self._mkdir(self.path)
        self._write(rel, data)

    def make_dirs(self) -> None:
        """The run folder's sub-folders, owned by the runner's user (runners append to them)."""
        for sub in ("", "chunks", "results", "logs"):
            self._mkdir(self.path / sub)

    def create(self, job_file: bytes, plan: Plan, manifests: dict[str, Manifest], control: Control, image: str) -> None:
        self.make_dirs()
        self._write("job.yaml", job_file)
        # Every manifest on disk before the plan says the run folder is complete: a few are fsynced
        # one by one; thousands get one os.sync() (which flushes every filesystem of the machine:
        # cheaper than thousands of fsyncs, dearer than a few).
        bulk = len(manifests) > BULK_MANIFESTS
        for chunk, manifest in manifests.items():
            path = self.path / "chunks" / f"{chunk}.json"
            write_atomic(path, manifest.to_json().encode(), self.owner, durable=not bulk)
        self.write_control(control)
        self.write_image(image)
        if bulk:
            os.sync()
        self._write("plan.json", plan.to_json().encode())  # last: its presence means "created"

    def plan(self) -> Plan:
        return Plan.from_json((self.path / "plan.json").read_text())

    def manifest(self, chunk: str) -> Manifest:
        return Manifest.from_json((self.path / "chunks" / f"{chunk}.json").read_text())

    def write_control(self, control: Control) -> None:
        self._write(
            "control.json", json.dumps({"max_concurrent": control.max_concurrent, "cancel": control.cancel}).encode()
        )

    def control(self) -> Control:
        data = json.loads((self.path / "control.json").read_text())
        return Control(max_concurrent=int(data["max_concurrent"]), cancel=bool(data.get("cancel", False)))

    def results(self, chunk: str) -> list[ItemResult]:
        path = self.path / "results" / f"{chunk}.jsonl"
        try:
            return read_results(path.read_text())
        except FileNotFoundError:
            return []

    def latest_results(self, chunk: str) -> dict[str, ItemResult]:
        """The last recorded result of each item (later attempts supersede earlier ones)."""
        out: dict[str, ItemResult] = {}
        for r in self.results(chunk):
            out[r.item] = r
        return out

    def last_attempt(self, chunk: str) -> int:
        """The highest attempt number an earlier run of this chunk used (from its runner logs)."""
        best = 0
        for f in (self.path / "logs").glob(f"{chunk}.a*.log"):
            n = f.name[len(chunk) + 2 : -4]
            if n.isdigit():
                best = max(best, int(n))
        return best

    def write_state(self, chunks: dict[str, Any]) -> None:
        self._write("state.json", json.dumps({"updated": time.time(), "chunks": chunks}, indent=1).encode())

    def state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.path / "state.json").read_text())
            return data
        except FileNotFoundError:
            return None

    def log_path(self, chunk: str, attempt: int) -> Path:
        return self.path / "logs" / f"{chunk}.a{attempt}.log"

    def write_image(self, image: str) -> None:
        self._write("image.json", json.dumps({"image": image}).encode())

    def image(self) -> str:
        """The image (digest or ID) resolved at the first submit: every attempt runs the same one."""
        return str(json.loads((self.path / "image.json").read_text())["image"])

    def write_report(self, report: dict[str, Any]) -> Path:
        self._write("report.json", json.dumps(report, indent=1, sort_keys=True).encode())
        return self.path / "report.json"

    def report(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.path / "report.json").read_text())
            return data
        except FileNotFoundError:
            return None


def next_job_id(data_root: Path, name: str, new: bool) -> str:
    """Job id = name; with --new the first free name-2, name-3 … when a run of that name exists."""
    if not new or not (data_root / "runs" / name).exists():
        return name
    n = 2
    while (data_root / "runs" / f"{name}-{n}").exists():
        n += 1
    return f"{name}-{n}"
