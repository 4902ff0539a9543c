#!/usr/bin/env bash
# perf/ab.sh: two shardline builds side by side, for a change that should not move a figure
# (a refactor) on a host whose absolute speed drifts. Each round runs build A, then build B,
# on the same files (a 1 KiB and a 1 MiB file on the host's disk), one shard on CPU 0 and one
# wrk connection on CPU 1 for 5 s per file (as perf/bench.sh pins them); it prints each
# round's requests/s and p99 and the mean requests/s of each build.
#
#   perf/ab.sh OLD_COMMIT [ROUNDS]     # builds OLD_COMMIT in a clone; B is this tree's build
#   perf/ab.sh --bins A_BIN B_BIN [ROUNDS]
#
# Needs wrk, curl and 2 CPUs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
[[ $# -ge 1 ]] || print_usage "$0" 2
case $1 in
  -h | --help) print_usage "$0" ;;
  --bins)
    [[ $# -ge 3 ]] || print_usage "$0" 2
    A=$2 B=$3 ROUNDS=${4:-3}
    ;;
  *)
    OLD=$1 ROUNDS=${2:-3}
    CLONE=$(mktemp -d /var/tmp/pl-ab-XXXXXX)
    git clone -q "$REPO" "$CLONE/src"
    git -C "$CLONE/src" checkout -q "$OLD" || die "no commit $OLD"
    log "building $OLD (release)"
    CARGO_TARGET_DIR=$CLONE/target cargo build --release --quiet --manifest-path "$CLONE/src/Cargo.toml"
    A=$CLONE/target/release/shardline
    log "building this tree (release)"
    cargo build --release --quiet --manifest-path "$REPO/Cargo.toml"
    B=$REPO/target/release/shardline
    ;;
esac
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
for tool in wrk curl; do command -v "$tool" >/dev/null || die "$tool is needed (Debian package $tool)"; done
ROOT=$(mktemp -d /var/tmp/pl-ab-root-XXXXXX)
PID=""
cleanup() {
  [[ -n $PID ]] && kill "$PID" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$ROOT" "${CLONE:-/nonexistent}"
}
trap cleanup EXIT
head -c 1024 /dev/urandom >"$ROOT/small.bin"
head -c $((1 << 20)) /dev/urandom >"$ROOT/mid.bin"
PORT=18200
# rate_p99 URL: "requests/s p99" of one connection for 5 s.
rate_p99() {
  taskset -c 1 wrk -t1 -c1 -d5s --latency "$1" 2>/dev/null |
    awk '$1 == "Requests/sec:" { r = $2 } $1 == "99%" { p = $2 } END { print r, p }'
}
declare -A SUM
for round in $(seq "$ROUNDS"); do
  for which in A B; do
    bin=$A
    [[ $which == B ]] && bin=$B
    "$bin" serve --root "$ROOT" --listen "127.0.0.1:$PORT" --shards 1 --cpus 0 >/dev/null 2>&1 &
    PID=$!
    wait_port "$PORT" "$PID" 20 || die "build $which did not start"
    read -r small_rate small_p99 < <(rate_p99 "http://127.0.0.1:$PORT/small.bin")
    read -r mid_rate mid_p99 < <(rate_p99 "http://127.0.0.1:$PORT/mid.bin")
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=""
    echo "round $round $which: 1 KiB $small_rate req/s (p99 $small_p99), 1 MiB $mid_rate req/s (p99 $mid_p99)"
    SUM[$which-small]=$(calc "${SUM[$which-small]:-0} + $small_rate")
    SUM[$which-mid]=$(calc "${SUM[$which-mid]:-0} + $mid_rate")
  done
done
for which in A B; do
  echo "$which mean: 1 KiB $(calc "${SUM[$which-small]} / $ROUNDS") req/s, 1 MiB $(calc "${SUM[$which-mid]} / $ROUNDS") req/s"
done
