//! Fixed-bucket latency histograms: the shards' (time to first byte, buffer waits, TLS
//! handshakes; `metrics`) and each cache disk's operation latency (`cache::disk_health`).
//! Their own module, so that both may use them without importing each other.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (inclusive, microseconds) of the latency histograms' buckets (time to first
/// byte, buffer waits): 100 us to 10 s in 1-2.5-5 steps. Anything slower lands in the implicit
/// `+Inf` bucket.
pub const TTFB_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
const BUCKETS: usize = TTFB_BUCKETS_US.len();

/// A fixed-bucket latency histogram with one writer (the shard) and any number of readers.
///
/// Each observation increments exactly one bucket (non-cumulative) and the sum. The count is
/// not stored separately: it is the total of the buckets, so a reader racing the writer can
/// never see `+Inf` disagree with `_count`.
#[derive(Default, Debug)]
pub struct Histogram {
    /// Observations per bucket; index `BUCKETS` is the overflow (`+Inf`) bucket.
    buckets: [AtomicU64; BUCKETS + 1],
    /// Sum of all observations, microseconds.
    sum_us: AtomicU64,
}

/// A point-in-time copy of a histogram (cumulative buckets, as Prometheus wants them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative count for each bound of `TTFB_BUCKETS_US`, then `+Inf` (== count).
    pub cumulative: [u64; BUCKETS + 1],
    /// Sum of observations, microseconds.
    pub sum_us: u64,
}

impl HistogramSnapshot {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.cumulative[BUCKETS]
    }
}

impl Histogram {
    /// Records one observation of `us` microseconds. Single writer only (load + store).
    pub fn observe(&self, us: u64) {
        let i = TTFB_BUCKETS_US.partition_point(|&bound| bound < us);
        add(&self.buckets[i], 1);
        add(&self.sum_us, us);
    }

    /// Records one observation of `us` microseconds from any of several writers (a cache
    /// disk's, shared by the shards and the I/O thread).
    pub fn observe_shared(&self, us: u64) {
        let i = TTFB_BUCKETS_US.partition_point(|&bound| bound < us);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Number of observations so far.
    pub fn count(&self) -> u64 {
        self.snapshot().count()
    }

    /// Copies the histogram with cumulative buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot {
            sum_us: self.sum_us.load(Ordering::Relaxed),
            ..Default::default()
        };
        let mut running = 0u64;
        for (c, b) in s.cumulative.iter_mut().zip(&self.buckets) {
            running = running.wrapping_add(b.load(Ordering::Relaxed));
            *c = running;
        }
        s
    }
}

/// Adds `v` to a counter only its one writer changes (a load and a store, no locked
/// instruction).
fn add(counter: &AtomicU64, v: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(v),
        Ordering::Relaxed,
    );
}
