//! One connection as a sans-IO state machine (issue 11 item 3).
//!
//! `ConnMachine` takes events (a receive, a read, a send or a notification completed, the
//! socket became writable, a timer expired, an arena slot was handed over, a response was
//! planned) and answers with `Action`s: submit this operation, give back that slot, queue me,
//! count this. It never touches the ring, the arena's memory, the file cache or the metrics;
//! the shard (`mod.rs`) is the driver that turns completions into events and actions into
//! submissions, in order. So every decision about one connection lives in this file, and the
//! simulator and the unit tests below can drive it without a kernel.
//!
//! Its state is three enums, so illegal combinations cannot be written down:
//! - `life`: `Free` -> `Open` -> (`Lingering` ->) `Closing` -> `Free`;
//! - `read`: the receive side (`Idle`, `Armed`, `AwaitingBuffer`, `Eof`);
//! - `write`: `Idle` or `Responding(Response)`, whose head is `Pending`, `Sending` or `Done`
//!   and whose body is a pipeline of chunks, each in one `ChunkState`.
//!
//! What is in flight is not counted by hand: `in_flight()` derives it from those states plus
//! the few operations that have no state of their own (`OpSlots`: poll, cancel, shutdown,
//! close). A connection is freed only when it is 0.

use super::buffers::Demand;
use super::conn::{
    Body, BodyBuffers, Chunk, ChunkState, CloseReason, Deadline, Origin, SealedRun, Segment, Source,
};
use super::sched::{TickBudget, Turn};
use super::slots::{ArenaSlot, FileSlot, SocketSlot};
use super::{
    LINGER_MAX_BYTES, LINGER_TIMEOUT_MS, MIN_READ_BYTES, READ_AHEAD_FAST_SEND_MS,
    READ_AHEAD_START_CHUNKS, RECV_BUFFER_BYTES,
};
use crate::client::proxy_protocol::{Feed as ProxyFeed, Outcome as ProxyOutcome};
use crate::http::request::Method;
use crate::limits::EgressBucket;
use crate::tls::record::RecordCut;
use crate::tls::session::{HandshakeFailure, HandshakeStep, Received, Resume, TlsSession, Version};

/// Where a connection slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Unused slot (on the shard's free list).
    Free,
    /// Serving requests.
    Open,
    /// After an error response with the rest of the request unread: the write side is shut,
    /// and what the client still sends is read and dropped (bounded) before the close, so the
    /// close sends no reset that could destroy the response in the client's buffer.
    Lingering {
        /// Bytes read and dropped so far.
        dropped_bytes: u64,
    },
    /// Cancelling what is in flight; the socket is closed once nothing is, then the slot is
    /// free.
    Closing {
        /// Why (for counters and logs).
        reason: CloseReason,
    },
}

/// The receive side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadState {
    /// No receive in flight.
    Idle,
    /// A receive is in flight.
    Armed,
    /// The last receive found no provided buffer free; the shard re-arms it next tick.
    AwaitingBuffer,
    /// The peer shut its write side.
    Eof,
}

/// The response head (in the connection's header buffer, kept by the ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadState {
    /// Bytes from `from` still to send.
    Pending {
        /// First unsent byte.
        from: usize,
    },
    /// A send from `from` is in flight.
    Sending {
        /// First byte of the send.
        from: usize,
    },
    /// Sent, or travelling in front of the body in the first chunk (a small file).
    Done,
}

/// A response in progress.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Keep the connection after it.
    pub keep_alive: bool,
    /// The head.
    pub head: HeadState,
    /// Bytes of the head.
    pub head_len: usize,
    /// The body, if any.
    pub body: Option<Body>,
}

/// The send side.
#[derive(Debug)]
pub enum WriteState {
    /// No response in progress.
    Idle,
    /// A response is being sent.
    Responding(Response),
    /// The request is parsed (and kept in `rx`); its response waits for the cache fill
    /// (`fill::cache_fill`). No slot, no operation: only a deadline.
    AwaitingFill,
}

/// The connection's place in the arena's wait queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArenaWait {
    /// Not waiting.
    None,
    /// Queued since (shard clock, µs).
    Waiting {
        /// When the wait began.
        since_us: u64,
    },
    /// A slot was handed over while waiting; the next pump uses it.
    Handed {
        /// The slot.
        slot: ArenaSlot,
    },
}

/// Operations in flight that no other state records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpSlots {
    /// A writability poll (a chunk is parked behind a full socket).
    pub poll: bool,
    /// The cancel of everything on the socket (closing).
    pub cancel: bool,
    /// The shutdown of the write side (lingering).
    pub shutdown: bool,
    /// The close of the socket.
    pub close: bool,
    /// The request for the peer's address (`SO_PEERNAME`), sent at accept.
    pub peer: bool,
    /// The cancel of the multishot receive (`rx` reached `RX_MULTISHOT_MAX_BYTES`).
    pub recv_cancel: bool,
}

/// A send of TLS bytes the session produced (handshake flight, alert, close_notify,
/// KeyUpdate), from the header buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsSend {
    /// None in flight.
    Idle,
    /// Bytes `from..len` of the header buffer are being sent.
    Sending {
        /// First byte of the send.
        from: u32,
        /// Bytes in the buffer.
        len: u32,
    },
}

/// How a TLS handshake ended (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeOutcome {
    /// Completed.
    Ok {
        /// Version negotiated.
        version: Version,
        /// A session ticket was used.
        resumed: bool,
    },
    /// rustls refused what the client sent.
    Failed,
    /// The client sent an alert or closed.
    PeerClosed,
    /// `tls_handshake_timeout_ms` passed.
    Timeout,
    /// The shard's queue of waiting handshakes was full.
    QueueFull,
    /// Too many handshake bytes.
    TooLarge,
    /// The shard's handshake budget (`tls_handshake_budget_bytes`) had no room for them.
    OverBudget,
    /// Cleartext HTTP on the TLS port (answered with a plain 400).
    PlainHttp,
}

/// Why read bytes went back to the arena unsent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveBack {
    /// The connection was parked behind a full socket (arena pressure or `PARK_HOLD_MS`):
    /// the unsent rest of the chunk the socket took part of.
    Reclaim,
    /// As `Reclaim`, from a chunk read ahead that had not begun to leave.
    ReclaimUnsent,
    /// A short send cut the read-ahead.
    ReadAhead,
}

/// Counters the machine bumps through the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// A receive found no provided buffer.
    RecvNoBuffers,
    /// Body or head bytes that left, by origin.
    Bytes(Source),
    /// A send that found the socket full.
    ParkedSend,
    /// Chunks given back from a parked connection.
    ReclaimedChunks,
    /// File bytes given back unsent, by why.
    GivenBack(GiveBack),
    /// A connection began closing, by reason.
    Closed(CloseReason),
    /// A TLS handshake ended.
    Handshake(HandshakeOutcome),
    /// TLS bytes received.
    TlsBytesIn,
    /// TLS bytes sent (records of every kind).
    TlsBytesOut,
    /// A PROXY protocol header ended, by outcome.
    Proxy(crate::client::proxy_protocol::Outcome),
    /// A request to a signed prefix was refused, by reason.
    SignedUrl(crate::signing::Refusal),
    /// A rate-limited response waited for its allowance.
    LimitWait,
    /// Bytes planned under a rate limit (past `limit_rate_after_bytes`).
    LimitedBytes,
    /// A response waited for its turn under the edge's egress cap.
    EgressWait,
    /// Bytes planned after waiting for the egress cap.
    EgressDelayedBytes,
    /// Bytes that went at once on the egress cap's bypass for first bytes.
    EgressBypassBytes,
}

/// What the driver does for the machine, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Arm a receive (multishot where `ConnMachine::recv_multishot` says so).
    Recv,
    /// Cancel the multishot receive: `rx` holds as much as it may.
    CancelRecv,
    /// The body's next file bytes (from `file_offset`) are not in the pulled object's
    /// committed blocks yet: have the fill say when they are (`Body::readable_end`).
    AwaitBlock {
        /// The first byte the body needs.
        file_offset: u64,
    },
    /// Re-arm the receive next tick (no provided buffer was free).
    RetryRecv,
    /// Send the header buffer from `from` (MSG_MORE when `more`).
    SendHead {
        /// First byte.
        from: usize,
        /// More bytes follow.
        more: bool,
    },
    /// Read file bytes into a slot.
    Read {
        /// Arena slot.
        slot: ArenaSlot,
        /// Where in the slot.
        buf_off: usize,
        /// Bytes.
        len: usize,
        /// Fixed-file index.
        file_fixed: u32,
        /// File offset.
        file_off: u64,
        /// `rw_flags` of the read.
        rw_flags: i32,
    },
    /// Send `len` bytes of a slot from `off`.
    Send {
        /// Arena slot.
        slot: ArenaSlot,
        /// First byte in the slot.
        off: usize,
        /// Bytes.
        len: usize,
        /// More bytes follow (MSG_MORE).
        more: bool,
        /// As SEND_ZC.
        zerocopy: bool,
    },
    /// Copy the header buffer to the front of a slot (a small file's one send).
    CopyHeadToSlot {
        /// Arena slot.
        slot: ArenaSlot,
    },
    /// Copy `len` framing bytes from `from` into a slot at `to`.
    CopyFraming {
        /// Arena slot.
        slot: ArenaSlot,
        /// First byte in `Body::framing`.
        from: usize,
        /// Bytes.
        len: usize,
        /// Where in the slot.
        to: usize,
    },
    /// Fill the front of a slot with `len` zero bytes.
    ZeroFill {
        /// Arena slot.
        slot: ArenaSlot,
        /// Bytes.
        len: usize,
    },
    /// Ask the kernel for the peer's address.
    GetPeer,
    /// The connection's client address is settled (peer, or PROXY header): count it.
    ClientKnown,
    /// The response waits for its rate limit: wake the connection at this shard time (ms).
    LimitWait {
        /// When enough bytes are allowed again.
        at_ms: u64,
    },
    /// Bytes reserved under the egress cap but not sent (given back, or the response ended):
    /// the bucket gets them back.
    EgressRefund(u64),
    /// Arm a one-shot writability poll.
    PollWritable,
    /// Shut the write side.
    ShutdownWrite,
    /// Cancel everything in flight on the socket.
    CancelAll,
    /// Close the socket.
    CloseSocket,
    /// Release the header buffer's memory.
    ReleaseHeadBuffer,
    /// Cut an idle connection's header buffer back to a response head's size.
    ShrinkHeadBuffer,
    /// Give an arena slot back (a waiter may get it).
    ReleaseSlot(ArenaSlot),
    /// Release the open-file cache entry the response held.
    ReleaseFile(FileSlot),
    /// The file system refused RWF_DONTCACHE: the cache entry reads buffered from now on.
    DemoteFile(FileSlot),
    /// Queue ahead of bulk work (a request to parse, a small response).
    QueueUrgent,
    /// Queue for a bulk turn.
    QueueBulk,
    /// Leave the ready queue.
    Unqueue,
    /// Join the shard's parked list (a chunk waits behind a full socket).
    ListParked,
    /// Leave the parked list.
    Unlist,
    /// Give parked chunks to connections waiting for the arena.
    Reclaim,
    /// Join the arena's wait queue.
    WaitArena(Demand),
    /// Leave the arena's wait queue.
    LeaveArenaQueue,
    /// A SEND_ZC send now holds a slot (counts toward the shard's zero-copy share).
    ZcTaken,
    /// That slot came back.
    ZcReleased,
    /// Bump a counter.
    Count(Counter, u64),
    /// The first byte of a response left, this long after its request was parsed (µs).
    Ttfb(u64),
    /// The connection waited this long for an arena slot (µs).
    BufferWaited(u64),
    /// Join the shard's queue of handshakes waiting for their turn (closed if it is full).
    QueueHandshake,
    /// Leave that queue.
    LeaveHandshakeQueue,
    /// Send TLS bytes from the header buffer from `from`; `swap` first puts the session's
    /// `outgoing` bytes there.
    SendTls {
        /// First byte.
        from: u32,
        /// Fill the header buffer from `TlsSession::outgoing` first.
        swap: bool,
    },
    /// Seal a chunk's plaintext into records (`tls::record::seal_run_into`, through the ring's
    /// spare buffer).
    Seal {
        /// Arena slot.
        slot: ArenaSlot,
        /// Where its plaintext starts in the slot.
        at: u32,
        /// How it is cut into records.
        cut: RecordCut,
        /// Sequence number of the first record.
        first_seq: u64,
    },
    /// A TLS handshake completed this long after accept (µs).
    HandshakeTime(u64),
    /// A response ended (complete or aborted): count it and write the access-log line.
    ResponseDone {
        /// Status code.
        status: u16,
        /// Bytes sent for it.
        bytes: u64,
    },
}

/// Most actions one event can produce, with room to spare (a full pipeline given back, plus
/// the sends, counters and queue moves around it); the driver's buffer is allocated for it.
pub const ACTIONS_PER_EVENT_MAX: usize = 4 * crate::config::MAX_PIPELINE_DEPTH + 32;

/// Longest framing run (a multipart part header) that travels in the same chunk as the file
/// bytes after it; longer ones (never produced today) take a chunk of their own.
pub const SHARED_FRAMING_MAX_BYTES: usize = 4096;

/// Unread request bytes a multishot receive may fill `rx` with before it is cancelled (the
/// bound of one head; the receive is armed again once they are consumed).
pub const RX_MULTISHOT_MAX_BYTES: usize = crate::http::request::MAX_HEAD_BYTES;

/// The actions of one event, in order.
pub type Actions = Vec<Action>;

/// Limits from the configuration, copied into every event.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request head must complete within this (ms).
    pub header_timeout_ms: u64,
    /// An idle keep-alive connection closes after this (ms).
    pub keepalive_timeout_ms: u64,
    /// A response must make send progress within this (ms).
    pub send_timeout_ms: u64,
    /// Bytes per arena slot.
    pub chunk_bytes: usize,
    /// Most chunks a response may hold.
    pub pipeline_depth: usize,
    /// SEND_ZC is enabled on this shard.
    pub zerocopy: bool,
    /// Smallest send made with SEND_ZC.
    pub zerocopy_min_bytes: usize,
    /// Bytes a response sends with copies before it may use SEND_ZC (`ZC_WARMUP_BYTES`).
    pub zerocopy_warmup_bytes: u64,
    /// Plaintext bytes per TLS record.
    pub tls_record_bytes: u32,
    /// Plaintext bytes a chunk may carry on a TLS connection (room left for the records'
    /// framing, `tls::record::chunk_plaintext_capacity`).
    pub tls_chunk_bytes: usize,
    /// A TLS handshake must complete within this (ms) of accept.
    pub tls_handshake_timeout_ms: u64,
    /// The edge's egress cap over all shards (0 = none).
    pub egress_limit_bytes_per_s: u64,
    /// First bytes of each response that may take the egress cap's bypass.
    pub egress_bypass_bytes: u64,
    /// Connections on the cleartext listener start with a PROXY header.
    pub proxy_protocol: bool,
    /// Connections on the TLS listener start with a PROXY header.
    pub tls_proxy_protocol: bool,
}

/// The moment and the shard-wide facts an event is judged by.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// Shard clock, ms.
    pub now_ms: u64,
    /// Shard clock, µs.
    pub now_us: u64,
    /// The shard is draining: no keep-alive after the current response.
    pub draining: bool,
    /// The shard's SEND_ZC share has room for one more slot.
    pub zc_room: bool,
    /// Configuration limits.
    pub limits: Limits,
    /// The egress bucket's clock, µs (one clock for every shard, from `EgressBucket::epoch`).
    pub egress_now_us: u64,
    /// Handshake bytes the shard may still hold (`tls_handshake_budget_bytes` less what its
    /// handshaking connections hold now).
    pub handshake_room_bytes: usize,
}

/// One connection slot.
#[derive(Debug)]
pub struct ConnMachine {
    /// Bumped each time the slot is freed; tokens carry it.
    pub generation: u16,
    /// Fixed-file index of the socket.
    pub socket: SocketSlot,
    /// Where the connection is in its life.
    pub life: Lifecycle,
    /// The receive side.
    pub read: ReadState,
    /// The send side.
    pub write: WriteState,
    /// Operations in flight that no other state records.
    pub ops: OpSlots,
    /// Who is asking: the peer, and the address a trusted proxy gave.
    pub client: crate::client::Client,
    /// Counted against `max_connections_per_client` under this key (released at close).
    pub cap_key: Option<crate::client::cap::ClientKey>,
    /// Over `max_connections_per_client`: its first request gets a 429.
    pub over_cap: bool,
    /// The limiter the last response waited for, if any (the access log's `limiter`).
    pub limiter: Option<&'static str>,
    /// Where the current pulled response's bytes come from (the access log's `cache`).
    pub cache: Option<&'static str>,
    /// The `[[origin]]` entry of the current pulled response (the per-origin counters).
    pub cache_origin: Option<u8>,
    /// The current response's rate limit (`limit_rate_bytes_per_s`), if one applies.
    pub rate_limit: Option<crate::limits::RateLimit>,
    /// The current response's place with the edge's egress cap, if one applies.
    pub egress: Option<crate::limits::egress::EgressHold>,
    /// The current request's client (X-Forwarded-For applied when a trusted proxy sent it).
    pub request_client: Option<std::net::IpAddr>,
    /// Waiting for the PROXY protocol header (None: not expected, or done).
    pub proxy: Option<crate::client::proxy_protocol::Stage>,
    /// Place in the arena's wait queue.
    pub arena: ArenaWait,
    /// Request bytes received and not yet consumed (pipelined requests wait here).
    pub rx: Vec<u8>,
    /// How far `rx` has been scanned for the end of the head (reset whenever `rx` loses bytes).
    pub head_scan: crate::http::head_scan::HeadScan,
    /// Active timer.
    pub deadline: Deadline,
    /// When it fires (shard clock, ms).
    pub deadline_ms: u64,
    /// When the connection last parked a chunk (shard clock, ms).
    pub parked_ms: u64,
    /// Bytes the socket took since it last became writable.
    pub round_bytes: u64,
    /// What the socket took in its last full writable round (bytes), at least a minimum read.
    pub round_estimate_bytes: usize,
    /// The last chunk send went out whole: the client drains fast enough for SEND_ZC, whose
    /// buffer stays the kernel's until the peer acknowledges it.
    pub fast_drain: bool,
    /// Method of the current request; None when its head was refused before that was known.
    pub method: Option<Method>,
    /// When the current request was parsed (shard clock, µs).
    pub request_start_us: u64,
    /// Bytes sent for the current response.
    pub resp_bytes: u64,
    /// `METHOD target VERSION` of the current request, for the access log (empty when off).
    pub log_request: Vec<u8>,
    /// Range header of the current request, for the access log.
    pub log_range: Vec<u8>,
    /// The queues of the last body, emptied; the driver returns them to the shard's pool.
    pub spare: Option<BodyBuffers>,
    /// The connection's TLS, on the TLS listener (handshake, then record keys).
    pub tls: Option<Box<TlsSession>>,
    /// A send of the session's own bytes in flight.
    pub tls_send: TlsSend,
    /// Lingering over TLS: the write side is shut once close_notify has left.
    pub linger_shutdown_due: bool,
    /// A clean close asked for while a TLS send (close_notify) was in flight: it happens
    /// when the send completes, so the client gets the whole record (the connection's
    /// deadline still bounds the wait).
    pub close_after_tls_send: Option<CloseReason>,
    /// When the connection was accepted (shard clock, µs).
    pub accepted_us: u64,
}

impl Default for ConnMachine {
    fn default() -> Self {
        ConnMachine::new()
    }
}

impl ConnMachine {
    /// An unused slot.
    pub fn new() -> ConnMachine {
        ConnMachine {
            generation: 0,
            socket: SocketSlot::new(0),
            life: Lifecycle::Free,
            read: ReadState::Idle,
            write: WriteState::Idle,
            ops: OpSlots::default(),
            client: crate::client::Client::default(),
            proxy: None,
            request_client: None,
            cap_key: None,
            over_cap: false,
            limiter: None,
            cache: None,
            cache_origin: None,
            rate_limit: None,
            egress: None,
            arena: ArenaWait::None,
            rx: Vec::new(),
            head_scan: crate::http::head_scan::HeadScan::new(),
            deadline: Deadline::None,
            deadline_ms: 0,
            parked_ms: 0,
            round_bytes: 0,
            round_estimate_bytes: 0,
            fast_drain: false,
            method: None,
            request_start_us: 0,
            resp_bytes: 0,
            log_request: Vec::new(),
            log_range: Vec::new(),
            spare: None,
            tls: None,
            tls_send: TlsSend::Idle,
            linger_shutdown_due: false,
            close_after_tls_send: None,
            accepted_us: 0,
        }
    }

    // ---- what the state says -----------------------------------------------------------

    /// Operations the kernel performs for this connection now, derived from its state: the
    /// receive, the head send, every chunk the kernel holds, and `ops`.
    pub fn in_flight(&self) -> usize {
        let head = matches!(self.head(), Some(HeadState::Sending { .. }));
        let chunks = self.body().map_or(0, |b| {
            b.chunks.iter().filter(|c| c.state.kernel_holds()).count()
        });
        usize::from(self.read == ReadState::Armed)
            + usize::from(head)
            + usize::from(self.tls_send != TlsSend::Idle)
            + chunks
            + usize::from(self.ops.poll)
            + usize::from(self.ops.cancel)
            + usize::from(self.ops.shutdown)
            + usize::from(self.ops.close)
            + usize::from(self.ops.peer)
            + usize::from(self.ops.recv_cancel)
    }

    /// Serving requests (not free, not closing, not lingering).
    pub fn is_open(&self) -> bool {
        self.life == Lifecycle::Open
    }

    /// Open or lingering: not yet closing.
    pub fn is_live(&self) -> bool {
        matches!(self.life, Lifecycle::Open | Lifecycle::Lingering { .. })
    }

    /// A response is in progress.
    pub fn responding(&self) -> bool {
        matches!(self.write, WriteState::Responding(_))
    }

    /// The pulled object this response reads is committed up to `end` now: the pipeline may
    /// read that far. True when the response was stopped at its old end (queue it).
    pub fn set_readable_end(&mut self, end: u64) -> bool {
        let Some(body) = self.body_mut() else {
            return false;
        };
        body.readable_end = end;
        let stopped = body.awaiting_block
            && matches!(body.segments.front(), Some(&Segment::File { pos, .. }) if pos < end);
        if stopped {
            body.awaiting_block = false;
        }
        stopped
    }

    /// Reads of this body start and end on `align`-byte boundaries (a pulled object's block
    /// size, so each read holds whole blocks whose checksums can be checked).
    pub fn set_read_align(&mut self, align: u64) {
        if let Some(body) = self.body_mut() {
            assert!(align.is_power_of_two() && align >= body.align.max(1));
            body.align = align;
        }
    }

    /// The read into arena slot `slot`: (file offset, offset in the slot, bytes read so far,
    /// bytes it needs), if that slot holds a chunk of this connection being read.
    pub fn chunk_read(&self, slot: ArenaSlot) -> Option<(u64, u32, u32, u32)> {
        let body = self.body()?;
        let c = body.chunks.iter().find(|c| c.slot == slot)?;
        (c.state == ChunkState::Reading).then_some((
            c.read_file_off,
            c.read_buf_off,
            c.read_got,
            c.read_need,
        ))
    }

    /// Where the response may read its file up to (None: no body).
    pub fn readable_end(&self) -> Option<u64> {
        self.body().map(|b| b.readable_end)
    }

    /// The file offset the body reads next (None: no file bytes left to plan).
    pub fn next_file_offset(&self) -> Option<u64> {
        self.body()?.segments.iter().find_map(|s| match *s {
            Segment::File { pos, .. } => Some(pos),
            _ => None,
        })
    }

    /// The response's body is a pass-through (`fill::relay`): its reads are answered from an
    /// origin fetch, one chunk at a time, and never given back.
    pub fn set_relay(&mut self) {
        if let Some(body) = self.body_mut() {
            body.relay = true;
        }
    }

    /// Whether the parsed request waits for the cache fill.
    pub fn awaiting_fill(&self) -> bool {
        matches!(self.write, WriteState::AwaitingFill)
    }

    /// The request just parsed waits for the cache fill (its bytes stay in `rx`, so it is
    /// parsed again when the fill has what it needs), for at most `timeout_ms`.
    pub fn await_fill(&mut self, timeout_ms: u64, cx: &Ctx) {
        assert!(
            matches!(self.write, WriteState::Idle),
            "a fill wait while responding"
        );
        self.write = WriteState::AwaitingFill;
        self.set_deadline(Deadline::Fill, cx.now_ms + timeout_ms);
    }

    /// The fill has what the waiting request needs (or failed): it is parsed again.
    pub fn fill_resumed(&mut self) {
        assert!(self.awaiting_fill());
        self.write = WriteState::Idle;
        self.set_deadline(Deadline::None, 0);
    }

    /// The response in progress.
    pub fn response(&self) -> Option<&Response> {
        match &self.write {
            WriteState::Responding(r) => Some(r),
            WriteState::Idle | WriteState::AwaitingFill => None,
        }
    }

    fn response_mut(&mut self) -> Option<&mut Response> {
        match &mut self.write {
            WriteState::Responding(r) => Some(r),
            WriteState::Idle | WriteState::AwaitingFill => None,
        }
    }

    fn head(&self) -> Option<HeadState> {
        self.response().map(|r| r.head)
    }

    /// The body of the response in progress.
    pub fn body(&self) -> Option<&Body> {
        self.response().and_then(|r| r.body.as_ref())
    }

    fn body_mut(&mut self) -> Option<&mut Body> {
        self.response_mut().and_then(|r| r.body.as_mut())
    }

    /// A chunk waits behind a full socket (a writability poll is armed).
    pub fn is_parked(&self) -> bool {
        self.is_open() && self.ops.poll
    }

    /// Whether a send (head, TLS bytes or chunk) is in flight.
    fn send_in_flight(&self) -> bool {
        self.tls_send != TlsSend::Idle
            || matches!(self.head(), Some(HeadState::Sending { .. }))
            || self
                .body()
                .is_some_and(|b| b.chunks.iter().any(|c| c.state == ChunkState::Sending))
    }

    /// Bytes from the response's source (the origin, for a pass-through) arrived while the
    /// client had taken everything offered: the send timeout restarts, since the wait was the
    /// origin's (bounded by its own timeouts), not the client's. Without this, a timer sweep
    /// in the same tick as the send closed a connection whose last bytes had just left.
    pub fn source_delivered(&mut self, cx: &Ctx) {
        if self.deadline == Deadline::Send && self.waiting_on_source() {
            self.deadline_ms = self.deadline_ms.max(cx.now_ms + cx.limits.send_timeout_ms);
        }
    }

    /// Nothing of the response waits for the client: the head is out, no send is in flight
    /// or parked, and the next bytes to leave are still being read (from the origin, for a
    /// pass-through, whose own timeouts bound the wait). A block fetched again is not
    /// counted: the send timeout is what bounds that wait.
    fn waiting_on_source(&self) -> bool {
        let Some(resp) = self.response() else {
            return false;
        };
        let next = resp.body.as_ref().and_then(|b| {
            b.chunks
                .iter()
                .find(|c| c.state != ChunkState::AwaitNotif || c.sent < c.send_len)
        });
        self.is_open()
            && resp.head == HeadState::Done
            && !self.send_in_flight()
            && !self.is_parked()
            && next.is_some_and(|c| c.state == ChunkState::Reading)
    }

    fn chunk_mut(&mut self, slot: ArenaSlot) -> &mut Chunk {
        let body = self
            .body_mut()
            .expect("completion for a chunk the connection does not hold");
        let i = body.chunk_index(slot);
        &mut body.chunks[i]
    }

    fn set_deadline(&mut self, kind: Deadline, at_ms: u64) {
        self.deadline = kind;
        self.deadline_ms = at_ms;
    }

    // ---- life --------------------------------------------------------------------------

    /// A newly accepted socket takes this (free) slot: the header clock starts (or, on the
    /// TLS listener, the handshake clock) and a receive is armed.
    pub fn open(
        &mut self,
        socket: SocketSlot,
        tls: Option<Box<TlsSession>>,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        assert_eq!(self.life, Lifecycle::Free);
        assert_eq!(
            self.in_flight(),
            0,
            "reusing a slot with operations in flight"
        );
        let generation = self.generation;
        let mut rx = std::mem::take(&mut self.rx);
        rx.clear();
        let mut log_request = std::mem::take(&mut self.log_request);
        log_request.clear();
        let mut log_range = std::mem::take(&mut self.log_range);
        log_range.clear();
        *self = ConnMachine::new();
        self.generation = generation;
        self.rx = rx;
        self.log_request = log_request;
        self.log_range = log_range;
        self.life = Lifecycle::Open;
        self.socket = socket;
        self.accepted_us = cx.now_us;
        if tls.is_some() {
            self.set_deadline(
                Deadline::Handshake,
                cx.now_ms + cx.limits.tls_handshake_timeout_ms,
            );
        } else {
            self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
        }
        let proxied_listener = if tls.is_some() {
            cx.limits.tls_proxy_protocol
        } else {
            cx.limits.proxy_protocol
        };
        if proxied_listener {
            self.proxy = Some(crate::client::proxy_protocol::Stage::default());
        }
        self.tls = tls;
        // Before the receive: the kernel answers it at once, so the address is known before
        // the first bytes are looked at (PROXY protocol, trusted proxies).
        self.ops.peer = true;
        out.push(Action::GetPeer);
        self.arm_recv(out);
    }

    /// The kernel answered the peer-address request (None: it could not, e.g. the client
    /// already reset; the connection then counts as from an unknown, untrusted peer).
    pub fn on_peer(
        &mut self,
        peer: Option<std::net::SocketAddr>,
        trusted: bool,
        out: &mut Actions,
    ) {
        assert!(self.ops.peer, "peer completion without a request");
        self.ops.peer = false;
        self.client.peer = peer;
        self.client.trusted = peer.is_some() && trusted;
        if self.proxy.is_none() {
            out.push(Action::ClientKnown);
        }
        if !self.is_open() {
            self.maybe_finish_close(out);
        }
    }

    /// Begins closing (once): leaves every queue, cancels what is in flight, and closes the
    /// socket when nothing is.
    pub fn close(&mut self, reason: CloseReason, cx: &Ctx, out: &mut Actions) {
        if !self.is_live() {
            return;
        }
        if let Some(tls) = self.tls.as_mut() {
            // A clean end says so (close_notify), so a client can tell it from a cut; an
            // abort or a stuck client gets none (a truncated body must not look complete).
            let clean = matches!(reason, CloseReason::Normal | CloseReason::Drain)
                || (reason == CloseReason::Timeout && self.deadline == Deadline::Idle);
            if clean && self.tls_send != TlsSend::Idle {
                self.close_after_tls_send = Some(reason);
                return;
            }
            if clean && tls.is_open() {
                tls.queue_close_notify();
            }
            if tls.handshaking() {
                out.push(Action::LeaveHandshakeQueue);
                if reason == CloseReason::Timeout {
                    out.push(Action::Count(
                        Counter::Handshake(HandshakeOutcome::Timeout),
                        1,
                    ));
                }
            }
        }
        self.life = Lifecycle::Closing { reason };
        if self.tls.is_some() {
            self.set_deadline(Deadline::LastWords, cx.now_ms + cx.limits.send_timeout_ms);
        }
        out.push(Action::Count(Counter::Closed(reason), 1));
        out.push(Action::Unqueue);
        out.push(Action::Unlist);
        self.leave_arena_queue(cx, out);
        self.give_back_handed(out);
        if self.in_flight() > 0 {
            self.ops.cancel = true;
            out.push(Action::CancelAll);
        }
        self.maybe_finish_close(out);
    }

    /// A slot handed over while waiting and not used goes back to the arena.
    fn give_back_handed(&mut self, out: &mut Actions) {
        if let ArenaWait::Handed { slot } = self.arena {
            self.arena = ArenaWait::None;
            out.push(Action::ReleaseSlot(slot));
        }
    }

    /// A response ends (complete, or aborted with nothing in flight): its chunks' slots and
    /// its file go back, its queues are kept for the next one, and it is counted and logged.
    fn end_response(&mut self, resp: Response, out: &mut Actions) {
        if let Some(hold) = self.egress.take().filter(|h| h.reserved_bytes > 0) {
            out.push(Action::EgressRefund(hold.reserved_bytes));
        }
        if let Some(body) = resp.body {
            for ch in &body.chunks {
                out.push(Action::ReleaseSlot(ch.slot));
            }
            if let Some(f) = body.file {
                out.push(Action::ReleaseFile(f));
            }
            self.spare = Some(body.into_buffers());
        }
        out.push(Action::ResponseDone {
            status: resp.status,
            bytes: self.resp_bytes,
        });
    }

    /// Closing and nothing in flight: every buffer is ours again; give them back and close.
    fn maybe_finish_close(&mut self, out: &mut Actions) {
        if !matches!(self.life, Lifecycle::Closing { .. }) || self.ops.close {
            return;
        }
        if self.in_flight() > 0 {
            return;
        }
        // The session's last words (close_notify or an alert, or the plain 400 for cleartext
        // on the TLS port) leave before the socket closes.
        if self.tls.as_ref().is_some_and(|t| !t.outgoing.is_empty()) {
            self.send_tls_output(out);
            return;
        }
        if let WriteState::Responding(resp) = std::mem::replace(&mut self.write, WriteState::Idle) {
            self.end_response(resp, out);
        }
        self.ops.close = true;
        if self.rx.capacity() > 2 * RECV_BUFFER_BYTES {
            self.rx = Vec::new();
            self.head_scan.reset();
        }
        out.push(Action::ReleaseHeadBuffer);
        out.push(Action::CloseSocket);
    }

    /// The socket is closed: the slot is free (the driver puts it on the free list).
    pub fn on_closed(&mut self) {
        assert!(self.ops.close, "close completion without a close");
        self.ops.close = false;
        assert_eq!(self.in_flight(), 0, "operations in flight after close");
        self.life = Lifecycle::Free;
        self.tls = None;
        self.generation = self.generation.wrapping_add(1);
    }

    /// The cancel submitted by `close` completed.
    pub fn on_cancel_done(&mut self, out: &mut Actions) {
        self.ops.cancel = false;
        self.maybe_finish_close(out);
    }

    /// The shutdown of the write side completed.
    pub fn on_shutdown_done(&mut self, out: &mut Actions) {
        self.ops.shutdown = false;
        self.maybe_finish_close(out);
    }

    /// The timer sweep: closes the connection if its deadline has passed (true if so).
    pub fn on_timer(&mut self, cx: &Ctx, out: &mut Actions) -> bool {
        if self.deadline == Deadline::LastWords && cx.now_ms >= self.deadline_ms {
            self.give_up_last_words(out);
            return false;
        }
        if !self.is_live() || self.deadline == Deadline::None || cx.now_ms < self.deadline_ms {
            return false;
        }
        if self.deadline == Deadline::Send && self.waiting_on_source() {
            // The send timeout measures a client that does not take what it is given (nginx's
            // `send_timeout`, between two writes). Bytes still coming from the origin (a
            // pass-through, a block fetched again) are bounded by the origin's own timeouts.
            self.deadline_ms = cx.now_ms + cx.limits.send_timeout_ms;
            return false;
        }
        // A lingering close that runs out of time is still a normal end.
        let reason = if self.deadline == Deadline::Linger {
            CloseReason::Normal
        } else {
            CloseReason::Timeout
        };
        self.close(reason, cx, out);
        true
    }

    /// The last words of a closing connection did not leave in time: the send is cancelled
    /// and the rest dropped, so the socket closes.
    fn give_up_last_words(&mut self, out: &mut Actions) {
        self.deadline = Deadline::None;
        if !matches!(self.life, Lifecycle::Closing { .. }) {
            return;
        }
        if let Some(tls) = self.tls.as_mut() {
            tls.outgoing.clear();
        }
        if self.tls_send != TlsSend::Idle && !self.ops.cancel {
            self.ops.cancel = true;
            out.push(Action::CancelAll);
        }
    }

    /// Whether the timer wheel should hold this connection's deadline.
    pub fn wants_timer(&self) -> bool {
        match self.deadline {
            Deadline::None => false,
            Deadline::LastWords => matches!(self.life, Lifecycle::Closing { .. }),
            _ => self.is_live(),
        }
    }

    /// The shard starts draining: an idle connection closes, a responding one closes after
    /// its response.
    pub fn on_drain(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_live() {
            return;
        }
        match &mut self.write {
            WriteState::Responding(r) => r.keep_alive = false,
            WriteState::Idle => self.close(CloseReason::Drain, cx, out),
            // Its fill ends, or its deadline answers 504, before the drain's end.
            WriteState::AwaitingFill => {}
        }
    }

    // ---- receive -----------------------------------------------------------------------

    /// Arms a receive unless one is armed, the peer has closed, or the connection closes.
    pub fn arm_recv(&mut self, out: &mut Actions) {
        if !self.is_live() || matches!(self.read, ReadState::Armed | ReadState::Eof) {
            return;
        }
        self.read = ReadState::Armed;
        out.push(Action::Recv);
    }

    /// Whether its receive is armed multishot: a cleartext connection's stays armed across
    /// arrivals (one SQE and one poll arm per connection, not per arrival: a head trickled a
    /// byte at a time costs one receive per byte, as in nginx). A TLS connection's is
    /// one-shot: records opened while a response's sealed chunks leave could put our
    /// KeyUpdate answer between them.
    pub fn recv_multishot(&self) -> bool {
        self.tls.is_none()
    }

    /// After bytes went into `rx` with the multishot receive still armed: once `rx` holds
    /// `RX_MULTISHOT_MAX_BYTES` (a head's bound; a response in progress reads no further
    /// than that of what follows it) the receive is cancelled, and armed again when `rx`
    /// has been consumed.
    fn bound_multishot(&mut self, out: &mut Actions) {
        if self.read == ReadState::Armed
            && self.rx.len() >= RX_MULTISHOT_MAX_BYTES
            && !self.ops.recv_cancel
        {
            self.ops.recv_cancel = true;
            out.push(Action::CancelRecv);
        }
    }

    /// The cancel of the multishot receive completed.
    pub fn on_recv_cancel_done(&mut self, out: &mut Actions) {
        assert!(
            self.ops.recv_cancel,
            "receive cancel completion without a cancel"
        );
        self.ops.recv_cancel = false;
        self.maybe_finish_close(out);
    }

    /// The shard has provided buffers again: re-arm a receive that found none.
    pub fn retry_recv(&mut self, out: &mut Actions) {
        if self.read == ReadState::AwaitingBuffer {
            self.read = ReadState::Idle;
        }
        self.arm_recv(out);
    }

    /// A receive completed with `res` and, when `res > 0`, the bytes (`data`, None if the
    /// kernel named no buffer); `more`: a multishot receive stays armed.
    pub fn on_recv(
        &mut self,
        res: i32,
        data: Option<&[u8]>,
        more: bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        assert_eq!(
            self.read,
            ReadState::Armed,
            "receive completion without a receive"
        );
        if !more {
            self.read = ReadState::Idle;
        }
        if !self.is_live() {
            self.maybe_finish_close(out);
            return;
        }
        if res < 0 {
            match -res {
                libc::ENOBUFS => {
                    out.push(Action::Count(Counter::RecvNoBuffers, 1));
                    self.read = ReadState::AwaitingBuffer;
                    out.push(Action::RetryRecv);
                }
                libc::ECANCELED => {}
                _ => self.close(CloseReason::Normal, cx, out),
            }
            return;
        }
        if res == 0 {
            self.read = ReadState::Eof;
            if let Some(stage) = self.proxy.take() {
                // A balancer's health check may connect and close without a byte: not counted.
                if stage.started() {
                    out.push(Action::Count(Counter::Proxy(ProxyOutcome::Truncated), 1));
                }
                self.close(CloseReason::ProtocolError, cx, out);
                return;
            }
            if self.tls.as_ref().is_some_and(|t| t.handshaking()) {
                out.push(Action::Count(
                    Counter::Handshake(HandshakeOutcome::PeerClosed),
                    1,
                ));
            }
            // A request waiting for the cache's fill is answered too, as a response would be
            // (the client only half-closed).
            if !self.responding() && !self.awaiting_fill() {
                if self.rx.is_empty() || !self.is_open() {
                    self.close(CloseReason::Normal, cx, out);
                } else if self.can_start_request() {
                    // A request that arrived before the FIN is still answered (over TLS it
                    // may wait for the handshake's last flight to leave: `on_tls_sent`).
                    out.push(Action::QueueUrgent);
                }
            }
            return;
        }
        if let Lifecycle::Lingering { dropped_bytes } = &mut self.life {
            // Dropped unread: the client is only being let finish before we close.
            *dropped_bytes += res as u64;
            if *dropped_bytes > LINGER_MAX_BYTES {
                self.close(CloseReason::Normal, cx, out);
            } else {
                self.arm_recv(out);
            }
            return;
        }
        let Some(data) = data else {
            self.close(CloseReason::ProtocolError, cx, out);
            return;
        };
        let data = match self.proxy.as_mut() {
            None => data,
            Some(stage) => match stage.feed(data, self.client.trusted) {
                ProxyFeed::NeedMore => {
                    self.arm_recv(out);
                    return;
                }
                ProxyFeed::Refuse(outcome) => {
                    out.push(Action::Count(Counter::Proxy(outcome), 1));
                    self.proxy = None;
                    self.close(CloseReason::ProtocolError, cx, out);
                    return;
                }
                ProxyFeed::Done {
                    outcome,
                    client,
                    rest_from,
                } => {
                    out.push(Action::Count(Counter::Proxy(outcome), 1));
                    self.client.proxied = client;
                    self.proxy = None;
                    out.push(Action::ClientKnown);
                    if !self.is_open() {
                        return;
                    }
                    if rest_from == data.len() {
                        self.arm_recv(out);
                        return;
                    }
                    &data[rest_from..]
                }
            },
        };
        let was_empty = self.rx.is_empty();
        if self.tls.is_some() {
            if !self.receive_tls(data, cx, out) {
                return;
            }
        } else {
            self.rx.extend_from_slice(data);
            self.bound_multishot(out);
        }
        // The first byte after an idle keep-alive pause starts the header clock; a new
        // connection's clock started at accept and is not restarted by a trickle.
        if was_empty && !self.rx.is_empty() && !self.responding() && self.deadline == Deadline::Idle
        {
            self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
        }
        if !self.responding() {
            out.push(Action::QueueUrgent);
        }
    }

    // ---- TLS -------------------------------------------------------------------------

    /// TLS bytes arrived: during the handshake they wait for the connection's handshake
    /// turn; after it, records are opened into `rx`. False when the connection stops here
    /// (closing, or waiting for its turn).
    fn receive_tls(&mut self, data: &[u8], cx: &Ctx, out: &mut Actions) -> bool {
        let tls = self.tls.as_mut().expect("TLS bytes without a session");
        out.push(Action::Count(Counter::TlsBytesIn, data.len() as u64));
        if tls.handshaking() && data.len() > cx.handshake_room_bytes {
            tls.refuse_handshake();
            out.push(Action::Count(
                Counter::Handshake(HandshakeOutcome::OverBudget),
                1,
            ));
            self.close(CloseReason::ProtocolError, cx, out);
            return false;
        }
        if !tls.receive(data) {
            if tls.handshaking() {
                out.push(Action::Count(
                    Counter::Handshake(HandshakeOutcome::TooLarge),
                    1,
                ));
            }
            self.close(CloseReason::ProtocolError, cx, out);
            return false;
        }
        if tls.handshaking() {
            out.push(Action::QueueHandshake);
            return false;
        }
        match tls.open_records(&mut self.rx) {
            Received::Data => true,
            Received::PeerClosed => {
                // close_notify says what a FIN says: nothing more will come.
                self.read = ReadState::Eof;
                if !self.responding() {
                    self.close(CloseReason::Normal, cx, out);
                    return false;
                }
                true
            }
            Received::PeerAlert => {
                self.close(CloseReason::Abort, cx, out);
                false
            }
            Received::Fatal => {
                self.close(CloseReason::ProtocolError, cx, out);
                false
            }
        }
    }

    /// This connection's turn in the shard's handshake queue: rustls processes what was
    /// received and its answer goes out; a completed handshake starts the request clock.
    pub fn handshake_turn(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() {
            return;
        }
        let Some(tls) = self.tls.as_mut().filter(|t| t.handshaking()) else {
            return;
        };
        match tls.handshake(&mut self.rx) {
            HandshakeStep::NeedInput => {
                self.send_tls_output(out);
                self.arm_recv(out);
            }
            HandshakeStep::Complete => {
                let facts = tls.facts.as_ref().expect("facts of a completed handshake");
                let outcome = HandshakeOutcome::Ok {
                    version: facts.version,
                    resumed: facts.resumed,
                };
                out.push(Action::Count(Counter::Handshake(outcome), 1));
                out.push(Action::HandshakeTime(
                    cx.now_us.saturating_sub(self.accepted_us),
                ));
                self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
                self.send_tls_output(out);
                self.arm_recv(out);
                if !self.rx.is_empty() && self.can_start_request() {
                    out.push(Action::QueueUrgent);
                }
            }
            HandshakeStep::PlainHttp => {
                out.push(Action::Count(
                    Counter::Handshake(HandshakeOutcome::PlainHttp),
                    1,
                ));
                self.close(CloseReason::ProtocolError, cx, out);
            }
            HandshakeStep::Failed(f) => {
                let outcome = match f {
                    HandshakeFailure::Protocol => HandshakeOutcome::Failed,
                    HandshakeFailure::Peer => HandshakeOutcome::PeerClosed,
                    HandshakeFailure::TooLarge => HandshakeOutcome::TooLarge,
                };
                out.push(Action::Count(Counter::Handshake(outcome), 1));
                self.close(CloseReason::ProtocolError, cx, out);
            }
        }
    }

    /// A request may be parsed and answered: no TLS handshake or TLS send stands in the
    /// way (the header buffer is free for the head).
    pub fn can_start_request(&self) -> bool {
        !self.awaiting_fill()
            && self.tls_send == TlsSend::Idle
            && self
                .tls
                .as_ref()
                .is_none_or(|t| t.is_open() && t.outgoing.is_empty())
    }

    /// Sends what the session queued for the client, unless a TLS send is in flight (its
    /// completion sends the rest).
    fn send_tls_output(&mut self, out: &mut Actions) {
        if self.tls_send != TlsSend::Idle {
            return;
        }
        let Some(tls) = self.tls.as_ref().filter(|t| !t.outgoing.is_empty()) else {
            return;
        };
        self.tls_send = TlsSend::Sending {
            from: 0,
            len: tls.outgoing.len() as u32,
        };
        out.push(Action::SendTls {
            from: 0,
            swap: true,
        });
    }

    /// A send of the session's bytes completed with `res`.
    pub fn on_tls_sent(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        let TlsSend::Sending { from, len } = self.tls_send else {
            panic!("TLS send completion without a TLS send");
        };
        self.tls_send = TlsSend::Idle;
        if res <= 0 {
            // The client is gone: nothing more of ours reaches it.
            if let Some(tls) = self.tls.as_mut() {
                tls.outgoing.clear();
            }
            if self.is_live() {
                self.close(CloseReason::Abort, cx, out);
            } else {
                self.maybe_finish_close(out);
            }
            return;
        }
        out.push(Action::Count(Counter::TlsBytesOut, res as u64));
        let from = from + res as u32;
        if from < len {
            self.tls_send = TlsSend::Sending { from, len };
            out.push(Action::SendTls { from, swap: false });
            return;
        }
        if !self.is_live() {
            self.maybe_finish_close(out);
            return;
        }
        if let Some(reason) = self.close_after_tls_send.take() {
            self.close(reason, cx, out);
            return;
        }
        let Some(tls) = self.tls.as_ref() else {
            return;
        };
        if !tls.outgoing.is_empty() {
            self.send_tls_output(out);
        } else if self.linger_shutdown_due {
            self.linger_shutdown_due = false;
            self.ops.shutdown = true;
            out.push(Action::ShutdownWrite);
        } else if tls.handshaking() {
            if !tls.incoming.is_empty() {
                out.push(Action::QueueHandshake);
            }
        } else if self.responding() {
            self.try_send(cx, out);
        } else {
            // The request waited for the header buffer (or has not fully arrived: a record
            // may still be cut short in `incoming`).
            if !self.rx.is_empty() {
                out.push(Action::QueueUrgent);
            } else {
                self.idle_tls_memory(out);
            }
            self.arm_recv(out);
        }
    }

    /// An idle TLS connection keeps no more than it needs to resume: its record state, and
    /// buffers cut back to nothing (the session's) and a head's size (the header buffer,
    /// which carried the handshake flight).
    fn idle_tls_memory(&mut self, out: &mut Actions) {
        if let Some(tls) = self.tls.as_mut().filter(|t| t.is_open()) {
            tls.shrink_idle();
            out.push(Action::ShrinkHeadBuffer);
        }
    }

    // ---- a request becomes a response --------------------------------------------------

    /// A request was parsed (or refused): its clock starts.
    pub fn request_parsed(&mut self, method: Option<Method>, cx: &Ctx) {
        self.request_start_us = cx.now_us;
        self.method = method;
        self.resp_bytes = 0;
    }

    /// The response to the current request was planned: a head of `head_len` bytes is in
    /// the header buffer, and `body` (if any) follows. A small body with `inline_head` set
    /// carries the head in its first chunk.
    pub fn begin_response(
        &mut self,
        status: u16,
        keep_alive: bool,
        head_len: usize,
        body: Option<Body>,
        rate: crate::limits::RateSpec,
        cx: &Ctx,
    ) {
        assert!(!self.responding(), "a response while one is in progress");
        assert!(self.egress.is_none_or(|e| e.reserved_bytes == 0));
        let inline = body.as_ref().is_some_and(|b| b.inline_head);
        // The limits in force when the response begins apply to all of it.
        self.rate_limit = body.as_ref().filter(|b| !b.inline_head).and_then(|_| {
            crate::limits::RateLimit::new(rate.rate_bytes_per_s, rate.after_bytes, cx.now_us)
        });
        self.egress = (body.is_some() && cx.limits.egress_limit_bytes_per_s > 0)
            .then(|| crate::limits::egress::EgressHold::new(cx.limits.egress_bypass_bytes));
        self.limiter = None;
        self.write = WriteState::Responding(Response {
            status,
            keep_alive,
            head: if inline {
                HeadState::Done
            } else {
                HeadState::Pending { from: 0 }
            },
            head_len,
            body,
        });
        self.set_deadline(Deadline::Send, cx.now_ms + cx.limits.send_timeout_ms);
    }

    /// The parser needs more bytes: arm a receive.
    pub fn need_more_request(&mut self, cx: &Ctx, out: &mut Actions) {
        if self.responding() {
            return;
        }
        if self.read == ReadState::Eof && self.is_open() {
            if self.awaiting_fill() {
                // Its request is whole and answered once the fill has its bytes.
                return;
            }
            // The client closed its side with only part of a request sent: none will come.
            self.close(CloseReason::Normal, cx, out);
            return;
        }
        self.arm_recv(out);
    }

    // ---- the chunk pipeline ------------------------------------------------------------

    /// Turns body segments into chunk reads, within the connection's budget for this visit,
    /// the shard's budget for this tick and the pipeline depth. `take` asks the arena for a
    /// slot (None: none free for that demand).
    pub fn pump(
        &mut self,
        budget: &mut TickBudget,
        shard_budget: &mut TickBudget,
        take: &mut dyn FnMut(Demand) -> Option<ArenaSlot>,
        egress: Option<&EgressBucket>,
        cx: &Ctx,
        out: &mut Actions,
    ) -> Turn {
        let depth = cx.limits.pipeline_depth;
        let chunk_bytes = self.payload_cap(cx);
        // The cap applies while it is configured (a reload that lifts it lets what is
        // reserved go and reserves nothing more).
        let egress = egress.filter(|_| cx.limits.egress_limit_bytes_per_s > 0);
        loop {
            let socket_full = self.ops.poll;
            let limit = self.rate_limit;
            let Some(body) = self.body_mut() else {
                return Turn::Idle;
            };
            // The next bytes of a pulled object still filling are not on disk yet: wait for
            // the fill (its notice moves `readable_end` on and queues us).
            let blocked_at = match body.segments.front() {
                Some(&Segment::File { pos, .. }) if pos >= body.readable_end => Some(pos),
                _ => None,
            };
            if let Some(file_offset) = blocked_at {
                if !body.awaiting_block {
                    body.awaiting_block = true;
                    out.push(Action::AwaitBlock { file_offset });
                }
            }
            // A full socket takes nothing now: read when it drains (the poll re-queues us).
            // A pass-through reads one chunk at a time (its bytes come in order from one fetch).
            let depth = if body.relay { 1 } else { depth };
            if socket_full
                || blocked_at.is_some()
                || body.segments.is_empty()
                || body.chunks.len() >= body.read_ahead.min(depth)
            {
                // No more read-ahead wanted now: a slot handed over while waiting goes back.
                self.leave_arena_queue(cx, out);
                self.give_back_handed(out);
                return Turn::Idle;
            }
            // A small response's single chunk is never held back; bulk work stops at the
            // connection's budget or when the shard's budget for this tick is spent.
            if !body.inline_head && (!budget.has_room() || !shard_budget.has_room()) {
                return Turn::MoreWork;
            }
            let rest = body.unplanned_bytes();
            let mut cap_bytes = u64::MAX;
            if let Some(limit) = limit {
                let allowance = limit.allowance(cx.now_us);
                let step = limit.step_bytes();
                if allowance < step.min(rest) {
                    let at_ms = limit.ready_at_ms(step.min(rest), cx.now_us);
                    if let Some(l) = self.rate_limit.as_mut() {
                        l.waits += 1;
                    }
                    out.push(Action::Count(Counter::LimitWait, 1));
                    return self.wait_for_limiter(at_ms, cx, out);
                }
                cap_bytes = allowance;
            }
            let want = cap_bytes.min(chunk_bytes as u64).min(rest).max(1);
            if let Some(bucket) = egress {
                if let Some(at_ms) = self.egress_turn(bucket, want, cx, out) {
                    return self.wait_for_limiter(at_ms, cx, out);
                }
                if let Some(hold) = self.egress {
                    cap_bytes = cap_bytes.min(hold.reserved_bytes.max(1));
                }
            }
            // A record that left in part is sealed again whole, whatever the limiters say (at
            // most a record past them; they count what is planned).
            if let Some(len) = self.tls.as_ref().and_then(|t| t.pending_resume_bytes()) {
                cap_bytes = cap_bytes.max(u64::from(len));
            }
            let body = self.body_mut().expect("checked above");
            body.limit_cap_bytes = usize::try_from(cap_bytes).unwrap_or(usize::MAX);
            let demand = if body.inline_head {
                Demand::Small
            } else if body.chunks.is_empty() {
                Demand::Bulk
            } else {
                Demand::ReadAhead
            };
            let handed = match self.arena {
                ArenaWait::Handed { slot } => Some(slot),
                _ => None,
            };
            let Some(slot) = handed.or_else(|| take(demand)) else {
                if demand == Demand::ReadAhead {
                    // Planned again when one of its chunks finishes.
                    return Turn::Idle;
                }
                if self.arena == ArenaWait::None {
                    self.arena = ArenaWait::Waiting {
                        since_us: cx.now_us,
                    };
                    out.push(Action::WaitArena(demand));
                }
                // Chunks parked behind full sockets are not moving: they go to the waiters.
                out.push(Action::Reclaim);
                return Turn::Idle;
            };
            if handed.is_some() {
                self.arena = ArenaWait::None;
            } else {
                self.leave_arena_queue(cx, out);
            }
            let head_len = self.response().map_or(0, |r| r.head_len);
            let body = self.body_mut().expect("checked above");
            let chunk = plan_chunk(body, slot, head_len, chunk_bytes, out);
            let planned = u64::from(chunk.send_len);
            budget.charge(chunk.send_len as usize);
            shard_budget.charge(chunk.send_len as usize);
            let reading = chunk.state == ChunkState::Reading;
            body.chunks.push_back(chunk);
            if reading {
                self.submit_read(slot, out);
            }
            if let Some(l) = self.rate_limit.as_mut() {
                let before = l.planned_bytes;
                l.planned_bytes += planned;
                let limited = l.planned_bytes.saturating_sub(before.max(l.after_bytes));
                if limited > 0 {
                    out.push(Action::Count(Counter::LimitedBytes, limited));
                }
            }
            if let (Some(bucket), Some(hold)) = (egress, self.egress.as_mut()) {
                if hold.delayed {
                    let delayed = planned.min(hold.reserved_bytes);
                    out.push(Action::Count(Counter::EgressDelayedBytes, delayed));
                }
                let rate = cx.limits.egress_limit_bytes_per_s;
                hold.spend(bucket, planned, rate, cx.egress_now_us);
            }
        }
    }

    /// A limiter lets the response go on at `at_ms` (shard clock): wait on the wheel, holding
    /// nothing planned ahead (no handed slot, no place in the arena's queue).
    fn wait_for_limiter(&mut self, at_ms: u64, cx: &Ctx, out: &mut Actions) -> Turn {
        out.push(Action::LimitWait { at_ms });
        self.leave_arena_queue(cx, out);
        self.give_back_handed(out);
        Turn::Idle
    }

    /// The egress cap's say on the next `want` bytes: reserves them when nothing is reserved,
    /// and returns when to wake (shard clock, ms) if they may not go yet.
    fn egress_turn(
        &mut self,
        bucket: &EgressBucket,
        want: u64,
        cx: &Ctx,
        out: &mut Actions,
    ) -> Option<u64> {
        let rate = cx.limits.egress_limit_bytes_per_s;
        let hold = self.egress.as_mut()?;
        if hold.reserved_bytes == 0 {
            let bypass_before = hold.bypass_left_bytes;
            if hold.reserve(bucket, want, rate, cx.now_us, cx.egress_now_us) {
                out.push(Action::Count(Counter::EgressWait, 1));
            } else if bypass_before > hold.bypass_left_bytes {
                let bypassed = bypass_before - hold.bypass_left_bytes;
                out.push(Action::Count(Counter::EgressBypassBytes, bypassed));
            }
        }
        (cx.now_us < hold.ready_at_us).then(|| hold.ready_at_us.div_ceil(1000))
    }

    /// Plaintext bytes one chunk carries: the whole slot, or on a TLS connection what still
    /// fits once every record's framing is added in place.
    fn payload_cap(&self, cx: &Ctx) -> usize {
        if self.tls.is_some() {
            cx.limits.tls_chunk_bytes
        } else {
            cx.limits.chunk_bytes
        }
    }

    /// Leaves the arena queue, if queued, and reports how long it waited.
    fn leave_arena_queue(&mut self, cx: &Ctx, out: &mut Actions) {
        if let ArenaWait::Waiting { since_us } = self.arena {
            self.arena = ArenaWait::None;
            out.push(Action::BufferWaited(cx.now_us.saturating_sub(since_us)));
            out.push(Action::LeaveArenaQueue);
        }
    }

    /// The arena handed this waiting connection a slot: a small response is queued urgently,
    /// bulk work at the back.
    pub fn slot_handed(&mut self, slot: ArenaSlot, cx: &Ctx, out: &mut Actions) {
        let ArenaWait::Waiting { since_us } = self.arena else {
            panic!(
                "a slot handed to a connection that was not waiting: {:?}",
                self.arena
            );
        };
        out.push(Action::BufferWaited(cx.now_us.saturating_sub(since_us)));
        self.arena = ArenaWait::Handed { slot };
        let small = self.body().is_some_and(|b| b.inline_head);
        out.push(if small {
            Action::QueueUrgent
        } else {
            Action::QueueBulk
        });
    }

    fn submit_read(&mut self, slot: ArenaSlot, out: &mut Actions) {
        let body = self.body().expect("reading without a body");
        let ch = &body.chunks[body.chunk_index(slot)];
        let got = ch.read_got;
        out.push(Action::Read {
            slot,
            buf_off: (ch.read_buf_off + got) as usize,
            len: (ch.read_len - got) as usize,
            file_fixed: body.file_fixed,
            file_off: ch.read_file_off + u64::from(got),
            rw_flags: body.rw_flags,
        });
    }

    /// The read into `slot` holds a cached block that failed its checksum (or that another
    /// read dropped as corrupt): the chunk keeps its place in the pipeline and its slot, and
    /// is read again whole (`reread`) once the block is fetched again. Nothing is in flight
    /// meanwhile; later chunks wait behind it, so bytes still leave in order.
    pub fn hold_for_refetch(&mut self, slot: ArenaSlot) {
        let body = self.body_mut().expect("a read completion without a body");
        let i = body.chunk_index(slot);
        let ch = &mut body.chunks[i];
        assert_eq!(ch.state, ChunkState::Reading, "held a chunk not reading");
        ch.state = ChunkState::Refetching;
        ch.read_got = 0;
    }

    /// The block a held chunk (`hold_for_refetch`) waited for is on disk again: its read is
    /// submitted again. False when no chunk of this response waits in `slot` (it ended).
    pub fn reread(&mut self, slot: ArenaSlot, out: &mut Actions) -> bool {
        if !self.is_open() {
            return false;
        }
        let Some(body) = self.body_mut() else {
            return false;
        };
        let Some(ch) = body
            .chunks
            .iter_mut()
            .find(|c| c.slot == slot && c.state == ChunkState::Refetching)
        else {
            return false;
        };
        ch.state = ChunkState::Reading;
        self.submit_read(slot, out);
        true
    }

    /// A file read into `slot` completed with `res`. `unchanged(file)` says whether the
    /// open file is still the version the response started with.
    pub fn on_read(
        &mut self,
        slot: ArenaSlot,
        res: i32,
        unchanged: &mut dyn FnMut(FileSlot) -> bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        let open = self.is_open();
        let body = self.body_mut().expect("read completion without a body");
        let i = body.chunk_index(slot);
        assert_eq!(
            body.chunks[i].state,
            ChunkState::Reading,
            "read completion for a chunk not reading"
        );
        if !open {
            body.chunks[i].state = ChunkState::Ready;
            self.maybe_finish_close(out);
            return;
        }
        if res < 0 {
            // Judged by the chunk, not the body: with several chunks in flight, every read
            // submitted with RWF_DONTCACHE comes back refused, not only the first.
            if -res == libc::EOPNOTSUPP && body.chunks[i].source == Source::DontCache {
                // RWF_DONTCACHE refused by this file system: read buffered from now on.
                body.rw_flags = 0;
                body.source = Source::Buffered;
                body.chunks[i].source = Source::Buffered;
                if let Some(file) = body.file {
                    out.push(Action::DemoteFile(file));
                }
                self.submit_read(slot, out);
                return;
            }
            tracing::warn!(errno = -res, "file read failed; aborting response");
            body.chunks[i].state = ChunkState::Ready;
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        let align = body.align;
        let file = body.file;
        let ch = &mut body.chunks[i];
        ch.read_got += res as u32;
        if ch.read_got < ch.read_need {
            let aligned = (ch.read_file_off + u64::from(ch.read_got)).is_multiple_of(align);
            if res == 0 || !aligned {
                // The file is shorter than promised: it was truncated under us. Never pad.
                tracing::info!("file shrank during a response; aborting");
                ch.state = ChunkState::Ready;
                self.close(CloseReason::Abort, cx, out);
                return;
            }
            self.submit_read(slot, out);
            return;
        }
        ch.state = ChunkState::Ready;
        let framed = match ch.origin {
            Origin::FramedFile { at, len } => Some((at, len, ch.send_off)),
            _ => None,
        };
        // The bytes are only good if the file did not change while they were read.
        if let Some(file) = file {
            if !unchanged(file) {
                tracing::info!("file changed during a response; aborting");
                self.close(CloseReason::Abort, cx, out);
                return;
            }
        }
        if let Some((at, len, to)) = framed {
            // The part header goes right in front of the data, over bytes of the aligned read
            // that precede the range (the read would have overwritten it before).
            out.push(Action::CopyFraming {
                slot,
                from: at as usize,
                len: len as usize,
                to: to as usize,
            });
        }
        if self.ops.poll {
            // Read ahead landed behind a full socket: the chunk is ours now, so a reclaim that
            // found it still being read (and freed nothing) can take it this time; past the
            // hold already (the read waited for a block fetched again) it goes back now.
            self.reclaim_past_hold(cx, out);
            out.push(Action::ListParked);
            out.push(Action::Reclaim);
            return;
        }
        self.send_soon(cx, out);
    }

    /// A chunk became sendable: a small response sends at once; bulk sends wait for the
    /// connection's turn in the ready queue, under the shard's per-tick budget.
    fn send_soon(&mut self, cx: &Ctx, out: &mut Actions) {
        if self.body().is_some_and(|b| b.small) {
            self.try_send(cx, out);
        } else {
            out.push(Action::QueueBulk);
        }
    }

    /// Sends what is next (the head, or the first chunk not yet sent) unless a send is in
    /// flight or the socket is full; finishes the response when nothing is left. On a TLS
    /// connection a chunk is sealed into records right before its first send (so only what
    /// is about to leave is encrypted), after our KeyUpdate if one is due.
    pub fn try_send(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() || self.send_in_flight() {
            return;
        }
        let poll = self.ops.poll;
        // A response a limiter holds back is paced by it, not by its socket: a whole send
        // only means the socket had room, and its bytes wait there for a client slower than
        // the link. Copy sends free the slot at once.
        let limiter_paced = self.rate_limit.is_some_and(|l| l.waits > 0)
            || self.egress.is_some_and(|e| e.waits > 0);
        let fast_drain = self.fast_drain && !limiter_paced;
        let warm = self.resp_bytes >= cx.limits.zerocopy_warmup_bytes;
        let ConnMachine { write, tls, .. } = self;
        let WriteState::Responding(resp) = write else {
            return;
        };
        if let HeadState::Pending { from } = resp.head {
            let more = resp.body.as_ref().is_some_and(|b| !b.is_done());
            resp.head = HeadState::Sending { from };
            out.push(Action::SendHead { from, more });
            return;
        }
        let Some(body) = resp.body.as_mut() else {
            self.finish_response(cx, out);
            return;
        };
        let Some(ch) = body
            .chunks
            .iter_mut()
            // A chunk fully handed to SEND_ZC only waits for its buffer; one the socket took
            // only part of still goes first (bytes leave in order).
            .find(|ch| ch.state != ChunkState::AwaitNotif || ch.sent < ch.send_len)
        else {
            if body.is_done() {
                self.finish_response(cx, out);
            }
            return;
        };
        if ch.state != ChunkState::Ready || poll {
            return;
        }
        if let (Some(session), None) = (tls.as_mut(), ch.tls) {
            if session.key_update_ready() {
                session.queue_key_update();
                self.send_tls_output(out);
                return;
            }
            let Some(plan) = session.plan_run(ch.send_len, cx.limits.tls_record_bytes) else {
                tracing::warn!("TLS record sequence cannot continue; aborting the response");
                self.close(CloseReason::Abort, cx, out);
                return;
            };
            assert_eq!(ch.sent, 0, "a chunk sealed after it began to leave");
            out.push(Action::Seal {
                slot: ch.slot,
                at: ch.send_off,
                cut: plan.cut,
                first_seq: plan.first_seq,
            });
            ch.tls = Some(SealedRun {
                cut: plan.cut,
                first_seq: plan.first_seq,
                pt_at: ch.send_off,
            });
            ch.send_off += plan.skip;
            ch.send_len = plan.cut.ct_len() - plan.skip;
        }
        ch.state = ChunkState::Sending;
        if ch.sent == 0 {
            ch.send_started_ms = cx.now_ms;
        }
        let (slot, off, len) = (ch.slot, ch.send_off + ch.sent, ch.send_len - ch.sent);
        let zc_busy = body.chunks.iter().any(|c| c.zerocopy);
        // More bytes follow this send (MSG_MORE): body not yet planned, or another chunk with
        // bytes still to leave. A chunk fully handed to SEND_ZC, waiting only for its
        // notification, has none: counting it corked the response's last segment.
        let more = !body.segments.is_empty()
            || body
                .chunks
                .iter()
                .any(|c| c.slot != slot && c.sent < c.send_len);
        // SEND_ZC keeps the buffer until the peer acknowledges it: only for a connection
        // that drains fast; a slow or stalled one gets copy sends and holds nothing.
        let zc = cx.limits.zerocopy
            && fast_drain
            && warm
            && len as usize >= cx.limits.zerocopy_min_bytes
            && cx.zc_room
            && !zc_busy;
        let i = body.chunk_index(slot);
        let ch = &mut body.chunks[i];
        ch.zerocopy = zc;
        if zc {
            out.push(Action::ZcTaken);
        }
        out.push(Action::Send {
            slot,
            off: off as usize,
            len: len as usize,
            more,
            zerocopy: zc,
        });
    }

    /// The head send completed with `res`.
    pub fn on_head_sent(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        let resp = self.response_mut().expect("head send without a response");
        let HeadState::Sending { from } = resp.head else {
            panic!("head send completion without a head send");
        };
        let head_len = resp.head_len;
        resp.head = HeadState::Pending { from };
        if !self.is_open() {
            self.maybe_finish_close(out);
            return;
        }
        if res <= 0 {
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        let from = from + res as usize;
        out.push(Action::Count(Counter::Bytes(Source::Memory), res as u64));
        if self.tls.is_some() {
            out.push(Action::Count(Counter::TlsBytesOut, res as u64));
        }
        self.sent_bytes(res as u64, cx, out);
        let resp = self.response_mut().expect("checked above");
        resp.head = if from < head_len {
            HeadState::Pending { from }
        } else {
            HeadState::Done
        };
        self.deadline_ms = cx.now_ms + cx.limits.send_timeout_ms;
        self.try_send(cx, out);
    }

    /// A chunk send completed: its result (`more`: SEND_ZC's notification is still to come),
    /// or the notification itself.
    pub fn on_send(
        &mut self,
        slot: ArenaSlot,
        res: i32,
        more: bool,
        notification: bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        let kernel_done = notification || !more;
        let open = self.is_open();
        let ch = self.chunk_mut(slot);
        if kernel_done && ch.zerocopy {
            ch.zerocopy = false;
            out.push(Action::ZcReleased);
        }
        if !open {
            ch.state = if kernel_done {
                ChunkState::Ready
            } else {
                ChunkState::AwaitNotif
            };
            if kernel_done {
                self.maybe_finish_close(out);
            }
            return;
        }
        if notification {
            assert_eq!(ch.state, ChunkState::AwaitNotif);
            if ch.sent < ch.send_len {
                // The socket was full when SEND_ZC returned short: wait until it drains.
                ch.state = ChunkState::Parked;
                self.park(cx, out);
            } else {
                self.remove_chunk(slot, out);
                self.send_soon(cx, out);
            }
            return;
        }
        assert_eq!(ch.state, ChunkState::Sending);
        let took = match res {
            n if n > 0 => n as u32,
            n if -n == libc::EAGAIN => 0,
            _ => {
                if more {
                    ch.state = ChunkState::AwaitNotif;
                    ch.sent = ch.send_len; // nothing more will be sent; wait for the buffer
                } else {
                    ch.state = ChunkState::Ready;
                }
                self.close(CloseReason::Abort, cx, out);
                return;
            }
        };
        ch.sent += took;
        let whole = ch.sent == ch.send_len;
        let source = ch.source;
        let state = if more {
            ChunkState::AwaitNotif
        } else if whole {
            ChunkState::Ready // removed below
        } else {
            ChunkState::Parked
        };
        ch.state = state;
        let tls = ch.tls.is_some();
        if took > 0 {
            out.push(Action::Count(Counter::Bytes(source), u64::from(took)));
            if tls {
                out.push(Action::Count(Counter::TlsBytesOut, u64::from(took)));
            }
            self.sent_bytes(u64::from(took), cx, out);
            self.deadline_ms = cx.now_ms + cx.limits.send_timeout_ms;
        }
        self.note_socket_round(took, whole, cx, out);
        if state == ChunkState::Parked {
            self.park(cx, out);
            return;
        }
        if state == ChunkState::Ready {
            self.remove_chunk(slot, out);
        }
        self.send_soon(cx, out);
    }

    /// A chunk is done: its slot goes back, and the connection may plan more.
    fn remove_chunk(&mut self, slot: ArenaSlot, out: &mut Actions) {
        let body = self.body_mut().expect("a chunk without a body");
        let i = body.chunk_index(slot);
        body.chunks.remove(i);
        let more = !body.segments.is_empty();
        out.push(Action::ReleaseSlot(slot));
        if more {
            out.push(Action::QueueBulk);
        }
    }

    /// Counts `n` (> 0) bytes that left for the current response; the first ones mark its
    /// first byte.
    fn sent_bytes(&mut self, n: u64, cx: &Ctx, out: &mut Actions) {
        debug_assert!(n > 0, "only bytes that left are counted");
        if self.resp_bytes == 0 {
            out.push(Action::Ttfb(
                cx.now_us.saturating_sub(self.request_start_us),
            ));
        }
        self.resp_bytes += n;
    }

    /// Learns from one send how much the socket takes: a whole send lets the connection read
    /// ahead its full pipeline with full-size reads; a short one (the socket filled up) records
    /// what this writable round took (the read size after a reclaim) and gives back read-ahead
    /// beyond `READ_AHEAD_START_CHUNKS`, so a slow client is never handed more than it can
    /// take.
    fn note_socket_round(&mut self, took: u32, whole: bool, cx: &Ctx, out: &mut Actions) {
        let chunk_bytes = self.payload_cap(cx);
        self.round_bytes += u64::from(took);
        self.fast_drain = whole;
        if whole {
            // Until its socket has once filled up, a connection doubles its reads (a fresh
            // download reaches full-size reads within a few sends). After that it knows what a
            // round takes and grows by one step per whole send: doubling past the estimate
            // made every other read overshoot the socket by the estimate, and under arena
            // pressure that overshoot was given back and read again.
            let learnt = self.round_estimate_bytes > 0;
            if let Some(body) = self.body_mut() {
                body.read_ahead = cx.limits.pipeline_depth;
                let grown = if learnt {
                    body.read_size_bytes.saturating_add(MIN_READ_BYTES)
                } else {
                    body.read_size_bytes.saturating_mul(2)
                };
                body.read_size_bytes = grown.min(chunk_bytes);
            }
            return;
        }
        // What one writable round took: the size of reads once parked chunks are reclaimed
        // (a re-read of what a slow socket could not take wastes disk time).
        self.round_estimate_bytes =
            (self.round_bytes as usize).clamp(MIN_READ_BYTES.min(chunk_bytes), chunk_bytes);
        self.cut_read_ahead(out);
    }

    /// Back to `READ_AHEAD_START_CHUNKS` of read-ahead: the chunks beyond it that the kernel
    /// does not hold go back to the arena.
    fn cut_read_ahead(&mut self, out: &mut Actions) {
        let Some(body) = self.body_mut() else {
            return;
        };
        if body.read_ahead > READ_AHEAD_START_CHUNKS {
            body.read_ahead = READ_AHEAD_START_CHUNKS;
            self.give_back_chunks(READ_AHEAD_START_CHUNKS, GiveBack::ReadAhead, out);
        }
    }

    /// The socket is full: wait for it to drain (one poll per connection; no buffer is lent
    /// to the kernel meanwhile) and list it so its chunks can be reclaimed.
    fn park(&mut self, cx: &Ctx, out: &mut Actions) {
        self.fast_drain = false;
        if !self.ops.poll {
            self.ops.poll = true;
            // The hold runs from the last park after which the socket took bytes: a wake-up
            // that sent nothing (a spurious poll completion, a socket full again at once)
            // must not restart it, or a stalled client keeps its chunks for ever.
            if self.round_bytes > 0 || self.parked_ms == 0 {
                self.parked_ms = cx.now_ms;
            }
            out.push(Action::PollWritable);
        }
        out.push(Action::Count(Counter::ParkedSend, 1));
        // Parked again with nothing taken since the hold began: the chunks go back now (the
        // sweep may never find it parked when every wake-up sends nothing and parks again).
        self.reclaim_past_hold(cx, out);
        out.push(Action::ListParked);
        out.push(Action::Reclaim);
    }

    /// Gives back every chunk it can when the connection has been parked longer than
    /// `PARK_HOLD_MS` (see `reclaim`).
    fn reclaim_past_hold(&mut self, cx: &Ctx, out: &mut Actions) {
        if cx.now_ms >= self.parked_ms + super::PARK_HOLD_MS {
            self.reclaim(out);
        }
    }

    /// The socket drained below its low-water mark: parked chunks may send again, and a
    /// connection whose chunks were reclaimed plans fresh reads.
    pub fn on_writable(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        assert!(self.ops.poll, "poll completion without a poll");
        self.ops.poll = false;
        if !self.is_open() {
            self.maybe_finish_close(out);
            return;
        }
        if res < 0 && -res != libc::ECANCELED {
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        self.round_bytes = 0;
        if let Some(body) = self.body_mut() {
            for ch in body.chunks.iter_mut() {
                if ch.state == ChunkState::Parked {
                    ch.state = ChunkState::Ready;
                }
            }
        }
        out.push(Action::QueueBulk);
    }

    /// Takes every chunk a parked connection holds (someone waits for the arena, or it has
    /// been parked longer than `PARK_HOLD_MS`); its later reads are sized to what its socket
    /// takes per writable round, so the next reclaim wastes little.
    pub fn reclaim(&mut self, out: &mut Actions) {
        let freed = self.give_back_chunks(0, GiveBack::Reclaim, out);
        out.push(Action::Count(Counter::ReclaimedChunks, freed as u64));
        let estimate = self.round_estimate_bytes;
        if let Some(body) = self.body_mut() {
            body.read_size_bytes = estimate;
        }
    }

    /// Its rate limit allows more bytes now: plan them.
    pub fn on_limit_wake(&mut self, out: &mut Actions) {
        if self.is_open() && self.body().is_some() {
            out.push(Action::QueueBulk);
        }
    }

    /// The timer sweep for a connection holding a SEND_ZC chunk: a buffer the peer is slow
    /// to acknowledge gives no completion to learn from, so the read-ahead behind it is given
    /// back here.
    pub fn check_zerocopy_stuck(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() {
            return;
        }
        let now = cx.now_ms;
        let stuck = self.body().is_some_and(|b| {
            b.read_ahead > READ_AHEAD_START_CHUNKS
                && b.chunks.iter().any(|ch| {
                    ch.state == ChunkState::AwaitNotif
                        && now.saturating_sub(ch.send_started_ms) > READ_AHEAD_FAST_SEND_MS
                })
        });
        if stuck {
            self.cut_read_ahead(out);
        }
    }

    /// Gives back chunks beyond `keep` that the kernel does not hold (read-ahead not yet sent,
    /// or the unsent rest of a parked chunk), newest first, and rewinds the body so those bytes
    /// are planned again when the client catches up: the disk, not the arena, buffers a slow
    /// client. A chunk whose response header has not fully left is kept.
    fn give_back_chunks(&mut self, keep: usize, why: GiveBack, out: &mut Actions) -> usize {
        let ConnMachine {
            write,
            tls,
            rate_limit,
            egress,
            ..
        } = self;
        let WriteState::Responding(Response {
            body: Some(body), ..
        }) = write
        else {
            return 0;
        };
        if body.relay {
            // Relayed bytes cannot be read again: they leave, or the connection ends.
            return 0;
        }
        let mut freed = 0;
        while body.chunks.len() > keep {
            let Some(last) = body.chunks.back() else {
                break;
            };
            // A chunk waiting for its block to be fetched again keeps its slot: it is read
            // again in place when the block is back.
            let ours = !last.state.kernel_holds() && last.state != ChunkState::Refetching;
            // Plaintext offsets in the slot: where the chunk's bytes began, the first one not
            // yet delivered, the end. A sealed chunk goes back to the start of its first
            // record that did not leave whole; one that left in part is sealed again
            // identically later (same length and sequence number, its sent bytes skipped).
            let (pt_off, unsent_at, send_end, record) = last.plaintext_progress();
            let rewind = last.tls.zip(record).map(|(run, (k, within))| {
                let resume = (within > 0).then(|| Resume {
                    len: run.cut.pt_len_of(k),
                    skip: within,
                });
                (run.first_seq + u64::from(k), resume)
            });
            let head_unsent = last.origin == Origin::File && unsent_at < last.read_buf_off;
            if !ours || head_unsent {
                break;
            }
            if let Some((seq, resume)) = rewind {
                tls.as_mut()
                    .expect("a sealed chunk on a connection without TLS")
                    .rewind(seq, resume);
            }
            let rest = send_end - unsent_at;
            if egress.is_some() && rest > 0 {
                out.push(Action::EgressRefund(u64::from(rest)));
            }
            // Each chunk comes from one segment, and segments follow in stream order, so the
            // unsent bytes go in front of whatever is still to plan.
            match last.origin {
                Origin::Framing { at } => {
                    let start = at + (unsent_at - pt_off);
                    body.segments.push_front(Segment::Mem {
                        start,
                        end: start + rest,
                    });
                }
                Origin::Zero => match body.segments.front_mut() {
                    Some(Segment::Zero { remaining }) => *remaining += u64::from(rest),
                    _ => body.segments.push_front(Segment::Zero {
                        remaining: u64::from(rest),
                    }),
                },
                Origin::File | Origin::FramedFile { .. } => {
                    let (framing_at, framing_len) = match last.origin {
                        Origin::FramedFile { at, len } => (at, len),
                        _ => (0, 0),
                    };
                    let data_at = unsent_at.max(pt_off + framing_len);
                    let start = last.read_file_off + u64::from(data_at - last.read_buf_off);
                    let end = last.read_file_off + u64::from(send_end - last.read_buf_off);
                    if end > start {
                        let why = match why {
                            GiveBack::Reclaim if last.sent == 0 => GiveBack::ReclaimUnsent,
                            why => why,
                        };
                        out.push(Action::Count(Counter::GivenBack(why), end - start));
                    }
                    // Given back unsent: the limit lets those bytes be planned again.
                    if let Some(l) = rate_limit.as_mut() {
                        l.planned_bytes = l.planned_bytes.saturating_sub(end - start);
                    }
                    match body.segments.front_mut() {
                        // The rest of the same file range: extend it back.
                        Some(Segment::File { pos, .. }) if *pos == end => *pos = start,
                        // That range was planned to its end (a part header or nothing follows).
                        _ => body.segments.push_front(Segment::File { pos: start, end }),
                    }
                    let header_sent = unsent_at - pt_off;
                    if header_sent < framing_len {
                        // The part header did not fully leave: its rest goes first.
                        body.segments.push_front(Segment::Mem {
                            start: framing_at + header_sent,
                            end: framing_at + framing_len,
                        });
                    }
                }
            }
            out.push(Action::ReleaseSlot(last.slot));
            body.chunks.pop_back();
            freed += 1;
        }
        freed
    }

    /// The response is complete: release what it held, then keep the connection (and parse
    /// a pipelined request or wait for one), linger, or close.
    fn finish_response(&mut self, cx: &Ctx, out: &mut Actions) {
        self.give_back_handed(out);
        let rate_waited = self.rate_limit.is_some_and(|l| l.waits > 0);
        let egress_waited = self.egress.is_some_and(|e| e.waits > 0);
        self.limiter = match (rate_waited, egress_waited) {
            (true, true) => Some("rate+egress"),
            (true, false) => Some("rate"),
            (false, true) => Some("egress"),
            (false, false) => None,
        };
        let WriteState::Responding(resp) = std::mem::replace(&mut self.write, WriteState::Idle)
        else {
            panic!("finishing a response that was not started");
        };
        assert!(resp.body.as_ref().is_none_or(|b| b.chunks.is_empty()));
        let tls_done = self.tls.as_ref().is_some_and(|t| t.wants_close());
        let (status, keep_alive) = (resp.status, resp.keep_alive && !tls_done);
        self.end_response(resp, out);
        let eof = self.read == ReadState::Eof;
        if !keep_alive && !eof && status >= 400 {
            self.begin_linger(cx, out);
            return;
        }
        // After a FIN, requests already received (pipelined) are still answered.
        if !keep_alive || (eof && self.rx.is_empty()) || cx.draining {
            self.close(CloseReason::Normal, cx, out);
            return;
        }
        if self.rx.is_empty() {
            self.set_deadline(Deadline::Idle, cx.now_ms + cx.limits.keepalive_timeout_ms);
            self.idle_tls_memory(out);
            self.arm_recv(out);
        } else {
            // A pipelined request is already here.
            self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
            out.push(Action::QueueUrgent);
        }
    }

    /// After an error response on a connection the client may still be writing to (a 414 or
    /// 431 with the rest of the head unread): shut our write side so the client sees the
    /// response and a FIN, then read and drop what it sends (bounded in bytes and time) until
    /// it closes (nginx's lingering close).
    fn begin_linger(&mut self, cx: &Ctx, out: &mut Actions) {
        self.life = Lifecycle::Lingering { dropped_bytes: 0 };
        self.rx.clear();
        self.head_scan.reset();
        self.set_deadline(Deadline::Linger, cx.now_ms + LINGER_TIMEOUT_MS);
        match self.tls.as_mut().filter(|t| t.is_open()) {
            // close_notify first; the write side is shut once it has left.
            Some(tls) => {
                tls.queue_close_notify();
                self.linger_shutdown_due = true;
                self.send_tls_output(out);
            }
            None => {
                self.ops.shutdown = true;
                out.push(Action::ShutdownWrite);
            }
        }
        self.arm_recv(out);
    }
}

/// Plans the next chunk of `body` into `slot`: the head and a small file's bytes in one, a
/// framing or zero run, or an aligned file read sized to what the socket takes.
fn plan_chunk(
    body: &mut Body,
    slot: ArenaSlot,
    head_len: usize,
    chunk_bytes: usize,
    out: &mut Actions,
) -> Chunk {
    let mut chunk = Chunk {
        slot,
        state: ChunkState::Ready,
        send_off: 0,
        send_len: 0,
        sent: 0,
        read_buf_off: 0,
        read_file_off: 0,
        read_len: 0,
        read_need: 0,
        read_got: 0,
        send_started_ms: 0,
        source: body.source,
        zerocopy: false,
        origin: Origin::File,
        tls: None,
    };
    if plan_framed_part(body, chunk_bytes, &mut chunk) {
        return chunk;
    }
    let limit_cap = limit_read_cap(body);
    let seg = body
        .segments
        .front_mut()
        .expect("planning with nothing to plan");
    match seg {
        Segment::Mem { start, end } => {
            let n = ((*end - *start) as usize).min(chunk_bytes).min(limit_cap);
            out.push(Action::CopyFraming {
                slot,
                from: *start as usize,
                len: n,
                to: 0,
            });
            chunk.send_len = n as u32;
            chunk.source = Source::Memory;
            chunk.origin = Origin::Framing { at: *start };
            *start += n as u32;
            if *start == *end {
                body.segments.pop_front();
            }
        }
        Segment::Zero { remaining } => {
            let n = (*remaining).min(chunk_bytes as u64).min(limit_cap as u64) as usize;
            out.push(Action::ZeroFill { slot, len: n });
            chunk.send_len = n as u32;
            chunk.source = Source::Memory;
            chunk.origin = Origin::Zero;
            *remaining -= n as u64;
            if *remaining == 0 {
                body.segments.pop_front();
            }
        }
        Segment::File { pos, end } => {
            if body.inline_head {
                // Small file: header and body leave in one send from one slot.
                out.push(Action::CopyHeadToSlot { slot });
                let len = (*end - *pos) as usize;
                assert!(head_len + len <= chunk_bytes);
                chunk.state = ChunkState::Reading;
                chunk.send_len = (head_len + len) as u32;
                chunk.read_buf_off = head_len as u32;
                chunk.read_file_off = *pos;
                chunk.read_len = len as u32;
                chunk.read_need = len as u32;
                body.inline_head = false;
                *pos = *end;
            } else {
                let read_cap =
                    read_cap_bytes(body.read_size_bytes, body.align, chunk_bytes).min(limit_cap);
                // Never past the committed bytes of a pulled object (a block boundary or its
                // end, both on the read alignment, so the aligned read stays inside them).
                let readable = (*end).min(body.readable_end);
                assert!(*pos < readable, "a chunk planned past the readable bytes");
                let plan = crate::fs::dio::plan_chunk(*pos, readable, body.align, read_cap);
                chunk.state = ChunkState::Reading;
                chunk.send_off = plan.skip as u32;
                chunk.send_len = plan.send_len as u32;
                chunk.read_file_off = plan.read_offset;
                chunk.read_len = plan.read_len as u32;
                chunk.read_need = (plan.skip + plan.send_len) as u32;
                *pos += plan.send_len as u64;
            }
            if *pos >= *end {
                body.segments.pop_front();
            }
        }
    }
    chunk
}

/// A part header followed by its file range, planned into one chunk: the read lands at the
/// first aligned offset past the header's length, and the header is copied in front of the
/// data when the read is done (`on_read`). False (nothing planned) when the front is not
/// such a pair.
fn plan_framed_part(body: &mut Body, chunk_bytes: usize, chunk: &mut Chunk) -> bool {
    let (Some(&Segment::Mem { start, end }), Some(&Segment::File { pos, end: file_end })) =
        (body.segments.front(), body.segments.get(1))
    else {
        return false;
    };
    let header = (end - start) as usize;
    let align = (body.align as usize).max(1);
    let read_at = header.div_ceil(align) * align;
    let room = chunk_bytes.saturating_sub(read_at) / align * align;
    if body.inline_head || header > SHARED_FRAMING_MAX_BYTES || room <= align {
        return false;
    }
    let read_cap = read_cap_bytes(body.read_size_bytes, body.align, chunk_bytes)
        .min(room)
        .min(limit_read_cap(body));
    let plan = crate::fs::dio::plan_chunk(pos, file_end, body.align, read_cap);
    chunk.state = ChunkState::Reading;
    chunk.origin = Origin::FramedFile {
        at: start,
        len: header as u32,
    };
    chunk.read_buf_off = read_at as u32;
    chunk.send_off = (read_at + plan.skip - header) as u32;
    chunk.send_len = (header + plan.send_len) as u32;
    chunk.read_file_off = plan.read_offset;
    chunk.read_len = plan.read_len as u32;
    chunk.read_need = (plan.skip + plan.send_len) as u32;
    // The header is planned; the file range goes on from where this read ends.
    body.segments.pop_front();
    let pos = pos + plan.send_len as u64;
    if pos >= file_end {
        body.segments.pop_front();
    } else {
        body.segments[0] = Segment::File { pos, end: file_end };
    }
    true
}

/// The most a rate-limited body may read for its next chunk: its allowance, aligned down for
/// O_DIRECT (the planned bytes may pass a small allowance by part of a block; the limiters
/// count what was planned).
fn limit_read_cap(body: &Body) -> usize {
    if body.limit_cap_bytes == usize::MAX {
        return usize::MAX;
    }
    let align = (body.align as usize).max(1);
    // One block at least (a read from inside it sends the rest of it): the planned bytes
    // pass the allowance by less than a block.
    (body.limit_cap_bytes / align * align).max(align)
}

/// Bytes a file read may ask for: the connection's estimate of what its socket takes,
/// rounded up to the read alignment, between `MIN_READ_BYTES` and the whole aligned blocks a
/// chunk holds, and two blocks when they fit (a read that starts inside a block may need the
/// next one too). A pulled object's alignment is its cache block, up to half a chunk: over
/// TLS a chunk carries a little less plaintext than that, so only one block fits there.
pub fn read_cap_bytes(estimate: usize, align: u64, chunk_bytes: usize) -> usize {
    let align = (align as usize).max(1);
    assert!(
        chunk_bytes >= align,
        "a chunk smaller than its read alignment"
    );
    let most = chunk_bytes / align * align;
    let want = estimate.clamp(MIN_READ_BYTES.min(chunk_bytes), chunk_bytes);
    let cap = want.div_ceil(align) * align;
    cap.max(2 * align).min(most)
}

#[cfg(test)]
mod tests {
    //! The machine driven by hand, with no ring: each test feeds events and checks the
    //! actions and the state they leave.
    use crate::limits::RateSpec;
    use std::collections::VecDeque;

    use super::*;

    fn a(raw: u16) -> ArenaSlot {
        ArenaSlot::new(raw)
    }

    #[test]
    fn read_caps_fit_a_tls_chunk_smaller_than_the_minimum_read() {
        // A 64 KiB chunk carries 60 KiB of plaintext over TLS: below MIN_READ_BYTES.
        let cap = crate::tls::record::chunk_plaintext_capacity(64 * 1024, 16 * 1024);
        assert!(cap < MIN_READ_BYTES);
        assert_eq!(read_cap_bytes(0, 4096, cap), cap);
        assert_eq!(read_cap_bytes(usize::MAX, 512, cap), cap);
        assert_eq!(read_cap_bytes(10_000, 1, cap), cap);
    }

    #[test]
    fn read_caps_are_whole_blocks_of_a_pulled_object() {
        // Block = half a chunk (the largest allowed): two blocks in cleartext, whatever the
        // estimate; over TLS the chunk holds a little less, so one.
        let (block, chunk) = (256 * 1024, 512 * 1024);
        assert_eq!(read_cap_bytes(4096, block as u64, chunk), chunk);
        assert_eq!(read_cap_bytes(usize::MAX, block as u64, chunk), chunk);
        let tls = crate::tls::record::chunk_plaintext_capacity(chunk, 16 * 1024);
        assert_eq!(read_cap_bytes(4096, block as u64, tls), block);
        assert_eq!(read_cap_bytes(usize::MAX, block as u64, tls), block);
        // Each plans: a read inside the block sends up to its end.
        let plan = crate::fs::dio::plan_chunk(1000, 10 << 20, block as u64, block);
        assert_eq!((plan.read_offset, plan.read_len), (0, block));
        assert_eq!(plan.send_len, block - 1000);
    }

    const CHUNK: usize = 64 * 1024;

    fn cx(now_ms: u64) -> Ctx {
        Ctx {
            now_ms,
            now_us: now_ms * 1000,
            draining: false,
            zc_room: true,
            handshake_room_bytes: usize::MAX,
            limits: Limits {
                header_timeout_ms: 10_000,
                keepalive_timeout_ms: 75_000,
                send_timeout_ms: 60_000,
                chunk_bytes: CHUNK,
                pipeline_depth: 4,
                zerocopy: false,
                zerocopy_min_bytes: 16 * 1024,
                zerocopy_warmup_bytes: crate::shard::ZC_WARMUP_BYTES,
                tls_record_bytes: 16 * 1024,
                tls_chunk_bytes: crate::tls::record::chunk_plaintext_capacity(CHUNK, 16 * 1024),
                tls_handshake_timeout_ms: 10_000,
                proxy_protocol: false,
                tls_proxy_protocol: false,
                egress_limit_bytes_per_s: 0,
                egress_bypass_bytes: 0,
            },
            egress_now_us: now_ms * 1000,
        }
    }

    #[test]
    fn a_limited_response_plans_only_its_allowance_and_waits_holding_nothing() {
        // 40 kB/s: a step is 4096 bytes (the minimum), after 8192 bytes at full speed.
        let lcx = cx(0);
        let rate = crate::limits::RateSpec {
            rate_bytes_per_s: 40_000,
            after_bytes: 8192,
        };
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(3), None, &lcx, &mut out);
        m.on_peer(None, false, &mut out);
        m.on_recv(18, Some(b"GET / HTTP/1.1\r\n\r\n"), false, &lcx, &mut out);
        m.rx.clear();
        m.request_parsed(Some(Method::Get), &lcx);
        m.begin_response(
            200,
            true,
            100,
            Some(file_body(10 * CHUNK as u64)),
            rate,
            &lcx,
        );
        m.response_mut().unwrap().head = HeadState::Done;
        out.clear();
        let mut free: Vec<u16> = (10..20).collect();
        let mut budget = TickBudget::new(1 << 20);
        let mut shard = TickBudget::new(8 << 20);
        let mut take = |_| free.pop().map(ArenaSlot::new);
        // At once: `after` plus one step, in one read.
        m.pump(&mut budget, &mut shard, &mut take, None, &lcx, &mut out);
        let body = m.body().unwrap();
        let planned: u32 = body.chunks.iter().map(|c| c.send_len).sum();
        assert_eq!(planned, 8192 + 4096);
        let wait = out.iter().find_map(|a| match a {
            Action::LimitWait { at_ms } => Some(*at_ms),
            _ => None,
        });
        // 4096 more bytes are earned in 102.4 ms.
        assert_eq!(wait, Some(103), "{out:?}");
        assert!(
            !out.iter().any(|a| matches!(a, Action::WaitArena(_))),
            "no arena wait"
        );
        // The chunk is read and sent whole: nothing is held while the limit waits.
        let slot = m.body().unwrap().chunks[0].slot;
        m.on_read(slot, planned as i32, &mut |_| true, &lcx, &mut out);
        m.try_send(&lcx, &mut out);
        m.on_send(slot, planned as i32, false, false, &lcx, &mut out);
        assert!(m.body().unwrap().chunks.is_empty(), "no slot while waiting");
        out.clear();
        m.pump(&mut budget, &mut shard, &mut take, None, &lcx, &mut out);
        assert!(
            m.body().unwrap().chunks.is_empty(),
            "still not allowed at t=0"
        );
        assert!(out.iter().any(|a| matches!(a, Action::LimitWait { .. })));
        // Once woken, one step more.
        let mut later = cx(103);
        later.limits = lcx.limits;
        out.clear();
        m.on_limit_wake(&mut out);
        assert_eq!(out, [Action::QueueBulk]);
        m.pump(&mut budget, &mut shard, &mut take, None, &later, &mut out);
        let planned: u32 = m.body().unwrap().chunks.iter().map(|c| c.send_len).sum();
        assert_eq!(
            planned,
            4096 + 24,
            "the step plus what the 0.6 ms past it earned"
        );
    }

    #[test]
    fn a_proxy_header_names_the_client_and_only_from_a_trusted_peer() {
        let mut pcx = cx(0);
        pcx.limits.proxy_protocol = true;
        let lb: std::net::SocketAddr = "10.0.0.5:40000".parse().unwrap();
        let real: std::net::SocketAddr = "203.0.113.9:5555".parse().unwrap();
        let mut header = Vec::new();
        crate::client::proxy_protocol::encode_v2(real, "10.0.0.1:80".parse().unwrap(), &mut header);
        // Trusted peer: header in two pieces, then the request in the same receive.
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(3), None, &pcx, &mut out);
        m.on_peer(Some(lb), true, &mut out);
        out.clear();
        m.on_recv(5, Some(&header[..5]), false, &pcx, &mut out);
        assert_eq!(out, [Action::Recv], "more of the header is needed");
        assert!(
            m.rx.is_empty(),
            "header bytes never reach the request parser"
        );
        out.clear();
        let mut rest = header[5..].to_vec();
        rest.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        m.on_recv(rest.len() as i32, Some(&rest), false, &pcx, &mut out);
        assert!(out.contains(&Action::Count(Counter::Proxy(ProxyOutcome::Accepted), 1)));
        assert!(
            out.contains(&Action::ClientKnown),
            "counted once the header named the client"
        );
        assert_eq!(m.rx, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(m.client.addr(), Some(real));
        assert_eq!(m.client.peer, Some(lb));
        // Untrusted peer: closed and counted, whatever it sends.
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(4), None, &pcx, &mut out);
        m.on_peer(Some("192.0.2.77:1".parse().unwrap()), false, &mut out);
        out.clear();
        m.on_recv(header.len() as i32, Some(&header), false, &pcx, &mut out);
        assert!(out.contains(&Action::Count(Counter::Proxy(ProxyOutcome::Untrusted), 1)));
        assert!(!m.is_open());
        assert_eq!(m.client.proxied, None);
        // A truncated header, then the peer closes: counted as truncated.
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(5), None, &pcx, &mut out);
        m.on_peer(Some(lb), true, &mut out);
        m.on_recv(7, Some(&header[..7]), false, &pcx, &mut out);
        out.clear();
        m.on_recv(0, None, false, &pcx, &mut out);
        assert!(out.contains(&Action::Count(Counter::Proxy(ProxyOutcome::Truncated), 1)));
        assert!(!m.is_open());
    }

    fn file_body(len: u64) -> Body {
        Body {
            file: Some(FileSlot::new(7)),
            file_fixed: 100,
            align: 1,
            rw_flags: 0,
            source: Source::Buffered,
            segments: VecDeque::from([Segment::File { pos: 0, end: len }]),
            framing: Vec::new(),
            chunks: VecDeque::new(),
            inline_head: false,
            small: false,
            read_ahead: READ_AHEAD_START_CHUNKS,
            read_size_bytes: CHUNK,
            limit_cap_bytes: usize::MAX,
            readable_end: u64::MAX,
            awaiting_block: false,
            relay: false,
        }
    }

    /// An open connection with a request parsed and a `len`-byte file response begun.
    fn responding(len: u64) -> ConnMachine {
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(3), None, &cx(0), &mut out);
        m.on_peer(Some("192.0.2.1:4000".parse().unwrap()), false, &mut out);
        m.on_recv(18, Some(b"GET / HTTP/1.1\r\n\r\n"), false, &cx(0), &mut out);
        m.rx.clear();
        m.request_parsed(Some(Method::Get), &cx(0));
        m.begin_response(
            200,
            true,
            100,
            Some(file_body(len)),
            RateSpec::default(),
            &cx(0),
        );
        m
    }

    /// Pumps with an arena of `free` slots numbered from 10.
    fn pump(m: &mut ConnMachine, free: &mut Vec<u16>, out: &mut Actions) -> Turn {
        let mut budget = TickBudget::new(1 << 20);
        let mut shard = TickBudget::new(8 << 20);
        m.pump(
            &mut budget,
            &mut shard,
            &mut |_| free.pop().map(ArenaSlot::new),
            None,
            &cx(1),
            out,
        )
    }

    #[test]
    fn a_new_connection_arms_a_receive_and_the_header_clock() {
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(5), None, &cx(1000), &mut out);
        // The peer's address is asked for before the receive goes out.
        assert_eq!(out, [Action::GetPeer, Action::Recv]);
        assert_eq!((m.deadline, m.deadline_ms), (Deadline::Header, 11_000));
        assert_eq!(m.in_flight(), 2);
        out.clear();
        let peer: std::net::SocketAddr = "198.51.100.7:5000".parse().unwrap();
        m.on_peer(Some(peer), false, &mut out);
        assert_eq!(out, [Action::ClientKnown], "counted against its cap now");
        assert_eq!(m.client.addr(), Some(peer));
        assert_eq!(m.in_flight(), 1);
        out.clear();
        m.on_recv(4, Some(b"GET "), false, &cx(1001), &mut out);
        assert_eq!(out, [Action::QueueUrgent]);
        assert_eq!(m.in_flight(), 0);
    }

    #[test]
    fn reads_are_planned_within_the_pipeline_and_sent_in_order() {
        let mut m = responding(3 * CHUNK as u64);
        let mut out = Actions::new();
        m.try_send(&cx(1), &mut out);
        assert_eq!(
            out,
            [Action::SendHead {
                from: 0,
                more: true
            }]
        );
        out.clear();
        let mut free = vec![12, 11, 10];
        assert_eq!(pump(&mut m, &mut free, &mut out), Turn::Idle);
        // Two chunks to start with (READ_AHEAD_START_CHUNKS), one slot left in the arena.
        let reads: Vec<_> = out
            .iter()
            .filter_map(|a| match a {
                Action::Read { slot, file_off, .. } => Some((slot.raw(), *file_off)),
                _ => None,
            })
            .collect();
        assert_eq!(reads, [(10, 0), (11, CHUNK as u64)]);
        assert_eq!(free, [12]);
        assert_eq!(m.in_flight(), 3, "head send + two reads");
        out.clear();
        m.on_read(a(11), CHUNK as i32, &mut |_| true, &cx(2), &mut out);
        m.on_head_sent(100, &cx(2), &mut out);
        // The second chunk is ready first but the first goes first.
        assert!(!out.iter().any(|a| matches!(a, Action::Send { .. })));
        out.clear();
        m.on_read(a(10), CHUNK as i32, &mut |_| true, &cx(3), &mut out);
        m.try_send(&cx(3), &mut out);
        assert!(out.contains(&Action::Send {
            slot: a(10),
            off: 0,
            len: CHUNK,
            more: true,
            zerocopy: false
        }));
    }

    #[test]
    fn a_wait_on_the_origin_is_not_the_clients_send_timeout() {
        let mut m = responding(2 * CHUNK as u64);
        m.response_mut().unwrap().head = HeadState::Done;
        let mut out = Actions::new();
        let mut free = vec![11, 10];
        pump(&mut m, &mut free, &mut out);
        m.on_read(a(10), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.try_send(&cx(1), &mut out);
        m.on_send(a(10), CHUNK as i32, false, false, &cx(2), &mut out);
        assert_eq!(m.deadline, Deadline::Send);
        let due = m.deadline_ms;
        // The second chunk's bytes are still coming from the origin (a pass-through): the
        // client has taken everything, so its send timeout does not run out.
        out.clear();
        assert!(!m.on_timer(&cx(due + 1), &mut out));
        assert!(m.is_open() && out.is_empty());
        // The bytes arrive long after: the send timeout restarts from them, so the timer
        // sweep of the same tick does not close the connection whose last bytes just left.
        let late = due + 10 * cx(0).limits.send_timeout_ms;
        m.source_delivered(&cx(late));
        m.on_read(a(11), CHUNK as i32, &mut |_| true, &cx(late), &mut out);
        m.try_send(&cx(late), &mut out);
        assert!(out.iter().any(|a| matches!(a, Action::Send { .. })));
        assert!(!m.on_timer(&cx(late), &mut out));
        assert!(m.is_open());
        // A client that then takes nothing still runs out of time.
        let stalled = late + cx(0).limits.send_timeout_ms;
        assert!(m.on_timer(&cx(stalled), &mut out));
    }

    #[test]
    fn a_full_socket_parks_the_chunk_and_a_reclaim_rewinds_the_body() {
        let mut m = responding(2 * CHUNK as u64);
        m.response_mut().unwrap().head = HeadState::Done;
        let mut out = Actions::new();
        let mut free = vec![11, 10];
        pump(&mut m, &mut free, &mut out);
        m.on_read(a(10), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.on_read(a(11), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.try_send(&cx(1), &mut out);
        out.clear();
        // The socket takes 1000 bytes, then is full.
        m.on_send(a(10), 1000, false, false, &cx(2), &mut out);
        assert!(out.contains(&Action::PollWritable));
        assert!(out.contains(&Action::ListParked) && out.contains(&Action::Reclaim));
        assert!(m.is_parked());
        assert_eq!(m.in_flight(), 1, "only the poll: a parked chunk is ours");
        out.clear();
        m.reclaim(&mut out);
        assert!(
            out.contains(&Action::ReleaseSlot(a(10))) && out.contains(&Action::ReleaseSlot(a(11)))
        );
        let body = m.body().unwrap();
        assert!(body.chunks.is_empty());
        // The unsent bytes are planned again from the first byte the socket did not take.
        assert!(matches!(
            body.segments.front(),
            Some(Segment::File { pos: 1000, end }) if *end == 2 * CHUNK as u64
        ));
        assert_eq!(body.read_size_bytes, MIN_READ_BYTES);
    }

    #[test]
    fn a_multishot_receive_stays_armed_and_is_cancelled_at_its_bound() {
        let mut m = responding(CHUNK as u64);
        assert!(
            m.recv_multishot(),
            "a cleartext connection receives multishot"
        );
        let mut out = Actions::new();
        m.read = ReadState::Idle;
        m.arm_recv(&mut out);
        assert_eq!(out, [Action::Recv]);
        out.clear();
        // Pipelined bytes arrive during the response: kept, and the receive stays armed.
        let piece = vec![b'x'; RX_MULTISHOT_MAX_BYTES / 2];
        m.on_recv(piece.len() as i32, Some(&piece), true, &cx(1), &mut out);
        assert_eq!(m.read, ReadState::Armed);
        assert!(
            out.is_empty(),
            "nothing to do until the response ends: {out:?}"
        );
        m.arm_recv(&mut out);
        assert!(out.is_empty(), "no second receive while one is armed");
        // At the bound: cancelled once, whatever else arrives before the cancel lands.
        m.on_recv(piece.len() as i32, Some(&piece), true, &cx(2), &mut out);
        assert_eq!(out, [Action::CancelRecv]);
        out.clear();
        m.on_recv(10, Some(&piece[..10]), true, &cx(2), &mut out);
        assert!(out.is_empty(), "one cancel: {out:?}");
        let before = m.in_flight();
        m.on_recv(-libc::ECANCELED, None, false, &cx(3), &mut out);
        assert_eq!(m.read, ReadState::Idle);
        assert_eq!(m.in_flight(), before - 1);
        m.on_recv_cancel_done(&mut out);
        assert!(!m.ops.recv_cancel);
        assert_eq!(m.rx.len(), RX_MULTISHOT_MAX_BYTES + 10, "no byte lost");
        // Once the bytes are consumed the receive is armed again.
        m.rx.clear();
        m.arm_recv(&mut out);
        assert_eq!(out, [Action::Recv]);
    }

    /// A TLS session under a certificate generated for the test (the directory holds it).
    fn tls_session() -> (tempfile::TempDir, Box<TlsSession>) {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::tls::testing::write_cert(
            dir.path(),
            "edge",
            crate::tls::testing::KeyKind::EcdsaP256,
            &["edge.test"],
        );
        let cfg = crate::config::Config {
            tls_listen: Some("127.0.0.1:0".parse().unwrap()),
            tls_certificate: vec![spec],
            ..crate::config::Config::default()
        };
        let ctx = crate::tls::TlsBuilder::new()
            .unwrap()
            .build(&cfg)
            .unwrap()
            .unwrap();
        (dir, Box::new(TlsSession::new(ctx.server.clone()).unwrap()))
    }

    #[test]
    fn last_words_stuck_in_a_full_socket_are_cut_at_the_send_timeout() {
        // A TLS connection closing cleanly: its last record (an alert) goes out before the
        // socket closes, but the client stopped reading, so the send never completes.
        let (_dir, mut tls) = tls_session();
        tls.outgoing.extend_from_slice(&[21, 3, 3, 0, 2, 1, 0]);
        let mut m = ConnMachine::new();
        m.tls = Some(tls);
        m.life = Lifecycle::Closing {
            reason: CloseReason::Normal,
        };
        m.set_deadline(Deadline::LastWords, 60_000);
        let mut out = Actions::new();
        m.maybe_finish_close(&mut out);
        assert!(
            out.iter().any(|a| matches!(a, Action::SendTls { .. })),
            "{out:?}"
        );
        assert!(!out.iter().any(|a| matches!(a, Action::CloseSocket)));
        assert!(m.wants_timer(), "the deadline must stay on the wheel");
        // Before the deadline nothing changes.
        out.clear();
        assert!(!m.on_timer(&cx(59_999), &mut out));
        assert!(out.is_empty(), "{out:?}");
        // At it, the send is cancelled and the rest dropped.
        assert!(!m.on_timer(&cx(60_000), &mut out));
        assert!(
            out.iter().any(|a| matches!(a, Action::CancelAll)),
            "{out:?}"
        );
        assert!(m.tls.as_ref().unwrap().outgoing.is_empty());
        assert!(!m.wants_timer());
        // The cancelled send and the cancel complete: the socket closes.
        out.clear();
        m.on_tls_sent(-libc::ECANCELED, &cx(60_001), &mut out);
        m.on_cancel_done(&mut out);
        assert!(
            out.iter().any(|a| matches!(a, Action::CloseSocket)),
            "{out:?}"
        );
    }

    #[test]
    fn a_wake_up_that_sends_nothing_keeps_the_park_hold_running() {
        let mut m = responding(2 * CHUNK as u64);
        m.response_mut().unwrap().head = HeadState::Done;
        let mut out = Actions::new();
        let mut free = vec![11, 10];
        pump(&mut m, &mut free, &mut out);
        m.on_read(a(10), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.on_read(a(11), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.try_send(&cx(1), &mut out);
        m.on_send(a(10), 1000, false, false, &cx(2), &mut out);
        assert_eq!(m.parked_ms, 2);
        // Woken (a spurious poll completion), but the socket takes nothing: parked again
        // with the hold still counted from the first park, and nothing given back yet.
        m.on_writable(-libc::ECANCELED, &cx(50), &mut out);
        m.try_send(&cx(50), &mut out);
        out.clear();
        m.on_send(a(10), -libc::EAGAIN, false, false, &cx(60), &mut out);
        assert!(m.is_parked());
        assert_eq!(
            m.parked_ms, 2,
            "a wake-up that sent nothing restarts no hold"
        );
        assert!(!out.iter().any(|a| matches!(a, Action::ReleaseSlot(_))));
        // Past the hold, the next empty wake-up gives every chunk back at once: the sweep
        // might never find it parked.
        m.on_writable(-libc::ECANCELED, &cx(250), &mut out);
        m.try_send(&cx(250), &mut out);
        out.clear();
        m.on_send(a(10), -libc::EAGAIN, false, false, &cx(260), &mut out);
        assert!(
            out.contains(&Action::ReleaseSlot(a(10))) && out.contains(&Action::ReleaseSlot(a(11)))
        );
        assert!(m.body().unwrap().chunks.is_empty());
        assert!(m.is_parked(), "it still waits for its socket to drain");
    }

    #[test]
    fn a_reclaim_counts_the_bytes_given_back_and_later_reads_grow_by_steps() {
        let mut m = responding(2 * CHUNK as u64);
        m.response_mut().unwrap().head = HeadState::Done;
        let mut out = Actions::new();
        let mut free = vec![11, 10];
        pump(&mut m, &mut free, &mut out);
        m.on_read(a(10), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.on_read(a(11), CHUNK as i32, &mut |_| true, &cx(1), &mut out);
        m.try_send(&cx(1), &mut out);
        m.on_send(a(10), 1000, false, false, &cx(2), &mut out);
        out.clear();
        m.reclaim(&mut out);
        let given = |why: GiveBack| -> u64 {
            out.iter()
                .filter_map(|a| match a {
                    Action::Count(Counter::GivenBack(w), n) if *w == why => Some(*n),
                    _ => None,
                })
                .sum()
        };
        // The rest of the chunk that left in part, and the whole chunk read ahead behind it.
        assert_eq!(given(GiveBack::Reclaim), CHUNK as u64 - 1000);
        assert_eq!(given(GiveBack::ReclaimUnsent), CHUNK as u64);
        // The socket has filled once: whole sends now grow reads one step at a time.
        assert_eq!(m.body().unwrap().read_size_bytes, MIN_READ_BYTES);
        // Slots large enough for reads to grow into.
        let mut big = cx(3);
        big.limits.chunk_bytes = 16 * MIN_READ_BYTES;
        m.note_socket_round(MIN_READ_BYTES as u32, true, &big, &mut out);
        m.note_socket_round(MIN_READ_BYTES as u32, true, &big, &mut out);
        assert_eq!(m.body().unwrap().read_size_bytes, 3 * MIN_READ_BYTES);
        // A fresh connection still doubles.
        let mut f = responding(2 * CHUNK as u64);
        f.body_mut().unwrap().read_size_bytes = MIN_READ_BYTES;
        f.note_socket_round(MIN_READ_BYTES as u32, true, &big, &mut out);
        f.note_socket_round(MIN_READ_BYTES as u32, true, &big, &mut out);
        assert_eq!(f.body().unwrap().read_size_bytes, 4 * MIN_READ_BYTES);
    }

    #[test]
    fn closing_waits_for_everything_in_flight_then_closes_once() {
        let mut m = responding(CHUNK as u64);
        let mut out = Actions::new();
        m.try_send(&cx(1), &mut out);
        let mut free = vec![10];
        pump(&mut m, &mut free, &mut out);
        out.clear();
        assert_eq!(m.in_flight(), 2, "head send + read");
        m.close(CloseReason::Abort, &cx(2), &mut out);
        assert!(out.contains(&Action::CancelAll));
        assert!(!out.contains(&Action::CloseSocket));
        out.clear();
        m.on_read(a(10), -libc::ECANCELED, &mut |_| true, &cx(3), &mut out);
        m.on_head_sent(-libc::ECANCELED, &cx(3), &mut out);
        assert!(
            !out.contains(&Action::CloseSocket),
            "the cancel is still in flight"
        );
        m.on_cancel_done(&mut out);
        let closes = out.iter().filter(|a| **a == Action::CloseSocket).count();
        assert_eq!(closes, 1);
        assert!(
            out.contains(&Action::ReleaseSlot(a(10)))
                && out.contains(&Action::ReleaseFile(FileSlot::new(7)))
        );
        assert!(out.contains(&Action::ResponseDone {
            status: 200,
            bytes: 0
        }));
        m.on_closed();
        assert_eq!(m.life, Lifecycle::Free);
        assert_eq!(m.generation, 1);
    }

    #[test]
    fn an_error_response_with_close_lingers_and_its_timer_is_a_normal_end() {
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(3), None, &cx(0), &mut out);
        m.on_peer(None, false, &mut out);
        m.on_recv(4, Some(b"GET "), false, &cx(0), &mut out);
        m.begin_response(431, false, 50, None, RateSpec::default(), &cx(0));
        m.try_send(&cx(0), &mut out);
        out.clear();
        m.on_head_sent(50, &cx(1), &mut out);
        assert!(out.contains(&Action::ShutdownWrite) && out.contains(&Action::Recv));
        assert_eq!(m.life, Lifecycle::Lingering { dropped_bytes: 0 });
        out.clear();
        m.on_recv(100, Some(&[0; 100]), false, &cx(2), &mut out);
        assert_eq!(m.life, Lifecycle::Lingering { dropped_bytes: 100 });
        assert!(m.rx.is_empty(), "lingering bytes are dropped");
        out.clear();
        assert!(m.on_timer(&cx(1 + LINGER_TIMEOUT_MS), &mut out));
        assert!(out.contains(&Action::Count(Counter::Closed(CloseReason::Normal), 1)));
    }

    #[test]
    fn a_part_header_shares_the_chunk_of_its_unaligned_data() {
        let mut m = responding(0);
        let body = m.body_mut().unwrap();
        body.align = 4096;
        body.source = Source::Direct;
        body.framing = vec![b'h'; 100];
        body.segments = VecDeque::from([
            Segment::Mem { start: 0, end: 100 },
            Segment::File {
                pos: 5000,
                end: 9000,
            },
        ]);
        m.response_mut().unwrap().head = HeadState::Done;
        let mut out = Actions::new();
        let mut free = vec![10];
        pump(&mut m, &mut free, &mut out);
        // One chunk for header and data: the aligned read lands past the header's length.
        let reads: Vec<_> = out
            .iter()
            .filter(|a| matches!(a, Action::Read { .. }))
            .collect();
        assert_eq!(
            reads,
            [&Action::Read {
                slot: a(10),
                buf_off: 4096,
                len: 8192,
                file_fixed: 100,
                file_off: 4096,
                rw_flags: 0
            }]
        );
        assert!(!out.iter().any(|a| matches!(a, Action::CopyFraming { .. })));
        out.clear();
        m.on_read(a(10), 8192, &mut |_| true, &cx(2), &mut out);
        // The header is copied after the read, right in front of file byte 5000.
        let to = 4096 + (5000 - 4096) - 100;
        assert!(out.contains(&Action::CopyFraming {
            slot: a(10),
            from: 0,
            len: 100,
            to
        }));
        out.clear();
        m.try_send(&cx(2), &mut out);
        assert!(out.contains(&Action::Send {
            slot: a(10),
            off: to,
            len: 4100,
            more: false,
            zerocopy: false
        }));
        out.clear();
        // 40 bytes of the header leave, then the socket is full: the rest of the header and
        // all the data are planned again, in order.
        m.on_send(a(10), 40, false, false, &cx(3), &mut out);
        m.reclaim(&mut out);
        let segs: Vec<_> = m.body().unwrap().segments.iter().collect();
        assert!(matches!(
            segs[..],
            [
                Segment::Mem {
                    start: 40,
                    end: 100
                },
                Segment::File {
                    pos: 5000,
                    end: 9000
                }
            ]
        ));
    }

    #[test]
    fn a_waiting_connection_uses_the_handed_slot_and_reports_the_wait() {
        let mut m = responding(CHUNK as u64);
        let mut out = Actions::new();
        let mut none = Vec::new();
        assert_eq!(pump(&mut m, &mut none, &mut out), Turn::Idle);
        assert!(out.contains(&Action::WaitArena(Demand::Bulk)));
        out.clear();
        m.slot_handed(a(4), &cx(5), &mut out);
        assert_eq!(out, [Action::BufferWaited(4000), Action::QueueBulk]);
        out.clear();
        pump(&mut m, &mut none, &mut out);
        assert!(out
            .iter()
            .any(|act| matches!(act, Action::Read { slot, .. } if *slot == a(4))));
        assert_eq!(m.arena, ArenaWait::None);
    }
}
