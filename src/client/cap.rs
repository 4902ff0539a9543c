//! Connections per client, counted across every shard without a lock: a count-min sketch of
//! atomic counters shared by the shards (two counters per client, chosen by two hashes of its
//! address; the client's count is the smaller). Accept and close are one relaxed `fetch_add`
//! or `fetch_sub` on each of two counters. A collision can only over-count, so a client is
//! never let past its cap; two clients that collide in both counters share one cap (with
//! `CLIENT_COUNT_BUCKETS` counters and 100 000 clients connected at once, about 1 in 10^4).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// Counters in the sketch (a power of two): 4 MiB, allocated at start-up.
pub const CLIENT_COUNT_BUCKETS: usize = 1 << 20;
/// Seconds a client over its cap is told to wait (`Retry-After` of the 429).
pub const CLIENT_CAP_RETRY_AFTER_S: u32 = 5;

/// A client as the cap counts it: an IPv4 address, or an IPv6 address cut to its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientKey {
    bits: u128,
    v4: bool,
}

impl ClientKey {
    /// The key of `ip` (canonical) with IPv6 addresses grouped by their first `v6_prefix` bits.
    pub fn new(ip: IpAddr, v6_prefix: u8) -> ClientKey {
        match super::canonical_ip(ip) {
            IpAddr::V4(a) => ClientKey {
                bits: u128::from(u32::from(a)),
                v4: true,
            },
            IpAddr::V6(a) => ClientKey {
                bits: super::cidr::mask128(u128::from(a), v6_prefix.min(128)),
                v4: false,
            },
        }
    }

    fn hashes(self) -> (usize, usize) {
        // Two independent 64-bit mixes (splitmix64 finalizer) of the folded key.
        let family = if self.v4 { 0x5bd1_e995_u64 } else { 0 };
        let folded = (self.bits as u64) ^ ((self.bits >> 64) as u64).rotate_left(29) ^ family;
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mask = (CLIENT_COUNT_BUCKETS - 1) as u64;
        let a = mix(folded.wrapping_add(0x9e37_79b9_7f4a_7c15)) & mask;
        let mut b = mix(folded ^ 0xd6e8_feb8_6659_fd93) & mask;
        if b == a {
            b = (b + 1) & mask;
        }
        (a as usize, b as usize)
    }
}

/// The shared counts.
pub struct ClientCounts {
    buckets: Box<[AtomicU32]>,
}

impl Default for ClientCounts {
    fn default() -> ClientCounts {
        ClientCounts {
            buckets: (0..CLIENT_COUNT_BUCKETS)
                .map(|_| AtomicU32::new(0))
                .collect(),
        }
    }
}

impl std::fmt::Debug for ClientCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCounts").finish_non_exhaustive()
    }
}

impl ClientCounts {
    /// Counts one more connection of `key` unless that makes more than `cap`; false (and
    /// nothing counted) when it would.
    pub fn acquire(&self, key: ClientKey, cap: u32) -> bool {
        let (a, b) = key.hashes();
        let ca = self.buckets[a].fetch_add(1, Ordering::Relaxed) + 1;
        let cb = self.buckets[b].fetch_add(1, Ordering::Relaxed) + 1;
        if ca.min(cb) > cap {
            self.release(key);
            return false;
        }
        true
    }

    /// One connection of `key` (counted by `acquire`) closed.
    pub fn release(&self, key: ClientKey) {
        let (a, b) = key.hashes();
        for i in [a, b] {
            let prev = self.buckets[i].fetch_sub(1, Ordering::Relaxed);
            assert!(prev > 0, "client count released below zero");
        }
    }

    /// The (sketched) connections of `key` now.
    pub fn count(&self, key: ClientKey) -> u32 {
        let (a, b) = key.hashes();
        self.buckets[a]
            .load(Ordering::Relaxed)
            .min(self.buckets[b].load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClientKey {
        ClientKey::new(s.parse().unwrap(), 64)
    }

    #[test]
    fn a_client_gets_its_cap_and_a_slot_back_when_one_closes() {
        let c = ClientCounts::default();
        let k = key("198.51.100.7");
        for _ in 0..3 {
            assert!(c.acquire(k, 3));
        }
        assert!(!c.acquire(k, 3), "the fourth is over the cap");
        assert_eq!(c.count(k), 3, "a refusal counts nothing");
        assert!(
            c.acquire(key("198.51.100.8"), 3),
            "another client has its own"
        );
        c.release(k);
        assert!(c.acquire(k, 3));
        for _ in 0..3 {
            c.release(k);
        }
        assert_eq!(c.count(k), 0);
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix_and_mapped_v4_is_v4() {
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.1"), key("192.0.2.1"));
        assert_ne!(key("192.0.2.1"), key("192.0.2.2"));
        let k128 = |s: &str| ClientKey::new(s.parse().unwrap(), 128);
        assert_ne!(k128("2001:db8::2"), k128("2001:db8::3"));
    }

    #[test]
    fn concurrent_shards_never_let_a_client_past_its_cap() {
        let c = std::sync::Arc::new(ClientCounts::default());
        let k = key("203.0.113.1");
        let got: u32 = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..1000).filter(|_| c.acquire(k, 50)).count() as u32)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert!(got <= 50, "{got} admitted over a cap of 50");
        assert_eq!(c.count(k), got);
    }
}
