#!/usr/bin/env bash
# perf/fill.sh: the pull-through cache as clients see it (issue 20's benchmark), shardline
# side by side with nginx proxy_cache set up as lancache sets it up (slice 1m,
# proxy_cache_lock on), in one run, same origin, same disk:
#   - cold single-client download of an N MiB object (default 1024), then the warm one, and
#     the same file served from shardline's local root;
#   - C clients (default 100) starting on another cold object within a second: the origin's
#     body bytes against the object's size, and the slowest client against one alone;
#   - 1000 stalled clients (they ask for a cold object and never read) while one client
#     downloads that object cold and another a warm one: both against their time alone;
#   - a cold 1 MiB range in the middle of a 100 GB (sparse) object: the blocks the origin
#     sends, for shardline and for lancache;
#   - kill -9 of shardline at 20 moments during 20 fills (tests/cache_crash.rs, run here in
#     release): wrong bytes after the restarts, and committed blocks fetched again.
#
#   perf/fill.sh [--mib N] [--clients C] [--delay-ms D] [--shards S] [--read-ahead B]
#                [--out FILE]
#
# The origin is nginx on loopback serving from /dev/shm behind a relay that holds every
# response's first byte for D ms (default 20: the origin's distance; tc here has no netem).
# Caches and shardline's root live on ext4 on a ram-backed loop device (O_DIRECT works; the
# disk is never the bottleneck). Clients are curl. Needs root (losetup, mount).
# Writes perf/FILL.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=fill-lib.sh
source "$HERE/fill-lib.sh"
MIB=1024 CLIENTS=100 DELAY_MS=20 SHARDS=auto READ_AHEAD=256 OUT=$HERE/FILL.md
while (($#)); do
  case $1 in
    --mib) MIB=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --delay-ms) DELAY_MS=$2; shift 2 ;;
    --shards) SHARDS=$2; shift 2 ;;
    --read-ahead) READ_AHEAD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "fill.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx)"
command -v curl >/dev/null || die "curl is missing"
WORK=$(mktemp -d /dev/shm/pl-fill-XXXXXX)
MNT=$HERE/out/pl-fill-mnt-$$
PIDS=()
cleanup() {
  [[ -n ${KEEP:-} ]] && cp -r "$WORK"/lancache/error.log "$WORK"/*many "$HERE/out/" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ramdisk_destroy
  rm -rf "$WORK"
}
trap cleanup EXIT
log "building shardline (release)"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml"
SL=${SHARDLINE_BIN:-$REPO/target/release/shardline}

BYTES=$((MIB << 20))
gib=$(calc "$BYTES / 1073741824")
mkdir -p "$WORK/origin/pull"
head -c "$BYTES" /dev/urandom >"$WORK/origin/pull/a.bin"
head -c "$BYTES" /dev/urandom >"$WORK/origin/pull/b.bin"
head -c "$BYTES" /dev/urandom >"$WORK/origin/pull/c.bin"
# 100 GB that take no memory: a hole reads as zeros.
truncate -s $((100 * 1000 * 1000 * 1000)) "$WORK/origin/pull/huge.bin"
ulimit -n "$(ulimit -Hn)"
# Pre-touched: a cold fill writes 1 GiB to the disk, and first writes to fresh shmem pages
# cost this VM's host ~1 s of CPU per GiB (a real disk's writes are DMA).
RAMDISK_PRETOUCH=1 ramdisk_create "pl-fill-disk-$$" $((8 * BYTES + (1024 << 20))) "$MNT"
mkdir -p "$MNT/root" "$MNT/cache" "$MNT/lancache" "$MNT/lancache-tmp"
cp "$WORK/origin/pull/a.bin" "$MNT/root/local.bin"
# Written back before any O_DIRECT read (a dirty page cache range is flushed by the read).
sync
fill_setup

SL_PORT=18084 ADMIN_PORT=18085
# The admin listener's control token (purge needs it): mode 0600, as shardline requires.
(umask 077 && head -c 32 /dev/urandom | base64 >"$WORK/admin.token")
cat >"$WORK/shardline.toml" <<EOF
admin_token_file = "$WORK/admin.token"
cache_dir = "$MNT/cache"
cache_read_ahead_blocks = $READ_AHEAD
[[origin]]
prefix = "/pull/"
url = "http://127.0.0.1:$RELAY_PORT"
EOF
"$SL" serve --root "$MNT/root" --listen "127.0.0.1:$SL_PORT" --config "$WORK/shardline.toml" \
  --shards "$SHARDS" --admin "127.0.0.1:$ADMIN_PORT" >"$WORK/shardline.log" 2>&1 &
SL_PID=$!
PIDS+=($!)
wait_port "$SL_PORT" "${PIDS[-1]}" 20 || die "shardline did not start: $(tail -3 "$WORK/shardline.log")"

# download URL: "seconds bytes" of one curl to /dev/null.
download() {
  curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "$1"
}
# rate SECONDS: MB/s of the object.
rate() { calc "$BYTES / $1 / 1e6"; }
check_bytes() { [[ ${2#* } == "$BYTES" ]] || die "$1 sent ${2#* } bytes, not $BYTES"; }

row() { # name "seconds bytes"
  local s=${2% *}
  printf '| %s | %.1f | %.3f |\n' "$1" "$(rate "$s")" "$s"
}

# host_busy: CPU-seconds all CPUs have been busy since boot (/proc/stat, not idle or iowait).
host_busy() { awk '/^cpu / { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / 100 }' /proc/stat; }
# proc_cpu PID: CPU-seconds the process has used (utime + stime).
proc_cpu() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
# A profile of one download: `perf record -a -e cpu-clock` (a software event: this host has no
# hardware counters) over every CPU while it runs, summed by process into CPU-seconds.
PROF_HZ=499
command -v perf >/dev/null || die "perf is missing (apt-get install linux-perf)"
# prof_start NAME / prof_stop NAME: a profile of every CPU between the two, summed by process
# into $WORK/prof-NAME.txt.
prof_start() {
  perf record -a -e cpu-clock -F "$PROF_HZ" -o "$WORK/prof-$1.data" -q -- sleep 3600 >/dev/null 2>&1 &
  PROF_PID=$!
  sleep 0.5
}
prof_stop() {
  kill -INT "$PROF_PID"
  wait "$PROF_PID" 2>/dev/null || true
  perf report -i "$WORK/prof-$1.data" --sort pid --stdio -q -F sample,pid 2>/dev/null >"$WORK/prof-$1.txt"
  rm -f "$WORK/prof-$1.data"
}
# profiled NAME URL: "seconds bytes" of one download of URL, profiled into $WORK/prof-NAME.txt.
profiled() {
  local out
  prof_start "$1"
  out=$(download "$2")
  prof_stop "$1"
  echo "$out"
}
# prof_groups NAME: "group samples" lines of a profile: the edge servers, the origin, the relay,
# the client, and the kernel's own threads (the loop device, softirq, writeback); idle left out.
prof_groups() {
  awk -v o="$(cat "$WORK/nginx-origin/pid")" -v l="$(cat "$WORK/lancache/pid")" '
    { n = $1; i = index($2, ":"); pid = substr($2, 1, i - 1); comm = substr($2, i + 1)
      if (pid == 0) next
      if (pid == o) g = "origin_nginx"; else if (pid == l) g = "lancache_nginx"
      else if (comm ~ /^stalled/) g = "stalled_clients"
      else if (comm ~ /^shard/) g = "shardline"; else if (comm ~ /^python/) g = "relay"
      else if (comm ~ /^curl/) g = "curl"
      else if (comm ~ /^(kworker|loop|ksoftirqd|kswapd|jbd2|rcu|migration)/) g = "kernel"
      else g = "other"
      s[g] += n }
    END { for (g in s) print g, s[g] }' "$WORK/prof-$1.txt"
}

log "the origin through its relay alone (no cache): the ceiling of any cold download here"
h0=$(host_busy)
relay_only=$(profiled relay-only "http://127.0.0.1:$RELAY_PORT/pull/b.bin"); check_bytes "the relay" "$relay_only"
relay_cpu=$(calc "$(host_busy) - $h0")
log "single client, cold then warm, and the local root"
o0=$(fill_origin_body_bytes)
h0=$(host_busy) p0=$(proc_cpu "$SL_PID")
sl_cold=$(profiled sl-cold "http://127.0.0.1:$SL_PORT/pull/a.bin"); check_bytes "shardline cold" "$sl_cold"
cold_host_cpu=$(calc "$(host_busy) - $h0") cold_sl_cpu=$(calc "$(proc_cpu "$SL_PID") - $p0")
h0=$(host_busy) p0=$(proc_cpu "$SL_PID")
w=$(profiled sl-warm "http://127.0.0.1:$SL_PORT/pull/a.bin"); check_bytes "shardline warm" "$w"
warm_host_cpu=$(calc "$(host_busy) - $h0") warm_sl_cpu=$(calc "$(proc_cpu "$SL_PID") - $p0")
warm_profiled_s=${w% *}
# Warm and local alternate, WARM_PAIRS of each. One loopback transfer varies by a third from
# run to run on this host, and the host's speed drifts over a run, so the figure is the median
# over pairs of local time / warm time (the two of a pair run back to back); the medians of
# each are reported too. shardline's own CPU over each set is the steadier measure of what a
# warm byte costs it.
WARM_PAIRS=9
warms=() locals=() pair_ratios=() warm_set_cpu=0 local_set_cpu=0
# cpu_download URL: one download's "seconds bytes", and shardline's CPU for it in $DL_CPU.
cpu_download() {
  local p0 out
  p0=$(proc_cpu "$SL_PID")
  out=$(download "$1")
  DL_CPU=$(calc "$(proc_cpu "$SL_PID") - $p0")
  REPLY=$out
}
for ((i = 0; i < WARM_PAIRS; i++)); do
  # Which goes first alternates, so neither always follows the other.
  for what in $( ((i % 2)) && echo "local warm" || echo "warm local"); do
    if [[ $what == warm ]]; then
      cpu_download "http://127.0.0.1:$SL_PORT/pull/a.bin"; w=$REPLY
      check_bytes "shardline warm" "$w"; warms+=("$w"); warm_set_cpu=$(calc "$warm_set_cpu + $DL_CPU")
    else
      cpu_download "http://127.0.0.1:$SL_PORT/local.bin"; l=$REPLY
      check_bytes "shardline local" "$l"; locals+=("$l"); local_set_cpu=$(calc "$local_set_cpu + $DL_CPU")
    fi
  done
  pair_ratios+=("$(calc "${l% *} / ${w% *}")")
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
sl_warm=$(median "${warms[@]}")
sl_local=$(median "${locals[@]}")
warm_vs_local=$(median "${pair_ratios[@]}")
sleep 0.5
sl_origin=$(($(fill_origin_body_bytes) - o0))
o0=$(fill_origin_body_bytes)
lc_cold=$(profiled lc-cold "http://127.0.0.1:$LANCACHE_PORT/pull/a.bin"); check_bytes "lancache cold" "$lc_cold"
lc_warm=$(profiled lc-warm "http://127.0.0.1:$LANCACHE_PORT/pull/a.bin"); check_bytes "lancache warm" "$lc_warm"
sync
sleep 0.5
lc_origin=$(($(fill_origin_body_bytes) - o0))
# Every byte shardline filled matches the origin's object.
curl -s "http://127.0.0.1:$SL_PORT/pull/a.bin" | cmp - "$WORK/origin/pull/a.bin" || die "shardline's cached bytes differ"

# many CLIENTS URL OUTDIR: CLIENTS curls started together; prints the slowest time.
many() {
  local n=$1 url=$2 dir=$3 i
  mkdir -p "$dir"
  for ((i = 0; i < n; i++)); do
    curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "$url" >"$dir/$i.txt" &
  done
  wait_clients "$n" "$dir"
}
wait_clients() {
  local n=$1 dir=$2
  local deadline=$((SECONDS + 600))
  while (($(cat "$dir"/*.txt 2>/dev/null | grep -c .) < n)); do
    ((SECONDS < deadline)) || die "clients did not finish"
    sleep 0.2
  done
  # "slowest-seconds short-bodies"
  awk -v want="$BYTES" '$2 != want { bad++ } $1 > max { max = $1 } END { printf "%.3f %d", max, bad }' "$dir"/*.txt
}

log "$CLIENTS clients on one cold object (shardline)"
o0=$(fill_origin_body_bytes)
sl_many=$(many "$CLIENTS" "http://127.0.0.1:$SL_PORT/pull/b.bin" "$WORK/sl-many")
[[ ${sl_many#* } == 0 ]] || die "${sl_many#* } shardline clients got a short body"
sl_many=${sl_many% *}
sleep 0.5
sl_many_origin=$(($(fill_origin_body_bytes) - o0))
log "$CLIENTS clients on one cold object (lancache-style nginx)"
o0=$(fill_origin_body_bytes)
lc_many=$(many "$CLIENTS" "http://127.0.0.1:$LANCACHE_PORT/pull/b.bin" "$WORK/lc-many")
lc_short=${lc_many#* } lc_many=${lc_many% *}
((lc_short == 0)) || log "lancache-style nginx: $lc_short of $CLIENTS clients got a short body"
sleep 0.5
lc_many_origin=$(($(fill_origin_body_bytes) - o0))
# nginx wrote its cache through the page cache: its writeback goes to the loop device now,
# not during the next cell's measurements.
sync

log "1000 stalled clients on a filling object"
cat >"$WORK/stall.py" <<'EOF'
import socket, sys, time
port, n, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
open("/proc/self/comm", "w").write("stalled")  # told apart from the relay in profiles
socks = []
for _ in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path).encode())
    socks.append(s)
print("ready", len(socks), flush=True)
time.sleep(3600)
EOF
# pair COLD-PATH OUTDIR: a cold download of COLD-PATH and a warm one of a.bin, together.
pair() {
  mkdir -p "$2"
  curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "http://127.0.0.1:$SL_PORT$1" >"$2/cold.txt" &
  local cold_pid=$!
  curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "http://127.0.0.1:$SL_PORT/pull/a.bin" >"$2/warm.txt" &
  local warm_pid=$!
  wait "$cold_pid" "$warm_pid"
  check_bytes "cold $1" "$(cat "$2/cold.txt")"
  check_bytes "warm beside it" "$(cat "$2/warm.txt")"
}
# stalled_start N PATH: N clients that ask for PATH and never read (returns once connected).
stalled_start() {
  python3 "$WORK/stall.py" "$SL_PORT" "$1" "$2" >"$WORK/stall.out" 2>&1 &
  STALL_PID=$!
  PIDS+=("$STALL_PID")
  local deadline=$((SECONDS + 60))
  until grep -q "^ready $1" "$WORK/stall.out" 2>/dev/null; do
    ((SECONDS < deadline)) || die "the stalled clients did not connect: $(tail -2 "$WORK/stall.out")"
    kill -0 "$STALL_PID" 2>/dev/null || die "the stalled clients failed: $(tail -2 "$WORK/stall.out")"
    sleep 0.2
  done
  # Their first want starts the fill and its read-ahead: let it settle.
  sleep 1
}
stalled_stop() {
  kill "$STALL_PID" 2>/dev/null || true
  wait "$STALL_PID" 2>/dev/null || true
  STALL_PID=0
}
purge() { "$SL" cache purge --admin "127.0.0.1:$ADMIN_PORT" --token-file "$WORK/admin.token" "$1" >/dev/null || die "purge $1 failed"; }
# One pair on a loaded host varies by a third from run to run, so the two settings alternate
# for STALL_ROUNDS rounds and the medians are compared. Each round's cold object is purged
# first, and in both settings stalled clients start its fill (one client "alone", 1000
# beside), so both cold downloads find the same read-ahead already under way.
STALL_ROUNDS=3
alone_cold=() alone_warm=() stalled_cold=() stalled_warm=()
for ((r = 1; r <= STALL_ROUNDS; r++)); do
  for setting in alone stalled; do
    purge /pull/c.bin
    if [[ $setting == alone ]]; then n=1; else n=1000; fi
    stalled_start "$n" /pull/c.bin
    ((r < STALL_ROUNDS)) || prof_start "pair-$setting"
    pair /pull/c.bin "$WORK/pair-$setting-$r"
    ((r < STALL_ROUNDS)) || prof_stop "pair-$setting"
    if [[ $setting == stalled ]]; then
      stall_rss_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$SL_PID/status" 2>/dev/null || echo 0)
    fi
    curl -s "http://127.0.0.1:$SL_PORT/pull/c.bin" | cmp - "$WORK/origin/pull/c.bin" || die "the object filled beside $n stalled clients differs"
    stalled_stop
    cold=$(cut -d' ' -f1 "$WORK/pair-$setting-$r/cold.txt") warm=$(cut -d' ' -f1 "$WORK/pair-$setting-$r/warm.txt")
    log "round $r, $setting ($n stalled): cold ${cold}s, warm ${warm}s"
    if [[ $setting == alone ]]; then alone_cold+=("$cold") alone_warm+=("$warm"); else stalled_cold+=("$cold") stalled_warm+=("$warm"); fi
  done
done
stall_cold_alone=$(median "${alone_cold[@]}") stall_warm_alone=$(median "${alone_warm[@]}")
stall_cold=$(median "${stalled_cold[@]}") stall_warm=$(median "${stalled_warm[@]}")

log "a cold 1 MiB range in the middle of a 100 GB object"
RANGE_FIRST=$((50 * 1000 * 1000 * 1000))
RANGE_LAST=$((RANGE_FIRST + (1 << 20) - 1))
# range_cell PORT: "seconds origin-body-bytes" of one cold range (origin bytes counted once
# the read-ahead it started has ended: the count stops moving).
range_cell() {
  local o0 t prev now
  o0=$(fill_origin_body_bytes)
  t=$(curl -s -o "$WORK/range.out" -r "$RANGE_FIRST-$RANGE_LAST" -w '%{time_total}' "http://127.0.0.1:$1/pull/huge.bin")
  [[ $(stat -c %s "$WORK/range.out") == $((1 << 20)) ]] || die "port $1 sent a range of $(stat -c %s "$WORK/range.out") bytes"
  cmp -s "$WORK/range.out" <(head -c $((1 << 20)) /dev/zero) || die "port $1 sent other bytes than the hole's zeros"
  prev=-1
  now=$(fill_origin_body_bytes)
  while ((now != prev)); do
    sleep 1
    prev=$now
    now=$(fill_origin_body_bytes)
  done
  echo "$t $((now - o0))"
}
sl_range=$(range_cell "$SL_PORT")
lc_range=$(range_cell "$LANCACHE_PORT")
BLOCK_BYTES=$((256 << 10))
blocks_of() { calc "${1#* } / $BLOCK_BYTES"; }

log "kill -9 at 20 moments during 20 fills (cargo test --release --test cache_crash)"
(cd "$REPO" && cargo test --release --quiet --test cache_crash -- --nocapture) >"$WORK/crash.out" 2>&1 \
  || die "the kill -9 test failed: $(grep -m3 -E 'panicked|wrong|fetched again' "$WORK/crash.out")"
crash_lines=$(grep -E '^fill [0-9]+: killed' "$WORK/crash.out" || true)
crash_partial=$(awk '/^fill [0-9]+: killed/ { if ($7 > 0 && $7 < $9) n++ } END { print n + 0 }' <<<"$crash_lines")

sl_cold_s=${sl_cold% *} sl_warm_s=${sl_warm% *} sl_local_s=${sl_local% *} lc_cold_s=${lc_cold% *}
shards_run=$(grep -o 'shards=[0-9]*' "$WORK/shardline.log" | head -1 | cut -d= -f2)
{
  echo "# Pull-through cache: clients of a distant origin (perf/fill.sh)"
  echo
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) vCPU, $(uname -r), at $(git -C "$REPO" rev-parse --short HEAD);"
  echo "shardline with ${shards_run:-?} shard(s), cache_read_ahead_blocks = $READ_AHEAD. Objects of $MIB MiB from nginx on loopback behind a relay that"
  echo "holds every response's first byte for $DELAY_MS ms. Caches and shardline's root on ext4 on a ram-backed"
  echo "loop device whose image was written through once before (a first write to a fresh shmem page costs"
  echo "this VM ~1 s per GiB: \`dd\` into a fresh /dev/shm file runs at ~1 GB/s, over it at ~4 GB/s; an NVMe"
  echo "write is DMA; before this, the loop's kernel threads took 3.7 CPU-s per GiB of a cold fill)."
  echo "Clients: curl over loopback."
  echo
  echo "## One client"
  echo
  echo "| download | MB/s | seconds |"
  echo "|---|---:|---:|"
  row "shardline, cold (pulled through)" "$sl_cold"
  row "shardline, warm (from its cache; median of $WARM_PAIRS)" "$sl_warm"
  row "shardline, the same file from its local root (median of $WARM_PAIRS)" "$sl_local"
  row "nginx proxy_cache as lancache, cold" "$lc_cold"
  row "nginx proxy_cache as lancache, warm" "$lc_warm"
  echo
  echo "- Cold / warm: **$(printf %.2f "$(calc "$sl_warm_s / $sl_cold_s")")** (target >= 0.9)."
  echo "- Cold against lancache's cold: **$(printf %.2fx "$(calc "$lc_cold_s / $sl_cold_s")")** (target >= 3x)."
  echo "- Warm against the local root: **$(printf %.2f "$warm_vs_local")** of its rate (target within 5%): the median over"
  echo "  $WARM_PAIRS back-to-back pairs of local time / warm time (each pair: $(printf '%.2f ' "${pair_ratios[@]}"));"
  echo "  shardline's CPU per GiB over the $WARM_PAIRS of each: warm $(printf %.3f "$(calc "$warm_set_cpu / ($WARM_PAIRS * $gib)")"), local $(printf %.3f "$(calc "$local_set_cpu / ($WARM_PAIRS * $gib)")")"
  echo "  (/proc/PID/stat, 10 ms ticks; the block checksums are the warm path's extra work)."
  echo "- Origin body bytes for the cold download: shardline $(printf %.3f "$(calc "$sl_origin / $BYTES")")x the object, lancache $(printf %.3f "$(calc "$lc_origin / $BYTES")")x."
  echo
  echo "Where the cold download's time goes (CPU-seconds per GiB, from /proc/stat over the whole host and"
  echo "/proc/PID/stat for shardline; the host has $(nproc) vCPUs, so a download that keeps them all busy moves at"
  echo "most $(nproc) / (host CPU-s per GiB) GiB/s):"
  echo
  echo "| download | MB/s | host CPU-s / GiB | shardline CPU-s / GiB | ceiling with every vCPU busy, MB/s |"
  echo "|---|---:|---:|---:|---:|"
  for cell in "origin through the relay, no cache|$relay_only|$relay_cpu|0" \
              "shardline, cold|$sl_cold|$cold_host_cpu|$cold_sl_cpu" \
              "shardline, warm|$warm_profiled_s $BYTES|$warm_host_cpu|$warm_sl_cpu"; do
    IFS='|' read -r name t hcpu scpu <<<"$cell"
    hpg=$(calc "$hcpu / $gib")
    printf '| %s | %.1f | %.2f | %.2f | %.0f |\n' "$name" "$(rate "${t% *}")" "$hpg" "$(calc "$scpu / $gib")" \
      "$(calc "$(nproc) * 1073741824 / ($hpg + 1e-9) / 1e6")"
  done
  echo
  echo "The cold path costs the host the origin's and the relay's work besides shardline's (receive, O_DIRECT"
  echo "write, sync, read back, send); on loopback with $(nproc) vCPUs every download is CPU-bound, so the cold/warm"
  echo "ratio is bounded by warm CPU / cold CPU per GiB, whatever the server."
  echo
  echo "Profile, side by side with nginx: CPU-seconds per GiB by process during each single-client download"
  echo "(\`perf record -a -e cpu-clock -F $PROF_HZ\` over every vCPU, samples summed by process; idle left out;"
  echo "softirq work is counted where it ran). \"kernel threads\" are the loop device's, softirq and writeback."
  echo "shardline writes its cache with O_DIRECT inside the download; nginx writes through the page cache, and"
  echo "its writeback comes after (the script syncs before the next cell), so its cold column leaves it out."
  echo
  echo "| process | shardline cold | lancache cold | shardline warm | lancache warm |"
  echo "|---|---:|---:|---:|---:|"
  for g in shardline lancache_nginx origin_nginx relay curl kernel other; do
    case $g in
      shardline) label="shardline" ;; lancache_nginx) label="nginx as lancache" ;;
      origin_nginx) label="the origin (nginx)" ;; relay) label="the relay (python, 20 ms first byte)" ;;
      curl) label="curl (the client)" ;; kernel) label="kernel threads" ;; other) label="other" ;;
    esac
    line="| $label |"
    for p in sl-cold lc-cold sl-warm lc-warm; do
      n=$(prof_groups "$p" | awk -v g="$g" '$1 == g { print $2 }')
      line="$line $(printf %.2f "$(calc "${n:-0} / $PROF_HZ / $gib")") |"
    done
    echo "$line"
  done
  line="| **all busy CPU** |"
  ceil="| ceiling with every vCPU busy, MB/s |"
  for p in sl-cold lc-cold sl-warm lc-warm; do
    n=$(prof_groups "$p" | awk '{ s += $2 } END { print s + 0 }')
    cpg=$(calc "$n / $PROF_HZ / $gib")
    line="$line **$(printf %.2f "$cpg")** |"
    ceil="$ceil $(printf %.0f "$(calc "$(nproc) * 1073741824 / ($cpg + 1e-9) / 1e6")") |"
  done
  echo "$line"
  echo "$ceil"
  echo
  # The bound: a cold download pays at least what the origin and relay cost without the edge
  # (the relay-only download less its client) plus what a warm one costs the host.
  relay_curl=$(prof_groups relay-only | awk '$1 == "curl" { print $2 }')
  relay_wo_client=$(calc "$relay_cpu - ${relay_curl:-0} / $PROF_HZ")
  bound=$(calc "$warm_host_cpu / ($warm_host_cpu + $relay_wo_client)")
  echo "The origin and the relay alone (the relay-only download, less its client) cost the host"
  echo "$(printf %.2f "$(calc "$relay_wo_client / $gib")") CPU-s per GiB; a warm download costs it $(printf %.2f "$(calc "$warm_host_cpu / $gib")"). A cold download pays both"
  echo "(and its own receive and write besides), so on this host cold / warm <= $(printf %.2f "$bound") for any server whose"
  echo "cold path cost nothing more than its warm one; shardline's is $(printf %.2f "$(calc "$sl_warm_s / $sl_cold_s")"), lancache's $(printf %.2f "$(calc "${lc_warm% *} / ${lc_cold% *}")")."
  echo
  echo "A cold download here costs the origin's and the relay's CPU on the same two vCPUs as the edge's and"
  echo "the client's; a warm one costs the edge's and the client's only. So cold / warm >= 0.9 is out of reach"
  echo "for any server on this host (lancache's cold and warm rows above are the same measure for nginx); on"
  echo "an edge the origin is another machine, and the ratio is the edge's own cold and warm CPU per GiB."
  echo
  echo "## $CLIENTS clients starting together on one cold object"
  echo
  echo "| | origin bytes / object | slowest client, s | slowest / one cold client |"
  echo "|---|---:|---:|---:|"
  echo "| shardline | $(printf %.3f "$(calc "$sl_many_origin / $BYTES")") | $sl_many | $(printf %.2f "$(calc "$sl_many / $sl_cold_s")") |"
  echo "| nginx proxy_cache as lancache | $(printf %.3f "$(calc "$lc_many_origin / $BYTES")") | $lc_many | $(printf %.2f "$(calc "$lc_many / $lc_cold_s")") |"
  echo
  echo "Targets: origin bytes <= 1.02x the object; the slowest within 1.2x of one client's cold time."
  ((lc_short == 0)) || echo "lancache-style nginx: $lc_short of $CLIENTS clients got a short body (counted in its slowest time as they ended)."
  echo "All clients together received $CLIENTS x $MIB MiB over loopback: shardline sent $(printf %.0f "$(calc "$CLIENTS * $BYTES / $sl_many / 1e6")") MB/s"
  echo "in all until its slowest client was done, against $(printf %.0f "$(rate "$sl_warm_s")") MB/s to one warm client."
  floor_s=$(calc "$CLIENTS * $warm_host_cpu / $(nproc)")
  echo "Out of reach on this host for any server: even from the cache, each GiB delivered costs the host"
  echo "$(printf %.2f "$(calc "$warm_host_cpu / $gib")") CPU-s (the warm row of the profile: the edge's send and curl's receive), so"
  echo "$CLIENTS x $MIB MiB need at least $(printf %.1f "$floor_s") s of all $(nproc) vCPUs, against the target's 1.2 x"
  echo "$(printf %.2f "$sl_cold_s") s = $(printf %.1f "$(calc "1.2 * $sl_cold_s")") s; the slowest shardline client took $(printf %.2f "$(calc "$sl_many / $floor_s")")x that floor."
  echo
  echo "## 1000 stalled clients on a filling object"
  echo
  echo "1000 clients ask for a cold object (SO_RCVBUF 4 KiB) and never read; then one client downloads that"
  echo "object cold and another a warm one, together. Alone: the same pair with one stalled client instead of"
  echo "1000 (so both cold downloads find the fill's read-ahead already under way). The two settings alternate"
  echo "for $STALL_ROUNDS rounds, each on the object purged again; the table gives the medians (seconds of each round:"
  echo "alone cold ${alone_cold[*]}, warm ${alone_warm[*]}; beside 1000 cold ${stalled_cold[*]}, warm ${stalled_warm[*]})."
  echo
  echo "| download | alone, s | beside 1000 stalled, s | ratio |"
  echo "|---|---:|---:|---:|"
  echo "| the filling object, cold | $stall_cold_alone | $stall_cold | $(printf %.2f "$(calc "$stall_cold / $stall_cold_alone")") |"
  echo "| a warm object | $stall_warm_alone | $stall_warm | $(printf %.2f "$(calc "$stall_warm / $stall_warm_alone")") |"
  echo
  echo "CPU-seconds by process while the last round's pairs ran (the same profile as above; what else kept the host busy):"
  echo
  echo "| process | pair alone | pair beside 1000 stalled |"
  echo "|---|---:|---:|"
  for g in shardline lancache_nginx origin_nginx relay stalled_clients curl kernel other; do
    line="| $g |"
    for p in pair-alone pair-stalled; do
      n=$(prof_groups "$p" | awk -v g="$g" '$1 == g { print $2 }')
      line="$line $(printf %.2f "$(calc "${n:-0} / $PROF_HZ")") |"
    done
    echo "$line"
  done
  echo
  echo "Target: each within 1.5x of its time alone. shardline's RSS with the stalled clients connected: $((stall_rss_kb / 1024)) MiB."
  echo
  echo "## A cold 1 MiB range in the middle of a 100 GB object"
  echo
  echo "| | seconds | origin body bytes | in 256 KiB blocks |"
  echo "|---|---:|---:|---:|"
  echo "| shardline | ${sl_range% *} | ${sl_range#* } | $(printf %.1f "$(blocks_of "$sl_range")") |"
  echo "| nginx proxy_cache as lancache | ${lc_range% *} | ${lc_range#* } | $(printf %.1f "$(blocks_of "$lc_range")") |"
  echo
  echo "Target (issue 31): at most 4 MiB from the origin. A closed range that does not continue blocks already"
  echo "there gets no read-ahead past its end (the blocks it touches: an unaligned 1 MiB spans 5); lancache fetches"
  echo "its 1 MiB slices whole."
  echo
  echo "## kill -9 during 20 fills"
  echo
  echo "\`cargo test --release --test cache_crash\` (6 MiB objects at 12 MiB/s from nginx; shardline killed with SIGKILL"
  echo "at 20 fixed pseudo-random moments, restarted on the same cache, each object then downloaded whole and compared):"
  echo "0 wrong bytes and no block the journal held before a kill fetched again (the test asserts both, and passed);"
  echo "$crash_partial of 20 kills left a partial object. Per kill:"
  echo
  echo '```'
  echo "$crash_lines"
  echo '```'
} >"$OUT"
log "wrote $OUT"
cat "$OUT"
