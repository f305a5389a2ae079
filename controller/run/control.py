"""Job control: the one writer of a run folder's control.json, for the CLI and the API alike.

control.json holds what may change while a job runs: its width (``max_concurrent``, how many of its
chunks run at once) and its cancel flag. The job's controller reads it at every turn
(controller/run/supervisor.py). `ffswarm scale`, `cancel`, `submit`, `resume` and `retry`, and the
API's scale, cancel and retry change it only through this module, so one half of the file is never
written over by a change to the other. Only the run folder's creation writes the first one.

The refusals (a width over the limit, a job already finished) are each front end's to word: the
CLI names commands, the API names endpoints; the changes they guard are these.
"""

from __future__ import annotations

from pathlib import Path

from controller.config import Config
from controller.errors import UsageError
from controller.job import claims
from controller.run import handover, status, webhooks
from controller.run.jobs import open_run
from controller.run.rundir import Control, RunDir
from controller.swarm.backend import SwarmBackend


def set_width(rundir: RunDir, n: int) -> None:
    """At most ``n`` of the job's chunks at once from its controller's next turn; a cancel stays."""
    rundir.write_control(Control(n, cancel=rundir.control().cancel))


def flag_cancel(rundir: RunDir) -> None:
    """The job's controller stops it at its next turn; its width stays (a resume runs it as wide)."""
    rundir.write_control(Control(rundir.control().max_concurrent, cancel=True))


def uncancel(rundir: RunDir) -> bool:
    """A cancelled job asked to run again (submit, resume, retry): its flag cleared. False when it
    was not cancelled (nothing written)."""
    current = rundir.control()
    if not current.cancel:
        return False
    rundir.write_control(Control(current.max_concurrent, cancel=False))
    return True


def hand_back(rundir: RunDir, inbox: Path, frozen: bytes) -> None:
    """Retry by hand-over: the job's remaining items run again under `serve`, which continues a job
    whose run folder exists. A cancelled job is un-cancelled first; then its frozen job file (the
    bytes its run folder keeps) is placed as ``inbox/<id>.yaml``. A file already there: UsageError
    (another retry won)."""
    webhooks.run_again(rundir)  # its next end is a new announcement
    uncancel(rundir)
    handover.place(inbox, f"{rundir.job}.yaml", frozen.decode("utf-8"))


# -- the CLI's commands --------------------------------------------------------------------------------
def cancel(config: Config, job_id: str, backend: SwarmBackend) -> int:
    """`ffswarm cancel`: flag the job cancelled (a running controller stops) and remove its services
    now, so a job whose controller is gone stops too. Committed outputs stay. A finished job is refused."""
    _, rundir = open_run(config, job_id)
    _refuse_finished(rundir, "cancel")
    flag_cancel(rundir)
    services = backend.services(job_id)
    for svc in services:
        backend.remove_service(svc.name)
    backend.remove_exited_containers(job_id)
    claims.release(config.data_root, job_id)
    return len(services)


def scale(config: Config, job_id: str, n: int) -> None:
    """`ffswarm scale`: the job's width, capped by the cluster's ``policy.limits.max_concurrent``."""
    limit = config.policy.limits.max_concurrent
    if n > limit:
        raise UsageError(f"scale {job_id} {n}: asks for {n}, the limit is {limit} (the cluster's policy.limits)")
    _, rundir = open_run(config, job_id)
    _refuse_finished(rundir, "scale")
    set_width(rundir, n)


def _refuse_finished(rundir: RunDir, what: str) -> None:
    if status.finished(rundir):
        raise UsageError(
            f"job {rundir.job} already finished: nothing to {what} "
            f"(`ffswarm retry {rundir.job}` re-runs its failed items, `ffswarm status {rundir.job}` shows it)"
        )
