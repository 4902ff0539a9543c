//! `CacheFill`: one shard's handle on the shared cache. It takes the lock for what the shard
//! asks (wants, pins, checks of read blocks, hot versions), runs the shard's fetches on its
//! ring, and settles the I/O thread's finished batches. It never waits for the lock: every
//! call a shard makes tries it (`try_lock_as`) and, when another thread holds it, answers
//! None (or keeps the work, such as a pin to give back, for the next hold), so the shard
//! does it at a later tick.

use super::*;

impl<W: Clone + PartialEq + Routed> CacheFill<W> {
    /// A single-shard cache in `dir` (replays its journal) with `filler` for the origins.
    pub fn open(dir: &Path, cfg: FillConfig, filler: Filler) -> std::io::Result<CacheFill<W>> {
        let core = FillCore::open(dir, cfg, 1)?.into_shared();
        Ok(CacheFill::attach(core, 0, filler))
    }

    /// Shard `shard`'s handle on the shared `core`, fetching with `filler`.
    pub fn attach(core: Arc<Mutex<FillCore<W>>>, shard: usize, filler: Filler) -> CacheFill<W> {
        let (store, signals, slot_bytes, revalidate_s, block_bytes) = {
            let c = lock(&core);
            (
                c.store.clone(),
                c.signals.clone(),
                c.cfg.slot_bytes,
                c.cfg.revalidate_s,
                c.cfg.block_bytes,
            )
        };
        CacheFill {
            signals,
            core,
            shard,
            filler,
            store,
            events: Vec::new(),
            freed: Vec::new(),
            samples: Vec::new(),
            pass_events: Vec::new(),
            next_pass: 1,
            pending: Pending::default(),
            budget_freed: false,
            slot_bytes,
            revalidate_s,
            block_bytes,
            handovers: Vec::new(),
            handed: HashMap::new(),
            held: Vec::new(),
            fetch_ended: false,
        }
    }

    /// Notes the field lines the request for `path` at `origin` forwards to its fill's
    /// fetches (`Filler::note_forward`).
    pub fn note_forward(&mut self, origin: usize, path: &str, lines: String) {
        self.filler.note_forward(origin, path, lines);
    }

    /// The block size new versions are stored in (`cache_block_bytes`).
    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// The freshness lifetime of a version whose origin set none (`cache_revalidate_s`).
    pub fn default_lifetime_s(&self) -> u64 {
        self.revalidate_s
    }

    /// The lock, waiting for it: tests only (a shard never waits, `try_core`).
    #[cfg(test)]
    pub(super) fn core(&self) -> Locked<'_, W> {
        lock_as(&self.core, self.shard)
    }

    /// The lock if it is free now (what this shard owed the core handed over first); None
    /// when another thread holds it.
    fn try_core(&mut self) -> Option<Locked<'_, W>> {
        let core = try_lock_as(&self.core, self.shard, &mut self.pending)?;
        catch_up(&mut self.store, &mut self.signals, &core);
        Some(core)
    }

    /// Takes the loaded core's store and signals once it replaced the loading one
    /// (`FillCore::install_threaded`), if the lock is free now: called each tick until then,
    /// so a shard with nothing to ask the cache still hears of fetches queued for it.
    pub fn catch_up_with_load(&mut self) {
        if self.signals.replaced() {
            let _ = self.try_core();
        }
    }

    /// Runs `f` on the shared fill under one hold of its lock, waiting for it: tests only.
    #[cfg(test)]
    pub fn with_core<T>(&self, f: impl FnOnce(&mut FillCore<W>) -> T) -> T {
        f(&mut self.core())
    }

    /// Runs `f` on the shared fill under one hold of its lock (several decisions, one lock)
    /// if the lock is free now; None when another thread holds it.
    pub fn try_with_core<T>(&mut self, f: impl FnOnce(&mut FillCore<W>) -> T) -> Option<T> {
        self.try_core().map(|mut core| f(&mut core))
    }

    /// Makes this shard's lock attempts fail `contention`'s share of the time, as another
    /// thread holding the lock would (the simulator's: it runs every shard on one thread).
    pub fn inject_contention(&mut self, contention: Contention) {
        self.pending.contention = Some(contention);
    }

    /// Lock attempts this shard found held (and did later), since start.
    pub fn lock_busy(&self) -> u64 {
        self.pending.busy
    }

    /// Settles the I/O thread's finished batches (their blocks become visible, their waiters
    /// hear), if it has any: read without the lock.
    pub fn settle_io(&mut self) {
        let Some(io) = self.signals.io.clone() else {
            return;
        };
        if !io.has_done.load(Ordering::Acquire) {
            return;
        }
        let Some(mut core) = self.try_core() else {
            return;
        };
        let mut done = std::mem::take(&mut core.done_scratch);
        io.take_done(&mut done);
        for d in done.drain(..) {
            core.io_done(d);
        }
        core.done_scratch = done;
    }

    /// The index (what is on disk), under the shared lock, waiting for it: tests only.
    #[cfg(test)]
    pub fn index(&self) -> IndexGuard<'_, W> {
        IndexGuard(self.core())
    }

    /// The index (what is on disk) if the lock is free now: do not hold it across calls.
    pub fn try_index(&mut self) -> Option<IndexGuard<'_, W>> {
        self.try_core().map(IndexGuard)
    }

    /// The data files.
    pub fn store(&self) -> &BlockStore {
        &self.store
    }

    /// The filler (this shard's connections and fetches).
    pub fn filler(&self) -> &Filler {
        &self.filler
    }

    /// Hands each time from a fetch's start to its origin's head (ms) seen since the last
    /// call to `observe`.
    pub fn take_first_byte_ms(&mut self, mut observe: impl FnMut(u64)) {
        let mut samples = std::mem::take(&mut self.samples);
        self.filler.take_first_byte_ms(&mut samples);
        samples.drain(..).for_each(&mut observe);
        self.samples = samples;
    }

    /// Blocks fetched from the origin, over all shards.
    #[cfg(test)]
    pub fn blocks_fetched(&self) -> u64 {
        self.core().blocks_fetched
    }

    /// Blocks found corrupt, over all shards.
    #[cfg(test)]
    pub fn blocks_corrupt(&self) -> u64 {
        self.core().blocks_corrupt
    }

    /// See `FillCore::purge`.
    #[cfg(test)]
    pub fn purge(&mut self, path: &str, prefix: bool) -> usize {
        self.core().purge(path, prefix)
    }

    /// Journal compactions finished, and the journal's bytes now.
    #[cfg(test)]
    pub fn compactions(&self) -> (u64, u64) {
        let core = self.core();
        (core.compactions, core.journal_bytes)
    }

    /// Data files the fill holds open for writing (at most `FillConfig::open_files`).
    #[cfg(test)]
    pub fn open_files(&self) -> usize {
        self.core().files.len()
    }

    /// See `FillCore::want`; None when the lock is held.
    pub fn want(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Option<Outcome> {
        self.try_core()
            .map(|mut c| c.want(key, origin, path, first, last, waiter))
    }

    /// See `FillCore::want_streaming`.
    #[cfg(test)]
    pub fn want_streaming(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.core()
            .want_streaming(key, origin, path, first, last, waiter)
    }

    /// See `FillCore::admit`.
    #[cfg(test)]
    pub fn admit(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        revalidate: bool,
        waiter: W,
    ) -> Option<Outcome> {
        self.core()
            .admit(key, origin, path, first, revalidate, waiter, unix_now_s())
    }

    /// See `FillCore::want_more`; None when the lock is held.
    #[allow(clippy::too_many_arguments)]
    pub fn want_more(
        &mut self,
        version: u64,
        key: &[u8],
        origin: usize,
        path: &str,
        start: u64,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Option<Outcome> {
        self.try_core()
            .map(|mut c| c.want_more(version, key, origin, path, start, first, last, waiter))
    }

    /// Pauses origin `origin` asked for so far (read without the lock).
    pub fn origin_pauses_of(&self, origin: usize) -> u64 {
        self.signals
            .origin_pauses
            .get(origin)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// See `FillCore::origin_paused_s` (None too when the lock is held).
    pub fn origin_paused_s(&mut self, origin: usize, now_ms: u64) -> Option<u64> {
        self.try_core()?.origin_paused_s(origin, now_ms)
    }

    /// See `FillCore::stats` (as of the lock's last release: read without it).
    pub fn stats(&self) -> FillStats {
        let [a, b, c, d, e, ..] = &self.signals.stats;
        FillStats {
            versions_evicted: a.load(Ordering::Relaxed),
            waits_joined: b.load(Ordering::Relaxed),
            waits_started: c.load(Ordering::Relaxed),
            disk_full: d.load(Ordering::Relaxed),
            origin_pauses: e.load(Ordering::Relaxed),
        }
    }

    /// Versions purged by tag and purge tags dropped, over all shards (`purge`; read
    /// without the lock).
    pub fn purge_stats(&self) -> (u64, u64) {
        super::purge::counts(&self.signals)
    }

    /// Moves the versions dropped since this shard last asked into `out` (the shard closes
    /// its descriptors of their removed data files).
    pub fn take_dropped(&mut self, out: &mut Vec<u64>) {
        if self.has_news() {
            let shard = self.shard;
            if let Some(mut core) = self.try_core() {
                out.append(&mut core.dropped[shard]);
            }
        }
    }

    /// See `FillCore::pin`.
    #[cfg(test)]
    pub fn pin(&mut self, version: u64) {
        self.core().pin(version);
    }

    /// See `FillCore::unpin`: now, or at this shard's next hold of the lock.
    pub fn unpin(&mut self, version: u64) {
        self.pending.unpins.push(version);
        drop(self.try_core());
    }

    /// See `FillCore::readable_end`; None when the lock is held.
    pub fn readable_end(&mut self, version: u64, from: u64) -> Option<u64> {
        self.try_core().map(|c| c.readable_end(version, from))
    }

    /// `waiter` went away: it hears nothing more (the fetches go on for the cache). Now, or
    /// at this shard's next hold of the lock, before anything else is asked under it.
    pub fn cancel(&mut self, waiter: &W) {
        self.pending.cancels.push(waiter.clone());
        drop(self.try_core());
    }

    /// Hands the core what this shard still owes it (pins, cancels, fetch events) if the lock
    /// is free now: each tick, so nothing waits on a later call to go.
    pub fn settle_pending(&mut self, now_ms: u64) {
        if !self.events.is_empty() || self.budget_freed {
            self.settle_events(now_ms);
        } else if !self.pending.unpins.is_empty()
            || !self.pending.cancels.is_empty()
            // A refusal whose work needs no retry (a hint let go): one try ends the loop's
            // quick wake-ups.
            || self.pending.refused
        {
            drop(self.try_core());
        }
    }

    /// Whether this shard has work a held lock put off (its loop comes back for it within a
    /// millisecond).
    #[cfg(test)]
    pub fn lock_refused(&self) -> bool {
        self.pending.refused
    }

    /// Starts the queued fetches that may start now on this shard: each takes a slot from
    /// `take_slot` (None: no slot free; they wait) and a connection from its origin's pool.
    pub fn pump<R: RingOps>(
        &mut self,
        ring: &mut R,
        take_slot: &mut dyn FnMut() -> Option<ArenaSlot>,
        now_ms: u64,
    ) {
        if !self.has_queued() {
            return;
        }
        let Some(mut core) = try_lock_as(&self.core, self.shard, &mut self.pending) else {
            return;
        };
        catch_up(&mut self.store, &mut self.signals, &core);
        core.pump(
            self.shard,
            &mut self.filler,
            ring,
            take_slot,
            &mut self.freed,
            now_ms,
        );
    }

    /// Posts the origin receives a bandwidth cap held back whose turn came.
    pub fn resume_paced<R: RingOps>(&mut self, ring: &mut R, now_ms: u64) {
        if self.filler.resume_paced(ring, now_ms) {
            self.settle_events(now_ms);
        }
    }

    /// An `Op::Origin` completion of this shard's fetch.
    pub fn on_completion<R: RingOps>(
        &mut self,
        ring: &mut R,
        token: crate::ring_api::token::Token,
        res: i32,
        now_ms: u64,
    ) {
        self.filler.on_completion(ring, token, res, now_ms);
        self.settle_events(now_ms);
    }

    /// Takes the filler's events: a pass-through's go to the shard, the rest to the shared
    /// fill.
    pub(super) fn settle_events(&mut self, now_ms: u64) {
        self.filler.take_events(&mut self.events);
        self.fetch_ended |= self
            .events
            .iter()
            .any(|e| matches!(e, FillEvent::Ended { .. }));
        let (pass_events, handed, held) = (&mut self.pass_events, &mut self.handed, &mut self.held);
        self.events.retain(|e| {
            let job = e.job();
            if let FillEvent::Head { facts, .. } = e {
                if facts.handed.is_some() {
                    // The shared fill decides who gets it; its pieces wait for that.
                    handed.entry(job).or_insert(false);
                    return true;
                }
            }
            if let Some(&taken) = handed.get(&job) {
                if matches!(e, FillEvent::Ended { .. }) && taken {
                    handed.remove(&job);
                }
                match e {
                    FillEvent::Committed { .. } => {}
                    _ if taken => pass_events.push(e.clone()),
                    _ => held.push(e.clone()),
                }
                return false;
            }
            if job & PASS_THROUGH_JOB_BIT == 0 {
                return true;
            }
            // Nothing of a pass-through is stored: its blocks are not journaled.
            if !matches!(e, FillEvent::Committed { .. }) {
                pass_events.push(e.clone());
            }
            false
        });
        // A fetch ended while another shard was refused its origin's shared budget: the
        // shards with queued fetches try again (they are woken as the lock is let go).
        self.budget_freed |= self.filler.take_budget_freed();
        if self.events.is_empty() && !self.budget_freed {
            return;
        }
        // Held elsewhere: the events wait here (in order) for the next tick's try.
        let Some(mut core) = try_lock_as(&self.core, self.shard, &mut self.pending) else {
            return;
        };
        catch_up(&mut self.store, &mut self.signals, &core);
        if std::mem::take(&mut self.budget_freed) {
            core.wake_queued_shards();
        }
        core.settle(&mut self.events, &mut self.freed, now_ms);
        // Only this shard's fetches were settled: the replies handed over are its own.
        self.handovers.append(&mut core.handovers);
    }

    /// Moves the replies handed over (`Handover`) into `out`: each is then claimed
    /// (`claim_handed`) or dropped (`drop_handed`).
    pub fn take_handovers(&mut self, out: &mut Vec<Handover<W>>) {
        out.append(&mut self.handovers);
    }

    /// The shard answers its waiter with handed-over fetch `job`: its events come out of
    /// `take_pass_through_events` from here on, those held first.
    pub fn claim_handed(&mut self, job: u64) {
        self.release_held(job, true);
    }

    /// Nobody takes handed-over fetch `job`: it is ended (its `Ended` gives its slot back
    /// through `take_pass_through_events`).
    pub fn drop_handed<R: RingOps>(&mut self, ring: &mut R, job: u64, now_ms: u64) {
        if self.release_held(job, false) {
            self.filler.abort(ring, job, now_ms);
            self.settle_events(now_ms);
        }
    }

    /// Marks `job` taken and moves its held events on (its pieces only when `pieces`: a
    /// dropped fetch's piece is its slot, given back with its end). Whether it is still
    /// running.
    fn release_held(&mut self, job: u64, pieces: bool) -> bool {
        let Some(taken) = self.handed.get_mut(&job) else {
            return false;
        };
        *taken = true;
        let mut running = true;
        let (pass_events, held) = (&mut self.pass_events, &mut self.held);
        held.retain(|e| {
            if e.job() != job {
                return true;
            }
            match e {
                FillEvent::Ended { .. } => {
                    running = false;
                    pass_events.push(e.clone());
                }
                FillEvent::Piece { .. } if !pieces => {}
                _ => pass_events.push(e.clone()),
            }
            false
        });
        if !running {
            self.handed.remove(&job);
        }
        running
    }

    /// Every arena slot this shard's fill holds: its running fetches', and those its ended
    /// fetches gave back that the shard has not taken yet (the simulator's accounting).
    pub fn held_slots(&self) -> impl Iterator<Item = ArenaSlot> + '_ {
        let ended = |e: &FillEvent| match *e {
            FillEvent::Ended { slot, .. } | FillEvent::Released { slot, .. } => slot,
            _ => None,
        };
        // Ended fetches' events not settled yet (the lock was held) hold their slots too.
        self.filler
            .slots()
            .chain(self.freed.iter().copied())
            .chain(self.pass_events.iter().filter_map(ended))
            .chain(self.held.iter().filter_map(ended))
            .chain(self.events.iter().filter_map(ended))
    }

    /// Starts a pass-through fetch of `pass` into `slot` (the caller's; it comes back with
    /// the fetch's `Ended`): its pieces come out of `take_pass_through_events` as
    /// `FillEvent::Piece`, each to be answered with `delivered`. Err: it cannot start
    /// now: `(slot, true)` when the origin is at its bound (try again once a fetch ends),
    /// `(slot, false)` when the request cannot be made.
    pub fn begin_pass_through<R: RingOps>(
        &mut self,
        ring: &mut R,
        pass: &PassThrough<'_>,
        slot: ArenaSlot,
        now_ms: u64,
    ) -> Result<u64, (ArenaSlot, bool)> {
        assert!(
            pass.from < pass.end && pass.size.is_none_or(|s| pass.end <= s) && pass.block_bytes > 0
        );
        let slot_bytes = self.slot_bytes;
        let b = u64::from(pass.block_bytes);
        let plan = Plan {
            first_block: u32::try_from(pass.from / b).unwrap_or(u32::MAX),
            last_block: u32::try_from((pass.end - 1) / b).unwrap_or(u32::MAX),
            block_bytes: pass.block_bytes,
            size: pass.size,
            etag: Some(pass.etag.to_owned()).filter(|e| !e.is_empty()),
            last_modified: Some(pass.last_modified.to_owned()).filter(|l| !l.is_empty()),
            revalidate: false,
            slot_bytes,
            // Nothing is written to a disk: no alignment, and the "syncs" are answered at
            // once, so one per 64 blocks keeps the machine's list of blocks short.
            align_bytes: 1,
            sync_every_blocks: 64,
            storing: crate::origin::fetch::Storing::Not,
            hand_over: false,
        };
        let job = PASS_THROUGH_JOB_BIT | self.next_pass;
        match self.filler.begin_as(
            ring,
            job,
            pass.origin,
            pass.path,
            pass.authorization,
            pass.forward,
            plan,
            slot,
            None,
            now_ms,
        ) {
            Ok(()) => {
                self.next_pass += 1;
                self.settle_events(now_ms);
                Ok(job)
            }
            Err(Begin::Wait(slot)) => Err((slot, true)),
            Err(Begin::Refused(slot, _)) => Err((slot, false)),
        }
    }

    /// Whether a fetch of this shard ended since the last call (an origin's fetch bound may
    /// have room again).
    pub fn take_fetch_ended(&mut self) -> bool {
        std::mem::take(&mut self.fetch_ended)
    }

    /// A request of this shard waits for room in its origin's fetch budget: the next fetch
    /// to end on any shard wakes this one (`take_budget_wake`).
    pub fn wait_for_budget(&self) {
        self.signals.budget_waits[self.shard].store(true, Ordering::Release);
    }

    /// Whether a fetch ended on some shard since this one's requests began waiting for their
    /// origin's budget (`wait_for_budget`).
    pub fn take_budget_wake(&self) -> bool {
        self.signals.budget_woken[self.shard].swap(false, Ordering::AcqRel)
    }

    /// The last piece of pass-through `job` went to its client: the fetch goes on.
    pub fn delivered<R: RingOps>(&mut self, ring: &mut R, job: u64, now_ms: u64) {
        if self.filler.delivered(ring, job, now_ms) {
            self.settle_events(now_ms);
        }
    }

    /// Ends pass-through `job` (its client is gone); its `Ended` follows.
    pub fn abort_pass_through<R: RingOps>(&mut self, ring: &mut R, job: u64, now_ms: u64) {
        self.filler.abort(ring, job, now_ms);
        self.settle_events(now_ms);
    }

    /// Moves the pass-through fetches' events (heads, pieces, ends) into `out`.
    pub fn take_pass_through_events(&mut self, out: &mut Vec<FillEvent>) {
        out.append(&mut self.pass_events);
    }

    /// Ends fetch stages past their deadline (their completions follow).
    pub fn expire(&mut self, now_ms: u64) {
        let parked = self.filler.parked();
        self.filler.expire(now_ms);
        // A fetch given up at a disk's deadline ended now: its waiters hear at once.
        if self.filler.parked() != parked {
            self.settle_events(now_ms);
        }
    }

    /// The earliest time (ms) something is due: a fetch deadline or a retry, or now when a
    /// held lock put work off.
    pub fn next_due_ms(&self) -> Option<u64> {
        if self.pending.refused {
            return Some(0);
        }
        let retry = Some(self.signals.next_retry_ms[self.shard].load(Ordering::Acquire))
            .filter(|&r| r != u64::MAX);
        match (self.filler.next_deadline_ms(), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves this shard's notices into `out`, the slots its ended fetches gave back into
    /// `slots`, and the shards to wake (other shards' waiters heard from this shard's
    /// fetches) into `wake`.
    pub fn take(
        &mut self,
        out: &mut Vec<Notice<W>>,
        slots: &mut Vec<ArenaSlot>,
        wake: &mut Vec<usize>,
    ) {
        slots.append(&mut self.freed);
        if !self.signals.news[self.shard].load(Ordering::Acquire) {
            return;
        }
        let shard = self.shard;
        let Some(mut core) = self.try_core() else {
            return;
        };
        out.append(&mut core.notices[shard]);
        core.to_wake[shard] = false;
        core.take_wakes(wake);
    }

    /// Whether the fill has queued fetches for this shard to start (read without the lock).
    pub fn has_queued(&self) -> bool {
        self.signals.queued[self.shard].load(Ordering::Acquire) > 0
    }

    /// Whether notices or dropped versions wait for this shard (read without the lock).
    pub fn has_news(&self) -> bool {
        self.signals.news[self.shard].load(Ordering::Acquire)
    }

    /// Checks every block of `version` that bytes `file_off..file_off + need` of its data
    /// file touch against its checksum, `bytes` being what the read brought (from
    /// `file_off`, a block boundary). A read of a pulled object holds whole blocks by
    /// construction (its reads are aligned to the block size and end at a block boundary or
    /// the object's end), so every block a response sends is checked, with no cap. The
    /// checksums come from the response's own `window`, refilled under the lock only when a
    /// block is past it. The first block that fails is forgotten and returned
    /// (`BadBlock::Corrupt`); one the index no longer holds (another read dropped it) is
    /// `BadBlock::Dropped`. `BadBlock::LockBusy` when a checksum or a bad block's drop needed
    /// the lock and another thread held it: the read is judged again later.
    pub fn check_blocks(
        &mut self,
        version: u64,
        file_off: u64,
        need: usize,
        bytes: &[u8],
        window: &mut CrcWindow,
        hot: Option<&HotVersion>,
    ) -> Result<(), BadBlock> {
        // A published version's checksums are all at hand: no lock.
        let refill = |me: &mut Self, at: u64, window: &mut CrcWindow| match hot {
            Some(h) if h.meta.version == version => {
                *window = h.window(at);
                Ok(())
            }
            _ => match me.try_core() {
                Some(core) => {
                    core.fill_window(version, at, window);
                    Ok(())
                }
                None => Err(BadBlock::LockBusy),
            },
        };
        if window.version != version || window.size == 0 {
            refill(self, file_off, window)?;
        }
        let (size, b) = (window.size, u64::from(window.block_bytes));
        if size == 0 {
            // A version read is pinned and never dropped: its bytes cannot be vouched for.
            return Err(BadBlock::Dropped(0));
        }
        assert_eq!(
            file_off % b,
            0,
            "a read of a pulled object starts on a block"
        );
        let end = (file_off + need as u64).min(size);
        let mut at = file_off;
        while at < end {
            let len = (size - at).min(b) as usize;
            let start = (at - file_off) as usize;
            // Whole blocks only: the read's alignment keeps it so.
            assert!(
                start + len <= bytes.len(),
                "a read holds part of block {} ({} of {len} bytes)",
                at / b,
                bytes.len() - start
            );
            let block = (at / b) as u32;
            let crc = match window.get(block) {
                Some(crc) => crc,
                None => {
                    refill(self, at, window)?;
                    // A read covers committed blocks only: one without its checksum now was
                    // found corrupt (and dropped) by another read while this one was planned
                    // or in flight, and its bytes on the disk are the bad ones.
                    window.get(block).ok_or(BadBlock::Dropped(block))?
                }
            };
            if crate::cache::checksum(&bytes[start..start + len]) != crc {
                let mut core = self.try_core().ok_or(BadBlock::LockBusy)?;
                core.blocks_corrupt += 1;
                core.index.forget_block(version, block);
                core.invalidate_hot(version);
                window.forget(block);
                return Err(BadBlock::Corrupt(block));
            }
            at += b;
        }
        Ok(())
    }

    /// A response reading `version` met block `block` corrupt (or dropped) mid-body: the
    /// block is fetched again at the front of the queue (or the fetch under way is joined and
    /// moved there), and `waiter` hears `Notice::Block` when it is back (`Ready`: it is
    /// already). `Busy` when it cannot be: the version is no longer the key's (the response
    /// cannot go on without mixing versions) or too many wait. None when the lock is held.
    pub fn refetch(&mut self, version: u64, block: u32, waiter: W) -> Option<Outcome> {
        self.try_core()
            .map(|mut c| c.refetch(version, block, waiter))
    }

    /// See `FillCore::verify_block`.
    #[cfg(test)]
    pub fn verify_block(&mut self, version: u64, block: u32, buf: &mut Vec<u8>) -> bool {
        self.core().verify_block(version, block, buf)
    }
}

/// A handle's copies of the core's store and signals, taken again from `core` (held) when
/// the core they came from was replaced by the loaded one.
fn catch_up<W: Clone + PartialEq + Routed>(
    store: &mut BlockStore,
    signals: &mut Arc<Signals>,
    core: &FillCore<W>,
) {
    if signals.replaced() {
        *store = core.store.clone();
        *signals = core.signals.clone();
    }
}
