#!/usr/bin/env bash
# Export the ffswarm data root over NFS from the storage host (Debian/Ubuntu, as root).
#   swarm/nfs-export.sh /srv/ffswarm 10.0.0.0/24 [10001]
# Creates the folder, hands it to the runner uid:gid (runners never run as root, and with root_squash
# root cannot write either), exports it read-write to the cluster's subnet, and reloads the exports.
# Idempotent: an existing export line for the folder is replaced.
set -euo pipefail
dir=${1:?usage: nfs-export.sh DIR CLIENT_SUBNET [RUNNER_UID]}
clients=${2:?usage: nfs-export.sh DIR CLIENT_SUBNET [RUNNER_UID]}
uid=${3:-10001}

if ! command -v exportfs >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nfs-kernel-server
fi
mkdir -p "$dir"
chown "$uid:$uid" "$dir"
line="$dir $clients(rw,sync,no_subtree_check,root_squash)"
touch /etc/exports
grep -v "^$dir " /etc/exports > /etc/exports.ffswarm.tmp || true
echo "$line" >> /etc/exports.ffswarm.tmp
mv /etc/exports.ffswarm.tmp /etc/exports
exportfs -ra
echo "nfs-export: $line"
echo "nfs-export: in ffswarm.yaml: volume: {type: nfs, server: $(hostname -f), export: $dir, options: nfsvers=4.1,hard}"
