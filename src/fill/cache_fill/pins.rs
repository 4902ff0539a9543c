//! Pins against eviction (`shardline cache prefill --pin-until`, `POST /cache/pin`): a
//! version pinned until a time is never evicted before it. In memory only: a restart keeps
//! the objects, not the pins.

use super::{FillCore, Routed};

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// Pins `key`'s current version against eviction until `until_unix_s` (a later time
    /// than a pin it has extends it). False when the key has no version yet.
    pub fn pin_until(&mut self, key: &[u8], until_unix_s: u64) -> bool {
        let Some(v) = self.index.current_version(key) else {
            return false;
        };
        match self.pinned_until.entry(v) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let t = o.get_mut();
                *t = (*t).max(until_unix_s);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if let Some(ev) = self.evict.as_mut() {
                    ev.pin(&v);
                }
                e.insert(until_unix_s);
            }
        }
        true
    }

    /// Versions pinned until a time now past become evictable again.
    pub(super) fn release_expired_pins(&mut self, now_unix_s: u64) {
        if self.pinned_until.is_empty() {
            return;
        }
        let expired: Vec<u64> = self
            .pinned_until
            .iter()
            .filter(|&(_, &until)| until <= now_unix_s)
            .map(|(&v, _)| v)
            .collect();
        for v in expired {
            self.pinned_until.remove(&v);
            if let Some(ev) = self.evict.as_mut() {
                ev.unpin(&v);
            }
        }
    }
}
