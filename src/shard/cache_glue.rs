//! The shard's side of the pull-through cache (`fill::edge`): routes a request to the cache,
//! parks it while the fill works (`ConnMachine::await_fill`: no slot, a deadline), carries
//! origin completions to the fill, lends it arena slots, and resumes the waiting requests
//! when their bytes are on disk. A cached version is served as a file response over its data
//! file (`FileCache::acquire_immutable`), so the chunk pipeline is the one every file uses.

use std::collections::HashMap;

use super::buffers::Demand;
use super::slots::{ArenaSlot, ConnSlot};
use super::{RingOps, Shard};
use crate::cache::index::ObjectVersion;
use crate::fill::cache_fill::{Notice, Outcome};
use crate::fill::edge::{EdgeCache, Hit, Route, Stream, Waiter};
use crate::http::plan::{self, FileFacts, FileRead};
use crate::http::request::{Method, Request};

/// The pulled responses' state on one shard, by connection slot: what the fill owes each
/// connection and what each connection's response needs from the cache. The shard holds one
/// (`Shard::pulls`); a connection slot's entries are removed when its response ends.
#[derive(Default)]
pub(super) struct Pulls {
    /// Notices and slots moved out of the fill each tick (kept for their allocations).
    pub notices: Vec<Notice<Waiter>>,
    pub slots: Vec<ArenaSlot>,
    /// Waiting requests whose fill failed: what they get when parsed again (a status, or a
    /// pass-through when the cache's disk had no room).
    pub answers: ByConn<FillAnswer>,
    /// A request parsed again after its fill (its arrival was noted the first time).
    pub resuming: bool,
    /// Responses streaming a pulled object as it fills, by connection slot: what they ask
    /// the fill for next, and the version they read.
    pub streams: ByConn<(Stream, u64)>,
    /// Streaming responses to cut (their fill failed, or changed version).
    pub aborts: Vec<Waiter>,
    /// Responses reading a pulled version, by connection slot: the version whose blocks'
    /// checksums every read is checked against.
    pub reads: ByConn<PulledRead>,
    /// Pass-through responses by connection slot (`fill::relay`), and their fetches' jobs.
    pub relays: ByConn<crate::fill::relay::Relay>,
    /// A pass-through fetch's job -> its connection (slot, generation); kept until the
    /// fetch's `Ended` gives its slot back, whether or not the connection is still there.
    pub relay_jobs: HashMap<u64, (ConnSlot, u16)>,
    /// Connections whose pass-through has something to do (a read asked, a cancel).
    pub relay_ready: Vec<ConnSlot>,
    /// Pass-through connections that are closing: their pending read ends, their fetch too.
    pub relay_cancels: Vec<ConnSlot>,
    /// Work a held fill lock put off, done at the next tick.
    pub lock_waits: LockWaits,
    /// The extra head lines of the pulled response being planned (kept for its allocation).
    pub head_extra: Vec<u8>,
    /// Requests answered by their own origin fetch, unstored (`respond_bypass`): why, and the
    /// reply's head once it came.
    pub bypasses: ByConn<Bypass>,
    /// Replies of fills handed over to the request that started them (`FillAnswer::Handed`),
    /// by connection slot, and those taken out of the fill this tick (kept for its
    /// allocation).
    pub handed: ByConn<crate::fill::cache_fill::Handover<Waiter>>,
    pub handovers: Vec<crate::fill::cache_fill::Handover<Waiter>>,
    /// Requests waiting for a pass-through of their own while the shard runs
    /// `MAX_PASS_THROUGHS_PER_SHARD` (bounded by its connections), and those whose turn came
    /// (resumed at the tick's end, outside the relay being ended).
    pub relay_waits: std::collections::VecDeque<Waiter>,
    pub relay_ready_waits: Vec<Waiter>,
    /// Responses whose disk failed a read and whose pass-through could not start yet (no
    /// slot, the origin at its fetch bound): tried again every `FAILOVER_RETRY_MS`
    /// (`read_failover`), bounded by the shard's connections.
    pub failover_waits: Vec<Waiter>,
    /// When `failover_waits` is tried next (the shard's clock, ms).
    pub failover_retry_at_ms: u64,
    /// When each arena slot's file read was submitted (the shard's clock, µs; by slot
    /// index, sized at start-up): a cached read's latency is its disk's.
    pub read_started_us: Vec<u64>,
    /// Reads of cached blocks in the kernel: (slot, disk, submitted µs, past the deadline
    /// and counted held). Bounded by the arena's slots (`read_failover::expire_reads`).
    pub cached_reads: Vec<(ArenaSlot, usize, u64, bool)>,
}

/// What the shard does again at its next tick because the fill's lock was held by another
/// thread when it asked (a shard never waits for it). Each entry is checked against its
/// connection's generation when it is done; every list is bounded by the shard's connections
/// (a connection has at most one of each at a time).
#[derive(Default)]
pub(super) struct LockWaits {
    /// Requests to ask the fill again: parsed again if their answer (`Pulls::answers`) is
    /// still there (a notice may have resumed them first).
    pub asks: Vec<Waiter>,
    /// Streaming responses at their readable end (`fill_await_block`), and that offset.
    pub awaits: Vec<(Waiter, u64)>,
    /// Notices to handle again.
    pub notices: Vec<Notice<Waiter>>,
    /// Chunks held in place (`ConnMachine::hold_for_refetch`) to be read again, by
    /// response and slot (a response may hold several).
    pub rereads: Vec<(Waiter, ArenaSlot)>,
}

impl LockWaits {
    /// Whether anything waits for the next tick.
    pub fn is_empty(&self) -> bool {
        self.asks.is_empty()
            && self.awaits.is_empty()
            && self.notices.is_empty()
            && self.rereads.is_empty()
    }
}

/// A connection as the glue's tables key it: its slot and the generation the slot had when
/// the entry was made, so an entry a closed connection left is never read by the next
/// connection in its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ConnRef {
    slot: ConnSlot,
    generation: u16,
}

impl ConnRef {
    /// Slot `slot` in its generation `generation`.
    pub fn new(slot: ConnSlot, generation: u16) -> ConnRef {
        ConnRef { slot, generation }
    }
}

/// A table of entries by connection (`ConnRef`): a lookup with another generation than the
/// entry's misses (and drops the stale entry).
#[derive(Debug)]
pub(super) struct ByConn<V> {
    map: HashMap<u32, (u16, V)>,
}

impl<V> Default for ByConn<V> {
    fn default() -> Self {
        ByConn {
            map: HashMap::new(),
        }
    }
}

impl<V> ByConn<V> {
    /// Sets `c`'s entry, replacing whatever its slot held.
    pub fn insert(&mut self, c: ConnRef, v: V) {
        self.map.insert(c.slot.raw(), (c.generation, v));
    }

    /// `c`'s entry, if it is this generation's.
    pub fn get(&self, c: ConnRef) -> Option<&V> {
        self.map
            .get(&c.slot.raw())
            .filter(|(g, _)| *g == c.generation)
            .map(|(_, v)| v)
    }

    /// `c`'s entry, if it is this generation's, to change.
    pub fn get_mut(&mut self, c: ConnRef) -> Option<&mut V> {
        self.map
            .get_mut(&c.slot.raw())
            .filter(|(g, _)| *g == c.generation)
            .map(|(_, v)| v)
    }

    /// Whether `c` has an entry of its generation.
    pub fn contains(&self, c: ConnRef) -> bool {
        self.get(c).is_some()
    }

    /// Takes `c`'s entry out; a stale entry in its slot is dropped and not returned.
    pub fn remove(&mut self, c: ConnRef) -> Option<V> {
        let (g, v) = self.map.remove(&c.slot.raw())?;
        (g == c.generation).then_some(v)
    }

    /// Entries held (stale ones included until their slot is used again).
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// The facts a pulled response is planned from: the version's size and type and the
/// origin's validators (so every edge holding this version says the same), with `etag` and
/// `last_modified` (an IMF-fixdate and its Unix seconds) where the origin gave none.
pub(super) fn pulled_facts<'a>(
    meta: &'a ObjectVersion,
    etag: &'a [u8],
    last_modified: (&'a [u8], i64),
    read: FileRead,
    extra: &'a [u8],
) -> FileFacts<'a> {
    let origin_lm = crate::http::date::parse_http_date(meta.last_modified.as_bytes())
        .map(|s| (meta.last_modified.as_bytes(), s));
    let (last_modified, mtime_secs) = origin_lm.unwrap_or(last_modified);
    FileFacts {
        size: meta.size,
        etag: if meta.etag.is_empty() {
            etag
        } else {
            meta.etag.as_bytes()
        },
        last_modified,
        mtime_secs,
        read,
        content_type: if meta.content_type.is_empty() {
            "application/octet-stream"
        } else {
            &meta.content_type
        },
        extra,
    }
}

/// How a pulled response was answered, for its `Cache-Status` (RFC 9211).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Served {
    /// From the cache, every byte there when it began.
    Hit,
    /// After the origin was asked (a miss, a fill, a revalidation), from what it stored.
    Fetched,
    /// Streamed from the origin unstored, for this reason (`detail`).
    Passed(&'static str),
}

/// Writes into `out` the header lines a pulled response carries besides its own: `Age`
/// (RFC 9111 §5.1, from the version's age), `Cache-Status` (RFC 9211: hit or forwarded, the
/// seconds of freshness left, whether it was stored) and the origin's stored end-to-end
/// fields (`ObjectVersion::headers`, checked when journaled).
pub(super) fn cached_head_lines(
    out: &mut Vec<u8>,
    meta: &ObjectVersion,
    served: Served,
    now_unix_s: u64,
    default_lifetime_s: u64,
) {
    use std::io::Write;
    out.clear();
    let ttl = meta.fresh_until_s(default_lifetime_s) as i64 - now_unix_s as i64;
    let _ = write!(
        out,
        "Age: {}\r\nCache-Status: shardline; ",
        meta.age_s(now_unix_s)
    );
    let _ = match served {
        Served::Hit => write!(out, "hit; ttl={ttl}\r\n"),
        Served::Fetched => write!(out, "fwd=miss; stored; ttl={ttl}\r\n"),
        Served::Passed(detail) => write!(out, "fwd=miss; detail={detail}\r\n"),
    };
    // The origin's Date is the response's own (`stored_date`), never a second line.
    for line in meta.headers.split_inclusive("\r\n") {
        if !is_date_line(line) {
            out.extend_from_slice(line.as_bytes());
        }
    }
}

/// The origin's `Date` among a version's stored lines, when it is an IMF-fixdate: a
/// response from the cache carries it (RFC 9110 §6.6.1: a cache does not change Date; `Age`
/// says how long it was kept). None: the edge's clock (versions stored before it was kept).
pub(super) fn stored_date(meta: &ObjectVersion) -> Option<&str> {
    meta.headers
        .split_inclusive("\r\n")
        .find(|l| is_date_line(l))
        .map(|l| l[5..].trim())
        .filter(|d| d.len() == crate::http::date::HTTP_DATE_BYTES && d.is_ascii())
}

fn is_date_line(line: &str) -> bool {
    line.get(..5)
        .is_some_and(|n| n.eq_ignore_ascii_case("date:"))
}

/// A request answered by its own origin fetch, unstored (`Shard::respond_bypass`): why
/// (`Cache-Status`'s detail), and the reply's head, as a version that is never indexed, once
/// it came.
#[derive(Clone, Debug)]
pub(super) struct Bypass {
    /// `Cache-Status`'s detail.
    pub detail: &'static str,
    /// The reply's head, once it came.
    pub head: Option<ObjectVersion>,
    /// The reply's status (200, 206, or another passed on as it is).
    pub status: u16,
}

/// `Cache-Status` detail of a request passed because its key's replies were found not
/// storable lately (hit-for-pass).
const NOT_STORED_LATELY: &str = "not-stored";

/// `Cache-Status` detail of a request passed because the cache's index is still loading.
const LOADING: &str = "loading";

/// Most times one response may meet a bad block and wait for it to be fetched again; past
/// it the response is cut (a disk that corrupts every block it is given cannot be served
/// from).
pub const MAX_REFETCHES_PER_RESPONSE: u32 = 8;

/// A response reading a pulled version: the version (pinned while read), and the chunk that
/// waits for a bad block to be fetched again, if one does.
#[derive(Clone, Debug)]
pub(super) struct PulledRead {
    version: u64,
    /// The version's metadata as the response began (its size, block size and key: read
    /// without the lock).
    meta: ObjectVersion,
    /// It holds a pin on the version (a hit served without the lock does not).
    pinned: bool,
    /// The version as published for lock-free hits: its checksums, all at hand.
    hot: Option<std::sync::Arc<crate::fill::cache_fill::HotVersion>>,
    /// The checksums its reads are checked against (refilled under the lock when a read
    /// passes it).
    crcs: crate::fill::cache_fill::CrcWindow,
    /// The chunks held for a bad block fetched again: each one's slot and the block it waits
    /// for (several chunks of a response may be held at once; at most its chunks in flight).
    refetch: Vec<(ArenaSlot, u32)>,
    /// Bad blocks met so far (`MAX_REFETCHES_PER_RESPONSE`).
    refetches: u32,
    /// Where the version comes from: its origin's index and path there (a read the disk
    /// fails goes on from there, `read_failover`).
    pub(super) origin: usize,
    pub(super) path: String,
    /// The chunks held because their disk read failed, waiting to be read again from the
    /// origin (`read_failover`), in no order.
    pub(super) failover: Vec<ArenaSlot>,
    /// When its pass-through was first refused (it is cut `cache_wait_timeout_ms` later).
    pub(super) failover_since_ms: Option<u64>,
}

/// What `verify_cache_read` made of a completed read of a pulled version.
pub(super) enum ReadCheck {
    /// Hand the machine this result (the bytes are checked, or the read is not whole yet,
    /// or `-EIO`: the response is cut).
    Use(i32),
    /// A bad block: the chunk waits in place (`ConnMachine::hold_for_refetch`), and is read
    /// again when the block is back (`now`: it is already).
    Hold {
        /// The block is on disk again already: read again at once.
        now: bool,
    },
    /// The disk failed the read: the chunk waits in place and is read again from the origin
    /// (`read_failover`).
    Failover,
}

/// Which held chunks of a response may be read again (`refetch_arrived`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Held {
    /// Those that waited for this block (its notice came).
    Block(u32),
    /// The one in this slot (its block was back before it was held).
    Slot(ArenaSlot),
}

/// `req` without its range and conditions: for a reply passed on whole, as the origin gave
/// it (a redirect, a refusal, an error).
pub(super) fn whole_request<'a>(req: &Request<'a>) -> Request<'a> {
    Request {
        range: None,
        if_match: None,
        if_none_match: None,
        if_modified_since: None,
        if_unmodified_since: None,
        if_range: None,
        ..*req
    }
}

/// What a waiting request whose fill failed gets when it is parsed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FillAnswer {
    /// This status (the origin's 4xx, 502, 504, 503).
    Status(u16),
    /// A pass-through from the origin: the cache's disk had no room for it.
    PassThrough,
    /// Its own origin fetch, unstored: the fill's reply may not be stored (the detail).
    Bypass(&'static str),
    /// Its own origin fetch's head came (`Pulls::bypasses`): answer from it.
    Bypassed,
    /// The fill it started got a reply the cache may not keep, handed to it
    /// (`Pulls::handed`): answer from it.
    Handed,
    /// Ask the fill again (its lock was held); `admitted`: as the request was first asked.
    Again {
        /// Whether it had been admitted (`EdgeCache::want`).
        admitted: bool,
    },
}

impl PulledRead {
    /// The version's metadata, as the response began.
    pub(super) fn meta(&self) -> &ObjectVersion {
        &self.meta
    }

    /// The object's name for a log line (its key without the origin's index).
    pub(super) fn object(&self) -> String {
        String::from_utf8_lossy(self.meta.key.get(2..).unwrap_or_default()).into_owned()
    }

    /// Moves the chunks held for a bad block (`refetch`) to `failover`: true if there were.
    pub(super) fn take_refetching(&mut self) -> bool {
        let any = !self.refetch.is_empty();
        self.failover
            .extend(self.refetch.drain(..).map(|(slot, _)| slot));
        any
    }
}

impl<R: RingOps> Shard<R> {
    /// Answers `req` from the cache when it is under an `[[origin]]`; false when it is not
    /// (the local root serves it).
    pub(super) fn respond_pulled(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        rate: crate::limits::RateSpec,
    ) -> bool {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let Some(edge) = self.cache.edge.as_mut() else {
            return false;
        };
        let mut scratch = std::mem::take(&mut self.policy.path_scratch);
        let route = edge.route(req.path, req.query, req.host, &mut scratch);
        self.policy.path_scratch = scratch;
        let Route::Origin {
            origin,
            key,
            path,
            never_cache,
        } = route
        else {
            return false;
        };
        if !self.cache.pulls.resuming {
            // Counted once per request (a request parsed again after its wait is the same).
            self.conns[c.index()].set_cache_origin(u8::try_from(origin).ok());
            if let Some(n) = self.metrics.origins.requests.get(origin) {
                super::ShardMetrics::add(n, 1);
            }
        }
        if key.len() > crate::cache::journal::MAX_KEY_BYTES {
            // Its record could never be journaled (replay would refuse it): 414, before the
            // cache or the origin sees it.
            tracing::info!(
                shard = self.index,
                key_bytes = key.len(),
                max = crate::cache::journal::MAX_KEY_BYTES,
                "cache key too long: 414"
            );
            super::ShardMetrics::add(&self.metrics.cache_error, 1);
            self.respond_status(c, 414, keep_alive, head_only);
            return true;
        }
        let again = self.cache.pulls.answers.remove(self.conn_ref(c));
        if req.authorization.is_some() && again.is_none() {
            // Never answered from another's copy, never stored (RFC 9111 §3.5).
            self.respond_bypass(c, req, origin, &path, "authorization");
            return true;
        }
        if never_cache && again.is_none() {
            // The operator's word (`never_cache`): each client's own fetch.
            self.respond_bypass(c, req, origin, &path, "never-cache");
            return true;
        }
        match again {
            Some(FillAnswer::Bypass(detail)) => {
                // The fill found its reply not storable: its own fetch, as every other
                // waiter of that fill makes (none gets another client's reply).
                self.respond_bypass(c, req, origin, &path, detail);
                return true;
            }
            Some(FillAnswer::Bypassed) => {
                self.respond_bypassed(c, req, rate);
                return true;
            }
            Some(FillAnswer::Handed) => {
                self.respond_handed(c, req, origin, &path, rate);
                return true;
            }
            Some(FillAnswer::Status(status)) => {
                super::ShardMetrics::add(&self.metrics.cache_error, 1);
                // Waited in vain on an origin that asked the edge to wait: told for how long.
                let now_ms = self.clock.now_ms;
                let paused = (status == 504)
                    .then(|| {
                        self.cache
                            .edge
                            .as_mut()?
                            .fill
                            .origin_paused_s(origin, now_ms)
                    })
                    .flatten();
                match paused {
                    Some(s) => self.respond_retry_later(c, s, head_only),
                    None => self.respond_status(c, status, keep_alive && status < 500, head_only),
                }
                return true;
            }
            Some(FillAnswer::PassThrough) => {
                // Its fill found no room on the cache's disk: streamed from the origin instead.
                self.respond_pass_through(c, req, origin, &key, &path, rate);
                return true;
            }
            Some(FillAnswer::Again { .. }) | None => {}
        }
        let waiter = self.waiter(c);
        // A request resumed after a wait was admitted when it first came: it is not sent to
        // revalidate again (with `cache_revalidate_s = 0` it would never get through). One
        // asked again because the lock was held is as it was.
        let admitted = match again {
            Some(FillAnswer::Again { admitted }) => admitted,
            _ => self.cache.pulls.resuming,
        };
        let mut key = key;
        // The key's stored reply, then (once) the variant the request's values select.
        let (outcome, stream, hit) = loop {
            let edge = self.cache.edge.as_mut().expect("checked above");
            let Some((outcome, stream, hit)) =
                edge.want(&key, origin, &path, req.range, head_only, admitted, waiter)
            else {
                self.ask_again_later(c, FillAnswer::Again { admitted });
                return true;
            };
            let selects = |h: &Hit| crate::origin::contract::selects(&h.meta.selecting, req.fields);
            let hit = match hit {
                Some(hit) if matches!(outcome, Outcome::Ready(_)) && !selects(&hit) => hit,
                hit => break (outcome, stream, hit),
            };
            // Stored for a request with other values of the fields its Vary names (RFC 9111
            // §4.1): this request's variant is its own key's.
            if hit.pinned {
                edge.fill.unpin(hit.meta.version);
            }
            let variant =
                crate::origin::contract::variant_key(&key, &hit.meta.selecting, req.fields)
                    .filter(|k| k.len() <= crate::cache::journal::MAX_KEY_BYTES);
            match variant {
                Some(variant) => key = variant,
                // No variant may be stored for it (its reply selects no request, its place
                // holds another's, its key is too long): its own fetch.
                None => {
                    self.respond_bypass(c, req, origin, &path, "vary");
                    return true;
                }
            }
        };
        match (outcome, hit) {
            (Outcome::Ready(_), Some(hit)) => {
                self.respond_cached(c, req, hit, rate, stream, (origin, path))
            }
            // Ready for a version the index no longer holds: cannot be (one hold decided both).
            (Outcome::Ready(_), None) => self.respond_status(c, 503, keep_alive, head_only),
            (Outcome::Waiting, _) => {
                self.conns[c.index()].set_cache_label(Some("MISS"));
                // Its fill's fetches send the client's end-to-end fields (not its Cookie:
                // the reply is shared).
                let mut forward = String::new();
                crate::origin::request::forwardable(req.fields, false, &mut forward);
                if let Some(edge) = self.cache.edge.as_mut() {
                    edge.fill.note_forward(origin, &path, forward);
                }
                self.park_for_fill(c);
            }
            (Outcome::Busy, _) => {
                super::ShardMetrics::add(&self.metrics.cache_error, 1);
                self.respond_status(c, 503, keep_alive, head_only)
            }
            (Outcome::Refused(status), _) => {
                // A remembered 404: the cache's answer, the origin not asked.
                super::ShardMetrics::add(&self.metrics.cache_error, 1);
                self.conns[c.index()].set_cache_label(Some("HIT"));
                self.respond_status(c, status, keep_alive, head_only)
            }
            // Its replies may not be stored: its own fetch, unstored.
            (Outcome::Pass, _) => self.respond_bypass(c, req, origin, &path, NOT_STORED_LATELY),
            // The index is still loading: its own fetch, unstored.
            (Outcome::Loading, _) => self.respond_bypass(c, req, origin, &path, LOADING),
        }
        true
    }

    /// The fill's lock was held by another thread when request `c` asked: it waits as for a
    /// fill (within `cache_wait_timeout_ms`) and is parsed again at the next tick with
    /// `answer`.
    pub(super) fn ask_again_later(&mut self, c: ConnSlot, answer: FillAnswer) {
        self.park_for_fill(c);
        let waiter = self.waiter(c);
        self.cache.pulls.answers.insert(self.conn_ref(c), answer);
        self.cache.pulls.lock_waits.asks.push(waiter);
    }

    /// Request `c` waits for the fill (`ConnMachine::await_fill`: no slot, a deadline of
    /// `cache_wait_timeout_ms`).
    pub(super) fn park_for_fill(&mut self, c: ConnSlot) {
        let Some(timeout_ms) = self.cache.edge.as_ref().map(|e| e.wait_timeout_ms) else {
            return;
        };
        let cx = self.cx();
        self.conns[c.index()].await_fill(timeout_ms, &cx);
        self.sync_timer(c);
    }

    /// Reads again the chunk connection `c` holds in `slot` (`ConnMachine::hold_for_refetch`).
    pub(super) fn reread_held(&mut self, c: ConnSlot, slot: ArenaSlot) {
        let mut out = self.take_actions();
        self.conns[c.index()].reread(slot, &mut out);
        self.run_actions(c, out);
    }

    /// Does again what a held fill lock put off (`LockWaits`), once each: what is refused
    /// again waits for the next tick.
    fn retry_lock_waits(&mut self, notices: &mut Vec<Notice<Waiter>>) {
        if self.cache.pulls.lock_waits.is_empty() {
            return;
        }
        let mut waits = std::mem::take(&mut self.cache.pulls.lock_waits);
        // Put-off notices go before this tick's, in the order they came.
        waits.notices.append(notices);
        std::mem::swap(notices, &mut waits.notices);
        for waiter in waits.asks.drain(..) {
            if self
                .cache
                .pulls
                .answers
                .contains(self.conn_ref(waiter.conn))
            {
                self.resume_fill(waiter, None);
            }
        }
        for (waiter, offset) in waits.awaits.drain(..) {
            let conn = &self.conns[waiter.conn.index()];
            if conn.generation() == waiter.generation
                && conn.responding()
                && self
                    .cache
                    .pulls
                    .streams
                    .contains(self.conn_ref(waiter.conn))
            {
                self.fill_await_block(waiter.conn, offset);
            }
        }
        for (waiter, slot) in waits.rereads.drain(..) {
            if self.conns[waiter.conn.index()].generation() == waiter.generation {
                self.reread_held(waiter.conn, slot);
            }
        }
    }

    /// Serves `req` from `hit`, a version of the cache pinned for it (every byte it needs
    /// is on disk); the pin goes when the response ends (`fill_reads_end`), or here when it
    /// reads nothing of the file.
    fn respond_cached(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        hit: Hit,
        rate: crate::limits::RateSpec,
        stream: Option<Stream>,
        (origin, path): (usize, String),
    ) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let Hit {
            meta,
            pinned,
            hot,
            crcs,
            readable_end,
        } = hit;
        let (version, size) = (meta.version, meta.size);
        // A response before this one on the connection lets its version go first.
        self.fill_reads_end(c);
        let edge = self
            .cache
            .edge
            .as_mut()
            .expect("a pulled request has a cache");
        let (file_key, file_path) = edge.data_file(version);
        let default_lifetime_s = edge.fill.default_lifetime_s();
        let idx = match self.files.acquire_immutable(
            &mut self.ring,
            &file_key,
            &file_path,
            meta.size,
            self.clock.now_ms,
        ) {
            Ok(idx) => idx,
            Err(e) => {
                if !pinned {
                    // A hit served without the lock raced its version's drop (its file is
                    // gone): the locked path decides again.
                    edge.forget_hot(&meta.key);
                    self.respond_pulled(c, req, rate);
                    return;
                }
                tracing::warn!(shard = self.index, path = %file_path.display(), ?e, "cache data file");
                edge.fill.unpin(version);
                if let crate::shard::files::OpenError::Other(errno) = e {
                    // Counted against the version's disk (a dead disk fails its opens too),
                    // and the request is answered by its own fetch: a disk that fails costs
                    // its objects, never the client's answer.
                    let slot = crate::cache::version_id::slot_of(version);
                    let now_s = crate::fill::cache_fill::unix_now_s();
                    edge.fill.store().health().note(slot, errno, now_s);
                    return self.respond_bypass(c, req, origin, &path, "disk");
                }
                return self.respond_status(c, e.status(), keep_alive, head_only);
            }
        };
        let served = if self.conns[c.index()].cache_label().is_some() {
            Served::Fetched
        } else {
            Served::Hit
        };
        let mut extra = std::mem::take(&mut self.cache.pulls.head_extra);
        cached_head_lines(
            &mut extra,
            &meta,
            served,
            u64::try_from(self.clock.date.secs()).unwrap_or(0),
            default_lifetime_s,
        );
        let limits = self.plan_limits(c);
        let mut ctx =
            super::respond::plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        if let Some(date) = stored_date(&meta) {
            ctx.date = date.as_bytes();
        }
        let f = self.files.get(idx);
        // Where the origin gave no validators, the data file's.
        let facts = pulled_facts(
            &meta,
            f.etag(),
            (&f.last_modified, f.mtime_secs),
            f.mode,
            &extra,
        );
        // A stored redirect or error is served whole as it came, whatever range or condition
        // the request named.
        let passed = meta.status != 200;
        let whole = if passed { whole_request(req) } else { *req };
        let mut plan = plan::plan_response(&whole, &facts, &limits, &ctx);
        if passed {
            plan.pass_status(meta.status);
        }
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let mut started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        self.cache.pulls.head_extra = extra;
        // The head leaves on its own: the body's reads must hold whole blocks to be checked,
        // which a head-and-body chunk (bytes read at the head's end) cannot.
        started.inline_head = false;
        if !started.reads_file {
            self.files.release(&mut self.ring, idx);
            if let (true, Some(edge)) = (pinned, self.cache.edge.as_mut()) {
                edge.fill.unpin(version);
            }
            let label = if self.conns[c.index()].cache_label().is_some() {
                "MISS"
            } else {
                "HIT"
            };
            self.conns[c.index()].set_cache_label(Some(label));
            return self.install(c, started, None, rate);
        }
        self.install(c, started, Some(idx), rate);
        // Every read holds whole blocks, checked against their checksums when it completes.
        self.conns[c.index()].set_read_align(u64::from(meta.block_bytes));
        if !pinned {
            super::ShardMetrics::add(&self.metrics.cache_lockless_hits, 1);
        }
        // Pinned while it is read (since `EdgeCache::want`) when found under the lock:
        // eviction never takes it. A lockless hit reads on from its open descriptor if its
        // version is dropped meanwhile.
        self.cache.pulls.reads.insert(
            self.conn_ref(c),
            PulledRead {
                version,
                meta,
                pinned,
                hot,
                crcs,
                refetch: Vec::new(),
                refetches: 0,
                origin,
                path,
                failover: Vec::new(),
                failover_since_ms: None,
            },
        );
        let waited = self.conns[c.index()].cache_label().is_some();
        let mut filling = false;
        // A streaming response reads no further than the committed blocks and moves on as
        // the fill commits more; anything else had every block it needs before it began.
        if let (Some(stream), Some(end)) = (stream, readable_end) {
            filling = end < stream.last.map_or(size, |l| l + 1);
            self.conns[c.index()].set_readable_end(end);
            self.cache
                .pulls
                .streams
                .insert(self.conn_ref(c), (stream, version));
        }
        let (label, counter) = match (filling, waited) {
            (true, _) => ("FILL", &self.metrics.cache_fill),
            (false, true) => ("MISS", &self.metrics.cache_miss),
            (false, false) => ("HIT", &self.metrics.cache_hit),
        };
        super::ShardMetrics::add(counter, 1);
        self.conns[c.index()].set_cache_label(Some(label));
    }

    /// A streaming response reached the end of the committed bytes (`Action::AwaitBlock`):
    /// it waits on the next block, or reads on at once if that came meanwhile.
    pub(super) fn fill_await_block(&mut self, c: ConnSlot, file_offset: u64) {
        if self.cache.pulls.relays.contains(self.conn_ref(c)) {
            // Streamed from the cache up to here; the rest is passed through.
            return self.relay_reaches_end_of_disk(c);
        }
        let waiter = self.waiter(c);
        let key = self.conn_ref(c);
        let (Some(edge), Some((stream, version))) =
            (self.cache.edge.as_mut(), self.cache.pulls.streams.get(key))
        else {
            // A body stopped at its readable end with no stream to move it: a bug, but the
            // client must not hang; the response is cut.
            self.cache.pulls.aborts.push(waiter);
            return;
        };
        let version = *version;
        let end = match edge.want_more(stream, version, file_offset, waiter) {
            Some(Outcome::Ready(v)) if v == version => edge.fill.readable_end(v, file_offset),
            Some(Outcome::Waiting) => return,
            // Another version (the response began on this one) or too many waiting.
            Some(
                Outcome::Ready(_)
                | Outcome::Busy
                | Outcome::Refused(_)
                | Outcome::Pass
                | Outcome::Loading,
            ) => {
                return self.cache.pulls.aborts.push(waiter);
            }
            None => None,
        };
        match end {
            Some(end) => {
                if self.conns[c.index()].set_readable_end(end) {
                    self.ready.push_bulk(c);
                }
            }
            // The fill's lock was held: asked again at the next tick.
            None => self
                .cache
                .pulls
                .lock_waits
                .awaits
                .push((waiter, file_offset)),
        }
    }

    /// Block notices for a streaming response: it reads on to the new end of the committed
    /// bytes and waits on the next block (which moves the read-ahead on). False when the
    /// fill's lock was held: the notice is handled again at the next tick.
    fn stream_block_arrived(&mut self, waiter: Waiter, version: u64) -> bool {
        let (c, generation) = (waiter.conn, waiter.generation);
        let conn = &self.conns[c.index()];
        if conn.generation() != generation || !conn.responding() {
            return true;
        }
        let key = self.conn_ref(c);
        let (Some(edge), Some((stream, v))) =
            (self.cache.edge.as_mut(), self.cache.pulls.streams.get(key))
        else {
            return true;
        };
        if *v != version {
            return true;
        }
        let Some(old_end) = self.conns[c.index()].readable_end() else {
            return true;
        };
        let Some(end) = edge.fill.readable_end(version, old_end) else {
            return false;
        };
        if end <= old_end {
            return true;
        }
        let (size, block_bytes) = self
            .cache
            .pulls
            .reads
            .get(key)
            .map_or((0, 1), |r| (r.meta.size, u64::from(r.meta.block_bytes)));
        let done = stream.last.is_some_and(|l| end > l) || end >= size;
        // A response far behind the fill (a stalled or slow client) stops hearing of each
        // block: it reads what is committed and asks again at its end (`fill_await_block`),
        // so a thousand stalled clients cost nothing per block. One near the front keeps
        // the fill's read-ahead moving.
        let pos = self.conns[c.index()].next_file_offset().unwrap_or(old_end);
        let near = end.saturating_sub(pos) <= edge.follow_blocks.saturating_mul(block_bytes);
        if !done && near {
            // Wait on the next block (its notice comes here again).
            match edge.want_more(stream, version, end, waiter) {
                // The key has another version now: this response cannot be finished.
                Some(Outcome::Busy) => self.cache.pulls.aborts.push(waiter),
                // The lock was held: asked at the next tick, as at the readable end.
                None => self.cache.pulls.lock_waits.awaits.push((waiter, end)),
                Some(_) => {}
            }
        }
        if self.conns[c.index()].set_readable_end(end) {
            self.ready.push_bulk(c);
        }
        if done {
            self.cache.pulls.streams.remove(self.conn_ref(c));
        }
        true
    }

    /// Each tick: deadlines, queued fetches (slots at bulk priority), slots given back, and
    /// the waiting requests whose fill moved.
    pub(super) fn run_fill(&mut self) {
        let Some(edge) = self.cache.edge.as_mut() else {
            return;
        };
        edge.fill.catch_up_with_load();
        edge.fill.expire(self.clock.now_ms);
        edge.fill.resume_paced(&mut self.ring, self.clock.now_ms);
        self.expire_reads();
        let Some(edge) = self.cache.edge.as_mut() else {
            return;
        };
        // What a held lock put off at an earlier tick: pins, cancels, fetch events.
        edge.fill.settle_pending(self.clock.now_ms);
        // Batches the I/O thread made durable: their blocks become visible now.
        edge.fill.settle_io();
        let arena = &mut self.arena;
        edge.fill.pump(
            &mut self.ring,
            &mut || arena.take(Demand::Bulk),
            self.clock.now_ms,
        );
        let mut notices = std::mem::take(&mut self.cache.pulls.notices);
        let mut slots = std::mem::take(&mut self.cache.pulls.slots);
        edge.take_notices(&mut notices, &mut slots);
        for slot in slots.drain(..) {
            self.release_slot(slot);
        }
        let mut handovers = std::mem::take(&mut self.cache.pulls.handovers);
        if let Some(edge) = self.cache.edge.as_mut() {
            edge.fill.take_handovers(&mut handovers);
        }
        for h in handovers.drain(..) {
            self.handover_arrived(h);
        }
        self.cache.pulls.handovers = handovers;
        self.retry_lock_waits(&mut notices);
        // Dropped versions' data files are closed here too, so their room comes back.
        if let Some(edge) = self.cache.edge.as_mut() {
            let (files, ring) = (&mut self.files, &mut self.ring);
            edge.dropped_files(|key| files.forget(ring, key));
        }
        for n in notices.drain(..) {
            match n {
                Notice::Block {
                    waiter,
                    version,
                    block,
                } => {
                    if self.refetch_arrived(waiter, Held::Block(block)) {
                        // A chunk held on a bad block reads it again.
                    } else if self.conns[waiter.conn.index()].awaiting_fill() {
                        self.resume_fill(waiter, None);
                    } else if !self.stream_block_arrived(waiter, version) {
                        // The fill's lock was held: again at the next tick.
                        self.cache.pulls.lock_waits.notices.push(n);
                    }
                }
                Notice::Known { waiter, .. } => self.resume_fill(waiter, None),
                Notice::Failed { waiter, error } => {
                    // The fill logged the failure once, naming the origin.
                    if self.refetch_failed(waiter, &error) {
                        // Cut: the bad block could not be fetched again.
                    } else if self.conns[waiter.conn.index()].awaiting_fill() {
                        let answer = if error == crate::origin::fetch::FetchError::VersionChanged {
                            // The version it waited on went (replaced at the origin, or
                            // evicted before its blocks came): nothing was sent yet, so it
                            // asks again and gets whatever version the key has now.
                            None
                        } else if error.passes_through() {
                            // No room to store it (or its disk failed): the request is
                            // passed through instead.
                            Some(FillAnswer::PassThrough)
                        } else if let crate::origin::fetch::FetchError::NotStored(why) = error {
                            // Not storable: its own fetch (it never gets another's reply).
                            Some(FillAnswer::Bypass(why.label()))
                        } else if let crate::origin::fetch::FetchError::Unusable(
                            crate::origin::response::Unusable::Status(201..=399),
                        ) = error
                        {
                            // Another 2xx or a redirect is passed on as the origin gave it,
                            // by its own fetch.
                            Some(FillAnswer::Bypass("status"))
                        } else {
                            Some(FillAnswer::Status(EdgeCache::status_for(&error)))
                        };
                        self.resume_fill(waiter, answer);
                    } else if self.relaying(waiter) {
                        // An earlier notice of this batch moved it to a pass-through (several
                        // fetches of its object can fail together, as when their disk
                        // stalls): the fill's later news of it are stale.
                    } else if !(error.passes_through() && self.live_stream(waiter)) {
                        // Its response has begun: it cannot become an error now.
                        self.cache.pulls.aborts.push(waiter);
                    }
                }
            }
        }
        // Responses whose stream cannot go on are cut (the client sees a short body).
        let mut aborts = std::mem::take(&mut self.cache.pulls.aborts);
        for Waiter {
            conn: c,
            generation,
            ..
        } in aborts.drain(..)
        {
            let conn = &self.conns[c.index()];
            if conn.generation() == generation && conn.is_live() && conn.responding() {
                // Off the waiter lists now (its close then finds no stream to cancel).
                if self.cache.pulls.streams.remove(self.conn_ref(c)).is_some() {
                    let waiter = self.waiter(c);
                    if let Some(edge) = self.cache.edge.as_mut() {
                        edge.fill.cancel(&waiter);
                    }
                }
                self.drive(c, |m, cx, out| {
                    m.close(super::conn::CloseReason::Abort, cx, out)
                });
            }
        }
        self.cache.pulls.aborts = aborts;
        self.cache.pulls.notices = notices;
        self.cache.pulls.slots = slots;
        self.run_relays();
        let fetch_ended = self.cache.edge.as_mut().is_some_and(|e| {
            let own = e.fill.take_fetch_ended();
            // Both flags are taken: a wake left set would come back as a spurious one.
            e.fill.take_budget_wake() | own
        });
        if fetch_ended {
            // A fetch's end, here or on another shard, may have made room at its origin for
            // the waiting requests' own: each tries again.
            self.wake_relay_waiters(usize::MAX);
        }
        for waiter in std::mem::take(&mut self.cache.pulls.relay_ready_waits) {
            self.resume_fill(waiter, None);
        }
        self.retry_failovers();
        if let Some(edge) = self.cache.edge.as_mut() {
            let f = edge.fill.filler();
            super::ShardMetrics::set(&self.metrics.origin_fetches, f.running() as u64);
            super::ShardMetrics::set(&self.metrics.origin_connections, f.connections() as u64);
            let received = f.received_bytes();
            super::ShardMetrics::set(&self.metrics.cache_origin_bytes, received);
            for (origin, &bytes) in f.received_by_origin().iter().enumerate() {
                if let Some(n) = self.metrics.origins.origin_bytes.get(origin) {
                    super::ShardMetrics::set(n, bytes);
                }
            }
            super::ShardMetrics::set(&self.metrics.cache_lock_busy, edge.fill.lock_busy());
            let m = &self.metrics;
            let refused = [
                &m.origin_refused_malformed,
                &m.origin_refused_too_large,
                &m.origin_refused_bad_length,
                &m.origin_refused_bad_te,
                &m.origin_refused_length_and_te,
                &m.origin_refused_bad_range,
                &m.origin_refused_interim,
            ];
            for (counter, &n) in refused.into_iter().zip(f.refused_heads()) {
                super::ShardMetrics::set(counter, n);
            }
            super::ShardMetrics::set(&m.origin_poisoned, f.poisoned());
            let first_byte = &self.metrics.origin_first_byte_time;
            edge.fill
                .take_first_byte_ms(|ms| first_byte.observe(ms * 1000));
            if self.index == 0 {
                // Shared counters: one shard reports them.
                let stats = edge.fill.stats();
                let m = &self.metrics;
                super::ShardMetrics::set(&m.cache_evictions, stats.versions_evicted);
                super::ShardMetrics::set(&m.cache_waits_joined, stats.waits_joined);
                super::ShardMetrics::set(&m.cache_waits_started, stats.waits_started);
                super::ShardMetrics::set(&m.cache_disk_full, stats.disk_full);
                super::ShardMetrics::set(&m.origin_pauses, stats.origin_pauses);
                let (purged_by_tag, tags_dropped) = edge.fill.purge_stats();
                super::ShardMetrics::set(&m.cache_purged_by_tag, purged_by_tag);
                super::ShardMetrics::set(&m.cache_tags_dropped, tags_dropped);
                // The configured origins only (not every slot of MAX_ORIGINS, each tick).
                let origins = edge.fill.filler().received_by_origin().len();
                for (origin, n) in m.origins.pauses.iter().enumerate().take(origins) {
                    super::ShardMetrics::set(n, edge.fill.origin_pauses_of(origin));
                }
            }
        }
    }

    /// The earliest fill deadline or retry (ms), for the loop's sleep: now when a held lock
    /// put work off (the loop comes back within a millisecond).
    pub(super) fn fill_due_ms(&self) -> Option<u64> {
        if !self.cache.pulls.lock_waits.is_empty() || !self.cache.pulls.relay_ready_waits.is_empty()
        {
            return Some(0);
        }
        self.cache.edge.as_ref().and_then(|e| e.fill.next_due_ms())
    }

    /// A waiting request's fill moved (or failed: `answer`): it is answered again.
    pub(super) fn resume_fill(&mut self, waiter: Waiter, answer: Option<FillAnswer>) {
        let (c, generation) = (waiter.conn, waiter.generation);
        let conn = &self.conns[c.index()];
        if conn.generation() != generation || !conn.is_open() || !conn.awaiting_fill() {
            return;
        }
        if let Some(a) = answer {
            self.cache.pulls.answers.insert(self.conn_ref(c), a);
        }
        self.conns[c.index()].fill_resumed();
        self.cache.pulls.resuming = true;
        self.start_request(c);
        self.cache.pulls.resuming = false;
        // Outside a visit nothing pumps a response begun here: queue the connection (a fresh
        // response is urgent work, as a new request is).
        if self.conns[c.index()].responding() {
            self.ready.push_urgent(c);
        }
    }

    /// Whether `waiter`'s response goes on from the origin already (a pass-through).
    fn relaying(&self, waiter: Waiter) -> bool {
        let conn = &self.conns[waiter.conn.index()];
        conn.generation() == waiter.generation
            && self
                .cache
                .pulls
                .relays
                .get(self.conn_ref(waiter.conn))
                .is_some()
    }

    /// Whether `waiter` is a live response streaming from the cache that goes on as a
    /// pass-through (the disk had no room for the rest of its object).
    fn live_stream(&mut self, waiter: Waiter) -> bool {
        let conn = &self.conns[waiter.conn.index()];
        conn.generation() == waiter.generation
            && conn.is_live()
            && conn.responding()
            && self.stream_to_pass_through(waiter.conn)
    }

    /// A waiting request ran out of time: 504, or 503 when it still waited for room to start
    /// a fetch of its own.
    pub(super) fn fill_timed_out(&mut self, c: ConnSlot) {
        let waiter = self.waiter(c);
        if let Some(edge) = self.cache.edge.as_mut() {
            edge.fill.cancel(&waiter);
        }
        // Its request never reached the origin: the edge had no room for it (a slot, or its
        // origin's fetch bound), as a proxy's queue timeout, not a slow origin.
        let waits = self.cache.pulls.relay_waits.len();
        self.cache.pulls.relay_waits.retain(|w| *w != waiter);
        let never_sent = self.cache.pulls.relay_waits.len() != waits;
        let status = if never_sent { 503 } else { 504 };
        self.resume_fill(waiter, Some(FillAnswer::Status(status)));
    }

    /// Connection `c` is gone: its waits end.
    pub(super) fn fill_forget(&mut self, c: ConnSlot) {
        self.cache.pulls.answers.remove(self.conn_ref(c));
        if let Some(h) = self.cache.pulls.handed.remove(self.conn_ref(c)) {
            self.drop_handed(h.job);
        }
        self.cache.pulls.bypasses.remove(self.conn_ref(c));
        self.relay_end(c);
        let refetching = self
            .cache
            .pulls
            .reads
            .get(self.conn_ref(c))
            .is_some_and(|r| !r.refetch.is_empty());
        self.fill_reads_end(c);
        // Only a request waiting for the fill, or a response streaming from it, is on a
        // waiter list: every other connection's close costs nothing here.
        let streaming = self.cache.pulls.streams.remove(self.conn_ref(c)).is_some();
        if streaming || refetching || self.conns[c.index()].awaiting_fill() {
            let waiter = self.waiter(c);
            if let Some(edge) = self.cache.edge.as_mut() {
                edge.fill.cancel(&waiter);
            }
        }
    }

    /// A read of a pulled version completed with `res`: when it is whole, every block in it
    /// is checked against its journaled CRC-32C. None: a block failed (or another read had
    /// dropped it): it is fetched again at the front of the fill's queue, and the chunk waits
    /// in place (`ConnMachine::hold_for_refetch`) to be read again when it is back, so the
    /// same response goes on with the right bytes. Only when that cannot be (the version was
    /// replaced, too many bad blocks, the origin cannot give it back) is the read an I/O
    /// error and the response cut, with a log line naming the object and the block.
    pub(super) fn verify_cache_read(
        &mut self,
        c: ConnSlot,
        slot: ArenaSlot,
        res: i32,
    ) -> ReadCheck {
        use ReadCheck::Use;
        let Some(read) = self.cache.pulls.reads.get(self.conn_ref(c)) else {
            return Use(res);
        };
        let (version, refetches, mut crcs) = (read.version, read.refetches, read.crcs);
        let hot = read.hot.clone();
        if !self.conns[c.index()].is_open() {
            // Closing: the machine only counts the read back in.
            return Use(res);
        }
        let Some((file_off, buf_off, got, need)) = self.conns[c.index()].chunk_read(slot) else {
            return Use(res);
        };
        if let (Some(edge), Some(&at_us)) = (
            self.cache.edge.as_ref(),
            self.cache.pulls.read_started_us.get(slot.index()),
        ) {
            let disk = crate::cache::version_id::slot_of(version);
            let took_us = self.clock.now_us.saturating_sub(at_us);
            let read = crate::cache::disk_health::DiskOp::Read;
            edge.fill.store().health().observe(disk, read, took_us);
        }
        if res < 0 {
            // Counted against the version's disk (device errors take it to failing).
            let kind = self.cache.edge.as_ref().map(|edge| {
                let slot = crate::cache::version_id::slot_of(version);
                let now_s = crate::fill::cache_fill::unix_now_s();
                edge.fill.store().health().note(slot, -res, now_s)
            });
            if kind.is_some_and(|k| self.fails_over(c, k, -res)) {
                return ReadCheck::Failover;
            }
        }
        if res <= 0 || got + (res as u32) < need {
            return Use(res);
        }
        let waiter = self.waiter(c);
        let key = self.conn_ref(c);
        let Some(edge) = self.cache.edge.as_mut() else {
            return Use(res);
        };
        let got_bytes = u64::from(got) + res as u64;
        let bytes = &self.ring.arena(slot)[buf_off as usize..buf_off as usize + got_bytes as usize];
        let checked = edge.fill.check_blocks(
            version,
            file_off,
            need as usize,
            bytes,
            &mut crcs,
            hot.as_deref(),
        );
        if let Some(r) = self.cache.pulls.reads.get_mut(key) {
            r.crcs = crcs;
        }
        let block = match checked {
            Ok(()) => return Use(res),
            Err(crate::fill::cache_fill::BadBlock::Dropped(block)) => block,
            Err(crate::fill::cache_fill::BadBlock::Corrupt(block)) => {
                super::ShardMetrics::add(&self.metrics.cache_corrupt_blocks, 1);
                let slot = crate::cache::version_id::slot_of(version);
                let checksum = crate::cache::disk_health::ErrorKind::Checksum;
                edge.fill.store().health().count(slot, checksum);
                block
            }
            Err(crate::fill::cache_fill::BadBlock::LockBusy) => return self.hold_for_lock(c, slot),
        };
        let key = self
            .cache
            .pulls
            .reads
            .get(key)
            .map(|r| r.object())
            .unwrap_or_default();
        if refetches >= MAX_REFETCHES_PER_RESPONSE {
            tracing::warn!(shard = self.index, object = %key, version, block, refetches, "a cached block failed its checksum again: the response is cut");
            return Use(-libc::EIO);
        }
        let edge = self.cache.edge.as_mut().expect("checked above");
        let Some(outcome) = edge.fill.refetch(version, block, waiter) else {
            // Dropped already: the read again finds it missing and asks for it then.
            return self.hold_for_lock(c, slot);
        };
        let entry = self
            .cache
            .pulls
            .reads
            .get_mut(self.conn_ref(c))
            .expect("looked up above");
        entry.refetches += 1;
        match outcome {
            Outcome::Waiting => {
                tracing::warn!(shard = self.index, object = %key, version, block, "a cached block failed its checksum: fetched again, the response waits for it");
                entry.refetch.push((slot, block));
                ReadCheck::Hold { now: false }
            }
            // Fetched again meanwhile: read again at once.
            Outcome::Ready(_) => {
                entry.refetch.push((slot, block));
                ReadCheck::Hold { now: true }
            }
            Outcome::Busy | Outcome::Refused(_) | Outcome::Pass | Outcome::Loading => {
                tracing::warn!(shard = self.index, object = %key, version, block, "a cached block failed its checksum and cannot be fetched again for this response: it is cut");
                Use(-libc::EIO)
            }
        }
    }

    /// A read of connection `c` (in `slot`) could not be judged: the fill's lock was held.
    /// The chunk waits in place and is read again at the next tick.
    fn hold_for_lock(&mut self, c: ConnSlot, slot: ArenaSlot) -> ReadCheck {
        let waiter = self.waiter(c);
        self.cache.pulls.lock_waits.rereads.push((waiter, slot));
        ReadCheck::Hold { now: false }
    }

    /// What a held chunk (`PulledRead::refetch`) waited for is there: each chunk of
    /// `waiter`'s response held for it is read again. False when none is (a block notice is
    /// then a stream's).
    pub(super) fn refetch_arrived(&mut self, waiter: Waiter, back: Held) -> bool {
        let c = waiter.conn;
        if self.conns[c.index()].generation() != waiter.generation {
            return false;
        }
        let Some(read) = self.cache.pulls.reads.get_mut(self.conn_ref(c)) else {
            return false;
        };
        // A bad block's path: rare, so a small list of its own.
        let mut slots = Vec::new();
        read.refetch.retain(|&(slot, block)| {
            let arrived = match back {
                Held::Block(b) => b == block,
                Held::Slot(s) => s == slot,
            };
            if arrived {
                slots.push(slot);
            }
            !arrived
        });
        let any = !slots.is_empty();
        for slot in slots {
            self.reread_held(c, slot);
        }
        any
    }

    /// The block the held chunk of `waiter`'s response waited for could not be fetched
    /// again: the response is cut, with a log line naming the object and the block. False
    /// when `waiter` holds no such chunk.
    fn refetch_failed(&mut self, waiter: Waiter, error: &crate::origin::fetch::FetchError) -> bool {
        let c = waiter.conn;
        if self.conns[c.index()].generation() != waiter.generation {
            return false;
        }
        let Some(read) = self.cache.pulls.reads.get_mut(self.conn_ref(c)) else {
            return false;
        };
        // The response cannot go on without the bytes it waits for (which of its held blocks
        // failed, the notice does not say): it is cut.
        let Some(&(_, block)) = read.refetch.first() else {
            return false;
        };
        read.refetch.clear();
        let (version, object) = (read.version, read.object());
        tracing::warn!(
            shard = self.index,
            %object,
            version,
            block,
            ?error,
            "a corrupt cached block could not be fetched again: the response is cut"
        );
        self.cache.pulls.aborts.push(waiter);
        true
    }

    /// Connection `c` no longer reads the version it read (its pin goes).
    pub(super) fn fill_reads_end(&mut self, c: ConnSlot) {
        if let (Some(read), Some(edge)) = (
            self.cache.pulls.reads.remove(self.conn_ref(c)),
            self.cache.edge.as_mut(),
        ) {
            if read.pinned {
                edge.fill.unpin(read.version);
            }
        }
    }

    /// This shard's name for a connection that waits on the fill.
    pub(super) fn waiter(&self, c: ConnSlot) -> Waiter {
        Waiter {
            shard: self.index as u16,
            conn: c,
            generation: self.conns[c.index()].generation(),
        }
    }

    /// Arms the poll on this shard's fill eventfd (other shards' fetches write it when they
    /// have news for this shard's waiters).
    pub(super) fn arm_fill_wake(&mut self) {
        if let Some(edge) = self.cache.edge.as_ref() {
            let t = super::token::Token::shard(super::token::Op::FillWake).encode();
            self.ring.poll_fd(edge.wake_fd(), libc::POLLIN as u32, t);
        }
    }

    /// The fill eventfd's poll completed: empty it and poll again (the notices are taken in
    /// `run_fill` this tick).
    pub(super) fn on_fill_wake(&mut self) {
        if let Some(edge) = self.cache.edge.as_ref() {
            edge.drain_wake();
        }
        self.arm_fill_wake();
    }

    /// An `Op::Origin` completion.
    pub(super) fn on_origin(&mut self, t: super::token::Token, res: i32) {
        let now_ms = self.ring.now().as_millis() as u64;
        match self.cache.edge.as_mut() {
            Some(edge) => edge.fill.on_completion(&mut self.ring, t, res, now_ms),
            None => super::ShardMetrics::add(&self.metrics.stray_completions, 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_left_by_a_closed_connection_is_not_the_next_ones() {
        let mut t: ByConn<&str> = ByConn::default();
        let old = ConnRef::new(ConnSlot::new(7), 3);
        let next = ConnRef::new(ConnSlot::new(7), 4);
        t.insert(old, "old");
        assert_eq!(t.get(old), Some(&"old"));
        assert!(t.get(next).is_none() && !t.contains(next));
        assert!(t.get_mut(next).is_none());
        // Taken out by the next generation: dropped, not returned.
        assert_eq!(t.remove(next), None);
        assert_eq!(t.len(), 0);
        t.insert(next, "next");
        assert_eq!(t.remove(old), None, "the old generation reads nothing");
        t.insert(next, "next");
        assert_eq!(t.remove(next), Some("next"));
    }
}
