//! One origin's connections, as a shard keeps them: a bounded set of idle keep-alive
//! connections, at most `max_fetches` fetches at once over every shard (a `FetchBudget` the
//! shards share without a lock), and the backoff after failures. Pure bookkeeping over
//! connection ids; the shard's ring owns the sockets.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// One origin's fetches at once over every shard: each shard's pool takes a unit before a
/// fetch and gives it back at its end, with atomics (no lock, no shard waits for another).
#[derive(Debug)]
pub struct FetchBudget {
    max: usize,
    taken: AtomicUsize,
    /// A take was refused since the last give-back: whoever gives one back wakes the shards.
    refused: AtomicBool,
}

impl FetchBudget {
    /// A budget of `max` fetches at once.
    pub fn new(max: usize) -> Arc<FetchBudget> {
        assert!(max > 0);
        Arc::new(FetchBudget {
            max,
            taken: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
        })
    }

    /// Takes a unit; false (and remembered) when all `max` are taken.
    fn try_take(&self) -> bool {
        let take = || {
            self.taken
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    (t < self.max).then_some(t + 1)
                })
                .is_ok()
        };
        if take() {
            return true;
        }
        self.refused.store(true, Ordering::Release);
        // A unit given back between the failed take and the mark saw no refusal and woke
        // nobody: take again, so no waiter sleeps while a unit is free.
        take()
    }

    /// Gives a unit back; true when a take was refused meanwhile (its shard waits to be woken).
    fn give_back(&self) -> bool {
        let before = self.taken.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a fetch budget given back more than taken");
        self.refused.swap(false, Ordering::AcqRel)
    }

    /// Fetches running now over every shard.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

/// First wait after a failed fetch before the next attempt.
pub const RETRY_FIRST_MS: u64 = 50;
/// Longest wait between attempts.
pub const RETRY_MAX_MS: u64 = 5_000;
/// Attempts a fetch makes before its error goes to the client.
pub const RETRY_ATTEMPTS_MAX: u32 = 4;

/// What a fetch may do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Send on this idle keep-alive connection.
    Reuse(u32),
    /// Open a new connection (the caller gets an id from its table and reports it with
    /// `opened`).
    Connect,
    /// `max_fetches` are in flight: wait for one to end.
    Wait,
}

/// One origin's pool.
#[derive(Debug)]
pub struct Pool {
    budget: Arc<FetchBudget>,
    max_idle: usize,
    in_flight: usize,
    idle: VecDeque<u32>,
    /// A give-back found a refused take: the shards waiting on this origin should be woken.
    freed_for_others: bool,
}

impl Pool {
    /// A pool that runs at most `max_fetches` fetches at once (a budget of its own) and keeps
    /// at most `max_idle` idle connections.
    pub fn new(max_fetches: usize, max_idle: usize) -> Pool {
        Pool::with_budget(FetchBudget::new(max_fetches), max_idle)
    }

    /// A pool whose fetches at once count against `budget`, shared with other shards' pools.
    pub fn with_budget(budget: Arc<FetchBudget>, max_idle: usize) -> Pool {
        Pool {
            budget,
            max_idle,
            in_flight: 0,
            idle: VecDeque::with_capacity(max_idle),
            freed_for_others: false,
        }
    }

    /// A fetch wants to start: the most recently idled connection first (its socket is the
    /// least likely to have been closed by the origin).
    pub fn acquire(&mut self) -> Grant {
        if !self.budget.try_take() {
            return Grant::Wait;
        }
        self.in_flight += 1;
        match self.idle.pop_back() {
            Some(c) => Grant::Reuse(c),
            None => Grant::Connect,
        }
    }

    /// A fetch ended on connection `conn`. With `keep` (a whole response on a keep-alive
    /// connection), the connection goes idle if there is room; returns the connection to close
    /// otherwise (it, or the oldest idle one it displaced).
    pub fn release(&mut self, conn: u32, keep: bool) -> Option<u32> {
        assert!(self.in_flight > 0, "a release without an acquire");
        self.in_flight -= 1;
        self.freed_for_others |= self.budget.give_back();
        if !keep || self.max_idle == 0 {
            return Some(conn);
        }
        self.idle.push_back(conn);
        if self.idle.len() > self.max_idle {
            return self.idle.pop_front();
        }
        None
    }

    /// An idle connection was closed by the origin (or timed out): forget it.
    pub fn forget_idle(&mut self, conn: u32) -> bool {
        match self.idle.iter().position(|&c| c == conn) {
            Some(i) => {
                self.idle.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether a fetch ended since the last call while another pool (or this one) had been
    /// refused a unit of the shared budget: the shards waiting on it should try again.
    pub fn take_freed_for_others(&mut self) -> bool {
        std::mem::take(&mut self.freed_for_others)
    }

    /// Fetches in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Idle connections kept.
    pub fn idle(&self) -> usize {
        self.idle.len()
    }
}

/// The wait before attempt `attempt` (1 = the first retry), or None once the attempts are
/// spent. It doubles from `RETRY_FIRST_MS` up to `RETRY_MAX_MS`, with jitter from `seed` (the
/// shard's randomness) over the upper half, so fetches that failed together do not retry
/// together. A retry always goes out on another connection.
pub fn retry_after_ms(attempt: u32, seed: u64) -> Option<u64> {
    if attempt == 0 || attempt >= RETRY_ATTEMPTS_MAX {
        return None;
    }
    let full = RETRY_FIRST_MS
        .saturating_mul(1 << (attempt - 1).min(16))
        .min(RETRY_MAX_MS);
    let half = full / 2;
    Some(half + seed % (full - half + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_are_bounded_and_idle_connections_are_reused_newest_first() {
        let mut p = Pool::new(2, 2);
        assert_eq!(p.acquire(), Grant::Connect);
        assert_eq!(p.acquire(), Grant::Connect);
        assert_eq!(p.acquire(), Grant::Wait, "at most 2 fetches");
        assert_eq!(p.release(10, true), None);
        assert_eq!(p.release(11, true), None);
        assert_eq!((p.in_flight(), p.idle()), (0, 2));
        assert_eq!(p.acquire(), Grant::Reuse(11));
        assert_eq!(p.release(11, false), Some(11), "not kept: closed");
        assert!(p.forget_idle(10));
        assert!(!p.forget_idle(10));
        assert_eq!(p.acquire(), Grant::Connect);
        // Past max_idle the oldest idle one is closed.
        let mut q = Pool::new(4, 1);
        for _ in 0..2 {
            q.acquire();
        }
        assert_eq!(q.release(1, true), None);
        assert_eq!(q.release(2, true), Some(1));
        assert_eq!(q.acquire(), Grant::Reuse(2));
    }

    #[test]
    fn pools_sharing_a_budget_run_at_most_its_fetches_over_all_shards() {
        let budget = FetchBudget::new(1);
        let mut a = Pool::with_budget(budget.clone(), 1);
        let mut b = Pool::with_budget(budget.clone(), 1);
        assert_eq!(a.acquire(), Grant::Connect);
        assert_eq!(
            b.acquire(),
            Grant::Wait,
            "the other shard's fetch holds the unit"
        );
        assert_eq!(budget.taken(), 1);
        assert_eq!(a.release(3, true), None);
        assert!(a.take_freed_for_others(), "b was refused: it must be woken");
        assert!(!a.take_freed_for_others());
        assert_eq!(b.acquire(), Grant::Connect);
        assert_eq!(a.acquire(), Grant::Wait);
        b.release(4, false);
        assert!(b.take_freed_for_others());
        assert_eq!(a.acquire(), Grant::Reuse(3));
        a.release(3, true);
        assert!(!a.take_freed_for_others(), "nobody was refused since");
        assert_eq!(budget.taken(), 0);
    }

    #[test]
    fn retries_back_off_with_jitter_and_stop() {
        assert_eq!(retry_after_ms(0, 0), None);
        for seed in [0u64, 1, 77, u64::MAX] {
            let waits: Vec<u64> = (1..RETRY_ATTEMPTS_MAX)
                .map(|a| retry_after_ms(a, seed).unwrap())
                .collect();
            for (i, w) in waits.iter().enumerate() {
                let full = RETRY_FIRST_MS << i;
                assert!(*w >= full / 2 && *w <= full, "attempt {} waits {w}", i + 1);
            }
        }
        assert_eq!(retry_after_ms(RETRY_ATTEMPTS_MAX, 3), None);
        assert!(retry_after_ms(3, 12345).unwrap() <= RETRY_MAX_MS);
    }
}
