#!/usr/bin/env bash
# Turns this machine (Debian 12, root) into a working single-node ffswarm dev swarm. Idempotent:
# every step checks first and says what it did.
#   - installs the Docker engine, debootstrap, python3-venv and ffmpeg when absent
#   - starts dockerd with two fake GPUs (Swarm generic resources GPU=GPU-a, GPU=GPU-b) when none runs
#   - swarm init, labels this node ffswarm.gpu=true
#   - installs and starts Ceph RGW for the S3 tests (scripts/s3-server.sh) in the background while the
#     images build
#   - builds the base, runner and controller images
#   - makes .venv (ffswarm + runner + test libraries, from locks/dev.txt) and the data root .dev-data/
#   - installs the OpenAPI linter (scripts/openapi-lint.sh) in the background when absent
#   - installs the stand-in model pack as `default` when no pack of that name exists
#   - writes ./ffswarm.yaml (bind volume, data root inside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
say() { printf 'dev-swarm: %s\n' "$*"; }
RUNNER_UID=10001

# 1. Packages.
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v ffprobe >/dev/null || need+=(ffmpeg)  # the controller probes and joins video targets
# the web page's test (tests/unit/test_api_page.py) drives Debian's Chromium with Playwright; never a downloaded browser
command -v chromium >/dev/null || need+=(chromium fonts-liberation)
command -v npm >/dev/null || need+=(nodejs npm)  # installs the OpenAPI linter (scripts/openapi-lint.sh)
command -v curl >/dev/null || need+=(curl)  # scripts/s3-server.sh asks RGW whether it is up
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! docker version >/dev/null 2>&1 && ! command -v docker >/dev/null; then
  say "docker client missing after install"; exit 1
fi

# 2. The engine.
if docker info >/dev/null 2>&1; then
  say "dockerd: already running"
else
  say "dockerd: starting with fake GPUs GPU-a, GPU-b (log /var/log/ffswarm-dockerd.log)"
  rm -f /var/run/docker.pid
  # The engine keeps none of this script's open files: a caller's lock (flock) would else be held by
  # dockerd for as long as it runs.
  (
    for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
    DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 exec nohup dockerd \
      --node-generic-resource GPU=GPU-a --node-generic-resource GPU=GPU-b \
      --no-new-privileges \
      >/var/log/ffswarm-dockerd.log 2>&1
  ) &
  for _ in $(seq 1 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/ffswarm-dockerd.log; exit 1; }
fi

# 3. Swarm and node label.
if [ "$(docker info -f '{{.Swarm.LocalNodeState}}')" != active ]; then
  docker swarm init --advertise-addr 127.0.0.1 >/dev/null
  docker swarm update --dispatcher-heartbeat 1s >/dev/null
  say "swarm: initialised (single node, 1 s heartbeat)"
else
  say "swarm: already active"
fi
# the node's own update after an engine restart (its new generic resources) races this one: "update
# out of sequence" is retried
for try in 1 2 3 4 5; do
  if docker node update --label-add ffswarm.gpu=true "$(docker info -f '{{.Swarm.NodeID}}')" >/dev/null; then break; fi
  [ "$try" = 5 ] && exit 1
  sleep 1
done
gpus=$(docker node inspect self -f '{{range .Description.Resources.GenericResources}}{{with .NamedResourceSpec}}{{.Kind}}={{.Value}} {{end}}{{end}}')
say "node: labelled ffswarm.gpu=true; generic resources: ${gpus:-none (GPU jobs cannot schedule here)}"

# 3b. The S3 tests' server (Ceph RGW, ~60 s to install its packages the first time, ~15 s to start)
# comes up while the images build: after the swarm, so that it also listens on the docker_gwbridge
# gateway the runners reach, and after this script's own apt-get; scripts/test.sh waits for it.
mkdir -p build
(
  for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
  exec scripts/s3-server.sh start >build/s3-server.log 2>&1
) &
say "s3: Ceph RGW starting in the background (log build/s3-server.log)"

# 4. Images (FFSWARM_IMAGES=later: the caller builds them itself, e.g. scripts/test.sh while the unit tests run).
[ "${FFSWARM_IMAGES:-}" = later ] || scripts/build-images.sh

# 5. Python environment for the controller, the tests and the stand-in pack generator.
if [ ! -x .venv/bin/ffswarm ] || [ pyproject.toml -nt .venv/.installed ] || [ locks/dev.txt -nt .venv/.installed ]; then
  # Exactly the lock's packages, every file's sha256 checked (docs/development.md#locks); then ffswarm.
  say "venv: installing ffswarm with runner and test libraries into .venv (locks/dev.txt)"
  python3 -m venv --clear .venv
  { .venv/bin/pip install -q --no-deps --require-hashes -r locks/dev.txt -r locks/build.txt \
      && .venv/bin/pip install -q --no-deps --no-build-isolation -e .; } \
    >/tmp/ffswarm-pip.log 2>&1 || { tail -30 /tmp/ffswarm-pip.log; exit 1; }
  touch .venv/.installed
else
  say "venv: up to date"
fi

# 5b. The OpenAPI linter (tests/unit/test_api_lint.py), in the background while the rest goes on.
# The test waits for this install (the script's lock) instead of starting a second npm. The background
# process keeps none of this script's open files, so a caller reading our output is not held open by it.
if scripts/openapi-lint.sh installed; then
  say "openapi linter: installed"
else
  mkdir -p build
  say "openapi linter: installing in the background (build/openapi-lint.log)"
  (
    for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
    exec scripts/openapi-lint.sh install
  ) </dev/null >build/openapi-lint.log 2>&1 &
fi

# 6. Data root and model pack.
data=$repo/.dev-data
mkdir -p "$data/models"
if [ ! -f "$data/models/default/pack.yaml" ]; then
  .venv/bin/python -m tests.fixtures.standin_pack "$data/models/default" >/dev/null
  say "##############################################################################"
  say "models: no pack named 'default' under $data/models: installed the STAND-IN test"
  say "        pack there (real RetinaFace detector, generated ArcFace/inswapper stand-ins)."
  say "        Its swaps are not real face swaps. Install real models: see README."
  say "##############################################################################"
else
  say "models: pack 'default' present"
fi
# The data root and the model pack are the runner's; never chown the whole tree: runs/, inbox/ and
# tenants/ hold the controller's and the API's own files, which a runner must not own (a second start
# of this script used to hand them all to the runner, and the API then refused its own records).
chown "$RUNNER_UID:$RUNNER_UID" "$data"
chown -R "$RUNNER_UID:$RUNNER_UID" "$data/models"

# 7. Config.
cat > ffswarm.yaml <<YAML
# Written by scripts/dev-swarm.sh: single-node dev swarm on this machine.
data_root: $data
volume:
  type: bind
image: ffswarm/runner:dev
controller_image: ffswarm/controller:dev   # the controller stack (ffswarm render --controller)
schedule_timeout: 5m
policy:   # what a job file may ask for (docs/operations.md#policy); the safe defaults otherwise
  images: [ffswarm/runner:dev, ffswarm/runner-faults:test]   # the tests' fault-injecting image too
YAML
say "config: wrote $repo/ffswarm.yaml (data root $data)"
[ "${FFSWARM_IMAGES:-}" = later ] && { say "ready but for the images (the caller builds them)"; exit 0; }
say "ready: scripts/demo.sh runs a real job here (it writes demo-jobs/demo.yaml; then: . .venv/bin/activate && ffswarm status demo)"
