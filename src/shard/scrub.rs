//! The background scrub (`cache_scrub_bytes_per_s`): one shard (`cache_scrub_shard`) reads
//! every cached block back, one read at a time through its ring into an arena slot, and checks
//! each against its journaled checksum, so a block that went bad on the disk is dropped (and
//! fetched again by the next request) before a client meets it. Paced by the configured rate,
//! and never ahead of clients: it reads only when the shard has no connection waiting for a
//! turn and at least half the arena is free, and checksums what it read
//! `SCRUB_CHECK_STEP_BYTES` per tick. One read takes as many consecutive blocks as a slot
//! holds (`SCRUB_RUN_BLOCKS_MAX`): each read costs the shard's CPU a submission and a
//! completion whatever its size.

use super::{RingOps, Shard};
use crate::fill::cache_fill::{ScrubBlock, ScrubStep};
use crate::metrics::ShardMetrics;
use crate::ring_api::slots::{ArenaSlot, FileSlot};
use crate::ring_api::token::{Op, Token};
use crate::shard::buffers::Demand;

/// How long the scrub steps aside when clients need the shard (a turn waiting, or the arena
/// more than half taken).
pub const SCRUB_YIELD_MS: u64 = 10;
/// Read alignment of the scrub's reads (O_DIRECT data files want at most this).
const SCRUB_READ_ALIGN: usize = 4096;
/// Bytes of a read block the scrub checksums per loop tick: a whole block at once would hold
/// the shard for tens of microseconds, a client's request behind it.
pub const SCRUB_CHECK_STEP_BYTES: usize = 16 * 1024;

/// How long (µs) the scrub's `len` bytes take at `rate` bytes/s. A rate turned off meanwhile
/// (a reload) paces nothing: the scrub starts at once when it is turned on again, instead of
/// waiting out `len` bytes at 1 byte/s.
fn pace_us(len: usize, rate: u64) -> u64 {
    (len as u64 * 1_000_000).checked_div(rate).unwrap_or(0)
}

/// The read in flight (or being checked): the run of blocks, and where it is read.
struct InFlight {
    slot: ArenaSlot,
    file: FileSlot,
    version: u64,
    run: ScrubBlock,
}

/// Where the scrub is in its pass over the cache.
#[derive(Default)]
pub(super) struct Scrub {
    /// The versions of this pass, oldest first, and the one being read.
    versions: Vec<u64>,
    next_version: usize,
    next_block: u32,
    /// Blocks read in this pass, and the blocks the cache held when it began.
    pass_done: u64,
    pass_blocks: u64,
    in_flight: Option<InFlight>,
    /// A read that completed, being checksummed a step per tick: the read, its result, the
    /// bytes of the run checked so far, and the CRC of the block being checked.
    checking: Option<(InFlight, i32, usize, u32)>,
    /// No read starts before this (the rate's pacing, or stepping aside), ms of the shard
    /// clock.
    next_at_ms: u64,
    /// When the bytes read so far are paid for at the rate (µs of the shard clock): reads
    /// are paced in µs, so the rate holds whatever the block size (a pause rounded to whole
    /// ms would not).
    paid_until_us: u64,
}

impl Scrub {
    /// Whether a read is in flight or being checked (the shard does not exit before).
    pub(super) fn busy(&self) -> bool {
        self.in_flight.is_some() || self.checking.is_some()
    }

    /// The arena slot the scrub holds (its read in flight, or being checked).
    #[cfg(test)]
    pub(super) fn slot(&self) -> Option<ArenaSlot> {
        self.in_flight
            .as_ref()
            .or(self.checking.as_ref().map(|c| &c.0))
            .map(|f| f.slot)
    }

    /// Whether a block is being checked: the loop does not sleep until it is done.
    pub(super) fn checking(&self) -> bool {
        self.checking.is_some()
    }

    /// When the shard should wake for the scrub's next read (None: nothing to do).
    pub(super) fn due_ms(&self, rate: u64) -> Option<u64> {
        (rate > 0 && !self.busy()).then_some(self.next_at_ms)
    }
}

impl<R: RingOps> Shard<R> {
    /// Starts the scrub's next read when it is due and the shard can spare it.
    pub(super) fn run_scrub(&mut self) {
        if self.cache.scrub.checking.is_some() {
            return self.scrub_check_step();
        }
        let rate = self.cfg.cache_scrub_bytes_per_s;
        let scrubber = self
            .cache
            .edge
            .as_ref()
            .map_or(0, |e| self.cfg.cache_scrub_shard % e.shards());
        if rate == 0 || self.index != scrubber || self.life.drain_deadline_ms.is_some() {
            return;
        }
        if self.cache.scrub.in_flight.is_some() || self.clock.now_ms < self.cache.scrub.next_at_ms {
            return;
        }
        let Some(edge) = self.cache.edge.as_mut() else {
            return;
        };
        if !self.ready.is_empty() || self.arena.free_count() * 2 < self.cfg.arena_slots() {
            self.cache.scrub.next_at_ms = self.clock.now_ms + SCRUB_YIELD_MS;
            return;
        }
        // The next block on disk, starting a new pass when the last one is done.
        let found = loop {
            let s = &mut self.cache.scrub;
            let Some(&version) = s.versions.get(s.next_version) else {
                if s.pass_blocks > 0 {
                    ShardMetrics::add(&self.metrics.cache_scrub_passes, 1);
                }
                // The fill's lock held elsewhere: tried again at the next tick.
                let Some((versions, blocks)) = edge.fill.try_with_core(|c| c.scrub_pass()) else {
                    return;
                };
                *s = Scrub {
                    versions,
                    pass_blocks: blocks,
                    next_at_ms: s.next_at_ms,
                    paid_until_us: s.paid_until_us,
                    ..Scrub::default()
                };
                ShardMetrics::set(&self.metrics.cache_scrub_progress, 0);
                if blocks == 0 {
                    // Nothing cached yet: look again in a second.
                    s.next_at_ms = self.clock.now_ms + 1000;
                    return;
                }
                continue;
            };
            // As many consecutive blocks as an arena slot holds, in one read.
            let slot_bytes = self.cfg.chunk_bytes;
            let next = edge
                .fill
                .try_with_core(|c| c.scrub_next(version, s.next_block, slot_bytes));
            let Some(next) = next else {
                return;
            };
            match next {
                ScrubStep::Block(b) => {
                    s.next_block = b.block + b.count as u32;
                    break (version, b);
                }
                ScrubStep::Skip(from) => s.next_block = from,
                ScrubStep::Done => {
                    s.next_version += 1;
                    s.next_block = 0;
                }
            }
        };
        let (version, run) = found;
        let (key, path) = edge.data_file(version);
        let file = match self.files.acquire_immutable(
            &mut self.ring,
            &key,
            &path,
            run.size,
            self.clock.now_ms,
        ) {
            Ok(f) => f,
            Err(_) => {
                // Dropped meanwhile (its file removed), or no descriptor free: on to the
                // next version (a removed one has nothing more to read).
                self.cache.scrub.next_version += 1;
                self.cache.scrub.next_block = 0;
                self.cache.scrub.next_at_ms = self.clock.now_ms + SCRUB_YIELD_MS;
                return;
            }
        };
        let Some(slot) = self.arena.take(Demand::Bulk) else {
            // Clients took the arena meanwhile: this block again, later.
            self.files.release(&mut self.ring, file);
            self.cache.scrub.next_block = run.block;
            self.cache.scrub.next_at_ms = self.clock.now_ms + SCRUB_YIELD_MS;
            return;
        };
        let slot_len = self.ring.arena(slot).len();
        assert!(
            run.run_bytes() <= slot_len,
            "a scrub run larger than its slot"
        );
        let len = run
            .run_bytes()
            .next_multiple_of(SCRUB_READ_ALIGN)
            .min(slot_len);
        let fixed = self.ring.file_fixed_index(file);
        let t = Token::shard(Op::Scrub).encode();
        self.ring.read_fixed_idle(slot, len, fixed, run.offset, t);
        self.cache.scrub.in_flight = Some(InFlight {
            slot,
            file,
            version,
            run,
        });
    }

    /// The scrub's read completed with `res`: the block is checked from the next tick on.
    pub(super) fn on_scrub_read(&mut self, res: i32) {
        let f = self
            .cache
            .scrub
            .in_flight
            .take()
            .expect("a scrub completion without a scrub read");
        self.ring.arena_done(f.slot);
        self.cache.scrub.checking = Some((f, res, 0, 0));
    }

    /// Checksums the next `SCRUB_CHECK_STEP_BYTES` of the read being checked, within one
    /// block; at each block's end a bad block is dropped, and at the run's end the slot and
    /// the file go back.
    fn scrub_check_step(&mut self) {
        let (f, res, at, crc_before) = self
            .cache
            .scrub
            .checking
            .take()
            .expect("checked by the caller");
        let i = at / f.run.block_bytes;
        let block_start = i * f.run.block_bytes;
        let block_end = block_start + f.run.block_len(i);
        let read = usize::try_from(res).unwrap_or(0);
        // A read that came short of this block: nothing of it to check.
        let end = if read < block_end {
            block_end
        } else {
            (at + SCRUB_CHECK_STEP_BYTES).min(block_end)
        };
        let crc = if read < block_end {
            crc_before
        } else {
            crate::cache::checksum_append(crc_before, &self.ring.arena(f.slot)[at..end])
        };
        if end < block_end {
            self.cache.scrub.checking = Some((f, res, end, crc));
            return;
        }
        // A short read (the kernel may return less than asked) that covered the blocks
        // before this one says nothing about this one: the run ends here, and the next read
        // starts with it (a read short of its first block is judged as before).
        if read < block_end && res >= 0 && i > 0 {
            self.cache.scrub.next_block = f.run.block + i as u32;
            return self.scrub_run_done(f, i);
        }
        // Block `i` is checked: whole and matching, or dropped.
        if (read < block_end || crc != f.run.crcs[i]) && !self.scrub_drop_bad(&f, i, res) {
            // The fill's lock was held: this step is done again at the next tick.
            self.cache.scrub.checking = Some((f, res, at, crc_before));
            return;
        }
        if i + 1 < f.run.count {
            self.cache.scrub.checking = Some((f, res, block_end, 0));
            return;
        }
        let count = f.run.count;
        self.scrub_run_done(f, count);
    }

    /// Block `i` of run `f` failed its checksum (or the read came short of it): dropped from
    /// the index, counted and logged. False when the fill's lock was held (nothing done).
    fn scrub_drop_bad(&mut self, f: &InFlight, i: usize, res: i32) -> bool {
        let block = f.run.block + i as u32;
        let Some(edge) = self.cache.edge.as_mut() else {
            return true;
        };
        let Some(bad) = edge
            .fill
            .try_with_core(|c| c.scrub_found_bad(f.version, block))
        else {
            return false;
        };
        if let Some(key) = bad {
            ShardMetrics::add(&self.metrics.cache_scrub_bad_blocks, 1);
            ShardMetrics::add(&self.metrics.cache_corrupt_blocks, 1);
            tracing::warn!(
                object = %String::from_utf8_lossy(key.get(2..).unwrap_or_default()),
                version = f.version,
                block,
                read = res,
                "scrub: a cached block failed its checksum; dropped (fetched again when asked)"
            );
        }
        true
    }

    /// The first `checked` blocks of run `f` are checked: the slot and the file go back, the
    /// pass moves on, and the next read waits until the rate has paid for this one.
    fn scrub_run_done(&mut self, f: InFlight, checked: usize) {
        let len = if checked == f.run.count {
            f.run.run_bytes()
        } else {
            checked * f.run.block_bytes
        };
        self.files.release(&mut self.ring, f.file);
        self.release_slot(f.slot);
        let s = &mut self.cache.scrub;
        s.pass_done += checked as u64;
        ShardMetrics::add(&self.metrics.cache_scrub_bytes, len as u64);
        if let Some(permille) = (s.pass_done * 1000).checked_div(s.pass_blocks) {
            ShardMetrics::set(&self.metrics.cache_scrub_progress, permille.min(1000));
        }
        let paid =
            s.paid_until_us.max(self.clock.now_us) + pace_us(len, self.cfg.cache_scrub_bytes_per_s);
        s.paid_until_us = paid;
        s.next_at_ms = paid.div_ceil(1000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fill::cache_fill::SCRUB_RUN_BLOCKS_MAX;

    #[test]
    fn a_run_of_blocks_ends_with_the_objects_short_last_block() {
        let b = 262_144usize;
        let run = |first: u32, count: usize, size: u64| ScrubBlock {
            block: first,
            count,
            crcs: [0; SCRUB_RUN_BLOCKS_MAX],
            offset: u64::from(first) * b as u64,
            block_bytes: b,
            size,
        };
        // Blocks 4 and 5 of a 10-block object: two whole blocks.
        let r = run(4, 2, 10 * b as u64);
        assert_eq!(
            (r.block_len(0), r.block_len(1), r.run_bytes()),
            (b, b, 2 * b)
        );
        // Blocks 8 and 9 of an object ending 100 bytes into block 9.
        let r = run(8, 2, 9 * b as u64 + 100);
        assert_eq!(
            (r.block_len(0), r.block_len(1), r.run_bytes()),
            (b, 100, b + 100)
        );
    }

    #[test]
    fn the_pace_follows_the_rate_and_a_rate_turned_off_paces_nothing() {
        assert_eq!(pace_us(262_144, 262_144), 1_000_000);
        assert_eq!(pace_us(262_144, 104_857_600), 2500);
        assert_eq!(pace_us(262_144, 0), 0);
    }
}
