"""What the controller learns of an engine once per process (controller/swarm/docker.py): the API
version (a client made with version "auto" first asks GET /version) and that it is a swarm manager
(GET /info). serve makes a backend and checks the manager before every pack: asked each time, that
is two extra round trips and a large /info document per pack. An engine on loopback HTTP stands in
for dockerd, counting what it is asked."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controller.errors import CapacityError
from controller.swarm import docker as engine
from controller.swarm.docker import DockerSwarm


class Engine:
    """Answers /version and /info as a manager (or a worker) would; counts the paths asked."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.manager = True
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                path = self.path.split("?")[0].rsplit("/", 1)[-1]
                outer.asked[path] = outer.asked[path] + 1
                body: dict[str, object] = {"ApiVersion": "1.41", "Version": "20.10.24"}
                if path == "info":
                    body = {"Swarm": {"LocalNodeState": "active", "ControlAvailable": outer.manager}}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"tcp://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def eng() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.server.shutdown()
    e.server.server_close()


def test_the_api_version_is_asked_once_per_engine_not_per_client(eng: Engine) -> None:
    first = DockerSwarm(eng.url)
    DockerSwarm(eng.url)
    first.events("job-1")  # the events' own connection
    assert eng.asked["version"] == 1
    assert first.client.api.api_version == "1.41"


def test_a_manager_is_asked_again_only_after_the_recheck_time(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(engine.time, "monotonic", lambda: now[0])
    DockerSwarm(eng.url).check_manager()
    DockerSwarm(eng.url).check_manager()
    assert eng.asked["info"] == 1
    eng.manager = False  # demoted meanwhile
    now[0] += engine.MANAGER_RECHECK
    with pytest.raises(CapacityError, match="swarm worker"):
        DockerSwarm(eng.url).check_manager()
    with pytest.raises(CapacityError, match="swarm worker"):  # a refusal is never kept
        DockerSwarm(eng.url).check_manager()
    assert eng.asked["info"] == 3
