//! The `hwloc` cargo feature: the same [`Topology`] filled by C libhwloc through `hwlocality`.
//!
//! hwloc gives the CPUs, cores, packages, NUMA nodes and each network device's locality (the
//! CPU set and NUMA node of its nearest non-I/O ancestor). It knows nothing about queues and
//! IRQs, so those are merged in from the sysfs/procfs reader for the NICs of the same name.
//!
//! Differences from [`Topology::read`] worth knowing:
//! - a NIC whose `device/numa_node` is -1 still gets a node when its locality spans exactly one
//!   node (always the case on a single-node host);
//! - on a kernel without NUMA support hwloc invents one node 0 covering every CPU, where the
//!   sysfs reader lists none;
//! - the NIC list is hwloc's: an interface hwloc does not attach to a device is not listed.

use super::{
    process_running, read_interrupts, read_nics, Cpu, Nic, NumaNode, Topology, TopologyError,
    TopologyErrorKind,
};
use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};
use std::path::{Path, PathBuf};

/// Reads this host's topology through libhwloc, with NIC queues and IRQs from `/sys` and
/// `/proc`.
///
/// `allowed_cpus` is hwloc's allowed set (cgroup cpuset) intersected with the calling thread's
/// CPU binding, i.e. what `Cpus_allowed_list` says for a process that has not re-pinned threads.
pub fn read_with_hwloc() -> Result<Topology, TopologyError> {
    let hw = load_this_system()?;
    let interrupts = read_interrupts(Path::new("/proc/interrupts"))?;
    let sysfs_nics = read_nics(Path::new("/"), &interrupts)?;
    let mut topo = from_hwloc(&hw, &sysfs_nics);
    // Without binding support (never the case on Linux) the cgroup's allowed set stands.
    if let Ok(bound) = hw.cpu_binding(CpuBindingFlags::THREAD) {
        let bound = cpu_ids(&bound);
        topo.allowed_cpus.retain(|cpu| bound.contains(cpu));
    }
    topo.irqbalance_running = process_running(Path::new("/proc"), "irqbalance");
    Ok(topo)
}

fn hwloc_error(what: &str, err: impl std::fmt::Display) -> TopologyError {
    TopologyError {
        path: PathBuf::new(),
        kind: TopologyErrorKind::Hwloc(format!("{what}: {err}")),
    }
}

/// Builds the topology of this machine, disallowed CPUs included (so `online_cpus` is complete)
/// and network devices kept.
fn load_this_system() -> Result<hwlocality::Topology, TopologyError> {
    builder_with_nics(hwlocality::Topology::builder())?
        .build()
        .map_err(|err| hwloc_error("loading the topology", err))
}

fn builder_with_nics(
    builder: hwlocality::topology::builder::TopologyBuilder,
) -> Result<hwlocality::topology::builder::TopologyBuilder, TopologyError> {
    builder
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|err| hwloc_error("setting build flags", err))?
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|err| hwloc_error("keeping I/O devices", err))
}

/// The CPU ids in an hwloc CPU set, sorted.
fn cpu_ids(set: &CpuSet) -> Vec<usize> {
    set.iter_set().map(usize::from).collect()
}

fn object_cpus(object: &TopologyObject) -> Vec<usize> {
    object.cpuset().map(|set| cpu_ids(&set)).unwrap_or_default()
}

/// Converts a loaded hwloc topology; NIC queues/IRQs come from `sysfs_nics` by name.
/// `irqbalance_running` is left false and `allowed_cpus` is hwloc's allowed set: both are
/// properties of the live process, filled by [`read_with_hwloc`].
fn from_hwloc(hw: &hwlocality::Topology, sysfs_nics: &[Nic]) -> Topology {
    let online_cpus = cpu_ids(&hw.cpuset());
    let allowed_cpus: Vec<usize> = cpu_ids(&hw.allowed_cpuset())
        .into_iter()
        .filter(|cpu| online_cpus.contains(cpu))
        .collect();

    let mut numa_nodes: Vec<NumaNode> = hw
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|node| {
            Some(NumaNode {
                id: node.os_index()?,
                cpus: object_cpus(node),
            })
        })
        .collect();
    numa_nodes.sort_by_key(|node| node.id);

    let mut cpus: Vec<Cpu> = hw
        .objects_with_type(ObjectType::PU)
        .filter_map(|pu| {
            let id = pu.os_index()?;
            let core = pu.first_ancestor_with_type(ObjectType::Core);
            let siblings = core.map(object_cpus).unwrap_or_else(|| vec![id]);
            Some(Cpu {
                id,
                core_id: core.and_then(TopologyObject::os_index),
                package_id: pu
                    .first_ancestor_with_type(ObjectType::Package)
                    .and_then(TopologyObject::os_index),
                siblings,
                numa_node: numa_nodes
                    .iter()
                    .find(|node| node.cpus.contains(&id))
                    .map(|node| node.id),
            })
        })
        .collect();
    cpus.sort_by_key(|cpu| cpu.id);

    let mut nics: Vec<Nic> = hw
        .objects_with_type(ObjectType::OSDevice)
        .filter(|dev| {
            matches!(
                dev.attributes(),
                Some(ObjectAttributes::OSDevice(attr))
                    if attr.device_type() == OSDeviceType::Network
            )
        })
        .filter_map(|dev| {
            let name = dev.name()?.to_str().ok()?.to_string();
            if name == "lo" {
                return None;
            }
            let locality = dev.first_non_io_ancestor();
            let local_cpus = locality.map(object_cpus).unwrap_or_default();
            let numa_node = locality
                .and_then(TopologyObject::nodeset)
                .filter(|set| set.weight() == Some(1))
                .and_then(|set| set.first_set())
                .map(usize::from);
            let sysfs = sysfs_nics.iter().find(|nic| nic.name == name);
            Some(Nic {
                numa_node,
                local_cpus,
                rx_queues: sysfs.map(|nic| nic.rx_queues.clone()).unwrap_or_default(),
                tx_queues: sysfs.map(|nic| nic.tx_queues.clone()).unwrap_or_default(),
                irqs: sysfs.map(|nic| nic.irqs.clone()).unwrap_or_default(),
                name,
            })
        })
        .collect();
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    nics.dedup_by(|a, b| a.name == b.name);

    Topology {
        allowed_cpus,
        online_cpus,
        cpus,
        numa_nodes,
        nics,
        irqbalance_running: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{format_cpulist, Topology};

    #[test]
    fn hwloc_and_sysfs_agree_on_this_host() {
        let sysfs = Topology::read(Path::new("/")).unwrap();
        let hw = read_with_hwloc().unwrap();
        eprintln!(
            "sysfs: allowed {} online {}, hwloc: allowed {} online {}",
            format_cpulist(&sysfs.allowed_cpus),
            format_cpulist(&sysfs.online_cpus),
            format_cpulist(&hw.allowed_cpus),
            format_cpulist(&hw.online_cpus),
        );
        assert!(!hw.allowed_cpus.is_empty());
        assert_eq!(hw.allowed_cpus, sysfs.allowed_cpus);
        assert_eq!(hw.online_cpus, sysfs.online_cpus);

        // Cores and packages: compare per CPU where sysfs knows them (VMs and containers may
        // hide topology/; the sysfs reader then has None and each CPU as its own core).
        assert_eq!(hw.cpus.len(), sysfs.cpus.len());
        for (h, s) in hw.cpus.iter().zip(&sysfs.cpus) {
            assert_eq!(h.id, s.id);
            if s.core_id.is_some() {
                assert_eq!(h.core_id, s.core_id, "core of CPU {}", s.id);
                assert_eq!(h.siblings, s.siblings, "SMT siblings of CPU {}", s.id);
            }
            if s.package_id.is_some() {
                assert_eq!(h.package_id, s.package_id, "package of CPU {}", s.id);
            }
        }
        let cores = |topo: &Topology| {
            let mut keys: Vec<_> = topo.cpus.iter().map(Cpu::core_key).collect();
            keys.sort_unstable();
            keys.dedup();
            keys.len()
        };
        if sysfs.cpus.iter().all(|cpu| cpu.core_id.is_some()) {
            assert_eq!(cores(&hw), cores(&sysfs), "number of physical cores");
        }

        // NUMA: hwloc invents node 0 when the kernel has no NUMA support.
        if sysfs.numa_nodes.is_empty() {
            assert_eq!(hw.numa_nodes.len(), 1);
            assert_eq!(hw.numa_nodes[0].cpus, hw.online_cpus);
        } else {
            // sysfs lists memory-only nodes too; hwloc lists them as well (empty cpuset).
            assert_eq!(hw.numa_nodes, sysfs.numa_nodes);
            let node_of = |topo: &Topology| {
                topo.cpus
                    .iter()
                    .map(|cpu| (cpu.id, cpu.numa_node))
                    .collect::<Vec<_>>()
            };
            assert_eq!(node_of(&hw), node_of(&sysfs));
        }

        // NICs: every interface hwloc reports is one the sysfs reader knows, with its queues.
        for nic in &hw.nics {
            let from_sysfs = sysfs
                .nic(&nic.name)
                .unwrap_or_else(|| panic!("hwloc NIC {} unknown to the sysfs reader", nic.name));
            assert_eq!(nic.rx_queues, from_sysfs.rx_queues);
            assert_eq!(nic.tx_queues, from_sysfs.tx_queues);
            assert_eq!(nic.irqs, from_sysfs.irqs);
            assert!(
                nic.local_cpus
                    .iter()
                    .all(|cpu| hw.online_cpus.contains(cpu)),
                "{}: local CPUs {:?}",
                nic.name,
                nic.local_cpus
            );
        }
    }

    /// A synthetic 2-socket SMT host: the conversion itself, independent of this machine.
    #[test]
    fn synthetic_two_socket_smt_converts() {
        let hw = builder_with_nics(hwlocality::Topology::builder())
            .unwrap()
            .from_synthetic("package:2 [numa] core:4 pu:2")
            .unwrap()
            .build()
            .unwrap();
        let topo = from_hwloc(&hw, &[]);
        assert_eq!(topo.online_cpus, (0..16).collect::<Vec<_>>());
        assert_eq!(topo.allowed_cpus, topo.online_cpus);
        assert_eq!(
            topo.numa_nodes,
            vec![
                NumaNode {
                    id: 0,
                    cpus: (0..8).collect()
                },
                NumaNode {
                    id: 1,
                    cpus: (8..16).collect()
                },
            ]
        );
        let cpu9 = topo.cpu(9).unwrap();
        assert_eq!(cpu9.siblings, vec![8, 9]);
        assert_eq!(cpu9.package_id, Some(1));
        assert_eq!(cpu9.numa_node, Some(1));
        assert_eq!(topo.cpu(8).unwrap().core_key(), cpu9.core_key());
        assert_ne!(topo.cpu(7).unwrap().core_key(), cpu9.core_key());
        assert!(topo.nics.is_empty());
    }
}
