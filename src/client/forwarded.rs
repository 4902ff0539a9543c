//! The client address a trusted proxy forwards in a request header: `X-Forwarded-For`
//! (`client, proxy1, proxy2`) or RFC 7239 `Forwarded` (`for=client, for="[v6]:port"`).
//!
//! As nginx's `real_ip_recursive on`: start from the TCP peer and, while the address in hand
//! is a trusted proxy, step one hop to the left. The first untrusted hop is the client; a
//! header from an untrusted peer is ignored entirely (anyone can write one).

use std::net::IpAddr;

use super::TrustedProxies;

/// Most hops looked at in one header (a longer chain is cut at its right-most hops).
pub const FORWARDED_HOPS_MAX: usize = 32;

/// The client's IP given the TCP peer (or PROXY address) `peer` and the lines of
/// `X-Forwarded-For` (`xff`) and `Forwarded` (`fwd`), each read as one list (its lines joined
/// by commas, as RFC 9110 5.3 says): `peer` unless it is trusted and the header names someone
/// further left. A hop that is not an address stops the walk.
pub fn client_ip(peer: IpAddr, xff: &[&[u8]], fwd: &[&[u8]], trusted: &TrustedProxies) -> IpAddr {
    let peer = super::canonical_ip(peer);
    if !trusted.trusts(peer) {
        return peer;
    }
    // Right to left, without collecting: the nearest hop first.
    if !xff.is_empty() {
        let hops = xff.iter().rev().flat_map(|l| split_list(l).rev());
        walk(peer, hops.map(parse_xff_hop), trusted)
    } else {
        let hops = fwd.iter().rev().flat_map(|l| split_list(l).rev());
        walk(peer, hops.map(parse_forwarded_element), trusted)
    }
}

/// Steps left from `peer` through `hops` (nearest first) while the address in hand is trusted.
fn walk(
    peer: IpAddr,
    hops: impl Iterator<Item = Option<IpAddr>>,
    trusted: &TrustedProxies,
) -> IpAddr {
    let mut client = peer;
    for hop in hops.take(FORWARDED_HOPS_MAX) {
        if !trusted.trusts(client) {
            break;
        }
        match hop {
            Some(ip) => client = super::canonical_ip(ip),
            None => break,
        }
    }
    client
}

fn split_list(v: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(trim)
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// One `X-Forwarded-For` hop: an address, optionally `[v6]:port` or `v4:port`.
fn parse_xff_hop(h: &[u8]) -> Option<IpAddr> {
    parse_node(std::str::from_utf8(h).ok()?)
}

/// An address as a node: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, _) = rest.split_once(']')?;
        return ip.parse().ok();
    }
    let (ip, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` of one `Forwarded` element (`for=192.0.2.60;proto=http;by=...`).
fn parse_forwarded_element(e: &[u8]) -> Option<IpAddr> {
    let e = std::str::from_utf8(e).ok()?;
    let value = e.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    })?;
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    parse_node(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted() -> TrustedProxies {
        TrustedProxies::parse(&["10.0.0.0/8".into(), "2001:db8:1::/48".into()]).unwrap()
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let t = trusted();
        let peer = ip("10.0.0.1");
        let xff = b"198.51.100.1, 203.0.113.5, 10.9.9.9";
        assert_eq!(client_ip(peer, &[&xff[..]], &[], &t), ip("203.0.113.5"));
        // All hops trusted: the left-most.
        assert_eq!(
            client_ip(peer, &[&b"10.1.1.1 ,10.2.2.2"[..]], &[], &t),
            ip("10.1.1.1")
        );
        assert_eq!(
            client_ip(peer, &[&b"[2001:db8::77]:443, 10.0.0.9:80"[..]], &[], &t),
            ip("2001:db8::77")
        );
        // A hop that is not an address stops the walk at the last trusted address.
        assert_eq!(
            client_ip(peer, &[&b"198.51.100.1, unknown, 10.0.0.3"[..]], &[], &t),
            ip("10.0.0.3")
        );
    }

    #[test]
    fn several_lines_read_as_one_list() {
        let t = trusted();
        let peer = ip("10.0.0.1");
        // A proxy that added its own line instead of appending: the walk goes on leftwards
        // into the earlier line.
        let lines: [&[u8]; 2] = [b"198.51.100.1, 203.0.113.5", b"10.7.7.7"];
        assert_eq!(client_ip(peer, &lines, &[], &t), ip("203.0.113.5"));
        let lines: [&[u8]; 2] = [b"198.51.100.9", b"10.7.7.7, 10.8.8.8"];
        assert_eq!(client_ip(peer, &lines, &[], &t), ip("198.51.100.9"));
    }

    #[test]
    fn an_untrusted_peer_cannot_spoof() {
        let t = trusted();
        let peer = ip("192.0.2.99");
        assert_eq!(client_ip(peer, &[&b"1.1.1.1"[..]], &[], &t), peer);
        assert_eq!(client_ip(peer, &[], &[&b"for=1.1.1.1"[..]], &t), peer);
        // Nobody trusted at all.
        let none = TrustedProxies::default();
        assert_eq!(
            client_ip(ip("10.0.0.1"), &[&b"1.1.1.1"[..]], &[], &none),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn forwarded_elements_and_quoted_v6() {
        let t = trusted();
        let peer = ip("10.0.0.1");
        let f = b"for=192.0.2.60;proto=http;by=203.0.113.43, for=\"[2001:db8:cafe::17]:4711\"";
        assert_eq!(client_ip(peer, &[], &[&f[..]], &t), ip("2001:db8:cafe::17"));
        assert_eq!(
            client_ip(peer, &[], &[&b"For=\"198.51.100.17\""[..]], &t),
            ip("198.51.100.17")
        );
        assert_eq!(client_ip(peer, &[], &[&b"for=_hidden"[..]], &t), peer);
        // X-Forwarded-For wins when both are there.
        assert_eq!(
            client_ip(peer, &[&b"198.51.100.1"[..]], &[&b"for=1.1.1.1"[..]], &t),
            ip("198.51.100.1")
        );
    }
}
