"""`ffswarm serve`'s inbox decisions, with a stand-in for running a job (no Docker needed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from controller.config import Config, parse_config
from controller.run.metrics import Metrics
from controller.run.serve import Inbox, Outcome, Server


def serve_once(tmp_path: Path, outcome: Outcome) -> tuple[Inbox, list[Path]]:
    inbox = Inbox(tmp_path / "inbox")
    inbox.ensure()
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    old = time.time() - 10
    os.utime(job, (old, old))
    ran: list[Path] = []
    done = threading.Event()

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        ran.append(path)
        done.set()
        return outcome

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    server = Server(config, inbox, Metrics(), poll=0.05, run=run, retry_after=60)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    assert done.wait(10)
    time.sleep(0.5)  # let the job thread move the file and the loop take another look
    server.stop.set()
    t.join(5)
    return inbox, ran


def test_a_job_the_swarm_cannot_take_waits_in_the_inbox(tmp_path: Path) -> None:
    inbox, ran = serve_once(tmp_path, Outcome(False, "CapacityError (exit 69): no swarm", retry=True))
    assert len(ran) == 1  # not picked again during the wait
    back = inbox.path / "a.yaml"
    assert back.is_file() and back.stat().st_mtime > time.time() + 50
    assert not list(inbox.failed.iterdir()) and not list(inbox.running.iterdir())


def test_a_bad_job_lands_in_failed_with_its_reason(tmp_path: Path) -> None:
    inbox, _ = serve_once(tmp_path, Outcome(False, "JobFileError (exit 65): a.yaml: name: required"))
    assert (inbox.failed / "a.yaml").is_file()
    assert "exit 65" in (inbox.failed / "a.yaml.reason.txt").read_text()
