//! The pull-through cache's storage (issue 20), step 1: what is on disk and how it is read back
//! after a crash. Nothing here serves requests yet; the origin client and the fill path build
//! on it.
//!
//! - `journal`: the append-only log every change to the cache is written to (an object
//!   version, a block committed with its checksum, a version dropped), each record
//!   checksummed, and its replay into the `Index` at start-up; `journal_file` opens it on disk,
//!   cuts a damaged tail off and appends (tested by killing a writer with SIGKILL mid-append).
//! - `index`: what is cached: each key's current version (validators, size, content type,
//!   block size) and which of its blocks are on disk, with their checksums.
//! - `store`: the data files (one per version, block `i` at `i * block_bytes`): a block is
//!   durable before its record is journaled, and every read checks its checksum (tested by
//!   killing a filler with SIGKILL).
//! - `blocks`: which blocks a response needs (a Range fetches only what it covers, plus a
//!   bounded read-ahead) and the runs of missing ones a fill asks the origin for.
//! - `coalesce`: one origin fetch per block however many clients want it; waiters woken
//!   together when it is on disk, retried or told of the failure together.
//! - `watch`: what a model of the disk (the simulator's) is told of every write, sync,
//!   create, rename and unlink, so it can crash the cache as a power loss would.
//! - `tags`: the purge tags an origin gives a reply (`Surrogate-Key`, `Cache-Tag`), bounded,
//!   kept with its version for `POST /cache/purge?tag=`.
//! - `disks`, `disk_health`, `placement`, `version_id`: several disks, each with its own
//!   journal, data files and id (issue 43); which disk a new object goes to (rendezvous hashing by capacity); a
//!   version id carries its disk's slot, so its file is found with no lock; errors sorted by
//!   kind, and when a disk is taken to failing.
//! - `evict`: which blocks go when the cache is over its byte budget (S3-FIFO; blocks being
//!   read are pinned and never go), and the LRU it is measured against.
//!
//! The rules that keep a wrong byte from ever being served:
//! - A block is visible only once its `BlockCommitted` record is in the journal, and that
//!   record is written only after the block's bytes are. Its CRC-32C is checked on every read
//!   from disk, so a block whose bytes did not reach the disk before a crash (the record did,
//!   the data did not) is caught and fetched again, alone.
//! - Each object records its own block size: changing `cache_block_bytes` invalidates nothing.
//! - A new version of a key is a new `ObjectVersion` with a new id; blocks name the version
//!   they belong to, so no response can mix two versions.

pub mod blocks;
pub mod coalesce;
pub mod disk_health;
pub mod disk_lock;
pub mod disk_worker;
pub mod disks;
pub mod evict;
pub mod failed_disks;
pub mod id_hash;
pub mod index;
pub mod journal;
pub mod journal_file;
pub mod journal_read;
pub mod load_progress;
pub mod placement;
pub mod prefill;
pub mod record;
pub mod store;
pub mod tags;
pub mod tool;
pub mod version_id;
pub mod watch;

pub use index::{Index, ObjectVersion};
pub use journal::{replay, Record, ReplayStats};

/// CRC-32C (Castagnoli) of `bytes`, with the CPU's carry-less multiply where it has one.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// The CRC-32C of `a` followed by `bytes`, given `crc` = `checksum(a)` (0 for nothing).
pub fn checksum_append(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.is_empty() {
        return crc;
    }
    // Resumes from `crc`'s register (the finished CRC-32C is the register inverted) rather
    // than combining two CRCs: a combine costs about as much as checksumming a 64 KiB
    // piece, and a fill appends every piece it receives.
    let mut digest =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(bytes);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32c_and_appends() {
        // The check value of CRC-32C (RFC 3720's iSCSI CRC): journals written before stay valid.
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
        assert_eq!(checksum(b""), 0);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let whole = checksum(&data);
        for cut in [0, 1, 4095, 65_536, 299_999, 300_000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(checksum_append(checksum(a), b), whole, "cut at {cut}");
        }
        assert_eq!(
            checksum_append(checksum_append(0, &data[..10]), &data[10..]),
            whole
        );
        // In uneven pieces, as a fill receives them.
        let (mut crc, mut at, mut step) = (0, 0, 1);
        while at < data.len() {
            let end = (at + step).min(data.len());
            crc = checksum_append(crc, &data[at..end]);
            (at, step) = (end, step * 3 + 1);
        }
        assert_eq!(crc, whole);
    }
}
