//! The cache journal: an append-only file of records, each framed and checksummed, replayed
//! into the `Index` at start-up.
//!
//! A record on disk is `len: u32 LE | crc: u32 LE | kind: u8 | body`, where `len` counts
//! `kind` and `body` and `crc` is the CRC-32C of them. Replay stops at the first record that
//! is cut short or does not match its checksum: that is where a crash (or a torn write) ended
//! the file, and the writer truncates it there before appending again. Every field has a
//! named bound, so a damaged length never makes replay allocate or read past the buffer.

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
}

impl Record {
    /// Appends the record, framed, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
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
        match parse_body(body) {
            Some(r) => Decoded::Record(r, FRAME_BYTES + len),
            None => Decoded::Corrupt,
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
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
    fn bytes(&mut self, max: usize) -> Option<&'a [u8]> {
        let n = usize::from(u16::from_le_bytes(self.take(2)?.try_into().ok()?));
        (n <= max).then_some(())?;
        self.take(n)
    }
    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes(MAX_FIELD_BYTES)?.to_vec()).ok()
    }
}

fn parse_body(body: &[u8]) -> Option<Record> {
    let mut r = Reader(body);
    let record = match r.u8()? {
        KIND_OBJECT => {
            let key = r.bytes(MAX_KEY_BYTES)?.to_vec();
            let version = r.u64()?;
            let size = r.u64()?;
            let block_bytes = r.u32()?;
            let fetched_unix_s = r.u64()?;
            let (etag, last_modified, content_type) = (r.text()?, r.text()?, r.text()?);
            let o = ObjectVersion {
                key,
                version,
                size,
                block_bytes,
                fetched_unix_s,
                etag,
                last_modified,
                content_type,
            };
            o.is_valid().then_some(Record::Object(o))?
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

/// What a replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Records applied.
    pub records: u64,
    /// Records that were valid but named nothing the index has (a block of a dropped
    /// version, a block past its object's end); skipped.
    pub skipped: u64,
    /// Bytes of whole, valid records from the start: the writer truncates the file here.
    pub valid_bytes: u64,
    /// The file went on past `valid_bytes` (a torn or damaged tail, ignored).
    pub damaged_tail: bool,
}

/// Replays a journal's bytes into a fresh index.
pub fn replay(bytes: &[u8]) -> (Index, ReplayStats) {
    // Sized from the journal's length, so a rebuild does not grow its tables step by step
    // (a journal of mostly drops or tiny keys may still grow them).
    let mut index = Index::with_capacity(bytes.len() / REPLAY_SIZING_BYTES_PER_VERSION);
    let mut stats = ReplayStats::default();
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
            Decoded::Incomplete | Decoded::Corrupt => {
                stats.damaged_tail = true;
                break;
            }
        }
    }
    stats.valid_bytes = at as u64;
    (index, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A well-framed body whose key length runs past the body.
        let mut body = vec![KIND_OBJECT];
        body.extend_from_slice(&1000u16.to_le_bytes());
        body.extend_from_slice(b"short");
        let mut framed = (body.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&crate::cache::checksum(&body).to_le_bytes());
        framed.extend_from_slice(&body);
        assert_eq!(Record::decode(&framed), Decoded::Corrupt);
        // An object whose block size is out of bounds is not valid either.
        let mut o = object("a", 1, 10);
        o.block_bytes = 1000;
        assert_eq!(
            Record::decode(&journal(&[Record::Object(o)])),
            Decoded::Corrupt
        );
    }
}
