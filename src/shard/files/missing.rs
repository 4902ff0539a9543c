//! Recently missing paths: the open-file cache's negative entries (nginx's
//! `open_file_cache_errors on`). A path that just gave 404 or 403 gives it again for
//! `valid_ms` without another `openat2` on the shard thread, so a flood of requests for a
//! missing file costs a hash lookup each.
//!
//! Bounded: at most `capacity` paths, the oldest forgotten first. A file created under a
//! remembered path is served once its entry is `valid_ms` old, the same delay a replaced file
//! takes to show in the positive cache.

use super::OpenError;
use std::collections::{HashMap, VecDeque};

/// Paths remembered as missing per shard.
pub const MISSING_PATHS_MAX: usize = 4096;

/// The negative entries, one map for file and one for directory targets (as `files::Keys`).
pub struct Missing {
    files: HashMap<Box<str>, (OpenError, u64)>,
    dirs: HashMap<Box<str>, (OpenError, u64)>,
    /// Insertion order, each remembered path once: the eviction queue.
    order: VecDeque<(Box<str>, bool)>,
    capacity: usize,
}

impl Missing {
    /// Room for `capacity` paths, allocated now.
    pub fn with_capacity(capacity: usize) -> Missing {
        assert!(capacity > 0);
        Missing {
            files: HashMap::with_capacity(capacity),
            dirs: HashMap::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    fn map(&self, wants_dir: bool) -> &HashMap<Box<str>, (OpenError, u64)> {
        if wants_dir {
            &self.dirs
        } else {
            &self.files
        }
    }

    fn map_mut(&mut self, wants_dir: bool) -> &mut HashMap<Box<str>, (OpenError, u64)> {
        if wants_dir {
            &mut self.dirs
        } else {
            &mut self.files
        }
    }

    /// The error `rel` gave less than `valid_ms` ago, if any.
    pub fn get(&self, rel: &str, wants_dir: bool, now_ms: u64, valid_ms: u64) -> Option<OpenError> {
        let &(error, at_ms) = self.map(wants_dir).get(rel)?;
        (now_ms.saturating_sub(at_ms) < valid_ms).then_some(error)
    }

    /// Remembers that `rel` gave `error` at `now_ms` (only a 404 or 403: what the file system
    /// says, not a full cache or an I/O error).
    pub fn insert(&mut self, rel: &str, wants_dir: bool, error: OpenError, now_ms: u64) {
        if !matches!(error, OpenError::NotFound | OpenError::Forbidden) {
            return;
        }
        if let Some(entry) = self.map_mut(wants_dir).get_mut(rel) {
            *entry = (error, now_ms);
            return;
        }
        if self.order.len() == self.capacity {
            if let Some((old, old_dir)) = self.order.pop_front() {
                self.map_mut(old_dir).remove(&old);
            }
        }
        self.map_mut(wants_dir).insert(rel.into(), (error, now_ms));
        self.order.push_back((rel.into(), wants_dir));
        debug_assert_eq!(self.order.len(), self.files.len() + self.dirs.len());
    }

    /// Paths remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Nothing remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_path_is_remembered_for_valid_ms() {
        let mut m = Missing::with_capacity(4);
        m.insert("a", false, OpenError::NotFound, 1000);
        assert_eq!(m.get("a", false, 1000, 500), Some(OpenError::NotFound));
        assert_eq!(m.get("a", false, 1499, 500), Some(OpenError::NotFound));
        assert_eq!(m.get("a", false, 1500, 500), None, "expired");
        assert_eq!(m.get("a", true, 1000, 500), None, "a/ is another target");
        assert_eq!(
            m.get("a", false, 1000, 0),
            None,
            "valid_ms 0 caches nothing"
        );
        m.insert("a", false, OpenError::Forbidden, 1500);
        assert_eq!(m.get("a", false, 1600, 500), Some(OpenError::Forbidden));
        assert_eq!(m.len(), 1, "a refresh does not queue the path twice");
    }

    #[test]
    fn only_file_system_answers_are_remembered() {
        let mut m = Missing::with_capacity(4);
        m.insert("busy", false, OpenError::Busy, 0);
        m.insert("eio", false, OpenError::Other(libc::EIO), 0);
        assert!(m.is_empty());
    }

    #[test]
    fn the_oldest_path_goes_when_full() {
        let mut m = Missing::with_capacity(3);
        for (i, p) in ["a", "b", "c", "d"].iter().enumerate() {
            m.insert(p, i % 2 == 1, OpenError::NotFound, 10);
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("a", false, 10, 100), None, "evicted");
        assert_eq!(m.get("b", true, 10, 100), Some(OpenError::NotFound));
        assert_eq!(m.get("d", true, 10, 100), Some(OpenError::NotFound));
    }
}
