"""What a person sees on a real terminal: `ffswarm submit` and `ffswarm status JOB --follow` run in a
pseudo-terminal (80 columns) on the dev swarm; their raw output is replayed into a screen model.

The bar keeps to its own line, log records print above it, the summary ends the output."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.fixtures import photos
from tests.integration.conftest import CONFIG, ROOT, Workspace, chown_tree
from tests.screen import CSI, is_bar, is_log, mixed, screen_lines, visible_widths

pytestmark = pytest.mark.integration

COLUMNS, ROWS = 80, 24


def write_job(ws: Workspace, n: int, **fields: object) -> Path:
    star = photos.astronaut(ws.dir / "faces")
    photos.face_photos(ws.dir / "crowd", n)
    chown_tree(ws.dir, ws.config.runner_uid_gid())
    body = {
        "name": ws.job,
        "source": ws.rel(star),
        "targets": [f"{ws.rel(ws.dir / 'crowd')}/*.jpg"],
        "output": f"{ws.rel(ws.dir / 'out')}/{{stem}}{{ext}}",
        "providers": ["cpu"],
        "resources": {"memory": "2g"},
        "chunk_size": 2,
        **fields,
    }
    return ws.write_job(json.dumps(body))  # JSON is YAML


def in_pty(*args: str, timeout: float = 600) -> tuple[int, bytes]:
    """`ffswarm ARGS` with stdin, stdout and stderr on a fresh 80x24 pseudo-terminal; its exit code
    and every byte it wrote there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS), "LANG": "C.UTF-8"}
    env.pop("NO_COLOR", None)
    cmd = [sys.executable, "-m", "controller.cli", "--config", str(CONFIG), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    raw = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                tail = raw[-3000:].decode(errors="replace")
                pytest.fail(f"ffswarm {' '.join(args)} still running after {timeout}s:\n{tail}")
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer of the terminal has gone
                break
            if not data:
                break
            raw += data
    finally:
        os.close(master)
    return proc.wait(timeout=30), bytes(raw)


def screen_text(raw: bytes) -> tuple[list[str], str]:
    lines = screen_lines(raw, COLUMNS, ROWS)
    return lines, "\n".join(lines)


def summary_of(raw: bytes, job: str, items: int, chunks: int) -> tuple[str, str]:
    """What came before the summary (the bar and the records: rich's, kept to 80 columns) and the
    summary's first line (printed plainly: a terminal wraps a long one as it wraps any text)."""
    text = CSI.sub("", raw.decode())
    m = re.search(rf"job {job}: \d+ ok, \d+ without a face, 0 failed of {items} items in {chunks} chunks", text)
    assert m, text[-3000:]
    return text[: m.start()], m.group(0)


def test_submit_on_a_terminal_keeps_the_bar_and_the_records_apart(workspace: Workspace) -> None:
    ws = workspace
    job = write_job(ws, 8, max_concurrent=2)
    code, raw = in_pty("-v", "submit", str(job))
    lines, text = screen_text(raw)
    assert code == 0, text[-3000:]
    assert not mixed(lines), mixed(lines)
    assert text.count("chunk_started") >= 4 and "chunk_done" in text  # -v: every chunk's records, above
    bars = [line for line in lines if is_bar(line)]
    assert bars and "8/8 items" in bars[-1], bars
    last_record = max(i for i, line in enumerate(lines) if is_log(line))
    assert lines.index(bars[-1]) > last_record  # the bar stayed at the bottom
    before, _ = summary_of(raw, ws.job, 8, 4)
    assert max(visible_widths(before)) <= COLUMNS


def test_status_follow_reattaches_the_bar_to_a_job_running_elsewhere(workspace: Workspace, tmp_path: Path) -> None:
    ws = workspace
    job = write_job(ws, 6, max_concurrent=1)
    cmd = [sys.executable, "-m", "controller.cli", "--json-logs", "--config", str(CONFIG), "submit", str(job)]
    with (tmp_path / "submit.log").open("w") as logs:
        submit = subprocess.Popen(cmd, cwd=ROOT, stdout=logs, stderr=subprocess.STDOUT)
    try:
        plan = ws.root / "runs" / ws.job / "plan.json"
        deadline = time.monotonic() + 120
        while not plan.exists():
            assert submit.poll() is None, (tmp_path / "submit.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the background submit made no run folder"
            time.sleep(0.1)
        code, raw = in_pty("status", ws.job, "--follow")
    finally:
        submitted = submit.wait(timeout=600)
    lines, text = screen_text(raw)
    assert submitted == 0, (tmp_path / "submit.log").read_text()[-3000:]
    assert code == 0, text[-3000:]
    assert not mixed(lines), mixed(lines)
    assert re.search(rb"[0-5]/6 items", raw), "the bar never showed the job under way"
    assert [line for line in lines if is_bar(line)][-1].find("6/6 items") >= 0
    before, _ = summary_of(raw, ws.job, 6, 3)
    assert max(visible_widths(before)) <= COLUMNS

    # Without a terminal: JSON status lines, the same summary, the same exit code.
    plain = ws.ffswarm("status", ws.job, "--follow")
    assert plain.returncode == 0, plain.stderr[-2000:]
    out = plain.stdout.splitlines()
    assert json.loads(out[0])["phase"] == "finished" and out[1].startswith(f"job {ws.job}: ")
