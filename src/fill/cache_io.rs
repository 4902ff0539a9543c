//! The cache's I/O thread: everything of the fill that blocks the calling thread runs here,
//! never on a shard thread. Journal appends with group commit (every record queued since the
//! last batch, from every shard, shares one write and one fdatasync), data-file creates,
//! dropped versions' unlinks, and journal compaction.
//!
//! The shards queue work in `FillCore`'s `Outbox` (memory only) and write this thread's
//! eventfd once per batch; the thread takes the batch under the lock, does the I/O without
//! it, then takes the lock again to make the batch's records visible (`FillCore::io_done`:
//! a block becomes visible only once its record is durable) and, in the same hold, to take
//! the next batch; the shards with news are woken as it lets go. Without this thread (`Mode::Inline`: tests, tools and
//! the simulator, one thread and deterministic) the same `Outbox` is flushed by the caller.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::cache::disks::Journals;
use crate::cache::journal::Record;
use crate::cache::store::BlockStore;

/// How long the thread sleeps between looks at whether its cache still exists (its eventfd
/// wakes it for work at once).
const IDLE_POLL_MS: i32 = 500;

/// The index the I/O thread journals for, as the thread sees it (the fill's shared core
/// implements it): when to compact the journal, and a snapshot of what is live.
pub trait Compactable: Send + Sync + 'static {
    /// Whether a journal of `journal_bytes` should be compacted now (never waits for a lock).
    fn compaction_due(&self, journal_bytes: u64) -> bool;
    /// Encodes every live record into `out`; the compaction has begun.
    fn snapshot(&self, out: &mut Vec<u8>);
    /// The compaction's outcome and the journal's length after it.
    fn compacted(&self, result: std::io::Result<()>, journal_bytes: u64);
}

/// What the fill has queued for the I/O thread.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Records to journal, in order; the first has sequence number `first_seq`.
    pub records: Vec<Record>,
    /// Sequence number of `records[0]`.
    pub first_seq: u64,
    /// Versions whose data file is to be created (opened for O_DIRECT writes).
    pub opens: Vec<u64>,
    /// Versions whose data file is to be removed (after this batch's records are durable).
    pub unlinks: Vec<u64>,
    /// The shards that queued into it (bit per shard; shards past 63 share the last bit's
    /// fate: every shard is woken).
    pub shards: u64,
}

impl Outbox {
    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.opens.is_empty() && self.unlinks.is_empty()
    }
}

/// What one batch's I/O came to.
#[derive(Debug)]
pub struct Done {
    /// Records `first_seq..first_seq + records` were appended; `Ok` once durable.
    pub first_seq: u64,
    /// How many.
    pub records: u64,
    /// The append's result (an error: none of them is durable).
    pub appended: std::io::Result<()>,
    /// Each created data file, or the errno that refused it.
    pub opened: Vec<(u64, Result<Arc<File>, i32>)>,
    /// The journal's bytes after the batch.
    pub journal_bytes: u64,
    /// The shards that queued into it (to wake).
    pub shards: u64,
}

/// What the shards and the I/O thread share, outside the fill's lock.
#[derive(Debug)]
pub struct IoShared {
    /// Work queued by the shards, not yet taken by the thread.
    pub todo: Mutex<Outbox>,
    /// Batches done, for a shard to settle (`CacheFill::settle_io`).
    pub done: Mutex<Vec<Done>>,
    /// `done` holds a batch (read without its lock).
    pub has_done: AtomicBool,
    /// The thread's eventfd.
    pub wake: OwnedFd,
    /// The operator's `online` requests and their outcomes (`Journals::reopen`).
    pub reopen: Mutex<Reopen>,
}

/// The operator's `online` requests, carried out by the I/O thread, and their outcomes.
#[derive(Debug, Default)]
pub struct Reopen {
    /// (slot, directory, id) to reopen.
    pub requests: Vec<(usize, std::path::PathBuf, u64)>,
    /// Each slot's last outcome not yet told (true: a blank replacement; or why not).
    pub outcomes: Vec<(usize, Result<bool, String>)>,
}

impl Reopen {
    /// Queues disk `slot`'s reopen unless one is queued or under way; whether it is new.
    pub fn ask(&mut self, slot: usize, dir: &std::path::Path, id: u64) -> bool {
        if self.requests.iter().any(|r| r.0 == slot) {
            return false;
        }
        self.outcomes.retain(|o| o.0 != slot);
        self.requests.push((slot, dir.to_path_buf(), id));
        true
    }

    /// Disk `slot`'s outcome, if there is one (told once).
    pub fn take_outcome(&mut self, slot: usize) -> Option<Result<bool, String>> {
        let i = self.outcomes.iter().position(|o| o.0 == slot)?;
        Some(self.outcomes.swap_remove(i).1)
    }

    /// Whether disk `slot`'s reopen is queued or under way.
    pub fn pending(&self, slot: usize) -> bool {
        self.requests.iter().any(|r| r.0 == slot)
    }
}

impl IoShared {
    /// Nothing queued yet, with a new eventfd.
    pub fn new() -> std::io::Result<IoShared> {
        Ok(IoShared {
            todo: Mutex::new(Outbox::default()),
            done: Mutex::new(Vec::new()),
            has_done: AtomicBool::new(false),
            wake: eventfd()?,
            reopen: Mutex::new(Reopen::default()),
        })
    }

    /// Queues `outbox`'s work (emptied) for the thread, from shard `shard`, waking it when
    /// the queue was empty.
    pub fn submit(&self, outbox: &mut Outbox, shard: usize) {
        if outbox.is_empty() {
            return;
        }
        let was_empty = {
            let mut todo = self.todo.lock().unwrap_or_else(PoisonError::into_inner);
            let was_empty = todo.is_empty();
            if todo.records.is_empty() {
                todo.first_seq = outbox.first_seq;
            }
            assert!(
                outbox.records.is_empty()
                    || todo.first_seq + todo.records.len() as u64 == outbox.first_seq,
                "records queued out of order"
            );
            todo.records.append(&mut outbox.records);
            todo.opens.append(&mut outbox.opens);
            todo.unlinks.append(&mut outbox.unlinks);
            todo.shards |= 1 << shard.min(63);
            was_empty
        };
        if was_empty {
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// Moves the batches done into `out`.
    pub fn take_done(&self, out: &mut Vec<Done>) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        out.append(&mut done);
        self.has_done.store(false, Ordering::Release);
    }
}

/// Carries out `outbox` against `journal`: one append (synced) for all its records and its
/// creates (per disk, side by side: `Journals::commit`); its unlinks (their Drop records
/// durable by then) go to `unlink`. Called by the I/O thread, or by the fill itself in
/// `Mode::Inline`.
pub fn run(outbox: &mut Outbox, journal: &mut Journals, unlink: &mut dyn FnMut(u64)) -> Done {
    let records = outbox.records.len() as u64;
    // Each disk's share of the records and its creates run on the disk's own thread, the
    // disks side by side, each within `cache_disk_op_timeout_ms` (`Journals::commit`).
    let (appended, opened) = journal.commit(&outbox.records, true, &outbox.opens);
    outbox.opens.clear();
    for version in outbox.unlinks.drain(..) {
        unlink(version);
    }
    outbox.records.clear();
    Done {
        first_seq: outbox.first_seq,
        records,
        appended,
        opened,
        journal_bytes: journal.len(),
        shards: std::mem::take(&mut outbox.shards),
    }
}

/// Removes dropped version `version`'s data file (a failure is logged: the space is lost
/// until a restart's sweep, nothing else).
pub fn remove_version(store: &BlockStore, version: u64) {
    // A failing disk's files stay where they are: its objects left the index all at once,
    // and a line per file would say nothing more than the one that took it out.
    if !store
        .health()
        .usable(crate::cache::version_id::slot_of(version))
    {
        return;
    }
    if let Err(e) = store.remove_version(version) {
        tracing::warn!(version, error = %e, "removing a dropped version's data file");
    }
}

/// Rewrites `journal` as `snapshot` (the live index's records): written and synced beside
/// it, then renamed over. Nothing else appends meanwhile: the caller owns the journal.
pub fn compact(journal: &mut Journals, snapshot: &[u8]) -> std::io::Result<()> {
    let before = journal.len();
    journal.compact(snapshot)?;
    tracing::info!(before, after = journal.len(), "cache journal compacted");
    Ok(())
}

/// Starts the I/O thread for `core`, owning `journal`: it takes the shards' batches from
/// `io`, and wakes through `wakers` the shards that queued each. It ends when the core is
/// gone.
pub fn spawn<C: Compactable>(
    core: Weak<C>,
    mut journal: Journals,
    store: BlockStore,
    io: Arc<IoShared>,
    wakers: Arc<Vec<OwnedFd>>,
) -> std::io::Result<()> {
    // Unlinks on a thread of their own per disk: freeing a large file's extents takes
    // milliseconds, and the journal's next sync (the blocks clients wait for) must not wait
    // behind them; nor may one stalled disk's unlink hold up the others'.
    let unlinks = (0..journal.disks())
        .map(|slot| {
            let (tx, rx) = std::sync::mpsc::channel::<u64>();
            let unlink_store = store.clone();
            std::thread::Builder::new()
                .name(format!("cache-unlink-{slot}"))
                .spawn(move || {
                    for version in rx {
                        remove_version(&unlink_store, version);
                    }
                })
                .map(|_| tx)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    std::thread::Builder::new()
        .name("cache-io".into())
        .spawn(move || {
            let mut unlink = |v: u64| {
                let slot = crate::cache::version_id::slot_of(v).min(unlinks.len() - 1);
                let _ = unlinks[slot].send(v);
            };
            let mut outbox = Outbox::default();
            let mut snapshot = Vec::new();
            loop {
                wait(&io.wake);
                let Some(core) = core.upgrade() else {
                    return;
                };
                // Operations a stalled disk held that came back; a quiet disk comes back.
                journal.poll();
                take_reopened(&io, &mut journal, &store);
                loop {
                    {
                        let mut todo = io.todo.lock().unwrap_or_else(PoisonError::into_inner);
                        std::mem::swap(&mut *todo, &mut outbox);
                    }
                    if outbox.is_empty() {
                        break;
                    }
                    let done = run(&mut outbox, &mut journal, &mut unlink);
                    let shards = done.shards;
                    io.done
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(done);
                    io.has_done.store(true, Ordering::Release);
                    for (shard, fd) in wakers.iter().enumerate() {
                        if shards & (1 << shard.min(63)) != 0 {
                            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
                        }
                    }
                }
                // A compaction is decided from what the shards published (`Signals`), and
                // takes the fill's lock only to encode the live index.
                if core.compaction_due(journal.len()) {
                    core.snapshot(&mut snapshot);
                    let result = compact(&mut journal, &snapshot);
                    snapshot.clear();
                    core.compacted(result, journal.len());
                }
            }
        })?;
    Ok(())
}

/// Carries out the operator's `online` requests: each disk reopened (`Journals::reopen`)
/// and brought online, or the reason it was not, left for the admin listener to tell. A
/// request stays queued (`Reopen::pending`) until its outcome is in.
pub fn take_reopened(io: &IoShared, journal: &mut Journals, store: &BlockStore) {
    let requests = io
        .reopen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .requests
        .clone();
    for (slot, dir, id) in requests {
        let outcome = journal.reopen(slot, &dir, id);
        match &outcome {
            Ok(blank) => {
                store.health().set_online(slot);
                tracing::warn!(
                    slot,
                    blank,
                    "cache disk online again: it takes its share of new objects"
                );
            }
            Err(why) => tracing::warn!(slot, why, "cache disk not brought online"),
        }
        let mut reopen = io.reopen.lock().unwrap_or_else(PoisonError::into_inner);
        reopen.requests.retain(|r| r.0 != slot);
        reopen.outcomes.push((slot, outcome));
    }
}

/// Waits for the eventfd (or `IDLE_POLL_MS`) and empties it.
fn wait(wake: &OwnedFd) {
    let mut fds = [rustix::event::PollFd::new(
        wake,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(IDLE_POLL_MS) * 1_000_000,
    };
    let _ = rustix::event::poll(&mut fds, Some(&timeout));
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(wake, &mut buf);
}

/// A new eventfd for the I/O thread (non-blocking: the thread polls it).
pub fn eventfd() -> std::io::Result<OwnedFd> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
    )
    .map_err(std::io::Error::from)
}
