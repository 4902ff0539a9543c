//! One block fetch as a sans-IO machine: a ranged GET for a run of blocks on one origin
//! connection, the answer received into one registered slot, each piece of a block written
//! from that slot with O_DIRECT, each finished block made durable and only then reported
//! with its checksum (the caller journals it: "a block is visible only once committed").
//!
//! The machine has at most one operation in flight, so it never needs to count: the caller
//! carries out the `Io` it asks for and reports the result with the matching event. It never
//! touches a socket, a file or the clock; the slot's bytes are lent to it on each event.
//!
//! A piece never crosses a block boundary, so a block's checksum is the running CRC-32C of
//! its pieces. Writes are whole multiples of the disk's alignment: the object's tail is padded
//! with zeros in the slot (the index keeps the true size; reads stop at it).

use super::response::{self, Expect, HeadError, Unusable, Verdict};

/// Longest validator or content type kept from an origin's head (longer ones are dropped).
pub const MAX_HEAD_FIELD_BYTES: usize = 256;
/// Most bytes a probe of an idle connection takes: one is enough to say it is not clean.
pub const PROBE_BYTES: usize = 4096;

/// What to fetch and how big the pieces are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// First block of the run.
    pub first_block: u32,
    /// Last block of the run (inclusive).
    pub last_block: u32,
    /// The object's block size (a multiple of `align_bytes`).
    pub block_bytes: u32,
    /// The object's size when a version is known (None: the first fetch learns it).
    pub size: Option<u64>,
    /// The ETag of the version being filled, when known.
    pub etag: Option<String>,
    /// The Last-Modified of the version being filled, when known.
    pub last_modified: Option<String>,
    /// Ask conditionally (`If-None-Match` with the ETag, else `If-Modified-Since` with the
    /// Last-Modified): a 304 ends the fetch with `FetchError::NotModified`, which the caller
    /// takes as "the version is still good".
    pub revalidate: bool,
    /// Bytes of the slot the answer is received into (a multiple of `align_bytes`).
    pub slot_bytes: usize,
    /// O_DIRECT alignment of the data file: every write is a multiple of it.
    pub align_bytes: usize,
    /// Blocks written between two syncs (at least 1). The fetch's first block is synced on
    /// its own, so a waiting client hears of it at once; later ones share a sync.
    pub sync_every_blocks: u32,
    /// Whether the bytes are for the cache (a fill) or one client (a pass-through), and by
    /// whose word: a reply that may not be stored is refused at its head, before a byte is
    /// written (`FetchError::NotStored`).
    pub storing: Storing,
    /// A fill's first fetch of a key: a reply the cache may not keep (`storing` refuses it,
    /// or a status other than 200/206) is not refused but goes on unstored, told by
    /// `HeadFacts::handed`, so the client that started the fill gets it (one origin request
    /// per client, RFC 9111 §3).
    pub hand_over: bool,
}

/// Who a fetch's bytes are for (`Plan::storing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storing {
    /// One client (a pass-through): nothing is stored.
    Not,
    /// The cache, by the origin's contract (RFC 9111): `no-store`, `private` and a `Vary` on
    /// a request field are refused.
    Contract,
    /// The cache, by the operator's word (`cache_policy = "override"`): only `private` is
    /// refused.
    Override,
}

impl Plan {
    /// The byte range the request asks for (inclusive), clamped to a known size.
    pub fn range(&self) -> (u64, u64) {
        let b = u64::from(self.block_bytes);
        let first = u64::from(self.first_block) * b;
        let mut last = (u64::from(self.last_block) + 1) * b - 1;
        if let Some(size) = self.size {
            last = last.min(size.saturating_sub(1));
        }
        (first, last)
    }
}

/// Timeouts of one fetch, ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From the connect to the socket being writable.
    pub connect_ms: u64,
    /// From the request's last byte to the head's end.
    pub first_byte_ms: u64,
    /// Between two receives of the body.
    pub idle_ms: u64,
}

/// What the caller is asked to do (one at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// Wait for the new connection's socket to become writable (the connect's end).
    Connect,
    /// Send `len` bytes of the slot from `offset` (the request head the caller wrote there).
    Send {
        /// Where in the slot.
        offset: usize,
        /// How many bytes.
        len: usize,
    },
    /// Receive at most `len` bytes into the slot at `offset` without waiting (MSG_DONTWAIT):
    /// `-EAGAIN` is the answer wanted. A kept-alive connection is probed before its next
    /// request and after each reply, so a byte past a reply's end is never read as the next
    /// reply (RFC 9112 §6.3).
    Probe {
        /// Where in the slot.
        offset: usize,
        /// At most this many bytes.
        len: usize,
    },
    /// Receive at most `len` bytes into the slot at `offset`.
    Recv {
        /// Where in the slot.
        offset: usize,
        /// At most this many bytes.
        len: usize,
    },
    /// Write the first `len` bytes of the slot to the version's data file at `file_offset`.
    Write {
        /// Bytes (a multiple of the alignment).
        len: usize,
        /// Where in the data file (the object's byte offset).
        file_offset: u64,
    },
    /// Make the data file's written bytes durable.
    Sync,
}

/// What the origin's head said, kept past the slot's reuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadFacts {
    /// The object's size.
    pub size: u64,
    /// ETag, if the origin sent one that fits.
    pub etag: Option<String>,
    /// Last-Modified, if it fits.
    pub last_modified: Option<String>,
    /// Content-Type, if it fits.
    pub content_type: Option<String>,
    /// The origin sent the whole object (a 200 to the range): every block follows.
    pub whole: bool,
    /// The origin's status: 200 or 206, or another one passed on as it is
    /// (`Verdict::Answer`, a fetch of unknown size that does not store).
    pub status: u16,
    /// The fields of its contract (caching, freshness) and the lines kept with it.
    pub fields: Box<super::contract::HeadFields>,
    /// Set when the reply may not be stored and the fetch goes on for one client
    /// (`Plan::hand_over`): why. Nothing of it is written to the data file.
    pub handed: Option<super::contract::NotStored>,
    /// For a reply with `Vary`: the request's lines it varies on
    /// (`contract::selecting_lines`), set by the caller that knows the request.
    pub selecting: String,
    /// For a reply handed over (`handed`): the client field lines its request carried, set
    /// by the caller; only a request with the same lines may be answered with it.
    pub request_lines: String,
}

/// Why a fetch ended without its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// The connect failed (errno).
    Connect(i32),
    /// A kept-alive connection was closed by the origin before any byte of the answer, or
    /// held bytes no request asked for (poisoned): try again on a new connection (not an
    /// attempt of its own).
    Stale,
    /// A stage took longer than its timeout.
    Timeout(&'static str),
    /// The connection ended or failed mid-answer (errno, 0 for an orderly close).
    Connection(i32),
    /// The head is not a usable HTTP head.
    Head(HeadError),
    /// The answer cannot be used (status, no length, another range).
    Unusable(Unusable),
    /// The origin has another version than the one being filled.
    VersionChanged,
    /// 304 where no revalidation was asked.
    NotModified,
    /// More bytes arrived than the head announced.
    Overrun,
    /// A write or sync of the data file failed (errno), or wrote short.
    Disk(i32),
    /// The reply may not be stored by a shared cache (RFC 9111 §3): each client is passed
    /// through on its own instead.
    NotStored(super::contract::NotStored),
}

impl FetchError {
    /// The cache's disk has no room (ENOSPC, EDQUOT): trying again cannot help until space
    /// is freed.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, FetchError::Disk(libc::ENOSPC | libc::EDQUOT))
    }

    /// The cache's disk failed the write (a device error: `cache::disk_health::classify`), or
    /// held it past `cache_disk_op_timeout_ms` (a stall): trying again on the same disk cannot
    /// help.
    pub fn is_disk_fault(&self) -> bool {
        use crate::cache::disk_health::{classify, ErrorKind};
        matches!(self, FetchError::Disk(e)
            if matches!(classify(*e), ErrorKind::Device | ErrorKind::Stall))
    }

    /// What a fetch that ended without an error but short of its blocks failed on: an
    /// overrun, or (`journal_full`) its disk's full journal, which refused their records.
    pub fn ended_short(journal_full: bool) -> FetchError {
        if journal_full {
            FetchError::Disk(libc::ENOSPC)
        } else {
            FetchError::Overrun
        }
    }

    /// The fill cannot store what it fetches (the disk is full, or failed): its waiters are
    /// passed through from the origin instead of getting an error.
    pub fn passes_through(&self) -> bool {
        self.is_disk_full() || self.is_disk_fault()
    }
}

/// What one event led to, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Carry this out and report it.
    Io(Io),
    /// The head was accepted: create or confirm the version before the next event.
    Head(HeadFacts),
    /// Block `block` is on disk and durable with checksum `crc`: journal it.
    Committed {
        /// Block number.
        block: u32,
        /// CRC-32C of its bytes.
        crc: u32,
    },
    /// `bytes` arrived past a reply's end (or before the request on a kept-alive connection):
    /// the connection is poisoned and closed, never read from again (the caller counts it).
    Poisoned {
        /// Bytes seen beyond the reply (at least this many).
        bytes: usize,
    },
    /// Every block of the run is committed; the connection may carry another fetch.
    Done {
        /// Whether the origin allows reuse.
        keep_alive: bool,
    },
    /// The fetch ended (the caller closes the connection; committed blocks stay).
    Failed(FetchError),
}

/// Where the machine is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Connecting,
    /// A kept-alive connection is probed before the request is sent (`Io::Probe`).
    ProbingBeforeSend,
    /// The reply is complete and whole; the connection is probed before it goes idle.
    ProbingAfterReply,
    Sending {
        sent: usize,
        len: usize,
    },
    Head {
        filled: usize,
    },
    /// A chunked reply's body is being received whole into the slot after its head, to be
    /// dechunked there (`chunked_body`).
    Chunked {
        filled: usize,
        head_len: usize,
    },
    Body,
    Writing,
    Syncing,
    Ended,
}

/// One fetch (see the module doc).
#[derive(Debug)]
pub struct BlockFetch {
    plan: Plan,
    timeouts: Timeouts,
    stage: Stage,
    deadline_ms: Option<u64>,
    /// The connection carried an earlier fetch (a close before any byte is `Stale`).
    reused: bool,
    /// The object's size, from the head.
    size: u64,
    /// A chunked reply dechunked in the slot: its body's length, and bytes that came past
    /// its end.
    chunked: Option<(u64, usize)>,
    /// Bytes of the body not yet received.
    body_left: u64,
    /// The object's byte offset of the slot's first byte.
    piece_start: u64,
    /// Bytes of the piece in the slot.
    piece_filled: usize,
    /// Running CRC-32C of the current block's pieces written so far.
    block_crc: u32,
    /// Blocks written whole but not yet synced, with their CRCs (at most `sync_every_blocks`
    /// plus a slot's worth).
    unsynced: Vec<(u32, u32)>,
    /// Blocks that end in the piece being written, with their CRCs.
    piece_blocks: Vec<(u32, u32)>,
    /// A sync of this fetch has completed.
    synced_once: bool,
    keep_alive: bool,
    /// Bytes of the request head at the slot's front.
    request_len: usize,
}

impl BlockFetch {
    /// A fetch of `plan`; on a kept-alive connection (`reused`) it starts with the request,
    /// otherwise with the connect. The caller has written the request head (`head_len` bytes)
    /// at the slot's front.
    pub fn start(
        plan: Plan,
        timeouts: Timeouts,
        reused: bool,
        head_len: usize,
        now_ms: u64,
        out: &mut Vec<Output>,
    ) -> BlockFetch {
        assert!(plan.first_block <= plan.last_block);
        assert!(plan.align_bytes.is_power_of_two());
        assert!(plan.slot_bytes.is_multiple_of(plan.align_bytes) && plan.slot_bytes > 0);
        assert!((plan.block_bytes as usize).is_multiple_of(plan.align_bytes));
        assert!(head_len > 0 && head_len <= plan.slot_bytes);
        assert!(plan.sync_every_blocks > 0);
        let mut f = BlockFetch {
            plan,
            timeouts,
            stage: Stage::Connecting,
            deadline_ms: None,
            reused,
            size: 0,
            body_left: 0,
            piece_start: 0,
            piece_filled: 0,
            block_crc: 0,
            unsynced: Vec::new(),
            piece_blocks: Vec::new(),
            chunked: None,
            synced_once: false,
            keep_alive: false,
            request_len: head_len,
        };
        if reused {
            // Whatever the connection holds now came after the last reply's end.
            f.stage = Stage::ProbingBeforeSend;
            let len = PROBE_BYTES.min(f.plan.slot_bytes - head_len);
            assert!(len > 0, "room past the request for a probe");
            out.push(Output::Io(Io::Probe {
                offset: head_len,
                len,
            }));
        } else {
            f.deadline_ms = Some(now_ms + timeouts.connect_ms);
            out.push(Output::Io(Io::Connect));
        }
        f
    }

    /// When the current stage times out (ms on the caller's clock), if it can.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.deadline_ms
    }

    /// Whether the fetch has ended (done or failed).
    pub fn ended(&self) -> bool {
        self.stage == Stage::Ended
    }

    /// The plan this fetch carries out.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn send(&mut self, sent: usize, len: usize, now_ms: u64, out: &mut Vec<Output>) {
        self.stage = Stage::Sending { sent, len };
        self.deadline_ms = Some(now_ms + self.timeouts.idle_ms);
        out.push(Output::Io(Io::Send {
            offset: sent,
            len: len - sent,
        }));
    }

    fn fail(&mut self, e: FetchError, out: &mut Vec<Output>) {
        self.stage = Stage::Ended;
        self.deadline_ms = None;
        out.push(Output::Failed(e));
    }

    /// The connect ended: `res` is the socket's pending error (0: connected).
    pub fn on_connected(&mut self, res: i32, head_len: usize, now_ms: u64, out: &mut Vec<Output>) {
        assert_eq!(self.stage, Stage::Connecting);
        if res != 0 {
            return self.fail(FetchError::Connect(res), out);
        }
        self.send(0, head_len, now_ms, out);
    }

    /// A probe (`Io::Probe`) completed with `res`: -EAGAIN is a clean connection; bytes are
    /// bytes no request asked for; 0 or another error is a connection the origin ended.
    pub fn on_probed(&mut self, res: i32, now_ms: u64, out: &mut Vec<Output>) {
        let clean = res == -libc::EAGAIN || res == -libc::EWOULDBLOCK;
        if res > 0 {
            out.push(Output::Poisoned {
                bytes: res as usize,
            });
        }
        match self.stage {
            Stage::ProbingBeforeSend if clean => self.send(0, self.request_len, now_ms, out),
            Stage::ProbingBeforeSend => self.fail(FetchError::Stale, out),
            Stage::ProbingAfterReply => {
                self.stage = Stage::Ended;
                self.deadline_ms = None;
                out.push(Output::Done { keep_alive: clean });
            }
            s => panic!("probe completion in {s:?}"),
        }
    }

    /// Every block is committed: the fetch is done. A connection that may be kept is probed
    /// first, so it goes idle only after a clean reply.
    fn finish(&mut self, out: &mut Vec<Output>) {
        self.deadline_ms = None;
        if !self.keep_alive {
            self.stage = Stage::Ended;
            out.push(Output::Done { keep_alive: false });
            return;
        }
        self.stage = Stage::ProbingAfterReply;
        out.push(Output::Io(Io::Probe {
            offset: 0,
            len: PROBE_BYTES.min(self.plan.slot_bytes),
        }));
    }

    /// A send completed with `res` (bytes, or -errno).
    pub fn on_sent(&mut self, res: i32, now_ms: u64, out: &mut Vec<Output>) {
        let Stage::Sending { sent, len } = self.stage else {
            panic!("send completion in {:?}", self.stage);
        };
        if res <= 0 {
            let e = if self.reused && sent == 0 {
                FetchError::Stale
            } else {
                FetchError::Connection(-res)
            };
            return self.fail(e, out);
        }
        let sent = sent + res as usize;
        if sent < len {
            return self.send(sent, len, now_ms, out);
        }
        self.stage = Stage::Head { filled: 0 };
        self.deadline_ms = Some(now_ms + self.timeouts.first_byte_ms);
        out.push(Output::Io(Io::Recv {
            offset: 0,
            len: response::MAX_RESPONSE_HEAD_BYTES.min(self.plan.slot_bytes),
        }));
    }

    /// A receive completed with `res` (bytes, 0 at the origin's close, or -errno); `slot`
    /// holds what arrived.
    pub fn on_received(&mut self, res: i32, slot: &mut [u8], now_ms: u64, out: &mut Vec<Output>) {
        match self.stage {
            Stage::Head { filled } => self.head_bytes(res, filled, slot, now_ms, out),
            Stage::Chunked { filled, head_len } => {
                if res <= 0 {
                    return self.fail(FetchError::Connection(-res), out);
                }
                self.chunked_body(filled + res as usize, head_len, slot, now_ms, out);
            }
            Stage::Body => {
                if res <= 0 {
                    return self.fail(FetchError::Connection(-res), out);
                }
                let n = res as usize;
                self.piece_filled += n;
                self.body_left -= n as u64;
                self.next(slot, now_ms, out);
            }
            s => panic!("receive completion in {s:?}"),
        }
    }

    fn head_bytes(
        &mut self,
        res: i32,
        filled: usize,
        slot: &mut [u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        if res <= 0 {
            let e = if self.reused && filled == 0 {
                FetchError::Stale
            } else {
                FetchError::Connection(-res)
            };
            return self.fail(e, out);
        }
        self.head_in(filled, filled + res as usize, slot, now_ms, out);
    }

    /// The slot holds `filled` bytes of the reply, the first `scanned` of them looked at
    /// before: the head is parsed when it may have ended.
    fn head_in(
        &mut self,
        scanned: usize,
        filled: usize,
        slot: &mut [u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let room = response::MAX_RESPONSE_HEAD_BYTES.min(self.plan.slot_bytes);
        // Parse only when the new bytes may end the head (or the room is full): a head that
        // trickles in costs linear time.
        let parsed = if filled >= room
            || self.chunked.is_some()
            || response::head_may_end(&slot[..filled], scanned)
        {
            response::parse(&slot[..filled])
        } else {
            Ok(None)
        };
        let head = match parsed {
            Err(e) => return self.fail(FetchError::Head(e), out),
            Ok(None) => {
                if filled >= room {
                    return self.fail(FetchError::Head(HeadError::TooLarge), out);
                }
                self.stage = Stage::Head { filled };
                out.push(Output::Io(Io::Recv {
                    offset: filled,
                    len: room - filled,
                }));
                return;
            }
            Ok(Some(h)) => h,
        };
        let mut head = head;
        if let Some((len, _)) = self.chunked {
            // Dechunked in place: the body that follows is `len` bytes.
            head.framing = response::Framing::Length(len);
        } else if head.framing == response::Framing::Chunked && !head.other_codings {
            let head_len = head.head_len;
            return self.chunked_body(filled, head_len, slot, now_ms, out);
        }
        let expect = Expect {
            range: Some(self.plan.range()),
            size: self.plan.size,
            etag: self.plan.etag.as_deref(),
            last_modified: self.plan.last_modified.as_deref(),
            // A fill's first fetch takes any answer to hand it over, but an origin that asks
            // the edge to wait (429/503 with Retry-After) is waited for.
            any_status: self.plan.size.is_none()
                && (self.plan.storing == Storing::Not
                    || (self.plan.hand_over
                        && !(matches!(head.status, 429 | 503) && head.retry_after.is_some()))),
        };
        let keep = |v: Option<&str>| {
            v.filter(|s| s.len() <= MAX_HEAD_FIELD_BYTES)
                .map(str::to_owned)
        };
        let mut other_status = false;
        let (size, first, whole) = match response::judge(&head, &expect) {
            Verdict::Range { first, total, .. } => (total, first, false),
            Verdict::Whole { size } => (size, 0, true),
            Verdict::Answer { size, .. } => {
                other_status = true;
                (size, 0, true)
            }
            Verdict::NotModified => {
                // Its fields renew the stored ones (RFC 9111 §4.3.4): told before the end.
                out.push(Output::Head(HeadFacts {
                    size: self.plan.size.unwrap_or(0),
                    etag: keep(head.etag),
                    last_modified: keep(head.last_modified),
                    content_type: keep(head.content_type),
                    whole: false,
                    status: 304,
                    fields: Box::new(super::contract::HeadFields::collect(&slot[..head.head_len])),
                    handed: None,
                    selecting: String::new(),
                    request_lines: String::new(),
                }));
                return self.fail(FetchError::NotModified, out);
            }
            Verdict::VersionChanged => return self.fail(FetchError::VersionChanged, out),
            Verdict::Unusable(u) => return self.fail(FetchError::Unusable(u), out),
        };
        let fields = Box::new(super::contract::HeadFields::collect(&slot[..head.head_len]));
        // Another status is kept only as its contract allows, and only when it fits one
        // block (its body is a page, not an object to fetch in pieces).
        let other_kept = other_status
            && size <= u64::from(self.plan.block_bytes)
            && super::contract::Contract::storable_status(
                &fields,
                head.status,
                head.last_modified.is_some(),
            );
        let refused = match self.plan.storing {
            Storing::Not => Ok(()),
            _ if other_status && !other_kept => Err(super::contract::NotStored::Status),
            Storing::Contract => super::contract::Contract::storable_fields(&fields),
            Storing::Override => super::contract::Contract::shareable_fields(&fields),
        };
        let mut handed = None;
        match refused {
            Err(why) if self.plan.hand_over => {
                // One client's from here: nothing of it reaches the data file.
                self.plan.storing = Storing::Not;
                handed = Some(why);
            }
            Err(why) => return self.fail(FetchError::NotStored(why), out),
            Ok(()) => {}
        }
        if size.div_ceil(u64::from(self.plan.block_bytes))
            > crate::cache::journal::MAX_BLOCKS_PER_OBJECT
        {
            // The cache could not record it (`ObjectVersion::validate`): refused at the head,
            // before a byte is written.
            return self.fail(FetchError::Unusable(Unusable::Uncacheable), out);
        }
        let facts = HeadFacts {
            size,
            etag: keep(head.etag),
            last_modified: keep(head.last_modified),
            content_type: keep(head.content_type),
            whole,
            status: head.status,
            fields,
            handed,
            selecting: String::new(),
            request_lines: String::new(),
        };
        let body_len = head.content_length().expect("judge checked the length");
        let head_len = head.head_len;
        self.keep_alive = head.keep_alive;
        if let Some((_, trailing @ 1..)) = self.chunked {
            // Bytes past the chunked message's end came with it: never read as a reply.
            out.push(Output::Poisoned { bytes: trailing });
            self.keep_alive = false;
        }
        let mut extra = filled - head_len;
        if extra as u64 > body_len {
            // Bytes past the reply's end came with it: the reply keeps its own, the
            // connection is never read from again.
            out.push(Output::Poisoned {
                bytes: extra - body_len as usize,
            });
            self.keep_alive = false;
            extra = body_len as usize;
        }
        if whole {
            // Every block follows, from the first.
            self.plan.first_block = 0;
            self.plan.last_block = u32::try_from(
                size.div_ceil(u64::from(self.plan.block_bytes))
                    .saturating_sub(1),
            )
            .unwrap_or(u32::MAX);
        }
        self.size = size;
        self.plan.size = Some(size);
        if self.plan.etag.is_none() {
            self.plan.etag = facts.etag.clone();
        }
        out.push(Output::Head(facts));
        // The body's first bytes came with the head: move them to the slot's front (at most
        // one receive's worth, once per fetch).
        slot.copy_within(head_len..head_len + extra, 0);
        self.piece_start = first;
        self.piece_filled = extra;
        self.body_left = body_len - extra as u64;
        self.block_crc = 0;
        if size == 0 || body_len == 0 {
            return self.finish(out);
        }
        self.stage = Stage::Body;
        self.next(slot, now_ms, out);
    }

    /// A chunked reply (RFC 9112 §7.1): its body is received whole into the slot after its
    /// head (`filled` bytes so far), at most the slot's room; once its last chunk and
    /// trailer came it is dechunked in place and the head goes on as one with that length
    /// (`chunked`). A larger one is refused (`TooLarge`): a cached object needs its size
    /// before its first block is written.
    fn chunked_body(
        &mut self,
        filled: usize,
        head_len: usize,
        slot: &mut [u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let room = self.plan.slot_bytes;
        let mut len = 0;
        match response::walk_chunked(&slot[head_len..filled], |_, n| len += n) {
            Err(e) => self.fail(FetchError::Head(e), out),
            Ok(None) if filled >= room => self.fail(FetchError::Head(HeadError::TooLarge), out),
            Ok(None) => {
                self.stage = Stage::Chunked { filled, head_len };
                self.deadline_ms = Some(now_ms + self.timeouts.idle_ms);
                out.push(Output::Io(Io::Recv {
                    offset: filled,
                    len: room - filled,
                }));
            }
            Ok(Some(message)) => {
                let mut body = Vec::with_capacity(len);
                let chunks = &slot[head_len..filled];
                let _ = response::walk_chunked(chunks, |at, n| {
                    body.extend_from_slice(&chunks[at..at + n]);
                });
                slot[head_len..head_len + len].copy_from_slice(&body);
                self.chunked = Some((len as u64, filled - head_len - message));
                self.head_in(0, head_len + len, slot, now_ms, out);
            }
        }
    }

    /// Where the current block ends (the object's end for the last one).
    /// Where the run ends: its last block's end (the object's end for the last block).
    fn run_end(&self) -> u64 {
        let b = u64::from(self.plan.block_bytes);
        ((u64::from(self.plan.last_block) + 1) * b).min(self.size)
    }

    /// Bytes the current piece holds when full: a whole slot, or what is left of the run.
    /// Pieces start on block or slot boundaries (both powers of two, one divides the other),
    /// so a piece holds whole blocks, or lies inside one.
    fn piece_len(&self) -> usize {
        (self.run_end() - self.piece_start).min(self.plan.slot_bytes as u64) as usize
    }

    /// After bytes arrived: write a full piece, or receive more.
    fn next(&mut self, slot: &mut [u8], now_ms: u64, out: &mut Vec<Output>) {
        let want = self.piece_len();
        if self.piece_filled > want {
            // A 206 body is exactly the run, a 200 exactly the object: more is a broken origin.
            return self.fail(FetchError::Overrun, out);
        }
        if self.piece_filled < want {
            if self.body_left == 0 {
                return self.fail(FetchError::Connection(0), out);
            }
            self.stage = Stage::Body;
            self.deadline_ms = Some(now_ms + self.timeouts.idle_ms);
            let room = (want - self.piece_filled).min(self.body_left as usize);
            out.push(Output::Io(Io::Recv {
                offset: self.piece_filled,
                len: room,
            }));
            return;
        }
        // Each block's CRC runs over its pieces; a block that ends in this piece is complete
        // once the piece's write is.
        let b = u64::from(self.plan.block_bytes);
        let mut at = self.piece_start;
        let end = self.piece_start + want as u64;
        while at < end {
            let block_end = ((at / b + 1) * b).min(self.size);
            let seg_end = block_end.min(end);
            let (from, to) = (
                (at - self.piece_start) as usize,
                (seg_end - self.piece_start) as usize,
            );
            self.block_crc = crate::cache::checksum_append(self.block_crc, &slot[from..to]);
            if seg_end == block_end {
                self.piece_blocks.push(((at / b) as u32, self.block_crc));
                self.block_crc = 0;
            }
            at = seg_end;
        }
        let len = want.next_multiple_of(self.plan.align_bytes);
        slot[want..len].fill(0);
        self.stage = Stage::Writing;
        self.deadline_ms = None;
        out.push(Output::Io(Io::Write {
            len,
            file_offset: self.piece_start,
        }));
    }

    /// A write of the current piece completed with `res`.
    pub fn on_written(&mut self, res: i32, slot: &mut [u8], now_ms: u64, out: &mut Vec<Output>) {
        assert_eq!(self.stage, Stage::Writing);
        let want = self.piece_len();
        if res < 0 || (res as usize) < want {
            // A short write of a regular file is the kernel writing what fit on the disk
            // (the next write would be refused with ENOSPC).
            return self.fail(
                FetchError::Disk(if res < 0 { -res } else { libc::ENOSPC }),
                out,
            );
        }
        self.piece_start += want as u64;
        self.piece_filled = 0;
        if !self.piece_blocks.is_empty() {
            let last = self.piece_blocks.last().map_or(0, |&(block, _)| block);
            self.unsynced.append(&mut self.piece_blocks);
            let run_done = self.piece_start >= self.size || last >= self.plan.last_block;
            if run_done
                || !self.synced_once
                || self.unsynced.len() >= self.plan.sync_every_blocks as usize
            {
                self.stage = Stage::Syncing;
                out.push(Output::Io(Io::Sync));
                return;
            }
        }
        self.next(slot, now_ms, out);
    }

    /// The sync after blocks were written completed with `res`: they are committed, in order.
    pub fn on_synced(&mut self, res: i32, slot: &mut [u8], now_ms: u64, out: &mut Vec<Output>) {
        assert_eq!(self.stage, Stage::Syncing);
        if res < 0 {
            return self.fail(FetchError::Disk(-res), out);
        }
        self.synced_once = true;
        let mut last = 0;
        for (block, crc) in self.unsynced.drain(..) {
            out.push(Output::Committed { block, crc });
            last = block;
        }
        if self.piece_start >= self.size || last >= self.plan.last_block {
            if self.body_left != 0 {
                return self.fail(FetchError::Overrun, out);
            }
            return self.finish(out);
        }
        self.next(slot, now_ms, out);
    }

    /// The clock passed the deadline: the fetch ends (the caller cancels what is in flight).
    pub fn on_timeout(&mut self, out: &mut Vec<Output>) {
        let stage = match self.stage {
            Stage::Connecting => "connect",
            Stage::Head { .. } => "first byte",
            Stage::Sending { .. } | Stage::Chunked { .. } | Stage::Body => "idle",
            Stage::ProbingBeforeSend
            | Stage::ProbingAfterReply
            | Stage::Writing
            | Stage::Syncing
            | Stage::Ended => return,
        };
        self.fail(FetchError::Timeout(stage), out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::contract::NotStored;
    use super::*;

    const ALIGN: usize = 512;

    fn plan(first: u32, last: u32, block: u32, slot: usize, size: Option<u64>) -> Plan {
        Plan {
            first_block: first,
            last_block: last,
            block_bytes: block,
            size,
            etag: None,
            last_modified: None,
            revalidate: false,
            slot_bytes: slot,
            align_bytes: ALIGN,
            sync_every_blocks: 1,
            storing: Storing::Contract,
            hand_over: false,
        }
    }

    const T: Timeouts = Timeouts {
        connect_ms: 100,
        first_byte_ms: 200,
        idle_ms: 300,
    };

    fn object(size: usize) -> Vec<u8> {
        (0..size).map(|i| (i * 31 + i / 7) as u8).collect()
    }

    /// Plays the origin and the disk: answers with `answer` (head + body) in receives of at
    /// most `step` bytes, keeps every write in `disk`; returns the outputs other than Io.
    fn run(
        f: BlockFetch,
        pending: Vec<Output>,
        answer: &[u8],
        step: usize,
        disk: &mut Vec<u8>,
    ) -> Vec<Output> {
        run_cut(f, pending, answer, &mut |_| step, disk)
    }

    /// `run` with the `i`th receive (from 0) given at most `step(i)` bytes; a probe finds the
    /// answer's bytes not yet received (none before the request is sent).
    fn run_cut(
        mut f: BlockFetch,
        mut pending: Vec<Output>,
        answer: &[u8],
        step: &mut dyn FnMut(usize) -> usize,
        disk: &mut Vec<u8>,
    ) -> Vec<Output> {
        let mut slot = vec![0xeeu8; f.plan.slot_bytes];
        let mut seen = Vec::new();
        let mut sent_at = 0;
        let mut receives = 0;
        let mut requested = false;
        let mut now = 0;
        while let Some(o) = (!pending.is_empty()).then(|| pending.remove(0)) {
            now += 1;
            let mut out = Vec::new();
            match o {
                Output::Io(Io::Connect) => f.on_connected(0, 10, now, &mut out),
                Output::Io(Io::Send { len, .. }) => {
                    requested = true;
                    f.on_sent(len as i32, now, &mut out)
                }
                Output::Io(Io::Probe { offset, len }) => {
                    let n = len.min(answer.len() - sent_at);
                    if n == 0 || !requested {
                        f.on_probed(-libc::EAGAIN, now, &mut out);
                    } else {
                        slot[offset..offset + n].copy_from_slice(&answer[sent_at..sent_at + n]);
                        sent_at += n;
                        f.on_probed(n as i32, now, &mut out);
                    }
                }
                Output::Io(Io::Recv { offset, len }) => {
                    let n = len.min(step(receives)).min(answer.len() - sent_at);
                    receives += 1;
                    slot[offset..offset + n].copy_from_slice(&answer[sent_at..sent_at + n]);
                    sent_at += n;
                    f.on_received(n as i32, &mut slot, now, &mut out);
                }
                Output::Io(Io::Write { len, file_offset }) => {
                    assert_eq!(len % ALIGN, 0, "an unaligned write");
                    assert_eq!(file_offset % ALIGN as u64, 0, "an unaligned offset");
                    let end = file_offset as usize + len;
                    if disk.len() < end {
                        disk.resize(end, 0);
                    }
                    disk[file_offset as usize..end].copy_from_slice(&slot[..len]);
                    f.on_written(len as i32, &mut slot, now, &mut out);
                }
                Output::Io(Io::Sync) => f.on_synced(0, &mut slot, now, &mut out),
                other => seen.push(other),
            }
            pending.extend(out);
        }
        assert!(f.ended());
        seen
    }

    fn ranged(body: &[u8], first: u64, total: u64) -> Vec<u8> {
        let mut a = format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\nETag: \"v1\"\r\nContent-Type: application/octet-stream\r\n\r\n",
            body.len(),
            first,
            first + body.len() as u64 - 1,
            total
        )
        .into_bytes();
        a.extend_from_slice(body);
        a
    }

    #[test]
    fn a_run_of_blocks_lands_on_disk_block_by_block_with_their_checksums() {
        let obj = object(10_000);
        let (block, slot) = (4096u32, 2048usize);
        for step in [1, 7, 100, 2048, 100_000] {
            let mut out = Vec::new();
            let f = BlockFetch::start(plan(0, 2, block, slot, None), T, false, 10, 0, &mut out);
            let mut disk = Vec::new();
            let seen = run(f, out, &ranged(&obj, 0, 10_000), step, &mut disk);
            let Output::Head(h) = &seen[0] else {
                panic!("{seen:?}")
            };
            assert_eq!(h.size, 10_000);
            assert_eq!(h.etag.as_deref(), Some("\"v1\""));
            let commits: Vec<_> = seen
                .iter()
                .filter_map(|o| match o {
                    Output::Committed { block, crc } => Some((*block, *crc)),
                    _ => None,
                })
                .collect();
            let want: Vec<_> = obj
                .chunks(block as usize)
                .enumerate()
                .map(|(i, c)| (i as u32, crate::cache::checksum(c)))
                .collect();
            assert_eq!(commits, want, "step {step}");
            assert_eq!(&disk[..10_000], &obj[..], "step {step}");
            assert!(disk[10_000..].iter().all(|&b| b == 0), "the tail is padded");
            assert_eq!(seen.last(), Some(&Output::Done { keep_alive: true }));
        }
    }

    #[test]
    fn a_first_fetch_hands_over_what_the_cache_may_not_keep_and_refuses_it_otherwise() {
        let obj = object(3000);
        let private = |mut a: Vec<u8>| {
            let at = a.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 2;
            a.splice(at..at, b"Cache-Control: private\r\n".iter().copied());
            a
        };
        let redirect =
            b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 5\r\n\r\nmoved"
                .to_vec();
        let cases = [
            (
                private(ranged(&obj, 0, 3000)),
                NotStored::Private,
                FetchError::NotStored(NotStored::Private),
                206,
                obj.clone(),
            ),
            (
                redirect,
                NotStored::Status,
                FetchError::Unusable(Unusable::Status(302)),
                302,
                b"moved".to_vec(),
            ),
        ];
        for (answer, why, refused, status, body) in cases {
            for hand_over in [false, true] {
                let mut p = plan(0, 0, 4096, 4096, None);
                p.hand_over = hand_over;
                let mut out = Vec::new();
                let f = BlockFetch::start(p, T, false, 10, 0, &mut out);
                let mut disk = Vec::new();
                let seen = run(f, out, &answer, 700, &mut disk);
                if !hand_over {
                    assert_eq!(
                        seen,
                        vec![Output::Failed(refused.clone())],
                        "refused at the head, nothing written"
                    );
                    assert!(disk.is_empty());
                    continue;
                }
                let Output::Head(h) = &seen[0] else {
                    panic!("{seen:?}")
                };
                assert_eq!((h.handed, h.status), (Some(why), status));
                // The body goes on, as a pass-through's pieces (the caller delivers them).
                assert_eq!(&disk[..body.len()], &body[..]);
                assert!(
                    !seen.iter().any(|o| matches!(o, Output::Failed(_))),
                    "{seen:?}"
                );
            }
        }
    }

    #[test]
    fn a_chunked_reply_that_fits_the_slot_is_dechunked_and_stored_whole() {
        let obj = object(3000);
        let mut answer =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: \"c\"\r\n\r\n".to_vec();
        for piece in obj.chunks(700) {
            answer.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            answer.extend_from_slice(piece);
            answer.extend_from_slice(b"\r\n");
        }
        answer.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 13, 700, 100_000] {
            let mut out = Vec::new();
            let f = BlockFetch::start(plan(0, 0, 4096, 4096, None), T, false, 10, 0, &mut out);
            let mut disk = Vec::new();
            let seen = run(f, out, &answer, step, &mut disk);
            let Output::Head(h) = &seen[0] else {
                panic!("{seen:?}")
            };
            assert_eq!((h.size, h.whole), (3000, true), "step {step}");
            assert_eq!(&disk[..3000], &obj[..], "step {step}");
            assert_eq!(
                seen.last(),
                Some(&Output::Done { keep_alive: true }),
                "step {step}"
            );
        }
        // Past the slot's room it is refused, never cut.
        let mut out = Vec::new();
        let f = BlockFetch::start(plan(0, 0, 4096, 2048, None), T, false, 10, 0, &mut out);
        let seen = run(f, out, &answer, 700, &mut Vec::new());
        assert_eq!(
            seen,
            vec![Output::Failed(FetchError::Head(HeadError::TooLarge))]
        );
    }

    #[test]
    fn blocks_after_the_first_share_a_sync_and_are_committed_only_after_it() {
        let obj = object(5 * 4096 + 7);
        let mut p = plan(0, 5, 4096, 4096, None);
        p.sync_every_blocks = 2;
        let mut out = Vec::new();
        let f = BlockFetch::start(p, T, false, 10, 0, &mut out);
        let mut disk = Vec::new();
        let seen = run(f, out, &ranged(&obj, 0, obj.len() as u64), 4096, &mut disk);
        let commits: Vec<u32> = seen
            .iter()
            .filter_map(|o| match o {
                Output::Committed { block, .. } => Some(*block),
                _ => None,
            })
            .collect();
        assert_eq!(commits, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(&disk[..obj.len()], &obj[..]);
        // A body cut after block 2 (written, not yet synced with block 1) commits block 0
        // (synced alone) and nothing written after the last sync.
        let mut a = ranged(&obj, 0, obj.len() as u64);
        let head = a.len() - obj.len();
        a.truncate(head + 3 * 4096 + 100);
        let mut p = plan(0, 5, 4096, 4096, None);
        p.sync_every_blocks = 4;
        let mut out = Vec::new();
        let f = BlockFetch::start(p, T, false, 10, 0, &mut out);
        let seen = run(f, out, &a, 4096, &mut Vec::new());
        let commits = seen
            .iter()
            .filter(|o| matches!(o, Output::Committed { .. }))
            .count();
        assert_eq!(commits, 1, "{seen:?}");
    }

    #[test]
    fn a_run_in_the_middle_writes_at_its_offsets() {
        let obj = object(20_000);
        let mut out = Vec::new();
        let f = BlockFetch::start(
            plan(1, 2, 4096, 4096, Some(20_000)),
            T,
            true,
            10,
            0,
            &mut out,
        );
        assert_eq!(
            out,
            vec![Output::Io(Io::Probe {
                offset: 10,
                len: 4086
            })],
            "a kept-alive connection is probed first"
        );
        let mut disk = Vec::new();
        let seen = run(
            f,
            out,
            &ranged(&obj[4096..12288], 4096, 20_000),
            999,
            &mut disk,
        );
        assert_eq!(&disk[4096..12288], &obj[4096..12288]);
        assert_eq!(
            seen.iter()
                .filter(|o| matches!(o, Output::Committed { .. }))
                .count(),
            2
        );
    }

    #[test]
    fn a_200_to_the_range_is_used_as_the_whole_object() {
        let obj = object(9000);
        let mut a = b"HTTP/1.1 200 OK\r\nContent-Length: 9000\r\n\r\n".to_vec();
        a.extend_from_slice(&obj);
        let mut out = Vec::new();
        let f = BlockFetch::start(plan(1, 1, 4096, 4096, None), T, false, 10, 0, &mut out);
        let mut disk = Vec::new();
        let seen = run(f, out, &a, 1500, &mut disk);
        assert!(matches!(&seen[0], Output::Head(h) if h.whole && h.size == 9000));
        let blocks: Vec<u32> = seen
            .iter()
            .filter_map(|o| match o {
                Output::Committed { block, .. } => Some(*block),
                _ => None,
            })
            .collect();
        assert_eq!(blocks, vec![0, 1, 2]);
        assert_eq!(&disk[..9000], &obj[..]);
    }

    #[test]
    fn a_short_body_fails_and_commits_only_whole_blocks() {
        let obj = object(10_000);
        let mut a = ranged(&obj, 0, 10_000);
        a.truncate(a.len() - 3000); // the origin closes mid-block 1
        let mut out = Vec::new();
        let f = BlockFetch::start(plan(0, 2, 4096, 2048, None), T, false, 10, 0, &mut out);
        let mut disk = Vec::new();
        let seen = run(f, out, &a, 1000, &mut disk);
        let commits = seen
            .iter()
            .filter(|o| matches!(o, Output::Committed { .. }))
            .count();
        assert_eq!(commits, 1, "{seen:?}");
        assert_eq!(
            seen.last(),
            Some(&Output::Failed(FetchError::Connection(0)))
        );
    }

    #[test]
    fn answers_of_another_version_or_unusable_ones_fail_before_any_write() {
        let obj = object(5000);
        let cases: Vec<(Vec<u8>, Plan, FetchError)> = vec![
            (
                ranged(&obj[..4096], 0, 6000),
                plan(0, 0, 4096, 4096, Some(5000)),
                FetchError::VersionChanged,
            ),
            (
                b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n".to_vec(),
                plan(0, 0, 4096, 4096, None),
                FetchError::Unusable(Unusable::Status(503)),
            ),
            (
                // A transfer coding besides chunked: its bytes are not the object's.
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec(),
                plan(0, 0, 4096, 4096, None),
                FetchError::Unusable(Unusable::NoLength),
            ),
            (
                b"garbage\r\n\r\n".to_vec(),
                plan(0, 0, 4096, 4096, None),
                FetchError::Head(HeadError::Malformed),
            ),
        ];
        for (answer, p, want) in cases {
            let mut out = Vec::new();
            let f = BlockFetch::start(p, T, false, 10, 0, &mut out);
            let mut disk = Vec::new();
            let seen = run(f, out, &answer, 4096, &mut disk);
            assert_eq!(seen, vec![Output::Failed(want)]);
            assert!(disk.is_empty());
        }
    }

    /// Bytes past a whole reply, however the receives split them (with the head, with the
    /// body's last bytes, or after): the reply keeps its bytes, the connection is poisoned
    /// and never kept (issue 45's first case).
    #[test]
    fn bytes_past_the_reply_poison_the_connection_but_never_the_reply() {
        let obj = object(10_000);
        let mut a = ranged(&obj, 0, 10_000);
        let reply_len = a.len();
        a.extend_from_slice(
            b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nETag: \"evil\"\r\n\r\nPOISONPOISONPOIS",
        );
        for cut in 1..=a.len() {
            let mut out = Vec::new();
            let f = BlockFetch::start(plan(0, 2, 4096, 16384, None), T, false, 10, 0, &mut out);
            let mut disk = Vec::new();
            let seen = run_cut(
                f,
                out,
                &a,
                &mut |i| if i == 0 { cut } else { usize::MAX },
                &mut disk,
            );
            assert_eq!(&disk[..10_000], &obj[..], "cut {cut}");
            let commits = seen
                .iter()
                .filter(|o| matches!(o, Output::Committed { .. }))
                .count();
            assert_eq!(commits, 3, "cut {cut}");
            let poisoned: usize = seen
                .iter()
                .filter_map(|o| match o {
                    Output::Poisoned { bytes } => Some(*bytes),
                    _ => None,
                })
                .sum();
            assert!(poisoned > 0 && poisoned <= a.len() - reply_len, "cut {cut}");
            assert_eq!(
                seen.last(),
                Some(&Output::Done { keep_alive: false }),
                "cut {cut}"
            );
        }
    }

    /// A kept-alive connection is probed before the request: bytes there are not an answer
    /// to it (the fetch goes again on a new connection, as after an origin's close).
    #[test]
    fn a_reused_connection_is_probed_before_its_request() {
        let start = |out: &mut Vec<Output>| {
            let f = BlockFetch::start(plan(0, 0, 4096, 4096, None), T, true, 10, 0, out);
            assert_eq!(
                out.as_slice(),
                &[Output::Io(Io::Probe {
                    offset: 10,
                    len: 4086
                })]
            );
            out.clear();
            f
        };
        let mut out = Vec::new();
        let mut f = start(&mut out);
        f.on_probed(-libc::EAGAIN, 1, &mut out);
        assert_eq!(out, vec![Output::Io(Io::Send { offset: 0, len: 10 })]);
        out.clear();
        for (res, want) in [
            (
                16,
                vec![
                    Output::Poisoned { bytes: 16 },
                    Output::Failed(FetchError::Stale),
                ],
            ),
            (0, vec![Output::Failed(FetchError::Stale)]),
            (-libc::ECONNRESET, vec![Output::Failed(FetchError::Stale)]),
        ] {
            let mut f = start(&mut out);
            f.on_probed(res, 1, &mut out);
            assert_eq!(out, want, "probe answered {res}");
            assert!(f.ended());
            out.clear();
        }
        // A clean reply is probed before the connection goes idle.
        let obj = object(4096);
        let mut out = Vec::new();
        let f = BlockFetch::start(plan(0, 0, 4096, 8192, None), T, true, 10, 0, &mut out);
        let seen = run(f, out, &ranged(&obj, 0, 4096), 100_000, &mut Vec::new());
        assert_eq!(seen.last(), Some(&Output::Done { keep_alive: true }));
    }

    /// Each hostile reply of issue 45, fed in every split of its first receive: the same
    /// decision whatever the segmentation, nothing written for a refused head, and the
    /// interim replies skipped.
    #[test]
    fn hostile_replies_get_one_decision_at_every_split() {
        let obj = object(1000);
        let ok_head = |fields: &str| {
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-999/1000\r\n{fields}\r\n"
            )
        };
        let with_body = |head: String| {
            let mut a = head.into_bytes();
            a.extend_from_slice(&obj);
            a
        };
        let refused = |e: HeadError| Some(FetchError::Head(e));
        let cases: Vec<(Vec<u8>, Option<FetchError>)> = vec![
            (
                with_body(ok_head(
                    "Transfer-Encoding: identity\r\nContent-Length: 1000\r\n",
                )),
                refused(HeadError::LengthAndTransferEncoding),
            ),
            (
                with_body(ok_head(
                    "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\
                     Content-Length: 1000\r\n",
                )),
                refused(HeadError::LengthAndTransferEncoding),
            ),
            (
                with_body(ok_head(
                    "Content-Range: bytes 1000-1999/2000\r\nContent-Length: 1000\r\n",
                )),
                refused(HeadError::BadContentRange),
            ),
            (
                with_body(ok_head("Content-Length: +1000\r\n")),
                refused(HeadError::BadLength),
            ),
            (
                with_body(format!(
                    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\
                     Link: </x>\r\n\r\n{}",
                    ok_head("Content-Length: 1000\r\n")
                )),
                None,
            ),
        ];
        for (answer, want) in cases {
            for cut in 1..=answer.len() {
                let mut out = Vec::new();
                let f = BlockFetch::start(plan(0, 0, 1024, 4096, None), T, false, 10, 0, &mut out);
                let mut disk = Vec::new();
                let seen = run_cut(
                    f,
                    out,
                    &answer,
                    &mut |i| if i == 0 { cut } else { usize::MAX },
                    &mut disk,
                );
                let text = String::from_utf8_lossy(&answer[..80]);
                match &want {
                    Some(e) => {
                        assert_eq!(seen, vec![Output::Failed(e.clone())], "{text:?} cut {cut}");
                        assert!(disk.is_empty());
                    }
                    None => {
                        assert_eq!(&disk[..1000], &obj[..], "{text:?} cut {cut}");
                        assert_eq!(seen.last(), Some(&Output::Done { keep_alive: true }));
                    }
                }
            }
        }
    }

    #[test]
    fn a_reused_connection_closed_before_the_answer_is_stale() {
        let mut out = Vec::new();
        let mut f = BlockFetch::start(plan(0, 0, 4096, 4096, None), T, true, 10, 0, &mut out);
        out.clear();
        f.on_probed(-libc::EAGAIN, 1, &mut out);
        out.clear();
        f.on_sent(10, 1, &mut out);
        out.clear();
        let mut slot = vec![0; 4096];
        f.on_received(0, &mut slot, 2, &mut out);
        assert_eq!(out, vec![Output::Failed(FetchError::Stale)]);
    }

    #[test]
    fn each_stage_has_its_deadline() {
        let mut out = Vec::new();
        let mut f = BlockFetch::start(plan(0, 0, 4096, 4096, None), T, false, 10, 1000, &mut out);
        assert_eq!(f.deadline_ms(), Some(1100));
        out.clear();
        f.on_connected(0, 10, 1050, &mut out);
        assert_eq!(f.deadline_ms(), Some(1350));
        f.on_sent(10, 1060, &mut out);
        assert_eq!(f.deadline_ms(), Some(1260));
        out.clear();
        f.on_timeout(&mut out);
        assert_eq!(out, vec![Output::Failed(FetchError::Timeout("first byte"))]);
        assert!(f.ended());
    }

    #[test]
    fn a_refused_connect_fails() {
        let mut out = Vec::new();
        let mut f = BlockFetch::start(plan(0, 0, 4096, 4096, None), T, false, 10, 0, &mut out);
        out.clear();
        f.on_connected(libc::ECONNREFUSED, 10, 1, &mut out);
        assert_eq!(
            out,
            vec![Output::Failed(FetchError::Connect(libc::ECONNREFUSED))]
        );
    }
}
