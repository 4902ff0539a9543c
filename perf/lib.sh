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

# render_nginx_conf TEMPLATE PREFIX ROOT PORT CPU [TLS_PORT CERT KEY]: writes PREFIX/nginx.conf
# from the anchor; without a TLS port the HTTPS server (# tls:begin .. # tls:end) is left out.
render_nginx_conf() {
  local template=$1 prefix=$2 root=$3 port=$4 cpu=$5 tls_port=${6:-} cert=${7:-} key=${8:-} mask
  mask=$(cpu_mask "$cpu")
  mkdir -p "$prefix/tmp"
  if [[ -n $tls_port ]]; then
    sed -e "s|@TLS_PORT@|$tls_port|g" -e "s|@TLS_CERT@|$cert|g" -e "s|@TLS_KEY@|$key|g" "$template"
  else
    sed -e '/# tls:begin/,/# tls:end/d' "$template"
  fi | sed -e "s|@PREFIX@|$prefix|g" -e "s|@ROOT@|$root|g" -e "s|@PORT@|$port|g" \
      -e "s|@CPU_MASK@|$mask|g" > "$prefix/nginx.conf"
}

# tls_test_cert DIR: an ECDSA P-256 certificate for localhost (DIR/cert.pem, DIR/key.pem), made
# once with openssl and reused; the same one for both servers.
tls_test_cert() {
  local dir=$1
  mkdir -p "$dir"
  [[ -s $dir/cert.pem && -s $dir/key.pem ]] && return 0
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" >/dev/null 2>&1 || die "openssl could not make a test certificate"
  chmod 644 "$dir/cert.pem" "$dir/key.pem"
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

# print_usage SCRIPT [CODE]: prints SCRIPT's header comment (the lines after the shebang up to
# the first non-comment line, shellcheck directives left out) and exits with CODE (0).
print_usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 && !/shellcheck|SC2317/ { sub(/^# ?/, ""); print }' "$1"
  exit "${2:-0}"
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

# metrics_delta BEFORE AFTER: "name{labels} delta" of every counter that moved, summed over
# the shards (the shard label is dropped: shardline exports per-shard series only).
metrics_delta() {
  awk 'FNR == 1 { f++ } /^#/ || !/shard="/ { next }
       { k = $1; sub(/,?shard="[^"]*"/, "", k); sub(/\{,/, "{", k); sub(/\{\}/, "", k) }
       f == 1 { b[k] += $2; next } { a[k] += $2 }
       END { for (k in a) { d = a[k] - b[k]; if (d != 0) print k, d } }' "$1" "$2"
}

# ------------------------------------------------------------------ fixture disks (--disk)
# --disk ram: ext4 on a loop device backed by a file in /dev/shm. O_DIRECT, alignment (DIOALIGN
# 512) and page-cache residency behave as on an NVMe drive, but the disk is never the bottleneck
# and reads at the same speed every run (drop_caches does not empty the backing shmem file).
# RAMDISK_IMG / RAMDISK_DEV / RAMDISK_MNT are set as each piece exists, so that ramdisk_destroy
# (called from a trap) removes exactly what was made, also after a failure half-way.
RAMDISK_IMG='' RAMDISK_DEV='' RAMDISK_MNT=''

# ramdisk_create NAME BYTES MOUNTPOINT: needs root.
ramdisk_create() {
  local name=$1 bytes=$2 mnt=$3
  [[ $(id -u) == 0 ]] || die "--disk ram needs root (losetup, mount); use --disk repo otherwise"
  [[ -d /dev/shm ]] || die "--disk ram needs /dev/shm"
  local avail
  avail=$(df -B1 --output=avail /dev/shm | tail -n 1)
  ((avail > bytes + 268435456)) || die "/dev/shm has $avail bytes free; the ram disk needs $bytes (use --disk repo)"
  RAMDISK_IMG=/dev/shm/$name.img
  rm -f "$RAMDISK_IMG"
  if [[ -n ${RAMDISK_PRETOUCH:-} ]]; then
    # Every page of the image written once now: the first write to a fresh shmem page costs
    # the host (allocation, zeroing, and in this VM the hypervisor's fault: dd gets ~1 GB/s
    # into fresh pages, ~4 GB/s over them), which no real disk charges a write.
    dd if=/dev/zero of="$RAMDISK_IMG" bs=16M count=$(((bytes + (16 << 20) - 1) >> 24)) status=none ||
      die "writing the ram disk's image failed"
  else
    truncate -s "$bytes" "$RAMDISK_IMG"
  fi
  RAMDISK_DEV=$(losetup -f --show "$RAMDISK_IMG") || die "losetup failed"
  # Initialise inode tables and journal now: lazy init would write in the background mid-run.
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$RAMDISK_DEV" >&2 || die "mkfs.ext4 $RAMDISK_DEV failed"
  mkdir -p "$mnt"
  mount "$RAMDISK_DEV" "$mnt" || die "mount $RAMDISK_DEV $mnt failed"
  RAMDISK_MNT=$mnt
  chmod 755 "$mnt"
  log "ram disk: $RAMDISK_IMG ($bytes bytes) on $RAMDISK_DEV, ext4, mounted at $mnt"
}

# ramdisk_destroy: unmounts, detaches and deletes what ramdisk_create made; safe to call twice.
ramdisk_destroy() {
  local dev
  if [[ -n $RAMDISK_MNT ]]; then
    if mountpoint -q "$RAMDISK_MNT"; then
      umount "$RAMDISK_MNT" 2>/dev/null || umount -l "$RAMDISK_MNT" 2>/dev/null || log "cannot unmount $RAMDISK_MNT"
    fi
    rmdir "$RAMDISK_MNT" 2>/dev/null || true
    RAMDISK_MNT=''
  fi
  if [[ -n $RAMDISK_IMG ]]; then
    # Every loop device on our image (also one whose name we never learnt).
    for dev in $(losetup -j "$RAMDISK_IMG" -O NAME -n 2>/dev/null) $RAMDISK_DEV; do
      losetup -d "$dev" 2>/dev/null || true
    done
    rm -f "$RAMDISK_IMG"
    RAMDISK_IMG='' RAMDISK_DEV=''
  fi
}

# disk_baseline FILE MIB: MB/s of one O_DIRECT reader of FILE with 512 KiB reads (both servers'
# chunk size), cold cache, at most MIB MiB (dd iflag=direct); empty when dd fails.
disk_baseline() {
  local file=$1 mib=$2
  drop_caches || true
  dd if="$file" of=/dev/null bs=512k count=$((mib > 1024 ? 2048 : mib * 2)) iflag=direct 2>&1 |
    awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^copied,?$/) s = $(i + 1); if (s > 0) printf "%.0f", $1 / s / 1e6 }'
}
