"""A tenant's job that ends before it has a run folder still tells its webhook, exactly once: `serve`
refusing it (``job.finished``, ``outcome: failed``, the reason) and the API cancelling it while it is
queued (``job.cancelled``). Real API on loopback, real `serve` threads, real receivers, the
reference verifier and an injected clock."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from contract.layout import run_rel
from controller.config import Config, parse_config
from controller.job.settings import OnComplete
from controller.run import status, webhooks
from controller.run.metrics import Metrics
from controller.run.outbox import Outbox, stable_id
from controller.run.rundir import Stage
from controller.run.webhooks import Deliverer
from controller.serve import refusals
from controller.serve.daemon import MAX_STARTS, Inbox, Server
from tests.builders import Env, beat, make_config, serve_api
from tests.unit.test_api_ops import claim, submit
from tests.unit.test_webhook_outbox import WHSEC as CLUSTER_WHSEC
from tests.unit.test_webhook_outbox import Clock, Receiver, configured, ended, run_folder

KEY = b"acme-own-webhook-key-0123456789ab"
WHSEC = "whsec_" + base64.b64encode(KEY).decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    if r.httpd is not None:
        r.down()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    """The two-tenant API whose tenant acme may post webhooks to loopback with its own key."""
    make_config(tmp_path)
    path = tmp_path / "ffswarm.yaml"
    data = yaml.safe_load(path.read_text())
    (tmp_path / "secrets" / "acme-hook").write_text(WHSEC + "\n")
    data["tenants"]["acme"]["webhooks"] = {
        "allow_hosts": ["127.0.0.1"], "allow_private": True, "secret_file": str(tmp_path / "secrets" / "acme-hook"),
    }  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    config = parse_config(path, data)
    beat(config)
    for url in serve_api(config):
        yield Env(config, config.data_root, url, b"")


def box(config: Config, clock: Clock) -> Outbox:
    """The outbox as `serve`'s deliverer reads it, on the test's clock."""
    return Outbox(config.data_root, config.webhook_delivery, clock, functools.partial(webhooks.record_tenant, config))


def verified(r: Receiver) -> list[dict[str, object]]:
    return [Webhook(WHSEC).verify(body, headers) for headers, body in r.got]


def refuse_in_serve(env: Env, job: str) -> None:
    """`serve` claims the job and runs it: its source was removed after the 202, so it is refused."""
    (env.area() / "faces" / "me.jpg").unlink()
    claimed = claim(env.config, job)
    server = Server(env.config, Inbox(env.config.data_root / "inbox"), Metrics(), poll=0.05)
    server.start_job(claimed)
    server._active[claimed.name].join(30)
    assert (env.root / "inbox" / "failed" / f"{job}.yaml").exists()


def test_a_job_serve_refuses_tells_its_webhook_once_with_the_reason(env: Env, receiver: Receiver) -> None:
    job = submit(env, on_complete={"webhook": receiver.url})
    refuse_in_serve(env, job)
    clock = Clock()
    sender = webhooks.deliverer(env.config, box(env.config, clock))
    assert sender.run_due() == 1
    assert sender.run_due() == 0
    [event] = verified(receiver)  # signed with acme's own key
    assert event["type"] == "job.finished"
    data = event["data"]
    assert isinstance(data, dict)
    assert (data["phase"], data["outcome"], data["owner"], data["tenant"]) == ("refused", "failed", "acme", "acme")
    assert "faces/me.jpg" in data["reason"] and "tenants/acme" not in data["reason"]
    with env.client() as c:
        shown = c.get(f"/v1/jobs/{job}").json()
        assert shown["phase"] == "refused" and shown["reason"] == data["reason"]
        listed = c.get(f"/v1/jobs/{job}/deliveries").json()["deliveries"]
        assert [(d["id"], d["type"], d["state"]) for d in listed] == [(receiver.ids()[0], "job.finished", "delivered")]
        assert c.get(f"/v1/jobs/{job}/deliveries", headers={"Authorization": "Bearer x"}).status_code == 401
    with env.client("globex") as c:
        assert c.get(f"/v1/jobs/{job}/deliveries").status_code == 404
    assert not (env.root / run_rel(job)).exists()  # the deliveries live beside the owner record


def test_a_serve_restarted_after_queueing_a_refusal_does_not_announce_it_again(env: Env, receiver: Receiver) -> None:
    """Killed between queueing the end and moving the file to failed/: the next serve refuses the
    file again and finds the delivery it made (one id), and a new deliverer sends it once."""
    job = submit(env, on_complete={"webhook": receiver.url})
    (env.area() / "faces" / "me.jpg").unlink()
    claimed = claim(env.config, job)
    refusals.announce(env.config, claimed, "MissingInputError (exit 66): faces/me.jpg is missing")
    refusals.announce(env.config, claimed, "MissingInputError (exit 66): faces/me.jpg is missing")  # restarted
    clock = Clock()
    [made] = box(env.config, clock).deliveries(job)
    assert made.id == stable_id(job, "job.finished", webhooks.BEFORE_RUN)
    assert webhooks.deliverer(env.config, box(env.config, clock)).run_due() == 1
    assert Deliverer(box(env.config, clock), webhooks.deliverer(env.config).policy_for).run_due() == 0
    assert receiver.ids() == [made.id]
    assert len(box(env.config, clock).deliveries(job)) == 1


def test_a_queued_job_cancelled_through_the_api_tells_its_webhook_once(env: Env, receiver: Receiver) -> None:
    job = submit(env, on_complete={"webhook": receiver.url})
    with env.client() as c:
        assert c.post(f"/v1/jobs/{job}/cancel").status_code == 200
        assert c.post(f"/v1/jobs/{job}/cancel").status_code == 409  # already out of the inbox: no second event
    clock = Clock()
    sender = webhooks.deliverer(env.config, box(env.config, clock))
    assert sender.run_due() == 1
    [event] = verified(receiver)
    assert event["type"] == "job.cancelled"
    data = event["data"]
    assert isinstance(data, dict)
    assert (data["phase"], data["outcome"], data["tenant"]) == ("cancelled", "cancelled", "acme")
    with env.client() as c:
        [shown] = c.get(f"/v1/jobs/{job}/deliveries").json()["deliveries"]
        assert shown["type"] == "job.cancelled" and shown["state"] == "delivered"
        r = c.post(f"/v1/jobs/{job}/deliveries/{shown['id']}/redeliver")  # the API writes beside the record
        assert r.status_code == 202 and r.json()["state"] == "pending"
        clock.advance(1)
        assert sender.run_due() == 1
        assert receiver.ids() == [shown["id"], shown["id"]]
        assert c.delete(f"/v1/jobs/{job}").status_code in (200, 204)
    assert not (env.root / "tenants" / ".jobs" / "acme" / f"{job}.deliveries").exists()  # deleted with the job


def test_the_webhook_events_filter_leaves_out_an_end_before_the_run(env: Env, receiver: Receiver) -> None:
    only_started = {"webhook": receiver.url, "webhook_events": ["job.started"]}
    cancelled = submit(env, on_complete=only_started)
    with env.client() as c:
        assert c.post(f"/v1/jobs/{cancelled}/cancel").status_code == 200
    (env.area() / "faces" / "me.jpg").parent.mkdir(exist_ok=True)
    refused = submit(env, on_complete={"webhook": receiver.url, "webhook_events": ["job.cancelled"]})
    refuse_in_serve(env, refused)
    clock = Clock()
    assert webhooks.deliverer(env.config, box(env.config, clock)).run_due() == 0
    assert receiver.got == []
    with env.client() as c:
        for job in (cancelled, refused):
            assert c.get(f"/v1/jobs/{job}/deliveries").json() == {"job": job, "deliveries": []}


def test_a_job_without_a_webhook_or_a_cli_file_refused_announces_nothing(env: Env, receiver: Receiver) -> None:
    job = submit(env)
    refuse_in_serve(env, job)
    cli = env.root / "inbox" / "cli-job.yaml"
    cli.write_text(json.dumps({"source": "x.jpg", "targets": ["y.jpg"], "on_complete": {"webhook": receiver.url}}))
    refusals.announce(env.config, cli, "JobFileError (exit 65): x.jpg is missing")
    assert list(box(env.config, Clock()).entries()) == []


def test_an_end_queued_again_after_a_restart_is_one_delivery_and_a_retry_is_a_new_one(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A controller killed after queueing a job's end but before the run was recorded as ended runs
    the hooks again on its restart: the same delivery, not sent twice. A retry of the ended job is
    a new run whose end is announced under a new id."""
    config = configured(tmp_path)
    rd = run_folder(config)
    hooks = OnComplete(webhook=receiver.url)
    assert ended(config, rd, hooks) == {"webhook": "delivered"}
    assert ended(config, rd, hooks) == {"webhook": "delivered"}  # the restarted controller's second call
    assert len(receiver.got) == 1 and len(webhooks.outbox(config).deliveries(rd.job)) == 1
    rd.write_report({"job": rd.job})
    rd.enter(Stage.ENDED)
    assert status.finished(rd)
    webhooks.run_again(rd)  # retried
    assert ended(config, rd, hooks) == {"webhook": "delivered"}
    first, second = webhooks.outbox(config).deliveries(rd.job)
    assert first.id != second.id and receiver.ids() == [first.id, second.id]
    assert [Webhook(CLUSTER_WHSEC).verify(b, h)["type"] for h, b in receiver.got] == ["job.finished"] * 2


def test_an_end_before_the_run_goes_only_to_a_host_the_tenant_allows(env: Env, receiver: Receiver) -> None:
    """The tenant's own allow_hosts decide, as for any event: another host gets nothing queued, and
    another tenant's section (globex allows none) never signs or sends acme's events."""
    job = submit(env, on_complete={"webhook": receiver.url})
    elsewhere = OnComplete(webhook="http://hooks.elsewhere.example/x")
    data = {"job": job, "phase": "cancelled"}
    assert webhooks.ended_before_running(env.config, job, "acme", elsewhere, "job.cancelled", data) is None
    assert (
        webhooks.ended_before_running(
            env.config, job, "globex", OnComplete(webhook=receiver.url), "job.cancelled", data
        )
        is None
    )
    assert list(box(env.config, Clock()).entries()) == []


def test_a_job_file_serve_gives_up_on_tells_its_webhook_it_failed(env: Env, receiver: Receiver) -> None:
    """A file whose controller kept dying before the job had a run folder is refused for good: its
    webhook hears of it like any other refusal."""
    job = submit(env, on_complete={"webhook": receiver.url})
    claimed = claim(env.config, job)
    server = Server(env.config, Inbox(env.config.data_root / "inbox"), Metrics(), poll=0.05)
    for _ in range(MAX_STARTS):
        server.inbox.count_start(claimed)
    server.start_job(claimed)  # one start too many: moved to failed/ at once
    assert (env.root / "inbox" / "failed" / f"{job}.yaml").exists()
    assert webhooks.deliverer(env.config, box(env.config, Clock())).run_due() == 1
    [event] = verified(receiver)
    data = event["data"]
    assert isinstance(data, dict) and data["outcome"] == "failed" and "is not resumed again" in data["reason"]


def test_a_job_refused_with_its_run_folder_half_made_tells_its_webhook_with_its_tenants_key(
    env: Env, receiver: Receiver
) -> None:
    """`serve` began the job's run folder (its sub-folders, no ``owner`` yet) and then refused it: the
    end is queued in that folder and still goes to the tenant's host, signed with the tenant's key
    (the owner record says whose it is); it was judged by the cluster's policy and refused."""
    job = submit(env, on_complete={"webhook": receiver.url})
    claimed = claim(env.config, job)
    (env.root / run_rel(job) / "chunks").mkdir(parents=True)  # cut before its owner and plan
    refusals.announce(env.config, claimed, "MissingInputError (exit 66): faces/me.jpg is missing")
    clock = Clock()
    [made] = box(env.config, clock).deliveries(job)
    assert (env.root / run_rel(job) / "deliveries").is_dir()  # queued in the half-made folder
    assert webhooks.deliverer(env.config, box(env.config, clock)).run_due() == 1
    [event] = verified(receiver)  # acme's own key
    assert event["type"] == "job.finished" and receiver.ids() == [made.id]
    assert box(env.config, clock).deliveries(job)[0].state == "delivered"
