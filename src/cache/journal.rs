//! The cache journal: an append-only file of records, each framed and checksummed, replayed
//! into the `Index` at start-up.
//!
//! A record on disk is `len: u32 LE | crc: u32 LE | kind: u8 | body`, where `len` counts
//! `kind` and `body` and `crc` is the CRC-32C of them. Replay stops at the first record that
//! is cut short or does not match its checksum: that is where a crash (or a torn write) ended
//! the file, and the writer truncates it there before appending again. A record that is
//! whole and matches its checksum but that replay refuses (`Record::validate`, the same
//! rule the writer keeps, so only a bug or another version's writer can leave one) is
//! skipped and counted: it never costs the records after it. Every field has a named bound,
//! so a damaged length never makes replay allocate or read past the buffer.

use super::index::{Index, ObjectVersion};

/// Bytes of a record's frame before its kind (length and checksum).
pub const FRAME_BYTES: usize = 8;
/// Longest record body (a key and its validators, with room).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;
/// Longest cache key (the origin's name and the path).
pub const MAX_KEY_BYTES: usize = 4096;
/// Longest validator (ETag or Last-Modified) or content type kept.
pub const MAX_FIELD_BYTES: usize = 512;
/// Smallest block size an object may record.
pub const MIN_BLOCK_BYTES: u32 = 64 * 1024;
/// Largest block size an object may record.
pub const MAX_BLOCK_BYTES: u32 = 64 * 1024 * 1024;
/// Most blocks one object may have (a 16 TiB object at 1 MiB blocks).
pub const MAX_BLOCKS_PER_OBJECT: u64 = 1 << 24;

/// Journal bytes per version assumed when replay sizes the index (an object record with a
/// short key and its block records come to about this).
const REPLAY_SIZING_BYTES_PER_VERSION: usize = 128;

const KIND_OBJECT: u8 = 1;
const KIND_BLOCK: u8 = 2;
const KIND_DROP: u8 = 3;
const KIND_FRESH: u8 = 4;

/// Why a record may not be journaled (the writer) or is refused (replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// A key of this many bytes (0, or over `MAX_KEY_BYTES`).
    KeyLength(usize),
    /// A validator or content type of this many bytes (over `MAX_FIELD_BYTES`).
    FieldLength(usize),
    /// A block size that is not a power of two in `MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES`.
    BlockBytes(u32),
    /// More blocks than `MAX_BLOCKS_PER_OBJECT`.
    Blocks(u64),
    /// An unknown record kind, or fields that do not parse.
    Malformed,
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
    },
}

/// What decoding the front of a buffer found.
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
            + o.content_type.len()) as u64
    }

    /// What a record may hold: the one rule the writer keeps before it journals a record and
    /// replay applies when it reads one back.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            Record::Object(o) => o.validate(),
            Record::Block { .. } | Record::Drop { .. } | Record::Fresh { .. } => Ok(()),
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
    fn encode_unchecked(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_BYTES]);
        match self {
            Record::Object(o) => {
                out.push(KIND_OBJECT);
                put_bytes(out, &o.key);
                out.extend_from_slice(&o.version.to_le_bytes());
                out.extend_from_slice(&o.size.to_le_bytes());
                out.extend_from_slice(&o.block_bytes.to_le_bytes());
                out.extend_from_slice(&o.fetched_unix_s.to_le_bytes());
                put_bytes(out, o.etag.as_bytes());
                put_bytes(out, o.last_modified.as_bytes());
                put_bytes(out, o.content_type.as_bytes());
            }
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
            Record::Drop { version } => {
                out.push(KIND_DROP);
                out.extend_from_slice(&version.to_le_bytes());
            }
            Record::Fresh {
                version,
                fetched_unix_s,
            } => {
                out.push(KIND_FRESH);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&fetched_unix_s.to_le_bytes());
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
        let Some(frame) = buf.get(..FRAME_BYTES) else {
            return Decoded::Incomplete;
        };
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        if len == 0 || len > MAX_RECORD_BYTES {
            return Decoded::Corrupt;
        }
        let Some(body) = buf.get(FRAME_BYTES..FRAME_BYTES + len) else {
            return Decoded::Incomplete;
        };
        if super::checksum(body) != crc {
            return Decoded::Corrupt;
        }
        match parse_body(body).ok_or(Invalid::Malformed).and_then(|r| {
            r.validate()?;
            Ok(r)
        }) {
            Ok(r) => Decoded::Record(r, FRAME_BYTES + len),
            Err(why) => Decoded::Refused(why, FRAME_BYTES + len),
        }
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
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

fn parse_body(body: &[u8]) -> Option<Record> {
    let mut r = Reader(body);
    let record = match r.u8()? {
        KIND_OBJECT => {
            // Lengths are bounded by the record's; what a field may hold is `validate`'s.
            let key = r.bytes()?.to_vec();
            let version = r.u64()?;
            let size = r.u64()?;
            let block_bytes = r.u32()?;
            let fetched_unix_s = r.u64()?;
            let (etag, last_modified, content_type) = (r.text()?, r.text()?, r.text()?);
            Record::Object(ObjectVersion {
                key,
                version,
                size,
                block_bytes,
                fetched_unix_s,
                etag,
                last_modified,
                content_type,
            })
        }
        KIND_BLOCK => Record::Block {
            version: r.u64()?,
            block: r.u32()?,
            crc: r.u32()?,
        },
        KIND_DROP => Record::Drop { version: r.u64()? },
        KIND_FRESH => Record::Fresh {
            version: r.u64()?,
            fetched_unix_s: r.u64()?,
        },
        _ => return None,
    };
    // Nothing may follow a record's fields.
    r.0.is_empty().then_some(record)
}

/// Appends the live index to `out` as records: each current version's object record (with
/// its latest confirmation time), then its blocks. Replaying them gives the same current
/// versions and blocks; versions already replaced (kept only for the responses reading them)
/// are left out, as are blocks found corrupt since.
pub fn snapshot(index: &Index, out: &mut Vec<u8>) {
    let mut versions: Vec<&ObjectVersion> = index
        .each_version()
        .filter(|m| index.is_current(m.version))
        .collect();
    // In id order: replay numbers new versions after the highest.
    versions.sort_unstable_by_key(|m| m.version);
    for m in versions {
        Record::Object(m.clone()).encode(out);
        for (block, crc) in index.each_block(m.version) {
            Record::Block {
                version: m.version,
                block,
                crc,
            }
            .encode(out);
        }
    }
}

/// What a replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Records applied.
    pub records: u64,
    /// Records that were valid but named nothing the index has (a block of a dropped
    /// version, a block past its object's end); skipped.
    pub skipped: u64,
    /// Whole records that matched their checksum but that `Record::validate` refuses;
    /// skipped, and the records after them replayed.
    pub refused: u64,
    /// Why the first refused record was refused.
    pub first_refusal: Option<Invalid>,
    /// Bytes of whole records from the start (valid or refused): the writer truncates the
    /// file here.
    pub valid_bytes: u64,
    /// The file went on past `valid_bytes` (a torn or damaged tail, ignored).
    pub damaged_tail: bool,
}

/// Replays a journal's bytes into a fresh index.
pub fn replay(bytes: &[u8]) -> (Index, ReplayStats) {
    let mut index = Index::with_capacity(replay_capacity(bytes.len() as u64));
    let mut stats = ReplayStats::default();
    let (used, _) = replay_into(bytes, &mut index, &mut stats);
    stats.damaged_tail = used < bytes.len();
    (index, stats)
}

/// Index capacity to reserve for a journal of `journal_bytes` (replay sizes its tables from
/// the journal's length, so a rebuild does not grow them step by step).
pub fn replay_capacity(journal_bytes: u64) -> usize {
    usize::try_from(journal_bytes).unwrap_or(usize::MAX) / REPLAY_SIZING_BYTES_PER_VERSION
}

/// Applies the whole records at the front of `bytes` to `index`; returns the bytes they
/// took, and whether what follows is damaged (a frame whose length or checksum is wrong:
/// the journal ends there) rather than a record cut short by the buffer's end (to be read
/// again with the bytes that follow). `stats.valid_bytes` grows by what was taken.
pub fn replay_into(bytes: &[u8], index: &mut Index, stats: &mut ReplayStats) -> (usize, bool) {
    let mut at = 0;
    while at < bytes.len() {
        match Record::decode(&bytes[at..]) {
            Decoded::Record(r, used) => {
                if index.apply(r) {
                    stats.records += 1;
                } else {
                    stats.skipped += 1;
                }
                at += used;
            }
            Decoded::Refused(why, used) => {
                stats.refused += 1;
                stats.first_refusal.get_or_insert(why);
                at += used;
            }
            Decoded::Incomplete => break,
            Decoded::Corrupt => {
                stats.valid_bytes += at as u64;
                return (at, true);
            }
        }
    }
    stats.valid_bytes += at as u64;
    (at, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A frame with a right length and checksum around `body`: what replay trusts.
    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&crate::cache::checksum(body).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Whatever a well-framed record holds (a bug, a disk that kept a checksum right): a
        /// record, refused, or corrupt, never a panic; a record it accepts encodes back to the
        /// same bytes, so replay and the writer agree on what each byte means.
        #[test]
        fn any_framed_body_decodes_without_panic_and_round_trips(
            kind in prop_oneof![Just(KIND_OBJECT), Just(KIND_BLOCK), Just(KIND_DROP),
                                Just(KIND_FRESH), any::<u8>()],
            rest in proptest::collection::vec(any::<u8>(), 0..96),
        ) {
            let mut body = vec![kind];
            body.extend_from_slice(&rest);
            let buf = framed(&body);
            match Record::decode(&buf) {
                Decoded::Record(r, n) => {
                    prop_assert_eq!(n, buf.len());
                    prop_assert_eq!(r.validate(), Ok(()));
                    let mut again = Vec::new();
                    r.encode(&mut again);
                    prop_assert_eq!(again, buf);
                }
                Decoded::Refused(_, n) => prop_assert_eq!(n, buf.len()),
                Decoded::Corrupt => {}
                Decoded::Incomplete => prop_assert!(false, "a whole frame is never incomplete"),
            }
        }

        /// Arbitrary bytes, as a torn or overwritten journal holds: decode and replay never
        /// panic, and replay never reads past what it was given.
        #[test]
        fn arbitrary_journal_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let _ = Record::decode(&bytes);
            let mut index = Index::default();
            let mut stats = ReplayStats::default();
            let (used, _) = replay_into(&bytes, &mut index, &mut stats);
            prop_assert!(used <= bytes.len());
        }

        /// Object records with keys and texts of every length around their bounds: what
        /// `validate` accepts round-trips through the bytes; what it refuses is refused by
        /// replay the same way, at its own length.
        #[test]
        fn object_records_round_trip_or_are_refused_alike(
            key_len in 0usize..(MAX_KEY_BYTES + 40),
            etag_len in 0usize..300,
            size in any::<u64>(),
            block_shift in 10u32..26,
        ) {
            let o = ObjectVersion {
                key: vec![b'k'; key_len],
                version: 7,
                size,
                block_bytes: 1 << block_shift,
                fetched_unix_s: 1_764_633_600,
                etag: "e".repeat(etag_len),
                last_modified: String::new(),
                content_type: String::new(),
            };
            let r = Record::Object(o);
            let mut buf = Vec::new();
            r.encode_unchecked(&mut buf);
            match (r.validate(), Record::decode(&buf)) {
                (Ok(()), Decoded::Record(back, n)) => {
                    prop_assert_eq!(back, r);
                    prop_assert_eq!(n, buf.len());
                }
                (Err(why), Decoded::Refused(refused, n)) => {
                    prop_assert_eq!(why, refused);
                    prop_assert_eq!(n, buf.len());
                }
                (v, d) => prop_assert!(false, "validate {:?} but decode {:?}", v, d),
            }
        }
    }

    fn object(key: &str, version: u64, size: u64) -> ObjectVersion {
        ObjectVersion {
            key: key.as_bytes().to_vec(),
            version,
            size,
            block_bytes: 1 << 20,
            fetched_unix_s: 1_764_633_600,
            etag: "\"abc\"".into(),
            last_modified: "Tue, 01 Dec 2026 00:00:00 GMT".into(),
            content_type: "application/octet-stream".into(),
        }
    }

    fn journal(records: &[Record]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            r.encode(&mut out);
        }
        out
    }

    #[test]
    fn records_round_trip() {
        let records = [
            Record::Object(object("cdn.example/patch/1.pak", 7, 3 << 20)),
            Record::Block {
                version: 7,
                block: 2,
                crc: 0xdead_beef,
            },
            Record::Fresh {
                version: 7,
                fetched_unix_s: 1_800_000_000,
            },
            Record::Drop { version: 7 },
        ];
        let bytes = journal(&records);
        let mut at = 0;
        for want in &records {
            match Record::decode(&bytes[at..]) {
                Decoded::Record(r, used) => {
                    assert_eq!(&r, want);
                    at += used;
                }
                other => panic!("{other:?} at {at}"),
            }
        }
        assert_eq!(at, bytes.len());
    }

    #[test]
    fn a_torn_tail_is_ignored_at_every_cut_and_nothing_before_it_is_lost() {
        let head = [
            Record::Object(object("a", 1, 5 << 20)),
            Record::Block {
                version: 1,
                block: 0,
                crc: 11,
            },
        ];
        let last = Record::Block {
            version: 1,
            block: 1,
            crc: 12,
        };
        let whole = journal(&[head[0].clone(), head[1].clone(), last]);
        let head_len = journal(&head).len();
        for cut in head_len..whole.len() {
            let (index, stats) = replay(&whole[..cut]);
            assert_eq!(stats.valid_bytes, head_len as u64, "cut at {cut}");
            assert_eq!(stats.damaged_tail, cut > head_len);
            let v = index.current(b"a").expect("the object survives");
            assert_eq!(index.block_crc(v.version, 0), Some(11));
            assert_eq!(
                index.block_crc(v.version, 1),
                None,
                "a torn block is not visible"
            );
        }
        let (index, stats) = replay(&whole);
        assert!(!stats.damaged_tail);
        assert_eq!(index.block_crc(1, 1), Some(12));
    }

    #[test]
    fn a_damaged_byte_anywhere_stops_replay_at_that_record() {
        let records = [
            Record::Object(object("a", 1, 1 << 20)),
            Record::Block {
                version: 1,
                block: 0,
                crc: 5,
            },
        ];
        let whole = journal(&records);
        let first = journal(&records[..1]).len();
        for i in 0..whole.len() {
            let mut bad = whole.clone();
            bad[i] ^= 0x40;
            let (index, stats) = replay(&bad);
            let expect = if i < first { 0 } else { first as u64 };
            assert_eq!(stats.valid_bytes, expect, "byte {i}");
            assert!(stats.damaged_tail, "byte {i}");
            assert_eq!(
                index.block_crc(1, 0),
                None,
                "byte {i}: no block from damage"
            );
        }
    }

    #[test]
    fn garbage_lengths_and_fields_are_refused_without_reading_past_the_buffer() {
        assert_eq!(Record::decode(&[]), Decoded::Incomplete);
        assert_eq!(Record::decode(&[0; 8]), Decoded::Corrupt, "zero length");
        let mut huge = vec![0xff; 8];
        huge.extend_from_slice(&[1; 64]);
        assert_eq!(
            Record::decode(&huge),
            Decoded::Corrupt,
            "length over the bound"
        );
        // A well-framed body whose key length runs past the body: refused, and skipped
        // whole (its frame says where the next record starts).
        let mut body = vec![KIND_OBJECT];
        body.extend_from_slice(&1000u16.to_le_bytes());
        body.extend_from_slice(b"short");
        let mut framed = (body.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&crate::cache::checksum(&body).to_le_bytes());
        framed.extend_from_slice(&body);
        assert_eq!(
            Record::decode(&framed),
            Decoded::Refused(Invalid::Malformed, framed.len())
        );
        // An object whose block size is out of bounds is refused too.
        let mut o = object("a", 1, 10);
        o.block_bytes = 1000;
        let mut bad = Vec::new();
        Record::Object(o).encode_unchecked(&mut bad);
        assert_eq!(
            Record::decode(&bad),
            Decoded::Refused(Invalid::BlockBytes(1000), bad.len())
        );
    }

    /// A snapshot of the live index replays to the same current versions and blocks, and
    /// its size is what the index counted as live.
    #[test]
    fn a_snapshot_replays_to_the_same_index() {
        let mut records = Vec::new();
        for v in 1..=20u64 {
            records.push(Record::Object(object(
                &format!("key-{}", v % 7),
                v,
                5 << 20,
            )));
            for b in 0..(v % 5) as u32 {
                records.push(Record::Block {
                    version: v,
                    block: b,
                    crc: (v as u32) << 8 | b,
                });
            }
            if v % 3 == 0 {
                records.push(Record::Drop { version: v - 1 });
            }
            records.push(Record::Fresh {
                version: v,
                fetched_unix_s: 2_000_000_000 + v,
            });
        }
        let (mut index, _) = replay(&journal(&records));
        assert!(index.forget_block(19, 1));
        // Drop every version that is not current, so the live count is the snapshot's size.
        let stale: Vec<u64> = index
            .each_version()
            .filter(|m| !index.is_current(m.version))
            .map(|m| m.version)
            .collect();
        for version in stale {
            assert!(index.apply(Record::Drop { version }));
        }
        let mut snap = Vec::new();
        snapshot(&index, &mut snap);
        assert_eq!(snap.len() as u64, index.live_bytes());
        let (again, stats) = replay(&snap);
        assert_eq!(
            (stats.refused, stats.skipped, stats.damaged_tail),
            (0, 0, false)
        );
        assert_eq!(
            (again.keys(), again.versions()),
            (index.keys(), index.versions())
        );
        for m in index.each_version() {
            assert_eq!(again.current(&m.key), Some(m));
            let blocks: Vec<_> = index.each_block(m.version).collect();
            assert_eq!(again.each_block(m.version).collect::<Vec<_>>(), blocks);
        }
        assert_eq!(
            again.block_crc(19, 1),
            None,
            "a forgotten block stays forgotten"
        );
        assert_eq!(again.live_bytes(), index.live_bytes());
    }

    /// What the writer would refuse, planted in the middle of a journal (a key over
    /// `MAX_KEY_BYTES`, a claim of more than `MAX_BLOCKS_PER_OBJECT` blocks, a malformed
    /// body): replay skips each, counts it, and every record around it survives.
    #[test]
    fn a_refused_record_in_the_middle_costs_only_itself() {
        let long_key = "k".repeat(MAX_KEY_BYTES + 1);
        let huge = object("huge", 3, (MAX_BLOCKS_PER_OBJECT + 1) << 20);
        let refused = [
            Record::Object(object(&long_key, 2, 1 << 20)),
            Record::Object(huge.clone()),
        ];
        for r in &refused {
            assert!(r.validate().is_err(), "{r:?}");
        }
        assert_eq!(
            huge.validate(),
            Err(Invalid::Blocks(MAX_BLOCKS_PER_OBJECT + 1))
        );
        let mut bytes = journal(&[
            Record::Object(object("a", 1, 2 << 20)),
            Record::Block {
                version: 1,
                block: 0,
                crc: 7,
            },
        ]);
        for r in &refused {
            r.encode_unchecked(&mut bytes);
        }
        // An unknown kind, well framed.
        let body = [99u8, 1, 2, 3];
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crate::cache::checksum(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes.extend(journal(&[
            Record::Object(object("b", 4, 1 << 20)),
            Record::Block {
                version: 4,
                block: 0,
                crc: 9,
            },
            Record::Block {
                version: 1,
                block: 1,
                crc: 8,
            },
        ]));
        let (index, stats) = replay(&bytes);
        assert_eq!(stats.refused, 3);
        assert_eq!(
            stats.first_refusal,
            Some(Invalid::KeyLength(MAX_KEY_BYTES + 1))
        );
        assert!(!stats.damaged_tail);
        assert_eq!(stats.valid_bytes, bytes.len() as u64);
        assert_eq!(
            (index.block_crc(1, 0), index.block_crc(1, 1)),
            (Some(7), Some(8))
        );
        assert_eq!(index.current(b"b").map(|m| m.version), Some(4));
        assert_eq!(index.block_crc(4, 0), Some(9));
        assert_eq!(index.keys(), 2);
    }
}
