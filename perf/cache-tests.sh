#!/usr/bin/env bash
# perf/cache-tests.sh: the http-tests/cache-tests suite (cache-tests.fyi) against shardline and
# against nginx set up as a proxy cache, side by side (issue 42, item 11).
#
#   perf/cache-tests.sh [--out FILE] [--revalidate-s N]
#   perf/cache-tests.sh --id TEST_ID      one test against both, with the suite's request and
#                                         response dump on stdout; writes nothing
#   perf/cache-tests.sh --report-only     rewrites the report from perf/cache-tests/*.json
#
# What runs (all on loopback, free ports from 28400):
# - the suite's test server (test-engine/server/server.mjs): the origin of every test;
# - nginx in front of it, configured from the suite's own docker/nginx/nginx.conf (only paths
#   and ports changed), as the published nginx runs are;
# - shardline (release build, one shard, a fresh cache_dir) with one [[origin]] "/" pointing at
#   the test server, and in front of it the ROUTER: HAProxy, which sends the suite's harness
#   requests straight to the test server and every other GET/HEAD through shardline:
#     * any method other than GET and HEAD: the suite PUTs each test's script to /config/<uuid>
#       before its requests, and a few tests send POST/PUT/DELETE. shardline serves only GET and
#       HEAD and refuses a request with a body, so without the router no test could even start.
#       A real edge sits behind a balancer that does the same; the method tests then measure
#       what shardline does with the GETs around those requests;
#     * GET /state/<uuid>: the client reading back what the server saw (the harness's channel,
#       not a test: nginx does not store it, having no freshness, and shardline need not).
# - the suite's CLI client (test-engine/cli.mjs) against nginx, then against the router; its
#   JSON results go to perf/cache-tests/{shardline,nginx}.json with the run's facts in
#   perf/cache-tests/run.json, and perf/cache-tests/summarize.mjs writes perf/CACHE-TESTS.md.
# - a DIAGNOSTIC third run (perf/cache-tests/shardline-carried.json, never the reported
#   result): the client tells a stored reply from a fresh one by the test server's
#   Server-Request-Count field, which shardline does not keep (it replays only its
#   STORED_FIELDS), so every test fails on that alone. A second shardline (fresh cache) fetches
#   through a "carrier" frontend of the same HAProxy that copies the count into
#   X-Content-Type-Options (a stored field no test uses), and a second router frontend copies
#   it back on the way out. What still fails there fails for another reason: it names the next
#   fix after field pass-through.
#
# shardline's settings for the suite (everything else is the default):
# - key_query = ["test"]: the suite names each test by a uuid in the path and, in the two
#   query-argument tests, by a `test=` parameter. shardline keys by path alone by default
#   (tokens never split an object); an operator names the parameters that choose the object.
# - cache_revalidate_s = 0 (--revalidate-s): the lifetime shardline gives a reply with no
#   freshness information. Its default (30 days) fails the suite's first check
#   (freshness-none), on which nearly every other test depends; the suite asks every cache to
#   turn such default caching off (README, "Test results FAQ"), as its Docker setup runs Varnish
#   with default_ttl=0. The Last-Modified heuristic has its own cap (cache_heuristic_max_s,
#   left at its default).
#
# The suite: a copy of the pinned snapshot (CACHE_TESTS_SRC, default ../shared/cache-tests next
# to the repository) in perf/out/cache-tests/suite, with its runtime dependencies installed
# from the npm registry (npm install --omit=dev; the CLI needs undici). Needs node (>= 20.18),
# npm, nginx and haproxy. Environment: SHARDLINE_BIN (default: cargo build --release).
# One run takes about two minutes per server (the suite waits between its requests).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }

ARGS=("$@")
OUT=$HERE/CACHE-TESTS.md TEST_ID='' REPORT_ONLY=0 REVALIDATE_S=0
while (($#)); do
  case $1 in
    --out) [[ $# -ge 2 ]] || usage 2; OUT=$2; shift 2 ;;
    --id) [[ $# -ge 2 ]] || usage 2; TEST_ID=$2; shift 2 ;;
    --revalidate-s) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || usage 2; REVALIDATE_S=$2; shift 2 ;;
    --report-only) REPORT_ONLY=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "cache-tests.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

SUITE_SRC=${CACHE_TESTS_SRC:-$(cd "$REPO/.." && pwd)/shared/cache-tests}
WORK=$HERE/out/cache-tests
SUITE=$WORK/suite
RESULTS=$HERE/cache-tests
SUMMARIZE=$RESULTS/summarize.mjs

for tool in node npm nginx haproxy curl; do
  command -v "$tool" >/dev/null || die "$tool is not installed (node and npm: Debian packages nodejs, npm)"
done
[[ -f $SUITE_SRC/tests/index.mjs ]] || die "no cache-tests snapshot at $SUITE_SRC (set CACHE_TESTS_SRC)"

# prepare_suite: a writable copy of the snapshot with its runtime dependencies, made again only
# when the snapshot or its package.json changed (the snapshot itself is read-only).
prepare_suite() {
  local stamp
  stamp=$(cat "$SUITE_SRC/SNAPSHOT.txt" "$SUITE_SRC/package.json" 2>/dev/null | sha256sum | cut -c1-16)
  if [[ -f $SUITE/.prepared && $(cat "$SUITE/.prepared") == "$stamp" && -d $SUITE/node_modules/undici ]]; then
    return 0
  fi
  log "copying the suite from $SUITE_SRC and installing its dependencies (npm registry)"
  rm -rf "$SUITE"
  mkdir -p "$WORK"
  cp -r "$SUITE_SRC" "$SUITE"
  chmod -R u+w "$SUITE"
  (cd "$SUITE" && npm install --omit=dev --no-audit --no-fund --loglevel=error >"$WORK/npm-install.log" 2>&1) ||
    die "npm install failed in $SUITE (log: $WORK/npm-install.log)"
  echo "$stamp" >"$SUITE/.prepared"
}

suite_commit() {
  grep -o '[0-9a-f]\{40\}' "$SUITE_SRC/SNAPSHOT.txt" 2>/dev/null | head -n 1 || echo unknown
}

summarize() {
  node "$SUMMARIZE" "$SUITE" "$RESULTS/run.json" "$OUT" \
    "shardline=$RESULTS/shardline.json" "nginx=$RESULTS/nginx.json" \
    "shardline, count carried (diagnostic)=$RESULTS/shardline-carried.json"
}

if ((REPORT_ONLY)); then
  for f in run.json shardline.json nginx.json shardline-carried.json; do
    [[ -f $RESULTS/$f ]] || die "no $RESULTS/$f: run perf/cache-tests.sh first"
  done
  prepare_suite
  summarize
  exit 0
fi

# ------------------------------------------------------------------ processes we start
# Each one is started with setsid (its pid is its process group) and stopped by group on exit,
# Ctrl-C, SIGTERM or SIGHUP.
declare -A GROUPS_LIVE=()
LAST_PID=''
spawn() { # spawn OUTFILE CMD...: background, own process group
  local outfile=$1
  shift
  setsid "$@" >"$outfile" 2>&1 </dev/null &
  LAST_PID=$!
  GROUPS_LIVE[$LAST_PID]=1
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM HUP
  set +e
  for pg in "${!GROUPS_LIVE[@]}"; do
    kill_group "$pg" 5
    wait "$pg" 2>/dev/null
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

free_port() { local p=$1; while port_busy "$p"; do p=$((p + 1)); done; echo "$p"; }
start_checked() { # start_checked NAME PORT LOG: waits for the last spawned process to listen
  wait_port "$2" "$LAST_PID" 20 && return 0
  tail -n 20 "$3" >&2 || true
  die "$1 did not start listening on port $2 (log: $3)"
}

prepare_suite
if [[ -n ${SHARDLINE_BIN:-} ]]; then
  SL_BIN=$(command -v "$SHARDLINE_BIN" || true)
  [[ -n $SL_BIN ]] || die "SHARDLINE_BIN=$SHARDLINE_BIN is not executable"
else
  log "building shardline (cargo build --release)"
  (cd "$REPO" && cargo build --release --quiet)
  SL_BIN=$REPO/target/release/shardline
fi

# A single test's run (--id) keeps the last full run's logs.
RUN=$WORK/run${TEST_ID:+-id}
rm -rf "$RUN"
mkdir -p "$RUN/nginx/cache" "$RUN/shardline/cache" "$RUN/shardline/root" "$RESULTS"
SERVER_PORT=$(free_port 28400)
NGINX_PORT=$(free_port $((SERVER_PORT + 1)))
SL_PORT=$(free_port $((NGINX_PORT + 1)))
ROUTER_PORT=$(free_port $((SL_PORT + 1)))
SL2_PORT=$(free_port $((ROUTER_PORT + 1)))       # the diagnostic run's shardline,
CARRIER_PORT=$(free_port $((SL2_PORT + 1)))      # its origin side
ROUTER2_PORT=$(free_port $((CARRIER_PORT + 1)))  # and its router

# The suite's server reads its settings from npm's environment (npm run server --port=...);
# started with node directly so that its pid is the process we stop.
spawn "$RUN/server.log" env npm_config_protocol=http npm_config_port="$SERVER_PORT" \
  npm_config_pidfile="$RUN/server.pid" node "$SUITE/test-engine/server/server.mjs"
start_checked "the suite's test server" "$SERVER_PORT" "$RUN/server.log"

# nginx: the suite's docker/nginx/nginx.conf (a server block) included as it is, only its cache
# path, port and origin changed; the lines around it only keep nginx's files in the run dir.
sed -e "s|/var/cache/nginx|$RUN/nginx/cache|g" -e "s|listen *8002;|listen 127.0.0.1:$NGINX_PORT;|" \
  -e "s|http://localhost:8000|http://127.0.0.1:$SERVER_PORT|" \
  "$SUITE/docker/nginx/nginx.conf" >"$RUN/nginx/cache-test.conf"
if ! grep -q "127.0.0.1:$NGINX_PORT" "$RUN/nginx/cache-test.conf" ||
  ! grep -q "127.0.0.1:$SERVER_PORT" "$RUN/nginx/cache-test.conf"; then
  die "the suite's docker/nginx/nginx.conf changed shape; adapt the sed in $0"
fi
cat >"$RUN/nginx/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1;
pid $RUN/nginx/nginx.pid;
error_log $RUN/nginx/error.log warn;
events { worker_connections 2048; }  # docker/entrypoint.sh raises Ubuntu's 768 to 2048 too
http {
  access_log $RUN/nginx/access.log;
  client_body_temp_path $RUN/nginx/tmp; fastcgi_temp_path $RUN/nginx/tmp;
  uwsgi_temp_path $RUN/nginx/tmp; scgi_temp_path $RUN/nginx/tmp;
  include $RUN/nginx/cache-test.conf;
}
EOF
mkdir -p "$RUN/nginx/tmp"
spawn "$RUN/nginx/stderr.log" nginx -p "$RUN/nginx" -c "$RUN/nginx/nginx.conf"
start_checked nginx "$NGINX_PORT" "$RUN/nginx/error.log"

cat >"$RUN/shardline/shardline.toml" <<EOF
# perf/cache-tests.sh: shardline for the cache-tests suite; see the script's header for why.
cache_dir = "$RUN/shardline/cache"
cache_revalidate_s = $REVALIDATE_S
access_log = "$RUN/shardline/access.log"
[[origin]]
prefix = "/"
url = "http://127.0.0.1:$SERVER_PORT"
key_query = ["test"]
EOF
spawn "$RUN/shardline/server.log" "$SL_BIN" serve --config "$RUN/shardline/shardline.toml" \
  --root "$RUN/shardline/root" --listen "127.0.0.1:$SL_PORT" --shards 1 --admin 127.0.0.1:0
SL_PG=$LAST_PID
start_checked shardline "$SL_PORT" "$RUN/shardline/server.log"

# The diagnostic shardline: the same settings, its own cache, its origin the carrier.
mkdir -p "$RUN/shardline-carried/cache"
sed -e "s|$RUN/shardline/|$RUN/shardline-carried/|g" -e "s|127.0.0.1:$SERVER_PORT|127.0.0.1:$CARRIER_PORT|" \
  "$RUN/shardline/shardline.toml" >"$RUN/shardline-carried/shardline.toml"
spawn "$RUN/shardline-carried/server.log" "$SL_BIN" serve --config "$RUN/shardline-carried/shardline.toml" \
  --root "$RUN/shardline/root" --listen "127.0.0.1:$SL2_PORT" --shards 1 --admin 127.0.0.1:0
SL2_PG=$LAST_PID
start_checked "shardline (diagnostic)" "$SL2_PORT" "$RUN/shardline-carried/server.log"

# The router (see the header). Lenient parsing both ways, so that the router never refuses
# what the suite sends or answers: what shardline makes of it is what is measured.
cat >"$RUN/router.cfg" <<EOF
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option accept-invalid-http-request
  option accept-invalid-http-response
frontend router
  bind 127.0.0.1:$ROUTER_PORT
  acl get_or_head method GET HEAD
  acl harness path_beg /config/ /state/
  use_backend cache if get_or_head !harness
  default_backend suite_server
backend cache
  server shardline 127.0.0.1:$SL_PORT
backend suite_server
  server suite 127.0.0.1:$SERVER_PORT

# The diagnostic run only (see the header): the same routing in front of the second shardline,
# and the count carried in X-Content-Type-Options from the test server to the client.
frontend router_carried
  bind 127.0.0.1:$ROUTER2_PORT
  acl get_or_head method GET HEAD
  acl harness path_beg /config/ /state/
  use_backend cache_carried if get_or_head !harness
  default_backend suite_server
backend cache_carried
  acl carried res.hdr(X-Content-Type-Options) -m beg scount=
  http-response set-header Server-Request-Count "%[res.hdr(X-Content-Type-Options),regsub(^scount=,)]" if carried
  http-response del-header X-Content-Type-Options if carried
  server shardline 127.0.0.1:$SL2_PORT
frontend carrier
  bind 127.0.0.1:$CARRIER_PORT
  default_backend suite_server_carried
backend suite_server_carried
  http-response set-header X-Content-Type-Options "scount=%[res.hdr(Server-Request-Count)]" if { res.hdr(Server-Request-Count) -m found }
  server suite 127.0.0.1:$SERVER_PORT
EOF
haproxy -c -q -f "$RUN/router.cfg" || die "haproxy refused $RUN/router.cfg"
spawn "$RUN/router.log" haproxy -db -f "$RUN/router.cfg"
start_checked "the router (haproxy)" "$ROUTER_PORT" "$RUN/router.log"

# One request through each path before the suite: a test script PUT through the router, and
# its GET answered by the test server through shardline.
probe_uuid=cache-tests-sh-probe-$$
curl -sf -o /dev/null -X PUT -H 'Content-Type: application/json' \
  --data '[{"id":"probe","name":"probe"}]' "http://127.0.0.1:$ROUTER_PORT/config/$probe_uuid" ||
  die "PUT /config through the router failed (logs in $RUN)"
[[ $(curl -s --max-time 10 "http://127.0.0.1:$ROUTER_PORT/test/$probe_uuid") == "$probe_uuid" ]] ||
  die "GET /test through the router and shardline did not return the test server's body (logs in $RUN)"
curl -sf -o /dev/null -X PUT -H 'Content-Type: application/json' \
  --data '[{"id":"probe","name":"probe"}]' "http://127.0.0.1:$ROUTER2_PORT/config/$probe_uuid-2" ||
  die "PUT /config through the diagnostic router failed (logs in $RUN)"
curl -s -D "$RUN/probe-carried.head" -o /dev/null --max-time 10 "http://127.0.0.1:$ROUTER2_PORT/test/$probe_uuid-2"
grep -qi '^Server-Request-Count: 1' "$RUN/probe-carried.head" ||
  die "the diagnostic path did not carry Server-Request-Count (see $RUN/probe-carried.head)"

# run_cli BASE_URL [TEST_ID]: the suite's CLI, JSON on stdout (or the dump of one test). npm run
# would set these variables from package.json; an empty id means every test.
run_cli() {
  (cd "$SUITE" && env npm_config_base="$1" npm_config_id="${2:-}" npm_package_config_id='' \
    node --no-warnings test-engine/cli.mjs)
}

TARGETS=("nginx http://127.0.0.1:$NGINX_PORT" "shardline http://127.0.0.1:$ROUTER_PORT"
  "shardline-carried http://127.0.0.1:$ROUTER2_PORT")
if [[ -n $TEST_ID ]]; then
  for target in "${TARGETS[@]}"; do
    read -r name base <<<"$target"
    echo "######## $name ($base)"
    run_cli "$base" "$TEST_ID" || true
  done
  exit 0
fi

START=$(date -u '+%Y-%m-%d %H:%M UTC')
for target in "${TARGETS[@]}"; do
  read -r name base <<<"$target"
  log "running the suite against $name ($base)"
  t0=$SECONDS
  run_cli "$base" >"$RUN/$name.json" 2>"$RUN/$name.stderr" ||
    die "the suite's client failed against $name: $(tail -n 3 "$RUN/$name.stderr")"
  node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$RUN/$name.json" ||
    die "the client's output for $name is not JSON ($RUN/$name.json)"
  cp "$RUN/$name.json" "$RESULTS/$name.json"
  log "$name: $((SECONDS - t0)) s, $(grep -c '^ERROR' "$RUN/$name.stderr" || true) client errors (in $RUN/$name.stderr)"
done

# Notes on the servers' own logs: anything shardline or nginx complained about.
NOTES=()
alive "$SL_PG" || NOTES+=("shardline exited during the run (log: perf/out/cache-tests/run/shardline/server.log)")
alive "$SL2_PG" || NOTES+=("the diagnostic shardline exited during its run (log: perf/out/cache-tests/run/shardline-carried/server.log)")
n=$(grep -ciE 'panic|error' "$RUN/shardline/server.log" || true)
((${n:-0} == 0)) || NOTES+=("shardline's log has $n lines matching panic/error, e.g. \`$(grep -iE 'panic|error' "$RUN/shardline/server.log" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)\`")
n=$(grep -ci 'warn' "$RUN/shardline/server.log" || true)
NOTES+=("shardline's log has ${n:-0} warn lines (the admin listener's \"control is off\" is one)")
# What shardline answered, from its access log: status x cache outcome, with counts.
for tag in shardline shardline-carried; do
  NOTES+=("$tag's access log (status cache=outcome: requests): $(awk '{ for (i = NF; i > 0; i--) if ($i ~ /^cache=/) c = substr($i, 7); s[$9 " " c]++ }
    END { for (k in s) printf "%s: %d\n", k, s[k] }' "$RUN/$tag/access.log" | sort -k3,3nr | paste -sd ',' | sed 's/,/, /g')")
done
n=$(grep -c '^ERROR' "$RUN/shardline.stderr" || true)
((${n:-0} == 0)) || NOTES+=("the suite's client logged $n errors against shardline, e.g. \`$(grep '^ERROR' "$RUN/shardline.stderr" | head -n 1 | cut -c1-200)\`")
n=$(grep -c '^ERROR' "$RUN/nginx.stderr" || true)
((${n:-0} == 0)) || NOTES+=("the suite's client logged $n errors against nginx, e.g. \`$(grep '^ERROR' "$RUN/nginx.stderr" | head -n 1 | cut -c1-200)\`")

sl_commit=$(git -C "$REPO" rev-parse --short HEAD)
[[ -z $(git -C "$REPO" status --porcelain -- src Cargo.toml Cargo.lock) ]] || sl_commit="$sl_commit + uncommitted changes"
[[ -z ${SHARDLINE_BIN:-} ]] || sl_commit="$sl_commit (binary: SHARDLINE_BIN=$SHARDLINE_BIN)"
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
cmd="perf/cache-tests.sh${ARGS[*]:+ ${ARGS[*]}}"
# The run's facts, as JSON through node (no hand-made escaping).
env META_DATE="$START" META_MACHINE="$(uname -srm), $(nproc) CPUs (${cpu_model:-unknown}), $(hostname)" \
  META_SL_COMMIT="$sl_commit" META_NGINX="$(nginx -v 2>&1 | sed 's/^nginx version: //')" \
  META_NODE="$(node --version)" META_SUITE="$(suite_commit)" META_CMD="$cmd" \
  META_SL_SETUP="1 shard, fresh cache_dir, one [[origin]] prefix \"/\" at the test server, key_query = [\"test\"], cache_revalidate_s = $REVALIDATE_S, all else default" \
  META_NGINX_SETUP="the suite's docker/nginx/nginx.conf (proxy_cache, proxy_cache_revalidate on, proxy_http_version 1.1), one worker, directly in front of the test server" \
  META_ROUTER="$(haproxy -v | head -n 1 | cut -d' ' -f1-3): methods other than GET/HEAD and GET /state/ (the harness's channel) go straight to the test server, every other GET/HEAD through shardline (config: perf/cache-tests.sh)" \
  META_DIAGNOSTIC="**The third column is a diagnostic, not a result.** The suite's client tells a stored reply from a fresh one by the test server's \`Server-Request-Count\` field. It was added when shardline replayed only a fixed list of fields; shardline now keeps every end-to-end field but \`UNSTORED_FIELDS\` (src/origin/contract.rs), so that field reaches the client and the first column stands on its own. The third column (a second shardline, same settings, its own cache, fetched through an HAProxy frontend that copies the count into \`X-Content-Type-Options\` and back) is kept as a second sample of the same code: where the two differ, the test's outcome depended on timing under the suite's parallel requests." \
  node -e '
    const e = process.env
    const notes = process.argv.slice(2)
    console.log(JSON.stringify({
      date: e.META_DATE, machine: e.META_MACHINE, shardline_commit: e.META_SL_COMMIT,
      shardline_setup: e.META_SL_SETUP, nginx_version: e.META_NGINX, nginx_setup: e.META_NGINX_SETUP,
      router: e.META_ROUTER, node_version: e.META_NODE, suite_commit: e.META_SUITE,
      command: e.META_CMD, diagnostic: e.META_DIAGNOSTIC, notes }, null, 2))' "${NOTES[@]}" >"$RESULTS/run.json"
summarize
log "wrote $OUT; raw results in $RESULTS"
