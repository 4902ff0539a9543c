//! Which cached blocks go when the cache is over `cache_max_bytes`: S3-FIFO (Yang et al.,
//! "FIFO queues are all you need for cache eviction", SOSP 2023), in bytes.
//!
//! Three FIFO queues: `small` (a tenth of the budget) takes every new entry, `main` the rest,
//! and `ghost` remembers the keys recently evicted from `small` (keys only, no bytes). An entry
//! read again while in `small` moves to `main` when it reaches the tail; one never read again
//! goes, its key to `ghost`, so a one-time scan (a download nobody repeats) passes through
//! `small` without pushing out what is popular. A new entry whose key is in `ghost` goes
//! straight to `main`. In `main`, an entry read since its last pass goes round once more (its
//! count decremented), as CLOCK does; one not read is evicted.
//!
//! Pinned entries (blocks being read by a response) are never evicted: eviction passes over
//! them as if they had been read. Everything is O(1) per operation but the ghost set's hash.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use super::id_hash::Ids;

/// The share of the budget the small queue gets (1/10, as the paper).
pub const SMALL_QUEUE_DIVISOR: u64 = 10;
/// The most an entry's read count goes up to (2 bits, as the paper).
pub const MAX_FREQ: u8 = 3;
/// Entries one `evict` call passes over before it gives up (every one pinned or going round):
/// bounds the work of a call whatever the queues hold.
pub const EVICT_SCAN_MAX: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// An entry's bytes, read count, queue and whether it is pinned, in one word: the table of
/// entries holds one per version cached, so a slot is 16 bytes with its key, not 24 (about
/// 13 bytes per object at 10 million). Pin counts are apart (`S3Fifo::pins`): few entries
/// are pinned at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry(u64);

/// Where `Entry` keeps its fields: bytes in the low 60 bits (an exabyte), then the count,
/// the queue and the pin.
const ENTRY_BYTES_BITS: u32 = 60;
const ENTRY_BYTES_MAX: u64 = (1 << ENTRY_BYTES_BITS) - 1;
const ENTRY_FREQ_SHIFT: u32 = ENTRY_BYTES_BITS;
const ENTRY_MAIN_BIT: u64 = 1 << 62;
const ENTRY_PINNED_BIT: u64 = 1 << 63;

// The count's two bits hold `MAX_FREQ`; a slot of a version's entry is the 16 bytes above.
const _: () = assert!(MAX_FREQ <= 3 && std::mem::size_of::<(u64, Entry)>() == 16);

/// `bytes` as an entry counts them: no disk holds an exabyte, so the clamp changes nothing
/// real, and every total adds what the entry keeps.
fn entry_bytes(bytes: u64) -> u64 {
    bytes.min(ENTRY_BYTES_MAX)
}

impl Entry {
    fn new(bytes: u64, queue: Queue) -> Entry {
        let mut e = Entry(0);
        e.set_bytes(bytes);
        e.set_queue(queue);
        e
    }

    fn bytes(self) -> u64 {
        self.0 & ENTRY_BYTES_MAX
    }

    fn set_bytes(&mut self, bytes: u64) {
        debug_assert!(bytes <= ENTRY_BYTES_MAX, "clamped by `entry_bytes`");
        self.0 = (self.0 & !ENTRY_BYTES_MAX) | (bytes & ENTRY_BYTES_MAX);
    }

    fn freq(self) -> u8 {
        ((self.0 >> ENTRY_FREQ_SHIFT) & 3) as u8
    }

    fn set_freq(&mut self, freq: u8) {
        debug_assert!(freq <= MAX_FREQ);
        self.0 = (self.0 & !(3 << ENTRY_FREQ_SHIFT)) | (u64::from(freq) << ENTRY_FREQ_SHIFT);
    }

    fn queue(self) -> Queue {
        if self.0 & ENTRY_MAIN_BIT != 0 {
            Queue::Main
        } else {
            Queue::Small
        }
    }

    fn set_queue(&mut self, queue: Queue) {
        match queue {
            Queue::Main => self.0 |= ENTRY_MAIN_BIT,
            Queue::Small => self.0 &= !ENTRY_MAIN_BIT,
        }
    }

    fn pinned(self) -> bool {
        self.0 & ENTRY_PINNED_BIT != 0
    }

    fn set_pinned(&mut self, pinned: bool) {
        if pinned {
            self.0 |= ENTRY_PINNED_BIT;
        } else {
            self.0 &= !ENTRY_PINNED_BIT;
        }
    }
}

/// An S3-FIFO cache of keys with sizes, in bytes.
#[derive(Debug)]
pub struct S3Fifo<K: Hash + Eq + Clone> {
    budget_bytes: u64,
    /// Keyed by version ids, which the edge numbers: the cheap hash (`id_hash`).
    entries: HashMap<K, Entry, Ids>,
    /// The pin counts of the entries pinned (`Entry::pinned`), by key.
    pins: HashMap<K, u32, Ids>,
    small: VecDeque<K>,
    main: VecDeque<K>,
    small_bytes: u64,
    main_bytes: u64,
    /// Bytes of the entries that hold a pin: when every byte held is pinned, nothing can go
    /// and `evict` does not scan (a prefill pinning more than the budget would otherwise
    /// make every block's arrival walk `EVICT_SCAN_MAX` entries).
    pinned_bytes: u64,
    ghost: VecDeque<K>,
    ghost_set: HashSet<K, Ids>,
}

impl<K: Hash + Eq + Clone> S3Fifo<K> {
    /// An empty cache of `budget_bytes`.
    pub fn new(budget_bytes: u64) -> S3Fifo<K> {
        S3Fifo {
            budget_bytes,
            entries: HashMap::default(),
            pins: HashMap::default(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_bytes: 0,
            main_bytes: 0,
            pinned_bytes: 0,
            ghost: VecDeque::new(),
            ghost_set: HashSet::default(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// A read of `key`: true on a hit (its count goes up).
    pub fn touch(&mut self, key: &K) -> bool {
        match self.entries.get_mut(key) {
            Some(e) => {
                e.set_freq((e.freq() + 1).min(MAX_FREQ));
                true
            }
            None => false,
        }
    }

    /// Adds `key` of `bytes` (not held yet), then evicts down to the budget; the evicted keys
    /// are appended to `evicted` (their bytes are to be freed on disk).
    pub fn insert(&mut self, key: K, bytes: u64, evicted: &mut Vec<K>) {
        let bytes = entry_bytes(bytes);
        let queue = if !self.ghost_set.is_empty() && self.ghost_set.remove(&key) {
            Queue::Main
        } else {
            Queue::Small
        };
        let entry = Entry::new(bytes, queue);
        match queue {
            Queue::Small => {
                self.small.push_back(key.clone());
                self.small_bytes += bytes;
            }
            Queue::Main => {
                self.main.push_back(key.clone());
                self.main_bytes += bytes;
            }
        }
        // One probe of the table, not two: start-up inserts every version held.
        let before = self.entries.insert(key, entry);
        assert!(before.is_none(), "inserted twice");
        self.evict(evicted);
    }

    /// Makes room for `entries` more entries at once (start-up knows how many it holds).
    pub fn reserve(&mut self, entries: usize) {
        self.entries.reserve(entries);
        self.small.reserve(entries);
    }

    /// As `insert`, with `key` pinned once before anything is evicted (a version a fill is
    /// writing: it must not be the one its own arrival evicts).
    pub fn insert_pinned(&mut self, key: K, bytes: u64, evicted: &mut Vec<K>) {
        let mut none = Vec::new();
        let budget = std::mem::replace(&mut self.budget_bytes, u64::MAX);
        self.insert(key.clone(), bytes, &mut none);
        self.budget_bytes = budget;
        debug_assert!(none.is_empty());
        self.pin(&key);
        self.evict(evicted);
    }

    /// `key` now holds `bytes` (a fill stored more of it, or a damaged block was forgotten),
    /// then evicts down to the budget: an entry counts what is on disk, not what the origin
    /// says the object's size is. False when `key` is not held.
    pub fn resize(&mut self, key: &K, bytes: u64, evicted: &mut Vec<K>) -> bool {
        let bytes = entry_bytes(bytes);
        let Some(e) = self.entries.get_mut(key) else {
            return false;
        };
        let total = match e.queue() {
            Queue::Small => &mut self.small_bytes,
            Queue::Main => &mut self.main_bytes,
        };
        *total = *total - e.bytes() + bytes;
        if e.pinned() {
            self.pinned_bytes = self.pinned_bytes - e.bytes() + bytes;
        }
        let grew = bytes > e.bytes();
        e.set_bytes(bytes);
        if grew {
            self.evict(evicted);
        }
        true
    }

    /// A response began reading `key` (it must not be evicted until `unpin`).
    pub fn pin(&mut self, key: &K) -> bool {
        let Some(e) = self.entries.get_mut(key) else {
            return false;
        };
        let pins = self.pins.entry(key.clone()).or_insert(0);
        if *pins == 0 {
            self.pinned_bytes += e.bytes();
            e.set_pinned(true);
        }
        *pins += 1;
        true
    }

    /// How many pins `key` holds (0 when not held).
    pub fn pins(&self, key: &K) -> u32 {
        self.pins.get(key).copied().unwrap_or(0)
    }

    /// That response is done with `key`.
    pub fn unpin(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            let pins = self.pins.get_mut(key).expect("unpinned more than pinned");
            assert!(e.pinned() && *pins > 0, "unpinned more than pinned");
            *pins -= 1;
            if *pins == 0 {
                self.pins.remove(key);
                e.set_pinned(false);
                self.pinned_bytes -= e.bytes();
            }
        }
    }

    /// Removes `key` outright (its block was corrupt, or its version dropped).
    pub fn remove(&mut self, key: &K) -> bool {
        let Some(e) = self.entries.remove(key) else {
            return false;
        };
        let (queue, bytes) = match e.queue() {
            Queue::Small => (&mut self.small, &mut self.small_bytes),
            Queue::Main => (&mut self.main, &mut self.main_bytes),
        };
        // O(queue) but rare: removal is for damage and drops, not the read path.
        if let Some(i) = queue.iter().position(|k| k == key) {
            queue.remove(i);
        }
        *bytes -= e.bytes();
        if e.pinned() {
            self.pins.remove(key);
            self.pinned_bytes -= e.bytes();
        }
        true
    }

    /// Evicts until the bytes held fit the budget (pinned entries stay, so it may stop above
    /// it: a fill that cannot get space is passed through, not stored).
    fn evict(&mut self, evicted: &mut Vec<K>) {
        let mut scanned = 0;
        debug_assert!(self.pinned_bytes <= self.bytes());
        while self.bytes() > self.budget_bytes
            && self.bytes() > self.pinned_bytes
            && scanned < EVICT_SCAN_MAX
        {
            scanned += 1;
            let small_over = self.small_bytes > self.budget_bytes / SMALL_QUEUE_DIVISOR;
            if (small_over || self.main.is_empty()) && !self.small.is_empty() {
                self.evict_small(evicted);
            } else if !self.main.is_empty() {
                self.evict_main(evicted);
            } else {
                break;
            }
        }
    }

    fn evict_small(&mut self, evicted: &mut Vec<K>) {
        let key = self.small.pop_front().expect("checked non-empty");
        let e = self.entries.get_mut(&key).expect("queued keys are held");
        self.small_bytes -= e.bytes();
        if e.freq() > 0 || e.pinned() {
            // Read again while new (or being read): it is worth keeping.
            e.set_queue(Queue::Main);
            e.set_freq(0);
            self.main_bytes += e.bytes();
            self.main.push_back(key);
            return;
        }
        self.entries.remove(&key);
        self.remember_ghost(key.clone());
        evicted.push(key);
    }

    fn evict_main(&mut self, evicted: &mut Vec<K>) {
        let key = self.main.pop_front().expect("checked non-empty");
        let e = self.entries.get_mut(&key).expect("queued keys are held");
        if e.freq() > 0 || e.pinned() {
            e.set_freq(e.freq().saturating_sub(1));
            self.main.push_back(key);
            return;
        }
        self.main_bytes -= e.bytes();
        self.entries.remove(&key);
        evicted.push(key);
    }

    /// Keeps `key` in the ghost queue, bounded by the entries `main` holds.
    fn remember_ghost(&mut self, key: K) {
        if self.ghost_set.insert(key.clone()) {
            self.ghost.push_back(key);
        }
        let bound = self.main.len().max(1);
        while self.ghost.len() > bound {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
    }
}

/// Plain LRU over the same interface, the baseline the hit ratio is compared against.
#[derive(Debug)]
pub struct Lru<K: Hash + Eq + Clone> {
    budget_bytes: u64,
    bytes: u64,
    tick: u64,
    entries: HashMap<K, (u64, u64)>,
    order: std::collections::BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone> Lru<K> {
    /// An empty LRU of `budget_bytes`.
    pub fn new(budget_bytes: u64) -> Lru<K> {
        Lru {
            budget_bytes,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
            order: std::collections::BTreeMap::new(),
        }
    }

    /// A read: true on a hit (it becomes the most recent).
    pub fn touch(&mut self, key: &K) -> bool {
        let Some((bytes, at)) = self.entries.get(key).copied() else {
            return false;
        };
        self.order.remove(&at);
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.entries.insert(key.clone(), (bytes, self.tick));
        true
    }

    /// Adds `key`, evicting the least recent entries down to the budget.
    pub fn insert(&mut self, key: K, bytes: u64, evicted: &mut Vec<K>) {
        let bytes = entry_bytes(bytes);
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.entries.insert(key, (bytes, self.tick));
        self.bytes += bytes;
        while self.bytes > self.budget_bytes {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.entries.remove(&old) {
                self.bytes -= b;
            }
            evicted.push(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_that_grows_evicts_others_and_counts_what_it_holds() {
        let mut c = S3Fifo::new(100);
        let mut ev = Vec::new();
        c.insert(1, 60, &mut ev);
        c.insert_pinned(2, 0, &mut ev);
        assert!(ev.is_empty(), "an empty entry costs nothing");
        assert!(c.resize(&2, 30, &mut ev));
        assert!(ev.is_empty() && c.bytes() == 90);
        assert!(c.resize(&2, 50, &mut ev));
        assert_eq!(ev, vec![1], "past the budget, the unpinned one goes");
        assert_eq!(c.bytes(), 50);
        assert!(c.resize(&2, 20, &mut ev), "a shrink");
        assert_eq!(c.bytes(), 20);
        assert!(!c.resize(&9, 1, &mut ev), "not held");
        // Pinned bytes are counted exactly: everything pinned and over budget, nothing goes.
        assert_eq!(c.pinned_bytes, 20);
        assert!(c.resize(&2, 150, &mut ev));
        assert_eq!((c.pinned_bytes, c.bytes()), (150, 150));
        c.pin(&2);
        c.unpin(&2);
        assert_eq!(c.pinned_bytes, 150, "still pinned once");
        c.unpin(&2);
        assert_eq!(c.pinned_bytes, 0);
        c.insert(3, 10, &mut ev);
        assert!(!c.contains(&2), "unpinned and over budget: it went");
    }

    #[test]
    fn an_entry_inserted_pinned_is_never_its_own_victim() {
        let mut c = S3Fifo::new(100);
        let mut ev = Vec::new();
        c.insert(1u32, 60, &mut ev);
        c.touch(&1);
        c.insert_pinned(2, 60, &mut ev);
        assert_eq!(ev, vec![1], "the older, unpinned one goes");
        assert!(c.contains(&2));
        ev.clear();
        c.insert_pinned(3, 200, &mut ev);
        assert!(c.contains(&3), "larger than the budget, kept while pinned");
        c.unpin(&2);
        c.unpin(&3);
        c.insert(4, 10, &mut ev);
        assert!(
            c.bytes() <= 100,
            "unpinned ones go once something new arrives"
        );
    }

    #[test]
    fn a_one_time_scan_does_not_push_out_what_is_read_again() {
        // 100 blocks of budget; 20 hot blocks read over and over, then a scan of 1000 blocks
        // read once each.
        let mut c = S3Fifo::new(100);
        let mut out = Vec::new();
        for k in 0..20u32 {
            c.insert(k, 1, &mut out);
        }
        for _ in 0..3 {
            for k in 0..20 {
                assert!(c.touch(&k));
            }
        }
        for k in 1000..2000u32 {
            c.insert(k, 1, &mut out);
        }
        assert!(
            (0..20).all(|k| c.contains(&k)),
            "the hot set survives the scan"
        );
        assert!(c.bytes() <= 100);
        // The same against LRU: the scan wipes it.
        let mut lru = Lru::new(100);
        for k in 0..20u32 {
            lru.insert(k, 1, &mut out);
        }
        for k in 1000..2000u32 {
            lru.insert(k, 1, &mut out);
        }
        assert!((0..20).all(|k| !lru.touch(&k)));
    }

    #[test]
    fn a_key_back_from_the_ghost_goes_to_main_and_pinned_entries_stay() {
        let mut c = S3Fifo::new(10);
        let mut out = Vec::new();
        for k in 0..11u32 {
            c.insert(k, 1, &mut out);
        }
        assert_eq!(out, [0], "the oldest new entry, never read again");
        out.clear();
        // 0 comes back: remembered, so it goes to main.
        c.insert(0, 1, &mut out);
        assert_eq!(c.entries[&0].queue(), Queue::Main);
        // Everything pinned: nothing can go, and the cache stays over budget rather than
        // evict a block being read.
        let mut p = S3Fifo::new(3);
        for k in 0..3u32 {
            p.insert(k, 1, &mut out);
            assert!(p.pin(&k));
        }
        out.clear();
        p.insert(3, 1, &mut out);
        assert_eq!(out, [3], "only the new, unpinned entry can go");
        p.unpin(&1);
        out.clear();
        p.insert(4, 1, &mut out);
        assert_eq!(p.bytes(), 3);
        assert!(
            p.contains(&0) && p.contains(&2),
            "pinned ones kept: {out:?}"
        );
        assert!(p.remove(&4) || !p.contains(&4));
    }

    #[test]
    fn bytes_are_accounted_through_every_move() {
        let mut c = S3Fifo::new(1000);
        let mut out = Vec::new();
        let mut seed = 7u64;
        for i in 0..20_000u64 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = (seed >> 33) % 300;
            if !c.touch(&key) {
                c.insert(key, 1 + (seed >> 20) % 50, &mut out);
            }
            if i % 997 == 0 {
                c.remove(&((seed >> 40) % 300));
            }
            let held: u64 = c.entries.values().map(|e| e.bytes()).sum();
            assert_eq!(held, c.bytes());
            assert!(c.bytes() <= 1000);
            assert_eq!(c.small.len() + c.main.len(), c.entries.len());
        }
    }

    #[test]
    fn an_entry_keeps_each_field_apart_and_pins_are_counted_beside_it() {
        let mut e = Entry::new(ENTRY_BYTES_MAX, Queue::Main);
        e.set_freq(MAX_FREQ);
        e.set_pinned(true);
        assert_eq!(
            (e.bytes(), e.freq(), e.queue(), e.pinned()),
            (ENTRY_BYTES_MAX, MAX_FREQ, Queue::Main, true)
        );
        e.set_bytes(5);
        e.set_queue(Queue::Small);
        assert_eq!(
            (e.bytes(), e.freq(), e.queue(), e.pinned()),
            (5, 3, Queue::Small, true)
        );
        e.set_freq(0);
        e.set_pinned(false);
        assert_eq!(
            (e.bytes(), e.freq(), e.queue(), e.pinned()),
            (5, 0, Queue::Small, false)
        );
        // Past an exabyte an entry counts an exabyte, and its totals agree with it.
        let mut c = S3Fifo::new(u64::MAX);
        let mut out = Vec::new();
        c.insert(1u64, u64::MAX, &mut out);
        assert_eq!((c.bytes(), out.len()), (ENTRY_BYTES_MAX, 0));

        // Pins in and out at random: the pinned bytes are those of entries with a pin, and
        // only those have a count.
        let mut c = S3Fifo::new(400);
        let mut seed = 11u64;
        for _ in 0..20_000u64 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = (seed >> 33) % 100;
            match (seed >> 20) % 4 {
                0 if !c.contains(&key) => c.insert(key, 1 + (seed >> 24) % 20, &mut out),
                1 => {
                    c.pin(&key);
                }
                2 if c.pins(&key) > 0 => c.unpin(&key),
                _ => {
                    c.touch(&key);
                }
            }
            let pinned: u64 = c
                .entries
                .values()
                .filter(|e| e.pinned())
                .map(|e| e.bytes())
                .sum();
            assert_eq!(pinned, c.pinned_bytes);
            assert!(c.pins.keys().all(|k| c.entries[k].pinned()));
            assert_eq!(
                c.pins.len(),
                c.entries.values().filter(|e| e.pinned()).count()
            );
        }
    }
}
