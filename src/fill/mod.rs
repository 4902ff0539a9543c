//! The origin client on the shard's ring (issue 20): `Filler` runs a shard's block fetches
//! (`origin::fetch::BlockFetch`) over keep-alive connections to its origins, each fetch in
//! one arena slot the caller lends it, with every operation on the shard's ring.
//!
//! The caller owns the cache's bookkeeping: it gives each fetch its plan, slot and the
//! version's data file (opened O_DIRECT), and gets back `FillEvent`s in order: the head's
//! facts, each block committed (durable, with its CRC, to be journaled now), then the end
//! with the slot. Connections are bounded per origin (`origin::pool::Pool`); a fetch that
//! cannot get one is refused with its slot (`Begin::Wait`), never queued here.
//!
//! A connect is a non-blocking `connect(2)` on the shard thread (it returns at once), then a
//! poll through the ring for the socket to become writable. A stage past its deadline shuts
//! the socket down, which ends the operation in flight at once; the fetch ends when that
//! completion arrives, so the slot and the descriptor are never released under the kernel.

pub mod cache_fill;
pub mod cache_io;
pub mod edge;
pub mod relay;
pub mod route;

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::origin::fetch::{BlockFetch, FetchError, HeadFacts, Io, Output, Plan, Timeouts};
use crate::origin::pool::{Grant, Pool};
use crate::origin::request::Fetch;
use crate::origin::response::{HeadError, Unusable};
use crate::ring_api::ops::RingOps;
use crate::ring_api::slots::ArenaSlot;
use crate::ring_api::token::Token;

/// Bytes at the end of a fetch's slot that TLS to an `https://` origin keeps for records
/// received and not yet opened (at least one whole record; the fetch machine gets the rest
/// of the slot for plaintext).
pub const TLS_AREA_BYTES: usize = 64 * 1024;

/// How a shard's filler speaks TLS to an `https://` origin.
#[derive(Clone, Debug)]
pub struct OriginTlsTarget {
    /// Roots, versions and ALPN (`http/1.1`).
    pub config: Arc<rustls::ClientConfig>,
    /// The name the certificate must carry (sent as SNI when it is a DNS name).
    pub name: rustls::pki_types::ServerName<'static>,
}

/// One origin as a shard's filler reaches it.
#[derive(Clone, Debug)]
pub struct OriginTarget {
    /// Where to connect: the address found at start-up, until `resolved` publishes others.
    pub addr: SocketAddr,
    /// The origin's name as the resolver thread looks it up again after its TTL (the
    /// published set and this origin's index in it); None: `addr` always.
    pub resolved: Option<(Arc<crate::origin::resolve::Addresses>, usize)>,
    /// The Host header to send.
    pub host: String,
    /// Most fetches at once from this shard (its own budget when `budget` is None).
    pub max_fetches: usize,
    /// The origin's fetches at once over every shard (`[[origin]] max_fetches`), shared.
    pub budget: Option<Arc<crate::origin::pool::FetchBudget>>,
    /// The origin's bandwidth cap over every shard (`[[origin]] max_bytes_per_s`): the
    /// shared bucket and its rate; None: no cap.
    pub bandwidth: Option<(Arc<crate::limits::egress::EgressBucket>, u64)>,
    /// Most idle keep-alive connections kept by this shard.
    pub max_idle: usize,
    /// Timeouts of each fetch.
    pub timeouts: Timeouts,
    /// TLS for an `https://` origin (None: cleartext).
    pub tls: Option<OriginTlsTarget>,
}

/// Ends `run`'s stage with `error`: its socket is shut down, so the operation in flight
/// completes at once, and the fetch ends with `error` then.
fn cut_stage(run: &mut Running, conns: &[Option<Socket>], error: FetchError) {
    run.timed_out = Some(error);
    if let Some(s) = conns[run.conn as usize].as_ref() {
        let _ = SockRef::from(s).shutdown(std::net::Shutdown::Both);
    }
}

/// What a fetch told the caller, in order.
#[derive(Clone, Debug)]
pub enum FillEvent {
    /// The origin's head was accepted for fetch `job`.
    Head {
        /// The caller's id of the fetch.
        job: u64,
        /// What the head said.
        facts: HeadFacts,
    },
    /// A pass-through fetch (begun with no data file) has `len` bytes (zero padded past the
    /// object's end) of the object at `file_offset` in `slot`: they go to its client, and
    /// `Filler::delivered` lets the fetch go on.
    Piece {
        /// The caller's id.
        job: u64,
        /// The fetch's slot.
        slot: ArenaSlot,
        /// The object's offset of the slot's first byte.
        file_offset: u64,
        /// Bytes in the slot from its start.
        len: usize,
    },
    /// Block `block` of `job` is durable with `crc`.
    Committed {
        /// The caller's id.
        job: u64,
        /// Block number.
        block: u32,
        /// Its CRC-32C.
        crc: u32,
    },
    /// `job` ended: `error` is None when every block of its run was committed. The slot is
    /// the caller's again, unless the fetch was given up with a disk operation still in the
    /// kernel (`parked`): then `Released` follows once it comes back.
    Ended {
        /// The caller's id.
        job: u64,
        /// Why it ended early, if it did.
        error: Option<FetchError>,
        /// The slot lent at `begin`; None while a write given up still holds it.
        slot: Option<ArenaSlot>,
        /// Given up at `cache_disk_op_timeout_ms` with its operation in the kernel
        /// (`Filler::park`; `error` is `FetchError::Disk(ETIMEDOUT)`).
        parked: bool,
    },
    /// The disk operation of `job` given up at `cache_disk_op_timeout_ms` (its `Ended` said
    /// ETIMEDOUT) came back: its slot, if it held one, is the caller's again.
    Released {
        /// The caller's id.
        job: u64,
        /// The slot the write held (None: a sync, which held none).
        slot: Option<ArenaSlot>,
    },
}

/// Why `begin` did not start a fetch.
#[derive(Debug)]
pub enum Begin {
    /// The origin has `max_fetches` in flight, or every fetch slot is taken: try again when a
    /// fetch ends. The slot is handed back.
    Wait(ArenaSlot),
    /// The request could not be written (a path with a CR/LF, too long) or the socket could
    /// not be made: the fetch cannot be made at all.
    Refused(ArenaSlot, String),
}

/// A fetch in flight.
struct Running {
    job: u64,
    origin: usize,
    conn: u32,
    machine: BlockFetch,
    slot: ArenaSlot,
    /// The version's data file; None for a pass-through (pieces are delivered, not written).
    file: Option<Arc<File>>,
    head_len: usize,
    /// The operation the ring holds now (every fetch has exactly one until it ends).
    io: Option<Io>,
    /// Set when a deadline passed: the error the fetch ends with once `io` completes.
    timed_out: Option<FetchError>,
    /// When the data file's write or sync in `io` went to the ring (ms).
    disk_since_ms: Option<u64>,
    /// When `begin` started it (ms), until the origin's head came.
    started_ms: Option<u64>,
    /// TLS: bytes received into the slot's TLS area and not yet used (from its start).
    ct_len: usize,
    /// TLS: the layer's own operation the ring holds (a handshake flight, sealed records, a
    /// receive of records); the machine's `io` waits behind it.
    tls_op: Option<TlsOp>,
    /// The origin's bandwidth cap: no receive is posted before this time (ms).
    paced_until_ms: u64,
    /// The machine's receive (`io`) waits for `paced_until_ms`, not yet on the ring.
    paced: bool,
    /// The client field lines the request carried (`forward`): a reply's `Vary` is matched
    /// against them (`HeadFacts::selecting`).
    forward: String,
}

/// An operation of the TLS layer (`origin::tls`) on a fetch's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsOp {
    /// Sending handshake bytes at `off`: `sent` of `len` so far.
    Handshake { off: usize, len: usize, sent: usize },
    /// Receiving handshake bytes into the TLS area.
    HandshakeRecv,
    /// Sending the sealed records of `plain` request bytes at `off`: `sent` of `len`.
    Sealed {
        off: usize,
        len: usize,
        sent: usize,
        plain: usize,
    },
    /// Receiving records into the TLS area.
    RecordRecv,
    /// Probing an established connection (`Io::Probe`) into the TLS area.
    ProbeRecv,
}

/// What the TLS layer did with the machine's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dispatch {
    /// An operation is on the ring; its completion comes back through `on_completion`.
    Submitted,
    /// The machine's operation is done now with this result (bytes sent or received, or a
    /// negative errno).
    Answer(i32),
}

struct FetchSlot {
    generation: u16,
    run: Option<Running>,
}

/// A fetch given up with its disk operation still in the kernel (`Filler::park`): what the
/// kernel holds until the operation's completion comes back.
struct Parked {
    /// The fetch's index and generation when it was given up (its completion's token).
    index: u32,
    generation: u16,
    job: u64,
    /// The slot a write reads from (a sync holds none).
    slot: Option<ArenaSlot>,
    /// The data file the operation is on, kept open until it is back.
    _file: Option<Arc<File>>,
}

impl FillEvent {
    /// The fetch it is about.
    pub fn job(&self) -> u64 {
        match *self {
            FillEvent::Head { job, .. }
            | FillEvent::Piece { job, .. }
            | FillEvent::Committed { job, .. }
            | FillEvent::Ended { job, .. }
            | FillEvent::Released { job, .. } => job,
        }
    }
}

/// A shard's origin fetches (see the module doc).
pub struct Filler {
    origins: Vec<OriginTarget>,
    pools: Vec<Pool>,
    /// Origin connections by id (the pools hold ids of idle ones).
    conns: Vec<Option<Socket>>,
    /// TLS state of each `https://` connection (index = connection id).
    tls: Vec<Option<Box<crate::origin::tls::OriginTls>>>,
    free_conns: Vec<u32>,
    fetches: Vec<FetchSlot>,
    free_fetches: Vec<u32>,
    out: Vec<Output>,
    request: String,
    events: Vec<FillEvent>,
    /// Bytes received from origins (heads and bodies), since start.
    received_bytes: u64,
    /// `received_bytes` by origin.
    received_by_origin: Vec<u64>,
    /// Times from a fetch's start to its origin's head (ms), not yet taken.
    first_byte_ms: Vec<u64>,
    /// Per origin: the resolver's publication last read, its addresses, and the next to use
    /// (new connections go round them).
    addrs: Vec<OriginAddrs>,
    /// Origin heads refused, by `HeadError::index`.
    refused_heads: [u64; HeadError::ALL.len()],
    /// Origin connections closed for bytes past a reply's end.
    poisoned: u64,
    /// Whether any origin has a bandwidth cap (receives may be held back).
    paced_any: bool,
    /// The field lines a client's request forwards, by (origin, path): noted when a
    /// request starts or joins a fill, sent with that path's fetches (`note_forward`).
    forward: std::collections::HashMap<(usize, String), String>,
    /// `cache_disk_op_timeout_ms`: a write or sync of a data file past it is given up.
    disk_op_timeout_ms: u64,
    /// Fetches given up with a disk operation the kernel still holds.
    parked: Vec<Parked>,
}

/// Most (origin, path) entries of forwarded field lines a filler keeps (when full, one is
/// forgotten for each new one: a fetch of its path then goes without them, and a reply it
/// hands over costs its starter a fetch of its own). Each entry is at most a key and
/// `MAX_FORWARDED_BYTES` of lines.
pub const MAX_FORWARD_ENTRIES: usize = 1024;

/// What a filler last read of an origin's published addresses.
struct OriginAddrs {
    epoch: u64,
    addrs: Vec<SocketAddr>,
    next: usize,
}

impl Filler {
    /// A filler for `origins` running at most `max_fetches` fetches at once in all.
    pub fn new(origins: Vec<OriginTarget>, max_fetches: usize) -> Filler {
        assert!(max_fetches > 0 && max_fetches < (1 << 24));
        let n_origins = origins.len();
        let paced_any = origins.iter().any(|o| o.bandwidth.is_some());
        let pools = origins
            .iter()
            .map(|o| match &o.budget {
                Some(b) => Pool::with_budget(b.clone(), o.max_idle),
                None => Pool::new(o.max_fetches, o.max_idle),
            })
            .collect();
        let max_conns = origins
            .iter()
            .map(|o| o.max_fetches + o.max_idle)
            .sum::<usize>();
        Filler {
            origins,
            pools,
            conns: (0..max_conns).map(|_| None).collect(),
            tls: (0..max_conns).map(|_| None).collect(),
            free_conns: (0..max_conns as u32).rev().collect(),
            fetches: (0..max_fetches)
                .map(|_| FetchSlot {
                    generation: 0,
                    run: None,
                })
                .collect(),
            free_fetches: (0..max_fetches as u32).rev().collect(),
            out: Vec::with_capacity(8),
            request: String::with_capacity(crate::origin::request::MAX_REQUEST_HEAD_BYTES),
            events: Vec::with_capacity(16),
            received_bytes: 0,
            received_by_origin: vec![0; n_origins],
            first_byte_ms: Vec::with_capacity(max_fetches),
            addrs: (0..n_origins)
                .map(|_| OriginAddrs {
                    epoch: u64::MAX,
                    addrs: Vec::new(),
                    next: 0,
                })
                .collect(),
            paced_any,
            refused_heads: [0; HeadError::ALL.len()],
            poisoned: 0,
            forward: std::collections::HashMap::new(),
            disk_op_timeout_ms: crate::cache::disks::DEFAULT_DISK_OP_TIMEOUT_MS,
            parked: Vec::new(),
        }
    }

    /// Notes the field lines (`origin::request::forwardable`) the request for `path` at
    /// `origin` forwards: its fill's fetches send them.
    pub fn note_forward(&mut self, origin: usize, path: &str, lines: String) {
        let key = (origin, path.to_owned());
        if self.forward.len() >= MAX_FORWARD_ENTRIES && !self.forward.contains_key(&key) {
            // One entry goes, not all: a fill whose lines went sends none, and a reply it
            // hands over then goes to nobody's request (`respond_handed` compares the lines).
            if let Some(old) = self.forward.keys().next().cloned() {
                self.forward.remove(&old);
            }
        }
        self.forward.insert(key, lines);
    }

    /// Origin heads refused since start, by `HeadError::index` (a counter).
    pub fn refused_heads(&self) -> &[u64; HeadError::ALL.len()] {
        &self.refused_heads
    }

    /// Origin connections closed since start because bytes arrived past a reply's end (a
    /// counter).
    pub fn poisoned(&self) -> u64 {
        self.poisoned
    }

    /// The address a new connection to `origin` goes to: the resolver's latest addresses in
    /// turn (read again only when it published), or the start-up address while it has none.
    pub fn next_addr(&mut self, origin: usize) -> SocketAddr {
        let target = &self.origins[origin];
        let cache = &mut self.addrs[origin];
        if let Some((published, i)) = &target.resolved {
            let epoch = published.epoch();
            if epoch != cache.epoch {
                cache.epoch = epoch;
                cache.addrs.clone_from(&published.get(*i).addrs);
            }
        }
        if cache.addrs.is_empty() {
            return target.addr;
        }
        cache.next = cache.next.wrapping_add(1);
        cache.addrs[cache.next % cache.addrs.len()]
    }

    /// Bytes received from origins since start.
    pub fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// `received_bytes` by origin (index = the origin's).
    pub fn received_by_origin(&self) -> &[u64] {
        &self.received_by_origin
    }

    /// Moves the times from fetch start to origin head (ms) observed since the last call into
    /// `out` (at most one per fetch begun).
    pub fn take_first_byte_ms(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.first_byte_ms);
    }

    /// Fetches in flight.
    pub fn running(&self) -> usize {
        self.fetches.len() - self.free_fetches.len()
    }

    /// The arena slots its running fetches hold, and those the kernel holds for fetches
    /// given up (`park`).
    pub fn slots(&self) -> impl Iterator<Item = ArenaSlot> + '_ {
        self.fetches
            .iter()
            .filter_map(|f| f.run.as_ref().map(|r| r.slot))
            .chain(self.parked.iter().filter_map(|p| p.slot))
    }

    /// Sets `cache_disk_op_timeout_ms`.
    pub fn set_disk_op_timeout_ms(&mut self, ms: u64) {
        assert!(ms > 0, "a disk operation's deadline of 0");
        self.disk_op_timeout_ms = ms;
    }

    /// `cache_disk_op_timeout_ms`.
    pub fn disk_op_timeout_ms(&self) -> u64 {
        self.disk_op_timeout_ms
    }

    /// Fetches given up whose disk operation the kernel still holds.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Origin connections open (busy and idle).
    pub fn connections(&self) -> usize {
        self.conns.len() - self.free_conns.len()
    }

    /// Starts fetching `plan` of `path` from origin `origin` into `slot`, writing the data
    /// file `file` (None: a pass-through, whose pieces come out as `FillEvent::Piece`); `job`
    /// names it in the events.
    #[allow(clippy::too_many_arguments)]
    pub fn begin<R: RingOps>(
        &mut self,
        ring: &mut R,
        job: u64,
        origin: usize,
        path: &str,
        plan: Plan,
        slot: ArenaSlot,
        file: Option<Arc<File>>,
        now_ms: u64,
    ) -> Result<(), Begin> {
        let forward = self
            .forward
            .get(&(origin, path.to_owned()))
            .cloned()
            .unwrap_or_default();
        self.begin_as(
            ring, job, origin, path, None, &forward, plan, slot, file, now_ms,
        )
    }

    /// `begin`, sending the client's `authorization` (a request the cache does not serve:
    /// its reply is that client's alone) and its `forward` field lines.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_as<R: RingOps>(
        &mut self,
        ring: &mut R,
        job: u64,
        origin: usize,
        path: &str,
        authorization: Option<&str>,
        forward: &str,
        plan: Plan,
        slot: ArenaSlot,
        file: Option<Arc<File>>,
        now_ms: u64,
    ) -> Result<(), Begin> {
        let target = &self.origins[origin];
        let mut plan = plan;
        if target.tls.is_some() {
            // The slot's tail holds records not yet opened.
            assert!(
                plan.slot_bytes >= 2 * TLS_AREA_BYTES,
                "a slot too small for TLS"
            );
            plan.slot_bytes -= TLS_AREA_BYTES;
        }
        let fetch = Fetch {
            path,
            host: &target.host,
            range: Some(plan.range()),
            if_none_match: plan.etag.as_deref().filter(|_| plan.revalidate),
            if_modified_since: plan.last_modified.as_deref().filter(|_| plan.revalidate),
            authorization,
            forward,
        };
        if let Err(e) = fetch.write(&mut self.request) {
            return Err(Begin::Refused(slot, format!("origin request: {e:?}")));
        }
        let head_len = self.request.len();
        let timeouts = target.timeouts;
        assert!(head_len <= plan.slot_bytes);
        let Some(&index) = self.free_fetches.last() else {
            return Err(Begin::Wait(slot));
        };
        let (conn, reused) = match self.pools[origin].acquire() {
            Grant::Wait => return Err(Begin::Wait(slot)),
            Grant::Reuse(c) => (c, true),
            Grant::Connect => match self.connect(origin) {
                Ok(c) => (c, false),
                Err(e) => {
                    // The acquire counted a fetch that will not run.
                    let _ = self.pools[origin].release(u32::MAX, false);
                    return Err(Begin::Refused(slot, format!("origin socket: {e}")));
                }
            },
        };
        self.free_fetches.pop();
        ring.arena_mut(slot)[..head_len].copy_from_slice(self.request.as_bytes());
        self.out.clear();
        let machine = BlockFetch::start(plan, timeouts, reused, head_len, now_ms, &mut self.out);
        let f = &mut self.fetches[index as usize];
        f.generation = f.generation.wrapping_add(1);
        // A completion still owed to a given-up fetch of this index must not find this one.
        while self
            .parked
            .iter()
            .any(|p| p.index == index && p.generation == f.generation)
        {
            f.generation = f.generation.wrapping_add(1);
        }
        f.run = Some(Running {
            job,
            origin,
            conn,
            machine,
            slot,
            file,
            head_len,
            io: None,
            timed_out: None,
            disk_since_ms: None,
            started_ms: Some(now_ms),
            ct_len: 0,
            tls_op: None,
            paced_until_ms: 0,
            paced: false,
            forward: forward.to_owned(),
        });
        self.carry_out(ring, index, now_ms);
        Ok(())
    }

    /// A new non-blocking connection to `origin` (the connect is under way when this returns).
    fn connect(&mut self, origin: usize) -> std::io::Result<u32> {
        let addr = self.next_addr(origin);
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.set_tcp_nodelay(true)?;
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let tls = match &self.origins[origin].tls {
            Some(t) => Some(Box::new(
                crate::origin::tls::OriginTls::new(t.config.clone(), t.name.clone())
                    .map_err(std::io::Error::other)?,
            )),
            None => None,
        };
        let id = self
            .free_conns
            .pop()
            .expect("connections are bounded by the pools");
        self.conns[id as usize] = Some(socket);
        self.tls[id as usize] = tls;
        Ok(id)
    }

    /// Runs the machine's outputs for fetch `index`: submits its next operation, or ends it.
    fn carry_out<R: RingOps>(&mut self, ring: &mut R, index: u32, now_ms: u64) {
        loop {
            let answer = self.carry_out_batch(ring, index, now_ms);
            match answer {
                // The TLS layer answered the machine's operation at once (plaintext it held).
                Some(res) => self.answer_machine(ring, index, res, now_ms),
                None => return,
            }
        }
    }

    /// One batch of the machine's outputs; Some(result) when its operation was answered at
    /// once (the caller feeds it back and runs the next batch).
    fn carry_out_batch<R: RingOps>(
        &mut self,
        ring: &mut R,
        index: u32,
        now_ms: u64,
    ) -> Option<i32> {
        let generation = self.fetches[index as usize].generation;
        let token = Token::fetch(index, generation).encode();
        let outputs = std::mem::take(&mut self.out);
        let mut answer = None;
        for o in outputs.iter().cloned() {
            let run = self.fetches[index as usize]
                .run
                .as_mut()
                .expect("a running fetch");
            match o {
                Output::Io(io) => {
                    assert!(
                        run.io.is_none() && run.tls_op.is_none(),
                        "two operations of one fetch"
                    );
                    run.io = Some(io);
                    if matches!(io, Io::Write { .. } | Io::Sync) && run.file.is_some() {
                        run.disk_since_ms = Some(now_ms);
                    }
                    if matches!(io, Io::Recv { .. }) && run.paced_until_ms > now_ms {
                        // The origin's bandwidth cap: the receive waits for its turn
                        // (`resume_paced`), and TCP holds the origin back meanwhile.
                        run.paced = true;
                        continue;
                    }
                    if let Some(res) = self.submit_io(ring, index, io, token) {
                        answer = Some(res);
                    }
                }
                Output::Head(facts) => {
                    if let Some(t) = run.started_ms.take() {
                        self.first_byte_ms.push(now_ms.saturating_sub(t));
                    }
                    let mut facts = facts;
                    if !facts.fields.vary.is_empty() {
                        // The request the reply varies on: what later clients must match.
                        facts.selecting = crate::origin::contract::selecting_lines(
                            &facts.fields.vary,
                            &run.forward,
                        );
                    }
                    if facts.handed.is_some() {
                        // Handed over to one client: its pieces are delivered from here on,
                        // never written (`FillEvent::Piece`). It is the answer to these lines
                        // (another client may have noted its own since the fill began).
                        run.file = None;
                        facts.request_lines = run.forward.clone();
                    }
                    self.events.push(FillEvent::Head {
                        job: run.job,
                        facts,
                    })
                }
                Output::Committed { block, crc } => self.events.push(FillEvent::Committed {
                    job: run.job,
                    block,
                    crc,
                }),
                Output::Poisoned { bytes } => {
                    self.poisoned += 1;
                    tracing::warn!(
                        origin = %self.origins[run.origin].host,
                        bytes,
                        "origin sent bytes past a reply's end; the connection is closed"
                    );
                }
                Output::Done { keep_alive } => self.end(index, keep_alive, None),
                Output::Failed(e) => {
                    if let FetchError::Head(reason) = e {
                        self.refused_heads[reason.index()] += 1;
                        tracing::warn!(
                            origin = %self.origins[run.origin].host,
                            reason = reason.label(),
                            "origin reply refused"
                        );
                    }
                    // A 304 or a refusal is an answer too: its time counts.
                    let answered = matches!(
                        e,
                        FetchError::NotModified
                            | FetchError::Unusable(
                                Unusable::Status(_) | Unusable::Throttled { .. }
                            )
                    );
                    if let Some(t) = run.started_ms.take().filter(|_| answered) {
                        self.first_byte_ms.push(now_ms.saturating_sub(t));
                    }
                    self.end(index, false, Some(e))
                }
            }
        }
        let mut outputs = outputs;
        outputs.clear();
        if self.out.is_empty() {
            self.out = outputs;
        }
        answer
    }

    /// Puts the machine's operation `io` of fetch `index` on the ring; Some(result) when it
    /// was answered at once (nothing to sync, or plaintext the TLS layer held).
    fn submit_io<R: RingOps>(
        &mut self,
        ring: &mut R,
        index: u32,
        io: Io,
        token: u64,
    ) -> Option<i32> {
        let run = self.fetches[index as usize]
            .run
            .as_ref()
            .expect("a running fetch");
        let tls = self.tls[run.conn as usize].is_some();
        match (io, run.file.as_ref()) {
            (Io::Write { len, file_offset }, None) => {
                // A pass-through: the piece goes to its client, and the write is done when
                // `delivered` says so.
                self.events.push(FillEvent::Piece {
                    job: run.job,
                    slot: run.slot,
                    file_offset,
                    len,
                });
            }
            // Nothing was written: nothing to make durable.
            (Io::Sync, None) => return Some(0),
            (Io::Write { len, file_offset }, Some(file)) => {
                ring.write_arena_fd(run.slot, len, file.as_fd(), file_offset, token)
            }
            (Io::Sync, Some(file)) => ring.fsync_fd(file.as_fd(), token),
            (Io::Send { .. } | Io::Recv { .. } | Io::Probe { .. }, _) if tls => {
                if let Dispatch::Answer(res) = self.tls_io(ring, index, token) {
                    return Some(res);
                }
            }
            (Io::Connect | Io::Send { .. } | Io::Recv { .. } | Io::Probe { .. }, _) => {
                let socket = self.conns[run.conn as usize]
                    .as_ref()
                    .expect("the fetch's connection");
                match io {
                    Io::Connect => ring.poll_fd(socket.as_fd(), libc::POLLOUT as u32, token),
                    Io::Send { offset, len } => {
                        ring.send_arena_fd(run.slot, offset, len, socket.as_fd(), token)
                    }
                    Io::Recv { offset, len } => {
                        ring.recv_arena_fd(run.slot, offset, len, socket.as_fd(), token)
                    }
                    Io::Probe { offset, len } => {
                        ring.probe_arena_fd(run.slot, offset, len, socket.as_fd(), token)
                    }
                    _ => unreachable!("matched above"),
                }
            }
        }
        None
    }

    /// Completes the machine's pending operation of fetch `index` with `res`.
    fn answer_machine<R: RingOps>(&mut self, ring: &mut R, index: u32, res: i32, now_ms: u64) {
        let Some(run) = self.fetches[index as usize].run.as_mut() else {
            return;
        };
        match run.io.take() {
            Some(Io::Send { .. }) => run.machine.on_sent(res, now_ms, &mut self.out),
            Some(Io::Recv { .. }) => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_received(res, slot, now_ms, &mut self.out);
            }
            Some(Io::Probe { .. }) => run.machine.on_probed(res, now_ms, &mut self.out),
            Some(Io::Sync) if run.file.is_none() => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_synced(res, slot, now_ms, &mut self.out);
            }
            other => unreachable!("the TLS layer answers sends and receives, not {other:?}"),
        }
    }

    /// Carries out the machine's pending send or receive of fetch `index` over TLS: the
    /// handshake first (on a new connection), then the request sealed into records, and
    /// receives opened into plaintext where the machine asked for it.
    fn tls_io<R: RingOps>(&mut self, ring: &mut R, index: u32, token: u64) -> Dispatch {
        let run = self.fetches[index as usize]
            .run
            .as_mut()
            .expect("a running fetch");
        let conn = run.conn as usize;
        let tls = self.tls[conn].as_mut().expect("a TLS connection");
        let socket = self.conns[conn].as_ref().expect("the fetch's connection");
        let origin = &self.origins[run.origin];
        let buf = ring.arena_mut(run.slot);
        let area_at = buf.len() - TLS_AREA_BYTES;
        let (plain, area) = buf.split_at_mut(area_at);
        let io = run.io.expect("a pending operation");
        let failed = |what: &str, e: &str| {
            tracing::warn!(origin = %origin.host, error = %e, "origin TLS {what}");
            Dispatch::Answer(-libc::EPROTO)
        };
        match io {
            Io::Send { .. } if !tls.established() => {
                // Handshake bytes go out from the plaintext area past the request head.
                let out = &mut plain[run.head_len..];
                let (used, step) = tls.handshake(&mut area[..run.ct_len], out);
                area.copy_within(used..run.ct_len, 0);
                run.ct_len -= used;
                match step {
                    crate::origin::tls::Step::Send(len) => {
                        let off = run.head_len;
                        run.tls_op = Some(TlsOp::Handshake { off, len, sent: 0 });
                        ring.send_arena_fd(run.slot, off, len, socket.as_fd(), token);
                        Dispatch::Submitted
                    }
                    crate::origin::tls::Step::NeedInput if run.ct_len == TLS_AREA_BYTES => {
                        failed("handshake", "a handshake message larger than the TLS area")
                    }
                    crate::origin::tls::Step::NeedInput => {
                        run.tls_op = Some(TlsOp::HandshakeRecv);
                        let (at, room) = (area_at + run.ct_len, TLS_AREA_BYTES - run.ct_len);
                        ring.recv_arena_fd(run.slot, at, room, socket.as_fd(), token);
                        Dispatch::Submitted
                    }
                    crate::origin::tls::Step::Established => self.tls_io(ring, index, token),
                    crate::origin::tls::Step::Failed(e) => failed("handshake", &e),
                }
            }
            Io::Send { offset, len } => {
                // The records go right after the request's plaintext.
                let (left, right) = plain.split_at_mut(offset + len);
                match tls.encrypt(&left[offset..], right) {
                    Ok(n) => {
                        let off = offset + len;
                        run.tls_op = Some(TlsOp::Sealed {
                            off,
                            len: n,
                            sent: 0,
                            plain: len,
                        });
                        ring.send_arena_fd(run.slot, off, n, socket.as_fd(), token);
                        Dispatch::Submitted
                    }
                    Err(e) => failed("seal", &e),
                }
            }
            Io::Recv { offset, len } => {
                match tls.read(&mut area[..run.ct_len], &mut plain[offset..offset + len]) {
                    Err(e) => failed("record", &e),
                    Ok(r) => {
                        area.copy_within(r.consumed..run.ct_len, 0);
                        run.ct_len -= r.consumed;
                        if r.delivered > 0 {
                            Dispatch::Answer(r.delivered as i32)
                        } else if r.closed {
                            Dispatch::Answer(0)
                        } else if run.ct_len == TLS_AREA_BYTES {
                            failed("record", "a record larger than the TLS area")
                        } else {
                            run.tls_op = Some(TlsOp::RecordRecv);
                            let (at, room) = (area_at + run.ct_len, TLS_AREA_BYTES - run.ct_len);
                            ring.recv_arena_fd(run.slot, at, room, socket.as_fd(), token);
                            Dispatch::Submitted
                        }
                    }
                }
            }
            Io::Probe { .. } if !tls.idle() || run.ct_len > 0 => {
                // Plaintext or records held past the reply: bytes no request asked for.
                Dispatch::Answer(run.ct_len.max(1) as i32)
            }
            Io::Probe { .. } => {
                run.tls_op = Some(TlsOp::ProbeRecv);
                ring.probe_arena_fd(run.slot, area_at, TLS_AREA_BYTES, socket.as_fd(), token);
                Dispatch::Submitted
            }
            other => unreachable!("the TLS layer carries sends and receives, not {other:?}"),
        }
    }

    /// What a probe of a TLS connection found in `res` raw bytes: application data is bytes
    /// past the reply (poisoned); a close or anything else (a ticket, part of a record) is a
    /// connection not to reuse, as an origin's close is.
    fn tls_probed<R: RingOps>(&mut self, ring: &mut R, index: u32, res: i32) -> i32 {
        let run = self.fetches[index as usize]
            .run
            .as_mut()
            .expect("a running fetch");
        if res <= 0 {
            return res;
        }
        self.received_bytes += res as u64;
        self.received_by_origin[run.origin] += res as u64;
        run.ct_len = res as usize;
        let Some(Io::Probe { offset, len }) = run.io else {
            unreachable!("a probe's completion")
        };
        let tls = self.tls[run.conn as usize]
            .as_mut()
            .expect("a TLS connection");
        let buf = ring.arena_mut(run.slot);
        let area_at = buf.len() - TLS_AREA_BYTES;
        let (plain, area) = buf.split_at_mut(area_at);
        match tls.read(&mut area[..run.ct_len], &mut plain[offset..offset + len]) {
            Ok(r) if r.delivered > 0 => r.delivered as i32,
            Ok(_) => 0,
            Err(_) => -libc::EPROTO,
        }
    }

    /// The completion of the TLS layer's operation `op` of fetch `index`.
    fn on_tls_completion<R: RingOps>(
        &mut self,
        ring: &mut R,
        index: u32,
        op: TlsOp,
        res: i32,
        now_ms: u64,
    ) {
        let generation = self.fetches[index as usize].generation;
        let token = Token::fetch(index, generation).encode();
        let run = self.fetches[index as usize]
            .run
            .as_mut()
            .expect("a running fetch");
        let socket = self.conns[run.conn as usize]
            .as_ref()
            .expect("the fetch's connection");
        let dispatch = match op {
            TlsOp::Handshake { len, .. } | TlsOp::Sealed { len, .. } if res <= 0 => {
                let _ = len;
                Dispatch::Answer(if res == 0 { -libc::EPIPE } else { res })
            }
            TlsOp::Handshake { off, len, sent } | TlsOp::Sealed { off, len, sent, .. }
                if sent + (res as usize) < len =>
            {
                let sent = sent + res as usize;
                run.tls_op = Some(match op {
                    TlsOp::Handshake { .. } => TlsOp::Handshake { off, len, sent },
                    TlsOp::Sealed { plain, .. } => TlsOp::Sealed {
                        off,
                        len,
                        sent,
                        plain,
                    },
                    _ => unreachable!("a send"),
                });
                ring.send_arena_fd(run.slot, off + sent, len - sent, socket.as_fd(), token);
                Dispatch::Submitted
            }
            TlsOp::Sealed { plain, .. } => Dispatch::Answer(plain as i32),
            TlsOp::Handshake { .. } => self.tls_io(ring, index, token),
            TlsOp::ProbeRecv => Dispatch::Answer(self.tls_probed(ring, index, res)),
            TlsOp::HandshakeRecv | TlsOp::RecordRecv if res < 0 => Dispatch::Answer(res),
            // The origin closed: mid-handshake an error, between records the machine's end.
            TlsOp::HandshakeRecv if res == 0 => Dispatch::Answer(-libc::ECONNRESET),
            TlsOp::RecordRecv if res == 0 => Dispatch::Answer(0),
            TlsOp::HandshakeRecv | TlsOp::RecordRecv => {
                self.received_bytes += res as u64;
                self.received_by_origin[run.origin] += res as u64;
                run.ct_len += res as usize;
                self.tls_io(ring, index, token)
            }
        };
        if let Dispatch::Answer(res) = dispatch {
            self.answer_machine(ring, index, res, now_ms);
        }
        self.carry_out(ring, index, now_ms);
    }

    /// Fetch `index` ended: its connection goes idle or is closed, its slot goes back.
    fn end(&mut self, index: u32, keep_alive: bool, error: Option<FetchError>) {
        let run = self.fetches[index as usize]
            .run
            .take()
            .expect("a running fetch");
        assert!(
            run.io.is_none(),
            "a fetch ended with an operation in flight"
        );
        // A TLS connection with bytes left over (held plaintext, records not yet opened, a
        // close_notify) cannot carry another request.
        let tls_idle = self.tls[run.conn as usize]
            .as_ref()
            .is_none_or(|t| t.idle() && run.ct_len == 0);
        let keep_alive = keep_alive && tls_idle;
        if let Some(close) = self.pools[run.origin].release(run.conn, keep_alive) {
            self.close_conn(close);
        }
        self.free_fetches.push(index);
        self.events.push(FillEvent::Ended {
            job: run.job,
            error,
            slot: Some(run.slot),
            parked: false,
        });
    }

    /// Whether a fetch ended since the last call while a shard had been refused a unit of an
    /// origin's shared budget (the shards with queued fetches should try again).
    pub fn take_budget_freed(&mut self) -> bool {
        let mut freed = false;
        for p in &mut self.pools {
            freed |= p.take_freed_for_others();
        }
        freed
    }

    fn close_conn(&mut self, conn: u32) {
        self.tls[conn as usize] = None;
        if self.conns[conn as usize].take().is_some() {
            self.free_conns.push(conn);
        }
    }

    /// The completion of fetch `index`'s operation (`token` decoded by the caller).
    pub fn on_completion<R: RingOps>(&mut self, ring: &mut R, token: Token, res: i32, now_ms: u64) {
        let index = token.fetch_index();
        if let Some(i) = self
            .parked
            .iter()
            .position(|p| p.index == index && p.generation == token.generation)
        {
            // A disk operation given up at its deadline came back: what it held is free.
            let p = self.parked.swap_remove(i);
            if let Some(slot) = p.slot {
                ring.arena_done(slot);
            }
            self.events.push(FillEvent::Released {
                job: p.job,
                slot: p.slot,
            });
            return;
        }
        let Some(f) = self.fetches.get_mut(index as usize) else {
            panic!("origin completion {token:?} for no fetch");
        };
        assert_eq!(f.generation, token.generation, "a stale origin completion");
        let run = f.run.as_mut().expect("a completion for a running fetch");
        if let Some(op) = run.tls_op.take() {
            ring.arena_done(run.slot);
            if let Some(e) = run.timed_out.take() {
                run.io = None;
                self.out.clear();
                self.out.push(Output::Failed(e));
                return self.carry_out(ring, index, now_ms);
            }
            return self.on_tls_completion(ring, index, op, res, now_ms);
        }
        let io = run.io.take().expect("a completion with nothing in flight");
        run.disk_since_ms = None;
        if !matches!(io, Io::Connect | Io::Sync) {
            ring.arena_done(run.slot);
        }
        self.out.clear();
        if let Some(e) = run.timed_out.take() {
            self.out.push(Output::Failed(e));
            return self.carry_out(ring, index, now_ms);
        }
        match io {
            Io::Connect => {
                let socket = self.conns[run.conn as usize].as_ref().expect("connection");
                let err = if res < 0 {
                    -res
                } else {
                    match socket.take_error() {
                        Ok(None) => 0,
                        Ok(Some(e)) | Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
                    }
                };
                run.machine
                    .on_connected(err, run.head_len, now_ms, &mut self.out);
            }
            Io::Send { .. } => run.machine.on_sent(res, now_ms, &mut self.out),
            Io::Probe { .. } => run.machine.on_probed(res, now_ms, &mut self.out),
            Io::Recv { .. } => {
                let n = u64::from(res.max(0).unsigned_abs());
                self.received_bytes += n;
                self.received_by_origin[run.origin] += n;
                if let Some((bucket, rate)) = self.origins[run.origin].bandwidth.as_ref() {
                    // Charged after the fact: the next receive waits out these bytes' turn.
                    let now_us = bucket.epoch().elapsed().as_micros() as u64;
                    let wait_us = bucket.reserve(n, *rate, now_us);
                    run.paced_until_ms = now_ms + wait_us.div_ceil(1000);
                }
                let slot = ring.arena_mut(run.slot);
                run.machine.on_received(res, slot, now_ms, &mut self.out);
            }
            Io::Write { .. } => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_written(res, slot, now_ms, &mut self.out);
            }
            Io::Sync => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_synced(res, slot, now_ms, &mut self.out);
            }
        }
        self.carry_out(ring, index, now_ms);
    }

    /// Ends every stage past its deadline: the socket is shut down, so the operation in
    /// flight completes at once and the fetch ends with the timeout then.
    pub fn expire(&mut self, now_ms: u64) {
        let timeout = self.disk_op_timeout_ms;
        let past: Vec<u32> = (0..self.fetches.len() as u32)
            .filter(|&i| {
                self.fetches[i as usize]
                    .run
                    .as_ref()
                    .and_then(|r| r.disk_since_ms)
                    .is_some_and(|t| t + timeout <= now_ms)
            })
            .collect();
        for index in past {
            self.park(index);
        }
        for f in &mut self.fetches {
            let Some(run) = f.run.as_mut() else { continue };
            if run.timed_out.is_some() || run.machine.deadline_ms().is_none_or(|d| d > now_ms) {
                continue;
            }
            let mut out = Vec::new();
            run.machine.on_timeout(&mut out);
            if let Some(Output::Failed(e)) = out.pop() {
                cut_stage(run, &self.conns, e);
            }
        }
    }

    /// Gives fetch `index` up while the kernel holds its write or sync of the data file (the
    /// disk is stalled): it ends now with ETIMEDOUT, so its waiters go on from the origin, and
    /// what the operation holds (the slot a write reads from, the file) is kept until its
    /// completion comes back (`Parked`, then `FillEvent::Released`). Its connection is
    /// closed: the rest of the reply is read by nobody.
    fn park(&mut self, index: u32) {
        let f = &mut self.fetches[index as usize];
        let run = f.run.take().expect("a running fetch");
        let io = run.io.expect("a disk operation in flight");
        assert!(run.tls_op.is_none(), "two operations of one fetch");
        let holds_slot = matches!(io, Io::Write { .. });
        self.parked.push(Parked {
            index,
            generation: f.generation,
            job: run.job,
            slot: holds_slot.then_some(run.slot),
            _file: run.file,
        });
        if let Some(close) = self.pools[run.origin].release(run.conn, false) {
            self.close_conn(close);
        }
        self.free_fetches.push(index);
        tracing::warn!(
            origin = %self.origins[run.origin].host,
            timeout_ms = self.disk_op_timeout_ms,
            op = if holds_slot { "write" } else { "sync" },
            "cache disk operation past its deadline: the fill is given up (its clients go on \
             from the origin), its buffer stays with the kernel until the disk answers"
        );
        self.events.push(FillEvent::Ended {
            job: run.job,
            error: Some(FetchError::Disk(libc::ETIMEDOUT)),
            slot: (!holds_slot).then_some(run.slot),
            parked: true,
        });
    }

    /// The earliest deadline of any fetch (ms), for the loop's sleep.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let timeout = self.disk_op_timeout_ms;
        let disk = self
            .fetches
            .iter()
            .filter_map(|f| f.run.as_ref()?.disk_since_ms.map(|t| t + timeout))
            .min();
        let runs = self.fetches.iter().filter_map(|f| f.run.as_ref());
        let deadlines = runs
            .clone()
            .filter(|r| r.timed_out.is_none())
            .filter_map(|r| r.machine.deadline_ms());
        // A held receive is due at its turn, or at once when its fetch was cut meanwhile.
        let paced = runs.filter(|r| r.paced).map(|r| {
            if r.timed_out.is_some() {
                0
            } else {
                r.paced_until_ms
            }
        });
        deadlines.chain(paced).chain(disk).min()
    }

    /// Posts the receives the origins' bandwidth caps held back whose turn came; one whose
    /// fetch was cut meanwhile (a deadline, an abort) ends it with that error instead.
    pub fn resume_paced<R: RingOps>(&mut self, ring: &mut R, now_ms: u64) -> bool {
        if !self.paced_any {
            return false;
        }
        let mut resumed = false;
        for index in 0..self.fetches.len() as u32 {
            let generation = self.fetches[index as usize].generation;
            let Some(run) = self.fetches[index as usize].run.as_mut() else {
                continue;
            };
            if !run.paced || (run.paced_until_ms > now_ms && run.timed_out.is_none()) {
                continue;
            }
            run.paced = false;
            resumed = true;
            self.out.clear();
            if let Some(e) = run.timed_out.take() {
                run.io = None;
                self.out.push(Output::Failed(e));
                self.carry_out(ring, index, now_ms);
                continue;
            }
            let io = run.io.expect("a held receive");
            let token = Token::fetch(index, generation).encode();
            if let Some(res) = self.submit_io(ring, index, io, token) {
                self.answer_machine(ring, index, res, now_ms);
                self.carry_out(ring, index, now_ms);
            }
        }
        resumed
    }

    /// The running fetch of `job`, if any.
    fn find(&self, job: u64) -> Option<u32> {
        self.fetches
            .iter()
            .position(|f| f.run.as_ref().is_some_and(|r| r.job == job))
            .map(|i| i as u32)
    }

    /// The piece of pass-through `job` (its last `FillEvent::Piece`) went to its client: the
    /// fetch goes on (receives the next piece, or ends). False when no such piece waits.
    pub fn delivered<R: RingOps>(&mut self, ring: &mut R, job: u64, now_ms: u64) -> bool {
        self.answer_piece(ring, job, None, now_ms)
    }

    /// Ends pass-through `job` (its client is gone): a fetch waiting for its piece to be
    /// delivered ends now, one with an operation on the ring ends when that completes (its
    /// socket is shut down). Its `Ended` event follows, as for every fetch.
    pub fn abort<R: RingOps>(&mut self, ring: &mut R, job: u64, now_ms: u64) {
        if self.answer_piece(ring, job, Some(libc::ECANCELED), now_ms) {
            return;
        }
        let Some(index) = self.find(job) else {
            return;
        };
        let run = self.fetches[index as usize].run.as_mut().expect("found");
        if run.timed_out.is_none() {
            cut_stage(run, &self.conns, FetchError::Connection(libc::ECANCELED));
        }
    }

    /// Completes the pending piece write of pass-through `job`: whole, or failed with
    /// `errno`. False when its fetch has no piece waiting.
    fn answer_piece<R: RingOps>(
        &mut self,
        ring: &mut R,
        job: u64,
        errno: Option<i32>,
        now_ms: u64,
    ) -> bool {
        let Some(index) = self.find(job) else {
            return false;
        };
        let run = self.fetches[index as usize].run.as_mut().expect("found");
        let (None, Some(Io::Write { len, .. })) = (run.file.as_ref(), run.io) else {
            return false;
        };
        run.io = None;
        self.out.clear();
        let res = errno.map_or(len as i32, |e| -e);
        let slot = ring.arena_mut(run.slot);
        run.machine.on_written(res, slot, now_ms, &mut self.out);
        self.carry_out(ring, index, now_ms);
        true
    }

    /// Moves the events since the last call into `out`.
    pub fn take_events(&mut self, out: &mut Vec<FillEvent>) {
        out.append(&mut self.events);
    }
}

#[cfg(test)]
mod tests;
