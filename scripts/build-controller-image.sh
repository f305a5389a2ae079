#!/usr/bin/env bash
# Builds the controller image (the controller stack's serve and api: no onnxruntime, OpenCV, numpy
# or models) from Dockerfile.controller on the local base image, copies its SBOM next to the build
# output and labels the image with the SBOM's sha256.
# Usage: scripts/build-controller-image.sh [IMAGE]   (default ffswarm/controller:dev)
# Env: BASE_IMAGE (default ffswarm/base:bookworm, which scripts/build-base-image.sh makes; elsewhere
#      python:3.11-slim-bookworm), NO_CACHE=1 (rebuild every step).
# Output: build/sbom-controller.cdx.json (the image's /opt/ffswarm/sbom.cdx.json); the image's labels
# io.ffswarm.sbom.sha256 (that file's sha256) and io.ffswarm.lock (the lock it was installed from).
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-ffswarm/controller:dev}
base=${BASE_IMAGE:-ffswarm/base:bookworm}
sbom_path=/opt/ffswarm/sbom.cdx.json
sbom_out=build/sbom-controller.cdx.json

# Extra CA certificates (corporate proxies re-signing HTTPS): whatever this machine trusts locally.
mkdir -p build/ca-certificates
rm -f build/ca-certificates/*.crt
cp /usr/local/share/ca-certificates/*.crt build/ca-certificates/ 2>/dev/null || true

# The package index, as this machine's pip is configured (nothing is written into the repo).
args=(--build-arg "BASE_IMAGE=$base")
index=$(python3 -m pip config get global.index-url 2>/dev/null || true)
[ -n "$index" ] && args+=(--build-arg "PIP_INDEX_URL=$index")
[ "${NO_CACHE:-}" = 1 ] && args+=(--no-cache)

echo "controller image $image: building on $base (locks/controller.txt) …"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
DOCKER_BUILDKIT=0 docker build -q -f Dockerfile.controller "${args[@]}" . >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
built=$(tail -1 "$log")

# The SBOM, read without starting the image; its digest becomes a label (a one-line second build adds
# it on top: no new layer).
cid=$(docker create "$built")
docker cp "$cid:$sbom_path" "$sbom_out" >/dev/null
docker rm "$cid" >/dev/null
sha=$(sha256sum "$sbom_out" | cut -d' ' -f1)
printf 'FROM %s\n' "$built" | DOCKER_BUILDKIT=0 docker build -q -t "$image" \
  --label "io.ffswarm.sbom.sha256=$sha" --label "io.ffswarm.lock=locks/controller.txt" - >"$log" 2>&1 \
  || { cat "$log" >&2; exit 1; }
size=$(docker image inspect -f '{{.Size}}' "$image")
echo "controller image $image: $(docker image inspect -f '{{.Id}}' "$image"), $((size / 1000000)) MB; SBOM $sbom_out (sha256 ${sha:0:16}…)"
