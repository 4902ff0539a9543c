#!/usr/bin/env bash
# perf/cache-index.sh: the cache index's memory per object and its time to ready after a
# restart, at 1, 3 and 10 million objects, beside another revision's index in the same run
# (issue 44).
#
#   perf/cache-index.sh [--base REV] [--sizes "1000000 3000000 10000000"] [--blocks B]
#                       [--rounds R] [--dir DIR] [--out FILE]
#
# Builds `examples/cache_restart.rs` (release) twice: from this tree, and from REV (default
# ccea321, the landed code) with this tree's example file, so both run the same program on
# their own index. For each size it writes one journal of N objects of B blocks (default 4,
# no churn) with this tree's build, then, R times (default 2) and alternating, drops the page
# cache and opens it with each build in a process of its own: the journal read from disk and
# replayed into a ready index. Reports bytes per object (VmRSS after the load minus before,
# over the objects), peak RSS and time to ready, and a straight-line fit through the sizes
# for 30 million. Needs root (drop_caches). Writes perf/CACHE-INDEX.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BASE=ccea321 SIZES="1000000 3000000 10000000" BLOCKS=4 ROUNDS=2
DIR=/var/tmp/shardline-cache-index OUT=$HERE/CACHE-INDEX.md
while (($#)); do
  case $1 in
    --base) BASE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "cache-index.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || die "needs root (it drops the page cache before each restart)"
mkdir -p "$DIR"
log "building examples/cache_restart (release) from this tree"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --example cache_restart
NEW=$DIR/cache_restart.new
cp "$REPO/target/release/examples/cache_restart" "$NEW"
WT=$HERE/out/cache-index-base
base_rev=$(git -C "$REPO" rev-parse --short "$BASE")
if [[ ! -d $WT ]]; then git -C "$REPO" worktree add --detach -f "$WT" "$BASE" >/dev/null; fi
git -C "$WT" checkout -q --detach "$BASE"
cp "$REPO/examples/cache_restart.rs" "$WT/examples/cache_restart.rs"
log "building examples/cache_restart (release) at $base_rev"
cargo build --release --quiet --manifest-path "$WT/Cargo.toml" --example cache_restart
OLD=$DIR/cache_restart.base
cp "$WT/target/release/examples/cache_restart" "$OLD"
git -C "$WT" checkout -q -- examples/cache_restart.rs

# field FILE REGEX: the first capture of REGEX (sed -E) in FILE.
field() { sed -nE "s/$2/\1/p" "$1" | head -1; }

rows=() fit_new=() fit_old=()
for n in $SIZES; do
  j=$DIR/n$n
  rm -rf "$j"
  log "writing a journal of $n objects"
  KEEP=1 "$NEW" "$j" "$n" "$BLOCKS" 1 >"$DIR/write-$n.txt"
  for ((r = 1; r <= ROUNDS; r++)); do
    for side in base new; do
      bin=$OLD; [[ $side == new ]] && bin=$NEW
      sync; echo 3 >/proc/sys/vm/drop_caches
      f=$DIR/open-$n-$side-$r.txt
      "$bin" open "$j/journal" >"$f"
      ready=$(field "$f" '.*ready in ([0-9.]+) s.*')
      peak=$(field "$f" '.*peak RSS ([0-9]+) MiB.*')
      per=$(field "$f" '.*: ([0-9]+) bytes per object.*')
      rows+=("| $n | $side | $r | $per | $peak | $ready |")
      log "$n objects, $side, round $r: $per B/object, peak $peak MiB, ready in $ready s"
      if [[ $side == new ]]; then fit_new+=("$n $per $ready"); else fit_old+=("$n $per $ready"); fi
    done
  done
  rm -rf "$j"
done

# fit "N BYTES SECONDS"...: least squares of bytes per object and of seconds over N, at 30M.
fit() {
  printf '%s\n' "$@" | awk '
    { n[NR] = $1 / 1e6; b[NR] = $2 * $1 / 1048576; t[NR] = $3 }
    END {
      for (i = 1; i <= NR; i++) { sx += n[i]; sb += b[i]; st += t[i]; sxx += n[i] * n[i]; sxb += n[i] * b[i]; sxt += n[i] * t[i] }
      d = NR * sxx - sx * sx
      mb = (NR * sxb - sx * sb) / d; cb = (sb - mb * sx) / NR
      mt = (NR * sxt - sx * st) / d; ct = (st - mt * sx) / NR
      printf "%.0f MiB (%.0f bytes per object), ready in %.1f s", cb + 30 * mb, (cb + 30 * mb) * 1048576 / 30e6, ct + 30 * mt
    }'
}
{
  echo "# The cache index at size: memory and time to ready (perf/cache-index.sh)"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/cache-index.sh --sizes \"$SIZES\" --rounds $ROUNDS\`"
  echo "- new: this tree ($(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- src examples || echo ', with uncommitted changes')); base: $base_rev. Both run the same \`examples/cache_restart.rs\`."
  echo "- Host: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); journal on $(df -P "$DIR" | awk 'NR == 2 { print $1 }'), dropped from the page cache before each open"
  echo "- Workload: N objects of $BLOCKS blocks (a 59-byte key, an ETag, a content type), no churn; one process per open: the journal read from disk and replayed into a ready index"
  echo "- bytes/object: VmRSS after the load minus before, over the objects (the index, block checksums included, and what malloc holds); peak: VmHWM"
  echo
  echo "| objects | index | round | bytes/object | peak RSS (MiB) | ready (s) |"
  echo "|---:|---|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "30 million objects, by a least-squares line through every round above (memory = bytes/object x N; time to ready; both close to linear in N):"
  echo
  echo "- new: $(fit "${fit_new[@]}")"
  echo "- base: $(fit "${fit_old[@]}")"
} >"$OUT"
log "wrote $OUT"
