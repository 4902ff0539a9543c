//! The ready queue: which connections get to add work in this loop tick, and in what order.
//!
//! Two queues: `urgent` holds connections with a newly parsed request (their first chunk is
//! issued before any bulk connection adds more), `bulk` holds transfers that want to add
//! their next chunks. Each visit a connection may add at most `tick_budget_bytes`; if it
//! wants more it goes to the back, so one fast connection cannot hold the shard.

use super::intrusive::ListSet;
use super::slots::ConnSlot;

/// What a connection did with its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Still has work to add: requeue at the back of `bulk`.
    MoreWork,
    /// Nothing to add until a completion arrives (or it waits for an arena slot).
    Idle,
}

const URGENT: usize = 0;
const BULK: usize = 1;

/// Round-robin ready queues (a connection is queued at most once, in one of them). Intrusive
/// lists: queueing, promotion and removal are O(1), with no allocation after start-up.
pub struct ReadyQueue {
    lists: ListSet<2>,
    /// Bulk entries still to visit in the current tick.
    bulk_rounds: usize,
}

impl ReadyQueue {
    /// Queues for `slots` connection slots.
    pub fn new(slots: usize) -> ReadyQueue {
        ReadyQueue {
            lists: ListSet::new(slots),
            bulk_rounds: 0,
        }
    }

    /// Queues `conn` ahead of bulk work (a new request); one waiting in bulk is promoted.
    pub fn push_urgent(&mut self, conn: ConnSlot) {
        if self.lists.list_of(conn.raw()) != Some(URGENT) {
            self.lists.push_back(URGENT, conn.raw());
        }
    }

    /// Queues `conn` at the back of the bulk queue (unless already queued).
    pub fn push_bulk(&mut self, conn: ConnSlot) {
        if self.lists.list_of(conn.raw()).is_none() {
            self.lists.push_back(BULK, conn.raw());
        }
    }

    /// Drops `conn` from the queues (it is closing).
    pub fn remove(&mut self, conn: ConnSlot) {
        self.lists.remove(conn.raw());
    }

    /// Connections queued now.
    pub fn len(&self) -> usize {
        self.lists.len(URGENT) + self.lists.len(BULK)
    }

    /// Whether a connection waits in the urgent queue.
    pub fn has_urgent(&self) -> bool {
        self.lists.len(URGENT) > 0
    }

    /// True when no connection is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts a tick: the bulk connections queued now get one visit each in this tick.
    pub fn begin_tick(&mut self) {
        self.bulk_rounds = self.lists.len(BULK);
    }

    /// The next connection to visit in this tick: urgent ones first (including those queued
    /// during the tick), then the bulk connections that were queued when the tick began.
    /// The caller re-queues it (`push_bulk`) if it wants another turn.
    /// With `bulk_allowed` false (the shard's budget for this tick is spent) only urgent
    /// connections are returned; the unvisited bulk ones keep their place at the front.
    pub fn next_conn(&mut self, bulk_allowed: bool) -> Option<ConnSlot> {
        if let Some(c) = self.lists.pop_front(URGENT) {
            return Some(ConnSlot::new(c));
        }
        if bulk_allowed && self.bulk_rounds > 0 {
            self.bulk_rounds -= 1;
            return self.lists.pop_front(BULK).map(ConnSlot::new);
        }
        None
    }

    /// Runs one tick with `visit` deciding each connection's turn.
    pub fn run_tick(&mut self, mut visit: impl FnMut(ConnSlot) -> Turn) {
        self.begin_tick();
        while let Some(c) = self.next_conn(true) {
            if visit(c) == Turn::MoreWork {
                self.push_bulk(c);
            }
        }
    }
}

/// Bytes a connection may still add in its current visit.
#[derive(Clone, Copy, Debug)]
pub struct TickBudget {
    left_bytes: usize,
}

impl TickBudget {
    /// A fresh budget of `bytes`.
    pub fn new(bytes: usize) -> TickBudget {
        TickBudget { left_bytes: bytes }
    }
    /// Whether another piece of work may start (the last one may overshoot by < one chunk).
    pub fn has_room(&self) -> bool {
        self.left_bytes > 0
    }
    /// Charges `bytes` of added work.
    pub fn charge(&mut self, bytes: usize) {
        self.left_bytes = self.left_bytes.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated transfer: `remaining` bytes, `chunk` per piece of work, at most `depth`
    /// pieces outstanding (completions are simulated between ticks).
    struct Sim {
        remaining: usize,
        outstanding: usize,
    }

    const CHUNK: usize = 512 * 1024;
    const BUDGET: usize = 1024 * 1024;
    const DEPTH: usize = 4;

    fn c(raw: u32) -> ConnSlot {
        ConnSlot::new(raw)
    }

    fn visit(sims: &mut [Sim], c: ConnSlot, log: &mut Vec<u32>) -> Turn {
        let s = &mut sims[c.index()];
        let mut budget = TickBudget::new(BUDGET);
        while budget.has_room() && s.outstanding < DEPTH && s.remaining > 0 {
            let n = CHUNK.min(s.remaining);
            s.remaining -= n;
            s.outstanding += 1;
            budget.charge(n);
            log.push(c.raw());
        }
        if s.remaining > 0 && s.outstanding < DEPTH {
            Turn::MoreWork
        } else {
            Turn::Idle
        }
    }

    /// 100 bulk connections and one small request arriving later: the small request's work
    /// is issued in the very next tick, before any bulk connection adds a chunk.
    #[test]
    fn small_request_is_served_within_one_tick_under_bulk() {
        let mut sims: Vec<Sim> = (0..101)
            .map(|_| Sim {
                remaining: 1 << 30,
                outstanding: 0,
            })
            .collect();
        sims[100].remaining = 1024;
        let mut q = ReadyQueue::new(101);
        for i in 0..100 {
            q.push_bulk(c(i));
        }
        let mut log = Vec::new();
        q.run_tick(|c| visit(&mut sims, c, &mut log));
        // Every bulk connection got exactly its budget (2 chunks) in the first tick.
        assert_eq!(log.len(), 200);
        for s in &mut sims[..100] {
            s.outstanding = 0; // their chunks completed
        }
        // The small request arrives; bulk connections are all queued again.
        q.push_urgent(c(100));
        log.clear();
        q.run_tick(|c| visit(&mut sims, c, &mut log));
        assert_eq!(log[0], 100, "small request must be first in the tick");
        assert_eq!(sims[100].remaining, 0);
    }

    #[test]
    fn budget_bounds_each_visit_and_rotates() {
        let mut sims: Vec<Sim> = (0..3)
            .map(|_| Sim {
                remaining: 10 * CHUNK,
                outstanding: 0,
            })
            .collect();
        let mut q = ReadyQueue::new(3);
        for i in 0..3 {
            q.push_bulk(c(i));
        }
        let mut log = Vec::new();
        q.run_tick(|c| visit(&mut sims, c, &mut log));
        assert_eq!(log, vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(q.len(), 3, "all still want more");
    }

    #[test]
    fn spent_shard_budget_serves_urgent_and_keeps_bulk_order() {
        let mut q = ReadyQueue::new(8);
        for i in [1, 2, 3] {
            q.push_bulk(c(i));
        }
        q.begin_tick();
        assert_eq!(q.next_conn(true), Some(c(1)));
        // The shard's budget is spent: bulk waits, a new request is still served.
        q.push_urgent(c(5));
        assert_eq!(q.next_conn(false), Some(c(5)));
        assert_eq!(q.next_conn(false), None);
        // Next tick: 2 and 3 come first, before connections queued after them.
        q.push_bulk(c(4));
        q.begin_tick();
        let order: Vec<ConnSlot> = std::iter::from_fn(|| q.next_conn(true)).collect();
        assert_eq!(order, vec![c(2), c(3), c(4)]);
    }

    #[test]
    fn a_connection_is_queued_once() {
        let mut q = ReadyQueue::new(4);
        q.push_bulk(c(1));
        q.push_bulk(c(1));
        q.push_urgent(c(1));
        assert_eq!(q.len(), 1);
        let mut seen = Vec::new();
        q.run_tick(|conn| {
            seen.push(conn);
            Turn::Idle
        });
        assert_eq!(seen, vec![c(1)]);
        q.push_bulk(c(2));
        q.remove(c(2));
        assert!(q.is_empty());
    }
}
