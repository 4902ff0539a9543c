//! What the cache holds, in memory: each key's current version and the blocks of each version
//! that are on disk, with their checksums. Built by replaying the journal; every change goes
//! through `Index::apply`, the same function replay uses, so a running cache and one rebuilt
//! after a crash agree. A version is held as its object record's body (one allocation for
//! every string) and its block table; keys are found by a hash and checked in the version
//! found, never held twice.

use std::collections::HashMap;

use super::id_hash::Ids;

pub use super::record::ObjectVersion;
use super::record::{group_journal_bytes, Invalid, ObjectView, Record, BLOCK_RUN_MAX, FRAME_BYTES};

/// Blocks a page of a `BlockTable` covers at most.
const PAGE_BLOCKS: u32 = 256;

/// The checksums of up to 256 consecutive blocks, and which of them are on disk: as many as
/// the object has from the page's first block (a 4-block object's page holds 4). One
/// allocation: `len` checksums, then the presence bits in `len.div_ceil(32)` words.
#[derive(Clone, Debug)]
struct Page {
    number: u32,
    len: u32,
    count: u32,
    words: Box<[u32]>,
}

impl Page {
    fn new(number: u32, len: usize) -> Page {
        Page {
            number,
            len: len as u32,
            count: 0,
            words: vec![0; len + len.div_ceil(32)].into_boxed_slice(),
        }
    }

    fn present(&self, i: usize) -> bool {
        i < self.len as usize && self.words[self.len as usize + i / 32] & (1 << (i % 32)) != 0
    }

    fn set_present(&mut self, i: usize, on: bool) {
        let w = &mut self.words[self.len as usize + i / 32];
        if on {
            *w |= 1 << (i % 32);
        } else {
            *w &= !(1 << (i % 32));
        }
    }
}

/// The checksums of a version's blocks on disk, in pages allocated as blocks arrive (kept
/// sorted by page number): its memory follows what is stored, never the size the origin
/// claims. An object of at most `PAGE_BLOCKS` blocks (nearly all) holds its one page inline.
#[derive(Clone, Debug, Default)]
enum BlockTable {
    #[default]
    Empty,
    One(Page),
    Many(Vec<Page>),
}

impl BlockTable {
    fn pages(&self) -> &[Page] {
        match self {
            BlockTable::Empty => &[],
            BlockTable::One(p) => std::slice::from_ref(p),
            BlockTable::Many(v) => v,
        }
    }

    fn page(&self, number: u32) -> Option<&Page> {
        let pages = self.pages();
        let i = pages.binary_search_by_key(&number, |p| p.number).ok()?;
        Some(&pages[i])
    }

    fn get(&self, block: u32) -> Option<u32> {
        let page = self.page(block / PAGE_BLOCKS)?;
        let i = (block % PAGE_BLOCKS) as usize;
        page.present(i).then(|| page.words[i])
    }

    /// The page numbered `number`, made with `len` blocks if it is not there.
    fn page_mut(&mut self, number: u32, len: usize) -> &mut Page {
        if let BlockTable::Empty = self {
            *self = BlockTable::One(Page::new(number, len));
        }
        if let BlockTable::One(p) = self {
            if p.number == number {
                return match self {
                    BlockTable::One(p) => p,
                    _ => unreachable!("just matched"),
                };
            }
            let BlockTable::One(p) = std::mem::take(self) else {
                unreachable!("just matched")
            };
            *self = BlockTable::Many(vec![p]);
        }
        let BlockTable::Many(pages) = self else {
            unreachable!("Empty and One are handled above")
        };
        let at = match pages.binary_search_by_key(&number, |p| p.number) {
            Ok(at) => at,
            Err(at) => {
                pages.insert(at, Page::new(number, len));
                at
            }
        };
        &mut pages[at]
    }

    /// Sets block `block`'s checksum (of an object of `blocks` blocks); true when it was not
    /// present before.
    fn set(&mut self, block: u32, crc: u32, blocks: u64) -> bool {
        let number = block / PAGE_BLOCKS;
        let first = u64::from(number) * u64::from(PAGE_BLOCKS);
        let len = blocks.saturating_sub(first).min(u64::from(PAGE_BLOCKS)) as usize;
        let page = self.page_mut(number, len);
        let i = (block % PAGE_BLOCKS) as usize;
        assert!(
            i < page.len as usize,
            "block {block} past its object's {blocks}"
        );
        page.words[i] = crc;
        let new = !page.present(i);
        page.set_present(i, true);
        page.count += u32::from(new);
        new
    }

    /// Forgets block `block`; true when it was present.
    fn take(&mut self, block: u32) -> bool {
        let number = block / PAGE_BLOCKS;
        let i = (block % PAGE_BLOCKS) as usize;
        let emptied = match self {
            BlockTable::Empty => return false,
            BlockTable::One(p) => {
                if p.number != number || !p.present(i) {
                    return false;
                }
                p.set_present(i, false);
                p.count -= 1;
                p.count == 0
            }
            BlockTable::Many(pages) => {
                let Ok(at) = pages.binary_search_by_key(&number, |p| p.number) else {
                    return false;
                };
                let p = &mut pages[at];
                if !p.present(i) {
                    return false;
                }
                p.set_present(i, false);
                p.count -= 1;
                if p.count == 0 {
                    pages.remove(at);
                }
                false
            }
        };
        if emptied {
            *self = BlockTable::Empty;
        }
        true
    }

    /// Blocks present.
    fn present(&self) -> u32 {
        self.pages().iter().map(|p| p.count).sum()
    }

    /// Which blocks of `block`'s aligned group of `BLOCK_RUN_MAX` are present (bit `i`: the
    /// group's block `i`). A page's presence word holds two groups (pages start at
    /// multiples of 256).
    fn group(&self, block: u32) -> u16 {
        let Some(page) = self.page(block / PAGE_BLOCKS) else {
            return 0;
        };
        let i = (block % PAGE_BLOCKS) as usize;
        if i >= page.len as usize {
            return 0;
        }
        let word = page.words[page.len as usize + i / 32];
        (word >> (i / BLOCK_RUN_MAX % 2 * BLOCK_RUN_MAX)) as u16
    }

    /// Journal bytes its blocks take as a compaction writes them (`group_journal_bytes`
    /// over each aligned group).
    fn journal_bytes(&self) -> u64 {
        self.pages()
            .iter()
            .flat_map(|p| &p.words[p.len as usize..])
            .map(|&w| group_journal_bytes(w as u16) + group_journal_bytes((w >> 16) as u16))
            .sum()
    }

    /// The blocks present and their checksums, in order.
    fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.pages().iter().flat_map(|page| {
            (0..page.len as usize)
                .filter(|&i| page.present(i))
                .map(move |i| (page.number * PAGE_BLOCKS + i as u32, page.words[i]))
        })
    }
}

/// Blocks an object may span for its blocks' checksums to live in its version's own
/// allocation, after its record's body (nearly every chunk of a game's depot); a larger one
/// keeps them in a `BlockTable`, which grows with what is stored.
const INLINE_BLOCKS: u64 = 16;

/// A version as the index holds it, one allocation and nothing beside it: its object
/// record's body in the index's form (`ObjectView::compact`: the key and every string, read
/// in place when asked for, without the version its slot is keyed by), then, for an object
/// of at most `INLINE_BLOCKS` blocks, its blocks' checksums (4 bytes each) and which of them
/// are on disk (`INLINE_PRESENT_BYTES`, bit `i`: block `i`). Where the body ends and how many
/// blocks are on disk follow from the body's size fields and those bits, so a slot of the
/// table of versions is 24 bytes: the id and the pointer. A larger object's checksums are in
/// the index's `tables`, beside it.
#[derive(Debug)]
struct Stored {
    data: Box<[u8]>,
}

/// Bytes of the inline blocks' presence bits, after their checksums.
const INLINE_PRESENT_BYTES: usize = 2;

// The inline blocks' presence bits fit their bytes.
const _: () = assert!(INLINE_BLOCKS <= 8 * INLINE_PRESENT_BYTES as u64);

// The slot the comment on `Stored` counts on.
const _: () = assert!(std::mem::size_of::<(u64, Stored)>() == 24);

/// Bytes after the body of a version keeping `inline` blocks' checksums in its allocation.
fn inline_tail_bytes(inline: usize) -> usize {
    if inline == 0 {
        0
    } else {
        4 * inline + INLINE_PRESENT_BYTES
    }
}

/// Where the key sits in a body in the index's form (`ObjectView::compact`): after its
/// length; the size, block size and fetch time follow it.
const BODY_KEY_AT: usize = 2;

/// The fixed fields of a body in the index's form, read in place (it was checked when it
/// came in).
struct Fixed<'a>(&'a [u8]);

impl<'a> Fixed<'a> {
    fn key(&self) -> &'a [u8] {
        let len = u16::from_le_bytes([self.0[0], self.0[1]]) as usize;
        &self.0[BODY_KEY_AT..BODY_KEY_AT + len]
    }

    /// The 8 bytes at `at` past the key.
    fn u64_after_key(&self, at: usize) -> u64 {
        let from = BODY_KEY_AT + self.key().len() + at;
        u64::from_le_bytes(self.0[from..from + 8].try_into().expect("8 bytes"))
    }

    fn size(&self) -> u64 {
        self.u64_after_key(0)
    }

    fn block_bytes(&self) -> u32 {
        let from = BODY_KEY_AT + self.key().len() + 8;
        u32::from_le_bytes(self.0[from..from + 4].try_into().expect("4 bytes"))
    }

    fn blocks(&self) -> u64 {
        self.size().div_ceil(u64::from(self.block_bytes()))
    }

    /// Where `fetched_unix_s` sits (after the size and the block size).
    fn fetched_at(&self) -> usize {
        BODY_KEY_AT + self.key().len() + 8 + 4
    }

    fn fetched_unix_s(&self) -> u64 {
        let at = self.fetched_at();
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// Blocks whose checksums a version of `blocks` blocks keeps inline (0: in a `BlockTable`).
fn inline_blocks(blocks: u64) -> usize {
    if blocks <= INLINE_BLOCKS {
        blocks as usize
    } else {
        0
    }
}

impl Stored {
    fn new(meta: &ObjectVersion) -> Stored {
        Stored::of_body(compact(
            meta,
            inline_tail_bytes(inline_blocks(meta.blocks())),
        ))
    }

    /// A version of the body `data` holds (in the index's form, checked), with no block on
    /// disk; the inline checksums follow it (room the caller reserved: nothing is moved).
    fn of_body(mut data: Vec<u8>) -> Stored {
        let inline = inline_blocks(Fixed(&data).blocks());
        data.resize(data.len() + inline_tail_bytes(inline), 0);
        Stored {
            data: data.into_boxed_slice(),
        }
    }

    /// Where the body ends (the inline checksums begin), for an object of `blocks` blocks.
    fn body_len(&self, blocks: u64) -> usize {
        self.data.len() - inline_tail_bytes(inline_blocks(blocks))
    }

    fn body(&self) -> &[u8] {
        &self.data[..self.body_len(self.blocks())]
    }

    /// Which inline blocks are on disk (bit `i`: block `i`), of an object of `blocks` blocks.
    fn inline_present(&self, blocks: u64) -> u16 {
        if inline_blocks(blocks) == 0 {
            return 0;
        }
        let at = self.data.len() - INLINE_PRESENT_BYTES;
        u16::from_le_bytes([self.data[at], self.data[at + 1]])
    }

    fn set_inline_present(&mut self, bits: u16) {
        let at = self.data.len() - INLINE_PRESENT_BYTES;
        self.data[at..].copy_from_slice(&bits.to_le_bytes());
    }

    /// Blocks on disk: counted in the inline bits, or in `table` (this version's in the
    /// index's `tables`, for an object over `INLINE_BLOCKS` blocks).
    fn present(&self, table: Option<&BlockTable>) -> u32 {
        let blocks = self.blocks();
        if blocks > INLINE_BLOCKS {
            table.map_or(0, BlockTable::present)
        } else {
            self.inline_present(blocks).count_ones()
        }
    }

    /// Version `version` (this one's id), read in place.
    fn view(&self, version: u64) -> ObjectView<'_> {
        ObjectView::parse_compact(self.body(), version).expect("a body the index checked")
    }

    fn key(&self) -> &[u8] {
        Fixed(&self.data).key()
    }

    fn size(&self) -> u64 {
        Fixed(&self.data).size()
    }

    fn block_bytes(&self) -> u32 {
        Fixed(&self.data).block_bytes()
    }

    fn blocks(&self) -> u64 {
        Fixed(&self.data).blocks()
    }

    fn meta(&self, version: u64) -> ObjectVersion {
        self.view(version).to_owned()
    }

    /// Bytes on disk, with `present` blocks there.
    fn stored_bytes(&self, present: u32) -> u64 {
        (u64::from(present) * u64::from(self.block_bytes())).min(self.size())
    }

    /// Journal bytes its records take as a compaction writes them, framed: the object's,
    /// and its blocks' (those in `table` for a large object).
    fn journal_bytes(&self, table: Option<&BlockTable>) -> u64 {
        self.record_bytes() + self.blocks_journal_bytes(table)
    }

    /// Journal bytes its blocks take as a compaction writes them (runs, `encode_batch`).
    fn blocks_journal_bytes(&self, table: Option<&BlockTable>) -> u64 {
        let blocks = self.blocks();
        if blocks > INLINE_BLOCKS {
            table.map_or(0, BlockTable::journal_bytes)
        } else {
            // At most 16 blocks: one group.
            group_journal_bytes(self.inline_present(blocks))
        }
    }

    /// Journal bytes its object record takes, framed.
    fn record_bytes(&self) -> u64 {
        (FRAME_BYTES + ObjectView::compact_record_len(self.body())) as u64
    }

    /// Its body replaced by `meta`'s (a confirmation's new lines), its blocks kept.
    fn rewrite(&mut self, meta: &ObjectVersion) {
        let blocks = self.blocks();
        debug_assert_eq!(blocks, meta.blocks(), "a confirmation keeps the size");
        let tail = &self.data[self.body_len(blocks)..];
        let mut body = compact(meta, tail.len());
        body.extend_from_slice(tail);
        self.data = body.into_boxed_slice();
    }

    /// Where inline block `i`'s checksum sits (of an object of `blocks` blocks).
    fn crc_at(&self, i: usize, blocks: u64) -> usize {
        self.body_len(blocks) + 4 * i
    }

    /// Block `block`'s checksum, kept inline (an object of at most `INLINE_BLOCKS` blocks,
    /// `blocks` of them).
    fn get_inline(&self, block: u32, blocks: u64) -> Option<u32> {
        let i = block as usize;
        (i < inline_blocks(blocks) && self.inline_present(blocks) & (1 << i) != 0).then(|| {
            let at = self.crc_at(i, blocks);
            u32::from_le_bytes(self.data[at..at + 4].try_into().expect("4 bytes"))
        })
    }

    /// Sets inline block `block`'s checksum (it is within the object, of `blocks` blocks, at
    /// most `INLINE_BLOCKS`); true when it was not present.
    fn set_inline(&mut self, block: u32, crc: u32, blocks: u64) -> bool {
        let i = block as usize;
        assert!(
            i < inline_blocks(blocks),
            "block {block} past its object's {blocks} inline"
        );
        let at = self.crc_at(i, blocks);
        self.data[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        let bits = self.inline_present(blocks);
        self.set_inline_present(bits | 1 << i);
        bits & (1 << i) == 0
    }

    /// Forgets inline block `block` (of an object of `blocks` blocks); true when it was
    /// present.
    fn take_inline(&mut self, block: u32, blocks: u64) -> bool {
        let i = block as usize;
        let bits = self.inline_present(blocks);
        let was = i < inline_blocks(blocks) && bits & (1 << i) != 0;
        if was {
            self.set_inline_present(bits & !(1 << i));
        }
        was
    }

    /// The inline blocks present and their checksums, in order.
    fn each_inline(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let blocks = self.blocks();
        (0..inline_blocks(blocks) as u32)
            .filter_map(move |b| self.get_inline(b, blocks).map(|crc| (b, crc)))
    }
}

/// `meta`'s body in the index's form (`ObjectView::compact`), with room for
/// `room_after` bytes of checksums after it.
fn compact(meta: &ObjectVersion, room_after: usize) -> Vec<u8> {
    meta.view().compact(room_after)
}

/// A version's blocks: inline in it, or, over `INLINE_BLOCKS`, in the table beside it.
fn blocks_of<'a>(
    s: &'a Stored,
    table: Option<&'a BlockTable>,
) -> Box<dyn Iterator<Item = (u32, u32)> + 'a> {
    match table {
        Some(t) => Box::new(t.iter()),
        None => Box::new(s.each_inline()),
    }
}

/// The hash of a cache key (SipHash), keyed per process (a client cannot aim two keys at
/// one slot): the table of current versions holds it beside the version's id instead of a
/// copy of the key, and a lookup checks the key itself in the version it finds. One key for
/// the whole process, so every index hashes a key alike and a join of two moves hashes
/// instead of hashing keys again (`Index::join`).
#[derive(Clone, Debug)]
struct KeyHasher {
    keys: std::hash::RandomState,
    /// Tests: every key hashes alike, so two keys meet in one slot.
    #[cfg(test)]
    collide: bool,
}

impl Default for KeyHasher {
    fn default() -> KeyHasher {
        static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
        KeyHasher {
            keys: KEYS.get_or_init(std::hash::RandomState::new).clone(),
            #[cfg(test)]
            collide: false,
        }
    }
}

impl KeyHasher {
    /// Whether `other` hashes every key as this one does (always, but for tests' colliding
    /// hashers).
    fn same_as(&self, other: &KeyHasher) -> bool {
        #[cfg(test)]
        if self.collide != other.collide {
            return false;
        }
        let _ = other;
        true
    }

    fn hash(&self, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        #[cfg(test)]
        if self.collide {
            return 7;
        }
        self.keys.hash_one(key)
    }
}

/// A slot of the table of current versions: the key's hash (so the table grows without
/// hashing keys again) and its current version's id, where the key is checked.
#[derive(Clone, Copy, Debug)]
struct Current {
    hash: u64,
    version: u64,
}

// The slot the comment on `Index::current` counts on: 16 bytes, no padding.
const _: () = assert!(std::mem::size_of::<Current>() == 16);

/// The hash a table of current versions keeps each slot under (when it grows).
fn current_hash(c: &Current) -> u64 {
    c.hash
}

/// An object record's version, checked and in its allocation, ready to insert
/// (`Index::insert_prepared`): the part of a replay that needs no table, so a reading
/// thread does it while another inserts.
#[derive(Debug)]
pub struct Prepared {
    version: u64,
    stored: Stored,
    /// The object's blocks (read once: each folded block checks against it).
    blocks: u64,
    /// The checksums of an object over `INLINE_BLOCKS` blocks, folded in.
    table: Option<BlockTable>,
    /// Blocks folded in (counted as they are, not from the body and its bits again).
    present: u32,
}

impl Prepared {
    /// The version `body_in` (an object record's body) holds, with its id moved to disk slot
    /// `slot` when one is given. Err when `ObjectVersion::validate` refuses it.
    pub fn from_body(body_in: &[u8], slot: Option<usize>) -> Result<Prepared, Invalid> {
        let view = ObjectView::parse(body_in).ok_or(Invalid::Malformed)?;
        view.validate()?;
        let version = slot.map_or(view.version, |s| {
            super::version_id::on_slot(view.version, s)
        });
        // The index keys the version by its id (moved to the slot), not holding it in the body.
        let body = view.compact(inline_tail_bytes(inline_blocks(view.blocks())));
        Ok(Prepared {
            version,
            stored: Stored::of_body(body),
            blocks: view.blocks(),
            table: None,
            present: 0,
        })
    }

    /// The version's id (its slot included).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Takes the block record `(block, crc)` of this version into it before it is inserted,
    /// when applying it after the insert would do the same: a block within the object and not
    /// taken already. False (nothing taken) otherwise: the record is applied on its own.
    pub fn fold_block(&mut self, block: u32, crc: u32) -> bool {
        let blocks = self.blocks;
        if u64::from(block) >= blocks {
            return false;
        }
        let new = if blocks > INLINE_BLOCKS {
            let table = self.table.get_or_insert_default();
            table.get(block).is_none() && table.set(block, crc, blocks)
        } else {
            self.stored.get_inline(block, blocks).is_none()
                && self.stored.set_inline(block, crc, blocks)
        };
        self.present += u32::from(new);
        new
    }

    /// Block records taken in (`fold_block`).
    pub fn folded_blocks(&self) -> u32 {
        debug_assert_eq!(self.present, self.stored.present(self.table.as_ref()));
        self.present
    }

    /// The blocks taken in, as records: what a refused insert applies one by one.
    pub fn folded(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        blocks_of(&self.stored, self.table.as_ref())
    }
}

/// Changes to the table of current versions a replay holds back at most
/// (`Index::hold_current_changes`), 2 MiB of them. Made in slot order, a batch's inserts
/// are independent of one another and near their neighbours, so the processor overlaps
/// their cache misses: at 10 million objects, replay's applying thread took half the time.
/// More (up to 2^20 were tried) was no faster, and stops the applying thread longer.
/// (Tests: a few, so their replays make changes in several batches.)
const HELD_CHANGES: usize = if cfg!(test) { 8 } else { 1 << 16 };

/// A change to the table of current versions, held back (`Index::change_current_or_hold`).
#[derive(Clone, Copy, Debug)]
struct HeldChange {
    hash: u64,
    version: u64,
    /// Makes `version` current (else: `version` stops being current, if it is).
    set: bool,
}

/// The cache's contents.
#[derive(Debug, Default)]
pub struct Index {
    /// Each key's current version, under the key's hash, 16 bytes a slot: a slot is a key's
    /// when the hash matches and its version holds the key (`current_id`), so two keys of one
    /// hash are both current, and no lookup returns another key's version.
    current: hashbrown::HashTable<Current>,
    /// Held in the table's slots (24 bytes each: the id and `Stored`, one allocation).
    versions: HashMap<u64, Stored, Ids>,
    /// The block checksums of versions over `INLINE_BLOCKS` blocks with any on disk.
    tables: HashMap<u64, BlockTable, Ids>,
    key_hasher: KeyHasher,
    /// Changes to `current` held back by a replay (`hold_current_changes`), made in the order
    /// of their slots when it has many: applied one by one, each would miss the caches.
    held: Option<Vec<HeldChange>>,
    /// Versions dropped while changes are held back, until those are made: a held change
    /// naming one cannot read its key from `versions` for sure (the id may be held again).
    dropped_while_held: std::collections::HashSet<u64, Ids>,
    /// Journal bytes a snapshot of every version held would take (`journal::snapshot`
    /// writes only the current ones, so this bounds it from above).
    live_bytes: u64,
    /// Blocks on disk over every version held (a version's own count is read from its
    /// allocation: summing those at start-up missed the caches once a version).
    blocks_held: u64,
}

impl Index {
    /// An empty index with room for `versions` versions (replay sizes it from the journal, so
    /// a rebuild does not grow its tables a step at a time).
    pub fn with_capacity(versions: usize) -> Index {
        Index {
            current: hashbrown::HashTable::with_capacity(versions),
            versions: HashMap::with_capacity_and_hasher(versions, Ids::default()),
            tables: HashMap::default(),
            key_hasher: KeyHasher::default(),
            held: None,
            dropped_while_held: Default::default(),
            live_bytes: 0,
            blocks_held: 0,
        }
    }

    /// From now until `make_held_changes`, changes to the table of current versions are held
    /// back and made in batches of `HELD_CHANGES`, in the order of their slots, each key's
    /// own in the order they came. A replay's inserts come in journal order, so each would
    /// miss the caches in a table of tens of millions of slots; in slot order, neighbours
    /// follow one another. No lookup is answered meanwhile (replay only applies records).
    pub fn hold_current_changes(&mut self) {
        self.held
            .get_or_insert_with(|| Vec::with_capacity(HELD_CHANGES));
    }

    /// Makes the changes held back (`hold_current_changes`) and stops holding them.
    pub fn make_held_changes(&mut self) {
        if let Some(mut held) = self.held.take() {
            self.make_changes(&mut held);
        }
    }

    /// Makes `held` (emptied), in the order of the slots they fall in; a stable sort keeps
    /// one key's changes in the order they came, and changes of different keys commute.
    fn make_changes(&mut self, held: &mut Vec<HeldChange>) {
        // The table's slot is the hash's low bits: the mask of a table twice as large orders
        // by them as well (a slot's two halves follow each other).
        let buckets = (self.current.capacity() + held.len()).max(8) * 8 / 7;
        let mask = (buckets.next_power_of_two() as u64) * 2 - 1;
        held.sort_by_key(|c| c.hash & mask);
        for c in held.drain(..) {
            self.change_current(c);
        }
        self.dropped_while_held.clear();
    }

    /// Makes one change to the table of current versions.
    fn change_current(&mut self, c: HeldChange) {
        if c.set {
            self.set_current(c.hash, c.version);
        } else {
            self.unset_current(c.hash, c.version);
        }
    }

    /// Makes `version` (its key of hash `hash`) its key's current version, in place of the
    /// key's slot if it has one. A replay's held-back changes may name a version dropped
    /// since, its id perhaps held again by another key (`dropped_while_held`): where either
    /// side's key cannot be read for sure, the hashes alone decide, so two keys of one hash
    /// (a 2^-64 chance a pair) in such a batch can cost one its slot: a miss, never another
    /// key's version.
    fn set_current(&mut self, hash: u64, version: u64) {
        let dropped = &self.dropped_while_held;
        let versions = &self.versions;
        let key_of = |v: u64| match dropped.is_empty() || !dropped.contains(&v) {
            true => versions.get(&v).map(Stored::key),
            false => None,
        };
        // Keys are read only for a slot of the same hash: a replay's changes come in the
        // order of their slots, and reading each version's key would miss the caches twice.
        let same_key = |c: &Current| {
            c.hash == hash
                && match (key_of(version), key_of(c.version)) {
                    (Some(key), Some(here)) => here == key,
                    _ => true,
                }
        };
        match self.current.entry(hash, same_key, current_hash) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => slot.get_mut().version = version,
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(Current { hash, version });
            }
        }
    }

    /// `version` (its key of hash `hash`) stops being its key's current version, if it is.
    fn unset_current(&mut self, hash: u64, version: u64) {
        if let Ok(slot) = self
            .current
            .find_entry(hash, |c| c.hash == hash && c.version == version)
        {
            slot.remove();
        }
    }

    /// Makes, or holds back, a change to the table of current versions: `set` makes `version`
    /// the current one of the key of `hash`; otherwise `version` stops being it, if it is.
    fn change_current_or_hold(&mut self, hash: u64, version: u64, set: bool) {
        let c = HeldChange { hash, version, set };
        let Some(held) = &mut self.held else {
            return self.change_current(c);
        };
        held.push(c);
        if held.len() >= HELD_CHANGES {
            let mut held = self.held.take().expect("held above");
            self.make_changes(&mut held);
            self.held = Some(held);
        }
    }

    /// Makes room for `versions` more versions (a join of several disks' indexes, sized once).
    pub fn reserve(&mut self, versions: usize) {
        self.current.reserve(versions, current_hash);
        self.versions.reserve(versions);
    }

    /// Versions its tables hold without growing: (the table of versions, that of keys).
    #[cfg(test)]
    pub fn table_capacity(&self) -> (usize, usize) {
        (self.versions.capacity(), self.current.capacity())
    }

    /// Gives back the room its tables hold beyond what they need (replay sizes them from the
    /// journal's length, an estimate from above).
    pub fn shrink_to_fit(&mut self) {
        self.current.shrink_to_fit(current_hash);
        self.versions.shrink_to_fit();
    }

    /// The id of `key`'s current version: the version its hash names, if that version is `key`'s.
    fn current_id(&self, key: &[u8]) -> Option<u64> {
        debug_assert!(self.held.is_none(), "a lookup while changes are held back");
        let hash = self.key_hasher.hash(key);
        let versions = &self.versions;
        let found = self.current.find(hash, |c| {
            c.hash == hash && versions.get(&c.version).is_some_and(|s| s.key() == key)
        })?;
        Some(found.version)
    }

    /// Applies one change; false when it names nothing the index has (it changes nothing).
    pub fn apply(&mut self, record: Record) -> bool {
        match record {
            Record::Object(meta) => {
                if !meta.is_valid() || self.versions.contains_key(&meta.version) {
                    return false;
                }
                self.insert(meta.version, Stored::new(&meta));
                true
            }
            Record::Block {
                version,
                block,
                crc,
            } => self.apply_block(version, block, crc),
            Record::Blocks {
                version,
                first,
                crcs,
            } => {
                // As its blocks' records one by one: applied when any names a block held.
                let mut applied = false;
                for (block, crc) in crcs.numbered(first) {
                    applied |= self.apply_block(version, block, crc);
                }
                applied
            }
            Record::Drop { version } => {
                let Some(s) = self.versions.remove(&version) else {
                    return false;
                };
                let table = self.tables.remove(&version);
                let present = s.present(table.as_ref());
                self.live_bytes -= s.journal_bytes(table.as_ref());
                self.blocks_held -= u64::from(present);
                let hash = self.key_hasher.hash(s.key());
                if self.held.is_some() {
                    self.dropped_while_held.insert(version);
                }
                self.change_current_or_hold(hash, version, false);
                true
            }
            Record::Fresh {
                version,
                fetched_unix_s,
                refresh,
            } => {
                let Some(s) = self.versions.get_mut(&version) else {
                    return false;
                };
                if fetched_unix_s < Fixed(&s.data).fetched_unix_s() {
                    // An older confirmation changes nothing.
                    return true;
                }
                let Some(r) = refresh else {
                    // The time alone: its 8 bytes, in place.
                    let at = Fixed(&s.data).fetched_at();
                    s.data[at..at + 8].copy_from_slice(&fetched_unix_s.to_le_bytes());
                    return true;
                };
                let mut meta = s.meta(version);
                meta.fetched_unix_s = fetched_unix_s;
                meta.freshness = r.freshness;
                meta.headers = r.headers;
                self.live_bytes -= s.record_bytes();
                s.rewrite(&meta);
                self.live_bytes += s.record_bytes();
                true
            }
        }
    }

    /// Applies a block record (`Record::Block`): replay's path for the commonest record, with
    /// nothing decoded into a `Record`. False when it names no version held, or a block past
    /// the version's end.
    pub fn apply_block(&mut self, version: u64, block: u32, crc: u32) -> bool {
        let Some(s) = self.versions.get_mut(&version) else {
            return false;
        };
        let blocks = s.blocks();
        if u64::from(block) >= blocks {
            return false;
        }
        let (new, group) = if blocks > INLINE_BLOCKS {
            let table = self.tables.entry(version).or_default();
            let group = table.group(block);
            (table.set(block, crc, blocks), group)
        } else {
            let group = s.inline_present(blocks);
            (s.set_inline(block, crc, blocks), group)
        };
        if new {
            // The block may join runs either side of it: its group is written anew.
            self.count_group_again(group, group | 1 << (block as usize % BLOCK_RUN_MAX));
            self.blocks_held += 1;
        }
        true
    }

    /// Inserts a version `Prepared::from_body` made (with the blocks folded into it), as its
    /// key's current one; when its id is taken, changes nothing and gives it back. The key is
    /// hashed here, on the thread that owns the index (replay's reader has the rest to do).
    pub fn insert_prepared(&mut self, prepared: Prepared) -> Result<(), Prepared> {
        // One probe of the versions' table finds the id free and takes its slot.
        let std::collections::hash_map::Entry::Vacant(slot_of_id) =
            self.versions.entry(prepared.version)
        else {
            return Err(prepared);
        };
        self.live_bytes += prepared
            .stored
            .blocks_journal_bytes(prepared.table.as_ref());
        self.blocks_held += u64::from(prepared.folded_blocks());
        let stored = prepared.stored;
        self.live_bytes += stored.record_bytes();
        if let Some(table) = prepared.table {
            self.tables.insert(prepared.version, table);
        }
        let hash = self.key_hasher.hash(stored.key());
        slot_of_id.insert(stored);
        self.change_current_or_hold(hash, prepared.version, true);
        Ok(())
    }

    /// Moves every current version of `from` (another disk's index: its ids on another
    /// slot), with its body and blocks, into this index as its key's current version: what
    /// `adopt` of each would do. A key current here in a newer version (a higher file
    /// number: a disk that came back after its keys were filled again elsewhere) keeps it,
    /// and `from`'s is left out, as are its versions that are not current.
    ///
    /// In batches of `HELD_CHANGES`: the keys in the order of `from`'s table of current
    /// versions (every index hashes alike, so that is the order of this one's slots too),
    /// then the versions in the order of their ids, so neither table is probed at random.
    pub fn join(&mut self, mut from: Index) {
        debug_assert!(self.held.is_none() && from.held.is_none());
        let same_hasher = self.key_hasher.same_as(&from.key_hasher);
        let current = std::mem::take(&mut from.current);
        // Every version of `from` current (how a replay ends but for a crash between a new
        // version and its old one's drop): the versions move at the end, none read.
        let all_current = current.len() == from.versions.len();
        let mut kept_out: Vec<u64> = Vec::new();
        let mut keys = current.into_iter();
        let mut batch: Vec<Current> = Vec::with_capacity(HELD_CHANGES);
        let mut moving: Vec<u64> = Vec::with_capacity(HELD_CHANGES);
        loop {
            batch.clear();
            batch.extend(keys.by_ref().take(HELD_CHANGES));
            if batch.is_empty() {
                break;
            }
            for &Current { hash, version } in &batch {
                // `from`'s current versions are held, each under its key's hash. A slot
                // taken earlier in this batch names a version still in `from`.
                // Read only for a slot of the same hash (or another hasher), so a batch in
                // slot order does not miss the caches on each version's key.
                let key = || from.versions[&version].key();
                let hash = if same_hasher {
                    hash
                } else {
                    self.key_hasher.hash(key())
                };
                let versions = (&self.versions, &from.versions);
                let same_key = |c: &Current| {
                    c.hash == hash
                        && versions
                            .0
                            .get(&c.version)
                            .or_else(|| versions.1.get(&c.version))
                            .is_some_and(|s| s.key() == key())
                };
                match self.current.entry(hash, same_key, current_hash) {
                    hashbrown::hash_table::Entry::Occupied(mut here) => {
                        use super::version_id::file_number;
                        if file_number(here.get().version) > file_number(version) {
                            kept_out.push(version);
                            continue;
                        }
                        here.get_mut().version = version;
                    }
                    hashbrown::hash_table::Entry::Vacant(slot) => {
                        slot.insert(Current { hash, version });
                    }
                }
                if !all_current {
                    moving.push(version);
                }
            }
            moving.sort_unstable();
            for version in moving.drain(..) {
                let stored = from.versions.remove(&version).expect("held, above");
                let table = from.tables.remove(&version);
                let present = stored.present(table.as_ref());
                self.live_bytes += stored.journal_bytes(table.as_ref());
                self.blocks_held += u64::from(present);
                if let Some(table) = table {
                    self.tables.insert(version, table);
                }
                let before = self.versions.insert(version, stored);
                assert!(before.is_none(), "two disks' versions share an id");
            }
        }
        if all_current {
            self.take_all_but(from, &kept_out);
        }
    }

    /// The end of a `join` where every version of `from` was current: all of them but
    /// `kept_out` (a newer version here keeps their keys) move, in the order of `from`'s
    /// table, so this one's is filled in near order too (both hash ids alike), and none is
    /// read: the bytes and blocks are `from`'s totals less those kept out. (Moved by id, each
    /// version read for its counts, the join of two disks of 5 million objects took longer
    /// than either replay.)
    fn take_all_but(&mut self, mut from: Index, kept_out: &[u64]) {
        let kept_out: std::collections::HashSet<u64, Ids> = kept_out.iter().copied().collect();
        for &version in &kept_out {
            let stored = &from.versions[&version];
            let table = from.tables.get(&version);
            let present = stored.present(table);
            from.live_bytes -= stored.journal_bytes(table);
            from.blocks_held -= u64::from(present);
        }
        self.live_bytes += from.live_bytes;
        self.blocks_held += from.blocks_held;
        for (version, table) in from.tables.drain() {
            if !kept_out.contains(&version) {
                self.tables.insert(version, table);
            }
        }
        for (version, stored) in from.versions.drain() {
            if !kept_out.contains(&version) {
                let before = self.versions.insert(version, stored);
                assert!(before.is_none(), "two disks' versions share an id");
            }
        }
    }

    /// Moves version `version` of `from`, with its blocks, into this index as its key's
    /// current version (what replaying its records here would do, with nothing decoded).
    /// False, and nothing moved, when `from` does not hold it or this index holds its id.
    /// Tests: the one-by-one reference `join` is held to.
    #[cfg(test)]
    pub(crate) fn adopt(&mut self, from: &mut Index, version: u64) -> bool {
        if self.versions.contains_key(&version) {
            return false;
        }
        let Some(stored) = from.versions.remove(&version) else {
            return false;
        };
        let hash = from.key_hasher.hash(stored.key());
        debug_assert!(from.held.is_none(), "a lookup while changes are held back");
        from.unset_current(hash, version);
        let table = from.tables.remove(&version);
        let present = stored.present(table.as_ref());
        let blocks_bytes = stored.blocks_journal_bytes(table.as_ref());
        if let Some(table) = table {
            self.tables.insert(version, table);
        }
        from.live_bytes -= stored.record_bytes() + blocks_bytes;
        from.blocks_held -= u64::from(present);
        self.live_bytes += blocks_bytes;
        self.blocks_held += u64::from(present);
        self.insert(version, stored);
        true
    }

    /// Adds a version (its id not held) and makes it its key's current one. The key's older
    /// version stays readable by the responses that began on it, until its own Drop record.
    fn insert(&mut self, version: u64, stored: Stored) {
        self.live_bytes += stored.record_bytes();
        let hash = self.key_hasher.hash(stored.key());
        self.versions.insert(version, stored);
        self.change_current_or_hold(hash, version, true);
    }

    /// The key of `version` no longer has it as its current version (the origin has another):
    /// the version stays readable by the responses that began on it, until its Drop record;
    /// the key's next want learns the new one. False when `version` was not current.
    pub fn retire(&mut self, version: u64) -> bool {
        if !self.is_current(version) {
            return false;
        }
        let hash = self.key_hasher.hash(self.versions[&version].key());
        self.unset_current(hash, version);
        true
    }

    /// The key's current version.
    pub fn current(&self, key: &[u8]) -> Option<ObjectVersion> {
        self.meta(self.current_id(key)?)
    }

    /// The id of the key's current version.
    pub fn current_version(&self, key: &[u8]) -> Option<u64> {
        self.current_id(key)
    }

    /// The key's current version, read in place (nothing decoded into its own allocation).
    pub fn current_view(&self, key: &[u8]) -> Option<ObjectView<'_>> {
        self.view(self.current_id(key)?)
    }

    /// Version `version`, read in place.
    pub fn view(&self, version: u64) -> Option<ObjectView<'_>> {
        Some(self.versions.get(&version)?.view(version))
    }

    /// What version `version` is (current or still being read).
    pub fn meta(&self, version: u64) -> Option<ObjectVersion> {
        self.versions.get(&version).map(|s| s.meta(version))
    }

    /// Appends `version`'s object record to `out`, framed, as `Record::encode` would write it
    /// (from the body held, not decoded); nothing when it is unknown.
    pub fn encode_version(&self, version: u64, out: &mut Vec<u8>) {
        if let Some(s) = self.versions.get(&version) {
            ObjectView::encode_compact_framed(s.body(), version, out);
        }
    }

    /// The key of `version`.
    pub fn key_of(&self, version: u64) -> Option<&[u8]> {
        self.versions.get(&version).map(|s| s.key())
    }

    /// Whether `version` is held (current or still being read).
    pub fn contains(&self, version: u64) -> bool {
        self.versions.contains_key(&version)
    }

    /// Blocks `version` spans, and its block size.
    pub fn blocks_of(&self, version: u64) -> Option<(u64, u32)> {
        self.versions
            .get(&version)
            .map(|s| (s.blocks(), s.block_bytes()))
    }

    /// The size in bytes of `version`.
    pub fn size_of(&self, version: u64) -> Option<u64> {
        self.versions.get(&version).map(|s| s.size())
    }

    /// The checksum of block `block` of `version`, if that block is on disk.
    pub fn block_crc(&self, version: u64, block: u32) -> Option<u32> {
        let s = self.versions.get(&version)?;
        // Read once: every block read checks its checksum here.
        let blocks = s.blocks();
        if blocks > INLINE_BLOCKS {
            self.tables.get(&version)?.get(block)
        } else {
            s.get_inline(block, blocks)
        }
    }

    /// The blocks of `version` on disk and their checksums, in order (empty when unknown).
    pub fn each_block(&self, version: u64) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.versions
            .get(&version)
            .into_iter()
            .flat_map(move |s| blocks_of(s, self.tables.get(&version)))
    }

    /// Forgets block `block` of `version` in memory (its bytes failed their checksum): it is
    /// fetched again, and the new block's record supersedes the journal's old one.
    pub fn forget_block(&mut self, version: u64, block: u32) -> bool {
        let Some(s) = self.versions.get_mut(&version) else {
            return false;
        };
        let blocks = s.blocks();
        let (forgot, group) = if blocks > INLINE_BLOCKS {
            let Some(t) = self.tables.get_mut(&version) else {
                return false;
            };
            let group = t.group(block);
            let took = t.take(block);
            if t.pages().is_empty() {
                self.tables.remove(&version);
            }
            (took, group)
        } else {
            let group = s.inline_present(blocks);
            (s.take_inline(block, blocks), group)
        };
        if forgot {
            self.count_group_again(group, group & !(1 << (block as usize % BLOCK_RUN_MAX)));
            self.blocks_held -= 1;
        }
        forgot
    }

    /// Counts the live bytes of a group of blocks that was `before` and is `after` (its
    /// presence bits): a block that comes or goes may join or split the runs beside it.
    fn count_group_again(&mut self, before: u16, after: u16) {
        // Added first: the count holds `before`'s bytes, so it never goes below zero.
        self.live_bytes =
            self.live_bytes + group_journal_bytes(after) - group_journal_bytes(before);
    }

    /// Journal bytes the live index takes as a compaction writes it (`journal::snapshot`):
    /// exactly that when every version held is its key's current one; more while an older
    /// version is still held, which the snapshot leaves out.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Blocks on disk over every version held.
    pub fn blocks_held(&self) -> u64 {
        self.blocks_held
    }

    /// Whether `version` is its key's current version.
    pub fn is_current(&self, version: u64) -> bool {
        debug_assert!(self.held.is_none(), "a lookup while changes are held back");
        self.versions.get(&version).is_some_and(|s| {
            let hash = self.key_hasher.hash(s.key());
            self.current
                .find(hash, |c| c.hash == hash && c.version == version)
                .is_some()
        })
    }

    /// The highest version id held (new versions are numbered after it).
    pub fn max_version(&self) -> u64 {
        self.versions.keys().copied().max().unwrap_or(0)
    }

    /// Bytes of `version` on disk: its blocks present, at most its size (0 when unknown).
    pub fn stored_bytes(&self, version: u64) -> u64 {
        self.versions
            .get(&version)
            .map_or(0, |s| s.stored_bytes(s.present(self.tables.get(&version))))
    }

    /// Blocks of `version` on disk.
    pub fn blocks_present(&self, version: u64) -> u64 {
        self.versions
            .get(&version)
            .map_or(0, |s| u64::from(s.present(self.tables.get(&version))))
    }

    /// Every version held, decoded, in no particular order.
    pub fn each_version(&self) -> impl Iterator<Item = ObjectVersion> + '_ {
        self.versions.iter().map(|(&v, s)| s.meta(v))
    }

    /// The id of every version held, in no particular order.
    pub fn each_version_id(&self) -> impl Iterator<Item = u64> + '_ {
        self.versions.keys().copied()
    }

    /// Versions held (current or still being read).
    pub fn versions(&self) -> usize {
        self.versions.len()
    }

    /// Keys with a current version.
    pub fn keys(&self) -> usize {
        self.current.len()
    }
}

/// A version as tests compare it: its id, key, blocks and whether it is current.
#[cfg(test)]
pub(crate) type HeldForTests = (u64, Vec<u8>, Vec<(u32, u32)>, bool);

#[cfg(test)]
impl Index {
    /// The index as tests compare two: each version held, the live bytes, and the keys with
    /// a current version.
    pub(crate) fn contents(&self) -> (Vec<HeldForTests>, u64, usize) {
        let mut ids: Vec<u64> = self.each_version_id().collect();
        ids.sort_unstable();
        let versions = ids
            .into_iter()
            .map(|v| {
                let key = self.key_of(v).expect("held").to_vec();
                (v, key, self.each_block(v).collect(), self.is_current(v))
            })
            .collect();
        let each: u64 = self.each_version_id().map(|v| self.blocks_present(v)).sum();
        assert_eq!(
            self.blocks_held(),
            each,
            "the blocks held are each version's"
        );
        // What a join that moves every version counts on (`take_all_but`).
        let bytes: u64 = self
            .versions
            .iter()
            .map(|(v, s)| s.journal_bytes(self.tables.get(v)))
            .sum();
        assert_eq!(self.live_bytes, bytes, "the live bytes are each version's");
        (versions, self.live_bytes(), self.keys())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::record::{Freshness, Refresh};

    fn object(key: &str, version: u64, size: u64) -> ObjectVersion {
        ObjectVersion {
            key: key.as_bytes().to_vec(),
            version,
            size,
            block_bytes: 1 << 20,
            fetched_unix_s: 0,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        }
    }

    #[test]
    fn a_new_version_takes_the_key_and_the_old_one_stays_until_dropped() {
        let mut ix = Index::default();
        assert!(ix.apply(Record::Object(object("k", 1, 3 << 20))));
        assert!(ix.apply(Record::Block {
            version: 1,
            block: 2,
            crc: 9
        }));
        assert!(ix.apply(Record::Object(object("k", 2, 1 << 20))));
        assert_eq!(ix.current(b"k").unwrap().version, 2);
        // Responses that began on version 1 still find its blocks.
        assert_eq!(ix.block_crc(1, 2), Some(9));
        assert_eq!(ix.block_crc(2, 0), None, "nothing of version 2 yet");
        assert!(ix.apply(Record::Drop { version: 1 }));
        assert_eq!(ix.block_crc(1, 2), None);
        assert_eq!(
            ix.current(b"k").unwrap().version,
            2,
            "dropping the old keeps the new"
        );
        assert_eq!((ix.keys(), ix.versions()), (1, 1));
    }

    #[test]
    fn a_confirmed_version_is_fresh_again_and_a_retired_one_stays_readable() {
        let mut ix = Index::default();
        assert!(ix.apply(Record::Object(object("k", 3, 1 << 20))));
        assert!(ix.apply(Record::Fresh {
            version: 3,
            fetched_unix_s: 500,
            refresh: None,
        }));
        assert!(ix.apply(Record::Fresh {
            version: 3,
            fetched_unix_s: 100,
            refresh: None,
        }));
        assert_eq!(ix.current(b"k").unwrap().fetched_unix_s, 500, "never older");
        assert!(!ix.apply(Record::Fresh {
            version: 4,
            fetched_unix_s: 1,
            refresh: None,
        }));
        assert!(ix.apply(Record::Block {
            version: 3,
            block: 0,
            crc: 1
        }));
        assert!(ix.retire(3));
        assert!(!ix.retire(3), "no longer current");
        assert!(
            ix.current(b"k").is_none(),
            "the next want learns the new version"
        );
        assert_eq!(ix.block_crc(3, 0), Some(1), "readable until dropped");
        assert!(ix.apply(Record::Object(object("k", 4, 1 << 20))));
        assert!(!ix.retire(3));
        assert_eq!(ix.current(b"k").unwrap().version, 4);
    }

    #[test]
    fn a_forgotten_block_is_absent_until_its_record_comes_again() {
        let mut ix = Index::default();
        assert!(ix.apply(Record::Object(object("k", 5, 2 << 20))));
        let block = |crc| Record::Block {
            version: 5,
            block: 1,
            crc,
        };
        assert!(ix.apply(block(7)));
        assert!(ix.forget_block(5, 1));
        assert!(!ix.forget_block(5, 1), "already absent");
        assert_eq!((ix.block_crc(5, 1), ix.blocks_present(5)), (None, 0));
        assert_eq!(ix.blocks_held(), 0);
        assert!(ix.apply(block(8)));
        assert_eq!((ix.block_crc(5, 1), ix.blocks_present(5)), (Some(8), 1));
        assert_eq!(ix.max_version(), 5);
        // A large object's table, forgotten from and dropped: the total follows each change.
        let big = (INLINE_BLOCKS + 4) << 20;
        assert!(ix.apply(Record::Object(object("big", 6, big))));
        for b in [0, 17, 19] {
            assert!(ix.apply(Record::Block {
                version: 6,
                block: b,
                crc: b
            }));
        }
        assert_eq!(ix.blocks_held(), 4);
        assert!(ix.forget_block(6, 17));
        assert_eq!((ix.blocks_present(6), ix.blocks_held()), (2, 3));
        assert!(ix.apply(Record::Drop { version: 6 }));
        assert_eq!(ix.blocks_held(), 1);
        ix.contents();
    }

    /// A version's block table holds pages only where blocks are stored, each no longer than
    /// what the object has there: a claim of 2^24 blocks with two stored costs two pages.
    #[test]
    fn block_tables_follow_what_is_stored() {
        let mut t = BlockTable::default();
        let blocks = 1u64 << 24;
        assert!(t.set((1 << 24) - 1, 5, blocks));
        assert!(t.set(3, 6, blocks));
        assert!(!t.set(3, 7, blocks), "set again");
        assert_eq!(t.pages().len(), 2);
        assert_eq!(t.get((1 << 24) - 1), Some(5));
        assert_eq!((t.get(3), t.get(4)), (Some(7), None));
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            vec![(3, 7), ((1 << 24) - 1, 5)]
        );
        assert!(t.take(3) && !t.take(3));
        assert_eq!(t.pages().len(), 1, "an empty page goes");
        // A 4-block object's page holds 4 checksums, not 256.
        let mut small = BlockTable::default();
        assert!(small.set(2, 1, 4));
        assert_eq!(small.pages()[0].len, 4);
        assert_eq!(small.get(3), None);
        // A page past 256 blocks holds what the object has there.
        let mut tail = BlockTable::default();
        assert!(tail.set(300, 9, 301));
        assert_eq!(tail.pages()[0].len, 45);
        // One page inline, then many, then back to none.
        let mut t = BlockTable::default();
        assert!(t.set(1, 10, 1000) && t.set(600, 11, 1000) && t.set(2, 12, 1000));
        assert!(matches!(t, BlockTable::Many(_)));
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            vec![(1, 10), (2, 12), (600, 11)]
        );
        let mut one = BlockTable::default();
        assert!(one.set(7, 1, 8) && matches!(one, BlockTable::One(_)));
        assert!(one.take(7) && matches!(one, BlockTable::Empty));
        assert_eq!(one.get(7), None);
    }

    /// Every field of a version comes back as it went in (the index keeps its record's body),
    /// and a confirmation that carries new lines and freshness rewrites them.
    #[test]
    fn a_version_comes_back_whole_and_a_refresh_rewrites_it() {
        let mut ix = Index::default();
        let mut m = object("origin/k", 9, (3 << 20) + 5);
        m.etag = "\"abc\"".into();
        m.last_modified = "Sun, 06 Dec 2026 10:00:00 GMT".into();
        m.content_type = "application/json".into();
        m.headers = "Cache-Control: max-age=60\r\n".into();
        m.selecting = "accept-encoding: gzip\r\n".into();
        m.status = 404;
        m.freshness.lifetime_s = Some(60);
        m.tags = crate::cache::tags::Tags::from_text("a b").unwrap();
        assert!(ix.apply(Record::Object(m.clone())));
        assert_eq!(ix.current(b"origin/k").as_ref(), Some(&m));
        assert_eq!(ix.meta(9).as_ref(), Some(&m));
        assert_eq!(ix.key_of(9), Some(&b"origin/k"[..]));
        assert_eq!(
            (ix.size_of(9), ix.blocks_of(9)),
            (Some(m.size), Some((4, 1 << 20)))
        );
        assert_eq!(ix.live_bytes(), Record::object_bytes(&m));
        let mut framed = Vec::new();
        ix.encode_version(9, &mut framed);
        let mut want = Vec::new();
        Record::Object(m.clone()).encode(&mut want);
        assert_eq!(framed, want, "the journal's bytes, from the body held");
        for (block, crc) in [(3, 33), (0, 10)] {
            assert!(ix.apply(Record::Block {
                version: 9,
                block,
                crc
            }));
        }
        let refresh = Refresh {
            freshness: Freshness {
                lifetime_s: Some(300),
                ..Default::default()
            },
            headers: "Cache-Control: max-age=300\r\n".into(),
        };
        assert!(ix.apply(Record::Fresh {
            version: 9,
            fetched_unix_s: 1000,
            refresh: Some(Box::new(refresh.clone())),
        }));
        let got = ix.meta(9).unwrap();
        assert_eq!(
            (got.fetched_unix_s, got.freshness, &got.headers),
            (1000, refresh.freshness, &refresh.headers)
        );
        assert_eq!((&got.etag, &got.tags), (&m.etag, &m.tags), "the rest kept");
        assert_eq!(
            ix.each_block(9).collect::<Vec<_>>(),
            vec![(0, 10), (3, 33)],
            "and the blocks"
        );
        assert_eq!(
            ix.live_bytes(),
            Record::object_bytes(&got) + 2 * Record::BLOCK_BYTES
        );
    }

    /// Replay's way in for an object record's body: true when inserted, false when its id
    /// is taken.
    fn insert_body(ix: &mut Index, body: &[u8], slot: Option<usize>) -> Result<bool, Invalid> {
        Prepared::from_body(body, slot).map(|p| ix.insert_prepared(p).is_ok())
    }

    /// Replay's way in (an object record's body, held in the index's form) gives what
    /// `apply` gives, writes the same record back, moves the version to its disk's slot, and
    /// refuses what `validate` refuses.
    #[test]
    fn a_body_from_the_journal_is_held_compact_and_checked_as_a_record_is() {
        let mut m = object("origin/k", 3, 5 << 20);
        m.etag = "\"e\"".into();
        m.content_type = "application/octet-stream".into();
        m.headers = "Cache-Control: max-age=9\r\n".into();
        let mut body = Vec::new();
        m.encode_body(&mut body);
        let mut ix = Index::default();
        assert_eq!(insert_body(&mut ix, &body, None), Ok(true));
        assert_eq!(ix.current(b"origin/k").as_ref(), Some(&m));
        // Held without its kind, its id, the common type's text and the defaults (a flag byte,
        // no number of the four), but written back whole.
        let held = ix.versions[&3].body().len();
        let defaults = Freshness::BYTES + 2 + 2 - 1;
        assert_eq!(
            held,
            body.len() - 1 - 8 - (2 + m.content_type.len() - 1) - defaults
        );
        // Then its 5 blocks' checksums and their presence bits, and nothing else.
        assert_eq!(
            ix.versions[&3].data.len(),
            held + 4 * 5 + INLINE_PRESENT_BYTES
        );
        let mut framed = Vec::new();
        Record::Object(m.clone()).encode(&mut framed);
        let mut written = Vec::new();
        ix.encode_version(3, &mut written);
        assert_eq!(written, framed);
        assert_eq!(ix.live_bytes(), framed.len() as u64);
        assert_eq!(insert_body(&mut ix, &body, None), Ok(false), "id taken");
        let moved = crate::cache::version_id::on_slot(3, 2);
        let mut other = Index::default();
        assert_eq!(insert_body(&mut other, &body, Some(2)), Ok(true));
        let got = other.current(b"origin/k").unwrap();
        assert_eq!((got.version, &got.headers), (moved, &m.headers));
        assert_eq!(other.blocks_of(moved), Some((5, 1 << 20)));
        let mut bad = m.clone();
        bad.block_bytes = 3;
        let mut body = Vec::new();
        bad.encode_body(&mut body);
        assert_eq!(
            insert_body(&mut ix, &body, None),
            Err(Invalid::BlockBytes(3))
        );
        assert_eq!(
            insert_body(&mut ix, &body[..body.len() - 1], None),
            Err(Invalid::Malformed)
        );
    }

    /// An object of up to `INLINE_BLOCKS` blocks keeps its checksums in its own allocation;
    /// a larger one in a table that grows with what is stored. Both answer alike.
    #[test]
    fn small_objects_keep_their_checksums_inline_and_large_ones_in_a_table() {
        for blocks in [1, INLINE_BLOCKS, INLINE_BLOCKS + 1, 1000] {
            let mut ix = Index::default();
            assert!(ix.apply(Record::Object(object("k", 1, blocks << 20))));
            let inline = inline_blocks(ix.versions[&1].blocks());
            assert_eq!(inline > 0, blocks <= INLINE_BLOCKS, "{blocks} blocks");
            let last = (blocks - 1) as u32;
            for (block, crc) in [(last, 7), (0, 5), (last, 8)] {
                assert!(ix.apply(Record::Block {
                    version: 1,
                    block,
                    crc
                }));
            }
            let want = if last == 0 {
                vec![(0, 8)]
            } else {
                vec![(0, 5), (last, 8)]
            };
            assert_eq!(
                ix.each_block(1).collect::<Vec<_>>(),
                want,
                "{blocks} blocks"
            );
            assert_eq!(ix.blocks_present(1), want.len() as u64);
            assert!(!ix.apply(Record::Block {
                version: 1,
                block: last + 1,
                crc: 1
            }));
            assert!(ix.forget_block(1, 0) && !ix.forget_block(1, 0));
            assert_eq!(ix.block_crc(1, 0), None);
            assert_eq!(ix.block_crc(1, last), (last != 0).then_some(8));
            assert_eq!(ix.tables.contains_key(&1), inline == 0 && last != 0);
            // Dropped, its checksums go with it: a new version under the id starts bare.
            assert!(ix.apply(Record::Drop { version: 1 }));
            assert!(ix.tables.is_empty(), "{blocks} blocks: a table left behind");
            assert!(ix.apply(Record::Object(object("k", 1, blocks << 20))));
            assert_eq!(ix.each_block(1).count(), 0, "{blocks} blocks");
            assert_eq!(ix.block_crc(1, last), None);
        }
    }

    /// A version moved from one index to another (joining disks) arrives whole, as its key's
    /// current version, and leaves the first.
    #[test]
    fn an_adopted_version_moves_whole() {
        let (mut a, mut b) = (Index::default(), Index::default());
        assert!(b.apply(Record::Object(object("k", 4, 3 << 20))));
        assert!(b.apply(Record::Block {
            version: 4,
            block: 2,
            crc: 6
        }));
        assert!(a.apply(Record::Object(object("k", 2, 1 << 20))));
        let moved = b.live_bytes();
        let before = a.live_bytes();
        assert!(a.adopt(&mut b, 4));
        assert!(!a.adopt(&mut b, 4), "gone from b");
        assert_eq!((b.versions(), b.keys(), b.live_bytes()), (0, 0, 0));
        assert_eq!(a.current_version(b"k"), Some(4));
        assert_eq!(a.each_block(4).collect::<Vec<_>>(), vec![(2, 6)]);
        assert_eq!(a.live_bytes(), before + moved);
        assert!(a.contains(2), "the older version stays until dropped");
        // A large object's checksums, kept beside it, move with it.
        let big = (INLINE_BLOCKS + 4) << 20;
        assert!(b.apply(Record::Object(object("big", 9, big))));
        assert!(b.apply(Record::Block {
            version: 9,
            block: 18,
            crc: 3
        }));
        assert!(a.adopt(&mut b, 9));
        assert!(b.tables.is_empty(), "no table left in b");
        assert_eq!(a.each_block(9).collect::<Vec<_>>(), vec![(18, 3)]);
        assert_eq!(a.block_crc(9, 18), Some(3));
    }

    /// Two keys of one hash are both current, each in its own slot, and neither lookup
    /// ever returns the other key's version: in place, through a replay's held-back changes,
    /// and after the table grows.
    #[test]
    fn two_keys_of_one_hash_are_both_current_and_never_answer_for_each_other() {
        let mut ix = Index::default();
        ix.key_hasher.collide = true;
        assert!(ix.apply(Record::Object(object("a", 1, 1 << 20))));
        assert_eq!(ix.current_version(b"a"), Some(1));
        assert_eq!(ix.current_version(b"b"), None, "b is not a");
        assert!(ix.apply(Record::Object(object("b", 2, 1 << 20))));
        assert_eq!(ix.current_version(b"b"), Some(2));
        assert_eq!(ix.current_version(b"a"), Some(1), "a keeps its own slot");
        assert!(ix.is_current(1) && ix.is_current(2));
        assert!(ix.apply(Record::Object(object("a", 3, 1 << 20))));
        assert_eq!(
            (ix.current_version(b"a"), ix.current_version(b"b")),
            (Some(3), Some(2)),
            "a's new version takes a's slot, not b's"
        );
        assert!(ix.retire(3) && !ix.retire(3));
        assert_eq!(ix.current_version(b"a"), None);
        assert_eq!(ix.current_version(b"b"), Some(2), "retiring a keeps b");
        assert!(ix.apply(Record::Drop { version: 1 }));
        assert!(ix.apply(Record::Drop { version: 2 }));
        assert_eq!(ix.current_version(b"b"), None);
        assert!(ix.apply(Record::Drop { version: 3 }));
        assert_eq!((ix.keys(), ix.versions()), (0, 0));

        // Held back and made in batches (`HELD_CHANGES` is 8 in tests), past a growth.
        ix.hold_current_changes();
        for v in 10..40u64 {
            let key = format!("k{}", v % 12);
            assert!(ix.apply(Record::Object(object(&key, v, 1 << 20))));
        }
        ix.make_held_changes();
        assert_eq!(ix.keys(), 12);
        for k in 0..12u64 {
            let newest = (10..40).rev().find(|v| v % 12 == k).unwrap();
            assert_eq!(ix.current_version(format!("k{k}").as_bytes()), Some(newest));
        }
    }

    #[test]
    fn records_naming_nothing_change_nothing() {
        let mut ix = Index::default();
        assert!(!ix.apply(Record::Block {
            version: 5,
            block: 0,
            crc: 1
        }));
        assert!(ix.apply(Record::Object(object("k", 5, 2 << 20))));
        assert!(!ix.apply(Record::Block {
            version: 5,
            block: 2,
            crc: 1
        }));
        assert!(
            !ix.apply(Record::Object(object("other", 5, 1))),
            "id reused"
        );
        assert!(!ix.apply(Record::Drop { version: 6 }));
        let mut bad = object("k", 6, 1);
        bad.block_bytes = 3 << 20;
        assert!(
            !ix.apply(Record::Object(bad)),
            "block size not a power of two"
        );
        assert_eq!(ix.blocks_present(5), 0);
        // A block committed twice (fetched again after a bad checksum) counts once.
        for crc in [1, 2] {
            assert!(ix.apply(Record::Block {
                version: 5,
                block: 1,
                crc
            }));
        }
        assert_eq!((ix.blocks_present(5), ix.block_crc(5, 1)), (1, Some(2)));
    }

    /// `join` as `adopt` of each current version one by one did it (`disks::join` before
    /// the batches): the reference `join` is held to.
    fn join_one_by_one(all: &mut Index, mut disk: Index) {
        use crate::cache::version_id::file_number;
        let versions: Vec<u64> = disk.each_version_id().collect();
        for version in versions {
            let Some(key) = disk.key_of(version).filter(|_| disk.is_current(version)) else {
                continue;
            };
            let newer = all
                .current_version(key)
                .is_some_and(|v| file_number(v) > file_number(version));
            if !newer {
                all.adopt(&mut disk, version);
            }
        }
    }

    /// A record of disk `slot`'s journal: a few keys, so both disks hold some of the same,
    /// in file numbers either side of the other's.
    fn any_record_on(slot: usize) -> impl proptest::strategy::Strategy<Value = Record> {
        use crate::cache::version_id::on_slot;
        use proptest::prelude::*;
        prop_oneof![
            3 => (0u8..5, 1u64..12, 1u64..24).prop_map(move |(key, version, blocks)| {
                Record::Object(object(&format!("key-{key}"), on_slot(version, slot), blocks << 20))
            }),
            5 => (1u64..12, 0u32..24, any::<u32>()).prop_map(move |(version, block, crc)| {
                Record::Block { version: on_slot(version, slot), block, crc }
            }),
            1 => (1u64..12).prop_map(move |version| Record::Drop { version: on_slot(version, slot) }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

        /// Batched (`HELD_CHANGES` is 8 in tests), a join leaves what adopting each current
        /// version did: newer versions kept on either side, large objects' tables moved, and
        /// with hashers that collide (every key in one slot) on either side or both.
        #[test]
        fn a_join_in_batches_matches_adopting_each_current_version(
            here in proptest::collection::vec(any_record_on(0), 0..80),
            there in proptest::collection::vec(any_record_on(1), 0..80),
            collide_here: bool,
            collide_there: bool,
        ) {
            let build = |records: &[Record], collide: bool| {
                let mut ix = Index::default();
                ix.key_hasher.collide = collide;
                for r in records {
                    ix.apply(r.clone());
                }
                ix
            };
            let mut batched = build(&here, collide_here);
            batched.join(build(&there, collide_there));
            let mut one_by_one = build(&here, collide_here);
            join_one_by_one(&mut one_by_one, build(&there, collide_there));
            proptest::prop_assert_eq!(batched.contents(), one_by_one.contents());
        }
    }
}
