"""Completion hooks (`on_complete:`): downstream systems learn that a job ended.

A webhook receives the report as JSON (POST, retried with backoff on connection errors and 5xx);
a command runs without a shell (shlex-split, so a job file cannot inject shell syntax) with the
report's path in FFSWARM_REPORT. A failing hook is logged and recorded, never fatal to the job.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from controller import log


def post_webhook(url: str, report: dict[str, Any], attempts: int = 4, timeout: float = 10.0) -> str:
    body = json.dumps(report).encode()
    last = ""
    for n in range(attempts):
        req = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "ffswarm"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return f"delivered (HTTP {resp.status})"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
            if e.code < 500:
                break  # the receiver refused it; asking again will not help
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if n + 1 < attempts:
            time.sleep(min(2**n, 8))
    return f"failed after {n + 1} attempt(s): {last}"


def run_command(command: str, report_path: Path, job: str, timeout: float = 300.0) -> str:
    env = {**os.environ, "FFSWARM_REPORT": str(report_path), "FFSWARM_JOB": job}
    try:
        proc = subprocess.run(shlex.split(command), env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"failed: {e}"
    return "ok" if proc.returncode == 0 else f"failed: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"


def on_complete(webhook: str | None, command: str | None, report: dict[str, Any], report_path: Path) -> dict[str, str]:
    logger = log.get(job=report["job"])
    outcome: dict[str, str] = {}
    if webhook:
        outcome["webhook"] = post_webhook(webhook, report)
        logger.info("hook_webhook", url=webhook, outcome=outcome["webhook"])
    if command:
        outcome["command"] = run_command(command, report_path, report["job"])
        logger.info("hook_command", command=command, outcome=outcome["command"])
    return outcome
