#!/usr/bin/env bash
# perf/trickle-profile.sh: where each server's CPU goes under perf/hostile.sh's spread trickle
# (row 1b: 200 connections, 15 000-byte heads, the last 1000 bytes one byte per connection per
# 2 ms, each connection at its own phase), shardline and nginx one after the other.
#
#   perf/trickle-profile.sh [--burst] [--freq HZ] [--nice N]
#
# Each server alone on CPU 0 (1 shard / 1 worker, perf/nginx.conf), the trickle on CPU 1. Over
# 1.5 s of the trickle: `perf record -g -e cpu-clock` (software events only) of the serving
# process, its CPU-s (utime+stime), voluntary context switches and, for shardline, the ring's
# enters and completions. --burst profiles row 1 (every connection's byte at once) instead.
# --nice applies to the servers and the client (on this VM, cpu-clock samples of a task at a
# negative nice mostly went missing: profile at nice 0). Prints each server's top symbols, self
# and with children, and the share of samples in a few groups; the profiles stay in
# perf/out/trickle-profile/{sl,ng}.data for `perf report -i`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
SPREAD=1 FREQ=4000 NICE=0
while (($#)); do
  case $1 in
    --burst) SPREAD=0; shift ;;
    --freq) FREQ=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "trickle-profile.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in perf nginx curl; do command -v "$tool" >/dev/null || die "$tool is needed"; done
RUN=$HERE/out/trickle-profile
mkdir -p "$RUN/root"
build_tools
LOADGEN=$HERE/loadgen/target/release/loadgen
ensure_fixture "$LOADGEN" "$RUN/root" "$RUN" small.bin 1024 11
SL_PORT=28790 SL_ADMIN=127.0.0.1:28791 NG_PORT=28792
PG=''
cleanup() { [[ -n $PG ]] && kill_group "$PG" 5; return 0; }
trap cleanup EXIT

profile() { # profile sl|ng
  local s=$1 port sp c0 c1 v0 v1 tp m0='' m1=''
  if [[ $s == sl ]]; then
    port=$SL_PORT
    setsid taskset -c 0 nice -n "$NICE" "$SL_BIN" serve --root "$RUN/root" \
      --listen "127.0.0.1:$port" --admin "$SL_ADMIN" --shards 1 --cpus 0 \
      >"$RUN/sl-server.log" 2>&1 </dev/null &
  else
    port=$NG_PORT
    render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$RUN/root" "$port" 0
    setsid taskset -c 0 nice -n "$NICE" nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf" \
      >"$RUN/ng-server.log" 2>&1 </dev/null &
  fi
  PG=$!
  wait_port "$port" "$PG" 15 || die "$s did not start"
  sleep 0.3
  sp=$(serving_pid "$PG")
  taskset -c 1 nice -n "$NICE" "$LOADGEN" trickle --addr "127.0.0.1:$port" --path /small.bin \
    --conns 200 --head-bytes 15000 --tail-bytes 1000 --gap-ms 2 --spread "$SPREAD" >"$RUN/$s-trickle.txt" &
  tp=$!
  # The trickle proper starts once the 200 connections sent their first 14 000 bytes.
  sleep 0.3
  c0=$("$LOADGEN" cpu --pgid "$PG" | sed -n 's/^cpu_s=//p')
  v0=$(switches "$sp")
  [[ $s == sl ]] && m0=$(curl -s "http://$SL_ADMIN/metrics")
  perf record -e cpu-clock -F "$FREQ" -g -p "$sp" -o "$RUN/$s.data" -- sleep 1.5 >/dev/null 2>"$RUN/$s-perf.log" ||
    die "perf record failed ($RUN/$s-perf.log)"
  c1=$("$LOADGEN" cpu --pgid "$PG" | sed -n 's/^cpu_s=//p')
  v1=$(switches "$sp")
  if [[ $s == sl ]]; then
    m1=$(curl -s "http://$SL_ADMIN/metrics")
    for k in ring_enters_total ring_cqes_total head_scan_waits_total head_parses_total recv_buffers_provided_total recv_no_buffers_total; do
      printf '%s over 1.5 s: %s\n' "$k" "$(($(sum_metric "$m1" "$k") - $(sum_metric "$m0" "$k")))"
    done
  fi
  wait "$tp" || die "$s: loadgen trickle failed"
  [[ $(kv "$RUN/$s-trickle.txt" ok) == 200 ]] || die "$s: trickled requests not all answered ($RUN/$s-trickle.txt)"
  kill_group "$PG" 10 || true
  PG=''
  echo "$s: CPU-s over 1.5 s of trickle: $(calc "$c1 - $c0"); voluntary context switches: $((v1 - v0))"
  echo "$s: top symbols, self:"
  # (head closes the pipe early: not a failure)
  perf report -i "$RUN/$s.data" --no-children --sort sym --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -n 15 || true
  echo "$s: top symbols, with children:"
  perf report -i "$RUN/$s.data" --children --sort sym --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -n 40 || true
  echo
}
switches() { # switches PID: voluntary context switches of all its threads (times it slept)
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt/ { s += $2 } END { print s + 0 }'
}
sum_metric() { # sum_metric TEXT NAME: NAME summed over the shards
  awk -v n="shardline_$2" '$1 ~ "^"n"[{ ]" { s += $2 } END { printf "%d", s + 0 }' <<<"$1"
}

log "shardline $(git -C "$REPO" rev-parse --short HEAD), $(nginx -v 2>&1 | sed 's/^nginx version: //'); spread=$SPREAD, $FREQ Hz"
profile sl
profile ng
