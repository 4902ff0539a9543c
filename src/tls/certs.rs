//! Certificates: a chain and its key from PEM files (ECDSA P-256/P-384, RSA 2048-4096, and
//! whatever else the provider signs with), an optional stapled OCSP response, and the store
//! that picks one per handshake by SNI: an exact name, then a wildcard, then the default
//! (the first configured), each time the first whose key the client can verify.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::TlsError;
use crate::config::TlsCertificate;

/// Largest PEM or OCSP file read (a chain of a few certificates is ~5 KiB).
pub const CERT_FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Most certificates in one chain file.
pub const CHAIN_MAX_CERTS: usize = 16;

/// One loaded certificate: what rustls signs with, and what operators are told about it.
#[derive(Debug)]
pub struct LoadedCert {
    /// Chain, signing key and OCSP staple, as rustls uses them.
    pub certified: Arc<CertifiedKey>,
    /// DNS names of the end-entity certificate (subjectAltName), wildcards included.
    pub names: Vec<String>,
    /// End of validity (Unix seconds), if it could be read.
    pub not_after_unix: Option<i64>,
    /// The chain file (for log lines and the doctor).
    pub cert_path: PathBuf,
}

fn read_capped(path: &Path) -> Result<Vec<u8>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|e| TlsError::file(path, e.to_string()))?;
    if meta.len() > CERT_FILE_MAX_BYTES {
        return Err(TlsError::file(
            path,
            format!(
                "{} bytes, over the {CERT_FILE_MAX_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    std::fs::read(path).map_err(|e| TlsError::file(path, e.to_string()))
}

/// Loads one `[[tls_certificate]]`: the chain, its key (checked to match), the OCSP staple.
pub fn load(spec: &TlsCertificate, provider: &CryptoProvider) -> Result<LoadedCert, TlsError> {
    let pem = read_capped(&spec.cert)?;
    let mut chain = Vec::new();
    for item in CertificateDer::pem_slice_iter(&pem) {
        let der = item
            .map_err(|e| TlsError::file(&spec.cert, format!("not a PEM certificate chain: {e}")))?;
        chain.push(der);
        if chain.len() > CHAIN_MAX_CERTS {
            return Err(TlsError::file(
                &spec.cert,
                format!("more than {CHAIN_MAX_CERTS} certificates"),
            ));
        }
    }
    if chain.is_empty() {
        return Err(TlsError::file(&spec.cert, "no CERTIFICATE block"));
    }
    let key_pem = read_capped(&spec.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| TlsError::file(&spec.key, format!("no private key: {e}")))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::file(&spec.key, format!("unusable private key: {e}")))?;
    let mut certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        TlsError::file(
            &spec.key,
            format!(
                "does not match the certificate in {}: {e}",
                spec.cert.display()
            ),
        )
    })?;
    if let Some(ocsp) = &spec.ocsp {
        let der = read_capped(ocsp)?;
        if der.first() != Some(&0x30) {
            return Err(TlsError::file(ocsp, "not a DER OCSP response"));
        }
        certified.ocsp = Some(der);
    }
    let end_entity = &certified.cert[0];
    let names = webpki::EndEntityCert::try_from(end_entity)
        .map(|c| {
            c.valid_dns_names()
                .map(|n| n.to_ascii_lowercase())
                .collect()
        })
        .map_err(|e| TlsError::file(&spec.cert, format!("unreadable certificate: {e:?}")))?;
    Ok(LoadedCert {
        not_after_unix: not_after_unix(end_entity.as_ref()),
        certified: Arc::new(certified),
        names,
        cert_path: spec.cert.clone(),
    })
}

/// Picks a certificate per handshake: exact SNI name, then `*.parent`, then the default.
#[derive(Debug)]
pub struct CertStore {
    exact: HashMap<String, Vec<Arc<CertifiedKey>>>,
    wildcard: HashMap<String, Vec<Arc<CertifiedKey>>>,
    default: Vec<Arc<CertifiedKey>>,
}

impl CertStore {
    /// A store over `certs`; the first is the default (for clients without SNI or with a
    /// name nothing matches). Several certificates for one name (an ECDSA and an RSA one)
    /// are tried in order against what the client can verify.
    pub fn new(certs: &[LoadedCert]) -> CertStore {
        let mut exact: HashMap<String, Vec<Arc<CertifiedKey>>> = HashMap::new();
        let mut wildcard: HashMap<String, Vec<Arc<CertifiedKey>>> = HashMap::new();
        for c in certs {
            for name in &c.names {
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard
                        .entry(parent.to_string())
                        .or_default()
                        .push(c.certified.clone()),
                    None => exact
                        .entry(name.clone())
                        .or_default()
                        .push(c.certified.clone()),
                }
            }
        }
        // Every certificate whose names match nothing still serves as a fallback in order.
        let default = certs.iter().map(|c| c.certified.clone()).collect();
        CertStore {
            exact,
            wildcard,
            default,
        }
    }

    /// The certificates for `sni` in preference order (the default list last).
    fn candidates<'a>(&'a self, sni: Option<&str>) -> impl Iterator<Item = &'a Arc<CertifiedKey>> {
        let lower = sni.map(|s| s.trim_end_matches('.').to_ascii_lowercase());
        let exact = lower.as_deref().and_then(|n| self.exact.get(n));
        let wild = lower
            .as_deref()
            .and_then(|n| n.split_once('.'))
            .and_then(|(_, parent)| self.wildcard.get(parent));
        exact
            .into_iter()
            .flatten()
            .chain(wild.into_iter().flatten())
            .chain(self.default.iter())
    }

    /// The chain served to a client that sent `sni` and accepts `schemes` (for tests and
    /// the doctor; the handshake goes through `resolve`).
    pub fn pick(
        &self,
        sni: Option<&str>,
        schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        // None fits the client's signature schemes: still answer with the first candidate,
        // so that rustls refuses the handshake with handshake_failure (RFC 8446 4.1.1, "no
        // shared parameters"). A None here made rustls send access_denied, which scanners
        // (sslyze's ROBOT check) take for a broken server.
        self.candidates(sni)
            .find(|c| c.key.choose_scheme(schemes).is_some())
            .or_else(|| self.candidates(sni).next())
            .cloned()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick(hello.server_name(), hello.signature_schemes())
    }
}

/// The end of a certificate's validity (Unix seconds), read from its DER: Certificate ->
/// tbsCertificate -> [version] serial signature issuer validity.notAfter.
pub fn not_after_unix(der: &[u8]) -> Option<i64> {
    let (_, cert) = der_seq(der, 0x30)?;
    let (_, mut tbs) = der_seq(cert, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = der_skip(tbs)?; // [0] version
    }
    tbs = der_skip(tbs)?; // serial
    tbs = der_skip(tbs)?; // signature algorithm
    tbs = der_skip(tbs)?; // issuer
    let (_, validity) = der_seq(tbs, 0x30)?;
    let not_before = der_skip(validity)?;
    let tag = *not_before.first()?;
    let (_, time) = der_seq(not_before, tag)?;
    let s = std::str::from_utf8(time).ok()?;
    parse_asn1_time(tag, s)
}

/// Splits the TLV at the front of `input` (which must carry `tag`): (rest after it, value).
fn der_seq(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *input.first()? != tag {
        return None;
    }
    let (len, header) = der_len(&input[1..])?;
    let start = 1 + header;
    let end = start.checked_add(len)?;
    let value = input.get(start..end)?;
    Some((&input[end..], value))
}

/// The bytes after the TLV at the front of `input`.
fn der_skip(input: &[u8]) -> Option<&[u8]> {
    let tag = *input.first()?;
    der_seq(input, tag).map(|(rest, _)| rest)
}

/// A DER length: (value, bytes it took).
fn der_len(input: &[u8]) -> Option<(usize, usize)> {
    let first = *input.first()?;
    if first < 0x80 {
        return Some((usize::from(first), 1));
    }
    let n = usize::from(first & 0x7f);
    if n == 0 || n > 4 {
        return None;
    }
    let mut len = 0usize;
    for &b in input.get(1..1 + n)? {
        len = (len << 8) | usize::from(b);
    }
    Some((len, 1 + n))
}

/// UTCTime (tag 0x17, `YYMMDDHHMMSSZ`) or GeneralizedTime (0x18, `YYYYMMDDHHMMSSZ`).
fn parse_asn1_time(tag: u8, s: &str) -> Option<i64> {
    let (year, rest) = match tag {
        0x17 => {
            let yy: i64 = s.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, s.get(2..)?)
        }
        0x18 => (s.get(..4)?.parse().ok()?, s.get(4..)?),
        _ => return None,
    };
    if rest.len() != 11 || !rest.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { rest.get(r)?.parse().ok() };
    let (month, day, hour, min, sec) =
        (num(0..2)?, num(2..4)?, num(4..6)?, num(6..8)?, num(8..10)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{self, KeyKind};

    fn provider() -> CryptoProvider {
        rustls::crypto::aws_lc_rs::default_provider()
    }

    #[test]
    fn every_key_kind_loads_and_a_wrong_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut loaded = Vec::new();
        for kind in [
            KeyKind::EcdsaP256,
            KeyKind::EcdsaP384,
            KeyKind::Rsa2048,
            KeyKind::Rsa4096,
        ] {
            let spec =
                testing::write_cert(dir.path(), &format!("{kind:?}"), kind, &["example.test"]);
            let c = load(&spec, &provider()).unwrap();
            assert_eq!(c.names, ["example.test"]);
            let left = c.not_after_unix.unwrap() - now_unix();
            assert!(
                (left - 86_400 * testing::CERT_VALID_DAYS).abs() < 86_400,
                "{left}"
            );
            loaded.push(spec);
        }
        // The key of one with the chain of another.
        let bad = TlsCertificate {
            cert: loaded[0].cert.clone(),
            key: loaded[1].key.clone(),
            ocsp: None,
        };
        let e = load(&bad, &provider()).unwrap_err();
        assert_eq!(e.file, loaded[1].key);
        assert!(e.message.contains("does not match"), "{e}");
        let missing = TlsCertificate {
            cert: dir.path().join("nope.pem"),
            ..bad
        };
        assert_eq!(
            load(&missing, &provider()).unwrap_err().file,
            dir.path().join("nope.pem")
        );
    }

    fn now_unix() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let p = provider();
        let default = load(
            &testing::write_cert(dir.path(), "d", KeyKind::EcdsaP256, &["default.test"]),
            &p,
        )
        .unwrap();
        let wild = load(
            &testing::write_cert(dir.path(), "w", KeyKind::EcdsaP256, &["*.cdn.test"]),
            &p,
        )
        .unwrap();
        let exact = load(
            &testing::write_cert(dir.path(), "e", KeyKind::EcdsaP256, &["a.cdn.test"]),
            &p,
        )
        .unwrap();
        let rsa = load(
            &testing::write_cert(dir.path(), "r", KeyKind::Rsa2048, &["a.cdn.test"]),
            &p,
        )
        .unwrap();
        let store = CertStore::new(&[default, wild, exact, rsa]);
        let all = [
            rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
            rustls::SignatureScheme::RSA_PSS_SHA256,
        ];
        let rsa_only = [rustls::SignatureScheme::RSA_PSS_SHA256];
        let names = |sni: Option<&str>, schemes: &[rustls::SignatureScheme]| {
            let c = store.pick(sni, schemes).unwrap();
            let cert = webpki::EndEntityCert::try_from(&c.cert[0]).unwrap();
            cert.valid_dns_names()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(Some("a.cdn.test"), &all), ["a.cdn.test"]);
        assert_eq!(names(Some("A.CDN.test."), &all), ["a.cdn.test"]);
        assert_eq!(names(Some("b.cdn.test"), &all), ["*.cdn.test"]);
        assert_eq!(
            names(Some("x.b.cdn.test"), &all),
            ["default.test"],
            "a wildcard covers one label"
        );
        assert_eq!(names(Some("other.test"), &all), ["default.test"]);
        assert_eq!(names(None, &all), ["default.test"]);
        // Only RSA acceptable: the RSA certificate for the name, not the ECDSA one.
        let c = store.pick(Some("a.cdn.test"), &rsa_only).unwrap();
        assert!(c.key.choose_scheme(&rsa_only).is_some());
        // Nothing fits: still the name's first candidate (rustls then refuses with
        // handshake_failure, not access_denied).
        let ed_only = [rustls::SignatureScheme::ED25519];
        assert_eq!(names(Some("b.cdn.test"), &ed_only), ["*.cdn.test"]);
    }

    #[test]
    fn asn1_times_parse() {
        assert_eq!(parse_asn1_time(0x17, "700101000000Z"), Some(0));
        assert_eq!(
            parse_asn1_time(0x18, "20380119031408Z"),
            Some(2_147_483_648)
        );
        assert_eq!(parse_asn1_time(0x17, "491231235959Z"), Some(2_524_607_999));
        assert_eq!(parse_asn1_time(0x17, "701301000000Z"), None);
        assert_eq!(parse_asn1_time(0x18, "2038011903140Z"), None);
        assert_eq!(not_after_unix(b"\x30\x03\x02\x01\x00"), None);
        assert_eq!(not_after_unix(b""), None);
    }
}
