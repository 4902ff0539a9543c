//! HTTPS test helpers: a CA and leaf certificates generated per test (rcgen, never committed
//! keys), a config file that turns the TLS listener on, a rustls client that reads responses
//! byte for byte, and the external clients (curl, wget, aria2c, openssl, python3) found on
//! PATH or failing loudly with what to install (`scripts/test.sh` installs them).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use super::{read_response, Response, IO_TIMEOUT};

/// Which key a leaf certificate has.
#[derive(Clone, Copy, Debug)]
pub enum Key {
    EcdsaP256,
    EcdsaP384,
    Rsa2048,
    Rsa4096,
}

/// A test CA in a temp dir, issuing leaf certificates.
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// The CA certificate (what clients trust).
    pub ca: PathBuf,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    /// A new CA.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "shardline test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        Pki {
            dir,
            ca,
            ca_cert: cert,
            ca_key: key,
        }
    }

    /// A leaf for `names` (DNS names or IP addresses) signed by the CA: (chain file, key file),
    /// valid from yesterday for `days`.
    pub fn leaf(&self, stem: &str, names: &[&str], key: Key, days: u64) -> (PathBuf, PathBuf) {
        let kp = match key {
            Key::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            Key::EcdsaP384 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            Key::Rsa2048 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            }
            Key::Rsa4096 => {
                rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_4096)
            }
        }
        .unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or(stem),
        );
        let now = std::time::SystemTime::now();
        params.not_before = (now - Duration::from_secs(86_400)).into();
        params.not_after = (now + Duration::from_secs(86_400 * days)).into();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        // Where revocation would be checked (testssl rates a certificate without one NOT ok).
        params.crl_distribution_points = vec![rcgen::CrlDistributionPoint {
            uris: vec!["http://ca.shardline.test/crl".to_string()],
        }];
        // RFC 5280 4.2.1.1: strict path validators (sslyze's) require the issuer's key id.
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&kp, &self.ca_cert, &self.ca_key).unwrap();
        let crt = self.dir.path().join(format!("{stem}.crt"));
        let key_path = self.dir.path().join(format!("{stem}.key"));
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(&key_path, kp.serialize_pem()).unwrap();
        (crt, key_path)
    }

    /// A config file turning the TLS listener on with `certs` (the first is the default),
    /// plus `extra` TOML lines.
    pub fn config(&self, certs: &[(PathBuf, PathBuf)], extra: &str) -> PathBuf {
        let mut text = String::from("tls_listen = \"127.0.0.1:0\"\n");
        text.push_str(extra);
        text.push('\n');
        for (cert, key) in certs {
            text.push_str(&format!(
                "[[tls_certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
                cert.display(),
                key.display()
            ));
        }
        let path = self
            .dir
            .path()
            .join(format!("shardline-{}.toml", rand_suffix()));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A rustls client configuration trusting the CA (HTTP/1.1 ALPN, session resumption on).
    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        Arc::new(self.client_config(&[&rustls::version::TLS13, &rustls::version::TLS12]))
    }

    /// A client configuration for `versions` only.
    pub fn client_config(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(&self.ca).unwrap())
            .unwrap();
        let mut cc = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        cc.alpn_protocols = vec![b"http/1.1".to_vec()];
        cc
    }
}

fn rand_suffix() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One HTTPS connection (rustls over TCP) that reads responses like `read_response`.
pub struct TlsConn {
    pub stream: BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
}

impl TlsConn {
    /// Connects to `addr` and completes the handshake for `sni`.
    pub fn connect(
        addr: SocketAddr,
        cfg: Arc<rustls::ClientConfig>,
        sni: &str,
    ) -> std::io::Result<TlsConn> {
        let tcp = TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))?;
        let name = ServerName::try_from(sni.to_string()).map_err(std::io::Error::other)?;
        let conn = rustls::ClientConnection::new(cfg, name).map_err(std::io::Error::other)?;
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(TlsConn {
            stream: BufReader::new(stream),
        })
    }

    /// The negotiated connection (version, cipher suite, resumption, peer certificates).
    pub fn conn(&self) -> &rustls::ClientConnection {
        &self.stream.get_ref().conn
    }

    /// Sends `request` and reads one response.
    pub fn exchange(&mut self, request: &str) -> std::io::Result<Response> {
        let s = self.stream.get_mut();
        s.write_all(request.as_bytes())?;
        s.flush()?;
        read_response(&mut self.stream, request.starts_with("HEAD "))
    }

    /// `GET path` on this connection (kept alive).
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.exchange(&req).expect("HTTPS response")
    }

    /// Reads to the end: Ok(bytes) after the server's close_notify, an error for a close
    /// without one (rustls reports it as UnexpectedEof).
    pub fn read_to_close(&mut self) -> std::io::Result<Vec<u8>> {
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).map(|_| rest)
    }

    /// Whether the next read ends cleanly (close_notify seen).
    pub fn closed_cleanly(&mut self) -> bool {
        let mut buf = Vec::new();
        let _ = self.stream.fill_buf();
        matches!(self.stream.read_to_end(&mut buf), Ok(0))
    }
}

/// The path of an external client, or a loud failure naming the Debian package
/// (`scripts/test.sh` installs every one of them).
#[track_caller]
pub fn tool(name: &str, package: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed: this test runs it as a real HTTPS client (Debian package \
         {package}; `scripts/test.sh` installs it)"
    );
}

/// Runs a command with a deadline; its output (killed at the deadline).
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("wait").is_some() || Instant::now() > deadline {
            let _ = child.kill();
            return child.wait_with_output().expect("output");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `openssl s_client ARGS` against `addr` with `input` on stdin (then EOF after
/// `linger`), returning everything it printed.
pub fn s_client(addr: SocketAddr, args: &[&str], input: &[u8], linger: Duration) -> String {
    let openssl = tool("openssl", "openssl");
    let mut child = Command::new(openssl)
        .arg("s_client")
        .arg("-connect")
        .arg(addr.to_string())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openssl");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    let deadline = Instant::now() + linger;
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
