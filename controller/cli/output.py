"""`-o text|json|yaml` on the read commands: people read text; scripts read data, as JSON or YAML.

The data are the objects the HTTP API answers wherever the API has them (a job's status object as
GET /v1/jobs/{job} answers it, a job list as ``{"jobs": [...], "next_cursor": null}`` like
GET /v1/jobs), so a script written against one works against the other; what has no API route (a dry
run's plan, doctor's checks, model packs, nodes) is one object of its own, never a bare list, so that
fields can be added later without breaking a reader. ``--json`` stays as a hidden alias of ``-o json``
for the scripts written before ``-o`` existed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
import yaml

from controller.errors import UsageError

FORMATS = ("text", "json", "yaml")
F = TypeVar("F", bound=Callable[..., Any])


def output_option(fn: F) -> F:
    """Adds ``-o/--output text|json|yaml`` (and the hidden ``--json``) to a click command; the command
    receives one ``output`` argument: "text", "json" or "yaml"."""

    @functools.wraps(fn)
    def command(*args: Any, output: str | None, as_json: bool, **kwargs: Any) -> Any:
        if as_json and output not in (None, "json"):
            raise UsageError(f"--json is -o json: it cannot go with -o {output}")
        return fn(*args, output="json" if as_json else (output or "text"), **kwargs)

    with_json = click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as -o json.")(command)
    with_output = click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(FORMATS),
        default=None,
        help="text (default, for people), or json / yaml: data, the API's objects where it has them.",
    )(with_json)
    return with_output  # type: ignore[return-value]


def dumps(data: Any, output: str) -> str:
    """``data`` as JSON or YAML text (one document, ending in a newline)."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if output == "yaml":
        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False))
    raise ValueError(f"not a data format: {output!r}")


def echo(data: Any, output: str) -> None:
    """Print ``data`` on stdout as ``output`` (json or yaml) says."""
    click.echo(dumps(data, output), nl=False)
