"""The submit-time identity step: who to swap in, decided once per job.

The controller has no face models (it is a small Docker client), so it asks the runner image: a
one-shot service, shaped and hardened like a chunk service, runs `python -m runner_image identity`
on the job's source (and reference) photos and writes the embeddings to the run folder. They go
into every manifest, so every chunk and every video segment swaps in and selects the same person,
and a source photo without exactly one face is a job-file error before any chunk starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from controller.config import Config
from controller.errors import CapacityError, FfswarmError, JobFileError, MissingInputError
from controller.jobspec import JobSpec, ResolvedJob
from controller.oneshot import run_oneshot
from controller.rundir import RunDir
from controller.servicespec import LABEL_ATTEMPT, LABEL_CHUNK, RunnerSettings, chunk_service
from controller.supervisor import last_words
from controller.swarm import SwarmBackend
from runner_image.manifest import CONTAINER_DATA_ROOT, IdentityRequest, IdentityResult, RunnerExit

STEP = "identity"


def _c(root: Path, p: Path) -> str:
    return f"{CONTAINER_DATA_ROOT}/{p.resolve().relative_to(root).as_posix()}"


def request_for(config: Config, spec: JobSpec, resolved: ResolvedJob, job_id: str) -> IdentityRequest:
    root = config.data_root
    return IdentityRequest(
        job=job_id,
        pack_dir=f"{CONTAINER_DATA_ROOT}/models/{spec.models}",
        sources=tuple(_c(root, s) for s in resolved.sources),
        output=f"{CONTAINER_DATA_ROOT}/runs/{job_id}/identity.json",
        providers=tuple(spec.providers),
        reference=_c(root, resolved.reference) if resolved.reference else None,
        detector_threshold=spec.detector.threshold,
        detector_size=spec.detector.size,
    )


def compute(
    config: Config,
    backend: SwarmBackend,
    settings: RunnerSettings,
    rundir: RunDir,
    request: IdentityRequest,
    job_file: str,
) -> IdentityResult:
    """Run the identity step; raise a job-file error naming the photo when a source is unusable."""
    rundir.make_dirs()  # logs/identity.log is written by the step itself
    rundir.write_file("identity-request.json", request.to_json().encode())
    spec = chunk_service(settings, STEP, 1)
    spec = dataclasses.replace(
        spec,
        name=f"ffswarm-{settings.job}-{STEP}",
        command=(*settings.command, STEP, "--request", f"{request.output.rsplit('/', 1)[0]}/identity-request.json"),
        labels={**spec.labels, LABEL_CHUNK: STEP, LABEL_ATTEMPT: "1", "io.ffswarm.role": STEP},
    )
    outcome = run_oneshot(
        backend, spec, timeout=config.schedule_timeout + 600, schedule_timeout=config.schedule_timeout
    )
    result_path = rundir.path / "identity.json"
    result = IdentityResult.from_json(result_path.read_text()) if result_path.is_file() else None
    if result is not None and result.error:
        field = "reference" if request.reference and request.reference in result.error else "source"
        raise JobFileError(job_file, field, result.error.replace(f"{CONTAINER_DATA_ROOT}/", ""))
    if outcome.ok and result is not None:
        return result
    words = last_words(outcome.logs) or outcome.message
    if outcome.exit_code == RunnerExit.MISSING_INPUT:
        raise MissingInputError(f"{job_file}: {words}")
    if outcome.state == "unscheduled":
        raise CapacityError(
            f"{job_file}: no node took the job's first service within {config.schedule_timeout}s "
            f"(placement and GPU reservation of the job): {outcome.message}"
        )
    raise FfswarmError(f"{job_file}: the identity step failed ({outcome.state}, exit {outcome.exit_code}): {words}")
