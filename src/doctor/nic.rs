//! Per-interface checks from `sys/class/net` and `ethtool`: link, offloads, ring sizes, drop
//! counters and their growth, txqueuelen, and MTU agreement between linked interfaces (bridge
//! and bond members, VLANs on their lower device) and between physical ports.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::ethtool::{parse_features, parse_rings};
use super::host::{Round, Snapshot, Tree};
use super::{Check, DoctorContext, Status};

/// Link speed the edge is built for.
const LINK_SPEED_MBPS_MIN: u64 = 10_000;
/// txqueuelen from the field report (`ip link set eth0 txqueuelen 10000`).
const TX_QUEUE_LEN_MIN: u64 = 10_000;
/// Counters listed per check before "+N more".
const COUNTERS_SHOWN_MAX: usize = 4;

/// One network interface as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// `ethernet`, `bridge`, `vlan`, `bond`, ... (from `uevent` DEVTYPE or sysfs markers).
    pub kind: String,
    /// Backed by a device (`device` link present); virtual interfaces skip hardware checks.
    pub physical: bool,
    /// MTU in bytes.
    pub mtu: Option<u32>,
    /// `operstate` (`up`, `down`, `unknown`, ...).
    pub operstate: String,
    /// Link speed; `None` when not reported (down link, virtio).
    pub speed_mbps: Option<u64>,
    /// `tx_queue_len` in packets.
    pub tx_queue_len: Option<u64>,
    /// Bridge or bond this interface is enslaved to.
    pub master: Option<String>,
    /// Lower devices (`lower_*` links: the parent of a VLAN, macvlan, ...).
    pub lowers: Vec<String>,
    /// Bridge ports (`brif/`).
    pub members: Vec<String>,
}

/// Reads every interface under `sys/class/net` except loopback, sorted by name.
pub fn discover(tree: &Tree) -> Vec<Nic> {
    tree.list("/sys/class/net")
        .into_iter()
        .filter(|name| name != "lo")
        .map(|name| read_nic(tree, name))
        .filter(|nic| nic.kind != "loopback")
        .collect()
}

fn read_nic(tree: &Tree, name: String) -> Nic {
    let dir = format!("/sys/class/net/{name}");
    let physical = tree.exists(&format!("{dir}/device"));
    let devtype = tree.read(&format!("{dir}/uevent")).ok().and_then(|u| {
        u.lines()
            .find_map(|l| l.strip_prefix("DEVTYPE=").map(str::to_string))
    });
    // ARPHRD_LOOPBACK: a loopback not called "lo" is still not a NIC.
    let loopback = tree.read(&format!("{dir}/type")).is_ok_and(|t| t == "772");
    let kind = if loopback {
        "loopback".to_string()
    } else if let Some(devtype) = devtype {
        devtype
    } else if tree.exists(&format!("{dir}/bridge")) {
        "bridge".into()
    } else if tree.exists(&format!("{dir}/bonding")) {
        "bond".into()
    } else if physical {
        "ethernet".into()
    } else {
        "virtual".into()
    };
    let lowers = tree
        .list(&dir)
        .into_iter()
        .filter_map(|e| e.strip_prefix("lower_").map(str::to_string))
        .collect();
    Nic {
        mtu: tree
            .read_u64(&format!("{dir}/mtu"))
            .ok()
            .and_then(|m| u32::try_from(m).ok()),
        operstate: tree
            .read(&format!("{dir}/operstate"))
            .unwrap_or_else(|_| "unknown".into()),
        // A down link reads EINVAL, virtio reads -1 (some kernels print it as u32): all mean
        // "not reported".
        speed_mbps: tree
            .read(&format!("{dir}/speed"))
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&s| s != u64::from(u32::MAX)),
        tx_queue_len: tree.read_u64(&format!("{dir}/tx_queue_len")).ok(),
        master: tree.link_name(&format!("{dir}/master")),
        members: tree.list(&format!("{dir}/brif")),
        lowers,
        physical,
        kind,
        name,
    }
}

/// First counter snapshot of every physical interface.
pub fn first_snapshots(ctx: &DoctorContext, nics: &[Nic]) -> BTreeMap<String, Snapshot> {
    nics.iter()
        .filter(|n| n.physical)
        .map(|n| {
            let snap = ctx.sampler.snapshot(ctx, &n.name, Round::First);
            (n.name.clone(), snap)
        })
        .collect()
}

/// All NIC checks; takes the second counter snapshot, so call it once the window is over.
pub fn checks(
    ctx: &DoctorContext,
    nics: &[Nic],
    first: &BTreeMap<String, Snapshot>,
    window: Duration,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for nic in nics {
        if !nic.physical {
            checks.push(virtual_note(nic));
            continue;
        }
        checks.push(link(nic));
        checks.push(offloads(ctx, &nic.name));
        checks.push(rings(ctx, &nic.name));
        let second = ctx.sampler.snapshot(ctx, &nic.name, Round::Second);
        let before = first.get(&nic.name).cloned().unwrap_or_default();
        checks.push(drops(&nic.name, &before, &second, window));
        checks.push(txqueuelen(nic));
    }
    checks.extend(mtu_relations(nics));
    checks.extend(mtu_consistency(nics));
    checks
}

fn mtu_text(mtu: Option<u32>) -> String {
    mtu.map_or_else(|| "?".into(), |m| m.to_string())
}

fn virtual_note(nic: &Nic) -> Check {
    Check::new(
        format!("nic.{}", nic.name),
        Status::Ok,
        if nic.kind == "virtual" {
            format!("virtual, mtu {}", mtu_text(nic.mtu))
        } else {
            format!("virtual ({}), mtu {}", nic.kind, mtu_text(nic.mtu))
        },
        "-",
        "not a physical port: ring/offload/drop checks skipped, MTU compared with linked interfaces",
    )
}

fn link(nic: &Nic) -> Check {
    let speed = nic
        .speed_mbps
        .map_or_else(|| "speed not reported".into(), |s| format!("{s} Mb/s"));
    let current = format!("{}, {speed}, mtu {}", nic.operstate, mtu_text(nic.mtu));
    let (status, why) = if nic.operstate == "down" {
        (Status::Warn, "link is down (an unused port is fine)")
    } else {
        match nic.speed_mbps {
            Some(s) if s >= LINK_SPEED_MBPS_MIN => (
                Status::Ok,
                "an edge needs 10G+; also check the uplink is really dedicated (iperf3)",
            ),
            Some(_) => (Status::Warn, "slower than the 10G an edge is sized for"),
            None => (
                Status::Warn,
                "driver reports no speed (virtio?): measure with the zero endpoint or iperf3",
            ),
        }
    };
    Check::new(
        format!("nic.{}.link", nic.name),
        status,
        current,
        ">= 10000 Mb/s, up",
        why,
    )
}

fn offloads(ctx: &DoctorContext, iface: &str) -> Check {
    let name = format!("nic.{iface}.offloads");
    let recommended = "tso on, gso on, gro on";
    let why = "segmentation offloads cut per-packet CPU at 10G; a rare driver bug makes TSO slow (measure before disabling)";
    let text = match ctx.runner.run("ethtool", &["-k", iface]) {
        Ok(text) => text,
        Err(e) => {
            return Check::new(
                name,
                Status::Warn,
                format!("cannot read offloads: {e}"),
                recommended,
                why,
            )
        }
    };
    let features = parse_features(&text);
    let mut status = Status::Ok;
    let mut parts = Vec::new();
    for (short, long) in [
        ("tso", "tcp-segmentation-offload"),
        ("gso", "generic-segmentation-offload"),
        ("gro", "generic-receive-offload"),
    ] {
        let state = match features.get(long) {
            Some(f) if f.on => "on",
            Some(f) if f.fixed => "off [fixed]",
            Some(_) => "off",
            None => "unknown",
        };
        if state != "on" {
            status = Status::Warn;
        }
        parts.push(format!("{short} {state}"));
    }
    Check::new(name, status, parts.join(", "), recommended, why)
}

/// Status of one ring: FAIL at a quarter of the maximum or less (512 of 4096 is an eighth),
/// WARN under half.
fn ring_status(current: u32, max: u32) -> Status {
    let (current, max) = (u64::from(current), u64::from(max));
    if current * 4 <= max {
        Status::Fail
    } else if current * 2 < max {
        Status::Warn
    } else {
        Status::Ok
    }
}

fn rings(ctx: &DoctorContext, iface: &str) -> Check {
    let name = format!("nic.{iface}.rings");
    let why = "small rings overflow in bursts: 512 of 4096 dropped ~1M packets in the field report (rx 1.33 -> 5.15 Gbit/s once raised)";
    let parsed = ctx
        .runner
        .run("ethtool", &["-g", iface])
        .map_err(|e| format!("cannot read rings: {e}"))
        .and_then(|text| parse_rings(&text).ok_or_else(|| "cannot parse ethtool -g output".into()));
    let rings = match parsed {
        Ok(r) => r,
        Err(e) => return Check::new(name, Status::Warn, e, "rx/tx at the maximum", why),
    };
    let mut status = Status::Ok;
    let mut parts = Vec::new();
    let mut wanted = Vec::new();
    for (label, current, max) in [
        ("rx", rings.rx_current, rings.rx_max),
        ("tx", rings.tx_current, rings.tx_max),
    ] {
        match (current, max) {
            (Some(c), Some(m)) => {
                status = status.max(ring_status(c, m));
                parts.push(format!("{label} {c} of {m}"));
                wanted.push(format!("{label} {m}"));
            }
            _ => parts.push(format!("{label} n/a")),
        }
    }
    if wanted.is_empty() {
        return Check::new(
            name,
            Status::Warn,
            "driver reports no ring sizes",
            "rx/tx at the maximum",
            why,
        );
    }
    let recommended = format!(
        "{} (ethtool -G {iface} {})",
        wanted.join(", "),
        wanted.join(" ")
    );
    Check::new(name, status, parts.join(", "), recommended, why)
}

/// Growth that only warns: `rx_dropped` also counts frames for unknown protocols/VLANs, and a
/// TX queue restart is back-pressure, not loss.
fn soft_counter(name: &str) -> bool {
    name == "rx_dropped" || name.contains("restart")
}

/// Drop/discard/busy counters and their growth between two snapshots.
pub fn drops(iface: &str, before: &Snapshot, after: &Snapshot, window: Duration) -> Check {
    let name = format!("nic.{iface}.drops");
    let recommended = "no growth";
    let window_ms = window.as_millis();
    if after.counters.is_empty() {
        let why = after.note.clone().unwrap_or_default();
        return Check::new(
            name,
            Status::Warn,
            format!("cannot read drop counters {why}")
                .trim_end()
                .to_string(),
            recommended,
            "drops show ring, queue or CPU overflow",
        );
    }
    let mut grown: Vec<(&String, u64, bool)> = Vec::new();
    let mut totals: Vec<(&String, u64)> = Vec::new();
    for (counter, &value) in &after.counters {
        // A counter that went backwards was reset (driver reload): no growth, not a panic.
        let delta = value.saturating_sub(before.counters.get(counter).copied().unwrap_or(value));
        if delta > 0 {
            grown.push((counter, delta, soft_counter(counter)));
        } else if value > 0 {
            totals.push((counter, value));
        }
    }
    // Hard counters first, biggest growth first.
    grown.sort_by(|a, b| a.2.cmp(&b.2).then(b.1.cmp(&a.1)));
    let status = if grown.iter().any(|g| !g.2) {
        Status::Fail
    } else if grown.is_empty() {
        Status::Ok
    } else {
        Status::Warn
    };
    let mut current = if grown.is_empty() {
        let mut text = format!("no growth in {window_ms} ms");
        if !totals.is_empty() {
            let list: Vec<String> = totals.iter().map(|(c, v)| format!("{c} {v}")).collect();
            text.push_str(&format!("; since boot: {}", shorten(list)));
        }
        text
    } else {
        let list: Vec<String> = grown.iter().map(|(c, d, _)| format!("{c} +{d}")).collect();
        format!("{} in {window_ms} ms", shorten(list))
    };
    if let Some(note) = &after.note {
        current.push_str(&format!(" (ethtool -S: {note})"));
    }
    let why = match status {
        Status::Fail => "ring/queue overflow is losing packets now: raise rings (ethtool -G), txqueuelen, check IRQ CPUs",
        Status::Warn => "rx_dropped also counts unknown protocols and tx restarts are back-pressure: watch the trend",
        Status::Ok => "growing drops mean ring, queue or CPU overflow (tx_busy nonzero = send queue too short)",
    };
    Check::new(name, status, current, recommended, why)
}

fn shorten(mut list: Vec<String>) -> String {
    if list.len() > COUNTERS_SHOWN_MAX {
        let more = list.len() - COUNTERS_SHOWN_MAX;
        list.truncate(COUNTERS_SHOWN_MAX);
        list.push(format!("+{more} more"));
    }
    list.join(", ")
}

fn txqueuelen(nic: &Nic) -> Check {
    let name = format!("nic.{}.txqueuelen", nic.name);
    let recommended = format!(
        ">= {TX_QUEUE_LEN_MIN} (ip link set dev {} txqueuelen {TX_QUEUE_LEN_MIN})",
        nic.name
    );
    let why = "a short device queue drops or stalls sends in 10G bursts (tx_busy/tx_dropped)";
    match nic.tx_queue_len {
        Some(q) if q >= TX_QUEUE_LEN_MIN => {
            Check::new(name, Status::Ok, q.to_string(), recommended, why)
        }
        Some(q) => Check::new(name, Status::Warn, q.to_string(), recommended, why),
        None => Check::new(
            name,
            Status::Warn,
            "cannot read tx_queue_len",
            recommended,
            why,
        ),
    }
}

/// How an upper interface relates to a lower one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Relation {
    /// Bridge or bond port: must share the master's MTU.
    Member,
    /// VLAN/macvlan on its parent: must not exceed the parent's MTU.
    Stacked,
}

/// MTU checks for every (upper, lower) pair linked by `master`, `brif/` or `lower_*`.
fn mtu_relations(nics: &[Nic]) -> Vec<Check> {
    let by_name: BTreeMap<&str, &Nic> = nics.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut pairs: BTreeSet<(String, String, Relation)> = BTreeSet::new();
    for nic in nics {
        if let Some(master) = &nic.master {
            pairs.insert((master.clone(), nic.name.clone(), Relation::Member));
        }
        for member in &nic.members {
            pairs.insert((nic.name.clone(), member.clone(), Relation::Member));
        }
        for lower in &nic.lowers {
            // A bridge/bond port also shows its master as `upper_*` and the master shows the
            // port as `lower_*`: keep that pair as membership.
            let member = by_name
                .get(lower.as_str())
                .is_some_and(|l| l.master.as_deref() == Some(nic.name.as_str()))
                || nic.members.contains(lower);
            if !member {
                pairs.insert((nic.name.clone(), lower.clone(), Relation::Stacked));
            }
        }
    }
    pairs
        .into_iter()
        .filter_map(|(upper, lower, relation)| {
            let up = by_name.get(upper.as_str())?.mtu?;
            let low = by_name.get(lower.as_str())?.mtu?;
            Some(mtu_pair(&upper, up, &lower, low, relation))
        })
        .collect()
}

fn mtu_pair(upper: &str, up: u32, lower: &str, low: u32, relation: Relation) -> Check {
    let name = format!("nic.{upper}.mtu_vs_{lower}");
    let current = format!("{upper} {up}, {lower} {low}");
    let (status, recommended, why) = match relation {
        Relation::Member => (
            if up == low { Status::Ok } else { Status::Fail },
            "equal MTU on the master and every port (1500 unless every hop takes jumbo)",
            "a bridge drops frames bigger than the egress port's MTU: jumbo-frame mismatch cut throughput 70-98% in the field report",
        ),
        Relation::Stacked if up > low => (
            Status::Fail,
            "upper MTU <= lower MTU",
            "frames bigger than the lower device's MTU cannot leave it: dropped or fragmented",
        ),
        Relation::Stacked if up < low => (
            Status::Warn,
            "same MTU as every peer on that network",
            "jumbo frames on the lower device are unused here: fine only if every peer on this VLAN uses the smaller MTU",
        ),
        Relation::Stacked => (
            Status::Ok,
            "upper MTU <= lower MTU",
            "a stacked device fits its lower device's frames",
        ),
    };
    Check::new(name, status, current, recommended, why)
}

/// One check across physical ports that are not down: differing MTUs are the jumbo-frame trap
/// unless each port faces a network that uses its MTU end to end.
fn mtu_consistency(nics: &[Nic]) -> Option<Check> {
    let ports: Vec<(&str, u32)> = nics
        .iter()
        .filter(|n| n.physical && n.operstate != "down")
        .filter_map(|n| Some((n.name.as_str(), n.mtu?)))
        .collect();
    if ports.len() < 2 {
        return None;
    }
    let same = ports.windows(2).all(|w| w[0].1 == w[1].1);
    let current: Vec<String> = ports.iter().map(|(n, m)| format!("{n} {m}")).collect();
    Some(Check::new(
        "nic.mtu_consistency",
        if same { Status::Ok } else { Status::Warn },
        current.join(", "),
        "one MTU per network, matched by every switch and peer",
        "an MTU/jumbo-frame mismatch anywhere on the path silently kills throughput: check every hop",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pairs: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            counters: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            note: None,
        }
    }

    fn nic(name: &str, mtu: u32) -> Nic {
        Nic {
            name: name.into(),
            kind: "ethernet".into(),
            physical: true,
            mtu: Some(mtu),
            operstate: "up".into(),
            speed_mbps: Some(10_000),
            tx_queue_len: Some(1000),
            master: None,
            lowers: vec![],
            members: vec![],
        }
    }

    #[test]
    fn ring_thresholds() {
        assert_eq!(ring_status(512, 4096), Status::Fail);
        assert_eq!(ring_status(1024, 4096), Status::Fail);
        assert_eq!(ring_status(2047, 4096), Status::Warn);
        assert_eq!(ring_status(2048, 4096), Status::Ok);
        assert_eq!(ring_status(256, 256), Status::Ok);
        assert_eq!(ring_status(0, 0), Status::Fail);
    }

    #[test]
    fn drop_growth_grades() {
        let w = Duration::from_millis(1000);
        let base = snap(&[("rx_dropped", 5), ("rx_missed_errors", 10)]);
        let c = drops("eth0", &base, &base, w);
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.current
                .contains("since boot: rx_dropped 5, rx_missed_errors 10"),
            "{}",
            c.current
        );

        let c = drops(
            "eth0",
            &base,
            &snap(&[("rx_dropped", 9), ("rx_missed_errors", 10)]),
            w,
        );
        assert_eq!(c.status, Status::Warn);

        let c = drops(
            "eth0",
            &base,
            &snap(&[("rx_dropped", 9), ("rx_missed_errors", 30)]),
            w,
        );
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.current, "rx_missed_errors +20, rx_dropped +4 in 1000 ms");

        // Reset counters and counters that appear only later are not growth.
        let c = drops(
            "eth0",
            &base,
            &snap(&[("rx_dropped", 0), ("ethtool:tx_busy", 3)]),
            w,
        );
        assert_eq!(c.status, Status::Ok);

        let empty = Snapshot {
            counters: BTreeMap::new(),
            note: Some("ethtool not found".into()),
        };
        assert_eq!(drops("eth0", &empty, &empty, w).status, Status::Warn);
    }

    #[test]
    fn many_counters_are_shortened() {
        let list: Vec<String> = (0..7).map(|i| format!("c{i}")).collect();
        assert_eq!(shorten(list), "c0, c1, c2, c3, +3 more");
    }

    #[test]
    fn mtu_pairs() {
        let mut br = nic("br0", 1500);
        br.physical = false;
        br.members = vec!["eth1".into()];
        let mut eth1 = nic("eth1", 9000);
        eth1.master = Some("br0".into());
        // sysfs also shows the bridge's port as lower_eth1: still one membership pair.
        br.lowers = vec!["eth1".into()];
        let mut vlan = nic("eth0.100", 9000);
        vlan.physical = false;
        vlan.lowers = vec!["eth0".into()];
        let eth0 = nic("eth0", 1500);
        let checks = mtu_relations(&[br, eth0, vlan, eth1]);
        let names: Vec<(&str, Status)> =
            checks.iter().map(|c| (c.name.as_str(), c.status)).collect();
        assert_eq!(
            names,
            vec![
                ("nic.br0.mtu_vs_eth1", Status::Fail),
                ("nic.eth0.100.mtu_vs_eth0", Status::Fail),
            ]
        );
        assert_eq!(
            mtu_pair("v", 1500, "e", 9000, Relation::Stacked).status,
            Status::Warn
        );
        assert_eq!(
            mtu_pair("v", 1500, "e", 1500, Relation::Stacked).status,
            Status::Ok
        );
    }

    #[test]
    fn mtu_consistency_needs_two_ports() {
        assert!(mtu_consistency(&[nic("eth0", 1500)]).is_none());
        let c = mtu_consistency(&[nic("eth0", 1500), nic("eth1", 9000)]).unwrap();
        assert_eq!(
            (c.status, c.current.as_str()),
            (Status::Warn, "eth0 1500, eth1 9000")
        );
        let mut down = nic("eth1", 9000);
        down.operstate = "down".into();
        assert!(mtu_consistency(&[nic("eth0", 1500), down]).is_none());
    }
}
