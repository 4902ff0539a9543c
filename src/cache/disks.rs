//! Several cache disks, each its own failure domain (issue 43). Each disk (a directory of
//! `cache_dirs`, one file system per drive) holds its own journal (`dir/journal`), its own
//! data files (`dir/data/`) and a stable id written on it at first use (`dir/disk-id`), so it
//! can be dropped, replaced or reformatted alone. At start-up each disk's journal is replayed
//! on its own (its versions moved to its slot: `version_id`) and the disks' indexes joined into
//! the one index the fill keeps; a disk that cannot be opened is left out with one warning
//! line, and the others serve (`cache_require_all_disks` makes it fatal instead). New objects
//! go to a disk by `placement` over the ids, weighted by capacity. A batch of records is
//! split by disk (`Journals`): each disk's share is appended and synced on a thread of its
//! own, so the disks' syncs run side by side.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::disk_health::unix_now_s;
use super::disk_health::{DiskHealth, DiskOp};
use super::disk_lock::{DiskLock, LockIdentity};
use super::disk_worker::{self, DiskWorker, Job};
use super::failed_disks;
use super::index::Index;
use super::journal::{Decoded, Record, ReplayStats};
use super::journal_file::JournalFile;
use super::load_progress::LoadProgress;
use super::placement::Placement;
use super::store::BlockStore;
use super::version_id::{record_version, slot_of};
use super::watch::{sync_dir, Watch};

/// The file a disk's id is written in, beside its journal.
pub const DISK_ID_FILE: &str = "disk-id";
/// The marker a disk the operator took offline carries (kept across restarts, by the disk
/// itself: wherever it is mounted, it comes up offline).
pub const OFFLINE_FILE: &str = "disk-offline";
/// `cache_disk_op_timeout_ms` when nothing sets it.
pub const DEFAULT_DISK_OP_TIMEOUT_MS: u64 = crate::config::DEFAULT_DISK_OP_TIMEOUT_MS;
/// Most disks one cache spreads over (`cache_dirs`); a version id's slot has room for 256.
pub const MAX_CACHE_DISKS: usize = crate::config::MAX_CACHE_DISKS;
const _: () = assert!(MAX_CACHE_DISKS <= 1 << (64 - super::version_id::SLOT_SHIFT));

/// One disk the cache opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// Its directory (an entry of `cache_dirs`).
    pub dir: PathBuf,
    /// Its id, written on it at first use.
    pub id: u64,
    /// Its file system's size (the weight of its share of new objects).
    pub capacity_bytes: u64,
}

/// A disk of the configuration that could not be opened, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingDisk {
    /// Its directory.
    pub dir: PathBuf,
    /// What opening it said.
    pub error: String,
}

/// What an operator is shown of the disks (`/metrics`, the admin's status): those opened,
/// those left out at start-up, and each one's health.
#[derive(Debug)]
pub struct DiskReport {
    /// The disks opened (index = slot).
    pub disks: Vec<Disk>,
    /// The disks left out at start-up.
    pub missing: Vec<MissingDisk>,
    /// Each opened disk's errors and state.
    pub health: std::sync::Arc<DiskHealth>,
}

/// A cache's start-up load as `/healthz` and `/metrics` see it: how far it is, and the disks
/// it opened once it is done (`fill::edge::SharedEdge::open_loading`).
#[derive(Debug, Default)]
pub struct DiskLoad {
    /// How far it is.
    pub progress: LoadProgress,
    report: std::sync::OnceLock<Arc<DiskReport>>,
}

impl DiskLoad {
    /// Marks the load done: with the disks `report` opened, or failed (None).
    pub fn finish(&self, report: Option<Arc<DiskReport>>) {
        let ready = report.is_some();
        if let Some(r) = report {
            let _ = self.report.set(r);
        }
        self.progress.finish(ready);
    }

    /// The disks opened (None until the load is done).
    pub fn disks(&self) -> Option<&Arc<DiskReport>> {
        self.report.get().filter(|_| self.progress.ready())
    }
}

impl DiskReport {
    /// The report of `opened`.
    pub fn of(opened: &Opened) -> DiskReport {
        DiskReport {
            disks: opened.disks.clone(),
            missing: opened.missing.clone(),
            health: opened.store.health().clone(),
        }
    }

    /// Bytes used on disk `slot`'s file system now (None: it cannot be asked).
    pub fn used_bytes(&self, slot: usize) -> Option<u64> {
        let d = self.disks.get(slot)?;
        let s = rustix::fs::statvfs(&d.dir).ok()?;
        Some(
            s.f_blocks
                .saturating_sub(s.f_bfree)
                .saturating_mul(s.f_frsize),
        )
    }
}

/// The disks opened: the data files, the journals and the joined index.
#[derive(Debug)]
pub struct Opened {
    /// The data files of every disk opened.
    pub store: BlockStore,
    /// Each disk's journal.
    pub journals: Journals,
    /// Every disk's versions, in one index.
    pub index: Index,
    /// The disks opened (index = slot).
    pub disks: Vec<Disk>,
    /// The disks left out.
    pub missing: Vec<MissingDisk>,
}

/// Opens the disks `dirs` (replaying each journal). A disk that cannot be opened (missing,
/// unreadable, a journal that does not read, the id of a disk already opened) is left out with
/// a warning line, unless `require_all`, when it is an error; so is having no disk at all.
pub fn open_disks(dirs: &[PathBuf], require_all: bool, watch: Watch) -> io::Result<Opened> {
    open_disks_with(dirs, require_all, watch, Vec::new(), None)
}

/// `open_disks`, with `locks[i]` the lock of `dirs[i]` when it was taken already
/// (`wait_for_locks`; a disk without one takes it now, and one another process holds is
/// left out or an error), counting the replay in `progress`.
pub fn open_disks_with(
    dirs: &[PathBuf],
    require_all: bool,
    watch: Watch,
    mut locks: Vec<Option<DiskLock>>,
    progress: Option<&LoadProgress>,
) -> io::Result<Opened> {
    locks.resize_with(dirs.len(), || None);
    if dirs.is_empty() || dirs.len() > MAX_CACHE_DISKS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("1 to {MAX_CACHE_DISKS} cache disks"),
        ));
    }
    let mut disks: Vec<Disk> = Vec::with_capacity(dirs.len());
    let mut journals = Vec::with_capacity(dirs.len());
    let mut locks_held = Vec::with_capacity(dirs.len());
    let mut index: Option<Index> = None;
    let mut missing = Vec::new();
    // The journals replay side by side, a thread each: several drives load in about the time
    // of the largest. Under a watch (the simulator's disk model) they open in order, so that
    // its events repeat.
    let mut side_by_side = if watch.is_none() && dirs.len() > 1 {
        open_side_by_side(dirs, &mut locks, progress)
    } else {
        Vec::new()
    };
    let versions: usize = side_by_side
        .iter()
        .flatten()
        .flatten()
        .map(|d| d.2.versions())
        .sum();
    for (at, dir) in dirs.iter().enumerate() {
        let slot = journals.len();
        // A disk is on the slot of its place while every disk before it opened; after one that
        // did not, it opens again here, on its slot.
        let opened = side_by_side.get_mut(at).and_then(Option::take);
        let opened = opened.filter(|_| slot == at);
        let opened =
            opened.unwrap_or_else(|| open_disk(dir, slot, &watch, locks[at].take(), progress, 0));
        let opened = opened.and_then(|d| match disks.iter().find(|o| o.id == d.0.id) {
            Some(o) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("the same disk id as {}", o.dir.display()),
            )),
            None => Ok(d),
        });
        match opened {
            Ok((disk, journal, mut disk_index, lock)) => {
                match index.as_mut() {
                    None => {
                        // Room for the other disks' versions, at once.
                        disk_index.reserve(versions.saturating_sub(disk_index.versions()));
                        index = Some(disk_index);
                    }
                    Some(all) => all.join(disk_index),
                }
                disks.push(disk);
                journals.push(journal);
                locks_held.push(lock);
            }
            Err(e) if require_all => {
                return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display())));
            }
            Err(e) => {
                tracing::warn!(
                    disk = %dir.display(),
                    error = %e,
                    "cache disk left out: serving from the other disks"
                );
                missing.push(MissingDisk {
                    dir: dir.clone(),
                    error: e.to_string(),
                });
            }
        }
    }
    let Some(mut index) = index else {
        return Err(io::Error::other("no cache disk could be opened"));
    };
    // The first disk's tables were sized for every journal (`open_side_by_side`).
    index.shrink_to_fit();
    let placement = Placement::new(
        &disks
            .iter()
            .map(|d| (d.id, d.capacity_bytes))
            .collect::<Vec<_>>(),
    );
    let roots: Vec<PathBuf> = disks.iter().map(|d| d.dir.clone()).collect();
    let store = BlockStore::on_disks(&roots, placement, watch)?;
    for (slot, d) in disks.iter().enumerate() {
        if d.dir.join(OFFLINE_FILE).exists() {
            store.health().set_offline(slot);
            tracing::warn!(
                disk = %d.dir.display(),
                "cache disk offline (the operator's word, kept on the disk): its objects are \
                 misses until `shardline cache disk online`"
            );
        }
    }
    // The disks that failed before this start, as the others remember them.
    let failed = failed_disks::read_listed(disks.iter().map(|d| d.dir.as_path()));
    for (slot, d) in disks.iter().enumerate() {
        if failed.contains(&d.id) && store.health().usable(slot) {
            store.health().set_failing(slot);
            tracing::warn!(
                disk = %d.dir.display(),
                "cache disk failed before this start (the other disks say so): its objects are \
                 misses until `shardline cache disk online`"
            );
        }
    }
    let workers = journals
        .into_iter()
        .enumerate()
        .map(|(slot, j)| DiskWorker::spawn(slot, j, store.health().clone()))
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Opened {
        journals: Journals {
            workers,
            locks: locks_held,
            retired: Vec::new(),
            ids: disks.iter().map(|d| (d.id, d.dir.clone())).collect(),
            // Written again at the first look, so every disk carries the whole list.
            written: failed.is_empty().then(BTreeSet::new),
            failed,
            health: store.health().clone(),
            store: store.clone(),
            op_timeout: Duration::from_millis(DEFAULT_DISK_OP_TIMEOUT_MS),
        },
        store,
        index,
        disks,
        missing,
    })
}

/// A disk opened: what it is, its journal, and its versions.
type OpenedDisk = (Disk, JournalFile, Index, DiskLock);

/// Opens each of `dirs` on the slot of its place, each on a thread of its own. None for a
/// disk whose thread could not start (it opens in order instead).
fn open_side_by_side(
    dirs: &[PathBuf],
    locks: &mut [Option<DiskLock>],
    progress: Option<&LoadProgress>,
) -> Vec<Option<io::Result<OpenedDisk>>> {
    // The first disk's index takes the others' in (`Index::join`): its tables are sized for
    // every journal at once, so none is grown, nor shrunk and grown again, on the way.
    // (Two disks of 5 million objects: the first one's tables shrunk after its replay, then
    // grown for the second's, were 7 % of the load's samples, rehashing on one thread.)
    let journal_bytes =
        |dir: &PathBuf| std::fs::metadata(dir.join("journal")).map_or(0, |m| m.len());
    let others_bytes: u64 = dirs.iter().skip(1).map(journal_bytes).sum();
    std::thread::scope(|scope| {
        let threads: Vec<_> = dirs
            .iter()
            .zip(locks.iter_mut())
            .enumerate()
            .map(|(slot, (dir, lock))| {
                let lock = lock.take();
                let joins_bytes = if slot == 0 { others_bytes } else { 0 };
                std::thread::Builder::new()
                    .name(format!("cache-replay-{slot}"))
                    .spawn_scoped(scope, move || {
                        open_disk(dir, slot, &None, lock, progress, joins_bytes)
                    })
                    .ok()
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                // A replay that panicked panics here, as it would have in order.
                t.map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            })
            .collect()
    })
}

/// Opens one disk: its id (written now on a blank one), its data directory, its journal
/// replayed (its versions moved to `slot`) into an index with room for `joins_bytes` of
/// other journals besides (`JournalFile::open_counted`).
fn open_disk(
    dir: &Path,
    slot: usize,
    watch: &Watch,
    lock: Option<DiskLock>,
    progress: Option<&LoadProgress>,
    joins_bytes: u64,
) -> io::Result<OpenedDisk> {
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    // Before anything on the disk is read or written: another process may be using it.
    let lock = match lock {
        Some(lock) => lock,
        None => DiskLock::try_take(dir)?,
    };
    let id = disk_id(dir, watch)?;
    let (journal, index, replayed) = JournalFile::open_counted(
        &dir.join("journal"),
        watch.clone(),
        Some(slot),
        progress,
        joins_bytes,
    )?;
    log_recovered(dir, id, &journal, &index, &replayed);
    let capacity_bytes = rustix::fs::statvfs(dir)
        .map(|s| s.f_blocks.saturating_mul(s.f_frsize))
        .unwrap_or(0);
    Ok((
        Disk {
            dir: dir.to_path_buf(),
            id,
            capacity_bytes,
        },
        journal,
        index,
        lock,
    ))
}

/// One line per disk: what came back, and anything dropped and why.
fn log_recovered(
    dir: &Path,
    id: u64,
    journal: &JournalFile,
    index: &Index,
    replayed: &ReplayStats,
) {
    let blocks = index.blocks_held();
    tracing::info!(
        dir = %dir.display(),
        disk_id = %format!("{id:016x}"),
        objects = index.keys(),
        versions = index.versions(),
        blocks,
        journal_bytes = journal.len(),
        records = replayed.records,
        skipped = replayed.skipped,
        refused = replayed.refused,
        first_refusal = %replayed.first_refusal.map_or(String::new(), |w| w.to_string()),
        torn_tail = replayed.damaged_tail,
        "cache index recovered"
    );
}

/// The id written on `dir` (16 hex digits), written now if there is none: a random number,
/// written beside and renamed into place, so a crash leaves either no id or a whole one.
pub fn disk_id(dir: &Path, watch: &Watch) -> io::Result<u64> {
    let path = dir.join(DISK_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return u64::from_str_radix(text.trim(), 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not 16 hex digits", path.display()),
                )
            })
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let id = u64::from_ne_bytes(bytes);
    write_id(dir, id, watch)?;
    Ok(id)
}

/// Writes `id` as `dir`'s disk id: beside and renamed into place, then the directory synced.
fn write_id(dir: &Path, id: u64, watch: &Watch) -> io::Result<()> {
    let path = dir.join(DISK_ID_FILE);
    let text = format!("{id:016x}\n");
    let tmp = dir.join(format!("{DISK_ID_FILE}.new"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, &path)?;
    if let Some(w) = watch {
        w.created(&tmp);
        w.wrote(&tmp, 0, text.as_bytes());
        w.synced(&tmp);
        w.renamed(&tmp, &path);
    }
    sync_dir(dir, watch)
}

/// Reopens the disk of slot `slot` at `dir` to bring it online while serving (`shardline
/// cache disk online`): the disk opened at start-up (its id is `id`), or a blank replacement
/// mounted in its place, which is given `id`, so it takes exactly the old disk's share of new
/// objects and no other disk's objects move. Its data directory is made and its journal
/// opened at its end for appends (what the same disk's journal holds comes back at the next
/// restart), and its offline marker removed. A directory holding another disk's id is
/// refused. True when it was blank.
pub fn reopen_disk(
    dir: &Path,
    slot: usize,
    id: u64,
    held: &LockIdentity,
) -> io::Result<(JournalFile, bool, Option<DiskLock>)> {
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    let blank = match std::fs::read_to_string(dir.join(DISK_ID_FILE)) {
        Ok(text) if u64::from_str_radix(text.trim(), 16).ok() == Some(id) => false,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "it holds another disk's id (restart to add that disk)",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(e) => return Err(e),
    };
    // The same disk's lock file is the one this process holds already; a replacement's is new.
    let lock = match DiskLock::try_take(dir) {
        Ok(lock) => Some(lock),
        Err(_) if held.is_of(dir) => None,
        Err(e) => return Err(e.into()),
    };
    if blank {
        write_id(dir, id, &None)?;
    }
    let data = dir.join("data");
    if !data.is_dir() {
        std::fs::create_dir_all(&data)?;
        sync_dir(dir, &None)?;
    }
    let (journal, _, _) = JournalFile::open_on_slot(&dir.join("journal"), None, Some(slot))?;
    if dir.join(OFFLINE_FILE).exists() {
        mark_offline(dir, false)?;
    }
    Ok((journal, blank, lock))
}

/// Each disk's journal (index = slot), each on its disk's worker thread
/// (`disk_worker::DiskWorker`). A batch of records goes to the journals of the disks its
/// versions are on, each disk's share in one write and one sync, the disks side by side, each
/// waited for until `cache_disk_op_timeout_ms`: a disk past it is stalled, and its share is
/// left out as a failing disk's is.
#[derive(Debug)]
pub struct Journals {
    workers: Vec<DiskWorker>,
    /// Each disk's lock (index = slot), held as long as the cache is open.
    locks: Vec<DiskLock>,
    /// Workers of replaced disks that still hold an operation past its deadline.
    retired: Vec<DiskWorker>,
    /// Each disk's id and directory (index = slot).
    ids: Vec<(u64, PathBuf)>,
    /// The ids of the disks that failed and were not brought back (`failed_disks`), and the
    /// list every usable disk carries now (None: not known to be the same on all).
    failed: BTreeSet<u64>,
    written: Option<BTreeSet<u64>>,
    /// The disks' health (the store's): a failing disk's records are not written, and an
    /// append's error is noted against its disk.
    health: Arc<DiskHealth>,
    /// Creates data files (`commit`'s opens).
    store: BlockStore,
    /// `cache_disk_op_timeout_ms`.
    op_timeout: Duration,
}

/// A created data file, or the errno that refused it.
pub type Created = (u64, Result<Arc<File>, i32>);

/// What one disk's share of a batch came to.
enum Outcome {
    Done(io::Result<()>),
    Batch(io::Result<()>, Vec<Created>),
}

/// A batch's append that failed on disk `slot` (`Journals::commit`'s error: none of the
/// batch is durable, but only this disk's records failed).
#[derive(Debug)]
pub struct AppendFailed {
    /// The disk whose append failed.
    pub slot: usize,
    /// Its error.
    pub error: io::Error,
}

impl std::fmt::Display for AppendFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cache disk {}: {}", self.slot, self.error)
    }
}

impl std::error::Error for AppendFailed {}

/// The disk whose journal had no room (ENOSPC, EDQUOT), when that failed a batch's append
/// (an `AppendFailed`).
pub fn full_journal(e: &io::Error) -> Option<usize> {
    let failed = e.get_ref()?.downcast_ref::<AppendFailed>()?;
    let errno = failed.error.raw_os_error()?;
    matches!(errno, libc::ENOSPC | libc::EDQUOT).then_some(failed.slot)
}

impl Journals {
    /// Appends `records`, each to its version's disk, and with `durable` returns once they
    /// are all on disk. An error from any disk is the batch's (none of it is counted durable).
    /// A failing or stalled disk's records are left out: its versions are on their way out of
    /// the index.
    pub fn append(&mut self, records: &[Record], durable: bool) -> io::Result<()> {
        self.commit(records, durable, &[]).0
    }

    /// `append`, and the data files of `opens` created (O_DIRECT) on their disks, each disk's
    /// creates followed by one sync of its data directory (a disk whose sync failed fails only
    /// its own files). A disk past the deadline fails its files with ETIMEDOUT.
    pub fn commit(
        &mut self,
        records: &[Record],
        durable: bool,
        opens: &[u64],
    ) -> (io::Result<()>, Vec<Created>) {
        self.health.try_come_back(unix_now_s());
        let disks = self.workers.len();
        let mut shares: Vec<(Vec<Record>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); disks];
        for r in records {
            let slot = slot_of(record_version(r));
            let Some(share) = shares.get_mut(slot) else {
                let e = io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a record of a disk the cache does not have",
                );
                return (
                    Err(e),
                    opens.iter().map(|&v| (v, Err(libc::EINVAL))).collect(),
                );
            };
            if self.health.usable(slot) {
                share.0.push(r.clone());
            }
        }
        let mut created: Vec<Created> = Vec::new();
        for &v in opens {
            match shares.get_mut(slot_of(v)) {
                Some(share) => share.1.push(v),
                None => created.push((v, Err(libc::EINVAL))),
            }
        }
        let deadline = Instant::now() + self.op_timeout;
        let mut sent = Vec::new();
        for (slot, (share, creates)) in shares.into_iter().enumerate() {
            if share.is_empty() && creates.is_empty() {
                continue;
            }
            let health = self.health.clone();
            let store = self.store.clone();
            let to_create = creates.clone();
            let job: Job = Box::new(move |journal: &mut JournalFile| -> disk_worker::Outcome {
                let appended = if share.is_empty() {
                    Ok(())
                } else {
                    let started = Instant::now();
                    let r = journal.append(&share, durable);
                    health.observe(slot, DiskOp::Append, micros_since(started));
                    r
                };
                Box::new(Outcome::Batch(appended, create_files(&store, &to_create)))
            });
            if self.workers[slot].send(job) {
                sent.push((slot, creates));
            } else {
                // Still holding a given-up operation: stalled, so its records are left out.
                created.extend(creates.into_iter().map(|v| (v, Err(libc::ETIMEDOUT))));
            }
        }
        let mut out = Ok(());
        for (slot, creates) in sent {
            match self.workers[slot].wait(deadline).map(unbox) {
                Some(Outcome::Batch(appended, files)) => {
                    if let Err(error) = self.noted(slot, appended) {
                        out = Err(io::Error::new(error.kind(), AppendFailed { slot, error }));
                    }
                    created.extend(files);
                }
                _ => created.extend(creates.into_iter().map(|v| (v, Err(libc::ETIMEDOUT)))),
            }
        }
        (out, created)
    }

    /// `result` of an append to disk `slot`, its error noted against the disk.
    fn noted(&self, slot: usize, result: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &result {
            if let Some(errno) = e.raw_os_error() {
                self.health.note(slot, errno, unix_now_s());
            }
        }
        result
    }

    /// Takes back the operations given up that the disks have finished since, and brings a
    /// stalled disk that is quiet again online (the I/O thread's idle look).
    pub fn poll(&mut self) {
        self.poll_at(unix_now_s());
    }

    /// `poll`, at `now_s` (Unix seconds).
    fn poll_at(&mut self, now_s: u64) {
        for w in &mut self.workers {
            w.poll();
        }
        // A replaced disk's old thread ends once its operation came back.
        self.retired.retain_mut(|w| !w.poll());
        self.health.try_come_back(now_s);
        self.keep_failures();
    }

    /// Writes the list of failed disks on every usable disk when it changed (each within the
    /// deadline; a disk that did not take it gets it at the next look).
    fn keep_failures(&mut self) {
        for (slot, (id, _)) in self.ids.iter().enumerate() {
            if self.health.state(slot) == super::disk_health::DiskState::Failing {
                self.failed.insert(*id);
            }
        }
        if self.written.as_ref() == Some(&self.failed) {
            return;
        }
        let deadline = Instant::now() + self.op_timeout;
        let mut sent = Vec::new();
        for (slot, (_, dir)) in self.ids.iter().enumerate() {
            if !self.health.usable(slot) {
                continue;
            }
            let (dir, ids) = (dir.clone(), self.failed.clone());
            let job: Job = Box::new(move |_: &mut JournalFile| -> disk_worker::Outcome {
                Box::new(Outcome::Done(failed_disks::write_list(&dir, &ids)))
            });
            if self.workers[slot].send(job) {
                sent.push(slot);
            }
        }
        let mut all = true;
        for slot in sent {
            match self.workers[slot].wait(deadline).map(unbox) {
                Some(Outcome::Done(Ok(()))) => {}
                _ => all = false,
            }
        }
        if all {
            self.written = Some(self.failed.clone());
        }
    }

    /// Bytes in all the journals.
    pub fn len(&self) -> u64 {
        self.workers.iter().map(DiskWorker::journal_bytes).sum()
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Disks it writes to.
    pub fn disks(&self) -> usize {
        self.workers.len()
    }

    /// Reopens disk `slot` at `dir` (`reopen_disk`, on a thread of its own, within the
    /// deadline: the disk may still stall) and gives it a new worker thread with that journal.
    /// The old worker was idle, since only this thread sends it work; one that still holds an
    /// operation past its deadline is kept aside (`retired`) until that comes back, and is
    /// given up for a blank replacement only: the same disk's journal could still be written
    /// by it. True when the disk was blank.
    pub fn reopen(&mut self, slot: usize, dir: &Path, id: u64) -> Result<bool, String> {
        let Some(worker) = self.workers.get_mut(slot) else {
            return Err(format!("no disk in slot {slot}"));
        };
        let stuck = !worker.poll();
        let (tx, rx) = std::sync::mpsc::channel();
        let at = dir.to_path_buf();
        let held = self.locks[slot].identity();
        std::thread::Builder::new()
            .name(format!("cache-reopen-{slot}"))
            .spawn(move || {
                let _ = tx.send(reopen_disk(&at, slot, id, &held));
            })
            .map_err(|e| e.to_string())?;
        let (journal, blank, lock) = match rx.recv_timeout(self.op_timeout) {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => {
                return Err(format!(
                    "the disk did not answer within {} ms",
                    self.op_timeout.as_millis()
                ))
            }
        };
        if stuck && !blank {
            return Err(
                "its thread still holds an operation past its deadline: ask again once it \
                 answers (shardline_cache_disk_held_ops)"
                    .into(),
            );
        }
        let new =
            DiskWorker::spawn(slot, journal, self.health.clone()).map_err(|e| e.to_string())?;
        if let Some(lock) = lock {
            self.locks[slot] = lock;
        }
        // Back: off the list of failed disks (written at the I/O thread's next look).
        self.failed.remove(&id);
        let old = std::mem::replace(&mut self.workers[slot], new);
        if stuck {
            self.retired.push(old);
        }
        Ok(blank)
    }

    /// Sets `cache_disk_op_timeout_ms`.
    pub fn set_op_timeout_ms(&mut self, ms: u64) {
        assert!(ms > 0, "a disk operation's deadline of 0");
        self.op_timeout = Duration::from_millis(ms);
    }

    /// Rewrites each journal as its disk's share of `snapshot` (the live index as records,
    /// `journal::snapshot`): written and synced beside it, then renamed over. Each disk is
    /// given `cache_disk_op_timeout_ms` plus its share's bytes at `COMPACT_FLOOR_BYTES_PER_S`.
    pub fn compact(&mut self, snapshot: &[u8]) -> io::Result<()> {
        let mut parts: Vec<Vec<u8>> = vec![Vec::new(); self.workers.len()];
        let mut at = 0;
        while at < snapshot.len() {
            match Record::decode(&snapshot[at..]) {
                Decoded::Record(r, used) => {
                    let part = parts.get_mut(slot_of(record_version(&r))).ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidInput, "a record of no disk")
                    })?;
                    part.extend_from_slice(&snapshot[at..at + used]);
                    at += used;
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a snapshot that does not decode",
                    ))
                }
            }
        }
        let started = Instant::now();
        let mut sent = Vec::new();
        for (slot, part) in parts.into_iter().enumerate() {
            // A failing disk is left alone; one disk's failure to compact leaves its journal
            // as it was, and the others are compacted.
            if !self.health.usable(slot) {
                continue;
            }
            let bytes = part.len() as u64;
            let job: Job = Box::new(move |journal: &mut JournalFile| -> disk_worker::Outcome {
                Box::new(Outcome::Done(compact_one(journal, &part)))
            });
            if self.workers[slot].send(job) {
                let allowed = self.op_timeout
                    + Duration::from_millis(bytes * 1000 / COMPACT_FLOOR_BYTES_PER_S);
                sent.push((slot, started + allowed));
            }
        }
        let mut result = Ok(());
        for (slot, deadline) in sent {
            match self.workers[slot].wait(deadline).map(unbox) {
                Some(Outcome::Done(Ok(()))) => {}
                Some(Outcome::Done(Err(e))) => result = Err(e),
                _ => {
                    result = Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
                }
            }
        }
        result
    }
}

/// The slowest a disk may write a compaction's snapshot before it counts as stalled (bytes/s,
/// on top of `cache_disk_op_timeout_ms`).
pub const COMPACT_FLOOR_BYTES_PER_S: u64 = 16 << 20;

/// A disk job's outcome as `Journals` sent it.
fn unbox(out: disk_worker::Outcome) -> Outcome {
    *out.downcast::<Outcome>()
        .expect("a disk job answers with the outcome its sender boxed")
}

/// Creates the data files of `versions` (all on one disk) for O_DIRECT writes, then syncs
/// their directory (a new file's entry is durable before any block in it is journaled). An
/// error is noted against the disk; a failed sync fails them all.
fn create_files(store: &BlockStore, versions: &[u64]) -> Vec<Created> {
    let Some(&first) = versions.first() else {
        return Vec::new();
    };
    let note = |errno: i32| {
        store.health().note(slot_of(first), errno, unix_now_s());
    };
    let mut files: Vec<Created> = versions
        .iter()
        .map(|&version| {
            let path = store.data_path(version);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .map(Arc::new)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO));
            match (&file, store.watch()) {
                (Ok(_), Some(w)) => w.created(&path),
                (Err(errno), _) => note(*errno),
                _ => {}
            }
            (version, file)
        })
        .collect();
    if let Err(e) = store.sync_data_dir_of(first) {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        note(errno);
        for f in &mut files {
            f.1 = Err(errno);
        }
    }
    files
}

/// Writes (`offline`) or removes the offline marker of the disk at `dir`, durably. A dead
/// disk cannot take it: the error says so, and the state then lasts until a restart.
pub fn mark_offline(dir: &Path, offline: bool) -> io::Result<()> {
    let path = dir.join(OFFLINE_FILE);
    if offline {
        let f = std::fs::File::create(&path)?;
        f.sync_all()?;
    } else {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    sync_dir(dir, &None)
}

/// Microseconds since `started` (an operation's latency).
fn micros_since(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Rewrites `journal` as `snapshot`: written and synced beside it, then renamed over.
fn compact_one(journal: &mut JournalFile, snapshot: &[u8]) -> io::Result<()> {
    let before = journal.len();
    let new = journal.write_snapshot(&journal.compaction_path(), snapshot)?;
    journal.finish_compaction(new, snapshot.len() as u64, before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::record::ObjectVersion;
    use crate::cache::version_id::on_slot;

    const BLOCK: u32 = 64 * 1024;

    fn meta(key: &str, version: u64) -> ObjectVersion {
        ObjectVersion {
            key: key.as_bytes().to_vec(),
            version,
            size: 3 * u64::from(BLOCK),
            block_bytes: BLOCK,
            fetched_unix_s: 0,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        }
    }

    fn dirs(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
        let t = tempfile::tempdir().unwrap();
        let d = (0..n)
            .map(|i| {
                let p = t.path().join(format!("disk{i}"));
                std::fs::create_dir(&p).unwrap();
                p
            })
            .collect();
        (t, d)
    }

    /// Writes `count` objects of one block each through `open_disks`, placed by key.
    fn fill(dirs: &[PathBuf], count: u64) -> Vec<(String, u64)> {
        let mut o = open_disks(dirs, true, None).unwrap();
        let mut out = Vec::new();
        let mut records = Vec::new();
        for n in 1..=count {
            let key = format!("0/obj-{n}");
            let v = o.store.new_version(key.as_bytes(), n);
            let m = meta(&key, v);
            let crc = o
                .store
                .write_block(&m, 0, &vec![n as u8; BLOCK as usize])
                .unwrap();
            records.push(Record::Object(m));
            records.push(Record::Block {
                version: v,
                block: 0,
                crc,
            });
            out.push((key, v));
        }
        o.journals.append(&records, true).unwrap();
        out
    }

    #[test]
    fn each_disk_journals_and_stores_its_own_share_and_replays_it() {
        let (_t, d) = dirs(3);
        let written = fill(&d, 60);
        // Every disk took some; each version's file is on its own disk.
        for (slot, dir) in d.iter().enumerate() {
            assert!(
                written.iter().any(|(_, v)| slot_of(*v) == slot),
                "slot {slot}"
            );
            assert!(std::fs::metadata(dir.join("journal")).unwrap().len() > 0);
            assert!(dir.join(DISK_ID_FILE).is_file());
        }
        let o = open_disks(&d, true, None).unwrap();
        assert_eq!(o.index.keys(), 60);
        let mut buf = Vec::new();
        for (key, v) in &written {
            let m = o.index.current(key.as_bytes()).unwrap().clone();
            assert_eq!(m.version, *v);
            let crc = o.index.block_crc(*v, 0).unwrap();
            o.store.read_block(&m, 0, crc, &mut buf).unwrap();
            assert!(o.store.data_path(*v).starts_with(&d[slot_of(*v)]));
        }
        // Ids stay; listed in another order, each disk's versions follow it to its new slot.
        let ids: Vec<u64> = o.disks.iter().map(|x| x.id).collect();
        let reordered = vec![d[2].clone(), d[0].clone(), d[1].clone()];
        drop(o);
        let o = open_disks(&reordered, true, None).unwrap();
        assert_eq!(
            o.disks.iter().map(|x| x.id).collect::<Vec<_>>(),
            [ids[2], ids[0], ids[1]]
        );
        for (key, v) in &written {
            let m = o.index.current(key.as_bytes()).unwrap().clone();
            let old_slot = slot_of(*v);
            let new_slot = [1, 2, 0][old_slot];
            assert_eq!(m.version, on_slot(*v, new_slot));
            let crc = o.index.block_crc(m.version, 0).unwrap();
            o.store.read_block(&m, 0, crc, &mut buf).unwrap();
            // Placement goes by id: a key's new versions go where it went before.
            assert_eq!(slot_of(o.store.new_version(key.as_bytes(), 999)), new_slot);
        }
    }

    #[test]
    fn the_first_disk_sized_for_every_journal_gives_back_the_room_the_join_left() {
        let (_t, d) = dirs(3);
        let written = fill(&d, 600);
        // All but 10 versions dropped: the journals are long, and hold few versions.
        let mut o = open_disks(&d, true, None).unwrap();
        let drops: Vec<Record> = written[10..]
            .iter()
            .map(|&(_, version)| Record::Drop { version })
            .collect();
        o.journals.append(&drops, true).unwrap();
        drop(o);
        // Side by side (no watch, several disks): the first disk's tables are sized for
        // every journal's bytes, hundreds of versions.
        let o = open_disks(&d, true, None).unwrap();
        assert_eq!((o.index.versions(), o.index.keys()), (10, 10));
        let fitted = Index::with_capacity(10).table_capacity();
        assert_eq!(o.index.table_capacity(), fitted);
        let mut buf = Vec::new();
        for (key, v) in &written[..10] {
            let m = o.index.current(key.as_bytes()).unwrap().clone();
            assert_eq!(m.version, *v);
            let crc = o.index.block_crc(*v, 0).unwrap();
            o.store.read_block(&m, 0, crc, &mut buf).unwrap();
        }
    }

    /// Polls `journals` (as the I/O thread's idle look does) until disk `slot` holds no
    /// operation past its deadline.
    fn wait_held_back(journals: &mut Journals, health: &DiskHealth, slot: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while health.held_ops(slot) > 0 {
            assert!(
                Instant::now() < deadline,
                "the held operation never came back"
            );
            journals.poll();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The deadline of a disk operation in the stall test.
    const STALL_TEST_TIMEOUT_MS: u64 = 1000;

    #[test]
    fn a_stalled_disk_costs_its_own_records_only_and_comes_back_when_quiet() {
        use crate::cache::disk_health::{DiskState, ErrorKind, STALL_QUIET_S};
        let (_t, d) = dirs(2);
        let mut o = open_disks(&d, true, None).unwrap();
        // Long enough for disk 0's append and sync on a loaded machine.
        o.journals.set_op_timeout_ms(STALL_TEST_TIMEOUT_MS);
        let health = o.store.health().clone();
        // One object on each disk.
        let mut versions = Vec::new();
        let mut records = Vec::new();
        for n in 1..=40u64 {
            let key = format!("0/obj-{n}");
            let v = o.store.new_version(key.as_bytes(), n);
            if versions.iter().any(|&w| slot_of(w) == slot_of(v)) {
                continue;
            }
            versions.push(v);
            records.push(Record::Object(meta(&key, v)));
        }
        versions.sort_by_key(|&v| slot_of(v));
        assert_eq!(versions.len(), 2, "both disks took a key");
        // Disk 1 stalls on its next operation; the batch returns at the deadline, disk 0's
        // records are durable, and disk 1's creates fail with ETIMEDOUT.
        let release = o.journals.workers[1].stall_next();
        let started = Instant::now();
        let (appended, created) = o.journals.commit(&records, true, &versions);
        let took = started.elapsed();
        assert!(appended.is_ok(), "{appended:?}");
        assert!(
            took >= Duration::from_millis(STALL_TEST_TIMEOUT_MS),
            "waited for the deadline: {took:?}"
        );
        assert_eq!(health.state(1), DiskState::Stalled);
        assert_eq!(health.state(0), DiskState::Online);
        assert_eq!(health.errors(1, ErrorKind::Stall), 1);
        assert_eq!(health.held_ops(1), 1);
        let file_of = |v: u64| created.iter().find(|c| c.0 == v).map(|c| c.1.is_ok());
        assert_eq!(file_of(versions[0]), Some(true));
        assert_eq!(file_of(versions[1]), Some(false));
        let failed = created.iter().find(|c| c.0 == versions[1]).unwrap();
        assert_eq!(failed.1.as_ref().err(), Some(&libc::ETIMEDOUT));
        // While it holds the operation, nothing more is sent to it, and the other disk goes
        // on at its own pace.
        o.journals.append(&records, true).unwrap();
        // Nothing waited on disk 1 again: no second stall, disk 0 still online.
        assert_eq!(health.errors(1, ErrorKind::Stall), 1);
        assert_eq!(health.state(0), DiskState::Online);
        assert_eq!(health.held_ops(1), 1);
        // The disk answers: its operation comes back, and once quiet it is online again.
        release.send(()).unwrap();
        wait_held_back(&mut o.journals, &health, 1);
        assert_eq!(
            health.state(1),
            DiskState::Stalled,
            "not before the quiet period"
        );
        // The I/O thread's idle look brings it back once quiet.
        o.journals.poll_at(unix_now_s() + STALL_QUIET_S);
        assert_eq!(health.state(1), DiskState::Online);
        o.journals.append(&records, true).unwrap();
        drop(o);
        // Disk 0 holds its object's record; disk 1 holds the one the stalled append finally
        // wrote (the disk let it finish), and no later one.
        let o = open_disks(&d, true, None).unwrap();
        assert_eq!(o.index.keys(), 2);
    }

    #[test]
    fn a_disk_is_reopened_as_itself_or_a_blank_replacement_never_as_another() {
        let (t, d) = dirs(2);
        let mut o = open_disks(&d, true, None).unwrap();
        let health = o.store.health().clone();
        let id = o.disks[1].id;
        let record = Record::Object(meta("0/on-1", on_slot(7, 1)));
        // The same disk, idle: reopened, and appends go on to it.
        assert_eq!(o.journals.reopen(1, &d[1], id), Ok(false));
        o.journals
            .append(std::slice::from_ref(&record), true)
            .unwrap();
        // Another disk's directory is refused.
        let refused = o.journals.reopen(1, &d[0], id).unwrap_err();
        assert!(refused.contains("another disk's id"), "{refused}");
        // Its thread held past the deadline: the same disk is refused (the held append could
        // still write to its journal), a blank replacement is taken and given the id.
        // A short deadline for the held append only: the reopens create and sync files, which
        // can take longer than that on a loaded machine.
        o.journals.set_op_timeout_ms(200);
        let release = o.journals.workers[1].stall_next();
        o.journals
            .append(std::slice::from_ref(&record), true)
            .unwrap();
        assert_eq!(health.held_ops(1), 1);
        o.journals.set_op_timeout_ms(DEFAULT_DISK_OP_TIMEOUT_MS);
        assert!(o.journals.reopen(1, &d[1], id).is_err());
        let blank = t.path().join("replacement");
        std::fs::create_dir(&blank).unwrap();
        assert_eq!(o.journals.reopen(1, &blank, id), Ok(true));
        assert_eq!(disk_id(&blank, &None).unwrap(), id);
        assert!(blank.join("data").is_dir());
        health.set_online(1);
        o.journals
            .append(std::slice::from_ref(&record), true)
            .unwrap();
        assert!(std::fs::metadata(blank.join("journal")).unwrap().len() > 0);
        // The old thread's operation comes back: counted back, the old thread ends.
        release.send(()).unwrap();
        wait_held_back(&mut o.journals, &health, 1);
        assert!(o.journals.retired.is_empty());
    }

    #[test]
    fn a_failed_disk_stays_failed_across_a_restart_until_it_is_brought_back() {
        use crate::cache::disk_health::DiskState;
        let (_t, d) = dirs(3);
        let mut o = open_disks(&d, true, None).unwrap();
        let id = o.disks[1].id;
        for _ in 0..crate::cache::disk_health::DEVICE_ERRORS_TO_FAIL {
            o.store.health().note(1, libc::EIO, unix_now_s());
        }
        assert_eq!(o.store.health().state(1), DiskState::Failing);
        // The I/O thread's look writes its id on the other disks (not on itself).
        o.journals.poll();
        for slot in [0, 2] {
            let listed = failed_disks::read_listed([d[slot].as_path()]);
            assert_eq!(listed, BTreeSet::from([id]), "disk {slot}");
        }
        assert!(!d[1].join(failed_disks::FAILED_DISKS_FILE).exists());
        drop(o);
        // Restarted, it comes up failing; the others are online.
        let mut o = open_disks(&d, true, None).unwrap();
        let states: Vec<DiskState> = (0..3).map(|s| o.store.health().state(s)).collect();
        assert_eq!(
            states,
            [DiskState::Online, DiskState::Failing, DiskState::Online]
        );
        // Brought back by the operator: off the lists, and online after the next restart.
        assert_eq!(o.journals.reopen(1, &d[1], id), Ok(false));
        o.store.health().set_online(1);
        o.journals.poll();
        drop(o);
        let o = open_disks(&d, true, None).unwrap();
        assert!((0..3).all(|s| o.store.health().usable(s)));
        assert!(failed_disks::read_listed(d.iter().map(|p| p.as_path())).is_empty());
    }

    #[test]
    fn a_missing_disk_is_left_out_unless_all_are_required() {
        let (t, mut d) = dirs(2);
        let written = fill(&d, 40);
        d.push(t.path().join("gone"));
        assert!(open_disks(&d, true, None).is_err());
        // A disk left out before the others: they replayed side by side on the slots of
        // their places, and open again on the slots they get; every object is found.
        let gone_first = vec![t.path().join("gone"), d[0].clone(), d[1].clone()];
        let o = open_disks(&gone_first, false, None).unwrap();
        assert_eq!((o.disks.len(), o.missing.len()), (2, 1));
        assert_eq!(o.index.keys(), 40);
        for (key, v) in &written {
            let m = o.index.current(key.as_bytes()).unwrap();
            assert_eq!(m.version, *v, "on the slot it had");
        }
        // The second disk broken: its id unreadable.
        std::fs::write(d[1].join(DISK_ID_FILE), "not hex").unwrap();
        drop(o);
        let o = open_disks(&d, false, None).unwrap();
        assert_eq!(o.disks.len(), 1);
        assert_eq!(o.missing.len(), 2);
        assert_eq!(o.store.disks(), 1);
        // The first disk's objects are all there; the rest are misses.
        let on_first = written.iter().filter(|(_, v)| slot_of(*v) == 0).count();
        assert_eq!(o.index.keys(), on_first);
        assert!(on_first > 0 && on_first < 40);
        // The same disk twice is one disk.
        drop(o);
        let twice = vec![d[0].clone(), d[0].clone()];
        assert_eq!(open_disks(&twice, false, None).unwrap().disks.len(), 1);
        // A disk another process uses (its lock held) is never opened beside it.
        let d = vec![d[0].clone()];
        let theirs = DiskLock::try_take(&d[0]).unwrap();
        let Err(err) = open_disks(&d, true, None) else {
            panic!("a held disk should be refused");
        };
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(err.to_string().contains("in use by process"), "{err}");
        drop(theirs);
        assert_eq!(open_disks(&d, true, None).unwrap().disks.len(), 1);
        assert!(open_disks(&[t.path().join("gone")], false, None).is_err());
    }

    #[test]
    fn compaction_splits_the_snapshot_by_disk() {
        let (_t, d) = dirs(2);
        let written = fill(&d, 20);
        let mut o = open_disks(&d, true, None).unwrap();
        // Drop half, so the compaction has something to cut.
        let drops: Vec<Record> = written
            .iter()
            .step_by(2)
            .map(|(_, v)| Record::Drop { version: *v })
            .collect();
        for r in &drops {
            o.index.apply(r.clone());
        }
        o.journals.append(&drops, true).unwrap();
        let before = o.journals.len();
        let mut snap = Vec::new();
        crate::cache::journal::snapshot(&o.index, &mut snap);
        o.journals.compact(&snap).unwrap();
        assert!(o.journals.len() < before);
        assert_eq!(o.journals.len(), snap.len() as u64);
        drop(o);
        let again = open_disks(&d, true, None).unwrap();
        assert_eq!(again.index.keys(), 10);
        for (key, v) in written.iter().skip(1).step_by(2) {
            assert_eq!(again.index.current(key.as_bytes()).unwrap().version, *v);
        }
    }
}
