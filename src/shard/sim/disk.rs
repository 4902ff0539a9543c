//! The simulator's disk under the cache: what was written is kept apart from what is durable,
//! and a power loss (`PowerDisk::crash`) keeps only what a real disk would have to keep.
//!
//! Every write, sync, create, rename and unlink of the cache's files is told to the model
//! (`cache::watch::DiskWatch`; the ring's block writes and fsyncs by `SimRing`). The files
//! themselves are written as usual, so reads during the run see what a page cache would. At a
//! crash each write since its file's last sync is, by the seed's draw, kept, dropped, or torn:
//! only some of its 512-byte sectors reach the disk. Draws are independent, so a later write
//! may survive an earlier one (reordering). A create, rename or unlink whose directory was not
//! synced since may be undone. `materialize` then writes that image over the cache directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::rng::Rng;
use crate::cache::watch::DiskWatch;

/// The unit a torn write is cut at: a logical sector.
pub const SECTOR_BYTES: u64 = 512;

/// Share of unsynced writes a crash keeps whole, and drops whole (the rest are torn).
const KEEP_PERCENT: u64 = 40;
const DROP_PERCENT: u64 = 40;

/// A change to a file's bytes not yet synced.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

/// Whether a file's directory entry is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// On the disk.
    Durable,
    /// Created since its directory's last sync: a crash may lose it.
    Created,
    /// Renamed over `to` since the directory's last sync: a crash may undo it (`to` then has
    /// what it had before, and this name comes back).
    RenamedFrom {
        from: PathBuf,
        before: Option<Box<FileModel>>,
    },
    /// Unlinked since the directory's last sync: a crash may bring it back.
    Removed,
}

/// One file as the disk knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileModel {
    /// Its bytes as of its last sync.
    durable: Vec<u8>,
    /// Changes since, in order.
    pending: Vec<Pending>,
    entry: Entry,
}

impl FileModel {
    fn new(entry: Entry) -> FileModel {
        FileModel {
            durable: Vec::new(),
            pending: Vec::new(),
            entry,
        }
    }

    /// What a read sees now: the durable bytes with every pending change.
    fn visible(&self) -> Vec<u8> {
        let mut bytes = self.durable.clone();
        for p in &self.pending {
            apply(&mut bytes, p, None);
        }
        bytes
    }

    /// What survives a crash: each pending change kept, dropped or torn by `rng`.
    fn after_crash(&self, rng: &mut Rng, torn: &mut u64) -> Vec<u8> {
        let mut bytes = self.durable.clone();
        for p in &self.pending {
            let roll = rng.below(100);
            if roll < KEEP_PERCENT {
                apply(&mut bytes, p, None);
            } else if roll >= KEEP_PERCENT + DROP_PERCENT {
                *torn += 1;
                apply(&mut bytes, p, Some(rng));
            }
        }
        bytes
    }
}

/// Applies `change` to `bytes`; with `tear`, a write keeps only a random subset of its sectors
/// (a cut at a sector boundary, or sectors out of order).
fn apply(bytes: &mut Vec<u8>, change: &Pending, tear: Option<&mut Rng>) {
    match change {
        Pending::SetLen(len) => bytes.resize(*len as usize, 0),
        Pending::Write {
            offset,
            bytes: data,
        } => {
            let end = *offset as usize + data.len();
            if tear.is_none() && bytes.len() == *offset as usize {
                // Appended (the common case): one copy, not a resize and a copy.
                bytes.extend_from_slice(data);
                return;
            }
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            match tear {
                None => bytes[*offset as usize..end].copy_from_slice(data),
                Some(rng) => {
                    let mut at = *offset;
                    while at < end as u64 {
                        let next = ((at / SECTOR_BYTES + 1) * SECTOR_BYTES).min(end as u64);
                        if rng.chance(50) {
                            let (a, b) = (at as usize, next as usize);
                            let from = a - *offset as usize;
                            bytes[a..b].copy_from_slice(&data[from..from + (b - a)]);
                        }
                        at = next;
                    }
                }
            }
        }
    }
}

/// What a crash left: each file's bytes, or None where it is gone.
pub type CrashImage = HashMap<PathBuf, Option<Vec<u8>>>;

/// The model (see the module doc).
#[derive(Debug, Default)]
pub struct PowerDisk {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<PathBuf, FileModel>,
    /// Events told so far.
    events: u64,
    /// The power goes as this event is told (it never reaches the disk), drawn with `rng`.
    crash_at: Option<(u64, Rng)>,
    /// What the crash left; once set the model hears nothing more.
    crashed: Option<(CrashImage, CrashStats)>,
}

/// What a crash did, for the run's summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CrashStats {
    /// Writes not synced when the power went.
    pub unsynced_writes: u64,
    /// Of them, torn at a sector boundary.
    pub torn_writes: u64,
    /// Creates, renames and unlinks whose directory was not synced.
    pub unsynced_entries: u64,
}

impl PowerDisk {
    /// A disk whose power goes as its `event`-th write, sync, create, rename or unlink is
    /// told (that one never happens), with what survives drawn from `rng`.
    pub fn crashing_at(event: u64, rng: Rng) -> PowerDisk {
        let disk = PowerDisk::default();
        disk.state().crash_at = Some((event, rng));
        disk
    }

    /// A disk holding `image` (what a crash left), all of it durable.
    pub fn holding(image: &CrashImage) -> PowerDisk {
        let disk = PowerDisk::default();
        disk.with(|files| {
            for (path, bytes) in image {
                if let Some(bytes) = bytes {
                    let mut m = FileModel::new(Entry::Durable);
                    m.durable = bytes.clone();
                    files.insert(path.clone(), m);
                }
            }
        });
        disk
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<PathBuf, FileModel>) -> T) -> T {
        f(&mut self.state().files)
    }

    /// Counts an event about to be recorded; false when the power is off (it never happens).
    fn powered(&self) -> bool {
        let mut st = self.state();
        if st.crashed.is_some() {
            return false;
        }
        st.events += 1;
        let due = st.crash_at.as_ref().is_some_and(|(at, _)| st.events >= *at);
        if due {
            let (_, mut rng) = st.crash_at.take().expect("due");
            let crashed = crash_files(&st.files, &mut rng);
            st.crashed = Some(crashed);
            return false;
        }
        true
    }

    /// The power went.
    pub fn has_crashed(&self) -> bool {
        self.state().crashed.is_some()
    }

    /// Events told so far.
    pub fn events(&self) -> u64 {
        self.state().events
    }

    /// What the crash left, once the power went (`crashing_at`).
    pub fn crashed(&self) -> Option<(CrashImage, CrashStats)> {
        self.state().crashed.clone()
    }

    fn change(&self, path: &Path, change: Pending) {
        self.with(|files| {
            files
                .entry(path.to_path_buf())
                .or_insert_with(|| FileModel::new(Entry::Durable))
                .pending
                .push(change)
        });
    }

    /// Checks that the model saw every change: each file it knows reads on disk as it says,
    /// and the cache directory holds no file it does not know. `Err` names the first miss.
    pub fn check_complete(&self, dir: &Path) -> Result<(), String> {
        let on_disk = list_files(dir).map_err(|e| format!("listing {}: {e}", dir.display()))?;
        self.with(|files| {
            for path in &on_disk {
                // A disk's lock file holds no cache state (the holder's pid, unsynced).
                if path.file_name() == Some(crate::cache::disk_lock::LOCK_FILE.as_ref()) {
                    continue;
                }
                let Some(model) = files.get(path).filter(|m| m.entry != Entry::Removed) else {
                    return Err(format!(
                        "{} is on disk but the model never saw it",
                        path.display()
                    ));
                };
                let real = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                if real != model.visible() {
                    return Err(format!(
                        "{}: {} bytes on disk, the model has {} (a write it was not told of)",
                        path.display(),
                        real.len(),
                        model.visible().len()
                    ));
                }
            }
            for (path, model) in files.iter() {
                if model.entry != Entry::Removed && !on_disk.contains(path) {
                    return Err(format!("{} is gone but the model has it", path.display()));
                }
            }
            Ok(())
        })
    }

    /// The power goes now: what the disk keeps, drawn from `rng`.
    pub fn crash(&self, rng: &mut Rng) -> (CrashImage, CrashStats) {
        let mut st = self.state();
        let crashed = crash_files(&st.files, rng);
        st.crashed = Some(crashed.clone());
        crashed
    }
}

/// What of `files` a crash keeps, drawn from `rng`.
fn crash_files(files: &HashMap<PathBuf, FileModel>, rng: &mut Rng) -> (CrashImage, CrashStats) {
    let mut stats = CrashStats::default();
    let mut image = CrashImage::new();
    {
        {
            // In path order, so a seed draws the same way each time.
            let mut paths: Vec<&PathBuf> = files.keys().collect();
            paths.sort();
            for path in paths {
                let model = &files[path];
                stats.unsynced_writes += model.pending.len() as u64;
                let bytes = model.after_crash(rng, &mut stats.torn_writes);
                let kept = match &model.entry {
                    Entry::Durable => Some(bytes),
                    Entry::Created => {
                        stats.unsynced_entries += 1;
                        rng.chance(50).then_some(bytes)
                    }
                    Entry::Removed => {
                        stats.unsynced_entries += 1;
                        rng.chance(50).then_some(bytes)
                    }
                    Entry::RenamedFrom { from, before } => {
                        stats.unsynced_entries += 1;
                        if rng.chance(50) {
                            Some(bytes)
                        } else {
                            // Undone: the old name has these bytes, this one its old ones.
                            image.insert(from.clone(), Some(bytes));
                            before
                                .as_ref()
                                .map(|b| b.after_crash(rng, &mut stats.torn_writes))
                        }
                    }
                };
                image.entry(path.clone()).or_insert(kept);
            }
        }
    }
    (image, stats)
}

impl DiskWatch for PowerDisk {
    fn created(&self, path: &Path) {
        if !self.powered() {
            return;
        }
        self.with(|files| match files.get(path) {
            // Opened with O_CREAT but already there (a version id used again after a crash
            // lost its records): its bytes and entry stay as they were.
            Some(m) if m.entry != Entry::Removed => {}
            _ => {
                files.insert(path.to_path_buf(), FileModel::new(Entry::Created));
            }
        });
    }

    fn wrote(&self, path: &Path, offset: u64, bytes: &[u8]) {
        if !self.powered() {
            return;
        }
        self.change(
            path,
            Pending::Write {
                offset,
                bytes: bytes.to_vec(),
            },
        );
    }

    fn set_len(&self, path: &Path, len: u64) {
        if !self.powered() {
            return;
        }
        self.change(path, Pending::SetLen(len));
    }

    fn synced(&self, path: &Path) {
        if !self.powered() {
            return;
        }
        self.with(|files| {
            if let Some(m) = files.get_mut(path) {
                for p in std::mem::take(&mut m.pending) {
                    apply(&mut m.durable, &p, None);
                }
            }
        });
    }

    fn renamed(&self, from: &Path, to: &Path) {
        if !self.powered() {
            return;
        }
        self.with(|files| {
            let Some(mut moved) = files.remove(from) else {
                return;
            };
            let before = files.remove(to).map(Box::new);
            moved.entry = Entry::RenamedFrom {
                from: from.to_path_buf(),
                before,
            };
            files.insert(to.to_path_buf(), moved);
        });
    }

    fn removed(&self, path: &Path) {
        if !self.powered() {
            return;
        }
        self.with(|files| match files.get_mut(path) {
            // Never durable: nothing comes back.
            Some(m) if m.entry == Entry::Created => {
                files.remove(path);
            }
            Some(m) => m.entry = Entry::Removed,
            None => {}
        });
    }

    fn dir_synced(&self, dir: &Path) {
        if !self.powered() {
            return;
        }
        self.with(|files| {
            files.retain(|path, m| {
                if path.parent() != Some(dir) {
                    return true;
                }
                match m.entry {
                    Entry::Removed => false,
                    _ => {
                        m.entry = Entry::Durable;
                        true
                    }
                }
            })
        });
    }
}

/// Every file under `dir` (recursively).
fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                dirs.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Writes `image` over the files under `dir`: each file as the crash left it, and every
/// other file gone.
pub fn materialize(dir: &Path, image: &CrashImage) -> std::io::Result<()> {
    for path in list_files(dir)? {
        if !matches!(image.get(&path), Some(Some(_))) {
            std::fs::remove_file(&path)?;
        }
    }
    for (path, bytes) in image {
        if let Some(bytes) = bytes {
            std::fs::write(path, bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synced write always survives; an unsynced one survives whole, not at all, or in
    /// whole sectors; an unsynced create may vanish.
    #[test]
    fn a_crash_keeps_what_was_synced_and_tears_the_rest_at_sectors() {
        let dir = Path::new("/model/d");
        let path = dir.join("f");
        let mut seen_torn = false;
        let mut seen_vanished = false;
        for seed in 0..200 {
            let disk = PowerDisk::default();
            disk.created(&path);
            disk.wrote(&path, 0, &[1u8; 1024]);
            disk.synced(&path);
            disk.dir_synced(dir);
            disk.wrote(&path, 1024, &[2u8; 1024]);
            let other = dir.join("g");
            disk.created(&other);
            let (image, stats) = disk.crash(&mut Rng::new(seed));
            assert_eq!(stats.unsynced_writes, 1);
            let bytes = image[&path].as_ref().expect("a durable file stays");
            assert!(bytes[..1024].iter().all(|&b| b == 1), "synced bytes kept");
            for sector in bytes[1024..].chunks(SECTOR_BYTES as usize) {
                let whole = sector.iter().all(|&b| b == 2) || sector.iter().all(|&b| b == 0);
                assert!(whole, "seed {seed}: a sector is all or nothing");
            }
            seen_torn |= stats.torn_writes == 1;
            seen_vanished |= image[&other].is_none();
        }
        assert!(seen_torn && seen_vanished);
    }

    /// An unsynced rename is either done or undone, never half.
    #[test]
    fn an_unsynced_rename_is_done_or_undone() {
        let dir = Path::new("/model/d");
        let (old, new) = (dir.join("journal"), dir.join("journal.compact"));
        let mut outcomes = std::collections::HashSet::new();
        for seed in 0..100 {
            let disk = PowerDisk::default();
            disk.created(&old);
            disk.wrote(&old, 0, b"old");
            disk.synced(&old);
            disk.created(&new);
            disk.wrote(&new, 0, b"new");
            disk.synced(&new);
            disk.dir_synced(dir);
            disk.renamed(&new, &old);
            let (image, _) = disk.crash(&mut Rng::new(seed));
            let o = image[&old].clone().unwrap();
            match o.as_slice() {
                b"new" => assert_eq!(image.get(&new), None),
                b"old" => assert_eq!(image[&new].as_deref(), Some(&b"new"[..])),
                other => panic!("seed {seed}: {other:?}"),
            }
            outcomes.insert(o);
        }
        assert_eq!(outcomes.len(), 2);
    }
}
