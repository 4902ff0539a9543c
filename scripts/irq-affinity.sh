#!/usr/bin/env bash
# irq-affinity.sh IFACE [--apply] [--cpus LIST]
#
# Pins each RX/TX queue IRQ of IFACE to one shard CPU and sets matching XPS (transmit packet
# steering), so a connection's packets are received, processed and answered on the core whose
# shard owns it. Queue k goes to the k-th shard CPU modulo the number of shard CPUs, the same
# convention `shardline plan` prints.
#
# Dry run by default: prints `file: current -> new` for every file it would write. --apply
# writes them; running it again changes nothing and says so.
#
# Shard CPUs, first match wins:
#   --cpus LIST                          e.g. --cpus 0-3,8
#   `shardline plan --json --nic IFACE`  when a shardline binary is found ($SHARDLINE or PATH);
#                                        pass the server's CPU flags in $SHARDLINE_PLAN_ARGS,
#                                        e.g. SHARDLINE_PLAN_ARGS="--cpus nic-local"
#   every online CPU
#
# irqbalance: a daemon that moves IRQs between CPUs every 10 s to even out load. It knows
# nothing of shards and will overwrite what this script writes. Either stop it
# (systemctl disable --now irqbalance) or tell it to leave these IRQs alone
# (IRQBALANCE_ARGS="--banirq=N ..." in /etc/default/irqbalance or /etc/sysconfig/irqbalance);
# the script prints the exact arguments when it finds irqbalance running.
#
# Environment: SYSFS_ROOT (default /sys) and PROC_ROOT (default /proc) let the tests run it on
# fixture trees.
set -euo pipefail

SYSFS_ROOT=${SYSFS_ROOT:-/sys}
PROC_ROOT=${PROC_ROOT:-/proc}

usage() {
    echo "usage: $0 IFACE [--apply] [--cpus LIST]" >&2
    exit 2
}

die() {
    echo "irq-affinity: $*" >&2
    exit 1
}

iface=""
apply=0
cpus_arg=""
while [ $# -gt 0 ]; do
    case "$1" in
    --apply) apply=1 ;;
    --cpus)
        [ $# -ge 2 ] || usage
        cpus_arg=$2
        shift
        ;;
    --cpus=*) cpus_arg=${1#--cpus=} ;;
    -h | --help) usage ;;
    -*) usage ;;
    *)
        [ -z "$iface" ] || usage
        iface=$1
        ;;
    esac
    shift
done
[ -n "$iface" ] || usage

net_dir="$SYSFS_ROOT/class/net/$iface"
[ -d "$net_dir" ] || die "no interface $iface under $SYSFS_ROOT/class/net"

# expand_cpulist "0-2,5" -> "0 1 2 5"; dies on malformed input.
expand_cpulist() {
    local list=$1 part first last cpu out=()
    list=${list//[[:space:]]/}
    [ -n "$list" ] || return 0
    IFS=, read -r -a parts <<<"$list"
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
            first=$((10#${BASH_REMATCH[1]}))
            last=$((10#${BASH_REMATCH[2]}))
        elif [[ $part =~ ^[0-9]+$ ]]; then
            first=$((10#$part))
            last=$first
        else
            die "malformed CPU list '$1'"
        fi
        [ "$first" -le "$last" ] || die "reversed range '$part' in CPU list '$1'"
        for ((cpu = first; cpu <= last; cpu++)); do out+=("$cpu"); done
    done
    echo "${out[@]}"
}

# compress_cpulist "5 0 1 2" -> "0-2,5" (sorted, deduplicated; the kernel's own format).
compress_cpulist() {
    local sorted first="" prev="" cpu result=""
    sorted=$(printf '%s\n' "$@" | sort -n -u)
    for cpu in $sorted; do
        if [ -z "$first" ]; then
            first=$cpu
        elif [ "$cpu" -ne $((prev + 1)) ]; then
            result+="${result:+,}$([ "$first" = "$prev" ] && echo "$first" || echo "$first-$prev")"
            first=$cpu
        fi
        prev=$cpu
    done
    if [ -n "$first" ]; then
        result+="${result:+,}$([ "$first" = "$prev" ] && echo "$first" || echo "$first-$prev")"
    fi
    echo "$result"
}

# mask_to_cpus "00000000,000000f0" -> "4 5 6 7"; hex digit by digit so any width works.
mask_to_cpus() {
    local hex=${1//,/} out=() i digit value bit pos=0
    hex=${hex//[[:space:]]/}
    [[ $hex =~ ^[0-9a-fA-F]*$ ]] || die "malformed CPU mask '$1'"
    for ((i = ${#hex} - 1; i >= 0; i--)); do
        digit=${hex:i:1}
        value=$((16#$digit))
        for bit in 0 1 2 3; do
            if (((value >> bit) & 1)); then out+=($((pos * 4 + bit))); fi
        done
        pos=$((pos + 1))
    done
    echo "${out[@]}"
}

# cpus_to_mask "4 5 6 7" -> "f0"; 32-bit groups separated by commas, as the kernel prints them.
cpus_to_mask() {
    local nibbles=() cpu max=0 i result="" digits=0
    for cpu in "$@"; do [ "$cpu" -gt "$max" ] && max=$cpu; done
    for ((i = 0; i <= max / 4; i++)); do nibbles[i]=0; done
    for cpu in "$@"; do nibbles[cpu / 4]=$((nibbles[cpu / 4] | (1 << (cpu % 4)))); done
    for ((i = 0; i <= max / 4; i++)); do
        if [ "$digits" -gt 0 ] && [ $((digits % 8)) -eq 0 ]; then result=",$result"; fi
        result="$(printf '%x' "${nibbles[i]}")$result"
        digits=$((digits + 1))
    done
    echo "$result"
}

# --- shard CPUs ---------------------------------------------------------------------------
cpu_source=""
shard_cpus=()
if [ -n "$cpus_arg" ]; then
    expanded=$(expand_cpulist "$cpus_arg")
    read -r -a shard_cpus <<<"$expanded"
    cpu_source="--cpus"
fi
shardline_bin=${SHARDLINE:-shardline}
if [ ${#shard_cpus[@]} -eq 0 ] && command -v "$shardline_bin" >/dev/null 2>&1; then
    # The plan reads sysfs and procfs from one root; use it only when both roots share one.
    root=""
    if [ "$SYSFS_ROOT" = "/sys" ] && [ "$PROC_ROOT" = "/proc" ]; then
        root="/"
    elif [ "${SYSFS_ROOT%/sys}" = "${PROC_ROOT%/proc}" ] && [ "${SYSFS_ROOT%/sys}" != "$SYSFS_ROOT" ]; then
        root=${SYSFS_ROOT%/sys}
    fi
    if [ -n "$root" ]; then
        # shellcheck disable=SC2086 # SHARDLINE_PLAN_ARGS is a list of flags on purpose
        if plan_json=$("$shardline_bin" plan --json --root "$root" --nic "$iface" ${SHARDLINE_PLAN_ARGS:-}); then
            # serde_json pretty output: one `"cpu": N` per shard, in shard order.
            read -r -a shard_cpus <<<"$(printf '%s\n' "$plan_json" | sed -n 's/^ *"cpu": *\([0-9][0-9]*\),\{0,1\}$/\1/p' | tr '\n' ' ')"
            cpu_source="shardline plan"
        else
            echo "irq-affinity: shardline plan failed; falling back to all online CPUs" >&2
        fi
    fi
fi
if [ ${#shard_cpus[@]} -eq 0 ]; then
    online_file="$SYSFS_ROOT/devices/system/cpu/online"
    [ -r "$online_file" ] || die "cannot read $online_file; pass --cpus LIST"
    expanded=$(expand_cpulist "$(cat "$online_file")")
    read -r -a shard_cpus <<<"$expanded"
    cpu_source="online CPUs"
fi
shard_count=${#shard_cpus[@]}
[ "$shard_count" -gt 0 ] || die "no shard CPUs"
echo "shard CPUs ($cpu_source): $(compress_cpulist "${shard_cpus[@]}")"

# --- queue IRQs ---------------------------------------------------------------------------
# Vectors named after the interface (eth0-TxRx-3, eth0-rx-3, eth0-tx-3, eth0-3), or listed in
# device/msi_irqs and named by the PCI device (mlx5_comp3@pci:...). Prints "irq queue name".
msi_irqs=""
if [ -d "$net_dir/device/msi_irqs" ]; then
    msi_irqs=$(ls "$net_dir/device/msi_irqs")
fi
queue_irqs() {
    [ -r "$PROC_ROOT/interrupts" ] || return 0
    awk -v iface="$iface" -v msi="$msi_irqs" '
        BEGIN { n = split(msi, list, /[ \n]+/); for (i = 1; i <= n; i++) if (list[i] != "") is_msi[list[i]] = 1 }
        NR > 1 {
            label = $1; sub(/:$/, "", label)
            if (label !~ /^[0-9]+$/) next
            name = $NF; queue = ""
            prefix = iface "-"
            if (substr(name, 1, length(prefix)) == prefix) {
                rest = tolower(substr(name, length(prefix) + 1))
                sub(/^(txrx|rxtx|combined|rx|tx)-/, "", rest)
                if (rest ~ /^[0-9]+$/) queue = rest
            } else if (label in is_msi) {
                base = name; sub(/@.*/, "", base)
                if (match(base, /comp[0-9]+$/)) queue = substr(base, RSTART + 4)
            }
            if (queue != "") print label, queue + 0, name
        }' "$PROC_ROOT/interrupts"
}

changes=0
failures=0
unchanged=0

# set_file FILE CURRENT_NORMALIZED NEW_NORMALIZED NEW_RAW: report, and write under --apply.
set_file() {
    local file=$1 current=$2 new=$3 raw=$4 readback
    if [ "$current" = "$new" ]; then
        echo "$file: ${current:-none} (unchanged)"
        unchanged=$((unchanged + 1))
        return
    fi
    if [ "$raw" = "$new" ]; then
        echo "$file: ${current:-none} -> $new"
    else
        echo "$file: CPUs ${current:-none} -> $new (writes mask $raw)"
    fi
    changes=$((changes + 1))
    if [ "$apply" -eq 1 ]; then
        # Managed IRQs (kernel-chosen affinity) refuse writes with EIO: report, keep going.
        if ! printf '%s\n' "$raw" 2>/dev/null >"$file"; then
            echo "  failed to write $file (managed IRQ or read-only sysfs?)" >&2
            failures=$((failures + 1))
            return
        fi
        readback=$(cat "$file" 2>/dev/null || true)
        echo "  written; now $readback"
    fi
}

irq_lines=$(queue_irqs)
banned=()
if [ -z "$irq_lines" ]; then
    echo "no queue IRQs of $iface found in $PROC_ROOT/interrupts (virtio-net and some drivers name vectors differently); skipping IRQ affinity"
else
    while read -r irq queue name; do
        target=${shard_cpus[queue % shard_count]}
        file="$PROC_ROOT/irq/$irq/smp_affinity_list"
        banned+=("--banirq=$irq")
        if [ ! -e "$file" ]; then
            echo "$file: missing (IRQ $irq, $name); skipped"
            continue
        fi
        expanded=$(expand_cpulist "$(cat "$file")")
        # shellcheck disable=SC2086 # word splitting of CPU ids is intended
        current=$(compress_cpulist $expanded)
        echo "# IRQ $irq $name: queue $queue -> shard $((queue % shard_count)) on CPU $target"
        set_file "$file" "$current" "$target" "$target"
    done <<<"$irq_lines"
fi

# --- XPS ----------------------------------------------------------------------------------
# tx-q is used by the shard CPUs i with i mod (TX queues) == q, plus the CPU of shard q mod
# shards, so every shard CPU transmits on a queue and every queue has a CPU.
tx_queues=()
for dir in "$net_dir"/queues/tx-*; do
    [ -e "$dir" ] || continue
    tx_queues+=("${dir##*/tx-}")
done
if [ ${#tx_queues[@]} -gt 0 ]; then
    mapfile -t tx_queues < <(printf '%s\n' "${tx_queues[@]}" | sort -n)
fi
tx_count=${#tx_queues[@]}
for queue in "${tx_queues[@]}"; do
    file="$net_dir/queues/tx-$queue/xps_cpus"
    [ -e "$file" ] || continue
    want=("${shard_cpus[queue % shard_count]}")
    for ((i = 0; i < shard_count; i++)); do
        if [ $((i % tx_count)) -eq "$queue" ]; then want+=("${shard_cpus[i]}"); fi
    done
    expanded=$(mask_to_cpus "$(cat "$file")")
    # shellcheck disable=SC2086 # word splitting of CPU ids is intended
    current=$(compress_cpulist $expanded)
    new=$(compress_cpulist "${want[@]}")
    set_file "$file" "$current" "$new" "$(cpus_to_mask "${want[@]}")"
done

# --- irqbalance ---------------------------------------------------------------------------
for comm in "$PROC_ROOT"/[0-9]*/comm; do
    [ -r "$comm" ] || continue
    if [ "$(cat "$comm" 2>/dev/null)" = "irqbalance" ]; then
        pid=${comm%/comm}
        pid=${pid##*/}
        echo "warning: irqbalance is running (pid $pid): it moves IRQs every 10 s and will overwrite these settings." >&2
        echo "  stop it:              systemctl disable --now irqbalance" >&2
        if [ ${#banned[@]} -gt 0 ]; then
            echo "  or leave these alone: IRQBALANCE_ARGS=\"${banned[*]}\" (in /etc/default/irqbalance or /etc/sysconfig/irqbalance), then restart it" >&2
        fi
        break
    fi
done

# --- summary ------------------------------------------------------------------------------
if [ "$changes" -eq 0 ]; then
    echo "nothing to change: $unchanged files already match the shard CPUs"
elif [ "$apply" -eq 1 ]; then
    echo "applied $((changes - failures)) of $changes changes ($unchanged already matched)"
else
    echo "dry run: $changes files would change ($unchanged already match); rerun with --apply to write them"
fi
[ "$failures" -eq 0 ] || exit 1
