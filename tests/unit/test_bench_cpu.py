"""The control plane's CPU as the benchmarks print it (scripts/proc_cpu.py, read by scripts/bench_api.py
and scripts/bench_small.py): a process tree's CPU over a window, read from a /proc built on disk, then
per request done and in bench_small's tables; and, on this machine's real /proc, that the time of
children (still running, or ended and reaped) is counted.

The benchmarks themselves need the dev swarm (bench_small) or minutes; they are not run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench_small, proc_cpu
from scripts.proc_cpu import cpu_seconds, sample, spent, tree

ROOT = Path(__file__).resolve().parents[2]
HZ = 100  # the fake /proc's clock ticks a second


class FakeProc:
    """A /proc folder: each process's stat (its CPU in seconds) and its threads' children lists."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        monkeypatch.setattr(proc_cpu, "TICK", HZ)

    def process(
        self,
        pid: int,
        own: tuple[float, float] = (0.0, 0.0),
        reaped: tuple[float, float] = (0.0, 0.0),
        threads: dict[int, list[int]] | None = None,
        name: str = "python3",
    ) -> None:
        """``own``: user and system seconds of its threads; ``reaped``: of the children it waited for;
        ``threads``: each thread's children (by default one thread, no child)."""
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        ticks = [str(round(s * HZ)) for s in (*own, *reaped)]
        # fields 3..13 (state, ppid, …, cmajflt), 14..17 (the CPU), then priority, nice, num_threads, …
        rest = ["S", "1", str(pid), str(pid), "0", "-1", "4194304", "812", "0", "3", "0", *ticks, "20", "0", "2"]
        (folder / "stat").write_text(f"{pid} ({name}) {' '.join(rest)} 0 302707 3133440\n")
        for tid, kids in (threads or {pid: []}).items():
            (folder / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
            (folder / "task" / str(tid) / "children").write_text("".join(f"{k} " for k in kids))


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    return FakeProc(tmp_path / "proc", monkeypatch)


def test_a_process_cpu_is_its_threads_user_and_system_time_and_that_of_the_children_it_reaped(
    proc: FakeProc,
) -> None:
    # a command name may hold spaces and parentheses: the fields are counted from its last ')'
    proc.process(4242, own=(3.0, 1.5), reaped=(0.25, 0.5), name="ffswarm (api) x")
    assert cpu_seconds(4242, proc.root) == pytest.approx(5.25)


def test_a_gone_process_cannot_be_read(proc: FakeProc) -> None:
    with pytest.raises(OSError):
        cpu_seconds(4242, proc.root)


def test_the_tree_holds_the_children_of_every_thread_and_theirs_and_not_those_gone(proc: FakeProc) -> None:
    # serve starts hooks from worker threads: the main thread's children alone would miss them
    proc.process(100, threads={100: [101], 102: [103, 105]})
    proc.process(101)
    proc.process(103, threads={103: [104]})
    proc.process(104)  # 105: listed by its parent, ended before it was read
    assert tree(100, proc.root) == [100, 101, 103, 104]
    assert list(sample(100, proc.root)) == [100, 101, 103, 104]
    assert tree(999, proc.root) == []


def test_a_window_counts_each_process_once_whatever_its_children_did_meanwhile(proc: FakeProc) -> None:
    # before: the API (100), a worker (101) and a hook still running (102)
    proc.process(100, own=(10.0, 0.0), threads={100: [101, 102]})
    proc.process(101, own=(4.0, 1.0))
    proc.process(102, own=(1.0, 0.0))
    before = sample(100, proc.root)
    # meanwhile: the API used 2 s; the worker 3 s; the hook 0.5 s more, then ended and was reaped (its
    # whole 1.5 s now the API's); a new child started and used 0.25 s, still running
    proc.process(100, own=(11.0, 1.0), reaped=(1.5, 0.0), threads={100: [101, 103]})
    proc.process(101, own=(6.0, 2.0))
    (proc.root / "102" / "stat").unlink()
    proc.process(103, own=(0.25, 0.0))
    after = sample(100, proc.root)
    assert spent(before, after) == pytest.approx(2 + 3 + 0.5 + 0.25)


def test_the_control_plane_cpu_per_request_is_the_api_and_serve_each_and_their_sum(proc: FakeProc) -> None:
    proc.process(100, own=(20.0, 5.0))  # the API
    proc.process(200, own=(3.0, 0.0))  # serve
    api0, serve0 = sample(100, proc.root), sample(200, proc.root)
    proc.process(100, own=(22.0, 5.5))  # 2.5 s over the phase
    proc.process(200, own=(7.0, 1.0))  # 5 s
    api_s, serve_s = spent(api0, sample(100, proc.root)), spent(serve0, sample(200, proc.root))
    assert bench_small.control_cpu(api_s, serve_s, 500) == pytest.approx(
        {"api_ms": 5.0, "serve_ms": 10.0, "control_ms": 15.0}
    )
    # nothing done: the phase's whole cost shows, as if for one request
    assert bench_small.control_cpu(api_s, serve_s, 0) == pytest.approx(
        {"api_ms": 2500.0, "serve_ms": 5000.0, "control_ms": 7500.0}
    )


ROWS = {
    "ceiling": {"items": 1000, "per_s": 20.0, "p50": 50.0, "p99": 50.0, **bench_small.control_cpu(0.5, 4.0, 1000)},
    "packed": {"items": 1000, "per_s": 8.0, "p50": 12.0, "p99": 20.25, **bench_small.control_cpu(6.25, 3.0, 1000)},
}


def test_bench_small_prints_the_cpu_per_request_as_markdown_rows_for_the_results() -> None:
    assert bench_small.markdown(ROWS) == [
        "| path | requests | done/s | × ceiling | × alone | p50 | p99 | API ms/req | serve ms/req | control ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| ceiling | 1,000 | 20.00 | 1.00× | - | 50.0 s | 50.0 s | 0.5 | 4.0 | 4.5 |",
        "| packed | 1,000 | 8.00 | 0.40× | - | 12.0 s | 20.2 s | 6.2 | 3.0 | 9.2 |",
    ]


def test_bench_small_prints_the_cpu_per_request_in_its_aligned_table() -> None:
    rows = {**ROWS, "alone": {"items": 30, "per_s": 0.5, "p50": 30.0, "p99": 55.0, **bench_small.control_cpu(1, 2, 30)}}
    header, *lines = bench_small.table(rows)
    assert header.split("  ")[-3:] == ["API ms/req", "serve ms/req", "control ms/req"]
    assert [line.split()[-5:] for line in lines] == [
        ["50.0", "50.0", "0.5", "4.0", "4.5"],
        ["12.0", "20.2", "6.2", "3.0", "9.2"],
        ["30.0", "55.0", "33.3", "66.7", "100.0"],
    ]
    assert lines[1].split()[4] == "16.0×"  # packed against alone
    assert {len(line) for line in [header, *lines]} == {len(header)}  # the columns line up


BURN = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('burnt', flush=True)\n"
AT_LEAST = 0.25  # of the 0.3 s burnt: /proc's figures are in whole ticks, split between user and system


def test_on_this_machine_a_child_still_running_is_counted() -> None:
    before = sample(os.getpid())
    with subprocess.Popen(
        [sys.executable, "-c", BURN + "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "burnt\n"
        after = sample(os.getpid())
        assert child.pid in after
        child.stdin.close()
    assert spent(before, after) >= AT_LEAST


def test_on_this_machine_a_child_ended_and_reaped_is_counted() -> None:
    before = sample(os.getpid())
    subprocess.run([sys.executable, "-c", BURN], check=True, capture_output=True)
    assert spent(before, sample(os.getpid())) >= AT_LEAST


@pytest.mark.parametrize("script", ["bench_api.py", "bench_small.py"])
def test_the_benchmarks_still_start(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}")


def test_a_repeated_phase_reports_its_median_run_whole() -> None:
    """--repeat: the row is one run as measured (its rate, latency and CPU together), the median by CPU."""
    runs = [{"per_s": float(n), "p99": 1.0 + n, "control_ms": ms} for n, ms in enumerate((12.3, 8.8, 10.6, 9.9))]
    assert bench_small.median_run(runs) == runs[3]  # 8.8 · 9.9 · 10.6 · 12.3: the lower middle, 9.9
    assert bench_small.median_run(runs[:3]) == runs[2]  # 8.8 · 10.6 · 12.3
    assert bench_small.median_run(runs[:1]) == runs[0]
