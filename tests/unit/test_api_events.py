"""`GET /v1/jobs/{id}/events` over real HTTP: ``chunk`` events as a run folder's state.json changes
while the client reads the stream (each change once, reasons as the tenant knows its paths), and a
packed job's one chunk, which shows only when it ends."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.results import ItemResult, ItemStatus
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import job_lease
from controller.run.rundir import Control, RunDir, Stage
from tests.builders import Env, api_env

JOB = "party-abcdefgh"
OUT = f"tenants/acme/out/{JOB}"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def new_run(env: Env, chunks: int) -> RunDir:
    """A tenant's job with two photos per chunk, its run folder started, nothing run yet."""
    area = Area(env.root, "acme")
    area.ensure(None)
    area.write_record(JOB, uploads=False)
    items = [PlannedItem(f"i{n:06d}", f"tenants/acme/in/{n}.jpg", f"{OUT}/{n}.jpg", "image") for n in range(2 * chunks)]
    pairs = (Chunk(f"c{c:04d}", (f"i{2 * c:06d}", f"i{2 * c + 1:06d}")) for c in range(chunks))
    plan = Plan(JOB, tuple(items), tuple(pairs))
    rd = RunDir(env.root, JOB)
    rd.create(b"name: x\n", plan, {}, Control(2), "sha256:x")
    return rd


def attempt(n: int, node: str | None, outcome: str = "running", reason: str | None = None) -> dict[str, Any]:
    return {"attempt": n, "service": f"ffswarm-{JOB}-c-a{n}", "node": node, "exit_code": None,
            "outcome": outcome, "reason": reason}  # fmt: skip


def chunk(state: str, *attempts: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"state": state, "failure": None, "reason": reason, "avoid_nodes": [], "attempts": list(attempts)}


def results(rd: RunDir, chunk_id: str, status: ItemStatus, *ids: str) -> None:
    now = time.time()
    lines = []
    for item in ids:
        n = int(item[1:])
        out = f"/data/{OUT}/{n}.jpg" if status is ItemStatus.OK else None
        lines.append(ItemResult(item, status, 2, f"/data/tenants/acme/in/{n}.jpg", out, started=now, finished=now))
    (rd.path / "results" / f"{chunk_id}.a2.jsonl").write_text("".join(r.to_line() for r in lines))


def stream(client: httpx.Client) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) as the server sends them."""
    with client.stream("GET", f"/v1/jobs/{JOB}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                assert event is not None
                yield event, json.loads(line[len("data: ") :])
                event = None


def next_chunk(events: Iterator[tuple[str, dict[str, Any]]], seen: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The next chunk event (progress events in between are kept in ``seen`` too)."""
    for name, data in events:
        seen.append((name, data))
        if name == "chunk":
            return data
        assert name == "progress", (name, data)
    raise AssertionError("the stream ended before the next chunk event")


def test_chunk_events_follow_state_json_while_the_stream_is_read(env: Env) -> None:
    rd = new_run(env, chunks=2)
    rd.write_state({"c0000": chunk("running", attempt(1, None))})
    seen: list[tuple[str, dict[str, Any]]] = []
    with env.client() as c:
        events = stream(c)
        assert next_chunk(events, seen) == {"chunk": "c0000", "state": "started", "attempt": 1}

        rd.write_state({"c0000": chunk("running", attempt(1, "node-1"))})
        assert next_chunk(events, seen) == {"chunk": "c0000", "state": "running", "attempt": 1}

        host_path = f"{env.root}/tenants/acme/in/1.jpg"  # the controller host's path: never shown
        why = f"runner exit 137 (killed: out of memory or stopped) reading /data/tenants/acme/in/1.jpg and {host_path}"
        rd.write_state({"c0000": chunk("queued", attempt(1, "node-1", "infrastructure", why))})
        retrying = next_chunk(events, seen)
        assert retrying == {
            "chunk": "c0000",
            "state": "retrying",
            "attempt": 1,
            "reason": "runner exit 137 (killed: out of memory or stopped) reading in/1.jpg and in/1.jpg",
        }

        first = attempt(1, "node-1", "infrastructure", why)
        rd.write_state({"c0000": chunk("running", first, attempt(2, "node-2"))})
        assert next_chunk(events, seen) == {"chunk": "c0000", "state": "running", "attempt": 2}

        # c0001 fails for good (its items with it); c0000's second attempt commits both photos
        gone = "missing input /data/tenants/acme/in/2.jpg"
        failed = chunk("failed", attempt(2, "node-1", "user", gone), reason=gone)
        rd.write_state({"c0000": chunk("running", first, attempt(2, "node-2")), "c0001": failed})
        assert next_chunk(events, seen) == {
            "chunk": "c0001",
            "state": "failed",
            "attempt": 2,
            "items": {"total": 2, "ok": 0, "no_face": 0, "failed": 2, "cancelled": 0},
            "reason": "missing input in/2.jpg",
        }
        results(rd, "c0000", ItemStatus.OK, "i000000", "i000001")  # done once every item is committed
        assert next_chunk(events, seen) == {
            "chunk": "c0000",
            "state": "done",
            "attempt": 2,
            "items": {"total": 2, "ok": 2, "no_face": 0, "failed": 0, "cancelled": 0},
        }
        rd.write_state({"c0000": chunk("done", first, attempt(2, "node-2", "done")), "c0001": failed})
        results(rd, "c0001", ItemStatus.ERROR, "i000002", "i000003")  # every item ended: the job is finished
        rest = list(events)
    assert [n for n, _ in rest if n == "chunk"] == []  # nothing changed twice
    assert rest[-1] == ("end", {"job": JOB, "phase": "finished"})
    assert rest[-2][0] == "progress" and rest[-2][1]["items"]["ok"] == 2 and rest[-2][1]["items"]["failed"] == 2
    everything = json.dumps([*seen, *rest])
    assert str(env.root) not in everything and "/data/" not in everything


def test_a_client_joining_late_gets_each_chunk_as_it_is_then_only_changes(env: Env) -> None:
    rd = new_run(env, chunks=3)
    results(rd, "c0000", ItemStatus.OK, "i000000", "i000001")
    rd.write_state({"c0000": chunk("done", attempt(1, "n", "done")), "c0001": chunk("running", attempt(1, "n"))})
    seen: list[tuple[str, dict[str, Any]]] = []
    with env.client() as c:
        events = stream(c)
        joined = [next_chunk(events, seen), next_chunk(events, seen)]  # c0002 has not left the queue
        assert joined == [
            {"chunk": "c0000", "state": "done", "attempt": 1,
             "items": {"total": 2, "ok": 2, "no_face": 0, "failed": 0, "cancelled": 0}},
            {"chunk": "c0001", "state": "running", "attempt": 1},
        ]  # fmt: skip
        rd.write_state(
            {
                "c0000": chunk("done", attempt(1, "n", "done")),
                "c0001": chunk("cancelled", attempt(1, "n", "running")),
                "c0002": chunk("cancelled"),
            }
        )
        rd.write_control(Control(2, cancel=True))  # no controller holds the job: it reads cancelled
        rest = list(events)
    assert [d for n, d in rest if n == "chunk"] == [
        {"chunk": "c0001", "state": "cancelled", "attempt": 1,
         "items": {"total": 2, "ok": 0, "no_face": 0, "failed": 0, "cancelled": 2}},
        {"chunk": "c0002", "state": "cancelled", "attempt": 0,
         "items": {"total": 2, "ok": 0, "no_face": 0, "failed": 0, "cancelled": 2}},
    ]  # fmt: skip
    assert rest[-1] == ("end", {"job": JOB, "phase": "cancelled"})


def test_a_packed_job_shows_its_one_chunk_only_when_it_ends(env: Env) -> None:
    rd = new_run(env, chunks=1)
    rd.write_file(rd.layout.packed, b"pack-aaaaaaaa\n")
    lease = job_lease.Lease(rd, interval=3600)  # its pack's controller runs it
    lease.acquire()
    rd.enter(Stage.CHUNKS)  # a packed job's state.json holds no chunk records: its pack's has them
    with env.client() as c:
        events = stream(c)
        name, first = next(events)
        assert name == "progress" and first["phase"] == "running"
        results(rd, "c0000", ItemStatus.OK, "i000000")  # the pack's first result, copied into the job
        name, copied = next(events)
        assert name == "progress" and copied["items"]["ok"] == 1  # no chunk event before it
        results(rd, "c0000", ItemStatus.OK, "i000000", "i000001")
        record = chunk("done")
        rd.write_report({"job": JOB, "chunks": {"c0000": record}})  # as the pack writes it at the job's end
        rd.enter(Stage.ENDED)
        lease.release()
        rest = list(events)
    assert [d for n, d in rest if n == "chunk"] == [
        {"chunk": "c0000", "state": "done", "attempt": 0,
         "items": {"total": 2, "ok": 2, "no_face": 0, "failed": 0, "cancelled": 0}}
    ]  # fmt: skip
    assert rest[-1] == ("end", {"job": JOB, "phase": "finished"})
