#!/usr/bin/env bash
# perf/tlsfuzzer.sh: tlsfuzzer's probes against shardline and nginx, the same probes to both (issue 46).
#
#   perf/tlsfuzzer.sh [--seed N] [--scripts "test-a test-b ..."] [--out FILE]
#
# shardline (release build, `serve --shards 1`, `--tls-listen` through its config) and nginx
# (perf/nginx.conf, 1 worker) each serve the same two test certificates for localhost: ECDSA
# P-256 and RSA-2048 (tlsfuzzer's TLS 1.3 probes mostly ask for RSA-PSS signatures; shardline
# picks by the client's signature schemes, nginx holds both). nginx's TLS 1.2 cipher list gains
# the ECDHE-RSA twins of its ECDHE-ECDSA suites, so both servers offer the same suites.
# Each script (the tlsfuzzer snapshot in ../shared/tlsfuzzer, SNAPSHOT.txt) runs with every probe
# (`-n 0`) and Python's random module seeded with N (default 46; the scripts have no seed option,
# so a wrapper seeds it before the script's main: the same probe order and random choices for both
# servers). TLS 1.2 scripts get `-d -M` (ECDHE with extended master secret; neither server offers
# RSA key exchange) and `-C TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256` where they take a suite.
# Needs python3 with venv; installs tlslite-ng 0.9.0b2 and ecdsa from PyPI into
# $TLSFUZZER_VENV (default /opt/shardline-test-tools/tlsfuzzer-venv) once.
# Writes perf/TLSFUZZER.md (per script: passed/total for each server, then totals); every
# script's output in perf/out/tlsfuzzer/{sl,ng}/SCRIPT.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
SEED=46 OUT=$HERE/TLSFUZZER.md
SCRIPTS="test-tls13-empty-alert test-renegotiation-disabled test-tls13-unrecognised-groups
  test-large-hello test-tls13-zero-length-data test-record-layer-fragmentation test-tls13-finished
  test-session-ticket-resumption test-truncating-of-client-hello
  test-invalid-client-hello-w-record-overflow test-tls13-conversation test-tls13-keyupdate
  test-tls13-ccs test-tls13-legacy-version test-tls13-record-padding test-tls13-zero-content-type
  test-tls13-unencrypted-alert test-tls13-invalid-ciphers test-tls13-hrr test-tls13-keyshare-omitted
  test-tls13-count-tickets test-tls13-version-negotiation test-tls13-multiple-ccs-messages
  test-conversation test-zero-length-data test-invalid-content-type"
while (($#)); do
  case $1 in
    --seed) SEED=$2; shift 2 ;;
    --scripts) SCRIPTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "tlsfuzzer.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# One script that hangs must not stall the run; the slowest take ~10 s.
SCRIPT_TIMEOUT_S=300
TLS12_SUITE=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
SNAPSHOT=${TLSFUZZER_DIR:-$REPO/../shared/tlsfuzzer}
VENV=${TLSFUZZER_VENV:-/opt/shardline-test-tools/tlsfuzzer-venv}
[[ -f $SNAPSHOT/SNAPSHOT.txt ]] || die "no tlsfuzzer snapshot at $SNAPSHOT (set TLSFUZZER_DIR)"
command -v nginx >/dev/null || die "nginx is missing (apt-get install nginx-light)"
if ! "$VENV/bin/python" -c 'import tlslite, ecdsa' 2>/dev/null; then
  log "installing tlslite-ng 0.9.0b2 and ecdsa into $VENV"
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q tlslite-ng==0.9.0b2 ecdsa ||
    die "cannot install tlslite-ng into $VENV"
fi
RUN=$HERE/out/tlsfuzzer
rm -rf "$RUN/sl" "$RUN/ng" "$RUN/tlsfuzzer"
mkdir -p "$RUN/root" "$RUN/sl" "$RUN/ng" "$RUN/tls"
echo hello >"$RUN/root/index.html"
# The snapshot's scripts/ are git symlinks stored as text ("_stub.py"); a private copy with real
# links (the snapshot itself is read-only).
cp -r "$SNAPSHOT" "$RUN/tlsfuzzer"
chmod -R u+w "$RUN/tlsfuzzer"
for f in "$RUN"/tlsfuzzer/scripts/*.py; do
  [[ $(cat "$f") == _stub.py ]] && ln -sf _stub.py "$f"
done
tls_test_cert "$RUN/tls"
[[ -s $RUN/tls/rsa-cert.pem ]] || openssl req -x509 -newkey rsa:2048 -nodes -days 3650 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$RUN/tls/rsa-key.pem" -out "$RUN/tls/rsa-cert.pem" >/dev/null 2>&1 || die "openssl could not make an RSA certificate"
SL_PORT=28880 SL_ADMIN=127.0.0.1:28881 SL_TLS_PORT=28883 NG_PORT=28882 NG_TLS_PORT=28884
cat >"$RUN/sl.toml" <<EOF
tls_listen = "127.0.0.1:$SL_TLS_PORT"
[[tls_certificate]]
cert = "$RUN/tls/cert.pem"
key = "$RUN/tls/key.pem"
[[tls_certificate]]
cert = "$RUN/tls/rsa-cert.pem"
key = "$RUN/tls/rsa-key.pem"
EOF
SL_BIN=${SHARDLINE_BIN:-}
if [[ -z $SL_BIN ]]; then
  log "building shardline (cargo build --release)"
  (cd "$REPO" && cargo build --release --quiet)
  SL_BIN=$REPO/target/release/shardline
fi
PG=''
cleanup() { [[ -n $PG ]] && kill_group "$PG" 5; return 0; }
trap cleanup EXIT

start() { # start sl|ng: sets PG and TLS_PORT
  for p in $SL_PORT ${SL_ADMIN##*:} $SL_TLS_PORT $NG_PORT $NG_TLS_PORT; do
    ! port_busy "$p" || die "port $p is in use: a server left from an earlier run? (ss -ltnp)"
  done
  if [[ $1 == sl ]]; then
    TLS_PORT=$SL_TLS_PORT
    setsid "$SL_BIN" serve --root "$RUN/root" --listen "127.0.0.1:$SL_PORT" --admin "$SL_ADMIN" \
      --shards 1 --config "$RUN/sl.toml" >"$RUN/sl-server.log" 2>&1 </dev/null &
  else
    TLS_PORT=$NG_TLS_PORT
    render_nginx_conf "$HERE/nginx.conf" "$RUN/nginx" "$RUN/root" "$NG_PORT" 0 \
      "$TLS_PORT" "$RUN/tls/cert.pem" "$RUN/tls/key.pem"
    # The RSA certificate beside the ECDSA one, and the ECDHE-RSA suites to go with it.
    sed -i -e "s|^\( *\)ssl_certificate_key .*|&\n\1ssl_certificate $RUN/tls/rsa-cert.pem;\n\1ssl_certificate_key $RUN/tls/rsa-key.pem;|" \
      -e 's|^\( *ssl_ciphers \)\(.*\);|\1\2:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305;|' \
      "$RUN/nginx/nginx.conf"
    grep -q rsa-cert "$RUN/nginx/nginx.conf" || die "nginx.conf: the RSA certificate was not added"
    setsid nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf" >"$RUN/ng-server.log" 2>&1 </dev/null &
  fi
  PG=$!
  wait_port "$TLS_PORT" "$PG" 15 || die "$1 did not start (log: $RUN/$1-server.log)"
}
stop() { kill_group "$PG" 10 || true; wait "$PG" 2>/dev/null || true; PG=''; }

# script_args SCRIPT: the options SCRIPT takes from those above (read from its getopt string).
script_args() {
  local opts
  opts=$(grep -o 'getopt(argv, *"[^"]*"' "$RUN/tlsfuzzer/tlsfuzzer/_apps/${1//-/_}.py" | head -n 1)
  local a=(-n 0)
  [[ $opts == *d* ]] && a+=(-d)
  [[ $opts == *M* ]] && a+=(-M)
  [[ $opts == *C:* && $1 != test-tls13-* ]] && a+=(-C "$TLS12_SUITE")
  printf '%s\n' "${a[@]}"
}

run_scripts() { # run_scripts sl|ng
  local s args
  for s in $SCRIPTS; do
    mapfile -t args < <(script_args "$s")
    (cd "$RUN/tlsfuzzer" && PYTHONPATH=. timeout "$SCRIPT_TIMEOUT_S" "$VENV/bin/python" -c '
import random, runpy, sys
random.seed(int(sys.argv[1]))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$SEED" "scripts/$s.py" -h localhost -p "$TLS_PORT" "${args[@]}") \
      >"$RUN/$1/$s.txt" 2>&1 || true
    alive "$PG" || die "$1 died during $s (log: $RUN/$1-server.log)"
    log "$1 $s: $(sed -n 's/^PASS: //p' "$RUN/$1/$s.txt")/$(sed -n 's/^TOTAL: //p' "$RUN/$1/$s.txt")"
  done
}

for s in sl ng; do
  start "$s"
  run_scripts "$s"
  stop
done

# count SERVER SCRIPT FIELD: PASS or TOTAL from a script's summary (0 when it printed none:
# a crash or a timeout counts as nothing passed; TOTAL is then taken from the other server).
count() { local v; v=$(sed -n "s/^$3: //p" "$RUN/$1/$2.txt" | tail -n 1); echo "${v:-0}"; }
{
  echo "# tlsfuzzer: shardline against nginx"
  echo
  echo "\`perf/tlsfuzzer.sh --seed $SEED\` on $(date -u +%Y-%m-%d), shardline $(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- src || echo '+changes'),"
  echo "$(nginx -v 2>&1 | sed 's|nginx version: ||') with $(openssl version | cut -d' ' -f1-2), tlsfuzzer $(sed -n 's/.*at commit \([0-9a-f]\{12\}\).*/\1/p' "$SNAPSHOT/SNAPSHOT.txt")."
  echo "Every probe of each script (\`-n 0\`), Python's random seeded with $SEED; passed/total per server."
  echo "Outputs: perf/out/tlsfuzzer/{sl,ng}/SCRIPT.txt."
  echo
  echo "| script | options | shardline | nginx |"
  echo "|---|---|---|---|"
  tsp=0 tst=0 tnp=0 tnt=0 worse=0 better=0
  for s in $SCRIPTS; do
    sp=$(count sl "$s" PASS) st=$(count sl "$s" TOTAL) np=$(count ng "$s" PASS) nt=$(count ng "$s" TOTAL)
    ((st > 0)) || st=$nt
    ((nt > 0)) || nt=$st
    mark=''
    if ((sp * nt < np * st)); then mark=' **worse**'; worse=$((worse + 1)); fi
    if ((sp * nt > np * st)); then better=$((better + 1)); fi
    echo "| $s | \`$(script_args "$s" | tr '\n' ' ' | sed 's/ $//')\` | $sp/$st$mark | $np/$nt |"
    tsp=$((tsp + sp)) tst=$((tst + st)) tnp=$((tnp + np)) tnt=$((tnt + nt))
  done
  echo "| **total** | | **$tsp/$tst** | **$tnp/$tnt** |"
  echo
  echo "shardline is worse than nginx in $worse scripts and better in $better."
} >"$OUT"
log "wrote $OUT"
cat "$OUT"
