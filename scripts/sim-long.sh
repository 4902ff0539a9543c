#!/usr/bin/env bash
# scripts/sim-long.sh: the nightly-sized simulator run (issue 30): SEEDS seeds (default
# 1 000 000) of the shard simulator in release mode, then the fault-class minimums, the same
# invariants as CI's 2 000. Prints the summary line and the wall time; a failing seed prints
# its one-line reproduction.
#
#   scripts/sim-long.sh [SEEDS]
#
# Wall time: 1 000 000 seeds took 21 min 30 s on the 2-vCPU CI host (2026-12-04, commit 337466d,
# release build included), with no failing seed. The run before (commit 6e07976) found 36 of
# the million failing; they are fixed and kept as `seeds_that_once_failed_pass` in
# src/shard/sim/mod.rs. A failing seed prints its reproduction line
# (`SHARDLINE_SIM_SEED=N cargo test --lib shard::sim`; a comma-separated list runs several).
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-1000000}
[[ $SEEDS =~ ^[0-9]+$ ]] || { echo "sim-long.sh: SEEDS must be a number, not '$SEEDS'" >&2; exit 2; }
cargo test --release --lib --no-run --quiet
start=$(date +%s)
SHARDLINE_SIM_SEEDS=$SEEDS cargo test --release --lib --quiet \
  shard::sim::simulated_shard_keeps_its_invariants -- --nocapture 2>&1 | grep -v '^$'
end=$(date +%s)
echo "sim-long: $SEEDS seeds in $((end - start)) s on $(nproc) CPUs ($(date -u '+%Y-%m-%d'), commit $(git rev-parse --short HEAD))"
