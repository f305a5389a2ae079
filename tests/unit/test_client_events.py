"""``Client.events``: a job's server-sent events followed to ``end`` across dropped connections.
Against the real API behind a proxy that cuts the first stream, and against a small event server
that sends ids, a ``retry:`` and keep-alives, to show the resume with ``Last-Event-ID``: every event
once, in order, after the server's reconnection delay."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controller.client import ApiError, Client, TransportError
from tests.builders import KEYS, Env, api_env
from tests.unit.proxies import Proxy
from tests.unit.standin_serve import StandinServe
from tests.unit.test_client import json_job


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    yield from api_env(tmp_path)


def test_a_stream_cut_mid_job_is_reconnected_and_followed_to_the_end(env: Env) -> None:
    slept: list[float] = []
    with Client(env.url, KEYS["acme"], sleep=lambda _: None) as c:
        job = json_job(env, c)
    with Proxy(env.url, cut_events=1) as proxy, Client(proxy.url, KEYS["acme"], sleep=slept.append) as c:
        events = c.events(job)
        first = next(events)
        assert first.name == "progress" and first.data["phase"] == "queued"
        with StandinServe(env.config):
            rest = list(events)
        assert proxy.streams == 2 and len(slept) == 1  # one reconnect, after the stream's delay
        assert proxy.headers[-1]["Last-Event-ID"] == first.id  # the reconnect resumes after it
    assert rest[-1].name == "end" and rest[-1].data["phase"] == "finished"
    assert rest[-2].name == "progress" and rest[-2].data["items"]["ok"] == 3


class Numbered:
    """Events 1…N with ids; the first connection says ``retry: 250`` and closes after ``cut`` events;
    a reconnect with Last-Event-ID k continues at k+1; keep-alive comments in between."""

    def __init__(self, n: int = 5, cut: int = 2, status: int = 200) -> None:
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                after = self.headers.get("Last-Event-ID")
                outer.seen.append(after)
                if status != 200:
                    body = json.dumps({"error": {"code": "not_found", "message": "no job 'x'"}}).encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                start = int(after) + 1 if after else 1
                out = "retry: 250\n\n" if after is None else ""
                for i in range(start, n + 1):
                    name = "end" if i == n else "progress"
                    out += f': keep-alive\n\nid: {i}\nevent: {name}\ndata: {{"n": {i},\ndata:  "x": 1}}\n\n'
                    if after is None and i == cut:
                        break
                self.wfile.write(out.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Numbered:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_reconnect_sends_last_event_id_and_sees_every_later_event_once() -> None:
    slept: list[float] = []
    with Numbered() as server, Client(server.url, "t", sleep=slept.append) as c:
        got = list(c.events("job-a"))
    assert [(e.id, e.name, e.data) for e in got] == [
        (str(i), "end" if i == 5 else "progress", {"n": i, "x": 1}) for i in range(1, 6)
    ]
    assert server.seen == [None, "2"] and slept == [0.25]


def test_resuming_from_a_known_event_id_starts_after_it() -> None:
    with Numbered() as server, Client(server.url, "t", sleep=lambda _: None) as c:
        got = [e.id for e in c.events("job-a", last_event_id="3")]
    assert got == ["4", "5"] and server.seen == ["3"]


def test_a_refused_stream_is_an_api_error_at_once_and_a_dead_one_gives_up() -> None:
    with (
        Numbered(status=404) as server,
        Client(server.url, "t", sleep=lambda _: None) as c,
        pytest.raises(ApiError) as e,
    ):
        list(c.events("x"))
    assert e.value.status == 404 and server.seen == [None]
    dead = Numbered(n=5, cut=0)
    with dead, Client(dead.url, "t", retries=2, sleep=lambda _: None) as c, pytest.raises(TransportError) as gone:
        list(c.events("x", last_event_id="99"))  # past the last event: every connection brings nothing
    assert "kept breaking off" in str(gone.value)
    assert len(dead.seen) == 3
