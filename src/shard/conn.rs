//! One connection's state: the read side (request bytes, the armed receive) and the write side
//! (the header buffer, the response body as a pipeline of chunks) kept apart, plus flags for
//! every operation in flight so a connection is never freed while the kernel still acts for it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::http::request::Method;

/// Where a connection slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Unused slot (on the free list).
    Free,
    /// Serving requests.
    Open,
    /// Cancelling operations; closed and freed once none is in flight.
    Closing,
}

/// Which timer is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// No timer.
    None,
    /// A request head must complete by then (slowloris).
    Header,
    /// An idle keep-alive connection is closed then.
    Idle,
    /// A response must make send progress by then.
    Send,
    /// A lingering close (write side shut after an error response) ends by then.
    Linger,
}

/// Why a connection is closed (for counters and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Peer closed or `Connection: close` completed.
    Normal,
    /// A timer expired.
    Timeout,
    /// Protocol error from the client.
    ProtocolError,
    /// Aborted mid-response (file changed, I/O error, reset).
    Abort,
    /// Server draining.
    Drain,
}

/// State of one chunk in a response's pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// File read in flight into the slot.
    Reading,
    /// Bytes ready, waiting for its turn to send.
    Ready,
    /// Send in flight.
    Sending,
    /// Fully sent with SEND_ZC; the slot returns with the notification.
    AwaitNotif,
    /// The socket took only part of it (or nothing): the rest waits for the socket to become
    /// writable. The slot is ours, not the kernel's, so it can be given back at any time and
    /// the unsent bytes re-read later (a stalled client holds memory only while nobody else
    /// needs it, and at most `PARK_HOLD_MS`).
    Parked,
}

/// One registered-buffer chunk of a response.
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    /// Arena slot.
    pub slot: u16,
    /// Pipeline state.
    pub state: ChunkState,
    /// Offset in the slot of the first byte to send.
    pub send_off: u32,
    /// Bytes to send.
    pub send_len: u32,
    /// Bytes sent so far.
    pub sent: u32,
    /// Where in the slot the file read lands.
    pub read_buf_off: u32,
    /// File offset of the read.
    pub read_file_off: u64,
    /// Bytes the read asks for.
    pub read_len: u32,
    /// Bytes the read must deliver for the chunk to be whole.
    pub read_need: u32,
    /// Bytes delivered so far (short reads continue).
    pub read_got: u32,
    /// When its first send was submitted (shard clock, ms).
    pub send_started_ms: u64,
    /// Where the body bytes came from (for counters).
    pub source: Source,
}

/// Origin of a chunk's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// O_DIRECT read.
    Direct,
    /// RWF_DONTCACHE read.
    DontCache,
    /// Buffered read.
    Buffered,
    /// Copied from memory (multipart framing).
    Memory,
}

/// Body work not yet turned into chunks.
#[derive(Debug)]
pub enum Segment {
    /// File bytes `[pos, end)`.
    File {
        /// Next byte to plan.
        pos: u64,
        /// End (exclusive).
        end: u64,
    },
    /// Literal bytes (multipart part headers and closing boundary).
    Mem(Vec<u8>),
    /// Zero bytes (the network-only diagnostic endpoint).
    Zero {
        /// Bytes still to produce.
        remaining: u64,
    },
}

/// A response body in progress.
#[derive(Debug)]
pub struct Body {
    /// Open-file cache entry held by this response (None for generated bodies).
    pub file: Option<u32>,
    /// Fixed-file index of the file.
    pub file_fixed: u32,
    /// Read alignment (1 for buffered).
    pub align: u64,
    /// `rw_flags` for reads (RWF_DONTCACHE or 0).
    pub rw_flags: i32,
    /// Source label for counters.
    pub source: Source,
    /// Body work not yet planned into chunks.
    pub segments: VecDeque<Segment>,
    /// Chunks in flight, in send order.
    pub chunks: VecDeque<Chunk>,
    /// The header waits in the tx buffer to be copied in front of the first chunk (a small
    /// file whose header and body leave in one send).
    pub inline_head: bool,
    /// A small response (one chunk with its header): never waits behind bulk work.
    pub small: bool,
    /// Chunks this response may hold now (adapts between READ_AHEAD_START_CHUNKS and
    /// pipeline_depth with how fast the client drains).
    pub read_ahead: usize,
    /// Bytes the next file read asks for at most: what the socket took in its last writable
    /// round (it grows again while the client keeps up), so a slow socket is not handed a
    /// whole chunk it cannot take.
    pub read_size_bytes: usize,
}

impl Body {
    /// Nothing left to plan or send.
    pub fn is_done(&self) -> bool {
        self.segments.is_empty() && self.chunks.is_empty()
    }
}

/// A connection slot.
pub struct Conn {
    /// Bumped each time the slot is reused; tokens carry it.
    pub generation: u16,
    /// Life phase.
    pub phase: Phase,
    /// Fixed-file index of the socket.
    pub socket: u32,
    /// Request bytes received and not yet consumed (pipelined requests wait here).
    pub rx: Vec<u8>,
    /// A receive is in flight.
    pub recv_armed: bool,
    /// Header buffer bytes not yet sent start here (None: nothing pending).
    pub head_from: Option<usize>,
    /// The header buffer send is in flight.
    pub head_sending: bool,
    /// Body of the current response, if any.
    pub body: Option<Body>,
    /// A response is being sent (head and/or body).
    pub responding: bool,
    /// Keep the connection after the current response.
    pub keep_alive: bool,
    /// Peer shut its write side.
    pub peer_closed: bool,
    /// Operations in flight (recv, sends, reads, cancel, close).
    pub ops: u32,
    /// Cancel already submitted while closing.
    pub cancel_sent: bool,
    /// Close already submitted.
    pub close_sent: bool,
    /// Reason recorded when closing began.
    pub close_reason: CloseReason,
    /// Active timer.
    pub deadline: Deadline,
    /// When the active timer fires (shard clock, ms).
    pub deadline_ms: u64,
    /// Status of the current response (for the log).
    pub status: u16,
    /// Waiting in the arena queue.
    pub waiting_arena: bool,
    /// When the current arena wait began (`start_arena_wait`); None when not waiting.
    pub arena_wait_since: Option<Instant>,
    /// Method of the current request; None when its head was refused before that was known.
    pub method: Option<Method>,
    /// An arena slot handed over while waiting; used by the next pump.
    pub handoff_slot: Option<u16>,
    /// Waiting to re-arm a receive (no provided buffer was free).
    pub recv_retry: bool,
    /// A writability poll is in flight (a chunk is parked behind a full socket).
    pub poll_armed: bool,
    /// When the connection last parked a chunk (shard clock, ms).
    pub parked_ms: u64,
    /// Bytes the socket took since it last became writable.
    pub round_bytes: u64,
    /// What the socket took in its last full writable round (bytes), at least a minimum read.
    pub round_estimate_bytes: usize,
    /// Closing gracefully after an error response: our write side is shut, and what the
    /// client still sends is read and dropped (bounded) so the close sends no reset that could
    /// destroy the response before the client reads it.
    pub lingering: bool,
    /// Bytes read and dropped while lingering.
    pub linger_bytes: u64,
    /// Listed in the shard's parked FIFO (kept across slot reuse: the FIFO holds slots).
    pub parked_listed: bool,
    /// The last chunk send went out whole: the client drains fast enough for SEND_ZC, whose
    /// buffer stays the kernel's until the peer acknowledges it.
    pub fast_drain: bool,
    /// When the current request was parsed (shard clock, µs).
    pub request_start_us: u64,
    /// The first byte of the current response has been sent.
    pub first_byte_sent: bool,
    /// Bytes sent for the current response.
    pub resp_bytes: u64,
    /// `METHOD target VERSION` of the current request, for the access log (empty when off).
    pub log_request: Vec<u8>,
    /// Range header of the current request, for the access log.
    pub log_range: Vec<u8>,
}

impl Conn {
    /// An unused slot.
    pub fn new() -> Conn {
        Conn {
            generation: 0,
            phase: Phase::Free,
            socket: 0,
            rx: Vec::new(),
            recv_armed: false,
            head_from: None,
            head_sending: false,
            body: None,
            responding: false,
            keep_alive: true,
            peer_closed: false,
            ops: 0,
            cancel_sent: false,
            close_sent: false,
            close_reason: CloseReason::Normal,
            deadline: Deadline::None,
            deadline_ms: 0,
            status: 0,
            waiting_arena: false,
            arena_wait_since: None,
            method: None,
            handoff_slot: None,
            recv_retry: false,
            poll_armed: false,
            parked_ms: 0,
            lingering: false,
            linger_bytes: 0,
            parked_listed: false,
            round_bytes: 0,
            round_estimate_bytes: 0,
            fast_drain: false,
            request_start_us: 0,
            first_byte_sent: false,
            resp_bytes: 0,
            log_request: Vec::new(),
            log_range: Vec::new(),
        }
    }

    /// Resets the slot for a newly accepted socket (generation is bumped by the caller).
    pub fn open(&mut self, socket: u32) {
        assert_eq!(self.phase, Phase::Free);
        assert_eq!(self.ops, 0, "reusing a slot with operations in flight");
        let generation = self.generation;
        let mut rx = std::mem::take(&mut self.rx);
        rx.clear();
        let mut log_request = std::mem::take(&mut self.log_request);
        log_request.clear();
        let parked_listed = self.parked_listed;
        *self = Conn::new();
        self.generation = generation;
        self.parked_listed = parked_listed;
        self.rx = rx;
        self.log_request = log_request;
        self.phase = Phase::Open;
        self.socket = socket;
    }

    /// Joins the arena queue; the wait is timed for `shardline_buffer_wait_seconds`.
    pub fn start_arena_wait(&mut self) {
        self.waiting_arena = true;
        self.arena_wait_since = Some(Instant::now());
    }

    /// Leaves the arena queue (a slot came, none is needed, or the connection closes);
    /// returns how long it waited, or None if it was not waiting.
    pub fn end_arena_wait(&mut self) -> Option<Duration> {
        self.waiting_arena = false;
        self.arena_wait_since.take().map(|since| since.elapsed())
    }

    /// Whether a send (head or chunk) is in flight.
    pub fn send_in_flight(&self) -> bool {
        self.head_sending
            || self
                .body
                .as_ref()
                .is_some_and(|b| b.chunks.iter().any(|c| c.state == ChunkState::Sending))
    }
}

impl Default for Conn {
    fn default() -> Self {
        Conn::new()
    }
}
