//! The hash of tables keyed by numbers the edge chooses itself (version ids), never by a
//! client: the id itself places it, one multiply spreads its tag, where SipHash cost a replay
//! a sixth of its time.

/// Hashes version ids (and, byte by byte, anything else a test keys by).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

/// Builds `IdHasher`s: the hasher of the index's and the eviction's tables.
pub type Ids = std::hash::BuildHasherDefault<IdHasher>;

const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
/// The bits of a hash that pick a table's slot (hashbrown takes the tag from the top 7).
const SLOT_BITS: u64 = (1 << 57) - 1;

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
        // The table's slot comes from the low bits and a slot's tag from the top 7: the low
        // bits stay the id's own, so ids made one after another (every version a replay
        // inserts) sit side by side in memory instead of one cache miss apart; the tag is
        // spread so a group's probe tells them apart.
        let id = self.0 ^ id;
        self.0 = (id & SLOT_BITS) | (id.wrapping_mul(SPREAD) & !SLOT_BITS);
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

    #[test]
    fn consecutive_ids_spread_over_the_top_bits() {
        // hashbrown takes a slot's tag from the top 7 bits: consecutive ids must not share it.
        let tags: std::collections::HashSet<u64> = (1..=64u64)
            .map(|id| Ids::default().hash_one(id) >> 57)
            .collect();
        assert!(tags.len() > 32, "{} tags of 64 ids", tags.len());
    }
}
