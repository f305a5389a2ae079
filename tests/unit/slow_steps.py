"""Slow steps that a test holds shut from outside the worker process that runs them: the API's glob
check (controller/api/submit.py ``checked_json_apart``, for tenant acme only) and an upload's
unpacking (``unpack_targets``) waiting on a lock the test holds. Top-level, so the API can send them
to its slow workers by name (controller/api/slow.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from controller.api import submit
from controller.api.area import Area
from controller.api.slow import Lent
from controller.api.uploads import Budget, Part
from controller.config import Config

GATE = "gate"  # in the data root: the test holds it locked; a held step waits for a shared lock on it
BEGAN = "began"  # in the data root: one byte per held step that began


def gate(root: Path) -> int:
    """The gate shut (an exclusive lock on a descriptor of its own); os.close(fd) opens it."""
    fd = os.open(root / GATE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def began(root: Path) -> int:
    path = root / BEGAN
    return path.stat().st_size if path.exists() else 0


def held_checked_json(config: Config, area: Area, data: object) -> tuple[str, str]:
    if area.tenant == "acme":
        fd = os.open(area.root / BEGAN, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b".")
        os.close(fd)
        gate_fd = os.open(area.root / GATE, os.O_RDONLY)
        try:
            fcntl.flock(gate_fd, fcntl.LOCK_SH)  # until the test opens the gate
        finally:
            os.close(gate_fd)
    return submit.checked_json_apart(config, area, data)


def held_unpack_targets(config: Config, lent: Lent, files: list[Part], budget: Budget) -> submit.Targets:
    """An upload's unpacking (controller/api/submit.py ``unpack_targets``) held at the gate first,
    so that several uploads have all been received before any of them unpacks."""
    fd = os.open(config.data_root / BEGAN, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, b".")
    os.close(fd)
    gate_fd = os.open(config.data_root / GATE, os.O_RDONLY)
    try:
        fcntl.flock(gate_fd, fcntl.LOCK_SH)  # until the test opens the gate
    finally:
        os.close(gate_fd)
    return submit.unpack_targets(config, lent, files, budget)
