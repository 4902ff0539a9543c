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
//! - **Nothing here blocks a shard.** Records, data-file creates and unlinks are queued for the
//!   cache's I/O thread (`cache_io`: group commit), and a shard learns whether the fill has
//!   anything for it from `Signals`, without the lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::cache_io::{self, Done, IoShared, Outbox};
use super::{Begin, FillEvent, Filler};
use crate::cache::blocks::{blocks_for, missing_runs};
use crate::cache::coalesce::{Ask, Failed, Fills};
use crate::cache::disks::Journals;
use crate::cache::evict::S3Fifo;
use crate::cache::index::{Index, ObjectVersion};
use crate::cache::store::{BlockStore, ReadError};
use crate::cache::{journal::Record, record::Freshness};
use crate::config::origin::CachePolicy;
use crate::origin::contract::{self, Contract};
use crate::origin::fetch::{FetchError, HeadFacts, Plan, Storing};
use crate::origin::pool::retry_after_ms;
use crate::origin::response::Unusable;
use crate::ring_api::ops::RingOps;
use crate::ring_api::slots::ArenaSlot;

mod disk_failure;
mod fill_core;
mod handle;
mod handover;
mod opening;
mod pins;
mod purge;
mod sharing;
pub use handover::Handover;
mod remembered;

/// Most wants that may wait for an unknown object's head (past it: `Outcome::Busy`).
pub const MAX_PROBE_WAITERS: usize = 4096;
/// Most fetches waiting for a slot or a connection (past it: `Outcome::Busy`).
pub const MAX_QUEUED_FETCHES: usize = 4096;
/// Blocks a stream that did not start at an object's start reads ahead at first (1 MiB in
/// 64 KiB blocks, 4 MiB in 256 KiB ones), before the blocks behind it show it sequential.
pub const INITIAL_READ_AHEAD_BLOCKS: u64 = 16;
/// Closed requests remembered per version to tell a sequential client (its next range starts
/// where one ended) from one that jumps.
pub const RECENT_ENDS_PER_VERSION: usize = 4;
/// Versions whose recent request ends are remembered at once; past it the memory is cleared
/// (a request then gets no read-ahead past its end until its stream is seen again).
pub const MAX_RECENT_END_VERSIONS: usize = 65_536;

/// The last bytes of a version's last `RECENT_ENDS_PER_VERSION` closed requests (a ring).
#[derive(Clone, Copy, Debug, Default)]
struct RecentEnds {
    last_bytes: [Option<u64>; RECENT_ENDS_PER_VERSION],
    next: usize,
}

impl RecentEnds {
    /// Whether a request starting at byte `start` continues one of them, judged by blocks
    /// (`block_bytes`) as the kernel judges by pages: it starts in the block after the one an
    /// end is in, or later in that same block.
    fn continued_by(&self, start: u64, block_bytes: u64) -> bool {
        let s = start / block_bytes;
        self.last_bytes.iter().flatten().any(|&e| {
            let b = e / block_bytes;
            s == b + 1 || (s == b && start > e)
        })
    }

    fn note(&mut self, last: u64) {
        if self.last_bytes.contains(&Some(last)) {
            return;
        }
        self.last_bytes[self.next] = Some(last);
        self.next = (self.next + 1) % RECENT_ENDS_PER_VERSION;
    }
}

/// Most blocks one `FillCore::scrub_next` call looks at (a hold of the lock stays short).
pub const SCRUB_SCAN_BLOCKS: u32 = 4096;

/// One block for the scrub to read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubBlock {
    /// The run's first block.
    pub block: u32,
    /// Blocks in the run: consecutive, all on disk.
    pub count: usize,
    /// Each block's journaled checksum (the first `count`).
    pub crcs: [u32; SCRUB_RUN_BLOCKS_MAX],
    /// Where the first block starts in the data file.
    pub offset: u64,
    /// The version's block size (the object's last block may be shorter).
    pub block_bytes: usize,
    /// The object's size.
    pub size: u64,
}

impl ScrubBlock {
    /// Bytes of the run's `i`th block.
    pub fn block_len(&self, i: usize) -> usize {
        let offset = self.offset + (i * self.block_bytes) as u64;
        ((self.size - offset) as usize).min(self.block_bytes)
    }

    /// Bytes of the whole run.
    pub fn run_bytes(&self) -> usize {
        (self.count - 1) * self.block_bytes + self.block_len(self.count - 1)
    }
}

/// Most consecutive blocks one scrub read takes (an arena slot bounds it too).
pub const SCRUB_RUN_BLOCKS_MAX: usize = 8;

/// What `FillCore::scrub_next` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubStep {
    /// A run of blocks to read back.
    Block(ScrubBlock),
    /// None on disk up to here (exclusive): ask again from it.
    Skip(u32),
    /// The version is done (or gone).
    Done,
}

/// Shortest pause a `Retry-After` makes (a `0` or a past date would otherwise send the fetch
/// straight back to an origin that just refused it).
pub const MIN_ORIGIN_PAUSE_S: u64 = 1;

/// How far one want fetches ahead (`FillCore::read_ahead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReadAhead {
    /// Blocks past the one being read, within the request.
    within: u64,
    /// Blocks past a closed request's last block.
    past_end: u64,
}
/// Most keys whose 404 is remembered at once (past it the oldest is forgotten early).
pub const MAX_NOT_FOUND_KEYS: usize = 65_536;
/// How long a key whose reply may not be stored (`no-store`, `private`, `Vary`) is passed
/// through without asking the fill first (Varnish's hit-for-pass): its replies are each
/// client's own until then.
pub const HIT_FOR_PASS_S: u64 = 120;
/// Most keys remembered as not storable at once (the oldest go first).
pub const MAX_PASS_KEYS: usize = 65_536;
/// Longest an origin's 404 may be remembered (a limit the config checks, so it lives there).
pub use crate::config::MAX_NOT_FOUND_S;
/// Smallest journal a compaction rewrites (below it, dead records cost nothing worth a
/// rewrite).
pub const COMPACT_MIN_BYTES: u64 = 4 << 20;
/// The journal is compacted once dead records (superseded, dropped, forgotten) pass this
/// share of it, so it stays within 1 / (1 - 0.4) < 2x the live index's records.
pub const COMPACT_DEAD_PERCENT: u64 = 40;

/// After a revalidation the origin could not answer (down, slow, a 5xx), the cached version
/// is served this long before the origin is asked again.
pub const REVALIDATE_RETRY_S: u64 = 10;

/// The bit that marks a pass-through fetch's job id (the shared fill's own ids, counted
/// from 1, never reach it).
pub const PASS_THROUGH_JOB_BIT: u64 = 1 << 63;

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
    /// Seconds a version is served after the origin last confirmed it; then the next request
    /// revalidates it first (0: every request does).
    pub revalidate_s: u64,
    /// Longest heuristic lifetime of a reply with only a Last-Modified (`cache_heuristic_max_s`).
    pub heuristic_max_s: u64,
    /// Seconds an origin's 404 is remembered: the key's requests get it without asking the
    /// origin (0: never remembered).
    pub not_found_s: u64,
    /// Each origin's name for log lines (index = its `[[origin]]` entry).
    pub origin_names: Vec<String>,
    /// Each origin's policy (index = its `[[origin]]` entry; absent: the origin's contract
    /// and `DEFAULT_STALE_IF_ERROR_S`).
    pub origin_policies: Vec<OriginPolicy>,
    /// Most data files kept open for writing (`cache_open_files`).
    pub open_files: usize,
    /// Smallest journal a compaction rewrites (`COMPACT_MIN_BYTES`; tests lower it).
    pub compact_min_bytes: u64,
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
    /// The origin answered this status for the key lately (a remembered 404): it is the
    /// answer, without asking the origin again.
    Refused(u16),
    /// The key's replies may not be stored lately (`HIT_FOR_PASS_S`): the request makes its
    /// own origin fetch.
    Pass,
    /// The cache's index is still loading (`FillCore::loading`): the request makes its own
    /// origin fetch, and nothing is stored until the load is done.
    Loading,
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
    /// A conditional request that confirms `version` (or finds it replaced).
    revalidate: bool,
    not_before_ms: u64,
    /// Blocks of the run committed so far.
    committed: Vec<u32>,
    /// The fetch holds a pin on its version (unpinned when it ends).
    pinned: bool,
    /// The shard that runs it: the one whose request asked (each shard runs its own
    /// fetches on its own ring and slots, so a cold fill on one never costs another's CPU).
    shard: usize,
}

/// Who a notice goes to: the shard that holds the waiting connection.
pub trait Routed: Send + 'static {
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
    /// Per version, where its last few closed requests ended (their last byte): a closed
    /// request that starts right after one of them continues it (read-ahead past its end).
    recent_ends: HashMap<u64, RecentEnds>,
    /// Versions pinned against eviction until a time (`shardline cache prefill --pin-until`):
    /// version -> Unix seconds. In memory only: a restart keeps the objects, not the pins.
    pinned_until: HashMap<u64, u64>,
    store: BlockStore,
    /// The journal, when this thread writes it (`cache_io`'s inline mode); None when the
    /// cache's I/O thread owns it.
    journal: Option<Journals>,
    /// The journal's bytes (as of the last batch written).
    journal_bytes: u64,
    /// Records, creates and unlinks queued for the I/O (`cache_io`).
    outbox: Outbox,
    /// Sequence number of the next record queued.
    next_seq: u64,
    /// Every record numbered below this is settled: durable, or its batch failed.
    settled_seq: u64,
    /// Sequence numbers of records whose batch failed (never durable), and the disk whose
    /// full journal failed it, if that was why (`disks::full_journal`).
    failed_seqs: Vec<(std::ops::Range<u64>, Option<usize>)>,
    /// Fetches with a committed block its own disk's full journal refused: ended short of
    /// their blocks, they end on the full disk (their waiters pass through), not as an
    /// overrun retried into the same journal.
    journal_lost: HashSet<u64>,
    /// What waits for records to be durable before it happens, in order (a block or an object
    /// is visible only after its record), and the fetch events behind them.
    deferred: VecDeque<Deferred>,
    /// Data files being created by the I/O thread, and the errno of those it could not.
    opening: HashSet<u64>,
    open_errors: HashMap<u64, i32>,
    /// The shard holding the lock now (`CacheFill::core`; the queue it fills is its).
    holder: usize,
    /// `flush` is running (inline: a flush reached from inside one only queues).
    flushing: bool,
    index: Index,
    blocks: Fills<(u64, u32), Option<W>>,
    probes: HashMap<Vec<u8>, Vec<W>>,
    /// Data files open for writing, with when each was last used (at most
    /// `FillConfig::open_files`; the least recently used is closed first).
    files: HashMap<u64, (Arc<File>, u64)>,
    /// The use counter `files` is stamped with.
    file_uses: u64,
    /// Fetches running on any shard, by job id.
    running: HashMap<u64, Job>,
    /// Jobs given up at a disk's deadline, until `FillEvent::Released`: the disk holding each.
    given_up: HashMap<u64, usize>,
    /// Inline only: `online` outcomes not yet told (`reopen_outcome`).
    reopen_outcomes: Vec<(usize, Result<bool, String>)>,
    queue: VecDeque<Job>,
    /// Each origin's pause (its 429/503 with `Retry-After`): no fetch to it starts before this
    /// (ms of the shards' clock; 0: none).
    paused_until_ms: Vec<u64>,
    /// Pauses asked by origins, for the metrics.
    pub origin_pauses: u64,
    /// `origin_pauses` by origin.
    pauses_by_origin: Vec<u64>,
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
    /// Versions held at start-up that `evict` does not count yet: a loaded edge serves
    /// hits at once and counts them a step at a time (`count_for_eviction`), since hits
    /// need the index, not the eviction's table.
    uncounted: Vec<u64>,
    /// Versions evicted, for the metrics.
    pub versions_evicted: u64,
    /// Responses and fetches using each version (a retired version goes at its last unpin).
    pins: HashMap<u64, u32>,
    /// Versions the origin replaced, still read or filled: dropped when their pins end.
    retired: HashSet<u64>,
    /// Versions whose revalidation the origin could not answer: served until then (Unix s).
    revalidate_after: HashMap<u64, u64>,
    /// Revalidations under way whose reply's head came: its fields, to renew the version's
    /// contract with when it ends (`revalidated`), by job id.
    refreshed: HashMap<u64, Box<crate::origin::contract::HeadFields>>,
    /// Keys whose 404 is remembered (`cache_404_s`).
    not_found: remembered::Remembered,
    /// Keys whose replies a shared cache may not store, for `HIT_FOR_PASS_S`: their requests
    /// go to their own origin fetch at once.
    pass_keys: remembered::Remembered,
    /// Replies handed over since the settling shard last took them (`Handover`).
    handovers: Vec<Handover<W>>,
    /// Waits that joined a fetch (or probe) already under way, and waits that started one:
    /// the coalescing ratio is joined / (joined + started).
    pub waits_joined: u64,
    /// See `waits_joined`.
    pub waits_started: u64,
    /// Fills given up because the cache's disk had no room.
    pub disk_full: u64,
    /// Versions dropped since each shard last looked (it closes their data files).
    dropped: Vec<Vec<u64>>,
    /// What shards read without the lock (published as it is let go).
    signals: Arc<Signals>,
    /// Shards to wake, gathered as the lock is let go (kept for its capacity).
    wake_scratch: Vec<usize>,
    /// Versions published for lock-free hits (`HotVersion`).
    hot: HashMap<u64, Arc<HotVersion>>,
    /// Batches being settled (kept for its capacity).
    done_scratch: Vec<Done>,
    /// A compaction's snapshot is being written.
    compacting: bool,
    /// Compactions finished.
    pub compactions: u64,
    /// The core of a cache whose disks are still loading (`FillCore::loading`): no disk is
    /// open, nothing is stored, every request passes through.
    loading: bool,
}

/// Blocks a `CrcWindow` holds.
pub const CRC_WINDOW_BLOCKS: u32 = 64;

/// The checksums of up to `CRC_WINDOW_BLOCKS` consecutive blocks of one version, copied under
/// the fill's lock so that a response checks its reads without taking it. A version's blocks
/// never change their bytes, so a checksum copied once stays right: a block found corrupt
/// since still has it (its bytes on the disk are what is wrong), and one fetched again has it
/// again.
#[derive(Clone, Copy, Debug)]
pub struct CrcWindow {
    version: u64,
    /// The version's size and block size (size 0: nothing copied yet, or the version is gone).
    size: u64,
    block_bytes: u32,
    first: u32,
    present: u64,
    crc: [u32; CRC_WINDOW_BLOCKS as usize],
}

impl CrcWindow {
    /// A window holding nothing.
    pub const EMPTY: CrcWindow = CrcWindow {
        version: 0,
        size: 0,
        block_bytes: 1,
        first: 0,
        present: 0,
        crc: [0; CRC_WINDOW_BLOCKS as usize],
    };

    /// Block `block`'s checksum, if the window holds it.
    pub fn get(&self, block: u32) -> Option<u32> {
        let i = block.checked_sub(self.first)?;
        (i < CRC_WINDOW_BLOCKS && self.present & (1 << i) != 0).then(|| self.crc[i as usize])
    }

    /// Forgets block `block` (found corrupt: looked up again after it is fetched again).
    fn forget(&mut self, block: u32) {
        if let Some(i) = block
            .checked_sub(self.first)
            .filter(|&i| i < CRC_WINDOW_BLOCKS)
        {
            self.present &= !(1 << i);
        }
    }
}

/// Most blocks a version may have to be published for lock-free hits (its checksums are
/// copied whole: 256 KiB of them at most).
pub const HOT_MAX_BLOCKS: u64 = 65_536;
/// Most versions published at once; past it every publication is withdrawn (invalid) and
/// the hits publish again what they still ask for.
pub const HOT_MAX_VERSIONS: usize = 65_536;

/// A version every block of which is on disk, published for hits that take no lock: its
/// metadata and every block's checksum, copied once. Immutable but for `invalid`, set under
/// the lock when the version stops being what a hit may serve (replaced, dropped, past its
/// freshness, a block found corrupt): the next hit then takes the locked path.
#[derive(Debug)]
pub struct HotVersion {
    /// The version.
    pub meta: ObjectVersion,
    /// Every block's checksum (a version's bytes never change: these stay right).
    pub crcs: Box<[u32]>,
    /// Served without asking the origin until then (Unix seconds).
    pub fresh_until_s: u64,
    invalid: AtomicBool,
}

impl HotVersion {
    /// Whether a hit may still be served from it.
    pub fn valid(&self) -> bool {
        !self.invalid.load(Ordering::Acquire)
    }

    /// A window of its checksums from the block holding byte `from`.
    pub fn window(&self, from: u64) -> CrcWindow {
        let mut w = CrcWindow::EMPTY;
        w.version = self.meta.version;
        w.size = self.meta.size;
        w.block_bytes = self.meta.block_bytes;
        w.first = u32::try_from(from / u64::from(self.meta.block_bytes)).unwrap_or(u32::MAX);
        for i in 0..CRC_WINDOW_BLOCKS {
            if let Some(&crc) = self.crcs.get((w.first as usize).saturating_add(i as usize)) {
                w.crc[i as usize] = crc;
                w.present |= 1 << i;
            }
        }
        w
    }
}

/// What waits for the journal (`FillCore::deferred`).
#[derive(Debug)]
enum Deferred {
    /// A block is visible once its record (`seq`) is durable.
    Commit {
        seq: u64,
        job: u64,
        version: u64,
        block: u32,
        crc: u32,
    },
    /// A fetch ended (after everything queued before it).
    Ended {
        job: u64,
        error: Option<FetchError>,
        now_ms: u64,
    },
}

/// A block a read of a pulled version must not send (`CacheFill::check_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadBlock {
    /// Its bytes fail their checksum: dropped now, to be fetched again.
    Corrupt(u32),
    /// Another read found it corrupt and dropped it while this one was under way.
    Dropped(u32),
    /// The read could not be judged now: another thread held the lock it needed (for the
    /// block's checksum, or to drop a bad block). Read again at a later tick.
    LockBusy,
}

/// The shared counters a shard reports (one lock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillStats {
    /// Versions evicted under the budget.
    pub versions_evicted: u64,
    /// Waits that joined a fetch under way.
    pub waits_joined: u64,
    /// Waits that started a fetch.
    pub waits_started: u64,
    /// Fills given up because the cache's disk had no room.
    pub disk_full: u64,
    /// Pauses asked by origins (429 or 503 with `Retry-After`).
    pub origin_pauses: u64,
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
    /// First-byte times between the filler and the metrics (kept for its capacity).
    samples: Vec<u64>,
    /// Events of pass-through fetches, for the shard (`take_pass_through_events`).
    pass_events: Vec<FillEvent>,
    /// The next pass-through job id (below `PASS_THROUGH_JOB_BIT`).
    next_pass: u64,
    /// What this shard reads without the lock.
    signals: Arc<Signals>,
    /// What this shard owes the core at its next hold of the lock (it never waits for it).
    pending: Pending<W>,
    /// A fetch ended while another shard was refused its origin's budget: the shards with
    /// queued fetches are woken at the next hold.
    budget_freed: bool,
    /// The arena slot's size (fixed at start-up: read without the lock).
    slot_bytes: usize,
    /// `FillConfig::revalidate_s` (fixed at start-up: read without the lock).
    revalidate_s: u64,
    /// `FillConfig::block_bytes` (fixed at start-up: read without the lock).
    block_bytes: u32,
    /// Replies handed over (`Handover`), for the shard (`take_handovers`).
    handovers: Vec<Handover<W>>,
    /// Fetches handed over, by job id: whether the shard took it (`claim_handed`,
    /// `drop_handed`); till then its events wait in `held`.
    handed: HashMap<u64, bool>,
    /// Events of handed-over fetches not yet taken (at most a piece and the end each).
    held: Vec<FillEvent>,
    /// A fetch ended since the shard last asked (`take_fetch_ended`).
    fetch_ended: bool,
}

/// What a shard owes the shared core and hands it at its next hold of the lock: versions its
/// responses stopped reading (pins to give back) and waiters that went away. A shard never
/// waits for the lock (`try_lock_as`), so these wait for it instead. Bounded by the shard's
/// connections: a pin or a wait is taken under the lock, so none is taken while these wait.
pub(super) struct Pending<W> {
    unpins: Vec<u64>,
    cancels: Vec<W>,
    /// The last attempt was refused: the shard's loop comes back within a millisecond.
    refused: bool,
    /// Attempts refused because another thread held the lock, since start.
    busy: u64,
    /// Refusals made up by the simulator (its one thread never meets a held lock).
    contention: Option<Contention>,
}

impl<W> Default for Pending<W> {
    fn default() -> Self {
        Pending {
            unpins: Vec::new(),
            cancels: Vec::new(),
            refused: false,
            busy: 0,
            contention: None,
        }
    }
}

/// Refuses `percent` % of lock attempts, as another thread holding the lock would (seeded:
/// the simulator's runs stay reproducible).
#[derive(Clone, Copy, Debug)]
pub struct Contention {
    state: u64,
    percent: u8,
}

impl Contention {
    /// Refuses about `percent` % of attempts, in an order fixed by `seed`.
    pub fn new(seed: u64, percent: u8) -> Contention {
        Contention {
            state: seed | 1,
            percent: percent.min(100),
        }
    }

    /// Whether this attempt finds the lock held (xorshift64).
    fn refuses(&mut self) -> bool {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state % 100 < u64::from(self.percent)
    }
}

/// What a pass-through fetch asks the origin for.
#[derive(Clone, Debug)]
pub struct PassThrough<'a> {
    /// The origin's index.
    pub origin: usize,
    /// The path sent to it.
    pub path: &'a str,
    /// The version's block size, size and validators (an answer for another version ends
    /// the fetch).
    pub block_bytes: u32,
    /// The object's size (None: not known yet, its own reply's head says: a request the
    /// cache does not serve, `Outcome::Pass`).
    pub size: Option<u64>,
    /// Its ETag ("" when the origin gave none).
    pub etag: &'a str,
    /// Its Last-Modified ("" when none).
    pub last_modified: &'a str,
    /// The client's `Authorization`, forwarded (a request the cache does not serve).
    pub authorization: Option<&'a str>,
    /// The client's field lines forwarded (`origin::request::forwardable`).
    pub forward: &'a str,
    /// The object's bytes wanted: `from..end`.
    pub from: u64,
    /// One past the last byte wanted.
    pub end: u64,
}

/// An origin entry's word on storing (`[[origin]]` `cache_policy`, `ttl_s`,
/// `stale_if_error_s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginPolicy {
    /// Whose word decides what is stored.
    pub cache_policy: CachePolicy,
    /// The lifetime under `CachePolicy::Override` (None: `revalidate_s`).
    pub ttl_s: Option<u64>,
    /// Seconds past its lifetime a version is still served when revalidation fails, where
    /// the origin gave no `stale-if-error`.
    pub stale_if_error_s: u64,
    /// The field naming a reply's purge tags (`purge_tag_header`).
    pub purge_tag_header: crate::cache::tags::TagHeader,
}

/// What a shard learns from the fill without taking its lock: whether anything waits for it.
/// Published each time the lock is let go (`Locked`), so a shard with nothing to do for the
/// cache this tick never touches the lock.
#[derive(Debug)]
pub struct Signals {
    /// Per shard: notices or dropped versions wait for it.
    news: Box<[AtomicBool]>,
    /// Per shard: fetches queued for it to start.
    queued: Box<[AtomicUsize]>,
    /// Per shard: the earliest queued retry (ms; `u64::MAX`: none).
    next_retry_ms: Box<[AtomicU64]>,
    /// Per shard: a request waits for its own fetch until its origin's fetch budget has
    /// room (`CacheFill::wait_for_budget`).
    budget_waits: Box<[AtomicBool]>,
    /// Per shard: a fetch ended on some shard since then (`CacheFill::take_budget_wake`).
    budget_woken: Box<[AtomicBool]>,
    /// Each shard's eventfd: written for a shard that has news (none: inline, one thread).
    wakers: Option<Arc<Vec<OwnedFd>>>,
    /// The shared counters (`FillStats`): versions evicted, waits joined, waits started,
    /// fills given up on a full disk; then `purge`'s (`purge::PURGED_BY_TAG`, ...).
    stats: [AtomicU64; 7],
    /// The I/O thread's queues (none: inline).
    io: Option<Arc<IoShared>>,
    /// `Index::live_bytes`, for the I/O thread's compaction rule.
    live_bytes: AtomicU64,
    /// Pauses each origin asked for (`FillCore::pauses_by_origin`).
    origin_pauses: Box<[AtomicU64]>,
    /// The core these signals are of was replaced by the loaded one (`install_threaded`):
    /// each shard takes the new one's store and signals at its next hold of the lock.
    replaced: AtomicBool,
}

impl Signals {
    fn new(shards: usize, wakers: Option<Arc<Vec<OwnedFd>>>, io: Option<Arc<IoShared>>) -> Signals {
        Signals {
            news: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            queued: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            next_retry_ms: (0..shards).map(|_| AtomicU64::new(u64::MAX)).collect(),
            budget_waits: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            budget_woken: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            wakers,
            stats: Default::default(),
            io,
            live_bytes: AtomicU64::new(0),
            origin_pauses: (0..crate::config::MAX_ORIGINS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            replaced: AtomicBool::new(false),
        }
    }
}

/// The shared lock, held: on release it publishes the `Signals` and wakes every shard that
/// has news (after the lock is let go).
pub struct Locked<'a, W: Clone + PartialEq + Routed> {
    guard: Option<MutexGuard<'a, FillCore<W>>>,
}

impl<W: Clone + PartialEq + Routed> std::ops::Deref for Locked<'_, W> {
    type Target = FillCore<W>;
    fn deref(&self) -> &FillCore<W> {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl<W: Clone + PartialEq + Routed> std::ops::DerefMut for Locked<'_, W> {
    fn deref_mut(&mut self) -> &mut FillCore<W> {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl<W: Clone + PartialEq + Routed> Drop for Locked<'_, W> {
    fn drop(&mut self) {
        let Some(mut core) = self.guard.take() else {
            return;
        };
        let signals = core.signals.clone();
        let mut wake = std::mem::take(&mut core.wake_scratch);
        core.publish(&mut wake);
        if let Some(io) = signals.io.as_ref() {
            let holder = core.holder;
            io.submit(&mut core.outbox, holder);
        }
        drop(core);
        if let Some(wakers) = signals.wakers.as_ref() {
            for &shard in &wake {
                if let Some(fd) = wakers.get(shard) {
                    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
                }
            }
        }
        wake.clear();
        // Back for its capacity (the next holder's publish fills it again).
        if let Some(mut core) = self.guard.take() {
            core.wake_scratch = wake;
        }
    }
}

/// The index, read under the shared lock (`CacheFill::index`).
pub struct IndexGuard<'a, W: Clone + PartialEq + Routed>(Locked<'a, W>);

impl<W: Clone + PartialEq + Routed> std::ops::Deref for IndexGuard<'_, W> {
    type Target = Index;
    fn deref(&self) -> &Index {
        &self.0.index
    }
}

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// A core over `store` and `journal` with `index` replayed, nothing in flight.
    fn assemble(
        cfg: FillConfig,
        store: BlockStore,
        journal: Option<Journals>,
        index: Index,
        shards: usize,
    ) -> FillCore<W> {
        assert!(cfg.max_run_blocks > 0 && cfg.max_attempts > 0 && shards > 0);
        // Numbers count over every disk (a version's slot is in its top bits).
        let evict = (cfg.max_bytes > 0).then(|| S3Fifo::new(cfg.max_bytes));
        // One pass over the versions: the largest number, and the list eviction counts.
        let mut uncounted = Vec::new();
        if evict.is_some() {
            uncounted.reserve_exact(index.versions());
        }
        let mut last_number = 0;
        for v in index.each_version_id() {
            last_number = last_number.max(crate::cache::version_id::file_number(v));
            if evict.is_some() {
                uncounted.push(v);
            }
        }
        let next_version = last_number + 1;
        let journal_bytes = journal.as_ref().map_or(0, |j| j.len());
        FillCore {
            blocks: Fills::new(cfg.max_attempts),
            cfg,
            store,
            journal,
            journal_bytes,
            outbox: Outbox::default(),
            next_seq: 1,
            settled_seq: 1,
            failed_seqs: Vec::new(),
            journal_lost: HashSet::new(),
            deferred: VecDeque::new(),
            opening: HashSet::new(),
            open_errors: HashMap::new(),
            holder: 0,
            flushing: false,
            index,
            probes: HashMap::new(),
            recent_ends: HashMap::new(),
            pinned_until: HashMap::new(),
            files: HashMap::new(),
            file_uses: 0,
            running: HashMap::new(),
            given_up: HashMap::new(),
            reopen_outcomes: Vec::new(),
            queue: VecDeque::new(),
            next_job: 0,
            next_version,
            notices: (0..shards).map(|_| Vec::new()).collect(),
            to_wake: vec![false; shards],
            blocks_fetched: 0,
            blocks_corrupt: 0,
            evict,
            uncounted,
            versions_evicted: 0,
            pins: HashMap::new(),
            retired: HashSet::new(),
            revalidate_after: HashMap::new(),
            refreshed: HashMap::new(),
            not_found: remembered::Remembered::new(MAX_NOT_FOUND_KEYS),
            pass_keys: remembered::Remembered::new(MAX_PASS_KEYS),
            handovers: Vec::new(),
            waits_joined: 0,
            waits_started: 0,
            disk_full: 0,
            paused_until_ms: Vec::new(),
            origin_pauses: 0,
            pauses_by_origin: Vec::new(),
            dropped: vec![Vec::new(); shards],
            signals: Arc::new(Signals::new(shards, None, None)),
            wake_scratch: Vec::new(),
            done_scratch: Vec::new(),
            hot: HashMap::new(),
            compacting: false,
            compactions: 0,
            loading: false,
        }
    }

    /// Whether dead records have passed `COMPACT_DEAD_PERCENT` of a journal of at least
    /// `compact_min_bytes`.
    pub(super) fn compaction_due(&self) -> bool {
        let len = self.journal_bytes;
        let dead = len.saturating_sub(self.index.live_bytes());
        !self.compacting
            && len >= self.cfg.compact_min_bytes
            && dead * 100 > len * COMPACT_DEAD_PERCENT
    }

    /// Inline mode (the journal held here): rewrites the journal as the live index now, on
    /// this thread, when `compaction_due`.
    fn compact_inline_if_due(&mut self) {
        if !self.compaction_due() {
            return;
        }
        let mut snap = Vec::new();
        self.snapshot(&mut snap);
        let journal = self.journal.as_mut().expect("inline");
        let result = cache_io::compact(journal, &snap);
        let len = journal.len();
        self.compacted(result, len);
    }

    /// Encodes the live index into `out` for a compaction (`compacted` ends it).
    pub(super) fn snapshot(&mut self, out: &mut Vec<u8>) {
        self.compacting = true;
        out.clear();
        out.reserve(self.index.live_bytes() as usize);
        crate::cache::journal::snapshot(&self.index, out);
    }

    /// A compaction ended; the journal is `journal_bytes` long now.
    pub(super) fn compacted(&mut self, result: std::io::Result<()>, journal_bytes: u64) {
        self.compacting = false;
        self.journal_bytes = journal_bytes;
        match result {
            Ok(()) => self.compactions += 1,
            Err(e) => tracing::warn!(
                error = %e,
                "cache journal compaction failed; the journal is kept as it was"
            ),
        }
    }

    /// Queues `record` for the journal; returns its sequence number.
    fn queue_record(&mut self, record: Record) -> u64 {
        if self.outbox.records.is_empty() {
            self.outbox.first_seq = self.next_seq;
        }
        self.outbox.records.push(record);
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Removes `version`'s data file once the records queued before are durable.
    fn queue_unlink(&mut self, version: u64) {
        self.files.remove(&version);
        self.outbox.unlinks.push(version);
    }

    /// Inline mode: carries the outbox out now (nothing when the I/O thread owns the
    /// journal, or when called from inside a flush, which goes on until the outbox is empty).
    fn flush(&mut self) {
        if self.journal.is_none() || self.flushing {
            return;
        }
        self.flushing = true;
        let mut outbox = Outbox::default();
        loop {
            self.take_outbox(&mut outbox);
            if outbox.is_empty() {
                break;
            }
            let journal = self.journal.as_mut().expect("inline");
            let store = &self.store;
            let done = cache_io::run(&mut outbox, journal, &mut |v| {
                cache_io::remove_version(store, v)
            });
            self.io_done(done);
        }
        self.compact_inline_if_due();
        self.flushing = false;
    }

    /// Moves what is queued for the I/O into `out` (the I/O thread's batch).
    pub(super) fn take_outbox(&mut self, out: &mut Outbox) {
        std::mem::swap(&mut self.outbox, out);
        self.outbox.records.clear();
        self.outbox.opens.clear();
        self.outbox.unlinks.clear();
        self.outbox.shards = 0;
    }

    /// A batch's I/O is done: its records are durable (or failed, and never will be), its
    /// data files created. What waited for them happens now, in order.
    pub(super) fn io_done(&mut self, done: Done) {
        self.journal_bytes = done.journal_bytes;
        let end = done.first_seq + done.records;
        if done.records > 0 {
            assert_eq!(done.first_seq, self.settled_seq, "batches settle in order");
            if let Err(e) = &done.appended {
                tracing::error!(error = %e, records = done.records, "cache journal append failed; what it vouched for is not stored");
                let full = crate::cache::disks::full_journal(e);
                self.failed_seqs.push((done.first_seq..end, full));
            }
            self.settled_seq = end;
        }
        let opened = !done.opened.is_empty();
        for (version, file) in done.opened {
            self.opening.remove(&version);
            match file {
                Ok(f) => self.keep_file(version, f),
                Err(errno) => {
                    self.open_errors.insert(version, errno);
                }
            }
        }
        if opened {
            // Fetches waited for these: whichever shard has a slot starts them.
            self.to_wake.iter_mut().for_each(|w| *w = true);
        }
        self.run_deferred();
    }

    /// Carries out what waited for records now settled, in order, up to the first that waits
    /// still.
    fn run_deferred(&mut self) {
        while let Some(front) = self.deferred.front() {
            let seq = match front {
                Deferred::Commit { seq, .. } => Some(*seq),
                Deferred::Ended { .. } => None,
            };
            if seq.is_some_and(|s| s >= self.settled_seq) {
                break;
            }
            // Whether it was in a failed batch (never durable), and the full disk that failed it.
            let failed = seq.and_then(|s| self.failed_seqs.iter().find(|f| f.0.contains(&s)));
            let failed = failed.map(|f| f.1);
            match self.deferred.pop_front().expect("looked at") {
                Deferred::Commit {
                    job,
                    version,
                    block,
                    crc,
                    ..
                } => {
                    // Its own disk's journal was full: the fetch ends on that (`on_ended`).
                    // Another failure leaves the block to be fetched again.
                    if failed == Some(Some(crate::cache::version_id::slot_of(version))) {
                        self.journal_lost.insert(job);
                    } else if failed.is_none() && self.index.contains(version) {
                        self.block_known(job, version, block, crc);
                    }
                }
                Deferred::Ended { job, error, now_ms } => self.on_ended(job, error, now_ms),
            }
        }
        if self.deferred.is_empty() {
            self.failed_seqs.clear();
        }
    }

    /// Journals the drop of `versions` (evicted, or retired and no longer read), forgets them
    /// and removes their data files.
    fn drop_versions(&mut self, versions: &[u64], evicted: bool) {
        if versions.is_empty() {
            return;
        }
        // Forgotten now; the data file goes once the drop is durable (a crash before leaves a
        // journal that vouches for blocks whose file is gone: read as corrupt, fetched again).
        for &version in versions {
            let record = Record::Drop { version };
            self.index.apply(record.clone());
            self.invalidate_hot(version);
            self.queue_record(record);
            self.queue_unlink(version);
            self.retired.remove(&version);
            self.revalidate_after.remove(&version);
            self.pinned_until.remove(&version);
            self.recent_ends.remove(&version);
            if let Some(e) = self.evict.as_mut() {
                e.remove(&version);
            }
            if evicted {
                self.versions_evicted += 1;
            }
            for list in &mut self.dropped {
                list.push(version);
            }
            // Every shard closes its descriptor of the removed file at its next tick.
            self.to_wake.iter_mut().for_each(|w| *w = true);
        }
        self.flush();
    }

    /// A response began reading `version`, or a fetch began filling it: it is not evicted
    /// (nor dropped when retired) until the matching `unpin`.
    pub fn pin(&mut self, version: u64) {
        *self.pins.entry(version).or_default() += 1;
        if let Some(e) = self.evict.as_mut() {
            e.pin(&version);
        }
    }

    /// The matching end of a `pin`; a retired version goes with its last.
    pub fn unpin(&mut self, version: u64) {
        if let Some(e) = self.evict.as_mut() {
            e.unpin(&version);
        }
        let Some(n) = self.pins.get_mut(&version) else {
            debug_assert!(false, "unpinned more than pinned");
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.pins.remove(&version);
            if self.retired.remove(&version) {
                self.drop_versions(&[version], false);
            }
        }
    }

    /// The origin has another version of `version`'s key (or none): the key forgets it at
    /// once, and it is dropped when nothing reads or fills it any more.
    fn retire(&mut self, version: u64) {
        self.invalidate_hot(version);
        if !self.index.retire(version) {
            return;
        }
        self.revalidate_after.remove(&version);
        if self.pins.contains_key(&version) {
            self.retired.insert(version);
        } else {
            self.drop_versions(&[version], false);
        }
    }

    /// Forgets every cached object whose path (its request path without the leading '/') is
    /// `path`, or starts with it when `prefix`, over all origins: each current version is
    /// retired (dropped, journaled, once nothing reads or fills it) and a remembered 404 under
    /// it is forgotten. The next request fetches from the origin again. Returns the objects
    /// purged.
    pub fn purge(&mut self, path: &str, prefix: bool) -> usize {
        let matches = |key: &[u8]| {
            let rel = key.get(2..).unwrap_or_default();
            if prefix {
                rel.starts_with(path.as_bytes())
            } else {
                // The path itself, and its variants keyed by query parameters (`key_query`:
                // the path, then `\0name=value`).
                rel.strip_prefix(path.as_bytes())
                    .is_some_and(|rest| rest.is_empty() || rest[0] == 0)
            }
        };
        let current: Vec<u64> = self
            .index
            .each_version_id()
            .filter(|&v| self.index.key_of(v).is_some_and(&matches) && self.index.is_current(v))
            .collect();
        for &v in &current {
            self.retire(v);
        }
        self.not_found.forget(matches);
        self.pass_keys.forget(matches);
        current.len()
    }

    /// The shared counters.
    pub fn stats(&self) -> FillStats {
        FillStats {
            versions_evicted: self.versions_evicted,
            waits_joined: self.waits_joined,
            waits_started: self.waits_started,
            disk_full: self.disk_full,
            origin_pauses: self.origin_pauses,
        }
    }

    /// Remembers the origin's 404 for `key` for `not_found_s`.
    fn remember_not_found(&mut self, key: &[u8], now_s: u64) {
        if self.cfg.not_found_s == 0 {
            return;
        }
        let until = now_s + self.cfg.not_found_s.min(MAX_NOT_FOUND_S);
        self.not_found.remember(key, until, now_s);
    }

    /// Version `v`'s contract as the reply that confirmed it (`fields`, at `now_s`) renews it
    /// (RFC 9111 §4.3.4): its freshness from that reply (the operator's under an override),
    /// and its stored lines with the reply's replacing those of the same name. None when
    /// the version is gone.
    pub(super) fn renewed_contract(
        &self,
        v: u64,
        origin: usize,
        fields: &contract::HeadFields,
        now_s: u64,
    ) -> Option<Box<crate::cache::record::Refresh>> {
        let m = self.index.meta(v)?;
        let policy = self.cfg.origin_policies.get(origin);
        let freshness = match policy {
            Some(p) if p.cache_policy == CachePolicy::Override => m.freshness,
            _ => {
                let c = Contract::of(fields, i64::try_from(now_s).unwrap_or(i64::MAX));
                let date = contract::parse_date(&fields.date).unwrap_or(now_s as i64);
                let lm = contract::parse_date(&m.last_modified);
                let d = c.directives;
                let secs = |s: Option<u64>| s.map(|s| u32::try_from(s).unwrap_or(u32::MAX - 1));
                Freshness {
                    lifetime_s: secs(c.lifetime_s(lm, date, self.cfg.heuristic_max_s)),
                    initial_age_s: u32::try_from(c.initial_age_s).unwrap_or(u32::MAX),
                    no_cache: d.no_cache,
                    must_revalidate: d.must_revalidate,
                    stale_while_revalidate_s: secs(d.stale_while_revalidate),
                    stale_if_error_s: secs(d.stale_if_error),
                }
            }
        };
        let headers = contract::merge_lines(&m.headers, &fields.stored);
        Some(Box::new(crate::cache::record::Refresh {
            freshness,
            headers,
        }))
    }

    /// Whether version `v` (of origin `origin`) may be served although its revalidation
    /// failed at `now_s`: not `no-cache` nor `must-revalidate`, and within its
    /// `stale-if-error` window past its lifetime.
    pub(super) fn may_serve_stale(&self, v: u64, origin: usize, now_s: u64) -> bool {
        let Some(m) = self.index.meta(v) else {
            return false;
        };
        let window = m.freshness.stale_if_error_s.map_or_else(
            || {
                self.cfg
                    .origin_policies
                    .get(origin)
                    .map_or(crate::config::origin::DEFAULT_STALE_IF_ERROR_S, |p| {
                        p.stale_if_error_s
                    })
            },
            u64::from,
        );
        !m.freshness.no_cache
            && !m.freshness.must_revalidate
            && now_s
                < m.fresh_until_s(self.cfg.revalidate_s)
                    .saturating_add(window)
    }

    /// Remembers that `key`'s replies may not be stored (`why`), for `HIT_FOR_PASS_S`; its
    /// version, if one is cached, is no longer served.
    pub(super) fn remember_pass(&mut self, key: &[u8], why: crate::origin::contract::NotStored) {
        let now_s = unix_now_s();
        tracing::debug!(key = %String::from_utf8_lossy(key), why = why.label(), "not stored: passed through");
        self.pass_keys.remember(key, now_s + HIT_FOR_PASS_S, now_s);
        if let Some(v) = self.index.current_version(key) {
            self.retire(v);
        }
    }

    /// The name of origin `origin` for a log line.
    fn origin_name(&self, origin: usize) -> &str {
        self.cfg
            .origin_names
            .get(origin)
            .map_or("(unnamed origin)", String::as_str)
    }

    /// One log line for a fill that failed for good: the origin, the path, and why (an
    /// origin's 4xx is its answer, not a fault of the edge or the origin's reach).
    fn log_failure(&self, job: &Job, error: &FetchError) {
        let origin = self.origin_name(job.origin);
        if error.is_disk_full() {
            tracing::warn!(origin, path = %job.path, ?error, "cache disk full: fill given up (hits are still served)");
        } else if matches!(error, FetchError::Unusable(Unusable::Status(s)) if (400..500).contains(s))
            || matches!(error, FetchError::NotStored(_))
        {
            tracing::debug!(origin, path = %job.path, ?error, "origin refused");
        } else {
            tracing::warn!(origin, path = %job.path, ?error, "origin fill failed");
        }
    }

    /// The index (what is on disk).
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Publishes what each shard may learn without the lock (`Signals`), and moves the shards
    /// to wake into `wake`.
    fn publish(&mut self, wake: &mut Vec<usize>) {
        self.drop_failed_disks();
        let shards = self.notices.len();
        let signals = self.signals.clone();
        let mut queued = [0usize; 64];
        let mut retry = [u64::MAX; 64];
        let counted = shards <= queued.len();
        if counted {
            for j in &self.queue {
                queued[j.shard] += 1;
                retry[j.shard] = retry[j.shard].min(self.due_ms(j));
            }
        }
        for s in 0..shards {
            let news = !self.notices[s].is_empty() || !self.dropped[s].is_empty();
            signals.news[s].store(news, Ordering::Release);
            let (q, r) = if counted {
                (queued[s], retry[s])
            } else {
                let mine = self.queue.iter().filter(|j| j.shard == s);
                (
                    mine.clone().count(),
                    mine.map(|j| self.due_ms(j)).min().unwrap_or(u64::MAX),
                )
            };
            signals.queued[s].store(q, Ordering::Release);
            signals.next_retry_ms[s].store(r, Ordering::Release);
        }
        signals
            .live_bytes
            .store(self.index.live_bytes(), Ordering::Relaxed);
        let stats = self.stats();
        for (cell, v) in signals.stats.iter().zip([
            stats.versions_evicted,
            stats.waits_joined,
            stats.waits_started,
            stats.disk_full,
            stats.origin_pauses,
        ]) {
            cell.store(v, Ordering::Relaxed);
        }
        self.take_wakes(wake);
    }

    /// Every shard with fetches queued for it, or requests waiting for an origin's budget, is
    /// woken as the lock is let go (a unit of an origin's shared fetch budget came back).
    fn wake_queued_shards(&mut self) {
        let s = &self.signals;
        for (shard, wake) in self.to_wake.iter_mut().enumerate() {
            if s.budget_waits[shard].swap(false, Ordering::AcqRel) {
                s.budget_woken[shard].store(true, Ordering::Release);
                *wake = true;
            }
            if s.queued[shard].load(Ordering::Acquire) > 0 {
                *wake = true;
            }
        }
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

/// The I/O thread's view of the shared core: it compacts the journal when dead records pass
/// `COMPACT_DEAD_PERCENT`, judged from what the shards published, and takes the lock only to
/// encode the live index.
impl<W: Clone + PartialEq + Routed> cache_io::Compactable for Mutex<FillCore<W>> {
    fn compaction_due(&self, journal_bytes: u64) -> bool {
        if journal_bytes < COMPACT_MIN_BYTES {
            return false;
        }
        let live = match self.try_lock() {
            Ok(c) => {
                if c.compacting || journal_bytes < c.cfg.compact_min_bytes {
                    return false;
                }
                c.signals.live_bytes.load(Ordering::Relaxed)
            }
            // Busy: asked again after the next batch.
            Err(_) => return false,
        };
        let dead = journal_bytes.saturating_sub(live);
        dead * 100 > journal_bytes * COMPACT_DEAD_PERCENT
    }

    fn snapshot(&self, out: &mut Vec<u8>) {
        lock(self).snapshot(out);
    }

    fn compacted(&self, result: std::io::Result<()>, journal_bytes: u64) {
        lock(self).compacted(result, journal_bytes);
    }
}

/// The shared lock, taken by shard `shard` (the records it queues are its to settle), waiting
/// for it: tests only (a shard tries it, `try_lock_as`).
#[cfg(test)]
fn lock_as<W: Clone + PartialEq + Routed>(
    core: &Mutex<FillCore<W>>,
    shard: usize,
) -> Locked<'_, W> {
    let mut locked = lock(core);
    locked.holder = shard;
    locked
}

/// The shared lock for shard `shard` if it is free now, with what the shard owed the core
/// (`Pending`) handed over first, in order; None when another thread holds it: the shard does
/// that work at a later tick and never waits (a slow hold elsewhere, a compaction's snapshot or
/// a purge of many objects, costs it nothing).
fn try_lock_as<'a, W: Clone + PartialEq + Routed>(
    core: &'a Mutex<FillCore<W>>,
    shard: usize,
    pending: &mut Pending<W>,
) -> Option<Locked<'a, W>> {
    let refused = pending.contention.as_mut().is_some_and(Contention::refuses);
    let guard = match core.try_lock() {
        Ok(g) if !refused => g,
        Err(std::sync::TryLockError::Poisoned(p)) if !refused => p.into_inner(),
        _ => {
            pending.busy += 1;
            pending.refused = true;
            return None;
        }
    };
    pending.refused = false;
    let mut locked = Locked { guard: Some(guard) };
    locked.holder = shard;
    for v in pending.unpins.drain(..) {
        locked.unpin(v);
    }
    for w in pending.cancels.drain(..) {
        locked.cancel(&w);
    }
    Some(locked)
}

/// The shared lock; a shard that panicked while holding it leaves the bookkeeping as it was
/// (every change is applied whole before the journal or a notice hears of it).
pub(crate) fn lock<W: Clone + PartialEq + Routed>(core: &Mutex<FillCore<W>>) -> Locked<'_, W> {
    Locked {
        guard: Some(
            core.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ),
    }
}

/// Now, in Unix seconds.
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod window_tests {
    use super::*;

    /// A window copies what the index holds from a block on, answers only inside itself,
    /// and forgets a block found corrupt.
    #[test]
    fn a_crc_window_holds_what_was_on_disk_from_its_block() {
        let mut index = Index::default();
        let meta = ObjectVersion {
            key: b"\0\0k".to_vec(),
            version: 3,
            size: 200 * 65_536 + 1,
            block_bytes: 65_536,
            fetched_unix_s: 0,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        };
        assert!(index.apply(Record::Object(meta)));
        for block in (0..201).filter(|b| b % 3 != 0) {
            assert!(index.apply(Record::Block {
                version: 3,
                block,
                crc: block * 7,
            }));
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = FillConfig {
            block_bytes: 65_536,
            read_ahead_blocks: 0,
            max_run_blocks: 1,
            slot_bytes: 1 << 20,
            align_bytes: 4096,
            max_attempts: 1,
            sync_every_blocks: 1,
            max_bytes: 0,
            revalidate_s: 1,
            heuristic_max_s: crate::config::DEFAULT_CACHE_HEURISTIC_MAX_S,
            not_found_s: 0,
            origin_names: Vec::new(),
            origin_policies: Vec::new(),
            open_files: 1,
            compact_min_bytes: COMPACT_MIN_BYTES,
        };
        let mut core: FillCore<usize> = FillCore::open(dir.path(), cfg, 1).unwrap();
        core.index = index;
        let mut w = CrcWindow::EMPTY;
        assert_eq!(w.get(0), None);
        // From the block holding byte 100 * 65 536 + 5: blocks 100..164.
        core.fill_window(3, 100 * 65_536 + 5, &mut w);
        assert_eq!(w.get(99), None, "before the window");
        assert_eq!(w.get(100), Some(700));
        assert_eq!(w.get(102), None, "not on disk");
        assert_eq!(w.get(163), Some(163 * 7));
        assert_eq!(w.get(164), None, "past the window");
        w.forget(100);
        assert_eq!(w.get(100), None);
        core.fill_window(9, 0, &mut w);
        assert_eq!(
            (w.get(1), w.size),
            (None, 0),
            "an unknown version copies nothing"
        );
    }
}

#[cfg(test)]
mod core_tests {
    use super::*;
    use crate::origin::response::Unusable;

    const B: u64 = 65_536;

    /// A core whose index holds a 200-block object of version 1 with blocks `present` on
    /// disk; read-ahead capped at 32 blocks, runs of at most 16.
    fn core_with(present: std::ops::Range<u32>) -> (FillCore<usize>, tempfile::TempDir) {
        let mut index = Index::default();
        assert!(index.apply(Record::Object(ObjectVersion {
            key: b"\0\0k".to_vec(),
            version: 1,
            size: 200 * B,
            block_bytes: B as u32,
            fetched_unix_s: unix_now_s(),
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        })));
        for block in present {
            assert!(index.apply(Record::Block {
                version: 1,
                block,
                crc: block,
            }));
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = FillConfig {
            block_bytes: B as u32,
            read_ahead_blocks: 32,
            max_run_blocks: 16,
            slot_bytes: 1 << 20,
            align_bytes: 4096,
            max_attempts: 1,
            sync_every_blocks: 1,
            max_bytes: 0,
            revalidate_s: 3600,
            heuristic_max_s: crate::config::DEFAULT_CACHE_HEURISTIC_MAX_S,
            not_found_s: 0,
            origin_names: vec!["o".into()],
            origin_policies: Vec::new(),
            open_files: 1,
            compact_min_bytes: COMPACT_MIN_BYTES,
        };
        let mut core: FillCore<usize> = FillCore::open(dir.path(), cfg, 1).unwrap();
        core.index = index;
        (core, dir)
    }

    /// A loading core answers every request `Loading` (its own fetch, unstored); the loaded
    /// core then takes its place behind the same lock, the old signals say so, and every
    /// shard is woken to take the new ones.
    #[test]
    fn a_loading_core_passes_everything_through_until_the_loaded_one_takes_its_place() {
        let (loaded, dir) = core_with(0..200);
        let dirs = [dir.path().to_path_buf()];
        let target = FillCore::<usize>::loading(&dirs, loaded.cfg.clone(), 2).into_shared();
        let old_signals = {
            let mut core = lock(&target);
            assert!(core.is_loading());
            for key in [&b"\0\0k"[..], b"\0\0other"] {
                let outcome = core.admit(key, 0, "/k", 0, true, 1, unix_now_s());
                assert_eq!(outcome, Some(Outcome::Loading));
            }
            assert!(core.queue.is_empty() && core.index.keys() == 0);
            core.signals.clone()
        };
        assert!(!old_signals.replaced());
        let wakers: Vec<OwnedFd> = (0..2)
            .map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap())
            .collect();
        let wakers = Arc::new(wakers);
        loaded.install_threaded(&target, wakers.clone()).unwrap();
        assert!(old_signals.replaced());
        let mut core = lock(&target);
        assert!(!core.is_loading());
        assert!(!Arc::ptr_eq(&core.signals, &old_signals));
        assert!(!core.signals.replaced());
        assert!(core.index.current(b"\0\0k").is_some());
        // Fresh and whole: the request goes on to `want`, which finds it on disk.
        assert_eq!(
            core.admit(b"\0\0k", 0, "/k", 0, true, 1, unix_now_s()),
            None
        );
        drop(core);
        for fd in wakers.iter() {
            let mut buf = [0u8; 8];
            assert_eq!(rustix::io::read(fd, &mut buf), Ok(8), "each shard is woken");
        }
    }

    fn queued(core: &FillCore<usize>) -> Vec<(u32, u32)> {
        core.queue.iter().map(|j| (j.first, j.last)).collect()
    }

    /// The read-ahead grows with what is right behind a read, and a closed range gets none
    /// past its end unless it continues what was read before.
    #[test]
    fn read_ahead_follows_the_blocks_behind_a_read() {
        let (core, _dir) = core_with(40..60);
        let meta = core.index.current(b"\0\0k").unwrap();
        let ra = |start: u64, last: u64, closed: bool| {
            let r = core.read_ahead(&meta, start, start, last, closed, true);
            (r.within, r.past_end)
        };
        let end = 200 * B - 1;
        assert_eq!(ra(0, end, false), (32, 0), "a download from the start");
        assert_eq!(
            ra(100 * B, end, false),
            (16, 0),
            "a resume with nothing behind"
        );
        assert_eq!(ra(60 * B, end, false), (20, 0), "20 blocks behind");
        assert_eq!(ra(100 * B, 100 * B + 9, true), (16, 0), "a jump");
        assert_eq!(ra(50 * B, 50 * B + 9, true), (16, 10), "10 blocks behind");
        assert_eq!(ra(60 * B, 64 * B - 1, true), (20, 20), "20 behind, 4 asked");
        let jump = core.read_ahead(&meta, 60 * B, 60 * B, 64 * B - 1, true, false);
        assert_eq!(
            (jump.within, jump.past_end),
            (20, 0),
            "blocks behind, but no request ended there: a jump"
        );
        let (core, _dir) = core_with(0..100);
        let meta = core.index.current(b"\0\0k").unwrap();
        let r = core.read_ahead(&meta, 100 * B, 100 * B, 100 * B, true, true);
        assert_eq!(r.past_end, 32, "capped at cache_read_ahead_blocks");
    }

    /// Start-up versions counted by the eviction after the core serves: a version pinned
    /// before its count keeps its pins, one dropped meanwhile is not counted, and once all
    /// are counted the budget holds as if they had been counted at once.
    #[test]
    fn versions_counted_for_eviction_later_keep_their_pins_and_the_budget() {
        let (mut core, _dir) = core_with(0..0);
        for v in 2..=7u64 {
            let key = format!("\0\0k{v}").into_bytes();
            assert!(core.index.apply(Record::Object(ObjectVersion {
                key,
                version: v,
                size: B,
                block_bytes: B as u32,
                ..core.index.current(b"\0\0k").unwrap()
            })));
            assert!(core.index.apply(Record::Block {
                version: v,
                block: 0,
                crc: 7
            }));
        }
        core.evict = Some(S3Fifo::new(2 * B));
        core.uncounted = (2..=7).collect();
        // Meanwhile: a response reads 7 (twice), a prefill holds 6, 5 is dropped.
        core.pin(7);
        core.pin(7);
        assert!(core.pin_until(b"\0\0k6", u64::MAX));
        core.drop_versions(&[5], false);
        assert_eq!(core.evict.as_ref().unwrap().bytes(), 0, "none counted yet");
        assert_eq!(core.count_for_eviction(2), 4, "a step of two");
        let ev = core.evict.as_ref().unwrap();
        assert_eq!((ev.pins(&7), ev.pins(&6)), (2, 1), "the pins taken over");
        assert_eq!(core.count_for_eviction(usize::MAX), 0);
        assert!(core.uncounted.capacity() == 0, "the list's memory let go");
        let ev = core.evict.as_ref().unwrap();
        assert!(!ev.contains(&5), "a dropped version is not counted");
        assert!(
            core.index.contains(7) && core.index.contains(6),
            "pinned: kept"
        );
        assert_eq!(ev.bytes(), 2 * B, "over budget until the pinned go");
        assert!(
            (2..=4).all(|v| !core.index.contains(v)),
            "the rest evicted down to the budget"
        );
        core.unpin(7);
        core.unpin(7);
        assert_eq!(core.evict.as_ref().unwrap().pins(&7), 0, "the pins end");
    }

    #[test]
    fn a_pin_until_a_time_keeps_a_version_until_then() {
        let (mut core, _dir) = core_with(0..4);
        core.evict = Some(S3Fifo::new(4 * B));
        let mut ev = Vec::new();
        core.evict.as_mut().unwrap().insert(1, 4 * B, &mut ev);
        assert!(ev.is_empty());
        assert!(!core.pin_until(b"\0\0none", 100), "no such key");
        assert!(core.pin_until(b"\0\0k", 100));
        assert!(
            core.pin_until(b"\0\0k", 50),
            "an earlier time keeps the later"
        );
        assert_eq!(core.pinned_until.get(&1), Some(&100));
        core.release_expired_pins(99);
        for v in 2..6 {
            core.evict.as_mut().unwrap().insert(v, B, &mut ev);
        }
        assert!(!ev.contains(&1), "pinned: kept though over budget: {ev:?}");
        assert_eq!(core.evict.as_ref().unwrap().pins(&1), 1);
        core.release_expired_pins(100);
        assert!(core.pinned_until.is_empty());
        assert_eq!(
            core.evict.as_ref().unwrap().pins(&1),
            0,
            "evictable once the time passed"
        );
    }

    #[test]
    fn a_request_continues_one_that_ended_right_before_it() {
        let mut r = RecentEnds::default();
        assert!(!r.continued_by(100, B));
        r.note(2 * B - 1);
        assert!(r.continued_by(2 * B, B), "starts at the next byte");
        assert!(r.continued_by(2 * B + 1, B), "in the next block");
        assert!(!r.continued_by(3 * B, B), "a block skipped");
        r.note(5 * B + 10);
        assert!(
            r.continued_by(5 * B + 100, B),
            "later in the block it ended in"
        );
        assert!(
            !r.continued_by(5 * B, B),
            "before its end: not a continuation"
        );
        for k in 0..RECENT_ENDS_PER_VERSION as u64 {
            r.note(100 * B + k);
        }
        assert!(!r.continued_by(2 * B, B), "the oldest ends are forgotten");
    }

    #[test]
    fn random_ranges_that_land_behind_stored_blocks_fetch_only_their_own() {
        // Blocks 40..50 are there (earlier random reads); a closed range starting at 50 does
        // not continue any request: its own block alone. Then one that does: read-ahead.
        let (mut core, _dir) = core_with(40..50);
        let o = core.want(b"\0\0k", 0, "/k", 50 * B, Some(51 * B - 1), 7);
        assert_eq!(o, Outcome::Waiting);
        assert_eq!(queued(&core), vec![(50, 50)]);
        core.queue.clear();
        let o = core.want(b"\0\0k", 0, "/k", 51 * B, Some(52 * B - 1), 7);
        assert_eq!(o, Outcome::Waiting);
        assert!(
            queued(&core).iter().any(|&(_, last)| last > 51),
            "a request continuing the last one reads ahead: {:?}",
            queued(&core)
        );
    }

    #[test]
    fn a_jump_fetches_its_blocks_and_a_continued_hit_fetches_the_next() {
        let (mut core, _dir) = core_with(40..50);
        // A closed range far from anything there: its own blocks, one run.
        let o = core.want(b"\0\0k", 0, "/k", 100 * B + 5, Some(101 * B + 5), 7);
        assert_eq!(o, Outcome::Waiting);
        assert_eq!(queued(&core), vec![(100, 101)]);
        core.queue.clear();
        // A hit on block 44: ready, and nothing more (no request ended right before it).
        let o = core.want(b"\0\0k", 0, "/k", 44 * B, Some(45 * B - 1), 7);
        assert_eq!(o, Outcome::Ready(1));
        assert_eq!(queued(&core), vec![]);
        // A hit on block 45 that continues it (5 behind): ready, and blocks 50 (missing) on
        // come.
        let o = core.want(b"\0\0k", 0, "/k", 45 * B, Some(46 * B - 1), 7);
        assert_eq!(o, Outcome::Ready(1));
        assert_eq!(queued(&core), vec![(50, 50)]);
    }

    /// Fetch 9 of blocks 3..=4 of version 1 (on disk 0) commits both, the batch holding
    /// their records fails on disk `slot` with `errno`, and the fetch ends without an error.
    fn records_fail_to_append(slot: usize, errno: i32) -> (FillCore<usize>, tempfile::TempDir) {
        let (mut core, dir) = core_with(0..0);
        let job = Job {
            key: b"\0\0k".to_vec(),
            origin: 0,
            path: "/k".into(),
            version: 1,
            first: 3,
            last: 4,
            probe: false,
            revalidate: false,
            not_before_ms: 0,
            committed: Vec::new(),
            pinned: false,
            shard: 0,
        };
        core.running.insert(9, job);
        let first_seq = core.next_seq;
        for block in [3, 4] {
            let crc = block;
            let seq = core.queue_record(Record::Block {
                version: 1,
                block,
                crc,
            });
            core.deferred.push_back(Deferred::Commit {
                seq,
                job: 9,
                version: 1,
                block,
                crc,
            });
        }
        let mut batch = Outbox::default();
        core.take_outbox(&mut batch);
        core.io_done(Done {
            first_seq,
            records: batch.records.len() as u64,
            appended: Err(std::io::Error::other(crate::cache::disks::AppendFailed {
                slot,
                error: std::io::Error::from_raw_os_error(errno),
            })),
            opened: Vec::new(),
            journal_bytes: 0,
            shards: 0,
        });
        assert_eq!(
            core.index.blocks_present(1),
            0,
            "no block of a failed batch is known"
        );
        core.on_ended(9, None, 0);
        assert!(core.journal_lost.is_empty());
        (core, dir)
    }

    /// A fetch whose blocks' records its own disk's full journal refused ends with that
    /// error, which passes its waiters through; not as an overrun, which would fetch the
    /// blocks again into a journal that cannot take them. Another disk's failure in the same
    /// batch, or a device error (that disk's failure, handled as such), leaves the blocks to
    /// be fetched again.
    #[test]
    fn a_fetch_whose_records_its_full_journal_refused_ends_with_the_disk_error() {
        for (slot, errno, full) in [
            (0, libc::ENOSPC, 1),
            (0, libc::EDQUOT, 1),
            (1, libc::ENOSPC, 0),
            (0, libc::EIO, 0),
        ] {
            let (core, _dir) = records_fail_to_append(slot, errno);
            assert_eq!(
                core.disk_full, full,
                "disk {slot}, errno {errno}: ended on a full disk"
            );
        }
    }

    #[test]
    fn an_origin_that_asks_to_wait_gets_no_fetch_until_then() {
        use crate::origin::response::RetryAfter;
        let (mut core, _dir) = core_with(0..0);
        let job = |origin: usize| Job {
            key: b"\0\0k".to_vec(),
            origin,
            path: "/k".into(),
            version: 1,
            first: 3,
            last: 4,
            probe: false,
            revalidate: false,
            not_before_ms: 0,
            committed: Vec::new(),
            pinned: false,
            shard: 0,
        };
        let throttled = |s: u64| {
            FetchError::Unusable(Unusable::Throttled {
                status: 429,
                retry_after: RetryAfter::Seconds(s),
            })
        };
        core.retry_or_fail(job(0), throttled(2), 10_000);
        assert_eq!(core.origin_pauses, 1);
        assert_eq!(core.origin_paused_s(0, 10_000), Some(2));
        assert_eq!(core.origin_paused_s(0, 11_001), Some(1));
        assert_eq!(core.origin_paused_s(0, 12_000), None, "the pause is over");
        assert_eq!(core.origin_paused_s(1, 10_000), None, "other origins go on");
        // The fetch waits out the pause at the front of the queue (not an attempt).
        assert_eq!(queued(&core), vec![(3, 4)]);
        assert_eq!(core.due_ms(&core.queue[0]), 12_000);
        assert_eq!(core.due_ms(&job(1)), 0);
        // A shorter ask does not end a pause early; a zero is still a second.
        core.retry_or_fail(job(0), throttled(1), 10_500);
        assert_eq!(core.paused_until(0), 12_000);
        assert_eq!(core.origin_pauses, 1);
        core.retry_or_fail(job(1), throttled(0), 10_000);
        assert_eq!(core.paused_until(1), 11_000);
    }

    #[test]
    fn a_block_another_read_dropped_is_never_passed_unchecked() {
        // Blocks 0..4 of version 1 on disk with the checksums of `bytes`; a response's window
        // took their checksums before another read found block 2 corrupt and dropped it.
        let bytes: Vec<u8> = (0..4 * B).map(|i| (i % 251) as u8).collect();
        let (mut core, _dir) = core_with(0..0);
        for block in 0..4u32 {
            let at = (u64::from(block) * B) as usize;
            let crc = crate::cache::checksum(&bytes[at..at + B as usize]);
            assert!(core.index.apply(Record::Block {
                version: 1,
                block,
                crc
            }));
        }
        let filler = crate::fill::Filler::new(Vec::new(), 1);
        let mut cf: CacheFill<usize> = CacheFill::attach(core.into_shared(), 0, filler);
        let mut window = CrcWindow::EMPTY;
        let read = 4 * B as usize;
        assert_eq!(
            cf.check_blocks(1, 0, read, &bytes, &mut window, None),
            Ok(())
        );
        // Dropped meanwhile: its bytes on disk are the bad ones, whatever this read holds.
        cf.with_core(|c| c.index.forget_block(1, 2));
        window.forget(2);
        assert_eq!(
            cf.check_blocks(1, 0, read, &bytes, &mut window, None),
            Err(BadBlock::Dropped(2))
        );
        // A read that does not reach it is fine.
        assert_eq!(
            cf.check_blocks(1, 0, 2 * B as usize, &bytes, &mut window, None),
            Ok(())
        );
    }

    #[test]
    fn a_shard_never_waits_for_the_lock_and_hands_over_what_it_owes_at_the_next_hold() {
        let bytes: Vec<u8> = (0..4 * B).map(|i| (i % 251) as u8).collect();
        let (mut core, _dir) = core_with(0..0);
        for block in 0..4u32 {
            let at = (u64::from(block) * B) as usize;
            let crc = crate::cache::checksum(&bytes[at..at + B as usize]);
            assert!(core.index.apply(Record::Block {
                version: 1,
                block,
                crc
            }));
        }
        core.pin(1);
        core.pin(1);
        let shared = core.into_shared();
        let filler = crate::fill::Filler::new(Vec::new(), 1);
        let mut cf: CacheFill<usize> = CacheFill::attach(shared.clone(), 0, filler);
        // Another thread (a shard, the I/O thread's snapshot, an admin purge) holds the lock
        // until told to let it go.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let guard = shared.lock().unwrap();
            held_tx.send(()).unwrap();
            // Bounded: a shard call that waited would be let through, and the asserts below
            // on what it left pending would fail instead of the test hanging.
            let _ = go_rx.recv_timeout(std::time::Duration::from_secs(60));
            drop(guard);
        });
        held_rx.recv().unwrap();
        cf.unpin(1);
        cf.cancel(&7);
        assert_eq!(cf.pending.unpins, vec![1], "the pin waits to be given back");
        assert_eq!(cf.pending.cancels, vec![7]);
        assert!(cf.want(b"\0\0k", 0, "/k", 0, Some(10), 3).is_none());
        assert!(cf.readable_end(1, 0).is_none());
        assert!(cf.try_index().is_none());
        let mut window = CrcWindow::EMPTY;
        assert_eq!(
            cf.check_blocks(1, 0, 4 * B as usize, &bytes, &mut window, None),
            Err(BadBlock::LockBusy),
            "a read whose checksums are not at hand waits to be judged"
        );
        assert!(cf.lock_busy() >= 6, "{} refusals counted", cf.lock_busy());
        assert!(cf.lock_refused());
        assert_eq!(cf.next_due_ms(), Some(0), "the loop comes back soon");
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        // The next hold hands over the pin and the cancel first, then answers.
        cf.settle_pending(0);
        assert!(cf.pending.unpins.is_empty() && cf.pending.cancels.is_empty());
        assert!(!cf.lock_refused());
        assert_eq!(cf.with_core(|c| c.pins.get(&1).copied()), Some(1));
        assert_eq!(
            cf.check_blocks(1, 0, 4 * B as usize, &bytes, &mut window, None),
            Ok(())
        );
        assert_eq!(cf.readable_end(1, 0), Some(4 * B));
    }

    #[test]
    fn a_probe_asks_for_a_closed_range_alone_and_a_whole_download_for_a_run() {
        let (mut core, _dir) = core_with(0..0);
        core.want(b"\0\0x", 0, "/x", 10 * B + 1, Some(12 * B), 7);
        assert_eq!(queued(&core), vec![(10, 12)]);
        core.queue.clear();
        core.want(b"\0\0y", 0, "/y", 0, None, 7);
        assert_eq!(queued(&core), vec![(0, 15)], "a run from the start");
        core.queue.clear();
        core.want(b"\0\0z", 0, "/z", 30 * B, None, 7);
        assert_eq!(
            queued(&core),
            vec![(30, 45)],
            "the initial read-ahead (16 blocks)"
        );
    }
}
