"""A job-end webhook whose receiver is down when the job ends stays in the job's outbox on the volume:
a `serve` SIGKILLed with it pending delivers it after its restart, once, under the same id, signed."""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import threading
import time
from typing import Any

import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from controller.run.handover import serving
from tests.integration.conftest import CONFIG, Serve, Workspace, free_port
from tests.integration.test_operating import make_job
from tests.integration.test_ops_serve import wait_for

pytestmark = pytest.mark.integration


def test_a_serve_killed_with_a_delivery_pending_delivers_it_once_after_its_restart(workspace: Workspace) -> None:
    ws = workspace
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    (ws.dir / "hook.key").write_text(secret)
    data = yaml.safe_load(CONFIG.read_text())
    hooks = {"allow_hosts": ["127.0.0.1"], "allow_private": True, "secret_file": str(ws.dir / "hook.key")}
    data["policy"] = {**(data.get("policy") or {}), "webhooks": hooks}
    data["webhooks"] = {"retry_schedule": ["2s"] * 50}
    config = ws.dir / "ffswarm.yaml"
    config.write_text(yaml.safe_dump(data))
    port = free_port()  # nobody listens there yet: the receiver is down
    hook = {"webhook": f"http://127.0.0.1:{port}/hook", "webhook_events": ["job.finished"]}
    job = make_job(ws, 1, ws.config.image, on_complete=hook)

    first = Serve(ws.dir / "inbox", free_port(), config=config)
    first.start()
    second = Serve(ws.dir / "inbox", free_port(), config=config)
    try:
        deadline = time.monotonic() + 60
        while not serving(first.inbox):
            assert first.proc is not None and first.proc.poll() is None, (ws.dir / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve wrote no heartbeat"
            time.sleep(0.2)
        r = ws.ffswarm("submit", "--detach", "--inbox", str(first.inbox), str(job), config=config, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        wait_for(first.inbox / "done" / f"{ws.job}.yaml", 300, first)
        [record] = [json.loads(p.read_text()) for p in (ws.root / "runs" / ws.job / "deliveries").glob("msg_*.json")]
        assert record["state"] == "pending" and record["attempts"], record  # tried, refused: kept
        first.kill(signal.SIGKILL)

        got: list[tuple[dict[str, str], bytes]] = []

        class Receiver(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                got.append((dict(self.headers.items()), self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.HTTPServer(("127.0.0.1", port), Receiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            second.start()
            deadline = time.monotonic() + 120
            path = ws.root / "runs" / ws.job / "deliveries" / f"{record['id']}.json"
            while json.loads(path.read_text())["state"] != "delivered":
                alive = second.proc is not None and second.proc.poll() is None
                assert alive, (ws.dir / "serve.log").read_text()[-2000:]
                assert time.monotonic() < deadline, (got, json.loads(path.read_text()))
                time.sleep(0.5)
        finally:
            server.shutdown()
            server.server_close()
    finally:
        first.kill()
        second.kill(signal.SIGTERM)
    assert len(got) == 1, got  # once
    headers, body = got[0]
    assert headers["webhook-id"] == record["id"]  # the id given when the job ended, kept across the restart
    event = Webhook(secret).verify(body, headers)
    assert (event["type"], event["data"]["job"], event["data"]["outcome"]) == ("job.finished", ws.job, "succeeded")
