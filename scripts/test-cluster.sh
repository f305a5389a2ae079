#!/usr/bin/env bash
# The cluster suite (tests/cluster/): ffswarm on a three-node Docker Swarm of dockerd-in-containers
# on this machine (scripts/cluster.sh). Not part of scripts/test.sh / CI: it needs ~2-3 minutes of
# bring-up (node image, registry push, image pull) on a 2-core machine. It brings the cluster up and
# tears it down itself; a cluster already up (scripts/cluster.sh up) is reused and left running.
# Extra arguments go to pytest, e.g. scripts/test-cluster.sh -k drain. SOAK=1: the short soak afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/dev-swarm.sh >/dev/null   # engine, runner image, venv, stand-in pack (idempotent)
start=$(date +%s)
status=0
.venv/bin/python -m pytest -q -s -p no:cacheprovider tests/cluster "$@" || status=$?
echo "cluster suite: wall time $(( $(date +%s) - start )) s"
if [ "${SOAK:-0}" = 1 ]; then  # then the short soak (docs/development.md#soak): one fault of each kind
  .venv/bin/python scripts/soak.py --short || status=$?
fi
exit $status
