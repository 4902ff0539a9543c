#!/usr/bin/env bash
# perf/hostile.sh: what hostile input costs shardline against the nginx anchor (issue 30), side by
# side in one run.
#
#   perf/hostile.sh [--runs N] [--nice N] [--out FILE]
#
# Each server alone on CPU 0 (shardline `serve --shards 1 --cpus 0`, default config; nginx with
# perf/nginx.conf, 1 worker); the clients on CPU 1; loopback; fixtures on the repository's disk.
# Rows, each run N times (default 3) per server, servers alternating, medians reported:
# 1. trickled heads: 200 connections each send the first 14 000 bytes of a 15 000-byte head at
#    once, then the last 1000 one byte per 2 ms (TCP_NODELAY; `loadgen trickle`). The server's
#    utime+stime over the trickle, and the TTFB p99 of 1 KiB keep-alive fetches at 1000/s (2000 samples a window, so a p99 is not 4 samples)
#    (`loadgen ttfb --keepalive 1`) beside it against the same probe alone.
# 2. missing files: 10 000 requests/s for paths that do not exist, never the same twice (so no
#    negative cache answers; `loadgen misses`, 8 keep-alive connections), for 3 s. The same
#    probe's p99 beside it against alone, and the server's CPU over the flood.
# Writes perf/HOSTILE.md; raw outputs in perf/out/hostile/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
RUNS=3 NICE=0 OUT=$HERE/HOSTILE.md
while (($#)); do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "hostile.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v nginx >/dev/null || {
  [[ $(id -u) == 0 ]] || die "nginx is missing; run as root (or install nginx-light) first"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >&2 || die "cannot install nginx"
}
RUN=$HERE/out/hostile
mkdir -p "$RUN/root"
build_tools
LOADGEN=$HERE/loadgen/target/release/loadgen
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" small.bin 1024 11
SL_PORT=28780 NG_PORT=28782 SL_ADMIN=127.0.0.1:28781
SERVER_CPU=0 CLIENT_CPU=1
PG=''
cleanup() { [[ -n $PG ]] && kill_group "$PG" 5; return 0; }
trap cleanup EXIT

start() { # start sl|ng: sets PG and PORT
  # A server left behind would take the load while the one measured failed to start.
  for p in $SL_PORT ${SL_ADMIN##*:} $NG_PORT; do
    ! port_busy "$p" || die "port $p is in use: a server left from an earlier run? (ss -ltnp)"
  done
  if [[ $1 == sl ]]; then
    PORT=$SL_PORT
    setsid taskset -c $SERVER_CPU nice -n "$NICE" "$SL_BIN" serve --root "$RUN/root" \
      --listen "127.0.0.1:$PORT" --admin "$SL_ADMIN" --shards 1 --cpus $SERVER_CPU \
      >"$RUN/sl-server.log" 2>&1 </dev/null &
  else
    PORT=$NG_PORT
    render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$RUN/root" "$PORT" $SERVER_CPU
    setsid taskset -c $SERVER_CPU nice -n "$NICE" nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf" \
      >"$RUN/ng-server.log" 2>&1 </dev/null &
  fi
  PG=$!
  wait_port "$PORT" "$PG" 15 || die "$1 did not start (log: $RUN/$1-server.log)"
  sleep 0.3
}
stop() { kill_group "$PG" 10 || true; wait "$PG" 2>/dev/null || true; PG=''; }
cpu_s() { "$LOADGEN" cpu --pgid "$PG" | sed -n 's/^cpu_s=//p'; }
client() { taskset -c $CLIENT_CPU nice -n "$NICE" "$LOADGEN" "$@"; }
probe() { # probe OUTFILE DURATION_S [DELAY_S]
  client ttfb --addr "127.0.0.1:$PORT" --path /small.bin --rate 1000 --duration-s "$2" \
    --delay-s "${3:-0}" --keepalive 1 --seed 11 --expect-len 1024 >"$1"
}
median() { printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

declare -A V=()
row_trickle() { # row_trickle sl|ng RUN_INDEX
  local s=$1 i=$2 c0 c1 d=$RUN/$1-trickle-$2
  probe "$d-alone.txt" 2
  c0=$(cpu_s)
  client trickle --addr "127.0.0.1:$PORT" --path /small.bin --conns 200 --head-bytes 15000 \
    --tail-bytes 1000 --gap-ms 2 >"$d.txt" &
  local tp=$!
  probe "$d-beside.txt" 2 0.2
  wait "$tp" || die "$s: loadgen trickle failed ($d.txt)"
  c1=$(cpu_s)
  [[ $(kv "$d.txt" bad) == 0 && $(kv "$d.txt" ok) == 200 ]] || die "$s: trickled requests not all answered 200 ($d.txt)"
  [[ $(kv "$d-beside.txt" errors) == 0 ]] || die "$s: probe errors beside the trickle ($d-beside.txt)"
  V[$s.trickle_cpu.$i]=$(calc "$c1 - $c0")
  V[$s.alone_p99.$i]=$(kv "$d-alone.txt" ttfb_p99_ms)
  V[$s.beside_p99.$i]=$(kv "$d-beside.txt" ttfb_p99_ms)
  V[$s.trickle_s.$i]=$(kv "$d.txt" trickle_s)
  log "$s run $i: trickle CPU ${V[$s.trickle_cpu.$i]} s over ${V[$s.trickle_s.$i]} s; probe p99 alone ${V[$s.alone_p99.$i]} ms, beside ${V[$s.beside_p99.$i]} ms"
}

row_misses() { # row_misses sl|ng RUN_INDEX
  local s=$1 i=$2 c0 c1 d=$RUN/$1-misses-$2
  probe "$d-alone.txt" 2
  c0=$(cpu_s)
  client misses --addr "127.0.0.1:$PORT" --rate 10000 --duration-s 3 --conns 8 >"$d.txt" &
  local mp=$!
  probe "$d-beside.txt" 2 0.5
  wait "$mp" || die "$s: loadgen misses failed ($d.txt)"
  c1=$(cpu_s)
  [[ $(kv "$d.txt" other) == 0 ]] || die "$s: a request for a missing file got no 404 ($d.txt)"
  [[ $(kv "$d-beside.txt" errors) == 0 ]] || die "$s: probe errors beside the misses ($d-beside.txt)"
  V[$s.miss_cpu.$i]=$(calc "$c1 - $c0")
  V[$s.miss_rate.$i]=$(kv "$d.txt" rate_per_s)
  V[$s.miss_alone_p99.$i]=$(kv "$d-alone.txt" ttfb_p99_ms)
  V[$s.miss_beside_p99.$i]=$(kv "$d-beside.txt" ttfb_p99_ms)
  log "$s run $i: misses at ${V[$s.miss_rate.$i]}/s, CPU ${V[$s.miss_cpu.$i]} s; probe p99 alone ${V[$s.miss_alone_p99.$i]} ms, beside ${V[$s.miss_beside_p99.$i]} ms"
}

for ((i = 1; i <= RUNS; i++)); do
  for s in sl ng; do
    start "$s"
    row_trickle "$s" "$i"
    row_misses "$s" "$i"
    stop
  done
done

med() { # med KEY: median over the runs
  local s=$1 k=$2 vals=() i
  for ((i = 1; i <= RUNS; i++)); do vals+=("${V[$s.$k.$i]:-}"); done
  median "${vals[@]}"
}
all() { local s=$1 k=$2 out='' i; for ((i = 1; i <= RUNS; i++)); do out+="${V[$s.$k.$i]:-?} "; done; echo "${out% }"; }
ratio() { calc "$1 / $2" | awk '{ printf "%.2f", $1 }'; }
{
  echo "# Hostile input: shardline vs nginx, side by side (perf/hostile.sh)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet || echo '+dirty'), $(nproc) vCPU, $(uname -r); $(nginx -v 2>&1 | sed 's/^nginx version: //') with perf/nginx.conf"
  echo "- servers on CPU $SERVER_CPU (1 shard / 1 worker), clients on CPU $CLIENT_CPU, loopback; $RUNS runs per server alternating, medians (every run in brackets); nice $NICE"
  echo
  echo "| Row | shardline | nginx | shardline / nginx | target |"
  echo "|---|---|---|---|---|"
  sc=$(med sl trickle_cpu) nc=$(med ng trickle_cpu)
  echo "| trickled heads: server CPU-s (200 x 15 000-byte heads, last 1000 bytes at 1 byte / 2 ms) | $sc [$(all sl trickle_cpu)] | $nc [$(all ng trickle_cpu)] | $(ratio "$sc" "$nc") | <= 1.0 |"
  sa=$(med sl alone_p99) sb=$(med sl beside_p99) na=$(med ng alone_p99) nb=$(med ng beside_p99)
  echo "| 1 KiB keep-alive TTFB p99 alone, ms | $sa [$(all sl alone_p99)] | $na [$(all ng alone_p99)] | $(ratio "$sa" "$na") | |"
  echo "| 1 KiB keep-alive TTFB p99 beside the trickle, ms | $sb [$(all sl beside_p99)] | $nb [$(all ng beside_p99)] | $(ratio "$sb" "$nb") | |"
  echo "| beside / alone (each server its own) | $(ratio "$sb" "$sa") | $(ratio "$nb" "$na") | | shardline <= 1.5 |"
  sr=$(med sl miss_rate) nr=$(med ng miss_rate)
  echo "| missing files: 404s answered per s (offered 10 000/s, unique paths, 3 s) | $sr [$(all sl miss_rate)] | $nr [$(all ng miss_rate)] | $(ratio "$sr" "$nr") | |"
  sc=$(med sl miss_cpu) nc=$(med ng miss_cpu)
  echo "| missing files: server CPU-s over the flood | $sc [$(all sl miss_cpu)] | $nc [$(all ng miss_cpu)] | $(ratio "$sc" "$nc") | |"
  sa=$(med sl miss_alone_p99) sb=$(med sl miss_beside_p99) na=$(med ng miss_alone_p99) nb=$(med ng miss_beside_p99)
  echo "| 1 KiB keep-alive TTFB p99 alone / beside the misses, ms | $sa / $sb | $na / $nb | | |"
  echo "| beside / alone (each server its own) | $(ratio "$sb" "$sa") | $(ratio "$nb" "$na") | | shardline <= 1.5 |"
  echo
  echo "Raw outputs: perf/out/hostile/ (\`*-trickle-N.txt\`: loadgen trickle; \`-alone\`/\`-beside\`: loadgen ttfb)."
} >"$OUT"
log "wrote $OUT"
cat "$OUT"
