#!/usr/bin/env bash
# perf/validate-no-reclaim.sh: the operator's check from the field report (seed 000 §3 and §7):
# while a bulk load runs against a running shardline, no direct reclaim and no reclaim functions
# in the kernel profile; plus the server's syscall mix per GiB sent.
#
#   perf/validate-no-reclaim.sh [--port P | --pid PID] [--url URL] [--seconds N]
#       [--connections C] [--client-cpus LIST] [--strace-seconds N]
#       [--compare-nginx [--nginx-port P] [--nginx-pid PID] [--nginx-url URL]]
#
# --url URL        start the load here: wrk -c C (default 100) -t1 on URL (a large file); without
#                  it, a load must already be running and bytes are estimated from interface
#                  tx counters
# --port/--pid     the server (default: the pid listening on the URL's port, else on 8080)
# --seconds N      profile length (default 10); --strace-seconds N syscall window (default 5)
# --client-cpus L  pin wrk with taskset -c L (e.g. 1 when the server is pinned to 0)
# --compare-nginx  the same syscall mix for nginx (default port 18081, the URL's path)
# Prints PASS or FAIL and exits 0 / 1 (2: could not run). FAIL when pgscan_direct or allocstall*
# grew, or when reclaim functions (shrink_*, *reclaim*) take more than 1% of kernel samples.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

PORT='' PID='' URL='' SECONDS_N=10 CONNS=100 CLIENT_CPUS='' STRACE_S=5
COMPARE=0 NG_PORT=18081 NG_PID='' NG_URL=''
while (($#)); do
  case $1 in
    --port) PORT=$2; shift 2 ;;
    --pid) PID=$2; shift 2 ;;
    --url) URL=$2; shift 2 ;;
    --seconds) SECONDS_N=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --client-cpus) CLIENT_CPUS=$2; shift 2 ;;
    --strace-seconds) STRACE_S=$2; shift 2 ;;
    --compare-nginx) COMPARE=1; shift ;;
    --nginx-port) NG_PORT=$2; shift 2 ;;
    --nginx-pid) NG_PID=$2; shift 2 ;;
    --nginx-url) NG_URL=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "validate-no-reclaim.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
[[ $SECONDS_N =~ ^[0-9]+$ && $STRACE_S =~ ^[0-9]+$ ]] || { echo "--seconds/--strace-seconds want integers" >&2; exit 2; }
url_port() { local hp=${1#*://}; hp=${hp%%/*}; [[ $hp == *:* ]] && echo "${hp##*:}" || echo 80; }
[[ -z $PORT && -n $URL ]] && PORT=$(url_port "$URL")
: "${PORT:=8080}"
if ((COMPARE)) && [[ -z $NG_URL && -n $URL ]]; then
  path=/${URL#*://*/}
  NG_URL="http://127.0.0.1:$NG_PORT$path"
fi

# ------------------------------------------------------------------ tools and processes
need=()
command -v perf >/dev/null || need+=(linux-perf)
command -v strace >/dev/null || need+=(strace)
[[ -n $URL ]] && ! command -v wrk >/dev/null && need+=(wrk)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || { echo "missing ${need[*]} (install them, or run as root)" >&2; exit 2; }
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2 || { echo "cannot install ${need[*]}" >&2; exit 2; }
fi

# listener_pid PORT: the process serving PORT; of a parent and child that both hold the
# listener (nginx master + worker), the child.
listener_pid() {
  local pids p pick=''
  pids=$(ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u)
  for p in $pids; do
    [[ -z $pick ]] && pick=$p
    if grep -qx "$(ps -o ppid= -p "$p" | tr -d ' ')" <<<"$pids"; then pick=$p; fi
  done
  echo "$pick"
}
[[ -n $PID ]] || PID=$(listener_pid "$PORT")
if [[ -z $PID ]] || ! kill -0 "$PID" 2>/dev/null; then
  echo "no server process (port $PORT, pid '$PID')" >&2
  exit 2
fi
if ((COMPARE)); then
  [[ -n $NG_PID ]] || NG_PID=$(listener_pid "$NG_PORT")
  [[ -n $NG_PID ]] || { echo "--compare-nginx: nothing listens on port $NG_PORT" >&2; exit 2; }
  [[ -n $NG_URL ]] || { echo "--compare-nginx needs --url or --nginx-url" >&2; exit 2; }
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/validate-no-reclaim.XXXXXX")
declare -A LIVE=()
cleanup() {
  local rc=$? pg
  trap - EXIT INT TERM
  for pg in "${!LIVE[@]}"; do
    kill -TERM -- "-$pg" 2>/dev/null
    sleep 0.2
    kill -KILL -- "-$pg" 2>/dev/null
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_load() { # start_load URL SECONDS OUTFILE: wrk in its own process group; sets LOAD_PID
  local pin=()
  [[ -n $CLIENT_CPUS ]] && pin=(taskset -c "$CLIENT_CPUS")
  setsid "${pin[@]}" wrk -t1 -c"$CONNS" -d"${2}s" --timeout 600s -s "$HERE/wrk-summary.lua" "$1" >"$3" 2>&1 </dev/null &
  LOAD_PID=$!
  LIVE[$LOAD_PID]=1
}
end_load() { wait "$LOAD_PID" || true; unset "LIVE[$LOAD_PID]"; }
tx_bytes() { cat /sys/class/net/*/statistics/tx_bytes 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }

# ------------------------------------------------------------------ 1: reclaim counters + profile
names=(pgscan_direct allocstall pgscan_kswapd pgsteal_direct)
declare -A before=() after=()
if [[ -n $URL ]]; then
  log "load: wrk -c$CONNS $URL for $((SECONDS_N + 2)) s"
  start_load "$URL" $((SECONDS_N + 2)) "$WORK/wrk-profile.txt"
  sleep 1
else
  log "no --url: assuming a bulk load is already running against port $PORT"
fi
for n in "${names[@]}"; do before[$n]=$(vmstat_get "$n"); done
log "perf record -e cpu-clock -a -g for $SECONDS_N s"
perf record -q -e cpu-clock -a -g -o "$WORK/perf.data" -- sleep "$SECONDS_N" >/dev/null 2>"$WORK/perf-record.err" ||
  { cat "$WORK/perf-record.err" >&2; echo "perf record failed" >&2; exit 2; }
for n in "${names[@]}"; do after[$n]=$(vmstat_get "$n"); done
[[ -n $URL ]] && end_load

perf report -i "$WORK/perf.data" --stdio --no-children --sort comm,sym -g none --percent-limit 0 \
  >"$WORK/self.txt" 2>/dev/null || true
perf report -i "$WORK/perf.data" --stdio --children --sort sym -g none --percent-limit 0 \
  >"$WORK/children.txt" 2>/dev/null || true
perf report -i "$WORK/perf.data" --stdio --no-children --sort comm -g none \
  >"$WORK/comms.txt" 2>/dev/null || true
reclaim_re='shrink_|reclaim'
# self.txt lines: "PCT  COMM...  [k]|[.]  SYMBOL...". Kernel samples = [k] samples outside the
# idle task (swapper), so an idle machine does not dilute the reclaim share.
awk -v re="$reclaim_re" '
  $1 ~ /%$/ {
    for (i = 2; i <= NF && $i != "[k]" && $i != "[.]"; i++) ;
    if (i > NF) next
    comm = $2; for (j = 3; j < i; j++) comm = comm " " $j
    sym = $(i + 1); p = $1; sub(/%/, "", p)
    if ($i == "[k]" && comm != "swapper") { k += p; ksym[sym] += p; if (sym ~ re) r += p }
  }
  END {
    printf "%.3f %.3f\n", k, r > "/dev/stderr"
    for (s in ksym) printf "%.2f %s\n", ksym[s], s
  }' "$WORK/self.txt" 2>"$WORK/kernel-share.txt" | sort -rn >"$WORK/kernel-syms.txt"
read -r kernel_pct reclaim_self_pct <"$WORK/kernel-share.txt"
read -r reclaim_incl_pct reclaim_incl_sym < <(awk -v re="$reclaim_re" '
  $1 ~ /%$/ && $3 == "[k]" && $4 ~ re { p = $1; sub(/%/, "", p); if (p + 0 > m) { m = p + 0; s = $4 } }
  END { printf "%.3f %s\n", m, (s == "" ? "-" : s) }' "$WORK/children.txt")
share() { awk -v a="$1" -v k="$kernel_pct" 'BEGIN { printf "%.2f", (k > 0 ? 100 * a / k : 0) }'; }
self_share=$(share "$reclaim_self_pct")
incl_share=$(share "$reclaim_incl_pct")

echo "== reclaim counters over ${SECONDS_N} s (/proc/vmstat, system-wide)"
for n in "${names[@]}"; do printf '  %-16s +%s\n' "$n" $((after[$n] - before[$n])); done
echo "== kernel profile (perf record -e cpu-clock -a -g, ${SECONDS_N} s)"
echo "  samples by command: $(awk '$1 ~ /%$/ && n++ < 6 { printf "%s%s %s", (n > 1 ? ", " : ""), $2, $1 }' "$WORK/comms.txt")"
echo "  kernel time outside the idle task: ${kernel_pct}% of all samples"
echo "  reclaim functions ($reclaim_re), self time: ${self_share}% of kernel samples"
echo "  largest inclusive reclaim function: $reclaim_incl_sym, ${incl_share}% of kernel samples"
echo "  top kernel symbols (self, % of all samples):"
awk 'n++ < 12 { printf "    %6.2f%%  %s\n", $1, $2 }' "$WORK/kernel-syms.txt"
perf report -i "$WORK/perf.data" --stdio --no-children --pid "$PID" --sort dso,sym -g none \
  >"$WORK/server.txt" 2>/dev/null || true
echo "  top symbols of the server (pid $PID, all its threads; self, % of all samples):"
awk '$1 ~ /%$/ && n++ < 12 { $1 = sprintf("    %7s ", $1); print }' "$WORK/server.txt"
if awk -v k="$kernel_pct" 'BEGIN { exit !(k < 1) }'; then
  echo "  WARNING: almost no kernel samples outside the idle task: was the load running?"
fi

verdict=PASS reasons=()
if ((after[pgscan_direct] > before[pgscan_direct])); then verdict=FAIL reasons+=("pgscan_direct grew by $((after[pgscan_direct] - before[pgscan_direct]))"); fi
if ((after[allocstall] > before[allocstall])); then verdict=FAIL reasons+=("allocstall grew by $((after[allocstall] - before[allocstall]))"); fi
if awk -v a="$self_share" -v b="$incl_share" 'BEGIN { exit !(a > 1 || b > 1) }'; then
  verdict=FAIL reasons+=("reclaim functions take ${self_share}% (self) / ${incl_share}% (inclusive, $reclaim_incl_sym) of kernel samples")
fi

# ------------------------------------------------------------------ 2: syscall mix per GiB
syscall_mix() { # syscall_mix NAME PID URL
  local name=$1 pid=$2 url=$3 bytes t0 src
  log "strace -c -f -p $pid ($name) for ${STRACE_S} s"
  setsid strace -c -f -p "$pid" -o "$WORK/strace-$name.txt" >/dev/null 2>"$WORK/strace-$name.err" </dev/null &
  local spid=$!
  LIVE[$spid]=1
  sleep 0.5
  if [[ -n $url ]]; then
    start_load "$url" "$STRACE_S" "$WORK/wrk-$name.txt"
    end_load
    bytes=$(sed -n 's/^wrk_bytes=//p' "$WORK/wrk-$name.txt")
    src="wrk received"
  else
    t0=$(tx_bytes)
    sleep "$STRACE_S"
    bytes=$(($(tx_bytes) - t0))
    src="approx: tx bytes of all interfaces"
  fi
  kill -INT "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  unset "LIVE[$spid]"
  : "${bytes:=0}"
  echo "== syscall mix: $name (pid $pid), ${STRACE_S} s under load, $bytes bytes sent ($src)"
  echo "   (strace slows every syscall down: compare the counts per GiB, not the speed)"
  awk -v b="$bytes" '
    $1 ~ /^[0-9.]+$/ && NF >= 5 { calls = $4; name = $NF; if (calls !~ /^[0-9]+$/) next
      n[name] = calls; order[++k] = name }
    END {
      gib = b / 1073741824
      printf "   %-18s %10s %14s\n", "syscall", "calls", "per GiB sent"
      for (i = 1; i <= k && i <= 12; i++) printf "   %-18s %10d %14s\n", order[i], n[order[i]], (gib > 0 ? sprintf("%.0f", n[order[i]] / gib) : "n/a")
    }' "$WORK/strace-$name.txt"
  awk -v b="$bytes" -v who="$name" '
    $1 ~ /^[0-9.]+$/ && NF >= 5 && $4 ~ /^[0-9]+$/ { n[$NF] = $4 }
    END {
      gib = b / 1073741824; if (gib <= 0) exit
      line = ""
      split("io_uring_enter sendfile pread64 preadv writev sendmsg write epoll_wait", want, " ")
      for (i = 1; i <= 8; i++) if (want[i] in n) line = line sprintf(" %s=%.0f", want[i], n[want[i]] / gib)
      print "   per GiB:" (line == "" ? " (none of io_uring_enter/sendfile/pread64/writev seen)" : line)
    }' "$WORK/strace-$name.txt"
}
syscall_mix shardline "$PID" "$URL"
if ((COMPARE)); then syscall_mix nginx "$NG_PID" "$NG_URL"; fi

echo "== RESULT: $verdict"
for r in "${reasons[@]}"; do echo "   - $r"; done
echo "   (files: $WORK)"
[[ $verdict == PASS ]]
