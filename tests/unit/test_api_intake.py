"""The API's intake: submits handed over in batches, answered only once their batch's flush has ended,
each refusal its own request's, nothing of a batch kept when its flush fails, and an accepted job
ready for `serve` at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.api import accept, quota
from controller.api.area import Area
from controller.api.intake import Intake, Staged
from controller.serve.inbox import Inbox
from tests.builders import beat, make_config


class Book:
    """What the steps did, in order: their writes, the flushes, keeps and undos."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def note(self, what: str) -> None:
        with self.lock:
            self.events.append(what)

    def step(self, name: str, fail: Exception | None = None) -> Callable[[], Staged[str]]:
        def run() -> Staged[str]:
            if fail is not None:
                raise fail
            self.note(f"write {name}")
            return Staged(name, keep=lambda: self.note(f"keep {name}"), undo=lambda: self.note(f"undo {name}"))

        return run

    def held_flush(self) -> tuple[Callable[[], None], threading.Event]:
        """A flush that notes itself, then waits for the returned gate (a batch held mid-flush)."""
        gate = threading.Event()

        def flush() -> None:
            self.note("flush")
            gate.wait(10)

        return flush, gate

    async def first_batch_flushing(self, intake: Intake) -> asyncio.Task[str]:
        """Step "w" sent, returned once its batch is in its flush: what comes next waits for another."""
        task = asyncio.create_task(intake.run(self.step("w")))
        while "flush" not in self.events:
            await asyncio.sleep(0.001)
        return task


def test_steps_queued_together_share_one_flush_and_are_answered_after_it(tmp_path: Path) -> None:
    book = Book()
    flush, gate = book.held_flush()  # the first batch's flush held until the others are queued

    async def main() -> list[str]:
        intake = Intake(tmp_path, threads=1, flush=flush)
        intake.start()
        try:
            first = await book.first_batch_flushing(intake)
            rest = [asyncio.create_task(intake.run(book.step(n))) for n in "bcde"]
            await asyncio.sleep(0.05)
            assert not first.done()  # its flush has not ended: no answer yet
            gate.set()
            return [await first, *[await t for t in rest]]
        finally:
            intake.close()

    assert asyncio.run(main()) == list("wbcde")
    # w alone, then b..e in one batch: two flushes for five requests, each kept only after its flush
    assert book.events == [
        "write w", "flush", "keep w",
        "write b", "write c", "write d", "write e", "flush", "keep b", "keep c", "keep d", "keep e",
    ]  # fmt: skip


def test_a_refused_step_answers_its_own_request_and_the_rest_of_its_batch_is_accepted(tmp_path: Path) -> None:
    book = Book()
    flush, gate = book.held_flush()

    async def main() -> list[object]:
        intake = Intake(tmp_path, threads=1, flush=flush)
        intake.start()
        try:
            warm = await book.first_batch_flushing(intake)
            tasks = [
                asyncio.create_task(intake.run(book.step("a"))),
                asyncio.create_task(intake.run(book.step("b", fail=ValueError("over quota")))),
                asyncio.create_task(intake.run(book.step("c"))),
            ]
            await asyncio.sleep(0.05)
            gate.set()
            await warm
            return list(await asyncio.gather(*tasks, return_exceptions=True))
        finally:
            intake.close()

    a, b, c = asyncio.run(main())
    assert (a, c) == ("a", "c")
    assert isinstance(b, ValueError) and str(b) == "over quota"
    assert "write b" not in book.events and "keep a" in book.events and "keep c" in book.events


def test_a_failed_flush_takes_back_every_write_of_its_batch_and_answers_each_with_the_error(tmp_path: Path) -> None:
    book = Book()

    def flush() -> None:
        book.note("flush")
        raise OSError(5, "Input/output error")

    async def main() -> list[object]:
        intake = Intake(tmp_path, threads=1, flush=flush)
        intake.start()
        try:
            return list(await asyncio.gather(*(intake.run(book.step(n)) for n in "ab"), return_exceptions=True))
        finally:
            intake.close()

    answers = asyncio.run(main())
    assert all(isinstance(e, OSError) and e.errno == 5 for e in answers)
    assert not [e for e in book.events if e.startswith("keep")]
    assert {e for e in book.events if e.startswith("undo")} == {"undo a", "undo b"}


def test_close_answers_every_step_queued_before_it(tmp_path: Path) -> None:
    book = Book()
    loop = asyncio.new_event_loop()
    intake = Intake(tmp_path, threads=2, flush=lambda: book.note("flush"))

    async def queue() -> list[asyncio.Task[str]]:
        intake.start()
        return [asyncio.create_task(intake.run(book.step(str(n)))) for n in range(20)]

    try:
        tasks = loop.run_until_complete(queue())
        loop.run_until_complete(asyncio.sleep(0))  # every task has queued its step
        intake.close()  # returns once the threads have run them all
        assert sorted(e for e in book.events if e.startswith("keep")) == sorted(f"keep {n}" for n in range(20))
        assert sorted(loop.run_until_complete(asyncio.gather(*tasks))) == sorted(str(n) for n in range(20))
    finally:
        loop.close()


def test_run_before_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(Intake(tmp_path).run(Book().step("a")))


def test_an_accepted_job_is_ready_for_serve_at_once_and_not_before_its_flush(tmp_path: Path) -> None:
    """A job file the API placed is whole (a link of a finished file): once durable and its slot
    committed, `serve` may take it at once, not a settle second later; before its flush it is young,
    so no serve takes it while it may still be taken back."""
    config, _ = make_config(tmp_path)
    beat(config)
    area = Area(config.data_root, "acme")
    area.ensure(None)
    box = Inbox(config.data_root / "inbox")
    job = "quick-abcdefgh"
    slot = quota.reserve(config, config.tenants["acme"], area, job=job)
    staged = accept.accept_json(config, area, job, "name: quick-abcdefgh\n", slot)
    assert box.waiting(time.time()) == []  # written, not yet durable: not taken
    assert staged.settle(config.data_root).job == job
    assert box.waiting(time.time()) == [config.data_root / "inbox" / f"{job}.yaml"]  # at once
