//! The data a connection's response is made of: the body still to plan (segments), the
//! chunks of registered memory it holds (each in one pipeline state), and the reasons and
//! timers the connection machine (`machine/`) works with.

use std::collections::VecDeque;

use super::slots::{ArenaSlot, FileSlot};

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
    /// A TLS handshake must complete by then (`tls_handshake_timeout_ms` from accept).
    Handshake,
    /// A response waiting for the cache fill gets a 504 then (`cache_wait_timeout_ms`).
    Fill,
    /// A closing TLS connection's last words (close_notify, an alert) must have left by then
    /// (`send_timeout_ms` from the close), or they are cancelled: a client that stopped
    /// reading would hold the slot for ever.
    LastWords,
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
    /// Its read holds a cached block that failed its checksum: the chunk keeps its place and
    /// its slot (nothing in flight) until the block is fetched again, then is read again.
    Refetching,
}

/// One registered-buffer chunk of a response.
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    /// Arena slot.
    pub slot: ArenaSlot,
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
    /// Its last send was SEND_ZC: the slot counts toward the shard's zero-copy share until
    /// the notification.
    pub zerocopy: bool,
    /// Where its bytes are planned again from when the chunk is given back unsent.
    pub bytes_from: BytesFrom,
    /// On a TLS connection, once sealed: how its plaintext became records. `send_off`,
    /// `send_len` and `sent` then count ciphertext; this maps them back to plaintext.
    pub tls: Option<SealedRun>,
}

/// A chunk's plaintext sealed into TLS records (`tls::record::seal_run_into`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedRun {
    /// How the plaintext was cut into records.
    pub cut: crate::tls::record::RecordCut,
    /// Sequence number of its first record.
    pub first_seq: u64,
    /// Offset in the slot where the plaintext began (and the ciphertext begins).
    pub pt_at: u32,
}

impl Chunk {
    /// Where in the slot its bytes began, the first one not yet delivered, and the end, in
    /// plaintext offsets. For a sealed TLS chunk the first undelivered byte is the start of
    /// the first record that did not leave whole (a record sent in part delivers nothing);
    /// also returned: that record's index and how many of its bytes left.
    pub fn plaintext_progress(&self) -> (u32, u32, u32, Option<(u32, u32)>) {
        match self.tls {
            None => (
                self.send_off,
                self.send_off + self.sent,
                self.send_off + self.send_len,
                None,
            ),
            Some(run) => {
                let (k, within) = run.cut.locate(self.send_off - run.pt_at + self.sent);
                (
                    run.pt_at,
                    run.pt_at + run.cut.pt_start(k),
                    run.pt_at + run.cut.pt_len,
                    Some((k, within)),
                )
            }
        }
    }
}

impl ChunkState {
    /// The kernel holds the slot (a read or a send is in flight, or SEND_ZC's notification is
    /// still to come): the chunk cannot be given back, and the connection cannot be freed.
    pub fn kernel_holds(self) -> bool {
        matches!(
            self,
            ChunkState::Reading | ChunkState::Sending | ChunkState::AwaitNotif
        )
    }
}

/// Where a chunk's bytes come from, so the unsent rest can be planned again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BytesFrom {
    /// File bytes (read into the slot at `read_buf_off`).
    File,
    /// The body's framing buffer from byte `at` (multipart part headers, closing boundary).
    Framing {
        /// Offset in `Body::framing` of the chunk's first byte.
        at: u32,
    },
    /// Generated zero bytes.
    Zero,
    /// A multipart part header from the framing buffer (`len` bytes from `at`), then file
    /// bytes: the header is copied in front of the data once the read has landed, so a part
    /// costs one slot and one send, not two.
    FramedFile {
        /// Offset in `Body::framing` of the header.
        at: u32,
        /// Bytes of the header at the front of the send.
        len: u32,
    },
}

/// How a chunk's file bytes are read.
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
    /// Bytes `[start, end)` of the body's framing buffer (multipart part headers and the
    /// closing boundary): one buffer per response, not one allocation per part.
    Mem {
        /// First byte in `Body::framing`.
        start: u32,
        /// End (exclusive).
        end: u32,
    },
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
    pub file: Option<FileSlot>,
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
    /// Literal body bytes the `Segment::Mem` entries point into.
    pub framing: Vec<u8>,
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
    /// What the connection's rate limit lets the next chunk plan (`usize::MAX`: no limit;
    /// set by `pump` before each chunk).
    pub limit_cap_bytes: usize,
    /// File offset up to which the file's bytes may be read (`u64::MAX`: all of them). A
    /// pulled object still filling is readable up to its first missing block: the pipeline
    /// stops there (`Action::AwaitBlock`) until the shard moves this on.
    pub readable_end: u64,
    /// An `Action::AwaitBlock` is out for `readable_end` (sent once per wait).
    pub awaiting_block: bool,
    /// A pass-through (`fill::relay`): its "reads" are answered from an origin fetch, so its
    /// chunks are never given back (their bytes cannot be read again) and it reads one
    /// chunk at a time.
    pub relay: bool,
}

impl Body {
    /// Bytes still to plan into chunks (file ranges, framing and zeros not yet planned).
    pub fn unplanned_bytes(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| match *s {
                Segment::File { pos, end } => end.saturating_sub(pos),
                Segment::Mem { start, end } => u64::from(end.saturating_sub(start)),
                Segment::Zero { remaining } => remaining,
            })
            .sum()
    }

    /// Nothing left to plan or send.
    pub fn is_done(&self) -> bool {
        self.segments.is_empty() && self.chunks.is_empty()
    }

    /// Where the chunk in arena slot `slot` sits in the pipeline; a slot the body does not
    /// hold is a driver bug (a completion routed to the wrong connection), so it panics.
    pub fn chunk_index(&self, slot: ArenaSlot) -> usize {
        self.chunks
            .iter()
            .position(|ch| ch.slot == slot)
            .expect("completion for a chunk the connection does not hold")
    }

    /// The body's queues, emptied, for the next response (their capacity is kept).
    pub fn into_buffers(self) -> BodyBuffers {
        let mut b = BodyBuffers {
            segments: self.segments,
            chunks: self.chunks,
            framing: self.framing,
        };
        b.segments.clear();
        b.chunks.clear();
        b.framing.clear();
        b
    }
}

/// A response body's queues, kept in a per-shard pool between responses so that starting a
/// response allocates nothing once the pool has seen as many responses at once as now.
#[derive(Debug, Default)]
pub struct BodyBuffers {
    /// Body work to plan.
    pub segments: VecDeque<Segment>,
    /// The chunk pipeline.
    pub chunks: VecDeque<Chunk>,
    /// Multipart framing bytes.
    pub framing: Vec<u8>,
}

impl BodyBuffers {
    /// Empty queues with room for a response of up to `segments` segments and a pipeline of
    /// `chunks` chunks.
    pub fn with_capacity(segments: usize, chunks: usize) -> BodyBuffers {
        BodyBuffers {
            segments: VecDeque::with_capacity(segments),
            chunks: VecDeque::with_capacity(chunks),
            framing: Vec::new(),
        }
    }
}
