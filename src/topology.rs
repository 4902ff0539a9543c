//! Host topology as plain data: CPUs, cores, SMT siblings, NUMA nodes, NICs with their queues and
//! IRQs, read from sysfs/procfs beneath a root path.
//!
//! Everything is read from files under `root` (`/` on a real host) so tests can point the reader
//! at fixture trees in `tests/fixtures/topology/`. The only thing that cannot come from a file
//! tree is the live process's affinity mask; it is a separate call
//! ([`Topology::restrict_to_live_affinity`]) so fixture reads stay deterministic.
//!
//! Missing files degrade to empty lists / `None` (containers and VMs hide much of sysfs); a file
//! that exists but cannot be parsed is an error naming the file, because silently planning on
//! garbage would pin shards to the wrong CPUs.

use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

#[cfg(feature = "hwloc")]
mod hwloc;
#[cfg(feature = "hwloc")]
pub use hwloc::read_with_hwloc;

/// Highest CPU id a cpulist may name; the kernel's NR_CPUS tops out at 8192, this leaves room
/// while refusing lists like `0-4000000000` that would allocate gigabytes.
pub const CPU_ID_MAX: usize = 65_535;

/// Why a cpulist string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpulistError {
    /// The offending input, trimmed.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for CpulistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid cpulist {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for CpulistError {}

/// Parses a kernel cpulist (`0-3,8,10-11`, empty = no CPUs) into sorted, deduplicated CPU ids.
pub fn parse_cpulist(input: &str) -> Result<Vec<usize>, CpulistError> {
    let trimmed = input.trim();
    let error = |reason: String| CpulistError {
        input: trimmed.to_string(),
        reason,
    };
    let mut cpus = BTreeSet::new();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    for part in trimmed.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(error("empty element".to_string()));
        }
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (
                parse_cpu_id(a).map_err(&error)?,
                parse_cpu_id(b).map_err(&error)?,
            ),
            None => {
                let cpu = parse_cpu_id(part).map_err(&error)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(error(format!("range {part} is reversed")));
        }
        cpus.extend(first..=last);
    }
    Ok(cpus.into_iter().collect())
}

fn parse_cpu_id(text: &str) -> Result<usize, String> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} is not a CPU number"));
    }
    match text.parse::<usize>() {
        Ok(cpu) if cpu <= CPU_ID_MAX => Ok(cpu),
        _ => Err(format!("CPU {text} is above the limit {CPU_ID_MAX}")),
    }
}

/// Formats CPU ids as a compact kernel cpulist (`[0,1,2,3,8]` -> `0-3,8`); input need not be sorted.
pub fn format_cpulist(cpus: &[usize]) -> String {
    let set: BTreeSet<usize> = cpus.iter().copied().collect();
    let mut out = String::new();
    let mut iter = set.into_iter().peekable();
    while let Some(first) = iter.next() {
        let mut last = first;
        while iter.peek() == Some(&(last + 1)) {
            last += 1;
            iter.next();
        }
        if !out.is_empty() {
            out.push(',');
        }
        if first == last {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
    }
    out
}

/// A topology read failure; names the file involved (hwloc failures name the hwloc step).
#[derive(Debug)]
pub struct TopologyError {
    /// The file (beneath the root) that could not be read or parsed; empty for hwloc failures.
    pub path: PathBuf,
    /// What went wrong.
    pub kind: TopologyErrorKind,
}

/// What went wrong with a topology file.
#[derive(Debug)]
pub enum TopologyErrorKind {
    /// The file exists but reading it failed (permissions, I/O error).
    Io(io::Error),
    /// The file's contents are not what the kernel writes there.
    Malformed(String),
    /// libhwloc failed to build the topology (`hwloc` feature).
    #[cfg(feature = "hwloc")]
    Hwloc(String),
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            TopologyErrorKind::Io(err) => write!(f, "{}: {err}", self.path.display()),
            TopologyErrorKind::Malformed(msg) => {
                write!(f, "{}: malformed: {msg}", self.path.display())
            }
            #[cfg(feature = "hwloc")]
            TopologyErrorKind::Hwloc(msg) => write!(f, "hwloc: {msg}"),
        }
    }
}

impl std::error::Error for TopologyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TopologyErrorKind::Io(err) => Some(err),
            TopologyErrorKind::Malformed(_) => None,
            #[cfg(feature = "hwloc")]
            TopologyErrorKind::Hwloc(_) => None,
        }
    }
}

/// One logical CPU (hardware thread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// Logical CPU id (`cpuN`).
    pub id: usize,
    /// `topology/core_id`: unique only within a package.
    pub core_id: Option<usize>,
    /// `topology/physical_package_id` (socket).
    pub package_id: Option<usize>,
    /// `topology/thread_siblings_list`: the hardware threads of this CPU's core, itself included.
    pub siblings: Vec<usize>,
    /// The NUMA node whose `cpulist` names this CPU.
    pub numa_node: Option<usize>,
}

impl Cpu {
    /// A key identifying the physical core: (package, core) when known, else the lowest sibling,
    /// else the CPU itself (no SMT information means every CPU counts as its own core).
    pub fn core_key(&self) -> (usize, usize) {
        match (self.package_id, self.core_id) {
            (Some(package), Some(core)) => (package, core),
            _ => (
                usize::MAX,
                self.siblings.first().copied().unwrap_or(self.id),
            ),
        }
    }
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// Node id (`nodeN`).
    pub id: usize,
    /// CPUs on this node.
    pub cpus: Vec<usize>,
}

/// What traffic an interrupt line serves, from its name in `/proc/interrupts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqKind {
    /// Combined RX/TX queue vector (`eth0-TxRx-3`, `mlx5_comp3@...`, `eth0-3`).
    TxRx,
    /// Receive-only queue vector (`eth0-rx-3`).
    Rx,
    /// Transmit-only queue vector (`eth0-tx-3`).
    Tx,
    /// Anything else on the device (admin queue, link events, `mlx5_async0`).
    Other,
}

/// One interrupt line belonging to a NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicIrq {
    /// IRQ number (`/proc/irq/N`).
    pub irq: u32,
    /// The action name from `/proc/interrupts` (`eth0-TxRx-0`).
    pub name: String,
    /// Queue kind, from the name.
    pub kind: IrqKind,
    /// Queue index, from the name; `None` for [`IrqKind::Other`].
    pub queue: Option<usize>,
    /// `/proc/irq/N/smp_affinity_list`; `None` when the file is missing.
    pub affinity: Option<Vec<usize>>,
}

/// One physical network interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nic {
    /// Interface name (`eth0`).
    pub name: String,
    /// `device/numa_node`; the kernel writes -1 when it does not know, read as `None`.
    pub numa_node: Option<usize>,
    /// `device/local_cpulist`: CPUs close to the device.
    pub local_cpus: Vec<usize>,
    /// RX queue indices (`queues/rx-N`), sorted.
    pub rx_queues: Vec<usize>,
    /// TX queue indices (`queues/tx-N`), sorted.
    pub tx_queues: Vec<usize>,
    /// The device's IRQs, by IRQ number.
    pub irqs: Vec<NicIrq>,
}

impl Nic {
    /// The IRQs that serve a receive queue (combined or RX-only), sorted by queue index.
    pub fn rx_queue_irqs(&self) -> Vec<&NicIrq> {
        let mut irqs: Vec<&NicIrq> = self
            .irqs
            .iter()
            .filter(|irq| matches!(irq.kind, IrqKind::TxRx | IrqKind::Rx) && irq.queue.is_some())
            .collect();
        irqs.sort_by_key(|irq| (irq.queue, irq.irq));
        irqs
    }
}

/// The host as the shard planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// CPUs this process may run on (`Cpus_allowed_list`), falling back to online CPUs.
    pub allowed_cpus: Vec<usize>,
    /// `/sys/devices/system/cpu/online`, falling back to the `cpuN` directories present.
    pub online_cpus: Vec<usize>,
    /// Per-CPU details for every online CPU, sorted by id.
    pub cpus: Vec<Cpu>,
    /// NUMA nodes, sorted by id; empty on kernels without NUMA.
    pub numa_nodes: Vec<NumaNode>,
    /// Physical NICs (no `lo`, no virtual devices without `device/`), sorted by name.
    pub nics: Vec<Nic>,
    /// Whether a process named `irqbalance` is running (it rewrites IRQ affinity every 10 s).
    pub irqbalance_running: bool,
}

impl Topology {
    /// Reads the topology from sysfs/procfs beneath `root` (`/` on a real host).
    pub fn read(root: &Path) -> Result<Topology, TopologyError> {
        let cpu_dir = root.join("sys/devices/system/cpu");
        let online_cpus = match read_cpulist_file(&cpu_dir.join("online"))? {
            Some(cpus) => cpus,
            None => list_indexed_entries(&cpu_dir, "cpu")?,
        };
        let numa_nodes = read_numa_nodes(&root.join("sys/devices/system/node"))?;
        let mut cpus = Vec::with_capacity(online_cpus.len());
        for &id in &online_cpus {
            cpus.push(read_cpu(&cpu_dir, id, &numa_nodes)?);
        }
        let allowed_cpus = match read_allowed_cpus(&root.join("proc/self/status"))? {
            Some(allowed) => allowed,
            None => online_cpus.clone(),
        };
        let interrupts = read_interrupts(&root.join("proc/interrupts"))?;
        let nics = read_nics(root, &interrupts)?;
        let irqbalance_running = process_running(&root.join("proc"), "irqbalance");
        Ok(Topology {
            allowed_cpus,
            online_cpus,
            cpus,
            numa_nodes,
            nics,
            irqbalance_running,
        })
    }

    /// Intersects `allowed_cpus` with the live process's `sched_getaffinity` mask.
    ///
    /// Separate from [`Topology::read`] because a fixture tree says nothing about the process
    /// running the tests; the CLI calls it when reading the real root.
    pub fn restrict_to_live_affinity(&mut self) -> io::Result<()> {
        let live = live_affinity_cpus()?;
        self.allowed_cpus.retain(|cpu| live.contains(cpu));
        Ok(())
    }

    /// The CPU with logical id `id`, if online.
    pub fn cpu(&self, id: usize) -> Option<&Cpu> {
        self.cpus
            .binary_search_by_key(&id, |cpu| cpu.id)
            .ok()
            .map(|index| &self.cpus[index])
    }

    /// The NIC named `name`.
    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|nic| nic.name == name)
    }

    /// The NUMA node of CPU `id`, if known.
    pub fn numa_node_of(&self, id: usize) -> Option<usize> {
        self.cpu(id).and_then(|cpu| cpu.numa_node)
    }
}

/// CPUs in the live process's affinity mask (`sched_getaffinity(0)`), sorted.
pub fn live_affinity_cpus() -> io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect())
}

fn malformed(path: &Path, msg: impl Into<String>) -> TopologyError {
    TopologyError {
        path: path.to_path_buf(),
        kind: TopologyErrorKind::Malformed(msg.into()),
    }
}

/// Reads a small text file; `Ok(None)` when it does not exist (hidden by a container, or a
/// kernel without the feature).
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(text)),
            Err(_) => Err(malformed(path, "not UTF-8")),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        // ENOTDIR: a path component is a plain file, i.e. the thing we look for is not there.
        Err(err) if err.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(err) => Err(TopologyError {
            path: path.to_path_buf(),
            kind: TopologyErrorKind::Io(err),
        }),
    }
}

fn read_cpulist_file(path: &Path) -> Result<Option<Vec<usize>>, TopologyError> {
    match read_optional(path)? {
        Some(text) => parse_cpulist(&text)
            .map(Some)
            .map_err(|err| malformed(path, err.to_string())),
        None => Ok(None),
    }
}

fn read_usize_file(path: &Path) -> Result<Option<usize>, TopologyError> {
    match read_optional(path)? {
        Some(text) => text
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| malformed(path, format!("{:?} is not a number", text.trim()))),
        None => Ok(None),
    }
}

/// Reads a `numa_node`-style file where -1 means "unknown".
fn read_node_file(path: &Path) -> Result<Option<usize>, TopologyError> {
    match read_optional(path)? {
        Some(text) => match text.trim().parse::<i64>() {
            Ok(node) if node < 0 => Ok(None),
            Ok(node) => usize::try_from(node)
                .map(Some)
                .map_err(|_| malformed(path, format!("node {node} out of range"))),
            Err(_) => Err(malformed(
                path,
                format!("{:?} is not a node number", text.trim()),
            )),
        },
        None => Ok(None),
    }
}

/// Names of the entries in `dir`, sorted; empty when `dir` is missing.
fn dir_entries(dir: &Path) -> Result<Vec<String>, TopologyError> {
    let iter = match fs::read_dir(dir) {
        Ok(iter) => iter,
        Err(err)
            if err.kind() == io::ErrorKind::NotFound
                || err.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Ok(Vec::new())
        }
        Err(err) => {
            return Err(TopologyError {
                path: dir.to_path_buf(),
                kind: TopologyErrorKind::Io(err),
            })
        }
    };
    let mut names = Vec::new();
    for entry in iter {
        let entry = entry.map_err(|err| TopologyError {
            path: dir.to_path_buf(),
            kind: TopologyErrorKind::Io(err),
        })?;
        // Non-UTF-8 names cannot be cpuN/nodeN/rx-N; skipping them is correct, not lossy.
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Indices N of entries named `{prefix}N` in `dir`, sorted (`cpu0`, `cpu1`, ... but not `cpufreq`).
fn list_indexed_entries(dir: &Path, prefix: &str) -> Result<Vec<usize>, TopologyError> {
    let mut ids: Vec<usize> = dir_entries(dir)?
        .iter()
        .filter_map(|name| indexed_suffix(name, prefix))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

fn indexed_suffix(name: &str, prefix: &str) -> Option<usize> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn read_numa_nodes(node_dir: &Path) -> Result<Vec<NumaNode>, TopologyError> {
    let mut nodes = Vec::new();
    for id in list_indexed_entries(node_dir, "node")? {
        let path = node_dir.join(format!("node{id}/cpulist"));
        let cpus = read_cpulist_file(&path)?.unwrap_or_default();
        nodes.push(NumaNode { id, cpus });
    }
    Ok(nodes)
}

fn read_cpu(cpu_dir: &Path, id: usize, nodes: &[NumaNode]) -> Result<Cpu, TopologyError> {
    let topo = cpu_dir.join(format!("cpu{id}/topology"));
    let core_id = read_usize_file(&topo.join("core_id"))?;
    let package_id = read_usize_file(&topo.join("physical_package_id"))?;
    let siblings = match read_cpulist_file(&topo.join("thread_siblings_list"))? {
        Some(list) => list,
        None => vec![id],
    };
    let numa_node = nodes
        .iter()
        .find(|node| node.cpus.contains(&id))
        .map(|node| node.id);
    Ok(Cpu {
        id,
        core_id,
        package_id,
        siblings,
        numa_node,
    })
}

fn read_allowed_cpus(status_path: &Path) -> Result<Option<Vec<usize>>, TopologyError> {
    let Some(text) = read_optional(status_path)? else {
        return Ok(None);
    };
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("Cpus_allowed_list:") {
            return parse_cpulist(value)
                .map(Some)
                .map_err(|err| malformed(status_path, format!("Cpus_allowed_list: {err}")));
        }
    }
    Ok(None)
}

/// One numbered line of `/proc/interrupts`: the IRQ number and its action names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InterruptLine {
    irq: u32,
    /// Whitespace-separated tokens after the per-CPU counts; the action names are the last
    /// tokens, comma-separated when an IRQ is shared (`ehci_hcd:usb1, ehci_hcd:usb2`).
    tokens: Vec<String>,
}

fn read_interrupts(path: &Path) -> Result<Vec<InterruptLine>, TopologyError> {
    let Some(text) = read_optional(path)? else {
        return Ok(Vec::new());
    };
    parse_interrupts(&text).map_err(|msg| malformed(path, msg))
}

fn parse_interrupts(text: &str) -> Result<Vec<InterruptLine>, String> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Ok(Vec::new());
    };
    let cpu_columns = header.split_whitespace().count();
    if cpu_columns == 0 || !header.split_whitespace().all(|col| col.starts_with("CPU")) {
        return Err(format!("first line {header:?} is not a CPU header"));
    }
    let mut out = Vec::new();
    for (number, line) in lines.enumerate() {
        let Some((label, rest)) = line.split_once(':') else {
            continue;
        };
        let label = label.trim();
        // NMI, LOC, ERR, MIS...: per-CPU statistics, not device IRQs.
        if !label.bytes().all(|b| b.is_ascii_digit()) || label.is_empty() {
            continue;
        }
        let irq: u32 = label
            .parse()
            .map_err(|_| format!("line {}: IRQ {label} out of range", number + 2))?;
        // Counts come first, one per CPU column; everything after is chip, hwirq and names.
        let tokens: Vec<String> = rest
            .split_whitespace()
            .skip_while(|tok| tok.bytes().all(|b| b.is_ascii_digit()))
            .map(|tok| tok.trim_end_matches(',').to_string())
            .collect();
        out.push(InterruptLine { irq, tokens });
    }
    Ok(out)
}

/// Classifies an interrupt action name for interface `iface`; `None` if it is not that
/// interface's by name.
fn classify_irq_name(name: &str, iface: &str) -> Option<(IrqKind, Option<usize>)> {
    // ixgbe/igb name the link/admin vector after the bare interface.
    if name == iface {
        return Some((IrqKind::Other, None));
    }
    let rest = name.strip_prefix(iface)?.strip_prefix('-')?;
    Some(classify_queue_suffix(rest))
}

/// Classifies the part of a vector name after the interface: `TxRx-3`, `rx-3`, `tx-3`, `3`.
fn classify_queue_suffix(rest: &str) -> (IrqKind, Option<usize>) {
    let lower = rest.to_ascii_lowercase();
    let (kind, index) = if let Some(index) = lower
        .strip_prefix("txrx-")
        .or_else(|| lower.strip_prefix("rxtx-"))
        .or_else(|| lower.strip_prefix("combined-"))
    {
        (IrqKind::TxRx, index)
    } else if let Some(index) = lower.strip_prefix("rx-") {
        (IrqKind::Rx, index)
    } else if let Some(index) = lower.strip_prefix("tx-") {
        (IrqKind::Tx, index)
    } else {
        (IrqKind::TxRx, lower.as_str())
    };
    match index.parse::<usize>() {
        Ok(queue) => (kind, Some(queue)),
        Err(_) => (IrqKind::Other, None),
    }
}

/// Classifies a vector name found only through `device/msi_irqs` (drivers that name vectors
/// after the PCI device, like mlx5: `mlx5_comp3@pci:0000:3b:00.0`).
fn classify_msi_name(name: &str) -> (IrqKind, Option<usize>) {
    let base = name.split('@').next().unwrap_or(name);
    if let Some(pos) = base.find("comp") {
        if let Ok(queue) = base[pos + "comp".len()..].parse::<usize>() {
            return (IrqKind::TxRx, Some(queue));
        }
    }
    (IrqKind::Other, None)
}

fn read_nics(root: &Path, interrupts: &[InterruptLine]) -> Result<Vec<Nic>, TopologyError> {
    let net_dir = root.join("sys/class/net");
    let mut nics = Vec::new();
    for name in dir_entries(&net_dir)? {
        if name == "lo" {
            continue;
        }
        let iface_dir = net_dir.join(&name);
        let device = iface_dir.join("device");
        // Virtual interfaces (bridges, veth, bonds, tun) have no backing device.
        if !device.exists() {
            continue;
        }
        let numa_node = read_node_file(&device.join("numa_node"))?;
        let local_cpus = read_cpulist_file(&device.join("local_cpulist"))?.unwrap_or_default();
        let queue_names = dir_entries(&iface_dir.join("queues"))?;
        let rx_queues = sorted_indices(&queue_names, "rx-");
        let tx_queues = sorted_indices(&queue_names, "tx-");
        let msi_irqs: BTreeSet<u32> = dir_entries(&device.join("msi_irqs"))?
            .iter()
            .filter_map(|irq| irq.parse().ok())
            .collect();
        let mut irqs = Vec::new();
        for line in interrupts {
            let by_name = line
                .tokens
                .iter()
                .rev()
                .find_map(|tok| classify_irq_name(tok, &name).map(|c| (tok, c)));
            let (irq_name, (kind, queue)) = match by_name {
                Some((tok, class)) => (tok.clone(), class),
                None if msi_irqs.contains(&line.irq) => {
                    let tok = line.tokens.last().cloned().unwrap_or_default();
                    let class = classify_msi_name(&tok);
                    (tok, class)
                }
                None => continue,
            };
            let affinity_path = root.join(format!("proc/irq/{}/smp_affinity_list", line.irq));
            let affinity = read_cpulist_file(&affinity_path)?;
            irqs.push(NicIrq {
                irq: line.irq,
                name: irq_name,
                kind,
                queue,
                affinity,
            });
        }
        irqs.sort_by_key(|irq| irq.irq);
        nics.push(Nic {
            name,
            numa_node,
            local_cpus,
            rx_queues,
            tx_queues,
            irqs,
        });
    }
    Ok(nics)
}

fn sorted_indices(names: &[String], prefix: &str) -> Vec<usize> {
    let mut out: Vec<usize> = names
        .iter()
        .filter_map(|name| indexed_suffix(name, prefix))
        .collect();
    out.sort_unstable();
    out
}

/// Whether any `/proc/<pid>/comm` beneath `proc_dir` equals `comm`. Best effort: processes
/// exit while we scan, so unreadable entries are skipped, never errors.
fn process_running(proc_dir: &Path, comm: &str) -> bool {
    let Ok(iter) = fs::read_dir(proc_dir) else {
        return false;
    };
    iter.flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()))
        })
        .any(|entry| {
            fs::read_to_string(entry.path().join("comm")).is_ok_and(|text| text.trim() == comm)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/topology")
            .join(name)
    }

    #[test]
    fn cpulist_parses_ranges_singles_and_whitespace() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("5").unwrap(), vec![5]);
        assert_eq!(parse_cpulist(" 2-2 , 0 ").unwrap(), vec![0, 2]);
        assert_eq!(parse_cpulist("3,1,1-2").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn cpulist_rejects_garbage_with_reason() {
        for bad in [
            "3-1",
            "a",
            "1,,2",
            "1-",
            "-1",
            "0x3",
            "1-2-3",
            "+1",
            "99999999999999999999",
        ] {
            let err = parse_cpulist(bad).unwrap_err();
            assert_eq!(err.input, bad.trim(), "{bad}");
        }
        let err = parse_cpulist("0-4000000000").unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn cpulist_format_round_trips() {
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[7, 5, 6]), "5-7");
        assert_eq!(format_cpulist(&[]), "");
        for list in ["0", "0-3,8,10-11", "1,3,5", "0-63"] {
            assert_eq!(format_cpulist(&parse_cpulist(list).unwrap()), list);
        }
    }

    proptest::proptest! {
        #[test]
        fn cpulist_format_then_parse_is_identity(cpus in proptest::collection::btree_set(0usize..300, 0..40)) {
            let cpus: Vec<usize> = cpus.into_iter().collect();
            proptest::prop_assert_eq!(parse_cpulist(&format_cpulist(&cpus)).unwrap(), cpus);
        }

        #[test]
        fn cpulist_parse_never_panics(input in "[0-9,\\- ]{0,24}") {
            let _ = parse_cpulist(&input);
        }
    }

    #[test]
    fn interrupts_parse_names_and_skip_statistics() {
        let text = "           CPU0       CPU1\n\
                    \x20 0:         35          0   IO-APIC   2-edge      timer\n\
                    \x2040:        100          5   PCI-MSI 524288-edge      eth0-TxRx-0\n\
                    \x2016:          0          0   IO-APIC  16-fasteoi   ehci_hcd:usb1, eth1\n\
                    NMI:          0          0   Non-maskable interrupts\n\
                    ERR:          0\n";
        let lines = parse_interrupts(text).unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].irq, 40);
        assert_eq!(lines[1].tokens.last().unwrap(), "eth0-TxRx-0");
        assert_eq!(
            lines[2].tokens,
            vec!["IO-APIC", "16-fasteoi", "ehci_hcd:usb1", "eth1"]
        );
        assert!(parse_interrupts("garbage\n 1: 2 x\n").is_err());
        assert_eq!(parse_interrupts("").unwrap(), Vec::new());
    }

    #[test]
    fn irq_names_classify_by_driver_convention() {
        assert_eq!(
            classify_irq_name("eth0-TxRx-3", "eth0"),
            Some((IrqKind::TxRx, Some(3)))
        );
        assert_eq!(
            classify_irq_name("eth0-rx-1", "eth0"),
            Some((IrqKind::Rx, Some(1)))
        );
        assert_eq!(
            classify_irq_name("eth0-tx-1", "eth0"),
            Some((IrqKind::Tx, Some(1)))
        );
        assert_eq!(
            classify_irq_name("eth0-7", "eth0"),
            Some((IrqKind::TxRx, Some(7)))
        );
        assert_eq!(
            classify_irq_name("eth0-input.2", "eth0").map(|c| c.0),
            Some(IrqKind::Other)
        );
        assert_eq!(
            classify_irq_name("eth0", "eth0"),
            Some((IrqKind::Other, None))
        );
        assert_eq!(classify_irq_name("eth01-TxRx-0", "eth0"), None);
        assert_eq!(
            classify_msi_name("mlx5_comp5@pci:0000:3b:00.0"),
            (IrqKind::TxRx, Some(5))
        );
        assert_eq!(
            classify_msi_name("mlx5_async0@pci:0000:3b:00.0"),
            (IrqKind::Other, None)
        );
    }

    #[test]
    fn two_socket_smt_fixture() {
        let topo = Topology::read(&fixture("two-socket-smt")).unwrap();
        assert_eq!(topo.online_cpus, (0..16).collect::<Vec<_>>());
        assert_eq!(topo.allowed_cpus, (0..16).collect::<Vec<_>>());
        assert_eq!(topo.numa_nodes.len(), 2);
        assert_eq!(topo.numa_nodes[0].cpus, vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(topo.numa_nodes[1].cpus, vec![4, 5, 6, 7, 12, 13, 14, 15]);
        // Linux enumerates one thread of every core first, then the siblings: cpu0 and cpu8
        // share socket 0 core 0.
        let cpu0 = topo.cpu(0).unwrap();
        assert_eq!((cpu0.package_id, cpu0.core_id), (Some(0), Some(0)));
        assert_eq!(cpu0.siblings, vec![0, 8]);
        let cpu13 = topo.cpu(13).unwrap();
        assert_eq!((cpu13.package_id, cpu13.core_id), (Some(1), Some(1)));
        assert_eq!(cpu13.siblings, vec![5, 13]);
        assert_eq!(cpu13.numa_node, Some(1));
        assert_eq!(
            topo.cpu(8).unwrap().core_key(),
            topo.cpu(0).unwrap().core_key()
        );
        assert_ne!(
            topo.cpu(4).unwrap().core_key(),
            topo.cpu(0).unwrap().core_key()
        );
        // ens1f0 is the physical NIC on socket 1; docker0 (no device/) and lo are skipped.
        let names: Vec<&str> = topo.nics.iter().map(|nic| nic.name.as_str()).collect();
        assert_eq!(names, vec!["ens1f0"]);
        let nic = &topo.nics[0];
        assert_eq!(nic.numa_node, Some(1));
        assert_eq!(nic.local_cpus, vec![4, 5, 6, 7, 12, 13, 14, 15]);
        assert_eq!(nic.rx_queues, vec![0, 1, 2, 3]);
        // mlx5 names its vectors after the PCI device: found through device/msi_irqs.
        let queues: Vec<(u32, Option<usize>, IrqKind)> = nic
            .irqs
            .iter()
            .map(|irq| (irq.irq, irq.queue, irq.kind))
            .collect();
        assert_eq!(
            queues,
            vec![
                (90, None, IrqKind::Other),
                (91, Some(0), IrqKind::TxRx),
                (92, Some(1), IrqKind::TxRx),
                (93, Some(2), IrqKind::TxRx),
                (94, Some(3), IrqKind::TxRx),
            ]
        );
        assert_eq!(nic.irqs[1].affinity, Some(vec![4]));
        assert!(topo.irqbalance_running);
    }

    #[test]
    fn single_node_vm_fixture() {
        let topo = Topology::read(&fixture("single-node")).unwrap();
        assert_eq!(topo.online_cpus, vec![0, 1, 2, 3]);
        // The process was started under `taskset -c 0-2`.
        assert_eq!(topo.allowed_cpus, vec![0, 1, 2]);
        assert_eq!(
            topo.numa_nodes,
            vec![NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3]
            }]
        );
        for cpu in &topo.cpus {
            assert_eq!(cpu.siblings, vec![cpu.id], "no SMT in this VM");
            assert_eq!(cpu.numa_node, Some(0));
        }
        let nic = topo.nic("ens3").unwrap();
        // virtio-net in a VM: numa_node -1 means unknown.
        assert_eq!(nic.numa_node, None);
        assert_eq!(nic.rx_queues, vec![0, 1]);
        assert_eq!(nic.tx_queues, vec![0, 1]);
        // virtio names its vectors virtio0-input.0: nothing that names the interface, and no
        // msi_irqs in the fixture, so no IRQs.
        assert!(nic.irqs.is_empty());
        assert!(!topo.irqbalance_running);
    }

    #[test]
    fn nic_8_queues_fixture() {
        let topo = Topology::read(&fixture("nic-8-queues")).unwrap();
        let nic = topo.nic("eth0").unwrap();
        assert_eq!(nic.numa_node, Some(0));
        assert_eq!(nic.local_cpus, vec![0, 1, 2, 3]);
        assert_eq!(nic.rx_queues, (0..8).collect::<Vec<_>>());
        assert_eq!(nic.tx_queues, (0..8).collect::<Vec<_>>());
        let rx = nic.rx_queue_irqs();
        assert_eq!(
            rx.iter().map(|irq| irq.irq).collect::<Vec<_>>(),
            (40..48).collect::<Vec<_>>()
        );
        assert_eq!(rx[0].name, "eth0-TxRx-0");
        assert_eq!(rx[0].affinity, Some(vec![0]));
        // Some IRQs point at the wrong CPUs (as left by irqbalance or the driver default).
        assert_eq!(rx[1].affinity, Some(vec![5]));
        assert_eq!(rx[2].affinity, Some(vec![0, 1, 2, 3, 4, 5, 6, 7]));
        // The admin vector eth0 (IRQ 39) belongs to the device but serves no queue.
        let other: Vec<u32> = nic
            .irqs
            .iter()
            .filter(|irq| irq.kind == IrqKind::Other)
            .map(|irq| irq.irq)
            .collect();
        assert_eq!(other, vec![39]);
    }

    #[test]
    fn missing_tree_degrades_to_empty() {
        let dir = tempfile::tempdir().unwrap();
        let topo = Topology::read(dir.path()).unwrap();
        assert!(topo.online_cpus.is_empty());
        assert!(topo.allowed_cpus.is_empty());
        assert!(topo.nics.is_empty());
        assert!(topo.numa_nodes.is_empty());
        assert!(!topo.irqbalance_running);
    }

    #[test]
    fn missing_topology_files_give_none() {
        let dir = tempfile::tempdir().unwrap();
        let cpu_dir = dir.path().join("sys/devices/system/cpu");
        fs::create_dir_all(cpu_dir.join("cpu0")).unwrap();
        fs::create_dir_all(cpu_dir.join("cpu1")).unwrap();
        fs::create_dir_all(cpu_dir.join("cpufreq")).unwrap();
        let topo = Topology::read(dir.path()).unwrap();
        assert_eq!(topo.online_cpus, vec![0, 1]);
        assert_eq!(topo.allowed_cpus, vec![0, 1]);
        let cpu1 = topo.cpu(1).unwrap();
        assert_eq!(
            (cpu1.core_id, cpu1.package_id, cpu1.numa_node),
            (None, None, None)
        );
        assert_eq!(cpu1.siblings, vec![1]);
    }

    #[test]
    fn malformed_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cpu_dir = dir.path().join("sys/devices/system/cpu");
        fs::create_dir_all(cpu_dir.join("cpu0/topology")).unwrap();
        fs::write(cpu_dir.join("online"), "0\n").unwrap();
        fs::write(cpu_dir.join("cpu0/topology/core_id"), "zero\n").unwrap();
        let err = Topology::read(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("cpu0/topology/core_id"), "{msg}");
        assert!(msg.contains("zero"), "{msg}");

        fs::write(cpu_dir.join("cpu0/topology/core_id"), "0\n").unwrap();
        fs::write(cpu_dir.join("online"), "0-\n").unwrap();
        let msg = Topology::read(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("system/cpu/online"), "{msg}");

        fs::write(cpu_dir.join("online"), "0\n").unwrap();
        fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        fs::write(
            dir.path().join("proc/self/status"),
            "Cpus_allowed_list:\tx\n",
        )
        .unwrap();
        let msg = Topology::read(dir.path()).unwrap_err().to_string();
        assert!(
            msg.contains("proc/self/status") && msg.contains("Cpus_allowed_list"),
            "{msg}"
        );
    }

    #[test]
    fn live_affinity_restricts_allowed_cpus() {
        // The live mask is never empty for a running thread.
        let live = live_affinity_cpus().unwrap();
        assert!(!live.is_empty());
        let mut topo = Topology::read(&fixture("single-node")).unwrap();
        topo.allowed_cpus = (0..=CPU_ID_MAX.min(4096)).collect();
        topo.restrict_to_live_affinity().unwrap();
        assert_eq!(topo.allowed_cpus, live);
    }
}
