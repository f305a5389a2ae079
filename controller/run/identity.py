"""The submit-time identity step: who to swap in, decided once per job.

The controller has no face models (it is a small Docker client), so it asks the runner image: a
one-shot service, shaped and hardened like a chunk service, runs `python -m runner_image identity`
on the job's source (and reference) photos and writes the embeddings to runs/<job>/identity.json.
Every chunk and every video segment reads that one file, so they all swap in and select exactly the
same person, and a source photo without exactly one face refuses the whole job, naming the photo.

The step runs BESIDE the job's first chunk services, not before them: the run folder is created with
identity.json saying "pending", chunk runners start, load their models and wait for the file to
change (worker.await_identity), while the identity service embeds a handful of photos. It reserves
no GPU (a few photos are quick on the CPU) so it never holds a slot the first chunks need. When it
fails, the job's services are removed and its run folder with them (jobs.supervise): nothing has
been committed, since no runner gets past the wait.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path, PurePosixPath

from contract.errors import ManifestError
from contract.exits import RunnerExit
from contract.identity import IdentityRequest, IdentityResult
from contract.identity_table import Identity, identity_id
from contract.layout import RunLayout
from contract.manifest import SCHEMA_IDENTITIES, SCHEMA_VERSION
from contract.paths import CONTAINER_DATA_ROOT, user_path, user_text
from contract.s3 import S3Url, StorageAccess
from controller.config import Config
from controller.errors import CapacityError, FfswarmError, JobFileError, MissingInputError
from controller.job.resolve import ResolvedJob
from controller.job.spec import JobSpec
from controller.run.failures import last_words
from controller.run.oneshot import OneShot, OneShotResult
from controller.run.rundir import RunDir, RunFileError
from controller.swarm.backend import SwarmBackend
from controller.swarm.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, LABEL_ROLE, RunnerSettings, chunk_service

STEP = "identity"
STEP_TIMEOUT = 600.0  # once scheduled; a handful of photos take seconds
STEP_ATTEMPTS = 3  # a step ended by its node (drained, rejected) or a temporary failure is run again
RETRY_STATES = {"shutdown", "orphaned", "rejected"}


def _c(root: Path, p: Path | S3Url) -> str:
    if isinstance(p, S3Url):
        return str(p)
    return f"{CONTAINER_DATA_ROOT}/{p.resolve().relative_to(root).as_posix()}"


def container_path(job_id: str) -> str:
    """Where chunk runners read the answer (Manifest.identity)."""
    return str(RunLayout.container(job_id).identity)


def wait_limit(config: Config) -> float:
    """How long a chunk runner waits for the answer (Manifest.identity_timeout): as long as the step
    may take, queueing for a node included, and a minute more."""
    return float(config.schedule_timeout) + STEP_TIMEOUT + 60.0


def request_for(
    config: Config, spec: JobSpec, resolved: ResolvedJob, job_id: str, tenant: str | None = None
) -> IdentityRequest:
    """A pairs job asks for every distinct person (an identity table); any other job for one. Its
    objects are read with the job's credentials (``tenant``'s own for a tenant's job, Config.s3)."""
    root = config.data_root
    people = {identity_id(n): Identity(tuple(_c(root, p) for p in ps)) for n, ps in enumerate(resolved.identities)}
    return IdentityRequest(
        job=job_id,
        pack_dir=f"{CONTAINER_DATA_ROOT}/models/{spec.models}",
        sources=() if people else tuple(_c(root, s) for s in resolved.sources),
        identities=people,
        schema=SCHEMA_IDENTITIES if people else SCHEMA_VERSION,
        output=container_path(job_id),
        providers=("cpu",),  # a few photos: no GPU reserved, none taken from the first chunks
        reference=_c(root, resolved.reference) if resolved.reference else None,
        detector_threshold=spec.detector.threshold,
        detector_size=spec.detector.size,
        storage=_access(config, tenant) if resolved.uses_s3 else None,
    )


def _access(config: Config, tenant: str | None) -> StorageAccess | None:
    s3 = config.s3(tenant)
    return None if s3 is None else s3.access()


def prepare(rundir: RunDir, request: IdentityRequest, step: bool = True) -> None:
    """The request, and the answer saying "pending" (a file that exists from the start is re-read
    promptly by NFS clients, which may cache a missing name for tens of seconds). Without a ``step``
    (each chunk embeds its own people: a pack's) the request alone, for what the job reads (usage's
    bytes in)."""
    rundir.write_file(rundir.layout.identity_request, request.to_json().encode())
    if step:
        rundir.write_file(rundir.layout.identity, IdentityResult(pending=True).to_json().encode())


MAX_RESULT_BYTES = 1024**2  # a few embeddings of 512 floats and one reason per photo
PER_IDENTITY_BYTES = 32 * 1024  # a pairs job's answer: one embedding (~11 kB as text) or reason per person
MAX_EMBEDDING = 4096
MAX_ERROR = 8192


def read_result(rundir: RunDir, people: int = 0) -> IdentityResult | None:
    """identity.json, written by a runner: parsed as hostile (no link followed, bounded, every field
    checked; ``people``: the identities a pairs job asked for, which the bound allows for). None
    while it is missing or not (yet) a valid answer; a file that can never be one (a link, a fifo,
    oversize) is an answer saying so, which refuses the job."""
    limit = MAX_RESULT_BYTES + people * PER_IDENTITY_BYTES
    try:
        data = rundir.read_file(rundir.layout.identity, limit)
        if data is None:  # a run folder made before identity/ existed
            data = rundir.read_file(rundir.layout.identity_legacy, limit)
    except RunFileError as e:
        return IdentityResult(error=f"the identity step's answer is unusable: {e}")
    if data is None:
        return None
    try:
        result = IdentityResult.from_json(data.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError):
        return None  # half-visible on a network filesystem, or garbage: read again (the step's timeout ends it)
    return result if _plausible(result) else IdentityResult(error="the identity step's answer is malformed")


def _plausible(r: IdentityResult) -> bool:
    embeddings = [r.source_embedding, *([r.reference_embedding] if r.reference_embedding is not None else [])]
    embeddings += [p.embedding for p in r.identities.values() if p.embedding is not None]
    return (
        all(len(e) <= MAX_EMBEDDING and all(math.isfinite(v) for v in e) for e in embeddings)
        and (r.error is None or (isinstance(r.error, str) and len(r.error) <= MAX_ERROR))
        and (r.provider is None or (isinstance(r.provider, str) and len(r.provider) <= 64))
        and len(r.sources) <= 10_000
        and all(p.embedding is not None or p.error is not None for p in r.identities.values())
    )


class Step:
    """The identity service of one job, polled until it has answered; `poll()` raises the job's error
    (JobFileError naming the photo, MissingInputError, CapacityError) when it cannot run."""

    def __init__(
        self, config: Config, backend: SwarmBackend, settings: RunnerSettings, rundir: RunDir, job_file: str
    ) -> None:
        self.config = config
        self.rundir = rundir
        self.job_file = job_file
        request = rundir.read_file(rundir.layout.identity_request, MAX_RESULT_BYTES)
        if request is None:
            raise RunFileError(f"{rundir.rel(rundir.layout.identity_request)}: missing")
        try:
            self.request = IdentityRequest.from_json(request.decode("utf-8"))
        except (ManifestError, UnicodeDecodeError):
            raise RunFileError(f"{rundir.rel(rundir.layout.identity_request)}: not a valid request") from None
        rundir.make_dirs()  # logs/identity.log is written by the step itself
        cpu_only = dataclasses.replace(settings, gpus=0)
        spec = chunk_service(cpu_only, STEP, 1)
        spec = dataclasses.replace(
            spec,
            name=f"ffswarm-{settings.job}-{STEP}",
            command=(*settings.command, STEP, "--request", str(self._request_path())),
            labels={**spec.labels, LABEL_CHUNK: STEP, LABEL_ATTEMPT: "1", LABEL_ROLE: STEP},
        )
        self.backend, self.spec, self.attempts = backend, spec, 1
        self.shot = self._shot()

    def _read(self) -> IdentityResult | None:
        """The answer, which for a pairs job must answer every person asked about."""
        result = read_result(self.rundir, len(self.request.identities))
        if result is not None and result.answered and set(self.request.identities) - set(result.identities):
            return IdentityResult(error="the identity step's answer is malformed (a person is missing)")
        return result

    def _request_path(self) -> PurePosixPath:
        """The request, in the container: beside the answer it asks for."""
        return RunLayout.container(self.rundir.job).identity_request

    def _shot(self) -> OneShot:
        schedule = float(self.config.schedule_timeout)
        return OneShot(self.backend, self.spec, timeout=schedule + STEP_TIMEOUT, schedule_timeout=schedule)

    def poll(self) -> IdentityResult | None:
        result = self._read()
        if result is not None and result.answered:
            # The file is the truth, however the container ended after writing it — or whatever the
            # swarm says of its task after an engine restart (seen: a task left unfinished for the
            # whole schedule_timeout although its container had answered and gone).
            self.shot.abort()
            return result
        outcome = self.shot.poll()
        if outcome is None:
            self._unless_node_lost()
            return None
        result = self._read()
        if result is not None and result.answered:
            return result  # written between the two reads
        temporary = outcome.state in RETRY_STATES or outcome.exit_code == RunnerExit.TEMPORARY
        if temporary and self.attempts < STEP_ATTEMPTS:
            self.attempts += 1
            self.shot = self._shot()  # e.g. its node was drained: the scheduler places it elsewhere
            return None
        return self._answer(outcome)

    def abort(self) -> None:
        self.shot.abort()

    def _unless_node_lost(self) -> None:
        """Swarm (engine 20.10) leaves a dead node's task "running": the first chunks would wait for
        the step's whole timeout. Like the supervisor does for chunks, run it again elsewhere."""
        task = self.shot.task
        if (
            task is None
            or task.node_id is None
            or task.state not in ("assigned", "accepted", "preparing", "starting", "running")
        ):
            return
        node = next((n for n in self.backend.nodes() if n.node_id == task.node_id), None)
        if node is None or node.state == "ready" or self.attempts >= STEP_ATTEMPTS:
            return
        self.shot.abort()
        self.attempts += 1
        self.shot = self._shot()

    def _answer(self, outcome: OneShotResult) -> IdentityResult:
        config, request, job_file = self.config, self.request, self.job_file
        result = self._read()
        if result is not None and result.error:  # photos named as the job file does (an older runner: /data/…)
            error = user_text(result.error)
            reference = request.reference and f"reference photo {user_path(request.reference)}:" in error
            raise JobFileError(job_file, "reference" if reference else "source", error)
        words = last_words(outcome.logs) or outcome.message
        if outcome.exit_code == RunnerExit.MISSING_INPUT:
            raise MissingInputError(f"{job_file}: {words}")
        if outcome.state == "unscheduled":
            raise CapacityError(
                f"{job_file}: no node took the job's identity step within {config.schedule_timeout}s "
                f"(the job's placement constraints): {outcome.message}"
            )
        raise FfswarmError(f"{job_file}: the identity step failed ({outcome.state}, exit {outcome.exit_code}): {words}")


def start(
    config: Config, backend: SwarmBackend, settings: RunnerSettings, rundir: RunDir, job_file: str
) -> Step | None:
    """The step of a run folder whose identity is still pending (a new job, or a controller that died
    during the step); None when identity.json already holds the answer, or when no chunk waits for
    one (a pack's: each chunk embeds its own people, jobs.PreparedJob.people_in_chunks)."""
    result = read_result(rundir)
    if result is not None and result.answered:
        return None
    if not _chunks_wait(rundir):
        return None
    return Step(config, backend, settings, rundir, job_file)


def _chunks_wait(rundir: RunDir) -> bool:
    """Whether the job's chunk manifests (the controller's files) read identity.json."""
    chunks = rundir.plan().chunks
    return not chunks or rundir.manifest(chunks[0].id).identity is not None


def ensure(config: Config, backend: SwarmBackend, settings: RunnerSettings, rundir: RunDir, job_file: str) -> None:
    """Blocking form, for callers that start no chunks themselves (`ffswarm render`)."""
    step = start(config, backend, settings, rundir, job_file)
    if step is None:
        return
    try:
        while step.poll() is None:
            time.sleep(0.1)
    except BaseException:
        step.abort()
        raise
