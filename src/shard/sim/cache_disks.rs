//! Several cache disks in the simulator's pull runs (issue 43): the cache spreads over two to
//! four directories, each with its own journal, data files and id, so the checker's rules (no
//! wrong byte, no cut download, every arena slot back) hold over the placement too.
//!
//! One disk can fail under the run (`DiskFault`, ATS's shim that fails the Nth disk I/O): from
//! its `nth` operation on (reads, block writes and syncs of its files, through the ring) every
//! one fails with EIO, as a dead drive's does, or only its `nth` write comes back short. The
//! sweep over N (`a_failing_disk_never_costs_a_wrong_byte_a_slot_or_a_hang_swept_over_n`) runs
//! the checker on each; no client that asked nothing unusual may be cut by the disk.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::rng::Rng;
use crate::config::Config;

/// Share of the pull runs (power-loss runs aside) whose cache spreads over two to four disks.
pub const MULTI_DISK_RUN_PERCENT: u64 = 40;

/// In `MULTI_DISK_RUN_PERCENT` of the runs, moves the pull run's cache (`cfg.cache_dir`) onto
/// two to four disks beneath `root/cache`. Its own random stream: the rest of a seed's world
/// stays what it was.
pub fn spread(seed: u64, root: &Path, cfg: &mut Config) -> std::io::Result<()> {
    let mut rng = Rng::new(seed ^ 0x043d_15c5);
    if !rng.chance(MULTI_DISK_RUN_PERCENT) && FAULT.get().is_none() {
        return Ok(());
    }
    let cache = root.join("cache");
    cfg.cache_dirs = (0..rng.range(2, 4))
        .map(|i| cache.join(format!("disk{i}")))
        .collect();
    for d in &cfg.cache_dirs {
        std::fs::create_dir_all(d)?;
        // Ids from the seed (a blank disk draws a random one): placement, and so the run,
        // repeats.
        let id = format!("{:016x}\n", rng.below(u64::MAX));
        std::fs::write(d.join(crate::cache::disks::DISK_ID_FILE), id)?;
    }
    cfg.cache_dir = None;
    Ok(())
}

/// How the failing disk fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// From the `nth` operation on, every one fails with EIO.
    Dead,
    /// The `nth` block write comes back short (half of it written); the rest go on.
    ShortWrite,
    /// The `nth` block write, sync or read completes only `STALL_MS` later (past
    /// `cache_disk_op_timeout_ms`: a stall that ends); the rest go on.
    Stall,
    /// From the `nth` operation on, every block write and sync completes `STALL_MS` late
    /// (`fsfreeze`: reads go on): every fill writing to the disk is held at once.
    Frozen,
    /// As `Frozen`, but `HANG_MS` late: as good as never, for the clients (the run checks
    /// that every one was done before any held operation came back).
    Hang,
}

/// How long a hung operation takes (virtual ms): past every client's run, within the run's
/// virtual time.
pub const HANG_MS: u64 = 90_000;

/// How long a stalled operation takes (virtual ms): past the default
/// `cache_disk_op_timeout_ms`, within the run's virtual time.
pub const STALL_MS: u64 = 3 * crate::cache::disks::DEFAULT_DISK_OP_TIMEOUT_MS;

/// Completions of disk operations a stall holds (`FaultKind::Stall`), each until its time.
#[derive(Debug, Default)]
pub struct Stalls(Vec<(Duration, u64, i32)>);

impl Stalls {
    /// Holds the completion (`token`, `res`) of an operation `hit` took, from `now`.
    pub fn hold(&mut self, hit: FaultHit, now: Duration, token: u64, res: i32) {
        let ms = if hit == FaultHit::Hang {
            HANG_MS
        } else {
            STALL_MS
        };
        self.0.push((now + Duration::from_millis(ms), token, res));
    }

    /// The completions whose time came by `now`, taken.
    pub fn due(&mut self, now: Duration) -> Vec<(u64, i32)> {
        let (due, held): (Vec<_>, Vec<_>) = self.0.drain(..).partition(|s| s.0 <= now);
        self.0 = held;
        due.into_iter().map(|(_, t, r)| (t, r)).collect()
    }

    /// When the next is due.
    pub fn next(&self) -> Option<Duration> {
        self.0.iter().map(|s| s.0).min()
    }

    /// How many it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// What one operation of the failing disk gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultHit {
    /// EIO.
    Eio,
    /// A short write.
    Short,
    /// Whole, but completed `STALL_MS` late.
    Stall,
    /// Whole, but completed `HANG_MS` late.
    Hang,
}

impl FaultHit {
    /// Whether the operation is done, only late.
    pub fn holds(self) -> bool {
        matches!(self, FaultHit::Stall | FaultHit::Hang)
    }
}

/// One cache disk that fails under a run (the ring's `disk_fault`).
#[derive(Clone, Debug)]
pub struct DiskFault {
    /// The disk's directory: operations on files beneath it count.
    pub dir: PathBuf,
    /// The operation (counted from 1) the fault starts at.
    pub nth: u64,
    /// How it fails.
    pub kind: FaultKind,
    /// Operations on the disk so far.
    ops: u64,
}

impl DiskFault {
    /// A block write (`write`) or a sync of `path`: what it gets, if the fault takes it.
    pub fn hit(&mut self, path: &Path, write: bool) -> Option<FaultHit> {
        if !path.starts_with(&self.dir) {
            return None;
        }
        self.ops += 1;
        match self.kind {
            FaultKind::Dead => (self.ops >= self.nth).then_some(FaultHit::Eio),
            FaultKind::ShortWrite => (write && self.ops == self.nth).then_some(FaultHit::Short),
            FaultKind::Stall => (self.ops == self.nth).then_some(FaultHit::Stall),
            FaultKind::Frozen => (self.ops >= self.nth).then_some(FaultHit::Stall),
            FaultKind::Hang => (self.ops >= self.nth).then_some(FaultHit::Hang),
        }
    }

    /// A read of a file on the disk: what it gets.
    pub fn read(&mut self) -> Option<FaultHit> {
        self.ops += 1;
        match self.kind {
            FaultKind::Dead => (self.ops >= self.nth).then_some(FaultHit::Eio),
            FaultKind::Stall => (self.ops == self.nth).then_some(FaultHit::Stall),
            FaultKind::ShortWrite | FaultKind::Frozen | FaultKind::Hang => None,
        }
    }
}

thread_local! {
    /// The fault the next runs on this thread put on their first disk (their pull and their
    /// several disks forced): set by the sweep.
    static FAULT: Cell<Option<(u64, FaultKind)>> = const { Cell::new(None) };
}

/// Whether a fault is set for this thread's runs (they pull and spread over disks).
pub fn forced() -> bool {
    FAULT.get().is_some()
}

/// The fault for a run whose cache is `cfg`'s: on its first disk, if one is set.
pub fn fault_for(cfg: &Config) -> Option<DiskFault> {
    let (nth, kind) = FAULT.get()?;
    Some(DiskFault {
        dir: cfg.cache_dirs.first()?.clone(),
        nth,
        kind,
        ops: 0,
    })
}

/// Seeds the sweep runs each N with (`SHARDLINE_DISK_FAULT_SEEDS` sets how many).
const SWEEP_SEEDS: u64 = 24;
/// Largest N swept.
const SWEEP_MAX_NTH: u64 = 8;

#[test]
fn a_failing_disk_never_costs_a_wrong_byte_a_slot_or_a_hang_swept_over_n() {
    let seeds = super::env_u64("SHARDLINE_DISK_FAULT_SEEDS").unwrap_or(SWEEP_SEEDS);
    let mut fired = 0;
    let mut runs = 0;
    let mut pulled = 0;
    let mut cut = [0; 5];
    let kinds = [
        FaultKind::Dead,
        FaultKind::ShortWrite,
        FaultKind::Stall,
        FaultKind::Frozen,
        FaultKind::Hang,
    ];
    for kind in kinds {
        for nth in 1..=SWEEP_MAX_NTH {
            for seed in 0..seeds {
                FAULT.set(Some((nth, kind)));
                let outcome = super::run_mode_caught(seed, super::Mode::Normal);
                FAULT.set(None);
                // The checker ran on every tick and at the end: no wrong byte, every arena
                // slot and receive buffer back, every connection ended, within virtual time.
                let stats = outcome
                    .unwrap_or_else(|e| panic!("{kind:?} at operation {nth}, seed {seed}: {e}"));
                runs += 1;
                fired += stats.paths.disk_fault_ops;
                pulled += stats.pulled;
                cut[kind as usize] += stats.cut_by_disk;
                // A disk that never answers holds up no client: all were done before the
                // first held operation came back.
                assert!(
                    kind != FaultKind::Hang || stats.clients_done_ms < HANG_MS,
                    "{kind:?} at operation {nth}, seed {seed}: the clients were done only at \
                     {} ms",
                    stats.clients_done_ms
                );
                if stats.cut_by_disk > 0 {
                    eprintln!(
                        "{kind:?} at operation {nth}, seed {seed}: {} clients cut",
                        stats.cut_by_disk
                    );
                }
            }
        }
    }
    eprintln!(
        "{runs} runs, {fired} disk operations failed, {pulled} pulled responses, clients cut by the disk alone: {} dead, {} short write, {} stall, {} frozen, {} hang",
        cut[0], cut[1], cut[2], cut[3], cut[4]
    );
    assert!(
        fired > 0 && pulled > 0,
        "the sweep never reached the failing disk"
    );
    // A read the disk fails goes on from the origin, as does a fill whose write it fails: no
    // client that asked nothing unusual is cut (`shard::read_failover`).
    assert_eq!(cut, [0; 5], "clients cut by the failing disk alone");
}
