#!/usr/bin/env bash
# perf/probe.sh: 1 KiB time to first byte under 100 bulk connections, as a user's client sees it,
# next to the pinned real-time prober perf/bench.sh uses, for shardline and nginx in one run.
#
#   perf/probe.sh [--disk repo|ram] [--duration-s N] [--reps N] [--rate N] [--large-mib N]
#                 [--nice N] [--profiles default,field] [--bulk wrk,pinned] [--servers sl,ng]
#                 [--slice-us N] [--evidence] [--out FILE]
#
# Both servers serve the same fixtures (perf/out/root on the repository's disk for --disk repo,
# the default), pinned to CPU 0 as perf/bench.sh starts them. For each sysctl profile, each
# repetition and each server (alternating): page cache dropped, small.bin warmed, then
# the bulk downloads large.bin; after 2 s three probes run at once over the
# same bulk window, each --rate 1 KiB GETs/s on fresh connections for --duration-s seconds
# (the bulk runs until the last probe has its answer, so no probe is measured without it):
#   plain  perf/loadgen ttfb, not pinned, normal (SCHED_OTHER) priority: a user's client
#   fifo   perf/loadgen ttfb pinned to CPU 1 under SCHED_FIFO 10: what perf/bench.sh measures
#   python a sequential Python socket client, not pinned (the independent probe of issue 11)
# --bulk wrk: `wrk -t2 -c100`, NOT pinned (a user's load; its threads also run on CPU 0);
# --bulk pinned: `perf/loadgen bulk --conns 100` pinned to CPU 1, as perf/bench.sh runs it.
# --servers takes sl (shardline), ng (nginx) and slx: shardline with its shard thread's EEVDF
# slice set to --slice-us (default 300) by sched_setattr from outside, the experiment behind
# perf/probe-fix.patch (which makes the shard thread set it itself).
# The python probe is closed-loop (one request at a time): while a server stalls it waits inside
# one request and takes no other samples, so it under-counts stalls (coordinated omission); the
# loadgen probes are open-loop (one request every 1/rate s whatever the answers).
# Every probe prints p50/p90/p99/max; the loadgen probes also report their own thread's
# run-queue wait during each request (client_wait) and the CPU it ran on. Per cell the script
# also records the server threads' and wrk's run-queue wait (schedstat), the host's CPU pressure
# (/proc/pressure/cpu), the disk's in-flight requests and the load average.
# --profiles field applies scripts/tune-host.sh --apply for those cells and restores every value
# it changed afterwards (also on failure). --nice N (default -10) for servers and clients alike.
# --evidence adds, per server, one extra cell with `strace -T` on the serving thread (syscall
# durations; strace slows the server, so those cells are not in the summary).
# Environment: SHARDLINE_BIN (default: cargo build --release), SHARDLINE_PORT, NGINX_PORT.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { print_usage "${BASH_SOURCE[0]}" "${1:-0}"; }

ARGS=("$@")
DISK=repo DURATION_S=20 REPS=2 RATE=50 LARGE_MIB=2048 NICE=-10 PROFILES=default SERVERS=sl,ng
EVIDENCE=0 OUT=$HERE/PROBE-run.md BULKS=wrk SLICE_US=300
while (($#)); do
  case $1 in
    --disk) DISK=$2; shift 2 ;;
    --duration-s) DURATION_S=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --large-mib) LARGE_MIB=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    --profiles) PROFILES=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --bulk) BULKS=$2; shift 2 ;;
    --slice-us) SLICE_US=$2; shift 2 ;;
    --evidence) EVIDENCE=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "probe.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
[[ $DISK == repo || $DISK == ram ]] || die "--disk wants repo or ram"
[[ $DURATION_S =~ ^[0-9]+$ && $DURATION_S -ge 2 ]] || die "--duration-s wants an integer >= 2"
[[ $REPS =~ ^[0-9]+$ && $REPS -ge 1 ]] || die "--reps wants an integer >= 1"
[[ $NICE =~ ^-?[0-9]+$ ]] || die "--nice wants an integer"
[[ $(id -u) == 0 ]] || die "needs root (drop_caches, SCHED_FIFO, sysctls)"
(($(nproc) >= 2)) || die "needs two CPUs (servers on 0, the fifo prober on 1)"
for t in wrk nginx python3 taskset chrt setsid; do command -v "$t" >/dev/null || die "missing $t"; done

SERVER_CPU=0 FIFO_CPU=1 BULK_CONNS=100 WARMUP_S=2
LARGE_BYTES=$((LARGE_MIB * 1024 * 1024)) SMALL_BYTES=1024
OUTDIR=$HERE/out RUN=$HERE/out/probe ROOT=$HERE/out/root STAMPDIR=$HERE/out
[[ $DISK == ram ]] && ROOT=$OUTDIR/pl-probe-mnt-$$ STAMPDIR=$OUTDIR/pl-probe-mnt-$$
LOADGEN=$HERE/loadgen/target/release/loadgen
free_port() { local p=$1; while port_busy "$p" || [[ $p == "${2:-}" ]]; do p=$((p + 1)); done; echo "$p"; }
SL_PORT=${SHARDLINE_PORT:-$(free_port 28280)}
NG_PORT=${NGINX_PORT:-$(free_port $((SL_PORT + 1)) "$SL_PORT")}
SLX_PORT=$(free_port $((NG_PORT + 1)) "$SL_PORT")
declare -A PORT=([sl]=$SL_PORT [ng]=$NG_PORT [slx]=$SLX_PORT) PG=()
declare -A NAME=([sl]=shardline [ng]=nginx [slx]="shardline+slice")
declare -A LIVE=()
SAVED_SYSCTLS=()

# ------------------------------------------------------------------ cleanup
restore_sysctls() {
  local kv
  for kv in "${SAVED_SYSCTLS[@]}"; do printf '%s\n' "${kv#*=}" >"${kv%%=*}" 2>/dev/null || log "cannot restore ${kv%%=*}"; done
  ((${#SAVED_SYSCTLS[@]})) && log "sysctls restored"
  SAVED_SYSCTLS=()
}
cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM
  set +e
  for pg in "${!LIVE[@]}"; do kill_group "$pg" 3; wait "$pg" 2>/dev/null; done
  restore_sysctls
  ramdisk_destroy
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

spawn() { # spawn OUTFILE CMD...: background in its own process group (pid = pgid)
  local out=$1
  shift
  setsid "$@" >"$out" 2>&1 </dev/null &
  LAST_PID=$!
  LIVE[$LAST_PID]=1
}
reap() { local rc=0; wait "$1" || rc=$?; unset "LIVE[$1]"; return "$rc"; }

# ------------------------------------------------------------------ sysctl profiles
# The keys scripts/tune-host.sh sets; their values are saved before --apply and written back.
TUNED_KEYS=(net/core/wmem_max net/core/rmem_max net/ipv4/tcp_wmem net/core/somaxconn
  net/core/netdev_max_backlog net/ipv4/tcp_congestion_control net/ipv4/tcp_slow_start_after_idle
  net/ipv4/tcp_notsent_lowat)
apply_profile() {
  local k
  restore_sysctls
  [[ $1 == default ]] && return 0
  for k in "${TUNED_KEYS[@]}"; do SAVED_SYSCTLS+=("/proc/sys/$k=$(cat "/proc/sys/$k")"); done
  "$REPO/scripts/tune-host.sh" --apply >"$RUN/tune-host.txt" 2>&1 || die "tune-host.sh --apply failed: $(tail -n 3 "$RUN/tune-host.txt")"
  log "profile field: $(grep -c -- '->' "$RUN/tune-host.txt" || true) values changed"
}

# ------------------------------------------------------------------ servers
start_server() {
  local s=$1
  port_busy "${PORT[$s]}" && die "port ${PORT[$s]} is in use"
  if [[ $s == sl || $s == slx ]]; then
    local extra=()
    [[ $("$SL_BIN" serve --help 2>&1) == *--admin* ]] && extra=(--admin 127.0.0.1:0)
    spawn "$RUN/$s-server.log" taskset -c "$SERVER_CPU" nice -n "$NICE" "$SL_BIN" serve --root "$ROOT" \
      --listen "127.0.0.1:${PORT[$s]}" --shards 1 --cpus "$SERVER_CPU" "${extra[@]}"
  else
    render_nginx_conf "$HERE/nginx.conf" "$OUTDIR/nginx-probe" "$ROOT" "${PORT[ng]}" "$SERVER_CPU"
    spawn "$RUN/ng-server.log" taskset -c "$SERVER_CPU" nice -n "$NICE" nginx -p "$OUTDIR/nginx-probe" \
      -c "$OUTDIR/nginx-probe/nginx.conf"
  fi
  PG[$s]=$LAST_PID
  wait_port "${PORT[$s]}" "${PG[$s]}" 15 || die "${NAME[$s]} did not start (log: $RUN/$s-server.log)"
  sleep 0.3
  if [[ $s == slx ]]; then
    local tid
    tid=$(serve_tid slx)
    python3 "$SLICE_PY" "$tid" "$SLICE_US" "$NICE" || die "sched_setattr on shard-0 ($tid) failed"
    log "shardline+slice: shard-0 ($tid) $(grep -E '^se.slice' "/proc/$tid/sched" | tr -s ' ')"
  fi
}
stop_server() { kill_group "${PG[$1]}" 10 || log "${NAME[$1]} needed SIGKILL"; reap "${PG[$1]}" || true; }

# serve_tid sl|ng: the thread that serves (shardline's shard-0, nginx's worker main thread).
serve_tid() {
  local pid t
  pid=$(serving_pid "${PG[$1]}")
  if [[ $1 == sl || $1 == slx ]]; then
    for t in /proc/"$pid"/task/*; do [[ $(cat "$t/comm" 2>/dev/null) == shard-0 ]] && { basename "$t"; return; }; done
  fi
  echo "$pid"
}

# threads_snap PID FILE: "tid comm run_ns wait_ns" of every thread of PID (schedstat).
threads_snap() {
  local t
  for t in /proc/"$1"/task/*; do
    printf '%s %s %s\n' "$(basename "$t")" "$(tr ' ' _ <"$t/comm" 2>/dev/null)" "$(cut -d' ' -f1,2 "$t/schedstat" 2>/dev/null)"
  done >"$2" 2>/dev/null || true
}
# cpu_wait_ns: host CPU pressure, ns during which some runnable task waited for a CPU (PSI).
cpu_wait_ns() { awk '/^some/ { sub(/total=/, "", $5); printf "%.0f\n", $5 * 1000 }' /proc/pressure/cpu 2>/dev/null || echo 0; }

# The experiment: EEVDF slice of a thread (sched_setattr, SCHED_OTHER, sched_runtime = slice),
# keeping its nice level. A shorter slice than the default lets the woken shard thread preempt
# a CPU-bound task (wrk, a compiler) at once instead of waiting for that task's slice to end.
SLICE_PY=$RUN/slice.py
write_slice_py() {
  cat >"$SLICE_PY" <<'EOF'
import ctypes, os, struct, sys
tid, slice_us, nice = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
SYS_SCHED_SETATTR = 314  # x86_64
attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, 0, 0, nice, 0, slice_us * 1000, 0, 0), 48)
if libc.syscall(SYS_SCHED_SETATTR, tid, attr, 0) != 0:
    sys.exit(f"sched_setattr: {os.strerror(ctypes.get_errno())}")
EOF
}

# ------------------------------------------------------------------ probes
PY_PROBE=$RUN/probe.py
write_py_probe() {
  cat >"$PY_PROBE" <<'EOF'
# A plain user's client: fresh connection per request, blocking sockets, one request at a time
# at fixed start times (a late answer delays the next start, as a user's script would).
import socket, sys, time
host, port, path, rate, dur, delay = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
time.sleep(delay)
req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: probe.py\r\n\r\n".encode()
ms, errors, start, n, samples = [], 0, time.monotonic(), int(rate * dur), []
for i in range(n):
    at = start + i / rate
    now = time.monotonic()
    if at > now:
        time.sleep(at - now)
    try:
        t0 = time.monotonic()
        s = socket.create_connection((host, port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(req)
        buf = s.recv(65536)
        t1 = time.monotonic()
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise IOError("eof in head")
            buf += d
        head, body = buf.split(b"\r\n\r\n", 1)
        ln = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
        while len(body) < ln:
            d = s.recv(65536)
            if not d:
                raise IOError("eof in body")
            body += d
        s.close()
        if not head.startswith(b"HTTP/1.1 200") or len(body) != ln:
            raise IOError("bad response")
        ms.append((t1 - t0) * 1000)
        samples.append(f"{i}:{(t1 - t0) * 1000:.2f}")
    except Exception:
        errors += 1
        samples.append(f"{i}:error")
ms.sort()
def pct(p):
    import math
    return ms[min(len(ms), max(1, math.ceil(p / 100 * len(ms)))) - 1]
print(f"requests={n}\nok={len(ms)}\nerrors={errors}")
if ms:
    print(f"ttfb_p50_ms={pct(50):.3f}\nttfb_p90_ms={pct(90):.3f}\nttfb_p99_ms={pct(99):.3f}\nttfb_max_ms={ms[-1]:.3f}")
print("samples=" + " ".join(samples))
EOF
}

# windows40 FILE: the p99 a 40-probe measurement would have reported (nearest rank: the max of
# 40), over every run of 40 consecutive probes in FILE's samples: "min/median/max" (ms).
windows40() {
  sed -n 's/^samples=//p' "$1" | tr ' ' '\n' | awk -F'[:/@]' '
    $2 != "" && $2 != "error" { v[n++] = (NF >= 4 ? $3 : $2) }
    END { for (i = 0; i + 40 <= n; i += 40) { m = 0; for (j = i; j < i + 40; j++) if (v[j] + 0 > m) m = v[j] + 0; a[w++] = m }
      for (i = 0; i < w; i++) for (j = i + 1; j < w; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      if (w) printf "%.1f/%.1f/%.1f", a[0], a[int(w / 2)], a[w - 1] }'
}

# ------------------------------------------------------------------ one cell
ROWS=$RUN/rows.tsv
# cell PROFILE BULK REP SERVER [strace]: one bulk window with the three probes.
cell() {
  local prof=$1 bulk=$2 rep=$3 s=$4 tracing=${5:-} port=${PORT[$4]} tag="$1-$2-$3-$4${5:+-$5}" pid tid
  local d=$RUN/$tag
  mkdir -p "$d"
  drop_caches || log "cannot drop the page cache"
  cat "$ROOT/small.bin" >/dev/null
  "$LOADGEN" get --addr "127.0.0.1:$port" --path /small.bin --seed 2 --expect-len "$SMALL_BYTES" >"$d/warm.txt" ||
    die "${NAME[$s]}: warm-up GET failed"
  pid=$(serving_pid "${PG[$s]}") tid=$(serve_tid "$s")
  local load0 w0 w1 bulk_s=$((3 * DURATION_S + 60))
  load0=$(cut -d' ' -f1 /proc/loadavg)
  # The bulk outlasts every probe (stopped below, once the last probe has its answer).
  if [[ $bulk == wrk ]]; then
    spawn "$d/bulk.txt" nice -n "$NICE" wrk -t2 -c"$BULK_CONNS" -d"${bulk_s}s" --timeout 20s \
      "http://127.0.0.1:$port/large.bin"
  else
    spawn "$d/bulk.txt" taskset -c "$FIFO_CPU" nice -n "$NICE" "$LOADGEN" bulk --addr "127.0.0.1:$port" \
      --path /large.bin --conns "$BULK_CONNS" --duration-s "$bulk_s" --warmup-s 1 --expect-len "$LARGE_BYTES"
  fi
  local pw=$LAST_PID
  sleep "$WARMUP_S"
  threads_snap "$pid" "$d/server-before.txt"
  threads_snap "$pw" "$d/wrk-before.txt"
  local bytes0 t_start=$SECONDS
  bytes0=$(awk '$1 == "lo:" { print $2 }' /proc/net/dev)
  w0=$(cpu_wait_ns)
  local ps=''
  if [[ $tracing == strace ]]; then
    spawn "$d/strace.txt" timeout 8 strace -T -tt -f -p "$tid" -e trace=io_uring_enter,openat2,openat,statx,newfstatat,fstat,pread64,preadv2,sendfile
    ps=$LAST_PID
  fi
  # 10 times a second: the disk's in-flight reads, and where each bulk-client thread and the
  # serving thread are (state@CPU; the serving thread's prefixed S): how often a bulk thread
  # runs on the server's CPU.
  (
    trap 'exit 0' TERM
    dev=$(findmnt -no SOURCE -T "$ROOT" | sed 's|/dev/||; s|[0-9]*$||')
    f=/sys/block/$dev/inflight
    [[ -r $f ]] || f=/sys/block/$(findmnt -no SOURCE -T "$ROOT" | sed 's|/dev/||')/inflight
    while read -r r _ <"$f"; do
      awk -v r="$r" -v tid="$tid" 'BEGIN { printf "%s", r } FILENAME ~ "/task/" tid "/" { printf " S%s@%s", $3, $39; next }
        { printf " %s@%s", $3, $39 } END { print "" }' /proc/"$pw"/task/*/stat /proc/"$pid"/task/"$tid"/stat 2>/dev/null
      sleep 0.1
    done
  ) >"$d/inflight.txt" 2>/dev/null &
  local pi=$!
  spawn "$d/plain.txt" nice -n "$NICE" "$LOADGEN" ttfb --addr "127.0.0.1:$port" --path /small.bin \
    --rate "$RATE" --duration-s "$DURATION_S" --seed 2 --expect-len "$SMALL_BYTES"
  local p1=$LAST_PID
  spawn "$d/fifo.txt" taskset -c "$FIFO_CPU" chrt -f 10 "$LOADGEN" ttfb --addr "127.0.0.1:$port" \
    --path /small.bin --rate "$RATE" --duration-s "$DURATION_S" --delay-s 0.007 --seed 2 \
    --expect-len "$SMALL_BYTES"
  local p2=$LAST_PID
  spawn "$d/python.txt" nice -n "$NICE" python3 "$PY_PROBE" 127.0.0.1 "$port" /small.bin "$RATE" "$DURATION_S" 0.013
  local p3=$LAST_PID
  reap "$p1" || log "plain probe failed: $(tail -n 2 "$d/plain.txt")"
  reap "$p2" || log "fifo probe failed: $(tail -n 2 "$d/fifo.txt")"
  reap "$p3" || log "python probe failed: $(tail -n 2 "$d/python.txt")"
  w1=$(cpu_wait_ns)
  threads_snap "$pid" "$d/server-after.txt"
  threads_snap "$pw" "$d/wrk-after.txt"
  local bytes1 t_win=$((SECONDS - t_start))
  bytes1=$(awk '$1 == "lo:" { print $2 }' /proc/net/dev)
  kill "$pi" 2>/dev/null; wait "$pi" 2>/dev/null || true
  [[ -n $ps ]] && { reap "$ps" || true; }
  # wrk prints its summary on SIGINT; loadgen (SIGINT ignored in a background job) takes TERM.
  # The bulk client may have finished on its own (its duration ran out while a slow probe
  # window ended): a failed kill is not an error.
  if [[ $bulk == wrk ]]; then kill -INT "$pw" 2>/dev/null || true; else kill -TERM "$pw" 2>/dev/null || true; fi
  reap "$pw" || true
  # Run-queue wait (ms) over the probe window: the serving thread, its other threads
  # (io_uring workers / nginx thread pool), wrk; and CPU time of each.
  local stats
  stats=$(awk -v tid="$tid" '
    FNR == 1 { f++ }
    f == 1 { r0[$1] = $3; w0[$1] = $4; next }
    f == 2 { dr = ($3 - r0[$1]) / 1e6; dw = ($4 - w0[$1]) / 1e6
             if ($1 == tid) { mr = dr; mw = dw } else { or += dr; ow += dw; if (dr > 0) on++ } }
    END { printf "%.0f %.0f %.0f %.0f %d", mr, mw, or, ow, on }' "$d/server-before.txt" "$d/server-after.txt")
  local wrk_stats
  wrk_stats=$(awk 'FNR == 1 { f++ } f == 1 { r0[$1] = $3; w0[$1] = $4; next }
    { r += ($3 - r0[$1]) / 1e6; w += ($4 - w0[$1]) / 1e6 } END { printf "%.0f %.0f", r, w }' \
    "$d/wrk-before.txt" "$d/wrk-after.txt")
  local inflight_max inflight_mean
  read -r inflight_mean inflight_max < <(awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.0f %d\n", NR ? s / NR : 0, m }' "$d/inflight.txt")
  # Share of samples with a bulk-client thread running (R) on the server CPU.
  local bulk_on0
  bulk_on0=$(awk -v c="$SERVER_CPU" '{ hit = 0; for (i = 2; i <= NF; i++) if ($i == "R@" c) hit = 1; n++; h += hit }
    END { printf "%.0f%%", n ? 100 * h / n : 0 }' "$d/inflight.txt")
  # Bulk goodput over the probe window, from loopback's byte counter (whole seconds: rough).
  local gbs
  gbs=$(awk -v a="$bytes0" -v b="$bytes1" -v t="$t_win" 'BEGIN { if (t > 0) printf "%.3f", (b - a) / t / 1e9 }')
  local mode f
  for mode in plain fifo python; do
    f=$d/$mode.txt
    printf '%s\t%s\t%s\t%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
      "$prof" "$rep" "$s" "$mode" "${tracing:+ (strace)}" "$(kv "$f" ok)/$(kv "$f" requests)" \
      "$(kv "$f" ttfb_p50_ms)" "$(kv "$f" ttfb_p90_ms)" "$(kv "$f" ttfb_p99_ms)" "$(kv "$f" ttfb_max_ms)" \
      "$(kv "$f" client_wait_p99_ms)" "$(kv "$f" ttfb_minus_wait_p99_ms)" "$(kv "$f" first_byte_cpu)" \
      "$stats" "$wrk_stats" "$(((w1 - w0) / 1000000))" "$inflight_mean/$inflight_max" "${gbs:-?}" "$load0" "$tracing" "$bulk" "$bulk_on0" "$(windows40 "$f")" >>"$ROWS"
  done
  log "$tag: p99 plain/fifo/python $(kv "$d/plain.txt" ttfb_p99_ms)/$(kv "$d/fifo.txt" ttfb_p99_ms)/$(kv "$d/python.txt" ttfb_p99_ms) ms; serve thread run/wait ms, others run/wait, n: $stats; wrk run/wait $wrk_stats; cpu pressure $(((w1 - w0) / 1000000)) ms; inflight $inflight_mean/$inflight_max; bulk thread on CPU $SERVER_CPU $bulk_on0; bulk ${gbs:-?} GB/s; load $load0"
}

# ------------------------------------------------------------------ report
report() {
  local end_load
  end_load=$(cut -d' ' -f1-3 /proc/loadavg)
  {
    echo "# perf/probe.sh: 1 KiB TTFB under $BULK_CONNS bulk connections, three probes"
    echo
    echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`perf/probe.sh ${ARGS[*]}\`"
    echo "- Host: kernel $(uname -r), $(nproc) CPUs; load average at start $START_LOAD, at end $end_load"
    echo "- shardline \`$SL_BIN\` (commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')), \`serve --shards 1 --cpus $SERVER_CPU\`; $(nginx -v 2>&1 | sed 's/^nginx version: //') with perf/nginx.conf; both pinned to CPU $SERVER_CPU, nice $NICE"
    echo "- Fixtures: $ROOT on $(findmnt -no SOURCE -T "$ROOT") (--disk $DISK), large.bin $LARGE_BYTES bytes, small.bin $SMALL_BYTES bytes; page cache dropped before each cell"
    echo "- Bulk (--bulk $BULKS): wrk = \`wrk -t2 -c$BULK_CONNS\` on large.bin, not pinned; pinned = \`perf/loadgen bulk --conns $BULK_CONNS\` pinned to CPU $FIFO_CPU (perf/bench.sh's); nice $NICE. shardline+slice = shardline whose shard thread got an EEVDF slice of $SLICE_US us (sched_setattr). Probes over the same ${DURATION_S} s window, $RATE/s each, fresh connection per request: plain = loadgen not pinned, SCHED_OTHER, nice $NICE; fifo = loadgen pinned to CPU $FIFO_CPU, SCHED_FIFO 10 (perf/bench.sh's prober); python = sequential Python client, not pinned, nice $NICE"
    echo
    echo "## Summary: p99 (ms), median of $REPS repetitions [min-max]; ratios to nginx's median"
    echo
    echo "| Profile | Bulk | Probe | shardline p99 | shardline+slice p99 | nginx p99 | shardline / nginx | +slice / nginx | p50 shardline / +slice / nginx |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---|"
    awk -F'\t' '$19 == "" {
        k = $1 SUBSEP $20 SUBSEP $4; keys[k] = 1; n[k, $3]++; p99[k, $3, n[k, $3]] = $8; p50[k, $3, n[k, $3]] = $6 }
      function med(a, k, s, c,   i, j, t, v) { lo = hi = ""; if (!c) return ""
        for (i = 1; i <= c; i++) v[i] = a[k, s, i]
        for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
        lo = v[1]; hi = v[c]; return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2 }
      function cellf(m) { return m == "" ? "-" : sprintf("%.1f [%.1f-%.1f]", m, lo, hi) }
      function ratio(x, y) { return (x == "" || y == "" || y + 0 == 0) ? "-" : sprintf("%.2fx", x / y) }
      function p5(s, m) { m = med(p50, K, s, n[K, s]); return m == "" ? "-" : sprintf("%.1f", m) }
      END { for (K in keys) { split(K, p, SUBSEP)
        a = med(p99, K, "sl", n[K, "sl"]); ca = cellf(a)
        x = med(p99, K, "slx", n[K, "slx"]); cx = cellf(x)
        b = med(p99, K, "ng", n[K, "ng"]); cb = cellf(b)
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", p[1], p[2], p[3], ca, cx, cb, ratio(a, b), ratio(x, b), p5("sl"), p5("slx"), p5("ng") } }' "$ROWS" | sort
    echo
    echo "## Every cell"
    echo
    echo "Columns: n = answered/sent; client wait p99 = the probe thread's own run-queue wait during a request (loadgen probes only); TTFB-wait p99 = TTFB minus that wait; CPU = where the probe thread ran at first byte (cpu:count); serve thread = shardline's shard-0 / nginx's worker: run ms, run-queue wait ms over the window; other threads = the server's other threads (shardline: main, admin, any iou-wrk io_uring workers; nginx: its 16 thread-pool threads): run ms, wait ms, how many ran; bulk client run/wait ms (all its threads); bulk on CPU $SERVER_CPU = share of 10 Hz samples in which a bulk-client thread was running on the server's CPU; CPU pressure = ms of the window in which some runnable task on the host waited for a CPU (/proc/pressure/cpu \"some\"); inflight = disk reads in flight, mean/max (10 Hz); bulk GB/s = loopback bytes over the window; 40-probe p99 = what a 40-probe measurement (p99 of 40 = their max) would have reported, over each run of 40 consecutive probes of the cell."
    echo
    echo "| Profile | Bulk | Rep | Server | Probe | n | p50 | p90 | p99 | max | client wait p99 | TTFB-wait p99 | CPU | serve thread run/wait | other threads run/wait/n | bulk client run/wait | bulk on CPU $SERVER_CPU | CPU pressure | inflight | bulk GB/s | load | 40-probe p99 min/med/max |"
    echo "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|---|---:|---:|---|"
    awk -F'\t' '{ split($13, a, " "); split($14, w, " "); nm = ($3 == "sl" ? "shardline" : $3 == "slx" ? "shardline+slice" : "nginx")
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s | %s/%s/%s | %s/%s | %s | %s | %s | %s | %s | %s |\n",
        $1, $20, $2, nm, $4, $5, $6, $7, $8, $9, $10, $11, $12, a[1], a[2], a[3], a[4], a[5], w[1], w[2], $21, $15, $16, $17, $18, $22 }' "$ROWS"
    if ((EVIDENCE)); then
      echo
      echo "## strace -T on the serving thread (evidence cells, ~8 s each; strace slows the server)"
      local s f
      for s in ${SERVERS//,/ }; do
        for f in "$RUN"/*-"$s"-strace/strace.txt; do break; done
        [[ -s $f ]] || continue
        echo
        echo "${NAME[$s]}: calls, total s, calls over 1 ms, longest (s), by syscall:"
        echo
        echo '```'
        awk 'match($0, /<[0-9.]+>$/) { t = substr($0, RSTART + 1, RLENGTH - 2)
             if (match($0, /<\.\.\. [a-z0-9_]+ resumed>/)) { c = substr($0, RSTART + 5, RLENGTH - 14) }
             else { split($0, a, "("); n = split(a[1], b, " "); c = b[n] }
             cnt[c]++; sum[c] += t; if (t > 0.001) slow[c]++; if (t > mx[c]) mx[c] = t }
             END { for (c in cnt) printf "%-16s %7d %9.3f %6d %9.6f\n", c, cnt[c], sum[c], slow[c], mx[c] }' "$f" | sort -k3 -gr
        echo '```'
      done
    fi
  } >"$OUT"
  cat "$OUT"
}

# ------------------------------------------------------------------ main
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$RUN" "$ROOT"
rm -rf "${RUN:?}"/*
build_tools
if [[ $DISK == ram ]]; then
  ramdisk_create "pl-probe-disk-$$" $((LARGE_BYTES + 256 * 1024 * 1024)) "$ROOT"
fi
ensure_fixture "$LOADGEN" "$ROOT" "$STAMPDIR" large.bin "$LARGE_BYTES" 1
ensure_fixture "$LOADGEN" "$ROOT" "$STAMPDIR" small.bin "$SMALL_BYTES" 2
chmod 755 "$OUTDIR" "$ROOT"
write_py_probe
write_slice_py
: >"$ROWS"
ulimit -n 65536 2>/dev/null || true
for s in ${SERVERS//,/ }; do start_server "$s"; done
for prof in ${PROFILES//,/ }; do
  apply_profile "$prof"
  for ((rep = 1; rep <= REPS; rep++)); do
    for bulk in ${BULKS//,/ }; do
      for s in ${SERVERS//,/ }; do cell "$prof" "$bulk" "$rep" "$s"; done
    done
  done
done
restore_sysctls
if ((EVIDENCE)); then
  command -v strace >/dev/null || die "--evidence needs strace"
  for s in ${SERVERS//,/ }; do cell default "${BULKS%%,*}" 1 "$s" strace; done
fi
for s in ${SERVERS//,/ }; do stop_server "$s"; done
report
log "wrote $OUT (raw: $RUN)"
