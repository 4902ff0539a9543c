#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2016,SC2059 # cleanup runs from a trap; bash -c bodies; row formats
# perf/link.sh: shardline (zerocopy on and off) against the nginx anchor on a shaped link.
#
#   perf/link.sh [--quick] [--rate RATE] [--disk ram|repo] [--sysctl default|seed|both]
#                [--duration-s N] [--big-conns N] [--workloads LIST] [--out FILE] [--nice N]
#                [--tls] [--dry-run] [--check-cleanup]
#
# The server runs in network namespace pl-srv-PID pinned to CPU 0, the clients in pl-cli-PID
# pinned to CPU 1, joined by a veth pair whose server side is shaped with
# `tbf rate RATE burst 256kb latency 1ms` (default 10gbit). The fixtures sit on an ext4 file
# system on a loop device backed by /dev/shm (--disk ram, default) or in perf/out/link-root on
# the repository's disk (--disk repo). Every workload runs against a fresh shardline with
# zerocopy = "on", one with "off", and nginx (perf/nginx.conf), one after the other, under each
# sysctl profile: "default" (fresh namespaces) and "seed" (scripts/tune-host.sh --apply inside
# the server namespace); --sysctl picks one, both by default.
# Workloads (--workloads, comma-separated, default all): fast (100 unpaced clients), paced
# (1000 clients paced to 1.2x the link together), big (--big-conns paced clients, default
# 10000), stall (20 fresh clients fetch 5m.bin and a 100 MiB range while N clients stall or
# read 1 byte/s, N = 64 and 1000, and with none). During fast/paced/big: 1 KiB probes at 50/s
# on fresh connections and one unaligned ranged GET, verified.
# --tls: every cell over HTTPS (issue 18): shardline serves --tls-listen with zerocopy on and
# off, nginx its TLS server from perf/nginx.conf, both with the same ECDSA P-256 certificate
# (perf/lib.sh tls_test_cert), and every client is loadgen with --tls 1 (rustls, TLS 1.3,
# X25519, tickets: fresh connections resume). The fast and paced workloads add a fourth column,
# shardline over cleartext HTTP in the same run, and a 4 s CPU profile of the server's core
# (perf record -g -e cpu-clock) for every column: the AEAD's and the copies' shares, and the
# share of the RAM disk's loop worker (its copy from /dev/shm is what an NVMe drive does by DMA,
# so the core's s/GiB is also given without it). Every load cell reports the disk bytes read
# per byte sent (/sys/class/block/DEV/stat of the fixtures' device over the measured window).
# Writes perf/LINK-HTTPS.md by default.
# --quick: harness check, small file, 2 s cells, N = 64 only, under 3 minutes after the builds;
# writes perf/out/link-quick.md. --dry-run prints the plan and touches nothing.
# --check-cleanup creates the namespaces, link, qdisc, ram disk and seed sysctls, starts a
# process in each namespace, then removes it all and checks that nothing is left (exit 0 =
# clean); it times nothing. Needs root (except --dry-run). Writes perf/LINK.md by default.
# Environment: SHARDLINE_BIN (default: cargo build --release), LINK_SERVER_CPU (0),
# LINK_CLIENT_CPU (1), LINK_SHARDLINE_CONFIG (extra TOML lines for shardline's config, e.g.
# 'notsent_lowat_bytes = 524288'; written into the report).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }
# Bad arguments: one clear line, exit 2 (nothing has been created yet).
usage_error() {
  echo "link.sh: $*" >&2
  echo "link.sh: see perf/link.sh --help" >&2
  exit 2
}
need_value() { (($2 >= 2)) || usage_error "$1 needs a value"; }

LINK_ARGS=("$@")
TLS=0 QUICK=0 RATE=10gbit DISK=ram SYSCTL=both DURATION_S='' BIG_CONNS='' WORKLOADS='' OUT='' NICE=0
MODE=run
while (($#)); do
  case $1 in
    --quick) QUICK=1; shift ;;
    --rate) need_value "$1" $#; RATE=$2; shift 2 ;;
    --disk) need_value "$1" $#; DISK=$2; shift 2 ;;
    --sysctl) need_value "$1" $#; SYSCTL=$2; shift 2 ;;
    --duration-s) need_value "$1" $#; DURATION_S=$2; shift 2 ;;
    --big-conns) need_value "$1" $#; BIG_CONNS=$2; shift 2 ;;
    --workloads) need_value "$1" $#; WORKLOADS=$2; shift 2 ;;
    --out) need_value "$1" $#; OUT=$2; shift 2 ;;
    --nice) need_value "$1" $#; NICE=$2; shift 2 ;;
    --tls) TLS=1; shift ;;
    --dry-run) MODE=dry; shift ;;
    --check-cleanup) MODE=cleanup; shift ;;
    -h | --help) usage 0 ;;
    *) usage_error "unknown argument '$1'" ;;
  esac
done

# shardline's egress cap, if LINK_SHARDLINE_CONFIG sets one (its goodput is also given against it).
EGRESS_CAP=$(sed -n 's/^[[:space:]]*egress_limit_bytes_per_s[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' <<<"${LINK_SHARDLINE_CONFIG:-}" | head -n 1)

# RATE as tc writes it: 10gbit, 2500mbit, 800kbit, 1gbps (bytes); RATE_BITS = bits per second.
if [[ $RATE =~ ^([0-9]+)(gbit|mbit|kbit|bit|gbps|mbps|kbps)$ ]]; then
  case ${BASH_REMATCH[2]} in
    gbit) RATE_BITS=$((BASH_REMATCH[1] * 1000000000)) ;;
    mbit) RATE_BITS=$((BASH_REMATCH[1] * 1000000)) ;;
    kbit) RATE_BITS=$((BASH_REMATCH[1] * 1000)) ;;
    bit) RATE_BITS=${BASH_REMATCH[1]} ;;
    gbps) RATE_BITS=$((BASH_REMATCH[1] * 8000000000)) ;;
    mbps) RATE_BITS=$((BASH_REMATCH[1] * 8000000)) ;;
    kbps) RATE_BITS=$((BASH_REMATCH[1] * 8000)) ;;
  esac
else
  usage_error "--rate wants a tc rate such as 10gbit, 2500mbit or 1gbps, not '$RATE'"
fi
((RATE_BITS >= 1000000)) || usage_error "--rate below 1mbit makes no sense here"
[[ $DISK == ram || $DISK == repo ]] || usage_error "--disk wants ram or repo, not '$DISK'"
case $SYSCTL in
  default) PROFILES=(default) ;;
  seed) PROFILES=(seed) ;;
  both) PROFILES=(default seed) ;;
  *) usage_error "--sysctl wants default, seed or both, not '$SYSCTL'" ;;
esac
[[ -z $DURATION_S || ($DURATION_S =~ ^[0-9]+$ && $DURATION_S -ge 2 && $DURATION_S -le 600) ]] ||
  usage_error "--duration-s wants an integer from 2 to 600, not '$DURATION_S'"
[[ -z $BIG_CONNS || ($BIG_CONNS =~ ^[0-9]+$ && $BIG_CONNS -ge 1 && $BIG_CONNS -le 60000) ]] ||
  usage_error "--big-conns wants an integer from 1 to 60000, not '$BIG_CONNS'"
[[ $NICE =~ ^-?[0-9]+$ && $NICE -ge -20 && $NICE -le 19 ]] || usage_error "--nice wants an integer from -20 to 19, not '$NICE'"
ALL_WORKLOADS=(fast paced big stall)
if [[ -z $WORKLOADS ]]; then
  WLIST=("${ALL_WORKLOADS[@]}")
else
  IFS=, read -r -a WLIST <<<"$WORKLOADS"
  for w in "${WLIST[@]}"; do
    [[ " ${ALL_WORKLOADS[*]} " == *" $w "* ]] || usage_error "--workloads: unknown workload '$w' (known: ${ALL_WORKLOADS[*]})"
  done
fi
[[ -z $OUT || -d $(dirname "$OUT") ]] || usage_error "--out: directory $(dirname "$OUT") does not exist"

# ------------------------------------------------------------------ plan
if ((QUICK)); then
  : "${DURATION_S:=2}" "${BIG_CONNS:=1000}"
  if ((TLS)); then : "${OUT:=$HERE/out/link-https-quick.md}"; else : "${OUT:=$HERE/out/link-quick.md}"; fi
  LARGE_MIB=256 WARMUP_S=0.5 BIG_WARMUP_S=1 PACED_CONNS=200 STALL_NS=(64)
  FETCH_RANGE_MIB=20 FETCH_TIMEOUT_S=5 SETTLE_S=1 PROFILE_S=0.8
else
  : "${DURATION_S:=12}" "${BIG_CONNS:=10000}"
  if ((TLS)); then : "${OUT:=$HERE/LINK-HTTPS.md}"; else : "${OUT:=$HERE/LINK.md}"; fi
  LARGE_MIB=1024 WARMUP_S=3 BIG_WARMUP_S=5 PACED_CONNS=1000 STALL_NS=(64 1000)
  FETCH_RANGE_MIB=100 FETCH_TIMEOUT_S=20 SETTLE_S=2 PROFILE_S=4
fi
FAST_CONNS=100
# PROFILE_S: the profiled stretch of the fast HTTPS cells (seconds, inside the measured window).
FETCH_CLIENTS=20
TTFB_RATE=50
# Paced clients together ask this much more than the link carries: slow home connections,
# and a link that is still the bottleneck.
PACE_OVERSUBSCRIPTION=1.2
# The verified unaligned ranged GET during the load workloads: small, because it gets only its
# share of a saturated link, and both ends off any block boundary.
PROBE_RANGE_START=1000 PROBE_RANGE_BYTES=$((4 * 1024 * 1024 + 3))
STALL_RCVBUF_BYTES=4096
# Memory guard: a cell stops early when MemAvailable falls below this (nginx holds up to
# output_buffers 4 x 512k per slow connection: 10 000 of them would want ~20 GiB).
MEM_FLOOR_KIB=$((4 * 1024 * 1024))
LARGE_BYTES=$((LARGE_MIB * 1024 * 1024)) FIVE_BYTES=$((5 * 1024 * 1024)) SMALL_BYTES=1024
LARGE_SEED=1 SMALL_SEED=2 FIVE_SEED=3
FETCH_RANGE_START=1000 FETCH_RANGE_BYTES=$((FETCH_RANGE_MIB * 1024 * 1024))
SERVER_CPU=${LINK_SERVER_CPU:-0} CLIENT_CPU=${LINK_CLIENT_CPU:-1}
VARIANTS=(on off ng)
declare -A VNAME=([on]='shardline zc=on' [off]='shardline zc=off' [ng]=nginx [cl]='shardline HTTP zc=on')
if ((TLS)); then
  # cl: shardline over cleartext in the same run, the reference for what TLS costs.
  VARIANTS=(on off ng cl)
  VNAME=([on]='shardline HTTPS zc=on' [off]='shardline HTTPS zc=off' [ng]='nginx HTTPS' [cl]='shardline HTTP zc=on')
fi
TAG=$$
NS_S=pl-srv-$TAG NS_C=pl-cli-$TAG VETH_S=pl-s$TAG VETH_C=pl-c$TAG
SRV_IP=10.231.0.1 CLI_IP=10.231.0.2 NET_PREFIX=30
SL_PORT=8080 NG_PORT=8081 SL_TLS_PORT=8443 NG_TLS_PORT=8444 ADMIN=127.0.0.1:9900
TLS_DIR=$HERE/out/link-tls
TBF=(tbf rate "$RATE" burst 256kb latency 1ms)
OUTDIR=$HERE/out RUN=$HERE/out/link
# --check-cleanup keeps out of a real run's outputs (and removes its own directory).
[[ $MODE == cleanup ]] && RUN=$OUTDIR/pl-check-$TAG
LOADGEN=$HERE/loadgen/target/release/loadgen
STOP_FILE=$RUN/.swarm-stop READY_FILE=$RUN/.swarm-ready
if [[ $DISK == ram ]]; then ROOT=$OUTDIR/pl-mnt-$TAG; else ROOT=$OUTDIR/link-root; fi
# ram disk: the three fixtures plus room for ext4's own metadata.
RAMDISK_BYTES=$((LARGE_BYTES + FIVE_BYTES + 256 * 1024 * 1024))
# The seed profile's keys: exactly those scripts/tune-host.sh writes.
mapfile -t SYSCTL_KEYS < <(sed -n 's/^  "\(net\.[a-z0-9_.]*\) .*/\1/p' "$REPO/scripts/tune-host.sh")

plan() {
  echo "link.sh plan ($([[ $QUICK == 1 ]] && echo quick || echo full)):"
  echo "  link: veth $VETH_S ($NS_S, $SRV_IP/$NET_PREFIX) <-> $VETH_C ($NS_C, $CLI_IP/$NET_PREFIX); tc qdisc add dev $VETH_S root ${TBF[*]}"
  echo "  disk: $DISK ($ROOT); large.bin $LARGE_MIB MiB, 5m.bin, small.bin"
  echo "  sysctl profiles: ${PROFILES[*]} (seed = scripts/tune-host.sh --apply in $NS_S: ${SYSCTL_KEYS[*]})"
  local v names=()
  for v in "${VARIANTS[@]}"; do names+=("${VNAME[$v]}"); done
  echo "  servers: $(IFS=,; echo "${names[*]}" | sed 's/,/, /g') on CPU $SERVER_CPU; clients on CPU $CLIENT_CPU; nice $NICE"
  ((TLS)) && echo "  HTTPS: certificate $TLS_DIR/cert.pem (ECDSA P-256), loadgen --tls 1; the cleartext column runs the fast and paced workloads only; fast and paced cells profile CPU $SERVER_CPU for $PROFILE_S s"
  echo "  workloads: ${WLIST[*]}; cells ${DURATION_S} s (warm-up $WARMUP_S s, big $BIG_WARMUP_S s);"
  echo "    fast $FAST_CONNS, paced $PACED_CONNS, big $BIG_CONNS connections; stall N = ${STALL_NS[*]}, $FETCH_CLIENTS fresh clients, timeout $FETCH_TIMEOUT_S s"
  echo "  report: $OUT; raw outputs: $RUN"
}
if [[ $MODE == dry ]]; then
  plan
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "link.sh: must run as root (network namespaces, tc, loop devices, sysctls); --dry-run works without" >&2; exit 2; }

# One run per host: the seed profile writes host-wide sysctls, and another run's snapshot taken
# meanwhile would "restore" them to the seed values.
LOCK_DIR=/run/lock
[[ -d $LOCK_DIR ]] || LOCK_DIR=/tmp
LOCK_FILE=$LOCK_DIR/pl-link.lock LOCKED=0
exec {LOCK_FD}>>"$LOCK_FILE" || { echo "link.sh: cannot open $LOCK_FILE" >&2; exit 2; }
if ! flock -n "$LOCK_FD"; then
  echo "link.sh: another perf/link.sh (or --check-cleanup) is running on this host ($LOCK_FILE is locked); runs must not overlap: the seed profile changes host-wide sysctls" >&2
  exit 2
fi
LOCKED=1

NOTES=() FAILURES=()
note() { NOTES+=("$*"); log "note: $*"; }
failure() { FAILURES+=("$*"); log "FAILURE: $*"; }

# ------------------------------------------------------------------ what we create, and cleanup
declare -A GROUPS_LIVE=()
CREATED_NS=()
declare -A SYSCTL_ROOT=()   # root-namespace values at start (restored if anything changed them)
LAST_PID=''

spawn_ns() { # spawn_ns NS CPU OUTFILE CMD...: background, in NS, pinned, own process group
  local ns=$1 cpu=$2 outfile=$3
  shift 3
  setsid ip netns exec "$ns" taskset -c "$cpu" nice -n "$NICE" "$@" >"$outfile" 2>&1 </dev/null &
  LAST_PID=$!
  GROUPS_LIVE[$LAST_PID]=1
}

reap() { # reap PID: wait for it; returns its exit status
  local rc=0
  wait "$1" || rc=$?
  unset "GROUPS_LIVE[$1]"
  return "$rc"
}

sysctl_file() { printf '/proc/sys/%s\n' "${1//.//}"; }
sysctl_read() { tr -s ' \t\n' '   ' <"$1" | sed 's/^ *//; s/ *$//'; }

snapshot_root_sysctls() {
  local k f
  for k in "${SYSCTL_KEYS[@]}"; do
    f=$(sysctl_file "$k")
    [[ -r $f ]] && SYSCTL_ROOT[$k]=$(sysctl_read "$f")
  done
  return 0
}

# restore_root_sysctls: writes back every root-namespace value that differs from the snapshot
# (on this kernel the seed keys are per namespace, so normally nothing; not so on every kernel).
# Prints what it restored or could not restore; returns 1 when one is still off.
restore_root_sysctls() {
  local k f now bad=0
  for k in "${!SYSCTL_ROOT[@]}"; do
    f=$(sysctl_file "$k")
    now=$(sysctl_read "$f" 2>/dev/null || true)
    [[ $now == "${SYSCTL_ROOT[$k]}" ]] && continue
    if printf '%s\n' "${SYSCTL_ROOT[$k]}" >"$f" 2>/dev/null; then
      log "restored $k = ${SYSCTL_ROOT[$k]} (was $now)"
    else
      log "could not restore $k to ${SYSCTL_ROOT[$k]} (is $now)"
      bad=1
    fi
  done
  return "$bad"
}

net_down() {
  local ns p
  for ns in "${CREATED_NS[@]}"; do
    # Anything still running inside a namespace we made is ours.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  CREATED_NS=()
  # Deleting the namespaces deletes the veth pair and its qdisc; this covers a half-made pair.
  ip link del "$VETH_S" 2>/dev/null || true
  ip link del "$VETH_C" 2>/dev/null || true
}

# leftovers: prints every object of this run that still exists; empty = clean.
leftovers() {
  ip netns list 2>/dev/null | awk -v a="$NS_S" -v b="$NS_C" '$1 == a || $1 == b { print "network namespace " $1 }'
  ip -o link show 2>/dev/null | awk -F': ' -v a="$VETH_S" -v b="$VETH_C" '{ sub(/@.*/, "", $2) } $2 == a || $2 == b { print "link " $2 }'
  losetup -j "/dev/shm/pl-disk-$TAG.img" -O NAME -n 2>/dev/null | sed 's/^/loop device /'
  [[ -e /dev/shm/pl-disk-$TAG.img ]] && echo "file /dev/shm/pl-disk-$TAG.img"
  findmnt -rno TARGET 2>/dev/null | grep -Fx "$OUTDIR/pl-mnt-$TAG" | sed 's/^/mount /'
  local k f now
  for k in "${!SYSCTL_ROOT[@]}"; do
    f=$(sysctl_file "$k")
    now=$(sysctl_read "$f" 2>/dev/null || true)
    [[ $now == "${SYSCTL_ROOT[$k]}" ]] || echo "sysctl $k = $now (was ${SYSCTL_ROOT[$k]})"
  done
  local pg
  for pg in "${!GROUPS_LIVE[@]}"; do
    pgrep -g "$pg" >/dev/null 2>&1 && echo "process group $pg"
  done
  return 0
}

cleanup() {
  local rc=$? pg left
  trap - EXIT INT TERM HUP
  set +e
  for pg in "${!GROUPS_LIVE[@]}"; do
    kill_group "$pg" 3
    wait "$pg" 2>/dev/null
    pgrep -g "$pg" >/dev/null 2>&1 || unset "GROUPS_LIVE[$pg]"
  done
  net_down
  ramdisk_destroy
  restore_root_sysctls
  rm -f "$STOP_FILE" "$READY_FILE"
  [[ $MODE == cleanup ]] && rm -rf "$RUN"
  if ((LOCKED)); then rm -f "$LOCK_FILE"; fi
  left=$(leftovers)
  if [[ -n $left ]]; then
    log "NOT CLEAN: left behind:"
    printf '  %s\n' "$left" >&2
    ((rc == 0)) && rc=1
  elif [[ $MODE == cleanup ]]; then
    log "clean: no namespace, link, qdisc, loop device, mount, process or sysctl change left"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------------ link and profiles
net_up() { # net_up PROFILE: fresh namespaces, veth, tbf; PROFILE's sysctls in the server's
  ip netns add "$NS_S" || die "ip netns add $NS_S failed"
  CREATED_NS+=("$NS_S")
  ip netns add "$NS_C" || die "ip netns add $NS_C failed"
  CREATED_NS+=("$NS_C")
  ip link add "$VETH_S" netns "$NS_S" type veth peer name "$VETH_C" netns "$NS_C" || die "cannot create the veth pair"
  ip -n "$NS_S" addr add "$SRV_IP/$NET_PREFIX" dev "$VETH_S"
  ip -n "$NS_C" addr add "$CLI_IP/$NET_PREFIX" dev "$VETH_C"
  ip -n "$NS_S" link set lo up
  ip -n "$NS_C" link set lo up
  ip -n "$NS_S" link set "$VETH_S" up
  ip -n "$NS_C" link set "$VETH_C" up
  tc -n "$NS_S" qdisc add dev "$VETH_S" root "${TBF[@]}" || die "tc qdisc add dev $VETH_S root ${TBF[*]} failed (this kernel needs sch_tbf)"
  if [[ $1 == seed ]]; then apply_seed; fi
  # The values in force for this profile, on both sides, for the report.
  local k f ns v
  for ns in "$NS_S" "$NS_C"; do
    for k in "${SYSCTL_KEYS[@]}"; do
      f=$(sysctl_file "$k")
      v=$(ip netns exec "$ns" sh -c "cat $f 2>/dev/null | tr -s ' \t' '  '" || true)
      # Not visible inside a namespace: a global key; the root namespace's value is in force.
      [[ -n $v ]] || v="$(sysctl_read "$f" 2>/dev/null || echo '?') (global)"
      printf '%s\t%s\t%s\n' "$ns" "$k" "$v"
    done
  done >"$RUN/sysctl-$1.tsv"
  log "link up ($1 sysctls): $NS_S/$VETH_S $SRV_IP <-> $NS_C/$VETH_C $CLI_IP, ${TBF[*]}"
}

# apply_seed: scripts/tune-host.sh --apply inside the server namespace. Keys that are global
# on this kernel (read-only or absent inside a namespace: net.core.wmem_max, rmem_max,
# netdev_max_backlog) get tune-host.sh's value in the root namespace instead; only raises of
# limits, and restore_root_sysctls puts them back when the profile ends. Per-namespace keys
# (tcp_notsent_lowat, ...) never touch the root namespace, where other work runs.
SEED_GLOBAL=()
apply_seed() {
  local out=$RUN/sysctl-seed-tune-host.txt k line cur want f
  ip netns exec "$NS_S" "$REPO/scripts/tune-host.sh" --apply >"$out" 2>&1 || true
  SEED_GLOBAL=()
  for k in "${SYSCTL_KEYS[@]}"; do
    grep -qE "^$k: (.*FAILED to write|not present)" "$out" && SEED_GLOBAL+=("$k")
  done
  ((${#SEED_GLOBAL[@]})) || return 0
  "$REPO/scripts/tune-host.sh" >"$RUN/sysctl-seed-root-dry-run.txt" 2>&1 || true
  for k in "${SEED_GLOBAL[@]}"; do
    line=$(grep -E "^$k: " "$RUN/sysctl-seed-root-dry-run.txt" | head -n 1)
    [[ $line == *' -> '* ]] || continue
    cur=${line#"$k: "} cur=${cur%% -> *} want=${line##* -> }
    f=$(sysctl_file "$k")
    if printf '%s\n' "$want" >"$f" 2>/dev/null; then
      log "seed: $k is global here: root namespace $cur -> $want (restored when the profile ends)"
      echo "$k: $cur -> $want (global key, written in the root namespace by link.sh)" >>"$out"
    else
      failure "seed: cannot write $k = $want in the root namespace"
    fi
  done
  if grep -E 'FAILED' "$out" | grep -vqE "^($(IFS='|'; echo "${SEED_GLOBAL[*]}")):"; then
    failure "scripts/tune-host.sh --apply in $NS_S reported a failure: $(grep FAILED "$out" | head -n 2 | tr '\n' ' ')"
  fi
}

# ------------------------------------------------------------------ tools
ensure_tools() {
  local missing=() p
  command -v nginx >/dev/null || missing+=(nginx)
  { command -v ip && command -v tc && command -v ss; } >/dev/null || missing+=(iproute2)
  { command -v losetup && command -v taskset && command -v setsid && command -v chrt && command -v findmnt; } >/dev/null ||
    missing+=(util-linux)
  command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
  command -v pgrep >/dev/null || missing+=(procps)
  command -v curl >/dev/null || missing+=(curl)
  if ((TLS)); then
    command -v openssl >/dev/null || missing+=(openssl)
    command -v perf >/dev/null || missing+=(linux-perf)
  fi
  ((${#missing[@]} == 0)) && return 0
  log "installing: ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || log "apt-get update failed; trying the cached lists"
  for p in "${missing[@]}"; do
    if [[ $p == nginx ]]; then
      apt-get install -y -qq nginx-light >&2 || apt-get install -y -qq nginx >&2 || die "cannot install nginx"
    else
      apt-get install -y -qq "$p" >&2 || die "cannot install $p"
    fi
  done
}

# ------------------------------------------------------------------ servers
declare -A V=()    # V[profile|workload|variant|key]
SRV_PG='' SRV_VARIANT=''

wait_ns_port() { # wait_ns_port PORT PID SECONDS: until $SRV_IP:PORT accepts from the client side
  local port=$1 pid=$2 secs=$3 i
  for ((i = 0; i < secs * 10; i++)); do
    ip netns exec "$NS_C" bash -c "exec 3<>/dev/tcp/$SRV_IP/$port" 2>/dev/null && return 0
    alive "$pid" || return 1
    sleep 0.1
  done
  return 1
}

start_server() { # start_server on|off|ng|cl TAG: sets SRV_PORT (the port clients use) and LG_TLS
  local v=$1 tag=$2 log=$RUN/$2-server.log port zc=$1 tls=() l
  SRV_VARIANT=$v LG_TLS=()
  # X25519 alone: nginx's OpenSSL may lack the ML-KEM hybrid that rustls would pick with shardline.
  if ((TLS)) && [[ $v != cl ]]; then LG_TLS=(--tls 1 --tls-version 13 --tls-group x25519); fi
  if [[ $v == ng ]]; then
    port=$NG_PORT
    if ((TLS)); then
      render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$ROOT" "$NG_PORT" "$SERVER_CPU" "$NG_TLS_PORT" "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem"
      port=$NG_TLS_PORT
    else
      render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$ROOT" "$port" "$SERVER_CPU"
    fi
    # Same anchor file; only the addresses differ: the server namespace's veth address.
    for l in $NG_PORT ${LG_TLS:+$NG_TLS_PORT}; do
      sed -i "s|listen 127.0.0.1:$l |listen $SRV_IP:$l |" "$RUN/nginx/nginx.conf"
      grep -q "listen $SRV_IP:$l " "$RUN/nginx/nginx.conf" || die "could not point perf/nginx.conf's listen line at $SRV_IP:$l"
    done
    : >"$RUN/nginx/error.log"
    spawn_ns "$NS_S" "$SERVER_CPU" "$log" nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf"
  else
    port=$SL_PORT
    [[ $v == cl ]] && zc=on
    if ((${#LG_TLS[@]})); then
      tls=(--tls-listen "$SRV_IP:$SL_TLS_PORT" --tls-cert "$TLS_DIR/cert.pem" --tls-key "$TLS_DIR/key.pem")
      port=$SL_TLS_PORT
    fi
    printf 'zerocopy = "%s"\n%s\n' "$zc" "${LINK_SHARDLINE_CONFIG:-}" >"$RUN/zerocopy-$zc.toml"
    spawn_ns "$NS_S" "$SERVER_CPU" "$log" "$SL_BIN" serve --config "$RUN/zerocopy-$zc.toml" --root "$ROOT" \
      --listen "$SRV_IP:$SL_PORT" "${tls[@]}" --admin "$ADMIN" --shards 1 --cpus "$SERVER_CPU"
  fi
  SRV_PG=$LAST_PID
  if ! wait_ns_port "$port" "$SRV_PG" 15; then
    tail -n 20 "$log" >&2 || true
    die "${VNAME[$v]} did not start listening on $SRV_IP:$port (log: $log)"
  fi
  SRV_PORT=$port
}

stop_server() { # stop_server TAG: SIGTERM, then the exit status (0 expected)
  local tag=$1 rc=0
  if ! alive "$SRV_PG"; then
    reap "$SRV_PG" || rc=$?
    failure "$tag: ${VNAME[$SRV_VARIANT]} had exited (status $rc) before the cell ended; log tail: $(tail -n 3 "$RUN/$tag-server.log" | sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' ')"
    return
  fi
  kill_group "$SRV_PG" 20 || failure "$tag: ${VNAME[$SRV_VARIANT]} did not exit within 20 s of SIGTERM; killed"
  reap "$SRV_PG" || rc=$?
  ((rc == 0)) || failure "$tag: ${VNAME[$SRV_VARIANT]} exited with status $rc on SIGTERM"
  if [[ $SRV_VARIANT == ng && -s $RUN/nginx/error.log ]]; then cp "$RUN/nginx/error.log" "$RUN/$tag-nginx-error.log"; fi
}

metrics_snap() { # metrics_snap FILE: shardline's /metrics from inside the server namespace
  [[ $SRV_VARIANT == ng ]] && return 0
  local i
  # The admin listener may come up a moment after the HTTP one.
  for i in 1 2 3 4 5; do
    ip netns exec "$NS_S" curl -sf --max-time 3 "http://$ADMIN/metrics" >"$1" 2>/dev/null && return 0
    sleep 0.2
  done
  rm -f "$1"
  note "could not read shardline's /metrics ($ADMIN in $NS_S) for $(basename "$1")"
  return 0
}

gauge() { # gauge FILE NAME: a gauge summed over the shards, from a /metrics snapshot
  [[ -s $1 ]] || return 0
  awk -v n="$2{shard=" 'index($1, n) == 1 { s += $2; seen = 1 } END { if (seen) print s }' "$1" 2>/dev/null || true
}

# metrics_per_gib BEFORE AFTER PREFIX: V[PREFIX|enters_gib] etc. from two snapshots.
metrics_per_gib() {
  local b=$1 a=$2 p=$3 out
  [[ -s $b && -s $a ]] || return 0
  out=$(metrics_delta "$b" "$a" | awk '
    { n = $1; sub(/\{.*/, "", n); d[n] += $2; if (index($1, "why=\"reclaim_unsent\"")) unsent += $2 }
    END {
      gib = d["shardline_bytes_sent_total"] / 1073741824
      if (gib <= 0) exit
      printf "enters_gib=%.0f sqes_gib=%.0f cqes_gib=%.0f arena_waits_gib=%.1f parked_gib=%.0f reclaimed_gib=%.0f given_back_mib_gib=%.1f unsent_mib_gib=%.1f\n",
        d["shardline_ring_enters_total"] / gib, d["shardline_ring_sqes_total"] / gib,
        d["shardline_ring_cqes_total"] / gib, d["shardline_arena_waits_total"] / gib,
        d["shardline_parked_sends_total"] / gib, d["shardline_reclaimed_chunks_total"] / gib,
        d["shardline_given_back_bytes_total"] / gib / 1048576, unsent / gib / 1048576
    }')
  local kv
  for kv in $out; do V["$p|${kv%%=*}"]=${kv#*=}; done
}

# watch_client PID PREFIX DEADLINE_S: waits for a client while sampling the server's RSS (peak
# into V[PREFIX|rss_mib]) and guarding host memory: below MEM_FLOOR_KIB available, the swarm is
# told to stop (stop file) and the cell is marked. A client still running DEADLINE_S after it
# started is told to stop, then killed 5 s later: a hung client fails its cell, not the run.
watch_client() {
  local pid=$1 p=$2 deadline=$(($3 * 4)) peak=0 r avail spid stopped=0 ticks=0
  spid=$(serving_pid "$SRV_PG")
  while alive "$pid"; do
    ticks=$((ticks + 1))
    if ((ticks == deadline)); then
      touch "$STOP_FILE"
      failure "$p: a client was still running after $3 s; told it to stop"
    elif ((ticks == deadline + 20)); then
      kill_group "$pid" 1 || true
      failure "$p: the client did not stop; killed it (its figures are missing)"
    fi
    r=$(awk '/^VmRSS:/ { print $2 }' "/proc/$spid/status" 2>/dev/null || true)
    [[ -n $r ]] && ((r > peak)) && peak=$r
    avail=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    if ((!stopped && avail < MEM_FLOOR_KIB)); then
      touch "$STOP_FILE"
      stopped=1
      note "$p: host memory fell to $((avail / 1024)) MiB available: the clients were stopped early (figures cover a shorter window)"
    fi
    sleep 0.25
  done
  V[$p|rss_mib]=$(calc "$peak / 1024")
}

# core_sample CPU DELAY_S WINDOW_S OUT: after DELAY_S, CPU's busy and total jiffies over WINDOW_S
# (every context: the server process, softirq, ksoftirqd, kworkers), as "busy total" in OUT.
# The server is alone on its CPU, so this is what its traffic costs the core wherever the
# kernel accounts it; the process's own CPU time misses softirq work run by ksoftirqd.
core_sample() {
  local cpu=$1 a b da db
  sleep "$2"
  a=$(awk -v c="cpu$cpu" '$1 == c { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  da=$(disk_read_bytes)
  sleep "$3"
  b=$(awk -v c="cpu$cpu" '$1 == c { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  db=$(disk_read_bytes)
  echo "$a $b" | awk '{ print $3 - $1, $4 - $2 }' >"$4"
  [[ -n $da && -n $db ]] && echo $((db - da)) >"$4.disk"
  return 0
}

# disk_read_bytes: bytes read so far from the block device that holds the fixtures ($ROOT),
# from /sys/block/DEV/stat (sectors of 512 bytes); empty when it cannot be found.
disk_read_bytes() {
  local src dev
  src=$(findmnt -n -o SOURCE --target "$ROOT" 2>/dev/null) || return 0
  dev=$(basename "$src")
  [[ -r /sys/class/block/$dev/stat ]] || return 0
  awk '{ printf "%.0f\n", $3 * 512 }' "/sys/class/block/$dev/stat"
}

# profile_shares DATA PREFIX OUT: the profile's top symbols into OUT, and into V the shares of
# the AEAD (AES-GCM, GHASH, ChaCha20-Poly1305), of byte copies (kernel copies to and from user
# memory, memcpy/memmove) and of the server's own code, in percent of the core's samples.
profile_shares() {
  local data=$1 p=$2 out=$3
  [[ -s $data ]] || return 0
  perf report -i "$data" --stdio --no-children --sort comm,dso,sym -q 2>/dev/null |
    awk 'NF && $1 ~ /%$/' >"$out.all" || true
  head -n 15 "$out.all" >"$out"
  local aead copy idle ramdisk
  # The RAM disk's own work: the loop device's worker copying from /dev/shm (what an NVMe
  # drive does by DMA, with no CPU), counted apart from the three shares below: samples whose
  # call chain passes through the loop driver (kworker names change with the last work item).
  ramdisk=$(perf script -i "$data" -F comm,ip,sym 2>/dev/null | awk '
    /^[^ \t]/ { n++; if (hit) r++; hit = 0; next }
    /loop_process_work|lo_rw_aio|loop_handle_cmd/ { hit = 1 }
    END { if (hit) r++; if (n) printf "%.1f\n", 100 * r / n; else print "" }')
  read -r aead copy idle < <(awk '
    { pct = $1; sub(/%/, "", pct); line = tolower($0) }
    line ~ /aes|gcm|ghash|gfmul|chacha|poly1305/ { aead += pct; next }
    line ~ /copy_user|copy_from_iter|copy_to_iter|memcpy|memmove|rep_movs|copy_page|_copy_/ { copy += pct; next }
    line ~ /swapper|cpuidle|poll_idle|intel_idle|acpi_idle|default_idle/ { idle += pct }
    END { printf "%.1f %.1f %.1f\n", aead, copy, idle }' "$out.all")
  V[$p|aead_pct]=$aead V[$p|copy_pct]=$copy V[$p|idle_pct]=$idle V[$p|ramdisk_pct]=$ramdisk
  rm -f "$out.all"
}

# ------------------------------------------------------------------ workloads
# Load cells (fast, paced, big): the swarm, the TTFB prober and one unaligned ranged GET.
cell_load() { # cell_load PROFILE WORKLOAD VARIANT
  local pr=$1 w=$2 v=$3 tag="$1-$2-$3" p="$1|$2|$3" conns rate=0 warm=$WARMUP_S
  local fs=$RUN/$tag-swarm.txt ft=$RUN/$tag-ttfb.txt fr=$RUN/$tag-range.txt psw pt prg ttfb_s i
  case $w in
    fast) conns=$FAST_CONNS ;;
    paced) conns=$PACED_CONNS ;;
    big) conns=$BIG_CONNS warm=$BIG_WARMUP_S ;;
  esac
  [[ $w == fast ]] || rate=$(awk -v r="$RATE_BITS" -v o="$PACE_OVERSUBSCRIPTION" -v n="$conns" 'BEGIN { printf "%.0f", r / 8 * o / n }')
  V[$p|conns]=$conns V[$p|rate]=$rate
  rm -f "$STOP_FILE"
  start_server "$v" "$tag"
  metrics_snap "$RUN/$tag-m0.txt"
  spawn_ns "$NS_C" "$CLIENT_CPU" "$fs" "$LOADGEN" swarm --addr "$SRV_IP:$SRV_PORT" "${LG_TLS[@]}" --path /large.bin \
    --conns "$conns" --duration-s "$((DURATION_S + ${warm%.*}))" --warmup-s "$warm" --rate-bytes-per-s "$rate" \
    --pgid "$SRV_PG" --expect-len "$LARGE_BYTES" --stop-file "$STOP_FILE"
  psw=$LAST_PID
  ttfb_s=$(calc "$DURATION_S - 0.7")
  # SCHED_FIFO: the prober measures the server's delay, not its wait behind the swarm on CPU 1.
  spawn_ns "$NS_C" "$CLIENT_CPU" "$ft" "${CHRT[@]}" "$LOADGEN" ttfb --addr "$SRV_IP:$SRV_PORT" "${LG_TLS[@]}" --path /small.bin \
    --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$(calc "$warm + 0.2")" --seed "$SMALL_SEED" --expect-len "$SMALL_BYTES"
  pt=$LAST_PID
  spawn_ns "$NS_C" "$CLIENT_CPU" "$fr" bash -c 'sleep "$1"; shift; exec "$@"' _ "$(calc "$warm + 0.5")" \
    "$LOADGEN" get --addr "$SRV_IP:$SRV_PORT" "${LG_TLS[@]}" --path /large.bin \
    --range "$PROBE_RANGE_START-$((PROBE_RANGE_START + PROBE_RANGE_BYTES - 1))" --seed "$LARGE_SEED"
  prg=$LAST_PID
  core_sample "$SERVER_CPU" "$warm" "$DURATION_S" "$RUN/$tag-core.txt" &
  local pcore=$! pprof=''
  if ((TLS)) && [[ $w == fast || $w == paced ]]; then
    # What the server's core spends its time on, for every context on it (softirq copies too).
    bash -c 'sleep "$1"; exec perf record -q -g -e cpu-clock -C "$2" -o "$3" -- sleep "$4"' _ \
      "$(calc "$warm + 1")" "$SERVER_CPU" "$RUN/$tag.perf.data" "$PROFILE_S" >"$RUN/$tag-perf.log" 2>&1 &
    pprof=$!
  fi
  watch_client "$psw" "$p" $((DURATION_S + ${warm%.*} + 60))
  reap "$psw" || failure "$tag: swarm exited non-zero ($(tail -n 1 "$fs"))"
  metrics_snap "$RUN/$tag-m1.txt"
  reap "$pt" || failure "$tag: ttfb prober exited non-zero ($(tail -n 1 "$ft"))"
  # The ranged GET had the whole cell; once the load is gone it needs a moment at most.
  i=0
  while ((i < 100)) && alive "$prg"; do sleep 0.1; i=$((i + 1)); done
  if alive "$prg"; then
    kill_group "$prg" 1 || true
    reap "$prg" || true
    V[$p|range]=unfinished
    note "$tag: the unaligned ranged GET did not finish within the cell + 10 s"
  elif reap "$prg"; then
    V[$p|range]="ok $(kv "$fr" mb_per_s) MB/s"
  else
    V[$p|range]=FAILED
    failure "$tag: unaligned ranged GET failed: $(kv "$fr" error)"
  fi
  wait "$pcore" 2>/dev/null || true
  if [[ -n $pprof ]]; then
    wait "$pprof" 2>/dev/null || note "$tag: perf record failed ($(tail -n 1 "$RUN/$tag-perf.log"))"
    profile_shares "$RUN/$tag.perf.data" "$p" "$RUN/$tag-profile.txt"
  fi
  stop_server "$tag"
  # Figures.
  local bps bytes cpu win ccpu core_busy core_total
  read -r core_busy core_total <"$RUN/$tag-core.txt" 2>/dev/null || true
  bps=$(kv "$fs" bytes_per_s) bytes=$(kv "$fs" window_bytes) cpu=$(kv "$fs" server_cpu_s)
  win=$(kv "$fs" window_s) ccpu=$(kv "$fs" client_cpu_s)
  if [[ -n $bps ]]; then
    V[$p|gbs]=$(calc "$bps / 1e9")
    V[$p|frac]=$(calc "$bps * 8 / $RATE_BITS")
    # Against shardline's egress cap, when LINK_SHARDLINE_CONFIG sets one (nginx has none).
    [[ -n $EGRESS_CAP && $v != ng ]] && V[$p|vs_cap]=$(calc "$bps / $EGRESS_CAP")
  fi
  if [[ -n $bytes && -n $cpu && $bytes != 0 ]]; then V[$p|cpu_gib]=$(calc "$cpu / ($bytes / 1073741824)"); fi
  if [[ -n $win && -n $cpu && $win != 0.000 ]]; then V[$p|cpu_pct]=$(calc "100 * $cpu / $win"); fi
  if [[ -n $win && -n $ccpu && $win != 0.000 ]]; then V[$p|client_pct]=$(calc "100 * $ccpu / $win"); fi
  if [[ -n ${core_total:-} && $core_total != 0 ]]; then
    V[$p|core_pct]=$(calc "100 * $core_busy / $core_total")
    [[ -n $bps && $bps != 0 ]] && V[$p|core_gib]=$(calc "$core_busy / $core_total / ($bps / 1073741824)")
  fi
  if [[ -n ${V[$p|core_gib]:-} && -n ${V[$p|ramdisk_pct]:-} ]]; then
    V[$p|core_gib_nodisk]=$(calc "${V[$p|core_gib]} * (1 - ${V[$p|ramdisk_pct]} / 100)")
  fi
  local disk_b
  read -r disk_b 2>/dev/null <"$RUN/$tag-core.txt.disk" || true
  if [[ -n ${disk_b:-} && -n $bps && $bps != 0 && -n $win && $win != 0.000 ]]; then
    V[$p|read_amp]=$(calc "$disk_b / ($bps * $win)")
  fi
  V[$p|slowest]=$(kv "$fs" conn_mb_per_s_min)
  V[$p|established]=$(kv "$fs" conns_established)
  V[$p|gapped]=$(kv "$fs" conns_gap_over_threshold)
  V[$p|max_gap]=$(kv "$fs" max_read_gap_ms)
  V[$p|ramp]=$(kv "$fs" ramp_s)
  V[$p|ttfb_p50]=$(kv "$ft" ttfb_p50_ms) V[$p|ttfb_p90]=$(kv "$ft" ttfb_p90_ms)
  V[$p|ttfb_p99]=$(kv "$ft" ttfb_p99_ms) V[$p|ttfb_max]=$(kv "$ft" ttfb_max_ms)
  local se te
  se=$(kv "$fs" errors) te=$(kv "$ft" errors)
  V[$p|errors]=$((${se:-0} + ${te:-0}))
  [[ ${se:-0} == 0 ]] || note "$tag: $se client errors (first: $(kv "$fs" first_error))"
  [[ ${te:-0} == 0 ]] || note "$tag: $te of $(kv "$ft" requests) probes failed (first: $(kv "$ft" first_error))"
  [[ ${V[$p|established]:-0} == "$conns" ]] || note "$tag: ${V[$p|established]:-0} of $conns connections established"
  if [[ -n ${V[$p|ramp]} ]] && awk -v r="${V[$p|ramp]}" -v w="$warm" 'BEGIN { exit !(r > w) }'; then
    note "$tag: opening the connections took ${V[$p|ramp]} s, longer than the $warm s warm-up: the window includes the ramp"
  fi
  metrics_per_gib "$RUN/$tag-m0.txt" "$RUN/$tag-m1.txt" "$p"
  log "$tag: ${V[$p|gbs]:-?} GB/s (${V[$p|frac]:-?} of the link), ${V[$p|cpu_gib]:-?} CPU s/GiB, ttfb p50/p99 ${V[$p|ttfb_p50]:-?}/${V[$p|ttfb_p99]:-?} ms, gaps>1s ${V[$p|gapped]:-?}/$conns, range ${V[$p|range]}"
}

# Stall cells: N clients stall (or read 1 byte/s) while 20 fresh clients fetch.
cell_stall() { # cell_stall PROFILE KIND N VARIANT; KIND = none|stall|trickle
  local pr=$1 kind=$2 n=$3 v=$4 w="stall-$2-$3" tag="$1-stall-$2-$3-$4" p="$1|stall-$2-$3|$4"
  local fs=$RUN/$tag-swarm.txt ff=$RUN/$tag-fetch.txt psw='' i
  rm -f "$STOP_FILE" "$READY_FILE"
  start_server "$v" "$tag"
  if [[ $kind != none ]]; then
    local mode=(--stall 1)
    [[ $kind == trickle ]] && mode=(--rate-bytes-per-s 1 --read-bytes 1)
    spawn_ns "$NS_C" "$CLIENT_CPU" "$fs" "$LOADGEN" swarm --addr "$SRV_IP:$SRV_PORT" "${LG_TLS[@]}" --path /large.bin \
      --conns "$n" --duration-s 600 --warmup-s 0 "${mode[@]}" --rcvbuf-bytes "$STALL_RCVBUF_BYTES" \
      --ready-file "$READY_FILE" --stop-file "$STOP_FILE"
    psw=$LAST_PID
    i=0
    while ((i < 600)) && [[ ! -s $READY_FILE ]] && alive "$psw"; do sleep 0.1; i=$((i + 1)); done
    [[ -s $READY_FILE ]] || failure "$tag: the $n $kind clients were not connected within 60 s"
    # Let the server fill what they will not read.
    sleep "$SETTLE_S"
  fi
  metrics_snap "$RUN/$tag-m0.txt"
  spawn_ns "$NS_C" "$CLIENT_CPU" "$ff" "$LOADGEN" fetch --addr "$SRV_IP:$SRV_PORT" "${LG_TLS[@]}" --clients "$FETCH_CLIENTS" \
    --file-path /5m.bin --file-seed "$FIVE_SEED" --file-len "$FIVE_BYTES" --range-path /large.bin \
    --range "$FETCH_RANGE_START-$((FETCH_RANGE_START + FETCH_RANGE_BYTES - 1))" --range-seed "$LARGE_SEED" \
    --timeout-s "$FETCH_TIMEOUT_S"
  watch_client "$LAST_PID" "$p" $((FETCH_TIMEOUT_S + 30))
  reap "$LAST_PID" || failure "$tag: fetch exited non-zero ($(tail -n 1 "$ff"))"
  metrics_snap "$RUN/$tag-m1.txt"
  if [[ -n $psw ]]; then
    touch "$STOP_FILE"
    i=0
    while ((i < 100)) && alive "$psw"; do sleep 0.1; i=$((i + 1)); done
    alive "$psw" && { kill_group "$psw" 1 || true; }
    reap "$psw" || failure "$tag: the $kind swarm exited non-zero ($(tail -n 1 "$fs"))"
    V[$p|established]=$(kv "$fs" conns_established)
    V[$p|dropped]=$(kv "$fs" closed_by_server)
    [[ ${V[$p|established]:-0} == "$n" ]] || note "$tag: ${V[$p|established]:-0} of $n $kind clients connected (first error: $(kv "$fs" first_error))"
  fi
  stop_server "$tag"
  local k
  for k in file range; do
    V["$p|${k}_worst"]=$(kv "$ff" "${k}_s_worst")
    # Not all done in time: the figure is a lower bound, say so instead of printing the timeout.
    if [[ $(kv "$ff" "${k}_all_done") != 1 ]]; then
      V["$p|${k}_worst"]="> $FETCH_TIMEOUT_S ($(kv "$ff" "${k}_ok")/$FETCH_CLIENTS done)"
    fi
    V["$p|${k}_p50"]=$(kv "$ff" "${k}_s_p50")
    V["$p|${k}_ok"]=$(kv "$ff" "${k}_ok")
  done
  local fe re fin rin
  fe=$(kv "$ff" file_errors) re=$(kv "$ff" range_errors) fin=$(kv "$ff" file_incomplete) rin=$(kv "$ff" range_incomplete)
  V[$p|errors]=$((${fe:-0} + ${re:-0}))
  V[$p|incomplete]=$((${fin:-0} + ${rin:-0}))
  [[ -n $fe ]] || failure "$tag: no figures from the fetch clients"
  if [[ ${V[$p|errors]} != 0 ]]; then
    # A timeout while the server withholds bytes is the finding; a wrong byte is a failure.
    if grep -q 'differs' "$ff"; then failure "$tag: a fetched body did not verify: $(kv "$ff" first_error)"; fi
    note "$tag: ${V[$p|errors]} fetches failed (first: $(kv "$ff" first_error))"
  fi
  V[$p|chunks]=$(gauge "$RUN/$tag-m0.txt" shardline_chunks_in_flight)
  metrics_per_gib "$RUN/$tag-m0.txt" "$RUN/$tag-m1.txt" "$p"
  log "$tag: 5m.bin slowest ${V[$p|file_worst]:-?} s, range slowest ${V[$p|range_worst]:-?} s, ${V[$p|file_ok]:-?}+${V[$p|range_ok]:-?} of $FETCH_CLIENTS+$FETCH_CLIENTS done, chunks held ${V[$p|chunks]:--}"
}

STALL_CONDS=()
build_stall_conds() {
  local n
  STALL_CONDS=("none 0")
  for n in "${STALL_NS[@]}"; do STALL_CONDS+=("stall $n" "trickle $n"); done
}

# ------------------------------------------------------------------ report
ratio() { # ratio A B: A / B with 2 decimals, or —
  awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^-?[0-9.]+$/ && b ~ /^-?[0-9.]+$/ && b + 0 != 0) printf "%.2f", a / b; else printf "—" }'
}
fmtv() { # fmtv FORMAT VALUE: number formatted, text as is, empty as —
  if [[ -z $2 ]]; then printf '—'; elif [[ $2 =~ ^-?[0-9.]+$ ]]; then printf "$1" "$2"; else printf '%s' "$2"; fi
}
# row LABEL FORMAT PREFIX KEY [noratio]: one table row over the variants, then each shardline
# HTTPS (or, without --tls, cleartext) variant divided by nginx.
row() {
  local label=$1 f=$2 p=$3 k=$4 v line
  line="| $label |"
  for v in "${VARIANTS[@]}"; do line="$line $(fmtv "$f" "${V[$p|$v|$k]:-}") |"; done
  for v in on off; do
    if [[ ${5:-} == noratio ]]; then line="$line |"; else line="$line $(ratio "${V[$p|$v|$k]:-}" "${V[$p|ng|$k]:-}") |"; fi
  done
  printf '%s\n' "$line"
}
table_head() {
  local v line="| Row |" sep="|---|"
  for v in "${VARIANTS[@]}"; do line="$line ${VNAME[$v]} |"; sep="$sep---:|"; done
  printf '%s on / nginx | off / nginx |\n%s---:|---:|\n' "$line" "$sep"
}

report_load() { # report_load PROFILE WORKLOAD
  local pr=$1 w=$2 p="$1|$2" conns rate
  conns=${V[$p|on|conns]:-${V[$p|ng|conns]:-?}} rate=${V[$p|on|rate]:-${V[$p|ng|rate]:-0}}
  case $w in
    fast) echo "#### $conns fast clients (unpaced, keep-alive, large.bin in a loop)" ;;
    paced) echo "#### $conns paced clients ($(calc "$rate / 1e6" | sed 's/0*$//; s/\.$//') MB/s each: ${PACE_OVERSUBSCRIPTION}x the link together)" ;;
    big) echo "#### $conns paced clients ($(calc "$rate / 1e3" | sed 's/0*$//; s/\.$//') kB/s each: ${PACE_OVERSUBSCRIPTION}x the link together)$([[ $conns != 10000 ]] && echo "; 10 000 asked for, $conns run (--big-conns)")" ;;
  esac
  echo
  table_head
  row "goodput (GB/s)" %.3f "$p" gbs
  row "fraction of the shaped rate" %.3f "$p" frac
  [[ -n $EGRESS_CAP ]] && row "goodput / egress_limit_bytes_per_s ($EGRESS_CAP)" %.4f "$p" vs_cap noratio
  row "server CPU s per GiB" %.3f "$p" cpu_gib
  row "server CPU %" %.0f "$p" cpu_pct
  row "server core (CPU $SERVER_CPU, every context) busy %" %.0f "$p" core_pct
  row "server core s per GiB (every context)" %.3f "$p" core_gib
  row "server peak RSS (MiB)" %.0f "$p" rss_mib
  row "client CPU % (CPU $CLIENT_CPU)" %.0f "$p" client_pct
  row "1 KiB TTFB p50 (ms)" %.2f "$p" ttfb_p50
  row "1 KiB TTFB p90 (ms)" %.2f "$p" ttfb_p90
  row "1 KiB TTFB p99 (ms)" %.2f "$p" ttfb_p99
  row "1 KiB TTFB max (ms)" %.2f "$p" ttfb_max
  row "slowest connection (MB/s)" %.3f "$p" slowest
  row "connections established" %.0f "$p" established
  row "errors (clients + probes)" %.0f "$p" errors
  row "connections with a read gap > 1 s" %.0f "$p" gapped
  row "longest read gap (ms)" %.0f "$p" max_gap
  row "unaligned ranged GET, verified" %s "$p" range noratio
  row "io_uring_enter per GiB" %.0f "$p" enters_gib noratio
  row "SQEs per GiB" %.0f "$p" sqes_gib noratio
  row "CQEs per GiB" %.0f "$p" cqes_gib noratio
  row "arena waits per GiB" %.1f "$p" arena_waits_gib noratio
  row "parked sends per GiB" %.0f "$p" parked_gib noratio
  row "chunks reclaimed per GiB" %.0f "$p" reclaimed_gib noratio
  row "MiB given back unsent per GiB sent" %.1f "$p" given_back_mib_gib noratio
  row "... of which read ahead, never begun to leave" %.1f "$p" unsent_mib_gib noratio
  if ((TLS)) && [[ $w == fast || $w == paced ]]; then
    row "profile: AEAD share of the core (%)" %.1f "$p" aead_pct noratio
    row "profile: byte copies' share of the core (%)" %.1f "$p" copy_pct noratio
    row "profile: idle share of the core (%)" %.1f "$p" idle_pct noratio
    row "profile: RAM disk's loop worker share of the core (%)" %.1f "$p" ramdisk_pct noratio
    row "server core s per GiB without the RAM disk's loop worker" %.3f "$p" core_gib_nodisk
  fi
  row "disk bytes read per byte sent" %.2f "$p" read_amp noratio
  echo
  if ((TLS)) && [[ $w == fast || $w == paced ]]; then
    local v f
    for v in on ng cl; do
      f=$RUN/$pr-$w-$v-profile.txt
      [[ -s $f ]] || continue
      echo "Top of the server core's profile, ${VNAME[$v]} (\`perf record -e cpu-clock -C $SERVER_CPU\`, $PROFILE_S s inside the window; command, object, symbol):"
      echo
      echo '```'
      cut -c1-150 "$f"
      echo '```'
      echo
    done
  fi
}

report_stall() { # report_stall PROFILE
  local pr=$1 c kind n p label
  echo "#### Stalled and 1-byte/s clients: $FETCH_CLIENTS fresh clients each fetch 5m.bin, then bytes $FETCH_RANGE_START-$((FETCH_RANGE_START + FETCH_RANGE_BYTES - 1)) of large.bin (timeout $FETCH_TIMEOUT_S s)"
  echo
  table_head
  for c in "${STALL_CONDS[@]}"; do
    read -r kind n <<<"$c"
    p="$pr|stall-$kind-$n"
    case $kind in
      none) label="no other clients" ;;
      stall) label="$n stalled (GET, never read, 4 KiB SO_RCVBUF)" ;;
      trickle) label="$n reading 1 byte/s (4 KiB SO_RCVBUF)" ;;
    esac
    row "$label: 5m.bin, slowest of $FETCH_CLIENTS (s)" %.3f "$p" file_worst
    row "$label: 5m.bin, median (s)" %.3f "$p" file_p50
    row "$label: range, slowest of $FETCH_CLIENTS (s)" %.3f "$p" range_worst
    row "$label: fetches failed / not done in time" %s "$p" fail_incomplete noratio
    if [[ $kind != none ]]; then
      row "$label: of them connected / dropped by the server" %s "$p" est_dropped noratio
      row "$label: shardline arena chunks held when the fetch began" %s "$p" chunks noratio
    fi
    row "$label: server peak RSS (MiB)" %.0f "$p" rss_mib
  done
  echo
  echo "\"slowest\" is when the last of the $FETCH_CLIENTS was done: the timeout ($FETCH_TIMEOUT_S s) when one was not. Compare each condition with \"no other clients\"."
  echo
}

report() {
  local kernel cpu_model end_load sl_rev fs pr w v c kind n p
  kernel=$(uname -r)
  cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  end_load=$(cut -d' ' -f1-3 /proc/loadavg)
  sl_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO" diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || sl_rev="$sl_rev (+ uncommitted changes in src/)"
  # Combined cells for the stall table.
  for pr in "${PROFILES[@]}"; do
    for c in "${STALL_CONDS[@]}"; do
      read -r kind n <<<"$c"
      for v in "${VARIANTS[@]}"; do
        p="$pr|stall-$kind-$n|$v"
        [[ -n ${V[$p|errors]:-} ]] && V[$p|fail_incomplete]="${V[$p|errors]} / ${V[$p|incomplete]}"
        [[ -n ${V[$p|established]:-} ]] && V[$p|est_dropped]="${V[$p|established]} / ${V[$p|dropped]:-0}"
      done
    done
  done
  {
    if ((TLS)); then echo "# shardline vs nginx over HTTPS on a shaped link (perf/link.sh --tls)"; else echo "# shardline vs nginx on a shaped link (perf/link.sh)"; fi
    echo
    if ((QUICK)); then echo "**Quick mode** (harness check: $LARGE_MIB MiB file, ${DURATION_S} s cells; the numbers mean little)."; echo; fi
    echo "## Machine and run"
    echo
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC') (start $START_DATE); command: \`perf/link.sh ${LINK_ARGS[*]}\`; took $(( (SECONDS - T0) / 60 )) min $(( (SECONDS - T0) % 60 )) s"
    echo "- Host: kernel $kernel, CPU \"$cpu_model\" x $(nproc), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM; **load average at start $START_LOAD, at end $end_load** (other work on the host adds noise: read this first)"
    if ((TLS)); then
      echo "- HTTPS: shardline adds \`--tls-listen $SRV_IP:$SL_TLS_PORT --tls-cert cert.pem --tls-key key.pem\` (defaults: 16 KiB records, TLS 1.3 first, AES-128-GCM first, tickets with random keys); nginx serves the \`# tls:begin\` server of \`perf/nginx.conf\` on $SRV_IP:$NG_TLS_PORT (TLS 1.2/1.3, tickets on, sendfile on, AES-128-GCM first); one ECDSA P-256 certificate for both ($(openssl version 2>/dev/null | cut -d' ' -f1-2) made it); every client is \`loadgen ... --tls 1 --tls-version 13 --tls-group x25519\`: rustls (aws-lc-rs), in-memory tickets, so a client's later connections resume. \"${VNAME[cl]}\" is the same shardline build over cleartext, in the same run (fast and paced workloads)"
    fi
    echo "- shardline \`$SL_BIN\` (commit $sl_rev): \`serve --config zerocopy-{on,off}.toml --root ROOT --listen $SRV_IP:$SL_PORT --admin $ADMIN --shards 1 --cpus $SERVER_CPU\`, every other key at its default${LINK_SHARDLINE_CONFIG:+ except \`$LINK_SHARDLINE_CONFIG\`}; $NGINX_VERSION with \`perf/nginx.conf\` (1 worker; only its listen address changed to $SRV_IP:$NG_PORT). Each cell starts a fresh server; servers pinned to CPU $SERVER_CPU in \`$NS_S\`, every client pinned to CPU $CLIENT_CPU in \`$NS_C\`; nice $NICE"
    echo "- Link: \`ip link add $VETH_S netns $NS_S type veth peer name $VETH_C netns $NS_C\`, $SRV_IP/$NET_PREFIX and $CLI_IP/$NET_PREFIX, MTU $(cat "$RUN/mtu.txt" 2>/dev/null || echo 1500), offloads as veth sets them; \`tc qdisc add dev $VETH_S root ${TBF[*]}\` on the server side ($RATE = $(calc "$RATE_BITS / 8e9" | sed 's/0*$//; s/\.$//') GB/s)"
    echo "- Disk: $DISK_DESC; one O_DIRECT reader of large.bin with 512 KiB reads (cold cache): **${DISK_MBS:-?} MB/s**"
    echo "- Fixtures: large.bin $LARGE_BYTES bytes, 5m.bin $FIVE_BYTES, small.bin $SMALL_BYTES; deterministic content (\`loadgen gen\`), every verified body checked byte for byte"
    echo "- Cells: load workloads ${DURATION_S} s measured after a warm-up of $WARMUP_S s ($BIG_WARMUP_S s for the big one) with \`loadgen swarm\` (one epoll thread); TTFB: \`loadgen ttfb\` at $TTFB_RATE/s on fresh connections (SCHED_FIFO) inside the window; one \`loadgen get\` of bytes $PROBE_RANGE_START-$((PROBE_RANGE_START + PROBE_RANGE_BYTES - 1)) of large.bin per cell, verified; stall cells: \`loadgen swarm --stall 1\` or \`--rate-bytes-per-s 1 --read-bytes 1\`, then \`loadgen fetch\` after $SETTLE_S s"
    echo "- Disk and profile rows: \"disk bytes read per byte sent\" is the fixtures' block device's read bytes (/sys/class/block/DEV/stat) over the measured window divided by the bytes the clients got (above 1: bytes read into the arena, given back unsent and read again; near 0: served from the page cache). The profile's \"RAM disk's loop worker\" share is the samples whose call chain runs through the loop driver (its copy from /dev/shm stands in for an NVMe drive's DMA, which costs no CPU); \"without the RAM disk's loop worker\" is the core's s/GiB times (1 - that share)"
    echo "- Read gaps: a connection \"waited > 1 s\" when more than 1 s passed between two of its reads (or from its request to its first byte) while its client was ready to read (pacing pauses do not count)"
    echo "- Server CPU rows: \"server CPU\" is the server process's own CPU time (loadgen reads its process group); \"server core\" is everything CPU $SERVER_CPU did over the measured window (/proc/stat: user, system, irq and softirq, including ksoftirqd and the loop device's kworkers), which is what the traffic costs the core wherever the kernel accounts it (busy % near 100 means the core, not the link, set the pace)"
    echo "- /metrics rows: deltas of shardline's counters (admin listener, inside $NS_S) over the cell, per GiB of \`shardline_bytes_sent_total\`; nginx has none"
    echo
    echo "## What this link models, and what it does not"
    echo
    echo "- It models a server whose 10G uplink is the bottleneck: the tbf on the server's veth lets $RATE through and queues ~1 ms behind it (tail drops beyond that show as ~200 ms retransmit outliers), the clients are slower than the server (paced by the client, as home connections are), and some stop reading."
    echo "- No per-flow fair queueing: this kernel has no fq, fq_codel, sfq or cake, so all flows share one FIFO; a probe's TTFB includes up to the queue's 1 ms for every server alike, and BBR's own pacing is the only pacing on the server side."
    echo "- No NIC: no TSO/GRO in hardware, no RSS queues, no interrupts or NIC ring sizes; veth segments and checksums in software on the sender's CPU."
    echo "- Zero-copy: on veth (as on loopback) SEND_ZC skbs are copied when delivered to the local peer, and the notification arrives when the data is acknowledged, so zerocopy=on shows its costs (an extra completion per send, buffers held until ACK) but not its saving (no copy on a NIC)."
    echo "- One machine: the clients' CPU ($CLIENT_CPU) and the server's ($SERVER_CPU) are hyperthreads or vCPUs of one host; client CPU % near 100 means the client set the pace."
    echo
    echo "## Sysctl profiles (server namespace; clients keep fresh-namespace defaults)"
    echo
    local header="| key |" sep="|---|" k
    for pr in "${PROFILES[@]}"; do header="$header $pr |"; sep="$sep---|"; done
    echo "$header"
    echo "$sep"
    for k in "${SYSCTL_KEYS[@]}"; do
      local line="| \`$k\` |"
      for pr in "${PROFILES[@]}"; do
        line="$line $(awk -F'\t' -v ns="$NS_S" -v k="$k" '$1 == ns && $2 == k { v = $3 } END { print (v == "" ? "?" : v) }' "$RUN/sysctl-$pr.tsv" 2>/dev/null) |"
      done
      echo "$line"
    done
    echo
    echo "\"seed\" is what \`scripts/tune-host.sh --apply\` writes (the field report's section 5), run inside \`$NS_S\`. Keys that are global on this kernel (read-only or absent inside a namespace, such as net.core.wmem_max and netdev_max_backlog) got tune-host.sh's value in the root namespace for the seed profile only; every root-namespace value was restored to its value at the start when the profile ended (and checked again at exit)."
    echo
    for pr in "${PROFILES[@]}"; do
      echo "## Profile: $pr sysctls"
      echo
      for w in "${WLIST[@]}"; do
        if [[ $w == stall ]]; then report_stall "$pr"; else report_load "$pr" "$w"; fi
      done
    done
    echo "Ratios are shardline divided by nginx (— when either side is missing). Higher is better for goodput, fraction and slowest connection; lower for CPU, TTFB, gaps, errors and completion times."
    echo
    echo "## Notes from this run"
    echo
    if ((${#FAILURES[@]} + ${#NOTES[@]} == 0)); then echo "- No client errors, every verified body matched, every server started and stopped cleanly."; fi
    local x
    for x in "${FAILURES[@]}"; do echo "- **FAILURE**: $x"; done
    for x in "${NOTES[@]}"; do echo "- $x"; done
    n=$(cat "$RUN"/*-server.log 2>/dev/null | grep -ciE 'panic|error|warn' || true)
    [[ ${n:-0} == 0 ]] || echo "- server logs: $n lines matching panic/error/warn over all cells, e.g. \`$(cat "$RUN"/*-server.log | grep -iE 'panic|error|warn' | head -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)\`"
    n=$(cat "$RUN"/*-nginx-error.log 2>/dev/null | wc -l || true)
    [[ ${n:-0} == 0 ]] || echo "- nginx error.log: $n lines over all cells, e.g. \`$(cat "$RUN"/*-nginx-error.log | head -n 1 | cut -c1-200)\`"
    for pr in "${PROFILES[@]}"; do
      for w in "${WLIST[@]}"; do
        [[ $w == stall ]] && continue
        local con=${V[$pr|$w|on|cqes_gib]:-} coff=${V[$pr|$w|off|cqes_gib]:-}
        [[ -n $con && -n $coff ]] || continue
        echo "- zerocopy in force ($pr, $w): CQEs per GiB $con with zc=on vs $coff with zc=off (SEND_ZC adds a notification CQE per send; a ratio near 1 would mean it was not in use): $(ratio "$con" "$coff")"
        break
      done
    done
    if printf '%s\n' "${FAILURES[@]}" | grep -q 'differ'; then
      echo "- **Data integrity**: at least one body did not match the fixture (see FAILURE lines): which server and which setting is in each line."
    fi
    echo "- Raw outputs of every client, /metrics snapshots and server logs: \`perf/out/link/\`."
  } >"$OUT"
  cat "$OUT"
}

# ------------------------------------------------------------------ main
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
START_DATE=$(date -u '+%H:%M UTC')
T0=$SECONDS
mkdir -p "$RUN"
rm -rf "${RUN:?}"/*
chmod 755 "$OUTDIR" "$RUN"
snapshot_root_sysctls
plan >&2
stale=$(ip netns list 2>/dev/null | awk '$1 ~ /^pl-/ { print $1 }' | tr '\n' ' ')
[[ -z $stale ]] || log "note: network namespaces from another link.sh (running, or killed with SIGKILL) exist: $stale"

if [[ $MODE == cleanup ]]; then
  # Everything a run creates, then the trap removes it and checks.
  ramdisk_create "pl-disk-$TAG" $((64 * 1024 * 1024)) "$ROOT"
  net_up seed
  spawn_ns "$NS_S" "$SERVER_CPU" "$RUN/check-srv.txt" sleep 300
  spawn_ns "$NS_C" "$CLIENT_CPU" "$RUN/check-cli.txt" sleep 300
  ip netns exec "$NS_C" bash -c "exec 3<>/dev/tcp/$SRV_IP/9" 2>/dev/null || true
  log "created: $NS_S $NS_C $VETH_S $VETH_C, tbf on $VETH_S, $RAMDISK_DEV on $ROOT, seed sysctls in $NS_S, 2 processes"
  exit 0
fi

ensure_tools
[[ $(nginx -V 2>&1) == *--with-threads* ]] || die "this nginx lacks thread pools (--with-threads); 'aio threads' needs them"
NGINX_VERSION=$(nginx -v 2>&1 | sed 's/^nginx version: //')
command -v cargo >/dev/null || die "cargo is needed to build perf/loadgen (and shardline)"
(($(nproc) >= 2)) || { CLIENT_CPU=$SERVER_CPU; log "one CPU only: clients share it with the server"; }
if chrt -f 10 true 2>/dev/null; then CHRT=(chrt -f 10); else CHRT=(); fi
build_tools  # sets SL_BIN
"$SL_BIN" serve --help 2>&1 | grep -q -- '--config' || die "$SL_BIN has no 'serve --config'"

# Descriptors: the big workload's clients and the server's sockets.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fd_limit=$(ulimit -n)
if ((fd_limit < BIG_CONNS + 1000)); then
  note "ulimit -n is $fd_limit: the big workload runs $((fd_limit - 1000)) connections instead of $BIG_CONNS"
  BIG_CONNS=$((fd_limit - 1000))
fi

if [[ $DISK == ram ]]; then
  ramdisk_create "pl-disk-$TAG" "$RAMDISK_BYTES" "$ROOT"
  DISK_DESC="ram: ext4 on $RAMDISK_DEV, a loop device backed by $RAMDISK_IMG (/dev/shm), mounted at perf/out/pl-mnt-$TAG"
else
  mkdir -p "$ROOT"
  chmod 755 "$ROOT"
  DISK_DESC="repo: $(findmnt -no FSTYPE -T "$ROOT" 2>/dev/null || echo '?') on $(findmnt -no SOURCE -T "$ROOT" 2>/dev/null || echo '?') (perf/out/link-root)"
fi
# Stamps beside the fixtures: bench.sh keeps its own in perf/out for perf/out/root.
STAMPS=$ROOT
ensure_fixture "$LOADGEN" "$ROOT" "$STAMPS" large.bin "$LARGE_BYTES" "$LARGE_SEED"
ensure_fixture "$LOADGEN" "$ROOT" "$STAMPS" 5m.bin "$FIVE_BYTES" "$FIVE_SEED"
ensure_fixture "$LOADGEN" "$ROOT" "$STAMPS" small.bin "$SMALL_BYTES" "$SMALL_SEED"
drop_caches || note "cannot drop the page cache"
DISK_MBS=$(disk_baseline "$ROOT/large.bin" "$LARGE_MIB")
log "disk ($DISK): one O_DIRECT reader, 512 KiB reads: ${DISK_MBS:-?} MB/s"

build_stall_conds
((TLS)) && tls_test_cert "$TLS_DIR"
for pr in "${PROFILES[@]}"; do
  net_up "$pr"
  ip netns exec "$NS_S" cat "/sys/class/net/$VETH_S/mtu" >"$RUN/mtu.txt" 2>/dev/null || true
  for w in "${WLIST[@]}"; do
    if [[ $w == stall ]]; then
      for c in "${STALL_CONDS[@]}"; do
        read -r kind n <<<"$c"
        for v in "${VARIANTS[@]}"; do [[ $v == cl ]] || cell_stall "$pr" "$kind" "$n" "$v"; done
      done
    else
      for v in "${VARIANTS[@]}"; do [[ $v == cl && $w == big ]] || cell_load "$pr" "$w" "$v"; done
    fi
  done
  net_down
  restore_root_sysctls || failure "a root-namespace sysctl could not be restored after the $pr profile"
done
log "cells took $((SECONDS - T0)) s"
report

rc=0
if ((${#FAILURES[@]})); then log "${#FAILURES[@]} failure(s), see the Notes section of $OUT"; rc=1; fi
log "wrote $OUT"
exit "$rc"
