#!/usr/bin/env bash
# shellcheck disable=SC2317 # cleanup runs from a trap
# perf/accept-rate.sh: what capturing every client's address costs (issue 19). Two shardline
# builds side by side in one run: BEFORE (a git revision without the capture, built in a
# worktree under perf/out/) and the current tree.
#
#   perf/accept-rate.sh [--before REV] [--duration-s N] [--rounds N] [--out FILE] [--report-only]
#
# Each round runs both builds, alternating (A B A B ...), a fresh server each time, 1 shard
# pinned to CPU 0, wrk pinned to CPU 1, on a 1 KiB file over loopback:
#   fresh: 64 connections, `Connection: close` on every request, so every request is an accept
#          (the path the capture adds an SO_PEERNAME request to);
#   kept-alive: 64 kept-alive connections (the small-file rate of perf/bench.sh, row 3).
# Writes perf/ACCEPT-RATE.md (requests/s of each run, the medians and after/before ratios).
# Default: --before 6e0f3c3 (the last commit before the capture), 8 s per run, 3 rounds.
# --after-config 'TOML LINES' runs the current build with those config lines (for example
# 'max_connections_per_client = 1000', to price the per-client cap's shared counters).
# --report-only rewrites the report from the last run's outputs (perf/out/accept-rate/).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

BEFORE=6e0f3c3 DURATION_S=8 ROUNDS=3 OUT=$HERE/ACCEPT-RATE.md REPORT_ONLY=0 AFTER_CONFIG=''
while (($#)); do
  case $1 in
    --before) BEFORE=$2; shift 2 ;;
    --duration-s) DURATION_S=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --report-only) REPORT_ONLY=1; shift ;;
    --after-config) AFTER_CONFIG=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "accept-rate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v wrk >/dev/null || {
  log "installing wrk (apt-get)"
  apt-get install -y -qq wrk >/dev/null || die "wrk is needed (Debian package wrk)"
}

RUN=$HERE/out/accept-rate WT=$HERE/out/accept-before-wt
mkdir -p "$RUN"
((REPORT_ONLY)) || rm -f "$RUN"/*.txt "$RUN"/*.rps
PORT=28580
SRV_PID=''
cleanup() {
  [[ -n $SRV_PID ]] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
  return 0
}
trap cleanup EXIT

if ((REPORT_ONLY == 0)); then
log "building the current tree"
(cd "$REPO" && cargo build --release --quiet)
AFTER_BIN=$REPO/target/release/shardline
AFTER_REV=$(git -C "$REPO" rev-parse --short HEAD)
BEFORE_REV=$(git -C "$REPO" rev-parse --short "$BEFORE")
log "building $BEFORE_REV in $WT"
if [[ ! -d $WT ]]; then git -C "$REPO" worktree add --detach -f "$WT" "$BEFORE_REV" >/dev/null; fi
git -C "$WT" checkout -q --detach "$BEFORE_REV"
(cd "$WT" && CARGO_TARGET_DIR=$HERE/out/accept-before-target cargo build --release --quiet)
BEFORE_BIN=$HERE/out/accept-before-target/release/shardline

ROOT=$RUN/root
mkdir -p "$ROOT"
head -c 1024 /dev/urandom >"$ROOT/small.bin"

printf '%s\n' "$AFTER_CONFIG" >"$RUN/after.toml"
echo "" >"$RUN/before.toml"
run_one() { # run_one NAME BIN MODE ROUND
  local name=$1 bin=$2 mode=$3 round=$4 f
  f=$RUN/$name-$mode-$round.txt
  taskset -c 0 "$bin" serve --config "$RUN/$name.toml" --root "$ROOT" --listen "127.0.0.1:$PORT" --admin '' --shards 1 --cpus 0 \
    >"$RUN/$name-server.log" 2>&1 &
  SRV_PID=$!
  wait_port "$PORT" "$SRV_PID" 10 || die "$name did not start"
  local hdr=()
  [[ $mode == fresh ]] && hdr=(-H "Connection: close")
  taskset -c 1 wrk -t1 -c64 -d"${DURATION_S}s" --timeout 10s "${hdr[@]}" -s "$HERE/wrk-summary.lua" \
    "http://127.0.0.1:$PORT/small.bin" >"$f" 2>&1 || die "wrk failed ($name $mode)"
  kill "$SRV_PID"
  wait "$SRV_PID" 2>/dev/null || true
  SRV_PID=''
  local req dur
  req=$(kv "$f" wrk_requests) dur=$(kv "$f" wrk_duration_us)
  echo "$(calc "$req / ($dur / 1e6)")" >"$f.rps"
  log "$name $mode round $round: $(cat "$f.rps") req/s (errors: connect $(kv "$f" wrk_err_connect), read $(kv "$f" wrk_err_read), status $(kv "$f" wrk_err_status))"
}

for mode in fresh kept; do
  for ((r = 1; r <= ROUNDS; r++)); do
    run_one before "$BEFORE_BIN" "$mode" "$r"
    run_one after "$AFTER_BIN" "$mode" "$r"
  done
done
echo "$BEFORE_REV $AFTER_REV" >"$RUN/revs"
printf '%s\n' "$AFTER_CONFIG" >"$RUN/after-config"
fi
read -r BEFORE_REV AFTER_REV <"$RUN/revs"
AFTER_CONFIG=$(cat "$RUN/after-config" 2>/dev/null || true)
# Requests per second of each run, one per line (from wrk's totals).
rps_of() { # rps_of NAME MODE
  local f req dur
  for f in "$RUN/$1-$2"-*.txt; do
    req=$(kv "$f" wrk_requests) dur=$(kv "$f" wrk_duration_us)
    printf '%.0f\n' "$(calc "$req / ($dur / 1e6)")"
  done
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
{
  echo "# What capturing every client's address costs (perf/accept-rate.sh)"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/accept-rate.sh --before $BEFORE --duration-s $DURATION_S --rounds $ROUNDS${AFTER_CONFIG:+ --after-config '$AFTER_CONFIG'}\`"
  [[ -n $AFTER_CONFIG ]] && echo "- after runs with the config lines: \`$AFTER_CONFIG\`"
  echo "- Host: kernel $(uname -r), $(nproc) CPUs; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- before: $BEFORE_REV (no address capture); after: $AFTER_REV (SO_PEERNAME on every accepted socket, client address in the log path). Same flags: \`serve --shards 1 --cpus 0\`, default config, wrk -t1 -c64 pinned to CPU 1, a 1 KiB file on loopback; builds alternate, a fresh server per run"
  echo
  echo "| workload | before req/s (each run) | after req/s (each run) | median before | median after | after / before |"
  echo "|---|---|---|---:|---:|---:|"
  for mode in fresh kept; do
    b=$(rps_of before "$mode" | paste -sd' ')
    a=$(rps_of after "$mode" | paste -sd' ')
    mb=$(rps_of before "$mode" | median)
    ma=$(rps_of after "$mode" | median)
    label=$([[ $mode == fresh ]] && echo "fresh connection per request (accept rate)" || echo "kept-alive (small-file rate)")
    printf '| %s | %s | %s | %.0f | %.0f | %.3f |\n' "$label" "$b" "$a" "$mb" "$ma" "$(calc "$ma / $mb")"
    grep -h "wrk_err_" "$RUN/before-$mode"-*.txt "$RUN/after-$mode"-*.txt | grep -v '=0$' >>"$RUN/errors" || true
  done
  echo
  echo "Target (issue 19): the small-file request rate with address capture >= 0.95 of before."
} >"$OUT"
log "wrote $OUT"
