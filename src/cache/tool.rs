//! `shardline cache stats|verify`: what a cache directory holds, and whether every block the
//! journal vouches for still reads back with its checksum. Read-only: the journal is replayed
//! from a copy of its bytes (never truncated), so it is safe beside a running server.

use std::path::Path;

use super::journal;
use super::store::{BlockStore, ReadError};

/// What a cache directory holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys with a current version.
    pub objects: usize,
    /// Versions held (current, or older ones not yet dropped).
    pub versions: usize,
    /// Blocks on disk that the journal vouches for.
    pub blocks: u64,
    /// Bytes of those blocks.
    pub bytes: u64,
    /// Bytes of the objects' sizes (what a complete cache of them would hold).
    pub object_bytes: u64,
    /// Bytes of the journal.
    pub journal_bytes: u64,
    /// The journal ends in a torn or damaged tail (ignored, as at start-up).
    pub damaged_tail: bool,
}

fn replay(dir: &Path) -> std::io::Result<(super::index::Index, journal::ReplayStats, u64)> {
    let bytes = std::fs::read(dir.join("journal"))?;
    let (index, stats) = journal::replay(&bytes);
    Ok((index, stats, bytes.len() as u64))
}

/// The cache in `dir`, counted.
pub fn stats(dir: &Path) -> std::io::Result<Stats> {
    let (index, replay, journal_bytes) = replay(dir)?;
    let mut s = Stats {
        objects: index.keys(),
        versions: index.versions(),
        journal_bytes,
        damaged_tail: replay.damaged_tail,
        ..Stats::default()
    };
    for v in index.each_version() {
        s.object_bytes += v.size;
        for b in 0..v.blocks() as u32 {
            if index.block_crc(v.version, b).is_some() {
                s.blocks += 1;
                s.bytes += BlockStore::block_len(v, b).unwrap_or(0) as u64;
            }
        }
    }
    Ok(s)
}

/// Reads every block the journal of `dir` vouches for and checks it; returns the blocks
/// (version, block) that fail, and how many were checked.
pub fn verify(dir: &Path) -> std::io::Result<(u64, Vec<(u64, u32)>)> {
    let (index, _, _) = replay(dir)?;
    let store = BlockStore::open(dir)?;
    let mut buf = Vec::new();
    let (mut checked, mut bad) = (0, Vec::new());
    for v in index.each_version() {
        for b in 0..v.blocks() as u32 {
            let Some(crc) = index.block_crc(v.version, b) else {
                continue;
            };
            checked += 1;
            match store.read_block(v, b, crc, &mut buf) {
                Ok(()) => {}
                Err(ReadError::Corrupt) | Err(ReadError::OutOfRange) => bad.push((v.version, b)),
                Err(ReadError::Io(e)) => return Err(e),
            }
        }
    }
    bad.sort_unstable();
    Ok((checked, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::index::ObjectVersion;
    use crate::cache::journal::Record;
    use crate::cache::journal_file::JournalFile;

    #[test]
    fn stats_count_and_verify_finds_a_damaged_block() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlockStore::open(dir.path()).unwrap();
        let (mut journal, _, _) = JournalFile::open(&dir.path().join("journal")).unwrap();
        let meta = ObjectVersion {
            key: b"k".to_vec(),
            version: 1,
            size: 3 * 65536 + 10,
            block_bytes: 65536,
            fetched_unix_s: 0,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
        };
        let mut records = vec![Record::Object(meta.clone())];
        for b in [0u32, 1, 3] {
            let len = BlockStore::block_len(&meta, b).unwrap();
            let bytes: Vec<u8> = (0..len).map(|i| (i as u32 ^ b) as u8).collect();
            let crc = store.write_block(&meta, b, &bytes).unwrap();
            records.push(Record::Block {
                version: 1,
                block: b,
                crc,
            });
        }
        journal.append(&records, true).unwrap();
        let s = stats(dir.path()).unwrap();
        assert_eq!((s.objects, s.versions, s.blocks), (1, 1, 3));
        assert_eq!(s.bytes, 2 * 65536 + 10);
        assert_eq!(s.object_bytes, meta.size);
        assert_eq!(verify(dir.path()).unwrap(), (3, vec![]));
        // One byte of block 1 flipped on disk.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(store.data_path(1))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], 65536 + 5).unwrap();
        assert_eq!(verify(dir.path()).unwrap(), (3, vec![(1, 1)]));
    }
}
