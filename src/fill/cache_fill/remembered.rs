//! Keys the fill remembers an answer for until a moment: an origin's 404 (`cache_404_s`), and
//! a key whose replies a shared cache may not store ("hit-for-pass", `HIT_FOR_PASS_S`), so
//! its next requests go straight to their own origin fetch instead of waiting on a fill that
//! would end the same way.

use std::collections::{HashMap, VecDeque};

/// A bounded set of keys, each remembered until a Unix second; the oldest go first when it
/// is full (every entry of one set has the same lifetime, so the oldest ends first).
#[derive(Debug)]
pub(super) struct Remembered {
    until: HashMap<Vec<u8>, u64>,
    order: VecDeque<(Vec<u8>, u64)>,
    max_keys: usize,
}

impl Remembered {
    /// An empty set of at most `max_keys` keys.
    pub fn new(max_keys: usize) -> Remembered {
        assert!(max_keys > 0);
        Remembered {
            until: HashMap::new(),
            order: VecDeque::new(),
            max_keys,
        }
    }

    /// Remembers `key` until `until_s`; the expired (at `now_s`) and, when full, the oldest
    /// are forgotten first.
    pub fn remember(&mut self, key: &[u8], until_s: u64, now_s: u64) {
        while let Some((k, until)) = self.order.front() {
            if *until > now_s && self.order.len() < self.max_keys {
                break;
            }
            if self.until.get(k) == Some(until) {
                self.until.remove(k);
            }
            self.order.pop_front();
        }
        self.until.insert(key.to_vec(), until_s);
        self.order.push_back((key.to_vec(), until_s));
    }

    /// Whether `key` is remembered at `now_s` (an expired entry is forgotten).
    pub fn holds(&mut self, key: &[u8], now_s: u64) -> bool {
        match self.until.get(key) {
            Some(&until) if now_s < until => true,
            Some(_) => {
                self.until.remove(key);
                false
            }
            None => false,
        }
    }

    /// Forgets the keys `matches` says (a purge).
    pub fn forget(&mut self, mut matches: impl FnMut(&[u8]) -> bool) {
        self.until.retain(|k, _| !matches(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_held_until_their_moment_and_bounded() {
        let mut r = Remembered::new(2);
        r.remember(b"a", 10, 0);
        assert!(r.holds(b"a", 9));
        assert!(!r.holds(b"a", 10), "expired");
        assert!(!r.holds(b"a", 0), "forgotten once expired");
        r.remember(b"a", 20, 5);
        r.remember(b"b", 21, 6);
        r.remember(b"c", 22, 7);
        assert!(!r.holds(b"a", 8), "the oldest went when full");
        assert!(r.holds(b"b", 8) && r.holds(b"c", 8));
        r.forget(|k| k == b"b");
        assert!(!r.holds(b"b", 8));
        // Remembered again: the newer moment counts, the older entry is not the key's.
        r.remember(b"c", 30, 9);
        r.remember(b"d", 31, 10);
        assert!(r.holds(b"c", 25));
    }
}
