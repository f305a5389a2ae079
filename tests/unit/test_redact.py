"""Redaction (issue 16): webhook URLs without credentials or queries, hook output without secrets,
names printed without terminal escapes (the log renderer and the reason writers share one helper)."""

from __future__ import annotations

import io

from rich.console import Console

from controller import log, redact
from controller.run.hooks import redact as hook_tail


def test_a_webhook_url_is_shown_without_credentials_query_or_token_path() -> None:
    shown = redact.url("https://bot:hunter2@hooks.example.internal:8443/ffswarm/T0AB1CD2EF3GH4IJ5?sig=abc#x")
    assert shown == "https://hooks.example.internal:8443/ffswarm/[redacted]?…"
    assert redact.url("https://hooks.example.internal/ffswarm") == "https://hooks.example.internal/ffswarm"


def test_hook_output_tail_is_redacted_and_printable() -> None:
    out = hook_tail("done\nTOKEN=abcdef0123456789 \x1b[31mred\x1b[0m " + "Zm9vYmFyYmF6cXV4cXV1eHF1dXg=")
    assert "abcdef0123456789" not in out and "Zm9vYmFy" not in out and "\x1b" not in out
    assert "[redacted]" in out and "\\x1b" in out


def test_the_terminal_log_prints_names_without_escapes() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    log.setup(json_lines=False, console=console)
    try:
        log.get(component="t").warning("job_file_refused", file="evil\x1b]0;pwned\x07\x1b[2J.yaml")
    finally:
        log.setup(json_lines=True)
    text = buf.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;pwned" in text
