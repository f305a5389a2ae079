#!/usr/bin/env bash
# Make this machine a GPU node for ffswarm (as root; NVIDIA driver and nvidia-container-toolkit
# installed). Generates daemon.json from `nvidia-smi -L`, enables the runtime's swarm-resource line,
# restarts dockerd, and installs ffswarm-sweep.timer. Needs the `ffswarm` command (pip install . from a checkout).
#   swarm/gpu-node.sh            then, on a manager:  ffswarm nodes label NODE  &&  ffswarm doctor
set -euo pipefail
toml=/etc/nvidia-container-runtime/config.toml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

nvidia-smi -L | ffswarm nodes gpu-config --out-dir "$out"
if [ -s /etc/docker/daemon.json ] && ! cmp -s "$out/daemon.json" /etc/docker/daemon.json; then
  cp /etc/docker/daemon.json "/etc/docker/daemon.json.before-ffswarm.$(date +%s)"
  echo "gpu-node: saved the previous /etc/docker/daemon.json; merge any settings of yours back by hand"
fi
install -D -m 0644 "$out/daemon.json" /etc/docker/daemon.json

line=$(cat "$out/nvidia-runtime.toml")
if grep -q '^swarm-resource' "$toml"; then
  sed -i "s|^swarm-resource.*|$line|" "$toml"
elif grep -q '^#swarm-resource' "$toml"; then
  sed -i "s|^#swarm-resource.*|$line|" "$toml"
else
  printf '%s\n%s\n' "$line" "$(cat "$toml")" > "$toml.ffswarm.tmp" && mv "$toml.ffswarm.tmp" "$toml"
fi
systemctl restart docker
echo "gpu-node: $(grep -c '"GPU=' /etc/docker/daemon.json) GPU(s) advertised; $line"

# A timer that removes the ended job containers an engine restart left behind (moby/moby#42723;
# docs/failures.md#engine-restarts).
ffswarm=$(command -v ffswarm)
cat > /etc/systemd/system/ffswarm-sweep.service <<UNIT
[Unit]
Description=ffswarm: remove ended job containers the engine kept
After=docker.service
Requires=docker.service

[Service]
Type=oneshot
ExecStart=$ffswarm nodes sweep --older-than 1h
UNIT
cat > /etc/systemd/system/ffswarm-sweep.timer <<'UNIT'
[Unit]
Description=ffswarm: sweep ended job containers every 15 minutes

[Timer]
OnBootSec=15min
OnUnitActiveSec=15min

[Install]
WantedBy=timers.target
UNIT
systemctl daemon-reload
systemctl enable --now ffswarm-sweep.timer
echo "gpu-node: ffswarm-sweep.timer installed (ffswarm nodes sweep every 15 minutes)"
