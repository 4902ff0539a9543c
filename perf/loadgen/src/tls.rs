//! HTTPS for loadgen: a rustls client on aws-lc-rs (the server's provider too), set once from
//! the command line and shared by every connection:
//!   --tls 1                      speak HTTPS
//!   --tls-sni NAME               server name sent (default localhost)
//!   --tls-version 12|13          offer one version only (default both, 1.3 preferred)
//!   --tls-resume 0|1             keep session tickets and resume (default 1)
//!   --tls-group x25519|mlkem     offer only X25519, or only the X25519MLKEM768 hybrid
//! It verifies no certificate and no handshake signature: the benchmark measures servers, and
//! the client's own checks would only make the client the bottleneck (both servers face the
//! same client).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use crate::Args;

/// The process's TLS client, when `--tls 1` (set by `init`).
static CLIENT: OnceLock<Option<(Arc<ClientConfig>, ServerName<'static>)>> = OnceLock::new();

#[derive(Debug)]
struct AcceptAnything(Vec<SignatureScheme>);

impl ServerCertVerifier for AcceptAnything {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

/// Reads the `--tls*` options; every connection made afterwards follows them.
pub fn init(a: &Args) {
    let on = a.opt_u64("tls").unwrap_or(0) != 0;
    let client = on.then(|| {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        match a.opt_str("tls-group").as_deref() {
            None | Some("any") => {}
            Some("x25519") => {
                provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519]
            }
            Some("mlkem") => {
                provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768]
            }
            Some(g) => crate::die(&format!("--tls-group {g}: x25519, mlkem or any")),
        }
        let schemes = provider
            .signature_verification_algorithms
            .supported_schemes();
        let versions: &[&'static rustls::SupportedProtocolVersion] = match a.opt_u64("tls-version")
        {
            None => &[&rustls::version::TLS13, &rustls::version::TLS12],
            Some(13) => &[&rustls::version::TLS13],
            Some(12) => &[&rustls::version::TLS12],
            Some(v) => crate::die(&format!("--tls-version {v}: 12 or 13")),
        };
        let mut cc = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap_or_else(|e| crate::die(&format!("TLS versions: {e}")))
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnything(schemes)))
            .with_no_client_auth();
        cc.alpn_protocols = vec![b"http/1.1".to_vec()];
        if a.opt_u64("tls-resume").unwrap_or(1) == 0 {
            cc.resumption = rustls::client::Resumption::disabled();
        } else {
            cc.resumption = rustls::client::Resumption::in_memory_sessions(65_536);
        }
        let sni = a.opt_str("tls-sni").unwrap_or_else(|| "localhost".into());
        let name =
            ServerName::try_from(sni).unwrap_or_else(|e| crate::die(&format!("--tls-sni: {e}")));
        (Arc::new(cc), name)
    });
    let _ = CLIENT.set(client);
}

/// The TLS client to connect with, if any.
pub fn client() -> Option<&'static (Arc<ClientConfig>, ServerName<'static>)> {
    CLIENT.get().and_then(|c| c.as_ref())
}

/// A blocking connection: plain TCP, or HTTPS over it.
pub enum Stream {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS (the handshake is done).
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    /// `tcp`, wrapped in TLS (handshake completed) when `--tls 1`.
    pub fn over(tcp: TcpStream) -> io::Result<Stream> {
        let Some((cfg, name)) = client() else {
            return Ok(Stream::Plain(tcp));
        };
        let conn =
            rustls::ClientConnection::new(cfg.clone(), name.clone()).map_err(io::Error::other)?;
        let mut s = rustls::StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(Stream::Tls(Box::new(s)))
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// Whether a TLS handshake resumed a session (None: cleartext).
    pub fn resumed(&self) -> Option<bool> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => Some(s.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
