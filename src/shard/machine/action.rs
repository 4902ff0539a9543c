//! What the machine asks of its driver (`Action`, in order), what it counts (`Counter`), and
//! what every event is judged by (`Limits`, `Ctx`).

use super::HandshakeOutcome;
use crate::shard::buffers::Demand;
use crate::shard::conn::{CloseReason, Source};
use crate::shard::slots::{ArenaSlot, FileSlot};
use crate::tls::record::RecordCut;

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
    /// Request bytes arrived that left the head incomplete: scanned, not parsed.
    HeadScanWaits,
    /// A request head was parsed (`parse_request`).
    HeadParses,
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
