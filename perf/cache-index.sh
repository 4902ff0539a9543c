#!/usr/bin/env bash
# perf/cache-index.sh: the cache index's memory per object and its time to ready after a
# restart, at 1, 3 and 10 million objects, beside another revision's index in the same run
# (issue 44).
#
#   perf/cache-index.sh [--base REV] [--sizes "1000000 3000000 10000000"] [--blocks B]
#                       [--rounds R] [--dir DIR] [--out FILE]
#
# Builds `examples/cache_restart.rs` (release) twice: from this tree, and from REV (default
# ccea321, the landed code) with this tree's example file, so both run the same program on
# their own index. For each size each build writes a journal of N objects of B blocks
# (default 4, no churn) in its own format (the same records; a newer build may encode them in
# fewer bytes), then, R times (default 2; the builds take turns going first), the page cache
# is dropped and each build opens its journal in a process of its own: the journal read from
# disk and replayed into a ready index. Reports bytes per object (VmRSS after the load minus before,
# over the objects), peak RSS and time to ready, and a straight-line fit through the sizes
# for 30 million. Then the same N on two disks of N/2 each (`cache_restart open-disks`: each
# journal replayed on its own thread, then the indexes joined). Then restarts a real edge
# (`shardline serve`, each build) over a cache of N objects and times its first answer to a
# pulled request (a hit, or, while the cache loads,
# a pass-through) and its first hit; then again held out as a load balancer would (only
# /healthz polled until it answers 200, then one request, which must be a hit), and the same
# after that edge is killed with SIGKILL (a crash). Needs root (drop_caches). Writes
# perf/CACHE-INDEX.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BASE=ccea321 SIZES="1000000 3000000 10000000" BLOCKS=4 ROUNDS=2
DIR=/var/tmp/shardline-cache-index OUT=$HERE/CACHE-INDEX.md
while (($#)); do
  case $1 in
    --base) BASE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) print_usage "$0" ;;
    *) echo "cache-index.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || die "needs root (it drops the page cache before each restart)"
mkdir -p "$DIR"
log "building examples/cache_restart (release) from this tree"
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --example cache_restart
NEW=$DIR/cache_restart.new
cp "$REPO/target/release/examples/cache_restart" "$NEW"
WT=$HERE/out/cache-index-base
base_rev=$(git -C "$REPO" rev-parse --short "$BASE")
if [[ ! -d $WT ]]; then git -C "$REPO" worktree add --detach -f "$WT" "$BASE" >/dev/null; fi
git -C "$WT" checkout -q --detach "$BASE"
cp "$REPO/examples/cache_restart.rs" "$WT/examples/cache_restart.rs"
log "building examples/cache_restart and shardline (release) at $base_rev"
cargo build --release --quiet --manifest-path "$WT/Cargo.toml" --example cache_restart --bin shardline
OLD=$DIR/cache_restart.base
cp "$WT/target/release/examples/cache_restart" "$OLD"
cp "$WT/target/release/shardline" "$DIR/shardline.base"
git -C "$WT" checkout -q -- examples/cache_restart.rs
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --bin shardline
cp "$REPO/target/release/shardline" "$DIR/shardline.new"

# server_fit COLUMN: the fit line of each build over the edge rows, bytes per object once
# counted (field 6), time from table COLUMN (awk's field number: 8 the first hit, 10 held).
server_fit() {
  local side pts
  for side in new base; do
    mapfile -t pts < <(printf '%s\n' "$server_rows" | awk -F'|' -v s=" $side " -v c="$1" '$3 == s { print $2 + 0, $6 + 0, $c + 0 }')
    echo "- $side: $(fit "${pts[@]}")"
  done
}

# order ROUND: the builds in the order round ROUND runs them, base first in odd rounds: the
# first open after a journal is written reads slower (seen up to 2x), and that falls on each
# build in turn.
order() { if (($1 % 2)); then echo base new; else echo new base; fi; }

# field FILE REGEX: the first capture of REGEX (sed -E) in FILE.
field() { sed -nE "s/$2/\1/p" "$1" | head -1; }

rows=() fit_new=() fit_old=() disk_rows=() sizes_rows=()
declare -A journal_bytes
for n in $SIZES; do
  j=$DIR/n$n
  for side in base new; do
    bin=$OLD; [[ $side == new ]] && bin=$NEW
    rm -rf "$j-$side"
    log "writing a journal of $n objects ($side)"
    KEEP=1 "$bin" "$j-$side" "$n" "$BLOCKS" 1 >"$DIR/write-$n-$side.txt"
    journal_bytes[$side]=$(stat -c %s "$j-$side/journal")
  done
  sizes_rows+=("| $n | ${journal_bytes[base]} | ${journal_bytes[new]} |")
  for ((r = 1; r <= ROUNDS; r++)); do
    for side in $(order "$r"); do
      bin=$OLD; [[ $side == new ]] && bin=$NEW
      sync; echo 3 >/proc/sys/vm/drop_caches
      f=$DIR/open-$n-$side-$r.txt
      "$bin" open "$j-$side/journal" >"$f"
      ready=$(field "$f" '.*ready in ([0-9.]+) s.*')
      peak=$(field "$f" '.*peak RSS ([0-9]+) MiB.*')
      per=$(field "$f" '.*: ([0-9]+) bytes per object.*')
      rows+=("| $n | $side | $r | $per | $peak | $ready |")
      log "$n objects, $side, round $r: $per B/object, peak $peak MiB, ready in $ready s"
      if [[ $side == new ]]; then fit_new+=("$n $per $ready"); else fit_old+=("$n $per $ready"); fi
    done
  done
  rm -rf "$j-base" "$j-new"
  # The same N over two disks of N/2 (keys apart): each journal replayed on its own thread,
  # then the two indexes joined into one (`Index::join`).
  log "writing two journals of $((n / 2)) objects"
  for side in base new; do
    bin=$OLD; [[ $side == new ]] && bin=$NEW
    rm -rf "$j-a-$side" "$j-b-$side"
    mkdir -p "$j-a-$side" "$j-b-$side"
    "$bin" append "$j-a-$side/journal" $((n / 2)) "$BLOCKS" 0 >/dev/null
    "$bin" append "$j-b-$side/journal" $((n / 2)) "$BLOCKS" $((n / 2)) >/dev/null
  done
  for ((r = 1; r <= ROUNDS; r++)); do
    for side in $(order "$r"); do
      bin=$OLD; [[ $side == new ]] && bin=$NEW
      sync; echo 3 >/proc/sys/vm/drop_caches
      f=$DIR/open-disks-$n-$side-$r.txt
      "$bin" open-disks "$j-a-$side" "$j-b-$side" >"$f"
      ready=$(field "$f" '.*ready in ([0-9.]+) s.*')
      peak=$(field "$f" '.*peak RSS ([0-9]+) MiB.*')
      disk_rows+=("| $n | $side | $r | $peak | $ready |")
      log "$n objects on two disks, $side, round $r: peak $peak MiB, ready in $ready s"
    done
  done
  rm -rf "$j"-[ab]-*
done

# The same restart on a real edge: `shardline serve` over a cache of one real object (filled
# from a second shardline as the origin) and N synthetic ones appended to its journal; the
# time from the process's start to the real object's first hit (`Cache-Status: ...; hit`,
# its bytes compared), and VmRSS then, against the same edge's over the one object alone.
server_rows=$(python3 - "$DIR" "$NEW" "$OLD" "$ROUNDS" "$BLOCKS" $SIZES <<'PY'
import hashlib, http.client, os, shutil, signal, socket, subprocess, sys, time
work, rounds, blocks = sys.argv[1], int(sys.argv[4]), sys.argv[5]
# Each build's cache is its own: filled by its edge, grown by its own example (its format).
examples = {"new": sys.argv[2], "base": sys.argv[3]}
sizes = [int(n) for n in sys.argv[6:]]
bins = {"base": f"{work}/shardline.base", "new": f"{work}/shardline.new"}
EDGE, ORIGIN, ADMIN = 18190, 18191, 18192
origin_root = f"{work}/origin"
os.makedirs(f"{origin_root}/pull", exist_ok=True)
body = os.urandom(1 << 20)
for p in (f"{origin_root}/obj.bin", f"{origin_root}/pull/obj.bin"):
    open(p, "wb").write(body)
want = hashlib.sha256(body).hexdigest()
def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False
for port in (EDGE, ORIGIN, ADMIN):
    if listening(port):
        raise SystemExit(f"something listens on 127.0.0.1:{port} already")
log = open(f"{work}/servers.log", "a")
# No admin listener on the origin; the edge's is on ADMIN, for /healthz (the default port is left alone).
open(f"{work}/origin.toml", "w").write('admin = ""\n')
origin = subprocess.Popen([bins["new"], "serve", "--root", origin_root, "--listen",
                           f"127.0.0.1:{ORIGIN}", "--shards", "1", "--config",
                           f"{work}/origin.toml"], stdout=log, stderr=log)
while not listening(ORIGIN):
    time.sleep(0.01)
def get():
    """(Cache-Status, the right bytes?) of the real object; None: no answer."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", EDGE, timeout=60)
        c.request("GET", "/pull/obj.bin")
        r = c.getresponse()
        data = r.read()
        return r.getheader("Cache-Status", ""), r.status == 200 and hashlib.sha256(data).hexdigest() == want
    except OSError:
        return None
def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
def healthy():
    """Whether the admin listener's /healthz answers 200 (503 while the cache loads)."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", ADMIN, timeout=60)
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        return r.status == 200
    except OSError:
        return False
def counted_rss_kib(p):
    """VmRSS once the eviction has counted every version held (`/metrics` shows none left
    uncounted): the edge's memory settled, where the RSS at the first hit may fall before,
    during or after that count."""
    t0 = time.monotonic()
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", ADMIN, timeout=60)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            left = [l for l in text.splitlines() if l.startswith("shardline_cache_load_uncounted_versions ")]
            if not left:
                raise SystemExit("/metrics has no shardline_cache_load_uncounted_versions")
            if float(left[0].split()[1]) == 0:
                return rss_kib(p.pid)
        except OSError:
            pass
        if time.monotonic() - t0 > 600:
            raise SystemExit("the eviction never counted every version")
        time.sleep(0.01)
def edge_held(side, cache):
    """Starts the edge as a load balancer would see it: /healthz polled every 10 ms (no
    pulled request while it loads), then the object, which must be a hit; (process, seconds
    to that hit)."""
    cfg = f"{work}/edge.toml"
    t0 = time.monotonic()
    p = subprocess.Popen([bins[side], "serve", "--root", origin_root, "--listen", f"127.0.0.1:{EDGE}",
                          "--shards", "2", "--config", cfg], stdout=log, stderr=log)
    while not healthy():
        if p.poll() is not None:
            raise SystemExit(f"the {side} edge exited ({p.returncode}); see {work}/servers.log")
        if time.monotonic() - t0 > 600:
            raise SystemExit("never healthy")
        time.sleep(0.01)
    got = get()
    if not got or "hit" not in got[0] or not got[1]:
        raise SystemExit(f"healthy, then not a hit with the right bytes: {got}")
    return p, time.monotonic() - t0
def edge(side, cache):
    """Starts the edge, waits for the object's first hit; (process, seconds to the first
    answer with the right bytes, seconds to the first hit, RSS KiB)."""
    cfg = f"{work}/edge.toml"
    open(cfg, "w").write(f'admin = "127.0.0.1:{ADMIN}"\ncache_dir = "{cache}"\ncache_max_bytes = {1 << 50}\n'
                         f'[[origin]]\nprefix = "/pull/"\nurl = "http://127.0.0.1:{ORIGIN}"\n')
    t0 = time.monotonic()
    answered = None
    p = subprocess.Popen([bins[side], "serve", "--root", origin_root, "--listen", f"127.0.0.1:{EDGE}",
                          "--shards", "2", "--config", cfg], stdout=log, stderr=log)
    while True:
        if p.poll() is not None:
            raise SystemExit(f"the {side} edge exited ({p.returncode}); see {work}/servers.log")
        got = get()
        if got and got[1] and answered is None:
            answered = time.monotonic() - t0
        if got and "hit" in got[0]:
            if not got[1]:
                raise SystemExit("a hit with the wrong bytes")
            return p, answered, time.monotonic() - t0, rss_kib(p.pid)
        if got is None:
            time.sleep(0.01)
        elif time.monotonic() - t0 > 600:
            raise SystemExit(f"no hit: {got}")
def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill(); p.wait()
try:
    for n in sizes:
        caches = {side: f"{work}/edge-cache-{side}" for side in ("new", "base")}
        base_rss = {}
        for side, cache in caches.items():
            shutil.rmtree(cache, ignore_errors=True)
            os.makedirs(cache)
            p, _, _, base_rss[side] = edge(side, cache)
            stop(p)
            out = subprocess.run([examples[side], "append", f"{cache}/journal", str(n), blocks],
                                 check=True, capture_output=True, text=True).stdout.strip()
            print(f"appended {n} ({side}): {out}", file=sys.stderr)
        for r in range(1, rounds + 1):
            for side in (("base", "new") if r % 2 else ("new", "base")):
                cache = caches[side]
                subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3")
                p, answer, secs, rss = edge(side, cache)
                counted = counted_rss_kib(p)
                stop(p)
                subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3")
                p, held = edge_held(side, cache)
                # A crash: killed, no shutdown of any kind; the restart replays what it
                # finds, as after a clean stop (nothing is written at a stop to skip it).
                p.kill(); p.wait()
                subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3")
                p, crashed = edge_held(side, cache)
                stop(p)
                per = max(rss - base_rss[side], 0) * 1024 // n
                per_counted = max(counted - base_rss[side], 0) * 1024 // n
                print(f"| {n} | {side} | {r} | {per} | {per_counted} | {rss // 1024} | {secs:.2f} | {answer:.2f} | {held:.2f} | {crashed:.2f} |")
                print(f"edge {n} {side} round {r}: {per} B/object at the first hit, {per_counted} once counted, first hit {secs:.2f} s, first answer {answer:.2f} s, held until healthy then hit {held:.2f} s, the same after kill -9 {crashed:.2f} s", file=sys.stderr)
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
finally:
    stop(origin)
PY
) || die "the edge restarts failed"

# fit "N BYTES SECONDS"...: least squares of bytes per object and of seconds over N, at 30M.
fit() {
  printf '%s\n' "$@" | awk '
    { n[NR] = $1 / 1e6; b[NR] = $2 * $1 / 1048576; t[NR] = $3 }
    END {
      for (i = 1; i <= NR; i++) { sx += n[i]; sb += b[i]; st += t[i]; sxx += n[i] * n[i]; sxb += n[i] * b[i]; sxt += n[i] * t[i] }
      d = NR * sxx - sx * sx
      mb = (NR * sxb - sx * sb) / d; cb = (sb - mb * sx) / NR
      mt = (NR * sxt - sx * st) / d; ct = (st - mt * sx) / NR
      printf "%.0f MiB (%.0f bytes per object), ready in %.1f s", cb + 30 * mb, (cb + 30 * mb) * 1048576 / 30e6, ct + 30 * mt
    }'
}
{
  echo "# The cache index at size: memory and time to ready (perf/cache-index.sh)"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/cache-index.sh --base $BASE --sizes \"$SIZES\" --rounds $ROUNDS\`"
  echo "- new: this tree ($(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- src examples || echo ', with uncommitted changes')); base: $base_rev. Both run the same \`examples/cache_restart.rs\` (each writes its own journals), on the server's allocator (mimalloc; before 2026-12-08 the example ran on glibc's malloc, about a third slower at 10 million); the edge rows run each build's \`shardline\`, on its own global allocator (mimalloc since b6d8b44)."
  echo "- Host: kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); journal on $(df -P "$DIR" | awk 'NR == 2 { print $1 }'), dropped from the page cache before each open"
  echo "- Workload: N objects of $BLOCKS blocks (a 59-byte key, an ETag, a content type), no churn; one process per open: the journal read from disk and replayed into a ready index"
  echo "- bytes/object: VmRSS after the load minus before, over the objects (the index, block checksums included, and what malloc holds); peak: VmHWM"
  echo
  echo "## The journals (bytes on disk, each build's own)"
  echo
  echo "| objects | base | new |"
  echo "|---:|---:|---:|"
  printf '%s\n' "${sizes_rows[@]}"
  echo
  echo "## The index alone (\`examples/cache_restart\`)"
  echo
  echo "| objects | index | round | bytes/object | peak RSS (MiB) | ready (s) |"
  echo "|---:|---|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "30 million objects, by a least-squares line through every round above (memory = bytes/object x N, and time to ready, each a line in N):"
  echo
  echo "- new: $(fit "${fit_new[@]}")"
  echo "- base: $(fit "${fit_old[@]}")"
  echo
  echo "## Two disks: the same objects, half on each (\`cache_restart open-disks\`)"
  echo
  echo "Two journals of N/2 objects (keys apart), replayed side by side, a thread each, then joined into one index. Page cache dropped before each open."
  echo
  echo "| objects | index | round | peak RSS (MiB) | ready (s) |"
  echo "|---:|---|---:|---:|---:|"
  printf '%s\n' "${disk_rows[@]}"
  echo
  echo "## A real edge's restart: time to the first answer and to the first hit"
  echo
  echo "\`shardline serve\` (2 shards) over one cache disk holding one real 1 MiB object (filled from a second shardline as the origin) and N synthetic objects appended to its journal (\`cache_restart append\`; their data files are never read); each build has its own cache, filled and grown by its own build. Page cache dropped, then the process started; first hit: the real object answered \`Cache-Status: shardline; hit\` with its bytes compared, polled every 10 ms; first answer: the first 200 with the object's bytes, a hit or (while the cache loads, past \`cache_ready_wait_ms\`, 1000 by default) a pass-through from the origin. Held: the same restart as a load balancer sees it, \`/healthz\` polled every 10 ms and no pulled request until it answers 200, then the object, which must be a hit (the polled runs share the 2 CPUs with the pass-throughs they cause and the origin). After kill -9: that held edge killed with SIGKILL (no shutdown), the page cache dropped, and the same held restart timed. bytes/object: VmRSS then, minus the same binary's over the one object alone, over N (the index, the eviction queues, the tables' room); at the first hit, the eviction may still be counting the versions it loaded (\`shardline_cache_load_uncounted_versions\`), so the figure once counted (\`/metrics\` shows none left, polled every 10 ms) is the settled one."
  echo
  echo "| objects | edge | round | bytes/object at the first hit | bytes/object once counted | RSS at the first hit (MiB) | first hit (s) | first answer (s) | held: healthy, then a hit (s) | held, after kill -9 (s) |"
  echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "$server_rows"
  echo
  echo "30 million objects, by the same fit over the rounds above (memory: bytes per object once counted; time: to the first hit):"
  echo
  server_fit 8
  echo
  echo "The same fit, time held (healthy, then a hit):"
  echo
  server_fit 10
  echo
  echo "The same fit, time held after kill -9:"
  echo
  server_fit 11
} >"$OUT"
log "wrote $OUT"
