//! The shard plan: which CPUs run shards, and which NIC queue / IRQ each shard should own.
//!
//! Pure function of a [`Topology`] and a [`PlanRequest`], so every choice and every refusal is
//! unit-tested against fixture trees. The plan never changes the host; it reports what does not
//! match (IRQ affinity, irqbalance, NUMA placement) as warnings, and `scripts/irq-affinity.sh`
//! is the tool that fixes IRQ affinity.
//!
//! Queue convention (shared with `scripts/irq-affinity.sh`): queue `k` belongs to shard
//! `k mod shards`. With exactly one queue per shard, shard `i` owns queue `i` alone.

use crate::topology::{format_cpulist, parse_cpulist, Nic, NicIrq, Topology};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;

/// Which CPUs may run shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuSelection {
    /// Every allowed, online CPU.
    All,
    /// The allowed CPUs in the NIC's `local_cpulist` (same NUMA node as the device).
    NicLocal,
    /// Exactly these CPUs (a cpulist such as `0-3,6`).
    List(Vec<usize>),
}

impl FromStr for CpuSelection {
    type Err = crate::topology::CpulistError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "all" => Ok(CpuSelection::All),
            "nic-local" => Ok(CpuSelection::NicLocal),
            list => {
                let cpus = parse_cpulist(list)?;
                if cpus.is_empty() {
                    return Err(crate::topology::CpulistError {
                        input: list.to_string(),
                        reason: "expected \"all\", \"nic-local\" or a CPU list like 0-3,6"
                            .to_string(),
                    });
                }
                Ok(CpuSelection::List(cpus))
            }
        }
    }
}

impl fmt::Display for CpuSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuSelection::All => f.write_str("all"),
            CpuSelection::NicLocal => f.write_str("nic-local"),
            CpuSelection::List(cpus) => f.write_str(&format_cpulist(cpus)),
        }
    }
}

/// What the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRequest {
    /// Candidate CPUs.
    pub cpus: CpuSelection,
    /// The NIC whose queues the shards should own.
    pub nic: Option<String>,
    /// Number of shards; `None` = one per chosen CPU.
    pub shards: Option<usize>,
    /// With SMT, use one hardware thread per physical core (default); `false` uses every thread.
    pub one_per_core: bool,
}

impl Default for PlanRequest {
    fn default() -> Self {
        PlanRequest {
            cpus: CpuSelection::All,
            nic: None,
            shards: None,
            one_per_core: true,
        }
    }
}

/// Where one shard runs and what it should own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardPlacement {
    /// Shard index; also its socket's index in the SO_REUSEPORT group.
    pub shard: usize,
    /// Logical CPU the shard thread is pinned to.
    pub cpu: usize,
    /// `core_id` of that CPU (unique within its package only).
    pub core: Option<usize>,
    /// Package (socket) of that CPU; with `core` it names the physical core.
    pub package: Option<usize>,
    /// NUMA node of that CPU: where the shard's memory should live.
    pub numa_node: Option<usize>,
    /// The NIC RX queue the shard owns first (`rx-3`); see the module doc for the convention.
    pub nic_queue: Option<String>,
    /// The IRQ of that queue, to be made affine to `cpu`.
    pub irq: Option<u32>,
}

/// The plan: one placement per shard, plus what the operator should fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardPlan {
    /// Placements, by shard index.
    pub shards: Vec<ShardPlacement>,
    /// Host settings that defeat the plan (IRQ affinity, irqbalance, NUMA), one line each.
    pub warnings: Vec<String>,
}

impl ShardPlan {
    /// The shard CPUs in shard order (what steering and pinning consume).
    pub fn cpus(&self) -> Vec<usize> {
        self.shards.iter().map(|shard| shard.cpu).collect()
    }
}

/// Why a plan is impossible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// A listed CPU exists and is online, but this process may not run on it.
    CpuNotAllowed {
        /// The CPU asked for.
        cpu: usize,
        /// What the process may use.
        allowed: Vec<usize>,
    },
    /// A listed CPU is not online (or does not exist).
    CpuNotOnline {
        /// The CPU asked for.
        cpu: usize,
        /// The online CPUs.
        online: Vec<usize>,
    },
    /// `--nic` names no physical interface.
    UnknownNic {
        /// The name asked for.
        name: String,
        /// The physical NICs found.
        known: Vec<String>,
    },
    /// `cpus = nic-local` without `nic`.
    NicLocalWithoutNic,
    /// The NIC reports no local CPUs and no NUMA node to derive them from.
    NicWithoutLocalCpus {
        /// The NIC.
        nic: String,
    },
    /// None of the NIC's local CPUs may be used by this process.
    NoNicLocalCpuAllowed {
        /// The NIC.
        nic: String,
        /// Its local CPUs.
        local: Vec<usize>,
        /// What the process may use.
        allowed: Vec<usize>,
    },
    /// No CPU is both online and allowed (or sysfs is not readable).
    NoUsableCpus,
    /// `shards = 0`.
    ZeroShards,
    /// More shards than selected CPUs.
    TooManyShards {
        /// Shards asked for.
        requested: usize,
        /// CPUs the selection yields.
        available: usize,
        /// Extra advice (e.g. `--smt`).
        hint: String,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::CpuNotAllowed { cpu, allowed } => write!(
                f,
                "CPU {cpu} is not allowed for this process (allowed: {})",
                format_cpulist(allowed)
            ),
            PlanError::CpuNotOnline { cpu, online } => write!(
                f,
                "CPU {cpu} is not online (online: {})",
                format_cpulist(online)
            ),
            PlanError::UnknownNic { name, known } => {
                if known.is_empty() {
                    write!(f, "NIC {name:?} not found: no physical NICs on this host")
                } else {
                    write!(f, "NIC {name:?} not found (physical NICs: {})", known.join(", "))
                }
            }
            PlanError::NicLocalWithoutNic => {
                f.write_str("cpus = nic-local needs a NIC: pass --nic IFACE")
            }
            PlanError::NicWithoutLocalCpus { nic } => write!(
                f,
                "NIC {nic} reports no local CPUs (device/local_cpulist) or NUMA node: use --cpus all or a CPU list"
            ),
            PlanError::NoNicLocalCpuAllowed {
                nic,
                local,
                allowed,
            } => write!(
                f,
                "none of NIC {nic}'s local CPUs ({}) is allowed for this process (allowed: {})",
                format_cpulist(local),
                format_cpulist(allowed)
            ),
            PlanError::NoUsableCpus => {
                f.write_str("no CPU is both online and allowed (is /sys readable?)")
            }
            PlanError::ZeroShards => f.write_str("shards = 0: at least one shard is needed"),
            PlanError::TooManyShards {
                requested,
                available,
                hint,
            } => write!(
                f,
                "{requested} shards requested but the CPU selection yields only {available}{hint}"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// Chooses shard CPUs and NIC queues for `req` on `topo`; refuses impossible plans.
pub fn plan(topo: &Topology, req: &PlanRequest) -> Result<ShardPlan, PlanError> {
    let nic = match &req.nic {
        Some(name) => Some(topo.nic(name).ok_or_else(|| PlanError::UnknownNic {
            name: name.clone(),
            known: topo.nics.iter().map(|nic| nic.name.clone()).collect(),
        })?),
        None => None,
    };
    let online: BTreeSet<usize> = topo.online_cpus.iter().copied().collect();
    let usable: Vec<usize> = topo
        .allowed_cpus
        .iter()
        .copied()
        .filter(|cpu| online.contains(cpu))
        .collect();
    let mut warnings = Vec::new();

    let (selected, thinned) = match &req.cpus {
        CpuSelection::All => {
            if usable.is_empty() {
                return Err(PlanError::NoUsableCpus);
            }
            thin_to_cores(topo, usable, req.one_per_core)
        }
        CpuSelection::NicLocal => {
            let nic = nic.ok_or(PlanError::NicLocalWithoutNic)?;
            let local = nic_local_cpus(topo, nic)?;
            let candidates: Vec<usize> = usable
                .iter()
                .copied()
                .filter(|cpu| local.contains(cpu))
                .collect();
            if candidates.is_empty() {
                return Err(PlanError::NoNicLocalCpuAllowed {
                    nic: nic.name.clone(),
                    local,
                    allowed: topo.allowed_cpus.clone(),
                });
            }
            thin_to_cores(topo, candidates, req.one_per_core)
        }
        CpuSelection::List(list) => {
            for &cpu in list {
                if !online.contains(&cpu) {
                    return Err(PlanError::CpuNotOnline {
                        cpu,
                        online: topo.online_cpus.clone(),
                    });
                }
                if !topo.allowed_cpus.contains(&cpu) {
                    return Err(PlanError::CpuNotAllowed {
                        cpu,
                        allowed: topo.allowed_cpus.clone(),
                    });
                }
            }
            // An explicit list is obeyed; sharing a core is worth a warning, not a refusal.
            if req.one_per_core {
                warn_shared_cores(topo, list, &mut warnings);
            }
            (list.clone(), false)
        }
    };

    let count = match req.shards {
        Some(0) => return Err(PlanError::ZeroShards),
        Some(requested) if requested > selected.len() => {
            let hint = if thinned {
                " (one per physical core; --smt uses every SMT thread)".to_string()
            } else {
                String::new()
            };
            return Err(PlanError::TooManyShards {
                requested,
                available: selected.len(),
                hint,
            });
        }
        Some(requested) => {
            if requested < selected.len() {
                if let CpuSelection::List(_) = req.cpus {
                    warnings.push(format!(
                        "{requested} shards for {} listed CPUs: CPUs {} stay unused",
                        selected.len(),
                        format_cpulist(&selected[requested..])
                    ));
                }
            }
            requested
        }
        None => selected.len(),
    };
    let cpus = &selected[..count];

    let queues = nic.map(queue_assignment).unwrap_or_default();
    let shards: Vec<ShardPlacement> = cpus
        .iter()
        .enumerate()
        .map(|(shard, &cpu)| {
            let info = topo.cpu(cpu);
            let owned = queues.get(shard);
            ShardPlacement {
                shard,
                cpu,
                core: info.and_then(|info| info.core_id),
                package: info.and_then(|info| info.package_id),
                numa_node: info.and_then(|info| info.numa_node),
                nic_queue: owned.map(|(queue, _)| format!("rx-{queue}")),
                irq: owned.and_then(|(_, irq)| irq.map(|irq| irq.irq)),
            }
        })
        .collect();

    if let Some(nic) = nic {
        nic_warnings(topo, nic, &shards, &queues, &mut warnings);
    }
    Ok(ShardPlan { shards, warnings })
}

/// Keeps the first hardware thread of each physical core when `one_per_core`; reports whether
/// anything was dropped (so errors can suggest `--smt`).
fn thin_to_cores(topo: &Topology, cpus: Vec<usize>, one_per_core: bool) -> (Vec<usize>, bool) {
    if !one_per_core {
        return (cpus, false);
    }
    let before = cpus.len();
    let mut seen = BTreeSet::new();
    let kept: Vec<usize> = cpus
        .into_iter()
        .filter(|&cpu| match topo.cpu(cpu) {
            Some(info) => seen.insert(info.core_key()),
            None => true,
        })
        .collect();
    let thinned = kept.len() < before;
    (kept, thinned)
}

fn warn_shared_cores(topo: &Topology, list: &[usize], warnings: &mut Vec<String>) {
    let mut by_core: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for &cpu in list {
        let Some(info) = topo.cpu(cpu) else { continue };
        let key = info.core_key();
        match by_core.iter_mut().find(|(k, _)| *k == key) {
            Some((_, cpus)) => cpus.push(cpu),
            None => by_core.push((key, vec![cpu])),
        }
    }
    for (_, cpus) in by_core.into_iter().filter(|(_, cpus)| cpus.len() > 1) {
        warnings.push(format!(
            "CPUs {} are SMT siblings of one physical core: their shards share its execution units (pass --smt to accept this silently)",
            format_cpulist(&cpus)
        ));
    }
}

fn nic_local_cpus(topo: &Topology, nic: &Nic) -> Result<Vec<usize>, PlanError> {
    if !nic.local_cpus.is_empty() {
        return Ok(nic.local_cpus.clone());
    }
    // Some drivers leave local_cpulist empty but report a node; the node's CPUs are as local.
    nic.numa_node
        .and_then(|node| topo.numa_nodes.iter().find(|n| n.id == node))
        .map(|node| node.cpus.clone())
        .filter(|cpus| !cpus.is_empty())
        .ok_or_else(|| PlanError::NicWithoutLocalCpus {
            nic: nic.name.clone(),
        })
}

/// RX queue indices of `nic` in order, each with the IRQ that serves it (when one was found).
fn queue_assignment(nic: &Nic) -> Vec<(usize, Option<&NicIrq>)> {
    let irqs = nic.rx_queue_irqs();
    if irqs.is_empty() {
        return nic.rx_queues.iter().map(|&queue| (queue, None)).collect();
    }
    let mut out: Vec<(usize, Option<&NicIrq>)> = Vec::new();
    for irq in irqs {
        let Some(queue) = irq.queue else { continue };
        // One IRQ per queue: the first (lowest) wins if a driver lists duplicates.
        if out.last().map(|(q, _)| *q) != Some(queue) {
            out.push((queue, Some(irq)));
        }
    }
    out
}

fn nic_warnings(
    topo: &Topology,
    nic: &Nic,
    shards: &[ShardPlacement],
    queues: &[(usize, Option<&NicIrq>)],
    warnings: &mut Vec<String>,
) {
    let name = &nic.name;
    let shard_count = shards.len();
    if topo.irqbalance_running {
        warnings.push(
            "irqbalance is running: it rewrites IRQ affinity every 10 s and will undo scripts/irq-affinity.sh; stop it (systemctl disable --now irqbalance) or exclude the queue IRQs (IRQBALANCE_ARGS=\"--banirq=N ...\")"
                .to_string(),
        );
    }
    let queue_irqs: Vec<&NicIrq> = nic.irqs.iter().filter(|irq| irq.queue.is_some()).collect();
    if queue_irqs.is_empty() {
        warnings.push(format!(
            "no queue IRQs of {name} found in /proc/interrupts (virtio or unusual driver naming): IRQ affinity cannot be checked"
        ));
    }
    if queues.len() > shard_count {
        warnings.push(format!(
            "{name} has {} RX queues for {shard_count} shards: queue k belongs to shard k mod {shard_count}; `ethtool -L {name} combined {shard_count}` gives each shard exactly one queue",
            queues.len()
        ));
    } else if !queues.is_empty() && queues.len() < shard_count {
        warnings.push(format!(
            "{name} has only {} RX queue(s) for {shard_count} shards: shard(s) {} own no queue, so no packets arrive on their CPUs and CPU steering sends them no connections; raise the queue count (`ethtool -L {name} combined {shard_count}`)",
            queues.len(),
            format_cpulist(&(queues.len()..shard_count).collect::<Vec<_>>())
        ));
    }
    // Every queue IRQ (TX-only vectors too) should fire on the CPU of the shard owning its queue.
    if shard_count > 0 {
        for irq in &queue_irqs {
            let (Some(queue), Some(affinity)) = (irq.queue, irq.affinity.as_ref()) else {
                continue;
            };
            let shard = queue % shard_count;
            let cpu = shards[shard].cpu;
            if affinity.as_slice() != [cpu] {
                warnings.push(format!(
                    "IRQ {} ({}) is affine to CPU {}, but its queue {queue} belongs to shard {shard} on CPU {cpu}: run scripts/irq-affinity.sh {name}",
                    irq.irq,
                    irq.name,
                    format_cpulist(affinity)
                ));
            }
        }
    }
    let Some(nic_node) = nic.numa_node else {
        return;
    };
    for irq in &queue_irqs {
        let Some(affinity) = irq.affinity.as_ref() else {
            continue;
        };
        let remote: Vec<usize> = affinity
            .iter()
            .copied()
            .filter(|&cpu| topo.numa_node_of(cpu).is_some_and(|node| node != nic_node))
            .collect();
        if !remote.is_empty() {
            warnings.push(format!(
                "IRQ {} ({}) may fire on CPUs {} outside {name}'s NUMA node {nic_node}: its packets cross the interconnect",
                irq.irq,
                irq.name,
                format_cpulist(&remote)
            ));
        }
    }
    let remote_shards: Vec<usize> = shards
        .iter()
        .filter(|shard| shard.numa_node.is_some_and(|node| node != nic_node))
        .map(|shard| shard.cpu)
        .collect();
    if !remote_shards.is_empty() {
        warnings.push(format!(
            "shard CPUs {} are not on {name}'s NUMA node {nic_node}: their packets cross the interconnect (--cpus nic-local keeps shards on the NIC's node)",
            format_cpulist(&remote_shards)
        ));
    }
}

fn dash<T: fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Human-readable plan: one row per shard (CPU, core, node, queue, IRQ and its current
/// affinity), then the warnings.
pub fn render_text(plan: &ShardPlan, topo: &Topology) -> String {
    let mut out = String::new();
    let cpus = plan.cpus();
    out.push_str(&format!(
        "{} shard(s) on CPUs {}\n",
        plan.shards.len(),
        format_cpulist(&cpus)
    ));
    let header = [
        "shard",
        "cpu",
        "package",
        "core",
        "node",
        "queue",
        "irq",
        "irq-affinity",
    ];
    let mut rows: Vec<[String; 8]> = vec![header.map(str::to_string)];
    for shard in &plan.shards {
        let affinity = shard.irq.and_then(|irq| {
            topo.nics
                .iter()
                .flat_map(|nic| nic.irqs.iter())
                .find(|nic_irq| nic_irq.irq == irq)
                .and_then(|nic_irq| nic_irq.affinity.as_ref())
                .map(|cpus| format_cpulist(cpus))
        });
        rows.push([
            shard.shard.to_string(),
            shard.cpu.to_string(),
            dash(shard.package),
            dash(shard.core),
            dash(shard.numa_node),
            dash(shard.nic_queue.as_deref()),
            dash(shard.irq),
            dash(affinity),
        ]);
    }
    let mut widths = [0usize; 8];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row.iter()) {
            *width = (*width).max(cell.len());
        }
    }
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths.iter())
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for warning in &plan.warnings {
        out.push_str("warning: ");
        out.push_str(warning);
        out.push('\n');
    }
    out
}

/// `shardline plan`: print the shard plan for this host (or a fixture root).
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Root of the sysfs/procfs tree to read ("/" on a real host, a fixture directory in tests).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// CPUs for shards: "all", "nic-local" (needs --nic) or a CPU list like "0-3,6".
    #[arg(long, default_value = "all")]
    pub cpus: CpuSelection,
    /// NIC whose RX queues the shards should own (e.g. eth0).
    #[arg(long)]
    pub nic: Option<String>,
    /// Number of shards (default: one per chosen CPU).
    #[arg(long)]
    pub shards: Option<usize>,
    /// Print the plan as JSON (for scripts/irq-affinity.sh and other tools).
    #[arg(long)]
    pub json: bool,
    /// Use every SMT thread instead of one per physical core.
    #[arg(long)]
    pub smt: bool,
    /// Read this host's topology through libhwloc instead of sysfs (NIC queues and IRQs still
    /// come from sysfs); needs a build with `--features hwloc`.
    #[arg(long, conflicts_with = "root")]
    pub hwloc: bool,
}

impl PlanArgs {
    /// The planner request these flags describe.
    pub fn request(&self) -> PlanRequest {
        PlanRequest {
            cpus: self.cpus.clone(),
            nic: self.nic.clone(),
            shards: self.shards,
            one_per_core: !self.smt,
        }
    }
}

/// Reads the topology and renders the plan `args` asks for; `Err` is the one-line message.
pub fn plan_cli_output(args: &PlanArgs) -> Result<String, String> {
    let mut topo = if args.hwloc {
        read_hwloc_topology()?
    } else {
        Topology::read(&args.root).map_err(|err| err.to_string())?
    };
    // Only the real root describes this process; a fixture's Cpus_allowed_list is the truth
    // for the fixture.
    if args.hwloc || args.root == Path::new("/") {
        topo.restrict_to_live_affinity()
            .map_err(|err| format!("sched_getaffinity: {err}"))?;
    }
    let plan = plan(&topo, &args.request()).map_err(|err| err.to_string())?;
    if args.json {
        let mut text = serde_json::to_string_pretty(&plan).map_err(|err| err.to_string())?;
        text.push('\n');
        Ok(text)
    } else {
        Ok(render_text(&plan, &topo))
    }
}

#[cfg(feature = "hwloc")]
fn read_hwloc_topology() -> Result<Topology, String> {
    crate::topology::read_with_hwloc().map_err(|err| err.to_string())
}

#[cfg(not(feature = "hwloc"))]
fn read_hwloc_topology() -> Result<Topology, String> {
    Err("--hwloc: shardline was built without the hwloc feature \
         (rebuild with `cargo build --features hwloc`, needs libhwloc-dev)"
        .to_string())
}

/// Runs `shardline plan`: prints the plan on stdout, or the error on stderr with exit status 1.
pub fn run_plan_cli(args: &PlanArgs) -> ExitCode {
    match plan_cli_output(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("shardline plan: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Topology {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/topology")
            .join(name);
        Topology::read(&root).unwrap()
    }

    fn request(cpus: &str, nic: Option<&str>, shards: Option<usize>) -> PlanRequest {
        PlanRequest {
            cpus: cpus.parse().unwrap(),
            nic: nic.map(str::to_string),
            shards,
            one_per_core: true,
        }
    }

    fn has_warning(plan: &ShardPlan, needle: &str) -> bool {
        plan.warnings.iter().any(|w| w.contains(needle))
    }

    #[test]
    fn cpu_selection_parses() {
        assert_eq!("all".parse::<CpuSelection>().unwrap(), CpuSelection::All);
        assert_eq!(
            "nic-local".parse::<CpuSelection>().unwrap(),
            CpuSelection::NicLocal
        );
        assert_eq!(
            "0-3,6".parse::<CpuSelection>().unwrap(),
            CpuSelection::List(vec![0, 1, 2, 3, 6])
        );
        assert!("".parse::<CpuSelection>().is_err());
        assert!("everything".parse::<CpuSelection>().is_err());
        assert_eq!(CpuSelection::List(vec![0, 1, 2, 3, 6]).to_string(), "0-3,6");
    }

    #[test]
    fn all_takes_one_thread_per_core_by_default() {
        let topo = fixture("two-socket-smt");
        let plan = plan(&topo, &PlanRequest::default()).unwrap();
        assert_eq!(plan.cpus(), (0..8).collect::<Vec<_>>());
        assert_eq!(plan.shards[5].package, Some(1));
        assert_eq!(plan.shards[5].core, Some(1));
        assert_eq!(plan.shards[5].numa_node, Some(1));
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);

        let req = PlanRequest {
            one_per_core: false,
            ..PlanRequest::default()
        };
        assert_eq!(plan_cpus(&topo, &req), (0..16).collect::<Vec<_>>());
    }

    fn plan_cpus(topo: &Topology, req: &PlanRequest) -> Vec<usize> {
        plan(topo, req).unwrap().cpus()
    }

    #[test]
    fn shard_count_takes_the_first_chosen_cpus() {
        let topo = fixture("two-socket-smt");
        assert_eq!(
            plan_cpus(&topo, &request("all", None, Some(3))),
            vec![0, 1, 2]
        );
        assert_eq!(
            plan_cpus(&topo, &request("nic-local", Some("ens1f0"), Some(2))),
            vec![4, 5]
        );
        let err = plan(&topo, &request("all", None, Some(9))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "9 shards requested but the CPU selection yields only 8 (one per physical core; --smt uses every SMT thread)"
        );
        assert_eq!(
            plan(&topo, &request("all", None, Some(0))).unwrap_err(),
            PlanError::ZeroShards
        );
        let plan = plan(&topo, &request("0-3", None, Some(2))).unwrap();
        assert_eq!(plan.cpus(), vec![0, 1]);
        assert!(
            has_warning(&plan, "CPUs 2-3 stay unused"),
            "{:?}",
            plan.warnings
        );
    }

    #[test]
    fn nic_local_on_two_sockets_picks_the_nic_node_and_flags_bad_irqs() {
        let topo = fixture("two-socket-smt");
        let plan = plan(&topo, &request("nic-local", Some("ens1f0"), None)).unwrap();
        assert_eq!(plan.cpus(), vec![4, 5, 6, 7]);
        let owned: Vec<(Option<&str>, Option<u32>)> = plan
            .shards
            .iter()
            .map(|s| (s.nic_queue.as_deref(), s.irq))
            .collect();
        assert_eq!(
            owned,
            vec![
                (Some("rx-0"), Some(91)),
                (Some("rx-1"), Some(92)),
                (Some("rx-2"), Some(93)),
                (Some("rx-3"), Some(94)),
            ]
        );
        assert!(plan.shards.iter().all(|s| s.numa_node == Some(1)));
        assert!(has_warning(&plan, "irqbalance is running"));
        assert!(
            has_warning(&plan, "IRQ 93 (mlx5_comp2@pci:0000:af:00.0) is affine to CPU 2, but its queue 2 belongs to shard 2 on CPU 6"),
            "{:?}",
            plan.warnings
        );
        assert!(has_warning(
            &plan,
            "IRQ 93 (mlx5_comp2@pci:0000:af:00.0) may fire on CPUs 2 outside ens1f0's NUMA node 1"
        ));
        assert_eq!(plan.warnings.len(), 3, "{:?}", plan.warnings);
    }

    #[test]
    fn all_cpus_with_a_remote_nic_warns_about_numa() {
        let topo = fixture("two-socket-smt");
        let plan = plan(&topo, &request("all", Some("ens1f0"), None)).unwrap();
        assert!(
            has_warning(&plan, "shard CPUs 0-3 are not on ens1f0's NUMA node 1"),
            "{:?}",
            plan.warnings
        );
        // 4 queues for 8 shards: shards 4-7 own none.
        assert!(
            has_warning(&plan, "shard(s) 4-7 own no queue"),
            "{:?}",
            plan.warnings
        );
        assert_eq!(plan.shards[4].nic_queue, None);
    }

    #[test]
    fn eight_queues_four_shards_wrap_and_flag_wrong_irqs() {
        let topo = fixture("nic-8-queues");
        let plan = plan(&topo, &request("nic-local", Some("eth0"), None)).unwrap();
        assert_eq!(plan.cpus(), vec![0, 1, 2, 3]);
        assert_eq!(
            plan.shards.iter().map(|s| s.irq).collect::<Vec<_>>(),
            vec![Some(40), Some(41), Some(42), Some(43)]
        );
        assert!(has_warning(&plan, "eth0 has 8 RX queues for 4 shards"));
        assert!(has_warning(
            &plan,
            "IRQ 41 (eth0-TxRx-1) is affine to CPU 5, but its queue 1 belongs to shard 1 on CPU 1"
        ));
        assert!(has_warning(
            &plan,
            "IRQ 42 (eth0-TxRx-2) is affine to CPU 0-7"
        ));
        assert!(has_warning(
            &plan,
            "IRQ 41 (eth0-TxRx-1) may fire on CPUs 5 outside eth0's NUMA node 0"
        ));
        assert!(has_warning(
            &plan,
            "IRQ 42 (eth0-TxRx-2) may fire on CPUs 4-7"
        ));
        // Queues 4-7 wrap onto shards 0-3, and their IRQs already point there: no warning.
        assert!(!plan
            .warnings
            .iter()
            .any(|w| w.contains("IRQ 44") || w.contains("IRQ 47")));
        assert!(!has_warning(&plan, "irqbalance"));
        assert_eq!(plan.warnings.len(), 5, "{:?}", plan.warnings);
    }

    #[test]
    fn explicit_list_is_obeyed_and_smt_sharing_warned() {
        let topo = fixture("two-socket-smt");
        let plan = plan(&topo, &request("0,8", None, None)).unwrap();
        assert_eq!(plan.cpus(), vec![0, 8]);
        assert!(
            has_warning(&plan, "CPUs 0,8 are SMT siblings"),
            "{:?}",
            plan.warnings
        );
        let mut req = request("0,8", None, None);
        req.one_per_core = false;
        assert!(super::plan(&topo, &req).unwrap().warnings.is_empty());
    }

    #[test]
    fn impossible_plans_are_refused_with_one_line_errors() {
        let vm = fixture("single-node");
        let cases: Vec<(PlanRequest, &str)> = vec![
            (
                request("3", None, None),
                "CPU 3 is not allowed for this process (allowed: 0-2)",
            ),
            (
                request("0,7", None, None),
                "CPU 7 is not online (online: 0-3)",
            ),
            (
                request("all", Some("eth9"), None),
                "NIC \"eth9\" not found (physical NICs: ens3)",
            ),
            (
                request("nic-local", None, None),
                "cpus = nic-local needs a NIC: pass --nic IFACE",
            ),
            (
                request("all", None, Some(4)),
                "4 shards requested but the CPU selection yields only 3",
            ),
        ];
        for (req, expected) in cases {
            let err = plan(&vm, &req).unwrap_err().to_string();
            assert_eq!(err, expected);
            assert!(!err.contains('\n'));
        }
        let mut empty = vm.clone();
        empty.allowed_cpus.clear();
        assert_eq!(
            plan(&empty, &PlanRequest::default()).unwrap_err(),
            PlanError::NoUsableCpus
        );
    }

    #[test]
    fn nic_local_without_local_cpus_uses_the_node_or_refuses() {
        let mut topo = fixture("nic-8-queues");
        topo.nics[0].local_cpus.clear();
        assert_eq!(
            plan_cpus(&topo, &request("nic-local", Some("eth0"), None)),
            vec![0, 1, 2, 3]
        );
        topo.nics[0].numa_node = None;
        assert_eq!(
            plan(&topo, &request("nic-local", Some("eth0"), None)).unwrap_err().to_string(),
            "NIC eth0 reports no local CPUs (device/local_cpulist) or NUMA node: use --cpus all or a CPU list"
        );
        let mut topo = fixture("nic-8-queues");
        topo.allowed_cpus = vec![4, 5];
        assert!(plan(&topo, &request("nic-local", Some("eth0"), None))
            .unwrap_err()
            .to_string()
            .starts_with("none of NIC eth0's local CPUs (0-3) is allowed"));
    }

    #[test]
    fn vm_nic_without_irqs_still_plans() {
        let vm = fixture("single-node");
        let plan = plan(&vm, &request("nic-local", Some("ens3"), None)).unwrap();
        assert_eq!(plan.cpus(), vec![0, 1, 2]);
        assert_eq!(plan.shards[1].nic_queue.as_deref(), Some("rx-1"));
        assert_eq!(plan.shards[1].irq, None);
        assert_eq!(plan.shards[2].nic_queue, None);
        assert!(has_warning(&plan, "no queue IRQs of ens3"));
        assert!(has_warning(
            &plan,
            "ens3 has only 2 RX queue(s) for 3 shards: shard(s) 2 own"
        ));
    }

    #[test]
    fn text_and_json_render() {
        let topo = fixture("nic-8-queues");
        let plan = plan(&topo, &request("nic-local", Some("eth0"), Some(2))).unwrap();
        let text = render_text(&plan, &topo);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "2 shard(s) on CPUs 0-1");
        assert_eq!(
            lines[1],
            "shard  cpu  package  core  node  queue  irq  irq-affinity"
        );
        assert_eq!(lines[2], "0      0    0        0     0     rx-0   40   0");
        assert_eq!(lines[3], "1      1    0        1     0     rx-1   41   5");
        assert!(lines[4].starts_with("warning: "));

        let json: serde_json::Value = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["shards"][1]["cpu"], 1);
        assert_eq!(json["shards"][1]["irq"], 41);
        assert_eq!(json["shards"][1]["nic_queue"], "rx-1");
        assert!(json["warnings"].as_array().unwrap().len() >= 2);
    }

    #[test]
    fn cli_output_on_fixture_root() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            plan: PlanArgs,
        }
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topology/nic-8-queues");
        let root = root.to_str().unwrap();
        let cli = Cli::parse_from([
            "shardline",
            "--root",
            root,
            "--cpus",
            "nic-local",
            "--nic",
            "eth0",
            "--json",
        ]);
        let out = plan_cli_output(&cli.plan).unwrap();
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(json["shards"].as_array().unwrap().len(), 4);

        let cli = Cli::parse_from(["shardline", "--root", root, "--cpus", "9"]);
        assert_eq!(
            plan_cli_output(&cli.plan).unwrap_err(),
            "CPU 9 is not online (online: 0-7)"
        );
        assert!(Cli::try_parse_from(["shardline", "--cpus", "x"]).is_err());

        assert!(Cli::try_parse_from(["shardline", "--hwloc", "--root", root]).is_err());
        let cli = Cli::parse_from(["shardline", "--hwloc", "--cpus", "all"]);
        let hwloc = plan_cli_output(&cli.plan);
        #[cfg(not(feature = "hwloc"))]
        assert_eq!(
            hwloc.unwrap_err(),
            "--hwloc: shardline was built without the hwloc feature \
             (rebuild with `cargo build --features hwloc`, needs libhwloc-dev)"
        );
        #[cfg(feature = "hwloc")]
        assert!(hwloc.unwrap().contains("shard(s) on CPUs"));

        let cli = Cli::parse_from(["shardline", "--root", "/definitely/not/here", "--smt"]);
        assert!(!cli.plan.request().one_per_core);
        assert!(plan_cli_output(&cli.plan)
            .unwrap_err()
            .contains("no CPU is both online and allowed"));
    }
}
