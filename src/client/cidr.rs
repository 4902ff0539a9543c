//! CIDR blocks and the `trusted_proxies` list: which peers may speak for a client.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Most entries `trusted_proxies` may have (a balancer tier is a handful of blocks).
pub const TRUSTED_PROXIES_MAX: usize = 256;

/// An address block such as `10.0.0.0/8` or `2001:db8::/32` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` (canonical: IPv4-mapped IPv6 counts as IPv4) is inside the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, super::canonical_ip(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => mask32(u32::from(a), self.prefix) == u32::from(n),
            (IpAddr::V6(n), IpAddr::V6(a)) => mask128(u128::from(a), self.prefix) == u128::from(n),
            _ => false,
        }
    }
}

fn mask32(v: u32, prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        v & (u32::MAX << (32 - u32::from(prefix)))
    }
}

/// `v` with only its first `prefix` bits kept.
pub(super) fn mask128(v: u128, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        v & (u128::MAX << (128 - u32::from(prefix)))
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or CIDR block"))?;
        let ip = super::canonical_ip(ip);
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0-{max}"))?,
        };
        let net = match ip {
            IpAddr::V4(a) => IpAddr::V4(mask32(u32::from(a), prefix).into()),
            IpAddr::V6(a) => IpAddr::V6(mask128(u128::from(a), prefix).into()),
        };
        if net != ip {
            return Err(format!(
                "'{s}' has bits set past its /{prefix} prefix (did you mean {net}/{prefix}?)"
            ));
        }
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The peers trusted to speak for a client (PROXY protocol, X-Forwarded-For).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    blocks: Vec<Cidr>,
}

impl TrustedProxies {
    /// Parses the configured list; an entry that is not a block is an error naming it.
    pub fn parse(entries: &[String]) -> Result<TrustedProxies, String> {
        if entries.len() > TRUSTED_PROXIES_MAX {
            return Err(format!(
                "trusted_proxies has {} entries; at most {TRUSTED_PROXIES_MAX}",
                entries.len()
            ));
        }
        let blocks = entries
            .iter()
            .map(|e| e.trim().parse::<Cidr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("trusted_proxies: {e}"))?;
        Ok(TrustedProxies { blocks })
    }

    /// Whether `ip` is one of the trusted peers.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.blocks.iter().any(|b| b.contains(ip))
    }

    /// Whether the list is empty (nobody may speak for a client).
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_match_their_own_family_and_prefix() {
        let t = TrustedProxies::parse(&[
            "10.0.0.0/8".into(),
            "192.0.2.7".into(),
            "2001:db8::/32".into(),
        ])
        .unwrap();
        assert!(t.trusts(ip("10.255.1.2")));
        assert!(t.trusts(ip("::ffff:10.1.1.1")), "v4-mapped counts as v4");
        assert!(t.trusts(ip("192.0.2.7")));
        assert!(!t.trusts(ip("192.0.2.8")));
        assert!(t.trusts(ip("2001:db8:ffff::1")));
        assert!(!t.trusts(ip("2001:db9::1")));
        assert!(!t.trusts(ip("11.0.0.1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::1")));
        assert_eq!(all.to_string(), "0.0.0.0/0");
    }

    #[test]
    fn bad_entries_are_refused_with_their_text() {
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "nope", "::/129", "1.2.3.4/x"] {
            let e = TrustedProxies::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        let many: Vec<String> = (0..=TRUSTED_PROXIES_MAX)
            .map(|_| "1.1.1.1".into())
            .collect();
        assert!(TrustedProxies::parse(&many).is_err());
    }
}
