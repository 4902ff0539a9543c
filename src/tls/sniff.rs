//! The first bytes of a connection: which protocol the client speaks, and the SNI name of a
//! ClientHello (for the access log and metrics; rustls chooses the certificate itself).

/// What a connection's first bytes say about its protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// Too few bytes to tell.
    Unknown,
    /// A TLS handshake record (a ClientHello, as far as the header says).
    TlsHandshake,
    /// An HTTP/1.x request line (an uppercase method token).
    PlainHttp,
    /// Something else.
    Other,
}

/// Classifies the first bytes a client sent.
pub fn classify(bytes: &[u8]) -> FirstBytes {
    match bytes {
        [] => FirstBytes::Unknown,
        // Handshake record, major version 3 (SSL 3.0 .. TLS 1.3 all say 3).
        [0x16] => FirstBytes::Unknown,
        [0x16, 3, ..] => FirstBytes::TlsHandshake,
        // A method token, e.g. "GET ", "HEAD ", "PRI * HTTP/2.0".
        [b, ..] if b.is_ascii_uppercase() => FirstBytes::PlainHttp,
        _ => FirstBytes::Other,
    }
}

/// Longest DNS name kept for logs.
pub const SNI_MAX_BYTES: usize = 253;

/// The `server_name` of the ClientHello at the front of `bytes`, if the first record holds
/// the whole extension list and the name is a plausible host name.
pub fn client_hello_sni(bytes: &[u8]) -> Option<&str> {
    let mut r = Reader(bytes);
    if r.u8()? != 0x16 {
        return None;
    }
    r.take(2)?; // record version
    let record_len = r.u16()? as usize;
    let mut r = Reader(r.take(record_len)?);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let hello_len = r.u24()?;
    let mut r = Reader(r.take(hello_len)?);
    r.take(2 + 32)?; // client_version, random
    let session_id = r.u8()? as usize;
    r.take(session_id)?;
    let suites = r.u16()? as usize;
    r.take(suites)?;
    let compression = r.u8()? as usize;
    r.take(compression)?;
    let ext_len = r.u16()? as usize;
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let typ = exts.u16()?;
        let len = exts.u16()? as usize;
        let data = exts.take(len)?;
        if typ != 0 {
            continue;
        }
        let mut list = Reader(data);
        let list_len = list.u16()? as usize;
        let mut list = Reader(list.take(list_len)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name_len = list.u16()? as usize;
            let name = list.take(name_len)?;
            if name_type == 0 {
                let ok = !name.is_empty()
                    && name.len() <= SNI_MAX_BYTES
                    && name
                        .iter()
                        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
                return ok.then(|| std::str::from_utf8(name).ok()).flatten();
            }
        }
        return None;
    }
    None
}

/// A bounds-checked cursor over bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing;

    #[test]
    fn first_bytes_tell_the_protocol() {
        assert_eq!(classify(b""), FirstBytes::Unknown);
        assert_eq!(classify(b"\x16"), FirstBytes::Unknown);
        assert_eq!(classify(b"\x16\x03\x01\x02\x00"), FirstBytes::TlsHandshake);
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), FirstBytes::PlainHttp);
        assert_eq!(classify(b"PRI * HTTP/2.0"), FirstBytes::PlainHttp);
        assert_eq!(classify(b"\x80\x2e\x01"), FirstBytes::Other);
        assert_eq!(classify(b"\x16\x02"), FirstBytes::Other);
    }

    #[test]
    fn sni_of_a_real_client_hello_and_every_truncation() {
        let hello = testing::client_hello(Some("edge-7.cdn.test"));
        assert_eq!(client_hello_sni(&hello), Some("edge-7.cdn.test"));
        assert_eq!(classify(&hello), FirstBytes::TlsHandshake);
        for cut in 0..hello.len() {
            // Never panics; a cut hello either still has the name or has none.
            let got = client_hello_sni(&hello[..cut]);
            assert!(got.is_none() || got == Some("edge-7.cdn.test"));
        }
        assert_eq!(client_hello_sni(&testing::client_hello(None)), None);
    }

    #[test]
    fn implausible_names_are_not_logged() {
        let mut hello = testing::client_hello(Some("aaaa.test"));
        let at = hello.windows(9).position(|w| w == b"aaaa.test").unwrap();
        hello[at] = b'\n';
        assert_eq!(client_hello_sni(&hello), None);
    }
}
