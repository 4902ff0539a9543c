//! The TLS steps of a connection: records received and opened, the handshake's turn, its
//! flights sent, and the memory an idle TLS connection gives back.

use super::*;

impl ConnMachine {
    // ---- TLS -------------------------------------------------------------------------

    /// TLS bytes arrived: during the handshake they wait for the connection's handshake
    /// turn; after it, records are opened into `rx`. False when the connection stops here
    /// (closing, or waiting for its turn).
    pub(super) fn receive_tls(&mut self, data: &[u8], cx: &Ctx, out: &mut Actions) -> bool {
        let tls = self.tls.as_mut().expect("TLS bytes without a session");
        out.push(Action::Count(Counter::TlsBytesIn, data.len() as u64));
        if tls.handshaking() && data.len() > cx.handshake_room_bytes {
            tls.refuse_handshake();
            out.push(Action::Count(
                Counter::Handshake(HandshakeOutcome::OverBudget),
                1,
            ));
            self.close(CloseReason::ProtocolError, cx, out);
            return false;
        }
        if !tls.receive(data) {
            if tls.handshaking() {
                out.push(Action::Count(
                    Counter::Handshake(HandshakeOutcome::TooLarge),
                    1,
                ));
            }
            self.close(CloseReason::ProtocolError, cx, out);
            return false;
        }
        if tls.handshaking() {
            out.push(Action::QueueHandshake);
            return false;
        }
        self.open_tls_records(cx, out)
    }

    /// Opens the whole records in the session's `incoming` into `rx`. False when the
    /// connection stops here (closing).
    fn open_tls_records(&mut self, cx: &Ctx, out: &mut Actions) -> bool {
        let tls = self.tls.as_mut().expect("TLS records without a session");
        match tls.open_records(&mut self.rx) {
            Received::Data => {
                // A refused renegotiation is answered now when nothing else is being sent
                // (else its warning goes before the next response head: `seal_tail`).
                let idle = self.tls_send == TlsSend::Idle && !self.responding();
                if let Some(tls) = self
                    .tls
                    .as_mut()
                    .filter(|t| idle && t.no_renegotiation_due())
                {
                    tls.queue_no_renegotiation();
                    self.send_tls_output(out);
                }
                true
            }
            Received::PeerClosed => {
                // close_notify says what a FIN says: nothing more will come.
                self.read = ReadState::Eof;
                if !self.responding() {
                    self.close(CloseReason::Normal, cx, out);
                    return false;
                }
                true
            }
            Received::PeerAlert => {
                self.close(CloseReason::Abort, cx, out);
                false
            }
            Received::Fatal => {
                self.close(CloseReason::ProtocolError, cx, out);
                false
            }
        }
    }

    /// This connection's turn in the shard's handshake queue: rustls processes what was
    /// received and its answer goes out; a completed handshake starts the request clock.
    pub fn handshake_turn(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() {
            return;
        }
        let Some(tls) = self.tls.as_mut().filter(|t| t.handshaking()) else {
            return;
        };
        match tls.handshake(&mut self.rx) {
            HandshakeStep::NeedInput => {
                self.send_tls_output(out);
                self.arm_recv(out);
            }
            HandshakeStep::Complete => {
                let facts = tls.facts.as_ref().expect("facts of a completed handshake");
                let outcome = HandshakeOutcome::Ok {
                    version: facts.version,
                    resumed: facts.resumed,
                };
                out.push(Action::Count(Counter::Handshake(outcome), 1));
                out.push(Action::HandshakeTime(
                    cx.now_us.saturating_sub(self.accepted_us),
                ));
                // Records that came behind the client's Finished were left to our record
                // layer (`TlsSession::fed`): a request, or something refused with our alert.
                let behind = self.tls.as_ref().is_some_and(|t| !t.incoming.is_empty());
                if behind && !self.open_tls_records(cx, out) {
                    return;
                }
                self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
                self.send_tls_output(out);
                self.arm_recv(out);
                if !self.rx.is_empty() && self.can_start_request() {
                    out.push(Action::QueueUrgent);
                }
            }
            HandshakeStep::PlainHttp => {
                out.push(Action::Count(
                    Counter::Handshake(HandshakeOutcome::PlainHttp),
                    1,
                ));
                self.close(CloseReason::ProtocolError, cx, out);
            }
            HandshakeStep::Failed(f) => {
                let outcome = match f {
                    HandshakeFailure::Protocol => HandshakeOutcome::Failed,
                    HandshakeFailure::Peer => HandshakeOutcome::PeerClosed,
                    HandshakeFailure::TooLarge => HandshakeOutcome::TooLarge,
                };
                out.push(Action::Count(Counter::Handshake(outcome), 1));
                self.close(CloseReason::ProtocolError, cx, out);
            }
        }
    }

    /// A request may be parsed and answered: no TLS handshake or TLS send stands in the
    /// way (the header buffer is free for the head).
    pub fn can_start_request(&self) -> bool {
        !self.awaiting_fill()
            && self.tls_send == TlsSend::Idle
            && self
                .tls
                .as_ref()
                .is_none_or(|t| t.is_open() && t.outgoing.is_empty())
    }

    /// Sends what the session queued for the client, unless a TLS send is in flight (its
    /// completion sends the rest).
    pub(super) fn send_tls_output(&mut self, out: &mut Actions) {
        if self.tls_send != TlsSend::Idle {
            return;
        }
        let Some(tls) = self.tls.as_ref().filter(|t| !t.outgoing.is_empty()) else {
            return;
        };
        self.tls_send = TlsSend::Sending {
            from: 0,
            len: tls.outgoing.len() as u32,
        };
        out.push(Action::SendTls {
            from: 0,
            swap: true,
        });
    }

    /// A send of the session's bytes completed with `res`.
    pub fn on_tls_sent(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        let TlsSend::Sending { from, len } = self.tls_send else {
            panic!("TLS send completion without a TLS send");
        };
        self.tls_send = TlsSend::Idle;
        if res <= 0 {
            // The client is gone: nothing more of ours reaches it.
            if let Some(tls) = self.tls.as_mut() {
                tls.outgoing.clear();
            }
            if self.is_live() {
                self.close(CloseReason::Abort, cx, out);
            } else {
                self.maybe_finish_close(out);
            }
            return;
        }
        out.push(Action::Count(Counter::TlsBytesOut, res as u64));
        let from = from + res as u32;
        if from < len {
            self.tls_send = TlsSend::Sending { from, len };
            out.push(Action::SendTls { from, swap: false });
            return;
        }
        if !self.is_live() {
            self.maybe_finish_close(out);
            return;
        }
        if let Some(reason) = self.close_after_tls_send.take() {
            self.close(reason, cx, out);
            return;
        }
        let Some(tls) = self.tls.as_ref() else {
            return;
        };
        if !tls.outgoing.is_empty() {
            self.send_tls_output(out);
        } else if self.linger_shutdown_due {
            self.linger_shutdown_due = false;
            self.ops.shutdown = true;
            out.push(Action::ShutdownWrite);
        } else if tls.handshaking() {
            if !tls.incoming.is_empty() {
                out.push(Action::QueueHandshake);
            }
        } else if self.responding() {
            self.try_send(cx, out);
        } else {
            // The request waited for the header buffer (or has not fully arrived: a record
            // may still be cut short in `incoming`).
            if !self.rx.is_empty() {
                out.push(Action::QueueUrgent);
            } else {
                self.idle_tls_memory(out);
            }
            self.arm_recv(out);
        }
    }

    /// An idle TLS connection keeps no more than it needs to resume: its record state, and
    /// buffers cut back to nothing (the session's) and a head's size (the header buffer,
    /// which carried the handshake flight).
    pub(super) fn idle_tls_memory(&mut self, out: &mut Actions) {
        if let Some(tls) = self.tls.as_mut().filter(|t| t.is_open()) {
            tls.shrink_idle();
            out.push(Action::ShrinkHeadBuffer);
        }
    }
}
