#!/usr/bin/env bash
# SC2317: the workload functions are called indirectly ("w_$w"), which shellcheck cannot see.
# shellcheck disable=SC2317
# perf/bench.sh: shardline against the nginx anchor (perf/nginx.conf), side by side, in one run.
#
#   perf/bench.sh [--quick] [--large-gib N | --large-mib N] [--duration-s N] [--out FILE]
#                 [--validate] [--nice N] [--disk ram|repo] [--workloads LIST]
#
# Both servers serve the same fixtures from perf/out/root, each pinned to CPU 0 (one shard, one
# worker); every load generator is pinned to CPU 1, except workload 2's second prober, which
# runs as a user's client does (not pinned, normal priority) beside the SCHED_FIFO one, so that
# both figures are in one run (perf/probe.sh goes further: unpinned wrk bulk, a Python client,
# repetitions and both sysctl profiles). Each workload runs against shardline, then
# against nginx, before the next workload starts. Raw outputs land in perf/out/run/.
# --validate also runs perf/validate-no-reclaim.sh (profile, reclaim counters, syscall mix of both
# servers) at the end and appends its output to the report. --nice N runs both servers and every
# load generator at that nice level (e.g. -10 on a host shared with other work; default 0).
# --disk ram (default) serves the fixtures from ext4 on a loop device backed by /dev/shm (O_DIRECT
# and alignment as on NVMe, never the bottleneck; needs root), --disk repo from perf/out/root on
# the repository's disk (this VM's virtual disk: 0.1-0.7 GB/s, varying). The O_DIRECT baseline of
# the chosen disk is printed and recorded. --workloads runs only the listed ones (comma-separated:
# bulk rate range pagecache idle tls_bulk tls_handshake tls_flood tls_idle; tls_flood uses
# tls_handshake's rate and falls back to 1000/s without it); rows of the others stay empty.
# Environment: SHARDLINE_BIN (default: cargo build --release, target/release/shardline),
# SHARDLINE_PORT, NGINX_PORT (default: first free from 28080), BENCH_SERVER_CPU (0), BENCH_CLIENT_CPU (1).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }

BENCH_ARGS=("$@")
QUICK=0 LARGE_MIB='' DURATION_S='' OUT='' VALIDATE=0 NICE=0 DISK=ram WORKLOADS=''
ALL_WORKLOADS=(bulk rate range pagecache idle tls_bulk tls_handshake tls_flood tls_idle)
while (($#)); do
  case $1 in
    --quick) QUICK=1; shift ;;
    --large-gib) LARGE_MIB=$(($2 * 1024)); shift 2 ;;
    --large-mib) LARGE_MIB=$2; shift 2 ;;
    --duration-s) DURATION_S=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --validate) VALIDATE=1; shift ;;
    --nice) NICE=$2; shift 2 ;;
    --disk) DISK=${2:-}; shift $(($# >= 2 ? 2 : 1)) ;;
    --workloads) WORKLOADS=${2:-}; shift $(($# >= 2 ? 2 : 1)) ;;
    -h | --help) usage 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

if ((QUICK)); then
  : "${LARGE_MIB:=64}" "${DURATION_S:=2}" "${OUT:=$HERE/out/quick.md}"
  WARMUP_S=0.5 RANGE_REPS=1 IDLE_CONNS=10000
else
  : "${LARGE_MIB:=2048}" "${DURATION_S:=15}" "${OUT:=$HERE/RESULTS.md}"
  WARMUP_S=3 RANGE_REPS=3 IDLE_CONNS=10000
fi
[[ $LARGE_MIB =~ ^[0-9]+$ && $LARGE_MIB -ge 16 ]] || die "the large file must be at least 16 MiB"
[[ $DURATION_S =~ ^[0-9]+$ && $DURATION_S -ge 2 ]] || die "--duration-s wants an integer >= 2"
[[ $NICE =~ ^-?[0-9]+$ ]] || die "--nice wants an integer"
[[ $DISK == ram || $DISK == repo ]] || { echo "bench.sh: --disk wants ram or repo" >&2; usage 2; }
WLIST=("${ALL_WORKLOADS[@]}")
if [[ -n $WORKLOADS ]]; then
  IFS=, read -r -a WLIST <<<"$WORKLOADS"
  for w in "${WLIST[@]}"; do
    [[ " ${ALL_WORKLOADS[*]} " == *" $w "* ]] || { echo "bench.sh: --workloads: unknown workload '$w' (known: ${ALL_WORKLOADS[*]})" >&2; usage 2; }
  done
fi
LARGE_BYTES=$((LARGE_MIB * 1024 * 1024))
SMALL_BYTES=1024
LARGE_SEED=1 SMALL_SEED=2
BULK_CONNS=100 RATE_CONNS=64 TTFB_RATE=50
RANGE_LEN=$((100 * 1024 * 1024))
((RANGE_LEN > LARGE_BYTES - 2 * 1024 * 1024)) && RANGE_LEN=$((LARGE_BYTES / 2))
ALIGNED_START=$((1024 * 1024)) UNALIGNED_START=1000
SERVER_CPU=${BENCH_SERVER_CPU:-0} CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
# Ports: as given, else the first free ones from 28080 up (other people's servers may be running).
free_port() { local p=$1; while port_busy "$p" || [[ $p == "${2:-}" ]]; do p=$((p + 1)); done; echo "$p"; }
SL_PORT=${SHARDLINE_PORT:-$(free_port 28080)}
NG_PORT=${NGINX_PORT:-$(free_port $((SL_PORT + 1)) "$SL_PORT")}
# HTTPS (issue 18): both servers also serve the same fixtures over TLS with one certificate.
SL_TLS_PORT=$(free_port $((NG_PORT + 1)) "$SL_PORT")
NG_TLS_PORT=$(free_port $((SL_TLS_PORT + 1)) "$NG_PORT")
# Handshake cells: closed-loop workers, and the flood's rate in multiples of each server's own
# full-handshake capacity.
HS_CONNS=8 FLOOD_FACTOR=2
# The flood cell's downloads: BULK_CONNS connections at this pace each (1 GB/s together, below
# what either server sends over HTTPS here without a flood).
FLOOD_PACE_BYTES_PER_S=10000000
OUTDIR=$HERE/out ROOT=$HERE/out/root RUN=$HERE/out/run
# --disk ram: the mount point of the ram disk (created after the build); stamps live beside the
# fixtures, so perf/out/root's stamps stay valid for --disk repo runs.
STAMPDIR=$OUTDIR
if [[ $DISK == ram ]]; then ROOT=$OUTDIR/pl-bench-mnt-$$ STAMPDIR=$ROOT; fi
LOADGEN=$HERE/loadgen/target/release/loadgen
NOTES=() FAILURES=()
note() { NOTES+=("$*"); log "note: $*"; }
failure() { FAILURES+=("$*"); log "FAILURE: $*"; }

# ------------------------------------------------------------------ processes we start
# Every process is started with setsid, so its pid is its process group; cleanup kills groups.
declare -A GROUPS_LIVE=()
LAST_PID=''

spawn() { # spawn CPU OUTFILE CMD...: background, pinned, own process group
  local cpu=$1 outfile=$2
  shift 2
  setsid taskset -c "$cpu" nice -n "$NICE" "$@" >"$outfile" 2>&1 </dev/null &
  LAST_PID=$!
  GROUPS_LIVE[$LAST_PID]=1
}

spawn_unpinned() { # spawn_unpinned OUTFILE CMD...: as spawn, on whichever CPU the kernel picks
  local outfile=$1
  shift
  setsid nice -n "$NICE" "$@" >"$outfile" 2>&1 </dev/null &
  LAST_PID=$!
  GROUPS_LIVE[$LAST_PID]=1
}

reap() { # reap PID: wait for it; returns its exit status
  local rc=0
  wait "$1" || rc=$?
  unset "GROUPS_LIVE[$1]"
  return "$rc"
}

# alive and kill_group come from lib.sh.

cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM
  set +e
  for pg in "${!GROUPS_LIVE[@]}"; do
    kill_group "$pg" 3
    wait "$pg" 2>/dev/null
  done
  ramdisk_destroy
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ tools
ensure_tools() {
  local missing=() p
  command -v nginx >/dev/null || missing+=(nginx)
  command -v wrk >/dev/null || missing+=(wrk)
  { command -v fincore && command -v taskset && command -v setsid && command -v chrt; } >/dev/null ||
    missing+=(util-linux)
  command -v pgrep >/dev/null || missing+=(procps)
  command -v ss >/dev/null || missing+=(iproute2)
  command -v curl >/dev/null || missing+=(curl)
  command -v openssl >/dev/null || missing+=(openssl)
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}; run as root (or install them) first"
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
  # For perf/validate-no-reclaim.sh; the bench itself runs without them.
  command -v perf >/dev/null && command -v strace >/dev/null ||
    apt-get install -y -qq linux-perf strace >&2 || log "linux-perf/strace not installed (only validate-no-reclaim.sh needs them)"
}

# ------------------------------------------------------------------ helpers
# kv and calc come from lib.sh.
median() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
max_of() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | tail -n 1; }
# group_stats PGID: GROUP_CPU_S (utime+stime) and GROUP_WAIT_S (run-queue wait) of a group.
group_stats() {
  local out
  out=$("$LOADGEN" cpu --pgid "$1")
  GROUP_CPU_S=$(sed -n 's/^cpu_s=//p' <<<"$out")
  GROUP_WAIT_S=$(sed -n 's/^runqueue_wait_s=//p' <<<"$out")
}
# CHILD_CPU_S=user+sys of every child this shell has reaped so far. Not a $(...) function:
# `times` in a subshell would report the subshell's children (none).
children_cpu() {
  times >"$RUN/.times"
  CHILD_CPU_S=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } print s }' "$RUN/.times")
}

# metrics_snap FILE: shardline's /metrics (admin listener), when it has one.
SL_ADMIN=''
metrics_snap() {
  [[ -n $SL_ADMIN ]] || return 0
  curl -s --max-time 3 "$SL_ADMIN/metrics" >"$1" 2>/dev/null || rm -f "$1"
}
# metrics_delta comes from lib.sh.

declare -A V=()   # V[sl.key] / V[ng.key]: measured values (empty = failed to measure)
declare -A PORT=([sl]=$SL_PORT [ng]=$NG_PORT)
declare -A TLS_PORT=([sl]=$SL_TLS_PORT [ng]=$NG_TLS_PORT)
declare -A NAME=([sl]=shardline [ng]=nginx)
declare -A PG=()  # process group (leader pid) of each running server

# ------------------------------------------------------------------ servers
start_server() { # start_server sl|ng
  local s=$1 log=$RUN/$1-server.log
  port_busy "${PORT[$s]}" && die "port ${PORT[$s]} is in use (set SHARDLINE_PORT / NGINX_PORT)"
  if [[ $s == sl ]]; then
    spawn "$SERVER_CPU" "$log" "$SL_BIN" serve --root "$ROOT" --listen "127.0.0.1:${PORT[sl]}" \
      --shards 1 --cpus "$SERVER_CPU" "${SL_EXTRA[@]}" "${SL_TLS[@]}"
  else
    render_nginx_conf "$HERE/nginx.conf" "$OUTDIR/nginx" "$ROOT" "${PORT[ng]}" "$SERVER_CPU" \
      "${TLS_PORT[ng]}" "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem"
    spawn "$SERVER_CPU" "$log" nginx -p "$OUTDIR/nginx" -c "$OUTDIR/nginx/nginx.conf"
  fi
  PG[$s]=$LAST_PID
  if ! wait_port "${PORT[$s]}" "${PG[$s]}" 15; then
    tail -n 20 "$log" >&2 || true
    die "${NAME[$s]} did not start listening on port ${PORT[$s]} (log: $log)"
  fi
  sleep 0.2
  if [[ $s == sl ]]; then
    SL_ADMIN=$(sed -n 's|.*admin at \(http://[0-9.:]*\).*|\1|p' "$log" | head -n 1)
  fi
  local admin=''
  [[ $s == sl && -n $SL_ADMIN ]] && admin=", admin $SL_ADMIN"
  log "${NAME[$s]} up: pgid ${PG[$s]}, serving pid $(serving_pid "${PG[$s]}"), port ${PORT[$s]}$admin"
}

# ensure_up sl|ng WORKLOAD: restart a server that died, and say so.
ensure_up() {
  local s=$1 rc=0
  alive "${PG[$s]}" && return 0
  reap "${PG[$s]}" || rc=$?
  failure "${NAME[$s]} exited (status $rc) before workload '$2'; restarted it. Log tail: $(tail -n 3 "$RUN/$s-server.log" | sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' ')"
  cp "$RUN/$s-server.log" "$RUN/$s-server.exited-at-${2%% *}.log" 2>/dev/null || true
  start_server "$s"
}

stop_server() { # stop_server sl|ng: SIGTERM, then check the exit status
  local s=$1 pg=${PG[$1]} rc=0
  if ! alive "$pg"; then
    reap "$pg" || rc=$?
    failure "${NAME[$s]} had already exited (status $rc) when the run ended"
    return
  fi
  if ! kill_group "$pg" 20; then
    failure "${NAME[$s]} did not exit within 20 s of SIGTERM; killed it"
  fi
  reap "$pg" || rc=$?
  if ((rc != 0)); then failure "${NAME[$s]} exited with status $rc on SIGTERM (expected 0)"; fi
  log "${NAME[$s]} stopped (status $rc)"
}

# ------------------------------------------------------------------ workloads
run_client() { # run_client OUTFILE CMD...: pinned to the client CPU, waited for; status returned
  spawn "$CLIENT_CPU" "$@"
  reap "$LAST_PID"
}

# 1 + 2: bulk download by 100 connections; 1 KiB requests on fresh connections meanwhile.
w_bulk() {
  local s=$1 port=${PORT[$1]} fb=$RUN/$1-bulk.txt ft=$RUN/$1-ttfb.txt fu=$RUN/$1-ttfb-unpinned.txt
  local pb pt pu ttfb_s
  drop_caches || true
  # The 1 KiB file is a hot manifest, as on an edge: warm it (page cache and the server's open
  # file) so the first probe measures the server, not one cold read queued behind 100 O_DIRECT
  # streams on the disk.
  cat "$ROOT/small.bin" >/dev/null
  run_client "$RUN/$s-warm-small.txt" "$LOADGEN" get --addr "127.0.0.1:$port" --path /small.bin \
    --seed "$SMALL_SEED" --expect-len "$SMALL_BYTES" || failure "${NAME[$s]}: warm-up GET of small.bin failed"
  [[ $s == sl ]] && metrics_snap "$RUN/sl-metrics-before-bulk.txt"
  ttfb_s=$(calc "$DURATION_S - $WARMUP_S - 0.5")
  spawn "$CLIENT_CPU" "$fb" "$LOADGEN" bulk --addr "127.0.0.1:$port" --path /large.bin \
    --conns "$BULK_CONNS" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --pgid "${PG[$s]}" \
    --expect-len "$LARGE_BYTES"
  pb=$LAST_PID
  # SCHED_FIFO so the prober is never queued behind the 100 bulk client threads on the same CPU:
  # what it measures is the server's delay, not the client's.
  spawn "$CLIENT_CPU" "$ft" "${CHRT[@]}" "$LOADGEN" ttfb --addr "127.0.0.1:$port" --path /small.bin \
    --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$WARMUP_S" --seed "$SMALL_SEED" \
    --expect-len "$SMALL_BYTES"
  pt=$LAST_PID
  # The same probe as a user's client runs it: not pinned, normal priority (SCHED_OTHER), half
  # an interval after the real-time one. Its own run-queue wait per request (client_wait) says
  # how much of what it measures is its own scheduling rather than the server.
  spawn_unpinned "$fu" "$LOADGEN" ttfb --addr "127.0.0.1:$port" --path /small.bin \
    --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$(calc "$WARMUP_S + 0.5 / $TTFB_RATE")" \
    --seed "$SMALL_SEED" --expect-len "$SMALL_BYTES"
  pu=$LAST_PID
  reap "$pb" || failure "${NAME[$s]} bulk client exited non-zero ($(tail -n 1 "$fb"))"
  reap "$pt" || failure "${NAME[$s]} ttfb client exited non-zero ($(tail -n 1 "$ft"))"
  reap "$pu" || failure "${NAME[$s]} unpinned ttfb client exited non-zero ($(tail -n 1 "$fu"))"
  [[ $s == sl ]] && metrics_snap "$RUN/sl-metrics-after-bulk.txt"
  local bps bytes cpu win ccpu wait_s
  bps=$(kv "$fb" bytes_per_s) bytes=$(kv "$fb" window_bytes) cpu=$(kv "$fb" server_cpu_s)
  win=$(kv "$fb" window_s) ccpu=$(kv "$fb" client_cpu_s)
  [[ -n $bps ]] && V[$s.bulk_gbs]=$(calc "$bps / 1e9")
  [[ -n $bytes && -n $cpu && $bytes != 0 ]] && V[$s.bulk_cpu_gib]=$(calc "$cpu / ($bytes / 1073741824)")
  [[ -n $win && -n $ccpu ]] && V[$s.bulk_client_pct]=$(calc "100 * $ccpu / $win")
  [[ -n $win && -n $cpu ]] && V[$s.bulk_server_pct]=$(calc "100 * $cpu / $win")
  wait_s=$(kv "$fb" server_runqueue_wait_s)
  [[ -n $win && -n $wait_s ]] && V[$s.bulk_wait_pct]=$(calc "100 * $wait_s / $win")
  V[$s.bulk_errors]=$(kv "$fb" errors)
  V[$s.bulk_gap_ms]=$(kv "$fb" max_read_gap_ms)
  V[$s.bulk_conn_min]=$(kv "$fb" conn_mb_per_s_min)
  V[$s.bulk_jain]=$(kv "$fb" jain_fairness)
  V[$s.ttfb_over5]=$(kv "$ft" over_5ms)
  V[$s.ttfb_p50]=$(kv "$ft" ttfb_p50_ms)
  V[$s.ttfb_p99]=$(kv "$ft" ttfb_p99_ms)
  V[$s.ttfb_max]=$(kv "$ft" ttfb_max_ms)
  V[$s.ttfb_n]=$(kv "$ft" ok)
  V[$s.ttfbu_p50]=$(kv "$fu" ttfb_p50_ms)
  V[$s.ttfbu_p90]=$(kv "$fu" ttfb_p90_ms)
  V[$s.ttfbu_p99]=$(kv "$fu" ttfb_p99_ms)
  V[$s.ttfbu_max]=$(kv "$fu" ttfb_max_ms)
  V[$s.ttfbu_wait99]=$(kv "$fu" client_wait_p99_ms)
  local ue
  ue=$(kv "$fu" errors)
  [[ ${ue:-0} == 0 ]] || note "${NAME[$s]} small-under-bulk (unpinned prober): $ue of $(kv "$fu" requests) requests failed (first: $(kv "$fu" first_error))"
  local be te
  be=$(kv "$fb" errors) te=$(kv "$ft" errors)
  [[ ${be:-0} == 0 ]] || note "${NAME[$s]} bulk: $be request errors (first: $(kv "$fb" first_error))"
  [[ ${te:-0} == 0 ]] || note "${NAME[$s]} small-under-bulk: $te of $(kv "$ft" requests) requests failed (first: $(kv "$ft" first_error))"
  log "${NAME[$s]} bulk: ${V[$s.bulk_gbs]:-?} GB/s, ${V[$s.bulk_cpu_gib]:-?} CPU s/GiB; ttfb p50/p99/max ${V[$s.ttfb_p50]:-?}/${V[$s.ttfb_p99]:-?}/${V[$s.ttfb_max]:-?} ms (unpinned prober ${V[$s.ttfbu_p50]:-?}/${V[$s.ttfbu_p99]:-?}/${V[$s.ttfbu_max]:-?} ms)"
}

# 3: 64 keep-alive connections on the 1 KiB file.
w_rate() {
  local s=$1 f=$RUN/$1-rate.txt c0 c1 k0 k1 w0 w1 req dur
  children_cpu
  group_stats "${PG[$s]}"
  c0=$GROUP_CPU_S w0=$GROUP_WAIT_S k0=$CHILD_CPU_S
  run_client "$f" wrk -t1 -c"$RATE_CONNS" -d"${DURATION_S}s" --timeout 10s -s "$HERE/wrk-summary.lua" \
    "http://127.0.0.1:${PORT[$s]}/small.bin" || failure "${NAME[$s]} wrk exited non-zero"
  children_cpu
  group_stats "${PG[$s]}"
  c1=$GROUP_CPU_S w1=$GROUP_WAIT_S k1=$CHILD_CPU_S
  req=$(kv "$f" wrk_requests) dur=$(kv "$f" wrk_duration_us)
  if [[ -n $req && -n $dur && $req != 0 ]]; then
    V[$s.rate_rps]=$(calc "$req / ($dur / 1e6)")
    V[$s.rate_cpu_us]=$(calc "($c1 - $c0) * 1e6 / $req")
    V[$s.rate_client_pct]=$(calc "100 * ($k1 - $k0) / ($dur / 1e6)")
    V[$s.rate_server_pct]=$(calc "100 * ($c1 - $c0) / ($dur / 1e6)")
    V[$s.rate_wait_pct]=$(calc "100 * ($w1 - $w0) / ($dur / 1e6)")
  fi
  local k errs='' nerr=0 v
  for k in connect read write status timeout; do
    v=$(kv "$f" "wrk_err_$k")
    errs="$errs${errs:+/}${v:-?}"
    [[ ${v:-0} == 0 ]] || nerr=1
  done
  ((nerr == 0)) || note "${NAME[$s]} small-file rate: wrk errors connect/read/write/status/timeout = $errs"
  log "${NAME[$s]} small-file rate: ${V[$s.rate_rps]:-?} req/s, ${V[$s.rate_cpu_us]:-?} CPU us/req"
}

# 4: 100 MiB ranges at an aligned (1 MiB) and an unaligned (1000) offset, cold cache each time.
w_range() {
  local s=$1 rep f kind start a=() u=() ra=() ru=() mb
  for ((rep = 1; rep <= RANGE_REPS; rep++)); do
    for kind in aligned unaligned; do
      start=$ALIGNED_START
      [[ $kind == unaligned ]] && start=$UNALIGNED_START
      f=$RUN/$s-range-$kind-$rep.txt
      drop_caches || true
      run_client "$f" "$LOADGEN" get --addr "127.0.0.1:${PORT[$s]}" --path /large.bin \
        --range "$start-$((start + RANGE_LEN - 1))" --seed "$LARGE_SEED" ||
        failure "${NAME[$s]} $kind Range GET failed: $(kv "$f" error)"
      mb=$(kv "$f" mb_per_s)
      if [[ $kind == aligned ]]; then a+=("$mb") ra+=("$(resident_bytes "$ROOT/large.bin")")
      else u+=("$mb") ru+=("$(resident_bytes "$ROOT/large.bin")"); fi
    done
  done
  V[$s.range_a]=$(median "${a[@]}")
  V[$s.range_u]=$(median "${u[@]}")
  [[ -n ${V[$s.range_a]} && -n ${V[$s.range_u]} ]] && V[$s.range_ratio]=$(calc "${V[$s.range_u]} / ${V[$s.range_a]}")
  V[$s.range_res_a]=$(max_of "${ra[@]}")
  V[$s.range_res_u]=$(max_of "${ru[@]}")
  log "${NAME[$s]} range: aligned ${V[$s.range_a]:-?} MB/s, unaligned ${V[$s.range_u]:-?} MB/s, resident after ${V[$s.range_res_a]:-?}/${V[$s.range_res_u]:-?} B"
}

# 5: one full download of the large file from a cold cache; page cache and reclaim counters.
w_pagecache() {
  local s=$1 f=$RUN/$1-full.txt d0 k0 a0
  drop_caches || true
  d0=$(vmstat_get pgscan_direct) k0=$(vmstat_get pgscan_kswapd) a0=$(vmstat_get allocstall)
  run_client "$f" "$LOADGEN" get --addr "127.0.0.1:${PORT[$s]}" --path /large.bin \
    --seed "$LARGE_SEED" --expect-len "$LARGE_BYTES" ||
    failure "${NAME[$s]} full download failed: $(kv "$f" error)"
  V[$s.pc_direct]=$(($(vmstat_get pgscan_direct) - d0))
  V[$s.pc_kswapd]=$(($(vmstat_get pgscan_kswapd) - k0))
  V[$s.pc_allocstall]=$(($(vmstat_get allocstall) - a0))
  V[$s.pc_resident]=$(resident_bytes "$ROOT/large.bin")
  V[$s.pc_mbs]=$(kv "$f" mb_per_s)
  log "${NAME[$s]} full download: ${V[$s.pc_mbs]:-?} MB/s, resident ${V[$s.pc_resident]:-?} B, pgscan_direct +${V[$s.pc_direct]}"
}

# 6: 10 000 keep-alive connections, each after one request, then idle.
w_idle() {
  local s=$1 f=$RUN/$1-idle.txt
  run_client "$f" "$LOADGEN" idle --addr "127.0.0.1:${PORT[$s]}" --path /small.bin \
    --conns "$IDLE_CONNS" --pid "$(serving_pid "${PG[$s]}")" --settle-s 1 ||
    failure "${NAME[$s]} idle client exited non-zero"
  local r0 r1 f0 f1 est open
  r0=$(kv "$f" rss_before_kib) r1=$(kv "$f" rss_after_kib) f0=$(kv "$f" fd_before) f1=$(kv "$f" fd_after)
  est=$(kv "$f" conns_established) open=$(kv "$f" conns_still_open)
  [[ $r0 =~ ^[0-9]+$ ]] && V[$s.idle_rss0]=$r0
  [[ $r1 =~ ^[0-9]+$ ]] && V[$s.idle_rss1]=$r1
  [[ $r0 =~ ^[0-9]+$ && $r1 =~ ^[0-9]+$ && ${est:-0} != 0 ]] && V[$s.idle_kib_per_conn]=$(calc "($r1 - $r0) / $est")
  [[ $f0 =~ ^[0-9]+$ ]] && V[$s.idle_fd0]=$f0
  [[ $f1 =~ ^[0-9]+$ ]] && V[$s.idle_fd1]=$f1
  V[$s.idle_open]=$open
  [[ $est == "$IDLE_CONNS" ]] || note "${NAME[$s]} idle: only ${est:-0} of $IDLE_CONNS connections established (first error: $(kv "$f" first_error))"
  [[ $open == "$est" ]] || note "${NAME[$s]} idle: ${open:-?} of ${est:-?} connections were still open after $(kv "$f" open_s) s + 1 s idle"
  sleep 1 # let the server close 10 000 sockets before the next measurement
  log "${NAME[$s]} idle: RSS $r0 -> $r1 KiB, fds $f0 -> $f1, $open/$est open"
}

# ------------------------------------------------------------------ HTTPS (issue 18)
# Every HTTPS client: rustls on aws-lc-rs, no certificate check (see perf/loadgen/src/tls.rs).
TLS_ARGS=(--tls 1 --tls-sni localhost)

# H1 + H2: the bulk download and the small probe of workloads 1 + 2 over HTTPS; the probe
# asks on one kept-alive connection (its handshake is not part of what it measures).
w_tls_bulk() {
  local s=$1 port=${TLS_PORT[$1]} fb=$RUN/$1-tls-bulk.txt ft=$RUN/$1-tls-ttfb.txt pb pt ttfb_s
  drop_caches || true
  cat "$ROOT/small.bin" >/dev/null
  ttfb_s=$(calc "$DURATION_S - $WARMUP_S - 0.5")
  spawn "$CLIENT_CPU" "$fb" "$LOADGEN" bulk --addr "127.0.0.1:$port" --path /large.bin \
    --conns "$BULK_CONNS" --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --pgid "${PG[$s]}" \
    --expect-len "$LARGE_BYTES" "${TLS_ARGS[@]}"
  pb=$LAST_PID
  spawn "$CLIENT_CPU" "$ft" "${CHRT[@]}" "$LOADGEN" ttfb --addr "127.0.0.1:$port" --path /small.bin \
    --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$WARMUP_S" --seed "$SMALL_SEED" \
    --expect-len "$SMALL_BYTES" --keepalive 1 "${TLS_ARGS[@]}"
  pt=$LAST_PID
  reap "$pb" || failure "${NAME[$s]} HTTPS bulk client exited non-zero ($(tail -n 1 "$fb"))"
  reap "$pt" || failure "${NAME[$s]} HTTPS ttfb client exited non-zero ($(tail -n 1 "$ft"))"
  local bps bytes cpu win
  bps=$(kv "$fb" bytes_per_s) bytes=$(kv "$fb" window_bytes) cpu=$(kv "$fb" server_cpu_s) win=$(kv "$fb" window_s)
  [[ -n $bps ]] && V[$s.tbulk_gbs]=$(calc "$bps / 1e9")
  [[ -n $bytes && -n $cpu && $bytes != 0 ]] && V[$s.tbulk_cpu_gib]=$(calc "$cpu / ($bytes / 1073741824)")
  [[ -n ${V[$s.tbulk_cpu_gib]:-} && -n ${V[$s.bulk_cpu_gib]:-} ]] && V[$s.tbulk_vs_clear]=$(calc "${V[$s.tbulk_cpu_gib]} / ${V[$s.bulk_cpu_gib]}")
  [[ -n $win && -n $cpu ]] && V[$s.tbulk_server_pct]=$(calc "100 * $cpu / $win")
  V[$s.tttfb_p50]=$(kv "$ft" ttfb_p50_ms)
  V[$s.tttfb_p99]=$(kv "$ft" ttfb_p99_ms)
  V[$s.tttfb_max]=$(kv "$ft" ttfb_max_ms)
  local be te
  be=$(kv "$fb" errors) te=$(kv "$ft" errors)
  [[ ${be:-0} == 0 ]] || note "${NAME[$s]} HTTPS bulk: $be request errors (first: $(kv "$fb" first_error))"
  [[ ${te:-0} == 0 ]] || note "${NAME[$s]} HTTPS small-under-bulk: $te of $(kv "$ft" requests) requests failed (first: $(kv "$ft" first_error))"
  log "${NAME[$s]} HTTPS bulk: ${V[$s.tbulk_gbs]:-?} GB/s, ${V[$s.tbulk_cpu_gib]:-?} CPU s/GiB; keep-alive ttfb p50/p99 ${V[$s.tttfb_p50]:-?}/${V[$s.tttfb_p99]:-?} ms"
}

# H3: handshakes on the server's one core: TLS 1.3, X25519, full (no resumption) and resumed
# (tickets), then full with the post-quantum hybrid; each connection GETs the 1 KiB file (so the
# server finishes the handshake, tickets included) and closes. "Per core" = completed handshakes
# per second of server CPU (the client's one CPU may not saturate the server).
w_tls_handshake() {
  local s=$1 port=${TLS_PORT[$1]} kind f resume group
  for kind in full resumed pq; do
    if [[ $kind == pq && $s == ng ]] && ! openssl list -kem-algorithms 2>/dev/null | grep -qi mlkem; then
      # OpenSSL before 3.5 (nginx 1.22 here links 3.0) has no ML-KEM: nothing to measure.
      V[ng.hs_pq_core]=none
      continue
    fi
    f=$RUN/$s-tls-hs-$kind.txt resume=0 group=x25519
    [[ $kind == resumed ]] && resume=1
    [[ $kind == pq ]] && group=mlkem
    run_client "$f" "$LOADGEN" handshakes --addr "127.0.0.1:$port" --conns "$HS_CONNS" \
      --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --path /small.bin --pgid "${PG[$s]}" \
      "${TLS_ARGS[@]}" --tls-version 13 --tls-resume "$resume" --tls-group "$group" ||
      failure "${NAME[$s]} $kind handshake client exited non-zero"
    V[$s.hs_${kind}_core]=$(kv "$f" handshakes_per_core_s)
    V[$s.hs_${kind}_rate]=$(kv "$f" handshakes_per_s)
    V[$s.hs_${kind}_us]=$(kv "$f" server_cpu_us_per_handshake)
    local e
    e=$(kv "$f" errors)
    [[ ${e:-0} == 0 ]] || note "${NAME[$s]} $kind handshakes: $e errors (first: $(kv "$f" first_error))"
    if [[ $kind == resumed ]]; then
      local r n
      r=$(kv "$f" resumed) n=$(kv "$f" handshakes)
      [[ -n $r && -n $n && $n != 0 ]] && V[$s.hs_resumed_share]=$(calc "100 * $r / $n")
    fi
  done
  log "${NAME[$s]} handshakes per core: full ${V[$s.hs_full_core]:-?}, resumed ${V[$s.hs_resumed_core]:-?} (${V[$s.hs_resumed_share]:-?}% resumed), PQ full ${V[$s.hs_pq_core]:-?}"
}

# H4: a ClientHello flood at FLOOD_FACTOR x the server's own full-handshake rate (from H3): an
# open loop of connections replaying one ClientHello (the flooding client does no crypto, as an
# attacker would not), each held until the server answers with its flight. The downloads are
# BULK_CONNS HTTPS connections paced to FLOOD_PACE_BYTES_PER_S each (client-paced, as real
# downloads are, and below either server's capacity, so that what they lose is what the server
# took from them, not what the flooding client took from the downloading one on the shared
# client CPU): their goodput with the flood against a run without it, and a kept-alive 1 KiB
# probe's p99 during the flood.
w_tls_flood() {
  local s=$1 port=${TLS_PORT[$1]} fb0=$RUN/$1-flood-base.txt fb=$RUN/$1-flood-bulk.txt ft=$RUN/$1-flood-ttfb.txt ff=$RUN/$1-flood.txt
  local pb pt pf ttfb_s rate b0
  local swarm=("$LOADGEN" swarm --addr "127.0.0.1:$port" --path /large.bin --conns "$BULK_CONNS"
    --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --rate-bytes-per-s "$FLOOD_PACE_BYTES_PER_S"
    --pgid "${PG[$s]}" --expect-len "$LARGE_BYTES" "${TLS_ARGS[@]}" --tls-version 13 --tls-group x25519)
  run_client "$fb0" "${swarm[@]}" || failure "${NAME[$s]} paced HTTPS downloads (no flood) exited non-zero"
  b0=$(kv "$fb0" bytes_per_s)
  [[ -n $b0 ]] && V[$s.flood_base_gbs]=$(calc "$b0 / 1e9")
  rate=$(calc "${V[$s.hs_full_rate]:-1000} * $FLOOD_FACTOR")
  ttfb_s=$(calc "$DURATION_S - $WARMUP_S - 0.5")
  spawn "$CLIENT_CPU" "$fb" "${swarm[@]}"
  pb=$LAST_PID
  spawn "$CLIENT_CPU" "$ft" "${CHRT[@]}" "$LOADGEN" ttfb --addr "127.0.0.1:$port" --path /small.bin \
    --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$WARMUP_S" --seed "$SMALL_SEED" \
    --expect-len "$SMALL_BYTES" --keepalive 1 "${TLS_ARGS[@]}"
  pt=$LAST_PID
  spawn "$CLIENT_CPU" "$ff" "$LOADGEN" flood --addr "127.0.0.1:$port" --rate "$rate" \
    --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" "${TLS_ARGS[@]}" --tls-version 13 --tls-group x25519
  pf=$LAST_PID
  reap "$pb" || failure "${NAME[$s]} flood: paced HTTPS downloads exited non-zero"
  reap "$pt" || failure "${NAME[$s]} flood ttfb client exited non-zero"
  reap "$pf" || failure "${NAME[$s]} flood client exited non-zero"
  local bps
  bps=$(kv "$fb" bytes_per_s)
  [[ -n $bps ]] && V[$s.flood_gbs]=$(calc "$bps / 1e9")
  [[ -n ${V[$s.flood_gbs]:-} && -n ${V[$s.flood_base_gbs]:-} ]] && V[$s.flood_keep]=$(calc "${V[$s.flood_gbs]} / ${V[$s.flood_base_gbs]}")
  V[$s.flood_p99]=$(kv "$ft" ttfb_p99_ms)
  V[$s.flood_offered]=$(kv "$ff" attempts_per_s)
  V[$s.flood_done]=$(kv "$ff" answered_per_s)
  local te
  te=$(kv "$ft" errors)
  [[ ${te:-0} == 0 ]] || note "${NAME[$s]} kept-alive probe under the flood: $te of $(kv "$ft" requests) requests failed (first: $(kv "$ft" first_error))"
  log "${NAME[$s]} flood at ${V[$s.flood_offered]:-?}/s offered (${V[$s.flood_done]:-?}/s answered): paced downloads ${V[$s.flood_gbs]:-?} GB/s (x${V[$s.flood_keep]:-?} of ${V[$s.flood_base_gbs]:-?} without the flood), keep-alive ttfb p99 ${V[$s.flood_p99]:-?} ms"
}

# H5: the idle workload over HTTPS: RSS per idle TLS keep-alive connection. The connections are
# counted on both sides while held (the client: those the server has not closed; the server's
# port: established sockets, `ss`); a run where either server closed some (nginx does when
# worker_connections run out: "reusing connections") is refused, its figure left empty.
w_tls_idle() {
  local s=$1 f=$RUN/$1-tls-idle.txt ready=$RUN/$1-tls-idle.ready stop=$RUN/$1-tls-idle.stop
  rm -f "$ready" "$stop"
  # A fresh server: what the handshake flood before left (and may give back while the
  # connections are held, which made nginx's growth negative) is not counted.
  stop_server "$s"
  start_server "$s"
  spawn "$CLIENT_CPU" "$f" "$LOADGEN" idle --addr "127.0.0.1:${TLS_PORT[$s]}" --path /small.bin \
    --conns "$IDLE_CONNS" --pid "$(serving_pid "${PG[$s]}")" --settle-s 1 \
    --ready-file "$ready" --stop-file "$stop" "${TLS_ARGS[@]}"
  local pid=$LAST_PID i server_open=''
  for ((i = 0; i < 1200; i++)); do
    [[ -s $ready ]] && break
    alive "$pid" || break
    sleep 0.1
  done
  [[ -s $ready ]] && server_open=$(ss -Htn state established "( sport = :${TLS_PORT[$s]} )" | wc -l)
  touch "$stop"
  reap "$pid" || failure "${NAME[$s]} HTTPS idle client exited non-zero"
  local r0 r1 est open
  r0=$(kv "$f" rss_before_kib) r1=$(kv "$f" rss_after_kib) est=$(kv "$f" conns_established)
  open=$(kv "$f" conns_still_open)
  V[$s.tidle_open]="${open:-?}/${server_open:-?}"
  if [[ ${est:-0} != 0 && $open == "$est" && $server_open == "$est" && $r0 =~ ^[0-9]+$ && $r1 =~ ^[0-9]+$ ]] &&
    ((r1 < r0)); then
    # Memory an earlier workload left was given back while the connections were held: the
    # growth is not what they cost, and a negative figure would pass any target.
    note "${NAME[$s]} HTTPS idle refused: RSS fell from $r0 to $r1 KiB while $est connections were held (memory of an earlier workload was freed meanwhile)"
  elif [[ ${est:-0} != 0 && $open == "$est" && $server_open == "$est" ]]; then
    [[ $r0 =~ ^[0-9]+$ && $r1 =~ ^[0-9]+$ ]] && V[$s.tidle_kib_per_conn]=$(calc "($r1 - $r0) / $est")
  else
    note "${NAME[$s]} HTTPS idle refused: of ${est:-0} connections, ${open:-?} still open at the client and ${server_open:-?} established at the server after 1 s idle (the server closed some: its RSS is not that of $est idle connections)"
  fi
  [[ $est == "$IDLE_CONNS" ]] || note "${NAME[$s]} HTTPS idle: only ${est:-0} of $IDLE_CONNS connections established (first error: $(kv "$f" first_error))"
  sleep 1
  log "${NAME[$s]} HTTPS idle: RSS $r0 -> $r1 KiB over $est connections, $open open at the client, $server_open at the server"
}

# ------------------------------------------------------------------ report
fmt_row() { # fmt_row LABEL BETTER FORMAT SLKEY NGKEY TARGET MEANING
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${V[sl.$4]:-}" "${V[ng.$5]:-}" "$6" "$7"
}

report() {
  local kernel cpu_model end_load sl_rev fs
  kernel=$(uname -r)
  cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  end_load=$(cut -d' ' -f1-3 /proc/loadavg)
  fs=$(findmnt -no FSTYPE -T "$ROOT" 2>/dev/null || stat -f -c %T "$ROOT")
  sl_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO" diff --quiet HEAD 2>/dev/null || sl_rev="$sl_rev (+ uncommitted changes)"
  {
    fmt_row "1 Bulk: throughput (GB/s)" higher %.2f bulk_gbs bulk_gbs "ratio>=1.0" \
      "Body bytes per second received by $BULK_CONNS keep-alive clients downloading large.bin in a loop, over the steady-state window; bounded by the client's one CPU over loopback or by the disk (both servers read large files O_DIRECT; see the disk baseline above), so a tie is expected when both reach that bound."
    fmt_row "1 Bulk: server CPU s per GiB" lower %.3f bulk_cpu_gib bulk_cpu_gib "ratio<=0.8" \
      "utime+stime of the server's processes (nginx: master + worker + its thread pool) per GiB sent in the same window: the cost of the data path, and the number loopback cannot hide."
    fmt_row "1 Bulk: server CPU %" info %.0f bulk_server_pct bulk_server_pct "" \
      "Server CPU time over the window as a share of one CPU; near 100 means the server's one core was the limit."
    fmt_row "1 Bulk: server run-queue wait % (sum over threads)" info %.0f bulk_wait_pct bulk_wait_pct "" \
      "Time the server's threads were runnable but waiting for a CPU (schedstat), as a share of the window: other work on the host taking CPU $SERVER_CPU. Above a few %, the latency rows measure the host more than the server."
    fmt_row "1 Bulk: load-generator CPU %" info %.0f bulk_client_pct bulk_client_pct "" \
      "CPU use of the bulk client on CPU $CLIENT_CPU; near 100 means the client, not the server, set the throughput."
    fmt_row "1 Bulk: slowest connection (MB/s)" higher %.2f bulk_conn_min bulk_conn_min "" \
      "Throughput of the slowest of the $BULK_CONNS connections over the window: a starved connection shows here."
    fmt_row "1 Bulk: fairness (Jain index)" higher %.3f bulk_jain bulk_jain "" \
      "Jain's index of per-connection throughput: 1 = every connection got the same share, 0.01 = one connection got everything."
    fmt_row "2 Small under bulk: TTFB p50 (ms)" lower %.3f ttfb_p50 ttfb_p50 "" \
      "Median time from connect() to the first response byte of a 1 KiB GET on a fresh connection, $TTFB_RATE/s, while the bulk load runs; this prober is pinned to CPU $CLIENT_CPU under SCHED_FIFO, so it never waits for its own CPU (the unpinned prober's rows below do)."
    fmt_row "2 Small under bulk: TTFB p99 (ms)" lower %.3f ttfb_p99 ttfb_p99 "sl<=5;ratio<=0.25" \
      "99th percentile of the same: the field report's 0.412 s vs 0.003 s case (one bulk connection holding the loop)."
    fmt_row "2 Small under bulk: TTFB max (ms)" lower %.3f ttfb_max ttfb_max "" \
      "Worst small request seen during the bulk window."
    fmt_row "2 Small under bulk, unpinned prober: TTFB p50 (ms)" lower %.3f ttfbu_p50 ttfbu_p50 "" \
      "The same 1 KiB probe, at the same time, from a client as a user runs one: not pinned, normal priority (SCHED_OTHER, nice $NICE), so it can queue behind the bulk client or land on CPU $SERVER_CPU beside the server."
    fmt_row "2 Small under bulk, unpinned prober: TTFB p90 (ms)" lower %.3f ttfbu_p90 ttfbu_p90 "" \
      "90th percentile of the unpinned probe."
    fmt_row "2 Small under bulk, unpinned prober: TTFB p99 (ms)" lower %.3f ttfbu_p99 ttfbu_p99 "ratio<=0.25" \
      "99th percentile of the unpinned probe (issue 11's target: <= 0.25x nginx's). perf/probe.sh measures it over more probe kinds, bulk clients and repetitions."
    fmt_row "2 Small under bulk, unpinned prober: TTFB max (ms)" lower %.3f ttfbu_max ttfbu_max "" \
      "Worst unpinned probe."
    fmt_row "2 Small under bulk, unpinned prober: its own run-queue wait p99 (ms)" info %.3f ttfbu_wait99 ttfbu_wait99 "" \
      "99th percentile over requests of the time the unpinned prober's own thread was runnable but waiting for a CPU between connect() and the first byte (schedstat): the part of its TTFB that is the client's scheduling, not the server."
    fmt_row "2 Small under bulk: requests over 5 ms" lower %.0f ttfb_over5 ttfb_over5 "" \
      "How many of the ${V[sl.ttfb_n]:-?} (shardline) / ${V[ng.ttfb_n]:-?} (nginx) small requests took longer than the 5 ms target to their first byte."
    fmt_row "3 Small-file rate: requests/s" higher %.0f rate_rps rate_rps "ratio>=1.3" \
      "1 KiB GETs per second over $RATE_CONNS keep-alive connections (wrk -t1 on CPU $CLIENT_CPU)."
    fmt_row "3 Small-file rate: server CPU us per request" lower %.1f rate_cpu_us rate_cpu_us "" \
      "Server CPU time per request in that run; meaningful even when the single wrk thread is the bottleneck."
    fmt_row "3 Small-file rate: server CPU %" info %.0f rate_server_pct rate_server_pct "" \
      "Server CPU time as a share of one CPU during the run."
    fmt_row "3 Small-file rate: server run-queue wait % (sum over threads)" info %.0f rate_wait_pct rate_wait_pct "" \
      "As for bulk: time the server waited for CPU $SERVER_CPU behind other work."
    fmt_row "3 Small-file rate: load-generator CPU %" info %.0f rate_client_pct rate_client_pct "" \
      "CPU use of wrk; near 100 means requests/s is client-bound and only the CPU-per-request row compares the servers."
    fmt_row "4 Range: aligned 100 MiB (MB/s)" higher %.0f range_a range_a "" \
      "One GET of bytes $ALIGNED_START-$((ALIGNED_START + RANGE_LEN - 1)) from a cold page cache, median of $RANGE_REPS."
    fmt_row "4 Range: unaligned 100 MiB (MB/s)" higher %.0f range_u range_u "" \
      "Same length starting at byte $UNALIGNED_START (not a multiple of any block size): what a player seeking in a file sends."
    fmt_row "4 Range: unaligned / aligned" higher %.3f range_ratio range_ratio "sl>=0.95" \
      "Each server's own unaligned/aligned speed ratio; 1.0 means an unaligned start costs nothing (the field report saw 892 vs 41 MB/s with nginx O_DIRECT)."
    fmt_row "4 Range: large.bin resident after aligned (bytes)" lower %.0f range_res_a range_res_a "sl==0" \
      "Page-cache bytes of large.bin (fincore) right after the aligned ranged GET (cache dropped before it)."
    fmt_row "4 Range: large.bin resident after unaligned (bytes)" lower %.0f range_res_u range_res_u "sl==0" \
      "The same after the unaligned GET: buffered head/tail reads leave pages behind."
    fmt_row "5 Page cache: full download (MB/s)" higher %.0f pc_mbs pc_mbs "" \
      "One client downloading all of large.bin from a cold cache; body verified byte for byte."
    fmt_row "5 Page cache: large.bin resident after (bytes)" lower %.0f pc_resident pc_resident "sl==0" \
      "Bytes of the 'read once' file left in the page cache after the full download: each is a page something else lost."
    fmt_row "5 Page cache: pgscan_direct delta" lower %.0f pc_direct pc_direct "sl==0" \
      "Pages scanned by direct reclaim during the download (system-wide /proc/vmstat): allocations that had to reclaim synchronously."
    fmt_row "5 Page cache: pgscan_kswapd delta" lower %.0f pc_kswapd pc_kswapd "" \
      "Pages scanned by kswapd (background reclaim) in the same interval; system-wide, so other work on the host shows here too."
    fmt_row "5 Page cache: allocstall delta" lower %.0f pc_allocstall pc_allocstall "sl==0" \
      "Sum of allocstall_* growth: allocations that stalled for reclaim."
    fmt_row "6 Idle: server RSS before (KiB)" lower %.0f idle_rss0 idle_rss0 "" \
      "VmRSS of the serving process (shardline; the nginx worker) before the idle connections; shardline's registered buffer arena (config arena_bytes, 64 MiB per shard by default) is allocated and pinned at start-up, so it is here from the first second."
    fmt_row "6 Idle: server RSS with $IDLE_CONNS idle (KiB)" lower %.0f idle_rss1 idle_rss1 "" \
      "VmRSS with $IDLE_CONNS keep-alive connections open, each after one 1 KiB request, then idle for 1 s."
    fmt_row "6 Idle: RSS per idle connection (KiB)" lower %.2f idle_kib_per_conn idle_kib_per_conn "" \
      "The difference divided by the connections: user-space memory each idle connection costs (kernel socket buffers are not in RSS)."
    fmt_row "6 Idle: server fds before" info %.0f idle_fd0 idle_fd0 "" \
      "Open file descriptors of the serving process before."
    fmt_row "6 Idle: server fds with $IDLE_CONNS idle" info %.0f idle_fd1 idle_fd1 "" \
      "The same with the connections open; io_uring direct descriptors (fixed-file table) are not in /proc/PID/fd, so shardline may show none of them."
    fmt_row "H1 HTTPS bulk: throughput (GB/s)" higher %.2f tbulk_gbs tbulk_gbs "ratio>=1.0" \
      "Workload 1 over TLS 1.3 (AES-128-GCM chosen by both servers): $BULK_CONNS keep-alive HTTPS clients (rustls) downloading large.bin; the client decrypts on its one CPU too."
    fmt_row "H1 HTTPS bulk: server CPU s per GiB" lower %.3f tbulk_cpu_gib tbulk_cpu_gib "ratio<=1.0" \
      "Server CPU per GiB of body over HTTPS: sealing included (shardline: in place in the arena slot; nginx: OpenSSL into its buffer, then the socket copy)."
    fmt_row "H1 HTTPS bulk: HTTPS / cleartext CPU per GiB" info %.2f tbulk_vs_clear tbulk_vs_clear "" \
      "Each server's HTTPS CPU per GiB divided by its own cleartext figure (row 1): what TLS costs it."
    fmt_row "H1 HTTPS bulk: server CPU %" info %.0f tbulk_server_pct tbulk_server_pct "" \
      "Server CPU time as a share of one CPU during the HTTPS bulk window."
    fmt_row "H2 HTTPS small under bulk, kept-alive: TTFB p50 (ms)" lower %.3f tttfb_p50 tttfb_p50 "" \
      "$TTFB_RATE 1 KiB GETs/s on one kept-alive HTTPS connection during H1 (SCHED_FIFO prober): request write to first response byte."
    fmt_row "H2 HTTPS small under bulk, kept-alive: TTFB p99 (ms)" lower %.3f tttfb_p99 tttfb_p99 "ratio<=0.25" \
      "The 99th percentile of the same."
    fmt_row "H2 HTTPS small under bulk, kept-alive: TTFB max (ms)" lower %.3f tttfb_max tttfb_max "" \
      "The slowest of the same."
    fmt_row "H3 Handshakes per core: full, TLS 1.3 ECDSA P-256 X25519 (/s)" higher %.0f hs_full_core hs_full_core "ratio>=1.2" \
      "Full handshakes (no resumption) per second of server CPU: $HS_CONNS client workers connect, handshake, GET the 1 KiB file, close; completed handshakes divided by the server's CPU seconds."
    fmt_row "H3 Handshakes per core: resumed (ticket) (/s)" higher %.0f hs_resumed_core hs_resumed_core "ratio>=1.2" \
      "The same with session tickets kept and offered by the client (psk_dhe_ke: a key exchange still, no signature)."
    fmt_row "H3 Handshakes: share resumed in the resumed run (%)" info %.0f hs_resumed_share hs_resumed_share "" \
      "Of the handshakes in the resumed run, the share the server resumed (the first of each worker is full)."
    fmt_row "H3 Handshakes per core: full, X25519MLKEM768 (/s)" higher %.0f hs_pq_core hs_pq_core "" \
      "Full handshakes with the post-quantum hybrid group only (nginx 1.22 with OpenSSL 3.0 has no ML-KEM: n/a or a failure there)."
    fmt_row "H3 Handshakes: full, completed per second (wall)" info %.0f hs_full_rate hs_full_rate "" \
      "What the client achieved in wall-clock time (bounded by the client's CPU when it is below the per-core figure)."
    fmt_row "H3 Handshakes: server CPU us per full handshake" lower %.1f hs_full_us hs_full_us "" \
      "Server CPU per full handshake, kernel TCP work (accept, close) included."
    fmt_row "H4 Handshake flood: offered (/s)" info %.0f flood_offered flood_offered "" \
      "ClientHellos per second of the open-loop flood (loadgen flood: one ClientHello replayed, no client crypto): $FLOOD_FACTOR x each server's own full-handshake rate from H3 (wall), while $BULK_CONNS HTTPS downloads paced to $((FLOOD_PACE_BYTES_PER_S / 1000000)) MB/s each run."
    fmt_row "H4 Handshake flood: answered (/s)" info %.0f flood_done flood_done "" \
      "ClientHellos the server answered with its flight (a key exchange and a signature each); the rest were closed unanswered or held 2 s."
    fmt_row "H4 Handshake flood: paced downloads without the flood (GB/s)" info %.3f flood_base_gbs flood_base_gbs "" \
      "Goodput of the $BULK_CONNS paced HTTPS downloads alone ($((FLOOD_PACE_BYTES_PER_S / 1000000)) MB/s each asked: $(calc "$BULK_CONNS * $FLOOD_PACE_BYTES_PER_S / 1e9") GB/s together)."
    fmt_row "H4 Handshake flood: paced downloads' goodput kept (x)" higher %.2f flood_keep flood_keep "sl>=0.8" \
      "Their goodput during the flood divided by the same downloads' without it."
    fmt_row "H4 Handshake flood: kept-alive 1 KiB TTFB p99 (ms)" lower %.3f flood_p99 flood_p99 "sl<=10" \
      "The kept-alive probe's p99 during the flood."
    fmt_row "H5 Idle HTTPS: RSS per idle TLS connection (KiB)" lower %.2f tidle_kib_per_conn tidle_kib_per_conn "ratio<=0.5" \
      "Workload 6 over TLS: $IDLE_CONNS HTTPS keep-alive connections after one request each, idle: VmRSS growth per connection (the TLS state kept per connection)."
  } >"$RUN/rows.tsv"

  {
    echo "# shardline vs nginx (field-report anchor): side-by-side benchmark"
    echo
    if ((QUICK)); then echo "**Quick mode** (harness check only: tiny file, ~${DURATION_S} s workloads; the numbers mean little)."; echo; fi
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/bench.sh ${BENCH_ARGS[*]}\`"
    echo "- Host: kernel $kernel, CPU \"$cpu_model\" x $(nproc), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM; load average at start $START_LOAD, at end $end_load (other work on the host adds noise)"
    echo "- Servers pinned to CPU $SERVER_CPU: shardline \`$SL_BIN\` (commit $sl_rev, \`serve --shards 1 --cpus $SERVER_CPU\`, default config); $NGINX_VERSION with \`perf/nginx.conf\` (1 worker)"
    echo "- Load generators pinned to CPU $CLIENT_CPU: \`perf/loadgen\` (std-only Rust) and $WRK_VERSION; everything over 127.0.0.1"
    echo "- Fixtures on $fs, $DISK_DESC (\`--disk $DISK\`): large.bin $LARGE_BYTES bytes ($LARGE_MIB MiB), small.bin $SMALL_BYTES bytes, deterministic pseudo-random content; every ranged and full GET is verified byte for byte"
    echo "- Durations: bulk ${DURATION_S} s with $BULK_CONNS connections, measured over [$WARMUP_S s, $DURATION_S s); small probe $TTFB_RATE/s on fresh connections inside that window; small-file rate ${DURATION_S} s with $RATE_CONNS connections; Range: $RANGE_REPS x (aligned + unaligned) of $RANGE_LEN bytes; idle: $IDLE_CONNS connections"
    echo "- Page cache dropped before workloads 1, 4 (each GET) and 5: $DROP_OK; nice level of servers and clients: $NICE"
    echo "- Disk baseline: one O_DIRECT reader of large.bin with 512 KiB reads (dd iflag=direct, cold cache): ${DISK_MBS:-?} MB/s; bulk and Range figures near it are disk-bound"
    echo
    echo "| Workload / metric | Better | shardline | nginx | shardline / nginx | Ahead | Target (issues 4, 18) |"
    echo "|---|---|---:|---:|---:|---|---|"
    awk -F'\t' -f "$HERE/report-rows.awk" -v mode=table "$RUN/rows.tsv"
    echo
    echo "\"Ahead\" names the server ahead by more than 5% (\"tie\" within 5%); \"Better\" is the direction of each row: higher or lower is better, \"info\" rows are context. Ratios are shardline divided by nginx."
    echo
    echo "## What each row means"
    echo
    awk -F'\t' -f "$HERE/report-rows.awk" -v mode=meaning "$RUN/rows.tsv"
    echo
    echo "## Notes from this run"
    echo
    if ((${#FAILURES[@]} + ${#NOTES[@]} == 0)); then echo "- No request errors, no failed verification, both servers started and stopped cleanly."; fi
    local n
    for n in "${FAILURES[@]}"; do echo "- **FAILURE**: $n"; done
    for n in "${NOTES[@]}"; do echo "- $n"; done
    for s in sl ng; do
      n=$(grep -ciE 'panic|error|warn' "$RUN/$s-server.log" 2>/dev/null || true)
      [[ ${n:-0} == 0 ]] || echo "- ${NAME[$s]} log: $n lines matching panic/error/warn, e.g. \`$(grep -iE 'panic|error|warn' "$RUN/$s-server.log" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)\`"
    done
    [[ -s $OUTDIR/nginx/error.log ]] && echo "- nginx error.log: $(wc -l <"$OUTDIR/nginx/error.log") lines, e.g. \`$(head -n 1 "$OUTDIR/nginx/error.log" | cut -c1-200)\`"
    if awk -v a="${V[sl.bulk_wait_pct]:-0}" -v b="${V[ng.bulk_wait_pct]:-0}" 'BEGIN { exit !(a > 5 || b > 5) }'; then
      echo "- **Busy host**: during the bulk window the servers' threads waited for CPU $SERVER_CPU (run queue) $(printf %.0f "${V[sl.bulk_wait_pct]:-0}")% (shardline) and $(printf %.0f "${V[ng.bulk_wait_pct]:-0}")% (nginx, summed over its worker and thread-pool threads) of the time: other work was running there. Latency rows (2) and throughput figures are inflated by it; CPU per GiB and per request are the steadiest comparisons. Rerun on an idle host (or with \`--nice -10\`) before reading the latency targets."
    fi
    echo "- Bulk: longest pause between two reads on one connection: shardline ${V[sl.bulk_gap_ms]:-?} ms, nginx ${V[ng.bulk_gap_ms]:-?} ms (a stall detector; on a busy host it includes the client's own scheduling delays)."
    if [[ -s $RUN/sl-metrics-before-bulk.txt && -s $RUN/sl-metrics-after-bulk.txt ]]; then
      metrics_delta "$RUN/sl-metrics-before-bulk.txt" "$RUN/sl-metrics-after-bulk.txt" >"$RUN/sl-metrics-bulk-delta.txt"
      echo "- shardline's own counters (/metrics) over workloads 1+2, per GiB it sent: $(awk '
        { n = $1; sub(/\{.*/, "", n); v[$1] = $2; if (n == "shardline_bytes_sent_total") bytes += $2 }
        END {
          gib = bytes / 1073741824; if (gib <= 0) { print "no bytes counted"; exit }
          printf "%.2f GiB sent", gib
          split("shardline_ring_enters_total shardline_ring_sqes_total shardline_ring_cqes_total shardline_arena_waits_total", k, " ")
          for (i = 1; i <= 4; i++) { key = k[i]; name = k[i]; sub(/^shardline_/, "", name); sub(/_total$/, "", name)
            printf ", %s %.0f/GiB", name, v[key] / gib }
          for (key in v) if (key ~ /closed_total|requests_total|accept_errors|recv_no_buffers|stray|parked|reclaimed|ring_busy|unqueued|overflow/) { s = key; sub(/^shardline_/, "", s); printf ", %s +%d", s, v[key] }
        }' "$RUN/sl-metrics-bulk-delta.txt")."
    fi
    echo "- Raw outputs of every client and both server logs: \`perf/out/run/\`."
    if [[ -s $RUN/validate.txt ]]; then
      echo
      echo "## perf/validate-no-reclaim.sh (same run, servers still up)"
      echo
      echo '```'
      grep -v '^\[' "$RUN/validate.txt"
      echo '```'
    fi
  } >"$OUT"
  cat "$OUT"
}

# ------------------------------------------------------------------ main
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
ensure_tools
[[ $(nginx -V 2>&1) == *--with-threads* ]] || die "this nginx lacks thread pools (--with-threads); 'aio threads' needs them"
NGINX_VERSION=$(nginx -v 2>&1 | sed 's/^nginx version: //')
WRK_VERSION=$({ wrk -v 2>&1 || true; } | awk 'NR == 1 { print "wrk " $2 }')
command -v cargo >/dev/null || die "cargo is needed to build perf/loadgen (and shardline)"
(($(nproc) >= 2)) || { CLIENT_CPU=$SERVER_CPU; log "one CPU only: clients share it with the servers"; }
if [[ $(id -u) == 0 ]] && chrt -f 10 true 2>/dev/null; then CHRT=(chrt -f 10); else CHRT=(); fi

mkdir -p "$ROOT" "$RUN"
rm -f "$RUN"/*
chmod 755 "$OUTDIR" "$ROOT"

build_tools  # sets SL_BIN
"$SL_BIN" serve --help 2>&1 | grep -q -- '--root' ||
  die "$SL_BIN does not implement 'serve --root ...' yet; to check the harness alone: SHARDLINE_BIN=perf/nginx-as-shardline.sh $0 --quick"
# Newer engines open an admin listener (/metrics) on a fixed port by default; ask for a free one so
# that another shardline on the host cannot make ours fail, and read its counters.
SL_EXTRA=()
[[ $("$SL_BIN" serve --help 2>&1) == *--admin* ]] && SL_EXTRA=(--admin 127.0.0.1:0)
TLS_DIR=$OUTDIR/tls
tls_test_cert "$TLS_DIR"
SL_TLS=(--tls-listen "127.0.0.1:${TLS_PORT[sl]}" --tls-cert "$TLS_DIR/cert.pem" --tls-key "$TLS_DIR/key.pem")

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
(($(ulimit -n) > IDLE_CONNS + 1000)) || die "ulimit -n is $(ulimit -n): too low for $IDLE_CONNS connections"

if [[ $DISK == ram ]]; then
  ramdisk_create "pl-bench-disk-$$" $((LARGE_BYTES + 256 * 1024 * 1024)) "$ROOT"
  DISK_DESC="a ram disk: loop device $RAMDISK_DEV backed by $RAMDISK_IMG"
else
  DISK_DESC="the repository's disk ($(findmnt -no SOURCE -T "$ROOT" 2>/dev/null || echo '?'))"
fi
make_fixture() { # make_fixture NAME BYTES SEED
  local f=$ROOT/$1 stamp=$STAMPDIR/fixture-$1.stamp
  if [[ -f $f && $(stat -c %s "$f") == "$2" && $(cat "$stamp" 2>/dev/null) == "$2 $3" ]]; then return; fi
  log "creating $1 ($2 bytes)"
  rm -f "$f" "$stamp"
  "$LOADGEN" gen --path "$f" --size "$2" --seed "$3" >/dev/null
  chmod 644 "$f"
  echo "$2 $3" >"$stamp"
}
make_fixture large.bin "$LARGE_BYTES" "$LARGE_SEED"
make_fixture small.bin "$SMALL_BYTES" "$SMALL_SEED"
[[ $(stat -f -c %T "$ROOT") == tmpfs ]] && note "the fixtures are on tmpfs: O_DIRECT and page-cache rows mean nothing"
if drop_caches; then DROP_OK=yes; else DROP_OK="no (not permitted: cold-cache and residency rows are not meaningful)"; note "cannot drop the page cache"; fi

# What the disk gives one O_DIRECT reader (512 KiB reads, like both servers' chunks): the bulk and
# Range rows cannot go faster than the disk when the file is read O_DIRECT from a cold cache.
DISK_MBS=$(disk_baseline "$ROOT/large.bin" "$LARGE_MIB")
log "disk ($DISK): one O_DIRECT reader, 512 KiB reads: ${DISK_MBS:-?} MB/s"

T0=$SECONDS
start_server sl
start_server ng
for w in "${WLIST[@]}"; do
  for s in sl ng; do
    ensure_up "$s" "$w"
    log "workload $w: ${NAME[$s]}"
    "w_$w" "$s"
    if ! alive "${PG[$s]}"; then
      # Died during the workload: say so (status 0 = someone sent it SIGTERM), restart, retry once.
      ensure_up "$s" "$w (died during it; retried once)"
      log "workload $w: ${NAME[$s]} (retry)"
      "w_$w" "$s"
    fi
  done
done
if ((VALIDATE)); then
  log "perf/validate-no-reclaim.sh against both servers"
  "$HERE/validate-no-reclaim.sh" --url "http://127.0.0.1:${PORT[sl]}/large.bin" \
    --pid "$(serving_pid "${PG[sl]}")" --client-cpus "$CLIENT_CPU" --seconds 10 --strace-seconds 5 \
    --compare-nginx --nginx-port "${PORT[ng]}" --nginx-pid "$(serving_pid "${PG[ng]}")" \
    >"$RUN/validate.txt" 2>&1 || true
fi
stop_server sl
stop_server ng
log "workloads took $((SECONDS - T0)) s"

report
if ((!QUICK)) && [[ $OUT == "$HERE/RESULTS.md" ]]; then
  # Keep the table in perf/README.md and README.md current (between the bench:begin/end markers).
  sed -n '/^| Workload/,/^$/p' "$OUT" | sed '/^$/d' >"$RUN/table.md"
  for readme in "$HERE/README.md" "$REPO/README.md"; do
    grep -q '<!-- bench:begin -->' "$readme" 2>/dev/null || continue
    awk -v table="$RUN/table.md" '
      /<!-- bench:begin -->/ { print; while ((getline l < table) > 0) print l; close(table); skip = 1; next }
      /<!-- bench:end -->/ { skip = 0 }
      !skip' "$readme" >"$RUN/README.new" && cp "$RUN/README.new" "$readme"
  done
fi

rc=0
unparsed=$(awk -F'\t' '$4 == "" || $5 == "" { print "  " $1 }' "$RUN/rows.tsv")
if [[ -n $unparsed && -n $WORKLOADS ]]; then
  # Only some workloads ran (--workloads): the others' rows are empty by design.
  log "rows without both figures (their workload was not run, or did not measure):"
  printf '%s\n' "$unparsed" >&2
elif [[ -n $unparsed ]]; then
  log "numbers that failed to parse or measure:"
  printf '%s\n' "$unparsed" >&2
  rc=1
fi
if ((${#FAILURES[@]})); then log "${#FAILURES[@]} failure(s), see the Notes section of $OUT"; rc=1; fi
log "wrote $OUT"
exit "$rc"
