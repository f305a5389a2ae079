#!/bin/sh
# Makes a Debian root filesystem lean, now and for every later apt install into it: no documentation
# (licence texts stay), manual pages or translations, no apt package lists or caches, no logs.
# Used on the base image's rootfs (scripts/build-base-image.sh) and inside Dockerfile.runner.
# Usage: slim-rootfs.sh [ROOT]   (default /)
set -eu
root=${1:-/}
root=${root%/}
mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
cat > "$root/etc/dpkg/dpkg.cfg.d/ffswarm-slim" <<'CFG'
# ffswarm images: no documentation, manual pages or translations (licence texts stay).
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
CFG
# What is already unpacked, likewise.
if [ -d "$root/usr/share/doc" ]; then
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
fi
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian/* \
  "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/log/apt/* "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log
