#!/usr/bin/env bash
# The project's test entry point (used by CI): formatting, lints, and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets -- --test-threads=2
