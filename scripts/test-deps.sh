#!/usr/bin/env bash
# Installs the Debian packages the test suite drives as real peers, when they are missing:
# HTTPS clients (curl, wget, aria2c, openssl, python3), testssl.sh, HAProxy (fleet tests),
# nginx (the origin of the cache-fill tests), iproute2 (network namespaces) and util-linux
# (prlimit/setpriv for the unprivileged runs);
# and sslyze (a TLS scanner by another project, checking the TLS port against Mozilla's
# "intermediate" configuration) from PyPI into its own virtualenv, linked as
# /usr/local/bin/sslyze.
# Sourced by scripts/test.sh (the README's test command) and run by .ci/run, so a fresh
# machine with only the Rust toolchain runs the whole suite.
set -euo pipefail

# command -> Debian package providing it
declare -A TEST_TOOLS=(
    [curl]=curl
    [wget]=wget
    [aria2c]=aria2
    [openssl]=openssl
    [python3]=python3
    [testssl]=testssl.sh
    [haproxy]=haproxy
    [nginx]=nginx
    [ip]=iproute2
    [setpriv]=util-linux
    [prlimit]=util-linux
)

install_test_tools() {
    local missing=() cmd
    for cmd in "${!TEST_TOOLS[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("${TEST_TOOLS[$cmd]}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    # One package may provide several commands.
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "test-deps: installing ${missing[*]} (apt-get)" >&2
    $sudo apt-get update -qq || echo "test-deps: apt-get update failed; trying the cached lists" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# PyPI, pinned: the version tests/sslyze.rs was checked against.
SSLYZE_VERSION=6.3.1
SSLYZE_VENV=/opt/shardline-test-tools/sslyze-$SSLYZE_VERSION

install_sslyze() {
    command -v sslyze >/dev/null 2>&1 && return 0
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
        echo "test-deps: installing python3-venv (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    fi
    echo "test-deps: installing sslyze $SSLYZE_VERSION (pip, into $SSLYZE_VENV)" >&2
    $sudo python3 -m venv "$SSLYZE_VENV"
    $sudo "$SSLYZE_VENV/bin/pip" install -q "sslyze==$SSLYZE_VERSION"
    $sudo ln -sf "$SSLYZE_VENV/bin/sslyze" /usr/local/bin/sslyze
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    install_test_tools
    install_sslyze
fi
