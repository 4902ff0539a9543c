#!/usr/bin/env bash
# perf/hostile.sh: what hostile input costs shardline against the nginx anchor (issue 30), side by
# side in one run.
#
#   perf/hostile.sh [--runs N] [--nice N] [--rows LIST] [--out FILE]
#
# Each server alone on CPU 0 (shardline `serve --shards 1 --cpus 0`, default config; nginx with
# perf/nginx.conf, 1 worker); the clients on CPU 1; loopback; fixtures on the repository's disk.
# Rows, each run N times (default 3) per server, servers alternating, medians reported:
# 1. trickled heads: 200 connections each send the first 14 000 bytes of a 15 000-byte head at
#    once, then the last 1000 one byte per 2 ms (TCP_NODELAY; `loadgen trickle`). The server's
#    utime+stime over the trickle, and the TTFB p99 of 1 KiB keep-alive fetches at 1000/s (2000 samples a window, so a p99 is not 4 samples)
#    (`loadgen ttfb --keepalive 1`) beside it against the same probe alone.
# 1b. spread trickle (issue 46): the same, but each connection's bytes at its own phase of the
#    2 ms (`loadgen trickle --spread 1`): ~100 000 one-byte segments/s arriving one by one, so
#    the server is woken for nearly every byte and cannot batch them as in row 1's bursts.
# 2. missing files: 10 000 requests/s for paths that do not exist, never the same twice (so no
#    negative cache answers; `loadgen misses`, 8 keep-alive connections), for 3 s. The same
#    probe's p99 beside it against alone, and the server's CPU over the flood.
# 3. handshake memory: 1000 connections to the HTTPS port each send 64 KiB of a ClientHello that
#    announces 100 KiB (A), or 48 KiB of one of 60 KiB (B: under rustls's 64 KiB limit, so
#    shardline's budget is what refuses), then stall for 6 s (`loadgen hellos`). shardline's handshake bytes held
#    (`shardline_tls_handshake_bytes`, at its highest while they stall) against its budget
#    (`tls_handshake_budget_bytes`, 16 MiB by default), each server's RSS growth, how many
#    connections each still holds at the end, and a plain-HTTP download's goodput (1 connection,
#    64 MiB file in a loop, 3 s) beside them against alone.
# --rows takes a comma list of trickle,spread,misses,hellos (default all); rows left out are
# reported as not run.
# Writes perf/HOSTILE.md (keeping its hand-written part: everything from the line "## Notes" on);
# raw outputs in perf/out/hostile/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
RUNS=3 NICE=0 OUT=$HERE/HOSTILE.md ROWS=trickle,spread,misses,hellos
while (($#)); do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "hostile.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for r in ${ROWS//,/ }; do
  [[ $r =~ ^(trickle|spread|misses|hellos)$ ]] || die "--rows: unknown row '$r'"
done
want() { [[ ,$ROWS, == *",$1,"* ]]; }
command -v nginx >/dev/null || {
  [[ $(id -u) == 0 ]] || die "nginx is missing; run as root (or install nginx-light) first"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >&2 || die "cannot install nginx"
}
RUN=$HERE/out/hostile
mkdir -p "$RUN/root"
build_tools
LOADGEN=$HERE/loadgen/target/release/loadgen
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" small.bin 1024 11
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" big.bin $((64 << 20)) 12
tls_test_cert "$RUN/tls"
SL_PORT=28780 NG_PORT=28782 SL_ADMIN=127.0.0.1:28781 SL_TLS_PORT=28783 NG_TLS_PORT=28784
HS_BUDGET_BYTES=$((16 << 20))
cat >"$RUN/sl.toml" <<EOF
tls_listen = "127.0.0.1:$SL_TLS_PORT"
tls_handshake_budget_bytes = $HS_BUDGET_BYTES
[[tls_certificate]]
cert = "$RUN/tls/cert.pem"
key = "$RUN/tls/key.pem"
EOF
SERVER_CPU=0 CLIENT_CPU=1
PG=''
cleanup() { [[ -n $PG ]] && kill_group "$PG" 5; return 0; }
trap cleanup EXIT

start() { # start sl|ng: sets PG and PORT
  # A server left behind would take the load while the one measured failed to start.
  for p in $SL_PORT ${SL_ADMIN##*:} $NG_PORT $SL_TLS_PORT $NG_TLS_PORT; do
    ! port_busy "$p" || die "port $p is in use: a server left from an earlier run? (ss -ltnp)"
  done
  if [[ $1 == sl ]]; then
    PORT=$SL_PORT TLS_PORT=$SL_TLS_PORT
    setsid taskset -c $SERVER_CPU nice -n "$NICE" "$SL_BIN" serve --root "$RUN/root" \
      --listen "127.0.0.1:$PORT" --admin "$SL_ADMIN" --shards 1 --cpus $SERVER_CPU \
      --config "$RUN/sl.toml" \
      >"$RUN/sl-server.log" 2>&1 </dev/null &
  else
    PORT=$NG_PORT
    TLS_PORT=$NG_TLS_PORT
    render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$RUN/root" "$PORT" $SERVER_CPU \
      "$TLS_PORT" "$RUN/tls/cert.pem" "$RUN/tls/key.pem"
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
row_trickle() { # row_trickle sl|ng RUN_INDEX [spread]: row 1, or with "spread" row 1b
  local s=$1 i=$2 c0 c1 p='' d=$RUN/$1-trickle-$2 spread=0
  if [[ ${3:-} == spread ]]; then p=s d=$RUN/$1-spread-$2 spread=1; fi
  probe "$d-alone.txt" 2
  c0=$(cpu_s)
  client trickle --addr "127.0.0.1:$PORT" --path /small.bin --conns 200 --head-bytes 15000 \
    --tail-bytes 1000 --gap-ms 2 --spread $spread >"$d.txt" &
  local tp=$!
  probe "$d-beside.txt" 2 0.2
  wait "$tp" || die "$s: loadgen trickle failed ($d.txt)"
  c1=$(cpu_s)
  [[ $(kv "$d.txt" bad) == 0 && $(kv "$d.txt" ok) == 200 ]] || die "$s: trickled requests not all answered 200 ($d.txt)"
  [[ $(kv "$d-beside.txt" errors) == 0 ]] || die "$s: probe errors beside the trickle ($d-beside.txt)"
  V[$s.${p}trickle_cpu.$i]=$(calc "$c1 - $c0")
  V[$s.${p}alone_p99.$i]=$(kv "$d-alone.txt" ttfb_p99_ms)
  V[$s.${p}beside_p99.$i]=$(kv "$d-beside.txt" ttfb_p99_ms)
  V[$s.${p}trickle_s.$i]=$(kv "$d.txt" trickle_s)
  # The probe's p99 less the time its own thread waited for CPU 1, which the trickle's sender
  # shares (loadgen ttfb's ttfb_minus_wait): what is left is the server's and the network's.
  V[$s.${p}alone_net_p99.$i]=$(kv "$d-alone.txt" ttfb_minus_wait_p99_ms)
  V[$s.${p}beside_net_p99.$i]=$(kv "$d-beside.txt" ttfb_minus_wait_p99_ms)
  log "$s run $i${3:+ ($3)}: trickle CPU ${V[$s.${p}trickle_cpu.$i]} s over ${V[$s.${p}trickle_s.$i]} s; probe p99 alone ${V[$s.${p}alone_p99.$i]} ms, beside ${V[$s.${p}beside_p99.$i]} ms"
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

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$(serving_pid "$PG")/status" 2>/dev/null || echo 0; }
sl_metric() { # sl_metric NAME: shardline's gauge NAME summed over the shards
  curl -s "http://$SL_ADMIN/metrics" | awk -v n="$1" '$1 ~ "^"n"[{ ]" { s += $2 } END { print s + 0 }'
}
row_hellos() { # row_hellos sl|ng RUN_INDEX TAG ANNOUNCE_KIB SEND_KIB
  local s=$1 i=$2 t=$3 d=$RUN/$1-hellos$3-$2 ready=$RUN/$1-hellos$3-$2.ready r0 rmax=0 r held=0 h k
  client bulk --addr "127.0.0.1:$PORT" --path /big.bin --conns 1 --duration-s 3 --warmup-s 0.5 \
    --expect-len $((64 << 20)) >"$d-bulk-alone.txt" || die "$s: bulk alone failed"
  r0=$(rss_kib)
  rm -f "$ready"
  client hellos --addr "127.0.0.1:$TLS_PORT" --conns 1000 --announce-bytes $(($4 << 10)) \
    --send-bytes $(($5 << 10)) --hold-s 6 --ready-file "$ready" >"$d.txt" &
  local hp=$!
  for ((k = 0; k < 300; k++)); do [[ -s $ready ]] && break; sleep 0.05; done
  [[ -s $ready ]] || die "$s: loadgen hellos never sent its ClientHellos ($d.txt)"
  client bulk --addr "127.0.0.1:$PORT" --path /big.bin --conns 1 --duration-s 3 --warmup-s 0.5 \
    --expect-len $((64 << 20)) >"$d-bulk-beside.txt" &
  local bp=$!
  # Sample while they stall: the highest RSS, and shardline's handshake bytes.
  for ((k = 0; k < 20; k++)); do
    r=$(rss_kib)
    ((r > rmax)) && rmax=$r
    if [[ $s == sl ]]; then
      h=$(sl_metric shardline_tls_handshake_bytes)
      ((h > held)) && held=$h
    fi
    sleep 0.2
  done
  wait "$bp" || die "$s: bulk beside the hellos failed"
  wait "$hp" || die "$s: loadgen hellos failed ($d.txt)"
  V[$s.hs${t}_held.$i]=$held
  V[$s.hs${t}_rss.$i]=$(((rmax - r0) / 1024))
  V[$s.hs${t}_open.$i]=$(kv "$d.txt" still_open)
  V[$s.hs${t}_alone.$i]=$(calc "$(kv "$d-bulk-alone.txt" bytes_per_s) / 1000000" | awk '{ printf "%.0f", $1 }')
  V[$s.hs${t}_beside.$i]=$(calc "$(kv "$d-bulk-beside.txt" bytes_per_s) / 1000000" | awk '{ printf "%.0f", $1 }')
  log "$s run $i: 1000 x $5 KiB of $4 KiB ClientHellos, stalled: held ${held} B, RSS +${V[$s.hs${t}_rss.$i]} MiB, ${V[$s.hs${t}_open.$i]} still open; goodput ${V[$s.hs${t}_alone.$i]} -> ${V[$s.hs${t}_beside.$i]} MB/s"
}

for ((i = 1; i <= RUNS; i++)); do
  for s in sl ng; do
    start "$s"
    if want trickle; then row_trickle "$s" "$i"; fi
    if want spread; then row_trickle "$s" "$i" spread; fi
    if want misses; then row_misses "$s" "$i"; fi
    if want hellos; then
      row_hellos "$s" "$i" A 100 64
      row_hellos "$s" "$i" B 60 48
    fi
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
# Judged before the report is written: writing it would make the tree look changed.
DIRTY=$(git -C "$REPO" diff --quiet -- . ":!${OUT#"$REPO"/}" 2>/dev/null || echo '+dirty')
NOTES=$(sed -n '/^## Notes/,$p' "$OUT" 2>/dev/null || true)
{
  echo "# Hostile input: shardline vs nginx, side by side (perf/hostile.sh)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD)$DIRTY, $(nproc) vCPU, $(uname -r); $(nginx -v 2>&1 | sed 's/^nginx version: //') with perf/nginx.conf"
  echo "- servers on CPU $SERVER_CPU (1 shard / 1 worker), clients on CPU $CLIENT_CPU, loopback; $RUNS runs per server alternating, medians (every run in brackets); nice $NICE"
  echo
  echo "| Row | shardline | nginx | shardline / nginx | target |"
  echo "|---|---|---|---|---|"
  for p in '' s; do
    if [[ -z $p ]]; then
      want trickle || continue
      what="trickled heads (burst: each 2 ms one byte to every connection at once)"
    else
      want spread || continue
      what="trickled heads, spread (each connection's byte at its own phase of the 2 ms)"
    fi
    sc=$(med sl ${p}trickle_cpu) nc=$(med ng ${p}trickle_cpu)
    echo "| $what: server CPU-s (200 x 15 000-byte heads, last 1000 bytes at 1 byte / 2 ms) | $sc [$(all sl ${p}trickle_cpu)] | $nc [$(all ng ${p}trickle_cpu)] | $(ratio "$sc" "$nc") | <= 1.0 |"
    sa=$(med sl ${p}alone_p99) sb=$(med sl ${p}beside_p99) na=$(med ng ${p}alone_p99) nb=$(med ng ${p}beside_p99)
    echo "| $what: 1 KiB keep-alive TTFB p99 alone, ms | $sa [$(all sl ${p}alone_p99)] | $na [$(all ng ${p}alone_p99)] | $(ratio "$sa" "$na") | |"
    echo "| $what: 1 KiB keep-alive TTFB p99 beside the trickle, ms | $sb [$(all sl ${p}beside_p99)] | $nb [$(all ng ${p}beside_p99)] | $(ratio "$sb" "$nb") | |"
    echo "| $what: p99 beside / alone (each server its own) | $(ratio "$sb" "$sa") | $(ratio "$nb" "$na") | | shardline <= 1.5 |"
    sa=$(med sl ${p}alone_net_p99) sb=$(med sl ${p}beside_net_p99) na=$(med ng ${p}alone_net_p99) nb=$(med ng ${p}beside_net_p99)
    echo "| $what: the same p99 less the probe client's own CPU wait, alone / beside, ms | $sa / $sb [$(all sl ${p}beside_net_p99)] | $na / $nb [$(all ng ${p}beside_net_p99)] | | |"
    echo "| $what: that p99 beside / alone (each server its own) | $(ratio "$sb" "$sa") | $(ratio "$nb" "$na") | | |"
  done
  if want misses; then
    sr=$(med sl miss_rate) nr=$(med ng miss_rate)
    echo "| missing files: 404s answered per s (offered 10 000/s, unique paths, 3 s) | $sr [$(all sl miss_rate)] | $nr [$(all ng miss_rate)] | $(ratio "$sr" "$nr") | |"
    sc=$(med sl miss_cpu) nc=$(med ng miss_cpu)
    echo "| missing files: server CPU-s over the flood | $sc [$(all sl miss_cpu)] | $nc [$(all ng miss_cpu)] | $(ratio "$sc" "$nc") | |"
    sa=$(med sl miss_alone_p99) sb=$(med sl miss_beside_p99) na=$(med ng miss_alone_p99) nb=$(med ng miss_beside_p99)
    echo "| 1 KiB keep-alive TTFB p99 alone / beside the misses, ms | $sa / $sb | $na / $nb | | |"
    echo "| beside / alone (each server its own) | $(ratio "$sb" "$sa") | $(ratio "$nb" "$na") | | shardline <= 1.5 |"
  fi
  for t in A B; do
    want hellos || continue
    if [[ $t == A ]]; then what="1000 x 64 KiB of a 100 KiB ClientHello (over rustls's 64 KiB), stalled"; else what="1000 x 48 KiB of a 60 KiB ClientHello, stalled"; fi
    echo "| $what: shardline's handshake bytes held at most, MiB | $(calc "$(med sl hs${t}_held) / 1048576" | awk '{ printf "%.1f", $1 }') [$(all sl hs${t}_held)] | | | <= budget $((HS_BUDGET_BYTES >> 20)) MiB |"
    echo "| $what: server RSS growth, MiB | $(med sl hs${t}_rss) [$(all sl hs${t}_rss)] | $(med ng hs${t}_rss) [$(all ng hs${t}_rss)] | | |"
    echo "| $what: connections still held after 6 s (of 1000) | $(med sl hs${t}_open) [$(all sl hs${t}_open)] | $(med ng hs${t}_open) [$(all ng hs${t}_open)] | | |"
    ga=$(med sl hs${t}_alone) gb=$(med sl hs${t}_beside) nga=$(med ng hs${t}_alone) ngb=$(med ng hs${t}_beside)
    echo "| $what: a 1-connection download alone / beside, MB/s | $ga / $gb | $nga / $ngb | | |"
    echo "| $what: goodput beside / alone (each server its own) | $(ratio "$gb" "$ga") | $(ratio "$ngb" "$nga") | | kept |"
  done
  echo
  echo "Rows run: $ROWS."
  echo
  echo "Raw outputs: perf/out/hostile/ (\`*-trickle-N.txt\`, \`*-spread-N.txt\`: loadgen trickle; \`-alone\`/\`-beside\`: loadgen ttfb)."
  if [[ -n $NOTES ]]; then
    echo
    printf '%s\n' "$NOTES"
  fi
} >"$OUT"
log "wrote $OUT"
cat "$OUT"
