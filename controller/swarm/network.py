"""The runners' network: an `internal` overlay network (no egress) and the anchor that keeps it still.

Why an anchor. Swarm gives a node an attachment to an overlay network while any task on that network
is on the node, and takes it away when the last one leaves; each change is a node update. On every node
update Swarm's constraint enforcer re-checks the node's running tasks, and its generic-resource check
rejects every task that holds a named generic resource the node still lists (swarmkit
manager/orchestrator/constraintenforcer: the test is inverted), so GPU tasks died with "assigned node no
longer meets constraints" whenever a runner arrived on, or left, a node (docs/architecture.md, engine
facts). A global service with one sleeping task per node, on the network, keeps every node's attachment
for good: runners then come and go without a node update. The anchor is made with the network, before a
job's first runner; a node that joins later gets its anchor before it has GPU work to lose.

Part of the Swarm adapter (with docker.py and admin.py, the only importers of docker).
"""

from __future__ import annotations

import time
from typing import Any

import docker
import docker.errors
from docker import types as dt

from controller.errors import CapacityError
from controller.swarm.servicespec import ANCHOR_SERVICE, LABEL_ROLE

ROLE_ANCHOR = "runners-anchor"
# PID 1 ignores a signal it has no handler for: without the SIGTERM handler every engine stop and node
# drain would wait out the grace period and then SIGKILL the anchor. It prints ANCHOR_READY once the handler
# is in place: a SIGTERM sent before that (while the interpreter starts) is still ignored.
ANCHOR_READY = "anchor ready"
ANCHOR_COMMAND = (
    "/opt/ffswarm/bin/python",
    "-I",
    "-c",
    "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    f"print({ANCHOR_READY!r}, flush=True); signal.pause()",
)
ANCHOR_MEMORY = 48 * 1024 * 1024
ANCHOR_WAIT = 60.0  # seconds for every node's anchor to be running before runners are started


def ensure(client: docker.DockerClient, name: str, image: str, user: str) -> None:
    """The internal overlay network `name` and its anchor service exist, and every ready node runs
    the anchor (or ANCHOR_WAIT has passed: a node whose anchor cannot start only risks its own tasks)."""
    found = [n for n in client.api.networks(names=[name]) if n.get("Name") == name]
    if not found:
        try:
            client.api.create_network(
                name, driver="overlay", internal=True, attachable=False, labels={LABEL_ROLE: "runners"}
            )
        except docker.errors.APIError as e:
            if e.status_code != 409:  # made meanwhile by another controller
                raise
    elif not found[0].get("Internal") or found[0].get("Driver") != "overlay":
        raise CapacityError(
            f"network {name} exists but is not an internal overlay network: remove it "
            f"(docker network rm {name}) and ffswarm makes it again"
        )
    if not _anchor(client):
        _create_anchor(client, name, image, user)
    _wait_for_anchors(client)


def ensure_storage(client: docker.DockerClient, network: str, image: str, user: str) -> None:
    """An anchor on the operator's storage network (``storage.s3.network``) too: runners join it as
    well as their own, and without a task on it on every node each runner's arrival or departure
    would be a node update that rejects the node's GPU tasks, as for the runners' network. Its own
    service (``<anchor>-<network>``), so that adding a storage network never restarts the first anchor.
    The network itself is the operator's: never made here."""
    service = storage_anchor(network)
    if not _anchor(client, service):
        _create_anchor(client, network, image, user, service)
    _wait_for_anchors(client, service)


def storage_anchor(network: str) -> str:
    return f"{ANCHOR_SERVICE}-{network}"[:63]


def _anchor(client: docker.DockerClient, service: str = ANCHOR_SERVICE) -> dict[str, Any] | None:
    for svc in client.api.services(filters={"name": service}):
        if svc.get("Spec", {}).get("Name") == service:
            return dict(svc)
    return None


def _create_anchor(
    client: docker.DockerClient, network: str, image: str, user: str, service: str = ANCHOR_SERVICE
) -> None:
    container = dt.ContainerSpec(
        image=image,
        command=list(ANCHOR_COMMAND),
        user=user,
        read_only=True,
        cap_drop=["ALL"],
        labels={LABEL_ROLE: ROLE_ANCHOR},
    )
    resources = dt.Resources(mem_limit=ANCHOR_MEMORY, cpu_limit=10**8)
    resources["Limits"]["Pids"] = 8
    template = dt.TaskTemplate(
        container_spec=container,
        resources=resources,
        networks=[network],
        restart_policy=dt.RestartPolicy(condition="any", delay=5 * 10**9),
        log_driver=dt.DriverConfig("json-file", {"max-size": "1m", "max-file": "1"}),
    )
    try:
        client.api.create_service(
            template, name=service, labels={LABEL_ROLE: ROLE_ANCHOR}, mode=dt.ServiceMode("global")
        )
    except docker.errors.APIError as e:
        if e.status_code != 409:
            raise


def _wait_for_anchors(client: docker.DockerClient, service: str = ANCHOR_SERVICE) -> None:
    deadline = time.monotonic() + ANCHOR_WAIT
    while True:
        ready = {
            n["ID"]
            for n in client.api.nodes()
            if n.get("Status", {}).get("State") == "ready" and n.get("Spec", {}).get("Availability") == "active"
        }
        running = {
            t.get("NodeID")
            for t in client.api.tasks(filters={"service": service, "desired-state": "running"})
            if t.get("Status", {}).get("State") == "running"
        }
        if ready <= running or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def missing_anchors(client: docker.DockerClient, name: str) -> list[str] | None:
    """Hostnames of ready, active nodes without a running anchor; None when `name` is not an internal
    overlay network (doctor)."""
    found = [n for n in client.api.networks(names=[name]) if n.get("Name") == name]
    if not found or not found[0].get("Internal") or found[0].get("Driver") != "overlay":
        return None
    ready = {
        n["ID"]: n.get("Description", {}).get("Hostname", n["ID"][:12])
        for n in client.api.nodes()
        if n.get("Status", {}).get("State") == "ready" and n.get("Spec", {}).get("Availability") == "active"
    }
    running = (
        {
            t.get("NodeID")
            for t in client.api.tasks(filters={"service": ANCHOR_SERVICE, "desired-state": "running"})
            if t.get("Status", {}).get("State") == "running"
        }
        if _anchor(client)
        else set()
    )
    return sorted(host for node, host in ready.items() if node not in running)
