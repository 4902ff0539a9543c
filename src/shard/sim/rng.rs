//! A small seeded generator (splitmix64): the simulator's only source of choices, so a seed
//! replays the same run.

/// splitmix64 (Vigna): one 64-bit state, good enough statistics for fault scheduling.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5eed_5a4d_11e5_0001)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `len` random bytes (eight from each draw).
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        for word in out.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            word.copy_from_slice(&bytes[..word.len()]);
        }
        out
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A byte count in `1..=max`: usually all of it, sometimes a random split.
    pub fn split(&mut self, max: usize) -> usize {
        if max <= 1 || self.chance(50) {
            max
        } else {
            1 + self.below(max as u64 - 1) as usize
        }
    }
}
