"""A job while and after it runs: the use case (jobs.py: prepare, start, supervise, report), its
stages (identity.py, supervisor.py with chunks.py and failures.py, join.py, report.py, timings.py,
hooks.py), the run folder (rundir.py), its control (control.py: width, cancel), and what watches or
serves jobs (status.py, progress.py, metrics.py, serve.py, handover.py)."""
