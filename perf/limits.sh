#!/usr/bin/env bash
# perf/limits.sh: the per-connection rate limit and the edge's egress cap (issue 19), measured.
#
#   perf/limits.sh [--rate-bytes-per-s N] [--egress-bytes-per-s E] [--out FILE]
#
# One shardline (1 shard on CPU 0, clients on CPU 1, loopback, the repository's disk):
# 1. accuracy: `limit_rate_bytes_per_s = N` (default 1000000), `limit_rate_after_bytes = 0`;
#    4 clients (`loadgen bulk`) each download a file far larger than N x 13 s, so one response
#    spans the whole window [3 s, 13 s): each connection's rate over those 10 s against N.
# 2. waiting holds nothing: 1000 clients (`loadgen swarm`, one epoll thread) on a 16 kB/s limit;
#    /metrics sampled every 0.5 s over the window: arena chunks in flight while all 1000 wait.
# 3. the egress cap: `egress_limit_bytes_per_s = E` (default 300000000) on 2 shards (CPUs 0-1,
#    clients unpinned), 64 bulk connections over [3 s, 13 s): their sum against E, the
#    `shardline_egress_bytes_per_s` gauge, and 1 KiB fetches on fresh connections at 50/s
#    meanwhile (`loadgen ttfb`): their TTFB (the bypass for first bytes).
# 4. 1000 connections (`loadgen swarm`) queued on a 16 MB/s egress cap, no bypass: arena
#    chunks in flight sampled every 0.5 s (those whose turn it is hold theirs while it sends).
# Writes perf/LIMITS.md; raw outputs in perf/out/limits/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
RATE=1000000 EGRESS=300000000 OUT=$HERE/LIMITS.md
while (($#)); do
  case $1 in
    --rate-bytes-per-s) RATE=$2; shift 2 ;;
    --egress-bytes-per-s) EGRESS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "limits.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
RUN=$HERE/out/limits
mkdir -p "$RUN/root"
build_tools
LOADGEN=$HERE/loadgen/target/release/loadgen
BIG=$((RATE * 20)) SEED=7
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" big.bin "$BIG" "$SEED"
EBIG=$((256 << 20)) SMALL_SEED=11
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" ebig.bin "$EBIG" "$SEED"
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" small.bin 1024 "$SMALL_SEED"
PORT=28680 ADMIN=127.0.0.1:28681
SRV=''
cleanup() { [[ -n $SRV ]] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null; return 0; }
trap cleanup EXIT
start() { # start CONFIG_TEXT [SHARDS CPUS]
  printf '%s\n' "$1" >"$RUN/shardline.toml"
  local shards=${2:-1} cpus=${3:-0}
  taskset -c "$cpus" "$SL_BIN" serve --config "$RUN/shardline.toml" --root "$RUN/root" --listen "127.0.0.1:$PORT" \
    --admin "$ADMIN" --shards "$shards" --cpus "$cpus" >"$RUN/server.log" 2>&1 &
  SRV=$!
  wait_port "$PORT" "$SRV" 10 || die "shardline did not start"
}
stop() { kill "$SRV"; wait "$SRV" 2>/dev/null || true; SRV=''; }
metric() { curl -sf "http://$ADMIN/metrics" | awk -v m="$1" '$1 ~ "^"m"[{ ]" || $1 == m { s += $2 } END { printf "%.0f\n", s }'; }

log "accuracy: 4 connections limited to $RATE B/s"
start "limit_rate_bytes_per_s = $RATE
limit_rate_after_bytes = 0"
taskset -c 1 "$LOADGEN" bulk --addr "127.0.0.1:$PORT" --path /big.bin --conns 4 --duration-s 13 --warmup-s 3 \
  >"$RUN/accuracy.txt" 2>&1 || die "loadgen bulk failed: $(tail -n 1 "$RUN/accuracy.txt")"
waits=$(metric shardline_limit_waits_total)
stop
min=$(kv "$RUN/accuracy.txt" conn_mb_per_s_min) p50=$(kv "$RUN/accuracy.txt" conn_mb_per_s_p50)
max=$(kv "$RUN/accuracy.txt" conn_mb_per_s_max)
limit_mb=$(calc "$RATE / 1e6")

log "waiting: 1000 connections limited to 16000 B/s"
start "limit_rate_bytes_per_s = 16000
limit_rate_after_bytes = 0"
taskset -c 1 "$LOADGEN" swarm --addr "127.0.0.1:$PORT" --path /big.bin --conns 1000 --duration-s 10 --warmup-s 4 \
  --expect-len "$BIG" >"$RUN/waiting.txt" 2>&1 &
SW=$!
sleep 4
max_chunks=0 samples=0 open_min=1000000
while alive "$SW"; do
  c=$(metric shardline_chunks_in_flight) o=$(metric shardline_connections_open)
  ((c > max_chunks)) && max_chunks=$c
  ((o < open_min)) && open_min=$o
  samples=$((samples + 1))
  sleep 0.5
done
wait "$SW" || die "loadgen swarm failed: $(tail -n 1 "$RUN/waiting.txt")"
wwaits=$(metric shardline_limit_waits_total)
stop
agg=$(kv "$RUN/waiting.txt" bytes_per_s)

log "egress: 64 connections under a $EGRESS B/s cap on 2 shards, 1 KiB probes at 50/s"
start "egress_limit_bytes_per_s = $EGRESS" 2 0,1
"$LOADGEN" ttfb --addr "127.0.0.1:$PORT" --path /small.bin --rate 50 --duration-s 9.5 --delay-s 3.2 \
  --seed "$SMALL_SEED" --expect-len 1024 >"$RUN/egress-ttfb.txt" 2>&1 &
PT=$!
( sleep 8; metric shardline_egress_bytes_per_s >"$RUN/egress-gauge.txt" ) &
PG=$!
"$LOADGEN" bulk --addr "127.0.0.1:$PORT" --path /ebig.bin --conns 64 --duration-s 13 --warmup-s 3 \
  --expect-len "$EBIG" >"$RUN/egress.txt" 2>&1 || die "loadgen bulk failed: $(tail -n 1 "$RUN/egress.txt")"
wait "$PT" || die "loadgen ttfb failed: $(tail -n 1 "$RUN/egress-ttfb.txt")"
wait "$PG" || true
ewaits=$(metric shardline_egress_waits_total) ebypass=$(metric shardline_egress_bypass_bytes_total)
stop
eagg=$(kv "$RUN/egress.txt" bytes_per_s) egauge=$(cat "$RUN/egress-gauge.txt")
ejain=$(kv "$RUN/egress.txt" jain_fairness)

log "egress waiting: 1000 connections under a 16 MB/s cap, no bypass"
start "egress_limit_bytes_per_s = 16000000
egress_bypass_bytes = 0" 2 0,1
"$LOADGEN" swarm --addr "127.0.0.1:$PORT" --path /big.bin --conns 1000 --duration-s 10 --warmup-s 4 \
  --expect-len "$BIG" >"$RUN/egress-waiting.txt" 2>&1 &
SW=$!
sleep 4
emax_chunks=0 esamples=0 eopen_min=1000000 echunk_sum=0
while alive "$SW"; do
  c=$(metric shardline_chunks_in_flight) o=$(metric shardline_connections_open)
  ((c > emax_chunks)) && emax_chunks=$c
  ((o < eopen_min)) && eopen_min=$o
  echunk_sum=$((echunk_sum + c)) esamples=$((esamples + 1))
  sleep 0.5
done
wait "$SW" || die "loadgen swarm failed: $(tail -n 1 "$RUN/egress-waiting.txt")"
ewwaits=$(metric shardline_egress_waits_total)
stop
ewagg=$(kv "$RUN/egress-waiting.txt" bytes_per_s)
{
  echo "# The per-connection rate limit (perf/limits.sh)"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/limits.sh --rate-bytes-per-s $RATE --egress-bytes-per-s $EGRESS\`; commit $(git -C "$REPO" rev-parse --short HEAD)"
  echo "- Host: kernel $(uname -r), $(nproc) CPUs, load average at the end $(cut -d' ' -f1-3 /proc/loadavg); shardline \`serve --shards 1 --cpus 0\` on loopback, clients on CPU 1, the repository's disk"
  echo
  echo "## Accuracy: 4 connections, \`limit_rate_bytes_per_s = $RATE\`, measured over the window [3 s, 13 s) (\`loadgen bulk\`)"
  echo
  echo "| per-connection rate over 10 s | MB/s | / limit |"
  echo "|---|---:|---:|"
  for k in min p50 max; do
    v=${!k}
    printf '| %s | %s | %.3f |\n' "$k" "$v" "$(calc "$v / $limit_mb")"
  done
  echo
  echo "Limiter waits in the run: $waits. Target (issue 19): within 5% over any 10 s window."
  echo
  echo "## 1000 connections waiting on a 16 kB/s limit (\`loadgen swarm\`, window [4 s, 10 s))"
  echo
  echo "| figure | value |"
  echo "|---|---:|"
  echo "| /metrics samples (every 0.5 s) | $samples |"
  echo "| fewest connections open in a sample | $open_min |"
  echo "| most arena chunks in flight in a sample | $max_chunks |"
  echo "| aggregate goodput (B/s; 1000 x 16000 = 16000000) | $agg |"
  echo "| limiter waits | $wwaits |"
  echo
  echo "Target (issue 19): 1000 connections waiting on their limiter hold 0 arena slots."
  echo
  echo "## The egress cap: \`egress_limit_bytes_per_s = $EGRESS\`, 2 shards, 64 bulk connections over [3 s, 13 s), loopback (unshaped)"
  echo
  echo "| figure | value |"
  echo "|---|---:|"
  printf '| sum of all connections (B/s) | %s |\n' "$eagg"
  printf '| / cap | %.4f |\n' "$(calc "$eagg / $EGRESS")"
  printf '| shardline_egress_bytes_per_s at 8 s (sum of shards) | %s |\n' "$egauge"
  printf '| Jain fairness over the 64 connections | %s |\n' "$ejain"
  printf '| egress waits | %s |\n' "$ewaits"
  printf '| bytes on the bypass (first 256 KiB of every response) | %s |\n' "$ebypass"
  printf '| 1 KiB TTFB p50 / p99 / max (ms), fresh connections at 50/s | %s / %s / %s |\n' \
    "$(kv "$RUN/egress-ttfb.txt" ttfb_p50_ms)" "$(kv "$RUN/egress-ttfb.txt" ttfb_p99_ms)" "$(kv "$RUN/egress-ttfb.txt" ttfb_max_ms)"
  echo
  echo "Targets (issue 19): the egress cap within 2%; with the cap active, 1 KiB TTFB p99 <= 5 ms. The shaped-link figure with 1000 paced clients is in perf/LINK-EGRESS.md (perf/link.sh)."
  echo
  echo "## 1000 connections queued on a 16 MB/s egress cap, no bypass (\`loadgen swarm\`, window [4 s, 10 s))"
  echo
  echo "| figure | value |"
  echo "|---|---:|"
  echo "| /metrics samples (every 0.5 s) | $esamples |"
  echo "| fewest connections open in a sample | $eopen_min |"
  echo "| most arena chunks in flight in a sample | $emax_chunks |"
  printf '| mean arena chunks in flight per sample | %.2f |\n' "$(calc "$echunk_sum / ($esamples > 0 ? $esamples : 1)")"
  echo "| aggregate goodput (B/s; cap 16000000) | $ewagg |"
  echo "| egress waits | $ewwaits |"
  echo
  echo "A connection waiting for its turn holds no slot; the few whose turn it is hold theirs while their step (160 kB) is read and sent."
} >"$OUT"
log "wrote $OUT"
