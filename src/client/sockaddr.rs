//! A `sockaddr_in` / `sockaddr_in6` as the kernel wrote it (bytes in a ring buffer), read
//! without `unsafe`: family in native byte order, port and address in network order.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Bytes of a `sockaddr_in`.
pub const SOCKADDR_IN_BYTES: usize = 16;
/// Bytes of a `sockaddr_in6`.
pub const SOCKADDR_IN6_BYTES: usize = 28;

/// The address in `b` (the first `len` bytes the kernel filled), canonical (`super::canonical`);
/// None for another family or a short buffer.
pub fn parse(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    let addr = match i32::from(family) {
        libc::AF_INET => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope))
        }
        _ => return None,
    };
    Some(super::canonical(addr))
}

/// The bytes the kernel would write for `addr` (tests and the simulator).
pub fn encode(addr: SocketAddr, out: &mut [u8; SOCKADDR_IN6_BYTES]) -> usize {
    *out = [0; SOCKADDR_IN6_BYTES];
    match addr {
        SocketAddr::V4(a) => {
            out[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.ip().octets());
            SOCKADDR_IN_BYTES
        }
        SocketAddr::V6(a) => {
            out[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            out[8..24].copy_from_slice(&a.ip().octets());
            out[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            SOCKADDR_IN6_BYTES
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_families_round_trip_and_others_are_refused() {
        let mut b = [0u8; SOCKADDR_IN6_BYTES];
        for s in ["127.0.0.9:4433", "[2001:db8::5]:80", "[fe80::1%3]:1"] {
            let a: SocketAddr = s.parse().unwrap();
            let n = encode(a, &mut b);
            assert_eq!(parse(&b[..n]), Some(a), "{s}");
        }
        let n = encode("[::ffff:10.1.2.3]:99".parse().unwrap(), &mut b);
        assert_eq!(parse(&b[..n]), Some("10.1.2.3:99".parse().unwrap()));
        assert_eq!(parse(&b[..3]), None);
        b[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(parse(&b), None);
    }
}
