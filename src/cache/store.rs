//! Where a version's blocks live on disk, and the order that keeps a crash from ever serving a
//! wrong byte: a block's bytes are written and made durable first, its `BlockCommitted` record
//! is journaled after, and every read checks the block against the journaled checksum.
//!
//! One data file per version (`data/<version's number as 16 hex digits>`, on the version's own
//! disk: `version_id`), block `i` at offset `i * block_bytes`; the last block holds the
//! object's tail. This file does plain blocking
//! I/O, which is what start-up checks and tests need. During service, the fill path writes
//! the same layout with O_DIRECT from the registered slot the origin's bytes arrived in,
//! through the shard's ring, and keeps the same order.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::disk_health::DiskHealth;
use super::index::ObjectVersion;
use super::placement::Placement;
use super::version_id::{file_number, on_slot, slot_of};
use super::watch::{sync_dir, DiskWatch, Watch};

/// Why a block could not be read back.
#[derive(Debug)]
pub enum ReadError {
    /// The bytes on disk do not match the journaled checksum, or are missing (a block whose
    /// data did not reach the disk, a torn write, a damaged sector). Fetch the block again.
    Corrupt,
    /// The block number is past the object's end.
    OutOfRange,
    /// The file could not be read.
    Io(io::Error),
}

/// The cache's data files, on one disk or several.
#[derive(Clone, Debug)]
pub struct BlockStore {
    /// Each disk's data directory (index = its slot); never empty.
    data: Arc<[PathBuf]>,
    /// Which disk a new version goes to.
    placement: Arc<Placement>,
    /// Each disk's errors and state, shared with every clone and the journals.
    health: Arc<DiskHealth>,
    watch: Watch,
}

impl BlockStore {
    /// The store under `dir` (creates `dir/data`).
    pub fn open(dir: &Path) -> io::Result<BlockStore> {
        Self::open_watched(dir, None)
    }

    /// `open`, telling `watch` (a model of the disk) of every write, sync, create and unlink.
    pub fn open_watched(dir: &Path, watch: Watch) -> io::Result<BlockStore> {
        Self::on_disks(&[dir.to_path_buf()], Placement::new(&[(0, 1)]), watch)
    }

    /// The store over the disks `dirs` (creates each `dir/data`), new versions placed by
    /// `placement` (over the same disks, in the same order). A store over one directory
    /// (the tools: `cache stats --dir`) reads every version there, whatever its slot.
    pub fn on_disks(
        dirs: &[PathBuf],
        placement: Placement,
        watch: Watch,
    ) -> io::Result<BlockStore> {
        if dirs.is_empty() || placement.len() != dirs.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a store needs its disks, each placed",
            ));
        }
        let mut data = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let d = dir.join("data");
            if !d.is_dir() {
                std::fs::create_dir_all(&d)?;
                // The new directory's own entry survives a power loss.
                sync_dir(dir, &None)?;
            }
            data.push(d);
        }
        Ok(BlockStore {
            health: Arc::new(DiskHealth::new(data.len())),
            data: data.into(),
            placement: Arc::new(placement),
            watch,
        })
    }

    /// The store of disks `dirs` that are not open yet (a loading cache's, whose core
    /// holds no version to read or write through it): nothing is created or read.
    pub fn not_open(dirs: &[PathBuf]) -> BlockStore {
        assert!(!dirs.is_empty(), "a store needs its disks");
        let ids: Vec<(u64, u64)> = (0..dirs.len() as u64).map(|i| (i, 1)).collect();
        BlockStore {
            health: Arc::new(DiskHealth::new(dirs.len())),
            data: dirs.iter().map(|d| d.join("data")).collect(),
            placement: Arc::new(Placement::new(&ids)),
            watch: None,
        }
    }

    /// Disks the store spreads over.
    pub fn disks(&self) -> usize {
        self.data.len()
    }

    /// The id of a new version of `key`, numbered `number`: on the disk placement gives it
    /// among those not failing.
    pub fn new_version(&self, key: &[u8], number: u64) -> u64 {
        let slot = self.placement.pick_where(key, |s| self.health.usable(s));
        on_slot(number, slot)
    }

    /// Each disk's errors and state.
    pub fn health(&self) -> &Arc<DiskHealth> {
        &self.health
    }

    /// The model of the disk the store is watched by, if any.
    pub fn watch(&self) -> Option<&dyn DiskWatch> {
        self.watch.as_deref()
    }

    /// Syncs every disk's data directory, so files created (or removed) in them survive a
    /// power loss.
    pub fn sync_data_dir(&self) -> io::Result<()> {
        for d in self.data.iter() {
            sync_dir(d, &self.watch)?;
        }
        Ok(())
    }

    /// Syncs the data directory `version`'s file is in.
    pub fn sync_data_dir_of(&self, version: u64) -> io::Result<()> {
        sync_dir(self.data_dir(version), &self.watch)
    }

    /// The data directory of `version`'s disk.
    fn data_dir(&self, version: u64) -> &Path {
        self.data.get(slot_of(version)).unwrap_or(&self.data[0])
    }

    /// The data file of `version`.
    pub fn data_path(&self, version: u64) -> PathBuf {
        self.data_dir(version)
            .join(format!("{:016x}", file_number(version)))
    }

    /// Bytes block `block` of `meta` holds (the last one: the object's tail).
    pub fn block_len(meta: &ObjectVersion, block: u32) -> Option<usize> {
        let b = u64::from(meta.block_bytes);
        let start = u64::from(block) * b;
        (start < meta.size).then(|| (meta.size - start).min(b) as usize)
    }

    /// Writes block `block` of `meta` from `bytes` (exactly its length) and makes it durable;
    /// returns its checksum, to be journaled only now.
    pub fn write_block(&self, meta: &ObjectVersion, block: u32, bytes: &[u8]) -> io::Result<u32> {
        let len = Self::block_len(meta, block).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "block past the object's end")
        })?;
        if bytes.len() != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block {block} is {len} bytes, {} given", bytes.len()),
            ));
        }
        let path = self.data_path(meta.version);
        let existed = path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if !existed {
            if let Some(w) = self.watch() {
                w.created(&path);
            }
            self.sync_data_dir_of(meta.version)?;
        }
        let offset = u64::from(block) * u64::from(meta.block_bytes);
        file.write_all_at(bytes, offset)?;
        file.sync_data()?;
        if let Some(w) = self.watch() {
            w.wrote(&path, offset, bytes);
            w.synced(&path);
        }
        Ok(super::checksum(bytes))
    }

    /// Reads block `block` of `meta` into `buf` and checks it against `crc`.
    pub fn read_block(
        &self,
        meta: &ObjectVersion,
        block: u32,
        crc: u32,
        buf: &mut Vec<u8>,
    ) -> Result<(), ReadError> {
        let len = Self::block_len(meta, block).ok_or(ReadError::OutOfRange)?;
        buf.clear();
        buf.resize(len, 0);
        let file = match File::open(self.data_path(meta.version)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Corrupt),
            Err(e) => return Err(ReadError::Io(e)),
        };
        match file.read_exact_at(buf, u64::from(block) * u64::from(meta.block_bytes)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ReadError::Corrupt),
            Err(e) => return Err(ReadError::Io(e)),
        }
        if super::checksum(buf) != crc {
            return Err(ReadError::Corrupt);
        }
        Ok(())
    }

    /// Removes a dropped version's data file (gone already is fine).
    pub fn remove_version(&self, version: u64) -> io::Result<()> {
        let path = self.data_path(version);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            Err(_) => Ok(()),
            Ok(()) => {
                if let Some(w) = self.watch() {
                    w.removed(&path);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::journal::Record;
    use crate::cache::journal_file::JournalFile;
    use std::time::{Duration, Instant};

    const BLOCK: u32 = 64 * 1024;

    fn meta(version: u64, size: u64) -> ObjectVersion {
        ObjectVersion {
            key: format!("origin/obj-{version}").into_bytes(),
            version,
            size,
            block_bytes: BLOCK,
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

    /// The bytes of block `block` of `version` (deterministic, different everywhere).
    fn content(version: u64, block: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (version as usize * 131 + block as usize * 17 + i * 7) as u8)
            .collect()
    }

    #[test]
    fn blocks_read_back_verified_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlockStore::open(dir.path()).unwrap();
        let m = meta(1, 2 * u64::from(BLOCK) + 100);
        assert_eq!(BlockStore::block_len(&m, 2), Some(100));
        assert_eq!(BlockStore::block_len(&m, 3), None);
        let crcs: Vec<u32> = (0..3)
            .map(|b| {
                let len = BlockStore::block_len(&m, b).unwrap();
                store.write_block(&m, b, &content(1, b, len)).unwrap()
            })
            .collect();
        let mut buf = Vec::new();
        for (b, crc) in crcs.iter().enumerate() {
            store.read_block(&m, b as u32, *crc, &mut buf).unwrap();
            assert_eq!(buf, content(1, b as u32, buf.len()));
        }
        assert!(store.write_block(&m, 2, &[0; 99]).is_err(), "wrong length");
        assert!(matches!(
            store.read_block(&m, 3, 0, &mut buf),
            Err(ReadError::OutOfRange)
        ));
        // A flipped byte in block 1 is caught; blocks 0 and 2 still read.
        let f = OpenOptions::new()
            .write(true)
            .open(store.data_path(1))
            .unwrap();
        f.write_all_at(&[0xff], u64::from(BLOCK) + 5).unwrap();
        assert!(matches!(
            store.read_block(&m, 1, crcs[1], &mut buf),
            Err(ReadError::Corrupt)
        ));
        store.read_block(&m, 0, crcs[0], &mut buf).unwrap();
        // A tail that never reached the disk reads as corrupt, not as zeros.
        f.set_len(2 * u64::from(BLOCK) + 50).unwrap();
        assert!(matches!(
            store.read_block(&m, 2, crcs[2], &mut buf),
            Err(ReadError::Corrupt)
        ));
        store.remove_version(1).unwrap();
        store.remove_version(1).unwrap();
        assert!(matches!(
            store.read_block(&m, 0, crcs[0], &mut buf),
            Err(ReadError::Corrupt)
        ));
    }

    /// The kill -9 test's child process: fills objects block by block, each block durable
    /// before its record is journaled, until killed. Ignored because it is not a test by
    /// itself: it never ends on its own (it fills until SIGKILL) and needs the directory its
    /// parent gives it. `a_filler_killed_mid_fill_never_leaves_a_committed_block_that_reads_wrong`
    /// runs it with `--include-ignored`; run alone, it fails on the missing variable.
    #[test]
    #[ignore = "child process of a_filler_killed_mid_fill_never_leaves_a_committed_block_that_reads_wrong, which runs it with SHARDLINE_STORE_CHILD set and kills it (it fills until killed); alone it fails at once on the missing variable"]
    fn block_filler_child() {
        let dir = std::env::var_os("SHARDLINE_STORE_CHILD")
            .expect("run by a_filler_killed_mid_fill_..., which sets SHARDLINE_STORE_CHILD");
        let dir = Path::new(&dir);
        let store = BlockStore::open(dir).unwrap();
        let (mut journal, index, _) = JournalFile::open(&dir.join("journal")).unwrap();
        for v in index.versions() as u64 + 1.. {
            let m = meta(v, 5 * u64::from(BLOCK) + 1234);
            journal.append(&[Record::Object(m.clone())], false).unwrap();
            for b in 0..6 {
                let len = BlockStore::block_len(&m, b).unwrap();
                let crc = store.write_block(&m, b, &content(v, b, len)).unwrap();
                journal
                    .append(
                        &[Record::Block {
                            version: v,
                            block: b,
                            crc,
                        }],
                        false,
                    )
                    .unwrap();
            }
        }
    }

    #[test]
    fn a_filler_killed_mid_fill_never_leaves_a_committed_block_that_reads_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let journal = dir.path().join("journal");
        for round in 0..4u64 {
            let mut child = std::process::Command::new(&exe)
                .args(["--exact", "cache::store::tests::block_filler_child"])
                .args(["--include-ignored", "--test-threads", "1"])
                .env("SHARDLINE_STORE_CHILD", dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let before = std::fs::metadata(&journal).map_or(0, |m| m.len());
            while std::fs::metadata(&journal).map_or(0, |m| m.len()) < before + 2000 {
                assert!(Instant::now() < deadline, "the child filled nothing");
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(7 * round));
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();

            let (_, index, _) = JournalFile::open(&journal).unwrap();
            let store = BlockStore::open(dir.path()).unwrap();
            let mut buf = Vec::new();
            let mut committed = 0;
            for v in 1..=index.versions() as u64 {
                let m = index
                    .current(format!("origin/obj-{v}").as_bytes())
                    .expect("versions in order")
                    .clone();
                for b in 0..6u32 {
                    let Some(crc) = index.block_crc(v, b) else {
                        continue;
                    };
                    // Every block the journal vouches for reads back, byte for byte.
                    store.read_block(&m, b, crc, &mut buf).unwrap();
                    assert_eq!(buf, content(v, b, buf.len()), "round {round} {v}/{b}");
                    committed += 1;
                }
            }
            assert!(committed > 0, "round {round}: nothing committed");
        }
    }
}
