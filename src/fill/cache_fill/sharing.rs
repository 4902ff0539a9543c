//! How the shards share a `FillCore`: inline (tests, tools, the simulator), or, in the server,
//! in place of a loading core once the disks are loaded (`fill::edge::SharedEdge::open_loading`),
//! its I/O on the cache's I/O thread.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::cache_io::{self, IoShared};
use super::{FillConfig, FillCore, Routed, Signals};
use crate::cache::index::Index;
use crate::cache::store::BlockStore;

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// The core of a cache on `dirs` whose disks are still loading
    /// (`fill::edge::SharedEdge::open_loading`): no disk open, an empty index, and every
    /// request answered `Outcome::Loading` (its own fetch, unstored) until the loaded core
    /// takes its place (`install_threaded`).
    pub fn loading(dirs: &[PathBuf], cfg: FillConfig, shards: usize) -> FillCore<W> {
        let store = BlockStore::not_open(dirs);
        let mut core = Self::assemble(cfg, store, None, Index::default(), shards);
        core.loading = true;
        core
    }

    /// Whether this is a loading cache's core (`loading`).
    pub fn is_loading(&self) -> bool {
        self.loading
    }

    /// This core shared by the shards, its journal written by whichever thread queues a
    /// record (inline: tests, tools and the simulator).
    pub fn into_shared(self) -> Arc<Mutex<FillCore<W>>> {
        Arc::new(Mutex::new(self))
    }

    /// This core in the place of the loading core `target` holds (`loading`), its blocking
    /// I/O on the cache's I/O thread (`cache_io`), which writes `wakers[shard]` when a shard
    /// has news. The shards' handles take this core's store and signals at their next hold
    /// of the lock, and each shard is woken for it.
    pub fn install_threaded(
        mut self,
        target: &Arc<Mutex<FillCore<W>>>,
        wakers: Arc<Vec<OwnedFd>>,
    ) -> std::io::Result<()> {
        let journal = self.journal.take().expect("opened inline");
        let io = Arc::new(IoShared::new()?);
        let shards = self.notices.len();
        self.signals = Arc::new(Signals::new(shards, Some(wakers.clone()), Some(io.clone())));
        let store = self.store.clone();
        // Started first: until the swap, it sees the loading core, which has nothing to write.
        cache_io::spawn(Arc::downgrade(target), journal, store, io, wakers.clone())?;
        {
            let mut core = target
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            assert!(core.loading, "installed over a loaded core");
            // Said under the lock: a shard that holds it next sees the new core and, through
            // its old signals, that it must take the new store and signals first.
            core.signals.replaced.store(true, Ordering::Release);
            *core = self;
        }
        for fd in wakers.iter() {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
        Ok(())
    }
}

impl Signals {
    /// Whether the core these signals are of was replaced by the loaded one.
    pub(super) fn replaced(&self) -> bool {
        self.replaced.load(Ordering::Acquire)
    }
}
