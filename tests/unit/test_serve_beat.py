"""`serve`'s heartbeat renews the lease of every file it holds: a file that ended meanwhile (its thread
moved it to done/ and removed its lease) is no error; a lease another controller took is one."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from structlog.testing import capture_logs

from controller.run.lease import Owner, Record
from controller.run.metrics import Metrics
from controller.serve.daemon import Inbox, Outcome, Server
from tests.builders import make_config


def test_a_held_file_that_ended_meanwhile_is_not_a_lost_lease_and_one_taken_over_is(tmp_path: Path) -> None:
    config, _ = make_config(tmp_path)

    def run(config: object, path: Path, metrics: Metrics) -> Outcome:
        return Outcome(True, None)

    server = Server(config, Inbox(config.data_root / "inbox"), Metrics(), poll=0.05, run=run)
    server.inbox.ensure()
    claimed = []
    for name in ("ended", "taken"):
        job = server.inbox.path / f"{name}.yaml"
        job.write_text(f"name: {name}\n")
        old = time.time() - 10
        os.utime(job, (old, old))  # settled
        got = server.inbox.claim(job, starts=1)
        assert got is not None
        claimed.append(got)
    ended, taken = claimed
    busy = threading.Event()
    holder = threading.Thread(target=busy.wait, daemon=True)  # the job threads still running
    holder.start()
    try:
        server._active.update({p.name: holder for p in claimed})
        server.inbox.finish(ended, True, None)  # its end, between the beat's look at what is held and its renewal
        far = Owner("other-host", 4242, "boot", "ns", "x" * 32)
        server.inbox.lease_file(taken).write_bytes(Record(far, time.time(), 5.0, 2).to_json())
        with capture_logs() as logs:
            server._beat()
    finally:
        busy.set()
    lost = [e["file"] for e in logs if e["event"] == "job_file_lease_lost"]
    assert lost == [taken.name]
