#!/usr/bin/env bash
# Check (and, for the controller's host, mount) the ffswarm NFS export on a node (as root).
#   swarm/nfs-mount.sh SERVER /srv/ffswarm [MOUNTPOINT]
# Runner containers mount the export themselves (a Swarm volume with driver options, rendered from
# the config), so GPU nodes only need the NFS client. Managers that run the controller also need the
# export at the config's data_root: give MOUNTPOINT and it is mounted there and added to /etc/fstab.
set -euo pipefail
server=${1:?usage: nfs-mount.sh SERVER EXPORT [MOUNTPOINT]}
export_dir=${2:?usage: nfs-mount.sh SERVER EXPORT [MOUNTPOINT]}
mountpoint=${3:-}
opts=nfsvers=4.1,hard

if ! command -v mount.nfs >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nfs-common
fi
probe=$(mktemp -d)
trap 'umount "$probe" 2>/dev/null || true; rmdir "$probe"' EXIT
mount -t nfs -o "$opts" "$server:$export_dir" "$probe"
echo "nfs-mount: $server:$export_dir mounts here (owner $(stat -c %u:%g "$probe"))"
umount "$probe"

if [ -n "$mountpoint" ]; then
  mkdir -p "$mountpoint"
  if ! grep -q " $mountpoint nfs " /etc/fstab; then
    echo "$server:$export_dir $mountpoint nfs $opts,_netdev 0 0" >> /etc/fstab
  fi
  mountpoint -q "$mountpoint" || mount "$mountpoint"
  echo "nfs-mount: mounted at $mountpoint (use it as data_root in ffswarm.yaml)"
fi
