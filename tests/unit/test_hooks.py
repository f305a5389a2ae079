"""Completion hooks bounded by the policy (issue 15 b, c): a named program run as an unprivileged uid
with a clean environment and a timeout; webhooks only to allowed hosts and checked addresses,
signed, never redirected. Real processes and a real loopback HTTP server; no swarm needed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from controller.job.spec import OnComplete
from controller.policy import Hook, Policy, Webhooks
from controller.run import hooks
from controller.run.hooks import DELIVERED, NOT_DELIVERED, on_complete, post_webhook, redact, run_hook
from tests.polling import until

REPORT = {"job": "j", "counts": {"ok": 2}}
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Readable by the hook's uid (pytest's own tmp folders are root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="ffswarm-hooks-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def script(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    d.chmod(0o755)
    p = d / "hook.py"
    p.write_text(f"#!{PYTHON}\nimport json, os, sys, time\n{body}\n")
    p.chmod(0o755)
    return p


@pytest.fixture
def drop(tmp_path: Path) -> Path:
    d = tmp_path / "drop"
    d.mkdir()
    d.chmod(0o777)  # the hook's uid writes here
    return d


# -- hooks -------------------------------------------------------------------------------------------------
def test_a_hook_runs_its_fixed_argv_without_a_shell_as_its_uid_in_a_clean_environment(
    tmp_path: Path, drop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    prog = script(
        tmp_path,
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ), 'ids': [os.getuid(), os.getgid()], "
        f"'groups': os.getgroups(), 'stdin': sys.stdin.read()}}, open({str(drop / 'seen.json')!r}, 'w'))",
    )
    hook = Hook((str(prog), "--job", "; touch /tmp/pwned"), 65534, 65534, 30)
    assert run_hook(hook, Path("/data/runs/j/report.json"), "j", '{"job": "j"}') == "ok"
    seen = json.loads((drop / "seen.json").read_text())
    assert seen["stdin"] == '{"job": "j"}'  # the report, readable whatever the run folder's owner
    assert seen["argv"] == ["--job", "; touch /tmp/pwned"]  # one argument, never shell syntax
    seen["env"].pop("LC_CTYPE", None)  # set by the hook's own Python at startup (PEP 538), not passed
    assert seen["env"] == {"FFSWARM_JOB": "j", "FFSWARM_REPORT": "/data/runs/j/report.json", "PATH": hooks.HOOK_PATH}
    if os.geteuid() == 0:
        assert seen["ids"] == [65534, 65534] and seen["groups"] in ([], [65534])


def test_a_hook_that_runs_too_long_is_killed_with_what_it_started(tmp_path: Path, drop: Path) -> None:
    prog = script(
        tmp_path,
        f"import subprocess\np = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(drop / 'child')!r}, 'w').write(str(p.pid))\ntime.sleep(60)",
    )
    started = time.monotonic()  # 5s: time for the hook to start its child even on a loaded machine
    assert run_hook(Hook((str(prog),), 65534, 65534, 5), Path("/r.json"), "j") == "failed: timed out after 5s"
    assert time.monotonic() - started < 30  # killed, not waited for (it sleeps 60s)
    child = int((drop / "child").read_text())

    def ended() -> bool:  # gone, or a zombie nobody has reaped yet: SIGKILL lands when it is next scheduled
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True

    until(ended, "the hook's child to be killed")


def test_a_failing_hook_reports_only_a_short_redacted_tail(tmp_path: Path) -> None:
    secret = "sk_live_" + "A1b2C3d4" * 6
    prog = script(tmp_path, f"sys.stderr.write('x' * 5000 + ' token={secret} password: hunter2 done')\nsys.exit(3)")
    outcome = run_hook(Hook((str(prog),), 65534, 65534, 30), Path("/r.json"), "j")
    assert outcome.startswith("failed: exit 3: ")
    assert secret not in outcome and "hunter2" not in outcome
    assert outcome.endswith("token=[redacted] password: [redacted] done")
    assert len(outcome) <= len("failed: exit 3: ") + hooks.TAIL_CHARS


def test_redact_keeps_plain_words() -> None:
    assert redact("cannot reach crm: connection refused") == "cannot reach crm: connection refused"
    assert redact("Authorization: Bearer abc.def") == "Authorization: [redacted] abc.def"


def test_a_hook_the_policy_no_longer_has_runs_nothing(tmp_path: Path) -> None:
    out = on_complete(Policy(), OnComplete(hook="gone"), REPORT, tmp_path / "report.json")
    assert out == {"hook": "failed: no hook 'gone' in the cluster's policy"}


# -- webhooks ---------------------------------------------------------------------------------------------
class Server:
    def __init__(self, status: int = 204, location: str | None = None) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((dict(self.headers), body))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/done"


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        s.httpd.shutdown()
        s.httpd.server_close()


def loopback(tmp_path: Path, **changes: Any) -> Webhooks:
    secret = tmp_path / "secret"
    secret.write_text("whsec_" + base64.b64encode(b"0123456789abcdef").decode() + "\n")
    fields: dict[str, Any] = {"allow_hosts": ("127.0.0.1", "localhost"), "allow_private": True, "secret_file": secret}
    return Webhooks(**{**fields, **changes})


def test_a_delivery_is_signed_standard_webhooks_style(tmp_path: Path, servers: list[Server]) -> None:
    servers.append(Server())
    server = servers[0]
    out = on_complete(Policy(webhooks=loopback(tmp_path)), OnComplete(webhook=server.url()), REPORT, tmp_path / "r")
    assert out == {"webhook": DELIVERED}
    assert len(server.requests) == 1
    headers, body = server.requests[0]
    sent = Webhook(base64.b64encode(b"0123456789abcdef").decode()).verify(body, headers)  # the reference verifier
    assert sent["type"] == "job.finished" and sent["data"] == REPORT  # the Standard Webhooks envelope
    assert sent["timestamp"].endswith("Z")
    wid, ts = headers["webhook-id"], headers["webhook-timestamp"]
    assert wid.startswith("msg_") and abs(int(ts) - time.time()) < 60
    mac = hmac.new(b"0123456789abcdef", f"{wid}.{ts}.".encode() + body, hashlib.sha256).digest()
    assert headers["webhook-signature"] == "v1," + base64.b64encode(mac).decode()


def test_a_redirect_is_never_followed(tmp_path: Path, servers: list[Server]) -> None:
    servers.append(Server())
    target = servers[0]
    servers.append(Server(302, location=target.url()))
    redirector = servers[1]
    outcome, why = post_webhook(redirector.url(), REPORT, loopback(tmp_path))
    assert (outcome, why) == (NOT_DELIVERED, "HTTP 302")
    assert len(redirector.requests) == 1  # asked once: a 3xx is not retried
    assert target.requests == []  # the redirect target receives nothing


def test_private_addresses_are_refused_unless_allowed(tmp_path: Path, servers: list[Server]) -> None:
    servers.append(Server())
    server = servers[0]
    outcome, why = post_webhook(server.url("localhost"), REPORT, loopback(tmp_path, allow_private=False))
    assert outcome == NOT_DELIVERED and "is loopback, link-local or private" in why
    assert server.requests == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "host 169.254.169.254 is not in policy.webhooks.allow_hosts"),
        ("http://evil.example/", "host evil.example is not in policy.webhooks.allow_hosts"),
        ("ftp://127.0.0.1/", "not an http(s) URL"),
    ],
)
def test_hosts_not_allowed_get_nothing(tmp_path: Path, url: str, why: str) -> None:
    assert post_webhook(url, REPORT, loopback(tmp_path)) == (NOT_DELIVERED, why)


def test_metadata_addresses_are_refused_even_with_private_allowed(tmp_path: Path) -> None:
    policy = loopback(tmp_path, allow_hosts=("169.254.169.254",))
    assert post_webhook("http://169.254.169.254/", REPORT, policy) == (
        NOT_DELIVERED,
        "address 169.254.169.254 is never allowed",
    )


def test_the_checked_address_is_the_one_connected_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that resolves to a public address first and to 127.0.0.1 next (DNS rebinding) is
    connected to at the address that was checked."""
    answers = iter(["93.184.216.34", "127.0.0.1"])
    monkeypatch.setattr(hooks.socket, "getaddrinfo", lambda *a, **k: [(0, 0, 0, "", (next(answers), 80))])
    connected: list[tuple[str, int]] = []

    def connect(addr: tuple[str, int], timeout: float | None = None) -> Any:
        connected.append(addr)
        raise ConnectionRefusedError("test")

    monkeypatch.setattr(hooks.socket, "create_connection", connect)
    monkeypatch.setattr(hooks.time, "sleep", lambda s: None)
    policy = Webhooks(allow_hosts=("hooks.example.internal",))
    outcome, why = post_webhook("http://hooks.example.internal/x", REPORT, policy, attempts=2)
    assert outcome == NOT_DELIVERED
    assert connected == [("93.184.216.34", 80)]  # the second try resolved to loopback and was refused
    assert why == "address 127.0.0.1 is loopback, link-local or private (policy.webhooks.allow_private)"


def test_retries_of_one_job_end_reuse_its_delivery_id(tmp_path: Path, servers: list[Server]) -> None:
    servers.append(Server(503))
    server = servers[0]
    outcome, _ = post_webhook(server.url(), REPORT, loopback(tmp_path), attempts=2)
    assert outcome == NOT_DELIVERED
    assert len(server.requests) == 2
    assert server.requests[0][0]["webhook-id"] == server.requests[1][0]["webhook-id"]
    post_webhook(server.url(), REPORT, loopback(tmp_path), attempts=1)
    assert server.requests[2][0]["webhook-id"] != server.requests[0][0]["webhook-id"]  # a new job end


# -- IPv6 addresses that carry an IPv4 one -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ip", "inner"),
    [
        ("2002:7f00:1::1", "127.0.0.1"),  # 6to4: bits 16-48
        ("2002:a00:1::", "10.0.0.1"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),  # Teredo: the client, last 32 bits inverted
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1"),
        ("::ffff:192.168.1.1", "192.168.1.1"),  # IPv4-mapped
        ("64:ff9b::a00:1", "10.0.0.1"),  # NAT64
    ],
)
def test_an_ipv6_address_wrapping_a_private_ipv4_one_is_refused(tmp_path: Path, ip: str, inner: str) -> None:
    with pytest.raises(hooks.WebhookRefused) as e:
        hooks.check_address(ip, loopback(tmp_path, allow_private=False))
    assert inner in str(e.value) and "loopback, link-local or private" in str(e.value)
    hooks.check_address(ip, loopback(tmp_path, allow_private=True))  # the operator allows private ones


@pytest.mark.parametrize(
    "ip", ["2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:5601:5601", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe"]
)
def test_a_wrapped_metadata_address_is_never_allowed(tmp_path: Path, ip: str) -> None:
    with pytest.raises(hooks.WebhookRefused, match=r"169\.254\.169\.254.* is never allowed"):
        hooks.check_address(ip, loopback(tmp_path, allow_private=True))


@pytest.mark.parametrize("ip", ["2002:808:808::1", "2001:0:4136:e378:8000:63bf:f7f7:f7f7"])
def test_a_wrapped_public_address_passes(tmp_path: Path, ip: str) -> None:
    hooks.check_address(ip, loopback(tmp_path, allow_private=False))  # 8.8.8.8 inside


def test_a_name_resolving_to_6to4_loopback_gets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks.socket, "getaddrinfo", lambda *a, **k: [(0, 0, 0, "", ("2002:7f00:1::1", 80, 0, 0))])
    connected: list[object] = []
    monkeypatch.setattr(hooks.socket, "create_connection", lambda *a, **k: connected.append(a))
    policy = Webhooks(allow_hosts=("hooks.example.internal",))
    outcome, why = post_webhook("http://hooks.example.internal/x", REPORT, policy)
    assert (outcome, connected) == (NOT_DELIVERED, [])
    assert why == (
        "address 2002:7f00:1::1 (IPv4 127.0.0.1 inside) is loopback, link-local or private "
        "(policy.webhooks.allow_private)"
    )
