#!/usr/bin/env bash
# perf/variants.sh: shardline against itself under config variants, in one run.
#
#   perf/variants.sh [--quick] [--out FILE] [--report-only]
#
# 1. steering = true vs false (issue 5): 2 shards on CPUs 0,1; two load generators, one pinned to
#    each CPU with half the connections; bulk and small-file rate, per-shard accepted connections,
#    and a locality probe (connections from a client on CPU k: share accepted by shard k).
# 2. zerocopy = "off" vs "on" (issue 4): 1 shard on CPU 0, clients on CPU 1; bulk and small under
#    bulk, plus a perf profile of the shard thread under bulk (share of _copy_from_iter).
# 3. wait_batch_usec = 0 / 50 / 200 and shard_tick_budget_bytes = 8 / 2 / 64 MiB (1 shard, CPU 0).
# Each comparison runs twice, interleaved (A B A B, A B C A B C), a fresh server per run, so the
# run-to-run noise is in the table next to the difference. Writes perf/VARIANTS.md (--quick:
# perf/out/variants-quick.md, 64 MiB file, ~2 s workloads, a harness check); raw outputs in
# perf/out/variants/. Exit status 1 when a number did not parse, a client saw errors or wrong
# bytes, or shardline did not exit 0 on SIGTERM. --report-only rewrites the report from the last
# run's numbers (perf/out/variants/results.sh) without running anything.
# Environment: SHARDLINE_BIN (default: cargo build --release, target/release/shardline),
# SHARDLINE_PORT (default: the first free port from 28180).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }

ARGS=("$@")
QUICK=0 OUT='' REPORT_ONLY=0
while (($#)); do
  case $1 in
    --quick) QUICK=1; shift ;;
    --report-only) REPORT_ONLY=1; shift ;;
    --out) [[ $# -ge 2 ]] || usage 2; OUT=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "variants.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

if ((QUICK)); then
  LARGE_MIB=64 DURATION_S=2 WARMUP_S=0.5 PROBE_CONNS=32
  : "${OUT:=$HERE/out/variants-quick.md}"
else
  LARGE_MIB=2048 DURATION_S=10 WARMUP_S=2.5 PROBE_CONNS=64
  : "${OUT:=$HERE/VARIANTS.md}"
fi
REPS=2
LARGE_BYTES=$((LARGE_MIB * 1024 * 1024)) SMALL_BYTES=1024
LARGE_SEED=1 SMALL_SEED=2 # the same fixtures as perf/bench.sh
BULK_CONNS=100 RATE_CONNS=64 TTFB_RATE=50
# The verified ranged GET that rides along every bulk run: unaligned start, a size one connection's
# share of the bulk throughput finishes within the run.
VERIFY_START=$((LARGE_BYTES / 3 + 1000)) VERIFY_BYTES=$(((QUICK ? 4 : 32) * 1024 * 1024))
SERVER_CPU=0 CLIENT_CPU=1 BOTH_CPUS=0,1
OUTDIR=$HERE/out ROOT=$HERE/out/root RUN=$HERE/out/variants
LOADGEN=$HERE/loadgen/target/release/loadgen
free_port() { local p=$1; while port_busy "$p"; do p=$((p + 1)); done; echo "$p"; }

FAILURES=() NOTES=()
failure() { FAILURES+=("$*"); log "FAILURE: $*"; }
note() { NOTES+=("$*"); log "note: $*"; }

# ------------------------------------------------------------------ processes we start
# Each one is started with setsid (its pid is its process group) and stopped by group on exit,
# Ctrl-C, SIGTERM or SIGHUP: servers, load generators and perf alike.
declare -A GROUPS_LIVE=()
LAST_PID=''
spawn() { # spawn CPULIST OUTFILE CMD...: background, pinned, own process group
  local cpus=$1 outfile=$2
  shift 2
  setsid taskset -c "$cpus" "$@" >"$outfile" 2>&1 </dev/null &
  LAST_PID=$!
  GROUPS_LIVE[$LAST_PID]=1
}
reap() { # reap PID: wait for it; returns its exit status
  local rc=0
  wait "$1" || rc=$?
  unset "GROUPS_LIVE[$1]"
  return "$rc"
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM HUP
  set +e
  for pg in "${!GROUPS_LIVE[@]}"; do
    kill_group "$pg" 3
    wait "$pg" 2>/dev/null
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------------ shardline
SL_PG='' SL_ADMIN='' SL_LOG=''
# start_sl TAG CONFIG SHARDS CPULIST: one shardline (the process pinned to CPULIST, its shards on
# the same CPUs), config file CONFIG, admin listener on a free loopback port.
start_sl() {
  local tag=$1 cfg=$2 shards=$3 cpus=$4 i
  SL_LOG=$RUN/$tag.server.log
  port_busy "$PORT" && die "port $PORT is in use (set SHARDLINE_PORT)"
  spawn "$cpus" "$SL_LOG" "$SL_BIN" serve --config "$cfg" --root "$ROOT" \
    --listen "127.0.0.1:$PORT" --shards "$shards" --cpus "$cpus" --admin 127.0.0.1:0
  SL_PG=$LAST_PID
  if ! wait_port "$PORT" "$SL_PG" 15; then
    tail -n 20 "$SL_LOG" >&2 || true
    die "shardline ($tag) did not start listening on port $PORT (log: $SL_LOG)"
  fi
  SL_ADMIN=''
  for ((i = 0; i < 100; i++)); do
    SL_ADMIN=$(sed -n 's|.*admin at \(http://[0-9.:]*\).*|\1|p' "$SL_LOG" | head -n 1)
    [[ -z $SL_ADMIN ]] || break
    sleep 0.05
  done
  [[ -n $SL_ADMIN ]] || failure "$tag: shardline printed no admin address; per-shard counters are missing"
}
# stop_sl TAG: SIGTERM, which must end in exit status 0 within 20 s; log warnings are noted.
stop_sl() {
  local tag=$1 rc=0 n
  if ! alive "$SL_PG"; then
    reap "$SL_PG" || rc=$?
    failure "$tag: shardline had exited (status $rc) before the end of its runs; log: $(tail -n 2 "$SL_LOG" | tr '\n' ' ')"
    return
  fi
  kill_group "$SL_PG" 20 || failure "$tag: shardline did not exit within 20 s of SIGTERM; killed it"
  reap "$SL_PG" || rc=$?
  ((rc == 0)) || failure "$tag: shardline exited with status $rc on SIGTERM (expected 0)"
  n=$(grep -ciE 'panic|error|warn' "$SL_LOG" || true)
  ((${n:-0} == 0)) || note "$tag: server log has $n lines matching panic/error/warn, e.g. \`$(grep -iE 'panic|error|warn' "$SL_LOG" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)\`"
}

# steal_ticks: "CPU0 CPU1" steal ticks from /proc/stat: time the hypervisor ran something else
# while our vCPU had work (a whole-CPU stall that no in-guest counter shows).
steal_ticks() {
  awk '$1 == "cpu0" || $1 == "cpu1" { printf "%s%s", (n++ ? " " : ""), $9 } END { print "" }' /proc/stat
}
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

metrics_snap() { # metrics_snap FILE: shardline's /metrics, empty file when unavailable
  : >"$1"
  [[ -n $SL_ADMIN ]] || return 0
  curl -s --max-time 3 "$SL_ADMIN/metrics" >"$1" 2>/dev/null || : >"$1"
}
# mdelta BEFORE AFTER NAME SHARD: growth of counter NAME{shard="SHARD"} (SHARD = 0, 1, or all:
# summed over the shards); empty when either snapshot lacks it.
mdelta() {
  awk -v key="$3{shard=\"$4\"}" -v pre="$3{shard=\"" -v all="$4" 'FNR == 1 { f++ }
    (all == "all" && index($1, pre) == 1) || $1 == key { v[f] += $2; seen[f] = 1 }
    END { if (seen[1] && seen[2]) printf "%.0f\n", v[2] - v[1] }' "$1" "$2"
}
sum_sent() { # sum_sent BEFORE AFTER: bytes_sent_total growth over every source and shard
  awk 'FNR == 1 { f++ } /^shardline_bytes_sent_total\{/ && /shard="/ { s[f] += $2 }
    END { printf "%.0f\n", s[2] - s[1] }' "$1" "$2"
}

# ------------------------------------------------------------------ workloads
declare -A R=() # R[TAG.metric]: one run's value; TAG = section.variant.rep

# bulk TAG "CPU..." TTFB: 100 keep-alive connections download large.bin in a loop, split evenly
# over one loadgen per listed CPU; with TTFB=1, 50/s 1 KiB GETs on fresh connections meanwhile
# (SCHED_FIFO prober on CPU_CLIENT, as in bench.sh). Server CPU comes from each loadgen's own
# window, [warm-up, end), which they share to within milliseconds.
bulk() {
  local tag=$1 ttfb=$3 cpu f pids=() files=() per ft='' pt='' ttfb_s
  local -a cpus
  read -ra cpus <<<"$2"
  per=$((BULK_CONNS / ${#cpus[@]}))
  if ((ttfb)); then
    spawn "$CLIENT_CPU" "$RUN/$tag.warm.txt" "$LOADGEN" get --addr "127.0.0.1:$PORT" --path /small.bin \
      --seed "$SMALL_SEED" --expect-len "$SMALL_BYTES"
    reap "$LAST_PID" || failure "$tag: warm-up GET of small.bin failed: $(kv "$RUN/$tag.warm.txt" error)"
  fi
  metrics_snap "$RUN/$tag.bulk.m0"
  local st0 st1 t_run=$SECONDS
  st0=$(steal_ticks)
  # One more connection, verified byte for byte: an unaligned ranged GET through the same bulk
  # path while the 100 others run (a buffer reused before the kernel is done with it, with
  # SEND_ZC say, would show here as wrong bytes).
  local fv=$RUN/$tag.verify.txt pv
  spawn "${cpus[0]}" "$fv" "$LOADGEN" get --addr "127.0.0.1:$PORT" --path /large.bin \
    --range "$VERIFY_START-$((VERIFY_START + VERIFY_BYTES - 1))" --seed "$LARGE_SEED"
  pv=$LAST_PID
  for cpu in "${cpus[@]}"; do
    f=$RUN/$tag.bulk-cpu$cpu.txt
    spawn "$cpu" "$f" "$LOADGEN" bulk --addr "127.0.0.1:$PORT" --path /large.bin --conns "$per" \
      --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --pgid "$SL_PG" --expect-len "$LARGE_BYTES"
    pids+=("$LAST_PID") files+=("$f")
  done
  if ((ttfb)); then
    ft=$RUN/$tag.ttfb.txt
    ttfb_s=$(calc "$DURATION_S - $WARMUP_S - 0.5")
    spawn "$CLIENT_CPU" "$ft" "${CHRT[@]}" "$LOADGEN" ttfb --addr "127.0.0.1:$PORT" --path /small.bin \
      --rate "$TTFB_RATE" --duration-s "$ttfb_s" --delay-s "$WARMUP_S" --seed "$SMALL_SEED" \
      --expect-len "$SMALL_BYTES"
    pt=$LAST_PID
  fi
  for cpu in "${!pids[@]}"; do
    reap "${pids[$cpu]}" || failure "$tag: bulk client exited non-zero ($(tail -n 1 "${files[$cpu]}"))"
  done
  [[ -z $pt ]] || reap "$pt" || failure "$tag: ttfb client exited non-zero ($(tail -n 1 "$ft"))"
  if reap "$pv"; then R[$tag.verified]=1; else failure "$tag: verified ranged GET during bulk failed: $(kv "$fv" error)"; fi
  metrics_snap "$RUN/$tag.bulk.m1"
  st1=$(steal_ticks)
  R[$tag.steal]=$(paste <(tr ' ' '\n' <<<"$st0") <(tr ' ' '\n' <<<"$st1") |
    awk -v hz="$CLK_TCK" -v s="$((SECONDS - t_run))" '{ p = 100 * ($2 - $1) / hz / (s > 0 ? s : 1); printf "%s%.0f", (NR > 1 ? "/" : ""), p }')
  R[$tag.jain]=$(for f in "${files[@]}"; do kv "$f" jain_fairness; done | awk '$1 != "" && (m == "" || $1 + 0 < m + 0) { m = $1 } END { print m }')
  R[$tag.conn_min]=$(for f in "${files[@]}"; do kv "$f" conn_mb_per_s_min; done | awk '$1 != "" && (m == "" || $1 + 0 < m + 0) { m = $1 } END { print m }')
  # Aggregate: bytes/s add up; the server's CPU rate is the same process seen by every loadgen.
  local line
  line=$(for f in "${files[@]}"; do
    printf '%s %s %s %s %s\n' "$(kv "$f" bytes_per_s)" "$(kv "$f" server_cpu_s)" "$(kv "$f" window_s)" \
      "$(kv "$f" server_runqueue_wait_s)" "$(kv "$f" errors)"
  done | awk '{ if ($1 == "" || $2 == "" || $3 == "" || $3 <= 0) bad = 1; else { bps += $1; cpu += $2 / $3; w += $4 / $3 } e += $5; n++ }
    END { if (bad || !n || bps <= 0) print "- - - -", e + 0; else printf "%.6f %.6f %.3f %.3f %d\n", bps / 1e9, (cpu / n) / (bps / 1073741824), 100 * cpu / n, 100 * w / n, e }')
  read -r "R[$tag.gbs]" "R[$tag.cpu_gib]" "R[$tag.server_pct]" "R[$tag.wait_pct]" "R[$tag.bulk_errors]" <<<"$line"
  local k
  for k in gbs cpu_gib server_pct wait_pct; do [[ ${R[$tag.$k]} != - ]] || R[$tag.$k]=''; done
  ((${R[$tag.bulk_errors]:-0} == 0)) ||
    failure "$tag: bulk clients counted ${R[$tag.bulk_errors]} errors (first: $(kv "${files[0]}" first_error))"
  if [[ -n $ft ]]; then
    R[$tag.p50]=$(kv "$ft" ttfb_p50_ms) R[$tag.p99]=$(kv "$ft" ttfb_p99_ms) R[$tag.max]=$(kv "$ft" ttfb_max_ms)
    [[ $(kv "$ft" errors) == 0 ]] || failure "$tag: $(kv "$ft" errors) small requests failed (first: $(kv "$ft" first_error))"
  fi
  # shardline's own counters over the whole run (warm-up and drain included): per GiB it sent.
  local m0=$RUN/$tag.bulk.m0 m1=$RUN/$tag.bulk.m1 sent
  if [[ -s $m0 && -s $m1 ]]; then
    sent=$(sum_sent "$m0" "$m1")
    if ((sent > 0)); then
      R[$tag.cqes_gib]=$(calc "$(mdelta "$m0" "$m1" shardline_ring_cqes_total all) * 1073741824 / $sent")
      R[$tag.enters_gib]=$(calc "$(mdelta "$m0" "$m1" shardline_ring_enters_total all) * 1073741824 / $sent")
    fi
    ((${#cpus[@]} < 2)) ||
      R[$tag.bulk_acc]="$(mdelta "$m0" "$m1" shardline_connections_accepted_total 0)/$(mdelta "$m0" "$m1" shardline_connections_accepted_total 1)"
  fi
  log "$tag bulk: ${R[$tag.gbs]:-?} GB/s, ${R[$tag.cpu_gib]:-?} CPU s/GiB${ft:+, TTFB p50 ${R[$tag.p50]:-?} p99 ${R[$tag.p99]:-?} ms}${R[$tag.bulk_acc]:+, accepted ${R[$tag.bulk_acc]}}"
}

# rate TAG "CPU...": 64 keep-alive connections GET small.bin, one wrk -t1 per listed CPU with an
# even share of them; requests/s (sum) and server CPU µs per request.
rate() {
  local tag=$1 cpu f k pids=() files=() per c0 c1 m0 m1
  m0=$RUN/$tag.rate.m0 m1=$RUN/$tag.rate.m1
  local -a cpus
  read -ra cpus <<<"$2"
  per=$((RATE_CONNS / ${#cpus[@]}))
  metrics_snap "$m0"
  c0=$(kv <("$LOADGEN" cpu --pgid "$SL_PG") cpu_s)
  for cpu in "${cpus[@]}"; do
    f=$RUN/$tag.rate-cpu$cpu.txt
    spawn "$cpu" "$f" wrk -t1 -c"$per" -d"${DURATION_S}s" --timeout 10s -s "$HERE/wrk-summary.lua" \
      "http://127.0.0.1:$PORT/small.bin"
    pids+=("$LAST_PID") files+=("$f")
  done
  for cpu in "${!pids[@]}"; do
    reap "${pids[$cpu]}" || failure "$tag: wrk exited non-zero ($(tail -n 1 "${files[$cpu]}"))"
  done
  c1=$(kv <("$LOADGEN" cpu --pgid "$SL_PG") cpu_s)
  metrics_snap "$m1"
  local line
  line=$(for f in "${files[@]}"; do
    printf '%s %s' "$(kv "$f" wrk_requests)" "$(kv "$f" wrk_duration_us)"
    for k in connect read write status timeout; do printf ' %s' "$(kv "$f" "wrk_err_$k")"; done
    echo
  done | awk -v c0="$c0" -v c1="$c1" '{ if (NF < 7 || $2 <= 0) bad = 1; else { req += $1; rps += $1 / ($2 / 1e6) } for (i = 3; i <= NF; i++) e += $i }
    END { if (bad || req <= 0 || c0 == "" || c1 == "") print "- -", e + 0; else printf "%.1f %.3f %d\n", rps, (c1 - c0) * 1e6 / req, e }' 2>/dev/null ||
    echo "- - 1")
  read -r "R[$tag.rps]" "R[$tag.us_req]" "R[$tag.rate_errors]" <<<"$line"
  [[ ${R[$tag.rps]} != - ]] || R[$tag.rps]=''
  [[ ${R[$tag.us_req]} != - ]] || R[$tag.us_req]=''
  ((${R[$tag.rate_errors]:-0} == 0)) || failure "$tag: wrk counted ${R[$tag.rate_errors]} socket/status errors"
  [[ -s $m0 && -s $m1 ]] &&
    R[$tag.rate_acc]="$(mdelta "$m0" "$m1" shardline_connections_accepted_total 0)/$(mdelta "$m0" "$m1" shardline_connections_accepted_total 1)"
  log "$tag rate: ${R[$tag.rps]:-?} req/s, ${R[$tag.us_req]:-?} CPU us/req, accepted ${R[$tag.rate_acc]:-?}"
}

# locality TAG: for k in 0 1, PROBE_CONNS connections (one request each) from a loadgen pinned to
# CPU k; the % of them that shard k accepted. Steering should make it 100; a hash, about 50.
locality() {
  local tag=$1 k f m0 m1 hit=0 all=0 a0 a1 detail=''
  for k in 0 1; do
    f=$RUN/$tag.probe-cpu$k.txt m0=$RUN/$tag.probe$k.m0 m1=$RUN/$tag.probe$k.m1
    metrics_snap "$m0"
    spawn "$k" "$f" "$LOADGEN" idle --addr "127.0.0.1:$PORT" --path /small.bin --conns "$PROBE_CONNS" --settle-s 0
    reap "$LAST_PID" || failure "$tag: locality probe from CPU $k exited non-zero"
    [[ $(kv "$f" errors) == 0 ]] || failure "$tag: locality probe from CPU $k: $(kv "$f" errors) errors ($(kv "$f" first_error))"
    metrics_snap "$m1"
    a0=$(mdelta "$m0" "$m1" shardline_connections_accepted_total 0)
    a1=$(mdelta "$m0" "$m1" shardline_connections_accepted_total 1)
    [[ -n $a0 && -n $a1 ]] || return 0
    if ((k == 0)); then hit=$((hit + a0)); else hit=$((hit + a1)); fi
    all=$((all + a0 + a1))
    detail="$detail${detail:+, }CPU $k: $a0/$a1"
  done
  ((all > 0)) && R[$tag.local]=$(calc "100 * $hit / $all")
  R[$tag.local_detail]=$detail
  log "$tag locality: ${R[$tag.local]:-?}% on the client CPU's shard ($detail)"
}

# profile TAG: perf record -e cpu-clock -g of the shard-0 thread while 100 connections download
# large.bin (client on CPU_CLIENT); the self share of each symbol, and of _copy_from_iter.
profile() {
  local tag=$1 f data rep
  f=$RUN/$tag.bulk-prof.txt data=$RUN/$tag.perf.data rep=$RUN/$tag.perf-report.txt
  local pb tid='' t secs
  spawn "$CLIENT_CPU" "$f" "$LOADGEN" bulk --addr "127.0.0.1:$PORT" --path /large.bin --conns "$BULK_CONNS" \
    --duration-s "$DURATION_S" --warmup-s "$WARMUP_S" --expect-len "$LARGE_BYTES"
  pb=$LAST_PID
  sleep "$WARMUP_S"
  for t in /proc/"$SL_PG"/task/*; do
    [[ $(cat "$t/comm" 2>/dev/null) == shard-0 ]] && tid=${t##*/}
  done
  secs=$(calc "$DURATION_S - $WARMUP_S - 0.5")
  if [[ -n $tid ]]; then
    spawn "$CLIENT_CPU" "$RUN/$tag.perf-record.log" perf record -e cpu-clock -g -t "$tid" -o "$data" -- sleep "$secs"
    reap "$LAST_PID" || note "$tag: perf record exited non-zero ($(tail -n 1 "$RUN/$tag.perf-record.log"))"
  else
    note "$tag: no shard-0 thread found in shardline's process; no profile"
  fi
  reap "$pb" || failure "$tag: bulk client (profile run) exited non-zero"
  [[ -s $data ]] || return 0
  perf report -i "$data" --stdio --no-children --sort symbol -g none --percent-limit 0.5 2>/dev/null |
    grep -E '^ +[0-9.]+%' >"$rep" || true
  # Lines: "  8.72%  [k] _copy_from_iter ..." (perf may append columns after the symbol).
  R[$tag.copy_share]=$(awk '$3 == "_copy_from_iter" { sub(/%/, "", $1); print $1; f = 1 } END { if (!f) print 0 }' "$rep")
  # The loopback's deferred copy of zerocopy pages (skb_copy_ubufs and the memcpy it calls).
  R[$tag.ubufs_share]=$(awk '$3 ~ /^(skb_copy_ubufs|__pi_memcpy|__memcpy|memcpy|memcpy_orig)$/ { sub(/%/, "", $1); s += $1 }
    END { printf "%.2f\n", s }' "$rep")
  R[$tag.samples]=$(perf report -i "$data" --stdio --no-children --sort symbol -g none 2>/dev/null |
    sed -n 's/^# Samples: \([0-9.]*[KM]*\).*/\1/p' | head -n 1)
  R[$tag.top]=$(head -n 10 "$rep" | awk '{ printf "%s`%s` %s", (NR > 1 ? ", " : ""), $3, $1 }')
  log "$tag profile: _copy_from_iter ${R[$tag.copy_share]}% of shard-0 samples (${R[$tag.samples]:-?})"
}

# ------------------------------------------------------------------ sections
declare -A VARIANTS=([steer]="on off" [zc]="off on" [wb]="0 50 200" [tb]="8M 2M 64M")
declare -A SECTION_LOAD=()
config_for() { # config_for SECTION VARIANT: writes the variant's config file, prints its path
  local f=$RUN/cfg-$1-$2.toml
  case $1.$2 in
    steer.on) echo 'steering = true' ;;
    steer.off) echo 'steering = false' ;;
    zc.*) echo "zerocopy = \"$2\"" ;;
    wb.*) echo "wait_batch_usec = $2" ;;
    tb.*) echo "shard_tick_budget_bytes = $((${2%M} * 1024 * 1024))" ;;
  esac >"$f"
  echo "$f"
}

run_section() { # run_section SECTION: every variant REPS times, interleaved
  local sec=$1 rep v tag cfg
  SECTION_LOAD[$sec]=$(cut -d' ' -f1-3 /proc/loadavg)
  for ((rep = 1; rep <= REPS; rep++)); do
    for v in ${VARIANTS[$sec]}; do
      tag=$sec.$v.$rep
      cfg=$(config_for "$sec" "$v")
      if [[ $sec == steer ]]; then
        start_sl "$tag" "$cfg" 2 "$BOTH_CPUS"
        bulk "$tag" "0 1" 0
        rate "$tag" "0 1"
        locality "$tag"
      else
        start_sl "$tag" "$cfg" 1 "$SERVER_CPU"
        bulk "$tag" "$CLIENT_CPU" 1
      fi
      stop_sl "$tag"
    done
  done
  if [[ $sec == zc ]]; then
    if command -v perf >/dev/null && perf --version >/dev/null 2>&1; then
      for v in off on; do
        tag=zc.$v.prof
        start_sl "$tag" "$(config_for zc "$v")" 1 "$SERVER_CPU"
        profile "$tag"
        stop_sl "$tag"
      done
    else
      note "perf is not installed (apt-get install linux-perf): no profile of the shard thread"
    fi
  fi
}

# ------------------------------------------------------------------ report
declare -A VERDICT=() # VERDICT[SECTION.metric.variant] = better | worse | noise (vs the default)
TABLE='' MEANINGS=''
# row SECTION METRIC LABEL BETTER FORMAT MEANING: one table row over the section's variants,
# every run shown ("run 1 / run 2"), the difference of each variant's mean from the first
# (default) variant's, and whether it is beyond the run-to-run noise.
row() {
  local sec=$1 key=$2 label=$3 better=$4 fmt=$5 meaning=$6 v rep vals out
  vals=''
  for v in ${VARIANTS[$sec]}; do
    local runs=''
    for ((rep = 1; rep <= REPS; rep++)); do runs="$runs ${R[$sec.$v.$rep.$key]:-n/a}"; done
    vals="$vals$v$runs"$'\n'
  done
  out=$(awk -v better="$better" -v fmt="$fmt" '
    function num(x) { return x ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
    function show(x) { return num(x) ? sprintf(fmt, x) : x }
    function abs(x) { return x < 0 ? -x : x }
    NF { n++; name[n] = $1; cell = ""; cnt = 0; s = 0; lo[n] = ""; hi[n] = ""
         for (i = 2; i <= NF; i++) {
           cell = cell (i > 2 ? " / " : "") show($i)
           if (num($i)) { x = $i + 0; s += x; cnt++; if (lo[n] == "" || x < lo[n]) lo[n] = x; if (hi[n] == "" || x > hi[n]) hi[n] = x }
           else miss[n] = 1
         }
         cells = cells (n > 1 ? "<br>" : "") "**" $1 "**: " cell
         mean[n] = cnt ? s / cnt : ""
         spread[n] = (cnt > 1 && mean[n] != 0) ? 100 * (hi[n] - lo[n]) / abs(mean[n]) : 0 }
    END {
      d = ""; v = ""; words = ""
      for (k = 2; k <= n; k++) {
        if (better == "info") break
        if (mean[1] == "" || mean[k] == "" || miss[1] || miss[k] || mean[1] == 0) {
          d = d (d == "" ? "" : "<br>") name[k] ": n/a"; v = v " " name[k] ":na"
          words = words (words == "" ? "" : "; ") name[k] ": not measured"; continue
        }
        pct = 100 * (mean[k] - mean[1]) / abs(mean[1])
        sp = spread[1] > spread[k] ? spread[1] : spread[k]
        # gap: distance between the closest runs of the two variants (0 when they overlap), as a
        # % of the default variant mean; it must exceed the larger within-variant spread to count.
        gap = lo[k] > hi[1] ? lo[k] - hi[1] : (hi[k] < lo[1] ? lo[1] - hi[k] : 0)
        gap = 100 * gap / abs(mean[1])
        dir = ((better == "higher") == (pct > 0)) ? "better" : "worse"
        if (gap == 0) cls = "noise"
        else if (gap <= sp) cls = "lean-" dir
        else cls = dir
        d = d (d == "" ? "" : "<br>") sprintf("%s: %+.1f%%", name[k], pct) \
          (cls == "noise" ? " (noise)" : (cls ~ /^lean/ ? " (" dir "? separate runs, small margin)" : " **" cls "**"))
        v = v " " name[k] ":" cls
        words = words (words == "" ? "" : "; ") sprintf("%s is %.1f%% %s than %s (means)", name[k], abs(pct), pct > 0 ? "higher" : "lower", name[1]) \
          (cls == "noise" ? sprintf(", within noise: the runs overlap (run-to-run spread up to %.0f%%)", sp) : \
           cls ~ /^lean/ ? sprintf(", a lean, not a result: every run of %s is %s than every run of %s, but the gap between the closest runs (%.1f%%) is within the run-to-run spread (up to %.0f%%)", name[k], dir, name[1], gap, sp) : \
           sprintf(", %s beyond noise: the closest runs are %.1f%% apart, more than the run-to-run spread (up to %.0f%%)", dir, gap, sp))
      }
      if (better == "info") { d = "—"; words = "" }
      printf "%s\t%s\t%s\t%s\n", cells, d, v, words
    }' <<<"$vals")
  local cellstr diff verd words pair
  IFS=$'\t' read -r cellstr diff verd words <<<"$out"
  for pair in $verd; do VERDICT[$sec.$key.${pair%%:*}]=${pair#*:}; done
  TABLE+="| ${SECTION_TITLE[$sec]} | $label | $better | $cellstr | $diff |"$'\n'
  local dir="$better is better"
  [[ $better == info ]] && dir="context, no direction"
  MEANINGS+="- **${SECTION_TITLE[$sec]}: $label** ($dir): $meaning${words:+ This run: $words.}"$'\n'
}
declare -A SECTION_TITLE=([steer]="1 Steering (2 shards)" [zc]="2 SEND_ZC (1 shard)" [wb]="3a wait_batch_usec (1 shard)" [tb]="3b shard_tick_budget_bytes (1 shard)")

verdict_of() { echo "${VERDICT[$1]:-na}"; }
mean_of() { # mean_of SECTION VARIANT METRIC
  local rep vals=()
  for ((rep = 1; rep <= REPS; rep++)); do vals+=("${R[$1.$2.$rep.$3]:-}"); done
  printf '%s\n' "${vals[@]}" | awk '/^-?[0-9.]+$/ { s += $1; n++ } END { if (n) printf "%.6f\n", s / n }'
}
# default_runs METRIC: the 6 runs of the default single-shard config (zerocopy off = auto on
# loopback, wait_batch_usec 0, shard budget 8 MiB) from sections 2, 3a and 3b: min-max, spread.
default_runs() {
  local k rep vals=()
  for k in zc.off wb.0 tb.8M; do
    for ((rep = 1; rep <= REPS; rep++)); do vals+=("${R[$k.$rep.$1]:-}"); done
  done
  printf '%s\n' "${vals[@]}" | awk -v fmt="$2" '/^-?[0-9.]+$/ { x = $1 + 0; s += x; n++; if (n == 1 || x < lo) lo = x; if (n == 1 || x > hi) hi = x }
    END { if (n) printf "%d runs, " fmt " to " fmt " (spread %.0f%% of the mean)\n", n, lo, hi, 100 * (hi - lo) / (s / n) }'
}

report() {
  local kernel cpu_model end_load sl_rev
  kernel=$(uname -r)
  cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
  end_load=$END_LOAD
  sl_rev=$SL_REV

  row steer gbs "Bulk: throughput (GB/s)" higher %.3f \
    "Body bytes/s received by $BULK_CONNS keep-alive connections downloading large.bin in a loop: two loadgens, pinned to CPU 0 and CPU 1, $((BULK_CONNS / 2)) connections each, over the steady-state window [$WARMUP_S s, $DURATION_S s); the clients share both CPUs with the two shards."
  row steer cpu_gib "Bulk: server CPU s per GiB" lower %.3f \
    "utime+stime of shardline (both shards) per GiB sent in that window: the cost of the data path with and without a connection staying on the CPU whose client sent its SYN."
  row steer bulk_acc "Bulk: accepted per shard (shard 0 / shard 1)" info %s \
    "shardline_connections_accepted_total growth per shard over the bulk run (/metrics): both loadgens open the same number of connections, so the split is even either way; which shard got which client's connections is the locality row."
  row steer rps "Small-file rate: requests/s" higher %.0f \
    "1 KiB GETs per second over $RATE_CONNS keep-alive connections: two wrk -t1 -c$((RATE_CONNS / 2)), one pinned to each CPU."
  row steer us_req "Small-file rate: server CPU µs per request" lower %.2f \
    "shardline's CPU time per request in that run (both shards)."
  row steer rate_acc "Small-file rate: accepted per shard (shard 0 / shard 1)" info %s \
    "Accepted connections per shard during the small-file run."
  row steer local "Locality: % of connections accepted by the shard on the client's CPU" higher %.0f \
    "$PROBE_CONNS connections from a loadgen pinned to CPU 0, then $PROBE_CONNS from one pinned to CPU 1 (over loopback a SYN is processed on the sender's CPU): the share accepted by the shard on that same CPU. Steering's promise is 100; SO_REUSEPORT's hash gives about 50."
  row steer jain "Bulk: fairness (Jain index, worse of the two loadgens)" higher %.3f \
    "Jain's index of per-connection throughput over each loadgen's $((BULK_CONNS / 2)) connections (1 = all equal), the lower of the two. Without steering a loadgen's connections are split by hash between a shard on its own CPU and one on the other CPU, and the two shards carry unequal numbers of connections, so its connections get unequal shares; with steering each shard serves exactly one loadgen."
  row steer conn_min "Bulk: slowest connection (MB/s)" higher %.2f \
    "Throughput of the slowest of the $BULK_CONNS connections over the window."
  row steer wait_pct "Bulk: server run-queue wait % (per CPU window)" info %.0f \
    "Time shardline's threads were runnable but waiting for a CPU, over the window: here mostly the load generators sharing both CPUs, so not a busy-host signal in this section."

  row zc gbs "Bulk: throughput (GB/s)" higher %.3f \
    "$BULK_CONNS connections from CPU $CLIENT_CPU download large.bin (O_DIRECT reads on the server) from the shard on CPU $SERVER_CPU; the client's CPU or the disk usually bounds it."
  row zc cpu_gib "Bulk: server CPU s per GiB" lower %.3f \
    "shardline's CPU time per GiB sent: what SEND_ZC is meant to lower."
  row zc p50 "Small under bulk: TTFB p50 (ms)" lower %.3f \
    "Median connect()-to-first-byte of $TTFB_RATE/s 1 KiB GETs on fresh connections during the bulk load (SCHED_FIFO prober on CPU $CLIENT_CPU)."
  row zc p99 "Small under bulk: TTFB p99 (ms)" lower %.3f \
    "99th percentile of the same (about $(calc "($DURATION_S - $WARMUP_S - 0.5) * $TTFB_RATE" | cut -d. -f1) samples per run, so p99 rests on the 3-4 slowest)."
  row zc cqes_gib "Bulk: io_uring completions per GiB" info %.0f \
    "shardline_ring_cqes_total per GiB sent (whole run): with SEND_ZC each chunk send completes twice (result + notification), so this shows that ZC really was in use."
  row zc server_pct "Bulk: server CPU % of its core" info %.0f \
    "shardline's CPU time over the window as a share of CPU $SERVER_CPU: near 100 means the shard, not the client or the disk, set the throughput."
  row zc wait_pct "Bulk: server run-queue wait %" info %.0f \
    "Time the shard waited for CPU $SERVER_CPU behind other work; above a few % the host was busy and latency rows are inflated."

  row wb cpu_gib "Bulk: server CPU s per GiB" lower %.3f \
    "shardline's CPU time per GiB sent: batching is meant to lower it by waking the shard fewer times."
  row wb gbs "Bulk: throughput (GB/s)" higher %.3f \
    "Aggregate throughput of the same run."
  row wb enters_gib "Bulk: io_uring_enter calls per GiB" info %.0f \
    "shardline_ring_enters_total per GiB sent (whole run): the wake-ups batching is meant to save."
  row wb p99 "Small under bulk: TTFB p99 (ms)" lower %.3f \
    "99th percentile connect()-to-first-byte of the 1 KiB probe during bulk: what the added wait may cost."
  row wb p50 "Small under bulk: TTFB p50 (ms)" lower %.3f \
    "Median of the same."
  row wb wait_pct "Bulk: server run-queue wait %" info %.0f \
    "Busy-host signal, as above."

  row tb p99 "Small under bulk: TTFB p99 (ms)" lower %.3f \
    "99th percentile connect()-to-first-byte of the 1 KiB probe during bulk: a smaller per-tick budget should let a new request in sooner."
  row tb p50 "Small under bulk: TTFB p50 (ms)" lower %.3f \
    "Median of the same."
  row tb gbs "Bulk: throughput (GB/s)" higher %.3f \
    "Aggregate throughput: a budget too small would starve the link with short ticks."
  row tb cpu_gib "Bulk: server CPU s per GiB" lower %.3f \
    "CPU per GiB: more ticks per GiB cost more io_uring_enter calls."
  row tb enters_gib "Bulk: io_uring_enter calls per GiB" info %.0f \
    "shardline_ring_enters_total per GiB sent (whole run)."
  row tb wait_pct "Bulk: server run-queue wait %" info %.0f \
    "Busy-host signal, as above."

  # ---- conclusions, from the verdicts
  local s_steer s_zc s_wb s_tb copy copy_on cpu_off cpu_on saved top_off top_on k v t
  local steer_strong='' steer_lean='' steer_cpu_req=''
  declare -A MNAME=([gbs]="bulk GB/s" [cpu_gib]="bulk CPU s/GiB" [rps]="requests/s" [us_req]="CPU µs/request" [p50]="TTFB p50" [p99]="TTFB p99")
  for k in gbs cpu_gib rps us_req; do
    v=$(verdict_of "steer.$k.off")
    # The verdict is off's against on; say it as what steering (on) does.
    case $v in
      worse) steer_strong+="${steer_strong:+, }on better on ${MNAME[$k]}" ;;
      better) steer_strong+="${steer_strong:+, }off better on ${MNAME[$k]}" ;;
      lean-worse) steer_lean+="${steer_lean:+, }on better on ${MNAME[$k]}" ;;
      lean-better) steer_lean+="${steer_lean:+, }off better on ${MNAME[$k]}" ;;
    esac
    [[ $k == us_req && ($v == worse || $v == lean-worse) ]] && steer_cpu_req=1
  done
  local loc_on loc_off
  loc_on=$(mean_of steer on local) loc_off=$(mean_of steer off local)
  s_steer="Steering does what it promises: connections from a client on CPU k landed on shard k $(printf %.0f "${loc_on:-0}")% of the time with \`steering = true\`, $(printf %.0f "${loc_off:-0}")% without (the kernel's hash). "
  if [[ -z $steer_strong$steer_lean ]]; then
    s_steer+="Throughput, CPU per GiB, requests/s and CPU per request did not differ beyond the run-to-run noise on this 2-core loopback box: the numbers neither support nor refute steering here. Keep the default \`steering = true\`: it costs nothing measurable, and its benefit needs what this box lacks (see below)."
  else
    s_steer+="${steer_strong:+Beyond noise: $steer_strong. }${steer_lean:+Leans (every run of one variant beyond every run of the other, by less than the spread): $steer_lean. }"
    if [[ $steer_lean == *"off better"* && $steer_strong != *"off better"* ]]; then
      s_steer+="A lean towards off is within what loopback's own side effect can do: with steering each client shares its core with the shard that serves it (see below). "
    fi
    if [[ -n $steer_cpu_req ]]; then
      s_steer+="Lower CPU per request with steering is what its mechanism predicts even here: without it, the loopback softirq on the client's CPU hands half the requests to the shard on the other CPU (a cross-CPU wake-up per request, and the socket's cache lines moving between cores); with it, softirq, shard and client stay on one CPU. That is the same hop RSS plus steering saves on a NIC host. "
    fi
    if [[ $steer_strong == *"off better"* ]]; then
      s_steer+="Where off came out ahead beyond noise, these numbers do not support steering on that row. Steering costs one BPF program run per SYN and nothing per packet, so an effect of that size is more likely the scheduling of the load generators on the two shared CPUs than steering itself; rerun before reading it as a cost. The default stays \`steering = true\` for what it does on a NIC host (below), not because of this box's numbers."
    elif [[ $steer_strong == *"on better"* ]]; then
      s_steer+="The numbers support the default \`steering = true\`."
    else
      if [[ $steer_lean == *"off better"* ]]; then
        s_steer+="Only leans, no result, and they point both ways; keep the default \`steering = true\` for what it does on a NIC host (below)."
      else
        s_steer+="Only leans, no result, all towards the default \`steering = true\`; keep it, for that and for what it does on a NIC host (below)."
      fi
    fi
  fi

  copy=${R[zc.off.prof.copy_share]:-} copy_on=${R[zc.on.prof.copy_share]:-}
  cpu_off=$(printf %.3f "$(mean_of zc off cpu_gib)") cpu_on=$(printf %.3f "$(mean_of zc on cpu_gib)")
  top_off=${R[zc.off.prof.top]:-} top_on=${R[zc.on.prof.top]:-}
  s_zc="On loopback the kernel copies SEND_ZC's pages anyway (../shared/FACTS.md; the kernel's msg_zerocopy documentation: packets looped to a local socket incur a deferred copy, skb_copy_ubufs, so that an unread socket cannot hold the sender's pages indefinitely), so \`zerocopy = \"on\"\` can only add its costs here: the notification CQE per send (completions per GiB above), the deferred copy's page allocations, and each buffer held until its notification. "
  case $(verdict_of zc.cpu_gib.on) in
    worse) s_zc+="Measured: ZC on costs more CPU per GiB than off ($cpu_on vs $cpu_off s/GiB), beyond noise$(if [[ $(verdict_of zc.gbs.on) == worse ]]; then echo ", and moves fewer GB/s"; fi). " ;;
    better) s_zc+="Measured: ZC on cost less CPU per GiB than off ($cpu_on vs $cpu_off s/GiB), beyond noise, which loopback should not allow: look at the profile before trusting it. " ;;
    *) s_zc+="Measured: CPU per GiB $cpu_on (on) vs $cpu_off (off) s/GiB ($(verdict_of zc.cpu_gib.on)). " ;;
  esac
  if [[ -n $copy && $cpu_off != 0.000 ]]; then
    saved=$(calc "$cpu_off * $copy / 100")
    s_zc+="With zerocopy off, \`_copy_from_iter\` (the copy of each send into socket buffers) took $copy% of the shard thread's samples under bulk (perf, ${R[zc.off.prof.samples]:-?} samples), about $(printf %.3f "$saved") of its $cpu_off CPU s/GiB. On a NIC with scatter-gather DMA that copy is what SEND_ZC removes, so it would save roughly $(printf %.2f "$saved") CPU s/GiB, less the notification cost. "
    local extra per_send
    extra=$(calc "$(mean_of zc on cqes_gib) - $(mean_of zc off cqes_gib)")
    if awk -v e="$extra" 'BEGIN { exit !(e > 100) }'; then
      per_send=$(calc "$saved / $extra * 1e6")
      s_zc+="That cost is one extra completion per send: ZC on added $(printf %.0f "$extra") completions per GiB, so each send's copy it saves is worth about $(printf %.0f "$per_send") µs of CPU, against a notification that costs one more completion to handle (on the order of a microsecond: an estimate, since on loopback the notification cannot be separated from the deferred copy): the net saving on a NIC should be close to the full copy share. "
    fi
    s_zc+="As a share the saving would be larger there: on loopback the shard's CPU also includes the receiving socket's softirq work, which a NIC host does not do. "
  fi
  if [[ -n $copy_on ]]; then
    s_zc+="The profiles show where the copy goes with ZC on: \`_copy_from_iter\` falls from ${copy:-?}% to $copy_on% of the shard's samples while the loopback's deferred copy (\`skb_copy_ubufs\` and its memcpy) rises from ${R[zc.off.prof.ubufs_share]:-?}% to ${R[zc.on.prof.ubufs_share]:-?}%: the same bytes are still copied, now with page allocation and notification on top. "
  fi
  case $(verdict_of zc.p50.on) in
    better | lean-better) s_zc+="One difference this data does not explain: the small-request TTFB p50 was lower with ZC on ($(printf %.3f "$(mean_of zc on p50)") vs $(printf %.3f "$(mean_of zc off p50)") ms, $(verdict_of zc.p50.on)); small responses never use SEND_ZC (below zerocopy_min_bytes), so it is an effect of the bulk sends around them, and it does not outweigh $(printf %.0f "$(calc "100 * ($cpu_on - $cpu_off) / $cpu_off")")% more CPU per GiB. " ;;
  esac
  if [[ $(verdict_of zc.cpu_gib.on) == worse ]]; then
    s_zc+="Default supported: keep \`zerocopy = \"auto\"\` (off on loopback, where these numbers show it losing; "
  else
    s_zc+="Default supported: keep \`zerocopy = \"auto\"\` (off on loopback, where it did not win in this run and, by the mechanism above, cannot; "
  fi
  s_zc+="on elsewhere, where the copy it removes is the share above of the shard's CPU at bulk). Confirm on a NIC host with section 2 against a remote client: the sign of the CPU-per-GiB difference should flip."

  # Batching and tick budget: list every verdict that is not noise, then pick the sentence.
  local u strong lean wins='' cpuw='' lat='' ent0 ent200
  verdict_lists() { # verdict_lists SECTION VARIANT...: STRONG and LEAN, "50 µs: CPU s/GiB worse, ..."
    local sec=$1 v m x
    shift
    STRONG='' LEAN=''
    for v in "$@"; do
      for m in cpu_gib gbs p50 p99; do
        x=$(verdict_of "$sec.$m.$v")
        case $x in
          better | worse) STRONG+="${STRONG:+; }${VLABEL[$v]} $x on ${MNAME[$m]}" ;;
          lean-*) LEAN+="${LEAN:+; }${VLABEL[$v]} ${x#lean-} on ${MNAME[$m]}" ;;
        esac
      done
    done
  }
  declare -A VLABEL=([50]="50 µs" [200]="200 µs" [2M]="2 MiB" [64M]="64 MiB")
  verdict_lists wb 50 200
  strong=$STRONG lean=$LEAN
  ent0=$(mean_of wb 0 enters_gib) ent200=$(mean_of wb 200 enters_gib)
  s_wb="io_uring_enter per GiB (means): $(printf %.0f "$ent0") at 0, $(printf %.0f "$(mean_of wb 50 enters_gib)") at 50 µs, $(printf %.0f "$ent200") at 200 µs. Against 0, beyond noise: ${strong:-nothing}${lean:+; leans: $lean}. "
  for u in 50 200; do
    if [[ $(verdict_of "wb.cpu_gib.$u") == better && $(verdict_of "wb.p50.$u") != *worse && $(verdict_of "wb.p99.$u") != *worse ]]; then
      wins+="${wins:+ and }${VLABEL[$u]}"
    fi
    [[ $(verdict_of "wb.cpu_gib.$u") != worse ]] || cpuw+="${cpuw:+ and }${VLABEL[$u]}"
    [[ $(verdict_of "wb.p50.$u") != worse && $(verdict_of "wb.p99.$u") != worse ]] || lat+="${lat:+ and }${VLABEL[$u]}"
  done
  if [[ -n $wins ]]; then
    s_wb+="Batching at $wins lowered CPU per GiB beyond noise without a worse small-request latency: the numbers support a non-zero default (the smaller value that wins); rerun once more before changing it."
  else
    if [[ -n $cpuw ]]; then
      local fell=''
      for u in 50 200; do
        if awk -v a="$(mean_of wb "$u" enters_gib)" -v b="$ent0" 'BEGIN { exit !(a != "" && b != "" && a + 0 < 0.95 * b) }'; then fell+="${fell:+ and }${VLABEL[$u]}"; fi
      done
      s_wb+="Batching did not buy CPU: at $cpuw CPU per GiB went up beyond noise; io_uring_enter calls per GiB fell by more than 5% ${fell:+only }at ${fell:-neither value}, so on this box the shard does not wake often enough for fewer wake-ups to pay (this data does not show where the extra CPU goes; the min-wait timer armed on each wait is one candidate). "
    else
      s_wb+="Batching did not lower CPU per GiB beyond noise. "
    fi
    [[ -z $lat ]] || s_wb+="It cost small-request latency beyond noise at $lat: a small request on a fresh connection needs several wake-ups (accept, the request's recv, its send), and with batching a shard with little to do waits up to the batch time at each before it looks at the completion, which is how a 50 µs batch can add more than 50 µs to one small request. "
    s_wb+="The numbers support keeping the default \`wait_batch_usec = 0\` (off). A shard that wakes for nearly every completion at many Gbit/s (real NIC, thousands of connections per shard) may gain where this box cannot show it: rerun there before turning it on."
  fi

  verdict_lists tb 2M 64M
  strong=$STRONG lean=$LEAN
  s_tb="Against 8 MiB, beyond noise: ${strong:-nothing}${lean:+; leans: $lean}. "
  if [[ $(verdict_of tb.p99.2M) == better && $(verdict_of tb.gbs.2M) != *worse ]]; then
    s_tb+="2 MiB gave a lower TTFB p99 beyond noise at no measurable throughput cost: the numbers point to a smaller default; confirm with a longer run before changing it."
  elif [[ -z $strong$lean ]]; then
    s_tb+="The numbers do not distinguish 2, 8 and 64 MiB on this box, where TTFB p99 is dominated by the host's scheduling (the default config's own p99 ranged $(default_runs p99 %.2f | sed 's/ (spread.*//; s/^[0-9]* runs, //') ms over six runs). Keep the default \`shard_tick_budget_bytes = 8388608\`; the budget matters where one shard feeds a fast NIC and a tick can really hold tens of MiB of sends."
  elif [[ "$strong; $lean" != *better* ]]; then
    s_tb+="Every difference that shows, strong or lean, goes against the alternative, none against 8 MiB: the numbers support the default \`shard_tick_budget_bytes = 8388608\`, weakly where only leans show (TTFB p99 here is dominated by the host's scheduling: the default config's own p99 ranged $(default_runs p99 %.2f | sed 's/ (spread.*//; s/^[0-9]* runs, //') ms over six runs)."
  else
    s_tb+="The differences point both ways: the numbers do not single out a better value than the default 8 MiB on this box; keep it, and rerun where one shard feeds a fast NIC."
  fi

  # Stall detector and fairness over each section's bulk runs (every loadgen output).
  local sec stalls='' f
  for sec in steer zc wb tb; do
    stalls+="${stalls:+; }${SECTION_TITLE[$sec]#* }: $(for f in "$RUN/$sec".*.bulk-cpu*.txt; do
      if [[ -e $f ]]; then printf '%s %s %s\n' "$(kv "$f" max_read_gap_ms)" "$(kv "$f" conn_mb_per_s_min)" "$(kv "$f" jain_fairness)"; fi
    done | awk '$1 != "" { if ($1 > g) g = $1; if (m == "" || $2 < m) m = $2; if (j == "" || $3 < j) j = $3 }
      END { printf "longest pause %.0f ms, slowest connection %.2f MB/s, lowest Jain index %.3f", g, m, j }')"
  done
  {
    echo "# shardline against itself: config variants"
    echo
    if ((QUICK)); then echo "**Quick mode** (harness check only: 64 MiB file, ~${DURATION_S} s workloads; the numbers mean little)."; echo; fi
    echo "- Date: $RESULT_DATE; command: \`perf/variants.sh${RESULT_ARGS[*]:+ ${RESULT_ARGS[*]}}\`; shardline \`$SL_BIN\` (commit $sl_rev)"
    echo "- Host: kernel $kernel, CPU \"$cpu_model\" x $(nproc), $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
    echo "- **Load average** (1/5/15 min) before the workloads: $START_LOAD; after: $end_load; at the start of each section: steering ${SECTION_LOAD[steer]:-?}, SEND_ZC ${SECTION_LOAD[zc]:-?}, wait_batch ${SECTION_LOAD[wb]:-?}, tick budget ${SECTION_LOAD[tb]:-?}. This host has 2 CPUs and is shared with other work: a load above ~1 before we start means someone else's processes took CPU time during these runs."
    echo "- Fixtures (\`perf/out/root\`, made as perf/bench.sh makes them): large.bin $LARGE_BYTES bytes ($LARGE_MIB MiB, served with O_DIRECT), small.bin $SMALL_BYTES bytes; every small response and every bulk Content-Length is checked"
    echo "- Each workload ${DURATION_S} s, measured over [$WARMUP_S s, $DURATION_S s); $BULK_CONNS bulk connections, $RATE_CONNS small-file connections, TTFB probe $TTFB_RATE/s; every variant run $REPS times, interleaved (A B A B / A B C A B C), a fresh shardline per run, config file with only the one key changed (\`perf/out/variants/cfg-*.toml\`)"
    echo "- Section 1: \`--shards 2 --cpus 0,1\`, clients on both CPUs; sections 2-3: \`--shards 1 --cpus $SERVER_CPU\`, clients on CPU $CLIENT_CPU; everything over 127.0.0.1"
    echo
    echo "Each cell lists every run of a variant (run 1 / run 2); \"Δ vs default\" compares each variant's mean with the first (default) variant's; **better**/**worse** only when every run of one variant is beyond every run of the other and the gap between the closest runs exceeds the larger run-to-run spread (the spread of a variant is its (max - min) / mean); \"better?\"/\"worse?\" when the runs separate by less than that spread (a lean, worth a rerun, not a result); otherwise \"(noise)\". With two runs per variant, two variants that do not differ at all still separate completely 1 time in 3 by chance: this is a coarse filter, not a significance test."
    echo
    echo "| Comparison | Metric | Better | Runs (run 1 / run 2) | Δ vs default |"
    echo "|---|---|---|---|---|"
    printf '%s' "$TABLE"
    echo
    echo "Default single-shard config, measured 6 times across sections 2, 3a and 3b (zerocopy off = auto on loopback, wait_batch_usec 0, 8 MiB budget): bulk GB/s $(default_runs gbs %.3f); CPU s/GiB $(default_runs cpu_gib %.3f); TTFB p99 ms $(default_runs p99 %.2f). That spread is this host's noise floor for the rows above."
    echo
    echo "## What each row means"
    echo
    printf '%s' "$MEANINGS"
    echo
    echo "## Conclusions: which default the numbers support"
    echo
    echo "Verdicts against the default: better / worse = beyond noise as defined above; lean-better / lean-worse = every run separate, by less than the run-to-run spread; noise = the runs overlap."
    echo
    echo "1. **Steering** (\`steering\`, default true). $s_steer"
    echo "2. **SEND_ZC** (\`zerocopy\`, default auto). $s_zc"
    echo "3. **Completion batching** (\`wait_batch_usec\`, default 0). $s_wb"
    echo "4. **Shard tick budget** (\`shard_tick_budget_bytes\`, default 8 MiB). $s_tb"
    echo
    echo "## What a 2-core loopback box can and cannot show"
    echo
    echo "- **Steering.** Here the \"CPU that received the packet\" is simply the client's CPU (loopback processes a SYN in the sender's softirq), so the locality row shows the BPF program works. What steering buys on a real edge cannot show: there are no NIC RSS queues and IRQs to align with (the work steering saves is the cross-core hop from the CPU that took the interrupt to the shard's CPU, and the cache lines of the socket bouncing between them), no second NUMA node (no remote-memory socket buffers or cross-socket interconnect traffic), and with 2 CPUs shared by clients and server, the bulk rows are set by the load generators' scheduling. What can show is the one hop loopback does have: without steering, the softirq on the client's CPU hands half the connections to the shard on the other CPU (a cross-CPU wake-up per request), which is why CPU per request is the row to watch here. And loopback adds an effect a NIC host does not have: steering puts each connection's client on the same CPU as its shard, so the two take turns on one core, which can cost or help bulk throughput here for reasons that have nothing to do with NIC queues. On a many-core NIC host with RSS and \`scripts/irq-affinity.sh\` applied, one would expect steering on to show lower CPU per GiB and per request (no cross-core softirq-to-shard hand-off, no remote wake-ups), flatter per-shard CPU, and lower tail latency, growing with the core count and doubling down across NUMA nodes."
    echo "- **SEND_ZC.** Loopback always copies (above), so here ZC can only cost; its saving needs a NIC with scatter-gather DMA. The profile share above is the estimate to check there."
    echo "- **Batching and tick budget.** One shard and one client CPU over loopback run far below a fast NIC's rates, so the shard rarely has many completions to gather or 8 MiB of sends in one tick; differences that only show at tens of Gbit/s per shard do not show here."
    echo
    echo "## Profile of the shard thread under bulk (perf record -e cpu-clock -g, self time)"
    echo
    if [[ -n $top_off ]]; then
      echo "- zerocopy off (${R[zc.off.prof.samples]:-?} samples): $top_off"
      echo "- zerocopy on (${R[zc.on.prof.samples]:-?} samples; \`_copy_from_iter\` ${copy_on:-?}%): $top_on"
      echo "- Full reports: \`perf/out/variants/zc.*.prof.perf-report.txt\`."
    else
      echo "- No profile (see notes)."
    fi
    echo
    echo "## Notes from this run"
    echo
    if ((${#FAILURES[@]} + ${#NOTES[@]} == 0)); then echo "- No request errors, no failed verification; every shardline started and exited 0 on SIGTERM."; fi
    local n
    for n in "${FAILURES[@]}"; do echo "- **FAILURE**: $n"; done
    for n in "${NOTES[@]}"; do echo "- $n"; done
    local loc=''
    for t in steer.on.1 steer.off.1 steer.on.2 steer.off.2; do loc="$loc${loc:+; }${t%.*} run ${t##*.}: ${R[$t.local_detail]:-?}"; done
    echo "- Locality probe detail (connections accepted by shard 0/shard 1 from each client CPU): $loc."
    local nver=0 nbulk=0
    for t in "${!R[@]}"; do
      [[ $t == *.gbs ]] && nbulk=$((nbulk + 1))
      [[ $t == *.verified ]] && nver=$((nver + 1))
    done
    echo "- Wrong bytes: each of the $nbulk bulk runs carried one extra connection with a ranged GET of $VERIFY_BYTES bytes from offset $VERIFY_START (unaligned), checked byte for byte against the fixture: $nver verified$( ((nver == nbulk)) && echo ", none failed" || echo "; see the failures above"). The small-request probe checks every 1 KiB body; the 100 bulk connections check Content-Length only."
    echo "- Bulk stall detector and fairness (worst over each section's runs; a pause is the longest gap between two reads on one connection, which on a busy 2-CPU host includes the client's own scheduling delays): $stalls."
    local steals='' sec2
    for sec2 in steer zc wb tb; do
      steals+="${steals:+; }${SECTION_TITLE[$sec2]#* }: $(for t in "${!R[@]}"; do
        if [[ $t == "$sec2".*.steal ]]; then printf '%s %s\n' "${t%.steal}" "${R[$t]}"; fi
      done | sort | awk '{ split($2, a, "/"); if (a[1] + 0 > m0) m0 = a[1] + 0; if (a[2] + 0 > m1) m1 = a[2] + 0; if (a[1] + 0 >= 5 || a[2] + 0 >= 5) hi = hi (hi ? ", " : "") $1 " " $2 }
        END { printf "up to %d%% (CPU 0) / %d%% (CPU 1)%s", m0, m1, hi ? " (runs at 5% or more: " hi ")" : "" }')"
    done
    local stalls2='' ft2 tg
    for ft2 in "$RUN"/*.ttfb.txt; do
      [[ -e $ft2 ]] || continue
      tg=${ft2##*/} tg=${tg%.ttfb.txt}
      stalls2+=$(sed -n 's/^samples=//p' "$ft2" | tr ' ' '\n' | awk -F'[:/]' -v tag="$tg" -v st="${R[$tg.steal]:-?}" -v rate="$TTFB_RATE" -v w="$WARMUP_S" '
        $3 + 0 > 50 { n++; if ($3 + 0 > m) { m = $3 + 0; at = $1 } }
        END { if (n) printf "%s%s: %d over 50 ms, worst %.0f ms (request #%d, sent %.1f s into the run; steal CPU 0/1 over the run %s%%)", "; ", tag, n, m, at, w + at / rate, st }')
    done
    [[ -n $stalls2 ]] || stalls2='; none'
    echo "- Small-request stalls (requests over 50 ms to first byte; a run of them sent 20 ms apart that all got their first byte at about the same moment means the shard did not run for that long): ${stalls2#; }."
    echo "- Hypervisor steal (/proc/stat: time this VM's CPU 0 / CPU 1 had work but the host ran something else; a stall no in-guest counter shows) per bulk run: $steals."
    echo "- The profile uses cpu-clock in a VM: time with interrupts disabled (softirq work, spinlock sections) is attributed to the point where they are re-enabled, hence the large \`_raw_spin_unlock_irqrestore\`; shares are of all the shard thread's samples."
    echo "- Raw outputs (loadgen, wrk, /metrics snapshots, server logs, perf data): \`perf/out/variants/\`."
  } >"$OUT"
  cat "$OUT"
}

# ------------------------------------------------------------------ main
if ((REPORT_ONLY)); then
  [[ -s $RUN/results.sh ]] || die "no $RUN/results.sh: run perf/variants.sh first"
  # shellcheck source=/dev/null
  source "$RUN/results.sh"
  [[ ${RESULT_QUICK:-} == "$QUICK" ]] || die "the last run was $( ((RESULT_QUICK)) && echo "--quick" || echo "a full run"): pass the same mode"
  report >/dev/null
  log "wrote $OUT (from $RUN/results.sh)"
  exit 0
fi
for t in taskset setsid pgrep ss curl wrk; do command -v "$t" >/dev/null || die "$t is needed (perf/bench.sh installs it)"; done
command -v cargo >/dev/null || die "cargo is needed to build perf/loadgen and shardline"
(($(nproc) >= 2)) || die "variants.sh needs CPUs 0 and 1"
if [[ $(id -u) == 0 ]] && chrt -f 10 true 2>/dev/null; then CHRT=(chrt -f 10); else CHRT=(); fi
mkdir -p "$ROOT" "$RUN"
rm -f "$RUN"/*
chmod 755 "$OUTDIR" "$ROOT"

build_tools  # sets SL_BIN
SL_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$REPO" diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || SL_REV="$SL_REV (+ uncommitted changes)"
[[ -z ${SHARDLINE_BIN:-} ]] || SL_REV="unknown (SHARDLINE_BIN)"
"$SL_BIN" serve --help 2>&1 | grep -q -- '--admin' || die "$SL_BIN has no 'serve --admin': too old for variants.sh"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
ensure_fixture "$LOADGEN" "$ROOT" "$OUTDIR" large.bin "$LARGE_BYTES" "$LARGE_SEED"
ensure_fixture "$LOADGEN" "$ROOT" "$OUTDIR" small.bin "$SMALL_BYTES" "$SMALL_SEED"
[[ $(stat -f -c %T "$ROOT") == tmpfs ]] && note "the fixtures are on tmpfs: O_DIRECT is refused there, so bulk reads are buffered"
PORT=${SHARDLINE_PORT:-$(free_port 28180)}

START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $START_LOAD"
T0=$SECONDS
for sec in steer zc wb tb; do
  log "section $sec: variants ${VARIANTS[$sec]}"
  run_section "$sec"
done
END_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
log "workloads took $((SECONDS - T0)) s; load average after: $END_LOAD"
# Everything the report needs, so that --report-only can rebuild it.
RESULT_QUICK=$QUICK RESULT_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
RESULT_ARGS=("${ARGS[@]}")
declare -p R SECTION_LOAD FAILURES NOTES START_LOAD END_LOAD SL_BIN SL_REV RESULT_QUICK RESULT_DATE RESULT_ARGS >"$RUN/results.sh"

report >/dev/null
log "wrote $OUT"
rc=0
unparsed=$(grep -E '^\| ' "$OUT" | grep -E 'n/a' | cut -d'|' -f2-3 || true)
if [[ -n $unparsed ]]; then
  log "numbers that failed to parse or measure:"
  printf '%s\n' "$unparsed" >&2
  rc=1
fi
if ((${#FAILURES[@]})); then log "${#FAILURES[@]} failure(s), see the Notes section of $OUT"; rc=1; fi
exit "$rc"
