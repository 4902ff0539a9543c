//! The shard's side of the process lifecycle: leaving rotation (health 503, no keep-alive)
//! and SIGHUP reloads, picked up once per loop tick without touching a connection.

use std::sync::Arc;

use super::{access_log, RingOps, Shard};
use crate::config::{AccessLogFormat, Config};
use crate::lifecycle::Lifecycle;

/// What a shard knows of the shared lifecycle.
pub(super) struct LifecycleView {
    shared: Arc<Lifecycle>,
    /// Reload epoch this shard runs with.
    seen_epoch: u64,
    /// A reload changed the access log; applied once no log write is in flight.
    log_change_pending: bool,
}

impl LifecycleView {
    /// A view of `shared`, current as of now.
    pub(super) fn new(shared: Arc<Lifecycle>) -> LifecycleView {
        LifecycleView {
            seen_epoch: shared.epoch(),
            shared,
            log_change_pending: false,
        }
    }
}

fn same_access_log(a: &Config, b: &Config) -> bool {
    a.access_log == b.access_log && a.access_log_format == b.access_log_format
}

impl<R: RingOps> Shard<R> {
    /// True once this edge is leaving rotation (SIGTERM) or draining: health answers 503 and
    /// responses close their connections.
    pub(super) fn leaving(&self) -> bool {
        self.life.drain_deadline_ms.is_some() || self.life.lifecycle.shared.is_leaving()
    }

    /// Switches to a reloaded configuration. Only keys `Config::reload` lets through differ,
    /// and each is read where it is used (deadlines set from now on, the next tick's budgets,
    /// the next request's ranges), so nothing in flight changes under a connection.
    pub(super) fn apply_reload(&mut self) {
        let epoch = self.life.lifecycle.shared.epoch();
        if epoch != self.life.lifecycle.seen_epoch {
            self.life.lifecycle.seen_epoch = epoch;
            let new = self.life.lifecycle.shared.config();
            if !same_access_log(&self.cfg, &new) {
                self.life.lifecycle.log_change_pending = true;
            }
            self.files.set_valid_ms(new.open_file_valid_ms);
            // The next connection's peer is judged by the new list; open ones keep theirs.
            if let Ok(t) = crate::client::TrustedProxies::parse(&new.trusted_proxies) {
                self.policy.trusted = t;
            }
            // New handshakes use the reloaded certificates and ticket keys; sessions under
            // way keep the configuration they started with.
            self.handshaking.tls = self.life.lifecycle.shared.tls();
            self.policy.signing = self.life.lifecycle.shared.signing();
            tracing::debug!(shard = self.index, epoch, "configuration reloaded");
            self.limits =
                super::build_limits(&new, self.sends.zerocopy, self.limits.zerocopy_warmup_bytes);
            self.cfg = new;
            // Published last: a reader who sees this epoch sees the shard on the new settings.
            crate::metrics::ShardMetrics::set(&self.metrics.config_epoch, epoch);
        }
        if self.life.lifecycle.log_change_pending {
            self.switch_access_log();
        }
    }

    /// Replaces the access log once its buffered lines are written (a write in flight owns the
    /// old file and buffer until it completes).
    fn switch_access_log(&mut self) {
        if let Some(log) = self.access_log.as_mut() {
            if log.busy() {
                return;
            }
            let t = super::token::Token::shard(super::token::Op::LogWrite).encode();
            log.maybe_flush(&mut self.ring, t, self.clock.now_ms, true);
            if log.busy() {
                return;
            }
        }
        self.life.lifecycle.log_change_pending = false;
        let path = self
            .cfg
            .access_log
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
        self.access_log = match path {
            None => None,
            Some(path) => {
                let json = self.cfg.access_log_format == AccessLogFormat::Json;
                let epoch = self
                    .life
                    .log_epoch
                    .load(std::sync::atomic::Ordering::Relaxed);
                match access_log::AccessLog::open(path.clone(), json, epoch) {
                    Ok(log) => Some(log),
                    Err(e) => {
                        tracing::error!(
                            shard = self.index,
                            path = %path.display(),
                            error = %e,
                            "reload: cannot open the new access log; access logging is off"
                        );
                        None
                    }
                }
            }
        };
    }
}
