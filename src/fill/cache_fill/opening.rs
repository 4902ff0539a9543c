//! Opening a `FillCore` over its disks, and counting the versions they hold against the
//! budget: at once (tests, tools, the simulator), or a step at a time once the shards serve
//! (`fill::edge::SharedEdge::open_loading`), since hits need the index, not the eviction.

use std::path::Path;

use super::{FillConfig, FillCore, Routed};

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// Opens the cache in `dir` (replays its journal) for `shards` shards.
    pub fn open(dir: &Path, cfg: FillConfig, shards: usize) -> std::io::Result<FillCore<W>> {
        Self::open_watched(dir, cfg, shards, None)
    }

    /// `open`, with the journal and data files written under `watch` (a model of the disk:
    /// the simulator's power-loss crashes).
    pub fn open_watched(
        dir: &Path,
        cfg: FillConfig,
        shards: usize,
        watch: crate::cache::watch::Watch,
    ) -> std::io::Result<FillCore<W>> {
        let opened = crate::cache::disks::open_disks(&[dir.to_path_buf()], true, watch)?;
        Self::on_disks(opened, cfg, shards)
    }

    /// `open`, over the disks `opened` (`cache::disks::open_disks`: each disk's journal
    /// replayed, one line each), every version counted by the eviction.
    pub fn on_disks(
        opened: crate::cache::disks::Opened,
        cfg: FillConfig,
        shards: usize,
    ) -> std::io::Result<FillCore<W>> {
        let mut core = Self::on_disks_uncounted(opened, cfg, shards)?;
        core.count_for_eviction(usize::MAX);
        Ok(core)
    }

    /// `on_disks`, with the versions held not yet counted by the eviction: the caller
    /// counts them (`count_for_eviction`), a step at a time once the shards serve.
    pub fn on_disks_uncounted(
        opened: crate::cache::disks::Opened,
        cfg: FillConfig,
        shards: usize,
    ) -> std::io::Result<FillCore<W>> {
        let crate::cache::disks::Opened {
            store,
            journals: journal,
            index,
            ..
        } = opened;
        let mut core = Self::assemble(cfg, store, Some(journal), index, shards);
        // Start-up is the loader's: a journal mostly dead is rewritten now, in full.
        core.compact_inline_if_due();
        // The eviction's table is sized here, off the lock the shards take.
        if let Some(e) = core.evict.as_mut() {
            e.reserve(core.uncounted.len());
        }
        Ok(core)
    }

    /// Versions held at start-up that the eviction does not count yet.
    pub fn uncounted(&self) -> usize {
        self.uncounted.len()
    }

    /// Counts up to `max_versions` of the versions held at start-up against the budget
    /// (a smaller budget than the disks hold evicts as they are counted); the count left.
    /// Until then a start-up version is never evicted, and the pins taken on it meanwhile
    /// (responses reading it, `pin_until`) are taken over when it is counted.
    pub fn count_for_eviction(&mut self, max_versions: usize) -> usize {
        let Some(e) = self.evict.as_mut() else {
            debug_assert!(self.uncounted.is_empty());
            return 0;
        };
        let mut evicted = Vec::new();
        for _ in 0..max_versions {
            let Some(v) = self.uncounted.pop() else {
                break;
            };
            // Dropped since start-up (retired, purged, found damaged): nothing to count.
            if !self.index.contains(v) {
                continue;
            }
            let bytes = self.index.stored_bytes(v);
            let pins = self.pins.get(&v).copied().unwrap_or(0)
                + u32::from(self.pinned_until.contains_key(&v));
            if pins == 0 {
                e.insert(v, bytes, &mut evicted);
            } else {
                e.insert_pinned(v, bytes, &mut evicted);
                for _ in 1..pins {
                    e.pin(&v);
                }
            }
        }
        if self.uncounted.is_empty() {
            // Its memory back: tens of millions of versions take hundreds of MB.
            self.uncounted = Vec::new();
        }
        self.drop_versions(&evicted, true);
        self.uncounted.len()
    }
}
