#!/usr/bin/env bash
# perf/disks-replay.sh: a start-up's open of a cache on several disks, their journals replayed
# side by side (a thread each) against one after another, in the same run (issue 44).
#
#   perf/disks-replay.sh [--disks D] [--objects N] [--blocks B] [--rounds R] [--dir DIR]
#                        [--out FILE]
#
# Builds `examples/cache_restart` (release), writes D cache disks (default 2) under DIR
# (default /dev/shm/shardline-disks-replay: RAM, as NVMe drives that each read faster than one
# core replays) holding N objects of B blocks in all (default 6 000 000 of 4, keys distinct
# per disk, no churn), then R times (default 3), alternating, opens them with
# `cache_restart open-disks --in-order` and `cache_restart open-disks`, each a process of its
# own. Reports the time to a ready index of each and their ratio. Writes perf/DISKS-REPLAY.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
DISKS=2 OBJECTS=6000000 BLOCKS=4 ROUNDS=3
DIR=/dev/shm/shardline-disks-replay OUT=$HERE/DISKS-REPLAY.md
while (($#)); do
  case $1 in
    --disks) DISKS=$2; shift 2 ;;
    --objects) OBJECTS=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "disks-replay.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
((DISKS >= 2)) || die "--disks must be at least 2"
log "building examples/cache_restart (release)"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --example cache_restart
BIN=$REPO/target/release/examples/cache_restart
rm -rf "$DIR"
per=$((OBJECTS / DISKS))
dirs=()
for ((d = 0; d < DISKS; d++)); do
  mkdir -p "$DIR/disk$d"
  log "disk $d: appending $per objects"
  "$BIN" append "$DIR/disk$d/journal" "$per" "$BLOCKS" $((d * per)) >/dev/null
  dirs+=("$DIR/disk$d")
done
# ready OUTPUT: the seconds to a ready index in a line of `open-disks`.
ready() { sed -nE 's/.*index ready in ([0-9.]+) s.*/\1/p' <<<"$1"; }
in_order=() side=()
for ((r = 1; r <= ROUNDS; r++)); do
  a=$("$BIN" open-disks --in-order "${dirs[@]}")
  b=$("$BIN" open-disks "${dirs[@]}")
  log "round $r: $a"
  log "round $r: $b"
  in_order+=("$(ready "$a")") side+=("$(ready "$b")")
  objects=$(sed -nE 's/.*\(([0-9]+) objects\).*/\1/p' <<<"$b")
  [[ $objects == $((per * DISKS)) ]] || die "side by side found $objects objects, not $((per * DISKS))"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
mi=$(median "${in_order[@]}") ms=$(median "${side[@]}")
{
  echo "# A cache on several disks: journals replayed side by side against in order"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/disks-replay.sh --disks $DISKS --objects $OBJECTS --blocks $BLOCKS --rounds $ROUNDS\`; commit $(git -C "$REPO" rev-parse --short HEAD)"
  echo "- Host: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); disks: directories in $DIR (RAM)"
  echo "- Workload: $DISKS disks of $per objects of $BLOCKS blocks each (distinct keys), no churn; each open a process of its own (\`cache_restart open-disks\`, \`--in-order\` for one after another)"
  echo
  echo "| open | index ready, median (each round) |"
  echo "|---|---|"
  echo "| in order | $mi s (${in_order[*]}) |"
  echo "| side by side | $ms s (${side[*]}) |"
  echo "| in order / side by side | $(awk -v a="$mi" -v b="$ms" 'BEGIN { printf "%.2f", a / b }') |"
} >"$OUT"
cat "$OUT"
rm -rf "$DIR"
