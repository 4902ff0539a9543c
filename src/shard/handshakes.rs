//! TLS handshakes on the shard thread: a bounded queue of connections whose handshake has
//! bytes to process, and turns that may take only a share of the thread's time, so a flood
//! of ClientHellos cannot starve transfers in flight or keep-alive requests.
//!
//! A full handshake costs ~110 µs of CPU here (ECDSA P-256, X25519; `perf/TLS-PROVIDER.md`),
//! RSA-2048 ~450 µs: far more than one request. Handshake time is earned like tokens: a
//! share of the wall time while transfers run, a whole burst when nothing else waits.
//! Connections whose handshake is under way (they answered our flight) go before new ones,
//! so admitted handshakes finish; a new one that finds `tls_max_pending_handshakes` waiting
//! is closed and counted (`queue_full`).

use super::machine::HandshakeOutcome;
use super::slots::ConnSlot;
use super::{RingOps, Shard};
use crate::metrics::ShardMetrics;
use crate::tls::session::{TlsSession, Version};
use std::time::Duration;

/// Share of the shard thread's wall time handshakes may take while transfers or requests are
/// in progress (the rest keeps their pace under a flood of ClientHellos).
pub const TLS_HANDSHAKE_SHARE_PERCENT: u64 = 15;
/// Most handshake time saved up (and what handshakes get at once when nothing else waits):
/// bounds how long a burst of handshakes holds up everything else.
pub const TLS_HANDSHAKE_BURST_US: u64 = 2000;
/// List of handshakes under way (their client answered): they go first.
const CONTINUING: usize = 0;
/// List of handshakes that have not had a turn yet.
const NEW: usize = 1;

impl<R: RingOps> Shard<R> {
    /// A session for a connection accepted on the TLS listener (None: no TLS context).
    pub(super) fn new_tls_session(&mut self) -> Option<Box<TlsSession>> {
        let ctx = self.handshaking.tls.as_ref()?;
        ShardMetrics::add(&self.metrics.tls_accepted, 1);
        match TlsSession::new(ctx.server.clone()) {
            Ok(s) => Some(Box::new(s)),
            Err(e) => {
                tracing::warn!(shard = self.index, error = %e, "cannot start a TLS session");
                None
            }
        }
    }

    /// Connection `c` received handshake bytes: it waits for a turn. A new handshake that
    /// finds the queue full is closed.
    pub(super) fn queue_handshake(&mut self, c: ConnSlot) {
        if self.handshaking.handshakes.list_of(c.raw()).is_some() {
            return;
        }
        let started = self.conns[c.index()].tls().is_some_and(|t| t.turns() > 0);
        if started {
            self.handshaking.handshakes.push_back(CONTINUING, c.raw());
            return;
        }
        if self.handshaking.handshakes.len(NEW) + self.handshaking.handshakes.len(CONTINUING)
            >= self.cfg.tls_max_pending_handshakes
        {
            self.count_handshake(HandshakeOutcome::QueueFull);
            self.drive(c, |m, cx, out| {
                m.close(super::conn::CloseReason::ProtocolError, cx, out)
            });
            return;
        }
        self.handshaking.handshakes.push_back(NEW, c.raw());
    }

    /// Handshakes waiting now.
    pub(super) fn pending_handshakes(&self) -> usize {
        self.handshaking.handshakes.len(CONTINUING) + self.handshaking.handshakes.len(NEW)
    }

    /// Earns handshake time: while transfers or requests are in progress, handshakes get
    /// `TLS_HANDSHAKE_SHARE_PERCENT` of the wall time that passes (the shard thread is
    /// what both run on), up to `TLS_HANDSHAKE_BURST_US` saved; with nothing else to do, the
    /// whole burst at once.
    pub(super) fn earn_handshake_time(&mut self) {
        let now = self.ring.now();
        let elapsed_us = now
            .saturating_sub(self.handshaking.hs_earned_at)
            .as_micros() as i64;
        self.handshaking.hs_earned_at = now;
        let busy = self.arena.free_count() < self.cfg.arena_slots() || !self.ready.is_empty();
        self.handshaking.hs_credit_us = if busy {
            (self.handshaking.hs_credit_us + elapsed_us * TLS_HANDSHAKE_SHARE_PERCENT as i64 / 100)
                .min(TLS_HANDSHAKE_BURST_US as i64)
        } else {
            TLS_HANDSHAKE_BURST_US as i64
        };
    }

    /// How long the loop may sleep for the handshakes' sake: `None` with none waiting, zero
    /// when one may run now, else until enough time is earned for the next turn (the loop
    /// waits for completions meanwhile instead of spinning).
    pub(super) fn handshake_wait(&mut self) -> Option<Duration> {
        if self.pending_handshakes() == 0 {
            return None;
        }
        self.earn_handshake_time();
        if self.handshaking.hs_credit_us > 0 {
            return Some(Duration::ZERO);
        }
        let owed_us = (1 - self.handshaking.hs_credit_us) as u64;
        Some(Duration::from_micros(
            owed_us * 100 / TLS_HANDSHAKE_SHARE_PERCENT,
        ))
    }

    /// Gives waiting handshakes their turns, continuing ones first, while handshake time is
    /// left; a turn that overruns is paid back before the next one.
    pub(super) fn run_handshakes(&mut self) {
        if self.pending_handshakes() == 0 {
            return;
        }
        self.earn_handshake_time();
        while self.handshaking.hs_credit_us > 0 {
            let Some(c) = self
                .handshaking
                .handshakes
                .pop_front(CONTINUING)
                .or_else(|| self.handshaking.handshakes.pop_front(NEW))
                .map(ConnSlot::new)
            else {
                break;
            };
            let started = self.ring.now();
            self.drive(c, |m, cx, out| m.handshake_turn(cx, out));
            let spent = self.ring.now().saturating_sub(started).as_micros() as i64;
            self.handshaking.hs_credit_us -= spent;
        }
    }

    /// Counts how a handshake ended.
    pub(super) fn count_handshake(&self, outcome: HandshakeOutcome) {
        let t = &self.metrics.tls_handshakes;
        match outcome {
            HandshakeOutcome::Ok { version, resumed } => {
                let v = match version {
                    Version::Tls12 => 0,
                    Version::Tls13 => 1,
                };
                t.count_ok(v, resumed);
            }
            HandshakeOutcome::Failed => t.count_failed(0),
            HandshakeOutcome::PeerClosed => t.count_failed(1),
            HandshakeOutcome::Timeout => t.count_failed(2),
            HandshakeOutcome::QueueFull => t.count_failed(3),
            HandshakeOutcome::TooLarge => t.count_failed(4),
            HandshakeOutcome::PlainHttp => t.count_failed(5),
            HandshakeOutcome::OverBudget => t.count_failed(6),
        }
    }
}
