#!/usr/bin/env bash
# perf/testssl.sh: testssl.sh against shardline's TLS port, output kept in perf/testssl/.
#
#   perf/testssl.sh
#
# Runs tests/testssl.rs (release build): shardline with an ECDSA P-256 and an RSA-2048
# certificate from a test CA on a loopback TLS port, testssl.sh (Debian package testssl.sh,
# installed by scripts/test-deps.sh) with every check, and the test's verdict (nothing rated
# VULNERABLE or NOT ok, no HIGH or CRITICAL finding, exactly TLS 1.2 and 1.3 offered). Writes
# perf/testssl/testssl.txt (what testssl printed) and perf/testssl/testssl.json (its findings).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# shellcheck source=../scripts/test-deps.sh
source "$REPO/scripts/test-deps.sh"

install_test_tools
mkdir -p "$HERE/testssl"
log "running tests/testssl.rs (release); output in perf/testssl/"
cd "$REPO"
SHARDLINE_TESTSSL_OUT=$HERE/testssl cargo test --release --test testssl -- --nocapture
log "testssl found nothing rated VULNERABLE, NOT ok, HIGH or CRITICAL; perf/testssl/testssl.txt and .json written"
