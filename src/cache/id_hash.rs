//! The hash of tables keyed by numbers the edge chooses itself (version ids), never by a
//! client: a multiply or two, where SipHash cost a replay a sixth of its time. Consecutive
//! ids land in consecutive slots, in runs spread over the table.

/// Hashes version ids (and, byte by byte, anything else a test keys by).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

/// Builds `IdHasher`s: the hasher of the index's and the eviction's tables.
pub type Ids = std::hash::BuildHasherDefault<IdHasher>;

const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
/// The bits of a hash that pick a table's slot (hashbrown takes the tag from the top 7).
const SLOT_BITS: u64 = (1 << 57) - 1;
/// Consecutive ids placed side by side: 64 slots of the versions' table are 2.5 KiB, a
/// page's worth of locality for a replay and a bound on any stretch of full slots.
const RUN_BITS: u32 = 6;
const RUN_IDS: u64 = 1 << RUN_BITS;

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(SPREAD);
        }
    }
    fn write_u64(&mut self, id: u64) {
        // The table's slot comes from the low bits and a slot's tag from the top 7. Ids in
        // runs of `RUN_IDS` keep their order, so ids made one after another (every version
        // a replay inserts) sit side by side in memory instead of one cache miss apart; the
        // runs are spread by a multiply, so a dense block of long-lived ids never makes one
        // long stretch of full slots that a later id of the same slot would probe across.
        // The tag is spread id by id, so a group's probe tells a run's ids apart.
        let id = self.0 ^ id;
        let run = (id >> RUN_BITS).wrapping_mul(SPREAD) << RUN_BITS;
        let slot = (run | (id & (RUN_IDS - 1))) & SLOT_BITS;
        self.0 = slot | (id.wrapping_mul(SPREAD) & !SLOT_BITS);
    }
    fn write_u128(&mut self, hash: u128) {
        // Already a keyed hash (of a cache key): its bits are spread.
        self.0 = hash as u64 ^ (hash >> 64) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// The slot a table of `buckets` slots gives `id` (hashbrown: the hash's low bits).
    fn slot(id: u64, buckets: u64) -> u64 {
        Ids::default().hash_one(id) & (buckets - 1)
    }

    #[test]
    fn consecutive_ids_sit_side_by_side_in_runs_spread_over_the_table() {
        let buckets = 1u64 << 20;
        // Side by side within a run: a replay's inserts touch neighbouring slots.
        for id in (0..RUN_IDS).map(|i| 5 * RUN_IDS + i) {
            assert_eq!(slot(id, buckets), slot(5 * RUN_IDS, buckets) + id % RUN_IDS);
        }
        // A dense quarter of the table's ids, all held: its slots form no stretch longer
        // than a few runs (a later id of the same slot probes past it in a few groups). Ids
        // placed by their own low bits would make one stretch of a quarter of the table.
        let mut full = vec![false; buckets as usize];
        for id in 0..buckets / 4 {
            full[slot(id, buckets) as usize] = true;
        }
        let (mut longest, mut stretch) = (0, 0);
        for &f in full.iter().chain(full.iter()) {
            stretch = if f { stretch + 1 } else { 0 };
            longest = longest.max(stretch);
        }
        assert!(
            longest <= 8 * RUN_IDS as usize,
            "a stretch of {longest} full slots"
        );
    }

    #[test]
    fn consecutive_ids_spread_over_the_top_bits() {
        // hashbrown takes a slot's tag from the top 7 bits: consecutive ids must not share it.
        let tags: std::collections::HashSet<u64> = (1..=64u64)
            .map(|id| Ids::default().hash_one(id) >> 57)
            .collect();
        assert!(tags.len() > 32, "{} tags of 64 ids", tags.len());
    }
}
