#!/usr/bin/env bash
# The OpenAPI linter: Redocly CLI at the version pinned in tools/openapi-lint/package-lock.json, installed
# into tools/openapi-lint/node_modules (gitignored) with npm, and run with tools/openapi-lint/redocly.yaml
# (the recommended ruleset).
#   scripts/openapi-lint.sh install     install it unless it is there and current (scripts/dev-swarm.sh)
#   scripts/openapi-lint.sh installed   exit 0 when it is there and current, 1 otherwise
#   scripts/openapi-lint.sh FILE [ARG…]  install when needed, then lint FILE (an OpenAPI document); extra
#                                       arguments go to `redocly lint`, e.g. --format=json
# The machine's npm config names the registry; nothing here does. Installs wait for each other (flock),
# so a background install from scripts/dev-swarm.sh and the unit test never run npm at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tools/openapi-lint
bin=$dir/node_modules/.bin/redocly
stamp=$dir/node_modules/.installed  # written after a complete install; npm ci removes it with the folder
say() { printf 'openapi-lint: %s\n' "$*" >&2; }

installed() {
  [ -x "$bin" ] && [ -f "$stamp" ] && [ ! "$dir/package-lock.json" -nt "$stamp" ] \
    && [ ! "$dir/package.json" -nt "$stamp" ]
}

install() {
  mkdir -p build
  exec 9>build/openapi-lint.lock
  flock 9
  if installed; then exec 9>&-; return 0; fi
  if ! command -v npm >/dev/null; then
    say "npm is missing: apt-get install -y nodejs npm (scripts/dev-swarm.sh installs them)"; exit 1
  fi
  say "installing Redocly CLI (tools/openapi-lint/package-lock.json) into $dir/node_modules"
  # npm ci: exactly the lock's packages, each checked against its integrity hash; no install scripts
  if ! (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >build/openapi-lint-npm.log 2>&1
  then
    tail -30 build/openapi-lint-npm.log >&2; say "npm ci failed (build/openapi-lint-npm.log)"; exit 1
  fi
  touch "$stamp"
  exec 9>&-
}

case "${1:-}" in
  "") say "usage: scripts/openapi-lint.sh install | installed | FILE [redocly lint args]"; exit 2 ;;
  install) if installed; then say "already installed ($("$bin" --version))"; else install; say "installed"; fi ;;
  installed) installed ;;
  *)
    [ -f "$1" ] || { say "no such file: $1"; exit 2; }
    installed || install
    # no telemetry, no update check: the linter talks to no one
    REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
      exec "$bin" lint --config "$dir/redocly.yaml" "$@"
    ;;
esac
