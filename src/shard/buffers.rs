//! Ownership bookkeeping for the registered arena: which slots are free, and who waits.
//!
//! A slot belongs to exactly one owner at a time: this free list, or one connection's chunk
//! (which may in turn have lent it to the kernel; the ring tracks that part). When the free
//! list is empty, connections queue here — there is no heap fallback.

use std::collections::VecDeque;

/// Slots kept back from bulk transfers so a small response never waits behind them.
pub const RESERVED_FOR_SMALL_SLOTS: usize = 4;

/// What kind of response asks for a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demand {
    /// Header plus a whole small body in one slot; may use the reserve.
    Small,
    /// One chunk of a large transfer; leaves the reserve alone.
    Bulk,
}

/// Free list and wait queues of one shard's arena.
pub struct ArenaSlots {
    free: Vec<u16>,
    reserve: usize,
    /// Connection slots waiting for a small-response buffer (served first).
    small_waiters: VecDeque<u32>,
    /// Connection slots waiting for a bulk chunk buffer.
    bulk_waiters: VecDeque<u32>,
    /// Times a connection had to wait for a slot.
    pub waits: u64,
    total: usize,
}

impl ArenaSlots {
    /// `slots` slots, all free.
    pub fn new(slots: u16) -> ArenaSlots {
        let total = usize::from(slots);
        let reserve = RESERVED_FOR_SMALL_SLOTS.min(total / 2);
        ArenaSlots {
            free: (0..slots).rev().collect(),
            reserve,
            small_waiters: VecDeque::new(),
            bulk_waiters: VecDeque::new(),
            waits: 0,
            total,
        }
    }

    /// Takes a slot for `demand`, or None when the caller must wait (see `wait`).
    pub fn take(&mut self, demand: Demand) -> Option<u16> {
        let floor = match demand {
            Demand::Small => 0,
            Demand::Bulk => self.reserve,
        };
        if self.free.len() > floor {
            self.free.pop()
        } else {
            None
        }
    }

    /// Queues connection `conn` until a slot for `demand` frees up.
    pub fn wait(&mut self, conn: u32, demand: Demand) {
        self.waits += 1;
        let q = match demand {
            Demand::Small => &mut self.small_waiters,
            Demand::Bulk => &mut self.bulk_waiters,
        };
        if !q.contains(&conn) {
            q.push_back(conn);
        }
    }

    /// Returns slot `slot` to the free list; yields the connection to wake, if any.
    pub fn give_back(&mut self, slot: u16) -> Option<u32> {
        debug_assert!(!self.free.contains(&slot), "slot {slot} freed twice");
        self.free.push(slot);
        assert!(self.free.len() <= self.total);
        if let Some(c) = self.small_waiters.pop_front() {
            return Some(c);
        }
        if self.free.len() > self.reserve {
            return self.bulk_waiters.pop_front();
        }
        None
    }

    /// Forgets a connection that closed while waiting.
    pub fn forget(&mut self, conn: u32) {
        self.small_waiters.retain(|&c| c != conn);
        self.bulk_waiters.retain(|&c| c != conn);
    }

    /// Free slots now.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Connections waiting now.
    pub fn waiting(&self) -> usize {
        self.small_waiters.len() + self.bulk_waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_leaves_the_reserve_for_small_responses() {
        let mut a = ArenaSlots::new(8);
        let mut bulk = Vec::new();
        while let Some(s) = a.take(Demand::Bulk) {
            bulk.push(s);
        }
        assert_eq!(bulk.len(), 8 - RESERVED_FOR_SMALL_SLOTS);
        assert!(a.take(Demand::Small).is_some());
        assert_eq!(a.free_count(), RESERVED_FOR_SMALL_SLOTS - 1);
    }

    #[test]
    fn waiters_wake_small_first_then_bulk() {
        let mut a = ArenaSlots::new(8);
        let mut held = Vec::new();
        while let Some(s) = a.take(Demand::Small) {
            held.push(s);
        }
        a.wait(1, Demand::Bulk);
        a.wait(2, Demand::Small);
        a.wait(2, Demand::Small);
        assert_eq!(a.waiting(), 2);
        assert_eq!(a.waits, 3);
        assert_eq!(a.give_back(held.pop().unwrap()), Some(2));
        // Bulk waiters wake only once the reserve is refilled.
        for _ in 0..RESERVED_FOR_SMALL_SLOTS - 1 {
            assert_eq!(a.give_back(held.pop().unwrap()), None);
        }
        assert_eq!(a.give_back(held.pop().unwrap()), Some(1));
    }

    #[test]
    fn forget_drops_a_waiter() {
        let mut a = ArenaSlots::new(2);
        a.wait(5, Demand::Bulk);
        a.forget(5);
        assert_eq!(a.waiting(), 0);
    }
}
