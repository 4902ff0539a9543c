#!/usr/bin/env bash
# Applies the field report's kernel settings for a shardline edge (the values `shardline doctor`
# recommends; keep src/doctor/sysctl.rs in step). Dry run by default: prints `key: current -> new`
# or `key: ok`. Never lowers a value that is already bigger than recommended. Idempotent.
#
#   scripts/tune-host.sh [--apply] [--persist] [--iface NAME]...
#
#   --apply       write the values (the /proc/sys files, which is what `sysctl -w` does)
#   --persist     also write the sysctl.d file (printed as a hint otherwise)
#   --iface NAME  also raise NAME's txqueuelen to 10000 (repeatable)
#
# Environment (for tests on fixture copies): PROC_ROOT (default /proc), SYS_ROOT (default /sys),
# SYSCTL_CONF (default /etc/sysctl.d/90-shardline.conf).
set -euo pipefail

PROC_ROOT=${PROC_ROOT:-/proc}
SYS_ROOT=${SYS_ROOT:-/sys}
SYSCTL_CONF=${SYSCTL_CONF:-/etc/sysctl.d/90-shardline.conf}
TXQUEUELEN_MIN=10000

# key mode target; mode: min (at least), exact, wmem (min default max: raise default and max).
SETTINGS=(
  "net.core.wmem_max min 16777216"
  "net.core.rmem_max min 16777216"
  "net.ipv4.tcp_wmem wmem 4096 1048576 16777216"
  "net.core.somaxconn min 65535"
  "net.core.netdev_max_backlog min 300000"
  "net.ipv4.tcp_congestion_control exact bbr"
  "net.ipv4.tcp_slow_start_after_idle exact 0"
  "net.ipv4.tcp_notsent_lowat exact 16384"
)

apply=0
persist=0
ifaces=()
while [ $# -gt 0 ]; do
  case "$1" in
    --apply) apply=1 ;;
    --persist) persist=1 ;;
    --iface)
      [ $# -ge 2 ] || { echo "--iface needs a name" >&2; exit 2; }
      ifaces+=("$2"); shift ;;
    --iface=*) ifaces+=("${1#--iface=}") ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
max() { if is_uint "$1" && [ "$1" -ge "$2" ]; then echo "$1"; else echo "$2"; fi; }
# Reads a file with whitespace squeezed to single spaces (tcp_wmem uses tabs).
read_value() { tr -s ' \t\n' '   ' <"$1" | sed 's/^ *//; s/ *$//'; }

failed=0
conf_lines=()

# Prints and, with --apply, writes one value. $1 label, $2 file, $3 current, $4 wanted.
settle() {
  local label=$1 file=$2 current=$3 wanted=$4
  if [ "$current" = "$wanted" ]; then
    echo "$label: ok ($current)"
    return
  fi
  if [ $apply -eq 0 ]; then
    echo "$label: $current -> $wanted"
    return
  fi
  if printf '%s\n' "$wanted" >"$file" 2>/dev/null; then
    echo "$label: $current -> $wanted (applied)"
  else
    echo "$label: $current -> $wanted (FAILED to write $file: need root?)"
    failed=1
  fi
}

for entry in "${SETTINGS[@]}"; do
  read -r key mode target <<<"$entry"
  file="$PROC_ROOT/sys/${key//.//}"
  if [ ! -r "$file" ]; then
    echo "$key: not present under $PROC_ROOT (skipped)"
    continue
  fi
  current=$(read_value "$file")
  case "$mode" in
    min) wanted=$(max "$current" "$target") ;;
    exact) wanted=$target ;;
    wmem)
      read -r t_min t_default t_max <<<"$target"
      read -r c_min c_default c_max <<<"$current"
      is_uint "${c_min:-}" || c_min=$t_min
      wanted="$c_min $(max "${c_default:-}" "$t_default") $(max "${c_max:-}" "$t_max")" ;;
  esac
  if [ "$key" = net.ipv4.tcp_congestion_control ] && [ "$current" != "$wanted" ]; then
    avail="$PROC_ROOT/sys/net/ipv4/tcp_available_congestion_control"
    if [ -r "$avail" ] && ! grep -qw bbr "$avail"; then
      # Writing the name makes the kernel load tcp_bbr (CAP_NET_ADMIN); say so up front.
      echo "$key: note: bbr not loaded yet; the write loads tcp_bbr (or run: modprobe tcp_bbr)"
    fi
  fi
  settle "$key" "$file" "$current" "$wanted"
  conf_lines+=("$key = $wanted")
done

for iface in "${ifaces[@]}"; do
  file="$SYS_ROOT/class/net/$iface/tx_queue_len"
  if [ ! -r "$file" ]; then
    echo "txqueuelen $iface: no such interface under $SYS_ROOT (skipped)"
    failed=1
    continue
  fi
  current=$(read_value "$file")
  # Same effect as `ip link set dev $iface txqueuelen N`, and works on a fixture copy.
  settle "txqueuelen $iface" "$file" "$current" "$(max "$current" "$TXQUEUELEN_MIN")"
done

conf=$(
  echo "# shardline: kernel settings from the field report (scripts/tune-host.sh)"
  printf '%s\n' "${conf_lines[@]}"
)
if [ $persist -eq 1 ]; then
  if [ -f "$SYSCTL_CONF" ] && [ "$(cat "$SYSCTL_CONF")" = "$conf" ]; then
    echo "persist: $SYSCTL_CONF unchanged"
  elif mkdir -p "$(dirname "$SYSCTL_CONF")" && printf '%s\n' "$conf" >"$SYSCTL_CONF"; then
    echo "persist: wrote $SYSCTL_CONF"
  else
    echo "persist: FAILED to write $SYSCTL_CONF"
    failed=1
  fi
else
  echo
  echo "To keep these across reboots, write $SYSCTL_CONF (or rerun with --persist):"
  printf '%s\n' "$conf" | sed 's/^/    /'
fi
if [ ${#ifaces[@]} -gt 0 ]; then
  echo "txqueuelen is not a sysctl: persist it in the interface's network config or a udev rule, e.g."
  for iface in "${ifaces[@]}"; do
    echo "    ACTION==\"add\", SUBSYSTEM==\"net\", KERNEL==\"$iface\", ATTR{tx_queue_len}=\"$TXQUEUELEN_MIN\""
  done
fi
if [ $apply -eq 0 ]; then
  echo "(dry run: nothing changed; rerun with --apply)"
fi
exit $failed
