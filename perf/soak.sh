#!/usr/bin/env bash
# Soak test: a release shardline under a long mixed load, every byte checked.
#
#   perf/soak.sh [--seconds N] [--workers W] [--shards S] [--idle N] [--dir DIR] [--keep]
#
# Builds release shardline and perf/soakgen, writes a fixture (7 files from 0 B to 256 MiB,
# content a function of offset) into DIR (default /var/tmp/shardline-soak, kept between runs
# so the 256 MiB file is written once; a real disk so O_DIRECT is used), starts shardline on
# it and runs soakgen for N seconds (default 60): full and ranged GETs, multi-range, HEAD +
# If-None-Match, keep-alive churn (new connection per request) and aborted downloads (FIN and
# RST). Reports requests, errors on valid requests, wrong bytes, peak RSS and fd-count drift,
# the server's own counters from its admin /metrics (stray completions must stay 0), then, with
# --idle N (default 10000; 0 skips), the RSS cost of N idle keep-alive connections.
#
# Exit status: 0 clean; 1 wrong bytes, errors on valid requests, or a failed final GET;
# 2 the server crashed or did not stop cleanly on SIGTERM; 3 setup failed.
set -euo pipefail

SECONDS_RUN=60
WORKERS=8
SHARDS=1
IDLE=10000
DIR=/var/tmp/shardline-soak
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_RUN="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --idle) IDLE="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 3 ;;
  esac
done

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
echo "== building (release)"
cargo build --release --quiet --bin shardline
cargo build --release --quiet --manifest-path perf/soakgen/Cargo.toml
SOAKGEN="$REPO/perf/soakgen/target/release/soakgen"
BIN="$REPO/target/release/shardline"

echo "== fixture in $DIR"
"$SOAKGEN" gen "$DIR"

WORK="$(mktemp -d /tmp/shardline-soak-run.XXXXXX)"
PID=""
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null || true; fi
  if [ "$KEEP" = 1 ]; then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# Idle connections need client descriptors; keep the idle count within our own limit.
NOFILE="$(ulimit -n)"
if [ "$IDLE" -gt 0 ] && [ "$NOFILE" != unlimited ] && [ "$IDLE" -gt $((NOFILE - 200)) ]; then
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  NOFILE="$(ulimit -n)"
  if [ "$NOFILE" != unlimited ] && [ "$IDLE" -gt $((NOFILE - 200)) ]; then
    echo "note: ulimit -n is $NOFILE; idle connections reduced to $((NOFILE - 200))"
    IDLE=$((NOFILE - 200))
  fi
fi

echo "== starting shardline ($SHARDS shard(s))"
RUST_LOG=warn "$BIN" serve --root "$DIR" --listen 127.0.0.1:0 --shards "$SHARDS" \
  --admin 127.0.0.1:0 >"$WORK/stdout" 2>"$WORK/stderr" &
PID=$!
ADDR=""
ADMIN=""
for _ in $(seq 1 200); do
  ADDR="$(grep -v 'admin at' "$WORK/stdout" 2>/dev/null | grep -o 'http://[0-9.:]*' | head -n1 | sed 's|http://||')" || true
  ADMIN="$(grep 'admin at' "$WORK/stdout" 2>/dev/null | grep -o 'http://[0-9.:]*' | head -n1 | sed 's|http://||')" || true
  [ -n "$ADDR" ] && [ -n "$ADMIN" ] && break
  if ! kill -0 "$PID" 2>/dev/null; then break; fi
  sleep 0.1
done
if [ -z "$ADDR" ] || [ -z "$ADMIN" ]; then
  echo "shardline did not start:"; cat "$WORK/stderr"; exit 3
fi
echo "   pid $PID listening on $ADDR, admin on $ADMIN"

echo "== mixed load for ${SECONDS_RUN}s, $WORKERS workers"
STATUS=0
"$SOAKGEN" run --addr "$ADDR" --seconds "$SECONDS_RUN" --workers "$WORKERS" --pid "$PID" \
  --admin "$ADMIN" || STATUS=1

if [ "$IDLE" -gt 0 ] && kill -0 "$PID" 2>/dev/null; then
  echo "== $IDLE idle keep-alive connections"
  "$SOAKGEN" idle --addr "$ADDR" --conns "$IDLE" --pid "$PID" || echo "(idle measurement incomplete)"
fi

if ! kill -0 "$PID" 2>/dev/null; then
  wait "$PID" || true
  echo "SERVER CRASHED; stderr tail:"; tail -n 30 "$WORK/stderr"
  PID=""
  exit 2
fi
kill -TERM "$PID"
RC=0
wait "$PID" || RC=$?
PID=""
if [ "$RC" != 0 ]; then
  echo "server exited with status $RC after SIGTERM; stderr tail:"; tail -n 30 "$WORK/stderr"
  exit 2
fi
if grep -q -i 'panicked' "$WORK/stderr"; then
  echo "server log contains a panic:"; grep -i -A5 'panicked' "$WORK/stderr" | head -n 20
  exit 2
fi
echo "server stopped cleanly on SIGTERM"
WARNINGS="$(grep -c -E ' (WARN|ERROR) ' "$WORK/stderr" || true)"
echo "server warnings/errors logged: $WARNINGS"
[ "$WARNINGS" -gt 0 ] && grep -E ' (WARN|ERROR) ' "$WORK/stderr" | sed 's/\x1b\[[0-9;]*m//g' | sort | uniq -c | sort -rn | head -n 5
exit "$STATUS"
