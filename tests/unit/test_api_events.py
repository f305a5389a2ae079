"""`GET /v1/jobs/{id}/events` over real HTTP: ``chunk`` events as a run folder's state.json changes
while the client reads the stream (each change once, reasons as the tenant knows its paths), a
packed job's one chunk, which shows only when it ends; ids that let a dropped client resume on
another replica without a replay, and keep-alives while nothing changes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.results import ItemResult, ItemStatus
from controller.api import events as event_stream
from controller.api.area import Area
from controller.job.plan import Chunk, Plan, PlannedItem
from controller.run import job_lease
from controller.run.rundir import Control, RunDir, Stage
from tests.builders import Env, api_env, serve_api

JOB = "party-abcdefgh"
PACK = "pack-aaaaaaaa"
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
    assert rest[-1] == ("end", {"job": JOB, "phase": "finished", "outcome": "partial"})  # 2 ok, 2 failed
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
    assert rest[-1] == ("end", {"job": JOB, "phase": "cancelled", "outcome": "cancelled"})


def test_a_packed_job_shows_its_one_chunk_only_when_it_ends(env: Env) -> None:
    rd = new_run(env, chunks=1)
    pack = RunDir(env.root, PACK)
    items = (  # the pack's items: another job's first, then this job's two
        PlannedItem("i000000", "tenants/acme/in/x.jpg", "tenants/acme/out/other/x.jpg", "image"),
    ) + tuple(replace(i, id=f"i{n + 1:06d}") for n, i in enumerate(rd.plan().items))
    plan = Plan(PACK, items, (Chunk("c0000", ("i000000", "i000001", "i000002")),))
    pack.create(b"name: p\n", plan, {}, Control(1), "sha256:x")
    mine = {"i000001": "i000000", "i000002": "i000001"}
    members = {"other-abcdefgh": {"items": {"i000000": "i000000"}}, JOB: {"items": mine}}
    pack.write_file(pack.layout.members, json.dumps(members).encode())
    rd.write_file(rd.layout.packed, f"{PACK}\n".encode())

    def commit(*ids: str) -> None:  # what the pack's runner has appended: each pack item as planned
        done = [plan.item(i) for i in ids]
        lines = [ItemResult(i.id, ItemStatus.OK, 1, f"/data/{i.input}", f"/data/{i.output}") for i in done]
        (pack.path / "results" / "c0000.a1.jsonl").write_text("".join(r.to_line() for r in lines))

    lease = job_lease.Lease(rd, interval=3600)  # its pack's controller runs it
    lease.acquire()
    rd.enter(Stage.CHUNKS)  # a packed job's state.json holds no chunk records: its pack's has them
    with env.client() as c:
        events = stream(c)
        name, first = next(events)
        assert name == "progress" and first["phase"] == "running"
        commit("i000001")  # the pack commits the job's first photo
        name, shown = next(events)
        assert name == "progress" and shown["items"]["ok"] == 1  # read through the pack; no chunk event before it
        commit("i000001", "i000002", "i000000")
        record = chunk("done")
        rd.write_report({"job": JOB, "chunks": {"c0000": record}})  # as the pack writes it at the job's end
        rd.enter(Stage.ENDED)
        lease.release()
        rest = list(events)
    assert [d for n, d in rest if n == "chunk"] == [
        {"chunk": "c0000", "state": "done", "attempt": 0,
         "items": {"total": 2, "ok": 2, "no_face": 0, "failed": 0, "cancelled": 0}}
    ]  # fmt: skip
    assert rest[-1] == ("end", {"job": JOB, "phase": "finished", "outcome": "succeeded"})


# --- ids, resuming, keep-alives -----------------------------------------------------------------
def frames(r: httpx.Response) -> Iterator[dict[str, str]]:
    """Each block of the stream as its fields (``event``, ``data``, ``id``, ``retry``; a comment
    as ``comment``), in the order sent."""
    block: dict[str, str] = {}
    for line in r.iter_lines():
        if line == "":
            if block:
                yield block
            block = {}
        elif line.startswith(":"):
            block["comment"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            block[name] = value[1:] if value.startswith(" ") else value
    if block:
        yield block


def seq(frame: dict[str, str]) -> int:
    return int(frame["id"].split(".")[0])


def named(frames_: list[dict[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f["event"], json.loads(f["data"])) for f in frames_ if "event" in f]


def read_until(blocks: Iterator[dict[str, str]], last: str) -> list[dict[str, str]]:
    """Blocks up to and with the first event named ``last`` (keep-alives skipped)."""
    out = []
    for block in blocks:
        if "comment" not in block:
            out.append(block)
        if block.get("event") == last:
            return out
    raise AssertionError(f"the stream ended before a {last} event")


def test_a_client_that_drops_mid_job_resumes_on_another_replica_with_every_later_event_once(env: Env) -> None:
    rd = new_run(env, chunks=3)
    results(rd, "c0000", ItemStatus.OK, "i000000", "i000001")
    c1 = chunk("running", attempt(1, "n1"))
    rd.write_state({"c0000": chunk("done", attempt(1, "n1", "done")), "c0001": c1})
    with env.client() as c, c.stream("GET", f"/v1/jobs/{JOB}/events") as r:
        assert r.headers["x-accel-buffering"] == "no" and r.headers["cache-control"] == "no-store"
        blocks = frames(r)
        assert next(blocks) == {"retry": "3000"}
        before = read_until(blocks, "progress")  # c0000, c0001, then the status object: the client drops
    assert [d["chunk"] for n, d in named(before) if n == "chunk"] == ["c0000", "c0001"]

    # while nobody listens, c0002 starts; c0000 and c0001 stay as they were sent
    rd.write_state({"c0000": chunk("done", attempt(1, "n1", "done")), "c0001": c1,
                    "c0002": chunk("running", attempt(1, None))})  # fmt: skip
    for url in serve_api(env.config):  # another replica of the API over the same volume
        other = replace(env, url=url)
        with (
            other.client() as c,
            c.stream("GET", f"/v1/jobs/{JOB}/events", headers={"Last-Event-ID": before[-1]["id"]}) as r,
        ):
            assert r.status_code == 200
            blocks = frames(r)
            assert next(blocks) == {"retry": "3000"}
            resumed = read_until(blocks, "progress")
            results(rd, "c0001", ItemStatus.OK, "i000002", "i000003")
            results(rd, "c0002", ItemStatus.NO_FACE, "i000004", "i000005")
            rest = list(blocks)
    after = [*resumed, *rest]
    assert all("id" in f for f in [*before, *after] if "event" in f)
    ids = [seq(f) for f in [*before, *after] if "id" in f]
    assert ids == sorted(set(ids)) and ids[0] == 1  # strictly increasing, continued by the resumed stream
    chunks = [(d["chunk"], d["state"]) for n, d in named(after) if n == "chunk"]
    assert chunks == [("c0002", "started"), ("c0001", "done"), ("c0002", "done")]  # nothing sent before again
    assert named(after)[-1] == ("end", {"job": JOB, "phase": "finished", "outcome": "succeeded"})
    assert [n for n, _ in named(after)].count("end") == 1

    with env.client() as c:  # the end seen: nothing more, and an EventSource stops reconnecting on a 204
        r = c.get(f"/v1/jobs/{JOB}/events", headers={"Last-Event-ID": after[-1]["id"]})
        assert r.status_code == 204 and r.content == b""
        # a client that saw the last status object but not the end: only the end, found by the query
        last_progress = next(f for f in reversed(after) if f.get("event") == "progress")
        r = c.get(f"/v1/jobs/{JOB}/events", params={"last_event_id": last_progress["id"]})
        assert named(list(frames(r))) == [("end", {"job": JOB, "phase": "finished", "outcome": "succeeded"})]


def test_keep_alives_arrive_while_a_chunk_is_quiet(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_stream, "KEEPALIVE", 0.2)  # 15 s in service
    rd = new_run(env, chunks=1)
    rd.write_state({"c0000": chunk("running", attempt(1, "n1"))})
    with env.client() as c, c.stream("GET", f"/v1/jobs/{JOB}/events") as r:
        blocks = frames(r)
        assert next(blocks) == {"retry": "3000"}
        first = read_until(blocks, "progress")
        quiet = [next(blocks) for _ in range(3)]  # the chunk runs on and nothing changes
        assert quiet == [{"comment": "keep-alive"}] * 3
        results(rd, "c0000", ItemStatus.OK, "i000000", "i000001")
        rest = list(blocks)
    assert [n for n, _ in named(first)] == ["chunk", "progress"]
    assert named(rest)[-1] == ("end", {"job": JOB, "phase": "finished", "outcome": "succeeded"})


def test_a_last_event_id_that_is_not_this_streams_is_refused_by_name(env: Env) -> None:
    new_run(env, chunks=1)
    other = "other-abcdefgh"
    Area(env.root, "acme").write_record(other, uploads=False)
    env.inbox_file(other).write_text("name: x\n")
    with env.client() as c:
        with c.stream("GET", f"/v1/jobs/{other}/events") as r:
            foreign = next(f for f in frames(r) if "id" in f)["id"]  # an id of another job's stream
        for bad in ("12", "3.not-base64!", "7.eJwDAAAAAAE", foreign, "x" * 5000):
            r = c.get(f"/v1/jobs/{JOB}/events", headers={"Last-Event-ID": bad})
            assert r.status_code == 400, bad
            error = r.json()["error"]
            assert error["field"] == "Last-Event-ID" and bad not in error["message"]
        assert c.get(f"/v1/jobs/{JOB}/events", params={"last_event_id": "12"}).status_code == 400


def test_a_job_handed_back_by_retry_streams_again_after_the_end(env: Env) -> None:
    rd = new_run(env, chunks=1)
    results(rd, "c0000", ItemStatus.ERROR, "i000000", "i000001")
    rd.write_state({"c0000": chunk("failed", attempt(1, "n1", "user", "bad input"), reason="bad input")})
    with env.client() as c:
        ended = list(frames(c.get(f"/v1/jobs/{JOB}/events")))
        assert named(ended)[-1] == ("end", {"job": JOB, "phase": "finished", "outcome": "failed"})
        env.inbox_file(JOB).write_text("name: x\n")  # POST …/retry handed it back to serve
        with c.stream("GET", f"/v1/jobs/{JOB}/events", headers={"Last-Event-ID": ended[-1]["id"]}) as r:
            assert r.status_code == 200
            again = read_until(frames(r), "progress")
    assert named(again) == [("progress", named(again)[0][1])] and named(again)[0][1]["phase"] == "queued"
    assert seq(again[-1]) == seq(ended[-1]) + 1


def test_an_id_stays_short_for_a_job_of_many_chunks() -> None:
    at = event_stream.Position(seq=40_000)
    for n in range(10_000):  # most done at the first attempt, some retried, some failed, the last running
        at.sent(n, event_stream.chunk_step({"attempt": 2 if n % 97 == 0 else 1, "state": "done"}))
    at.sent(9_999, event_stream.chunk_step({"attempt": 1, "state": "running"}))
    text = at.id(JOB)
    assert len(text) < 1024 and "\n" not in text and "\r" not in text
    assert event_stream.Position.parse(text, JOB) == at
    with pytest.raises(ValueError):
        event_stream.Position.parse(text, "other-abcdefgh")
