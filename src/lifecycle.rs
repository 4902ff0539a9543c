//! What the main thread changes while the shards run: whether this edge is leaving rotation
//! (SIGTERM) and the running configuration (SIGHUP). Shards read both once per loop tick.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::tls::TlsContext;

/// Process-wide state shared by the main thread (writer) and the shards (readers).
pub struct Lifecycle {
    /// Set at SIGTERM/SIGINT: health answers 503, responses close their connections.
    leaving: Arc<AtomicBool>,
    /// The running configuration; replaced by an accepted reload.
    config: Mutex<Arc<Config>>,
    /// Bumped by every accepted reload, so a shard compares one integer per tick.
    epoch: AtomicU64,
    /// Certificates and ticket keys new TLS handshakes use; replaced by a reload whose every
    /// TLS file loaded.
    tls: Mutex<Option<Arc<TlsContext>>>,
    /// Signed-URL rules with their keys; replaced by a reload whose every key file loaded.
    signing: Mutex<Arc<crate::signing::Signing>>,
    /// Connections per client over all shards (`max_connections_per_client`).
    client_counts: Arc<crate::client::cap::ClientCounts>,
    /// The edge's egress cap over all shards (`egress_limit_bytes_per_s`).
    egress: Arc<crate::limits::EgressBucket>,
}

impl Lifecycle {
    /// Serving, with `config`.
    pub fn new(config: Arc<Config>) -> Arc<Lifecycle> {
        Self::with_client_counts(config, Arc::default())
    }

    /// Serving, with `config`, counting connections per client in `client_counts` (4 MiB:
    /// the simulator, which starts thousands of shards, shares one per thread).
    pub fn with_client_counts(
        config: Arc<Config>,
        client_counts: Arc<crate::client::cap::ClientCounts>,
    ) -> Arc<Lifecycle> {
        Arc::new(Lifecycle {
            leaving: Arc::new(AtomicBool::new(false)),
            config: Mutex::new(config),
            epoch: AtomicU64::new(0),
            tls: Mutex::new(None),
            signing: Mutex::new(Arc::default()),
            client_counts,
            egress: Arc::default(),
        })
    }

    /// The TLS context new handshakes use (None: no TLS listener).
    pub fn tls(&self) -> Option<Arc<TlsContext>> {
        self.tls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `tls` the context of new handshakes (shards pick it up with the next `publish`,
    /// or at start-up); connections already established keep theirs.
    pub fn set_tls(&self, tls: Option<Arc<TlsContext>>) {
        *self.tls.lock().unwrap_or_else(|e| e.into_inner()) = tls;
    }

    /// The signed-URL rules requests are judged by.
    pub fn signing(&self) -> Arc<crate::signing::Signing> {
        self.signing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes `signing` the rules of new requests (shards pick it up with the next `publish`).
    pub fn set_signing(&self, signing: Arc<crate::signing::Signing>) {
        *self.signing.lock().unwrap_or_else(|e| e.into_inner()) = signing;
    }

    /// The egress bucket every shard shares.
    pub fn egress(&self) -> Arc<crate::limits::EgressBucket> {
        self.egress.clone()
    }

    /// The per-client connection counts every shard shares.
    pub fn client_counts(&self) -> Arc<crate::client::cap::ClientCounts> {
        self.client_counts.clone()
    }

    /// The "leaving" flag itself, for the admin listener's `/healthz`.
    pub fn leaving_flag(&self) -> Arc<AtomicBool> {
        self.leaving.clone()
    }

    /// True once the edge started leaving rotation.
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }

    /// Health answers 503 from now on.
    pub fn start_leaving(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    /// Number of reloads applied so far.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes `config` the running configuration; shards pick it up on their next tick.
    pub fn publish(&self, config: Config) {
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        self.epoch.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_bumps_the_epoch_and_replaces_the_config() {
        let l = Lifecycle::new(Arc::new(Config::default()));
        assert_eq!(l.epoch(), 0);
        assert!(!l.is_leaving());
        l.publish(Config {
            send_timeout_ms: 7,
            ..Config::default()
        });
        assert_eq!(l.epoch(), 1);
        assert_eq!(l.config().send_timeout_ms, 7);
        l.start_leaving();
        assert!(l.leaving_flag().load(Ordering::Relaxed));
    }
}
