# shellcheck shell=bash
# Helpers shared by perf/bench.sh, perf/validate-no-reclaim.sh and perf/nginx-as-shardline.sh.
# Sourced, never run.

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# cpu_mask 0 -> 1, 1 -> 10, 3 -> 1000: the bitmask nginx's worker_cpu_affinity wants.
cpu_mask() {
  local cpu=$1 mask=1 i
  for ((i = 0; i < cpu; i++)); do mask="${mask}0"; done
  printf '%s\n' "$mask"
}

# render_nginx_conf TEMPLATE PREFIX ROOT PORT CPU: writes PREFIX/nginx.conf from the anchor.
render_nginx_conf() {
  local template=$1 prefix=$2 root=$3 port=$4 cpu=$5 mask
  mask=$(cpu_mask "$cpu")
  mkdir -p "$prefix/tmp"
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@ROOT@|$root|g" -e "s|@PORT@|$port|g" \
      -e "s|@CPU_MASK@|$mask|g" "$template" > "$prefix/nginx.conf"
}

# port_busy PORT: true when something listens on 127.0.0.1:PORT (or any address) already.
port_busy() {
  ss -ltnH "sport = :$1" 2>/dev/null | grep -q .
}

# wait_port PORT PID SECONDS: until PORT accepts connections; fails when PID dies or time is up.
wait_port() {
  local port=$1 pid=$2 secs=$3 i
  for ((i = 0; i < secs * 20; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# serving_pid PGID: the process that does the serving in a group we started: the leader's
# (last) child when it has one (nginx master -> worker), else the leader (shardline).
serving_pid() {
  local child
  child=$(pgrep -P "$1" 2>/dev/null | tail -n 1 || true)
  printf '%s\n' "${child:-$1}"
}

# vmstat_get NAME: one counter from /proc/vmstat; "allocstall" sums every allocstall_* line.
vmstat_get() {
  if [[ $1 == allocstall ]]; then
    awk '/^allocstall/ { s += $2 } END { print s + 0 }' /proc/vmstat
  else
    awk -v k="$1" '$1 == k { print $2; f = 1 } END { if (!f) print 0 }' /proc/vmstat
  fi
}

# drop_caches: empties the page cache when permitted; returns 1 when not.
drop_caches() {
  sync
  { echo 1 > /proc/sys/vm/drop_caches; } 2>/dev/null
}

# resident_bytes FILE: bytes of FILE in the page cache.
resident_bytes() {
  fincore --bytes --noheadings --output RES "$1" 2>/dev/null | awk '{ print $1 + 0 }'
}

# alive PID: exists and is not a zombie.
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s%% *} != Z ]]
}

# kill_group PGID [GRACE_S]: TERM the process group, wait up to GRACE_S, then KILL; returns 1
# when it had to KILL.
kill_group() {
  local pg=$1 grace=${2:-5} i
  pgrep -g "$pg" >/dev/null 2>&1 || return 0
  kill -TERM -- "-$pg" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    pgrep -g "$pg" 2>/dev/null | while read -r p; do alive "$p" && echo x; done | grep -q . || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pg" 2>/dev/null || true
  return 1
}

# kv FILE KEY: the value of KEY=... in FILE (loadgen and wrk-summary.lua output), empty when absent.
kv() {
  sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n 1
}

# calc EXPR: awk arithmetic, 6 decimals; empty when EXPR does not evaluate.
calc() { awk "BEGIN { x = $1; printf \"%.6f\", x }" 2>/dev/null; }

# ensure_fixture LOADGEN DIR STAMPDIR NAME BYTES SEED: DIR/NAME holds BYTES bytes of the
# deterministic stream SEED (loadgen gen); reused when its size and stamp match.
ensure_fixture() {
  local loadgen=$1 dir=$2 stampdir=$3 name=$4 bytes=$5 seed=$6
  local f=$dir/$name stamp=$stampdir/fixture-$name.stamp
  if [[ -f $f && $(stat -c %s "$f") == "$bytes" && $(cat "$stamp" 2>/dev/null) == "$bytes $seed" ]]; then return 0; fi
  log "creating $name ($bytes bytes)"
  rm -f "$f" "$stamp"
  "$loadgen" gen --path "$f" --size "$bytes" --seed "$seed" >/dev/null
  chmod 644 "$f"
  echo "$bytes $seed" >"$stamp"
}

# Builds perf/loadgen and shardline (or takes SHARDLINE_BIN); sets SL_BIN. Needs HERE and REPO.
build_tools() {
  log "building perf/loadgen"
  cargo build --release --quiet --manifest-path "$HERE/loadgen/Cargo.toml"
  if [[ -n ${SHARDLINE_BIN:-} ]]; then
    SL_BIN=$(command -v "$SHARDLINE_BIN" || true)
    [[ -n $SL_BIN ]] || die "SHARDLINE_BIN=$SHARDLINE_BIN is not executable"
    [[ $SL_BIN == /* ]] || SL_BIN=$PWD/$SL_BIN
  else
    log "building shardline (cargo build --release)"
    (cd "$REPO" && cargo build --release --quiet)
    SL_BIN=$REPO/target/release/shardline
  fi
}
