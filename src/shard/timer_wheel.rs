//! A hashed timer wheel with one timer per connection slot: O(1) arm, re-arm and cancel, and
//! expiry that costs the buckets the clock moved over plus the entries in them, never a sweep
//! over every slot.
//!
//! Layout. Time is cut into ticks of `granularity_ms`; a timer with deadline `d` lives in bucket
//! `(d / granularity_ms) % buckets`, in an intrusive doubly linked list over preallocated
//! per-slot arrays (the style of [`super::intrusive`]), so nothing allocates after `new()`.
//! Each entry keeps its absolute deadline, so deadlines a revolution or more ahead (hours, from
//! the config) share a bucket with nearer ones and are simply left there when the bucket is
//! visited before they are due ("rounds", as in Netty's `HashedWheelTimer`).
//!
//! Exactness. [`TimerWheel::pop_expired`] is exact: it returns a slot at the first call whose
//! `now_ms` is at or past the slot's deadline, never earlier, because every entry is compared
//! by its absolute deadline, not by its bucket. The granularity therefore does not make a
//! deadline fire late; how late a deadline fires is how long the shard goes without calling
//! `pop_expired` (today's shard sleeps at most `TIMER_SWEEP_MS` = 100 ms). The granularity sets
//! the cost side instead: a bucket spans `granularity_ms`, so the current bucket is re-examined
//! when its earliest entry is due, and [`TimerWheel::next_deadline_ms`] is exact only for the
//! current tick: for a later tick it is the tick's start, so a shard that sleeps until that
//! bound may wake up to `granularity_ms` early, at most once per occupied tick, and then
//! learns the exact deadline.
//!
//! Invariants (checked by `check_invariants` in the tests, cheap ones by `debug_assert!`):
//! - a slot is in at most one list: one bucket, or the due list, or none (`home`);
//! - every entry in a bucket has `deadline_ms > now_ms` (the `now_ms` of the last advance) and
//!   sits in bucket `(deadline_ms / granularity_ms) & mask`, so its tick is at or after the
//!   cursor's tick;
//! - every entry in the due list has `deadline_ms <= now_ms`: it has fired and waits to be
//!   popped;
//! - `cursor_min_ms` is at most every deadline in the cursor's bucket and `due_min_ms` at most
//!   every deadline in the due list (lower bounds, tightened whenever the list is walked);
//! - a bucket's bit in `occupied` is set exactly when the bucket is non-empty;
//! - `len` is the number of slots in any list.

/// Width of one wheel bucket in milliseconds, the default for a shard. 10 ms: well under the
/// shard's 100 ms sleep bound and the 20 ms `READ_AHEAD_FAST_SEND_MS`, so a shard that sleeps
/// until [`TimerWheel::next_deadline_ms`] wakes early at most once per occupied 10 ms tick.
pub const TIMER_GRANULARITY_MS: u64 = 10;
/// Buckets of a shard's wheel (a power of two). 8192 x 10 ms = 81.92 s per revolution covers
/// every default timeout (header 10 s, send 60 s, keep-alive 75 s, linger 2 s), so at the
/// defaults each timer is examined only in the tick it is due; the heads cost 32 KiB per shard.
pub const TIMER_WHEEL_BUCKETS: usize = 8192;

/// No slot (end of a list).
const NIL: u32 = u32::MAX;
/// `home` of a slot that has no timer.
const UNARMED: u32 = u32::MAX;
/// Bits per word of the `occupied` bitmap.
const WORD_BITS: u64 = u64::BITS as u64;

/// One timer per slot `0..capacity`, bucketed by deadline (see the module doc).
pub struct TimerWheel {
    granularity_ms: u64,
    /// `buckets - 1`: bucket of tick `t` is `t & mask`.
    mask: u64,
    /// Absolute deadline of each armed slot (meaningless when unarmed).
    deadline_ms: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// The list a slot is in: a bucket index, `due_list()` (= buckets), or `UNARMED`.
    home: Vec<u32>,
    /// First slot of each bucket, then of the due list (index `buckets`).
    head: Vec<u32>,
    /// Last slot of the due list (kept FIFO, so slots pop in the order they became due).
    due_tail: u32,
    /// One bit per bucket: set when the bucket holds any slot.
    occupied: Vec<u64>,
    /// Tick of `now_ms`; buckets up to it have been examined.
    cursor_tick: u64,
    /// The `now_ms` of the last advance: everything due by then is in the due list.
    now_ms: u64,
    /// Lower bound of the deadlines in the cursor's bucket.
    cursor_min_ms: u64,
    /// Lower bound of the deadlines in the due list.
    due_min_ms: u64,
    len: usize,
}

impl TimerWheel {
    /// An empty wheel for slots `0..capacity`, with `buckets` (a power of two) buckets of
    /// `granularity_ms` each; the shard uses [`TIMER_GRANULARITY_MS`] and
    /// [`TIMER_WHEEL_BUCKETS`]. All memory is allocated here.
    pub fn new(capacity: usize, granularity_ms: u64, buckets: usize) -> TimerWheel {
        assert!(capacity < NIL as usize, "slot indices must fit below NIL");
        assert!(granularity_ms > 0, "granularity_ms must be positive");
        assert!(buckets.is_power_of_two(), "buckets must be a power of two");
        // Bucket indices and the due list's index must stay below UNARMED.
        assert!(buckets < UNARMED as usize);
        let words = buckets.div_ceil(WORD_BITS as usize);
        TimerWheel {
            granularity_ms,
            mask: buckets as u64 - 1,
            deadline_ms: vec![0; capacity],
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            home: vec![UNARMED; capacity],
            head: vec![NIL; buckets + 1],
            due_tail: NIL,
            occupied: vec![0; words],
            cursor_tick: 0,
            now_ms: 0,
            cursor_min_ms: u64::MAX,
            due_min_ms: u64::MAX,
            len: 0,
        }
    }

    /// Sets `slot`'s timer to fire at `deadline_ms`, replacing any timer it had (O(1)). A
    /// deadline at or before the last `pop_expired` time is due at once.
    pub fn arm(&mut self, slot: u32, deadline_ms: u64) {
        self.unlink(slot);
        self.deadline_ms[slot as usize] = deadline_ms;
        if deadline_ms <= self.now_ms {
            self.push_due(slot);
        } else {
            let bucket = self.bucket_of(deadline_ms);
            if bucket == self.bucket_of_tick(self.cursor_tick) {
                self.cursor_min_ms = self.cursor_min_ms.min(deadline_ms);
            }
            self.push_bucket(bucket, slot);
        }
    }

    /// Removes `slot`'s timer (O(1)); no-op if it has none.
    pub fn cancel(&mut self, slot: u32) {
        self.unlink(slot);
    }

    /// `slot`'s deadline, if it has a timer (also while it is due and not yet popped).
    pub fn deadline(&self, slot: u32) -> Option<u64> {
        let s = slot as usize;
        (self.home[s] != UNARMED).then_some(self.deadline_ms[s])
    }

    /// Slots with a timer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no slot has a timer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes one slot whose deadline is `<= now_ms` and disarms it; `None` when there is none.
    /// Call it in a loop (`while let Some(slot) = wheel.pop_expired(now)`); arming or
    /// cancelling any slot between calls is allowed, and a slot re-armed with a deadline
    /// `<= now_ms` is returned again by the same loop. The first call at a new `now_ms` moves
    /// every due timer to the due list: O(buckets the clock moved over, at most `buckets` +
    /// entries in them); a jump of many revolutions visits each bucket once. `now_ms` must not
    /// decrease; a smaller value is taken as the last one.
    pub fn pop_expired(&mut self, now_ms: u64) -> Option<u32> {
        if now_ms > self.now_ms {
            self.advance(now_ms);
        }
        let slot = self.head[self.due_list()];
        if slot == NIL {
            return None;
        }
        debug_assert!(self.deadline_ms[slot as usize] <= self.now_ms);
        self.unlink(slot);
        Some(slot)
    }

    /// A time at or before every armed deadline (`None` if nothing is armed): exact for the
    /// current tick, the start of the tick for later ones. After `pop_expired(now)` returned
    /// `None` it is later than `now`, so a shard sleeping until it never spins.
    /// O(buckets / 64).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut earliest = u64::MAX;
        if self.head[self.due_list()] != NIL {
            earliest = self.due_min_ms;
        }
        if self.head[self.bucket_of_tick(self.cursor_tick) as usize] != NIL {
            earliest = earliest.min(self.cursor_min_ms);
        }
        if let Some(ticks_ahead) = self.first_occupied_after_cursor() {
            // Entries there are at that tick or a whole revolution later, never earlier.
            let tick = self.cursor_tick.saturating_add(ticks_ahead);
            earliest = earliest.min(tick.saturating_mul(self.granularity_ms));
        }
        Some(earliest)
    }

    /// Moves every timer due by `now_ms` (> `self.now_ms`) to the due list.
    fn advance(&mut self, now_ms: u64) {
        debug_assert!(now_ms > self.now_ms);
        let target_tick = now_ms / self.granularity_ms;
        let ticks_ahead = target_tick - self.cursor_tick;
        self.now_ms = now_ms;
        if ticks_ahead == 0 && now_ms < self.cursor_min_ms {
            // Same tick and nothing in its bucket is due yet: later buckets' entries are at
            // later ticks, so nothing is due anywhere.
            return;
        }
        // Visit the ticks ending at the target, each bucket at most once (a jump of a
        // revolution or more visits every bucket once).
        let visits = ticks_ahead.min(self.mask) + 1;
        let first_tick = target_tick - (visits - 1);
        let mut target_min_ms = u64::MAX;
        for i in 0..visits {
            let bucket = self.bucket_of_tick(first_tick + i);
            target_min_ms = self.collect_due(bucket, now_ms);
        }
        self.cursor_tick = target_tick;
        self.cursor_min_ms = target_min_ms;
    }

    /// Moves the entries of `bucket` due by `now_ms` to the due list; returns the earliest
    /// deadline left in the bucket (`u64::MAX` if none).
    fn collect_due(&mut self, bucket: u32, now_ms: u64) -> u64 {
        let mut left_min_ms = u64::MAX;
        let mut slot = self.head[bucket as usize];
        while slot != NIL {
            let following = self.next[slot as usize];
            let deadline_ms = self.deadline_ms[slot as usize];
            if deadline_ms <= now_ms {
                self.unlink(slot);
                self.push_due(slot);
            } else {
                left_min_ms = left_min_ms.min(deadline_ms);
            }
            slot = following;
        }
        left_min_ms
    }

    /// Ticks from the cursor to the first non-empty bucket after the cursor's own, within one
    /// revolution.
    fn first_occupied_after_cursor(&self) -> Option<u64> {
        let buckets = self.mask + 1;
        let start = self.cursor_tick & self.mask;
        let mut offset = 1;
        while offset < buckets {
            let pos = (start + offset) & self.mask;
            let bit = pos % WORD_BITS;
            // Look at the rest of this word, without running past the end of the wheel (when
            // it has fewer than 64 buckets) or past a full revolution.
            let span = (WORD_BITS - bit).min(buckets - pos).min(buckets - offset);
            let bits = self.occupied[(pos / WORD_BITS) as usize] >> bit;
            let first = u64::from(bits.trailing_zeros());
            if first < span {
                return Some(offset + first);
            }
            offset += span;
        }
        None
    }

    /// Index of the due list in `head`.
    fn due_list(&self) -> usize {
        self.mask as usize + 1
    }

    fn bucket_of_tick(&self, tick: u64) -> u32 {
        (tick & self.mask) as u32
    }

    fn bucket_of(&self, deadline_ms: u64) -> u32 {
        self.bucket_of_tick(deadline_ms / self.granularity_ms)
    }

    /// Puts unlisted `slot` at the front of `bucket` (order within a bucket does not matter).
    fn push_bucket(&mut self, bucket: u32, slot: u32) {
        let s = slot as usize;
        debug_assert_eq!(self.home[s], UNARMED);
        debug_assert!(self.deadline_ms[s] > self.now_ms);
        let b = bucket as usize;
        let old_head = self.head[b];
        self.prev[s] = NIL;
        self.next[s] = old_head;
        if old_head != NIL {
            self.prev[old_head as usize] = slot;
        }
        self.head[b] = slot;
        self.home[s] = bucket;
        self.occupied[b / WORD_BITS as usize] |= 1 << (b % WORD_BITS as usize);
        self.len += 1;
    }

    /// Appends unlisted `slot` to the due list.
    fn push_due(&mut self, slot: u32) {
        let s = slot as usize;
        debug_assert_eq!(self.home[s], UNARMED);
        debug_assert!(self.deadline_ms[s] <= self.now_ms);
        let due = self.due_list();
        self.prev[s] = self.due_tail;
        self.next[s] = NIL;
        match self.due_tail {
            NIL => self.head[due] = slot,
            t => self.next[t as usize] = slot,
        }
        self.due_tail = slot;
        self.home[s] = due as u32;
        self.due_min_ms = self.due_min_ms.min(self.deadline_ms[s]);
        self.len += 1;
    }

    /// Takes `slot` out of whichever list holds it (no-op if none).
    fn unlink(&mut self, slot: u32) {
        let s = slot as usize;
        let home = self.home[s];
        if home == UNARMED {
            return;
        }
        let list = home as usize;
        let due = list == self.due_list();
        let (p, n) = (self.prev[s], self.next[s]);
        match p {
            NIL => self.head[list] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL if due => self.due_tail = p,
            NIL => {}
            n => self.prev[n as usize] = p,
        }
        if self.head[list] == NIL {
            if due {
                self.due_min_ms = u64::MAX;
            } else {
                self.occupied[list / WORD_BITS as usize] &= !(1 << (list % WORD_BITS as usize));
            }
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        self.home[s] = UNARMED;
        self.len -= 1;
    }

    /// Walks every list and panics on any broken invariant of the module doc.
    #[cfg(test)]
    fn check_invariants(&self) {
        let due = self.due_list();
        let mut seen = 0;
        for list in 0..=due {
            let mut prev = NIL;
            let mut slot = self.head[list];
            while slot != NIL {
                let s = slot as usize;
                assert_eq!(self.home[s] as usize, list, "slot {slot} in the wrong list");
                assert_eq!(self.prev[s], prev, "broken back link at {slot}");
                let d = self.deadline_ms[s];
                if list == due {
                    assert!(d <= self.now_ms, "due slot {slot} not due");
                    assert!(self.due_min_ms <= d);
                } else {
                    assert!(d > self.now_ms, "slot {slot} left in a bucket though due");
                    assert_eq!(self.bucket_of(d) as usize, list);
                    assert!(d / self.granularity_ms >= self.cursor_tick);
                    if list == self.bucket_of_tick(self.cursor_tick) as usize {
                        assert!(self.cursor_min_ms <= d);
                    }
                }
                seen += 1;
                prev = slot;
                slot = self.next[s];
            }
            if list == due {
                assert_eq!(self.due_tail, prev);
            } else {
                let bit = self.occupied[list / WORD_BITS as usize] >> (list % WORD_BITS as usize);
                assert_eq!(
                    bit & 1 == 1,
                    self.head[list] != NIL,
                    "occupied bit of {list}"
                );
            }
        }
        assert_eq!(seen, self.len);
        let armed = self.home.iter().filter(|&&h| h != UNARMED).count();
        assert_eq!(armed, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pops everything due at `now_ms`, sorted.
    fn drain(w: &mut TimerWheel, now_ms: u64) -> Vec<u32> {
        let mut fired = Vec::new();
        while let Some(slot) = w.pop_expired(now_ms) {
            fired.push(slot);
        }
        w.check_invariants();
        fired.sort_unstable();
        fired
    }

    fn small_wheel() -> TimerWheel {
        // 8 buckets of 10 ms: one revolution is 80 ms, so rounds are easy to reach.
        TimerWheel::new(16, 10, 8)
    }

    #[test]
    fn arm_fires_at_the_deadline_not_before() {
        let mut w = small_wheel();
        w.arm(3, 25);
        assert_eq!(w.len(), 1);
        assert_eq!(w.deadline(3), Some(25));
        assert_eq!(drain(&mut w, 24), Vec::<u32>::new());
        assert_eq!(w.deadline(3), Some(25));
        // deadline == now fires.
        assert_eq!(drain(&mut w, 25), vec![3]);
        assert_eq!(w.deadline(3), None);
        assert!(w.is_empty());
        // Exactly once.
        assert_eq!(drain(&mut w, 1000), Vec::<u32>::new());
    }

    #[test]
    fn a_deadline_in_the_past_is_due_at_once() {
        let mut w = small_wheel();
        assert_eq!(drain(&mut w, 500), Vec::<u32>::new());
        w.arm(1, 100);
        w.arm(2, 500);
        assert_eq!(w.next_deadline_ms(), Some(100));
        // Even without the clock moving.
        assert_eq!(drain(&mut w, 500), vec![1, 2]);
        // A deadline of 0 on a fresh wheel is due at time 0.
        let mut fresh = small_wheel();
        fresh.arm(0, 0);
        assert_eq!(drain(&mut fresh, 0), vec![0]);
    }

    #[test]
    fn re_arm_earlier_and_later_replaces_the_timer() {
        let mut w = small_wheel();
        w.arm(5, 50);
        w.arm(5, 20);
        assert_eq!(w.len(), 1);
        assert_eq!(drain(&mut w, 20), vec![5]);
        w.arm(6, 30);
        w.arm(6, 300);
        assert_eq!(w.deadline(6), Some(300));
        assert_eq!(drain(&mut w, 299), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 300), vec![6]);
        // Re-arming a slot that is due and not yet popped takes it off the due list.
        w.arm(7, 310);
        assert_eq!(w.pop_expired(320), Some(7));
        w.arm(8, 315);
        w.arm(9, 316);
        w.pop_expired(330).unwrap();
        w.arm(8, 400);
        w.arm(9, 400);
        assert_eq!(drain(&mut w, 330), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 400), vec![8, 9]);
    }

    #[test]
    fn cancel_then_arm() {
        let mut w = small_wheel();
        w.cancel(4); // no timer: no-op
        assert!(w.is_empty());
        w.arm(4, 40);
        w.cancel(4);
        w.cancel(4);
        assert_eq!(w.deadline(4), None);
        assert_eq!(w.next_deadline_ms(), None);
        assert_eq!(drain(&mut w, 100), Vec::<u32>::new());
        w.arm(4, 120);
        assert_eq!(drain(&mut w, 120), vec![4]);
        w.check_invariants();
    }

    #[test]
    fn first_and_last_slot_and_a_one_slot_wheel() {
        let mut w = small_wheel();
        w.arm(0, 10);
        w.arm(15, 10);
        assert_eq!(drain(&mut w, 10), vec![0, 15]);
        let mut one = TimerWheel::new(1, 1, 1);
        one.arm(0, 7);
        assert_eq!(drain(&mut one, 6), Vec::<u32>::new());
        assert_eq!(drain(&mut one, 7), vec![0]);
    }

    #[test]
    fn deadlines_revolutions_ahead_wait_for_their_round() {
        let mut w = small_wheel();
        // Same bucket as 15, three revolutions (240 ms) later.
        w.arm(1, 255);
        w.arm(2, 15);
        assert_eq!(drain(&mut w, 15), vec![2]);
        for now in (20..255).step_by(5) {
            assert_eq!(drain(&mut w, now), Vec::<u32>::new(), "early at {now}");
        }
        assert_eq!(drain(&mut w, 255), vec![1]);
    }

    #[test]
    fn a_jump_over_many_revolutions_fires_everything_due_once() {
        let mut w = small_wheel();
        for slot in 0..16 {
            w.arm(slot, 10 + u64::from(slot) * 37);
        }
        w.arm(15, 1_000_000);
        // 10_000 ms is 125 revolutions.
        assert_eq!(drain(&mut w, 10_000), (0..15).collect::<Vec<_>>());
        assert_eq!(w.len(), 1);
        assert_eq!(drain(&mut w, 999_999), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 1_000_000), vec![15]);
    }

    #[test]
    fn u64_large_deadlines_and_clock() {
        let mut w = TimerWheel::new(4, 1, 8);
        w.arm(0, u64::MAX);
        w.arm(1, u64::MAX - 1);
        w.arm(2, 100);
        assert_eq!(drain(&mut w, 100), vec![2]);
        assert!(w.next_deadline_ms().is_some_and(|t| t < u64::MAX));
        assert_eq!(drain(&mut w, u64::MAX - 2), Vec::<u32>::new());
        assert_eq!(drain(&mut w, u64::MAX - 1), vec![1]);
        assert_eq!(drain(&mut w, u64::MAX), vec![0]);
        // Arming at the end of time still works.
        w.arm(3, u64::MAX);
        assert_eq!(drain(&mut w, u64::MAX), vec![3]);
        let mut coarse = TimerWheel::new(2, TIMER_GRANULARITY_MS, TIMER_WHEEL_BUCKETS);
        coarse.arm(0, u64::MAX);
        assert_eq!(drain(&mut coarse, u64::MAX - 1), Vec::<u32>::new());
        assert_eq!(drain(&mut coarse, u64::MAX), vec![0]);
    }

    #[test]
    fn next_deadline_is_a_lower_bound_exact_in_the_current_tick() {
        let mut w = small_wheel();
        assert_eq!(w.next_deadline_ms(), None);
        w.arm(1, 57);
        // A later tick: its start.
        assert_eq!(w.next_deadline_ms(), Some(50));
        assert_eq!(drain(&mut w, 50), Vec::<u32>::new());
        // Now the current tick: exact, and later than now.
        assert_eq!(w.next_deadline_ms(), Some(57));
        w.cancel(1);
        assert_eq!(w.next_deadline_ms(), None);
        // A deadline a revolution ahead in the cursor's own bucket. The cancelled 57 may
        // still bound it (a lower bound is only tightened when the bucket is walked) ...
        w.arm(2, 50 + 80 + 3);
        assert!(w
            .next_deadline_ms()
            .is_some_and(|t| (57..=133).contains(&t)));
        // ... which the next pop at or past the stale bound does, without firing anything.
        assert_eq!(drain(&mut w, 57), Vec::<u32>::new());
        assert_eq!(w.next_deadline_ms(), Some(133));
        assert_eq!(drain(&mut w, 133), vec![2]);
    }

    #[test]
    fn a_past_now_is_taken_as_the_last_one() {
        let mut w = small_wheel();
        w.arm(1, 100);
        assert_eq!(drain(&mut w, 200), vec![1]);
        w.arm(2, 150);
        // The clock may not go back; 100 counts as 200.
        assert_eq!(drain(&mut w, 100), vec![2]);
    }

    #[test]
    fn the_shard_defaults_cover_the_default_timeouts_in_one_revolution() {
        let revolution_ms = TIMER_GRANULARITY_MS * TIMER_WHEEL_BUCKETS as u64;
        let defaults = crate::config::Config::default();
        for t in [
            defaults.header_timeout_ms,
            defaults.keepalive_timeout_ms,
            defaults.send_timeout_ms,
        ] {
            assert!(t < revolution_ms, "{t} ms is more than one revolution");
        }
    }

    /// One step of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Arm {
            slot: u32,
            deadline: Deadline,
        },
        Cancel {
            slot: u32,
        },
        /// One `pop_expired` after moving the clock forward.
        Pop {
            advance_ms: u64,
        },
        /// `pop_expired` until `None` after moving the clock forward.
        Drain {
            advance_ms: u64,
        },
    }

    /// A deadline relative to the model's clock.
    #[derive(Debug, Clone)]
    enum Deadline {
        Ahead(u64),
        Behind(u64),
        EndOfTime(u64),
    }

    fn clock_step() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 0u64..30,
            1 => 0u64..2_000,
            1 => Just(u64::MAX / 4),
        ]
    }

    fn op(slots: u32) -> impl Strategy<Value = Op> {
        let deadline = prop_oneof![
            6 => (0u64..200).prop_map(Deadline::Ahead),
            2 => (0u64..5_000).prop_map(Deadline::Ahead),
            1 => (0u64..100).prop_map(Deadline::Behind),
            1 => (0u64..3).prop_map(Deadline::EndOfTime),
        ];
        prop_oneof![
            6 => (0..slots, deadline).prop_map(|(slot, deadline)| Op::Arm { slot, deadline }),
            2 => (0..slots).prop_map(|slot| Op::Cancel { slot }),
            3 => clock_step().prop_map(|advance_ms| Op::Pop { advance_ms }),
            2 => clock_step().prop_map(|advance_ms| Op::Drain { advance_ms }),
        ]
    }

    fn wheel_case() -> impl Strategy<Value = (u32, u64, u32, Vec<Op>)> {
        (1u32..12, 1u64..12, 0u32..8).prop_flat_map(|(slots, granularity, bucket_bits)| {
            (
                Just(slots),
                Just(granularity),
                Just(bucket_bits),
                proptest::collection::vec(op(slots), 0..300),
            )
        })
    }

    proptest! {
        /// Against a `Vec<Option<u64>>` model: every pop returns a slot that is due (never
        /// early), a drain returns exactly the due set, `None` only when nothing is due, and
        /// `len`, `deadline` and the `next_deadline_ms` bound agree after every step.
        #[test]
        fn matches_a_naive_model((slots, granularity, bucket_bits, ops) in wheel_case()) {
            let mut w = TimerWheel::new(slots as usize, granularity, 1 << bucket_bits);
            let mut model: Vec<Option<u64>> = vec![None; slots as usize];
            let mut now: u64 = 0;
            for op in ops {
                match op {
                    Op::Arm { slot, deadline } => {
                        let d = match deadline {
                            Deadline::Ahead(x) => now.saturating_add(x),
                            Deadline::Behind(x) => now.saturating_sub(x),
                            Deadline::EndOfTime(x) => u64::MAX - x,
                        };
                        w.arm(slot, d);
                        model[slot as usize] = Some(d);
                    }
                    Op::Cancel { slot } => {
                        w.cancel(slot);
                        model[slot as usize] = None;
                    }
                    Op::Pop { advance_ms } => {
                        now = now.saturating_add(advance_ms);
                        match w.pop_expired(now) {
                            Some(slot) => {
                                let d = model[slot as usize].take();
                                prop_assert!(d.is_some_and(|d| d <= now), "slot {} fired early: {:?} at {}", slot, d, now);
                            }
                            None => prop_assert!(model.iter().all(|d| d.is_none_or(|d| d > now)), "a due slot was not returned"),
                        }
                    }
                    Op::Drain { advance_ms } => {
                        now = now.saturating_add(advance_ms);
                        let fired = drain(&mut w, now);
                        let mut expected = Vec::new();
                        for (slot, d) in model.iter_mut().enumerate() {
                            if d.is_some_and(|d| d <= now) {
                                *d = None;
                                expected.push(slot as u32);
                            }
                        }
                        prop_assert_eq!(fired, expected);
                        // Nothing due is left: a shard sleeping until the bound never spins.
                        prop_assert!(w.next_deadline_ms().is_none_or(|t| t > now));
                    }
                }
                w.check_invariants();
                prop_assert_eq!(w.len(), model.iter().flatten().count());
                for (slot, d) in model.iter().enumerate() {
                    prop_assert_eq!(w.deadline(slot as u32), *d);
                }
                let earliest = model.iter().flatten().min().copied();
                match (w.next_deadline_ms(), earliest) {
                    (None, None) => {}
                    (Some(bound), Some(earliest)) => prop_assert!(bound <= earliest, "bound {} after {}", bound, earliest),
                    (got, want) => prop_assert!(false, "next_deadline_ms {:?}, earliest {:?}", got, want),
                }
            }
        }
    }
}
