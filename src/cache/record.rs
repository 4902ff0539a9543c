//! The cache's records, as the journal frames them and replay reads them back: one version
//! of an object (`ObjectVersion`), a block on disk, a drop, a refresh. `ObjectVersion::validate`
//! is the one rule the writer and replay share. The index applies records; the journal
//! frames and replays them.

/// Bytes of a record's frame before its kind (length and checksum).
pub const FRAME_BYTES: usize = 8;
/// Longest record body (a key and its validators, with room).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;
/// Longest cache key (the origin's name and the path).
pub const MAX_KEY_BYTES: usize = 4096;
/// Longest validator (ETag or Last-Modified) or content type kept.
pub const MAX_FIELD_BYTES: usize = 512;
use super::tags::{Tags, MAX_TAGS_BYTES};

// A version's record (key, validators, header lines, tags, and room for the fixed fields)
// fits the record bound.
const _: () = assert!(
    MAX_KEY_BYTES + 3 * MAX_FIELD_BYTES + MAX_STORED_HEADER_BYTES + MAX_TAGS_BYTES + 256
        <= MAX_RECORD_BYTES
);
pub use crate::config::{MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};
/// Longest header block kept with a version and replayed on every response from the cache
/// (the lines, CRLFs included); a field that would go past it is left out.
pub const MAX_STORED_HEADER_BYTES: usize = 2048;
/// Most blocks one object may have (a 16 TiB object at 1 MiB blocks).
pub const MAX_BLOCKS_PER_OBJECT: u64 = 1 << 24;

/// Content types a version the index holds keeps as one byte (`ObjectView::compact`):
/// nearly every object of a game's depot or patch is one of these. Memory only, never
/// journaled, so the list may change from one release to the next (at most 255).
const SHORT_CONTENT_TYPES: [&str; 8] = [
    "application/octet-stream",
    "application/json",
    "application/xml",
    "application/zip",
    "application/gzip",
    "text/plain",
    "text/html",
    "text/xml",
];

// A short type is its index plus one in a byte (0: the type follows in full).
const _: () = assert!(SHORT_CONTENT_TYPES.len() < u8::MAX as usize);

/// `ObjectView::compact`'s first flag byte: bits 0-3 say which freshness numbers follow
/// (lifetime, initial age, stale-while-revalidate, stale-if-error), then these.
const HELD_NO_CACHE: u8 = 1 << 4;
const HELD_MUST_REVALIDATE: u8 = 1 << 5;
const HELD_HEADERS: u8 = 1 << 6;
/// A second flag byte follows, of these.
const HELD_MORE: u8 = 1 << 7;
const HELD_STATUS: u8 = 1;
const HELD_SELECTING: u8 = 2;
const HELD_TAGS: u8 = 4;

/// Record kinds, the byte after the frame.
pub(crate) const KIND_OBJECT: u8 = 1;
pub(crate) const KIND_BLOCK: u8 = 2;
pub(crate) const KIND_DROP: u8 = 3;
pub(crate) const KIND_FRESH: u8 = 4;
pub(crate) const KIND_BLOCKS: u8 = 5;

/// Most checksums one `Record::Blocks` holds: inline, so a run costs no allocation.
pub const BLOCK_RUN_MAX: usize = 16;

/// Why a record may not be journaled (the writer) or is refused (replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// A key of this many bytes (0, or over `MAX_KEY_BYTES`).
    KeyLength(usize),
    /// A validator or content type of this many bytes (over `MAX_FIELD_BYTES`), or stored
    /// header lines over `MAX_STORED_HEADER_BYTES` or not lines of header fields.
    FieldLength(usize),
    /// A block size that is not a power of two in `MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES`.
    BlockBytes(u32),
    /// More blocks than `MAX_BLOCKS_PER_OBJECT`.
    Blocks(u64),
    /// A stored status other than 200 that the cache never keeps (`is_storable_status`).
    Status(u16),
    /// An unknown record kind, or fields that do not parse.
    Malformed,
}

/// Whether a version may hold the origin's `status`: 200 (a 206 is stored as the object's
/// 200), or another final status the origin's contract let the cache keep (RFC 9111 §3),
/// but never a 206 or 304 (they answer a request, not stand for the object).
pub fn is_storable_status(status: u16) -> bool {
    (200..=599).contains(&status) && status != 206 && status != 304
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::KeyLength(n) => write!(f, "a key of {n} bytes (1 to {MAX_KEY_BYTES})"),
            Invalid::FieldLength(n) => {
                write!(f, "a field of {n} bytes (at most {MAX_FIELD_BYTES})")
            }
            Invalid::BlockBytes(n) => write!(f, "a block size of {n} bytes"),
            Invalid::Blocks(n) => write!(f, "{n} blocks (at most {MAX_BLOCKS_PER_OBJECT})"),
            Invalid::Status(s) => write!(f, "a stored status {s}"),
            Invalid::Malformed => f.write_str("a malformed record"),
        }
    }
}

/// One change to the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A version of a key begins (it supersedes the key's previous version).
    Object(ObjectVersion),
    /// A block of a version is on disk with this checksum.
    Block {
        /// The version's id.
        version: u64,
        /// Block number (byte offset / the version's block size).
        block: u32,
        /// CRC-32C of the block's bytes (the last block: of its bytes up to the object's end).
        crc: u32,
    },
    /// Blocks `first`, `first + 1`, ... of a version are on disk with these checksums: the
    /// block records of a run in one (`encode_batch` writes them so; replay applies each
    /// block as its own record).
    Blocks {
        /// The version's id.
        version: u64,
        /// The run's first block number.
        first: u32,
        /// The run's checksums, in block order.
        crcs: BlockRun,
    },
    /// A version is gone (evicted, or replaced and no longer read).
    Drop {
        /// The version's id.
        version: u64,
    },
    /// The origin confirmed a version (a 304, or the same validators) at this time: it is
    /// fresh for another `cache_revalidate_s`.
    Fresh {
        /// The version's id.
        version: u64,
        /// When it was confirmed (Unix seconds).
        fetched_unix_s: u64,
        /// What the confirming reply said (RFC 9111 §4.3.4: a 304 or a full reply updates
        /// the stored freshness and lines); None: unchanged (records from before issue 42).
        refresh: Option<Box<Refresh>>,
    },
}

/// The checksums of 1 to `BLOCK_RUN_MAX` consecutive blocks (`Record::Blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    len: u8,
    crcs: [u32; BLOCK_RUN_MAX],
}

impl BlockRun {
    /// A run of `crcs` (None: empty, or over `BLOCK_RUN_MAX`).
    pub fn new(crcs: &[u32]) -> Option<BlockRun> {
        if crcs.is_empty() || crcs.len() > BLOCK_RUN_MAX {
            return None;
        }
        let mut run = BlockRun {
            len: 0,
            crcs: [0; BLOCK_RUN_MAX],
        };
        for &crc in crcs {
            run.push(crc);
        }
        Some(run)
    }

    /// The checksums, in block order.
    pub fn as_slice(&self) -> &[u32] {
        &self.crcs[..usize::from(self.len)]
    }

    /// A run record's fields, read in place (replay's path: `Record::Blocks` without the
    /// move): its version, first block and checksums. What `Record::parse` would refuse is
    /// refused alike.
    pub fn read(body: &[u8]) -> Result<(u64, u32, BlockRun), Invalid> {
        read_whole(body, KIND_BLOCKS, Self::read_fields)
    }

    fn read_fields(r: &mut Reader<'_>) -> Option<(u64, u32, BlockRun)> {
        let (version, first, len) = (r.u64()?, r.u32()?, r.u8()?);
        if !run_fits(first, usize::from(len)) {
            return None;
        }
        let mut crcs = [0; BLOCK_RUN_MAX];
        for crc in &mut crcs[..usize::from(len)] {
            *crc = r.u32()?;
        }
        Some((version, first, BlockRun { len, crcs }))
    }

    /// Adds the next block's checksum; false when the run is full.
    fn push(&mut self, crc: u32) -> bool {
        let Some(slot) = self.crcs.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = crc;
        self.len += 1;
        true
    }

    /// Each block number from `first`, with its checksum.
    pub fn numbered(&self, first: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        // `validate` and `parse` keep `first + len - 1` within u32 (so the last may be
        // u32::MAX, where a `first..` range would overflow).
        let numbers = (0..u32::from(self.len)).map(move |i| first.wrapping_add(i));
        numbers.zip(self.as_slice().iter().copied())
    }
}

/// A version's contract as a revalidation renewed it (`Record::Fresh`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refresh {
    /// Its freshness now.
    pub freshness: Freshness,
    /// Its stored header lines now.
    pub headers: String,
}

/// What the front of a buffer holds, framed (`Record::frame`).
#[derive(Debug, PartialEq, Eq)]
pub enum Framed<'a> {
    /// A body whose length and checksum hold, and the bytes its frame took.
    Body(&'a [u8], usize),
    /// The buffer ends inside the frame (or is empty).
    Incomplete,
    /// A frame whose length or checksum is wrong.
    Corrupt,
}

/// What decoding the front of a buffer found.
// Returned by value once per record at replay and moved straight into the index: boxing the
// record would cost an allocation per record for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A record, and the bytes it took.
    Record(Record, usize),
    /// The buffer ends inside a record (or is empty).
    Incomplete,
    /// The bytes are not a valid record (damaged, or garbage after a torn write).
    Corrupt,
    /// A whole record that matches its checksum but holds what `Record::validate` refuses:
    /// skipped (the bytes it took), never a reason to stop.
    Refused(Invalid, usize),
}

impl Record {
    /// Bytes a block record takes in the journal, framed.
    pub const BLOCK_BYTES: u64 = (FRAME_BYTES + 1 + 8 + 4 + 4) as u64;

    /// Bytes a run record (`Record::Blocks`) takes in the journal, framed, besides its
    /// checksums' 4 each.
    pub const RUN_FIXED_BYTES: u64 = (FRAME_BYTES + 1 + 8 + 4 + 1) as u64;

    /// Bytes `o`'s object record takes in the journal, framed.
    pub fn object_bytes(o: &ObjectVersion) -> u64 {
        (FRAME_BYTES
            + 1
            + 2
            + o.key.len()
            + 8
            + 8
            + 4
            + 8
            + 6
            + o.etag.len()
            + o.last_modified.len()
            + o.content_type.len()
            + Freshness::BYTES
            + 2
            + o.headers.len()
            + 2
            + 2
            + o.selecting.len()
            + if o.tags.is_empty() {
                0
            } else {
                2 + o.tags.as_str().len()
            }) as u64
    }

    /// What a record may hold: the one rule the writer keeps before it journals a record and
    /// replay applies when it reads one back.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            Record::Object(o) => o.validate(),
            Record::Fresh {
                refresh: Some(r), ..
            } if r.headers.len() > MAX_STORED_HEADER_BYTES || !are_header_lines(&r.headers) => {
                Err(Invalid::FieldLength(r.headers.len()))
            }
            Record::Blocks { first, crcs, .. } if !run_fits(*first, crcs.as_slice().len()) => {
                Err(Invalid::Malformed)
            }
            Record::Block { .. }
            | Record::Blocks { .. }
            | Record::Drop { .. }
            | Record::Fresh { .. } => Ok(()),
        }
    }

    /// Appends the record, framed, to `out` (it must pass `validate`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert_eq!(
            self.validate(),
            Ok(()),
            "journaling a record replay refuses"
        );
        self.encode_unchecked(out);
    }

    /// `encode` without the check (tests plant refused records with it).
    pub(crate) fn encode_unchecked(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_BYTES]);
        match self {
            Record::Object(o) => o.encode_body(out),
            Record::Block {
                version,
                block,
                crc,
            } => {
                out.push(KIND_BLOCK);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&crc.to_le_bytes());
            }
            Record::Blocks {
                version,
                first,
                crcs,
            } => {
                out.push(KIND_BLOCKS);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&first.to_le_bytes());
                out.push(crcs.len);
                for crc in crcs.as_slice() {
                    out.extend_from_slice(&crc.to_le_bytes());
                }
            }
            Record::Drop { version } => {
                out.push(KIND_DROP);
                out.extend_from_slice(&version.to_le_bytes());
            }
            Record::Fresh {
                version,
                fetched_unix_s,
                refresh,
            } => {
                out.push(KIND_FRESH);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&fetched_unix_s.to_le_bytes());
                if let Some(r) = refresh {
                    r.freshness.encode(out);
                    put_bytes(out, r.headers.as_bytes());
                }
            }
        }
        let body = &out[start + FRAME_BYTES..];
        assert!(body.len() <= MAX_RECORD_BYTES, "a record over its bound");
        let len = body.len() as u32;
        let crc = super::checksum(body);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the record at the front of `buf`.
    pub fn decode(buf: &[u8]) -> Decoded {
        match Record::frame(buf) {
            Framed::Body(body, used) => match Record::parse(body) {
                Ok(r) => Decoded::Record(r, used),
                Err(why) => Decoded::Refused(why, used),
            },
            Framed::Incomplete => Decoded::Incomplete,
            Framed::Corrupt => Decoded::Corrupt,
        }
    }

    /// The frame at the front of `buf`: its body once its length and checksum hold.
    pub fn frame(buf: &[u8]) -> Framed<'_> {
        let Some(frame) = buf.get(..FRAME_BYTES) else {
            return Framed::Incomplete;
        };
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        if len == 0 || len > MAX_RECORD_BYTES {
            return Framed::Corrupt;
        }
        let Some(body) = buf.get(FRAME_BYTES..FRAME_BYTES + len) else {
            return Framed::Incomplete;
        };
        if super::checksum(body) != crc {
            return Framed::Corrupt;
        }
        Framed::Body(body, FRAME_BYTES + len)
    }

    /// The record a frame's body holds, if it parses and `validate` passes.
    pub fn parse(body: &[u8]) -> Result<Record, Invalid> {
        let r = parse_body(body).ok_or(Invalid::Malformed)?;
        r.validate()?;
        Ok(r)
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    assert!(
        b.len() <= usize::from(u16::MAX),
        "a field over its length prefix"
    );
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads fields off the front of a record body; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2)
            .map(|b| u16::from_le_bytes(b.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(u16::from_le_bytes(self.take(2)?.try_into().ok()?));
        self.take(n)
    }
    fn text(&mut self) -> Option<String> {
        self.str().map(str::to_string)
    }
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

/// An object record's fields, borrowed from its body (what replay checks) or from the index's
/// form of it (`ObjectView::compact`), with no allocation per string.
#[derive(Clone, Copy, Debug)]
pub struct ObjectView<'a> {
    /// The cache key.
    pub key: &'a [u8],
    /// The version's id.
    pub version: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its block size.
    pub block_bytes: u32,
    /// When it was fetched or last confirmed (Unix seconds).
    pub fetched_unix_s: u64,
    etag: &'a str,
    last_modified: &'a str,
    content_type: &'a str,
    /// Its freshness as its origin set it.
    pub freshness: Freshness,
    headers: &'a str,
    /// The origin's status.
    pub status: u16,
    selecting: &'a str,
    tags: &'a str,
}

impl<'a> ObjectView<'a> {
    /// The fields of an object record's body (its kind byte first); None when they do not
    /// parse, or something follows them.
    pub fn parse(body: &'a [u8]) -> Option<ObjectView<'a>> {
        let mut r = Reader(body);
        if r.u8()? != KIND_OBJECT {
            return None;
        }
        let view = Self::read(&mut r)?;
        r.0.is_empty().then_some(view)
    }

    fn read(r: &mut Reader<'a>) -> Option<ObjectView<'a>> {
        // Lengths are bounded by the record's; what a field may hold is `validate`'s.
        let key = r.bytes()?;
        let version = r.u64()?;
        let size = r.u64()?;
        let block_bytes = r.u32()?;
        let fetched_unix_s = r.u64()?;
        let (etag, last_modified, content_type) = (r.str()?, r.str()?, r.str()?);
        // Records journaled before the origin's contract was kept end here.
        let (freshness, headers) = if r.0.is_empty() {
            (Freshness::default(), "")
        } else {
            (Freshness::decode(r)?, r.str()?)
        };
        // Records journaled before non-2xx answers were stored end here: a 200.
        let status = if r.0.is_empty() { 200 } else { r.u16()? };
        // And before Vary replies were: none selects.
        let selecting = if r.0.is_empty() { "" } else { r.str()? };
        // Records journaled before purge by tag, or of untagged versions, end here; the
        // writer never writes an empty list (one encoding per record).
        let tags = if r.0.is_empty() {
            ""
        } else {
            let text = r.str()?;
            if text.is_empty() {
                return None;
            }
            text
        };
        Some(ObjectView {
            key,
            version,
            size,
            block_bytes,
            fetched_unix_s,
            etag,
            last_modified,
            content_type,
            freshness,
            headers,
            status,
            selecting,
            tags,
        })
    }

    /// The version in the form the index holds in memory, in an allocation of its length and
    /// `room_after` bytes more. It is its record's body (`encode_body`) without the kind
    /// byte and the version (the index keys it by the version), a common content type
    /// (`SHORT_CONTENT_TYPES`) as one byte, and what follows the content type as flags and
    /// only the fields that are not their default (`HELD_*`): most versions have no lines
    /// kept, no `Vary` and no tags, and give their freshness one number of the four.
    /// `parse_compact` reads it; `encode_compact_framed` writes the record back.
    pub fn compact(&self, room_after: usize) -> Vec<u8> {
        let short = SHORT_CONTENT_TYPES
            .iter()
            .position(|t| *t == self.content_type);
        let numbers = self.held_numbers();
        let (flags, more) = self.held_flags(&numbers);
        let len = 2
            + self.key.len()
            + 8
            + 4
            + 8
            + 2
            + self.etag.len()
            + 2
            + self.last_modified.len()
            + if short.is_some() {
                1
            } else {
                1 + 2 + self.content_type.len()
            }
            + 1
            + 4 * numbers.iter().flatten().count()
            + if flags & HELD_HEADERS != 0 {
                2 + self.headers.len()
            } else {
                0
            }
            + usize::from(more != 0)
            + if more & HELD_STATUS != 0 { 2 } else { 0 }
            + if more & HELD_SELECTING != 0 {
                2 + self.selecting.len()
            } else {
                0
            }
            + if more & HELD_TAGS != 0 {
                2 + self.tags.len()
            } else {
                0
            };
        // Exactly its length: an allocator keeps a shrunk block in its size class.
        let mut out = Vec::with_capacity(len + room_after);
        put_bytes(&mut out, self.key);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.fetched_unix_s.to_le_bytes());
        put_bytes(&mut out, self.etag.as_bytes());
        put_bytes(&mut out, self.last_modified.as_bytes());
        match short {
            Some(i) => out.push(i as u8 + 1),
            None => {
                out.push(0);
                put_bytes(&mut out, self.content_type.as_bytes());
            }
        }
        out.push(flags);
        for n in numbers.iter().flatten() {
            out.extend_from_slice(&n.to_le_bytes());
        }
        if flags & HELD_HEADERS != 0 {
            put_bytes(&mut out, self.headers.as_bytes());
        }
        if more != 0 {
            out.push(more);
        }
        if more & HELD_STATUS != 0 {
            out.extend_from_slice(&self.status.to_le_bytes());
        }
        if more & HELD_SELECTING != 0 {
            put_bytes(&mut out, self.selecting.as_bytes());
        }
        if more & HELD_TAGS != 0 {
            put_bytes(&mut out, self.tags.as_bytes());
        }
        debug_assert_eq!(out.len(), len);
        out
    }

    /// The freshness numbers a record keeps (lifetime, initial age, the two stale windows),
    /// each as the record writes it (clamped as `Freshness::encode` clamps, so the index
    /// and a replay of its record agree), None where it is the default.
    fn held_numbers(&self) -> [Option<u32>; 4] {
        let f = &self.freshness;
        let clamp = |w: Option<u32>| w.map(|s| s.min(Freshness::NO_LIFETIME - 1));
        [
            clamp(f.lifetime_s),
            (f.initial_age_s != 0).then_some(f.initial_age_s),
            clamp(f.stale_while_revalidate_s),
            clamp(f.stale_if_error_s),
        ]
    }

    /// `compact`'s two flag bytes: which fields follow the content type.
    fn held_flags(&self, numbers: &[Option<u32>; 4]) -> (u8, u8) {
        let mut flags = 0;
        for (i, n) in numbers.iter().enumerate() {
            flags |= u8::from(n.is_some()) << i;
        }
        flags |= u8::from(self.freshness.no_cache) * HELD_NO_CACHE;
        flags |= u8::from(self.freshness.must_revalidate) * HELD_MUST_REVALIDATE;
        flags |= u8::from(!self.headers.is_empty()) * HELD_HEADERS;
        let more = (u8::from(self.status != 200) * HELD_STATUS)
            | (u8::from(!self.selecting.is_empty()) * HELD_SELECTING)
            | (u8::from(!self.tags.is_empty()) * HELD_TAGS);
        (flags | (u8::from(more != 0) * HELD_MORE), more)
    }

    /// The fields of version `version` held in the index's form (`compact`); None when they
    /// do not parse, or something follows them.
    pub fn parse_compact(held: &'a [u8], version: u64) -> Option<ObjectView<'a>> {
        let mut r = Reader(held);
        let key = r.bytes()?;
        let (size, block_bytes, fetched_unix_s) = (r.u64()?, r.u32()?, r.u64()?);
        let (etag, last_modified) = (r.str()?, r.str()?);
        let content_type = match r.u8()? {
            0 => r.str()?,
            n => SHORT_CONTENT_TYPES.get(usize::from(n) - 1)?,
        };
        let flags = r.u8()?;
        let mut numbers = [None; 4];
        for (i, n) in numbers.iter_mut().enumerate() {
            if flags & (1 << i) != 0 {
                *n = Some(r.u32()?);
            }
        }
        let headers = if flags & HELD_HEADERS != 0 {
            r.str()?
        } else {
            ""
        };
        let more = if flags & HELD_MORE != 0 { r.u8()? } else { 0 };
        if more & !(HELD_STATUS | HELD_SELECTING | HELD_TAGS) != 0 {
            return None;
        }
        let status = if more & HELD_STATUS != 0 {
            r.u16()?
        } else {
            200
        };
        let selecting = if more & HELD_SELECTING != 0 {
            r.str()?
        } else {
            ""
        };
        let tags = if more & HELD_TAGS != 0 { r.str()? } else { "" };
        let view = ObjectView {
            key,
            version,
            size,
            block_bytes,
            fetched_unix_s,
            etag,
            last_modified,
            content_type,
            freshness: Freshness {
                lifetime_s: numbers[0],
                initial_age_s: numbers[1].unwrap_or(0),
                no_cache: flags & HELD_NO_CACHE != 0,
                must_revalidate: flags & HELD_MUST_REVALIDATE != 0,
                stale_while_revalidate_s: numbers[2],
                stale_if_error_s: numbers[3],
            },
            headers,
            status,
            selecting,
            tags,
        };
        r.0.is_empty().then_some(view)
    }

    /// Appends version `version`'s object record, framed, from its body held in the index's
    /// form (`compact`): the bytes `Record::encode` writes for it.
    pub fn encode_compact_framed(held: &[u8], version: u64, out: &mut Vec<u8>) {
        let view = ObjectView::parse_compact(held, version).expect("a body `compact` wrote");
        let frame_at = out.len();
        out.extend_from_slice(&[0; FRAME_BYTES]);
        view.encode_body(out);
        let body = &out[frame_at + FRAME_BYTES..];
        assert!(body.len() <= MAX_RECORD_BYTES, "a record over its bound");
        let (len, crc) = (body.len() as u32, super::checksum(body));
        out[frame_at..frame_at + 4].copy_from_slice(&len.to_le_bytes());
        out[frame_at + 4..frame_at + FRAME_BYTES].copy_from_slice(&crc.to_le_bytes());
    }

    /// Bytes of the object record body that a version held in the index's form (`compact`)
    /// is written as: its lengths walked, no text checked (every insert counts it).
    pub fn compact_record_len(held: &[u8]) -> usize {
        let mut r = Reader(held);
        let checked = "a body `compact` wrote";
        let mut len = 1 + 2 + r.bytes().expect(checked).len() + 8 + 8 + 4 + 8;
        r.take(8 + 4 + 8).expect(checked);
        len += 2 + r.bytes().expect(checked).len() + 2 + r.bytes().expect(checked).len();
        len += 2 + match r.u8().expect(checked) {
            0 => r.bytes().expect(checked).len(),
            n => SHORT_CONTENT_TYPES[usize::from(n) - 1].len(),
        };
        let flags = r.u8().expect(checked);
        r.take(4 * (flags & 0xf).count_ones() as usize)
            .expect(checked);
        len += Freshness::BYTES + 2 + 2 + 2;
        if flags & HELD_HEADERS != 0 {
            len += r.bytes().expect(checked).len();
        }
        let more = if flags & HELD_MORE != 0 {
            r.u8().expect(checked)
        } else {
            0
        };
        if more & HELD_STATUS != 0 {
            r.take(2).expect(checked);
        }
        if more & HELD_SELECTING != 0 {
            len += r.bytes().expect(checked).len();
        }
        if more & HELD_TAGS != 0 {
            len += 2 + r.bytes().expect(checked).len();
        }
        len
    }

    /// Appends its object record's body (the record, unframed: its kind, then its fields)
    /// to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        out.push(KIND_OBJECT);
        put_bytes(out, self.key);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.fetched_unix_s.to_le_bytes());
        put_bytes(out, self.etag.as_bytes());
        put_bytes(out, self.last_modified.as_bytes());
        put_bytes(out, self.content_type.as_bytes());
        // Since issue 42; a record without them (older) replays with the defaults.
        self.freshness.encode(out);
        put_bytes(out, self.headers.as_bytes());
        // Since non-2xx answers are stored; a record without it (older) is a 200.
        out.extend_from_slice(&self.status.to_le_bytes());
        // Since Vary replies are stored; older records select every request.
        put_bytes(out, self.selecting.as_bytes());
        // Since purge by tag, and only when there are some: a record without them
        // (older, or untagged) replays with none.
        if !self.tags.is_empty() {
            put_bytes(out, self.tags.as_bytes());
        }
    }

    /// The version, its strings copied.
    pub fn to_owned(&self) -> ObjectVersion {
        ObjectVersion {
            key: self.key.to_vec(),
            version: self.version,
            size: self.size,
            block_bytes: self.block_bytes,
            fetched_unix_s: self.fetched_unix_s,
            etag: self.etag.to_string(),
            last_modified: self.last_modified.to_string(),
            content_type: self.content_type.to_string(),
            freshness: self.freshness,
            headers: self.headers.to_string(),
            status: self.status,
            selecting: self.selecting.to_string(),
            tags: Tags::from_text(self.tags).unwrap_or_else(|| Tags::unchecked(self.tags.into())),
        }
    }

    /// Blocks the object spans.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(u64::from(self.block_bytes))
    }

    /// `ObjectVersion::fresh_until_s`'s rule: until when (Unix seconds) it is fresh.
    pub fn fresh_until_s(&self, default_lifetime_s: u64) -> u64 {
        if self.freshness.no_cache {
            return 0;
        }
        let lifetime = self
            .freshness
            .lifetime_s
            .map_or(default_lifetime_s, u64::from);
        self.fetched_unix_s
            .saturating_add(lifetime)
            .saturating_sub(u64::from(self.freshness.initial_age_s))
    }

    /// Whether its purge tags hold `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        !self.tags.is_empty() && self.tags.split(' ').any(|t| t == tag)
    }

    /// `ObjectVersion::validate`'s rule, checked in place.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.key.is_empty() || self.key.len() > MAX_KEY_BYTES {
            return Err(Invalid::KeyLength(self.key.len()));
        }
        let longest = [self.etag, self.last_modified, self.content_type]
            .iter()
            .map(|f| f.len())
            .max()
            .unwrap_or(0);
        if longest > MAX_FIELD_BYTES {
            return Err(Invalid::FieldLength(longest));
        }
        for lines in [self.headers, self.selecting] {
            if lines.len() > MAX_STORED_HEADER_BYTES || !are_header_lines(lines) {
                return Err(Invalid::FieldLength(lines.len()));
            }
        }
        if !Tags::is_text(self.tags) {
            return Err(Invalid::FieldLength(self.tags.len()));
        }
        if !self.block_bytes.is_power_of_two()
            || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&self.block_bytes)
        {
            return Err(Invalid::BlockBytes(self.block_bytes));
        }
        if self.blocks() > MAX_BLOCKS_PER_OBJECT {
            return Err(Invalid::Blocks(self.blocks()));
        }
        if !is_storable_status(self.status) {
            return Err(Invalid::Status(self.status));
        }
        Ok(())
    }
}

/// A block record's fields, read in place (replay's path: `Record::Block` without the move).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockFields {
    /// The version's id, as journaled.
    pub version: u64,
    /// Block number.
    pub block: u32,
    /// The block's CRC-32C.
    pub crc: u32,
}

impl BlockFields {
    /// The fields of `body`, a block record's whole body (its kind first); what
    /// `Record::parse` would refuse is refused alike.
    pub fn read(body: &[u8]) -> Result<BlockFields, Invalid> {
        read_whole(body, KIND_BLOCK, Self::read_fields)
    }

    fn read_fields(r: &mut Reader<'_>) -> Option<BlockFields> {
        Some(BlockFields {
            version: r.u64()?,
            block: r.u32()?,
            crc: r.u32()?,
        })
    }
}

/// The fields `read_fields` takes from `body`, a whole record body of kind `kind`: Malformed
/// for another kind, fields cut short, or bytes left after them.
fn read_whole<T>(
    body: &[u8],
    kind: u8,
    read_fields: impl FnOnce(&mut Reader<'_>) -> Option<T>,
) -> Result<T, Invalid> {
    let mut r = Reader(body);
    if r.u8() != Some(kind) {
        return Err(Invalid::Malformed);
    }
    match read_fields(&mut r) {
        Some(fields) if r.0.is_empty() => Ok(fields),
        _ => Err(Invalid::Malformed),
    }
}

/// Whether a run of `len` blocks from `first` is one `Record::Blocks` may hold: 1 to
/// `BLOCK_RUN_MAX` of them, every number within u32.
fn run_fits(first: u32, len: usize) -> bool {
    (1..=BLOCK_RUN_MAX).contains(&len) && u64::from(first) + len as u64 <= 1 << 32
}

/// Appends `records`, framed, to `out` (each must pass `Record::validate`), each run of
/// block records of one version with consecutive numbers as one `Record::Blocks`: a
/// version's blocks cost the journal 38 bytes per 4 instead of 100, and replay one frame.
/// A run never crosses a multiple of `BLOCK_RUN_MAX`, so what a version's blocks take is
/// the sum over those aligned groups (`group_journal_bytes`), which the index keeps up to
/// date a block at a time (`Index::live_bytes`).
pub fn encode_batch<'a>(records: impl IntoIterator<Item = &'a Record>, out: &mut Vec<u8>) {
    let mut run: Option<(u64, u32, BlockRun)> = None;
    for r in records {
        if let Record::Block {
            version,
            block,
            crc,
        } = *r
        {
            if let Some((v, first, crcs)) = &mut run {
                let next = u64::from(*first) + u64::from(crcs.len);
                if *v == version
                    && next == u64::from(block)
                    && !(block as usize).is_multiple_of(BLOCK_RUN_MAX)
                    && crcs.push(crc)
                {
                    continue;
                }
            }
            encode_run(run.take(), out);
            run = Some((version, block, BlockRun::new(&[crc]).expect("one checksum")));
            continue;
        }
        encode_run(run.take(), out);
        r.encode(out);
    }
    encode_run(run, out);
}

/// Journal bytes, framed, that the blocks of one aligned group of `BLOCK_RUN_MAX` take as
/// `encode_batch` writes them in one batch (`present` bit `i`: the group's block `i`): a
/// lone block as a block record, each longer stretch as one run.
pub fn group_journal_bytes(present: u16) -> u64 {
    // A stretch starts at a block whose previous one is absent, ends at one whose next is.
    let starts = present & !(present << 1);
    let ends = present & !(present >> 1);
    let lone = u64::from((starts & ends).count_ones());
    let stretches = u64::from(starts.count_ones());
    let blocks = u64::from(present.count_ones());
    lone * Record::BLOCK_BYTES + (stretches - lone) * Record::RUN_FIXED_BYTES + (blocks - lone) * 4
}

// One group's presence is a u16 (and an inline object's blocks are one group).
const _: () = assert!(BLOCK_RUN_MAX == u16::BITS as usize);

/// A run as `encode_batch` writes it: a lone block as its block record.
fn encode_run(run: Option<(u64, u32, BlockRun)>, out: &mut Vec<u8>) {
    match run {
        None => {}
        Some((version, block, crcs)) if crcs.len == 1 => Record::Block {
            version,
            block,
            crc: crcs.crcs[0],
        }
        .encode(out),
        Some((version, first, crcs)) => Record::Blocks {
            version,
            first,
            crcs,
        }
        .encode(out),
    }
}

fn parse_body(body: &[u8]) -> Option<Record> {
    let mut r = Reader(body);
    let record = match r.u8()? {
        KIND_OBJECT => Record::Object(ObjectView::read(&mut r)?.to_owned()),
        KIND_BLOCK => {
            let b = BlockFields::read_fields(&mut r)?;
            Record::Block {
                version: b.version,
                block: b.block,
                crc: b.crc,
            }
        }
        KIND_BLOCKS => {
            let (version, first, crcs) = BlockRun::read_fields(&mut r)?;
            Record::Blocks {
                version,
                first,
                crcs,
            }
        }
        KIND_DROP => Record::Drop { version: r.u64()? },
        KIND_FRESH => {
            let (version, fetched_unix_s) = (r.u64()?, r.u64()?);
            // Records journaled before issue 42 end here.
            let refresh = if r.0.is_empty() {
                None
            } else {
                Some(Box::new(Refresh {
                    freshness: Freshness::decode(&mut r)?,
                    headers: r.text()?,
                }))
            };
            Record::Fresh {
                version,
                fetched_unix_s,
                refresh,
            }
        }
        _ => return None,
    };
    // Nothing may follow a record's fields.
    r.0.is_empty().then_some(record)
}

/// Whether `text` is header lines a response may carry as they are: each `Name: value\r\n`,
/// a token name, a value of visible characters, spaces and tabs (no CR or LF inside).
fn are_header_lines(text: &str) -> bool {
    text.is_empty()
        || text.ends_with("\r\n")
            && text[..text.len() - 2].split("\r\n").all(|line| {
                line.split_once(": ").is_some_and(|(name, value)| {
                    !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
                        && value
                            .bytes()
                            .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
                })
            })
}

/// One version of a cached object: what the origin said about it, and how it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectVersion {
    /// The cache key (origin and path).
    pub key: Vec<u8>,
    /// This version's id, unique on this edge (blocks and the data file name it).
    pub version: u64,
    /// The object's size in bytes.
    pub size: u64,
    /// The block size it is stored in (its own: changing `cache_block_bytes` later
    /// invalidates nothing).
    pub block_bytes: u32,
    /// When it was fetched or last revalidated (Unix seconds).
    pub fetched_unix_s: u64,
    /// The origin's ETag ("" if none).
    pub etag: String,
    /// The origin's Last-Modified ("" if none).
    pub last_modified: String,
    /// The origin's Content-Type ("" if none).
    pub content_type: String,
    /// How long it is fresh and how it must be validated (the origin's contract, RFC 9111).
    pub freshness: Freshness,
    /// The origin's end-to-end header lines (`Name: value\r\n`, `origin::contract`'s
    /// `STORED_FIELDS`), sent on every response from the cache; at most
    /// `MAX_STORED_HEADER_BYTES`.
    pub headers: String,
    /// The origin's status: 200 for an object, or another it let the cache keep (a
    /// redirect, a 404, an error with explicit freshness), served whole as it came.
    pub status: u16,
    /// For a reply with `Vary`: the request's lines it varies on
    /// (`origin::contract::selecting_lines`), which a request must match to get it; "" for
    /// every other.
    pub selecting: String,
    /// The origin's purge tags (`cache::tags`; none from records before purge by tag).
    pub tags: Tags,
}

/// A version's freshness as its origin set it (RFC 9111 §4.2), kept in its record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Freshness {
    /// Seconds it is fresh for from `fetched_unix_s` (the origin's explicit lifetime, or the
    /// heuristic); None: the origin entry's `cache_revalidate_s` (records from before issue 42).
    pub lifetime_s: Option<u32>,
    /// How old it was when it arrived (`corrected_initial_age`).
    pub initial_age_s: u32,
    /// `no-cache`: every use is validated first, and never served if that fails.
    pub no_cache: bool,
    /// `must-revalidate` / `proxy-revalidate`: never served stale.
    pub must_revalidate: bool,
    /// `stale-while-revalidate` (RFC 5861): seconds past its lifetime it is served while one
    /// revalidation runs in the background.
    pub stale_while_revalidate_s: Option<u32>,
    /// `stale-if-error` (RFC 5861): seconds past its lifetime it is served when revalidation
    /// fails (None: the origin entry's `stale_if_error_s`).
    pub stale_if_error_s: Option<u32>,
}

impl Freshness {
    /// Bytes it takes in a record.
    pub const BYTES: usize = 4 + 4 + 1 + 4 + 4;
    const NO_LIFETIME: u32 = u32::MAX;
    const FLAG_NO_CACHE: u8 = 1;
    const FLAG_MUST_REVALIDATE: u8 = 2;

    fn encode(&self, out: &mut Vec<u8>) {
        let lifetime = self
            .lifetime_s
            .map_or(Self::NO_LIFETIME, |s| s.min(Self::NO_LIFETIME - 1));
        out.extend_from_slice(&lifetime.to_le_bytes());
        out.extend_from_slice(&self.initial_age_s.to_le_bytes());
        for window in [self.stale_while_revalidate_s, self.stale_if_error_s] {
            let w = window.map_or(Self::NO_LIFETIME, |s| s.min(Self::NO_LIFETIME - 1));
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.push(
            (u8::from(self.no_cache) * Self::FLAG_NO_CACHE)
                | (u8::from(self.must_revalidate) * Self::FLAG_MUST_REVALIDATE),
        );
    }

    fn decode(r: &mut Reader<'_>) -> Option<Freshness> {
        let lifetime = r.u32()?;
        let initial_age_s = r.u32()?;
        let window = |w: u32| (w != Self::NO_LIFETIME).then_some(w);
        let stale_while_revalidate_s = window(r.u32()?);
        let stale_if_error_s = window(r.u32()?);
        let flags = r.u8()?;
        if flags & !(Self::FLAG_NO_CACHE | Self::FLAG_MUST_REVALIDATE) != 0 {
            return None;
        }
        Some(Freshness {
            lifetime_s: (lifetime != Self::NO_LIFETIME).then_some(lifetime),
            initial_age_s,
            no_cache: flags & Self::FLAG_NO_CACHE != 0,
            must_revalidate: flags & Self::FLAG_MUST_REVALIDATE != 0,
            stale_while_revalidate_s,
            stale_if_error_s,
        })
    }
}

impl ObjectVersion {
    /// Appends its object record's body (the record, unframed: its kind, then its fields) to
    /// `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        self.view().encode_body(out);
    }

    /// A version from `encode_body`'s bytes; None when they are not an object record's body.
    pub fn decode_body(body: &[u8]) -> Option<ObjectVersion> {
        match parse_body(body)? {
            Record::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Until when (Unix seconds) it is fresh: `fetched_unix_s` plus its lifetime
    /// (`default_lifetime_s` where its origin set none) less the age it arrived with; a
    /// `no-cache` version is never fresh (RFC 9111 §4.2, §5.2.2.4).
    pub fn fresh_until_s(&self, default_lifetime_s: u64) -> u64 {
        self.view().fresh_until_s(default_lifetime_s)
    }

    /// Its age at `now_unix_s` (RFC 9111 §4.2.3 `current_age`), for the `Age` field.
    pub fn age_s(&self, now_unix_s: u64) -> u64 {
        u64::from(self.freshness.initial_age_s)
            .saturating_add(now_unix_s.saturating_sub(self.fetched_unix_s))
    }

    /// Blocks the object spans.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(u64::from(self.block_bytes))
    }

    /// The bounds every stored version keeps: a key of 1 to `MAX_KEY_BYTES`, fields within
    /// `MAX_FIELD_BYTES`, a power-of-two block size in range, and not more blocks than
    /// `MAX_BLOCKS_PER_OBJECT`. The one rule the writer checks before it journals a version
    /// and replay checks when it reads one back, so nothing written is ever refused later.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.view().validate()
    }

    /// Its fields, borrowed (the one `validate` rule is the view's).
    pub fn view(&self) -> ObjectView<'_> {
        ObjectView {
            key: &self.key,
            version: self.version,
            size: self.size,
            block_bytes: self.block_bytes,
            fetched_unix_s: self.fetched_unix_s,
            etag: &self.etag,
            last_modified: &self.last_modified,
            content_type: &self.content_type,
            freshness: self.freshness,
            headers: &self.headers,
            status: self.status,
            selecting: &self.selecting,
            tags: self.tags.as_str(),
        }
    }

    /// Whether `validate` passes.
    pub fn is_valid(&self) -> bool {
        self.validate().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A version with the given strings, the rest fixed.
    fn version(content_type: String, etag: String, headers: String, tags: &str) -> ObjectVersion {
        ObjectVersion {
            key: b"\0\0depot/7/chunk/0a1b".to_vec(),
            version: 0x1234_5678_9abc,
            size: 5 << 20,
            block_bytes: 1 << 20,
            fetched_unix_s: 1_800_000_000,
            etag,
            last_modified: "Tue, 15 Nov 1994 12:45:26 GMT".into(),
            content_type,
            freshness: Freshness {
                lifetime_s: Some(60),
                ..Freshness::default()
            },
            headers,
            status: 200,
            selecting: String::new(),
            tags: Tags::from_text(tags).unwrap_or_default(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 800, ..ProptestConfig::default() })]

        /// The index's form of a version reads as its record does, writes the record back
        /// byte for byte (a record of an older format: as `Record::encode` writes it now),
        /// counts its length, and takes a byte for a common content type and none for a
        /// default field.
        #[test]
        fn a_compact_body_reads_and_encodes_as_the_record_it_came_from(
            content_type in prop_oneof![
                proptest::sample::select(SHORT_CONTENT_TYPES.to_vec()).prop_map(String::from),
                "[a-z/+.;= -]{0,40}",
            ],
            etag in "[a-z0-9\"-]{0,20}",
            headers in prop_oneof![Just(String::new()), Just("Cache-Control: max-age=9\r\n".to_string())],
            tags in prop_oneof![Just(""), Just("patch-7 depot")],
            selecting in prop_oneof![Just(String::new()), Just("accept-encoding: gzip\r\n".to_string())],
            status in prop_oneof![Just(200u16), Just(301u16), Just(404u16)],
            numbers in proptest::array::uniform4(proptest::option::of(prop_oneof![Just(u32::MAX), Just(0u32), any::<u32>()])),
            no_cache: bool,
            must_revalidate: bool,
            cut in 0usize..5,
        ) {
            let mut m = version(content_type.clone(), etag, headers, tags);
            m.selecting = selecting;
            m.status = status;
            m.freshness = Freshness {
                lifetime_s: numbers[0],
                initial_age_s: numbers[1].unwrap_or(0),
                no_cache,
                must_revalidate,
                stale_while_revalidate_s: numbers[2],
                stale_if_error_s: numbers[3],
            };
            let mut body = Vec::new();
            m.encode_body(&mut body);
            // Records of older formats end after the content type, the stored lines, the
            // status or the selecting lines.
            let after_type = 1 + 2 + m.key.len() + 8 + 8 + 4 + 8 + 6
                + m.etag.len() + m.last_modified.len() + m.content_type.len();
            let after_headers = after_type + Freshness::BYTES + 2 + m.headers.len();
            let ends = [after_type, after_headers, after_headers + 2,
                        after_headers + 2 + 2 + m.selecting.len(), body.len()];
            body.truncate(ends[cut]);
            let view = ObjectView::parse(&body).expect("a record's body");
            let held = view.compact(3);
            prop_assert_eq!(held.capacity(), held.len() + 3);
            let back = ObjectView::parse_compact(&held, m.version).expect("the index's form");
            prop_assert_eq!(back.to_owned(), view.to_owned());
            // What a replay of the record written back gives.
            let mut framed = Vec::new();
            Record::Object(view.to_owned()).encode(&mut framed);
            let mut again = Vec::new();
            ObjectView::encode_compact_framed(&held, m.version, &mut again);
            prop_assert_eq!(&again, &framed);
            prop_assert_eq!(ObjectView::compact_record_len(&held), framed.len() - FRAME_BYTES);
            let replayed = ObjectView::parse(&framed[FRAME_BYTES..]).expect("written back");
            prop_assert_eq!(replayed.compact(0), held.clone());
            if cut == 4 {
                prop_assert_eq!(&framed[FRAME_BYTES..], &body[..]);
            }
            // Shorter by the kind and the version less two flag bytes at least; a common type
            // takes a byte, and the fields after it at their defaults one byte in all.
            prop_assert!(held.len() + 9 - 2 <= framed.len() - FRAME_BYTES);
            let short = SHORT_CONTENT_TYPES.contains(&content_type.as_str());
            let defaults = back.freshness == Freshness::default() && back.headers.is_empty()
                && back.status == 200 && back.selecting.is_empty() && back.tags.is_empty();
            if short && defaults {
                let after_type = Freshness::BYTES + 2 + 2 + 2;
                prop_assert_eq!(
                    held.len() + 9 + (2 + content_type.len() - 1) + (after_type - 1),
                    framed.len() - FRAME_BYTES
                );
            }
            // Cut short, it does not parse (and never panics).
            prop_assert!(ObjectView::parse_compact(&held[..held.len() - 1], m.version).is_none());
        }
    }

    /// A tag past the list of short content types is refused, not a panic.
    #[test]
    fn an_unknown_short_content_type_does_not_parse() {
        let m = version(
            SHORT_CONTENT_TYPES[0].into(),
            String::new(),
            String::new(),
            "",
        );
        let mut body = Vec::new();
        m.encode_body(&mut body);
        let mut held = ObjectView::parse(&body).unwrap().compact(0);
        let tag_at = 2 + m.key.len() + 8 + 4 + 8 + 2 + 2 + m.last_modified.len();
        assert_eq!(held[tag_at], 1);
        assert!(ObjectView::parse_compact(&held, m.version).is_some());
        held[tag_at] = SHORT_CONTENT_TYPES.len() as u8 + 1;
        assert!(ObjectView::parse_compact(&held, m.version).is_none());
    }
}
