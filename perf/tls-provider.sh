#!/usr/bin/env bash
# perf/tls-provider.sh: the measurements behind shardline's TLS crypto provider and record layout.
#
#   perf/tls-provider.sh [--out FILE]
#
# Builds perf/tlsprobe (its own crate: rustls with both providers, aws-lc-rs and ring) and runs
# it pinned to CPU 0: AEAD throughput on 16 KiB records, server CPU per TLS 1.3 handshake (full
# and resumed; ECDSA P-256/P-384, RSA-2048; X25519, and the X25519MLKEM768 hybrid that only
# aws-lc-rs offers), and the cost of sealing an arena slot's records in place versus out of
# place. Writes perf/TLS-PROVIDER.md (about a minute; CPU-bound, no root needed).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }
OUT=$HERE/TLS-PROVIDER.md
while (($#)); do
  case $1 in
    --out) [[ $# -ge 2 ]] || usage 2; OUT=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "tls-provider.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

command -v cargo >/dev/null || die "cargo is needed to build perf/tlsprobe"
log "building perf/tlsprobe (release)"
cargo build --release --quiet --manifest-path "$HERE/tlsprobe/Cargo.toml" || die "perf/tlsprobe did not build"
PROBE=$HERE/tlsprobe/target/release/tlsprobe
CPU=0
log "running tlsprobe on CPU $CPU"
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$SECONDS
tables=$(taskset -c "$CPU" "$PROBE") || die "tlsprobe failed"
versions=$(awk -F'"' '/^name = "(aws-lc-rs|aws-lc-sys|ring|rustls)"$/ { n = $2; getline; print n " " $2 }' "$HERE/tlsprobe/Cargo.lock" | sort -u | tr '\n' ',' | sed 's/,$//; s/,/, /g')
aes=$(grep -m1 -o -w -E 'vaes|aes' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)
{
  echo "# TLS crypto provider and record layout (perf/tls-provider.sh)"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/tls-provider.sh\`; took $((SECONDS - T0)) s"
  echo "- Host: kernel $(uname -r), CPU \"$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)\" x $(nproc); flags: $(grep -m1 -o -w -E 'vaes|vpclmulqdq|avx512f|aes|pclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ')(from /proc/cpuinfo); load average at start $START_LOAD, at end $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- Crates: $versions (perf/tlsprobe/Cargo.lock; shardline's Cargo.lock pins the same rustls and aws-lc-rs)"
  echo "- Method: one thread pinned to CPU $CPU; every figure is the best of 5 rounds, the compared measurements interleaved round by round (other work on the host only slows a round down, and a slow stretch hits all alike). AEAD: 20 000 records of 16 384 bytes sealed in place. Handshakes: 1000 TLS 1.3 handshakes per round, rustls client and server in one thread with the bytes passed in memory, only the server's calls timed (read the flight, process, write the answer), tickets on (aws-lc-rs's ticketer for both providers, as shardline), the server's certificate self-signed; a resumed row fails the run unless every handshake after the first resumed. Layout: AES-128-GCM over 512 slots of 512 KiB (256 MiB, beyond the caches, as file bytes are after an O_DIRECT read)."
  echo
  echo "$tables"
  echo
  echo "## What shardline takes from this"
  echo
  echo "- **Provider: aws-lc-rs.** It seals AES-GCM faster than ring and spends less server CPU per handshake (the aws-lc-rs / ring columns), far less with P-384 and RSA keys, and it alone offers the X25519MLKEM768 post-quantum hybrid that current browsers and rustls clients send first. ChaCha20-Poly1305, which only clients without AES instructions should pick, is about even (either side wins by a little from run to run). Its build needs only a C compiler (aws-lc-sys ships its generated assembly; no cmake, no Go, no NASM on x86_64 Linux), which the Rust toolchain's host already has, so both README commands still work on a fresh machine."
  echo "- **Server cipher order: AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305** (\`src/tls/mod.rs\`): the server picks, and AES-128-GCM is the cheapest per byte on any CPU with AES-NI (\`shardline doctor\` reports it as tls.cpu_aes)."
  echo "- **Records sealed in place in the arena slot**, each record's plaintext moved back by its header and the previous records' overhead, last record first (\`src/tls/record.rs\`): cheaper than sealing into a second slot (one slot per chunk instead of two, and the move touches lines the AEAD then finds in cache), within a few percent of the unmovable lower bound."
  echo "- **Full 16 KiB records** (\`tls_record_bytes\`, default 16384): the AEAD's fixed cost per record (nonce, tag, header) is spread over the most bytes, and a 1 KiB response is one record with its head anyway."
} >"$OUT"
cat "$OUT"
log "wrote $OUT"
