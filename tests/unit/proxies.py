"""A loopback HTTP proxy in front of a test's API server that loses what a real network loses: the
answer to a request the API has already acted on (``drop_answers``: the first N POSTs are forwarded,
their answers read and the connection then closed unanswered), an event stream cut after a few
events (``cut_events``: the first stream closes after that many events), and a download broken off
(``cut_body``: the first GET answer whose path ends so is sent half, then the connection closes).
It counts what it saw and keeps each request's headers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class Proxy:
    def __init__(
        self, upstream: str, drop_answers: int = 0, cut_events: int | None = None, cut_body: str | None = None
    ) -> None:
        self.upstream = upstream
        self.cut_body = cut_body
        self.drop_answers = drop_answers
        self.cut_events = cut_events
        self.dropped = 0
        self.requests = 0
        self.streams = 0
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.http = httpx.Client(base_url=upstream, timeout=30)

    def __enter__(self) -> Proxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.http.close()


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def _forward(self) -> None:
            body = self._body()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            with proxy.lock:
                proxy.requests += 1
                proxy.headers.append(dict(self.headers.items()))
                drop = self.command == "POST" and proxy.dropped < proxy.drop_answers
                if drop:
                    proxy.dropped += 1
                half = proxy.cut_body is not None and self.path.split("?")[0].endswith(proxy.cut_body)
                if half:
                    proxy.cut_body = None
            request = proxy.http.build_request(self.command, self.path, headers=headers, content=body)
            r = proxy.http.send(request, stream=True)
            try:
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    self._stream(r)
                    return
                data = r.read()
                if drop:  # the API acted; its answer is lost with the connection
                    self.close_connection = True
                    return
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if half:  # the connection closes with the body half sent
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(data)
            finally:
                r.close()

        def _stream(self, r: httpx.Response) -> None:
            with proxy.lock:
                proxy.streams += 1
                cut = proxy.cut_events if proxy.streams == 1 else None
            self.send_response(r.status_code)
            for k, v in r.headers.items():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            events, data = 0, False
            for line in r.iter_lines():
                self.wfile.write(line.encode() + b"\n")
                self.wfile.flush()
                data = data or line.startswith("data:")
                if not line and data:  # an event ends (a `retry:` block or a comment is none)
                    events, data = events + 1, False
                    if cut is not None and events >= cut:
                        return  # the connection closes mid-job

        do_GET = do_POST = do_DELETE = _forward

    return Handler
