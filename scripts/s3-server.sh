#!/usr/bin/env bash
# A real S3 server for the tests: Ceph RADOS Gateway from Debian's own packages, as plain processes
# (one monitor, one memstore OSD, one radosgw; no manager, pool size 1), state under build/rgw/
# (or /var/lib/ffswarm-rgw/, below).
#   scripts/s3-server.sh start [--also ADDR]…   install when absent (root), bring it up, make the test
#                                 user; idempotent. --also: one more address of this host to listen on
#                                 (kept for later starts while the host has it); never 0.0.0.0
#   scripts/s3-server.sh stop     stop by pid file (rgw, osd, mon), state kept
#   scripts/s3-server.sh gateway-kill   SIGKILL radosgw alone (by pid file): the store stops answering,
#                                       the objects stay (monitor and OSD keep running); `start` brings
#                                       radosgw back and waits until it answers (fault tests, the soak)
#   scripts/s3-server.sh reset    stop and remove the state (the next start makes a fresh cluster)
#   scripts/s3-server.sh env      KEY=VALUE lines: endpoints and the test user's credentials
#   scripts/s3-server.sh install  only the packages (slow part; CI runs it beside the image builds)
# RGW listens on 127.0.0.1 (the controller and the unit tests) and, when the engine's docker_gwbridge
# exists, on its gateway address too: a runner on any swarm overlay network reaches the host there,
# as it reached moto's published port before, with no port open on the machine's other interfaces.
# A change of listen addresses, or a gateway stopped alone, restarts radosgw only, so the objects stay.
# The daemons run as the unprivileged `ceph` user when started by root.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${FFSWARM_RGW_STATE:-$PWD/build/rgw}
# The daemons run as `ceph`, which must walk to the state: a checkout under a folder others cannot
# enter (`mktemp -d` makes 0700 ones) keeps it in /var/lib/ffswarm-rgw/<hash of the checkout> instead.
walkable() { local d=$1; while [ "$d" != / ]; do (( 0$(stat -c %a "$d") & 1 )) || return 1; d=$(dirname "$d"); done; }
if [ -z "${FFSWARM_RGW_STATE:-}" ] && [ "$(id -u)" = 0 ] && ! walkable "$PWD"; then
  STATE=/var/lib/ffswarm-rgw/$(printf %s "$PWD" | sha256sum | cut -c1-12)
fi
PORT=${FFSWARM_RGW_PORT:-7480}
MON_PORT=${FFSWARM_RGW_MON_PORT:-3300}
FSID=6f2f7c1e-5e21-4c1a-9b3e-0ff5a2a11a01
ACCESS_KEY=FFSWARMTESTACCESSKEY
SECRET_KEY=ffswarm-test-secret-key-not-for-production
OTHER_ACCESS_KEY=FFSWARMOTHERACCESSKEY
OTHER_SECRET_KEY=ffswarm-other-secret-key-not-for-production
CONF=$STATE/ceph.conf
OSD_UUID=7d3c8e0a-3f7b-4d0e-9a55-0ff5a2a11a02
say() { printf 's3-server: %s\n' "$*" >&2; }

gateway() { ip -4 -o addr show docker_gwbridge 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4; exit}'; }
host_has() { ip -4 -o addr show 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4}' | grep -qxF "$1"; }
extras() {  # the --also addresses of earlier starts that this host still has
  local a
  [ -s "$STATE/also" ] || return 0
  while read -r a; do [ -n "$a" ] && host_has "$a" && echo "$a"; done <"$STATE/also"
}
endpoints() {
  local gw a out
  gw=$(gateway)
  out="127.0.0.1:$PORT${gw:+ $gw:$PORT}"
  for a in $(extras); do case " $out " in *" $a:$PORT "*) ;; *) out+=" $a:$PORT" ;; esac; done
  echo "$out"
}
alive() { [ -s "$STATE/run/$1.pid" ] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }
answers() { curl -s -o /dev/null -m 2 "http://127.0.0.1:$PORT/"; }
ceph_() { ceph -c "$CONF" --connect-timeout 15 "$@"; }

install() {
  command -v radosgw >/dev/null && command -v ceph-osd >/dev/null && command -v ceph-mon >/dev/null && return
  say "installing ceph-mon ceph-osd radosgw (Debian's packages, ~60 s)"
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
    ceph-mon ceph-osd radosgw curl >/dev/null
}

write_conf() {
  local eps="" e
  for e in $(endpoints); do eps+=" endpoint=$e"; done
  cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
osd objectstore = memstore
memstore device bytes = 4294967296
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 1
auth allow insecure global id reclaim = false
run dir = $STATE/run
pid file = $STATE/run/\$name.pid
admin socket = $STATE/run/\$name.asok
log file = $STATE/log/\$name.log
log to stderr = false
[mon.a]
mon data = $STATE/mon
[osd.0]
osd data = $STATE/osd
[client.rgw.a]
rgw frontends = beast$eps
rgw data = $STATE/rgw
rgw enable usage log = false
rgw init timeout = 60
EOF
  echo "$(endpoints)" >"$STATE/endpoints"
}

as_ceph=()
[ "$(id -u)" = 0 ] && as_ceph=(--setuser ceph --setgroup ceph)

start() {
  install
  mkdir -p "$STATE"
  exec 9>"$STATE/lock"
  flock 9  # a second start waits for the first, then finds it up
  if alive client.rgw.a && [ "$(cat "$STATE/endpoints" 2>/dev/null)" = "$(endpoints)" ] && answers; then
    ensure_users; say "already running on $(endpoints)"; return
  fi
  if alive mon.a && alive osd.0 && [ -s "$CONF" ]; then  # the objects are there: only radosgw (re)starts
    stop_gateway
    write_conf
    radosgw -c "$CONF" -n client.rgw.a "${as_ceph[@]}" 9>&-
    wait_answers
    ensure_users
    say "radosgw up again on $(endpoints)"
    return
  fi
  # memstore keeps objects in RAM only: a cluster that is not wholly up is made afresh (~15 s).
  stop
  local port
  for port in "$PORT" "$MON_PORT"; do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
      say "port $port is taken by another process (another checkout's RGW? its scripts/s3-server.sh stop)"; exit 1
    fi
  done
  find "$STATE" -mindepth 1 -maxdepth 1 ! -name lock ! -name also -exec rm -rf {} +
  mkdir -p "$STATE"/{run,log,mon,osd,rgw}
  write_conf
  [ "$(id -u)" = 0 ] && chown -R ceph:ceph "$STATE"
  say "new cluster in $STATE"
  monmaptool --create --clobber --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$STATE/monmap" >/dev/null
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$STATE/monmap" "${as_ceph[@]}"
  ceph-mon -c "$CONF" -i a "${as_ceph[@]}" 9>&-  # the daemons must not hold the lock
  ceph_ osd create "$OSD_UUID" 0 >/dev/null
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$OSD_UUID" "${as_ceph[@]}" 2>>"$STATE/log/mkfs.log"
  ceph-osd -c "$CONF" -i 0 "${as_ceph[@]}" 9>&- 2>>"$STATE/log/start.log"
  radosgw -c "$CONF" -n client.rgw.a "${as_ceph[@]}" 9>&-
  wait_answers
  ensure_users
  say "up on $(endpoints)"
}

wait_answers() {
  for _ in $(seq 1 120); do answers && return; sleep 0.5; done
  say "radosgw did not answer on 127.0.0.1:$PORT; see $STATE/log"; exit 1
}

also() {  # remember ADDR (an IPv4 address of this host, never 0.0.0.0) for this and later starts
  local a=$1
  if ! [[ $a =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || [ "$a" = 0.0.0.0 ]; then
    say "--also $a: give one IPv4 address of this host (never 0.0.0.0: the test keys would reach the network)"; exit 2
  fi
  host_has "$a" || { say "--also $a: no interface of this host has that address"; exit 2; }
  mkdir -p "$STATE"
  grep -qxF "$a" "$STATE/also" 2>/dev/null || echo "$a" >>"$STATE/also"
}

ensure_users() {
  # The test user, and a second one owning a bucket the first may not use.
  local uid key secret
  for uid in ffswarm-test ffswarm-other; do
    if [ $uid = ffswarm-test ]; then key=$ACCESS_KEY secret=$SECRET_KEY; else key=$OTHER_ACCESS_KEY secret=$OTHER_SECRET_KEY; fi
    radosgw-admin -c "$CONF" user info --uid $uid >/dev/null 2>&1 || radosgw-admin -c "$CONF" user create \
      --uid $uid --display-name "ffswarm tests" --access-key "$key" --secret "$secret" >/dev/null
  done
}

wait_gone() {
  local pid; pid=$(cat "$STATE/run/$1.pid" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

stop_gateway() {
  if alive client.rgw.a; then kill "$(cat "$STATE/run/client.rgw.a.pid")"; wait_gone client.rgw.a; say "stopped client.rgw.a"; fi
}

stop() {
  local name
  for name in client.rgw.a osd.0 mon.a; do
    if alive $name; then kill "$(cat "$STATE/run/$name.pid")"; wait_gone $name; say "stopped $name"; fi
  done
}

gateway_kill() {
  if alive client.rgw.a; then kill -KILL "$(cat "$STATE/run/client.rgw.a.pid")"; wait_gone client.rgw.a; say "killed radosgw"; fi
}

env_() {
  local gw; gw=$(gateway)
  [ -n "$gw" ] && grep -qw "$gw:$PORT" "$STATE/endpoints" 2>/dev/null && gw="$gw:$PORT" || gw=""
  echo "FFSWARM_S3_ENDPOINT=http://127.0.0.1:$PORT"
  echo "FFSWARM_S3_SWARM_ENDPOINT=http://${gw:-127.0.0.1:$PORT}"
  echo "FFSWARM_S3_ACCESS_KEY=$ACCESS_KEY"
  echo "FFSWARM_S3_SECRET_KEY=$SECRET_KEY"
  echo "FFSWARM_S3_OTHER_ACCESS_KEY=$OTHER_ACCESS_KEY"
  echo "FFSWARM_S3_OTHER_SECRET_KEY=$OTHER_SECRET_KEY"
}

cmd=${1:-}
shift || true
if [ "$cmd" = start ]; then
  while [ $# -gt 0 ]; do
    case "$1" in
      --also) [ $# -ge 2 ] || { say "--also needs an address"; exit 2; }; also "$2"; shift 2 ;;
      *) say "start: unknown option $1"; exit 2 ;;
    esac
  done
elif [ $# -gt 0 ]; then
  say "$cmd takes no options"; exit 2
fi
case "$cmd" in
  start) start ;;
  stop) stop ;;
  gateway-kill) gateway_kill ;;
  reset) stop; rm -rf "${STATE:?}" ;;
  env) env_ ;;
  install) install ;;
  *) echo "usage: $0 start [--also ADDR]…|stop|gateway-kill|reset|env|install" >&2; exit 2 ;;
esac
