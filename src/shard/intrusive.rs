//! Intrusive FIFO lists of connection slots: O(1) push, pop and removal from the middle, with
//! all links preallocated at start-up (no `retain`, no `contains`, no allocation per event).
//!
//! A `ListSet<N>` holds `N` lists over one family of slots; a slot is in at most one list of
//! the family at a time (e.g. the ready queue's urgent and bulk lists, or the arena's small
//! and bulk waiters).

/// No slot (end of a list).
const NIL: u32 = u32::MAX;
/// The slot is in none of the lists.
const NOT_LISTED: u8 = u8::MAX;

/// `N` FIFO lists over slots `0..slots`, each slot in at most one of them.
pub struct ListSet<const N: usize> {
    prev: Vec<u32>,
    next: Vec<u32>,
    member: Vec<u8>,
    head: [u32; N],
    tail: [u32; N],
    len: [usize; N],
}

impl<const N: usize> ListSet<N> {
    /// Empty lists over `slots` slots.
    pub fn new(slots: usize) -> ListSet<N> {
        assert!(N < usize::from(NOT_LISTED));
        assert!(slots < NIL as usize);
        ListSet {
            prev: vec![NIL; slots],
            next: vec![NIL; slots],
            member: vec![NOT_LISTED; slots],
            head: [NIL; N],
            tail: [NIL; N],
            len: [0; N],
        }
    }

    /// Which list `slot` is in, if any.
    pub fn list_of(&self, slot: u32) -> Option<usize> {
        match self.member[slot as usize] {
            NOT_LISTED => None,
            l => Some(usize::from(l)),
        }
    }

    /// Appends `slot` to list `list`; a slot already in some list moves (to the back of this
    /// one).
    pub fn push_back(&mut self, list: usize, slot: u32) {
        self.remove(slot);
        let s = slot as usize;
        self.prev[s] = self.tail[list];
        self.next[s] = NIL;
        match self.tail[list] {
            NIL => self.head[list] = slot,
            t => self.next[t as usize] = slot,
        }
        self.tail[list] = slot;
        self.member[s] = list as u8;
        self.len[list] += 1;
    }

    /// Takes the first slot of list `list`.
    pub fn pop_front(&mut self, list: usize) -> Option<u32> {
        let h = self.head[list];
        if h == NIL {
            return None;
        }
        self.remove(h);
        Some(h)
    }

    /// The first slot of list `list`, left in place.
    pub fn front(&self, list: usize) -> Option<u32> {
        (self.head[list] != NIL).then_some(self.head[list])
    }

    /// Unlinks `slot` from whichever list holds it (no-op if none). Returns whether it was
    /// listed.
    pub fn remove(&mut self, slot: u32) -> bool {
        let s = slot as usize;
        let list = self.member[s];
        if list == NOT_LISTED {
            return false;
        }
        let l = usize::from(list);
        let (p, n) = (self.prev[s], self.next[s]);
        match p {
            NIL => self.head[l] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail[l] = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        self.member[s] = NOT_LISTED;
        self.len[l] -= 1;
        true
    }

    /// Slots in list `list`.
    pub fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    /// True when list `list` is empty.
    pub fn is_empty(&self, list: usize) -> bool {
        self.len[list] == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fifo_order_moves_and_removal() {
        let mut l: ListSet<2> = ListSet::new(8);
        for s in [3, 1, 4] {
            l.push_back(0, s);
        }
        l.push_back(1, 5);
        assert_eq!(l.len(0), 3);
        // Moving 1 to the other list keeps the rest in order.
        l.push_back(1, 1);
        assert_eq!(l.list_of(1), Some(1));
        assert!(l.remove(4));
        assert!(!l.remove(4));
        assert_eq!(l.pop_front(0), Some(3));
        assert_eq!(l.pop_front(0), None);
        assert_eq!(l.pop_front(1), Some(5));
        assert_eq!(l.front(1), Some(1));
        assert_eq!(l.pop_front(1), Some(1));
        assert!(l.is_empty(1));
        assert_eq!(l.list_of(1), None);
    }

    proptest! {
        /// Against a model of two VecDeques: any sequence of pushes, pops and removals gives
        /// the same order and lengths.
        #[test]
        fn matches_a_deque_model(ops in proptest::collection::vec((0u8..4, 0u32..16, 0usize..2), 0..200)) {
            let mut l: ListSet<2> = ListSet::new(16);
            let mut model = [std::collections::VecDeque::new(), std::collections::VecDeque::new()];
            for (op, slot, list) in ops {
                match op {
                    0 | 1 => {
                        for m in model.iter_mut() { m.retain(|&s| s != slot); }
                        model[list].push_back(slot);
                        l.push_back(list, slot);
                    }
                    2 => prop_assert_eq!(l.pop_front(list), model[list].pop_front()),
                    _ => {
                        let was = model.iter().any(|m| m.contains(&slot));
                        for m in model.iter_mut() { m.retain(|&s| s != slot); }
                        prop_assert_eq!(l.remove(slot), was);
                    }
                }
                for (i, m) in model.iter().enumerate() {
                    prop_assert_eq!(l.len(i), m.len());
                    prop_assert_eq!(l.front(i), m.front().copied());
                }
            }
        }
    }
}
