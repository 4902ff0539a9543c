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

/// Extension types RFC 8446 9.2 requires of a ClientHello that offers TLS 1.3.
const EXT_SUPPORTED_GROUPS: u16 = 10;
const EXT_SIGNATURE_ALGORITHMS: u16 = 13;
const EXT_PRE_SHARED_KEY: u16 = 41;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const EXT_KEY_SHARE: u16 = 51;
/// TLS 1.3's version number in supported_versions.
const TLS13: [u8; 2] = [3, 4];

/// The `server_name` of the ClientHello at the front of `bytes`, if the first record holds
/// the whole extension list and the name is a plausible host name.
pub fn client_hello_sni(bytes: &[u8]) -> Option<&str> {
    let data = Extensions(client_hello_extensions(bytes)?)
        .find(|&(typ, _)| typ == 0)?
        .1;
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
    None
}

/// Whether the ClientHello at the front of `bytes` (whole in its first record) offers TLS
/// 1.3 without an extension RFC 8446 9.2 then requires: supported_groups without key_share or
/// the reverse, or (without pre_shared_key) no signature_algorithms or supported_groups. The
/// RFC's answer is missing_extension; rustls answers handshake_failure (its
/// `PeerIncompatible` errors). A hello split over records, or one that does not parse, is
/// left to rustls.
pub fn tls13_hello_missing_extension(bytes: &[u8]) -> bool {
    let Some(exts) = client_hello_extensions(bytes) else {
        return false;
    };
    let has = |want: u16| Extensions(exts).any(|(typ, _)| typ == want);
    let offers_tls13 = Extensions(exts)
        .find(|&(typ, _)| typ == EXT_SUPPORTED_VERSIONS)
        .and_then(|(_, body)| body.get(1..))
        .is_some_and(|list| list.chunks_exact(2).any(|v| v == TLS13));
    if !offers_tls13 {
        return false;
    }
    let (groups, shares) = (has(EXT_SUPPORTED_GROUPS), has(EXT_KEY_SHARE));
    // A PSK hello may leave out both (psk_ke); any other needs groups and signatures.
    let enough = has(EXT_PRE_SHARED_KEY) || (groups && has(EXT_SIGNATURE_ALGORITHMS));
    groups != shares || !enough
}

/// The extension list of the ClientHello at the front of `bytes`, if the first record holds
/// the whole hello and its fields up to the list parse.
fn client_hello_extensions(bytes: &[u8]) -> Option<&[u8]> {
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
    r.take(ext_len)
}

/// The (type, body) of each extension in a list, up to the first that does not parse.
struct Extensions<'a>(&'a [u8]);

impl<'a> Iterator for Extensions<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<(u16, &'a [u8])> {
        let mut r = Reader(self.0);
        let typ = r.u16()?;
        let len = r.u16()? as usize;
        let body = r.take(len);
        // A malformed tail ends the walk.
        self.0 = if body.is_some() { r.0 } else { &[] };
        Some((typ, body?))
    }
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

    /// `hello` with each extension of type `from` renamed `to` (an unknown type: the
    /// extension is as good as gone, and no length changes).
    fn rename_extension(mut hello: Vec<u8>, from: u16, to: u16) -> Vec<u8> {
        let exts = client_hello_extensions(&hello).unwrap();
        let mut at = exts.as_ptr() as usize - hello.as_ptr() as usize;
        let end = at + exts.len();
        while at < end {
            let typ = u16::from_be_bytes([hello[at], hello[at + 1]]);
            let len = usize::from(u16::from_be_bytes([hello[at + 2], hello[at + 3]]));
            if typ == from {
                hello[at..at + 2].copy_from_slice(&to.to_be_bytes());
            }
            at += 4 + len;
        }
        hello
    }

    #[test]
    fn a_tls13_hello_without_an_extension_rfc_8446_requires_is_told_apart() {
        const UNKNOWN: u16 = 0xfafa;
        let hello = testing::client_hello(Some("edge-7.cdn.test"));
        assert!(!tls13_hello_missing_extension(&hello), "a real hello");
        for cut in 0..hello.len() {
            assert!(
                !tls13_hello_missing_extension(&hello[..cut]),
                "cut at {cut}"
            );
        }
        for gone in [
            EXT_KEY_SHARE,
            EXT_SUPPORTED_GROUPS,
            EXT_SIGNATURE_ALGORITHMS,
        ] {
            let without = rename_extension(hello.clone(), gone, UNKNOWN);
            assert_ne!(without, hello);
            assert!(tls13_hello_missing_extension(&without), "without {gone}");
            // Not offering TLS 1.3, the same hello asks for nothing RFC 8446 requires.
            let tls12 = rename_extension(without, EXT_SUPPORTED_VERSIONS, UNKNOWN);
            assert!(
                !tls13_hello_missing_extension(&tls12),
                "TLS 1.2, without {gone}"
            );
        }
        // Neither supported_groups nor key_share: fine with a PSK (psk_ke), not without.
        let neither = rename_extension(
            rename_extension(hello.clone(), EXT_KEY_SHARE, UNKNOWN),
            EXT_SUPPORTED_GROUPS,
            UNKNOWN,
        );
        assert!(tls13_hello_missing_extension(&neither));
        // (server_name renamed: a pre_shared_key whose body nobody here reads)
        let with_psk = rename_extension(neither, 0, EXT_PRE_SHARED_KEY);
        assert!(!tls13_hello_missing_extension(&with_psk));
    }

    #[test]
    fn implausible_names_are_not_logged() {
        let mut hello = testing::client_hello(Some("aaaa.test"));
        let at = hello.windows(9).position(|w| w == b"aaaa.test").unwrap();
        hello[at] = b'\n';
        assert_eq!(client_hello_sni(&hello), None);
    }
}
