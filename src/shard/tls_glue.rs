//! The shard's side of TLS records: the machine's TLS actions carried out (a handshake queued
//! or left, the session's own bytes sent from the header buffer, a chunk's plaintext sealed
//! out of place into its arena slot).

use super::machine::Action;
use super::slots::{ConnSlot, SocketSlot};
use super::token::Op;
use super::{RingOps, Shard};

impl<R: RingOps> Shard<R> {
    /// Carries out TLS action `action` of connection `c` (on socket `socket`).
    pub(super) fn execute_tls(&mut self, c: ConnSlot, socket: SocketSlot, action: Action) {
        match action {
            Action::QueueHandshake => self.queue_handshake(c),
            Action::LeaveHandshakeQueue => {
                self.handshaking.handshakes.remove(c.raw());
            }
            Action::SendTls { from, swap } => {
                if swap {
                    let tls = self.conns[c.index()]
                        .tls_mut()
                        .expect("TLS bytes without a session");
                    let tx = self.ring.tx_mut(c);
                    std::mem::swap(tx, &mut tls.outgoing);
                    tls.outgoing.clear();
                }
                let t = self.token(Op::SendTls, c);
                self.ring.send_tx(c, socket, from as usize, 0, t);
            }
            Action::Seal {
                slot,
                at,
                cut,
                first_seq,
            } => {
                let tls = self.conns[c.index()]
                    .tls()
                    .expect("sealing without a session");
                // Out of place into the spare buffer, which becomes the slot's: one pass
                // over the bytes instead of a move to make room for framing, then the AEAD.
                self.ring.arena_rewrite(slot, &mut |src, dst| {
                    crate::tls::record::seal_run_into(
                        tls.tx_key(),
                        src,
                        dst,
                        at as usize,
                        &cut,
                        crate::tls::record::CONTENT_APPLICATION_DATA,
                        first_seq,
                    )
                });
            }
            _ => unreachable!("not a TLS action: {action:?}"),
        }
    }
}
