"""A job while and after it runs: the use case (usecase.py: open or start, supervise, report), the
job prepared for it (jobs.py: prepare, next id, run folder opened or started), its stages
(identity.py with oneshot.py, supervisor.py with chunks.py and failures.py, join.py, report.py,
timings.py, hooks.py; launch.py, lanes.py and warmth.py: how its attempts start, warm runners and
who gets them), the run folder (rundir.py, fold.py, history.py, attempts.py) and its lease
(job_lease.py on lease.py), its control (control.py: width, cancel, un-cancel, retry's hand-over),
and what watches it (status.py, progress.py, metrics.py, usage.py, dryrun.py). handover.py hands a
job to a serving controller and reads its heartbeat. Nothing here imports controller/serve/, which
runs jobs through this package."""
