//! The edge's egress cap (`egress_limit_bytes_per_s`): one bucket shared by every shard, so
//! that an operator can hold a whole edge to its commit rate.
//!
//! It is virtual scheduling (GCRA): the bucket keeps one number, the time at which every byte
//! reserved so far will have left at the cap (`tat`). A response reserves its next step (at
//! most a chunk) with one compare-and-swap: `tat = max(tat, now) + bytes / rate`. A step that
//! begins within `EGRESS_BURST_MS` of now goes at once; a later one waits on the shard's timer
//! wheel for its turn, holding no arena slot. Waiting responses are so served in the order they
//! reserved, with no herd at wake-up; the sum over all shards holds the cap over any window
//! longer than the burst; and the hot path is one atomic per step, not per byte, on any shard.
//!
//! Small responses are not held behind bulk ones: the first `egress_bypass_bytes` of every
//! response go at once, drawn from a second, smaller bucket (a tenth of the cap). They are
//! still charged to the main bucket, so bulk transfers slow down to make room and the cap holds;
//! only past the bypass share do small responses queue like the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Bytes a step may run ahead of the cap (the bucket's depth), in milliseconds of the rate.
pub const EGRESS_BURST_MS: u64 = 20;
/// The bypass for responses' first bytes gets this fraction of the cap (1/10).
pub const EGRESS_BYPASS_DIVISOR: u64 = 10;
/// A response reserves at most this fraction of a second's worth of the cap at once (1/100),
/// so that at a low cap many responses take turns, not a chunk each.
pub const EGRESS_STEPS_PER_S: u64 = 100;

/// Bytes one reservation may take at `rate_bytes_per_s` (at least an aligned block).
pub fn step_bytes(rate_bytes_per_s: u64) -> u64 {
    (rate_bytes_per_s / EGRESS_STEPS_PER_S).max(super::LIMIT_STEP_MIN_BYTES)
}

/// Depth of the bypass bucket, in milliseconds of its rate (bursts of manifests go at once).
pub const EGRESS_BYPASS_BURST_MS: u64 = 200;

/// The shared bucket (one per process; shards reach it through the lifecycle).
#[derive(Debug)]
pub struct EgressBucket {
    /// The bucket's clock: every `now_us` passed in counts from here.
    epoch: Instant,
    /// When every byte reserved so far will have left at the cap, ns on the bucket's clock.
    bulk_tat_ns: AtomicU64,
    /// The same for the bypass share.
    bypass_tat_ns: AtomicU64,
}

impl Default for EgressBucket {
    fn default() -> EgressBucket {
        EgressBucket::new()
    }
}

/// Nanoseconds `bytes` take at `rate_bytes_per_s` (the rate is never 0 here).
fn cost_ns(bytes: u64, rate_bytes_per_s: u64) -> u64 {
    let ns = u128::from(bytes) * 1_000_000_000 / u128::from(rate_bytes_per_s.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

impl EgressBucket {
    /// An idle bucket whose clock starts now.
    pub fn new() -> EgressBucket {
        EgressBucket {
            epoch: Instant::now(),
            bulk_tat_ns: AtomicU64::new(0),
            bypass_tat_ns: AtomicU64::new(0),
        }
    }

    /// When the bucket's clock began.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Reserves `bytes` at `rate_bytes_per_s` at `now_us` (bucket clock); returns the µs to
    /// wait before they may go (0: now).
    pub fn reserve(&self, bytes: u64, rate_bytes_per_s: u64, now_us: u64) -> u64 {
        let now_ns = now_us.saturating_mul(1000);
        let burst_ns = EGRESS_BURST_MS * 1_000_000;
        let cost = cost_ns(bytes, rate_bytes_per_s);
        let old = self
            .bulk_tat_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.max(now_ns).saturating_add(cost))
            })
            .expect("the update always applies");
        // These bytes start where the queue ended (or now, on an idle bucket).
        let start = old.max(now_ns);
        start.saturating_sub(now_ns + burst_ns).div_ceil(1000)
    }

    /// A response's first bytes: they go now if the bypass share has room (and are charged to
    /// the cap all the same); otherwise they are reserved like any other. Returns the µs to
    /// wait.
    pub fn reserve_first(&self, bytes: u64, rate_bytes_per_s: u64, now_us: u64) -> u64 {
        let now_ns = now_us.saturating_mul(1000);
        let bypass_rate = (rate_bytes_per_s / EGRESS_BYPASS_DIVISOR).max(1);
        let burst_ns = EGRESS_BYPASS_BURST_MS * 1_000_000;
        let cost = cost_ns(bytes, bypass_rate);
        let mut old = self.bypass_tat_ns.load(Ordering::Relaxed);
        loop {
            let start = old.max(now_ns);
            if start > now_ns + burst_ns {
                // The bypass share is spent: wait in line with the bulk.
                return self.reserve(bytes, rate_bytes_per_s, now_us);
            }
            match self.bypass_tat_ns.compare_exchange_weak(
                old,
                start.saturating_add(cost),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => old = seen,
            }
        }
        // Charged to the cap: the bulk's next reservations move back by as much.
        let _ = self.reserve(bytes, rate_bytes_per_s, now_us);
        0
    }

    /// Gives back `bytes` reserved but never sent (given back to the disk, or the response
    /// ended first): the next reservation comes that much sooner. Time already past is not
    /// given back (an idle bucket does not bank credit).
    pub fn refund(&self, bytes: u64, rate_bytes_per_s: u64, now_us: u64) {
        let now_ns = now_us.saturating_mul(1000);
        let cost = cost_ns(bytes, rate_bytes_per_s);
        let _ = self
            .bulk_tat_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t > now_ns).then(|| t.saturating_sub(cost).max(now_ns))
            });
    }
}

/// One response's place with the egress cap (kept in its connection's machine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressHold {
    /// Bytes reserved and not yet planned.
    pub reserved_bytes: u64,
    /// When (shard clock, µs) the reserved bytes may go.
    pub ready_at_us: u64,
    /// First bytes that may still take the bypass.
    pub bypass_left_bytes: u64,
    /// The current reservation had to wait (its bytes count as delayed).
    pub delayed: bool,
    /// Times this response waited for the cap.
    pub waits: u64,
}

impl EgressHold {
    /// A response's hold as it begins: nothing reserved, `bypass_bytes` of first bytes.
    pub fn new(bypass_bytes: u64) -> EgressHold {
        EgressHold {
            bypass_left_bytes: bypass_bytes,
            ..EgressHold::default()
        }
    }

    /// Reserves `want` bytes, at most a step (nothing must be reserved), at `bucket_now_us`,
    /// and returns
    /// whether they had to wait. `now_us` is the shard's clock, which `ready_at_us` uses.
    pub fn reserve(
        &mut self,
        bucket: &EgressBucket,
        want: u64,
        rate_bytes_per_s: u64,
        now_us: u64,
        bucket_now_us: u64,
    ) -> bool {
        assert_eq!(self.reserved_bytes, 0, "a reservation over another");
        let want = want.min(step_bytes(rate_bytes_per_s));
        let first = want.min(self.bypass_left_bytes);
        let wait_us = if first > 0 {
            self.bypass_left_bytes -= first;
            bucket.reserve_first(first, rate_bytes_per_s, bucket_now_us)
        } else {
            bucket.reserve(want, rate_bytes_per_s, bucket_now_us)
        };
        self.reserved_bytes = if first > 0 { first } else { want };
        self.ready_at_us = now_us + wait_us;
        self.delayed = wait_us > 0;
        if self.delayed {
            self.waits += 1;
        }
        self.delayed
    }

    /// `planned` bytes were planned: they come off the reservation; any beyond it (a read
    /// rounded up to the disk's alignment) are charged to the bucket as they go.
    pub fn spend(&mut self, bucket: &EgressBucket, planned: u64, rate: u64, bucket_now_us: u64) {
        let over = planned.saturating_sub(self.reserved_bytes);
        self.reserved_bytes = self.reserved_bytes.saturating_sub(planned);
        if over > 0 {
            let _ = bucket.reserve(over, rate, bucket_now_us);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn reservations_queue_behind_each_other_at_the_cap() {
        let b = EgressBucket::new();
        // 100 MB/s: 1 MB is 10 ms. The first 20 ms (the burst) go at once.
        assert_eq!(b.reserve(MB, 100 * MB, 0), 0);
        assert_eq!(b.reserve(MB, 100 * MB, 0), 0);
        assert_eq!(b.reserve(MB, 100 * MB, 0), 0);
        // The fourth starts at 30 ms: 10 ms past the burst.
        assert_eq!(b.reserve(MB, 100 * MB, 0), 10_000);
        assert_eq!(b.reserve(MB, 100 * MB, 0), 20_000);
        // Over any window the bytes let go are at most rate * (window + burst).
        let b = EgressBucket::new();
        let mut sent = 0;
        let mut now = 0;
        loop {
            // Each step goes once its wait is over; count those gone by 10 s.
            now += b.reserve(512 * 1024, 100 * MB, now);
            if now > 10_000_000 {
                break;
            }
            sent += 512 * 1024;
        }
        let cap = 100 * MB * (10_000 + EGRESS_BURST_MS) / 1000;
        assert!(sent <= cap + 512 * 1024, "{sent} > {cap}");
        assert!(sent >= 100 * MB * 10 - 512 * 1024, "{sent} under the cap");
    }

    #[test]
    fn an_idle_bucket_banks_no_credit_and_refunds_bring_the_queue_forward() {
        let b = EgressBucket::new();
        assert_eq!(b.reserve(MB, 100 * MB, 0), 0);
        // Idle for 10 s: the next bytes are not owed anything but the burst.
        for _ in 0..3 {
            assert_eq!(b.reserve(MB, 100 * MB, 10_000_000), 0);
        }
        assert_eq!(b.reserve(MB, 100 * MB, 10_000_000), 10_000);
        // 2 MB given back: the next waits 20 ms less.
        b.refund(2 * MB, 100 * MB, 10_000_000);
        assert_eq!(b.reserve(MB, 100 * MB, 10_000_000), 0);
        // A refund on an idle bucket changes nothing.
        let idle = EgressBucket::new();
        idle.refund(MB, 100 * MB, 5_000_000);
        assert_eq!(idle.reserve(3 * MB, 100 * MB, 5_000_000), 0);
        assert_eq!(idle.reserve(MB, 100 * MB, 5_000_000), 10_000);
    }

    #[test]
    fn first_bytes_skip_the_queue_within_the_bypass_share_and_still_count() {
        let b = EgressBucket::new();
        // The bulk is 1 s deep in reservations.
        for _ in 0..102 {
            b.reserve(MB, 100 * MB, 0);
        }
        assert!(b.reserve(MB, 100 * MB, 0) > 990_000);
        // A manifest goes at once.
        assert_eq!(b.reserve_first(10_000, 100 * MB, 0), 0);
        // And the bulk behind it moved back by its 0.1 ms.
        let before = b.bulk_tat_ns.load(Ordering::Relaxed);
        assert_eq!(b.reserve_first(10_000, 100 * MB, 0), 0);
        assert_eq!(b.bulk_tat_ns.load(Ordering::Relaxed) - before, 100_000);
        // The bypass share is 10 MB/s with a 200 ms depth: 2 MB at once, then it queues.
        let fresh = EgressBucket::new();
        assert_eq!(fresh.reserve_first(2 * MB, 100 * MB, 0), 0);
        assert_eq!(fresh.reserve_first(MB, 100 * MB, 0), 0, "within 200 ms");
        assert!(fresh.reserve_first(MB, 100 * MB, 0) > 0, "past the share");
    }

    #[test]
    fn a_hold_takes_its_bypass_first_then_reserves_and_charges_what_rounding_adds() {
        let b = EgressBucket::new();
        let mut h = EgressHold::new(64 * 1024);
        assert!(!h.reserve(&b, 512 * 1024, 100 * MB, 7, 0));
        assert_eq!(h.reserved_bytes, 64 * 1024, "the bypass part alone");
        assert_eq!(h.bypass_left_bytes, 0);
        h.spend(&b, 64 * 1024, 100 * MB, 0);
        assert_eq!(h.reserved_bytes, 0);
        // Fill the burst, then a reservation waits, in shard time; it takes one step (10 ms
        // of the cap).
        b.reserve(2 * MB, 100 * MB, 0);
        assert!(h.reserve(&b, 4 * MB, 100 * MB, 5_000, 0));
        assert_eq!(h.reserved_bytes, MB);
        assert_eq!(h.waits, 1);
        assert!(h.ready_at_us > 5_000);
        // A read rounded up past the reservation charges the rest.
        let before = b.bulk_tat_ns.load(Ordering::Relaxed);
        h.spend(&b, MB + 4096, 100 * MB, 0);
        assert_eq!(h.reserved_bytes, 0);
        assert_eq!(b.bulk_tat_ns.load(Ordering::Relaxed) - before, 40_960);
    }
}
