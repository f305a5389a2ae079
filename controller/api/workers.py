"""`ffswarm api --workers N`: N worker processes serving one listening socket.

One Python process is bounded by one core (the GIL), so an API that must accept many small jobs a
second on a multi-core machine runs several. The API keeps no state of its own between requests
(jobs, idempotency keys and the quota ledger are on the volume, shared under file locks), so its
workers are like replicas on one host:

- the parent binds the socket and builds the app once, so a wrong address, a missing key file or a
  bad tenant is one clear error before any worker exists; then it forks the workers, which inherit
  both and accept connections from the same socket (the kernel hands each connection to one);
- ``Ctrl-C`` or SIGTERM to the parent stops every worker gracefully (requests in flight finish; one
  still there after STOP_GRACE seconds is killed, so the parent always ends); a
  worker that exits on its own stops the others and the parent exits non-zero, so a supervisor
  (Swarm, systemd) restarts the whole service rather than running it short of workers; a parent
  killed outright takes its workers with it (each asked the kernel for a SIGTERM when it dies);
- what is kept per process: each worker's fairness buckets (``quota.requests_per_second`` and
  ``requests_in_flight`` apply per worker, as per replica), its group commit (several requests in one
  flush, per worker), its upload sweep (safe to run in several at once); ``/metrics`` sums every
  worker's counters (prometheus_client's multiprocess mode over a temporary folder of this service,
  removed when it stops).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from controller import log
from controller.errors import FfswarmError

METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # what prometheus_client reads to share counters across processes
BACKLOG = 2048
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE = 10.0  # seconds a stopping worker has to finish its requests before it is killed
POLL = 0.05  # how often the parent looks for ended workers


class ListenError(FfswarmError):
    exit_code = 71  # EX_OSERR: the address cannot be served


class WorkerExited(FfswarmError):
    exit_code = 70


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv6 when the host has a colon); ListenError naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or type(e).__name__}") from None
    sock.set_inheritable(True)
    return sock


def shared_metrics() -> str:
    """Counters shared by the workers from here on: a fresh folder for prometheus_client's
    multiprocess mode, set before any metric is made (the caller removes it at the end)."""
    from prometheus_client import values

    folder = tempfile.mkdtemp(prefix="ffswarm-api-metrics-")
    os.environ[METRICS_DIR] = folder
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    return folder


def run(build: Callable[[], ASGIApp], host: str, port: int, workers: int) -> None:
    """Serve the app ``build`` makes with ``workers`` processes until SIGINT/SIGTERM; WorkerExited
    when a worker exited on its own (the others stopped)."""
    folder = shared_metrics()
    try:
        sock = listen(host, port)
        try:
            app = build()
            died = _supervise(app, sock, workers)
        finally:
            sock.close()
        if died is not None:
            n, code = died
            raise WorkerExited(f"API worker {n} exited on its own (code {code}); the others were stopped")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _supervise(app: ASGIApp, sock: socket.socket, workers: int) -> tuple[int, int] | None:
    """Fork the workers and wait for them all; (worker, exit code) of the first that exited on its
    own, None when they were stopped by a signal."""
    logger = log.get(component="api")
    children: dict[int, int] = {}  # pid → worker number
    state = {"stopping": False}
    deadline = [0.0]  # once stopping: when a worker still there is killed
    died: tuple[int, int] | None = None

    def stop(sig: int, frame: FrameType | None) -> None:
        if not state["stopping"]:
            state["stopping"], deadline[0] = True, time.monotonic() + STOP_GRACE
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # uvicorn's graceful shutdown

    me = os.getpid()
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        for n in range(workers):
            if state["stopping"]:
                break
            sys.stdout.flush()
            sys.stderr.flush()
            # signals held across the fork: the child must not run the parent's handler (a lost stop),
            # and the parent registers the child before its handler may run
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:
                    _worker(app, sock, me)  # never returns
                children[pid] = n
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        while children:
            try:  # polled: a blocking wait would hang the parent on a worker that ignores its stop
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                if state["stopping"] and time.monotonic() > deadline[0]:
                    for late in list(children):
                        logger.warning("api_worker_killed", worker=children[late], pid=late, grace_s=STOP_GRACE)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(late, signal.SIGKILL)
                    deadline[0] = float("inf")
                time.sleep(POLL)
                continue
            n = children.pop(pid)
            if not state["stopping"]:
                code = os.waitstatus_to_exitcode(status)
                logger.error("api_worker_exited", worker=n, pid=pid, code=code)
                died = (n, code)
                stop(signal.SIGTERM, None)
        return died
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _worker(app: ASGIApp, sock: socket.socket, parent: int) -> None:
    """One worker: uvicorn on the inherited socket until told to stop; exits the process."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _exit_now)  # before uvicorn's handlers, and re-raised by it at its end
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a stop that came meanwhile lands now
        _end_with_parent(parent)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", proxy_headers=False))
        server.run(sockets=[sock])
        code = 0 if server.started else 3
    except (KeyboardInterrupt, SystemExit):
        code = 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _end_with_parent(parent: int) -> None:
    """SIGTERM to this worker when the parent dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG):
    no worker goes on serving the address alone. Exits at once if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(0)


def _exit_now(sig: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


__all__ = ["ListenError", "listen", "run", "shared_metrics"]
