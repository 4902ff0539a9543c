#!/usr/bin/env bash
# Stand-in for the shardline binary, for checking perf/bench.sh's plumbing before the engine
# serves: accepts shardline's CLI contract and execs nginx with the anchor config (perf/nginx.conf).
#   SHARDLINE_BIN=perf/nginx-as-shardline.sh perf/bench.sh --quick
# Both columns of the table are then nginx, so every ratio should be close to 1.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

[[ ${1:-} == serve ]] || { echo "usage: $0 serve --root DIR --listen HOST:PORT [--shards N] [--cpus LIST] [--config FILE]" >&2; exit 2; }
shift
root='' listen='' cpus=0
while (($#)); do
  case $1 in
    --help) echo "nginx-as-shardline: serve --root DIR --listen HOST:PORT --shards 1 --cpus N"; exit 0 ;;
    --root) root=$2; shift 2 ;;
    --listen) listen=$2; shift 2 ;;
    --cpus) cpus=${2%%[,-]*}; shift 2 ;;
    --shards | --config) shift 2 ;;
    *) echo "nginx-as-shardline: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $root && -n $listen ]] || { echo "nginx-as-shardline: --root and --listen are required" >&2; exit 2; }
port=${listen##*:}
prefix="$here/out/nginx-as-shardline-$port"
render_nginx_conf "$here/nginx.conf" "$prefix" "$(cd "$root" && pwd)" "$port" "$cpus"
exec nginx -p "$prefix" -c "$prefix/nginx.conf"
