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

use super::index::{Index, Prepared};
pub use super::record::{
    encode_batch, BlockRun, Decoded, Framed, Invalid, ObjectVersion, Record, BLOCK_RUN_MAX,
    FRAME_BYTES, MAX_BLOCKS_PER_OBJECT, MAX_BLOCK_BYTES, MAX_FIELD_BYTES, MAX_KEY_BYTES,
    MAX_RECORD_BYTES, MIN_BLOCK_BYTES,
};
use super::record::{BlockFields, KIND_BLOCK, KIND_BLOCKS, KIND_OBJECT};

/// Appends the live index to `out` as records: each current version's object record (with
/// its latest confirmation time), then its blocks. Replaying them gives the same current
/// versions and blocks; versions already replaced (kept only for the responses reading them)
/// are left out, as are blocks found corrupt since.
pub fn snapshot(index: &Index, out: &mut Vec<u8>) {
    let mut versions: Vec<u64> = index
        .each_version_id()
        .filter(|&v| index.is_current(v))
        .collect();
    // In id order: replay numbers new versions after the highest.
    versions.sort_unstable();
    let mut blocks = Vec::new();
    for version in versions {
        index.encode_version(version, out);
        blocks.clear();
        blocks.extend(index.each_block(version).map(|(block, crc)| Record::Block {
            version,
            block,
            crc,
        }));
        // Consecutive blocks as runs (`Record::Blocks`).
        encode_batch(&blocks, out);
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
    index.hold_current_changes();
    let (used, _) = replay_into(bytes, &mut index, &mut stats);
    index.make_held_changes();
    index.shrink_to_fit();
    stats.damaged_tail = used < bytes.len();
    (index, stats)
}

/// Journal bytes per version assumed when replay sizes the index (an object record with a
/// short key and a run of four blocks come to about this, 197 bytes for a game chunk; replay
/// gives back what it did not use, and grows the tables where versions are smaller). At 256,
/// the size before runs, a journal of 1 million objects sized its tables below them, and
/// replay grew them: 219 MiB at the peak against 202.
const REPLAY_SIZING_BYTES_PER_VERSION: usize = 192;

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
    replay_into_slot(bytes, index, stats, None)
}

/// `replay_into`, with every record's version moved to disk slot `slot` when one is given
/// (`version_id::rebase`: the journal of one of several disks).
pub fn replay_into_slot(
    bytes: &[u8],
    index: &mut Index,
    stats: &mut ReplayStats,
    slot: Option<usize>,
) -> (usize, bool) {
    let mut decoder = Decoder::new(slot);
    let (used, damaged) = each_record(bytes, |body| {
        decoder.decode(body);
        for step in decoder.ready() {
            step.apply(index, stats);
        }
    });
    for step in decoder.finish() {
        step.apply(index, stats);
    }
    stats.valid_bytes += used as u64;
    (used, damaged)
}

/// Calls `each` with the body of every whole record at the front of `bytes`, in order;
/// returns the bytes they took, and whether what follows is damaged (a frame whose length or
/// checksum is wrong) rather than a record cut short by the buffer's end.
pub fn each_record(bytes: &[u8], mut each: impl FnMut(&[u8])) -> (usize, bool) {
    let mut at = 0;
    while at < bytes.len() {
        match Record::frame(&bytes[at..]) {
            Framed::Body(body, used) => {
                at += used;
                each(body);
            }
            Framed::Incomplete => break,
            Framed::Corrupt => return (at, true),
        }
    }
    (at, false)
}

/// Decodes records into `Step`s, in order, each block record that directly follows its
/// version's object record folded into it (`Prepared::fold_block`): applying the steps
/// does what applying the records one by one does.
pub struct Decoder {
    slot: Option<usize>,
    /// Decoded, not yet handed on; the last may still take blocks.
    steps: Vec<Step>,
}

impl Decoder {
    /// A decoder of records whose versions move to disk `slot` (None: stay).
    pub fn new(slot: Option<usize>) -> Decoder {
        Decoder {
            slot,
            steps: Vec::new(),
        }
    }

    /// Decodes one record's body (framed, checksum matched) onto `steps`.
    pub fn decode(&mut self, body: &[u8]) {
        if body.first() == Some(&KIND_BLOCKS) {
            // A run: each of its blocks as its own block record would go.
            match BlockRun::read(body) {
                Ok((version, first, crcs)) => {
                    let version = self.on_slot(version);
                    for (block, crc) in crcs.numbered(first) {
                        self.push(Step::Block(BlockFields {
                            version,
                            block,
                            crc,
                        }));
                    }
                }
                Err(why) => self.steps.push(Step::Refused(why)),
            }
            return;
        }
        self.push(Step::decode(body, self.slot));
    }

    /// Pushes `step`, a block folded into its version's object step when that is the last.
    fn push(&mut self, step: Step) {
        if let (Step::Block(b), Some(Step::Object(last))) = (&step, self.steps.last_mut()) {
            if last.version() == b.version && last.fold_block(b.block, b.crc) {
                return;
            }
        }
        self.steps.push(step);
    }

    /// `version` moved to this decoder's disk slot, if it has one.
    fn on_slot(&self, version: u64) -> u64 {
        self.slot
            .map_or(version, |s| super::version_id::on_slot(version, s))
    }

    /// Steps decoded and not handed on yet.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether every step decoded was handed on.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps that are final, in order: all but the last, which blocks may still join.
    pub fn ready(&mut self) -> std::vec::Drain<'_, Step> {
        let keep = self.steps.len().min(1);
        self.steps.drain(..self.steps.len() - keep)
    }

    /// `ready`, as a batch of its own (the last step starts the next one).
    pub fn ready_batch(&mut self) -> Vec<Step> {
        let last = self.steps.pop();
        let room = self.steps.len() + 1;
        let batch = std::mem::replace(&mut self.steps, Vec::with_capacity(room));
        self.steps.extend(last);
        batch
    }

    /// Every step left, the last included (the records have ended).
    pub fn finish(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.steps)
    }
}

impl ReplayStats {
    /// Counts one record's fate: applied, skipped (it named nothing held), or refused.
    pub fn tally(&mut self, applied: Result<bool, Invalid>) {
        match applied {
            Ok(true) => self.records += 1,
            Ok(false) => self.skipped += 1,
            Err(why) => {
                self.refused += 1;
                self.first_refusal.get_or_insert(why);
            }
        }
    }
}

// What `journal_file`'s bound on the steps in flight counts on.
const _: () = assert!(std::mem::size_of::<Step>() <= 80);

/// One record decoded for the index, with everything done that needs no table (so a
/// reading thread may decode while another applies, `JournalFile::open`). The common kinds
/// are read in place: a `Record` is large to move.
#[derive(Debug)]
pub enum Step {
    /// An object record's version, checked and allocated, with the block records folded into
    /// it (its key is hashed as it is inserted).
    Object(Prepared),
    /// A block record.
    Block(BlockFields),
    /// A drop record's version.
    Drop(u64),
    /// Any other record (a confirmation).
    Other(Box<Record>),
    /// A record replay refuses, and why.
    Refused(Invalid),
}

impl Step {
    /// The step a record's body (framed, checksum matched) asks for, its version moved to
    /// disk slot `slot` when one is given.
    pub fn decode(body: &[u8], slot: Option<usize>) -> Step {
        let on_slot = |version| slot.map_or(version, |s| super::version_id::on_slot(version, s));
        let step = match body.first() {
            Some(&KIND_OBJECT) => Prepared::from_body(body, slot).map(Step::Object),
            Some(&KIND_BLOCK) => BlockFields::read(body).map(|b| {
                Step::Block(BlockFields {
                    version: on_slot(b.version),
                    ..b
                })
            }),
            _ => Record::parse(body).map(|r| match r {
                Record::Drop { version } => Step::Drop(on_slot(version)),
                r => Step::Other(Box::new(match slot {
                    Some(slot) => super::version_id::rebase(r, slot),
                    None => r,
                })),
            }),
        };
        step.unwrap_or_else(Step::Refused)
    }

    /// Applies the step, counting each record it stands for in `stats` (`ReplayStats::tally`).
    pub fn apply(self, index: &mut Index, stats: &mut ReplayStats) {
        match self {
            Step::Object(prepared) => {
                let folded = u64::from(prepared.folded_blocks());
                match index.insert_prepared(prepared) {
                    Ok(()) => stats.records += 1 + folded,
                    Err(refused) => {
                        // The id is taken: the object record is skipped, and its blocks go
                        // to the version that holds the id, as they would have one by one.
                        stats.tally(Ok(false));
                        for (block, crc) in refused.folded() {
                            stats.tally(Ok(index.apply_block(refused.version(), block, crc)));
                        }
                    }
                }
            }
            Step::Block(b) => stats.tally(Ok(index.apply_block(b.version, b.block, b.crc))),
            Step::Drop(version) => stats.tally(Ok(index.apply(Record::Drop { version }))),
            Step::Other(record) => stats.tally(Ok(index.apply(*record))),
            Step::Refused(why) => stats.tally(Err(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::record::{
        group_journal_bytes, KIND_BLOCK, KIND_BLOCKS, KIND_DROP, KIND_FRESH, KIND_OBJECT,
        MAX_STORED_HEADER_BYTES,
    };
    use crate::cache::tags::{TagHeader, Tags, MAX_TAGS_PER_VERSION, MAX_TAG_BYTES};
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
                                Just(KIND_FRESH), Just(KIND_BLOCKS), any::<u8>()],
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
            lifetime in proptest::option::of(any::<u32>()),
            initial_age_s in any::<u32>(),
            no_cache in any::<bool>(),
            must_revalidate in any::<bool>(),
            header_len in 0usize..(MAX_STORED_HEADER_BYTES + 40),
            bad_header in any::<bool>(),
            tag_shape in (0usize..(MAX_TAGS_PER_VERSION + 4), 1usize..(MAX_TAG_BYTES + 4), any::<bool>()),
        ) {
            // Tags around their bounds (count, length, total), or one repeated.
            let (tag_count, tag_len, repeat) = tag_shape;
            let mut tags: Vec<String> = (0..tag_count)
                .map(|i| format!("{i:0>width$}", width = tag_len))
                .collect();
            if repeat && tag_count > 1 {
                tags[1] = tags[0].clone();
            }
            // Header lines of about `header_len` bytes, or one with a bare LF inside.
            let mut headers = String::new();
            while headers.len() + 12 <= header_len {
                headers.push_str("X-A: bcdef\r\n");
            }
            if bad_header {
                headers.push_str("X-B: c\nd\r\n");
            }
            let o = ObjectVersion {
                key: vec![b'k'; key_len],
                version: 7,
                size,
                block_bytes: 1 << block_shift,
                fetched_unix_s: 1_764_633_600,
                etag: "e".repeat(etag_len),
                last_modified: String::new(),
                content_type: String::new(),
                freshness: crate::cache::record::Freshness {
                    lifetime_s: lifetime.map(|l| l.min(u32::MAX - 1)),
                    initial_age_s,
                    no_cache,
                    must_revalidate,
                    stale_while_revalidate_s: lifetime.map(|l| l / 2),
                    stale_if_error_s: None,
                },
                headers,
                status: 200,
                selecting: String::new(),
                tags: crate::cache::tags::Tags::unchecked(tags.join(" ")),
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

    /// A version journaled before issue 42 (no freshness, no stored lines: its record ends
    /// after the content type) replays with the defaults; with them it replays whole.
    #[test]
    fn object_records_from_before_the_contract_replay_with_the_defaults() {
        let old = object("/pull/a", 3, 100);
        let mut buf = Vec::new();
        Record::Object(old.clone()).encode(&mut buf);
        // Cut the new fields off the body and frame it again, as an old writer did.
        let body_len = buf.len() - FRAME_BYTES - crate::cache::record::Freshness::BYTES - 2 - 2 - 2;
        let framed = framed(&buf[FRAME_BYTES..FRAME_BYTES + body_len]);
        assert_eq!(
            Record::decode(&framed),
            Decoded::Record(Record::Object(old.clone()), framed.len())
        );
        let kept = ObjectVersion {
            freshness: crate::cache::record::Freshness {
                lifetime_s: Some(60),
                initial_age_s: 5,
                no_cache: false,
                must_revalidate: true,
                stale_while_revalidate_s: Some(30),
                stale_if_error_s: Some(600),
            },
            headers: "Content-Encoding: gzip\r\n".into(),
            ..old
        };
        let mut buf = Vec::new();
        Record::Object(kept.clone()).encode(&mut buf);
        assert_eq!(
            Record::decode(&buf),
            Decoded::Record(Record::Object(kept.clone()), buf.len())
        );
        // Journaled before non-2xx answers were stored (no status): a 200.
        let before_status = super::tests::framed(&buf[FRAME_BYTES..buf.len() - 4]);
        assert_eq!(
            Record::decode(&before_status),
            Decoded::Record(Record::Object(kept.clone()), before_status.len())
        );
        // And before Vary replies were (no selecting lines).
        let before_vary = super::tests::framed(&buf[FRAME_BYTES..buf.len() - 2]);
        assert_eq!(
            Record::decode(&before_vary),
            Decoded::Record(Record::Object(kept.clone()), before_vary.len())
        );
        // A stored redirect, and a Vary reply, replay as they were; a status the cache
        // never keeps is refused.
        let moved = ObjectVersion {
            status: 301,
            selecting: "accept-language: en\r\nx-tier: \r\n".into(),
            ..kept.clone()
        };
        let mut buf = Vec::new();
        Record::Object(moved.clone()).encode(&mut buf);
        assert_eq!(
            Record::decode(&buf),
            Decoded::Record(Record::Object(moved), buf.len())
        );
        for status in [0, 101, 206, 304, 600] {
            let bad = ObjectVersion {
                status,
                ..kept.clone()
            };
            assert_eq!(
                Record::Object(bad).validate(),
                Err(crate::cache::record::Invalid::Status(status))
            );
        }
    }

    /// A version journaled before purge by tag (or untagged: its record ends after the stored
    /// lines) replays with no tags; a tagged one replays with its tags; an empty tag list
    /// written out (which the writer never does) is refused.
    #[test]
    fn object_records_carry_their_tags_and_older_ones_have_none() {
        let old = object("/pull/a", 3, 100);
        let mut untagged = Vec::new();
        Record::Object(old.clone()).encode(&mut untagged);
        assert_eq!(
            Record::decode(&untagged),
            Decoded::Record(Record::Object(old.clone()), untagged.len())
        );
        let tagged = ObjectVersion {
            tags: Tags::parse(TagHeader::SurrogateKey, "build-1234 other").0,
            ..old.clone()
        };
        let mut buf = Vec::new();
        Record::Object(tagged.clone()).encode(&mut buf);
        assert_eq!(buf.len() as u64, Record::object_bytes(&tagged));
        assert_eq!(
            buf.len(),
            untagged.len() + 2 + "build-1234 other".len(),
            "the tags trail the record"
        );
        assert_eq!(
            Record::decode(&buf),
            Decoded::Record(Record::Object(tagged), buf.len())
        );
        let mut body = untagged[FRAME_BYTES..].to_vec();
        body.extend_from_slice(&[0, 0]);
        let empty = framed(&body);
        assert!(matches!(
            Record::decode(&empty),
            Decoded::Refused(Invalid::Malformed, _)
        ));
        let bad = ObjectVersion {
            tags: Tags::unchecked("a a".into()),
            ..old
        };
        let mut buf = Vec::new();
        Record::Object(bad).encode_unchecked(&mut buf);
        assert!(matches!(
            Record::decode(&buf),
            Decoded::Refused(Invalid::FieldLength(3), _)
        ));
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
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        }
    }

    /// `records` as the writer journals them (runs of blocks as `Record::Blocks`).
    fn journal(records: &[Record]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_batch(records, &mut out);
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
                refresh: None,
            },
            Record::Fresh {
                version: 7,
                fetched_unix_s: 1_800_000_100,
                refresh: Some(Box::new(crate::cache::record::Refresh {
                    freshness: crate::cache::record::Freshness {
                        lifetime_s: Some(60),
                        ..Default::default()
                    },
                    headers: "Cache-Control: max-age=60\r\n".into(),
                })),
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
        // Two appends: the last block a record of its own.
        let head_len = journal(&head).len();
        let mut whole = journal(&head);
        whole.extend(journal(&[last]));
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
    fn consecutive_blocks_of_a_version_are_journaled_as_runs_and_replay_as_their_blocks() {
        // 20 blocks of version 1 (a run of 16, then 4), a lone block of version 2, then 1's
        // blocks 20 and 22 (not consecutive with each other: a record each).
        let mut records = vec![
            Record::Object(object("a", 1, 23 << 20)),
            Record::Object(object("b", 2, 1 << 20)),
        ];
        let block = |version, block, crc| Record::Block {
            version,
            block,
            crc,
        };
        records.extend((0..20).map(|b| block(1, b, 100 + b)));
        records.extend([block(2, 0, 7), block(1, 20, 120), block(1, 22, 122)]);
        let bytes = journal(&records);
        let mut decoded = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            match Record::decode(&bytes[at..]) {
                Decoded::Record(r, used) => {
                    decoded.push(r);
                    at += used;
                }
                other => panic!("{other:?} at {at}"),
            }
        }
        let run = |first: u32, crcs: std::ops::Range<u32>| Record::Blocks {
            version: 1,
            first,
            crcs: BlockRun::new(&crcs.collect::<Vec<_>>()).expect("a run"),
        };
        assert_eq!(
            decoded,
            [
                records[0].clone(),
                records[1].clone(),
                run(0, 100..116),
                run(16, 116..120),
                block(2, 0, 7),
                block(1, 20, 120),
                block(1, 22, 122),
            ]
        );
        // Replay: as the records one by one, each block counted.
        let (index, stats) = replay(&bytes);
        let mut one_by_one = Index::default();
        for r in records.iter().cloned() {
            assert!(one_by_one.apply(r));
        }
        assert_eq!(index.contents(), one_by_one.contents());
        assert_eq!(stats.records, records.len() as u64);
        // A game chunk's 4 blocks: one frame of 38 bytes, not 4 of 25.
        let mut four = Vec::new();
        encode_batch(&records[2..6], &mut four);
        assert_eq!((four.len(), 4 * Record::BLOCK_BYTES), (38, 100));
        // A run stops at a multiple of 16: blocks 3..=19 are runs 3..=15 and 16..=19.
        let mut unaligned = Vec::new();
        encode_batch(&records[5..22], &mut unaligned);
        let mut want = Vec::new();
        run(3, 103..116).encode(&mut want);
        run(16, 116..120).encode(&mut want);
        assert_eq!(unaligned, want);
        // Torn anywhere inside, a run is none of its blocks.
        let head = journal(&records[..1]);
        let mut whole = head.clone();
        whole.extend(&four);
        for cut in head.len()..whole.len() {
            let (index, stats) = replay(&whole[..cut]);
            assert_eq!(stats.valid_bytes, head.len() as u64, "cut at {cut}");
            assert_eq!(index.each_block(1).count(), 0, "cut at {cut}");
        }
        assert_eq!(replay(&whole).0.each_block(1).count(), 4);
    }

    /// What `group_journal_bytes` says a group's blocks take is what `encode_batch`
    /// writes for them, for every set of blocks of a group.
    #[test]
    fn a_groups_journal_bytes_are_what_its_blocks_are_written_in() {
        let mut out = Vec::new();
        let mut blocks = Vec::new();
        for present in 0..=u16::MAX {
            blocks.clear();
            blocks.extend(
                (0..16u32)
                    .filter(|i| present & (1 << i) != 0)
                    .map(|i| Record::Block {
                        version: 7,
                        block: 48 + i,
                        crc: i,
                    }),
            );
            out.clear();
            encode_batch(&blocks, &mut out);
            assert_eq!(
                group_journal_bytes(present),
                out.len() as u64,
                "{present:016b}"
            );
        }
        // A whole group is one run; two lone blocks are two block records.
        assert_eq!(group_journal_bytes(u16::MAX), Record::RUN_FIXED_BYTES + 64);
        assert_eq!(group_journal_bytes(0b101), 2 * Record::BLOCK_BYTES);
    }

    #[test]
    fn a_run_that_does_not_fit_is_refused_and_costs_only_itself() {
        let mut bytes = journal(&[Record::Object(object("a", 1, 3 << 20))]);
        for (first, len) in [(0u32, 0usize), (0, BLOCK_RUN_MAX + 1), (u32::MAX, 2)] {
            let crcs = vec![1u32; len];
            let mut body = vec![KIND_BLOCKS];
            body.extend_from_slice(&1u64.to_le_bytes());
            body.extend_from_slice(&first.to_le_bytes());
            body.push(len as u8);
            for crc in &crcs {
                body.extend_from_slice(&crc.to_le_bytes());
            }
            let framed = framed(&body);
            assert!(
                matches!(Record::decode(&framed), Decoded::Refused(Invalid::Malformed, n) if n == framed.len()),
                "first {first}, {len} blocks"
            );
            bytes.extend(framed);
        }
        bytes.extend(journal(&[Record::Block {
            version: 1,
            block: 2,
            crc: 9,
        }]));
        let (index, stats) = replay(&bytes);
        assert_eq!((stats.refused, stats.damaged_tail), (3, false));
        assert_eq!(index.each_block(1).collect::<Vec<_>>(), [(2, 9)]);
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
                refresh: None,
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
        // Blocks as runs, what the index counts as live (every version held is current): one
        // record per version and one per run of consecutive blocks (19's 0, then 2 and 3),
        // a run stopping at a multiple of `BLOCK_RUN_MAX`.
        assert_eq!(snap.len() as u64, index.live_bytes());
        let runs: usize = index
            .each_version()
            .map(|m| {
                let blocks: Vec<u32> = index.each_block(m.version).map(|(b, _)| b).collect();
                (0..blocks.len())
                    .filter(|&i| {
                        i == 0
                            || blocks[i - 1] + 1 != blocks[i]
                            || (blocks[i] as usize).is_multiple_of(BLOCK_RUN_MAX)
                    })
                    .count()
            })
            .sum();
        let mut frames = 0;
        each_record(&snap, |_| frames += 1);
        assert_eq!(frames, index.versions() + runs);
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
            let blocks: Vec<_> = index.each_block(m.version).collect();
            assert_eq!(again.current(&m.key).as_ref(), Some(&m));
            assert_eq!(again.each_block(m.version).collect::<Vec<_>>(), blocks);
        }
        assert_eq!(
            again.block_crc(19, 1),
            None,
            "a forgotten block stays forgotten"
        );
        assert_eq!(again.live_bytes(), index.live_bytes());
    }

    /// One record of a random history: few keys and ids, so ids repeat, blocks land past
    /// their object's end, after their version's drop, twice, and on objects kept inline
    /// (at most 16 blocks) and in a table (more).
    fn any_record() -> impl Strategy<Value = Record> {
        prop_oneof![
            3 => (0u8..4, 1u64..10, 1u64..24).prop_map(|(key, version, blocks)| {
                Record::Object(object(&format!("key-{key}"), version, blocks << 20))
            }),
            6 => (1u64..10, 0u32..26, any::<u32>()).prop_map(|(version, block, crc)| {
                Record::Block { version, block, crc }
            }),
            1 => (1u64..10).prop_map(|version| Record::Drop { version }),
            1 => (1u64..10, 0u64..3).prop_map(|(version, t)| Record::Fresh {
                version,
                fetched_unix_s: 1_764_633_600 + t,
                refresh: None,
            }),
        ]
    }

    /// A record of `any_record`, or a run of 2 to 19 consecutive blocks of one version (as a
    /// fill's synced blocks come, some past their object's end or over `BLOCK_RUN_MAX`).
    fn any_records() -> impl Strategy<Value = Vec<Record>> {
        prop_oneof![
            9 => any_record().prop_map(|r| vec![r]),
            2 => (1u64..10, 0u32..26, 2u32..20, any::<u32>()).prop_map(|(version, first, n, crc)| {
                (first..first + n)
                    .map(|block| Record::Block { version, block, crc: crc ^ block })
                    .collect()
            }),
        ]
    }

    /// Random histories, runs of blocks among them.
    fn any_history() -> impl Strategy<Value = Vec<Record>> {
        proptest::collection::vec(any_records(), 0..40).prop_map(|r| r.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Replay decodes records into steps, folding blocks into the object record before
        /// them, and start-up does it on two threads: both end where applying every record
        /// by itself (`Index::apply`) ends, with the same counts.
        #[test]
        fn replay_and_a_streamed_start_up_match_applying_record_by_record(
            records in any_history(),
        ) {
            let mut one_by_one = Index::default();
            let mut applied = ReplayStats::default();
            for r in &records {
                applied.tally(Ok(one_by_one.apply(r.clone())));
            }
            let bytes = journal(&records);
            let (replayed, stats) = replay(&bytes);
            prop_assert_eq!((stats.records, stats.skipped), (applied.records, applied.skipped));
            prop_assert_eq!(replayed.contents(), one_by_one.contents());

            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal");
            std::fs::write(&path, &bytes).unwrap();
            let (_, opened, opened_stats) =
                crate::cache::journal_file::JournalFile::open(&path).unwrap();
            prop_assert_eq!(opened_stats, stats);
            prop_assert_eq!(opened.contents(), one_by_one.contents());
        }

        /// What the index counts as live (`Index::live_bytes`, which the compaction's
        /// trigger reads) is what a compaction writes for it: more while older versions are
        /// held (the snapshot leaves them out), and exactly that once they are dropped;
        /// blocks forgotten (a stretch cut in two, a run shortened) included.
        #[test]
        fn the_live_bytes_are_what_a_snapshot_of_the_index_takes(
            records in any_history(),
            forgotten in proptest::collection::vec(any::<proptest::sample::Index>(), 0..8),
        ) {
            let mut index = Index::default();
            for r in &records {
                index.apply(r.clone());
            }
            let versions: Vec<u64> = index.each_version_id().collect();
            let present: Vec<(u64, u32)> = versions
                .iter()
                .flat_map(|&v| index.each_block(v).map(move |(b, _)| (v, b)))
                .collect();
            for i in forgotten {
                if let Some(&(version, block)) = present.get(i.index(present.len().max(1))) {
                    index.forget_block(version, block);
                }
            }
            let snap_len = |index: &Index| {
                let mut snap = Vec::new();
                snapshot(index, &mut snap);
                snap.len() as u64
            };
            let stale: Vec<u64> = versions.into_iter().filter(|&v| !index.is_current(v)).collect();
            if !stale.is_empty() {
                prop_assert!(snap_len(&index) < index.live_bytes());
            }
            for version in stale {
                index.apply(Record::Drop { version });
            }
            prop_assert_eq!(snap_len(&index), index.live_bytes());
            // And the snapshot replays to the same count.
            let mut snap = Vec::new();
            snapshot(&index, &mut snap);
            prop_assert_eq!(replay(&snap).0.live_bytes(), snap.len() as u64);
        }

        /// What the writer journals decodes to the same records, each run
        /// (`Record::Blocks`) standing for its blocks in order, and no run could have been
        /// longer: what follows a lone block or a run short of `BLOCK_RUN_MAX` never starts
        /// at its next block.
        #[test]
        fn a_batch_decodes_to_its_records_with_runs_for_their_blocks(records in any_history()) {
            let bytes = journal(&records);
            let (mut back, mut at, mut last_run) = (Vec::new(), 0, None);
            while at < bytes.len() {
                let Decoded::Record(r, used) = Record::decode(&bytes[at..]) else {
                    return Err(TestCaseError::fail(format!("no record at {at}")));
                };
                at += used;
                // The record's version and first block, when it holds blocks.
                let starts = match &r {
                    Record::Block { version, block, .. } => Some((*version, *block)),
                    Record::Blocks { version, first, .. } => Some((*version, *first)),
                    _ => None,
                };
                prop_assert!(
                    last_run.is_none() || starts != last_run,
                    "blocks that could have joined the run before them"
                );
                last_run = None;
                match r {
                    Record::Block { version, block, crc } => {
                        // A run stops at a multiple of BLOCK_RUN_MAX: the next block there
                        // could not have joined.
                        last_run = block
                            .checked_add(1)
                            .filter(|next| !(*next as usize).is_multiple_of(BLOCK_RUN_MAX))
                            .map(|next| (version, next));
                        back.push(Record::Block { version, block, crc });
                    }
                    Record::Blocks { version, first, crcs } => {
                        let len = crcs.as_slice().len();
                        prop_assert!(len >= 2, "a run of one");
                        let group = |b: u32| b as usize / BLOCK_RUN_MAX;
                        prop_assert_eq!(group(first), group(first + len as u32 - 1), "a run across a group");
                        let next = first + len as u32;
                        if !(next as usize).is_multiple_of(BLOCK_RUN_MAX) {
                            last_run = Some((version, next));
                        }
                        back.extend(crcs.numbered(first).map(|(block, crc)| Record::Block { version, block, crc }));
                    }
                    r => back.push(r),
                }
            }
            prop_assert_eq!(back, records);
        }
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
        assert_eq!(index.current_version(b"b"), Some(4));
        assert_eq!(index.block_crc(4, 0), Some(9));
        assert_eq!(index.keys(), 2);
    }
}
