"""One soak from start to end: deploy, reference run, faulted run, drain, checks, summary.

1. The cluster and the controller stack (``deploy``), the tenants' inputs (with ``--s3`` in their
   areas of the store too), the webhook receiver.
2. Reference: each distinct request of the plan submitted twice over, in two fault-free rounds; the
   second round's outputs must show the same pictures as the first's (byte for byte, or apart only by
   the CPU runner's rounding: ``checks.compare``), and the first round's are what every soak job's ok
   outputs are compared with.
3. The faulted run: the plan's requests at their seconds (a pool of senders, so a slow upload never
   holds the stream up) and its faults at theirs, each in a thread of its own (faults may overlap).
4. Drain: every accepted job ended, the webhook outbox empty, lanes expired — or a time limit.
5. The checks (``checks``), a table, and build/soak/<seed>-<time>.json.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import docker

from scripts.soak import checks, deploy
from scripts.soak.faults import KILLED, Faults, RgwSwitch
from scripts.soak.plan import TENANTS, Plan
from scripts.soak.stream import Receiver, Record, Stream, make_inputs, upload_inputs

ENDED = ("finished", "cancelled", "refused")
DRAIN_S = float(os.environ.get("SOAK_DRAIN_S", "1800"))


def log(msg: str) -> None:
    print(f"soak {datetime.now(UTC):%H:%M:%S}: {msg}", flush=True)


def ended(status: dict[str, Any]) -> bool:
    return status.get("phase") in ENDED and status.get("outcome") is not None


def wait_ended(
    stream: Stream, jobs: dict[str, str], timeout: float, lost_after: float = 120.0
) -> dict[str, dict[str, Any] | None]:
    """job → its status as its tenant's job list shows it (None: not listed, lost) once every one has
    ended, or at ``timeout``; ``jobs``: job → tenant. A job still not listed after ``lost_after``
    seconds is lost: it is not waited for."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        listed: dict[str, dict[str, Any]] = {}
        for tenant in sorted(set(jobs.values())):
            try:
                listed.update((j["job"], j) for j in stream.jobs(tenant))
            except Exception as e:  # a replica restarting: ask again on the next round
                log(f"listing {tenant}'s jobs: {type(e).__name__}")
        statuses = {job: listed.get(job) for job in jobs}
        lost_ok = time.monotonic() - start >= lost_after
        left = [j for j, s in statuses.items() if (s is None and not lost_ok) or (s is not None and not ended(s))]
        if not left or time.monotonic() > deadline:
            return statuses
        time.sleep(10)


def reference(
    stream: Stream, plan: Plan, root: Any, s3: Any = None, rounds: int = 2
) -> tuple[dict[str, dict[str, str]], checks.Check]:
    """Each distinct request's outputs (input name → path relative to the data root, or object URL)
    from the first fault-free round, and whether later rounds made the same pictures
    (``checks.deterministic``; ``s3`` reads objects)."""
    found: list[dict[str, dict[str, str]]] = []
    for n in range(rounds):
        made = {req.key: (req.tenant, stream.offer(req, 0.0, reference=True)) for req in plan.distinct()}
        jobs = {job: tenant for tenant, job in made.values() if job}
        log(f"reference round {n + 1}: {len(jobs)} of {len(made)} requests accepted; waiting for their ends")
        wait_ended(stream, jobs, 1200)
        found.append({key: checks.outputs(root, tenant, job) for key, (tenant, job) in made.items() if job})
    return found[0], checks.deterministic(root, found, s3)


def faulted(plan: Plan, stream: Stream, faults: Faults | None, replicas: Callable[[], list[str]]) -> float:
    """The plan's requests and (unless ``faults`` is None) its faults; the seconds it took.
    ``replicas``: where the API answers now (asked every 10 s: a killed replica comes back elsewhere)."""
    t0 = time.monotonic()
    threads = []
    if faults is not None:

        def schedule() -> None:
            for f in plan.faults:
                time.sleep(max(0.0, t0 + f.at - time.monotonic()))
                t = threading.Thread(target=faults.inject, args=(f, t0), daemon=True)
                t.start()
                threads.append(t)

        threading.Thread(target=schedule, daemon=True).start()
    refreshed = 0.0
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, req in enumerate(plan.requests):
            time.sleep(max(0.0, t0 + req.at - time.monotonic()))
            if time.monotonic() - refreshed > 10:  # replicas move when one is killed
                refreshed = time.monotonic()
                with contextlib.suppress(Exception):
                    stream.replicas = replicas() or stream.replicas
            pool.submit(stream.offer, req, req.at)
            if i % 200 == 0:
                log(f"request {i}/{len(plan.requests)}, {len(stream.record.accepted)} accepted")
    for t in threads:
        t.join(120)
    return time.monotonic() - t0


def wait_quiet(c: deploy.Cluster, timeout: float) -> list[str]:
    """Until no webhook delivery is pending and no job service, lane or job container is left on any
    node (or ``timeout``). A removed service's containers go after the service itself: each worker's
    agent removes them when the manager's next assignment reaches it, which after a restarted or
    paused engine takes tens of seconds, so the containers are waited for too. An engine restarted
    while removing them keeps them for good (moby/moby#42723): once the services have been gone a
    minute, each node runs ``ffswarm nodes sweep`` as its timer would (swarm/gpu-node.sh), with a
    minute for its hour. What is still there at the end is a leftover. Returns what the sweeps removed."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    gone: float | None = None
    swept: list[str] = []
    while time.monotonic() < deadline:
        queue = c.data_root / "runs" / ".outbox"
        pending = list(queue.iterdir()) if queue.is_dir() else []
        services, containers = swarm_lists(c)
        ours = [s for s in services if "io.ffswarm.job" in (s["Spec"].get("Labels") or {})]
        if not ours and gone is None:
            gone = time.monotonic()
        held = [x for found in containers.values() for x in found if "io.ffswarm.job" in (x.get("Labels") or {})]
        if not pending and not ours and not held:
            after = "" if gone is None else f", the last containers {time.monotonic() - gone:.0f} s after the services"
            log(f"quiet after {time.monotonic() - t0:.0f} s{after}")
            return swept
        if held and gone is not None and time.monotonic() - gone > 60:
            for node, url in c.apis.items():
                for name in sweep(url):
                    swept.append(f"{node}: {name}")
                    log(f"{node}: ffswarm nodes sweep removed {name}")
        time.sleep(5)
    return swept


def sweep(url: str) -> list[str]:
    """``ffswarm nodes sweep`` against one node's engine: the containers it removed."""
    cmd = [sys.executable, "-m", "controller.cli", "nodes", "sweep", "--docker-host", url, "--older-than", "60s"]
    proc = subprocess.run([*cmd, "-o", "json"], capture_output=True, text=True, timeout=120, cwd=deploy.ROOT)
    if proc.returncode != 0:
        log(f"ffswarm nodes sweep on {url} failed: {proc.stderr.strip()[-300:]}")
        return []
    return [f"{c['name']} (job {c['job']})" for c in json.loads(proc.stdout)["removed"]]


def swarm_lists(c: deploy.Cluster) -> tuple[list[Any], dict[str, list[Any]]]:
    services = docker.DockerClient(base_url=c.apis[deploy.NODES[0]], timeout=60).api.services()
    containers = {
        n: docker.DockerClient(base_url=url, timeout=60).api.containers(all=True) for n, url in c.apis.items()
    }
    return services, containers


def run_checks(
    c: deploy.Cluster,
    stream: Stream,
    record: Record,
    ref: dict[str, dict[str, str]],
    received: list[dict[str, Any]],
    store: deploy.ObjectStore | None,
    faults: Faults | None = None,
    swept: list[str] | None = None,
) -> list[checks.Check]:
    statuses = wait_ended(stream, {a.job: a.tenant for a in record.accepted.values()}, 60)
    # (a request whose reference was not accepted fails the comparison: "no reference")
    soak_jobs = {a.job: (a.tenant, a.key) for a in record.accepted.values() if not a.reference and a.key != KILLED}
    ends: dict[str, int | None] = {}
    for job, s in statuses.items():
        if s is not None:
            ends[job] = None if s.get("started_at") is None else 1 + record.retried[job]
    totals = {t: stream.usage(t) for t in TENANTS}
    per_job = {t: [j.get("usage") for j in stream.jobs(t)] for t in TENANTS}
    services, containers = swarm_lists(c)
    unverified = [d for d in received if not d.get("verified")]
    hooks = checks.webhooks_once(c.data_root, ends, received)
    hooks.problems += [f"{d.get('id')}: signature did not verify ({d.get('tenant')})" for d in unverified]
    s3 = store.client() if store else None
    left = checks.left_in_swarm(services, containers)
    left.notes += [f"removed by ffswarm nodes sweep: {x}" for x in swept or []]
    found = [
        checks.ended(list(record.accepted), statuses),
        checks.identical(c.data_root, soak_jobs, ref, s3),
        checks.committed_once(c.data_root),
        checks.left_on_volume(c.data_root),
        left,
        hooks,
        checks.usage_adds_up(totals, per_job),
        checks.no_internal_errors(record.answers, [d.note for d in faults.done] if faults else []),
    ]
    if store is not None:
        inputs = [f"{t}/soak/" for t in TENANTS]
        found.insert(4, checks.left_in_store(c.data_root, s3, store.bucket, inputs))
    return found


def soak(plan: Plan, keep: bool, no_faults: bool = False) -> int:
    c = deploy.cluster(os.environ.get("SOAK_DATA_SIZE", "4g"))
    log(f"cluster up: data root {c.data_root} ({'own mount' if c.own_volume else 'host disk'}), host {c.gateway}")
    store = deploy.object_store(c, plan.seed) if plan.s3 else None
    if store is not None:
        log(f"object store: Ceph RGW on {store.endpoint} (and loopback), bucket {store.bucket}")
    image = deploy.push_controller_image()
    d = deploy.write_config(c, image, c.gateway, plan.seed, store)
    receiver = Receiver(c.gateway, d.webhook_secrets)
    deploy.prepare_volume(c)
    deploy.deploy(deploy.render(d))
    faults: Faults | None = None
    try:
        urls = deploy.wait_ready(c, d.keys[TENANTS[0]])
        log(f"controller stack ready: api {urls}")
        for t in TENANTS:
            make_inputs(c.data_root / "tenants" / t)
            if store is not None:
                upload_inputs(c.data_root / "tenants" / t, store.client(), store.area(t))
        record = Record()
        areas = {t: store.area(t) for t in TENANTS} if store else None
        stream = Stream(c.data_root, urls, d.keys, receiver.url, record, areas)
        ref, determinism = reference(stream, plan, c.data_root, store.client() if store else None)
        switch = RgwSwitch(c.gateway) if store else None
        faults = None if no_faults else Faults(c, stream, switch)
        log(f"{'fault-free' if no_faults else 'faulted'} run: {len(plan.requests)} requests, {len(plan.faults)} faults")
        took = faulted(plan, stream, faults, lambda: deploy.api_urls(c))
        if faults is not None:
            faults.heal()
        log("draining: every job to its end, the outbox empty, lanes expired")
        t_end = time.monotonic()
        wait_ended(stream, {a.job: a.tenant for a in record.accepted.values()}, DRAIN_S)
        drained = time.monotonic() - t_end
        swept = wait_quiet(c, 600)
        results = run_checks(c, stream, record, ref, receiver.received(), store, faults, swept)
        results.insert(0, determinism)
        return report(plan, record, faults, results, took, drained, len(receiver.received()))
    finally:
        if faults is not None:
            faults.heal()
        receiver.close()
        if not keep:
            deploy.remove_stack(d.secret_names)
            if store is not None:
                deploy.remove_store(store)


def report(plan: Plan, record: Record, faults: Faults | None, results: list[checks.Check], took: float,
           drained: float, deliveries: int) -> int:  # fmt: skip
    done = faults.done if faults else []
    injected: dict[str, int] = {}
    for f in done:
        injected[f.kind] = injected.get(f.kind, 0) + f.injected
    accepted = sum(1 for a in record.accepted.values() if not a.reference)
    summary = {
        "seed": plan.seed, "minutes": plan.minutes, "short": plan.short, "faults_planned": plan.fault_counts(),
        "faults_injected": injected, "faults": [f.to_dict() for f in done], "stream": record.to_dict(),
        "requests_planned": plan.request_counts(), "seconds": round(took, 1), "drain_seconds": round(drained, 1),
        "accepted_per_second": round(accepted / took, 3) if took else None, "webhook_deliveries": deliveries,
        "checks": [r.to_dict() for r in results], "passed": all(r.ok for r in results),
    }  # fmt: skip
    out = deploy.OUT / f"{plan.seed}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(summary, indent=1, sort_keys=True))
    rate = summary["accepted_per_second"]
    print(f"\nsoak seed {plan.seed}: {accepted} requests accepted in {took:.0f} s ({rate}/s)")
    print(f"faults injected {sum(injected.values())} {json.dumps(injected)}")
    print(f"{'':4}  {'check':<22} {'looked':>6}  problems")
    for r in results:
        print(r.row())
        for note in r.notes:
            print(f"{'':36}note: {note}")
    print(f"{'PASS' if summary['passed'] else 'FAIL'}: {out}")
    return 0 if summary["passed"] else 1
