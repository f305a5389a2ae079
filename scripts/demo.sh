#!/usr/bin/env bash
# The demo: a real face-swap job on a local single-node swarm. Brings the dev swarm up
# (scripts/dev-swarm.sh), puts a source face and a folder of photos on the data root, and runs
# `ffswarm submit` on a job file. Each run is a new job (demo, demo-2, …).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/dev-swarm.sh
data=$(pwd)/.dev-data
.venv/bin/python - "$data" <<'PY'
import sys
from pathlib import Path
from tests.fixtures import photos

demo = Path(sys.argv[1]) / "demo"
if not (demo / "crowd").is_dir():
    photos.astronaut(demo / "faces")
    photos.face_photos(demo / "crowd", 8)
    photos.group(demo / "crowd")
    photos.no_face_photo(demo / "crowd")
PY
mkdir -p demo-jobs
cat > demo-jobs/demo.yaml <<'YAML'
# A job file (v1): swap the astronaut's face into every photo of demo/crowd.
name: demo
source: demo/faces/astronaut.jpg
targets: [demo/crowd/*.jpg]
output: demo/out/{job}/{stem}{ext}
faces: many
no_face: copy
chunk_size: 4
max_concurrent: 2
providers: [cuda, cpu]
resources: {gpus: 1, gpu_kind: GPU, memory: 2g}
placement: [node.labels.ffswarm.gpu==true]
YAML
chown -R 10001:10001 "$data/demo"
echo "demo: ffswarm submit --new demo-jobs"
.venv/bin/ffswarm submit --new demo-jobs
