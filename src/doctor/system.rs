//! Process and CPU checks: RLIMIT_MEMLOCK against the registered arenas, transparent
//! hugepages, the CPU frequency governor and irqbalance. All read under the root path.

use super::host::Tree;
use super::{fmt_bytes, Check, DoctorContext, Status};

/// `CAP_IPC_LOCK` bit in the capability sets of `/proc/<pid>/status`.
const CAP_IPC_LOCK_BIT: u32 = 14;

/// Counts the CPUs in a sysfs cpulist (`0-3,6` -> 5); `None` when malformed.
pub fn cpulist_len(list: &str) -> Option<usize> {
    let mut count = 0usize;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse::<usize>().ok()?,
                hi.trim().parse::<usize>().ok()?,
            ),
            None => {
                let cpu = part.trim().parse::<usize>().ok()?;
                (cpu, cpu)
            }
        };
        count = count.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    (count > 0).then_some(count)
}

/// Online CPUs under the root, or this process's parallelism when sysfs does not say.
pub fn online_cpus(tree: &Tree) -> usize {
    tree.read("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|l| cpulist_len(&l))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A limit from `/proc/<pid>/limits`: `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Soft limit in bytes.
    pub soft: Option<u64>,
    /// Hard limit in bytes.
    pub hard: Option<u64>,
}

/// Parses the "Max locked memory" row of `/proc/<pid>/limits`.
pub fn parse_memlock(limits: &str) -> Option<Limit> {
    let row = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let mut fields = row.split_whitespace();
    let mut value = || -> Option<Option<u64>> {
        match fields.next()? {
            "unlimited" => Some(None),
            n => n.parse().ok().map(Some),
        }
    };
    let soft = value()?;
    let hard = value()?;
    Some(Limit { soft, hard })
}

/// Whether the `CapEff` line of `/proc/<pid>/status` holds CAP_IPC_LOCK.
pub fn has_ipc_lock(status: &str) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << CAP_IPC_LOCK_BIT) != 0)
}

fn limit_text(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".into(), fmt_bytes)
}

/// RLIMIT_MEMLOCK against `arena_bytes x shards`.
pub fn memlock(ctx: &DoctorContext) -> Check {
    let name = "rlimit.memlock";
    let need = ctx.arena_bytes.saturating_mul(ctx.shards as u64);
    let recommended = format!(
        ">= {} ({} arena x {} shards), unlimited, or CAP_IPC_LOCK",
        fmt_bytes(need),
        fmt_bytes(ctx.arena_bytes),
        ctx.shards
    );
    let why_base = "io_uring charges registered buffers to RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK (root usually does); a systemd unit's LimitMEMLOCK= applies to the service, not to this shell";
    let limit = ctx
        .tree
        .read("/proc/self/limits")
        .ok()
        .and_then(|t| parse_memlock(&t));
    let Some(limit) = limit else {
        return Check::new(
            name,
            Status::Warn,
            "cannot read Max locked memory from proc/self/limits",
            recommended,
            why_base,
        );
    };
    let ipc_lock = ctx
        .tree
        .read("/proc/self/status")
        .ok()
        .and_then(|s| has_ipc_lock(&s));
    let cap_text = match ipc_lock {
        Some(true) => "CAP_IPC_LOCK held",
        Some(false) => "no CAP_IPC_LOCK",
        None => "CAP_IPC_LOCK unknown",
    };
    let current = format!(
        "soft {}, hard {}; {cap_text}",
        limit_text(limit.soft),
        limit_text(limit.hard)
    );
    let enough = limit.soft.is_none_or(|soft| soft >= need);
    let status = if enough || ipc_lock == Some(true) {
        Status::Ok
    } else {
        Status::Fail
    };
    let why = if status == Status::Fail {
        "registering the arenas fails (ENOMEM) at start-up: raise the limit (LimitMEMLOCK=) or shrink --arena-bytes"
    } else {
        why_base
    };
    Check::new(name, status, current, recommended, why)
}

/// Transparent hugepages: `always` invites compaction stalls on a host also serving from page
/// cache; `madvise` lets the arena opt in.
pub fn transparent_hugepages(tree: &Tree) -> Check {
    let name = "thp.enabled";
    let recommended = "madvise (or never)";
    let Ok(text) = tree.read("/sys/kernel/mm/transparent_hugepage/enabled") else {
        return Check::new(
            name,
            Status::Ok,
            "not present",
            recommended,
            "kernel without THP",
        );
    };
    // The active choice is bracketed: "always [madvise] never".
    let active = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(text.as_str())
        .to_string();
    let (status, why) = match active.as_str() {
        "madvise" | "never" => (
            Status::Ok,
            "no surprise compaction or khugepaged stalls on the data path",
        ),
        "always" => (
            Status::Warn,
            "direct compaction and khugepaged stalls add latency spikes under memory pressure",
        ),
        _ => (Status::Warn, "unrecognised setting"),
    };
    Check::new(name, status, active, recommended, why)
}

/// CPU frequency governor across all CPUs.
pub fn cpu_governor(tree: &Tree) -> Check {
    let name = "cpu.governor";
    let recommended = "performance";
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let cpus = tree
        .list("/sys/devices/system/cpu")
        .into_iter()
        .filter(|n| {
            n.strip_prefix("cpu")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        });
    for cpu in cpus {
        if let Ok(g) = tree.read(&format!(
            "/sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor"
        )) {
            *counts.entry(g).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return Check::new(
            name,
            Status::Ok,
            "no cpufreq (VM or firmware-controlled)",
            recommended,
            "nothing to tune from the OS",
        );
    }
    let total: usize = counts.values().sum();
    let current: Vec<String> = counts
        .iter()
        .map(|(g, n)| format!("{g} on {n} of {total} CPUs"))
        .collect();
    let status = if counts.keys().all(|g| g == "performance") {
        Status::Ok
    } else {
        Status::Warn
    };
    Check::new(
        name,
        status,
        current.join(", "),
        recommended,
        "ramping frequency per burst adds latency and costs throughput on a busy loop",
    )
}

/// Whether irqbalance runs (any `proc/<pid>/comm` says so).
pub fn irqbalance(tree: &Tree) -> Check {
    let name = "irqbalance";
    let running = tree
        .list("/proc")
        .into_iter()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .any(|pid| {
            tree.read(&format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c == "irqbalance")
        });
    let recommended = "not running, NIC IRQs pinned to the shards' cores";
    if running {
        Check::new(
            name,
            Status::Warn,
            "running",
            recommended,
            "it moves NIC IRQs away from the cores that own the connections; stop it or ban the shard CPUs (IRQBALANCE_BANNED_CPULIST)",
        )
    } else {
        Check::new(
            name,
            Status::Ok,
            "not running",
            recommended,
            "IRQ placement stays where you pin it (check /proc/interrupts spreads over the shard CPUs)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(cpulist_len("0-3"), Some(4));
        assert_eq!(cpulist_len("0-3,6,8-9\n"), Some(7));
        assert_eq!(cpulist_len("0"), Some(1));
        assert_eq!(cpulist_len(""), None);
        assert_eq!(cpulist_len("3-1"), None);
        assert_eq!(cpulist_len("a-b"), None);
        assert_eq!(cpulist_len("0-18446744073709551615"), None);
    }

    #[test]
    fn memlock_rows() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(
            parse_memlock(text),
            Some(Limit {
                soft: Some(8 << 20),
                hard: Some(8 << 20)
            })
        );
        let unlimited = "Max locked memory         unlimited            unlimited            bytes";
        assert_eq!(
            parse_memlock(unlimited),
            Some(Limit {
                soft: None,
                hard: None
            })
        );
        assert_eq!(parse_memlock("Max locked memory  lots"), None);
        assert_eq!(parse_memlock(""), None);
    }

    #[test]
    fn capabilities() {
        assert_eq!(has_ipc_lock("CapEff:\t000001ffffffffff\n"), Some(true));
        assert_eq!(has_ipc_lock("CapEff:\t0000000000000000\n"), Some(false));
        assert_eq!(has_ipc_lock("CapEff:\tzz\n"), None);
        assert_eq!(has_ipc_lock("Name: x"), None);
    }
}
