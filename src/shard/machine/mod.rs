//! One connection as a sans-IO state machine (issue 11 item 3).
//!
//! `ConnMachine` takes events (a receive, a read, a send or a notification completed, the
//! socket became writable, a timer expired, an arena slot was handed over, a response was
//! planned) and answers with `Action`s: submit this operation, give back that slot, queue me,
//! count this. It never touches the ring, the arena's memory, the file cache or the metrics;
//! the shard (`mod.rs`) is the driver that turns completions into events and actions into
//! submissions, in order. So every decision about one connection lives in this module (its
//! request life here; `action.rs`, `tls.rs`, `send.rs` and `chunk_plan.rs` beside it), and the
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

mod action;
mod chunk_plan;
mod send;
mod tls;

pub use action::*;

use super::buffers::Demand;
use super::conn::{
    Body, BodyBuffers, BytesFrom, Chunk, ChunkState, CloseReason, Deadline, SealedRun, Segment,
    Source,
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
use crate::tls::session::{HandshakeFailure, HandshakeStep, Received, Resume, TlsSession, Version};

/// Where a connection slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnLife {
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

/// One connection slot.
#[derive(Debug)]
pub struct ConnMachine {
    /// Bumped each time the slot is freed; tokens carry it.
    generation: u16,
    /// Fixed-file index of the socket.
    socket: SocketSlot,
    /// Where the connection is in its life.
    life: ConnLife,
    /// The receive side.
    read: ReadState,
    /// The send side.
    write: WriteState,
    /// Operations in flight that no other state records.
    ops: OpSlots,
    /// Who is asking: the peer, and the address a trusted proxy gave.
    client: crate::client::Client,
    /// Counted against `max_connections_per_client` under this key (released at close).
    cap_key: Option<crate::client::cap::ClientKey>,
    /// Over `max_connections_per_client`: its first request gets a 429.
    over_cap: bool,
    /// The limiter the last response waited for, if any (the access log's `limiter`).
    limiter: Option<&'static str>,
    /// Where the current pulled response's bytes come from (the access log's `cache`).
    cache: Option<&'static str>,
    /// The `[[origin]]` entry of the current pulled response (the per-origin counters).
    cache_origin: Option<u8>,
    /// The current response's rate limit (`limit_rate_bytes_per_s`), if one applies.
    rate_limit: Option<crate::limits::RateLimit>,
    /// The current response's place with the edge's egress cap, if one applies.
    egress: Option<crate::limits::egress::EgressHold>,
    /// The current request's client (X-Forwarded-For applied when a trusted proxy sent it).
    request_client: Option<std::net::IpAddr>,
    /// Waiting for the PROXY protocol header (None: not expected, or done).
    proxy: Option<crate::client::proxy_protocol::Stage>,
    /// Place in the arena's wait queue.
    arena: ArenaWait,
    /// Request bytes received and not yet consumed (pipelined requests wait here).
    rx: Vec<u8>,
    /// How far `rx` has been scanned for the end of the head (reset whenever `rx` loses bytes).
    head_scan: crate::http::head_scan::HeadScan,
    /// Active timer.
    deadline: Deadline,
    /// When it fires (shard clock, ms).
    deadline_ms: u64,
    /// When the connection last parked a chunk (shard clock, ms).
    parked_ms: u64,
    /// Bytes the socket took since it last became writable.
    round_bytes: u64,
    /// What the socket took in its last full writable round (bytes), at least a minimum read.
    round_estimate_bytes: usize,
    /// The last chunk send went out whole: the client drains fast enough for SEND_ZC, whose
    /// buffer stays the kernel's until the peer acknowledges it.
    fast_drain: bool,
    /// Method of the current request; None when its head was refused before that was known.
    method: Option<Method>,
    /// When the current request was parsed (shard clock, µs).
    request_start_us: u64,
    /// Bytes sent for the current response.
    resp_bytes: u64,
    /// `METHOD target VERSION` of the current request, for the access log (empty when off).
    log_request: Vec<u8>,
    /// Range header of the current request, for the access log.
    log_range: Vec<u8>,
    /// The queues of the last body, emptied; the driver returns them to the shard's pool.
    spare: Option<BodyBuffers>,
    /// The connection's TLS, on the TLS listener (handshake, then record keys).
    tls: Option<Box<TlsSession>>,
    /// A send of the session's own bytes in flight.
    tls_send: TlsSend,
    /// Lingering over TLS: the write side is shut once close_notify has left.
    linger_shutdown_due: bool,
    /// A clean close asked for while a TLS send (close_notify) was in flight: it happens
    /// when the send completes, so the client gets the whole record (the connection's
    /// deadline still bounds the wait).
    close_after_tls_send: Option<CloseReason>,
    /// When the connection was accepted (shard clock, µs).
    accepted_us: u64,
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
            life: ConnLife::Free,
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

    // ---- what the driver reads and records (the fields stay private) ----------------

    /// The slot's generation (tokens carry it; bumped when the slot is freed).
    pub fn generation(&self) -> u16 {
        self.generation
    }

    /// Where the connection is in its life.
    pub fn life(&self) -> ConnLife {
        self.life
    }

    /// The receive side's state.
    pub fn read_state(&self) -> ReadState {
        self.read
    }

    /// Fixed-file index of the socket.
    pub fn socket(&self) -> SocketSlot {
        self.socket
    }

    /// When the active timer fires (shard clock, ms).
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// When the connection last parked a chunk (shard clock, ms).
    pub fn parked_ms(&self) -> u64 {
        self.parked_ms
    }

    /// When the current request was parsed (shard clock, µs).
    pub fn request_start_us(&self) -> u64 {
        self.request_start_us
    }

    /// Method of the current request (None: refused before it was known).
    pub fn method(&self) -> Option<Method> {
        self.method
    }

    /// Who is asking: the peer, and the address a trusted proxy gave.
    pub fn client(&self) -> &crate::client::Client {
        &self.client
    }

    /// The current request's client (X-Forwarded-For applied when a trusted proxy sent it).
    pub fn request_client(&self) -> Option<std::net::IpAddr> {
        self.request_client
    }

    /// Records the current request's client.
    pub fn set_request_client(&mut self, ip: Option<std::net::IpAddr>) {
        self.request_client = ip;
    }

    /// Counts the connection against its client's cap under `key` (released at close).
    pub fn set_cap_key(&mut self, key: crate::client::cap::ClientKey) {
        self.cap_key = Some(key);
    }

    /// The cap's key, taken at close.
    pub fn take_cap_key(&mut self) -> Option<crate::client::cap::ClientKey> {
        self.cap_key.take()
    }

    /// Marks the connection over its client's cap: its first request gets a 429.
    pub fn set_over_cap(&mut self) {
        self.over_cap = true;
    }

    /// Whether the connection is over its client's cap.
    pub fn over_cap(&self) -> bool {
        self.over_cap
    }

    /// The limiter the last response waited for (the access log's `limiter`).
    pub fn limiter(&self) -> Option<&'static str> {
        self.limiter
    }

    /// Where the current pulled response's bytes come from (the access log's `cache`).
    pub fn cache_label(&self) -> Option<&'static str> {
        self.cache
    }

    /// Sets where the current response's bytes come from (`HIT`, `MISS`, `PASS`, ...).
    pub fn set_cache_label(&mut self, label: Option<&'static str>) {
        self.cache = label;
    }

    /// The `[[origin]]` entry of the current pulled response.
    pub fn cache_origin(&self) -> Option<u8> {
        self.cache_origin
    }

    /// Sets the `[[origin]]` entry of the current pulled response.
    pub fn set_cache_origin(&mut self, origin: Option<u8>) {
        self.cache_origin = origin;
    }

    /// The current response's rate limit, if one applies.
    pub fn rate_limit(&self) -> Option<crate::limits::RateLimit> {
        self.rate_limit
    }

    /// The current response's place with the edge's egress cap, if one applies.
    pub fn egress_hold(&self) -> Option<crate::limits::egress::EgressHold> {
        self.egress
    }

    /// Place in the arena's wait queue.
    pub fn arena_wait(&self) -> ArenaWait {
        self.arena
    }

    /// The connection's TLS, on the TLS listener.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.tls.as_deref()
    }

    /// The connection's TLS, to change.
    pub fn tls_mut(&mut self) -> Option<&mut TlsSession> {
        self.tls.as_deref_mut()
    }

    /// A send of the session's own bytes, if one is in flight.
    pub fn tls_send(&self) -> TlsSend {
        self.tls_send
    }

    /// The queues of the last body, for the shard's pool.
    pub fn take_spare(&mut self) -> Option<BodyBuffers> {
        self.spare.take()
    }

    /// Request bytes received and not yet consumed.
    pub fn rx(&self) -> &[u8] {
        &self.rx
    }

    /// Whether `rx` may hold a whole head, for the parse about to run (which takes the
    /// verdict): each byte is scanned once, so a trickled head costs linear time
    /// (`http::head_scan`).
    pub fn head_may_be_complete(&mut self) -> bool {
        self.head_scan.take_parse(&self.rx)
    }

    /// `rx`, taken to be parsed (given back with `return_rx`).
    pub fn take_rx(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.rx)
    }

    /// Gives `rx` back with its first `consumed` bytes (a request's head) gone.
    pub fn return_rx(&mut self, rx: Vec<u8>, consumed: usize) {
        self.rx = rx;
        if consumed > 0 {
            self.rx.drain(..consumed);
            self.head_scan.reset();
        }
    }

    /// The access log's request line and Range header of the current request.
    pub fn log_fields(&self) -> (&[u8], &[u8]) {
        (&self.log_request, &self.log_range)
    }

    /// The access log's buffers, emptied, to be written for a new request.
    pub fn log_fields_cleared(&mut self) -> (&mut Vec<u8>, &mut Vec<u8>) {
        self.log_request.clear();
        self.log_range.clear();
        (&mut self.log_request, &mut self.log_range)
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
        self.life == ConnLife::Open
    }

    /// Open or lingering: not yet closing.
    pub fn is_live(&self) -> bool {
        matches!(self.life, ConnLife::Open | ConnLife::Lingering { .. })
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

    /// Whether a file read of this response is in flight (a chunk being read).
    pub fn reads_in_flight(&self) -> bool {
        self.body()
            .is_some_and(|b| b.chunks.iter().any(|c| c.state == ChunkState::Reading))
    }

    /// The file offset the chunk held in `slot` (`hold_for_refetch`) reads from, if that
    /// slot holds a held chunk of this connection.
    pub fn held_file_offset(&self, slot: ArenaSlot) -> Option<u64> {
        let body = self.body()?;
        let c = body.chunks.iter().find(|c| c.slot == slot)?;
        (c.state == ChunkState::Refetching).then_some(c.read_file_off)
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
        assert_eq!(self.life, ConnLife::Free);
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
        self.life = ConnLife::Open;
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
        self.life = ConnLife::Closing { reason };
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
        if !matches!(self.life, ConnLife::Closing { .. }) || self.ops.close {
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
        self.life = ConnLife::Free;
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
        if !matches!(self.life, ConnLife::Closing { .. }) {
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
            Deadline::LastWords => matches!(self.life, ConnLife::Closing { .. }),
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
        if let ConnLife::Lingering { dropped_bytes } = &mut self.life {
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
            self.scan_request_bytes(cx, out);
        }
    }

    /// Bytes of a request arrived: one step of the head scan per byte. Only when the parser
    /// could say more than `Partial` is the connection queued for `start_request`; otherwise
    /// the receive stays armed (or is armed again) and the bytes cost nothing more: no visit,
    /// no parse, no extra enter for an urgent round (`Shard::answer_new_requests`).
    fn scan_request_bytes(&mut self, cx: &Ctx, out: &mut Actions) {
        if self.is_open() && self.can_start_request() && !self.head_scan.scan(&self.rx) {
            out.push(Action::Count(Counter::HeadScanWaits, 1));
            self.need_more_request(cx, out);
            return;
        }
        out.push(Action::QueueUrgent);
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
        // Part of a request line: scanned, not queued; the one-shot receive is armed again.
        m.on_recv(4, Some(b"GET "), false, &cx(1001), &mut out);
        assert_eq!(
            out,
            [Action::Count(Counter::HeadScanWaits, 1), Action::Recv]
        );
        assert_eq!(m.in_flight(), 1);
        out.clear();
        // The request line's end: the parser may say more now.
        m.on_recv(12, Some(b"/ HTTP/1.1\r\n"), false, &cx(1002), &mut out);
        assert_eq!(out, [Action::QueueUrgent]);
        assert_eq!(m.in_flight(), 0);
    }

    #[test]
    fn a_head_trickled_a_byte_at_a_time_is_scanned_per_byte_and_queued_when_due() {
        let head = b"GET /small.bin HTTP/1.1\r\nHost: a\r\nX-Pad: aaaa\r\n\r\n";
        let line_end = head.iter().position(|&b| b == b'\n').unwrap();
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(5), None, &cx(0), &mut out);
        m.on_peer(None, false, &mut out);
        out.clear();
        let mut queued = Vec::new();
        for (i, b) in head.iter().enumerate() {
            // A multishot receive: it stays armed, one completion per byte.
            m.on_recv(1, Some(std::slice::from_ref(b)), true, &cx(1), &mut out);
            if out.contains(&Action::QueueUrgent) {
                queued.push(i);
                // The connection's turn parses (the request line: Partial) and takes the
                // verdict, as `start_request` does.
                assert!(m.head_may_be_complete());
                m.need_more_request(&cx(1), &mut out);
            } else {
                assert_eq!(out, [Action::Count(Counter::HeadScanWaits, 1)], "byte {i}");
            }
            out.clear();
        }
        // Queued twice: when the request line ended and when the head did.
        assert_eq!(queued, [line_end, head.len() - 1]);
        assert_eq!(m.rx(), head, "every byte kept, in order");
        assert_eq!(m.in_flight(), 1, "the one multishot receive, still armed");
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
        m.life = ConnLife::Closing {
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
        assert_eq!(m.life, ConnLife::Free);
        assert_eq!(m.generation, 1);
    }

    #[test]
    fn an_error_response_with_close_lingers_and_its_timer_is_a_normal_end() {
        let mut m = ConnMachine::new();
        let mut out = Actions::new();
        m.open(SocketSlot::new(3), None, &cx(0), &mut out);
        m.on_peer(None, false, &mut out);
        let head = b"GET / HTTP/1.1\r\n\r\n";
        m.on_recv(head.len() as i32, Some(head), false, &cx(0), &mut out);
        m.begin_response(431, false, 50, None, RateSpec::default(), &cx(0));
        m.try_send(&cx(0), &mut out);
        out.clear();
        m.on_head_sent(50, &cx(1), &mut out);
        assert!(out.contains(&Action::ShutdownWrite) && out.contains(&Action::Recv));
        assert_eq!(m.life, ConnLife::Lingering { dropped_bytes: 0 });
        out.clear();
        m.on_recv(100, Some(&[0; 100]), false, &cx(2), &mut out);
        assert_eq!(m.life, ConnLife::Lingering { dropped_bytes: 100 });
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
