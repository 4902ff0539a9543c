//! Test helpers: certificates generated per test (never committed keys), in-memory
//! handshakes between rustls peers, and a real ClientHello.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection,
    SupportedCipherSuite,
};

use crate::config::TlsCertificate;

/// Days a generated certificate is valid from now.
pub const CERT_VALID_DAYS: i64 = 365;

/// Which key a generated certificate has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA over P-256 with SHA-256.
    EcdsaP256,
    /// ECDSA over P-384 with SHA-384.
    EcdsaP384,
    /// RSA 2048 (PKCS#1 v1.5 SHA-256 signature on the certificate).
    Rsa2048,
    /// RSA 4096.
    Rsa4096,
    /// Ed25519 (deterministic signatures of one length: the simulator's runs replay exactly).
    Ed25519,
}

/// A self-signed certificate for `names` and its key, as PEM strings.
pub fn generate(kind: KeyKind, names: &[&str]) -> (String, String) {
    let key = match kind {
        KeyKind::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        KeyKind::EcdsaP384 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        KeyKind::Rsa2048 => {
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
        }
        KeyKind::Rsa4096 => {
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_4096)
        }
        KeyKind::Ed25519 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519),
    }
    .expect("key generation");
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("certificate names");
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(86_400)).into();
    params.not_after =
        (now + std::time::Duration::from_secs(86_400 * CERT_VALID_DAYS as u64)).into();
    let cert = params.self_signed(&key).expect("self-signed certificate");
    (cert.pem(), key.serialize_pem())
}

/// Writes a generated certificate and key as `dir/stem.crt` and `dir/stem.key`.
pub fn write_cert(dir: &Path, stem: &str, kind: KeyKind, names: &[&str]) -> TlsCertificate {
    let (cert, key) = generate(kind, names);
    let spec = TlsCertificate {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
        ocsp: None,
    };
    std::fs::write(&spec.cert, cert).unwrap();
    std::fs::write(&spec.key, key).unwrap();
    spec
}

fn der_pair(kind: KeyKind, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let (cert, key) = generate(kind, names);
    use rustls::pki_types::pem::PemObject;
    let cert = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
    let key = PrivatePkcs8KeyDer::from_pem_slice(key.as_bytes()).unwrap();
    (cert, PrivateKeyDer::Pkcs8(key))
}

/// Every cipher suite usable with an ECDSA certificate: the three TLS 1.3 suites and the
/// three ECDHE-ECDSA TLS 1.2 ones.
pub fn all_suites() -> Vec<SupportedCipherSuite> {
    rustls::crypto::aws_lc_rs::default_provider()
        .cipher_suites
        .into_iter()
        .filter(|s| match s {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(t) => t
                .sign
                .iter()
                .any(|sc| format!("{sc:?}").starts_with("ECDSA")),
        })
        .collect()
}

/// A client configuration that trusts `cert` and offers only `suite` (or every suite).
pub fn client_config(
    cert: &CertificateDer<'static>,
    suite: Option<SupportedCipherSuite>,
) -> ClientConfig {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(suite) = suite {
        provider.cipher_suites = vec![suite];
    }
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// Moves everything `from` wants to write into `to`, until neither has anything.
fn pump(client: &mut ClientConnection, server: &mut ServerConnection) {
    for _ in 0..32 {
        let mut moved = false;
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            moved = true;
            let mut rd = &buf[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            server.process_new_packets().unwrap();
        }
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        if !buf.is_empty() {
            moved = true;
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            client.process_new_packets().unwrap();
        }
        if !moved {
            return;
        }
    }
}

/// A buffered rustls client and server that completed a handshake over `suite` in memory
/// (the server allows secret extraction; tickets are off so nothing is left to send).
pub fn handshaken_pair(suite: SupportedCipherSuite) -> (ClientConnection, ServerConnection) {
    let (cert, key) = der_pair(KeyKind::EcdsaP256, &["localhost"]);
    let mut sc = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)
    .unwrap();
    sc.enable_secret_extraction = true;
    sc.send_tls13_tickets = 0;
    let cc = client_config(&cert, Some(suite));
    let mut client =
        ClientConnection::new(Arc::new(cc), ServerName::try_from("localhost").unwrap()).unwrap();
    let mut server = ServerConnection::new(Arc::new(sc)).unwrap();
    pump(&mut client, &mut server);
    assert!(
        !client.is_handshaking() && !server.is_handshaking(),
        "{suite:?}"
    );
    (client, server)
}

/// The first flight of a rustls client: a ClientHello naming `sni` (None: an IP address,
/// so no SNI extension).
pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let (cert, _) = der_pair(KeyKind::EcdsaP256, &["localhost"]);
    let cc = Arc::new(client_config(&cert, None));
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).unwrap(),
        None => ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    let mut client = ClientConnection::new(cc, name).unwrap();
    let mut out = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut out).unwrap();
    }
    out
}

/// Cases a TLS fuzz property runs: `default`, or `SHARDLINE_TLS_FUZZ_CASES` for a long run.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("SHARDLINE_TLS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
