"""``python -m runner_image``: the runner image's exec-form entrypoint.

Only argument/environment parsing and the mapping from how an attempt ended to its exit code live
here (contract/exits.py, docs/failures.md#exit-codes); the work is in worker.run_attempt. Inputs: ``FFSWARM_MANIFEST``
(container path of the chunk manifest), ``FFSWARM_ATTEMPT`` (default 1), ``DOCKER_RESOURCE_GPU``
(set by Swarm), and for local runs/tests ``--manifest``, ``--attempt`` and ``--data-root`` /
``FFSWARM_DATA_ROOT`` (a local folder standing in for ``/data``; see volume.py).

``python -m runner_image identity --request PATH`` embeds a job's source/reference photos once at
submit (identity.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from contract.errors import ManifestError
from contract.exits import RunnerExit
from contract.handoff import ENV_LANE
from contract.manifest import ENV_ATTEMPT, ENV_MANIFEST, Manifest

from . import log
from .errors import BadManifest, RunnerError, Terminated
from .identity import run_identity
from .linger import run_lingering
from .record import AttemptRecorder
from .volume import ENV_DATA_ROOT, DataRoot, read_manifest
from .worker import invocation_from_env, run_attempt

EXIT_TERMINATED = 128 + signal.SIGTERM  # what a shell reports for SIGTERM: "killed", infrastructure


def _parse_identity(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m runner_image identity", description="Embed a job's source and reference photos once."
    )
    parser.add_argument("--request", required=True, help="container path of runs/<job>/identity-request.json")
    parser.add_argument("--data-root", help=f"local folder standing in for /data (default ${ENV_DATA_ROOT} or /data)")
    return parser.parse_args(argv)


def _parse(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m runner_image", description="Run one ffswarm chunk attempt.")
    parser.add_argument("--manifest", default=env.get(ENV_MANIFEST), help=f"manifest path (default ${ENV_MANIFEST})")
    parser.add_argument("--attempt", default=env.get(ENV_ATTEMPT, "1"), help=f"≥ 1 (default ${ENV_ATTEMPT} or 1)")
    parser.add_argument(
        "--data-root", help=f"local folder standing in for /data (dev/test aid; default ${ENV_DATA_ROOT} or /data)"
    )
    return parser.parse_args(argv)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def _attempt(value: str) -> int:
    attempt = int(value)
    if attempt < 1:
        raise ValueError(attempt)
    return attempt


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    # insightface's face_align calls a scikit-image API deprecated in 0.26: noise on every chunk.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"insightface\.")
    argv = sys.argv[1:] if argv is None else list(argv)
    identity = bool(argv) and argv[0] == "identity"
    args = _parse_identity(argv[1:]) if identity else _parse(argv, env)
    sink = log.configure()
    logger = log.get()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if identity:
            return _one(
                lambda recorder: run_identity(DataRoot.from_env(env, args.data_root), args.request, sink), logger
            )

        def chunk(manifest: str, attempt_text: str) -> int:
            def attempt(recorder: AttemptRecorder) -> int:
                try:
                    n = _attempt(attempt_text)
                except ValueError:
                    raise BadManifest(f"attempt must be an integer ≥ 1, got {attempt_text!r}") from None
                return run_attempt(invocation_from_env(env, manifest, n, args.data_root), sink, recorder)

            code = _one(attempt, logger)
            log.clear()
            return code

        code = chunk(args.manifest, args.attempt)
        first = _lingering(env, args)
        if first is not None:  # a lane waits for the next chunk (runner_image/linger.py)
            try:
                code = run_lingering(first[0], first[1], lambda m, a: chunk(m, str(a)), code)
            except Terminated:
                logger.warning("terminated by SIGTERM while lingering", exit_code=EXIT_TERMINATED)
                code = EXIT_TERMINATED
        return code
    finally:
        signal.signal(signal.SIGTERM, previous)
        sink.detach()
        log.reset()


def _one(run: Callable[[AttemptRecorder], int], logger: Any) -> int:
    """One attempt (or the identity step) with its ending mapped to an exit code and recorded."""
    recorder = AttemptRecorder()  # the attempt's record, once the manifest says whose (record.py)
    code: int = RunnerExit.INTERNAL  # what the record says if something escapes the handlers below
    reason: str | None = None
    try:
        code = run(recorder)
    except Terminated:
        logger.warning("terminated by SIGTERM", exit_code=EXIT_TERMINATED)
        code, reason = EXIT_TERMINATED, "terminated by SIGTERM"
    except ManifestError as e:
        code, reason = RunnerExit.BAD_MANIFEST, str(e)
        logger.error("runner failed", exit_code=int(code), error=str(e), kind="bad manifest")
    except RunnerError as e:
        code, reason = e.exit_code, str(e)
        logger.error("runner failed", exit_code=int(code), error=str(e), kind=type(e).__name__)
    except Exception as e:
        code, reason = RunnerExit.INTERNAL, f"internal error: {type(e).__name__}: {e}"
        logger.exception("runner failed", exit_code=int(code), kind="internal error")
    finally:
        recorder.finish(int(code), reason, logger)
    return int(code)


def _lingering(env: Mapping[str, str], args: argparse.Namespace) -> tuple[DataRoot, Manifest] | None:
    """The first manifest, when this service is a lane and the manifest says to linger after it
    (None: exit now, as always)."""
    if env.get(ENV_LANE) != "1":
        return None
    try:
        root = DataRoot.from_env(env, args.data_root)
        manifest = read_manifest(root, args.manifest)
    except (RunnerError, ManifestError, OSError, ValueError):
        return None
    return (root, manifest) if manifest.linger > 0 and manifest.handoff else None


if __name__ == "__main__":
    status = main()
    # Everything is committed and the log is closed: skip the interpreter's teardown (onnxruntime's
    # and OpenCV's thread pools, module finalisers), which only delays the container's exit, and so
    # the chunk's end as the controller sees it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
