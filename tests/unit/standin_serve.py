"""A stand-in for `ffswarm serve` in tests of the client and the CLI's remote mode: it claims each
job file the API hands over and leaves the run folder as a real run would (the same code prepares
and starts it: controller/run/usecase.py, jobs.py), with one result per item, the report and the
output files, then moves the inbox file to done/ or failed/ — no swarm, no runner. A job handed
back by a retry is continued in its run folder, and its items not ok before run again (and pass)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from contract.results import ItemResult, ItemStatus
from controller.config import Config
from controller.run import usecase
from controller.run.fold import Fold
from controller.run.jobs import start_run
from controller.run.report import build_report
from controller.run.rundir import RunDir, Stage
from controller.serve import daemon as serve
from controller.serve.inbox import Inbox
from tests.builders import JPEG
from tests.polling import Polling

IMAGE = "sha256:" + "1" * 64


def run_job(config: Config, job: str, fails: Callable[[str], bool] = lambda _: False) -> RunDir:
    """serve's run of the handed-over ``inbox/<job>.yaml``: items whose input ``fails`` says fail on
    their first attempt; every other item pending is ok."""
    box = Inbox(config.data_root / "inbox", config.policy.limits.job_file)
    box.ensure()
    path = config.data_root / "inbox" / f"{job}.yaml"
    settled = time.time() - 10
    os.utime(path, (settled, settled))
    claimed = box.claim(path)
    assert claimed is not None
    tenant = serve.job_owner(config, claimed)
    prepared = usecase.one_job(config, claimed, tenant=tenant)
    rundir = start_run(config, prepared, IMAGE)  # or the run folder it has, continued (a retry)
    plan = rundir.plan()
    fold = Fold.read(plan, rundir)
    now = time.time()
    for chunk in plan.chunks:
        for item_id in chunk.items:
            done = fold.result(item_id)
            if done is not None and done.status is ItemStatus.OK:
                continue
            attempt = 1 if done is None else done.attempt + 1
            item = plan.item(item_id)
            bad = attempt == 1 and fails(item.input)
            if not bad:
                (config.data_root / item.output).write_bytes(JPEG)
            status, out = (ItemStatus.ERROR, None) if bad else (ItemStatus.OK, f"/data/{item.output}")
            reason = f"no face found in /data/{item.input}" if bad else None
            line = ItemResult(item_id, status, attempt, f"/data/{item.input}", out, reason, started=now, finished=now)
            results = rundir.layout.results(chunk.id, attempt)
            results.parent.mkdir(parents=True, exist_ok=True)
            with results.open("a") as f:
                f.write(line.to_line())
    report = build_report(plan, rundir, {}, IMAGE, now)
    rundir.write_report(report.to_dict())
    rundir.enter(Stage.ENDED)
    Inbox(config.data_root / "inbox").finish(claimed, report.exit_code() == 0, None)
    return rundir


class StandinServe(Polling):
    """Runs every job file that appears in the inbox, in a thread, while the test drives a client."""

    def __init__(self, config: Config, fails: Callable[[str], bool] = lambda _: False) -> None:
        self.config = config
        self.fails = fails
        self.ran: list[str] = []

    def poll(self) -> None:
        for path in sorted(Path(self.config.data_root, "inbox").glob("*.yaml")):
            self.ran.append(path.stem)
            run_job(self.config, path.stem, self.fails)
