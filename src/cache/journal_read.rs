//! Reads a journal for its replay, a thread ahead of the decoding, into a few reused aligned
//! buffers, with `O_DIRECT` where the file system takes it. A start-up reads gigabytes once:
//! through the page cache each read cost replay's reading thread a copy out of freshly
//! allocated pages (its largest cost, and about a third of the disk's speed here), and left
//! the pages for the co-located services' memory to reclaim.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;

use super::journal::{FRAME_BYTES, MAX_RECORD_BYTES};
use super::load_progress::LoadProgress;

/// Bytes one read asks for: start-up holds `READS_IN_FLIGHT` of these, whatever the
/// journal's size.
pub const REPLAY_READ_BYTES: usize = 1 << 20;
/// Buffers in the pool: reads the reading thread may be ahead of the decoding by.
const READS_IN_FLIGHT: usize = 4;
/// Alignment of an `O_DIRECT` read's buffer, offset and length (every logical block size
/// up to a page).
const DIRECT_ALIGN: usize = 4096;
/// Room before each read for the record the previous read cut (a frame and a body at most),
/// rounded to the alignment so the read itself stays aligned.
const CARRY_ROOM: usize = (FRAME_BYTES + MAX_RECORD_BYTES).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;

const _: () = assert!(REPLAY_READ_BYTES.is_multiple_of(DIRECT_ALIGN));

/// One read's buffer: room for a carried record, then the aligned read.
struct Chunk {
    bytes: Vec<u8>,
    /// Where the read lands (aligned; `CARRY_ROOM` after the room's start).
    read_at: usize,
    /// Bytes read.
    len: usize,
    /// Where the carried record starts (`read_at` when none is).
    from: usize,
    /// Bytes of the read the consumer left (a record it cut).
    left: usize,
}

impl Chunk {
    fn new() -> Chunk {
        let bytes = vec![0u8; DIRECT_ALIGN + CARRY_ROOM + REPLAY_READ_BYTES];
        let pad = bytes.as_ptr().align_offset(DIRECT_ALIGN);
        assert!(pad < DIRECT_ALIGN, "a byte buffer can always be aligned");
        let read_at = pad + CARRY_ROOM;
        Chunk {
            bytes,
            read_at,
            len: 0,
            from: read_at,
            left: 0,
        }
    }

    /// Reads up to `want` bytes at `offset` (aligned) into the buffer: with `direct` where
    /// given, which is dropped (and the buffered `file` used) if it refuses the alignment.
    fn read(
        &mut self,
        direct: &mut Option<File>,
        file: &File,
        offset: u64,
        want: usize,
    ) -> io::Result<()> {
        assert!(want <= REPLAY_READ_BYTES && offset.is_multiple_of(DIRECT_ALIGN as u64));
        self.len = 0;
        self.from = self.read_at;
        self.left = 0;
        // O_DIRECT reads whole blocks: the last one of the file comes back short.
        let asked = want.next_multiple_of(DIRECT_ALIGN);
        while self.len < want {
            let at = self.read_at + self.len;
            let region = &mut self.bytes[at..self.read_at + asked];
            let pos = offset + self.len as u64;
            let n = match direct {
                Some(d) if pos.is_multiple_of(DIRECT_ALIGN as u64) => {
                    match d.read_at(region, pos) {
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                            *direct = None;
                            continue;
                        }
                        r => r?,
                    }
                }
                // A short read left the offset unaligned: the rest goes through the cache.
                _ => file.read_at(&mut region[..want - self.len], pos)?,
            };
            if n == 0 {
                break;
            }
            self.len += n.min(want - self.len);
        }
        Ok(())
    }

    /// Puts the `left` bytes that end `prev` (a cut record) in front of this read.
    fn carry(&mut self, prev: &Chunk) {
        let left = prev.left;
        assert!(left <= CARRY_ROOM, "a cut record over its bound");
        let end = prev.read_at + prev.len;
        self.from = self.read_at - left;
        self.bytes[self.from..self.read_at].copy_from_slice(&prev.bytes[end - left..end]);
    }

    /// The carried record and the read.
    fn held(&self) -> &[u8] {
        &self.bytes[self.from..self.read_at + self.len]
    }
}

/// Opens `path` for `O_DIRECT` reads; None where the file system refuses (tmpfs before
/// Linux 6.6, for one): those reads go through the page cache.
fn open_direct(path: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Reads the journal `file` at `path` (its first `on_disk` bytes) in order on a thread of its
/// own, and calls `each` with the bytes it has not taken yet: the record the last call left
/// cut, then the next read. `each` returns the bytes it took (whole records) and whether to
/// go on. Returns the bytes taken in all; a read's error ends the replay with it.
pub fn read_journal(
    path: &Path,
    file: &File,
    on_disk: u64,
    progress: Option<&LoadProgress>,
    mut each: impl FnMut(&[u8]) -> (usize, bool),
) -> io::Result<u64> {
    let mut direct = open_direct(path);
    std::thread::scope(|scope| {
        let (full_tx, full) = mpsc::sync_channel::<io::Result<Chunk>>(READS_IN_FLIGHT);
        let (free, free_rx) = mpsc::channel::<Chunk>();
        for _ in 0..READS_IN_FLIGHT {
            free.send(Chunk::new()).expect("the receiver is here");
        }
        std::thread::Builder::new()
            .name("cache-read".into())
            .spawn_scoped(scope, move || {
                let mut offset = 0u64;
                // Ends when the file does, on an error, or when the consumer stops (its end
                // of either channel is gone).
                while offset < on_disk {
                    let Ok(mut chunk) = free_rx.recv() else {
                        return;
                    };
                    let want = (on_disk - offset).min(REPLAY_READ_BYTES as u64) as usize;
                    let read = chunk.read(&mut direct, file, offset, want).map(|()| chunk);
                    let got = read.as_ref().map_or(0, |c| c.len);
                    if full_tx.send(read).is_err() || got == 0 {
                        return;
                    }
                    offset += got as u64;
                }
            })?;
        let mut taken = 0u64;
        let mut prev: Option<Chunk> = None;
        for read in full {
            let mut chunk = read?;
            if let Some(p) = prev.take() {
                chunk.carry(&p);
                // The reading thread may have ended: a buffer not taken back is only freed.
                let _ = free.send(p);
            }
            if let Some(p) = progress {
                p.add_read(chunk.len as u64);
            }
            let held = chunk.held().len();
            let (used, go_on) = each(chunk.held());
            assert!(used <= held, "took more than it was given");
            taken += used as u64;
            chunk.left = held - used;
            if !go_on {
                break;
            }
            prev = Some(chunk);
        }
        Ok(taken)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of `len` bytes each, the whole file, as `read_journal` hands them on when each
    /// call takes whole records only.
    fn records(path: &Path, len: usize) -> (Vec<u8>, u64) {
        let file = File::open(path).unwrap();
        let on_disk = file.metadata().unwrap().len();
        let mut seen = Vec::new();
        let taken = read_journal(path, &file, on_disk, None, |held| {
            let whole = held.len() / len * len;
            seen.extend_from_slice(&held[..whole]);
            (whole, true)
        })
        .unwrap();
        (seen, taken)
    }

    #[test]
    fn every_record_arrives_once_in_order_across_reads_with_the_cut_one_carried() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        // Records of a length prime to the read's, so one is cut at nearly every read's end;
        // the file ends inside a block (O_DIRECT's last read comes back short) and a torn
        // record is left over.
        let len = 4099;
        let whole = 3 * REPLAY_READ_BYTES / len + 7;
        let mut bytes: Vec<u8> = (0..whole * len).map(|i| (i % 251) as u8).collect();
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        let (seen, taken) = records(&path, len);
        assert_eq!(taken, (whole * len) as u64, "the torn record is not taken");
        assert!(
            seen == bytes[..whole * len],
            "the bytes, in order, once each"
        );
        assert!(
            open_direct(&path).is_some(),
            "the test's file system takes O_DIRECT (so its reads were checked here)"
        );
    }

    #[test]
    fn a_consumer_that_stops_ends_the_reads_and_an_empty_journal_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(&path, vec![7u8; 3 * REPLAY_READ_BYTES]).unwrap();
        let file = File::open(&path).unwrap();
        let mut calls = 0;
        let taken = read_journal(&path, &file, 3 * REPLAY_READ_BYTES as u64, None, |held| {
            calls += 1;
            (held.len() / 2, false)
        })
        .unwrap();
        assert_eq!((calls, taken), (1, REPLAY_READ_BYTES as u64 / 2));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let (seen, taken) = records(&empty, 10);
        assert!(seen.is_empty() && taken == 0);
    }

    #[test]
    fn the_page_cache_reads_where_o_direct_is_refused() {
        // A read the buffered file does alone (no O_DIRECT file) hands on the same bytes.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let bytes: Vec<u8> = (0..REPLAY_READ_BYTES + 5000)
            .map(|i| (i % 13) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let mut chunk = Chunk::new();
        chunk.read(&mut None, &file, 0, REPLAY_READ_BYTES).unwrap();
        assert!(chunk.held() == &bytes[..REPLAY_READ_BYTES]);
        let mut next = Chunk::new();
        next.read(&mut None, &file, REPLAY_READ_BYTES as u64, 5000)
            .unwrap();
        chunk.left = 100;
        next.carry(&chunk);
        assert!(next.held() == &bytes[REPLAY_READ_BYTES - 100..]);
    }
}
