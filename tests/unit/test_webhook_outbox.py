"""Webhooks that survive a receiver's outage: Standard Webhooks envelopes kept in the job's outbox on
the volume until delivered, retried on ``webhooks.retry_schedule``, each with one id for all its
tries. Real loopback receivers, real run folders on a temp data root, the reference verifier
(``standardwebhooks``) and an injected clock: no test waits."""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from controller.api import schemas
from controller.config import Config, parse_config
from controller.errors import ConfigError, JobFileError
from controller.job.files import parse_job
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.job.settings import OnComplete
from controller.policy import Webhooks
from controller.run import control, hooks, webhooks
from controller.run.metrics import Metrics
from controller.run.outbox import Outbox, OutboxError
from controller.run.report import Counts, Report
from controller.run.rundir import Control, RunDir
from controller.run.usecase import call_hooks
from controller.run.webhooks import Deliverer
from controller.serve.daemon import Inbox, Outcome, Server
from controller.settings.webhooks import WebhookSettings
from tests.builders import Env, api_env, make_config
from tests.unit.test_api_ops import run_once, submit

KEY = b"outbox-webhook-key-0123456789abc"
WHSEC = "whsec_" + base64.b64encode(KEY).decode()
REPLY = b'{"receiver": "private reply, never recorded"}'


class Clock:
    """Starts at the real time (the reference verifier allows 5 minutes of skew) and moves only when told."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Receiver:
    """A webhook receiver on a fixed loopback port that can go down (connection refused) and come back."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        self.port = 0
        self.httpd: http.server.HTTPServer | None = None
        self.up()

    def up(self) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                outer.got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", str(len(REPLY)))
                self.end_headers()
                self.wfile.write(REPLY)
                outer.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def verified(self) -> list[dict[str, Any]]:
        """Every body received, checked by the Standard Webhooks reference verifier."""
        return [Webhook(WHSEC).verify(body, headers) for headers, body in self.got]

    def ids(self) -> list[str]:
        return [headers["webhook-id"] for headers, _ in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    if r.httpd is not None:
        r.down()


def configured(tmp_path: Path, **extra: Any) -> Config:
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    (tmp_path / "secrets" / "hook").write_text(WHSEC + "\n")
    data["policy"] = {"webhooks": {"allow_hosts": ["127.0.0.1"], "allow_private": True,
                                   "secret_file": str(tmp_path / "secrets" / "hook")}}  # fmt: skip
    data.update(extra)
    path.write_text(yaml.safe_dump(data))
    return parse_config(path, data)


def run_folder(config: Config, job: str = "j-cli") -> RunDir:
    item = PlannedItem("i000000", "in/0.jpg", "out/0.jpg", "image")
    rd = RunDir(config.data_root, job)
    rd.create(b"name: x\n", Plan(job, (item,), (Chunk("c0000", (item.id,)),)), {}, Control(1), "sha256:x")
    return rd


def ended(config: Config, rd: RunDir, hooks: OnComplete) -> dict[str, str] | None:
    """call_hooks at the end of a run, as the use case calls it."""
    report = Report(rd.job, "img", 0.0, 1.0, Counts(1, 1, 0, 0, 1), (), {}, {})
    done = call_hooks(config, hooks, rd, report, rd.path / "report.json")
    return None if done.hooks is None else dict(done.hooks)


def test_the_retry_schedule_is_read_from_the_config_and_lasts_a_day_by_default(tmp_path: Path) -> None:
    assert WebhookSettings().span >= 24 * 3600
    config = configured(tmp_path, webhooks={"retry_schedule": ["5s", "2m", "1h"]})
    assert config.webhook_delivery.retry_schedule == (5, 120, 3600)
    with pytest.raises(ConfigError, match=r"webhooks\.retry_schedule\[1\]: must be a duration"):
        configured(tmp_path / "b", webhooks={"retry_schedule": ["5s", "soon"]})


def test_a_receiver_down_for_two_minutes_gets_the_delivery_exactly_once(tmp_path: Path, receiver: Receiver) -> None:
    config = configured(tmp_path)
    rd = run_folder(config)
    clock = Clock()
    box = Outbox(config.data_root, WebhookSettings((5, 30, 120, 600)), clock)
    sender = Deliverer(box, lambda job: config.policy.webhooks)
    receiver.down()
    made = box.enqueue(rd.job, "job.finished", {"job": rd.job, "outcome": "succeeded"}, receiver.url)
    tried_at = []
    for step in (0, 5, 30, 60, 59):  # over two minutes of a receiver that refuses connections
        clock.advance(step)
        if sender.run_due():
            tried_at.append(clock.t - made.created)
    assert tried_at == [0, 5, 35]  # on the schedule, never before a try is due
    assert box.read(rd.job, made.id).state == "pending"  # type: ignore[union-attr]
    receiver.up()
    clock.advance(1)  # the next try: 2 minutes after the last
    assert sender.run_due() == 1
    for _ in range(5):  # later passes, hours later: nothing is sent again
        clock.advance(3600)
        assert sender.run_due() == 0
    assert receiver.ids() == [made.id]
    [sent] = receiver.verified()
    assert sent["type"] == "job.finished" and sent["data"] == {"job": rd.job, "outcome": "succeeded"}
    done = box.read(rd.job, made.id)
    assert done is not None and done.state == "delivered" and done.next_attempt is None
    assert [a.get("status") or a.get("error") for a in done.attempts] == [
        "ConnectionRefusedError", "ConnectionRefusedError", "ConnectionRefusedError", 200
    ]  # fmt: skip
    assert b"private reply" not in box.record(rd.job, made.id).read_bytes()  # never the receiver's body
    assert list(box.entries()) == []  # it left the queue


def test_a_delivery_pending_when_the_deliverer_is_discarded_is_sent_by_the_next(
    tmp_path: Path, receiver: Receiver
) -> None:
    """The restart case: a CLI job's end tried once with the receiver down (the report says pending);
    a `serve` started later reads the outbox from the volume and delivers it under the same id."""
    config = configured(tmp_path)
    rd = run_folder(config)
    receiver.down()
    assert ended(config, rd, OnComplete(webhook=receiver.url)) == {"webhook": "pending"}
    [pending] = webhooks.outbox(config).deliveries(rd.job)
    first = Deliverer(Outbox(config.data_root, config.webhook_delivery, Clock()), lambda job: config.policy.webhooks)
    assert first.run_due() == 0  # not due yet
    del first  # serve killed with the delivery pending
    receiver.up()
    clock = Clock()
    clock.advance(10)
    restarted = webhooks.deliverer(config, Outbox(config.data_root, config.webhook_delivery, clock))
    assert restarted.run_due() == 1
    assert receiver.ids() == [pending.id]
    [sent] = receiver.verified()
    assert sent["type"] == "job.finished" and sent["data"]["outcome"] == "succeeded"
    assert sent["data"]["job"] == rd.job and sent["data"]["phase"] == "finished"
    clock.advance(86400)
    assert restarted.run_due() == 0 and len(receiver.got) == 1


def test_serve_sends_what_an_earlier_controller_left_pending(tmp_path: Path, receiver: Receiver) -> None:
    """A `serve` started on the volume (after one was killed, or after a `submit`) sends the pending
    delivery from its own sender thread, without any job to run."""
    config = configured(tmp_path)
    rd = run_folder(config)
    receiver.down()
    assert ended(config, rd, OnComplete(webhook=receiver.url)) == {"webhook": "pending"}
    [pending] = webhooks.outbox(config).deliveries(rd.job)
    receiver.up()
    past = Outbox(config.data_root, config.webhook_delivery, lambda: pending.created - 60)
    past.redeliver(rd.job, pending.id)  # due now: the test does not wait out the schedule
    inbox = Inbox(config.data_root / "inbox")
    server = Server(config, inbox, Metrics(), poll=0.05, run=lambda *a: Outcome(True, None))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        assert receiver.arrived.wait(10)
    finally:
        server.stop.set()
        t.join(10)
    assert receiver.ids() == [pending.id]
    [d] = webhooks.outbox(config).deliveries(rd.job)
    assert d.state == "delivered" and list(webhooks.outbox(config).entries()) == []


def test_a_record_replaced_on_the_volume_is_never_followed_nor_sent(tmp_path: Path, receiver: Receiver) -> None:
    config = configured(tmp_path)
    rd = run_folder(config)
    clock = Clock()
    box = Outbox(config.data_root, config.webhook_delivery, clock)
    linked = box.enqueue(rd.job, "job.finished", {"job": rd.job}, receiver.url)
    garbled = box.enqueue(rd.job, "job.started", {"job": rd.job}, receiver.url)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(box.record(rd.job, linked.id).read_bytes())
    box.record(rd.job, linked.id).unlink()
    box.record(rd.job, linked.id).symlink_to(elsewhere)
    box.record(rd.job, garbled.id).write_text('{"id": "msg_x", "url": "http://evil.example/"}')
    assert box.deliveries(rd.job) == []  # neither is a record ffswarm wrote
    assert Deliverer(box, lambda job: config.policy.webhooks).run_due() == 0
    assert receiver.got == [] and list(box.entries()) == []  # nothing sent; their pointers dropped
    with pytest.raises(OutboxError) as e:
        box.read(rd.job, garbled.id)
    assert "evil" not in str(e.value) and f"runs/{rd.job}/deliveries/{garbled.id}.json" in str(e.value)


class Killed(BaseException):
    """The controller killed right after the receiver answered, before the answer was recorded."""


def test_a_sender_killed_before_recording_a_success_sends_the_same_id_again(tmp_path: Path, receiver: Receiver) -> None:
    config = configured(tmp_path)
    rd = run_folder(config)
    clock = Clock()
    box = Outbox(config.data_root, config.webhook_delivery, clock)
    made = box.enqueue(rd.job, "job.finished", {"job": rd.job}, receiver.url)

    def send_then_die(url: str, body: bytes, delivery: str, policy: Webhooks, now: float) -> Any:
        hooks.send_once(url, body, delivery, policy, now)
        raise Killed

    with pytest.raises(Killed):
        Deliverer(box, lambda job: config.policy.webhooks, send_then_die).run_due()
    claim = box.folder(rd.job) / f"{made.id}.sending"
    claim.write_text(str(clock.t))  # what a killed sender leaves behind
    restarted = Deliverer(Outbox(config.data_root, config.webhook_delivery, clock), lambda job: config.policy.webhooks)
    clock.advance(60)
    restarted.run_due()
    assert len(receiver.got) == 1  # the claim is the killed sender's for a while yet
    clock.advance(120)
    assert restarted.run_due() == 1
    assert receiver.ids() == [made.id, made.id]  # the same id: the receiver drops the second
    assert box.read(rd.job, made.id).state == "delivered"  # type: ignore[union-attr]
    assert not claim.exists()


def test_a_job_announces_its_start_once_and_its_end_and_the_filter_leaves_out_the_rest(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = configured(tmp_path)
    rd = run_folder(config, "j-all")
    every = OnComplete(webhook=receiver.url)
    webhooks.started(config, rd, every)
    webhooks.started(config, rd, every)  # a resumed run: not announced again
    assert ended(config, rd, every) == {"webhook": "delivered"}
    assert [b["type"] for b in receiver.verified()] == ["job.started", "job.finished"]
    assert receiver.verified()[0]["data"]["phase"] == "running"
    assert receiver.verified()[0]["data"]["outcome"] is None
    assert all(b["data"]["tenant"] is None for b in receiver.verified())  # a CLI job: the data says so

    only_end = OnComplete(webhook=receiver.url, webhook_events=("job.finished",))
    rd2 = run_folder(config, "j-end")
    webhooks.started(config, rd2, only_end)
    control.flag_cancel(rd2)
    assert ended(config, rd2, only_end) is None  # cancelled: job.cancelled is not in its list
    assert len(receiver.got) == 2 and webhooks.outbox(config).deliveries(rd2.job) == []

    rd3 = run_folder(config, "j-cancel")
    control.flag_cancel(rd3)
    assert ended(config, rd3, every) == {"webhook": "delivered"}
    last = receiver.verified()[-1]
    assert last["type"] == "job.cancelled" and last["data"]["outcome"] == "cancelled"


def test_a_job_file_names_the_events_its_webhook_wants(tmp_path: Path) -> None:
    base = {"name": "j", "source": "a.jpg", "targets": ["b.jpg"], "output": "o/{stem}{ext}"}
    hook = {"webhook": "https://hooks.example.internal/x", "webhook_events": ["job.finished", "job.cancelled"]}
    spec = parse_job({**base, "on_complete": hook}, "j.yaml")
    assert spec.on_complete.webhook_events == ("job.finished", "job.cancelled")
    with pytest.raises(JobFileError) as e:
        parse_job({**base, "on_complete": {**hook, "webhook_events": ["job.done"]}}, "j.yaml")
    assert e.value.field == "on_complete.webhook_events[0]" and "job.started" in e.value.reason
    with pytest.raises(JobFileError) as e:
        parse_job({**base, "on_complete": {"webhook_events": ["job.finished"]}}, "j.yaml")
    assert e.value.field == "on_complete.webhook_events" and "needs webhook" in e.value.reason


def test_a_refused_delivery_fails_at_once_and_is_not_retried(tmp_path: Path, receiver: Receiver) -> None:
    config = configured(tmp_path)
    rd = run_folder(config)
    clock = Clock()
    box = Outbox(config.data_root, config.webhook_delivery, clock)
    made = box.enqueue(rd.job, "job.finished", {"job": rd.job}, receiver.url)
    closed = Webhooks(allow_hosts=("hooks.example.internal",))  # the policy no longer allows the host
    assert Deliverer(box, lambda job: closed).run_due() == 1
    d = box.read(rd.job, made.id)
    assert d is not None and d.state == "failed" and d.attempts[0]["error"] == "refused"
    assert receiver.got == [] and list(box.entries()) == []


def test_a_url_with_a_bad_port_fails_its_delivery_without_stopping_the_job(tmp_path: Path) -> None:
    config = configured(tmp_path)
    rd = run_folder(config)
    assert ended(config, rd, OnComplete(webhook="http://127.0.0.1:99999/x")) == {"webhook": "not delivered"}
    [d] = webhooks.outbox(config).deliveries(rd.job)
    assert d.state == "failed" and d.attempts[0]["error"] == "refused"


# -- the API ----------------------------------------------------------------------------------------------
@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path, quota={"jobs_queued": 2, "gpus": 4})


def test_a_tenant_lists_its_jobs_deliveries_and_redelivers_one_under_the_same_id(
    env: Env, tmp_path: Path, receiver: Receiver
) -> None:
    job = submit(env)
    rd = run_once(env.config, job, fail=set())
    rd.write_file(rd.layout.owner, b"acme\n")
    (tmp_path / "key").write_text(WHSEC)
    policy = Webhooks(allow_hosts=("127.0.0.1",), allow_private=True, secret_file=tmp_path / "key")
    clock = Clock()
    box = Outbox(env.root, WebhookSettings((60,)), clock)
    sender = Deliverer(box, lambda j: policy)
    made = box.enqueue(job, "job.finished", {"job": job}, receiver.url + "?token=abc")
    assert sender.run_due() == 1
    with env.client() as c:
        r = c.get(f"/v1/jobs/{job}/deliveries")
        assert r.status_code == 200, r.text
        [shown] = r.json()["deliveries"]
        assert shown["id"] == made.id and shown["type"] == "job.finished" and shown["state"] == "delivered"
        assert shown["next_attempt_at"] is None and shown["created_at"].endswith("Z")
        assert [set(a) for a in shown["attempts"]] == [{"at", "status"}] and shown["attempts"][0]["status"] == 200
        assert "token=abc" not in r.text  # the URL is not shown
        r = c.post(f"/v1/jobs/{job}/deliveries/{made.id}/redeliver")
        assert r.status_code == 202, r.text
        assert r.json()["id"] == made.id and r.json()["state"] == "pending"
        assert c.post(f"/v1/jobs/{job}/deliveries/msg_{'0' * 32}/redeliver").status_code == 404
        assert c.post(f"/v1/jobs/{job}/deliveries/..%2Fx/redeliver").status_code == 404
    with env.client("globex") as c:  # another tenant's job does not exist for it
        assert c.get(f"/v1/jobs/{job}/deliveries").status_code == 404
        r = c.post(f"/v1/jobs/{job}/deliveries/{made.id}/redeliver")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    clock.advance(60)  # the API queued it by the real clock: due by now
    assert sender.run_due() == 1
    assert receiver.ids() == [made.id, made.id]  # the same id: the receiver knows it has it
    with env.client() as c:
        listed = c.get(f"/v1/jobs/{job}/deliveries").json()
        doc = c.get("/openapi.json").json()
    [again] = listed["deliveries"]
    assert again["state"] == "delivered" and len(again["attempts"]) == 2
    # the answers are the ones /openapi.json documents
    get_op = doc["paths"]["/v1/jobs/{job}/deliveries"]["get"]
    post_op = doc["paths"]["/v1/jobs/{job}/deliveries/{delivery}/redeliver"]["post"]
    assert (get_op["operationId"], post_op["operationId"]) == ("listJobDeliveries", "redeliverJobDelivery")
    assert get_op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/DeliveryPage")
    assert post_op["responses"]["202"]["content"]["application/json"]["schema"]["$ref"].endswith("/Delivery")
    schemas.DeliveryPage.model_validate(listed)
    schemas.Delivery.model_validate(again)
