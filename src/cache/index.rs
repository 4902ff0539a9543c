//! What the cache holds, in memory: each key's current version and the blocks of each version
//! that are on disk, with their checksums. Built by replaying the journal; every change goes
//! through `Index::apply`, the same function replay uses, so a running cache and one rebuilt
//! after a crash agree.

use std::collections::HashMap;

pub use super::record::ObjectVersion;
use super::record::Record;

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

    /// The blocks present and their checksums, in order.
    fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.pages().iter().flat_map(|page| {
            (0..page.len as usize)
                .filter(|&i| page.present(i))
                .map(move |i| (page.number * PAGE_BLOCKS + i as u32, page.words[i]))
        })
    }
}

/// A version and its blocks' checksums.
#[derive(Clone, Debug)]
struct Stored {
    meta: ObjectVersion,
    blocks: BlockTable,
    present: u64,
}

/// Hashes version ids: ids are numbered by the edge (not chosen by a client), so one
/// multiply spreads them; SipHash cost a replay a sixth of its time.
#[derive(Clone, Copy, Debug, Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Ids = std::hash::BuildHasherDefault<IdHasher>;

/// The cache's contents.
#[derive(Debug, Default)]
pub struct Index {
    current: HashMap<Vec<u8>, u64>,
    /// Boxed: the table's entries stay small (16 bytes), so a replay's table of millions of
    /// slots costs little memory to reserve and little to rehash as it grows.
    versions: HashMap<u64, Box<Stored>, Ids>,
    /// Journal bytes a snapshot of every version held would take (`journal::snapshot`
    /// writes only the current ones, so this bounds it from above).
    live_bytes: u64,
}

impl Index {
    /// An empty index with room for `versions` versions (replay sizes it from the journal, so
    /// a rebuild does not grow its tables a step at a time).
    pub fn with_capacity(versions: usize) -> Index {
        Index {
            current: HashMap::with_capacity(versions),
            versions: HashMap::with_capacity_and_hasher(versions, Ids::default()),
            live_bytes: 0,
        }
    }

    /// Applies one change; false when it names nothing the index has (it changes nothing).
    pub fn apply(&mut self, record: Record) -> bool {
        match record {
            Record::Object(meta) => {
                if !meta.is_valid() || self.versions.contains_key(&meta.version) {
                    return false;
                }
                let blocks = BlockTable::default();
                self.live_bytes += Record::object_bytes(&meta);
                // The key's older version stays readable by the responses that began on it,
                // until its own Drop record.
                self.current.insert(meta.key.clone(), meta.version);
                self.versions.insert(
                    meta.version,
                    Box::new(Stored {
                        meta,
                        blocks,
                        present: 0,
                    }),
                );
                true
            }
            Record::Block {
                version,
                block,
                crc,
            } => {
                let Some(s) = self.versions.get_mut(&version) else {
                    return false;
                };
                if u64::from(block) >= s.meta.blocks() {
                    return false;
                }
                if s.blocks.set(block, crc, s.meta.blocks()) {
                    s.present += 1;
                    self.live_bytes += Record::BLOCK_BYTES;
                }
                true
            }
            Record::Drop { version } => {
                let Some(s) = self.versions.remove(&version) else {
                    return false;
                };
                self.live_bytes -= Record::object_bytes(&s.meta) + s.present * Record::BLOCK_BYTES;
                if self.current.get(&s.meta.key) == Some(&version) {
                    self.current.remove(&s.meta.key);
                }
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
                if fetched_unix_s < s.meta.fetched_unix_s {
                    // An older confirmation changes nothing.
                    return true;
                }
                s.meta.fetched_unix_s = fetched_unix_s;
                if let Some(r) = refresh {
                    self.live_bytes -= Record::object_bytes(&s.meta);
                    s.meta.freshness = r.freshness;
                    s.meta.headers = r.headers;
                    self.live_bytes += Record::object_bytes(&s.meta);
                }
                true
            }
        }
    }

    /// The key of `version` no longer has it as its current version (the origin has another):
    /// the version stays readable by the responses that began on it, until its Drop record;
    /// the key's next want learns the new one. False when `version` was not current.
    pub fn retire(&mut self, version: u64) -> bool {
        let Some(s) = self.versions.get(&version) else {
            return false;
        };
        if self.current.get(&s.meta.key) != Some(&version) {
            return false;
        }
        self.current.remove(&s.meta.key);
        true
    }

    /// The key's current version.
    pub fn current(&self, key: &[u8]) -> Option<&ObjectVersion> {
        let v = self.current.get(key)?;
        self.versions.get(v).map(|s| &s.meta)
    }

    /// What version `version` is (current or still being read).
    pub fn meta(&self, version: u64) -> Option<&ObjectVersion> {
        self.versions.get(&version).map(|s| &s.meta)
    }

    /// The checksum of block `block` of `version`, if that block is on disk.
    pub fn block_crc(&self, version: u64, block: u32) -> Option<u32> {
        self.versions.get(&version)?.blocks.get(block)
    }

    /// The blocks of `version` on disk and their checksums, in order (empty when unknown).
    pub fn each_block(&self, version: u64) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.versions
            .get(&version)
            .into_iter()
            .flat_map(|s| s.blocks.iter())
    }

    /// Forgets block `block` of `version` in memory (its bytes failed their checksum): it is
    /// fetched again, and the new block's record supersedes the journal's old one.
    pub fn forget_block(&mut self, version: u64, block: u32) -> bool {
        let Some(s) = self.versions.get_mut(&version) else {
            return false;
        };
        let forgot = s.blocks.take(block);
        if forgot {
            s.present -= 1;
            self.live_bytes -= Record::BLOCK_BYTES;
        }
        forgot
    }

    /// Journal bytes the live index would take as records (what a compaction keeps, at most).
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Whether `version` is its key's current version.
    pub fn is_current(&self, version: u64) -> bool {
        self.versions
            .get(&version)
            .is_some_and(|s| self.current.get(&s.meta.key) == Some(&version))
    }

    /// The highest version id held (new versions are numbered after it).
    pub fn max_version(&self) -> u64 {
        self.versions.keys().copied().max().unwrap_or(0)
    }

    /// Blocks of `version` on disk.
    pub fn blocks_present(&self, version: u64) -> u64 {
        self.versions.get(&version).map_or(0, |s| s.present)
    }

    /// Every version held, in no particular order.
    pub fn each_version(&self) -> impl Iterator<Item = &ObjectVersion> {
        self.versions.values().map(|s| &s.meta)
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(ix.apply(block(8)));
        assert_eq!((ix.block_crc(5, 1), ix.blocks_present(5)), (Some(8), 1));
        assert_eq!(ix.max_version(), 5);
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
}
