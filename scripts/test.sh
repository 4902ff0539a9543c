#!/usr/bin/env bash
# The project's test entry point (used by CI): formatting, lints, and the whole test suite.
# Installs the real clients the integration tests drive (scripts/test-deps.sh) first.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test-deps.sh
source scripts/test-deps.sh
install_test_tools
install_sslyze

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets -- --test-threads=2
