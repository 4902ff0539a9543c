#!/usr/bin/env bash
# perf/cache-isolation.sh: the pull-through cache against the shard-per-core design (issue 29),
# with the cache on the host's own disk (not tmpfs), the origin nginx on loopback with no
# added latency:
#   - isolation: a client pinned to CPU 1 (steered to shard 1) fetches a cached 1 MiB object
#     in a loop (wrk, one connection); its p99 alone and while a client on CPU 0 downloads a
#     cold 2 GiB object through shard 0. The same for a 1 MiB file of the local root, as the
#     control;
#   - scrub: a 1 KiB cached hit's p99 on shard 0 alone and while the background scrub
#     (cache_scrub_bytes_per_s, SCRUB_RUNS: 25 and 100 MiB/s) reads the cache there, and at
#     100 MiB/s on shard 1 (cache_scrub_shard: the work is that shard's CPU's); as the
#     control, the same while another process on CPU 0 reads the cache's disk with O_DIRECT at
#     OUTSIDE_RATE (100 MiB/s), checking nothing;
#   - nothing blocks: strace of the process during a cold 1 GiB fill, counting fdatasync,
#     fsync, openat, openat2, unlinkat and futex per thread (shard-N against the rest);
#   - CPU: shardline's own CPU seconds per GiB for a cold download and for the warm one after,
#     the same for lancache-style nginx, and (with perf installed) shardline's profile of both;
#   - cold rate: a cold 1 GiB download, shardline beside nginx set up as lancache (slice 1m,
#     proxy_cache_lock), same origin, same disk; the median of RUNS runs;
#   - restart: examples/cache_restart on the same disk: a journal written through 1M objects x
#     4 blocks with a churn history 10x that (compacted by the fill's rule), then a start-up's
#     replay in a process of its own: journal against live bytes, time to a ready index (RUNS
#     opens, the page cache dropped before the first), peak RSS.
#
#   perf/cache-isolation.sh [--runs N] [--out FILE]
#   perf/cache-isolation.sh --scrub-only [--chunk-bytes N] [--block-bytes N] [--scrub-hit PATH]
#                           [--out FILE]
#
# --scrub-only runs the scrub rows alone (over two cached 2 GiB objects) and writes only them:
# to tell what the scrub's cost on its shard comes from, --chunk-bytes sets chunk_bytes (the
# scrub's read size; the tick budgets follow; --block-bytes sets cache_block_bytes, at most half
# of it), --scrub-hit the path the hits ask for
# (/small.bin: a 1 KiB file of the local root, no disk read), and SHARDLINE_BIN a binary
# built otherwise (e.g. with the checksum step taken out).
#
# Needs root (strace -p, drop_caches), nginx, curl, wrk, strace. Writes perf/CACHE-ISOLATION.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=fill-lib.sh
source "$HERE/fill-lib.sh"
RUNS=5 OUT=$HERE/CACHE-ISOLATION.md SCRUB_ONLY="" CHUNK_BYTES="" BLOCK_BYTES="" SCRUB_HIT=/pull/small.bin
while (($#)); do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --scrub-only) SCRUB_ONLY=1; shift ;;
    --chunk-bytes) CHUNK_BYTES=$2; shift 2 ;;
    --block-bytes) BLOCK_BYTES=$2; shift 2 ;;
    --scrub-hit) SCRUB_HIT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "cache-isolation.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in nginx curl wrk strace; do
  if ! command -v "$tool" >/dev/null; then
    log "installing $tool (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null ||
      die "$tool is needed (Debian package $tool)"
  fi
done
[[ $(nproc) -ge 2 ]] || die "needs 2 CPUs (a client on each)"
# The origin's files live in RAM (the origin is not what is measured); both caches and
# shardline's root on the host's disk.
WORK=$(mktemp -d /dev/shm/pl-iso-XXXXXX)
MNT=$(mktemp -d /var/tmp/pl-iso-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK" "$MNT"
}
trap cleanup EXIT
log "building shardline (release)"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml"
SL=${SHARDLINE_BIN:-$REPO/target/release/shardline}

mkdir -p "$WORK/origin/pull" "$MNT/root" "$MNT/sl-cache"
log "origin files: 1 GiB and 2 GiB objects, 1 MiB hot objects"
head -c $((1 << 30)) /dev/urandom >"$WORK/origin/pull/big.bin"
head -c $((2 << 30)) /dev/urandom >"$WORK/origin/pull/huge.bin"
head -c $((1 << 20)) /dev/urandom >"$WORK/origin/pull/hot.bin"
head -c 1024 /dev/urandom >"$WORK/origin/pull/small.bin"
cp "$WORK/origin/pull/hot.bin" "$MNT/root/hot.bin"
cp "$WORK/origin/pull/small.bin" "$MNT/root/small.bin"
# Each cold download asks for a name never asked before (a symlink to the same bytes).
for i in $(seq 0 $((RUNS + 10))); do
  ln -s big.bin "$WORK/origin/pull/cold$i.bin"
  ln -s huge.bin "$WORK/origin/pull/fill$i.bin"
done
DELAY_MS=0
LANCACHE_UPSTREAM_PORT=18081
fill_setup
# The origin on CPU 0, beside the cold client: CPU 1 is the hit loop's.
taskset -pc 0 "$(cat "$WORK/nginx-origin/pid")" >/dev/null

PORT=18090 ADMIN=18091
# write_config SCRUB_BYTES_PER_S [SCRUB_SHARD]: shardline's configuration (the scrub's rate and
# shard are reloadable).
write_config() {
  cat >"$WORK/shardline.toml" <<EOF
cache_dir = "$MNT/sl-cache"
admin = "127.0.0.1:$ADMIN"
cache_scrub_bytes_per_s = $1
cache_scrub_shard = ${2:-0}
$([[ -z $BLOCK_BYTES ]] || echo "cache_block_bytes = $BLOCK_BYTES")
$(if [[ -n $CHUNK_BYTES ]]; then
  printf 'chunk_bytes = %s\ntick_budget_bytes = %s\nshard_tick_budget_bytes = %s\n' "$CHUNK_BYTES" \
    "$((CHUNK_BYTES > 1048576 ? CHUNK_BYTES : 1048576))" "$((CHUNK_BYTES > 1048576 ? 2 * CHUNK_BYTES : 2097152))"
fi)
[[origin]]
prefix = "/pull/"
url = "http://127.0.0.1:$ORIGIN_PORT"
EOF
}
write_config 0
"$SL" serve --config "$WORK/shardline.toml" --root "$MNT/root" --listen "127.0.0.1:$PORT" \
  --shards 2 2>"$WORK/shardline.log" &
SLPID=$!
PIDS+=("$SLPID")
wait_port "$PORT" "$SLPID" 20 || die "shardline did not start: $(tail -5 "$WORK/shardline.log")"
URL=http://127.0.0.1:$PORT
curl -sf -o /dev/null "$URL/pull/hot.bin" || die "the warm-up fetch failed"
curl -sf -o /dev/null "$URL/pull/small.bin" || die "the warm-up fetch failed"

# cpu_ticks PID: user + system clock ticks the process has used.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
# p99_ms PATH [CPU]: one connection on CPU (default 1) for 6 s; wrk's p99 in ms.
p99_ms() {
  taskset -c "${2:-1}" wrk -t1 -c1 -d6s --latency "$URL$1" 2>/dev/null |
    awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 }
      else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }
      printf "%.3f", v }'
}
# beside_cold PATH N: PATH's p99 while a client on CPU 0 downloads fill<N>.bin cold.
beside_cold() {
  taskset -c 0 curl -sf -o /dev/null "$URL/pull/fill$2.bin" &
  local c=$!
  sleep 0.3
  p99_ms "$1"
  wait "$c"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# lock_busy: times the shards found the fill's lock held (and did that work at a later tick).
lock_busy() { curl -sf "http://127.0.0.1:$ADMIN/metrics" | awk '$1 ~ /^shardline_cache_lock_busy_total/ { s += $2 } END { printf "%.0f", s }'; }
HA=() HB=() LA=() LB=()
if [[ -n $SCRUB_ONLY ]]; then
  log "scrub only: two cold 2 GiB objects cached for the scrub to read"
  curl -sf -o /dev/null "$URL/pull/fill0.bin" && curl -sf -o /dev/null "$URL/pull/fill1.bin" ||
    die "the fills failed"
  sync
fi
log "isolation: 1 MiB hits on shard 1, alone and beside a cold 2 GiB fill on shard 0, 5 rounds"
BUSY0=$(lock_busy)
for round in 0 1 2 3 4; do
  [[ -n $SCRUB_ONLY ]] && break
  HA+=("$(p99_ms /pull/hot.bin)")
  HB+=("$(beside_cold /pull/hot.bin $((2 * round)))")
  sync
  LA+=("$(p99_ms /hot.bin)")
  LB+=("$(beside_cold /hot.bin $((2 * round + 1)))")
  sync
  log "round $round: cached ${HA[-1]} / ${HB[-1]} ms, local ${LA[-1]} / ${LB[-1]} ms"
done
HIT_ALONE=$(median "${HA[@]:-0}") HIT_BESIDE=$(median "${HB[@]:-0}")
LOCAL_ALONE=$(median "${LA[@]:-0}") LOCAL_BESIDE=$(median "${LB[@]:-0}")
ISOLATION_BUSY=$(($(lock_busy) - BUSY0))

# Rows "RATE SHARD": the scrub beside the hits (shard 0) at two rates, then on the other shard
# (its CPU's work is that shard's: the hits should not see it).
SCRUB_RUNS=${SCRUB_RUNS:-"26214400:0 104857600:0 104857600:1"}
scrub_bytes() { curl -sf "http://127.0.0.1:$ADMIN/metrics" | awk '$1 ~ /^shardline_cache_scrub_bytes_total/ { s += $2 } END { printf "%.0f", s }'; }
SCRUB_ROWS=""
for run in $SCRUB_RUNS; do
  rate=${run%:*} scrub_shard=${run#*:}
  log "scrub: 1 KiB hits on shard 0, alone and while the scrub reads the cache at $rate B/s on shard $scrub_shard, 5 rounds"
  SA=() SB=() SR=()
  for round in 0 1 2 3 4; do
    SA+=("$(p99_ms "$SCRUB_HIT" 0)")
    write_config "$rate" "$scrub_shard"
    kill -HUP "$SLPID"
    b0=$(scrub_bytes)
    for _ in $(seq 200); do (($(scrub_bytes) > b0)) && break; sleep 0.05; done
    b0=$(scrub_bytes) t0=$(date +%s.%N)
    SB+=("$(p99_ms "$SCRUB_HIT" 0)")
    SR+=("$(calc "($(scrub_bytes) - $b0) / ($(date +%s.%N) - $t0) / 1000000")")
    write_config 0
    kill -HUP "$SLPID"
    sleep 0.5
    log "round $round: alone ${SA[-1]} ms, with the scrub ${SB[-1]} ms (scrub ${SR[-1]} MB/s)"
  done
  a=$(median "${SA[@]}") b=$(median "${SB[@]}")
  SCRUB_ROWS+="| the scrub, shard $scrub_shard | $(calc "$rate / 1000000") | $a | $b | $(calc "$b / $a") | $(median "${SR[@]}") | ${SA[*]} / ${SB[*]} |"$'\n'
done

# The control for the scrub rows: the same disk reads made by another process. A reader on
# CPU 0 (the scrubbing shard's) reads the cache's largest data file with O_DIRECT, one 256 KiB
# read (the scrub's block) every 256 KiB / OUTSIDE_RATE seconds, and checks nothing; shardline
# only serves the hits. If the hits' p99 rises as much, the cost is the read's own (the block
# layer, the disk's interrupt on that CPU), not the scrub's work on the shard.
OUTSIDE_RATE=${OUTSIDE_RATE:-104857600} # 0: no control row
BIGGEST=$(find "$MNT/sl-cache" -type f -size +100M -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2)
outside_reader() {
  exec taskset -c 0 python3 - "$BIGGEST" "$OUTSIDE_RATE" "$WORK/outside-bytes" <<'PY'
import mmap, os, signal, sys, time
path, rate, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
block = 262144
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
size = os.fstat(fd).st_size // block * block
buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT needs
done, off, start = 0, 0, time.monotonic()


def stop(*_):
    with open(out, "w") as f:
        f.write(str(done))
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
while True:
    os.preadv(fd, [buf], off)
    done += block
    off = (off + block) % size
    time.sleep(max(0.0, start + done / rate - time.monotonic()))
PY
}
OUTSIDE_ROW=""
if [[ -n $BIGGEST && $OUTSIDE_RATE != 0 ]]; then
  log "control: 1 KiB hits on shard 0 while another process reads $BIGGEST at $OUTSIDE_RATE B/s (O_DIRECT, CPU 0), 5 rounds"
  OA=() OB=() OR=()
  for round in 0 1 2 3 4; do
    OA+=("$(p99_ms "$SCRUB_HIT" 0)")
    echo 0 >"$WORK/outside-bytes"
    outside_reader &
    reader=$!
    t0=$(date +%s.%N)
    OB+=("$(p99_ms "$SCRUB_HIT" 0)")
    kill "$reader"
    wait "$reader" 2>/dev/null || true
    OR+=("$(calc "$(cat "$WORK/outside-bytes") / ($(date +%s.%N) - $t0) / 1000000")")
    log "round $round: alone ${OA[-1]} ms, beside the reader ${OB[-1]} ms (${OR[-1]} MB/s)"
  done
  a=$(median "${OA[@]}") b=$(median "${OB[@]}")
  OUTSIDE_ROW="| another process, CPU 0, no checksum (control) | $(calc "$OUTSIDE_RATE / 1000000") | $a | $b | $(calc "$b / $a") | $(median "${OR[@]}") | ${OA[*]} / ${OB[*]} |"
fi

# scrub_report: the scrub section of the report.
scrub_report() {
  echo "## Scrub: p99 of 1 KiB hits ($SCRUB_HIT) on shard 0 (wrk, one connection on CPU 0, 6 s), median of 5 rounds"
  echo
  echo "The scrub runs on the shard named in the row (cache_scrub_bytes_per_s and cache_scrub_shard set,"
  echo "then the rate back to 0, by SIGHUP each round); the hits are shard 0's."
  [[ -z $CHUNK_BYTES ]] || echo "chunk_bytes = $CHUNK_BYTES (the scrub's reads are at most that)."
  [[ -z $BLOCK_BYTES ]] || echo "cache_block_bytes = $BLOCK_BYTES."
  echo "The control row makes the same reads from another process on CPU 0 (O_DIRECT, one 256 KiB"
  echo "read every 2.5 ms at 100 MiB/s, nothing checked) while shardline only serves the hits."
  echo
  echo "| who reads the disk | rate set (MB/s) | alone (ms) | while it reads (ms) | ratio (target <= 1.1) | MB/s held | rounds alone / with |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s' "$SCRUB_ROWS"
  [[ -n $OUTSIDE_ROW ]] && echo "$OUTSIDE_ROW"
  echo
}
if [[ -n $SCRUB_ONLY ]]; then
  {
    echo "# The scrub's cost on its shard (perf/cache-isolation.sh --scrub-only)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) vCPU, $(uname -r), at $(git -C "$REPO" rev-parse --short HEAD); binary $SL."
    echo
    scrub_report
  } >"$OUT"
  log "wrote $OUT"
  cat "$OUT"
  exit 0
fi
log "strace during a cold 1 GiB fill"
strace -f -qq -e trace=fdatasync,fsync,openat,openat2,unlinkat,futex -o "$WORK/strace" \
  -p "$SLPID" &
STRACE=$!
sleep 1
BUSY0=$(lock_busy)
curl -sf -o /dev/null "$URL/pull/cold0.bin"
sleep 0.5
kill -INT "$STRACE"
wait "$STRACE" 2>/dev/null || true
STRACE_BUSY=$(($(lock_busy) - BUSY0))
declare -A COMM
for t in /proc/"$SLPID"/task/*; do COMM[$(basename "$t")]=$(cat "$t/comm"); done
# A call's first line ("TID name(args"); "<... name resumed>" lines continue one already counted.
STRACE_ROWS=$(awk '$2 ~ /^[a-z0-9_]+\(/ { print $1, $2 }' "$WORK/strace" | sed -E 's/\(.*//' |
  while read -r tid call; do
    name=${COMM[$tid]:-gone}
    [[ $name == shard-* ]] && who=shard || who=$name
    echo "$who $call"
  done | sort | uniq -c | awk '{ printf "| %s | %s | %d |\n", $2, $3, $1 }')
SHARD_BLOCKING=$(printf '%s\n' "$STRACE_ROWS" |
  awk -F'|' '$2 == " shard " && $3 ~ /fdatasync|fsync|openat|unlinkat/ { s += $4 } END { print s + 0 }')
SHARD_FUTEX=$(printf '%s\n' "$STRACE_ROWS" |
  awk -F'|' '$2 == " shard " && $3 ~ /futex/ { s += $4 } END { print s + 0 }')
sync

log "CPU per GiB: cold, then warm"
t0=$(cpu_ticks "$SLPID")
curl -sf -o /dev/null "$URL/pull/cold1.bin"
t1=$(cpu_ticks "$SLPID")
curl -sf -o /dev/null "$URL/pull/cold1.bin"
t2=$(cpu_ticks "$SLPID")
COLD_CPU=$(calc "($t1 - $t0) / $TICK")
WARM_CPU=$(calc "($t2 - $t1) / $TICK")
sync
# The same two downloads through lancache-style nginx (its one process: master_process off).
LCPID=$(cat "$WORK/lancache/pid")
LC_NAME=cold$((RUNS + 3)).bin
t0=$(cpu_ticks "$LCPID")
curl -sf -o /dev/null "http://127.0.0.1:$LANCACHE_PORT/pull/$LC_NAME"
t1=$(cpu_ticks "$LCPID")
curl -sf -o /dev/null "http://127.0.0.1:$LANCACHE_PORT/pull/$LC_NAME"
t2=$(cpu_ticks "$LCPID")
LC_COLD_CPU=$(calc "($t1 - $t0) / $TICK")
LC_WARM_CPU=$(calc "($t2 - $t1) / $TICK")
sync

# profile_run OUT NAME [PID BASE_URL]: perf samples of a server (shardline by default, every
# thread) while it serves NAME once.
profile_run() {
  perf record -q -F 999 -g -p "${3:-$SLPID}" -o "$1" -- sleep 600 >/dev/null 2>&1 &
  local perf_pid=$!
  sleep 1
  curl -sf -o /dev/null "${4:-$URL}/pull/$2"
  kill -INT "$perf_pid"
  wait "$perf_pid" 2>/dev/null || true
}
# top_rows COLD WARM: the 12 top symbols of COLD's samples, beside the same symbols in WARM.
top_rows() {
  awk -F'\t' 'NR == FNR { warm[$2] = $1; next }
    { if (FNR <= 12) { top[FNR] = $2; cold[$2] = $1 } }
    END {
      for (i = 1; i <= 12 && (i in top); i++) printf "| `%s` | %d | %d |\n", top[i], cold[top[i]], warm[top[i]]
    }' "$2" "$1"
}
total_samples() { awk -F'\t' '{ s += $1 } END { print s + 0 }' "$1"; }
# symbol_samples DATA: "samples symbol" per symbol, every thread together.
symbol_samples() {
  perf report -i "$1" --no-children --sort sym -g none -n --stdio 2>/dev/null |
    awk '/^ +[0-9.]+%/ { n = $2; $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, ""); print n "\t" $0 }'
}
PROFILE_ROWS=""
if command -v perf >/dev/null; then
  log "profile: shardline serving a cold 1 GiB download, then the same warm (perf record -g)"
  PROF_NAME=cold$((RUNS + 2)).bin
  profile_run "$WORK/cold.perf" "$PROF_NAME"
  profile_run "$WORK/warm.perf" "$PROF_NAME"
  symbol_samples "$WORK/cold.perf" >"$WORK/cold.samples"
  symbol_samples "$WORK/warm.perf" >"$WORK/warm.samples"
  PROFILE_ROWS=$(top_rows "$WORK/cold.samples" "$WORK/warm.samples")
  PROFILE_TOTALS="$(total_samples "$WORK/cold.samples") | $(total_samples "$WORK/warm.samples")"
  log "profile: lancache-style nginx serving a cold 1 GiB download, then the same warm"
  LC_PROF_NAME=cold$((RUNS + 4)).bin
  profile_run "$WORK/lc-cold.perf" "$LC_PROF_NAME" "$LCPID" "http://127.0.0.1:$LANCACHE_PORT"
  profile_run "$WORK/lc-warm.perf" "$LC_PROF_NAME" "$LCPID" "http://127.0.0.1:$LANCACHE_PORT"
  symbol_samples "$WORK/lc-cold.perf" >"$WORK/lc-cold.samples"
  symbol_samples "$WORK/lc-warm.perf" >"$WORK/lc-warm.samples"
  LC_PROFILE_ROWS=$(top_rows "$WORK/lc-cold.samples" "$WORK/lc-warm.samples")
  LC_PROFILE_TOTALS="$(total_samples "$WORK/lc-cold.samples") | $(total_samples "$WORK/lc-warm.samples")"
else
  log "perf is not installed: no profile"
fi

log "cold rate: $RUNS cold 1 GiB downloads each, shardline and lancache-style nginx"
SL_RATES=() LC_RATES=()
for i in $(seq 2 $((RUNS + 1))); do
  s=$(curl -sf -o /dev/null -w '%{speed_download}' "$URL/pull/cold$i.bin")
  SL_RATES+=("$(calc "$s / 1000000")")
  sync
  s=$(curl -sf -o /dev/null -w '%{speed_download}' "http://127.0.0.1:$LANCACHE_PORT/pull/cold$i.bin")
  LC_RATES+=("$(calc "$s / 1000000")")
  sync
  log "run $i: shardline ${SL_RATES[-1]} MB/s, lancache ${LC_RATES[-1]} MB/s"
done
SL_MED=$(median "${SL_RATES[@]}")
LC_MED=$(median "${LC_RATES[@]}")

log "restart: 1M objects x 4 blocks after a churn of 10x (examples/cache_restart)"
cargo build --release --quiet --example cache_restart --manifest-path "$REPO/Cargo.toml"
RESTART_BIN=$REPO/target/release/examples/cache_restart
RESTART_OUT=$(KEEP=1 "$RESTART_BIN" "$MNT/restart" 1000000 4 10)
RESTART_HISTORY=$(head -2 <<<"$RESTART_OUT")
sync
echo 3 >/proc/sys/vm/drop_caches
RESTART_OPENS=()
for _ in $(seq "$RUNS"); do
  RESTART_OPENS+=("$("$RESTART_BIN" open "$MNT/restart/journal")")
done
RESTART_S=$(printf '%s\n' "${RESTART_OPENS[@]}" | sed -E 's/.*ready in ([0-9.]+) s.*/\1/')
RESTART_MED=$(printf '%s\n' $RESTART_S | sort -n | sed -n "$(((RUNS + 1) / 2))p")
RESTART_RSS=$(printf '%s\n' "${RESTART_OPENS[0]}" | sed -E 's/.*peak RSS ([0-9]+) MiB.*/\1/')
rm -rf "$MNT/restart"

{
  echo "# Cache isolation and cost (perf/cache-isolation.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) vCPU, $(uname -r), at $(git -C "$REPO" rev-parse --short HEAD)."
  echo "Caches and the root on the host's disk ($(df --output=source "$MNT" | tail -1), $(stat -f -c %T "$MNT")); origin nginx on"
  echo "loopback serving from RAM, no added latency, pinned to CPU 0; shardline 2 shards, steered by CPU."
  echo
  echo "## Isolation: p99 of one connection's 1 MiB GETs on CPU 1 (wrk, 6 s), median of 5 rounds"
  echo
  echo "| object | alone (ms) | beside a cold 2 GiB fill on CPU 0 (ms) | ratio of medians | rounds alone / beside |"
  echo "|---|---|---|---|---|"
  echo "| cached, /pull/hot.bin | $HIT_ALONE | $HIT_BESIDE | $(calc "$HIT_BESIDE / $HIT_ALONE") | ${HA[*]} / ${HB[*]} |"
  echo "| local root, /hot.bin (control) | $LOCAL_ALONE | $LOCAL_BESIDE | $(calc "$LOCAL_BESIDE / $LOCAL_ALONE") | ${LA[*]} / ${LB[*]} |"
  echo
  echo "The fill's lock was found held by a shard (which did that work at a later tick instead of"
  echo "waiting) $ISOLATION_BUSY times over these rounds' ten cold fills (shardline_cache_lock_busy_total)."
  echo
  scrub_report
  echo "## Syscalls during a cold 1 GiB fill (strace -f -p, by thread)"
  echo
  echo "| thread | syscall | calls |"
  echo "|---|---|---|"
  printf '%s\n' "$STRACE_ROWS"
  echo
  echo "From shard threads: $SHARD_BLOCKING fdatasync/fsync/openat/unlinkat, $SHARD_FUTEX futex."
  echo "Fill lock attempts the shards found held meanwhile: $STRACE_BUSY."
  echo
  echo "## CPU per GiB (each server's own process, utime + stime)"
  echo
  echo "| download | shardline CPU s/GiB | nginx as lancache CPU s/GiB | shardline / nginx |"
  echo "|---|---|---|---|"
  echo "| cold 1 GiB | $COLD_CPU | $LC_COLD_CPU | $(calc "$COLD_CPU / $LC_COLD_CPU") |"
  echo "| warm 1 GiB (the same again) | $WARM_CPU | $LC_WARM_CPU | $(calc "$WARM_CPU / $LC_WARM_CPU") |"
  echo "| cold / warm | $(calc "$COLD_CPU / $WARM_CPU") | $(calc "$LC_COLD_CPU / $LC_WARM_CPU") | |"
  echo
  echo "nginx's warm download is sendfile from the page cache (its cache file was just written);"
  echo "shardline's is an O_DIRECT read checked block by block, then a send."
  if [[ -n $PROFILE_ROWS ]]; then
    echo
    echo "### Profile: shardline's samples per symbol, every thread (perf record -F 999 -g)"
    echo
    echo "The top symbols of the cold download, beside the same symbols warm. On loopback the"
    echo "receiver's ACKs run the origin's transmit in the receiver's context, so part of the"
    echo "origin's send is counted here (tcp_write_xmit under tcp_rcv_established); on a NIC it is not."
    echo
    echo "| symbol | cold samples | warm samples |"
    echo "|---|---|---|"
    printf '%s\n' "$PROFILE_ROWS"
    echo "| every symbol | $PROFILE_TOTALS |"
    echo
    echo "### Profile: nginx as lancache, the same (its one process)"
    echo
    echo "| symbol | cold samples | warm samples |"
    echo "|---|---|---|"
    printf '%s\n' "$LC_PROFILE_ROWS"
    echo "| every symbol | $LC_PROFILE_TOTALS |"
  fi
  echo
  echo "## Cold 1 GiB download (MB/s), $RUNS runs"
  echo
  echo "| server | runs | median |"
  echo "|---|---|---|"
  echo "| shardline | ${SL_RATES[*]} | $SL_MED |"
  echo "| nginx as lancache (slice 1m, proxy_cache_lock) | ${LC_RATES[*]} | $LC_MED |"
  echo "| shardline / lancache | | $(calc "$SL_MED / $LC_MED") |"
  echo
  echo "## Restart: 1M objects x 4 blocks after a churn history 10x that (examples/cache_restart)"
  echo
  printf '%s\n' "$RESTART_HISTORY" | sed 's/^/    /'
  echo
  echo "| index ready (s), $RUNS opens, first after drop_caches | median | peak RSS |"
  echo "|---|---|---|"
  echo "| $(echo $RESTART_S) | $RESTART_MED | $RESTART_RSS MiB |"
} >"$OUT"
log "wrote $OUT"
cat "$OUT"
