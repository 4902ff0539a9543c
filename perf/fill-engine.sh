#!/usr/bin/env bash
# perf/fill-engine.sh: how fast shardline's fill engine alone (issue 20, fill::cache_fill,
# with no client attached; perf/fill.sh measures clients) fills one cold object from an nginx
# origin onto the cache disk, side by
# side with nginx proxy_cache set up as lancache sets it up (slice 1m, proxy_cache_lock on),
# which fills the same object cold while it sends it to one curl client.
#
#   perf/fill-engine.sh [--mib N] [--delay-ms D] [--connections C] [--run-blocks R] [--out FILE]
#
# Same run, same origin, same disk for both: the origin is nginx on loopback serving an N MiB
# object (default 1024) from /dev/shm; the caches live on ext4 on a ram-backed loop device
# (perf/lib.sh ramdisk_create: O_DIRECT works, the disk is never the bottleneck). tc here has
# no netem, so the origin's distance is modelled in the origin itself: with --delay-ms D
# (default 20) every response's first byte waits D ms (nginx `echo_sleep` is not in Debian's
# nginx, so a tiny delaying TCP relay in python3 sits in front of it).
#
# What it compares is the fill, not the serving: shardline's figure has no client attached
# (the shard does not serve from the cache yet), lancache's includes sending to curl over
# loopback. Writes perf/FILL-ENGINE.md. Needs root (losetup, mount).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=fill-lib.sh
source "$HERE/fill-lib.sh"
MIB=1024 DELAY_MS=20 CONNS=4 RUN=16 OUT=$HERE/FILL-ENGINE.md
while (($#)); do
  case $1 in
    --mib) MIB=$2; shift 2 ;;
    --delay-ms) DELAY_MS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --run-blocks) RUN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "fill-engine.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx)"
command -v curl >/dev/null || die "curl is missing"
WORK=$(mktemp -d /dev/shm/pl-fill-XXXXXX)
MNT=$HERE/out/pl-fill-mnt-$$
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ramdisk_destroy
  rm -rf "$WORK"
}
trap cleanup EXIT
log "building examples/fill_rate (release)"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --example fill_rate
BIN=$REPO/target/release/examples/fill_rate

mkdir -p "$WORK/origin"
head -c $((MIB << 20)) /dev/urandom >"$WORK/origin/obj.bin"
ramdisk_create "pl-fill-disk-$$" $((3 * (MIB << 20) + (512 << 20))) "$MNT"

fill_setup

log "shardline fill engine: cold $MIB MiB through the ${DELAY_MS} ms origin, $CONNS connections"
"$BIN" --origin "127.0.0.1:$RELAY_PORT" --path /obj.bin --dir "$MNT/shardline" \
  --connections "$CONNS" --run-blocks "$RUN" --read-ahead $((CONNS * RUN)) >"$WORK/shardline.txt" || die "fill_rate failed"
sl_mbs=$(kv "$WORK/shardline.txt" mb_per_s)
sl_s=$(kv "$WORK/shardline.txt" seconds)
log "shardline: $sl_mbs MB/s ($sl_s s)"
cmp <(head -c $((MIB << 20)) "$MNT/shardline/data/0000000000000001") "$WORK/origin/obj.bin" ||
  die "the filled data file differs from the origin's object"

log "the origin through the relay, one curl client (the ceiling of both)"
rl=$(curl -s -o /dev/null -w '%{time_total} %{size_download}' "http://127.0.0.1:$RELAY_PORT/obj.bin")
rl_s=${rl% *}
rl_mbs=$(calc "${rl#* } / $rl_s / 1e6")
log "relay: $rl_mbs MB/s"

log "lancache-style nginx: cold $MIB MiB through the same origin, one curl client"
lc=$(curl -s -o /dev/null -w '%{time_total} %{size_download}' "http://127.0.0.1:$LANCACHE_PORT/obj.bin")
lc_s=${lc% *} lc_bytes=${lc#* }
((lc_bytes == MIB << 20)) || die "lancache-style nginx sent $lc_bytes bytes"
lc_mbs=$(calc "$lc_bytes / $lc_s / 1e6")
log "lancache-style nginx: $lc_mbs MB/s ($lc_s s)"
ratio=$(calc "$sl_mbs / $lc_mbs")

{
  echo "# Fill engine: one cold object from a distant origin (perf/fill-engine.sh)"
  echo
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) vCPU, $(uname -r), at $(git -C "$REPO" rev-parse --short HEAD)."
  echo "Object: $MIB MiB from nginx on loopback behind a relay that holds every response's first byte"
  echo "for $DELAY_MS ms (the origin's distance). Caches on ext4 on a ram-backed loop device."
  echo
  echo "| | MB/s | seconds | |"
  echo "|---|---:|---:|---|"
  echo "| the origin through the relay, one curl client, no cache (the ceiling) | $(printf %.1f "$rl_mbs") | $rl_s | |"
  echo "| shardline fill engine ($CONNS connections, 1 MiB blocks, runs of $RUN, read-ahead $((CONNS * RUN))) | $(printf %.1f "$sl_mbs") | $sl_s | the engine alone: no client (perf/fill.sh has them) |"
  echo "| nginx proxy_cache, lancache setup (slice 1m, proxy_cache_lock on) | $(printf %.1f "$lc_mbs") | $lc_s | fill + send to one curl client |"
  echo
  echo "Ratio: **$(printf %.2f "$ratio")x**. Every byte of shardline's data file was compared with the origin's object."
  echo
  echo "Shardline's row is the fill engine alone (examples/fill_rate.rs, no client): what the fill"
  echo "can feed. Lancache's is what its client gets (one 1 MiB slice at a time, each paying the"
  echo "origin's first-byte delay). perf/fill.sh compares client downloads."
} >"$OUT"
log "wrote $OUT"
