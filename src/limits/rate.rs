//! The per-connection rate limit: `limit_rate_bytes_per_s` after `limit_rate_after_bytes`,
//! as nginx's `limit_rate` / `limit_rate_after`, or a `[[rate_limit]]` prefix's own rate.

/// Fewest bytes a limited response plans at once (one O_DIRECT-aligned read; a smaller step
/// would only add operations).
pub const LIMIT_STEP_MIN_BYTES: u64 = 4096;
/// A step is this fraction of a second's worth of the rate (1/10: ten reads a second).
pub const LIMIT_STEPS_PER_S: u64 = 10;

/// The rate a response is given when it begins (from the configuration or its prefix rule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateSpec {
    /// Bytes per second once `after_bytes` have gone; 0 = no limit.
    pub rate_bytes_per_s: u64,
    /// Bytes sent at full speed first.
    pub after_bytes: u64,
}

pub use crate::config::rules::{PrefixRate, MAX_RATE_LIMIT_RULES};

/// The rate of a response for `path`: the longest covering `[[rate_limit]]` prefix's, else
/// `default` (the server-wide `limit_rate_bytes_per_s`).
pub fn rate_for(
    rules: &[PrefixRate],
    path: &crate::fs::resolve::ResolvedRef<'_>,
    default: RateSpec,
) -> RateSpec {
    rules
        .iter()
        .filter(|r| path.is_under(&r.prefix))
        .max_by_key(|r| r.prefix.len())
        .map_or(default, |r| RateSpec {
            rate_bytes_per_s: r.rate_bytes_per_s,
            after_bytes: r.after_bytes,
        })
}

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
    fn the_longest_covering_prefix_names_the_rate() {
        let rule = |prefix: &str, rate| PrefixRate {
            prefix: prefix.into(),
            rate_bytes_per_s: rate,
            after_bytes: 7,
        };
        let rules = [rule("/beta/", 1000), rule("/beta/fast/", 0), rule("/b", 5)];
        let default = RateSpec {
            rate_bytes_per_s: 9,
            after_bytes: 0,
        };
        let at = |p: &str| {
            let r = crate::fs::resolve::resolve_target(p.as_bytes()).unwrap();
            let path = crate::fs::resolve::ResolvedRef {
                rel_path: &r.rel_path,
                wants_dir: r.wants_dir,
            };
            rate_for(&rules, &path, default).rate_bytes_per_s
        };
        assert_eq!(at("/beta/x.pak"), 1000);
        // Resolved first: dot segments and escapes cannot dodge a rule.
        assert_eq!(at("/x/../beta/%78.pak"), 1000);
        assert_eq!(
            at("/beta/fast/x"),
            0,
            "a more specific rule lifts the limit"
        );
        assert_eq!(at("/bin"), 5);
        assert_eq!(at("/other"), 9);
        assert!(rule("beta", 1).validate().is_err());
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
