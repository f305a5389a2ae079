"""The progress bar and the log records on one terminal: records print above the bar, never on its
line; per-chunk info only with --verbose; 80 columns; NO_COLOR. And `status --follow`'s feed."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from rich.console import Console

from contract.results import ItemResult, ItemStatus
from controller import log
from controller.errors import UsageError
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run.progress import Progress, Snapshot, follow, snapshot
from controller.run.rundir import Control, RunDir
from controller.run.status import job_status
from tests.screen import colour_codes, is_bar, is_log, mixed, screen_lines, visible_widths

JOB = "a-rather-long-job-name-that-fills-a-line-2"


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width), out


def run_folder(tmp_path: Path, chunks: int = 3, size: int = 4) -> RunDir:
    items = tuple(PlannedItem(f"i{n:06d}", f"in/{n}.jpg", f"out/{n}.jpg", "image") for n in range(chunks * size))
    plan = Plan(
        JOB,
        items,
        tuple(Chunk(f"c{c:04d}", tuple(i.id for i in items[c * size : (c + 1) * size])) for c in range(chunks)),
    )
    rd = RunDir(tmp_path, JOB)
    rd.create(b"name: j\n", plan, {}, Control(2), "sha256:x")
    return rd


def record(rd: RunDir, chunk: str, statuses: list[ItemStatus], attempt: int = 1) -> None:
    ids = rd.plan().chunks[int(chunk[1:])].items
    now = time.time()
    lines = [
        ItemResult(
            item=i, status=s, attempt=attempt, input=f"/data/in/{i}", output=None, started=now, finished=now + 1
        ).to_line()
        for i, s in zip(ids, statuses, strict=False)  # fewer statuses: an attempt that stopped part-way
    ]
    with (rd.path / "results" / f"{chunk}.jsonl").open("a") as f:
        f.write("".join(lines))


def drive(rd: RunDir, console: Console, verbose: bool) -> None:
    """A job as supervise() reports it: each event logged, then handed to the bar."""
    log.setup(json_lines=False, verbose=verbose, console=console)
    bar = Progress(rd, len(rd.plan().items), console)
    logger = log.get(job=JOB)

    def emit(event: str, level: str = "info", **fields: object) -> None:
        getattr(logger, level)(event, **fields)
        bar(event, **fields)

    emit("job_started", chunks=3, pending=3, items=12, image="sha256:" + "0" * 64)
    for c in ("c0000", "c0001"):
        emit("chunk_started", chunk=c, attempt=1, service=f"ffswarm-{JOB}-{c}-a1")
        emit("chunk_running", chunk=c, attempt=1, node="n" * 25)
    record(rd, "c0000", [ItemStatus.OK] * 3 + [ItemStatus.ERROR])
    emit("chunk_done", chunk="c0000", attempt=1, exit_code=3)
    emit("chunk_retry", chunk="c0001", attempt=1, failure="infrastructure", reason="runner exit 137 (killed)")
    logger.warning("engine_slow", seconds=12.5)
    emit("chunk_started", chunk="c0001", attempt=2, service=f"ffswarm-{JOB}-c0001-a2")
    emit("chunk_started", chunk="c0002", attempt=1, service=f"ffswarm-{JOB}-c0002-a1")
    record(rd, "c0001", [ItemStatus.OK] * 4, attempt=2)
    record(rd, "c0002", [ItemStatus.NO_FACE] + [ItemStatus.OK] * 3)
    emit("chunk_done", chunk="c0001", attempt=2, exit_code=0)
    emit("chunk_done", chunk="c0002", attempt=1, exit_code=0)
    logger.error("report_slow", path="/data/runs/" + JOB + "/report.json")
    emit("job_finished", items=12, ok=10, failed=1)
    bar.close()


def test_records_print_above_the_bar_never_on_its_line(tmp_path: Path) -> None:
    console, out = terminal()
    drive(run_folder(tmp_path), console, verbose=True)
    lines = screen_lines(out.getvalue().encode(), onlcr=True)
    assert not mixed(lines), mixed(lines)
    bars = [line for line in lines if is_bar(line)]
    assert bars and "12/12 items" in bars[-1] and "1 failed" in bars[-1], bars
    assert lines.index(bars[-1]) > max(i for i, line in enumerate(lines) if is_log(line))  # the bar is last
    assert any("chunk_started" in line for line in lines)  # verbose: every chunk's events


def test_per_chunk_info_only_with_verbose_warnings_and_failures_always(tmp_path: Path) -> None:
    console, out = terminal()
    drive(run_folder(tmp_path), console, verbose=False)
    text = "\n".join(screen_lines(out.getvalue().encode(), onlcr=True))
    for routine in ("chunk_started", "chunk_running", "chunk_done"):
        assert routine not in text
    for news in ("job_started", "chunk_retry", "engine_slow", "report_slow", "job_finished"):
        assert news in text


def test_nothing_is_wider_than_80_columns(tmp_path: Path) -> None:
    console, out = terminal(80)
    drive(run_folder(tmp_path), console, verbose=True)
    widths = visible_widths(out.getvalue())
    assert max(widths) <= 80 and max(widths) > 60  # long records are wrapped by rich, not the terminal


@pytest.mark.parametrize("width", [80, 60, 40])
def test_the_bar_keeps_to_one_line_on_a_narrow_terminal(tmp_path: Path, width: int) -> None:
    console, out = terminal(width)
    progress = Progress(run_folder(tmp_path), 12, console)
    assert progress.bar is not None
    progress.bar.show(Snapshot(12345, 1200, 1000, 200, 2270, 12345, 1200))
    progress.close()
    lines = [line for line in screen_lines(out.getvalue().encode(), columns=width, onlcr=True) if line]
    assert len(lines) == 1 and "1200/12345 items" in lines[0], lines
    assert max(visible_widths(out.getvalue())) <= width


def test_no_color_means_no_colour_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console, out = terminal()
    drive(run_folder(tmp_path / "a"), console, verbose=True)
    assert colour_codes(out.getvalue())  # the check can see colour when there is some
    monkeypatch.setenv("NO_COLOR", "1")
    console, out = terminal()
    drive(run_folder(tmp_path / "b"), console, verbose=True)
    assert out.getvalue() and not colour_codes(out.getvalue())


def test_off_a_terminal_json_lines_and_no_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert log.setup(json_lines=None) is None  # pytest's stderr is no terminal
    progress = Progress(run_folder(tmp_path), 12, None)
    log.get(job=JOB).info("chunk_started", chunk="c0000", attempt=1)
    progress("chunk_started", chunk="c0000")
    progress.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    line = json.loads(err[0])
    assert line["event"] == "chunk_started" and line["level"] == "info" and line["chunk"] == "c0000"
    assert line["timestamp"].endswith("Z") and progress.bar is None
    plain = Console(file=io.StringIO(), width=80)  # --console-logs into a file: records, no bar
    assert log.setup(json_lines=False, console=plain) is plain
    assert Progress(run_folder(tmp_path / "b"), 12, plain).bar is None


def test_a_resumed_job_starts_where_it_was_and_a_retried_chunk_counts_once(tmp_path: Path) -> None:
    rd = run_folder(tmp_path)
    record(rd, "c0000", [ItemStatus.OK] * 4)
    record(rd, "c0001", [ItemStatus.ERROR, ItemStatus.OK], attempt=1)  # an interrupted attempt
    progress = Progress(rd, 12, None)
    progress("job_started", pending=2)
    assert progress.snapshot() == Snapshot(12, 6, 1, 0, 2, 12, 6)
    progress("chunk_started", chunk="c0001")
    record(rd, "c0001", [ItemStatus.OK] * 4, attempt=2)
    progress("chunk_done", chunk="c0001")
    assert progress.snapshot() == Snapshot(12, 8, 0, 0, 1, 12, 8)


def test_follow_prints_one_json_line_per_change_then_returns_the_report(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, chunks=2)
    rd.write_state({"c0000": {"state": "running", "attempts": [{}]}, "c0001": {"state": "queued", "attempts": []}})
    steps = iter(
        [
            lambda: None,  # nothing changed: no line
            lambda: record(rd, "c0000", [ItemStatus.OK] * 4),
            lambda: rd.write_report({"job": JOB, "counts": {}}),  # a retry's old report: chunks still live
            lambda: rd.write_state({"c0000": {"state": "done", "attempts": [{}]}}),
        ]
    )
    lines: list[str] = []
    report = follow(rd, None, lines.append, sleep=lambda _: next(steps)())
    assert report == {"job": JOB, "counts": {}}
    rows = [json.loads(line) for line in lines]
    assert [r["items"]["pending"] for r in rows] == [8, 4, 4, 4]
    assert [r["phase"] for r in rows] == ["running", "running", "stopped", "stopped"]
    assert rows[-1] == job_status(rd)


def test_follow_on_a_terminal_draws_the_same_bar(tmp_path: Path) -> None:
    rd = run_folder(tmp_path, chunks=2)
    rd.write_state({"c0000": {"state": "running", "attempts": [{}]}, "c0001": {"state": "queued", "attempts": []}})
    steps = iter(
        [
            lambda: record(rd, "c0000", [ItemStatus.OK] * 3 + [ItemStatus.ERROR]),
            lambda: record(rd, "c0001", [ItemStatus.OK] * 4),
            lambda: rd.write_state({c: {"state": "done", "attempts": [{}]} for c in ("c0000", "c0001")}),
            lambda: rd.write_report({"job": JOB}),
        ]
    )
    console, out = terminal()
    assert follow(rd, console, pytest.fail, sleep=lambda _: next(steps)()) == {"job": JOB}
    lines = [line for line in screen_lines(out.getvalue().encode(), onlcr=True) if line]
    assert len(lines) == 1 and "8/8 items" in lines[0] and "1 failed" in lines[0], lines
    assert snapshot(job_status(rd)) == Snapshot(8, 8, 1, 0, 0, 8, 8)


def test_follow_names_a_missing_job_before_drawing_anything(tmp_path: Path) -> None:
    console, out = terminal()
    with pytest.raises(UsageError, match="no job 'nope'"):
        follow(RunDir(tmp_path, "nope"), console, pytest.fail)
    assert out.getvalue() == ""
