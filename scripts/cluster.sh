#!/usr/bin/env bash
# A three-node Docker Swarm on this one machine, for the cluster test suite (tests/cluster/):
# three dockerd-in-containers on a private network, plus a registry for the runner image.
#
#   scripts/cluster.sh up      bring it up (idempotent: an existing cluster is reused)
#   scripts/cluster.sh down    remove everything it made (containers, volumes, network, the data)
#   scripts/cluster.sh status  what is running
#   CLUSTER_DATA_SIZE=4g scripts/cluster.sh up   the shared data folder on a tmpfs of that size (scripts/soak.py)
#
#   ffswarm-mgr   manager, labelled ffswarm.cpu-only=true, NO GPUs; its API on tcp://127.0.0.1:23750
#   ffswarm-w1    worker, ffswarm.gpu=true, fake GPUs GPU-w1a GPU-w1b;  API on tcp://127.0.0.1:23751
#   ffswarm-w2    worker, ffswarm.gpu=true, fake GPUs GPU-w2a GPU-w2b;  API on tcp://127.0.0.1:23752
#   ffswarm-registry  Debian's docker-registry; host pushes to 127.0.0.1:5000, workers pull
#                     ffswarm-registry:5000/ffswarm/runner@sha256:… (insecure, node network only)
#
# Node APIs are published on loopback only. Nodes are NOT --privileged (this VM's root lacks
# CAP_SYS_RESOURCE; docs/development.md#test-suites): all caps but that one, unconfined seccomp/apparmor/systempaths,
# every device allowed, a private cgroup namespace, and an entrypoint that remounts /sys and the cgroup
# v1 hierarchies rw. The shared data folder build/cluster/data is bind-mounted at the SAME path on
# every node, so the controller's bind volume works unchanged. Everything made carries the label
# io.ffswarm.test=cluster. Writes build/cluster/ffswarm.yaml (a config for `ffswarm --config`) and
# build/cluster/state.json (what the tests read). The node image ffswarm/node:bookworm stays cached.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
LABEL=io.ffswarm.test=cluster
NET=ffswarm-cluster
NODE_IMAGE=ffswarm/node:bookworm
REGISTRY=ffswarm-registry
RUNNER=${RUNNER_IMAGE:-ffswarm/runner:dev}
REPO_PATH=ffswarm/runner
state=$repo/build/cluster
data=$state/data
RUNNER_UID=10001
NODES=(ffswarm-mgr ffswarm-w1 ffswarm-w2)
declare -A PORT=([ffswarm-mgr]=23750 [ffswarm-w1]=23751 [ffswarm-w2]=23752)
declare -A GPUS=([ffswarm-mgr]="" [ffswarm-w1]="GPU-w1a GPU-w1b" [ffswarm-w2]="GPU-w2a GPU-w2b")
say() { printf 'cluster: %s\n' "$*"; }
t0=$(date +%s%N)
secs() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }
elapsed() { printf '%s s' "$(secs)"; }

node_image() {
  local ctx; ctx=$(mktemp -d)
  cat > "$ctx/entrypoint.sh" <<'SH'
#!/bin/sh
# dockerd inside an unprivileged container: make /sys and the cgroup v1 hierarchies writable (Docker
# mounts them read-only without --privileged), drop pid files a killed run left, then run dockerd.
set -e
mount -o remount,rw /sys 2>/dev/null || true
if [ ! -e /sys/fs/cgroup/cgroup.controllers ]; then
  for m in $(awk '$2 ~ "^/sys/fs/cgroup/" {print $2}' /proc/self/mounts | sort -r); do umount "$m" 2>/dev/null || true; done
  umount /sys/fs/cgroup 2>/dev/null || true
  mount -t tmpfs -o rw,nosuid,nodev,noexec,mode=755 cgroup /sys/fs/cgroup
  while IFS=: read -r _ subsys _; do
    case "$subsys" in
      "") mkdir -p /sys/fs/cgroup/unified; mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified 2>/dev/null || rmdir /sys/fs/cgroup/unified ;;
      name=*) mkdir -p "/sys/fs/cgroup/${subsys#name=}"; mount -t cgroup -o "none,$subsys" cgroup "/sys/fs/cgroup/${subsys#name=}" ;;
      *) mkdir -p "/sys/fs/cgroup/$subsys"; mount -t cgroup -o "$subsys" cgroup "/sys/fs/cgroup/$subsys"
         case "$subsys" in *,*) for c in $(echo "$subsys" | tr , ' '); do ln -sfn "$subsys" "/sys/fs/cgroup/$c"; done ;; esac ;;
    esac
  done < /proc/self/cgroup
fi
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid /run/docker/containerd/containerd.pid
exec dockerd "$@"
SH
  # Debian's registry config asks for htpasswd auth; the test registry lives on a private network.
  cat > "$ctx/registry.yml" <<'YAML'
version: 0.1
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
http:
  addr: :5000
YAML
  cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM ffswarm/base:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends docker.io docker-registry iptables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY entrypoint.sh /usr/local/bin/ffswarm-node
COPY registry.yml /etc/ffswarm/registry.yml
RUN chmod 755 /usr/local/bin/ffswarm-node
VOLUME /var/lib/docker
ENTRYPOINT ["/usr/local/bin/ffswarm-node"]
DOCKERFILE
  # Rebuilt only when this recipe changes (its hash is a label of the image).
  local recipe; recipe=$(cat "$ctx"/* | sha256sum | cut -c1-16)
  if [ "$(docker image inspect -f '{{index .Config.Labels "io.ffswarm.node-recipe"}}' "$NODE_IMAGE" 2>/dev/null)" != "$recipe" ]; then
    [ -n "$(docker images -q ffswarm/base:bookworm)" ] || scripts/build-base-image.sh ffswarm/base:bookworm
    say "node image $NODE_IMAGE: building (base + docker.io + docker-registry) …"
    DOCKER_BUILDKIT=0 docker build -q --label "$LABEL" --label "io.ffswarm.node-recipe=$recipe" \
      -t "$NODE_IMAGE" "$ctx" >/dev/null 2>"$ctx/build.log" || { cat "$ctx/build.log" >&2; exit 1; }
  fi
  rm -rf "$ctx"
}

api() { docker -H "tcp://127.0.0.1:${PORT[$1]}" "${@:2}"; }

start_node() {
  local name=$1 args=()
  for g in ${GPUS[$name]}; do args+=(--node-generic-resource "GPU=$g"); done
  docker volume create --label "$LABEL" "$name-docker" >/dev/null
  docker run -d --name "$name" --hostname "$name" --label "$LABEL" --network "$NET" \
    --cap-add ALL --cap-drop SYS_RESOURCE \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
    --device-cgroup-rule 'a *:* rwm' --cgroupns private \
    -v "$name-docker:/var/lib/docker" -v "$data:$data" \
    -p "127.0.0.1:${PORT[$name]}:2375" \
    "$NODE_IMAGE" \
    -H unix:///var/run/docker.sock -H tcp://0.0.0.0:2375 --tls=false \
    --insecure-registry "$REGISTRY:5000" --no-new-privileges "${args[@]}" >/dev/null
}

wait_api() {
  for _ in $(seq 1 150); do api "$1" info >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$1: dockerd did not come up"; docker logs --tail 30 "$1" >&2; return 1
}

up() {
  if [ -f "$state/state.json" ] && [ "$(docker inspect -f '{{.State.Running}}' ffswarm-mgr 2>/dev/null)" = true ]; then
    say "already up ($state/state.json)"; return 0
  fi
  docker image inspect "$RUNNER" >/dev/null 2>&1 || { say "runner image $RUNNER missing: run scripts/dev-swarm.sh"; exit 1; }
  down quiet
  node_image
  if [ -n "${CLUSTER_DATA_SIZE:-}" ]; then  # a data root of its own size (the soak fills it): a tmpfs
    mkdir -p "$data"
    mount -t tmpfs -o "size=$CLUSTER_DATA_SIZE,mode=0755" ffswarm-cluster-data "$data"
  fi
  mkdir -p "$data/models"
  if [ ! -f "$data/models/default/pack.yaml" ]; then
    if [ -f .dev-data/models/default/pack.yaml ]; then cp -a .dev-data/models/default "$data/models/"
    else .venv/bin/python -m tests.fixtures.standin_pack "$data/models/default" >/dev/null; fi
  fi
  chown -R "$RUNNER_UID:$RUNNER_UID" "$data"

  docker network create --label "$LABEL" "$NET" >/dev/null
  docker volume create --label "$LABEL" ffswarm-registry-data >/dev/null
  docker run -d --name "$REGISTRY" --label "$LABEL" --network "$NET" -p 127.0.0.1:5000:5000 \
    -v ffswarm-registry-data:/var/lib/docker-registry --entrypoint /usr/bin/docker-registry \
    "$NODE_IMAGE" serve /etc/ffswarm/registry.yml >/dev/null
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do wait_api "$n"; done
  say "nodes: dockerd up in 3 containers ($(elapsed))"

  local mgr_ip; mgr_ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" ffswarm-mgr)
  api ffswarm-mgr swarm init --advertise-addr "$mgr_ip" >/dev/null
  api ffswarm-mgr swarm update --dispatcher-heartbeat 1s >/dev/null
  local token; token=$(api ffswarm-mgr swarm join-token -q worker)
  for n in ffswarm-w1 ffswarm-w2; do api "$n" swarm join --token "$token" "$mgr_ip:2377" >/dev/null; done
  api ffswarm-mgr node update --label-add ffswarm.cpu-only=true ffswarm-mgr >/dev/null
  for n in ffswarm-w1 ffswarm-w2; do api ffswarm-mgr node update --label-add ffswarm.gpu=true "$n" >/dev/null; done
  say "swarm: 1 manager (cpu-only) + 2 GPU workers, 1 s heartbeat ($(elapsed))"

  # The runner image, by digest, on every node.
  for _ in $(seq 1 50); do curl -sf http://127.0.0.1:5000/v2/ >/dev/null && break; sleep 0.2; done
  docker tag "$RUNNER" "127.0.0.1:5000/$REPO_PATH:dev"
  docker push -q "127.0.0.1:5000/$REPO_PATH:dev" >/dev/null
  local digest; digest=$(docker image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$RUNNER" \
    | awk -F@ '/^127.0.0.1:5000\// {print $2; exit}')
  [ -n "$digest" ] || { say "push gave no digest"; exit 1; }
  say "registry: pushed $RUNNER as $REGISTRY:5000/$REPO_PATH@$digest ($(elapsed))"
  # Pre-pulled by the workers (the manager runs no chunks; the config names the digest, so the
  # controller needs no local copy to resolve it). Tasks find it local and never pull.
  local pids=()
  for n in ffswarm-w1 ffswarm-w2; do api "$n" pull -q "$REGISTRY:5000/$REPO_PATH@$digest" >/dev/null & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  say "workers: runner image pulled ($(elapsed))"

  cat > "$state/ffswarm.yaml" <<YAML
# Written by scripts/cluster.sh: the three-node test swarm (manager API on loopback).
data_root: $data
volume:
  type: bind
image: $REGISTRY:5000/$REPO_PATH@$digest
schedule_timeout: 5m
docker_host: tcp://127.0.0.1:${PORT[ffswarm-mgr]}
YAML
  local ids=""
  for n in "${NODES[@]}"; do ids+="\"$n\": \"$(api "$n" info -f '{{.Swarm.NodeID}}')\", "; done
  cat > "$state/state.json" <<JSON
{"config": "$state/ffswarm.yaml", "data_root": "$data", "digest": "$digest",
 "image": "$REGISTRY:5000/$REPO_PATH@$digest",
 "apis": {"ffswarm-mgr": "tcp://127.0.0.1:23750", "ffswarm-w1": "tcp://127.0.0.1:23751", "ffswarm-w2": "tcp://127.0.0.1:23752"},
 "node_ids": {${ids%, }}, "bring_up_s": $(secs)}
JSON
  say "up in $(elapsed): ffswarm --config $state/ffswarm.yaml …"
}

down() {
  local ids
  ids=$(docker ps -aq --filter "label=$LABEL")
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null
  ids=$(docker volume ls -q --filter "label=$LABEL")
  [ -z "$ids" ] || docker volume rm $ids >/dev/null
  ids=$(docker network ls -q --filter "label=$LABEL")
  [ -z "$ids" ] || docker network rm $ids >/dev/null
  # The throwaway registry's tags and digests: a digest left on an image would name a gone registry.
  local refs
  refs=$(docker images --digests --format '{{.Repository}}:{{.Tag}} {{.Repository}}@{{.Digest}}' \
    | tr ' ' '\n' | grep '^127\.0\.0\.1:5000/' | grep -v -e ':<none>$' -e '@<none>$' || true)
  [ -z "$refs" ] || docker image rm $refs >/dev/null 2>&1 || true
  if mountpoint -q "$data" 2>/dev/null; then umount "$data"; fi
  rm -rf "$state"
  [ "${1:-}" = quiet ] || say "down: containers, volumes, network and $state removed ($NODE_IMAGE stays cached)"
}

status() {
  docker ps -a --filter "label=$LABEL" --format '{{.Names}}\t{{.Status}}\t{{.Ports}}'
  if docker inspect ffswarm-mgr >/dev/null 2>&1; then api ffswarm-mgr node ls 2>/dev/null || true; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
