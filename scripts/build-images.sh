#!/usr/bin/env bash
# The dev swarm's images: the base, the runner on it, and the controller (the controller stack's serve
# and api: no runner libraries). Each script skips what is already built from the same inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-base-image.sh ffswarm/base:bookworm
scripts/build-runner-image.sh ffswarm/runner:dev
scripts/build-controller-image.sh ffswarm/controller:dev
