//! Which disk a new object goes to (issue 43): capacity-weighted rendezvous hashing over the
//! disks' ids (Thaler and Ravishankar; the weighted score `-weight / ln(u)` of Schindelhauer
//! and Schomaker). Each disk scores every key from the key's hash and the disk's id alone,
//! and the key goes wholly to the highest score. So a disk added takes only the keys it now
//! wins, a disk removed gives up only its own keys, and a disk renamed or moved to another slot
//! keeps them: the id is written on the disk (`disks::DISK_ID_FILE`), not taken from its path.
//! A disk's expected share is its weight over the sum of weights.

/// The disks a key may go to: each one's stable id and weight (its capacity).
#[derive(Clone, Debug, Default)]
pub struct Placement {
    disks: Vec<(u64, f64)>,
}

impl Placement {
    /// Placement over `disks` (id, weight); a weight of 0 counts as 1.
    pub fn new(disks: &[(u64, u64)]) -> Placement {
        Placement {
            disks: disks
                .iter()
                .map(|&(id, weight)| (id, weight.max(1) as f64))
                .collect(),
        }
    }

    /// The position in `disks` of the disk `key` goes to (0 with no disk).
    pub fn pick(&self, key: &[u8]) -> usize {
        self.pick_where(key, |_| true)
    }

    /// `pick` among the disks `usable` takes (a failing disk's keys go where they would
    /// without it); with none usable, among all.
    pub fn pick_where(&self, key: &[u8], usable: impl Fn(usize) -> bool) -> usize {
        let any = (0..self.disks.len()).any(&usable);
        let h = key_hash(key);
        let mut best = (0, f64::MIN);
        for (i, &(id, weight)) in self.disks.iter().enumerate() {
            if any && !usable(i) {
                continue;
            }
            let s = score(h, id, weight);
            if s > best.1 {
                best = (i, s);
            }
        }
        best.0
    }

    /// How many disks it places over.
    pub fn len(&self) -> usize {
        self.disks.len()
    }

    /// True when it places over no disk.
    pub fn is_empty(&self) -> bool {
        self.disks.is_empty()
    }
}

/// The key's 64-bit hash: FNV-1a, finished by `mix` (stable across builds and platforms,
/// unlike the standard library's hasher, which may change).
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64's finaliser: every input bit moves about half the output bits.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Disk `id`'s score for a key hashed to `key_hash`: `-weight / ln(u)`, with `u` uniform in
/// (0, 1) drawn from the key and the disk.
fn score(key_hash: u64, id: u64, weight: f64) -> f64 {
    let x = mix(key_hash ^ mix(id));
    let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -weight / u.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: usize = 20_000;

    fn keys() -> Vec<Vec<u8>> {
        (0..KEYS)
            .map(|i| format!("0/depot/{i}/chunk").into_bytes())
            .collect()
    }

    /// The disk id each key goes to.
    fn placed(disks: &[(u64, u64)]) -> Vec<u64> {
        let p = Placement::new(disks);
        keys().iter().map(|k| disks[p.pick(k)].0).collect()
    }

    #[test]
    fn shares_follow_the_weights() {
        let disks = [(11, 1000), (22, 2000), (33, 1000)];
        let got = placed(&disks);
        for (id, weight) in disks {
            let share = got.iter().filter(|&&d| d == id).count() as f64 / KEYS as f64;
            let want = weight as f64 / 4000.0;
            assert!((share - want).abs() < 0.02, "disk {id}: {share} vs {want}");
        }
    }

    #[test]
    fn adding_a_disk_moves_only_its_share_and_removing_it_moves_them_back() {
        let three = [(11, 1000), (22, 1000), (33, 1000)];
        let four = [(11, 1000), (22, 1000), (33, 1000), (44, 1000)];
        let before = placed(&three);
        let after = placed(&four);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                // A key that moved went to the new disk, never between the old ones.
                assert_eq!(*a, 44);
                moved += 1;
            }
        }
        let share = moved as f64 / KEYS as f64;
        assert!((share - 0.25).abs() < 0.02, "moved {share}");
        // Removed again, every key is back where it was; removing another disk moves only
        // that disk's keys.
        assert_eq!(placed(&three), before);
        let without_22 = placed(&[(11, 1000), (33, 1000)]);
        for (b, a) in before.iter().zip(&without_22) {
            if *b != 22 {
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn the_slot_does_not_matter_only_the_id() {
        let a = placed(&[(11, 1000), (22, 1000), (33, 1000)]);
        let b = placed(&[(33, 1000), (11, 1000), (22, 1000)]);
        assert_eq!(a, b);
        assert_eq!(Placement::default().pick(b"k"), 0);
        // A disk left out by `pick_where` gives up its keys as if it were removed.
        let p = Placement::new(&[(11, 1000), (22, 1000), (33, 1000)]);
        let q = Placement::new(&[(11, 1000), (33, 1000)]);
        for k in keys() {
            let got = p.pick_where(&k, |i| i != 1);
            assert_eq!(got, [0, 2][q.pick(&k)]);
        }
        assert_eq!(p.pick_where(b"k", |_| false), p.pick(b"k"));
        assert_eq!(Placement::new(&[(5, 0)]).pick(b"k"), 0);
    }
}
