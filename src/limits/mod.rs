//! How much a client may take: the per-connection rate limit (`limit_rate_bytes_per_s`
//! after `limit_rate_after_bytes`, as nginx's `limit_rate` / `limit_rate_after`).
//!
//! Pure arithmetic: the shard's machine asks `RateLimit` how many bytes a response may plan
//! now, and when it may plan more. It plans reads only within that allowance, so a limited
//! connection that waits holds no arena slot: its bytes are on disk, not in memory.

/// Fewest bytes a limited response plans at once (one O_DIRECT-aligned read; a smaller step
/// would only add operations).
pub const LIMIT_STEP_MIN_BYTES: u64 = 4096;
/// A step is this fraction of a second's worth of the rate (1/10: ten reads a second).
pub const LIMIT_STEPS_PER_S: u64 = 10;

/// One response's rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Bytes per second once `after_bytes` have been planned.
    pub rate_bytes_per_s: u64,
    /// Bytes planned without a limit first.
    pub after_bytes: u64,
    /// When the response began (shard clock, microseconds).
    pub start_us: u64,
    /// Bytes planned so far (given-back bytes are taken off again).
    pub planned_bytes: u64,
    /// Times the response had to wait for its allowance.
    pub waits: u64,
}

impl RateLimit {
    /// A limit for a response starting at `now_us`; None when `rate_bytes_per_s` is 0.
    pub fn new(rate_bytes_per_s: u64, after_bytes: u64, now_us: u64) -> Option<RateLimit> {
        (rate_bytes_per_s > 0).then_some(RateLimit {
            rate_bytes_per_s,
            after_bytes,
            start_us: now_us,
            planned_bytes: 0,
            waits: 0,
        })
    }

    /// The size of one step of planning (also the burst a response starts with).
    pub fn step_bytes(&self) -> u64 {
        (self.rate_bytes_per_s / LIMIT_STEPS_PER_S).max(LIMIT_STEP_MIN_BYTES)
    }

    /// Bytes allowed in all by `now_us` (planned bytes never exceed it).
    pub fn allowed_total(&self, now_us: u64) -> u64 {
        let elapsed_us = now_us.saturating_sub(self.start_us);
        let earned = u128::from(self.rate_bytes_per_s) * u128::from(elapsed_us) / 1_000_000;
        self.after_bytes
            .saturating_add(self.step_bytes())
            .saturating_add(u64::try_from(earned).unwrap_or(u64::MAX))
    }

    /// Bytes the response may plan now.
    pub fn allowance(&self, now_us: u64) -> u64 {
        self.allowed_total(now_us)
            .saturating_sub(self.planned_bytes)
    }

    /// When (shard clock, ms, rounded up) `want` more bytes will be allowed.
    pub fn ready_at_ms(&self, want: u64, now_us: u64) -> u64 {
        let need = self
            .planned_bytes
            .saturating_add(want)
            .saturating_sub(self.allowed_total(now_us));
        let wait_us = u128::from(need) * 1_000_000 / u128::from(self.rate_bytes_per_s);
        let at_us = u128::from(now_us) + wait_us;
        u64::try_from(at_us.div_ceil(1000)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_are_free_then_the_rate_holds() {
        let mut l = RateLimit::new(1_000_000, 300_000, 0).unwrap();
        assert_eq!(l.step_bytes(), 100_000);
        // `after` plus one step at once.
        assert_eq!(l.allowance(0), 400_000);
        l.planned_bytes = 400_000;
        assert_eq!(l.allowance(0), 0);
        // A step (100 kB) is earned in 100 ms.
        assert_eq!(l.ready_at_ms(100_000, 0), 100);
        assert_eq!(l.allowance(100_000), 100_000);
        // Over 10 s the total is after + step + 10 MB, whatever the wake-ups.
        assert_eq!(
            l.allowance(10_000_000),
            300_000 + 100_000 + 10_000_000 - 400_000
        );
        assert_eq!(RateLimit::new(0, 0, 0), None);
        let slow = RateLimit::new(1000, 0, 0).unwrap();
        assert_eq!(slow.step_bytes(), LIMIT_STEP_MIN_BYTES);
    }

    #[test]
    fn a_late_wake_up_does_not_lose_bytes() {
        let mut l = RateLimit::new(2_000_000, 0, 0).unwrap();
        l.planned_bytes = l.allowance(0);
        // Woken 70 ms late: the allowance has grown by what those 70 ms earned too.
        let at = l.ready_at_ms(l.step_bytes(), 0);
        assert_eq!(at, 100);
        assert_eq!(l.allowance((at + 70) * 1000), 340_000);
    }
}
