//! A cached response whose disk fails a read goes on from its origin (issue 43).
//!
//! The chunk the disk failed waits in place (`ConnMachine::hold_for_refetch`, as a chunk
//! waiting for a bad block does), the response's pipeline drops to one chunk
//! (`ConnMachine::set_relay`), and once none of its reads is in the kernel any more, a
//! pass-through (`fill::relay`) from the origin answers the held chunks, lowest offset first,
//! then every later read. The client sees one response, every byte the origin's and none
//! missing (the fetch asks for the stored version's validator, so a changed object fails it
//! rather than splice two versions). Only when no pass-through can start (the shard's
//! `MAX_PASS_THROUGHS_PER_SHARD`, no arena slot, the origin at its fetch bound) is the
//! response cut, with a warn line, as it was before this existed.

use super::cache_glue::PulledRead;
use super::{RingOps, Shard, ShardMetrics};
use crate::cache::disk_health::ErrorKind;
use crate::fill::relay::MAX_PASS_THROUGHS_PER_SHARD;
use crate::ring_api::slots::{ArenaSlot, ConnSlot};

/// How often responses whose pass-through could not start try again (while any waits).
pub const FAILOVER_RETRY_MS: u64 = 5;

impl<R: RingOps> Shard<R> {
    /// Connection `c`'s file read into `slot` goes to the kernel now: its time is noted (a
    /// cached read's latency is its disk's), and a read of a cached block is followed until
    /// it comes back (`expire_reads`).
    pub(super) fn read_submitted(&mut self, c: ConnSlot, slot: ArenaSlot) {
        let now_us = self.clock.now_us;
        if let Some(at) = self.cache.pulls.read_started_us.get_mut(slot.index()) {
            *at = now_us;
        }
        if let Some(read) = self.cache.pulls.reads.get(self.conn_ref(c)) {
            let disk = crate::cache::version_id::slot_of(read.meta().version);
            self.cache
                .pulls
                .cached_reads
                .push((slot, disk, now_us, false));
        }
    }

    /// The read into `slot` came back: no longer followed; one past its deadline is counted
    /// back to its disk (which may come back once quiet).
    pub(super) fn read_back(&mut self, slot: ArenaSlot) {
        let reads = &mut self.cache.pulls.cached_reads;
        let Some(i) = reads.iter().position(|r| r.0 == slot) else {
            return;
        };
        let (_, disk, _, held) = reads.swap_remove(i);
        if let (true, Some(edge)) = (held, self.cache.edge.as_ref()) {
            let now_s = crate::fill::cache_fill::unix_now_s();
            edge.fill.store().health().op_back(disk, now_s);
        }
    }

    /// Each tick: a read of a cached block in the kernel past `cache_disk_op_timeout_ms`
    /// stalls its disk (`DiskHealth::note` with ETIMEDOUT: its objects leave the index, so
    /// every later request goes elsewhere) and is counted held until it comes back. Its own
    /// response waits for it: a frozen file system still answers reads, and the slot is the
    /// kernel's until it does.
    pub(super) fn expire_reads(&mut self) {
        let Some(edge) = self.cache.edge.as_ref() else {
            return;
        };
        let timeout_us = edge.fill.filler().disk_op_timeout_ms() * 1000;
        let now_us = self.clock.now_us;
        for r in &mut self.cache.pulls.cached_reads {
            if r.3 || now_us < r.2 + timeout_us {
                continue;
            }
            r.3 = true;
            let health = edge.fill.store().health();
            health.op_held(r.1);
            health.note(r.1, libc::ETIMEDOUT, crate::fill::cache_fill::unix_now_s());
            tracing::warn!(
                shard = self.index,
                disk = r.1,
                timeout_us,
                "a read of cached blocks passed its deadline: its disk is stalled"
            );
        }
    }

    /// Whether a read of connection `c`'s cached response that failed with `errno` (of
    /// `kind`) goes on from the origin. A software error (a bug of ours: EINVAL, EBADF,
    /// EFAULT) is not the disk's, and cuts the response loudly as before; so does a read
    /// of a response already passing the rest of its bytes through.
    pub(super) fn fails_over(&self, c: ConnSlot, kind: ErrorKind, errno: i32) -> bool {
        let disk_failed = match kind {
            ErrorKind::Device | ErrorKind::Checksum | ErrorKind::Stall => true,
            // Cancelled (the connection is closing) or refused by the file system (the
            // machine reads again without the flag): not a failure of the disk.
            ErrorKind::Other => errno != libc::ECANCELED && errno != libc::EOPNOTSUPP,
            ErrorKind::Software | ErrorKind::Full => false,
        };
        disk_failed && !self.cache.pulls.relays.contains(self.conn_ref(c))
    }

    /// The disk failed connection `c`'s read into `slot` (`ReadCheck::Failover`): the chunk
    /// is held, and the response goes on from the origin once it can (`try_failover`).
    pub(super) fn read_failed_over(&mut self, c: ConnSlot, slot: ArenaSlot) {
        let conn = &mut self.conns[c.index()];
        conn.hold_for_refetch(slot);
        // One chunk at a time from here on, and nothing given back to be read again.
        conn.set_relay();
        let key = self.conn_ref(c);
        if let Some(read) = self.cache.pulls.reads.get_mut(key) {
            read.failover.push(slot);
        }
        self.try_failover(c);
    }

    /// Whether connection `c` has chunks held for the origin (`read_failed_over`).
    pub(super) fn failover_pending(&self, c: ConnSlot) -> bool {
        self.cache
            .pulls
            .reads
            .get(self.conn_ref(c))
            .is_some_and(|r| !r.failover.is_empty())
    }

    /// Moves connection `c`'s failover on: once no read of its response is in the kernel,
    /// starts the pass-through; while the pass-through is not reading, reads the held chunk
    /// of lowest offset again through it. Called when a chunk is held, when a read of it
    /// completes, and when a relayed read completes.
    pub(super) fn try_failover(&mut self, c: ConnSlot) {
        let key = self.conn_ref(c);
        if !self.failover_pending(c) || !self.conns[c.index()].is_open() {
            return;
        }
        match self.cache.pulls.relays.get(key) {
            // Its one read at a time is in flight: the next goes when it completes.
            Some(relay) if relay.reading() => return,
            Some(_) => {}
            None => {
                // A read still in the kernel may fail as well: its chunk is held too, and the
                // pass-through starts below all of them.
                if self.conns[c.index()].reads_in_flight() {
                    return;
                }
                if !self.start_failover(c) {
                    return self.failover_later(c);
                }
            }
        }
        let conn = &self.conns[c.index()];
        let Some(read) = self.cache.pulls.reads.get_mut(key) else {
            return;
        };
        let lowest = (0..read.failover.len())
            .min_by_key(|&i| conn.held_file_offset(read.failover[i]).unwrap_or(u64::MAX));
        if let Some(i) = lowest {
            let slot = read.failover.swap_remove(i);
            self.reread_held(c, slot);
        }
    }

    /// Starts connection `c`'s pass-through from the lowest offset it holds to its
    /// response's end. False when it cannot start.
    fn start_failover(&mut self, c: ConnSlot) -> bool {
        if self.cache.pulls.relays.len() >= MAX_PASS_THROUGHS_PER_SHARD {
            return false;
        }
        let key = self.conn_ref(c);
        let Some(read) = self.cache.pulls.reads.get_mut(key) else {
            return false;
        };
        // Chunks waiting for a bad block's refetch come from the origin too now.
        let waited_for_blocks = read.take_refetching();
        let conn = &self.conns[c.index()];
        let Some(from) = read
            .failover
            .iter()
            .filter_map(|&s| conn.held_file_offset(s))
            .min()
        else {
            return false;
        };
        let (origin, path, meta) = (read.origin, read.path.clone(), read.meta().clone());
        let object = PulledRead::object(read);
        let end = self
            .cache
            .pulls
            .streams
            .get(key)
            .map_or(meta.size, |(s, _)| s.last.map_or(meta.size, |l| l + 1));
        // The client holds the chunks it reads into.
        if !self.start_relay(c, origin, &path, &meta, (from, end), 0) {
            return false;
        }
        // Off the fill's waiter lists: its bytes from `from` on come from the pass-through.
        let streaming = self.cache.pulls.streams.remove(key).is_some();
        if streaming || waited_for_blocks {
            let waiter = self.waiter(c);
            if let Some(edge) = self.cache.edge.as_mut() {
                edge.fill.cancel(&waiter);
            }
        }
        tracing::warn!(
            shard = self.index,
            %object,
            version = meta.version,
            from,
            "a cache disk failed a read: the response goes on from its origin"
        );
        ShardMetrics::add(&self.metrics.cache_disk_failovers, 1);
        self.relay_reaches_end_of_disk(c);
        true
    }

    /// Connection `c`'s pass-through could not start (no arena slot, the origin at its fetch
    /// bound, the shard's bound): it tries again every `FAILOVER_RETRY_MS`, and is cut once
    /// it has waited `cache_wait_timeout_ms`.
    fn failover_later(&mut self, c: ConnSlot) {
        let now_ms = self.clock.now_ms;
        let timeout_ms = self.cache.edge.as_ref().map_or(0, |e| e.wait_timeout_ms);
        let key = self.conn_ref(c);
        let Some(read) = self.cache.pulls.reads.get_mut(key) else {
            return;
        };
        let since_ms = *read.failover_since_ms.get_or_insert(now_ms);
        if now_ms.saturating_sub(since_ms) >= timeout_ms {
            return self.cut_failover(c);
        }
        let waiter = self.waiter(c);
        let waits = &mut self.cache.pulls.failover_waits;
        if !waits.contains(&waiter) {
            if waits.is_empty() {
                self.cache.pulls.failover_retry_at_ms = now_ms + FAILOVER_RETRY_MS;
            }
            waits.push(waiter);
        }
    }

    /// Each tick (from `run_fill`): the responses waiting for their pass-through try again,
    /// every `FAILOVER_RETRY_MS` (the loop wakes at least every `TIMER_SWEEP_MS`).
    pub(super) fn retry_failovers(&mut self) {
        let pulls = &mut self.cache.pulls;
        if pulls.failover_waits.is_empty() || self.clock.now_ms < pulls.failover_retry_at_ms {
            return;
        }
        pulls.failover_retry_at_ms = self.clock.now_ms + FAILOVER_RETRY_MS;
        let waits = std::mem::take(&mut pulls.failover_waits);
        for w in waits {
            if self.conns[w.conn.index()].generation() == w.generation {
                // Waits again (back on the list) if it still cannot start.
                self.try_failover(w.conn);
            }
        }
    }

    /// No pass-through could start for connection `c`'s held chunks: the response is cut.
    fn cut_failover(&mut self, c: ConnSlot) {
        let key = self.conn_ref(c);
        let object = self.cache.pulls.reads.get_mut(key).map(|read| {
            read.failover.clear();
            PulledRead::object(read)
        });
        tracing::warn!(
            shard = self.index,
            object = object.as_deref().unwrap_or(""),
            "a cache disk failed a read and no pass-through from the origin could start: the response is cut"
        );
        ShardMetrics::add(&self.metrics.cache_disk_failovers_cut, 1);
        let waiter = self.waiter(c);
        self.cache.pulls.aborts.push(waiter);
    }
}
