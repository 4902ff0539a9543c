//! What the cache does to its files that decides what survives a power loss, told as it
//! happens to a model of the disk (the simulator's `shard::sim::disk`), which keeps what is
//! written apart from what is durable and, at a simulated crash, drops, tears or reorders
//! what was not synced. The server runs with no watch: the real disk needs no one told.
//!
//! Every call comes after the operation succeeded, from whichever thread did it.

use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// A model of the disk under the cache's files (see the module doc).
pub trait DiskWatch: Send + Sync + Debug {
    /// `path` was created (its directory entry is durable once its directory is synced).
    fn created(&self, path: &Path);
    /// `bytes` were written to `path` at `offset` (durable once `path` is synced).
    fn wrote(&self, path: &Path, offset: u64, bytes: &[u8]);
    /// `path` was cut (or grown) to `len` bytes.
    fn set_len(&self, path: &Path, len: u64);
    /// `path`'s data reached the disk (fdatasync): every write before it is durable.
    fn synced(&self, path: &Path);
    /// `from` was renamed over `to` (durable once their directory is synced).
    fn renamed(&self, from: &Path, to: &Path);
    /// `path` was unlinked (for good once its directory is synced).
    fn removed(&self, path: &Path);
    /// Directory `dir` was synced: creates, renames and unlinks in it are durable.
    fn dir_synced(&self, dir: &Path);
}

/// The watch a cache's files are written under (None: the real disk, no model).
pub type Watch = Option<Arc<dyn DiskWatch>>;

/// Syncs directory `dir` (so the entries created, renamed or removed in it survive a power
/// loss) and tells `watch`.
pub fn sync_dir(dir: &Path, watch: &Watch) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    if let Some(w) = watch {
        w.dir_synced(dir);
    }
    Ok(())
}
