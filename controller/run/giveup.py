"""A job the controller gives up on ends as any job ends.

`serve` gives up on a job when running it met an internal error, or when its controller kept stopping
while it ran the job; the job's file goes to ``inbox/failed/`` with the reason. A job that already has
a run folder then ends through the one end of a job (controller/run/usecase.py ``end``): its report,
each item without a result failed for that reason, its ``job.finished`` queued, stage ENDED, its output
claims released. Its status then says how it ended, instead of ``stopped`` for ever.
"""

from __future__ import annotations

from controller import log
from controller.config import Config
from controller.errors import CapacityError, FfswarmError
from controller.run import job_lease as lease
from controller.run.chunks import ended_runs
from controller.run.fold import Fold
from controller.run.jobs import open_run, owner
from controller.run.report import Report
from controller.run.rundir import RunDir, Stage
from controller.run.usecase import end
from controller.swarm.backend import SwarmBackend


def give_up(config: Config, job_id: str, reason: str, backend: SwarmBackend | None = None) -> Report | None:
    """End a job the controller gives up on (`serve`: an internal error, or a controller that kept
    stopping while it ran the job) through the one end of a job: every chunk with an item that has
    no result fails for ``reason`` (a cancelled job's are cancelled: it stays cancelled), its report
    says ``reason``, its ``job.finished`` is queued. ``backend``: its services are removed first
    (best effort: an engine that does not answer leaves them to the next sweep of a `resume`).
    None, and nothing touched, when there is nothing to end: no run folder, a job that has ended,
    or one whose lease another controller holds (that controller ends it)."""
    rundir = RunDir(config.data_root, job_id, owner(config), config.controller_ids())
    logger = log.get(job=job_id)
    if not rundir.exists() or (rundir.state() or {}).get("stage") == Stage.ENDED:
        return None
    held = lease.Lease(rundir)
    try:
        held.acquire()
    except CapacityError as e:  # another controller runs it (or took the lease meanwhile): it is theirs
        logger.info("job_not_given_up", error=str(e))
        return None
    try:
        if backend is not None:
            try:
                for svc in backend.services(job_id):
                    backend.remove_service(svc.name)
            except FfswarmError as e:
                logger.warning("job_services_not_removed", error=str(e))
        job, _ = open_run(config, job_id)
        plan = rundir.plan()
        fold = Fold.read(plan, rundir)
        cancelled = rundir.control().cancel
        chunks = ((c.id, c.items) for c in plan.chunks)
        runs = ended_runs(chunks, lambda i: fold.result(i) is not None, cancelled, lambda _: reason)
        report = end(config, job, rundir, plan, runs, rundir.image(), held.started, logger.info, reason)
        logger.warning("job_given_up", reason=reason, **vars(report.counts))
        return report
    finally:
        held.release()
