#!/usr/bin/env bash
# Builds the local Debian 12 base image offline-style: no registry is reachable here, so the base is
# made with debootstrap from the Debian mirror this machine's own apt is configured with.
# Usage: scripts/build-base-image.sh [IMAGE]   (default ffswarm/base:bookworm; skipped if present)
set -euo pipefail
image=${1:-ffswarm/base:bookworm}
if docker image inspect "$image" >/dev/null 2>&1; then
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
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" >/tmp/ffswarm-debootstrap.log 2>&1 \
  || { tail -20 /tmp/ffswarm-debootstrap.log >&2; exit 1; }
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
echo "base image $image: built"
