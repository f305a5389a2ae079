#!/usr/bin/env bash
# Builds the runner image from Dockerfile.runner on the local base image.
# Usage: scripts/build-runner-image.sh [IMAGE]   (default ffswarm/runner:dev)
# Env: BASE_IMAGE (default ffswarm/base:bookworm), ORT_EXTRA (cpu|gpu, default cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-ffswarm/runner:dev}
base=${BASE_IMAGE:-ffswarm/base:bookworm}

# Extra CA certificates (corporate proxies re-signing HTTPS): whatever this machine trusts locally.
mkdir -p build/ca-certificates
rm -f build/ca-certificates/*.crt
cp /usr/local/share/ca-certificates/*.crt build/ca-certificates/ 2>/dev/null || true

# The package index, as this machine's pip is configured (nothing is written into the repo).
args=(--build-arg "BASE_IMAGE=$base" --build-arg "ORT_EXTRA=${ORT_EXTRA:-cpu}")
index=$(python3 -m pip config get global.index-url 2>/dev/null || true)
[ -n "$index" ] && args+=(--build-arg "PIP_INDEX_URL=$index")

echo "runner image $image: building on $base …"
DOCKER_BUILDKIT=0 docker build -q -f Dockerfile.runner -t "$image" "${args[@]}" . >/dev/null
echo "runner image $image: $(docker image inspect -f '{{.Id}}' "$image")"
