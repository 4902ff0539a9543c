//! HTTPS: everything TLS that is not one connection's state machine.
//!
//! - `certs.rs`: PEM chains and keys, OCSP staples, the SNI certificate store;
//! - `tickets.rs`: session-ticket keys from a file shared by the fleet;
//! - `record.rs`: the record layer (seal in place into arena slots, open in place);
//! - `session.rs`: one connection's TLS (rustls's unbuffered handshake, then records);
//! - `sniff.rs`: a connection's first bytes (plain HTTP on the TLS port, SNI for logs).
//!
//! `TlsContext` is what a shard starts handshakes with; `TlsBuilder::build` makes one from
//! the configuration at start-up and again at every SIGHUP (a file that fails keeps the
//! running context, with one log line naming it).

pub mod certs;
pub mod record;
pub mod session;
pub mod sniff;
#[cfg(test)]
pub mod testing;
pub mod tickets;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ProducesTickets};
use rustls::ServerConfig;

use crate::config::Config;

/// TLS 1.3 session tickets sent after each full handshake (a client opening parallel
/// connections resumes one per ticket; each costs an encryption and ~200 bytes).
pub const TLS13_TICKETS_PER_HANDSHAKE: usize = 2;
/// The only application protocol offered (ALPN): HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// A TLS configuration file problem: the file and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsError {
    /// The file at fault.
    pub file: PathBuf,
    /// What is wrong.
    pub message: String,
}

impl TlsError {
    /// An error about `file`.
    pub fn file(file: &Path, message: impl Into<String>) -> TlsError {
        TlsError {
            file: file.to_path_buf(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for TlsError {}

/// The crypto provider: aws-lc-rs, chosen over ring by AES-GCM throughput (12.6 vs 8.1 GB/s
/// on 16 KiB records) and handshake cost on this kind of host (`perf/TLS-PROVIDER.md`), and
/// the one with the post-quantum hybrid X25519MLKEM768.
///
/// Its cipher suites in the order the server prefers them (it chooses, not the client):
/// AES-128-GCM first, the cheapest per byte on hosts with AES-NI/VAES (14 vs 11.6 GB/s for
/// AES-256-GCM here), then AES-256-GCM, then ChaCha20-Poly1305; TLS 1.3 before 1.2.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| {
        let name = s.suite().as_str().unwrap_or("");
        let aead = if name.contains("AES_128_GCM") {
            0
        } else if name.contains("AES_256_GCM") {
            1
        } else {
            2
        };
        let version = match s {
            rustls::SupportedCipherSuite::Tls13(_) => 0,
            rustls::SupportedCipherSuite::Tls12(_) => 1,
        };
        (version, aead)
    };
    p.cipher_suites.sort_by_key(rank);
    Arc::new(p)
}

/// One loaded certificate as operators are told about it.
#[derive(Clone, Debug)]
pub struct CertSummary {
    /// Its chain file.
    pub path: PathBuf,
    /// Its DNS names.
    pub names: Vec<String>,
    /// End of validity (Unix seconds).
    pub not_after_unix: Option<i64>,
}

/// What a shard starts handshakes with.
#[derive(Debug)]
pub struct TlsContext {
    /// rustls's server configuration (certificates, tickets, versions, ALPN).
    pub server: Arc<ServerConfig>,
    /// The certificates it serves.
    pub certs: Vec<CertSummary>,
}

/// Builds `TlsContext`s from the configuration; keeps the random ticket keys a process uses
/// without a key file, so a reload does not forget them.
pub struct TlsBuilder {
    random_tickets: Arc<dyn ProducesTickets>,
}

impl TlsBuilder {
    /// A builder with fresh random ticket keys (rotated by rustls every 6 hours, the previous
    /// key kept).
    pub fn new() -> Result<TlsBuilder, TlsError> {
        let random_tickets = rustls::crypto::aws_lc_rs::Ticketer::new().map_err(|e| {
            TlsError::file(
                Path::new("tls_ticket_key_file"),
                format!("no random ticket keys: {e}"),
            )
        })?;
        Ok(TlsBuilder { random_tickets })
    }

    /// Loads every certificate and the ticket keys `cfg` names; None when TLS is off.
    pub fn build(&self, cfg: &Config) -> Result<Option<Arc<TlsContext>>, TlsError> {
        if cfg.tls_listen.is_none() {
            return Ok(None);
        }
        let provider = provider();
        let mut loaded = Vec::with_capacity(cfg.tls_certificate.len());
        for spec in &cfg.tls_certificate {
            loaded.push(certs::load(spec, &provider)?);
        }
        if loaded.is_empty() {
            return Err(TlsError::file(
                Path::new("tls_certificate"),
                "tls_listen is set but no [[tls_certificate]] is configured",
            ));
        }
        let tickets: Arc<dyn ProducesTickets> = match &cfg.tls_ticket_key_file {
            Some(path) => Arc::new(tickets::FileTicketer::load(
                path,
                cfg.tls_ticket_lifetime_s,
            )?),
            None => self.random_tickets.clone(),
        };
        let store = certs::CertStore::new(&loaded);
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::file(Path::new("tls"), e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(store));
        server.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        server.ignore_client_order = true;
        // The record layer is ours once the handshake is done (record.rs).
        server.enable_secret_extraction = true;
        server.max_early_data_size = 0;
        server.send_tls13_tickets = TLS13_TICKETS_PER_HANDSHAKE;
        // Stateless tickets only: a per-process session cache would neither resume on
        // another edge nor stay bounded without a lock shared by the shards.
        server.session_storage = Arc::new(NoServerSessionStorage {});
        server.ticketer = tickets;
        Ok(Some(Arc::new(TlsContext {
            server: Arc::new(server),
            certs: loaded
                .iter()
                .map(|c| CertSummary {
                    path: c.cert_path.clone(),
                    names: c.names.clone(),
                    not_after_unix: c.not_after_unix,
                })
                .collect(),
        })))
    }
}
