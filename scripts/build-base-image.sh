#!/usr/bin/env bash
# Builds the local Debian 12 base image offline-style: no registry is reachable here, so the base is
# made with debootstrap from the Debian mirror this machine's own apt is configured with.
# It carries python3 and CA certificates, and no documentation, manual pages or translations
# (scripts/slim-rootfs.sh, also for every later apt install into it).
# Usage: scripts/build-base-image.sh [IMAGE]   (default ffswarm/base:bookworm; skipped if present and
# built by this recipe: the recipe's hash is the image's label io.ffswarm.base-recipe)
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-ffswarm/base:bookworm}
recipe=$(cat scripts/build-base-image.sh scripts/slim-rootfs.sh | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "io.ffswarm.base-recipe"}}' "$image" 2>/dev/null)" = "$recipe" ]; then
  echo "base image $image: present"
  exit 0
fi

# The Debian mirror, as this machine's apt knows it (deb822 .sources first, then sources.list).
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }

rootfs=$(mktemp -d /var/tmp/ffswarm-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "base image $image: debootstrap bookworm (minbase) …"
debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$rootfs" "$mirror" >/tmp/ffswarm-debootstrap.log 2>&1 \
  || { tail -20 /tmp/ffswarm-debootstrap.log >&2; exit 1; }
scripts/slim-rootfs.sh "$rootfs"
tar -C "$rootfs" -c . | docker import -c "LABEL io.ffswarm.base-recipe=$recipe" - "$image" >/dev/null
echo "base image $image: built"
