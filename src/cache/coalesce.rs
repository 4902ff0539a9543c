//! One origin fetch per block, however many clients want it: the fills in flight and who
//! waits on each. The first client to want a missing block starts its fetch; later ones wait
//! on it and are woken together when the block is on disk (or told the fetch failed). Pure
//! bookkeeping over block keys and waiter ids; the shard drives the fetches.

use std::collections::HashMap;
use std::hash::Hash;

/// Most clients that may wait on one block's fill (past it, a client is served by a fetch of
/// its own, passed through: a bound on the waiter lists, not on who is served).
pub const MAX_WAITERS_PER_BLOCK: usize = 4096;

/// What a client that wants a missing block does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Nobody is fetching it: start the fetch (this client waits on it too).
    Fetch,
    /// A fetch is under way: wait for it.
    Wait,
    /// Too many wait already: fetch it for this client alone, without storing it.
    PassThrough,
}

/// What became of a failed fetch.
#[derive(Debug, PartialEq, Eq)]
pub enum Failed<W> {
    /// Try again (on another connection, after `origin::pool::retry_after_ms(attempt)`):
    /// the waiters keep waiting.
    Retry {
        /// The attempt about to be made (1 = the first retry).
        attempt: u32,
    },
    /// Attempts are spent: these waiters get the error.
    GiveUp(Vec<W>),
}

#[derive(Debug)]
struct Fill<W> {
    waiters: Vec<W>,
    attempt: u32,
}

/// The fills in flight.
#[derive(Debug)]
pub struct Fills<K: Hash + Eq + Copy, W: PartialEq> {
    fills: HashMap<K, Fill<W>>,
    max_attempts: u32,
}

impl<K: Hash + Eq + Copy, W: PartialEq> Fills<K, W> {
    /// No fill in flight; a fetch is tried at most `max_attempts` times.
    pub fn new(max_attempts: u32) -> Fills<K, W> {
        assert!(max_attempts > 0);
        Fills {
            fills: HashMap::new(),
            max_attempts,
        }
    }

    /// `waiter` wants block `key`, which is not on disk.
    pub fn want(&mut self, key: K, waiter: W) -> Ask {
        match self.fills.get_mut(&key) {
            None => {
                self.fills.insert(
                    key,
                    Fill {
                        waiters: vec![waiter],
                        attempt: 0,
                    },
                );
                Ask::Fetch
            }
            Some(f) if f.waiters.len() >= MAX_WAITERS_PER_BLOCK => Ask::PassThrough,
            Some(f) => {
                f.waiters.push(waiter);
                Ask::Wait
            }
        }
    }

    /// Block `key` is on disk (its record journaled): every waiter, to wake.
    pub fn arrived(&mut self, key: K) -> Vec<W> {
        self.fills.remove(&key).map_or_else(Vec::new, |f| f.waiters)
    }

    /// The fetch of `key` failed (the origin refused, the connection broke, a timeout).
    pub fn failed(&mut self, key: K) -> Failed<W> {
        let Some(f) = self.fills.get_mut(&key) else {
            return Failed::GiveUp(Vec::new());
        };
        f.attempt += 1;
        if f.attempt < self.max_attempts && !f.waiters.is_empty() {
            return Failed::Retry { attempt: f.attempt };
        }
        let f = self.fills.remove(&key).expect("present above");
        Failed::GiveUp(f.waiters)
    }

    /// `waiter` no longer wants `key` (its client went away). The fetch goes on for the
    /// others, or for the cache alone when nobody is left.
    pub fn cancel(&mut self, key: K, waiter: &W) -> bool {
        let Some(f) = self.fills.get_mut(&key) else {
            return false;
        };
        match f.waiters.iter().position(|w| w == waiter) {
            Some(i) => {
                f.waiters.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether `key` is being fetched.
    pub fn fetching(&self, key: &K) -> bool {
        self.fills.contains_key(key)
    }

    /// Fills in flight.
    pub fn len(&self) -> usize {
        self.fills.len()
    }

    /// True when no fill is in flight.
    pub fn is_empty(&self) -> bool {
        self.fills.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fetch_per_block_however_many_want_it() {
        let mut f: Fills<(u64, u32), u32> = Fills::new(3);
        assert_eq!(f.want((1, 0), 10), Ask::Fetch);
        for w in 11..20 {
            assert_eq!(f.want((1, 0), w), Ask::Wait);
        }
        assert_eq!(
            f.want((1, 1), 10),
            Ask::Fetch,
            "another block: its own fetch"
        );
        assert_eq!(f.len(), 2);
        let woken = f.arrived((1, 0));
        assert_eq!(woken, (10..20).collect::<Vec<_>>());
        assert!(!f.fetching(&(1, 0)));
        assert!(f.arrived((1, 0)).is_empty(), "woken once");
        // The next client after arrival finds no fill (the block is on disk).
        assert_eq!(f.want((1, 0), 99), Ask::Fetch);
    }

    #[test]
    fn failures_retry_then_give_the_waiters_the_error() {
        let mut f: Fills<u32, u32> = Fills::new(3);
        f.want(7, 1);
        f.want(7, 2);
        assert_eq!(f.failed(7), Failed::Retry { attempt: 1 });
        assert_eq!(f.failed(7), Failed::Retry { attempt: 2 });
        assert_eq!(f.failed(7), Failed::GiveUp(vec![1, 2]));
        assert!(f.is_empty());
        // Nobody left waiting: no retry for nobody.
        f.want(8, 1);
        assert!(f.cancel(8, &1));
        assert!(!f.cancel(8, &1));
        assert_eq!(f.failed(8), Failed::GiveUp(vec![]));
    }

    #[test]
    fn the_waiter_list_is_bounded() {
        let mut f: Fills<u32, usize> = Fills::new(1);
        assert_eq!(f.want(1, 0), Ask::Fetch);
        for w in 1..MAX_WAITERS_PER_BLOCK {
            assert_eq!(f.want(1, w), Ask::Wait);
        }
        assert_eq!(f.want(1, usize::MAX), Ask::PassThrough);
        assert_eq!(f.arrived(1).len(), MAX_WAITERS_PER_BLOCK);
    }
}
