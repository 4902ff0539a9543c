//! How far a cache's start-up load has come, read without a lock by `/healthz` and
//! `/metrics` while the loader runs (`fill::edge::SharedEdge::open_loading`).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize};

/// The load is under way (waiting for a disk's lock, or replaying journals).
const LOADING: u8 = 0;
/// The index is whole and the shards fill and hit.
const READY: u8 = 1;
/// The load failed (the process ends).
const FAILED: u8 = 2;

/// A cache load's progress.
#[derive(Debug, Default)]
pub struct LoadProgress {
    state: AtomicU8,
    /// Journal bytes replayed so far, over every disk.
    read_bytes: AtomicU64,
    /// Journal bytes to replay, over the disks whose journal was opened so far.
    total_bytes: AtomicU64,
    /// Disks whose lock another process holds now (`cache::disk_lock`).
    waiting_disks: AtomicUsize,
    /// Versions held at start-up that the eviction does not count yet (it counts them after
    /// the shards serve: `fill::edge::EVICTION_COUNT_STEP`).
    uncounted_versions: AtomicU64,
}

impl LoadProgress {
    /// Whether the load is still under way.
    pub fn loading(&self) -> bool {
        self.state.load(Acquire) == LOADING
    }

    /// Whether the index is whole.
    pub fn ready(&self) -> bool {
        self.state.load(Acquire) == READY
    }

    /// Whether the load failed.
    pub fn failed(&self) -> bool {
        self.state.load(Acquire) == FAILED
    }

    /// Marks the load done: `ready`, or failed.
    pub fn finish(&self, ready: bool) {
        self.waiting_disks.store(0, Relaxed);
        self.state
            .store(if ready { READY } else { FAILED }, Release);
    }

    /// A journal of `bytes` is to be replayed.
    pub fn add_total(&self, bytes: u64) {
        self.total_bytes.fetch_add(bytes, Relaxed);
    }

    /// `bytes` more of a journal were replayed.
    pub fn add_read(&self, bytes: u64) {
        self.read_bytes.fetch_add(bytes, Relaxed);
    }

    /// Disks whose lock another process holds now.
    pub fn set_waiting_disks(&self, disks: usize) {
        self.waiting_disks.store(disks, Relaxed);
    }

    /// Versions the eviction has yet to count.
    pub fn set_uncounted_versions(&self, versions: u64) {
        self.uncounted_versions.store(versions, Relaxed);
    }

    /// Versions the eviction has yet to count.
    pub fn uncounted_versions(&self) -> u64 {
        self.uncounted_versions.load(Relaxed)
    }

    /// (journal bytes replayed, journal bytes to replay, disks waited for).
    pub fn figures(&self) -> (u64, u64, usize) {
        (
            self.read_bytes.load(Relaxed),
            self.total_bytes.load(Relaxed),
            self.waiting_disks.load(Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_counts_up_and_ends_once() {
        let p = LoadProgress::default();
        assert!(p.loading() && !p.ready() && !p.failed());
        p.set_waiting_disks(2);
        p.add_total(100);
        p.add_read(40);
        assert_eq!(p.figures(), (40, 100, 2));
        p.finish(true);
        assert!(p.ready() && !p.failed() && !p.loading());
        assert_eq!(p.figures(), (40, 100, 0), "nothing is waited for once done");
        let f = LoadProgress::default();
        f.finish(false);
        assert!(f.failed() && !f.ready());
    }
}
