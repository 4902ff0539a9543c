//! Accepting connections: the multishot accepts on both listeners, a new connection's slot
//! and machine, its peer's address, and its client's connection cap.

use super::*;

impl<R: RingOps> Shard<R> {
    /// Counts connection `c` against its client's cap (`max_connections_per_client`, over
    /// all shards); over it, the connection is closed or its request answered 429. A client
    /// whose address the kernel did not give is not counted.
    pub(super) fn count_client(&mut self, c: ConnSlot) {
        let cap = self.cfg.max_connections_per_client;
        if cap == 0 {
            return;
        }
        let Some(addr) = self.conns[c.index()].client().addr() else {
            return;
        };
        let key = crate::client::cap::ClientKey::new(addr.ip(), self.cfg.client_ipv6_prefix);
        if self.policy.client_counts.acquire(key, cap) {
            self.conns[c.index()].set_cap_key(key);
            return;
        }
        ShardMetrics::add(&self.metrics.refused_client_cap, 1);
        match self.cfg.client_cap_action {
            crate::config::ClientCapAction::Close => {
                self.drive(c, |m, cx, out| m.close(CloseReason::Abort, cx, out));
            }
            crate::config::ClientCapAction::TooManyRequests => {
                self.conns[c.index()].set_over_cap();
            }
        }
    }

    /// Bytes of the peer `sockaddr` a connection from the TLS (or cleartext) listener has:
    /// the kernel refuses a longer buffer for `SO_PEERNAME`, and a socket's peers share its
    /// listener's family (IPv4 clients of an IPv6 listener come as mapped addresses).
    pub(super) fn peer_sockaddr_bytes(&self, tls: bool) -> usize {
        let listen = if tls {
            self.cfg.tls_listen.unwrap_or(self.cfg.listen)
        } else {
            self.cfg.listen
        };
        if listen.is_ipv6() {
            crate::client::sockaddr::SOCKADDR_IN6_BYTES
        } else {
            crate::client::sockaddr::SOCKADDR_IN_BYTES
        }
    }

    pub(super) fn arm_accept(&mut self) {
        let tls_wanted = self.accept.tls_listener.is_some()
            || (self.accept.ring_accepts && self.handshaking.tls.is_some());
        if (self.accept.accept_armed && (self.accept.tls_accept_armed || !tls_wanted))
            || self.life.drain_deadline_ms.is_some()
            || self.clock.now_ms < self.accept.accept_retry_ms
        {
            return;
        }
        let listener = self.accept.listener.as_ref().map(|l| l.as_fd());
        if !self.accept.accept_armed && (listener.is_some() || self.accept.ring_accepts) {
            let t = Token::shard(Op::Accept).encode();
            self.ring.accept_multi(listener, t);
            self.accept.accept_armed = true;
        }
        let tls_listener = self.accept.tls_listener.as_ref().map(|l| l.as_fd());
        // The simulator's ring produces TLS connections too when the shard has a context.
        let ring_tls = self.accept.ring_accepts && self.handshaking.tls.is_some();
        if !self.accept.tls_accept_armed && (tls_listener.is_some() || ring_tls) {
            let t = Token::shard(Op::AcceptTls).encode();
            self.ring.accept_multi(tls_listener, t);
            self.accept.tls_accept_armed = true;
        }
    }

    pub(super) fn on_accept(&mut self, cqe: Completion, tls: bool) {
        if !cqe.more() {
            if tls {
                self.accept.tls_accept_armed = false;
            } else {
                self.accept.accept_armed = false;
            }
        }
        if cqe.result < 0 {
            let errno = -cqe.result;
            if errno != libc::ECANCELED {
                ShardMetrics::add(&self.metrics.accept_errors, 1);
                // Under a connection flood this repeats: log at most once per interval.
                if self.clock.now_ms >= self.accept.accept_warned_ms + ACCEPT_WARN_INTERVAL_MS
                    || self.accept.accept_warned_ms == 0
                {
                    self.accept.accept_warned_ms = self.clock.now_ms.max(1);
                    tracing::warn!(
                        shard = self.index,
                        errno,
                        "accept failed; backing off until a socket slot frees (more such errors \
                         are counted in accept_errors_total, logged at most once a second)"
                    );
                }
                self.accept.accept_retry_ms = self.clock.now_ms + ACCEPT_BACKOFF_MS;
            }
            return;
        }
        let socket = SocketSlot::new(cqe.result as u32);
        let draining = self.life.drain_deadline_ms.is_some();
        let Some(c) = (!draining).then(|| self.free_conns.pop()).flatten() else {
            ShardMetrics::add(&self.metrics.refused_over_cap, 1);
            let t = Token::socket(Op::Overflow, socket).encode();
            let tc = Token::socket(Op::OverflowClose, socket).encode();
            let canned = if tls {
                OVER_CAP_TLS_ALERT
            } else {
                OVER_CAP_RESPONSE
            };
            self.ring.send_static_then_close(socket, canned, t, tc);
            return;
        };
        ShardMetrics::add(&self.metrics.accepted, 1);
        let session = if tls { self.new_tls_session() } else { None };
        if tls && session.is_none() {
            // No context (a reload turned TLS off under us) or rustls refused: nothing to
            // speak with this client.
            self.free_conns.push(c);
            let t = Token::socket(Op::OverflowClose, socket).encode();
            self.ring.close_fixed(socket, t);
            return;
        }
        self.open_conns += 1;
        self.accept.accepted_in_round = true;
        self.drive(c, |m, cx, out| m.open(socket, session, cx, out));
    }
}
