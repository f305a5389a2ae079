"""Group commit: requests written while a flush runs are made durable by the next one, together."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.api.commit import GroupCommit, durable


class Flushes:
    """A flush that holds until the test lets it end, counting how many began."""

    def __init__(self, fail_first: bool = False) -> None:
        self.begun = 0
        self.gate = threading.Event()
        self.fail_first = fail_first

    def __call__(self) -> None:
        self.begun += 1
        assert self.gate.wait(10)
        if self.fail_first and self.begun == 1:
            raise OSError(5, "Input/output error")


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_requests_arriving_during_a_flush_share_the_next_one_and_none_returns_early() -> None:
    flush = Flushes()
    commit = GroupCommit(flush)
    done: list[str] = []

    def call(name: str) -> None:
        commit.sync()
        done.append(name)

    first = threading.Thread(target=call, args=("first",))
    first.start()
    until(lambda: flush.begun == 1, "the first flush")
    later = [threading.Thread(target=call, args=(f"later{n}",)) for n in range(5)]
    for t in later:
        t.start()
    until(lambda: commit.waiting == 5, "five requests waiting")
    assert done == []
    flush.gate.set()  # the first flush ends; it began before the later writes, so they need another
    for t in [first, *later]:
        t.join(10)
    assert done[0] == "first" and sorted(done[1:]) == [f"later{n}" for n in range(5)]
    assert flush.begun == 2  # six requests, two flushes


def test_a_failed_flush_fails_its_caller_and_the_waiters_get_a_flush_of_their_own() -> None:
    flush = Flushes(fail_first=True)
    commit = GroupCommit(flush)
    errors: list[str] = []

    def call() -> None:
        try:
            commit.sync()
        except OSError as e:
            errors.append(str(e.strerror))

    first = threading.Thread(target=call)
    first.start()
    until(lambda: flush.begun == 1, "the first flush")
    waiter = threading.Thread(target=call)
    waiter.start()
    until(lambda: commit.waiting == 1, "a waiting request")
    flush.gate.set()
    first.join(10)
    waiter.join(10)
    assert errors == ["Input/output error"] and flush.begun == 2


def test_durable_flushes_the_data_roots_filesystem(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    durable(tmp_path)  # syncfs on this filesystem: returns once flushed, no error
    durable(tmp_path)
