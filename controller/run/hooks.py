"""Completion hooks (`on_complete:`): downstream systems learn that a job ended.

Both kinds are bounded by the cluster's policy (controller/policy.py), never by the job file:

- ``hook: NAME`` runs the program the policy defines under that name: fixed argv, no shell, as the
  policy's unprivileged uid:gid (when the controller is root), with a clean environment
  (FFSWARM_JOB, FFSWARM_REPORT, a fixed PATH) and a timeout. Only a short redacted tail of its output
  reaches report.json.
- ``webhook: URL`` is POSTed the job's events (Standard Webhooks envelopes, ``envelope``; made and
  kept by controller/run/webhooks.py and controller/run/outbox.py, each attempt ``send_once``) if its
  host is allowed; the resolved address is checked
  (loopback, link-local, private and metadata ranges refused unless allowed) and connected to as
  checked (no second lookup); redirects are never followed. Deliveries carry Standard Webhooks headers
  signed with the secret of the section that allowed the host: ``policy.webhooks`` for a CLI job, the
  tenant's own ``tenants.<t>.webhooks`` for a tenant's job (its run folder's ``owner``), so no tenant
  holds a key that signs another's deliveries or can point its job at another's receiver. The data
  names the tenant (``tenant``, null for a CLI job). The report records delivered, pending (the
  outbox retries it) or not delivered. A tenant's job adds ``results_url``: a signed link to its
  results.zip made with the API's ``api.signing_key_file`` and ``link_ttl`` (absolute with
  ``api.public_url``), so the receiver can fetch the results without a token
  (docs/api.md#results-and-signed-links).

A failing hook is logged and recorded, never fatal to the job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from contract.layout import RunLayout, may_own
from controller import log
from controller import redact as shown
from controller.apiconfig import ApiSettings
from controller.job.owners import TENANT
from controller.job.spec import OnComplete
from controller.policy import Hook, Policy, Webhooks
from controller.run import links
from controller.volume import read_nofollow

HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAIL_CHARS = 200
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
DELIVERED, NOT_DELIVERED = "delivered", "not delivered"
PENDING = "pending"  # in the job's outbox: `serve` retries it (controller/run/outbox.py)


def redact(text: str) -> str:
    """The last TAIL_CHARS of a hook's output, with anything that looks like a secret replaced."""
    tail = text.strip()[-TAIL_CHARS:]
    return shown.printable(shown.secrets(tail), newlines=True)


def run_hook(hook: Hook, report_path: Path, job: str, report_json: str = "") -> str:
    """'ok', or 'failed: …' with the exit status and the redacted tail of its stderr. The report comes
    on stdin too: the hook's uid need not be able to read the run folder."""
    env = {"FFSWARM_JOB": job, "FFSWARM_REPORT": str(report_path), "PATH": HOOK_PATH}
    ids: dict[str, Any] = {}
    if os.geteuid() == 0:  # drop to the policy's uid:gid, no supplementary groups (root's included)
        ids = {"user": hook.uid, "group": hook.gid, "extra_groups": []}
    try:
        proc = subprocess.Popen(
            list(hook.command),
            env=env,
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a timeout kills everything it started
            **ids,
        )
    except OSError as e:
        return f"failed: cannot start: {e.strerror or type(e).__name__}"
    try:
        out, err = proc.communicate(input=report_json, timeout=hook.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"failed: timed out after {hook.timeout}s"
    if proc.returncode == 0:
        return "ok"
    return f"failed: exit {proc.returncode}: {redact(err or out)}"


# -- webhooks --------------------------------------------------------------------------------------------
class WebhookRefused(Exception):
    """Why a webhook is not sent; logged for the operator, never copied into the report."""


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and reaches: IPv4-mapped (``::ffff:a.b.c.d``), 6to4
    (``2002::/16``, bits 16–48), Teredo (``2001::/32``, the client: the last 32 bits inverted) or
    NAT64 (``64:ff9b::/96``); None for any other."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def check_address(ip: str, policy: Webhooks) -> None:
    """Refuse an address the policy does not allow; an IPv6 address that wraps an IPv4 one is
    judged by the IPv4 address it reaches."""
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip.split("%")[0])
    shown_addr = str(addr)
    if isinstance(addr, ipaddress.IPv6Address) and (inner := embedded_ipv4(addr)) is not None:
        shown_addr = f"{addr} (IPv4 {inner} inside)" if addr.ipv4_mapped is None else str(inner)
        addr = inner
    if addr in _METADATA or addr.is_multicast or addr.is_unspecified:
        raise WebhookRefused(f"address {shown_addr} is never allowed")
    private = addr.is_loopback or addr.is_link_local or addr.is_private or addr.is_reserved or not addr.is_global
    if private and not policy.allow_private:
        raise WebhookRefused(f"address {shown_addr} is loopback, link-local or private ({policy.name}.allow_private)")


def resolve(url: str, policy: Webhooks) -> tuple[str, str, int, str]:
    """(scheme, host, port, checked IP) of an allowed URL; raises WebhookRefused."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise WebhookRefused("not an http(s) URL")
    if host not in policy.allow_hosts:
        raise WebhookRefused(f"host {host} is not in {policy.name}.allow_hosts")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused("the URL's port is not a port number") from None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise WebhookRefused(f"cannot resolve {host}: {e}") from None
    ip = str(infos[0][4][0])
    check_address(ip, policy)
    return parts.scheme, host, port, ip


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address that was checked, not to whatever a second lookup returns."""

    def __init__(self, host: str, port: int, ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.ip = ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self.ip, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.ip = ip

    def connect(self) -> None:
        raw = socket.create_connection((self.ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def read_secret(path: Path | None) -> bytes | None:
    """The signing key: the file's text; a Standard Webhooks ``whsec_…`` secret is base64-decoded."""
    if path is None:
        return None
    text = path.read_text().strip()
    return base64.b64decode(text.removeprefix("whsec_")) if text.startswith("whsec_") else text.encode()


def sign(secret: bytes, delivery_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


@dataclass(frozen=True)
class Attempt:
    """One try of a delivery: the receiver's HTTP status, or the class of the error that stopped it
    (never the response body). ``final``: asking again will not help (refused by the policy, a
    redirect, a 4xx other than 408, 425 and 429)."""

    status: int | None = None
    error: str | None = None
    final: bool = False
    detail: str = ""  # for the operator's log, never the receiver's body

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


RETRYABLE_4XX = frozenset({408, 425, 429})


def envelope(kind: str, data: Mapping[str, Any], at: float) -> dict[str, Any]:
    """The Standard Webhooks body: ``{"type", "timestamp", "data"}`` (``timestamp``: when the event
    happened, RFC 3339 UTC; the ``webhook-timestamp`` header is the time of each attempt)."""
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"type": kind, "timestamp": stamp, "data": dict(data)}


def send_once(url: str, body: bytes, delivery_id: str, policy: Webhooks, now: float, timeout: float = 10.0) -> Attempt:
    """POST ``body`` once, signed for ``delivery_id`` at ``now``; the host and its address are
    checked on every attempt (the policy may have changed, the name may resolve elsewhere)."""
    try:
        scheme, host, port, ip = resolve(url, policy)
        secret = read_secret(policy.secret_file)
    except WebhookRefused as e:
        return Attempt(error="refused", final=True, detail=str(e))
    except OSError as e:
        why = f"cannot read {policy.name}.secret_file: {e.strerror or e}"
        return Attempt(error="no_secret", final=True, detail=why)
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    timestamp = int(now)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "ffswarm",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
    }
    if secret is not None:
        headers["webhook-signature"] = sign(secret, delivery_id, timestamp, body)
    kind = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = kind(host, port, ip, timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        return Attempt(error=type(e).__name__, detail=f"{type(e).__name__}: {e}")
    finally:
        conn.close()
    # a redirect is never followed and a refusal will not change by asking again
    final = not 200 <= status < 300 and status < 500 and status not in RETRYABLE_4XX
    return Attempt(status=status, final=final, detail=f"HTTP {status}")


def post_webhook(
    url: str,
    body: Mapping[str, Any],
    policy: Webhooks,
    attempts: int = 4,
    timeout: float = 10.0,
    sleep: Callable[[float], None] | None = None,
) -> tuple[str, str]:
    """(DELIVERED or NOT_DELIVERED, why) of a delivery outside the outbox: one delivery id, reused
    by its retries (a receiver deduplicates on it); once a 2xx is read nothing is sent again."""
    data = json.dumps(body).encode()
    delivery_id = new_id()
    why = ""
    for n in range(attempts):
        tried = send_once(url, data, delivery_id, policy, time.time(), timeout)
        if tried.ok:
            return DELIVERED, tried.detail
        why = tried.detail
        if tried.final:
            return NOT_DELIVERED, why
        if n + 1 < attempts:
            (sleep or time.sleep)(min(2**n, 8))
    return NOT_DELIVERED, why


def new_id() -> str:
    """A delivery id (``msg_…``), fixed when the delivery is made and sent with every retry."""
    return f"msg_{uuid.uuid4().hex}"


def job_tenant(data_root: Path, job: str) -> str | None:
    """The tenant the run folder's ``owner`` names (controller/run/jobs.py write_owner); None for a
    CLI job, and for a tenant's pack whose id carries another tenant's key (may_own)."""
    raw = read_nofollow(RunLayout.host(data_root, job).owner, 64)
    tenant = None if raw is None else raw.decode("ascii", "replace").strip()
    return tenant if tenant is not None and TENANT.fullmatch(tenant) and may_own(job, tenant) else None


def results_link(data_root: Path, job: str, tenants: Mapping[str, object], api: ApiSettings) -> dict[str, str]:
    """``{"results_url": …}`` for a tenant's job when the API signs links (in the job's current link
    generation: a revoke before the job ended counts); {} for a CLI job, without a signing key, or
    when the key cannot be read (logged: the webhook still goes, without a link)."""
    tenant = job_tenant(data_root, job)
    if tenant is None or tenant not in tenants or api.signing_key_file is None:
        return {}
    try:
        key = links.read_key(api.signing_key_file)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        log.get(job=job).warning("webhook_link_not_signed", key_file=str(api.signing_key_file), error=why)
        return {}
    gen = links.generation(data_root, tenant, job)
    link = links.sign(links.SigningKeys(key), "GET", links.results_path(job), api.link_ttl, gen)
    return {"results_url": links.absolute(api.public_url, link)}


def on_complete(
    policy: Policy,
    hooks: OnComplete,
    report: dict[str, Any],
    report_path: Path,
    webhook_extra: Mapping[str, str | None] | None = None,
    webhooks: Webhooks | None = None,
    deliver: Callable[[], tuple[str, str]] | None = None,
) -> dict[str, str]:
    """``webhook_extra``: fields the webhook's data carries beside the report (``tenant``,
    ``results_url``). ``webhooks``: the tenant's own hosts and key for a tenant's job; None for a
    CLI job (the cluster's ``policy.webhooks``). ``deliver``: the job's outbox delivery, tried now and
    left pending for `serve` (controller/run/outbox.py); without it, a ``job.finished`` delivery of
    the report is tried a few times at once and then dropped."""
    logger = log.get(job=report["job"])
    outcome: dict[str, str] = {}
    if hooks.webhook:
        if deliver is not None:
            outcome["webhook"], why = deliver()
        else:
            body = envelope("job.finished", {**report, **(webhook_extra or {})}, time.time())
            allowed = policy.webhooks if webhooks is None else webhooks
            outcome["webhook"], why = post_webhook(hooks.webhook, body, allowed)
        # the URL as logs may show it: no credentials, no query (tokens often travel there)
        logger.info("hook_webhook", url=shown.url(hooks.webhook), outcome=outcome["webhook"], detail=shown.secrets(why))
    if hooks.hook:
        hook = policy.hooks.get(hooks.hook)
        if hook is None:  # the policy changed since submit: the hook is gone
            outcome["hook"] = f"failed: no hook {hooks.hook!r} in the cluster's policy"
        else:
            outcome["hook"] = run_hook(hook, report_path, report["job"], json.dumps(report))
        # the hook's name and program, never its arguments (an operator may pass a token there)
        program = os.path.basename(hook.command[0]) if hook and hook.command else None
        logger.info("hook_run", hook=hooks.hook, program=program, outcome=outcome["hook"])
    return outcome
