//! Which of a ring's memory the kernel holds right now: arena slots (a read, a send or a
//! SEND_ZC in flight), receive buffers (provided to the kernel until a completion hands one
//! over), peer-address buffers (a peer request in flight) and the access log's write; and
//! which fixed-file indexes name files. One type for the real ring (`shard::ring`) and the
//! simulated one (`shard::sim::ring`), so every simulator run checks the assertions the real
//! ring makes before it lets the kernel touch memory, or the shard touch it back.

use super::slots::{ArenaSlot, FileSlot};

/// Who holds each buffer a ring lends the kernel. Every transition asserts the state it
/// leaves: a buffer lent twice, or used by the shard while the kernel holds it, panics.
#[derive(Debug)]
pub struct Custody {
    /// Per arena slot: the kernel holds it.
    arena: Vec<bool>,
    /// Per receive buffer: the shard holds it (a completion handed it over; not provided
    /// back yet).
    recv_held: Vec<bool>,
    /// Per connection slot: a peer-address request is in flight into its buffer.
    peers: Vec<bool>,
    /// The access log's buffer is being written.
    log: bool,
    socket_slots: u32,
    file_slots: u32,
}

impl Custody {
    /// Nothing lent; every receive buffer still the shard's (`provide_recv` hands each over).
    pub fn new(
        arena_slots: usize,
        recv_buffers: usize,
        conn_slots: usize,
        socket_slots: u32,
        file_slots: u32,
    ) -> Custody {
        Custody {
            arena: vec![false; arena_slots],
            recv_held: vec![true; recv_buffers],
            peers: vec![false; conn_slots],
            log: false,
            socket_slots,
            file_slots,
        }
    }

    /// The kernel takes arena slot `slot` (a read or a send of it is submitted).
    pub fn lend_arena(&mut self, slot: ArenaSlot) {
        let held = &mut self.arena[slot.index()];
        assert!(!*held, "arena slot {slot} already in flight");
        *held = true;
    }

    /// The kernel is done with arena slot `slot` (its read, send or ZC notification arrived).
    pub fn arena_done(&mut self, slot: ArenaSlot) {
        let held = &mut self.arena[slot.index()];
        assert!(*held, "arena_done on slot {slot} not in flight");
        *held = false;
    }

    /// Asserts the shard may touch arena slot `slot` (`what` it does, for the message).
    pub fn check_arena_free(&self, slot: ArenaSlot, what: &str) {
        assert!(
            !self.arena[slot.index()],
            "arena slot {slot} {what} while in flight"
        );
    }

    /// Whether the kernel holds arena slot `slot`.
    pub fn arena_in_flight(&self, slot: ArenaSlot) -> bool {
        self.arena[slot.index()]
    }

    /// Receive buffer `bid` goes (back) to the kernel.
    pub fn provide_recv(&mut self, bid: u16) {
        let held = &mut self.recv_held[usize::from(bid)];
        assert!(*held, "recv buffer {bid} provided twice");
        *held = false;
    }

    /// A completion handed receive buffer `bid` to the shard.
    pub fn claim_recv(&mut self, bid: u16) {
        let held = &mut self.recv_held[usize::from(bid)];
        assert!(!*held, "recv buffer {bid} claimed twice");
        *held = true;
    }

    /// Asserts the shard holds receive buffer `bid` (it reads it).
    pub fn check_recv_held(&self, bid: u16) {
        assert!(
            self.recv_held[usize::from(bid)],
            "reading recv buffer {bid} the kernel owns"
        );
    }

    /// A peer-address request for connection slot `conn` goes to the kernel.
    pub fn lend_peer(&mut self, conn: usize) {
        let lent = &mut self.peers[conn];
        assert!(!*lent, "second peer request for slot {conn} in flight");
        *lent = true;
    }

    /// Connection slot `conn`'s peer-address request completed.
    pub fn peer_done(&mut self, conn: usize) {
        let lent = &mut self.peers[conn];
        assert!(*lent, "peer completion for slot {conn} without a request");
        *lent = false;
    }

    /// The access log's buffer goes to the kernel (one write at a time).
    pub fn lend_log(&mut self) {
        assert!(!self.log, "second log write in flight");
        self.log = true;
    }

    /// The access log's write completed.
    pub fn log_done(&mut self) {
        assert!(self.log, "log write completion without a write");
        self.log = false;
    }

    /// Asserts the absolute fixed-file index `file` names a file slot, not a socket's.
    pub fn check_file_index(&self, file: u32) {
        assert!(
            file >= self.socket_slots && file < self.socket_slots + self.file_slots,
            "fixed index {file} is not a file slot"
        );
    }

    /// Asserts file slot `index` is in the file range.
    pub fn check_file_slot(&self, index: FileSlot) {
        assert!(
            index.raw() < self.file_slots,
            "file slot {index} out of range"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custody() -> Custody {
        Custody::new(4, 2, 3, 8, 8)
    }

    #[test]
    fn an_arena_slot_is_lent_once_and_untouchable_until_done() {
        let mut c = custody();
        let s = ArenaSlot::new(1);
        c.lend_arena(s);
        assert!(c.arena_in_flight(s));
        let again = std::panic::catch_unwind(move || {
            let mut c = c;
            c.lend_arena(s);
        });
        assert!(again.is_err(), "a second lend of one slot must panic");
        let mut c = custody();
        c.lend_arena(s);
        let touched = std::panic::catch_unwind(|| c.check_arena_free(s, "read"));
        assert!(touched.is_err(), "touching a lent slot must panic");
        c.arena_done(s);
        c.check_arena_free(s, "read");
    }

    #[test]
    fn receive_buffers_start_with_the_shard_and_alternate() {
        let mut c = custody();
        c.check_recv_held(0);
        c.provide_recv(0);
        assert!(std::panic::catch_unwind(|| c.check_recv_held(0)).is_err());
        let mut c = custody();
        c.provide_recv(1);
        c.claim_recv(1);
        c.check_recv_held(1);
        assert!(std::panic::catch_unwind(move || {
            let mut c = c;
            c.claim_recv(1);
        })
        .is_err());
    }

    #[test]
    fn peers_and_the_log_take_one_request_at_a_time() {
        let mut c = custody();
        c.lend_peer(2);
        c.peer_done(2);
        c.lend_log();
        c.log_done();
        assert!(std::panic::catch_unwind(move || {
            let mut c = c;
            c.peer_done(2);
        })
        .is_err());
        let c = custody();
        c.check_file_index(8);
        c.check_file_index(15);
        assert!(std::panic::catch_unwind(|| c.check_file_index(7)).is_err());
        assert!(std::panic::catch_unwind(|| c.check_file_index(16)).is_err());
    }
}
