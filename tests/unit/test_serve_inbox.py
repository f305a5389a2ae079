"""`ffswarm serve`'s inbox decisions, with a stand-in for running a job (no Docker needed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from controller.config import Config, parse_config
from controller.run.metrics import Metrics
from controller.serve.daemon import Inbox, Outcome, Server
from tests.polling import until


class Looks(Inbox):
    """The inbox, counting how often the server has looked for waiting files."""

    looks = 0

    def waiting(self, now: float, limit: int | None = None) -> list[Path]:
        self.looks += 1
        return super().waiting(now, limit)


def serve_once(tmp_path: Path, outcome: Outcome) -> tuple[Inbox, list[Path]]:
    inbox = Looks(tmp_path / "inbox")
    inbox.ensure()
    job = inbox.path / "a.yaml"
    job.write_text("name: a\n")
    old = time.time() - 10
    os.utime(job, (old, old))
    ran: list[Path] = []
    workers: list[threading.Thread] = []

    def run(config: Config, path: Path, metrics: Metrics) -> Outcome:
        ran.append(path)
        workers.append(threading.current_thread())
        return outcome

    config = parse_config(tmp_path / "ffswarm.yaml", {"data_root": str(tmp_path)})
    server = Server(config, inbox, Metrics(), poll=0.05, run=run, retry_after=60)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    until(lambda: bool(workers) and not workers[0].is_alive(), "the job thread to end")  # the file moved
    seen = inbox.looks
    until(lambda: inbox.looks >= seen + 2, "the loop to look at the inbox again")
    server.stop.set()
    t.join(30)
    assert not t.is_alive()
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


def _drop(inbox: Inbox, name: str, age: float, text: str = "name: a\n") -> Path:
    p = inbox.path / name
    p.write_text(text)
    t = time.time() - age
    os.utime(p, (t, t))
    return p


def test_the_indexed_inbox_hands_out_the_oldest_first_and_sees_every_change(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox")
    inbox.ensure()
    for i in range(30):
        _drop(inbox, f"j{i:02d}.yaml", age=100 - i)  # j00 the oldest
    now = time.time()
    assert [p.name for p in inbox.waiting(now, 3)] == ["j00.yaml", "j01.yaml", "j02.yaml"]
    assert len(inbox.waiting(now)) == 30
    # claimed by someone else: gone from the next poll; a new one, and one replaced under its old
    # name (a new file, as put_back or a careful writer makes it) with a future mtime: not yet ready
    (inbox.path / "j00.yaml").unlink()
    _drop(inbox, "new.yaml", age=500)
    os.replace(_drop(inbox, ".tmp", age=-60), inbox.path / "j01.yaml")
    assert [p.name for p in inbox.waiting(time.time(), 3)] == ["new.yaml", "j02.yaml", "j03.yaml"]
    assert "j01.yaml" not in {p.name for p in inbox.waiting(time.time())}


def test_a_file_written_again_after_it_was_listed_is_not_claimed_until_it_settles(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox")
    inbox.ensure()
    job = _drop(inbox, "a.yaml", age=100)
    [listed] = inbox.waiting(time.time())
    with open(job, "a") as f:  # the same file (same inode) written again, in place
        f.write("# more\n")
    assert inbox.claim(listed) is None
    assert job.is_file() and not list(inbox.running.iterdir())  # left where it was, to settle
    old = time.time() - 10
    os.utime(job, (old, old))
    claimed = inbox.claim(inbox.waiting(time.time())[0])
    assert claimed is not None and claimed.read_text() == "name: a\n# more\n"
