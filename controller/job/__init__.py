"""A job before it runs: the job file read and checked (spec.py, files.py; the field checks are
controller/settings/fields.py), resolved on the data root (resolve.py, paths.py), judged with the
runner's ids (access.py), its videos probed (video.py) and the whole cut into items, chunks and
manifests (plan.py). Nothing here talks to Docker or writes a run folder."""
