#!/usr/bin/env bash
# perf/fill-ab.sh: two shardline builds' cold fills side by side, for a change to the fill
# path that should not move its speed (issue 45's probe of each origin connection), on a host
# whose absolute speed drifts. Each round downloads an N MiB object (default 1024) cold
# through build A, then through build B (which goes first alternates), each from an empty
# cache, one client (curl), from the same origin behind the same relay as perf/fill.sh (nginx
# on /dev/shm, first byte held D ms, default 20), caches on ext4 on a ram-backed loop device.
# Prints each round's MB/s and writes the medians and B/A to perf/FILL-AB.md.
#
#   perf/fill-ab.sh OLD_COMMIT [--rounds R] [--mib N] [--delay-ms D]   # A = OLD_COMMIT, B = this tree
#   perf/fill-ab.sh --bins A_BIN B_BIN [--rounds R] [--mib N] [--delay-ms D]
#
# Needs root (losetup, mount), nginx, curl, python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=fill-lib.sh
source "$HERE/fill-lib.sh"
[[ $# -ge 1 ]] || print_usage "$0" 2
ROUNDS=5 MIB=1024 DELAY_MS=20 OUT=$HERE/FILL-AB.md A='' B='' OLD=''
case $1 in
  -h | --help) print_usage "$0" ;;
  --bins) [[ $# -ge 3 ]] || print_usage "$0" 2; A=$2 B=$3; shift 3 ;;
  *) OLD=$1; shift ;;
esac
while (($#)); do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --delay-ms) DELAY_MS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "fill-ab.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive number, not '$ROUNDS'"
for tool in nginx curl python3; do command -v "$tool" >/dev/null || die "$tool is missing"; done
WORK=$(mktemp -d /dev/shm/pl-fill-ab-XXXXXX)
MNT=$HERE/out/pl-fill-ab-mnt-$$
PIDS=() CLONE=''
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ramdisk_destroy
  rm -rf "$WORK" "${CLONE:-/nonexistent}"
}
trap cleanup EXIT
if [[ -n $OLD ]]; then
  CLONE=$(mktemp -d /var/tmp/pl-fill-ab-XXXXXX)
  git clone -q "$REPO" "$CLONE/src"
  git -C "$CLONE/src" checkout -q "$OLD" || die "no commit $OLD"
  log "building $OLD (release)"
  CARGO_TARGET_DIR=$CLONE/target cargo build --release --quiet --manifest-path "$CLONE/src/Cargo.toml"
  A=$CLONE/target/release/shardline
  log "building this tree (release)"
  cargo build --release --quiet --manifest-path "$REPO/Cargo.toml"
  B=$REPO/target/release/shardline
fi
BYTES=$((MIB << 20))
mkdir -p "$WORK/origin/pull"
head -c "$BYTES" /dev/urandom >"$WORK/origin/pull/a.bin"
ulimit -n "$(ulimit -Hn)"
# Room for two cold copies at a time (each round's caches are removed after it).
RAMDISK_PRETOUCH=1 ramdisk_create "pl-fill-ab-disk-$$" $((3 * BYTES + (512 << 20))) "$MNT"
mkdir -p "$MNT/root"
fill_setup
SL_PORT=18094

# cold BIN: MB/s of one cold download of the object through BIN (a fresh cache directory).
cold() {
  local bin=$1 pid out s
  rm -rf "$MNT/cache" && mkdir -p "$MNT/cache"
  cat >"$WORK/shardline.toml" <<EOF
cache_dir = "$MNT/cache"
[[origin]]
prefix = "/pull/"
url = "http://127.0.0.1:$RELAY_PORT"
EOF
  "$bin" serve --root "$MNT/root" --listen "127.0.0.1:$SL_PORT" --config "$WORK/shardline.toml" \
    --admin "" >"$WORK/shardline.log" 2>&1 &
  pid=$!
  wait_port "$SL_PORT" "$pid" 20 || die "$bin did not start: $(tail -3 "$WORK/shardline.log")"
  out=$(curl -s -o /dev/null -w '%{time_total} %{size_download}' "http://127.0.0.1:$SL_PORT/pull/a.bin")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  [[ ${out#* } == "$BYTES" ]] || die "$bin sent ${out#* } bytes, not $BYTES"
  s=${out% *}
  calc "$BYTES / $s / 1e6"
}

as=() bs=() ratios=()
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then a=$(cold "$A"); b=$(cold "$B"); else b=$(cold "$B"); a=$(cold "$A"); fi
  as+=("$a") bs+=("$b") ratios+=("$(calc "$b / $a")")
  log "round $round: A $(printf '%.0f' "$a") MB/s, B $(printf '%.0f' "$b") MB/s"
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
{
  echo "# Cold fill, two builds (perf/fill-ab.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(uname -r); a ${MIB} MiB object cold through"
  echo "one shardline per round (default shards), one curl, origin nginx on /dev/shm behind a"
  echo "relay holding each first byte ${DELAY_MS} ms; caches on ext4 on a ram-backed loop device."
  echo "A: \`${OLD:-$A}\`, B: \`$( [[ -n $OLD ]] && git -C "$REPO" rev-parse --short HEAD || echo "$B")\`."
  echo
  echo "| round | A MB/s | B MB/s | B/A |"
  echo "|---|---|---|---|"
  for i in "${!as[@]}"; do
    printf '| %d | %.0f | %.0f | %.3f |\n' $((i + 1)) "${as[$i]}" "${bs[$i]}" "${ratios[$i]}"
  done
  printf '| **median** | %.0f | %.0f | %.3f |\n' "$(median "${as[@]}")" "$(median "${bs[@]}")" "$(median "${ratios[@]}")"
} >"$OUT"
cat "$OUT"
