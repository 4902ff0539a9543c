#!/usr/bin/env bash
# perf/traffic.sh: the platforms' real traffic (issue 31's benchmark), shardline side by side
# with nginx set up as lancache sets it up (slice 1m, proxy_cache_lock on), in one run, on the
# same origin behind the same relay, on the same disk.
#
# The trace (perf/loadgen/src/traffic.rs documents the mix; seeded): Steam chunk GETs with
# per-session tokens under three host names, Riot multipart ranges into bundles, PS5 18 MiB
# ranges into packages, Delivery-Optimization random ranges into one archive, and whole-file
# downloads, played by C keep-alive clients (default 16). Its catalogue (1.77 GB at scale 1)
# is bigger than either cache (--cache-mib, default 1280); the bytes it asks for (1.0 GB)
# fit. Each server gets a cold pass (empty cache), then a warm pass (the same trace again).
# Every body byte is checked against the origin's. Before the passes, `shardline cache
# prefill` fills 1000 objects of 1 MiB at --rate 200 MB/s into a shardline of its own, twice
# (the second run must fetch nothing).
#
#   perf/traffic.sh [--scale F] [--clients C] [--cache-mib M] [--delay-ms D] [--seed S]
#                   [--kinds steam,riot,ps5,do,whole] [--out FILE]
#
# --kinds plays only those kinds' sessions (to see what each costs the origin).
#
# Figures, per server: origin body bytes over the unique bytes the cold pass asked for; the
# cold pass's client goodput (requested bytes per second, all clients); the warm pass's byte
# hit ratio, 1 - origin bytes / bytes served (origin bytes are counted in the origin's log);
# wrong responses. The origin is nginx on loopback serving /dev/shm behind a relay that holds
# every response's first byte for D ms (default 20; tc here has no netem). Caches live on ext4
# on a ram-backed loop device. Needs root (losetup, mount). Writes perf/TRAFFIC.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=fill-lib.sh
source "$HERE/fill-lib.sh"
SCALE=1 CLIENTS=16 CACHE_MIB=1280 DELAY_MS=20 SEED=31 KINDS=steam,riot,ps5,do,whole
OUT=$HERE/TRAFFIC.md
while (($#)); do
  case $1 in
    --scale) SCALE=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --cache-mib) CACHE_MIB=$2; shift 2 ;;
    --delay-ms) DELAY_MS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "traffic.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx)"
WORK=$(mktemp -d /dev/shm/pl-traffic-XXXXXX)
MNT=$HERE/out/pl-traffic-mnt-$$
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ramdisk_destroy
  rm -rf "$WORK"
}
trap cleanup EXIT
log "building shardline and loadgen (release)"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml"
cargo build --release --quiet --manifest-path "$HERE/loadgen/Cargo.toml"
SL=${SHARDLINE_BIN:-$REPO/target/release/shardline}
LG=$HERE/loadgen/target/release/loadgen
ulimit -n "$(ulimit -Hn)"

log "writing the catalogue (seed $SEED, scale $SCALE)"
mkdir -p "$WORK/origin"
"$LG" traffic-gen --dir "$WORK/origin" --seed "$SEED" --scale "$SCALE" >"$WORK/gen.txt"
CATALOGUE=$(kv "$WORK/gen.txt" catalogue_bytes)
CACHE_BYTES=$((CACHE_MIB << 20))
((CATALOGUE > CACHE_BYTES)) || log "note: the catalogue ($CATALOGUE B) fits in the cache"
RAMDISK_PRETOUCH=1 ramdisk_create "pl-traffic-disk-$$" $((2 * CACHE_BYTES + (1024 << 20))) "$MNT"
mkdir -p "$MNT/cache" "$MNT/lancache" "$MNT/lancache-tmp" "$MNT/root"
# lancache: its shipped nginx (a master with a cache manager, which enforces max_size).
LANCACHE_MASTER=on LANCACHE_WORKERS=auto LANCACHE_MAX_SIZE="${CACHE_MIB}m" fill_setup

# Prefill first, on a shardline of its own with an empty cache (so the passes' writes do not
# share its disk): PREFILL_OBJECTS objects of 1 MiB at --rate PREFILL_RATE, pinned, then the
# same list again: it must fetch nothing.
PREFILL_OBJECTS=1000 PREFILL_RATE=200000000 PF_PORT=18086 PF_ADMIN_PORT=18087
mkdir -p "$MNT/prefill-cache"
# The admin listener's control token (the prefill's lookups and pins need it), mode 0600. The
# prefill asks two control requests per object: the control rate is raised so it measures the
# fill, not admin_control_per_s.
(umask 077 && head -c 32 /dev/urandom | base64 >"$WORK/admin.token")
cat >"$WORK/prefill.toml" <<EOF
admin_token_file = "$WORK/admin.token"
admin_control_per_s = 100000
cache_dir = "$MNT/prefill-cache"
cache_max_bytes = $CACHE_BYTES
[[origin]]
prefix = "/"
url = "http://127.0.0.1:$RELAY_PORT"
EOF
"$SL" serve --root "$MNT/root" --listen "127.0.0.1:$PF_PORT" --config "$WORK/prefill.toml" \
  --admin "127.0.0.1:$PF_ADMIN_PORT" >"$WORK/prefill-shardline.log" 2>&1 &
PF_PID=$!
PIDS+=("$PF_PID")
wait_port "$PF_PORT" "$PF_PID" 20 || die "shardline (prefill) did not start: $(tail -3 "$WORK/prefill-shardline.log")"

log "prefill: $PREFILL_OBJECTS objects of 1 MiB at $PREFILL_RATE B/s"
mkdir -p "$WORK/origin/prefill"
for ((i = 0; i < PREFILL_OBJECTS; i++)); do
  echo "/prefill/o$i.bin"
done >"$WORK/prefill.txt"
"$LG" gen --path "$WORK/origin/prefill/o0.bin" --size $((1 << 20)) --seed 7 >/dev/null
for ((i = 1; i < PREFILL_OBJECTS; i++)); do
  ln "$WORK/origin/prefill/o0.bin" "$WORK/origin/prefill/o$i.bin"
done
prefill_run() { # NAME: one prefill of the list, its wall time and origin bytes in $WORK/NAME.txt
  local o0 t0 t1
  o0=$(fill_origin_body_bytes)
  t0=$(date +%s.%N)
  "$SL" cache prefill --admin "127.0.0.1:$PF_ADMIN_PORT" --edge "127.0.0.1:$PF_PORT" \
    --token-file "$WORK/admin.token" --rate "$PREFILL_RATE" --pin-until +1h --json "$WORK/prefill.txt" >"$WORK/$1.json" 2>"$WORK/$1.err" ||
    die "$1: prefill failed: $(tail -3 "$WORK/$1.err")"
  t1=$(date +%s.%N)
  sleep 1
  {
    echo "wall_s=$(calc "$t1 - $t0")"
    echo "origin_bytes=$(($(fill_origin_body_bytes) - o0))"
    echo "filled=$(grep -c '"filled"' "$WORK/$1.json" || true)"
    echo "cached=$(grep -c '"cached"' "$WORK/$1.json" || true)"
  } >"$WORK/$1.txt"
  log "$1: $(tr '\n' ' ' <"$WORK/$1.txt")"
}
prefill_run prefill-1
prefill_run prefill-2
kill "$PF_PID"
wait "$PF_PID" 2>/dev/null || true
rm -rf "$MNT/prefill-cache"


SL_PORT=18084 ADMIN_PORT=18085
cat >"$WORK/shardline.toml" <<EOF
cache_dir = "$MNT/cache"
cache_max_bytes = $CACHE_BYTES
# Steam: one chunk under several CDN names is one object; tokens are not part of the key.
[[origin]]
prefix = "/depot/"
host = "cache1-fra1.steamcontent.com"
hosts = ["cache2-fra1.steamcontent.com", "lancache.steamcontent.com"]
url = "http://127.0.0.1:$RELAY_PORT"
# Everything else (Riot, PlayStation, Delivery Optimization by bare IP, Epic) by prefix.
[[origin]]
prefix = "/"
url = "http://127.0.0.1:$RELAY_PORT"
EOF
"$SL" serve --root "$MNT/root" --listen "127.0.0.1:$SL_PORT" --config "$WORK/shardline.toml" \
  --admin "127.0.0.1:$ADMIN_PORT" >"$WORK/shardline.log" 2>&1 &
PIDS+=($!)
wait_port "$SL_PORT" "${PIDS[-1]}" 20 || die "shardline did not start: $(tail -3 "$WORK/shardline.log")"

# pass NAME PORT: plays the trace against PORT into $WORK/NAME.txt, with the origin's body
# bytes over the pass appended as origin_bytes.
pass() {
  local o0
  o0=$(fill_origin_body_bytes)
  "$LG" traffic --addr "127.0.0.1:$2" --seed "$SEED" --scale "$SCALE" --clients "$CLIENTS" \
    --sessions-from "$KINDS" >"$WORK/$1.txt" 2>"$WORK/$1.err" || die "$1: loadgen failed: $(tail -3 "$WORK/$1.err")"
  sleep 1 # the origin's log line of a response is written when it ends
  echo "origin_bytes=$(($(fill_origin_body_bytes) - o0))" >>"$WORK/$1.txt"
  log "$1: $(tr '\n' ' ' <"$WORK/$1.txt")"
}
# The ceiling of any cold pass here: the trace straight from the origin through its relay,
# no cache (the relay and the origin share the two vCPUs with the edge under test).
log "the origin through its relay, no cache"
pass relay "$RELAY_PORT"
log "shardline: cold pass, then warm"
pass sl-cold "$SL_PORT"
pass sl-warm "$SL_PORT"
log "lancache: cold pass, then warm"
pass lc-cold "$LANCACHE_PORT"
pass lc-warm "$LANCACHE_PORT"

get() { kv "$WORK/$1.txt" "$2"; }
UNIQUE=$(get sl-cold unique_bytes)
wrong=0
for p in relay sl-cold sl-warm lc-cold lc-warm; do
  wrong=$((wrong + $(get $p wrong_responses) + $(get $p errors)))
done
amp() { calc "$(get "$1" origin_bytes) / $UNIQUE"; }
hit() { calc "1 - $(get "$1" origin_bytes) / $(get "$1" useful_bytes)"; }
sl_amp=$(amp sl-cold) lc_amp=$(amp lc-cold)
sl_hit=$(hit sl-warm) lc_hit=$(hit lc-warm)
sl_gp=$(get sl-cold goodput_mb_s) lc_gp=$(get lc-cold goodput_mb_s)
gp_ratio=$(calc "$sl_gp / $lc_gp")

{
  echo "# Traffic: the platforms' mix, shardline against lancache (perf/traffic.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$REPO" rev-parse --short HEAD), $(nproc) CPUs, $(uname -r)."
  echo "Command: \`perf/traffic.sh --scale $SCALE --clients $CLIENTS --cache-mib $CACHE_MIB --delay-ms $DELAY_MS --seed $SEED\`."
  echo
  echo "Catalogue $CATALOGUE bytes (objects at the origin the trace draws from); caches $CACHE_BYTES bytes each;"
  echo "the trace asks for $UNIQUE unique bytes ($(get sl-cold requests) requests in $(get sl-cold sessions) sessions, $CLIENTS clients)."
  echo "Origin: nginx on loopback behind a relay holding each response's first byte $DELAY_MS ms."
  echo
  echo "| | shardline | lancache | target |"
  echo "|---|---|---|---|"
  printf '| origin bytes / unique bytes asked (cold pass) | %.3f | %.3f | at most 1.1 |\n' "$sl_amp" "$lc_amp"
  printf '| cold pass goodput, MB/s (all clients) | %.1f | %.1f | shardline at least 3x lancache: **%.2fx** |\n' "$sl_gp" "$lc_gp" "$gp_ratio"
  printf '| the same trace from the origin through its relay, no cache, MB/s (any cold pass'"'"'s ceiling here) | %.1f | | shardline at %.2f of it |\n' "$(get relay goodput_mb_s)" "$(calc "$sl_gp / $(get relay goodput_mb_s)")"
  printf '| warm pass goodput, MB/s | %.1f | %.1f | |\n' "$(get sl-warm goodput_mb_s)" "$(get lc-warm goodput_mb_s)"
  printf '| warm pass byte hit ratio | %.4f | %.4f | at least 0.99 |\n' "$sl_hit" "$lc_hit"
  printf '| wrong or failed responses (both passes) | %d | %d | 0 |\n' \
    "$(($(get sl-cold wrong_responses) + $(get sl-warm wrong_responses) + $(get sl-cold errors) + $(get sl-warm errors)))" \
    "$(($(get lc-cold wrong_responses) + $(get lc-warm wrong_responses) + $(get lc-cold errors) + $(get lc-warm errors)))"
  echo
  pf_bytes=$((PREFILL_OBJECTS << 20))
  pf_rate=$(calc "$pf_bytes / $(get prefill-1 wall_s)")
  echo "Prefill (\`shardline cache prefill --rate $PREFILL_RATE --pin-until +1h\`, $PREFILL_OBJECTS objects of 1 MiB, 8 at once, through the same relay, into an empty cache of a shardline of its own, before the passes):"
  echo
  echo "| run | objects filled / already cached | wall s | rate, B/s | of the cap | origin bytes |"
  echo "|---|---|---|---|---|---|"
  printf '| first | %d / %d | %.2f | %.0f | %.3f (target within 5%%) | %d |\n' "$(get prefill-1 filled)" "$(get prefill-1 cached)" \
    "$(get prefill-1 wall_s)" "$pf_rate" "$(calc "$pf_rate / $PREFILL_RATE")" "$(get prefill-1 origin_bytes)"
  printf '| second | %d / %d | %.2f | | | %d (target 0) |\n' "$(get prefill-2 filled)" "$(get prefill-2 cached)" \
    "$(get prefill-2 wall_s)" "$(get prefill-2 origin_bytes)"
  echo
  echo "Per pass (bytes; useful = what the requests asked for):"
  echo
  echo "| pass | wall s | useful | body | origin | steam | riot | ps5 | do | whole |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for p in relay sl-cold sl-warm lc-cold lc-warm; do
    echo "| $p | $(get $p wall_s) | $(get $p useful_bytes) | $(get $p body_bytes) | $(get $p origin_bytes) | $(get $p steam_useful_bytes) | $(get $p riot_useful_bytes) | $(get $p ps5_useful_bytes) | $(get $p do_useful_bytes) | $(get $p whole_useful_bytes) |"
  done
} >"$OUT"
cat "$OUT"
((wrong == 0)) || die "$wrong wrong or failed responses (see $WORK/*.err)"
