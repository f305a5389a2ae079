"""A job before it runs: the job file read and checked (spec.py, files.py; the field checks are
controller/settings/fields.py), resolved on the data root (resolve.py, paths.py), judged with the
runner's ids (access.py), its model pack checked (pack_checks.py), its videos probed (video.py) and
the whole cut into items, chunks and manifests (plan.py). Nothing here talks to Docker or writes a
run folder. Preparing a job from these steps and opening its run folder is controller/run/jobs.py."""
