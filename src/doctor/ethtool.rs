//! Parsers for the text output of `ethtool -g` (rings), `-k` (features) and `-S` (statistics).
//! Pure functions so they are tested on captured outputs; the tool is run elsewhere with
//! `LC_ALL=C`. Unknown or malformed lines are skipped, never fatal.

use std::collections::BTreeMap;

/// Receive/transmit ring sizes, maximum and current; `None` where the driver says `n/a`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rings {
    /// Largest RX ring the driver supports.
    pub rx_max: Option<u32>,
    /// Largest TX ring the driver supports.
    pub tx_max: Option<u32>,
    /// RX ring in use.
    pub rx_current: Option<u32>,
    /// TX ring in use.
    pub tx_current: Option<u32>,
}

/// Parses `ethtool -g`; `None` when neither section is present (not ring output at all).
pub fn parse_rings(text: &str) -> Option<Rings> {
    #[derive(PartialEq)]
    enum Section {
        None,
        Max,
        Current,
    }
    let mut section = Section::None;
    let mut seen = false;
    let mut rings = Rings::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Pre-set maximums") {
            section = Section::Max;
            seen = true;
            continue;
        }
        if line.starts_with("Current hardware settings") {
            section = Section::Current;
            seen = true;
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().parse::<u32>().ok();
        let slot = match (&section, key.trim()) {
            (Section::Max, "RX") => &mut rings.rx_max,
            (Section::Max, "TX") => &mut rings.tx_max,
            (Section::Current, "RX") => &mut rings.rx_current,
            (Section::Current, "TX") => &mut rings.tx_current,
            _ => continue,
        };
        *slot = value;
    }
    seen.then_some(rings)
}

/// One `ethtool -k` feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    /// Whether it is on.
    pub on: bool,
    /// `[fixed]`: the driver does not let it change.
    pub fixed: bool,
}

/// Parses `ethtool -k` into feature name -> state.
pub fn parse_features(text: &str) -> BTreeMap<String, Feature> {
    let mut features = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.trim().split_once(':') else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let on = match words.next() {
            Some("on") => true,
            Some("off") => false,
            _ => continue,
        };
        let fixed = rest.contains("[fixed]");
        features.insert(name.trim().to_string(), Feature { on, fixed });
    }
    features
}

/// Parses `ethtool -S` into counter name -> value (first occurrence wins).
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.trim().rsplit_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            continue;
        }
        if let Ok(v) = value.parse::<u64>() {
            stats.entry(name.to_string()).or_insert(v);
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from an ixgbe port left at the driver default (the 512-of-4096 trap).
    const RINGS_IXGBE: &str = "Ring parameters for eth0:
Pre-set maximums:
RX:\t\t\t4096
RX Mini:\t\tn/a
RX Jumbo:\t\tn/a
TX:\t\t\t4096
Current hardware settings:
RX:\t\t\t512
RX Mini:\t\tn/a
RX Jumbo:\t\tn/a
TX:\t\t\t512
RX Buf Len:\t\tn/a
CQE Size:\t\tn/a
TX Push:\t\toff
TCP data split:\t\tn/a
";

    // virtio_net: fixed rings, maximum already in use.
    const RINGS_VIRTIO: &str = "Ring parameters for eth0:
Pre-set maximums:
RX:\t\t256
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t256
Current hardware settings:
RX:\t\t256
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t256
";

    const FEATURES: &str = "Features for eth0:
rx-checksumming: on
tx-checksumming: on
\ttx-checksum-ipv4: off [fixed]
scatter-gather: on
tcp-segmentation-offload: off
\ttx-tcp-segmentation: off
\ttx-tcp6-segmentation: off
generic-segmentation-offload: on
generic-receive-offload: on
large-receive-offload: off [fixed]
rx-vlan-filter: on [fixed]
";

    const STATS: &str = "NIC statistics:
     rx_packets: 1849329
     tx_packets: 2011293
     rx_queue_0_drops: 12
     tx_busy: 40
     rx_discards_phy: 7
     weird line without value:
     : 5
     tx_busy: 99
";

    #[test]
    fn rings_trap_is_parsed() {
        let r = parse_rings(RINGS_IXGBE).unwrap();
        assert_eq!(
            r,
            Rings {
                rx_max: Some(4096),
                tx_max: Some(4096),
                rx_current: Some(512),
                tx_current: Some(512)
            }
        );
        let v = parse_rings(RINGS_VIRTIO).unwrap();
        assert_eq!(v.rx_max, v.rx_current);
    }

    #[test]
    fn rings_reject_other_text() {
        assert_eq!(parse_rings(""), None);
        assert_eq!(parse_rings("netlink error: Operation not supported"), None);
        // Truncated output keeps what was there.
        let r = parse_rings("Pre-set maximums:\nRX: 4096\n").unwrap();
        assert_eq!((r.rx_max, r.rx_current), (Some(4096), None));
        assert_eq!(
            parse_rings("Pre-set maximums:\nRX: n/a\n").unwrap().rx_max,
            None
        );
    }

    #[test]
    fn features_are_parsed() {
        let f = parse_features(FEATURES);
        assert_eq!(
            f["tcp-segmentation-offload"],
            Feature {
                on: false,
                fixed: false
            }
        );
        assert!(f["generic-receive-offload"].on);
        assert!(f["large-receive-offload"].fixed);
        assert!(f["tx-checksum-ipv4"].fixed);
        assert!(!f.contains_key("Features for eth0"));
    }

    #[test]
    fn stats_are_parsed() {
        let s = parse_stats(STATS);
        assert_eq!(s["tx_busy"], 40, "first occurrence wins");
        assert_eq!(s["rx_queue_0_drops"], 12);
        assert_eq!(s["rx_discards_phy"], 7);
        assert!(!s.contains_key("NIC statistics"));
        assert_eq!(s.len(), 5);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(text in "\\PC*") {
            let _ = parse_rings(&text);
            let _ = parse_features(&text);
            let _ = parse_stats(&text);
        }
    }
}
