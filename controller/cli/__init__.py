"""The `ffswarm` command: parsing only, each command calls one function of the controller.

controller/cli/main.py is the root: the `cli` group, its global options, and every command added to
it in one place; the commands live by audience in jobs.py (submit, resume, retry, status, logs,
scale, cancel), ops.py (render, serve, nodes, doctor) and models.py (models verify|fetch);
extras.py names the extra (pyproject) to install when a command needs a module that is missing.
"""

from controller.cli.main import cli, main

__all__ = ["cli", "main"]
