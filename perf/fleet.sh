#!/usr/bin/env bash
# perf/fleet.sh: a fleet of shardline edges behind HAProxy, each edge in its own network
# namespace with identical content (copied with `cp -a`: other inodes, same mtimes), HAProxy
# (config/haproxy.cfg, only the addresses replaced) in another, the clients in another.
# Checks and reports in perf/FLEET.md:
#   1. downloads through HAProxy verify byte for byte;
#   2. the same URL always lands on the same edge;
#   3. the fraction of N URLs that move when a 4th edge is added (consistent hashing: ~1/4);
#   4. SIGTERM on an edge during 50 downloads: none refused, the time from SIGTERM to "out of
#      rotation" in HAProxy, every client resumes (Range + If-Range -> 206) on another edge,
#      every byte verifies;
#   5. a restart of one edge under load (new process joins the address, the old one drains):
#      0 refused connections, 0 downloads cut;
#   6. SIGHUP reloads of every edge under load: 0 failed requests.
# Exit status 0 only when every check passed (tests/fleet.rs runs `--quick`).
#
# Usage: sudo perf/fleet.sh [--quick] [--bin PATH] [--report FILE]
#   --quick   smaller files, fewer URLs and clients (the integration test; ~30 s)
#   --bin     the shardline binary (default: cargo build --release)
#   --report  where the report goes (default perf/FLEET.md)
# Needs root (namespaces, veths); installs haproxy and curl with apt-get when missing.
# Creates only namespaces named fl-*, their veths and a work directory in /dev/shm, and
# removes them on exit, also on failure or Ctrl-C.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
# shellcheck source=perf/lib.sh
source "$HERE/lib.sh"

QUICK=0
BIN=""
REPORT="$HERE/FLEET.md"
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --bin) BIN=$2; shift ;;
    --report) REPORT=$2; shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done

if ((QUICK)); then
  BIG_MIB=96 MID_MIB=2 URLS=200 CLIENTS=12 RATE=2M LOAD_SECS=4 DRAIN_TIMEOUT_MS=2000
else
  BIG_MIB=64 MID_MIB=8 URLS=1000 CLIENTS=50 RATE=2M LOAD_SECS=12 DRAIN_TIMEOUT_MS=4000
fi
DRAIN_ACCEPT_MS=3000
# The production default ("auto": SEND_ZC on a non-loopback listener such as these veths);
# FLEET_ZEROCOPY=off compares with plain sends.
ZEROCOPY=${FLEET_ZEROCOPY:-auto}
LB=10.213.100.1
# Every namespace and veth name starts with this (tests/fleet.rs uses its own, so a test run
# and a full run never collide).
P=${FLEET_PREFIX:-fl-}
[[ $P =~ ^fl-[a-z0-9-]{0,4}$ ]] || die "FLEET_PREFIX must be fl- plus up to 4 of [a-z0-9-]"
NS_LB=${P}lb
NS_CL=${P}cl

[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces and veth pairs)"
ip netns list >/dev/null 2>&1 || die "ip netns is not available here"
need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v curl >/dev/null || need+=(curl)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" \
    >/dev/null || die "apt-get install ${need[*]} failed"
fi
if [[ -z $BIN ]]; then
  log "building shardline (release)"
  (cd "$REPO" && cargo build --release -q) || die "cargo build failed"
  BIN=$REPO/target/release/shardline
fi
[[ -x $BIN ]] || die "$BIN is not executable"

WORK=$(mktemp -d /dev/shm/fl-XXXXXX)
PIDS=()
cleanup() {
  local p ns n
  [[ -n ${FLEET_KEEP:-} ]] && log "keeping $WORK (FLEET_KEEP)" && cp -r "$WORK" /tmp/fl-kept
  # Two SIGTERMs: the second skips an edge's lame-duck window (drain_accept_ms).
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for ((n = 0; n < 40; n++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  for ns in $NS_LB $NS_CL ${P}e1 ${P}e2 ${P}e3 ${P}e4; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

FAILS=0
ROWS=()
# check NAME OK(0/1) DETAIL: one report row; any failure makes the exit status 1.
check() {
  local verdict=pass
  if [[ $2 -ne 1 ]]; then verdict=FAIL; FAILS=$((FAILS + 1)); fi
  ROWS+=("| $1 | $verdict | $3 |")
  log "$verdict: $1: $3"
}

# ---- network: lb <-> each edge on its own /24, lb <-> clients -----------------------------
for ns in $NS_LB $NS_CL ${P}e1 ${P}e2 ${P}e3 ${P}e4; do
  ip netns del "$ns" 2>/dev/null # a run killed with -9 leaves them behind
  ip netns add "$ns" || die "ip netns add $ns"
  ip -n "$ns" link set lo up
done
link() { # link NS_A DEV_A ADDR_A NS_B DEV_B ADDR_B
  ip link add "$2" type veth peer name "$5" || die "veth $2"
  ip link set "$2" netns "$1" && ip link set "$5" netns "$4" || die "moving veth $2"
  ip -n "$1" addr add "$3/24" dev "$2" && ip -n "$4" addr add "$6/24" dev "$5"
  ip -n "$1" link set "$2" up && ip -n "$4" link set "$5" up
}
for i in 1 2 3 4; do
  link $NS_LB "${P}lb$i" "10.213.$i.1" "${P}e$i" "${P}e$i" "10.213.$i.2"
  # A closing listener's queued connections move to another socket of its group (restart).
  ip netns exec "${P}e$i" sysctl -qw net.ipv4.tcp_migrate_req=1 2>/dev/null
done
link $NS_LB "${P}lbc" "$LB" $NS_CL "${P}cl0" 10.213.100.2

# ---- content: built once, copied with its mtimes to every edge ---------------------------
log "content: big ${BIG_MIB} MiB, mid ${MID_MIB} MiB, $URLS small files"
C1=$WORK/content-1
mkdir -p "$C1/u"
head -c $((BIG_MIB << 20)) /dev/urandom >"$C1/big.bin"
head -c $((MID_MIB << 20)) /dev/urandom >"$C1/mid.bin"
for ((u = 0; u < URLS; u++)); do printf 'file %d\n' "$u" >"$C1/u/$u"; done
for i in 2 3 4; do cp -a "$C1" "$WORK/content-$i"; done
BIG_BYTES=$((BIG_MIB << 20))
MID_BYTES=$((MID_MIB << 20))

# ---- edges ---------------------------------------------------------------------------------
EDGE_PID=()
for i in 1 2 3 4; do
  cat >"$WORK/edge$i.toml" <<EOF
root = "$WORK/content-$i"
listen = "10.213.$i.2:8080"
shards = 1
admin = ""
arena_bytes = 16777216
drain_accept_ms = $DRAIN_ACCEPT_MS
drain_timeout_ms = $DRAIN_TIMEOUT_MS
zerocopy = "$ZEROCOPY"
EOF
done
# start_edge I TAG: starts edge I's process, waits for its serving line; its pid goes to
# STARTED_PID (not printed: a $(...) subshell would lose it from PIDS and from `wait`).
STARTED_PID=""
start_edge() {
  local i=$1 tag=$2 out=$WORK/edge$1.$2.out n
  ip netns exec "${P}e$i" "$BIN" serve --config "$WORK/edge$i.toml" \
    >"$out" 2>"$WORK/edge$i.$tag.log" &
  local pid=$!
  PIDS+=("$pid")
  for ((n = 0; n < 200; n++)); do
    grep -q "serving" "$out" 2>/dev/null && { STARTED_PID=$pid; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  cat "$WORK/edge$i.$tag.log" >&2
  die "edge $i ($tag) did not start"
}
for i in 1 2 3; do start_edge "$i" first; EDGE_PID[i]=$STARTED_PID; done

# ---- haproxy: config/haproxy.cfg with this network's addresses ----------------------------
HA_PID=""
# config/haproxy.cfg's maxconn 100000 needs ~200k descriptors (LimitNOFILE on a real host);
# here as many as the hard RLIMIT_NOFILE allows.
HA_MAXCONN=$(( $(ulimit -Hn) / 2 - 100 ))
ulimit -n "$(ulimit -Hn)"
# start_haproxy N: HAProxy with edges 1..N; waits until all are UP.
start_haproxy() {
  local n=$1 i
  sed -e '/^    server edge/d' -e "s|^    bind :80|    bind $LB:80|" \
    -e 's|^    log /dev/log local0 info|    log stdout format raw local0 info|' \
    -e "s|^    maxconn 100000|    maxconn $HA_MAXCONN|" \
    "$REPO/config/haproxy.cfg" >"$WORK/haproxy.cfg"
  for ((i = 1; i <= n; i++)); do
    printf '    server edge%d 10.213.%d.2:8080\n' "$i" "$i" >>"$WORK/haproxy.cfg"
  done
  printf '\nlisten stats\n    bind %s:8404\n    stats enable\n    stats uri /stats\n' "$LB" \
    >>"$WORK/haproxy.cfg"
  if [[ -n $HA_PID ]]; then kill "$HA_PID" 2>/dev/null; wait "$HA_PID" 2>/dev/null; fi
  ip netns exec $NS_LB haproxy -db -f "$WORK/haproxy.cfg" >>"$WORK/haproxy.log" 2>&1 &
  HA_PID=$!
  PIDS+=("$HA_PID")
  wait_up "$n" 200 || die "HAProxy did not see $n edges UP: $(cat "$WORK/haproxy.log")"
}
# edge_status I: HAProxy's state of edge I (UP, DOWN, "UP 1/2", ...).
edge_status() {
  ip netns exec $NS_CL curl -s --max-time 2 "http://$LB:8404/stats;csv" |
    awk -F, -v s="edge$1" '$1 == "edges" && $2 == s { print $18 }'
}
# ha_errors: "connect-errors retries redispatches" of the backend, from HAProxy's stats; an edge
# that refused or reset a connection shows here even when a retry hid it from the client.
ha_errors() {
  ip netns exec $NS_CL curl -s --max-time 2 "http://$LB:8404/stats;csv" |
    awk -F, '$1 == "edges" && $2 == "BACKEND" { print $14 + 0, $16 + 0, $17 + 0 }'
}
# ha_delta BEFORE: the change in ha_errors since BEFORE, as "a/b/c".
ha_delta() {
  local b a
  read -ra b <<<"$1"
  read -ra a <<<"$(ha_errors)"
  echo "$((a[0] - b[0]))/$((a[1] - b[1]))/$((a[2] - b[2]))"
}
# wait_up N TRIES: until edges 1..N are all UP (50 ms per try).
wait_up() {
  local n=$1 t i ok
  for ((t = 0; t < $2; t++)); do
    ok=1
    for ((i = 1; i <= n; i++)); do [[ $(edge_status "$i") == UP ]] || ok=0; done
    ((ok)) && return 0
    sleep 0.05
  done
  return 1
}
start_haproxy 3

cl() { ip netns exec $NS_CL "$@"; }
URL=http://$LB

# ---- 1. byte-verified downloads ------------------------------------------------------------
ok=1
detail=""
for f in big.bin mid.bin u/0 u/1 u/2; do
  got=$(cl curl -s -o "$WORK/dl" -w '%{http_code} %{size_download}' "$URL/$f")
  rc=$?
  if ((rc != 0)) || ! cmp -s "$WORK/dl" "$C1/$f"; then
    ok=0
    detail+="$f differs (curl exit $rc, status and bytes $got, $(cmp "$WORK/dl" "$C1/$f" 2>&1 | head -1)); "
  fi
done
check "downloads through HAProxy verify byte for byte" $ok "${detail:-big.bin (${BIG_MIB} MiB), mid.bin, 3 small files identical}"

# ---- 2. stickiness -------------------------------------------------------------------------
# map_urls FILE: "url edge" per small file, over one keep-alive connection.
map_urls() {
  local u
  for ((u = 0; u < URLS; u++)); do printf 'url = "%s/u/%d"\noutput = "/dev/null"\n' "$URL" "$u"; done \
    >"$WORK/urls.cfg"
  cl curl -s -K "$WORK/urls.cfg" -w '%{url} %header{x-served-by}\n' >"$1"
}
map_urls "$WORK/map-a"
map_urls "$WORK/map-b"
same=$(paste -d' ' "$WORK/map-a" "$WORK/map-b" | awk '$1 == $3 && $2 == $4 && $2 != "" { n++ } END { print n + 0 }')
spread=$(awk '{ c[$2]++ } END { for (e in c) printf "%s=%d ", e, c[e] }' "$WORK/map-a")
check "same URL -> same edge" $((same == URLS)) "$same of $URLS URLs on the same edge twice; spread: $spread"

# ---- 3. a 4th edge -------------------------------------------------------------------------
start_edge 4 first
EDGE_PID[4]=$STARTED_PID
start_haproxy 4
map_urls "$WORK/map-4"
moved=$(paste -d' ' "$WORK/map-a" "$WORK/map-4" | awk '$2 != $4 { n++ } END { print n + 0 }')
moved_elsewhere=$(paste -d' ' "$WORK/map-a" "$WORK/map-4" | awk '$2 != $4 && $4 != "edge4" { n++ } END { print n + 0 }')
fraction=$(awk -v m="$moved" -v n="$URLS" 'BEGIN { printf "%.3f", m / n }')
# About 1/4 move, and only to the new edge; HAProxy's ring has a few points per server, so
# allow 0.12..0.40.
frac_ok=$(awk -v f="$fraction" 'BEGIN { print (f >= 0.12 && f <= 0.40) ? 1 : 0 }')
check "URLs moved when a 4th edge is added" $((frac_ok && moved_elsewhere == 0)) \
  "$moved of $URLS moved (fraction $fraction, ideal 0.250); $moved_elsewhere moved between old edges"

# ---- 4. SIGTERM during downloads, resume elsewhere -----------------------------------------
victim=$(cl curl -s -o /dev/null -r 0-0 -w '%header{x-served-by}' "$URL/big.bin")
vi=${victim#edge}
log "SIGTERM on $victim during $CLIENTS downloads of big.bin at $RATE/s each"
# client K: download at RATE until cut, then resume with Range + If-Range without a limit.
client() {
  local k=$1 d=$WORK/c$1 rc1 size etag s1 st2 s2 verify=bad
  mkdir -p "$d"
  cl curl -s --limit-rate "$RATE" -D "$d/h1" -o "$d/part" "$URL/big.bin"
  rc1=$?
  size=$(stat -c %s "$d/part" 2>/dev/null || echo 0)
  etag=$(awk 'tolower($1) == "etag:" { print $2 }' "$d/h1" | tr -d '\r')
  s1=$(awk 'tolower($1) == "x-served-by:" { print $2 }' "$d/h1" | tr -d '\r')
  st2=- s2=-
  if ((size < BIG_BYTES)); then
    cl curl -s -D "$d/h2" -H "If-Range: $etag" -r "$size-" -o "$d/rest" "$URL/big.bin"
    st2=$(awk 'NR == 1 { print $2 }' "$d/h2")
    s2=$(awk 'tolower($1) == "x-served-by:" { print $2 }' "$d/h2" | tr -d '\r')
    cat "$d/part" "$d/rest" >"$d/all"
  else
    mv "$d/part" "$d/all"
  fi
  cmp -s "$d/all" "$C1/big.bin" && verify=ok
  echo "$k $rc1 $size $s1 $st2 $s2 $verify" >"$d/result"
  rm -f "$d/all" "$d/part" "$d/rest"
}
ha_before=$(ha_errors)
CLIENT_PIDS=()
for ((k = 0; k < CLIENTS; k++)); do client "$k" & CLIENT_PIDS+=($!); done
sleep 1.5
t0=$(date +%s%N)
kill -TERM "${EDGE_PID[vi]}"
out_ms=-1
for ((t = 0; t < 400; t++)); do
  st=$(edge_status "$vi")
  if [[ $st == DOWN* || $st == MAINT* ]]; then out_ms=$((($(date +%s%N) - t0) / 1000000)); break; fi
  sleep 0.02
done
wait "${CLIENT_PIDS[@]}"
ha4=$(ha_delta "$ha_before")
cat "$WORK"/c*/result >"$WORK/sigterm-results" 2>/dev/null
results=$(wc -l <"$WORK/sigterm-results")
cut=$(awk '$3 < '"$BIG_BYTES"' { n++ } END { print n + 0 }' "$WORK/sigterm-results")
first_on_victim=$(awk -v v="$victim" '$4 == v { n++ } END { print n + 0 }' "$WORK/sigterm-results")
resumed_206=$(awk -v v="$victim" '$3 < '"$BIG_BYTES"' && $5 == 206 && $6 != v && $6 != "" { n++ } END { print n + 0 }' "$WORK/sigterm-results")
verified=$(awk '$7 == "ok" { n++ } END { print n + 0 }' "$WORK/sigterm-results")
refused=$(awk '$3 == 0 || ($5 != "-" && $5 != 206) { n++ } END { print n + 0 }' "$WORK/sigterm-results")
check "SIGTERM during $CLIENTS downloads: none refused" $((results == CLIENTS && refused == 0 && first_on_victim == CLIENTS)) \
  "$results clients, all started on $victim: $first_on_victim; refused or failed: $refused; HAProxy connect errors/retries/redispatches: $ha4"
check "SIGTERM: edge out of rotation" $((out_ms >= 0 && out_ms <= DRAIN_ACCEPT_MS)) \
  "HAProxy marked $victim DOWN ${out_ms} ms after SIGTERM (checks: inter 1s, fastinter 500ms, fall 2; drain_accept_ms $DRAIN_ACCEPT_MS)"
# Socket buffers along the path (client, HAProxy, edge: ~20 MiB) let a download finish before
# the cut now and then; what must hold is that every cut one resumed elsewhere.
check "SIGTERM: every cut download resumes with 206 on another edge" $((cut * 2 >= CLIENTS && resumed_206 == cut)) \
  "$cut of $CLIENTS cut at the drain deadline (drain_accept_ms $DRAIN_ACCEPT_MS + drain_timeout_ms $DRAIN_TIMEOUT_MS), $((CLIENTS - cut)) finished before it; $resumed_206 resumed with 206 elsewhere"
check "SIGTERM: every byte verifies" $((verified == CLIENTS)) "$verified of $CLIENTS reassembled files identical to the original"
wait "${EDGE_PID[vi]}" 2>/dev/null
start_edge "$vi" back
EDGE_PID[vi]=$STARTED_PID
wait_up 4 400 || die "$victim did not come back UP"

# ---- load for 5 and 6 ----------------------------------------------------------------------
# load_loop K SECS: mid.bin at 4x its size per second plus small files, until SECS pass; one
# line per request: "kind status bytes curl_rc".
load_loop() {
  local end=$((SECONDS + $2)) u
  while ((SECONDS < end)); do
    cl curl -s --limit-rate $((MID_BYTES * 2)) -o /dev/null -w "mid %{http_code} %{size_download} " "$URL/mid.bin"
    echo $?
    u=$((RANDOM % URLS))
    cl curl -s -o /dev/null -w "small %{http_code} %{size_download} " "$URL/u/$u"
    echo $?
  done >"$WORK/load.$1"
}
# load_summary: "requests failed cut" over the load logs.
load_summary() {
  cat "$WORK"/load.* | awk -v mid="$MID_BYTES" '
    { n++ }
    $2 != 200 || ($4 != 0 && $4 != 18) { failed++ }
    $1 == "mid" && $2 == 200 && $3 != mid { cut++ }
    END { print n + 0, failed + 0, cut + 0 }'
}
LOADERS=8

# ---- 5. restart under load -----------------------------------------------------------------
target=$(cl curl -s -o /dev/null -r 0-0 -w '%header{x-served-by}' "$URL/mid.bin")
ti=${target#edge}
rm -f "$WORK"/load.*
ha_before=$(ha_errors)
LOADER_PIDS=()
for ((k = 0; k < LOADERS; k++)); do load_loop "$k" "$LOAD_SECS" & LOADER_PIDS+=($!); done
sleep 1
old_pid=${EDGE_PID[ti]}
start_edge "$ti" restarted
new_pid=$STARTED_PID
sleep 0.3
kill -TERM "$old_pid"
t0=$SECONDS
while kill -0 "$old_pid" 2>/dev/null && ((SECONDS - t0 < 60)); do sleep 0.1; done
EDGE_PID[ti]=$new_pid
handover=$(grep -c "handover: new connections go to the successor" "$WORK/edge$ti.first.log" "$WORK/edge$ti.back.log" 2>/dev/null | awk -F: '{ s += $2 } END { print s + 0 }')
wait "${LOADER_PIDS[@]}"
ha5=$(ha_delta "$ha_before")
read -r n failed cutn <<<"$(load_summary)"
ok=$((failed == 0 && cutn == 0 && handover >= 1))
[[ $ha5 == 0/0/0 ]] || ok=0
check "restart of $target under load (new process, old draining)" $ok \
  "$n requests (8 loops of mid.bin + small files); $failed refused or failed; $cutn downloads cut; HAProxy connect errors/retries/redispatches: $ha5; old process handed over: $handover"

# ---- 6. SIGHUP under load ------------------------------------------------------------------
rm -f "$WORK"/load.*
ha_before=$(ha_errors)
LOADER_PIDS=()
for ((k = 0; k < LOADERS; k++)); do load_loop "$k" "$LOAD_SECS" & LOADER_PIDS+=($!); done
hups=0
for _ in 1 2 3; do
  sleep 1
  for i in 1 2 3 4; do kill -HUP "${EDGE_PID[i]}" && hups=$((hups + 1)); done
done
wait "${LOADER_PIDS[@]}"
read -r n failed cutn <<<"$(load_summary)"
reloaded=$(cat "$WORK"/edge*.log | grep -c "configuration reloaded")
ha6=$(ha_delta "$ha_before")
ok=$((failed == 0 && cutn == 0 && reloaded >= hups))
[[ $ha6 == 0/0/0 ]] || ok=0
check "SIGHUP of every edge under load" $ok \
  "$hups SIGHUPs ($reloaded reloads logged); $n requests, $failed failed, $cutn cut; HAProxy connect errors/retries/redispatches: $ha6"

# ---- report --------------------------------------------------------------------------------
{
  echo "# Fleet behind HAProxy (perf/fleet.sh$([[ $QUICK -eq 1 ]] && echo ' --quick'))"
  echo
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) CPUs, kernel $(uname -r), $(haproxy -v | head -1 | cut -d' ' -f1-3)."
  echo "Four edges (\`shardline serve --shards 1\`) in namespaces ${P}e1..${P}e4, HAProxy with"
  echo "config/haproxy.cfg (addresses replaced, a stats listener added) in ${P}lb, curl clients in"
  echo "${P}cl; veth links, no shaping. Content built once and copied with \`cp -a\` (other"
  echo "inodes, same mtimes). Edges: drain_accept_ms $DRAIN_ACCEPT_MS, drain_timeout_ms $DRAIN_TIMEOUT_MS,"
  echo "zerocopy \"$ZEROCOPY\", net.ipv4.tcp_migrate_req=1 in each edge namespace. Clients cut by"
  echo "the drain resume with \`curl -r N- -H 'If-Range: <ETag of the first response>'\`."
  echo
  echo "| check | result | figures |"
  echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "Failed checks: $FAILS."
  echo
  echo "This check found that after a partial SEND_ZC the next chunk overtook the rest of the"
  echo "current one (every body over a veth had wrong bytes with zerocopy \"auto\"); fixed in"
  echo "src/shard/mod.rs try_send (commit \"Fix SEND_ZC reordering\")."
} >"$REPORT"
log "report: $REPORT ($FAILS failed)"
((FAILS == 0))
