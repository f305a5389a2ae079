#!/usr/bin/env bash
# The test command: brings up the dev swarm (scripts/dev-swarm.sh, idempotent), then lint, types,
# unit tests (no Docker) and integration tests (the real single-node swarm and runner image), the S3
# ones against Ceph RGW (scripts/s3-server.sh).
# Extra arguments go to pytest, e.g. scripts/test.sh -k spine
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/dev-swarm.sh
# Ceph RGW for the S3 tests: dev-swarm.sh started it while the images built; this waits for it.
scripts/s3-server.sh start || { tail -20 build/s3-server.log 2>/dev/null; exit 1; }
echo "== ruff"; .venv/bin/ruff check contract controller runner_image tests
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit tests/integration "$@"
