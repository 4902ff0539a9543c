//! What each cache disk's errors say about it (issue 43), sorted by kind, and when a disk is
//! taken to *failing*. Shared by every thread that touches a disk (the shards' reads, the
//! fills' writes, the I/O thread's appends, creates and unlinks) through atomics: noting an
//! error takes no lock.
//!
//! - **Device errors** (EIO, ENXIO, ENODEV, EROFS, ESHUTDOWN) count against the disk:
//!   `DEVICE_ERRORS_TO_FAIL` of them within `DEVICE_ERROR_WINDOW_S` take it to failing (a
//!   dead drive or a shut-down file system answers every I/O with one, so it fails at once;
//!   a lone bad sector does not take a drive out).
//! - **Software errors** (EINVAL, EBADF, EFAULT) are the cache's own bugs: logged loudly, never
//!   blamed on the disk.
//! - **Full** (ENOSPC, EDQUOT): writes stop, reads go on (`docs/CACHE.md`, "A full disk").
//! - **Checksum failures**: the block is dropped and fetched again (as with one disk), and
//!   counted against the disk, not toward failing it.
//! - **Stalls**: an operation past `cache_disk_op_timeout_ms` (a journal append, a create, a
//!   fill's write or sync; noted as ETIMEDOUT) takes the disk to *stalled* at once: as
//!   failing, until every operation the kernel still held has come back and
//!   `STALL_QUIET_S` passed without a new one (`try_come_back`), when it is online again.
//!
//! A failing disk takes no new object (placement skips it), its records are no longer
//! journaled and its files no longer unlinked, and its objects leave the index (the fill's
//! `drop_failed_disks`), so they are misses, filled again on the other disks.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::histogram::{Histogram, HistogramSnapshot};

/// Device errors within `DEVICE_ERROR_WINDOW_S` that take a disk to failing.
pub const DEVICE_ERRORS_TO_FAIL: u64 = 3;
/// The window device errors are counted in (s).
pub const DEVICE_ERROR_WINDOW_S: u64 = 60;
/// How long a stalled disk's operations must all have been back before it is online again
/// (s): a disk that stalls now and then stays out rather than flapping.
pub const STALL_QUIET_S: u64 = 30;

/// What an errno from a cache disk's I/O says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The device failed (counts toward failing the disk).
    Device,
    /// The cache asked wrongly (a bug: logged, not the disk's fault).
    Software,
    /// No room.
    Full,
    /// A block read back did not match its checksum.
    Checksum,
    /// An operation passed `cache_disk_op_timeout_ms` (ETIMEDOUT): the disk is stalled.
    Stall,
    /// Anything else (counted, logged).
    Other,
}

impl ErrorKind {
    /// Every kind, in the order of the counters.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::Device,
        ErrorKind::Software,
        ErrorKind::Full,
        ErrorKind::Checksum,
        ErrorKind::Stall,
        ErrorKind::Other,
    ];

    /// The metrics' label.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Device => "device",
            ErrorKind::Software => "software",
            ErrorKind::Full => "full",
            ErrorKind::Checksum => "checksum",
            ErrorKind::Stall => "stall",
            ErrorKind::Other => "other",
        }
    }
}

/// The kind of `errno` (positive) from a cache disk's I/O.
pub fn classify(errno: i32) -> ErrorKind {
    match errno {
        libc::EIO | libc::ENXIO | libc::ENODEV | libc::EROFS | libc::ESHUTDOWN => ErrorKind::Device,
        libc::EINVAL | libc::EBADF | libc::EFAULT => ErrorKind::Software,
        libc::ENOSPC | libc::EDQUOT => ErrorKind::Full,
        libc::ETIMEDOUT => ErrorKind::Stall,
        _ => ErrorKind::Other,
    }
}

/// Seconds since the Unix epoch (0 before it).
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A disk's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskState {
    /// Serving and filling.
    Online,
    /// Device errors took it out: no new fills, its objects are misses.
    Failing,
    /// The operator took it out (`shardline cache disk offline`): as failing, until
    /// `online`; kept across restarts by a marker on the disk (`disks::OFFLINE_FILE`).
    Offline,
    /// An operation passed its deadline: as failing, until it is back and quiet
    /// (`STALL_QUIET_S`).
    Stalled,
}

impl DiskState {
    /// The metrics' and the status's label.
    pub fn label(self) -> &'static str {
        match self {
            DiskState::Online => "online",
            DiskState::Failing => "failing",
            DiskState::Offline => "offline",
            DiskState::Stalled => "stalled",
        }
    }

    fn code(self) -> u8 {
        match self {
            DiskState::Online => 0,
            DiskState::Failing => 1,
            DiskState::Offline => 2,
            DiskState::Stalled => 3,
        }
    }
}

/// A timed operation on a cache disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskOp {
    /// A client's read of cached blocks (a shard's, submitted to completed).
    Read,
    /// A journal append of a batch, with its sync when the batch is durable (the I/O
    /// thread's).
    Append,
}

impl DiskOp {
    /// Every operation, in the order of the histograms.
    pub const ALL: [DiskOp; 2] = [DiskOp::Read, DiskOp::Append];

    /// Its `op` label.
    pub fn label(self) -> &'static str {
        match self {
            DiskOp::Read => "read",
            DiskOp::Append => "append",
        }
    }
}

/// One disk's counters.
#[derive(Debug, Default)]
struct One {
    /// `DiskState::code`.
    state: AtomicU8,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// Device errors in the window that began at `window_start_s`.
    window_errors: AtomicU64,
    window_start_s: AtomicU64,
    /// By `DiskOp::ALL`; written by every shard and the I/O thread.
    latency: [Histogram; DiskOp::ALL.len()],
    /// Operations given up at their deadline that the kernel or the disk's worker still
    /// holds (each keeps its buffer until it comes back).
    held_ops: AtomicU64,
    /// When the last of them came back, or the last stall began (Unix s).
    quiet_since_s: AtomicU64,
}

impl One {
    /// Moves the state from `from` to `to`; false when it was not `from` (another thread
    /// moved it first, or the operator's word stands).
    fn moved(&self, from: DiskState, to: DiskState) -> bool {
        self.state
            .compare_exchange(from.code(), to.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Every disk's health (index = slot).
#[derive(Debug)]
pub struct DiskHealth {
    disks: Box<[One]>,
    /// Bit per slot: failing, already dropped from the index by the fill.
    dropped: AtomicU64,
}

impl DiskHealth {
    /// Health for `disks` disks, all online.
    pub fn new(disks: usize) -> DiskHealth {
        DiskHealth {
            disks: (0..disks.min(64)).map(|_| One::default()).collect(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Disks it follows.
    pub fn disks(&self) -> usize {
        self.disks.len()
    }

    /// Notes error `errno` (positive) from disk `slot` at `now_s` (Unix seconds); returns its
    /// kind. A device error that makes `DEVICE_ERRORS_TO_FAIL` in the window takes the disk to
    /// failing (one warning line, once).
    pub fn note(&self, slot: usize, errno: i32, now_s: u64) -> ErrorKind {
        let kind = classify(errno);
        self.count(slot, kind);
        let Some(d) = self.disks.get(slot) else {
            return kind;
        };
        match kind {
            ErrorKind::Device => {
                let start = d.window_start_s.load(Ordering::Relaxed);
                let n = if now_s >= start + DEVICE_ERROR_WINDOW_S {
                    d.window_start_s.store(now_s, Ordering::Relaxed);
                    d.window_errors.store(1, Ordering::Relaxed);
                    1
                } else {
                    d.window_errors.fetch_add(1, Ordering::Relaxed) + 1
                };
                if n >= DEVICE_ERRORS_TO_FAIL && d.moved(DiskState::Online, DiskState::Failing) {
                    tracing::error!(
                        disk = slot,
                        errno,
                        errors = n,
                        window_s = DEVICE_ERROR_WINDOW_S,
                        "cache disk failing: no new fills go to it, its objects are misses now"
                    );
                }
            }
            ErrorKind::Software => tracing::error!(
                disk = slot,
                errno,
                "cache disk I/O refused as invalid (a bug of the cache, not the disk's fault)"
            ),
            ErrorKind::Stall => {
                d.quiet_since_s.store(now_s, Ordering::Relaxed);
                if d.moved(DiskState::Online, DiskState::Stalled) {
                    tracing::error!(
                        disk = slot,
                        "cache disk stalled (an operation passed cache_disk_op_timeout_ms): no \
                         new fills go to it, its objects are misses, its clients go on from the \
                         origin"
                    );
                }
            }
            ErrorKind::Other => tracing::warn!(disk = slot, errno, "cache disk I/O error"),
            ErrorKind::Full | ErrorKind::Checksum => {}
        }
        kind
    }

    /// Counts one error of `kind` on disk `slot` (a checksum failure: `ErrorKind::Checksum`).
    pub fn count(&self, slot: usize, kind: ErrorKind) {
        if let Some(d) = self.disks.get(slot) {
            let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
            d.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Errors of `kind` noted on disk `slot`.
    pub fn errors(&self, slot: usize, kind: ErrorKind) -> u64 {
        let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.disks
            .get(slot)
            .map_or(0, |d| d.errors[i].load(Ordering::Relaxed))
    }

    /// Disk `slot`'s state.
    pub fn state(&self, slot: usize) -> DiskState {
        match self
            .disks
            .get(slot)
            .map(|d| d.state.load(Ordering::Acquire))
        {
            Some(1) => DiskState::Failing,
            Some(2) => DiskState::Offline,
            Some(3) => DiskState::Stalled,
            _ => DiskState::Online,
        }
    }

    /// Takes disk `slot` offline (the operator's word); false when there is no such disk.
    pub fn set_offline(&self, slot: usize) -> bool {
        let Some(d) = self.disks.get(slot) else {
            return false;
        };
        d.state.store(DiskState::Offline.code(), Ordering::Release);
        true
    }

    /// Brings disk `slot` back online, its error window cleared: it takes its share of new
    /// objects again (its old ones left the index; they come back at a restart), and a later
    /// failure takes its objects out again. False when there is no such disk.
    pub fn set_online(&self, slot: usize) -> bool {
        let Some(d) = self.disks.get(slot) else {
            return false;
        };
        d.window_errors.store(0, Ordering::Relaxed);
        d.window_start_s.store(0, Ordering::Relaxed);
        d.state.store(DiskState::Online.code(), Ordering::Release);
        self.dropped.fetch_and(!(1u64 << slot), Ordering::AcqRel);
        true
    }

    /// Notes that an operation `op` on disk `slot` took `micros` µs.
    pub fn observe(&self, slot: usize, op: DiskOp, micros: u64) {
        if let Some(d) = self.disks.get(slot) {
            d.latency[op as usize].observe_shared(micros);
        }
    }

    /// Disk `slot`'s latency of `op` so far (None: no such disk).
    pub fn latency(&self, slot: usize, op: DiskOp) -> Option<HistogramSnapshot> {
        Some(self.disks.get(slot)?.latency[op as usize].snapshot())
    }

    /// Disk `slot` failed before this start (`failed_disks`): failing, unless the operator
    /// has it offline.
    pub fn set_failing(&self, slot: usize) {
        if let Some(d) = self.disks.get(slot) {
            d.moved(DiskState::Online, DiskState::Failing);
        }
    }

    /// Takes disk `slot` to failing for `why` (not a device error: the cache's own thread for
    /// it is gone), unless the operator has it offline.
    pub fn fail(&self, slot: usize, why: &str) {
        let Some(d) = self.disks.get(slot) else {
            return;
        };
        let failing = DiskState::Failing.code();
        let was = d.state.swap(failing, Ordering::AcqRel);
        if was == DiskState::Offline.code() {
            d.state.store(was, Ordering::Release);
        } else if was != failing {
            tracing::error!(
                disk = slot,
                why,
                "cache disk failing: a bug of the cache, not the disk's fault"
            );
        }
    }

    /// An operation on disk `slot` was given up at its deadline and is still held (by the
    /// kernel, or the disk's worker thread): counted until `op_back`.
    pub fn op_held(&self, slot: usize) {
        if let Some(d) = self.disks.get(slot) {
            d.held_ops.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// An operation `op_held` counted came back at `now_s`.
    pub fn op_back(&self, slot: usize, now_s: u64) {
        if let Some(d) = self.disks.get(slot) {
            let before = d.held_ops.fetch_sub(1, Ordering::AcqRel);
            assert!(before > 0, "an operation back that was not held");
            d.quiet_since_s.store(now_s, Ordering::Relaxed);
        }
    }

    /// Operations on disk `slot` given up and still held.
    pub fn held_ops(&self, slot: usize) -> u64 {
        self.disks
            .get(slot)
            .map_or(0, |d| d.held_ops.load(Ordering::Acquire))
    }

    /// Brings every stalled disk whose held operations are all back, and that has been
    /// quiet for `STALL_QUIET_S`, online again (as `set_online`: it takes its share of new
    /// objects; its old ones left the index). Returns the disks brought back (bit per slot).
    pub fn try_come_back(&self, now_s: u64) -> u64 {
        let mut back = 0u64;
        for (slot, d) in self.disks.iter().enumerate() {
            if d.state.load(Ordering::Acquire) != DiskState::Stalled.code()
                || d.held_ops.load(Ordering::Acquire) > 0
                || now_s < d.quiet_since_s.load(Ordering::Relaxed) + STALL_QUIET_S
            {
                continue;
            }
            if d.moved(DiskState::Stalled, DiskState::Online) {
                self.dropped.fetch_and(!(1u64 << slot), Ordering::AcqRel);
                back |= 1 << slot;
                tracing::warn!(
                    disk = slot,
                    quiet_s = STALL_QUIET_S,
                    "cache disk back from a stall: its operations complete again; it takes new \
                     objects"
                );
            }
        }
        back
    }

    /// Whether disk `slot` takes new objects and journal records.
    pub fn usable(&self, slot: usize) -> bool {
        self.state(slot) == DiskState::Online
    }

    /// The failing disks not yet taken out of the index (bit per slot); each is returned
    /// once, to the one caller that drops its objects.
    pub fn take_newly_failed(&self) -> u64 {
        let failing = self
            .disks
            .iter()
            .enumerate()
            .filter(|(_, d)| d.state.load(Ordering::Acquire) != DiskState::Online.code())
            .fold(0u64, |m, (i, _)| m | 1 << i);
        if failing == 0 {
            return 0;
        }
        failing & !self.dropped.fetch_or(failing, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::TTFB_BUCKETS_US;

    #[test]
    fn latency_lands_in_its_bucket_per_disk_and_op() {
        let h = DiskHealth::new(2);
        h.observe(1, DiskOp::Read, 50);
        h.observe(1, DiskOp::Read, 7_000);
        h.observe(1, DiskOp::Read, 60_000_000);
        h.observe(1, DiskOp::Append, 200);
        // No such disk: ignored.
        h.observe(5, DiskOp::Read, 1);
        let read = h.latency(1, DiskOp::Read).expect("disk 1");
        let within =
            |us: u64| read.cumulative[TTFB_BUCKETS_US.iter().position(|&b| b == us).unwrap()];
        assert_eq!(within(100), 1, "50 µs is within the first bound");
        assert_eq!(within(10_000), 2, "7 ms is within 10 ms");
        assert_eq!(within(10_000_000), 2, "60 s is past every bound");
        assert_eq!(read.count(), 3, "+Inf counts them all");
        assert_eq!(read.sum_us, 50 + 7_000 + 60_000_000);
        assert_eq!(h.latency(1, DiskOp::Append).expect("disk 1").count(), 1);
        assert_eq!(h.latency(0, DiskOp::Read).expect("disk 0").count(), 0);
        assert!(h.latency(5, DiskOp::Read).is_none());
    }

    #[test]
    fn errors_are_sorted_by_kind() {
        for e in [
            libc::EIO,
            libc::ENXIO,
            libc::ENODEV,
            libc::EROFS,
            libc::ESHUTDOWN,
        ] {
            assert_eq!(classify(e), ErrorKind::Device, "{e}");
        }
        for e in [libc::EINVAL, libc::EBADF, libc::EFAULT] {
            assert_eq!(classify(e), ErrorKind::Software, "{e}");
        }
        assert_eq!(classify(libc::ENOSPC), ErrorKind::Full);
        assert_eq!(classify(libc::EDQUOT), ErrorKind::Full);
        assert_eq!(classify(libc::EAGAIN), ErrorKind::Other);
    }

    #[test]
    fn device_errors_within_the_window_take_the_disk_to_failing_and_others_never_do() {
        let h = DiskHealth::new(3);
        // Software errors, full and checksum failures, however many, never fail a disk.
        for _ in 0..100 {
            h.note(0, libc::EINVAL, 1000);
            h.note(0, libc::ENOSPC, 1000);
            h.count(0, ErrorKind::Checksum);
        }
        assert_eq!(h.state(0), DiskState::Online);
        assert_eq!(h.errors(0, ErrorKind::Software), 100);
        assert_eq!(h.errors(0, ErrorKind::Checksum), 100);
        // Device errors spread wider than the window do not either.
        for i in 0..10 {
            h.note(1, libc::EIO, 1000 + i * DEVICE_ERROR_WINDOW_S);
        }
        assert_eq!(h.state(1), DiskState::Online);
        assert_eq!(h.take_newly_failed(), 0);
        // DEVICE_ERRORS_TO_FAIL within it do, and only that disk.
        for i in 0..DEVICE_ERRORS_TO_FAIL {
            assert_eq!(h.state(2), DiskState::Online, "after {i}");
            h.note(2, libc::EIO, 5000 + i);
        }
        assert_eq!(h.state(2), DiskState::Failing);
        assert!(!h.usable(2) && h.usable(0) && h.usable(1));
        assert_eq!(h.errors(2, ErrorKind::Device), DEVICE_ERRORS_TO_FAIL);
        // The fill hears of it once.
        assert_eq!(h.take_newly_failed(), 1 << 2);
        assert_eq!(h.take_newly_failed(), 0);
        // A slot past the disks is counted nowhere and fails nothing.
        h.note(9, libc::EIO, 1);
        assert_eq!(h.state(9), DiskState::Online);
        // Online again: usable, and a later failure is heard of again.
        assert!(h.set_online(2));
        assert!(h.usable(2));
        for i in 0..DEVICE_ERRORS_TO_FAIL {
            h.note(2, libc::EIO, 9000 + i);
        }
        assert_eq!(h.take_newly_failed(), 1 << 2);
        // The operator's offline is as failing for placement and the index.
        assert!(h.set_offline(0));
        assert_eq!((h.state(0), h.usable(0)), (DiskState::Offline, false));
        assert_eq!(h.take_newly_failed(), 1);
        assert!(!h.set_offline(7));
    }
}
