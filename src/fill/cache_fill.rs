//! A shard's cache fill: turns "this client wants bytes a..=b of this key" into coalesced
//! block fetches (`Filler`), journals every block once it is durable, and tells each waiter
//! when the block it waits on is on disk (or why it never will be).
//!
//! - **One fetch per block.** Every missing block is registered in `cache::coalesce::Fills`
//!   before it is asked for; a later want of the same block waits on that fetch.
//! - **An unknown object** is probed: the first want starts a fetch of its first blocks with
//!   no size; the head's answer creates the version (`Record::Object`, journaled), and the
//!   wants that waited for it are judged again against that version.
//! - **Visible only once committed.** `FillEvent::Committed` comes after the block's bytes
//!   are durable; the `Record::Block` is journaled (and synced) before the index or a waiter
//!   hears of it.
//! - **Retries** go to a new fetch after `origin::pool::retry_after_ms`; a version change at
//!   the origin ends the old version's fill (its waiters get the error: a response never
//!   mixes versions) and the next want probes the new one.
//! - **A corrupt block** (`verify_block`) is forgotten and fetched again on its own.
//!
//! The journal is appended on the shard thread (one small synced write per block); issue 20
//! leaves moving it onto the ring, with group commit, to the shard wiring.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Begin, FillEvent, Filler};
use crate::cache::blocks::{blocks_for, missing_runs};
use crate::cache::coalesce::{Ask, Failed, Fills};
use crate::cache::evict::S3Fifo;
use crate::cache::index::{Index, ObjectVersion};
use crate::cache::journal::Record;
use crate::cache::journal_file::JournalFile;
use crate::cache::store::{BlockStore, ReadError};
use crate::origin::fetch::{FetchError, HeadFacts, Plan};
use crate::origin::pool::retry_after_ms;
use crate::shard::ring_ops::RingOps;
use crate::shard::slots::ArenaSlot;

/// Most wants that may wait for an unknown object's head (past it: `Outcome::Busy`).
pub const MAX_PROBE_WAITERS: usize = 4096;
/// Most fetches waiting for a slot or a connection (past it: `Outcome::Busy`).
pub const MAX_QUEUED_FETCHES: usize = 4096;

/// How the fill stores and asks.
#[derive(Clone, Debug)]
pub struct FillConfig {
    /// Block size of new versions (old ones keep theirs).
    pub block_bytes: u32,
    /// Blocks fetched past the ones a want needs.
    pub read_ahead_blocks: u64,
    /// Most blocks one origin request asks for.
    pub max_run_blocks: u64,
    /// Bytes of an arena slot.
    pub slot_bytes: usize,
    /// O_DIRECT alignment of the cache's disk.
    pub align_bytes: usize,
    /// Attempts per block before its waiters get the error.
    pub max_attempts: u32,
    /// Blocks a fetch writes between two syncs (its first is synced alone).
    pub sync_every_blocks: u32,
    /// Bytes of objects the cache keeps (S3-FIFO evicts past it); 0: no budget.
    pub max_bytes: u64,
}

/// What a want found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every block it needs is on disk now (version id).
    Ready(u64),
    /// It waits; a `Notice` comes for it later.
    Waiting,
    /// Too many wait already: serve it without the cache, or refuse it (503).
    Busy,
}

/// What a waiter hears.
#[derive(Debug, PartialEq, Eq)]
pub enum Notice<W> {
    /// Block `block` of `version` is on disk: the waiter may read it, or want more.
    Block {
        /// Who waited.
        waiter: W,
        /// Version id.
        version: u64,
        /// Block number.
        block: u32,
    },
    /// The object's version is known (after a probe): the waiter wants again.
    Known {
        /// Who waited.
        waiter: W,
        /// Version id.
        version: u64,
    },
    /// The fill failed for good: the waiter's client gets an error (502/504, or a close if
    /// its response has begun).
    Failed {
        /// Who waited.
        waiter: W,
        /// Why.
        error: FetchError,
    },
}

/// One origin request the fill wants made.
#[derive(Clone, Debug)]
struct Job {
    key: Vec<u8>,
    origin: usize,
    path: String,
    /// The version filled (for a probe: the id the head's version will get).
    version: u64,
    /// Blocks first..=last.
    first: u32,
    last: u32,
    probe: bool,
    not_before_ms: u64,
    /// Blocks of the run committed so far.
    committed: Vec<u32>,
    /// The fetch holds a pin on its version (unpinned when it ends).
    pinned: bool,
}

/// Who a notice goes to: the shard that holds the waiting connection.
pub trait Routed {
    /// The waiter's shard.
    fn shard(&self) -> usize;
}

/// A single-shard cache's waiters (tests and tools name them by number).
impl Routed for usize {
    fn shard(&self) -> usize {
        0
    }
}

/// What every shard shares: the index and journal, the fills in flight and who waits on
/// them, the queue of fetches to make, and each shard's notices. Behind one mutex, held
/// only for bookkeeping (a block's journal append is the longest thing done under it).
pub struct FillCore<W: Clone + PartialEq + Routed> {
    cfg: FillConfig,
    store: BlockStore,
    journal: JournalFile,
    index: Index,
    blocks: Fills<(u64, u32), Option<W>>,
    probes: HashMap<Vec<u8>, Vec<W>>,
    files: HashMap<u64, Arc<File>>,
    /// Fetches running on any shard, by job id.
    running: HashMap<u64, Job>,
    queue: VecDeque<Job>,
    next_job: u64,
    next_version: u64,
    /// Notices for each shard's waiters.
    notices: Vec<Vec<Notice<W>>>,
    /// Shards with notices since they last took them (to wake).
    to_wake: Vec<bool>,
    /// Blocks fetched from the origin (for the coalescing ratio).
    pub blocks_fetched: u64,
    /// Blocks found corrupt on a read and fetched again.
    pub blocks_corrupt: u64,
    /// Which versions go when the budget is passed (None: no `max_bytes`). Versions being
    /// read or filled are pinned and never evicted.
    evict: Option<S3Fifo<u64>>,
    /// Versions evicted, for the metrics.
    pub versions_evicted: u64,
}

/// One shard's handle on the shared fill: its own fetches (`Filler`, on its ring), and the
/// shared `FillCore`.
pub struct CacheFill<W: Clone + PartialEq + Routed> {
    core: Arc<Mutex<FillCore<W>>>,
    shard: usize,
    filler: Filler,
    store: BlockStore,
    events: Vec<FillEvent>,
    /// Slots given back by ended fetches, for the caller.
    freed: Vec<ArenaSlot>,
}

/// The index, read under the shared lock (`CacheFill::index`).
pub struct IndexGuard<'a, W: Clone + PartialEq + Routed>(MutexGuard<'a, FillCore<W>>);

impl<W: Clone + PartialEq + Routed> std::ops::Deref for IndexGuard<'_, W> {
    type Target = Index;
    fn deref(&self) -> &Index {
        &self.0.index
    }
}

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// Opens the cache in `dir` (replays its journal) for `shards` shards.
    pub fn open(dir: &Path, cfg: FillConfig, shards: usize) -> std::io::Result<FillCore<W>> {
        assert!(cfg.max_run_blocks > 0 && cfg.max_attempts > 0 && shards > 0);
        let store = BlockStore::open(dir)?;
        let (journal, index, _) = JournalFile::open(&dir.join("journal"))?;
        let next_version = index.max_version() + 1;
        let evict = (cfg.max_bytes > 0).then(|| S3Fifo::new(cfg.max_bytes));
        let mut core = FillCore {
            blocks: Fills::new(cfg.max_attempts),
            cfg,
            store,
            journal,
            index,
            probes: HashMap::new(),
            files: HashMap::new(),
            running: HashMap::new(),
            queue: VecDeque::new(),
            next_job: 0,
            next_version,
            notices: (0..shards).map(|_| Vec::new()).collect(),
            to_wake: vec![false; shards],
            blocks_fetched: 0,
            blocks_corrupt: 0,
            evict,
            versions_evicted: 0,
        };
        // What the journal holds counts against the budget (a smaller budget evicts now).
        let mut evicted = Vec::new();
        let held: Vec<(u64, u64)> = core
            .index
            .each_version()
            .map(|v| (v.version, v.size))
            .collect();
        if let Some(e) = core.evict.as_mut() {
            for (version, size) in held {
                e.insert(version, size, &mut evicted);
            }
        }
        core.drop_versions(&evicted);
        Ok(core)
    }

    /// Journals the drop of `versions` (evicted), forgets them and removes their data files.
    fn drop_versions(&mut self, versions: &[u64]) {
        if versions.is_empty() {
            return;
        }
        let records: Vec<Record> = versions
            .iter()
            .map(|&version| Record::Drop { version })
            .collect();
        if let Err(e) = self.journal.append(&records, true) {
            tracing::error!(error = %e, "cache journal append failed; evicted versions stay");
            return;
        }
        for (&version, record) in versions.iter().zip(records) {
            self.index.apply(record);
            self.files.remove(&version);
            if let Err(e) = self.store.remove_version(version) {
                tracing::warn!(version, error = %e, "removing an evicted version's data file");
            }
            self.versions_evicted += 1;
        }
    }

    /// A response began reading `version`, or a fetch began filling it: it is not evicted
    /// until the matching `unpin`.
    pub fn pin(&mut self, version: u64) {
        if let Some(e) = self.evict.as_mut() {
            e.pin(&version);
        }
    }

    /// The matching end of a `pin`.
    pub fn unpin(&mut self, version: u64) {
        if let Some(e) = self.evict.as_mut() {
            e.unpin(&version);
        }
    }

    /// The index (what is on disk).
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Shards that have notices waiting since the last call (each once).
    pub fn take_wakes(&mut self, out: &mut Vec<usize>) {
        for (shard, w) in self.to_wake.iter_mut().enumerate() {
            if std::mem::take(w) {
                out.push(shard);
            }
        }
    }

    fn notify(&mut self, n: Notice<W>) {
        let w = match &n {
            Notice::Block { waiter, .. }
            | Notice::Known { waiter, .. }
            | Notice::Failed { waiter, .. } => waiter,
        };
        let shard = w.shard().min(self.notices.len() - 1);
        self.notices[shard].push(n);
        self.to_wake[shard] = true;
    }
}

impl<W: Clone + PartialEq + Routed> CacheFill<W> {
    /// A single-shard cache in `dir` (replays its journal) with `filler` for the origins.
    pub fn open(dir: &Path, cfg: FillConfig, filler: Filler) -> std::io::Result<CacheFill<W>> {
        let core = Arc::new(Mutex::new(FillCore::open(dir, cfg, 1)?));
        Ok(CacheFill::attach(core, 0, filler))
    }

    /// Shard `shard`'s handle on the shared `core`, fetching with `filler`.
    pub fn attach(core: Arc<Mutex<FillCore<W>>>, shard: usize, filler: Filler) -> CacheFill<W> {
        let store = lock(&core).store.clone();
        CacheFill {
            core,
            shard,
            filler,
            store,
            events: Vec::new(),
            freed: Vec::new(),
        }
    }

    fn core(&self) -> MutexGuard<'_, FillCore<W>> {
        lock(&self.core)
    }

    /// The index (what is on disk), under the shared lock: do not hold it across calls.
    pub fn index(&self) -> IndexGuard<'_, W> {
        IndexGuard(self.core())
    }

    /// The data files.
    pub fn store(&self) -> &BlockStore {
        &self.store
    }

    /// The filler (this shard's connections and fetches).
    pub fn filler(&self) -> &Filler {
        &self.filler
    }

    /// Blocks fetched from the origin, over all shards.
    pub fn blocks_fetched(&self) -> u64 {
        self.core().blocks_fetched
    }

    /// Blocks found corrupt, over all shards.
    pub fn blocks_corrupt(&self) -> u64 {
        self.core().blocks_corrupt
    }

    /// See `FillCore::want`.
    pub fn want(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.core()
            .want_blocks(key, origin, path, first, last, waiter, false)
    }

    /// See `FillCore::want_streaming`.
    pub fn want_streaming(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.core()
            .want_blocks(key, origin, path, first, last, waiter, true)
    }

    /// See `FillCore::pin`.
    pub fn pin(&mut self, version: u64) {
        self.core().pin(version);
    }

    /// See `FillCore::unpin`.
    pub fn unpin(&mut self, version: u64) {
        self.core().unpin(version);
    }

    /// Versions evicted, over all shards.
    pub fn versions_evicted(&self) -> u64 {
        self.core().versions_evicted
    }

    /// See `FillCore::readable_end`.
    pub fn readable_end(&self, version: u64, from: u64) -> u64 {
        self.core().readable_end(version, from)
    }

    /// `waiter` went away: it hears nothing more (the fetches go on for the cache).
    pub fn cancel(&mut self, waiter: &W) {
        self.core().cancel(waiter);
    }

    /// Starts the queued fetches that may start now on this shard: each takes a slot from
    /// `take_slot` (None: no slot free; they wait) and a connection from its origin's pool.
    pub fn pump<R: RingOps>(
        &mut self,
        ring: &mut R,
        take_slot: &mut dyn FnMut() -> Option<ArenaSlot>,
        now_ms: u64,
    ) {
        let mut core = lock(&self.core);
        core.pump(&mut self.filler, ring, take_slot, &mut self.freed, now_ms);
    }

    /// An `Op::Origin` completion of this shard's fetch.
    pub fn on_completion<R: RingOps>(
        &mut self,
        ring: &mut R,
        token: crate::shard::token::Token,
        res: i32,
        now_ms: u64,
    ) {
        self.filler.on_completion(ring, token, res, now_ms);
        self.filler.take_events(&mut self.events);
        if self.events.is_empty() {
            return;
        }
        let mut core = lock(&self.core);
        core.settle(&mut self.events, &mut self.freed, now_ms);
    }

    /// Ends fetch stages past their deadline (their completions follow).
    pub fn expire(&mut self, now_ms: u64) {
        self.filler.expire(now_ms);
    }

    /// The earliest time (ms) something is due: a fetch deadline or a retry.
    pub fn next_due_ms(&self) -> Option<u64> {
        let retry = self.core().queue.iter().map(|j| j.not_before_ms).min();
        match (self.filler.next_deadline_ms(), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves this shard's notices into `out`, the slots its ended fetches gave back into
    /// `slots`, and the shards to wake (other shards' waiters heard from this shard's
    /// fetches) into `wake`.
    pub fn take(
        &mut self,
        out: &mut Vec<Notice<W>>,
        slots: &mut Vec<ArenaSlot>,
        wake: &mut Vec<usize>,
    ) {
        let mut core = lock(&self.core);
        out.append(&mut core.notices[self.shard]);
        core.to_wake[self.shard] = false;
        core.take_wakes(wake);
        slots.append(&mut self.freed);
    }

    /// Checks the blocks `bytes` (read from `version`'s data file at `file_off`, a block
    /// boundary) holds whole against their checksums; the first that fails is forgotten
    /// and returned.
    pub fn check_blocks(&mut self, version: u64, file_off: u64, bytes: &[u8]) -> Result<(), u32> {
        // The checksums are looked up under the lock; the bytes are summed outside it.
        const MAX: usize = 64;
        let mut want = [(0u32, 0u32, 0usize, 0usize); MAX];
        let mut n = 0;
        {
            let core = self.core();
            let Some(meta) = core.index.meta(version) else {
                return Ok(());
            };
            let b = u64::from(meta.block_bytes);
            debug_assert_eq!(
                file_off % b,
                0,
                "a read of a pulled object starts on a block"
            );
            let mut at = file_off;
            while at < meta.size && n < MAX {
                let len = (meta.size - at).min(b) as usize;
                let start = (at - file_off) as usize;
                if start + len > bytes.len() {
                    break; // ends inside this block: checked by the read that holds it whole
                }
                let block = (at / b) as u32;
                if let Some(crc) = core.index.block_crc(version, block) {
                    want[n] = (block, crc, start, len);
                    n += 1;
                }
                at += b;
            }
        }
        for &(block, crc, start, len) in &want[..n] {
            if crate::cache::checksum(&bytes[start..start + len]) != crc {
                let mut core = self.core();
                core.blocks_corrupt += 1;
                core.index.forget_block(version, block);
                return Err(block);
            }
        }
        Ok(())
    }

    /// See `FillCore::verify_block`.
    pub fn verify_block(&mut self, version: u64, block: u32, buf: &mut Vec<u8>) -> bool {
        self.core().verify_block(version, block, buf)
    }
}

/// The shared lock; a shard that panicked while holding it leaves the bookkeeping as it was
/// (every change is applied whole before the journal or a notice hears of it).
fn lock<W: Clone + PartialEq + Routed>(core: &Mutex<FillCore<W>>) -> MutexGuard<'_, FillCore<W>> {
    core.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// `waiter` wants bytes `first..=last` (None: from `first` to the end) of `key`, fetched
    /// from `origin` as `path` when missing; `Ready` once every block of them is on disk.
    pub fn want(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.want_blocks(key, origin, path, first, last, waiter, false)
    }

    /// As `want`, for a response that streams: `Ready` once the block holding `first` is on
    /// disk (the response reads on up to `readable_end` and wants again from there), and only
    /// that block and the read-ahead after it are asked for now, however long the range.
    pub fn want_streaming(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.want_blocks(key, origin, path, first, last, waiter, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn want_blocks(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
        streaming: bool,
    ) -> Outcome {
        let Some(meta) = self.index.current(key).cloned() else {
            return self.probe(key, origin, path, first, waiter);
        };
        if meta.size == 0 {
            return Outcome::Ready(meta.version);
        }
        let last = last.unwrap_or(meta.size - 1).min(meta.size - 1);
        let first = first.min(last);
        let b = u64::from(meta.block_bytes);
        let (need_last, ahead_last) = if streaming {
            let window = (self.cfg.read_ahead_blocks + 1).saturating_mul(b);
            (
                (first | (b - 1)).min(last),
                first.saturating_add(window - 1).min(last),
            )
        } else {
            (last, last)
        };
        let need = blocks_for(first, need_last, meta.size, meta.block_bytes, 0);
        let mut ahead = blocks_for(
            first,
            ahead_last,
            meta.size,
            meta.block_bytes,
            self.cfg.read_ahead_blocks,
        );
        // The read-ahead window ends on a multiple of its step (the read-ahead, at most a
        // run), so it grows a step at a time: a window sliding one block per want would turn
        // every later request into a one-block run, each paying the origin's first-byte delay.
        // At most `step - 1` blocks are fetched past the read-ahead.
        let step = self.cfg.read_ahead_blocks.min(self.cfg.max_run_blocks);
        if step > 1 {
            ahead.end = ahead.end.next_multiple_of(step).min(meta.blocks());
        }
        let v = meta.version;
        let present = |b: u64| self.index.block_crc(v, b as u32).is_some();
        if need.clone().all(present) {
            if let Some(e) = self.evict.as_mut() {
                e.touch(&v);
            }
            return Outcome::Ready(v);
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return Outcome::Busy;
        }
        // The first missing block this waiter needs is what it waits on; the others of its
        // range and the read-ahead are fetched for nobody in particular.
        let mut waited = false;
        let mut to_fetch = Vec::new();
        for b in ahead.clone() {
            if present(b) {
                continue;
            }
            let w = (!waited && need.contains(&b)).then(|| waiter.clone());
            let is_waiter = w.is_some();
            if !is_waiter && self.blocks.fetching(&(v, b as u32)) {
                // Read-ahead already under way: nobody to add to its list.
                continue;
            }
            match self.blocks.want((v, b as u32), w) {
                Ask::Fetch => to_fetch.push(b),
                Ask::Wait => {}
                Ask::PassThrough if is_waiter => return Outcome::Busy,
                Ask::PassThrough => continue,
            }
            waited |= is_waiter;
        }
        let runs = missing_runs(ahead, |b| !to_fetch.contains(&b), self.cfg.max_run_blocks);
        for run in runs {
            let job = Job {
                key: key.to_vec(),
                origin,
                path: path.to_owned(),
                version: v,
                first: run.start as u32,
                last: (run.end - 1) as u32,
                probe: false,
                not_before_ms: 0,
                committed: Vec::new(),
                pinned: false,
            };
            self.queue.push_back(job);
        }
        Outcome::Waiting
    }

    /// An unknown object: its first fetch starts at the block of byte `first` (a cold Range
    /// in the middle of a large object fetches its own blocks, not the object's start) and
    /// learns the size from the head.
    fn probe(&mut self, key: &[u8], origin: usize, path: &str, first: u64, waiter: W) -> Outcome {
        if let Some(waiters) = self.probes.get_mut(key) {
            if waiters.len() >= MAX_PROBE_WAITERS {
                return Outcome::Busy;
            }
            waiters.push(waiter);
            return Outcome::Waiting;
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return Outcome::Busy;
        }
        self.probes.insert(key.to_vec(), vec![waiter]);
        let version = self.next_version;
        self.next_version += 1;
        let start = u32::try_from(first / u64::from(self.cfg.block_bytes)).unwrap_or(u32::MAX);
        let run = self.cfg.read_ahead_blocks.min(self.cfg.max_run_blocks - 1) as u32;
        self.queue.push_back(Job {
            key: key.to_vec(),
            origin,
            path: path.to_owned(),
            version,
            first: start,
            last: start.saturating_add(run),
            probe: true,
            not_before_ms: 0,
            committed: Vec::new(),
            pinned: false,
        });
        Outcome::Waiting
    }

    /// Where the committed bytes of `version` that start at byte `from`'s block end: the
    /// end of the last block of the run of present blocks from there (`from` itself when its
    /// block is missing).
    pub fn readable_end(&self, version: u64, from: u64) -> u64 {
        let Some(meta) = self.index.meta(version) else {
            return from;
        };
        let b = u64::from(meta.block_bytes);
        let mut block = from / b;
        while block < meta.blocks() && self.index.block_crc(version, block as u32).is_some() {
            block += 1;
        }
        (block * b).min(meta.size).max(from)
    }

    /// `waiter` went away: it hears nothing more (the fetches go on for the cache).
    pub fn cancel(&mut self, waiter: &W) {
        for waiters in self.probes.values_mut() {
            waiters.retain(|w| w != waiter);
        }
        let waiter = Some(waiter.clone());
        for j in self.running.values().chain(self.queue.iter()) {
            for b in j.first..=j.last {
                self.blocks.cancel((j.version, b), &waiter);
            }
        }
    }

    /// Starts the queued fetches that may start now: each takes a slot from `take_slot`
    /// (None: no slot free; they wait) and a connection from its origin's pool.
    fn pump<R: RingOps>(
        &mut self,
        filler: &mut Filler,
        ring: &mut R,
        take_slot: &mut dyn FnMut() -> Option<ArenaSlot>,
        freed: &mut Vec<ArenaSlot>,
        now_ms: u64,
    ) {
        let mut waiting = VecDeque::new();
        while let Some(job) = self.queue.pop_front() {
            if job.not_before_ms > now_ms {
                waiting.push_back(job);
                continue;
            }
            let Some(slot) = take_slot() else {
                waiting.push_back(job);
                break;
            };
            let file = match self.data_file(job.version) {
                Ok(f) => f,
                Err(e) => {
                    freed.push(slot);
                    self.give_up(
                        &job,
                        FetchError::Disk(e.raw_os_error().unwrap_or(libc::EIO)),
                    );
                    continue;
                }
            };
            let meta = self
                .index
                .current(&job.key)
                .filter(|m| m.version == job.version);
            let plan = Plan {
                first_block: job.first,
                last_block: job.last,
                block_bytes: meta.map_or(self.cfg.block_bytes, |m| m.block_bytes),
                size: meta.map(|m| m.size),
                etag: meta.map(|m| m.etag.clone()).filter(|e| !e.is_empty()),
                slot_bytes: self.cfg.slot_bytes,
                align_bytes: self.cfg.align_bytes,
                sync_every_blocks: self.cfg.sync_every_blocks,
            };
            let id = self.next_job;
            match filler.begin(ring, id, job.origin, &job.path, plan, slot, file, now_ms) {
                Ok(()) => {
                    self.next_job += 1;
                    let mut job = job;
                    if !job.probe {
                        if let Some(e) = self.evict.as_mut() {
                            job.pinned = e.pin(&job.version);
                        }
                    }
                    self.running.insert(id, job);
                }
                Err(Begin::Wait(slot)) => {
                    freed.push(slot);
                    waiting.push_back(job);
                    // This origin is at its bound; others may not be, but keep the order.
                    break;
                }
                Err(Begin::Refused(slot, why)) => {
                    freed.push(slot);
                    tracing::warn!(origin = job.origin, path = %job.path, %why, "origin fetch refused");
                    self.give_up(&job, FetchError::Connection(libc::EINVAL));
                }
            }
        }
        waiting.append(&mut self.queue);
        self.queue = waiting;
    }

    fn data_file(&mut self, version: u64) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.files.get(&version) {
            return Ok(f.clone());
        }
        let f = Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_DIRECT)
                .open(self.store.data_path(version))?,
        );
        self.files.insert(version, f.clone());
        Ok(f)
    }

    fn settle(&mut self, events: &mut Vec<FillEvent>, freed: &mut Vec<ArenaSlot>, now_ms: u64) {
        // Blocks committed together (one sync of the data file) are journaled together (one
        // synced append), before anything else of theirs happens.
        let mut commits: Vec<(u64, Record)> = Vec::new();
        for e in events.drain(..) {
            if let FillEvent::Committed { job, block, crc } = e {
                if let Some(j) = self.running.get(&job) {
                    let version = j.version;
                    commits.push((
                        job,
                        Record::Block {
                            version,
                            block,
                            crc,
                        },
                    ));
                }
                continue;
            }
            self.commit(&mut commits);
            match e {
                FillEvent::Head { job, facts } => self.on_head(job, facts),
                FillEvent::Ended { job, error, slot } => {
                    freed.push(slot);
                    self.on_ended(job, error, now_ms);
                }
                FillEvent::Committed { .. } => unreachable!("handled above"),
            }
        }
        self.commit(&mut commits);
    }

    /// Journals `commits` in one synced append, then makes them visible: index, fetches'
    /// bookkeeping, waiters.
    fn commit(&mut self, commits: &mut Vec<(u64, Record)>) {
        if commits.is_empty() {
            return;
        }
        let records: Vec<Record> = commits.iter().map(|(_, r)| r.clone()).collect();
        if let Err(e) = self.journal.append(&records, true) {
            // Not journaled: not visible. Their waiters hear of it when the fetch ends.
            tracing::error!(error = %e, "cache journal append failed; the blocks are not stored");
            commits.clear();
            return;
        }
        for (job, record) in commits.drain(..) {
            let Record::Block { version, block, .. } = record else {
                continue;
            };
            if let Some(j) = self.running.get_mut(&job) {
                j.committed.push(block);
            }
            self.blocks_fetched += 1;
            self.index.apply(record);
            for waiter in self.blocks.arrived((version, block)).into_iter().flatten() {
                self.notify(Notice::Block {
                    waiter,
                    version,
                    block,
                });
            }
        }
    }

    fn on_head(&mut self, id: u64, facts: HeadFacts) {
        let job = self.running.get_mut(&id).expect("a running job");
        if !job.probe {
            return;
        }
        let meta = ObjectVersion {
            key: job.key.clone(),
            version: job.version,
            size: facts.size,
            block_bytes: self.cfg.block_bytes,
            fetched_unix_s: unix_now_s(),
            etag: facts.etag.unwrap_or_default(),
            last_modified: facts.last_modified.unwrap_or_default(),
            content_type: facts.content_type.unwrap_or_default(),
        };
        let record = Record::Object(meta);
        if let Err(e) = self.journal.append(std::slice::from_ref(&record), true) {
            tracing::error!(error = %e, "cache journal append failed; the object is not stored");
            return;
        }
        let (version, key) = (job.version, job.key.clone());
        if facts.whole {
            job.first = 0;
        }
        let size = facts.size;
        self.index.apply(record);
        // The new version counts against the budget from now; its fill pins it.
        let mut evicted = Vec::new();
        if let Some(e) = self.evict.as_mut() {
            // Pinned as it goes in: its own insert never evicts it (an object larger than the
            // whole budget stays while it fills and is read, past the budget until it goes).
            e.insert_pinned(version, size, &mut evicted);
            job.pinned = true;
        }
        self.drop_versions(&evicted);
        let job = self.running.get_mut(&id).expect("a running job");
        // The probe's own blocks are being fetched: register them so wants coalesce on them.
        let (first, last) = (job.first, job.last);
        for b in first..=last {
            if self
                .index
                .current(&key)
                .is_some_and(|m| u64::from(b) < m.blocks())
            {
                let _ = self.blocks.want((version, b), None);
            }
        }
        for waiter in self.probes.remove(&key).unwrap_or_default() {
            self.notify(Notice::Known { waiter, version });
        }
    }

    fn on_ended(&mut self, id: u64, error: Option<FetchError>, now_ms: u64) {
        let mut job = self.running.remove(&id).expect("a running job");
        if std::mem::take(&mut job.pinned) {
            self.unpin(job.version);
        }
        let Some(error) = error else {
            // A 200 to a range can commit more than the run; blocks of the run not committed
            // (none, when the origin kept to the plan) fall through to the failure path below.
            if (job.first..=job.last)
                .all(|b| job.committed.contains(&b) || !self.block_in_object(job.version, b))
            {
                return;
            }
            return self.retry_or_fail(job, FetchError::Overrun, now_ms);
        };
        if error == FetchError::Stale {
            // A kept-alive connection the origin had closed: again at once, not an attempt.
            let mut again = job;
            again.committed.clear();
            again.pinned = false;
            self.queue.push_front(again);
            return;
        }
        self.retry_or_fail(job, error, now_ms);
    }

    fn block_in_object(&self, version: u64, block: u32) -> bool {
        self.index
            .meta(version)
            .is_some_and(|m| u64::from(block) < m.blocks())
    }

    fn retry_or_fail(&mut self, job: Job, error: FetchError, now_ms: u64) {
        if job.probe && self.index.meta(job.version).is_none() {
            // The head never came: the probe's waiters get the error (retried like a block).
            return self.give_up(&job, error);
        }
        if matches!(error, FetchError::VersionChanged) {
            return self.give_up(&job, error);
        }
        let missing: Vec<u32> = (job.first..=job.last)
            .filter(|b| !job.committed.contains(b) && self.block_in_object(job.version, *b))
            .collect();
        let mut retry = Vec::new();
        for b in missing {
            match self.blocks.failed((job.version, b)) {
                Failed::Retry { attempt } => retry.push((b, attempt)),
                Failed::GiveUp(waiters) => {
                    for waiter in waiters.into_iter().flatten() {
                        self.notify(Notice::Failed {
                            waiter,
                            error: error.clone(),
                        });
                    }
                }
            }
        }
        let present = |b: u64| !retry.iter().any(|&(r, _)| u64::from(r) == b);
        let Some(&(_, attempt)) = retry.first() else {
            return;
        };
        let wait = retry_after_ms(attempt, job.version ^ u64::from(job.first)).unwrap_or(0);
        for run in missing_runs(
            u64::from(job.first)..u64::from(job.last) + 1,
            present,
            self.cfg.max_run_blocks,
        ) {
            self.queue.push_back(Job {
                first: run.start as u32,
                last: (run.end - 1) as u32,
                probe: false,
                not_before_ms: now_ms + wait,
                committed: Vec::new(),
                pinned: false,
                ..job.clone()
            });
        }
    }

    fn give_up(&mut self, job: &Job, error: FetchError) {
        if job.probe {
            for waiter in self.probes.remove(&job.key).unwrap_or_default() {
                self.notify(Notice::Failed {
                    waiter,
                    error: error.clone(),
                });
            }
        }
        for b in job.first..=job.last {
            if let Failed::GiveUp(waiters) = self.give_up_block(job.version, b) {
                for waiter in waiters.into_iter().flatten() {
                    self.notify(Notice::Failed {
                        waiter,
                        error: error.clone(),
                    });
                }
            }
        }
    }

    fn give_up_block(&mut self, version: u64, block: u32) -> Failed<Option<W>> {
        loop {
            match self.blocks.failed((version, block)) {
                Failed::Retry { .. } => continue,
                g => return g,
            }
        }
    }

    /// Reads block `block` of `version` back and checks it; a block that fails its checksum
    /// is forgotten (the next want fetches it again, alone) and counted.
    pub fn verify_block(&mut self, version: u64, block: u32, buf: &mut Vec<u8>) -> bool {
        let Some(meta) = self.index.meta(version).cloned() else {
            return false;
        };
        let Some(crc) = self.index.block_crc(version, block) else {
            return false;
        };
        match self.store.read_block(&meta, block, crc, buf) {
            Ok(()) => true,
            Err(ReadError::Corrupt) => {
                self.blocks_corrupt += 1;
                self.index.forget_block(version, block);
                false
            }
            Err(_) => false,
        }
    }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
