//! Ownership bookkeeping for the registered arena: which slots are free, and who waits.
//!
//! A slot belongs to exactly one owner at a time: this free list, or one connection's chunk
//! (which may in turn have lent it to the kernel; the ring tracks that part). When the free
//! list is empty, connections queue here — there is no heap fallback.

use super::intrusive::ListSet;
use super::slots::{ArenaSlot, ConnSlot};

const SMALL_WAITERS: usize = 0;
const BULK_WAITERS: usize = 1;

/// Slots kept back from bulk transfers (a limit the config checks, so it lives there).
pub use crate::config::RESERVED_FOR_SMALL_SLOTS;

/// What kind of response asks for a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demand {
    /// Header plus a whole small body in one slot; may use the reserve.
    Small,
    /// One chunk of a large transfer; leaves the reserve alone.
    Bulk,
    /// A chunk read ahead by a transfer that already holds one: taken only while a quarter of
    /// the arena is free and nobody waits, and never queued, so read-ahead can neither starve
    /// a connection that holds nothing nor make anyone wait.
    ReadAhead,
}

/// Share of the arena (1/N) kept free of read-ahead, for connections that hold no chunk.
pub const READ_AHEAD_FREE_DIVISOR: usize = 4;

/// Free list and wait queues of one shard's arena.
pub struct ArenaSlots {
    free: Vec<ArenaSlot>,
    /// Per arena slot: on the free list (a slot is never freed twice).
    is_free: Vec<bool>,
    reserve: usize,
    /// Connection slots waiting for a small-response buffer (served first) or a bulk chunk
    /// buffer: intrusive FIFOs, O(1) to join, leave and pop.
    waiters: ListSet<2>,
    /// Times a connection had to wait for a slot.
    pub waits: u64,
    total: usize,
}

impl ArenaSlots {
    /// `slots` arena slots, all free, for connections `0..conns`.
    pub fn new(slots: u16, conns: usize) -> ArenaSlots {
        let total = usize::from(slots);
        let reserve = RESERVED_FOR_SMALL_SLOTS.min(total / 2);
        ArenaSlots {
            free: (0..slots).rev().map(ArenaSlot::new).collect(),
            is_free: vec![true; total],
            reserve,
            waiters: ListSet::new(conns),
            waits: 0,
            total,
        }
    }

    /// Takes a slot for `demand`, or None when the caller must wait (see `wait`).
    ///
    /// Bulk demand never overtakes a queued bulk waiter: slots freed while connections wait
    /// are handed to them in FIFO order (`give_back`), so one connection cannot go without a
    /// chunk while others refill their pipelines.
    pub fn take(&mut self, demand: Demand) -> Option<ArenaSlot> {
        let floor = match demand {
            Demand::Small => 0,
            Demand::Bulk if !self.waiters.is_empty(BULK_WAITERS) => return None,
            Demand::Bulk => self.reserve,
            Demand::ReadAhead if self.waiting() > 0 => return None,
            Demand::ReadAhead => self.reserve + self.total / READ_AHEAD_FREE_DIVISOR,
        };
        if self.free.len() > floor {
            let slot = self.free.pop()?;
            self.is_free[slot.index()] = false;
            Some(slot)
        } else {
            None
        }
    }

    /// Takes a bulk slot for a pass-through's fetch only while `chunks_owed` more stay free
    /// besides the reserve: a fetch's slot comes back only once its client's chunk has copied
    /// it, so fetches holding every slot would wait on chunks that never come.
    pub fn take_leaving(&mut self, chunks_owed: usize) -> Option<ArenaSlot> {
        if self.free.len() <= self.reserve + chunks_owed {
            return None;
        }
        self.take(Demand::Bulk)
    }

    /// Queues connection `conn` until a slot for `demand` frees up.
    pub fn wait(&mut self, conn: ConnSlot, demand: Demand) {
        self.waits += 1;
        let list = match demand {
            Demand::Small => SMALL_WAITERS,
            Demand::Bulk => BULK_WAITERS,
            Demand::ReadAhead => unreachable!("read-ahead never waits"),
        };
        if self.waiters.list_of(conn.raw()) != Some(list) {
            self.waiters.push_back(list, conn.raw());
        }
    }

    /// Returns slot `slot`. If a connection waits for it, the slot is handed to that
    /// connection directly (small responses first; bulk only while the reserve is full) and
    /// `(conn, slot)` is returned: the caller must give it to that connection.
    pub fn give_back(&mut self, slot: ArenaSlot) -> Option<(ConnSlot, ArenaSlot)> {
        assert!(!self.is_free[slot.index()], "slot {slot} freed twice");
        assert!(self.free.len() < self.total);
        if let Some(c) = self.waiters.pop_front(SMALL_WAITERS) {
            return Some((ConnSlot::new(c), slot));
        }
        if self.free.len() >= self.reserve {
            if let Some(c) = self.waiters.pop_front(BULK_WAITERS) {
                return Some((ConnSlot::new(c), slot));
            }
        }
        self.is_free[slot.index()] = true;
        self.free.push(slot);
        None
    }

    /// Forgets a connection that closed while waiting.
    pub fn forget(&mut self, conn: ConnSlot) {
        self.waiters.remove(conn.raw());
    }

    /// Free slots now.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Connections waiting now.
    pub fn waiting(&self) -> usize {
        self.waiters.len(SMALL_WAITERS) + self.waiters.len(BULK_WAITERS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(raw: u32) -> ConnSlot {
        ConnSlot::new(raw)
    }

    #[test]
    fn read_ahead_keeps_a_quarter_free_and_yields_to_waiters() {
        let mut a = ArenaSlots::new(16, 64);
        // reserve 4 + 16/4 = 8 slots stay free of read-ahead.
        let mut got = 0;
        while a.take(Demand::ReadAhead).is_some() {
            got += 1;
        }
        assert_eq!(got, 8);
        assert_eq!(a.free_count(), 8);
        assert!(a.take(Demand::Bulk).is_some());
        // Anyone waiting stops read-ahead even with slots above the floor.
        let mut b = ArenaSlots::new(16, 64);
        b.wait(c(3), Demand::Small);
        assert_eq!(b.take(Demand::ReadAhead), None);
    }

    #[test]
    fn bulk_leaves_the_reserve_for_small_responses() {
        let mut a = ArenaSlots::new(8, 64);
        let mut bulk = Vec::new();
        while let Some(s) = a.take(Demand::Bulk) {
            bulk.push(s);
        }
        assert_eq!(bulk.len(), 8 - RESERVED_FOR_SMALL_SLOTS);
        assert!(a.take(Demand::Small).is_some());
        assert_eq!(a.free_count(), RESERVED_FOR_SMALL_SLOTS - 1);
    }

    #[test]
    fn freed_slots_are_handed_to_waiters_small_first_then_bulk() {
        let mut a = ArenaSlots::new(8, 64);
        let mut held = Vec::new();
        while let Some(s) = a.take(Demand::Small) {
            held.push(s);
        }
        a.wait(c(1), Demand::Bulk);
        a.wait(c(2), Demand::Small);
        a.wait(c(2), Demand::Small);
        assert_eq!(a.waiting(), 2);
        assert_eq!(a.waits, 3);
        let s = held.pop().unwrap();
        assert_eq!(a.give_back(s), Some((c(2), s)));
        // Bulk waiters get a slot only once the reserve is refilled.
        for _ in 0..RESERVED_FOR_SMALL_SLOTS {
            assert_eq!(a.give_back(held.pop().unwrap()), None);
        }
        let s = held.pop().unwrap();
        assert_eq!(a.give_back(s), Some((c(1), s)));
    }

    #[test]
    fn bulk_takers_do_not_overtake_waiters() {
        let mut a = ArenaSlots::new(16, 64);
        let mut held = Vec::new();
        while let Some(s) = a.take(Demand::Bulk) {
            held.push(s);
        }
        a.wait(c(7), Demand::Bulk);
        a.wait(c(8), Demand::Bulk);
        // A slot frees up while the reserve is full: it goes to the first waiter, in order,
        // and a newcomer cannot take one meanwhile.
        let s = held.pop().unwrap();
        assert_eq!(a.give_back(s), Some((c(7), s)));
        assert_eq!(a.take(Demand::Bulk), None);
        let s = held.pop().unwrap();
        assert_eq!(a.give_back(s), Some((c(8), s)));
        let s = held.pop().unwrap();
        assert_eq!(a.give_back(s), None);
        assert!(a.take(Demand::Bulk).is_some());
    }

    #[test]
    fn forget_drops_a_waiter() {
        let mut a = ArenaSlots::new(2, 64);
        a.wait(c(5), Demand::Bulk);
        a.forget(c(5));
        assert_eq!(a.waiting(), 0);
    }
}
