#!/usr/bin/env bash
# The test command: brings up the dev swarm (scripts/dev-swarm.sh, idempotent), then lint, types,
# unit tests (no Docker) and integration tests (the real single-node swarm and runner image), the S3
# ones against Ceph RGW (scripts/s3-server.sh). The images build in the background while lint, types
# and the unit tests run (they need no image).
# Extra arguments go to pytest, e.g. scripts/test.sh -k spine
set -euo pipefail
cd "$(dirname "$0")/.."
FFSWARM_IMAGES=later scripts/dev-swarm.sh
mkdir -p build
scripts/build-images.sh >build/images.log 2>&1 &
images=$!
echo "== images: building in the background (build/images.log)"
failed=0
echo "== ruff"; .venv/bin/ruff check contract controller runner_image tests || failed=1
echo "== mypy"; .venv/bin/mypy || failed=1
# Ceph RGW for the S3 tests: dev-swarm.sh started it in the background; this waits for it.
scripts/s3-server.sh start || { tail -20 build/s3-server.log 2>/dev/null; exit 1; }
echo "== pytest (unit)"
unit=0; .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit "$@" || unit=$?
[ "$unit" -eq 0 ] || [ "$unit" -eq 5 ] || failed=1  # 5: a -k that selects no unit test
echo "== images"
if ! wait "$images"; then tail -40 build/images.log; echo "test: the images did not build"; exit 1; fi
cat build/images.log
[ "$failed" -eq 0 ] || { echo "test: lint, types or unit tests failed (above)"; exit 1; }
echo "== pytest (integration)"
rc=0; .venv/bin/python -m pytest -q -p no:cacheprovider tests/integration "$@" || rc=$?
[ "$rc" -eq 5 ] && [ "$unit" -eq 0 ] && rc=0  # a -k that selects unit tests only
exit "$rc"
