"""The data root's top folders and the run folder: every path of ``runs/<job>/`` named once, for
both of its readers.

``DataRootLayout`` names the folders ffswarm keeps for itself at the top of the data root (``runs/``,
``models/``, ``inbox/``, ``tenants/``: never a job's outputs); ``RunLayout`` the files of one run
folder. A tenant's pack keeps its run folder under ``runs/.tenants/<key>/``, where ``<key>`` is the
tenant's key: the first 10 hex digits of the sha256 of its name (tenant_key), whatever the name's
length. The pack's id carries the same key (``pack-<key>-<8 base32>``), so its folder follows from
the id alone (run_rel); the tenant itself is recorded in the pack's ``owner`` file. A lane of that
tenant mounts that folder alone, never another tenant's or a CLI job's run folders
(docs/operations.md#isolation). An operator finds a tenant's folder with
``python3 -c 'import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:10])' acme``.

The controller sees the run folder under its host's data root, a runner under the container's
``/data``; both build a ``RunLayout`` over their own root and ask it for paths, so a file is never
spelled twice. Every file has one writer (docs/architecture.md, "The controller/runner mirror"):

====================================  ==============================================================
``job.yaml``, ``plan.json``           controller, at the first submit
``job.sha256``                        controller, at the first submit: the job file's digest
``owner``                             controller (`serve`), for API jobs and tenants' packs: the tenant
``packed``                            controller (`serve`): a packed job's pack (controller/serve/packs.py)
``members.json``                      controller (`serve`), in a pack's folder: its jobs and their items
``chunks/<chunk>.json``               controller: the chunk manifest (contract/manifest.py)
``control.json``                      ``ffswarm scale`` / ``cancel``
``image.json``                        controller, once: the image every attempt runs
``identity-request.json``             controller (contract/identity.py)
``identity/identity.json``            controller ("pending"), then the identity step
``results/<chunk>.a<n>.jsonl``        controller creates it empty; attempt n's runner appends (once it
                                      is there, attempt n−1's runner takes no more items)
``results/<chunk>.a<n>.commits``      attempt n's runner: each output just before its rename
``logs/<chunk>.a<n>.log``             runner (or the controller, from the service's logs)
``logs/identity.log``                 the identity step
``attempts/<chunk>.a<n>.json``        runner: its record of the attempt (contract/attempt.py)
``segments/<item>-s<n>.mp4``          runner: a video's segments, joined by the controller
``state.json``                        controller's watch
``lease.json``                        the controller running the job (controller/run/job_lease.py)
``joins.jsonl``, ``report.json``      controller
====================================  ==============================================================

The run folder itself, ``chunks/`` and the controller's files are the controller's (not writable
by the runner's uid: docs/operations.md#trust-model); ``RUNNER_FOLDERS`` are the only places a runner
writes in it, so whatever the controller reads from them is parsed as hostile.

Pure: naming only, no file is touched here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import Generic, NamedTuple, TypeVar

from contract.paths import CONTAINER_DATA_ROOT

P = TypeVar("P", bound=PurePath)

RUNS = "runs"  # under the data root: one folder per job id
TENANT_RUNS = ".tenants"  # under runs/: a folder per tenant key holding its runs' folders (a dot: never a job id)
PACK_PREFIX = "pack-"  # `serve`'s packs' ids: no other job's id starts so (controller/run/jobs.py)
PACK_SUFFIX = 8  # lowercase base32 characters that end a pack's id
TENANT_KEY = 10  # hex digits of sha256(tenant name) that stand for the tenant in its runs' ids and folder
TENANT_JOB_NAME = 21  # characters of an API job's name that its id keeps (the id is at most 40: service names)
MODELS = "models"  # under the data root: one folder per model pack (contract/pack.py)
INBOX = "inbox"  # under the data root: job files handed to `serve` (controller/serve/daemon.py)
TENANTS = "tenants"  # under the data root: the API's tenants' areas, and their job records in .jobs/
RECORDS = ".jobs"  # under tenants/: one folder of job records per tenant (controller/job/owners.py)
RESERVED = (RUNS, MODELS, INBOX, TENANTS)  # the data root's top folders that are ffswarm's, never outputs
CHUNKS = "chunks"
RESULTS = "results"
LOGS = "logs"
SEGMENTS = "segments"
ATTEMPTS = "attempts"
IDENTITY_DIR = "identity"  # the identity step's answer: runner-written, so not in the folder's top
CONTROLLER_FOLDERS = (CHUNKS,)  # made with the run folder, the controller's
RUNNER_FOLDERS = (RESULTS, LOGS, SEGMENTS, ATTEMPTS, IDENTITY_DIR)  # made with it, the runner's to write
SUBFOLDERS = (*CONTROLLER_FOLDERS, *RUNNER_FOLDERS)
JOB_FILE = "job.yaml"
JOB_SHA256 = "job.sha256"  # the sha256 of the job file that started the run (its identity)
OWNER = "owner"  # API jobs and a tenant's packs: the tenant's name (controller-owned; CLI jobs have none)
PACKED = "packed"  # a job run inside a pack: the pack's job id (controller-owned)
MEMBERS = "members.json"  # a pack: each job it runs, its tenant, and its items' ids in the pack
PLAN = "plan.json"  # written last: its presence means the run folder is complete
CONTROL = "control.json"
IMAGE = "image.json"
IDENTITY_REQUEST = "identity-request.json"
IDENTITY = "identity.json"
IDENTITY_LOG = "identity.log"
STATE = "state.json"
LEASE = "lease.json"  # who runs the job now: one controller at a time
JOINS = "joins.jsonl"
REPORT = "report.json"

_TENANT_PACK = re.compile(rf"{PACK_PREFIX}(?P<key>[0-9a-f]{{{TENANT_KEY}}})-[a-z2-7]{{{PACK_SUFFIX}}}")
# an API job's id (tenant_job_id): its last part is 18 characters, never 8 as in the ids the API gave before
TENANT_JOB_ID = re.compile(
    rf"[a-z0-9-]{{1,{TENANT_JOB_NAME}}}-(?P<key>[0-9a-f]{{{TENANT_KEY}}})[a-z2-7]{{{PACK_SUFFIX}}}"
)
_ATTEMPT_LOG = re.compile(r"(?P<chunk>[^./][^/]*)\.a(?P<attempt>[0-9]+)\.log")
_RESULTS = re.compile(r"(?P<chunk>[a-z0-9][a-z0-9-]*)(?:\.a(?P<attempt>[0-9]{1,6}))?\.jsonl")


class AttemptLog(NamedTuple):
    """What a runner log's file name says: whose it is."""

    chunk: str
    attempt: int


def attempt_log_name(chunk: str, attempt: int) -> str:
    return f"{chunk}.a{attempt}.log"


def results_name(chunk: str, attempt: int) -> str:
    return f"{chunk}.a{attempt}.jsonl"


def tenant_key(tenant: str) -> str:
    """What stands for ``tenant`` in its packs' ids and in the folder of their run folders: the first
    TENANT_KEY hex digits of the sha256 of its name. Fixed-length, so a pack's id is a job id
    whatever the tenant's name; the config refuses two tenants with one key
    (controller/apiconfig.py parse_tenants), so a key names one tenant."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:TENANT_KEY]


def pack_job_id(tenant: str | None, suffix: str) -> str:
    """A pack's id: ``pack-<suffix>``, a tenant's ``pack-<tenant key>-<suffix>`` (``suffix``:
    PACK_SUFFIX lowercase base32 characters), so that its run folder is found from its id alone
    (run_rel)."""
    return f"{PACK_PREFIX}{suffix}" if tenant is None else f"{PACK_PREFIX}{tenant_key(tenant)}-{suffix}"


def tenant_job_id(tenant: str, name: str, suffix: str) -> str:
    """An API job's id: ``<name>-<tenant key><suffix>`` (the name's first TENANT_JOB_NAME characters;
    ``suffix``: PACK_SUFFIX lowercase base32 characters), so that its run folder is in its tenant's
    folder of runs (run_rel), which the tenant's lanes see (controller/run/lanes.py)."""
    return f"{name[:TENANT_JOB_NAME]}-{tenant_key(tenant)}{suffix}"


def run_tenant_key(job: str) -> str | None:
    """The tenant key a tenant's pack's or API job's id carries (None: neither; a CLI job, or an API
    job whose id was given before ids carried the key)."""
    m = _TENANT_PACK.fullmatch(job) or TENANT_JOB_ID.fullmatch(job)
    return None if m is None else m["key"]


def may_own(job: str, tenant: str) -> bool:
    """Whether run folder ``job``'s ``owner`` may name ``tenant``: a job whose id carries a tenant key
    only that tenant; any other job any tenant (checked elsewhere). An ``owner`` that fails this is
    never believed."""
    key = run_tenant_key(job)
    return key is None or key == tenant_key(tenant)


def tenant_runs_rel(tenant: str) -> PurePosixPath:
    """The folder of the run folders of a tenant's packs and API jobs, relative to the data root
    (``runs/.tenants/<key>``): all a lane of that tenant sees of runs/ (docs/operations.md#isolation)."""
    return PurePosixPath(RUNS, TENANT_RUNS, tenant_key(tenant))


def run_rel(job: str) -> PurePosixPath:
    """A job's run folder relative to the data root: ``runs/<job>``; one whose id carries a tenant
    key (a tenant's pack's, an API job's) ``runs/.tenants/<tenant key>/<job>``."""
    key = run_tenant_key(job)
    return PurePosixPath(RUNS, job) if key is None else PurePosixPath(RUNS, TENANT_RUNS, key, job)


def parse_results_name(name: str) -> AttemptLog | None:
    """The chunk and attempt a file in results/ belongs to: ``c0007.a2.jsonl`` → (c0007, 2), the
    pre-attempt ``c0007.jsonl`` → (c0007, 0); None for anything else (a temporary name)."""
    m = _RESULTS.fullmatch(name)
    if m is None:
        return None
    return AttemptLog(m["chunk"], int(m["attempt"]) if m["attempt"] is not None else 0)


def parse_attempt_log(name: str) -> AttemptLog | None:
    """The chunk and attempt a log file name (``c0007.a2.log``) belongs to; None for any other file
    in logs/ (``identity.log``, a temporary name being written)."""
    m = _ATTEMPT_LOG.fullmatch(name)
    return None if m is None else AttemptLog(m["chunk"], int(m["attempt"]))


@dataclass(frozen=True)
class DataRootLayout(Generic[P]):
    """The folders ffswarm keeps at the top of a data root ``root``, of the same kind as ``root``
    (host Paths for the controller, container PurePosixPaths under ``/data`` for a runner)."""

    root: P

    @staticmethod
    def host(data_root: Path) -> DataRootLayout[Path]:
        return DataRootLayout(data_root)

    @staticmethod
    def container() -> DataRootLayout[PurePosixPath]:
        return DataRootLayout(PurePosixPath(CONTAINER_DATA_ROOT))

    @property
    def runs(self) -> P:
        return self.root / RUNS

    @property
    def models(self) -> P:
        return self.root / MODELS

    @property
    def inbox(self) -> P:
        return self.root / INBOX

    @property
    def tenants(self) -> P:
        return self.root / TENANTS

    @property
    def records(self) -> P:
        """Every tenant's job records (``tenants/.jobs/<tenant>/<job>.json``)."""
        return self.root / TENANTS / RECORDS

    def pack(self, name: str) -> P:
        """A model pack's folder (``models/<name>``)."""
        return self.root / MODELS / name

    def run(self, job: str) -> RunLayout[P]:
        """One job's run folder."""
        return RunLayout(self.root / run_rel(job))

    def tenant_runs(self) -> P:
        """The folder of every tenant's folder of pack run folders (``runs/.tenants``)."""
        return self.root / RUNS / TENANT_RUNS


@dataclass(frozen=True)
class RunLayout(Generic[P]):
    """The paths of one run folder ``dir`` (``<data root>/`` run_rel), of the same kind as ``dir``:
    host Paths for the controller, container PurePosixPaths for the runner and the manifests."""

    dir: P

    @staticmethod
    def host(data_root: Path, job: str) -> RunLayout[Path]:
        """The controller's view: under this host's data root."""
        return RunLayout(data_root / run_rel(job))

    @staticmethod
    def container(job: str) -> RunLayout[PurePosixPath]:
        """A runner's view, and what manifests and requests name: under ``/data``."""
        return RunLayout(PurePosixPath(CONTAINER_DATA_ROOT) / run_rel(job))

    @staticmethod
    def relative(job: str) -> RunLayout[PurePosixPath]:
        """Relative to the data root, as plan.json and reports name files."""
        return RunLayout(run_rel(job))

    @property
    def job_file(self) -> P:
        return self.dir / JOB_FILE

    @property
    def job_sha256(self) -> P:
        return self.dir / JOB_SHA256

    @property
    def owner(self) -> P:
        return self.dir / OWNER

    @property
    def packed(self) -> P:
        return self.dir / PACKED

    @property
    def members(self) -> P:
        return self.dir / MEMBERS

    @property
    def plan(self) -> P:
        return self.dir / PLAN

    @property
    def control(self) -> P:
        return self.dir / CONTROL

    @property
    def image(self) -> P:
        return self.dir / IMAGE

    @property
    def identity_request(self) -> P:
        return self.dir / IDENTITY_REQUEST

    @property
    def identity(self) -> P:
        return self.dir / IDENTITY_DIR / IDENTITY

    @property
    def identity_legacy(self) -> P:
        """Where run folders made before the trust boundary kept the answer (read-only fallback)."""
        return self.dir / IDENTITY

    @property
    def identity_dir(self) -> P:
        return self.dir / IDENTITY_DIR

    @property
    def state(self) -> P:
        return self.dir / STATE

    @property
    def lease(self) -> P:
        return self.dir / LEASE

    @property
    def joins(self) -> P:
        return self.dir / JOINS

    @property
    def report(self) -> P:
        return self.dir / REPORT

    @property
    def chunks_dir(self) -> P:
        return self.dir / CHUNKS

    @property
    def results_dir(self) -> P:
        return self.dir / RESULTS

    @property
    def logs_dir(self) -> P:
        return self.dir / LOGS

    @property
    def segments_dir(self) -> P:
        return self.dir / SEGMENTS

    @property
    def attempts_dir(self) -> P:
        return self.dir / ATTEMPTS

    def subfolders(self) -> tuple[P, ...]:
        """The run folder and all its sub-folders."""
        return (self.dir, *(self.dir / sub for sub in SUBFOLDERS))

    def runner_folders(self) -> tuple[P, ...]:
        """The sub-folders runners write into (the rest of the run folder is the controller's)."""
        return tuple(self.dir / sub for sub in RUNNER_FOLDERS)

    def controller_folders(self) -> tuple[P, ...]:
        """The run folder and its sub-folders only the controller writes."""
        return (self.dir, *(self.dir / sub for sub in CONTROLLER_FOLDERS))

    def manifest(self, chunk: str) -> P:
        return self.dir / CHUNKS / f"{chunk}.json"

    def lane_handoff(self, chunk: str) -> P:
        """The hand-off file of a lane started for this job's ``chunk`` (contract/handoff.py)."""
        return self.dir / CHUNKS / f"{chunk}.lane.json"

    def results(self, chunk: str, attempt: int) -> P:
        """One attempt's result lines (``results/<chunk>.a<n>.jsonl``): one writer per file, since
        appends from two NFS clients to one file are not atomic. The controller creates it, empty,
        before the attempt's service (controller/run/chunks.py)."""
        return self.dir / RESULTS / results_name(chunk, attempt)

    def commits(self, chunk: str, attempt: int) -> P:
        """The runner's commit journal of one attempt: a line per output just before its rename, so
        that a later attempt knows a file the killed one renamed but had no result line for."""
        return self.dir / RESULTS / f"{chunk}.a{attempt}.commits"

    def legacy_results(self, chunk: str) -> P:
        """The single results file of run folders made before results were kept per attempt; read
        as attempt 0."""
        return self.dir / RESULTS / f"{chunk}.jsonl"

    def log(self, chunk: str, attempt: int) -> P:
        return self.dir / LOGS / attempt_log_name(chunk, attempt)

    def attempt_record(self, chunk: str, attempt: int) -> P:
        """The runner's record of one attempt (contract/attempt.py)."""
        return self.dir / ATTEMPTS / f"{chunk}.a{attempt}.json"

    @property
    def identity_log(self) -> P:
        return self.dir / LOGS / IDENTITY_LOG

    def segment(self, segment_id: str, ext: str) -> P:
        """A video segment's output (``ext``: contract/ffmpeg.py SEGMENT_EXT)."""
        return self.dir / SEGMENTS / f"{segment_id}{ext}"
