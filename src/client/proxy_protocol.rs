//! The PROXY protocol header (HAProxy's spec, versions 1 and 2) that a TCP balancer puts in
//! front of the client's bytes, so the edge learns the client's address.
//!
//! Pure: `parse` looks at the bytes received so far and says whether a whole header is there,
//! more bytes are needed, or the bytes cannot be a header. The shard accepts a header only
//! from a peer in `trusted_proxies`; anything else closes the connection and is counted.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// The 12-byte signature that starts a version 2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest version 1 header, CRLF included (the spec's 107 bytes).
pub const V1_MAX_BYTES: usize = 107;
/// Fixed part of a version 2 header (signature, version/command, family, length).
pub const V2_FIXED_BYTES: usize = 16;
/// Largest version 2 payload (addresses and TLVs) accepted: HAProxy's own TLVs (ALPN,
/// authority, unique id, SSL) fit well inside; larger is refused, not buffered.
pub const V2_MAX_PAYLOAD_BYTES: usize = 1024;
/// Longest header of either version.
pub const MAX_HEADER_BYTES: usize = V2_FIXED_BYTES + V2_MAX_PAYLOAD_BYTES;

/// What the bytes so far are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parse {
    /// A prefix of a header that may still be valid: wait for more bytes.
    Incomplete,
    /// A whole header of `len` bytes; `source` is the client's address, or None when the
    /// header says the connection is the proxy's own (v2 LOCAL, v1 UNKNOWN, v2 UNSPEC/UNIX):
    /// the TCP peer then stands for itself.
    Done {
        /// Bytes of the header (the client's own bytes follow).
        len: usize,
        /// The client's address.
        source: Option<SocketAddr>,
    },
    /// Not a PROXY header, or a malformed one.
    Invalid(&'static str),
}

/// Parses the header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Parse {
    if buf.is_empty() {
        return Parse::Incomplete;
    }
    let v2_prefix = buf.len().min(V2_SIGNATURE.len());
    if buf[..v2_prefix] == V2_SIGNATURE[..v2_prefix] {
        return if buf.len() < V2_SIGNATURE.len() {
            Parse::Incomplete
        } else {
            parse_v2(buf)
        };
    }
    const V1_START: &[u8] = b"PROXY ";
    let v1_prefix = buf.len().min(V1_START.len());
    if buf[..v1_prefix] == V1_START[..v1_prefix] {
        return if buf.len() < V1_START.len() {
            Parse::Incomplete
        } else {
            parse_v1(buf)
        };
    }
    Parse::Invalid("not a PROXY protocol header")
}

fn parse_v2(buf: &[u8]) -> Parse {
    if buf.len() < V2_FIXED_BYTES {
        // Check what is there already: a wrong version is known at byte 13.
        if let Some(&vc) = buf.get(12) {
            if vc >> 4 != 2 {
                return Parse::Invalid("PROXY v2: version is not 2");
            }
        }
        return Parse::Incomplete;
    }
    let ver_cmd = buf[12];
    let fam = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Parse::Invalid("PROXY v2: version is not 2");
    }
    let command = ver_cmd & 0x0f;
    if command > 1 {
        return Parse::Invalid("PROXY v2: unknown command");
    }
    if len > V2_MAX_PAYLOAD_BYTES {
        return Parse::Invalid("PROXY v2: header longer than V2_MAX_PAYLOAD_BYTES");
    }
    let total = V2_FIXED_BYTES + len;
    if buf.len() < total {
        return Parse::Incomplete;
    }
    let body = &buf[V2_FIXED_BYTES..total];
    // LOCAL: the proxy's own connection (health checks); the addresses are ignored.
    if command == 0 {
        return Parse::Done {
            len: total,
            source: None,
        };
    }
    let source = match fam {
        // TCP over IPv4: src 4, dst 4, src port 2, dst port 2.
        0x11 => {
            if body.len() < 12 {
                return Parse::Invalid("PROXY v2: IPv4 addresses truncated");
            }
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            Some(SocketAddr::new(
                ip.into(),
                u16::from_be_bytes([body[8], body[9]]),
            ))
        }
        // TCP over IPv6: src 16, dst 16, src port 2, dst port 2.
        0x21 => {
            if body.len() < 36 {
                return Parse::Invalid("PROXY v2: IPv6 addresses truncated");
            }
            let ip: [u8; 16] = body[0..16].try_into().expect("16 bytes");
            let port = u16::from_be_bytes([body[32], body[33]]);
            Some(super::canonical(SocketAddr::new(
                Ipv6Addr::from(ip).into(),
                port,
            )))
        }
        // UNSPEC or UNIX: nothing we can log as an IP; the peer stands.
        0x00 | 0x31 | 0x32 => None,
        0x12 | 0x22 => return Parse::Invalid("PROXY v2: UDP is not TCP"),
        _ => return Parse::Invalid("PROXY v2: unknown address family"),
    };
    Parse::Done { len: total, source }
}

fn parse_v1(buf: &[u8]) -> Parse {
    let window = &buf[..buf.len().min(V1_MAX_BYTES)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if window.contains(&b'\n') {
            return Parse::Invalid("PROXY v1: line ends without CR");
        }
        return if buf.len() >= V1_MAX_BYTES {
            Parse::Invalid("PROXY v1: line longer than 107 bytes")
        } else if window[6..]
            .iter()
            .all(|b| b.is_ascii_graphic() || *b == b' ')
        {
            Parse::Incomplete
        } else {
            Parse::Invalid("PROXY v1: bytes that are not text")
        };
    };
    match window.get(cr + 1) {
        None => return Parse::Incomplete,
        Some(b'\n') => {}
        Some(_) => return Parse::Invalid("PROXY v1: CR not followed by LF"),
    }
    // The same rule as for an incomplete line above, so a header split over receives is
    // judged as it would be whole (a NUL after UNKNOWN was accepted whole, refused in part).
    if !window[6..cr]
        .iter()
        .all(|b| b.is_ascii_graphic() || *b == b' ')
    {
        return Parse::Invalid("PROXY v1: bytes that are not text");
    }
    let Ok(line) = std::str::from_utf8(&window[6..cr]) else {
        return Parse::Invalid("PROXY v1: bytes that are not text");
    };
    let len = cr + 2;
    let mut parts = line.split(' ');
    let proto = parts.next().unwrap_or("");
    if proto == "UNKNOWN" {
        return Parse::Done { len, source: None };
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Parse::Invalid("PROXY v1: wants protocol, two addresses and two ports");
    };
    let port = |p: &str| -> Option<u16> {
        // No sign, no leading zero (the spec's form), 0-65535.
        if p.is_empty() || p.len() > 5 || (p.len() > 1 && p.starts_with('0')) {
            return None;
        }
        p.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| p.parse().ok())?
    };
    let (Some(sport), Some(_)) = (port(sport), port(dport)) else {
        return Parse::Invalid("PROXY v1: bad port");
    };
    let source = match proto {
        "TCP4" => match (src.parse::<Ipv4Addr>(), dst.parse::<Ipv4Addr>()) {
            (Ok(s), Ok(_)) => SocketAddr::new(s.into(), sport),
            _ => return Parse::Invalid("PROXY v1: bad IPv4 address"),
        },
        "TCP6" => match (src.parse::<Ipv6Addr>(), dst.parse::<Ipv6Addr>()) {
            (Ok(s), Ok(_)) => super::canonical(SocketAddr::new(s.into(), sport)),
            _ => return Parse::Invalid("PROXY v1: bad IPv6 address"),
        },
        _ => return Parse::Invalid("PROXY v1: protocol is not TCP4, TCP6 or UNKNOWN"),
    };
    Parse::Done {
        len,
        source: Some(source),
    }
}

/// A version 2 header for `source` -> `dest` (what HAProxy's `send-proxy-v2` sends; for tests).
pub fn encode_v2(source: SocketAddr, dest: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21);
    match (source, dest) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        (s, d) => {
            let v6 = |a: SocketAddr| match a {
                SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
                SocketAddr::V6(a) => *a.ip(),
            };
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
    }
}

/// How a connection's PROXY header ended (counted by result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A header from a trusted peer named the client.
    Accepted,
    /// A header from a trusted peer for the proxy's own connection (v2 LOCAL, v1 UNKNOWN):
    /// the peer stands for itself.
    Local,
    /// Bytes from a peer not in `trusted_proxies` (or whose address is unknown).
    Untrusted,
    /// Bytes that are not a valid header, or one over `MAX_HEADER_BYTES`.
    Malformed,
    /// The peer closed before its header was complete.
    Truncated,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Local => "local",
            Outcome::Untrusted => "untrusted",
            Outcome::Malformed => "malformed",
            Outcome::Truncated => "truncated",
        }
    }
}

/// What the bytes received so far decide.
#[derive(Debug, PartialEq, Eq)]
pub enum Feed {
    /// The header is not complete yet: receive more.
    NeedMore,
    /// Close the connection.
    Refuse(Outcome),
    /// The header is done: `client` (None: the peer stands); the client's own bytes are the
    /// ones of this receive from `rest_from` on (every earlier byte was the header's).
    Done {
        /// Accepted or Local.
        outcome: Outcome,
        /// The client's address.
        client: Option<SocketAddr>,
        /// Where the client's bytes begin in the data just fed.
        rest_from: usize,
    },
}

/// A connection waiting for its PROXY header. A header that arrives whole in one receive is
/// parsed where it lies; only one split over receives is buffered, at most
/// `MAX_HEADER_BYTES` of it.
#[derive(Debug, Default)]
pub struct Stage {
    buf: Vec<u8>,
}

impl Stage {
    /// Takes the next received bytes; `trusted`: the peer is in `trusted_proxies`.
    pub fn feed(&mut self, data: &[u8], trusted: bool) -> Feed {
        if !trusted {
            return Feed::Refuse(Outcome::Untrusted);
        }
        // Header bytes buffered from earlier receives (an incomplete parse means every one
        // of them belongs to the header).
        let before = self.buf.len();
        let parsed = if before == 0 {
            parse(data)
        } else {
            // One byte past the limit is enough to know the header is too long.
            let take = data
                .len()
                .min((MAX_HEADER_BYTES + 1).saturating_sub(before));
            self.buf.extend_from_slice(&data[..take]);
            parse(&self.buf)
        };
        match parsed {
            Parse::Incomplete => {
                if before == 0 {
                    let take = data.len().min(MAX_HEADER_BYTES + 1);
                    self.buf.extend_from_slice(&data[..take]);
                }
                if self.buf.len() > MAX_HEADER_BYTES {
                    Feed::Refuse(Outcome::Malformed)
                } else {
                    Feed::NeedMore
                }
            }
            Parse::Invalid(_) => Feed::Refuse(Outcome::Malformed),
            Parse::Done { len, source } => {
                assert!(len >= before, "buffered bytes past the header");
                self.buf = Vec::new();
                let outcome = if source.is_some() {
                    Outcome::Accepted
                } else {
                    Outcome::Local
                };
                Feed::Done {
                    outcome,
                    client: source,
                    rest_from: len - before,
                }
            }
        }
    }

    /// Whether part of a header has arrived (a close now is a truncation).
    pub fn started(&self) -> bool {
        !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let h = b"PROXY TCP4 203.0.113.9 192.0.2.1 56324 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(h),
            Parse::Done {
                len: 44,
                source: Some(addr("203.0.113.9:56324"))
            }
        );
        let h = b"PROXY TCP6 2001:db8::7 2001:db8::1 1 80\r\n";
        assert_eq!(
            parse(h),
            Parse::Done {
                len: h.len(),
                source: Some(addr("[2001:db8::7]:1"))
            }
        );
        let h = b"PROXY UNKNOWN\r\n";
        assert_eq!(
            parse(h),
            Parse::Done {
                len: h.len(),
                source: None
            }
        );
    }

    /// Found by the proxy_header fuzz target: a control byte after UNKNOWN was accepted when
    /// the line came whole and refused when it came in part; now refused both ways.
    #[test]
    fn a_control_byte_is_refused_whole_and_in_part() {
        let h = b"PROXY UNKNOWN \0\0\0 2 99999 4\r\n";
        assert_eq!(
            parse(h),
            Parse::Invalid("PROXY v1: bytes that are not text")
        );
        assert_eq!(
            parse(&h[..16]),
            Parse::Invalid("PROXY v1: bytes that are not text")
        );
        let tab = b"PROXY TCP4\t1.2.3.4 5.6.7.8 1 2\r\n";
        assert!(matches!(parse(tab), Parse::Invalid(_)));
    }

    #[test]
    fn v2_inet_inet6_local_and_tlvs() {
        let mut h = Vec::new();
        encode_v2(addr("198.51.100.4:61000"), addr("10.0.0.1:443"), &mut h);
        h.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            parse(&h),
            Parse::Done {
                len: 28,
                source: Some(addr("198.51.100.4:61000"))
            }
        );
        let mut h = Vec::new();
        encode_v2(addr("[2001:db8::9]:7"), addr("[2001:db8::1]:443"), &mut h);
        assert_eq!(
            parse(&h),
            Parse::Done {
                len: 52,
                source: Some(addr("[2001:db8::9]:7"))
            }
        );
        // A TLV after the addresses is part of the header and skipped.
        let mut h = Vec::new();
        encode_v2(addr("1.2.3.4:5"), addr("5.6.7.8:9"), &mut h);
        h[14..16].copy_from_slice(&(12u16 + 7).to_be_bytes());
        h.extend_from_slice(&[0x01, 0x00, 0x04, b'h', b't', b't', b'p']);
        assert_eq!(
            parse(&h),
            Parse::Done {
                len: 35,
                source: Some(addr("1.2.3.4:5"))
            }
        );
        // LOCAL (health check): the peer stands.
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        assert_eq!(
            parse(&h),
            Parse::Done {
                len: 16,
                source: None
            }
        );
    }

    #[test]
    fn every_truncation_is_incomplete_and_never_done() {
        let mut v2 = Vec::new();
        encode_v2(addr("198.51.100.4:61000"), addr("10.0.0.1:443"), &mut v2);
        let v1 = b"PROXY TCP4 203.0.113.9 192.0.2.1 56324 443\r\n".to_vec();
        for h in [v2, v1] {
            for cut in 0..h.len() {
                assert_eq!(parse(&h[..cut]), Parse::Incomplete, "cut at {cut}");
            }
            assert!(matches!(parse(&h), Parse::Done { .. }));
        }
    }

    #[test]
    fn malformed_headers_are_invalid() {
        let bad: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\n",
            b"\x16\x03\x01\x02\x00",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX",
            b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4\x00 5.6.7.8 1 2\r\n",
        ];
        for b in bad {
            assert!(
                matches!(parse(b), Parse::Invalid(_)),
                "{:?}",
                String::from_utf8_lossy(b)
            );
        }
        let long = [b"PROXY ".as_slice(), &[b'1'; 120]].concat();
        assert!(matches!(parse(&long), Parse::Invalid(_)));
        // v2: wrong version, unknown command, UDP, too long.
        let mut h = Vec::new();
        encode_v2(addr("1.2.3.4:5"), addr("5.6.7.8:9"), &mut h);
        for (i, v) in [(12, 0x11u8), (12, 0x22), (13, 0x12)] {
            let mut b = h.clone();
            b[i] = v;
            assert!(matches!(parse(&b), Parse::Invalid(_)), "byte {i} = {v:#x}");
        }
        let mut b = h.clone();
        b[14..16].copy_from_slice(&((V2_MAX_PAYLOAD_BYTES + 1) as u16).to_be_bytes());
        assert!(matches!(parse(&b), Parse::Invalid(_)));
        let mut b = h.clone();
        b[14..16].copy_from_slice(&4u16.to_be_bytes());
        assert!(
            matches!(parse(&b), Parse::Invalid(_)),
            "IPv4 body too short"
        );
    }

    proptest! {
        #[test]
        fn never_panics_and_done_is_within_the_buffer(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Parse::Done { len, .. } = parse(&b) {
                prop_assert!(len <= b.len() && len <= MAX_HEADER_BYTES);
            }
            let mut with_sig = V2_SIGNATURE.to_vec();
            with_sig.extend_from_slice(&b);
            if let Parse::Done { len, .. } = parse(&with_sig) {
                prop_assert!(len <= with_sig.len());
            }
        }
    }

    #[test]
    fn the_stage_hands_on_the_bytes_after_the_header_in_any_split() {
        let mut h = Vec::new();
        encode_v2(addr("198.51.100.4:61000"), addr("10.0.0.1:443"), &mut h);
        h.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        for cut in 0..h.len() {
            let mut st = Stage::default();
            let first = st.feed(&h[..cut], true);
            // The client's bytes are the fed data's from `rest_from` on.
            let (got, fed) = if cut >= 28 {
                (first, &h[..cut])
            } else {
                assert_eq!(first, Feed::NeedMore, "cut {cut}");
                assert_eq!(st.started(), cut > 0);
                (st.feed(&h[cut..], true), &h[cut..])
            };
            let Feed::Done {
                outcome,
                client,
                rest_from,
            } = got
            else {
                panic!("cut {cut}: {got:?}");
            };
            assert_eq!(outcome, Outcome::Accepted);
            assert_eq!(client, Some(addr("198.51.100.4:61000")));
            let rest_at = if cut >= 28 { 28 } else { 28 - cut };
            assert_eq!(rest_from, rest_at, "cut {cut}");
            assert_eq!(&fed[rest_from..], &h[28..28 + fed.len() - rest_from]);
            assert!(!st.started(), "nothing kept once done");
        }
        assert_eq!(
            Stage::default().feed(&h, false),
            Feed::Refuse(Outcome::Untrusted)
        );
        assert_eq!(
            Stage::default().feed(b"GET / HTTP/1.1\r\n", true),
            Feed::Refuse(Outcome::Malformed)
        );
        // A v2 header that claims the largest payload: refused once over the limit, never
        // buffered past it.
        let mut big = V2_SIGNATURE.to_vec();
        big.extend_from_slice(&[0x21, 0x11]);
        big.extend_from_slice(&(V2_MAX_PAYLOAD_BYTES as u16).to_be_bytes());
        let mut st = Stage::default();
        assert_eq!(st.feed(&big, true), Feed::NeedMore);
        let pad = vec![0u8; 600];
        assert_eq!(st.feed(&pad, true), Feed::NeedMore);
        assert!(matches!(st.feed(&pad, true), Feed::Done { .. }));
    }
}
