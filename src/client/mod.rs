//! Who is asking: the client's address as the edge should log and judge it.
//!
//! Every connection knows its peer (the shard asks the kernel right after accept,
//! `SO_PEERNAME` on the direct descriptor). Behind a balancer the peer is the balancer, so the
//! address it forwards counts instead, but only when the peer is one of `trusted_proxies`:
//! the PROXY protocol header at the start of the connection (`proxy_protocol`), or the
//! `X-Forwarded-For` / `Forwarded` header of a request (`forwarded`). Everything here is pure
//! parsing and matching; the shard's machine holds one `Client` per connection.

pub mod cap;
pub mod cidr;
pub mod forwarded;
pub mod proxy_protocol;
pub mod sockaddr;

use std::net::{IpAddr, SocketAddr};

pub use cidr::{Cidr, TrustedProxies};

/// One connection's view of who is asking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Client {
    /// The TCP peer (None until the kernel answered, or if it could not).
    pub peer: Option<SocketAddr>,
    /// The address a trusted proxy gave for the connection (PROXY protocol).
    pub proxied: Option<SocketAddr>,
    /// The peer is in `trusted_proxies` (it may name the client).
    pub trusted: bool,
}

impl Client {
    /// The connection's client: the proxied address if a trusted proxy gave one, else the peer.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.proxied.or(self.peer)
    }
}

/// An address in its canonical form: an IPv4-mapped IPv6 address (a v4 client on a dual-stack
/// listener) becomes the IPv4 address, so logs and CIDR matches see one form.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => addr,
        },
        v4 => v4,
    }
}

/// `canonical` for a bare IP.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxied_address_wins_and_mapped_addresses_become_v4() {
        let peer: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let mut c = Client {
            peer: Some(peer),
            ..Client::default()
        };
        assert_eq!(c.addr(), Some(peer));
        let real: SocketAddr = "203.0.113.7:5555".parse().unwrap();
        c.proxied = Some(real);
        assert_eq!(c.addr(), Some(real));
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:80".parse().unwrap();
        assert_eq!(canonical(mapped), "192.0.2.1:80".parse().unwrap());
        let v6: SocketAddr = "[2001:db8::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
