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
# AB_PULLED=1 measures warm cache hits instead: the same files pulled through an [[origin]]
# (nginx serving them on loopback, started here), each filled and hit once before the
# measured run, so every measured request is a hit of the pull-through cache.
#
# Needs wrk and curl (installed with apt-get when missing and run as root) and 2 CPUs.
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
for tool in wrk curl; do
  command -v "$tool" >/dev/null && continue
  # The project installs what its benchmarks need (as perf/bench.sh does).
  [[ $(id -u) == 0 ]] || die "$tool is needed (Debian package $tool); run as root to install it"
  log "installing $tool (apt-get)"
  apt-get update -qq >&2 || log "apt-get update failed; trying the cached lists"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >&2 || die "cannot install $tool"
done
ROOT=$(mktemp -d /var/tmp/pl-ab-root-XXXXXX)
PID="" ORIGIN_PID=""
cleanup() {
  [[ -n $PID ]] && kill "$PID" 2>/dev/null
  [[ -n $ORIGIN_PID ]] && kill "$ORIGIN_PID" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$ROOT" "${CLONE:-/nonexistent}"
}
trap cleanup EXIT
head -c 1024 /dev/urandom >"$ROOT/small.bin"
head -c $((1 << 20)) /dev/urandom >"$ROOT/mid.bin"
PORT=18200
ORIGIN_PORT=18201
SERVE_ARGS=(--root "$ROOT")
if [[ -n ${AB_PULLED:-} ]]; then
  command -v nginx >/dev/null || die "AB_PULLED needs nginx (Debian package nginx)"
  mkdir -p "$ROOT/origin" "$ROOT/local"
  mv "$ROOT/small.bin" "$ROOT/mid.bin" "$ROOT/origin/"
  cat >"$ROOT/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $ROOT/nginx.pid; error_log $ROOT/nginx.err;
events { worker_connections 256; }
http { access_log off; sendfile on; client_body_temp_path $ROOT; proxy_temp_path $ROOT;
  fastcgi_temp_path $ROOT; uwsgi_temp_path $ROOT; scgi_temp_path $ROOT;
  server { listen 127.0.0.1:$ORIGIN_PORT; root $ROOT/origin; } }
EOF
  taskset -c 1 nginx -p "$ROOT" -c "$ROOT/nginx.conf" &
  ORIGIN_PID=$!
  wait_port "$ORIGIN_PORT" "$ORIGIN_PID" 10 || die "the nginx origin did not start"
  SERVE_ARGS=(--root "$ROOT/local" --config "$ROOT/shardline.toml")
fi
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
    if [[ -n ${AB_PULLED:-} ]]; then
      # A fresh cache each run: the first request fills, the second is a hit.
      rm -rf "$ROOT/cache" && mkdir -p "$ROOT/cache"
      printf 'cache_dir = "%s"\n[[origin]]\nprefix = "/"\nurl = "http://127.0.0.1:%s"\n' \
        "$ROOT/cache" "$ORIGIN_PORT" >"$ROOT/shardline.toml"
    fi
    "$bin" serve "${SERVE_ARGS[@]}" --listen "127.0.0.1:$PORT" --shards 1 --cpus 0 >/dev/null 2>&1 &
    PID=$!
    wait_port "$PORT" "$PID" 20 || die "build $which did not start"
    if [[ -n ${AB_PULLED:-} ]]; then
      for f in small.bin mid.bin small.bin mid.bin; do
        curl -sf -o /dev/null "http://127.0.0.1:$PORT/$f" || die "build $which: /$f not served"
      done
    fi
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
