"""A job's stores, probed then relied on (docs/storage.md#what-ffswarm-records-about-a-store): the
records of this data root (controller/storage/record.py) as the controller keeps them, read and
written at submit (a job writing objects is refused where a commit could replace another's object;
otherwise its runners learn whether conditional commits may go up in parts), by `doctor --store`,
and by the join (the same choice for a joined video's commit)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from contract.s3 import S3Url, is_s3
from contract.s3put import Upload
from controller.config import Config
from controller.errors import FfswarmError
from controller.job import access, owners
from controller.job.plan import Plan
from controller.storage.record import Records, commit_mode, endpoint_of
from controller.storage.settings import S3Settings
from controller.volume import Volume

if TYPE_CHECKING:
    from controller.storage.s3 import S3Store


def records(config: Config, clock: Callable[[], float] | None = None) -> Records:
    """The data root's records: written as the controller, believed when root's or the controller's
    and never the runner's (a runner with the whole data root could otherwise forge one)."""
    try:
        runner: int | None = access.parse_ids(config.runner_uid_gid())[0]
    except FfswarmError:  # no runner identity to tell apart (a data root owned by root): theirs is unknown
        runner = None
    controller = config.controller_ids()
    trusted = owners.trusted_uids(controller[0], runner)
    return Records(Volume(config.data_root), controller, trusted, clock or time.time)


def endpoint(settings: S3Settings) -> str:
    return endpoint_of(settings.endpoint_url, settings.region)


def commit_in_parts(config: Config, store: S3Store, outputs: list[str]) -> bool:
    """For a job writing ``outputs`` (those that are s3:// count): whether its conditional commits
    may go up in parts; StorageAccessError (exit 66) when a bucket's store lacks a guarantee that
    commits need. Each bucket's record is read, or the store probed under the job's first output
    there when the record is missing, untrusted or older than ``storage.s3.probe_max_age``."""
    urls = [S3Url.parse(o) for o in outputs if is_s3(o)]
    if not urls:
        return False
    settings = store.settings
    return commit_mode(records(config), endpoint(settings), settings.probe_max_age, urls, store.capabilities)


def join_upload(config: Config, plan: Plan, store: S3Store) -> Upload:
    """How the join commits the plan's joined videos: in parts only when every output bucket's
    current record says the store honours conditions on CompleteMultipartUpload; else one PUT
    (up to its 5 GiB). Nothing is probed here: submit did, and refused a store that was unsafe."""
    settings = store.settings
    kept = records(config)
    buckets = {S3Url.parse(v.output).bucket for v in plan.videos if is_s3(v.output)}
    found = [kept.load(endpoint(settings), b) for b in sorted(buckets)]
    fresh = [r for r in found if r is not None and kept.clock() - r.probed_at <= settings.probe_max_age]
    parts = bool(buckets) and len(fresh) == len(buckets) and all(r.capabilities.conditional_complete for r in fresh)
    return Upload(conditional_complete=parts)
