//! `FillCore`'s work under the lock: wants of byte ranges turned into coalesced block
//! fetches, fetch events applied (heads, blocks committed, failures and retries), notices to
//! waiters on any shard, eviction, scrub steps and the origins' pauses.

use super::*;

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// `waiter` wants bytes `first..=last` (None: from `first` to the end) of `key`, fetched
    /// from `origin` as `path` when missing; `Ready` once every block of them is on disk.
    pub fn want(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.want_blocks(key, origin, path, first, first, last, waiter, false)
    }

    /// As `want`, for a response that streams: `Ready` once the block holding `first` is on
    /// disk (the response reads on up to `readable_end` and wants again from there), and only
    /// that block and the read-ahead after it are asked for now, however long the range.
    pub fn want_streaming(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        self.want_blocks(key, origin, path, first, first, last, waiter, true)
    }

    /// What a request for `key` (from byte `first`) must wait for before its bytes are
    /// judged: `Refused(404)` when the origin's 404 is remembered, and, when `revalidate` (a
    /// request not yet through a revalidation), `Waiting` if the key's version is stale (past
    /// its origin's lifetime, `revalidate_s` where it set none; always, for `no-cache`): its
    /// revalidation is started or joined. None: go on to `want`. An
    /// empty object is never revalidated (it has no block to ask for).
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        revalidate: bool,
        waiter: W,
        now_s: u64,
    ) -> Option<Outcome> {
        if self.loading {
            return Some(Outcome::Loading);
        }
        let shard = waiter.shard().min(self.notices.len() - 1);
        if self.not_found.holds(key, now_s) {
            return Some(Outcome::Refused(404));
        }
        if self.pass_keys.holds(key, now_s) {
            return Some(Outcome::Pass);
        }
        if !revalidate {
            return None;
        }
        // Read in place: every locked request that may need revalidating comes here.
        let meta = self.index.current_view(key)?;
        let (v, size, block_bytes, status) =
            (meta.version, meta.size, meta.block_bytes, meta.status);
        let (freshness, fresh_until) = (meta.freshness, meta.fresh_until_s(self.cfg.revalidate_s));
        if status != 200 && now_s >= fresh_until {
            // A stored redirect or error is not revalidated but fetched anew (the object may
            // be there now): the request goes on to `want` as a miss.
            self.retire(v);
            return None;
        }
        if size == 0
            || now_s < fresh_until
            || self.revalidate_after.get(&v).is_some_and(|&t| now_s < t)
        {
            return None;
        }
        // The block the request starts in is the one asked for: a 206 with the same
        // validators refreshes it, and a partial object gets it.
        let block = (first.min(size - 1) / u64::from(block_bytes)) as u32;
        let swr = freshness.stale_while_revalidate_s.map_or(0, u64::from);
        if !freshness.no_cache && now_s < fresh_until.saturating_add(swr) {
            // `stale-while-revalidate` (RFC 5861): served stale now, while one revalidation
            // runs in the background (with no waiter: nobody waits for it).
            if !self.probes.contains_key(key) && self.queue.len() < MAX_QUEUED_FETCHES {
                self.probes.insert(key.to_vec(), Vec::new());
                self.queue_revalidation(key, origin, path, v, block, shard);
            }
            return None;
        }
        if let Some(waiters) = self.probes.get_mut(key) {
            if waiters.len() >= MAX_PROBE_WAITERS {
                return Some(Outcome::Busy);
            }
            waiters.push(waiter);
            self.waits_joined += 1;
            return Some(Outcome::Waiting);
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return Some(Outcome::Busy);
        }
        self.probes.insert(key.to_vec(), vec![waiter]);
        self.waits_started += 1;
        self.queue_revalidation(key, origin, path, v, block, shard);
        Some(Outcome::Waiting)
    }

    /// Queues the conditional fetch of `block` that confirms `version` of `key` (or finds it
    /// replaced), run by `shard`.
    fn queue_revalidation(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        version: u64,
        block: u32,
        shard: usize,
    ) {
        self.queue.push_back(Job {
            key: key.to_vec(),
            origin,
            path: path.to_owned(),
            version,
            first: block,
            last: block,
            probe: false,
            revalidate: true,
            not_before_ms: 0,
            committed: Vec::new(),
            pinned: false,
            shard,
        });
    }

    /// As `want_streaming`, for a response that began on `version` at byte `start` and reads
    /// on from `first`: `Busy` once the key has another version (the response cannot go on
    /// without mixing them).
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
    ) -> Outcome {
        if self.index.current_version(key) != Some(version) {
            return Outcome::Busy;
        }
        self.want_blocks(key, origin, path, start, first, last, waiter, true)
    }

    /// `waiter` wants the pieces of a multipart range (`(first, last)` byte pairs, last
    /// inclusive, within the object) of `key`: `Ready` once the blocks of every piece are on
    /// disk. Only those blocks are fetched, with no read-ahead: a Riot patcher's pieces of a
    /// bundle cost the origin their own blocks, not the span between them.
    pub fn want_pieces(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        pieces: &[(u64, u64)],
        waiter: W,
    ) -> Outcome {
        let Some(&(first, last)) = pieces.first() else {
            return self.want(key, origin, path, 0, None, waiter);
        };
        let Some(meta) = self.index.current(key) else {
            return self.probe(key, origin, path, first, Some(last), waiter);
        };
        if meta.size == 0 {
            return Outcome::Ready(meta.version);
        }
        let shard = waiter.shard().min(self.notices.len() - 1);
        // Each piece's blocks, merged where they touch.
        let mut spans: Vec<std::ops::Range<u64>> = pieces
            .iter()
            .filter(|(a, b)| a <= b && *b < meta.size)
            .map(|&(a, b)| blocks_for(a, b, meta.size, meta.block_bytes, 0))
            .collect();
        spans.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u64>> = Vec::with_capacity(spans.len());
        for r in spans {
            match merged.last_mut() {
                Some(m) if r.start <= m.end => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let v = meta.version;
        let present = |b: u64| self.index.block_crc(v, b as u32).is_some();
        let ready = merged.iter().all(|r| r.clone().all(present));
        if ready {
            if let Some(e) = self.evict.as_mut() {
                e.touch(&v);
            }
            return Outcome::Ready(v);
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return Outcome::Busy;
        }
        // The first missing block is what the waiter waits on; the rest are fetched for
        // nobody in particular (the waiter asks again when it is woken).
        if !self.ask_missing(key, origin, path, v, &merged, &|_| true, &waiter, shard) {
            return Outcome::Busy;
        }
        Outcome::Waiting
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn want_blocks(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        start: u64,
        first: u64,
        last: Option<u64>,
        waiter: W,
        streaming: bool,
    ) -> Outcome {
        let shard = waiter.shard().min(self.notices.len() - 1);
        let Some(meta) = self.index.current(key) else {
            return self.probe(key, origin, path, first, last, waiter);
        };
        if meta.size == 0 {
            return Outcome::Ready(meta.version);
        }
        // Closed: the client said where it stops, short of the object's end.
        let closed = last.is_some_and(|l| l < meta.size - 1);
        let last = last.unwrap_or(meta.size - 1).min(meta.size - 1);
        let first = first.min(last);
        let start = start.min(first);
        let b = u64::from(meta.block_bytes);
        let need_last = if streaming {
            (first | (b - 1)).min(last)
        } else {
            last
        };
        let need = blocks_for(first, need_last, meta.size, meta.block_bytes, 0);
        let continues = closed
            && self
                .recent_ends
                .get(&meta.version)
                .is_some_and(|r| r.continued_by(start, b));
        if closed {
            if self.recent_ends.len() >= MAX_RECENT_END_VERSIONS
                && !self.recent_ends.contains_key(&meta.version)
            {
                self.recent_ends.clear();
            }
            self.recent_ends.entry(meta.version).or_default().note(last);
        }
        let ra = self.read_ahead(&meta, start, first, last, closed, continues);
        let ahead_end = if streaming {
            // Within the request, the ramp; past a closed request's end, what `read_ahead`
            // allows. The window ends on a multiple of its step (the ramp, at most a run), so
            // it grows a step at a time: one sliding a block per want would turn every later
            // request into a one-block run, each paying the origin's first-byte delay. It is
            // rounded down (never below what the want needs).
            let end = (first / b + 1 + ra.within).min(last / b + 1 + ra.past_end);
            let step = ra.within.min(self.cfg.max_run_blocks);
            if step > 1 && end < meta.blocks() {
                (end / step * step).max(need.end)
            } else {
                end
            }
        } else {
            last / b + 1 + ra.past_end
        };
        let ahead = need.start..ahead_end.min(meta.blocks()).max(need.end);
        let v = meta.version;
        let present = |b: u64| self.index.block_crc(v, b as u32).is_some();
        // Ready now, and the read-ahead still asked for: a sequential reader whose blocks
        // are all there finds its next ones coming (the kernel's asynchronous read-ahead).
        let ready = need.clone().all(present);
        if ready {
            if let Some(e) = self.evict.as_mut() {
                e.touch(&v);
            }
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return if ready {
                Outcome::Ready(v)
            } else {
                Outcome::Busy
            };
        }
        // The first missing block this waiter needs is what it waits on; the others of its
        // range and the read-ahead are fetched for nobody in particular.
        let needed = |b: u64| need.contains(&b);
        if !self.ask_missing(key, origin, path, v, &[ahead], &needed, &waiter, shard) {
            return Outcome::Busy;
        }
        if ready {
            Outcome::Ready(v)
        } else {
            Outcome::Waiting
        }
    }

    /// Asks for the blocks of `spans` of version `v` that are not on disk: the first one
    /// `needed` is what `waiter` waits on, the others are fetched for nobody in particular
    /// (one already coming is left alone), and the blocks to fetch are queued in runs. False
    /// when the waiter's block is being passed through (the want is `Busy`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask_missing(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        v: u64,
        spans: &[std::ops::Range<u64>],
        needed: &dyn Fn(u64) -> bool,
        waiter: &W,
        shard: usize,
    ) -> bool {
        let mut waited = false;
        let mut to_fetch = Vec::new();
        for b in spans.iter().flat_map(|r| r.clone()) {
            if self.index.block_crc(v, b as u32).is_some() {
                continue;
            }
            let w = (!waited && needed(b)).then(|| waiter.clone());
            let is_waiter = w.is_some();
            if !is_waiter && self.blocks.fetching(&(v, b as u32)) {
                // Already under way: nobody to add to its list.
                continue;
            }
            match self.blocks.want((v, b as u32), w) {
                Ask::Fetch => {
                    self.waits_started += u64::from(is_waiter);
                    to_fetch.push(b);
                }
                Ask::Wait => self.waits_joined += u64::from(is_waiter),
                Ask::PassThrough if is_waiter => return false,
                Ask::PassThrough => continue,
            }
            waited |= is_waiter;
        }
        for span in spans {
            let runs = missing_runs(
                span.clone(),
                |b| !to_fetch.contains(&b),
                self.cfg.max_run_blocks,
            );
            for run in runs {
                self.queue.push_back(Job {
                    key: key.to_vec(),
                    origin,
                    path: path.to_owned(),
                    version: v,
                    first: run.start as u32,
                    last: (run.end - 1) as u32,
                    probe: false,
                    revalidate: false,
                    not_before_ms: 0,
                    committed: Vec::new(),
                    pinned: false,
                    shard,
                });
            }
        }
        true
    }

    /// How far a want may fetch past the block of byte `first`, by the context the way the
    /// kernel's on-demand read-ahead judges it: a download from the object's start that runs
    /// to its end gets the whole `read_ahead_blocks` at once; any other stream starts at
    /// `INITIAL_READ_AHEAD_BLOCKS` and grows with the blocks already there (or coming) right
    /// behind where it reads, so it doubles while access stays sequential. Past the end of a
    /// closed range (`last`, the request began at `start`) only when it `continues` one of the
    /// version's recent closed requests (it starts where one ended) and the blocks right
    /// behind it are there: a client that continues what it or another read before (a chunked
    /// download, a PS5's 18 MiB ranges) gets its next ranges ahead, one that jumps (Delivery
    /// Optimization, TACT archives, Riot bundles) gets exactly what it asked for, even where
    /// earlier jumps happened to leave blocks right behind it.
    pub(super) fn read_ahead(
        &self,
        meta: &crate::cache::index::ObjectVersion,
        start: u64,
        first: u64,
        last: u64,
        closed: bool,
        continues: bool,
    ) -> ReadAhead {
        let cap = self.cfg.read_ahead_blocks;
        let b = u64::from(meta.block_bytes);
        let (start_block, first_block) = (start / b, first / b);
        // Counted once where the request starts and the read is (a want that does not
        // stream reads from its start).
        let behind_start = closed.then(|| self.blocks_behind(meta.version, start_block, cap));
        let within = if start_block == 0 && !closed {
            cap
        } else {
            let behind = match behind_start {
                Some(n) if first_block == start_block => n,
                _ => self.blocks_behind(meta.version, first_block, cap),
            };
            cap.min(INITIAL_READ_AHEAD_BLOCKS.max(behind))
        };
        let past_end = match behind_start {
            None | Some(0) => 0,
            Some(_) if !continues => 0,
            Some(behind) => cap.min(behind.max(last / b + 1 - start_block)),
        };
        ReadAhead { within, past_end }
    }

    /// Blocks of `version` right before `block` that are on disk or being fetched, counted up
    /// to `max`.
    pub(super) fn blocks_behind(&self, version: u64, block: u64, max: u64) -> u64 {
        let v = version;
        let there = |b: u64| {
            self.index.block_crc(v, b as u32).is_some() || self.blocks.fetching(&(v, b as u32))
        };
        (1..=max.min(block))
            .take_while(|&d| there(block - d))
            .count() as u64
    }

    /// An unknown object: its first fetch starts at the block of byte `first` (a cold Range
    /// in the middle of a large object fetches its own blocks, not the object's start), asks
    /// for the blocks up to a closed range's `last` only, or for the read-ahead's start (the
    /// whole `read_ahead_blocks` from the object's start), and learns the size from the head.
    pub(super) fn probe(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        first: u64,
        last: Option<u64>,
        waiter: W,
    ) -> Outcome {
        let shard = waiter.shard().min(self.notices.len() - 1);
        if let Some(waiters) = self.probes.get_mut(key) {
            if waiters.len() >= MAX_PROBE_WAITERS {
                return Outcome::Busy;
            }
            waiters.push(waiter);
            self.waits_joined += 1;
            return Outcome::Waiting;
        }
        if self.queue.len() >= MAX_QUEUED_FETCHES {
            return Outcome::Busy;
        }
        self.probes.insert(key.to_vec(), vec![waiter]);
        self.waits_started += 1;
        let version = self.store.new_version(key, self.next_version);
        self.next_version += 1;
        let b = u64::from(self.cfg.block_bytes);
        let start = u32::try_from(first / b).unwrap_or(u32::MAX);
        let ahead = match last {
            Some(last) => (last.max(first) / b).saturating_sub(first / b),
            None if first < b => self.cfg.read_ahead_blocks,
            None => self.cfg.read_ahead_blocks.min(INITIAL_READ_AHEAD_BLOCKS),
        };
        let run = ahead.min(self.cfg.max_run_blocks - 1) as u32;
        self.queue.push_back(Job {
            key: key.to_vec(),
            origin,
            path: path.to_owned(),
            version,
            first: start,
            last: start.saturating_add(run),
            probe: true,
            revalidate: false,
            not_before_ms: 0,
            committed: Vec::new(),
            pinned: false,
            shard,
        });
        Outcome::Waiting
    }

    /// Copies the checksums of `version`'s blocks from the one holding byte `from` on (those
    /// on disk) into `window`; a version the index no longer holds leaves it empty.
    pub fn fill_window(&self, version: u64, from: u64, window: &mut CrcWindow) {
        *window = CrcWindow::EMPTY;
        // Read in place (no version decoded): every locked hit and window step comes here.
        let (Some((_, block_bytes)), Some(size)) =
            (self.index.blocks_of(version), self.index.size_of(version))
        else {
            return;
        };
        let first = u32::try_from(from / u64::from(block_bytes)).unwrap_or(u32::MAX);
        window.version = version;
        window.size = size;
        window.block_bytes = block_bytes;
        window.first = first;
        for i in 0..CRC_WINDOW_BLOCKS {
            if let Some(crc) = first
                .checked_add(i)
                .and_then(|b| self.index.block_crc(version, b))
            {
                window.crc[i as usize] = crc;
                window.present |= 1 << i;
            }
        }
    }

    /// `version` published for lock-free hits, when every block of it is on disk, it is
    /// fresh and has at most `HOT_MAX_BLOCKS` blocks.
    pub fn hot_version(&mut self, version: u64) -> Option<Arc<HotVersion>> {
        if let Some(h) = self.hot.get(&version) {
            return Some(h.clone());
        }
        // Checked in place first: a version too large to publish comes here on each hit.
        let (blocks, _) = self.index.blocks_of(version)?;
        if blocks > HOT_MAX_BLOCKS
            || self.index.blocks_present(version) != blocks
            || !self.index.is_current(version)
        {
            return None;
        }
        let meta = self.index.meta(version)?;
        let crcs: Box<[u32]> = (0..blocks as u32)
            .map(|b| self.index.block_crc(version, b))
            .collect::<Option<_>>()?;
        let fresh_until_s = meta.fresh_until_s(self.cfg.revalidate_s);
        if self.hot.len() >= HOT_MAX_VERSIONS {
            for (_, h) in self.hot.drain() {
                h.invalid.store(true, Ordering::Release);
            }
        }
        let hot = Arc::new(HotVersion {
            meta,
            crcs,
            fresh_until_s,
            invalid: AtomicBool::new(false),
        });
        self.hot.insert(version, hot.clone());
        Some(hot)
    }

    /// `version` may no longer be served without the lock (see `HotVersion`).
    pub(super) fn invalidate_hot(&mut self, version: u64) {
        if let Some(h) = self.hot.remove(&version) {
            h.invalid.store(true, Ordering::Release);
        }
    }

    /// Hits served without the lock count for eviction now (S3-FIFO's frequency).
    pub fn touch(&mut self, versions: &[u64]) {
        if let Some(e) = self.evict.as_mut() {
            for v in versions {
                e.touch(v);
            }
        }
    }

    /// See `CacheFill::refetch`.
    pub fn refetch(&mut self, version: u64, block: u32, waiter: W) -> Outcome {
        let shard = waiter.shard().min(self.notices.len() - 1);
        let Some(meta) = self.index.meta(version) else {
            return Outcome::Busy;
        };
        if self.index.current_version(&meta.key) != Some(version)
            || u64::from(block) >= meta.blocks()
            || meta.key.len() < 2
        {
            return Outcome::Busy;
        }
        if self.index.block_crc(version, block).is_some() {
            return Outcome::Ready(version);
        }
        // The key is the origin's index (2 bytes) and the path under it (`EdgeCache::route`).
        let origin = usize::from(u16::from_be_bytes([meta.key[0], meta.key[1]]));
        let path = format!("/{}", String::from_utf8_lossy(&meta.key[2..]));
        let key = meta.key.clone();
        match self.blocks.want((version, block), Some(waiter)) {
            Ask::Fetch => {
                self.waits_started += 1;
                self.queue.push_front(Job {
                    key,
                    origin,
                    path,
                    version,
                    first: block,
                    last: block,
                    probe: false,
                    revalidate: false,
                    not_before_ms: 0,
                    committed: Vec::new(),
                    pinned: false,
                    shard,
                });
            }
            Ask::Wait => {
                self.waits_joined += 1;
                // A queued fetch of it goes first (one already running is on its way).
                let queued = self.queue.iter().position(|j| {
                    j.version == version && !j.probe && (j.first..=j.last).contains(&block)
                });
                if let Some(job) = queued.and_then(|i| self.queue.remove(i)) {
                    self.queue.push_front(job);
                }
            }
            Ask::PassThrough => return Outcome::Busy,
        }
        Outcome::Waiting
    }

    /// Where the committed bytes of `version` that start at byte `from`'s block end: the
    /// end of the last block of the run of present blocks from there (`from` itself when its
    /// block is missing).
    pub fn readable_end(&self, version: u64, from: u64) -> u64 {
        let (Some((blocks, block_bytes)), Some(size)) =
            (self.index.blocks_of(version), self.index.size_of(version))
        else {
            return from;
        };
        let b = u64::from(block_bytes);
        let mut block = from / b;
        while block < blocks && self.index.block_crc(version, block as u32).is_some() {
            block += 1;
        }
        (block * b).min(size).max(from)
    }

    /// `waiter` went away: it hears nothing more (the fetches go on for the cache).
    pub fn cancel(&mut self, waiter: &W) {
        for waiters in self.probes.values_mut() {
            waiters.retain(|w| w != waiter);
        }
        let waiter = Some(waiter.clone());
        for j in self.running.values().chain(self.queue.iter()) {
            for b in j.first..=j.last {
                self.blocks.cancel((j.version, b), &waiter);
            }
        }
    }

    /// Starts the queued fetches that may start now: each takes a slot from `take_slot`
    /// (None: no slot free; they wait) and a connection from its origin's pool.
    pub(super) fn pump<R: RingOps>(
        &mut self,
        shard: usize,
        filler: &mut Filler,
        ring: &mut R,
        take_slot: &mut dyn FnMut() -> Option<ArenaSlot>,
        freed: &mut Vec<ArenaSlot>,
        now_ms: u64,
    ) {
        let mut waiting = VecDeque::new();
        while let Some(job) = self.queue.pop_front() {
            // A paused origin's fetches wait; the other origins' go on.
            if job.shard != shard || self.due_ms(&job) > now_ms {
                waiting.push_back(job);
                continue;
            }
            // A fetch for a version the key no longer has (the origin replaced it meanwhile):
            // its bytes could join nothing.
            let current = self.index.current_version(&job.key);
            if !job.probe && current != Some(job.version) {
                self.give_up(&job, FetchError::VersionChanged);
                continue;
            }
            let file = match self.data_file(job.version) {
                Some(Ok(f)) => f,
                Some(Err(errno)) => {
                    self.give_up(&job, FetchError::Disk(errno));
                    continue;
                }
                None => {
                    // Being created on the I/O thread: its news wakes us.
                    waiting.push_back(job);
                    continue;
                }
            };
            let Some(slot) = take_slot() else {
                waiting.push_back(job);
                break;
            };
            let meta = self
                .index
                .current(&job.key)
                .filter(|m| m.version == job.version);
            let meta = meta.as_ref();
            let plan = Plan {
                first_block: job.first,
                last_block: job.last,
                block_bytes: meta.map_or(self.cfg.block_bytes, |m| m.block_bytes),
                size: meta.map(|m| m.size),
                etag: meta.map(|m| m.etag.clone()).filter(|e| !e.is_empty()),
                last_modified: meta
                    .map(|m| m.last_modified.clone())
                    .filter(|l| !l.is_empty()),
                revalidate: job.revalidate,
                slot_bytes: self.cfg.slot_bytes,
                align_bytes: self.cfg.align_bytes,
                sync_every_blocks: self.cfg.sync_every_blocks,
                storing: match self.cfg.origin_policies.get(job.origin) {
                    Some(p) if p.cache_policy == CachePolicy::Override => Storing::Override,
                    _ => Storing::Contract,
                },
                // A first fetch's reply the cache may not keep goes to the client that
                // started it (`on_head`).
                hand_over: job.probe,
            };
            let id = self.next_job;
            // A stored variant's blocks are asked for as the request that got it asked
            // (`Vary`): never with another client's fields, so its bytes are one variant's.
            let variant = meta
                .filter(|m| !m.selecting.is_empty())
                .map(|m| contract::variant_request_lines(&m.selecting));
            let begun = match &variant {
                Some(lines) => filler.begin_as(
                    ring,
                    id,
                    job.origin,
                    &job.path,
                    None,
                    lines,
                    plan,
                    slot,
                    Some(file),
                    now_ms,
                ),
                None => filler.begin(
                    ring,
                    id,
                    job.origin,
                    &job.path,
                    plan,
                    slot,
                    Some(file),
                    now_ms,
                ),
            };
            match begun {
                Ok(()) => {
                    self.next_job += 1;
                    let mut job = job;
                    if !job.probe {
                        self.pin(job.version);
                        job.pinned = true;
                    }
                    self.running.insert(id, job);
                }
                Err(Begin::Wait(slot)) => {
                    freed.push(slot);
                    waiting.push_back(job);
                    // This origin is at its bound; others may not be, but keep the order.
                    break;
                }
                Err(Begin::Refused(slot, why)) => {
                    freed.push(slot);
                    tracing::warn!(origin = job.origin, path = %job.path, %why, "origin fetch refused");
                    self.give_up(&job, FetchError::Connection(libc::EINVAL));
                }
            }
        }
        waiting.append(&mut self.queue);
        self.queue = waiting;
    }

    /// `version`'s data file, open for O_DIRECT writes: created on the I/O thread (None
    /// until it is; its news wakes the shards), or here inline. Err: the errno that refused it.
    pub(super) fn data_file(&mut self, version: u64) -> Option<Result<Arc<File>, i32>> {
        self.file_uses += 1;
        if let Some((f, used)) = self.files.get_mut(&version) {
            *used = self.file_uses;
            return Some(Ok(f.clone()));
        }
        if let Some(errno) = self.open_errors.remove(&version) {
            return Some(Err(errno));
        }
        if self.opening.insert(version) {
            self.outbox.opens.push(version);
            self.flush();
        }
        if let Some((f, _)) = self.files.get(&version) {
            return Some(Ok(f.clone()));
        }
        self.open_errors.remove(&version).map(Err)
    }

    /// Keeps `file` as `version`'s data file, closing the least recently used past
    /// `open_files` (a fetch under way holds its own handle: closing ours costs it nothing).
    pub(super) fn keep_file(&mut self, version: u64, file: Arc<File>) {
        if self.files.len() >= self.cfg.open_files.max(1) && !self.files.contains_key(&version) {
            let oldest = self
                .files
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(&v, _)| v);
            if let Some(v) = oldest {
                self.files.remove(&v);
            }
        }
        self.files.insert(version, (file, self.file_uses));
        debug_assert!(self.files.len() <= self.cfg.open_files.max(1));
    }

    /// A shard's fetch events. A committed block waits for its record to be durable
    /// (`Deferred`); a fetch's end waits behind whatever waits. The slots
    /// ended fetches give back go to the shard at once.
    pub(super) fn settle(
        &mut self,
        events: &mut Vec<FillEvent>,
        freed: &mut Vec<ArenaSlot>,
        now_ms: u64,
    ) {
        for e in events.drain(..) {
            match e {
                FillEvent::Committed { job, block, crc } => {
                    // A version the index does not hold (its head was refused) journals nothing.
                    let Some(version) = self.running.get(&job).map(|j| j.version) else {
                        continue;
                    };
                    if !self.index.contains(version) {
                        continue;
                    }
                    let seq = self.queue_record(Record::Block {
                        version,
                        block,
                        crc,
                    });
                    self.deferred.push_back(Deferred::Commit {
                        seq,
                        job,
                        version,
                        block,
                        crc,
                    });
                }
                FillEvent::Head { job, facts } => self.on_head(job, facts),
                FillEvent::Ended {
                    job,
                    error,
                    slot,
                    parked,
                } => {
                    freed.extend(slot);
                    if parked {
                        self.given_up(job);
                    }
                    if self.deferred.is_empty() {
                        self.on_ended(job, error, now_ms);
                    } else {
                        self.deferred
                            .push_back(Deferred::Ended { job, error, now_ms });
                    }
                }
                FillEvent::Released { job, slot } => {
                    freed.extend(slot);
                    self.released(job);
                }
                FillEvent::Piece { .. } => unreachable!("only pass-through fetches deliver"),
            }
        }
        self.flush();
    }

    /// A block's record is durable: it is visible now (index, the fetch's bookkeeping,
    /// waiters).
    pub(super) fn block_known(&mut self, job: u64, version: u64, block: u32, crc: u32) {
        if let Some(j) = self.running.get_mut(&job) {
            j.committed.push(block);
        }
        self.blocks_fetched += 1;
        self.index.apply(Record::Block {
            version,
            block,
            crc,
        });
        for waiter in self.blocks.arrived((version, block)).into_iter().flatten() {
            self.notify(Notice::Block {
                waiter,
                version,
                block,
            });
        }
        // The budget counts what is on disk: a range read of a huge object costs its blocks.
        if !self.pinned_until.is_empty() {
            self.release_expired_pins(unix_now_s());
        }
        let stored = self.index.stored_bytes(version);
        let mut evicted = Vec::new();
        if let Some(e) = self.evict.as_mut() {
            e.resize(&version, stored, &mut evicted);
        }
        self.drop_versions(&evicted, true);
    }

    pub(super) fn on_head(&mut self, id: u64, facts: HeadFacts) {
        if let Some(why) = facts.handed {
            return self.hand_over(id, facts, why);
        }
        let job = self.running.get_mut(&id).expect("a running job");
        if !job.probe {
            if job.revalidate {
                self.refreshed.insert(id, facts.fields);
            }
            return;
        }
        let origin = job.origin;
        let tags = self.tags_of(origin, &facts.fields);
        let job = &self.running[&id];
        let now_s = unix_now_s();
        let contract = Contract::of(&facts.fields, i64::try_from(now_s).unwrap_or(i64::MAX));
        let date = contract::parse_date(&facts.fields.date).unwrap_or(now_s as i64);
        let last_modified = facts
            .last_modified
            .as_deref()
            .and_then(contract::parse_date);
        let d = contract.directives;
        // Another status than the object's is kept by its own contract, whatever the policy.
        let object = matches!(facts.status, 200 | 206);
        let override_ttl_s = match self.cfg.origin_policies.get(job.origin) {
            Some(p) if object && p.cache_policy == CachePolicy::Override => {
                Some(p.ttl_s.unwrap_or(self.cfg.revalidate_s))
            }
            _ => None,
        };
        let meta = ObjectVersion {
            key: job.key.clone(),
            version: job.version,
            size: facts.size,
            block_bytes: self.cfg.block_bytes,
            fetched_unix_s: now_s,
            etag: facts.etag.unwrap_or_default(),
            last_modified: facts.last_modified.unwrap_or_default(),
            content_type: facts.content_type.unwrap_or_default(),
            freshness: match override_ttl_s {
                // The operator's word: its lifetime, no validation asked for.
                Some(ttl_s) => Freshness {
                    lifetime_s: Some(u32::try_from(ttl_s).unwrap_or(u32::MAX - 1)),
                    ..Freshness::default()
                },
                None => Freshness {
                    // The entry's default lifetime is an object's: another status without
                    // one of its own is stale at once.
                    lifetime_s: contract
                        .lifetime_s(last_modified, date, self.cfg.heuristic_max_s)
                        .or((!object).then_some(0))
                        .map(|s| u32::try_from(s).unwrap_or(u32::MAX - 1)),
                    initial_age_s: u32::try_from(contract.initial_age_s).unwrap_or(u32::MAX),
                    no_cache: d.no_cache,
                    must_revalidate: d.must_revalidate,
                    stale_while_revalidate_s: d
                        .stale_while_revalidate
                        .map(|s| u32::try_from(s).unwrap_or(u32::MAX - 1)),
                    stale_if_error_s: d
                        .stale_if_error
                        .map(|s| u32::try_from(s).unwrap_or(u32::MAX - 1)),
                },
            },
            headers: facts.fields.stored,
            // A 206 stands for the object; another status was kept by its contract.
            status: if facts.status == 206 {
                200
            } else {
                facts.status
            },
            selecting: facts.selecting,
            tags,
        };
        if let Err(why) = meta.validate() {
            // Replay would refuse its record: it is never journaled, and its waiters get a
            // 502 (the fetch's blocks are not journaled either: `settle` skips a version the
            // index does not hold).
            let job = job.clone();
            tracing::warn!(
                origin = self.origin_name(job.origin),
                path = %job.path,
                %why,
                "origin object not cacheable: refused"
            );
            return self.give_up(&job, FetchError::Unusable(Unusable::Uncacheable));
        }
        // Known at once: an object with no block on disk serves nothing from the disk, and a
        // block is visible only once its own record is durable (after this one). Its record
        // lost to a crash costs its blocks' records (replay skips them): a fetch again.
        self.queue_record(Record::Object(meta.clone()));
        self.head_known(id, meta, facts.whole);
    }

    /// A first fetch's reply may not be stored (`why`): the fetch goes on for the waiter
    /// that started it, on the fetch's shard (`Handover`), when its reply reaches the
    /// object's end (it then answers any request from its first byte on). Every other
    /// waiter makes its own fetch, or gets a 5xx as its status (an origin in trouble is not
    /// sent one fetch per client); the key's next requests pass (hit-for-pass) unless the
    /// origin failed.
    fn hand_over(&mut self, id: u64, facts: HeadFacts, why: contract::NotStored) {
        let job = self.running.remove(&id).expect("a running job");
        // Nothing of it was written, and nothing will be.
        self.queue_unlink(job.version);
        self.flush();
        let status = facts.status;
        let b = u64::from(self.cfg.block_bytes);
        let from = if facts.whole {
            0
        } else {
            u64::from(job.first) * b
        };
        let reaches_end = facts.whole || (u64::from(job.last) + 1) * b >= facts.size;
        let others = if status >= 500 {
            FetchError::Unusable(Unusable::Status(status))
        } else {
            FetchError::NotStored(why)
        };
        if status == 404 && Contract::storable_fields(&facts.fields).is_ok() {
            self.remember_not_found(&job.key, unix_now_s());
        } else if status < 500 {
            self.remember_pass(&job.key, why);
        }
        let mut waiter = None;
        for w in self.probes.remove(&job.key).unwrap_or_default() {
            if waiter.is_none() && reaches_end && w.shard() == job.shard {
                waiter = Some(w);
            } else {
                self.notify(Notice::Failed {
                    waiter: w,
                    error: others.clone(),
                });
            }
        }
        self.handovers.push(Handover {
            job: id,
            waiter,
            facts,
            why,
            from,
        });
    }

    /// A probe's head came: its version is known now (index, budget, the blocks its fetch
    /// brings, the wants that waited for it).
    pub(super) fn head_known(&mut self, id: u64, meta: ObjectVersion, whole: bool) {
        let (version, key) = (meta.version, meta.key.clone());
        let Some(job) = self.running.get_mut(&id) else {
            return;
        };
        if whole {
            job.first = 0;
        }
        // A key's older version (if any) is no longer what its hits serve.
        if let Some(old) = self.index.current_version(&meta.key) {
            self.invalidate_hot(old);
        }
        self.index.apply(Record::Object(meta));
        // The new version counts against the budget with what it stores, block by block as
        // they arrive (`block_known`), never with the size its origin claims; its fill pins it.
        let mut evicted = Vec::new();
        if let Some(e) = self.evict.as_mut() {
            // Pinned as it goes in: its own growth never evicts it (an object larger than the
            // whole budget stays while it fills and is read, past the budget until it goes).
            e.insert_pinned(version, 0, &mut evicted);
        }
        *self.pins.entry(version).or_default() += 1;
        if let Some(job) = self.running.get_mut(&id) {
            job.pinned = true;
        }
        self.drop_versions(&evicted, true);
        let Some(job) = self.running.get(&id) else {
            return;
        };
        // The probe's own blocks are being fetched: register them so wants coalesce on them.
        let (first, last) = (job.first, job.last);
        let blocks = self
            .index
            .current_version(&key)
            .and_then(|v| self.index.blocks_of(v))
            .map_or(0, |(blocks, _)| blocks);
        for b in first..=last {
            if u64::from(b) < blocks {
                let _ = self.blocks.want((version, b), None);
            }
        }
        for waiter in self.probes.remove(&key).unwrap_or_default() {
            self.notify(Notice::Known { waiter, version });
        }
    }

    pub(super) fn on_ended(&mut self, id: u64, error: Option<FetchError>, now_ms: u64) {
        let journal_full = self.journal_lost.remove(&id);
        let mut job = self.running.remove(&id).expect("a running job");
        if std::mem::take(&mut job.pinned) {
            self.unpin(job.version);
        }
        if job.revalidate {
            let fields = self.refreshed.remove(&id);
            return self.revalidated(job, error, fields);
        }
        let Some(error) = error else {
            // A 200 to a range can commit more than the run; blocks of the run not committed
            // (none, when the origin kept to the plan) fall through to the failure path below.
            if (job.first..=job.last)
                .all(|b| job.committed.contains(&b) || !self.block_in_object(job.version, b))
            {
                return;
            }
            return self.retry_or_fail(job, FetchError::ended_short(journal_full), now_ms);
        };
        if error == FetchError::Stale {
            // A kept-alive connection the origin had closed: again at once, not an attempt.
            let mut again = job;
            again.committed.clear();
            again.pinned = false;
            self.queue.push_front(again);
            return;
        }
        self.retry_or_fail(job, error, now_ms);
    }

    /// The versions a scrub pass walks (oldest first) and the blocks they hold now.
    pub fn scrub_pass(&self) -> (Vec<u64>, u64) {
        let mut versions: Vec<u64> = self.index.each_version_id().collect();
        versions.sort_unstable();
        (versions, self.index.blocks_held())
    }

    /// The scrub's next run of `version` from block `from` on: the first block on disk among
    /// at most `SCRUB_SCAN_BLOCKS` (a sparse version is walked over several calls), and the
    /// blocks on disk right after it, as many as fit in `max_bytes` (at least one, at most
    /// `SCRUB_RUN_BLOCKS_MAX`), in one hold of the lock.
    pub fn scrub_next(&self, version: u64, from: u32, max_bytes: usize) -> ScrubStep {
        let Some((blocks, block_bytes)) = self.index.blocks_of(version) else {
            return ScrubStep::Done;
        };
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
        let size = self.index.size_of(version).unwrap_or(0);
        let b = u64::from(block_bytes);
        let max_blocks = (max_bytes / block_bytes as usize).clamp(1, SCRUB_RUN_BLOCKS_MAX);
        let until = from.saturating_add(SCRUB_SCAN_BLOCKS).min(blocks);
        for block in from..until {
            let Some(crc) = self.index.block_crc(version, block) else {
                continue;
            };
            let mut run = ScrubBlock {
                block,
                count: 1,
                crcs: [0; SCRUB_RUN_BLOCKS_MAX],
                offset: u64::from(block) * b,
                block_bytes: block_bytes as usize,
                size,
            };
            run.crcs[0] = crc;
            while run.count < max_blocks {
                let next = block + run.count as u32;
                let Some(crc) = (next < blocks)
                    .then(|| self.index.block_crc(version, next))
                    .flatten()
                else {
                    break;
                };
                run.crcs[run.count] = crc;
                run.count += 1;
            }
            return ScrubStep::Block(run);
        }
        if until >= blocks {
            ScrubStep::Done
        } else {
            ScrubStep::Skip(until)
        }
    }

    /// The scrub read block `block` of `version` back and it failed its checksum: the block
    /// is forgotten (the next request fetches it again) and counted; its object's key, for
    /// the log line (None: already gone).
    pub fn scrub_found_bad(&mut self, version: u64, block: u32) -> Option<Vec<u8>> {
        self.index.block_crc(version, block)?;
        self.blocks_corrupt += 1;
        self.index.forget_block(version, block);
        self.invalidate_hot(version);
        self.index.key_of(version).map(<[u8]>::to_vec)
    }

    /// When `job` may start: its own retry time, or its origin's pause if later.
    pub(super) fn due_ms(&self, job: &Job) -> u64 {
        job.not_before_ms.max(self.paused_until(job.origin))
    }

    /// The end of `origin`'s pause (0: none).
    pub(super) fn paused_until(&self, origin: usize) -> u64 {
        self.paused_until_ms.get(origin).copied().unwrap_or(0)
    }

    /// Seconds left of `origin`'s pause at `now_ms`, rounded up (None: not paused): what a
    /// client that waited in vain is told to wait (`Retry-After`).
    pub fn origin_paused_s(&self, origin: usize, now_ms: u64) -> Option<u64> {
        let until = self.paused_until(origin);
        (until > now_ms).then(|| (until - now_ms).div_ceil(1000))
    }

    /// `origin` answered `status` with a `Retry-After` of `pause_s`: no new fetch to it
    /// before then (fetches already running go on).
    pub(super) fn pause_origin(&mut self, origin: usize, status: u16, pause_s: u64, now_ms: u64) {
        if self.paused_until_ms.len() <= origin {
            self.paused_until_ms.resize(origin + 1, 0);
        }
        let until = now_ms + pause_s * 1000;
        if until <= self.paused_until_ms[origin] {
            return;
        }
        self.paused_until_ms[origin] = until;
        self.origin_pauses += 1;
        if self.pauses_by_origin.len() <= origin {
            self.pauses_by_origin.resize(origin + 1, 0);
        }
        self.pauses_by_origin[origin] += 1;
        if let Some(n) = self.signals.origin_pauses.get(origin) {
            n.store(self.pauses_by_origin[origin], Ordering::Relaxed);
        }
        let name = self
            .cfg
            .origin_names
            .get(origin)
            .map_or("?", String::as_str);
        tracing::warn!(
            origin = name,
            status,
            pause_s,
            "origin asked the edge to wait (Retry-After): no new fetch to it until then"
        );
    }

    pub(super) fn block_in_object(&self, version: u64, block: u32) -> bool {
        self.index
            .blocks_of(version)
            .is_some_and(|(blocks, _)| u64::from(block) < blocks)
    }

    pub(super) fn retry_or_fail(&mut self, job: Job, error: FetchError, now_ms: u64) {
        if let FetchError::Unusable(Unusable::Throttled {
            status,
            retry_after,
        }) = error
        {
            // The origin asked to wait: no fetch to it starts before then, this one included
            // (not an attempt: its waiters wait on, within their own timeout).
            let pause_s = retry_after
                .seconds_from(i64::try_from(unix_now_s()).unwrap_or(i64::MAX))
                .max(MIN_ORIGIN_PAUSE_S);
            self.pause_origin(job.origin, status, pause_s, now_ms);
            let mut again = job;
            again.committed.clear();
            again.pinned = false;
            self.queue.push_front(again);
            return;
        }
        if let FetchError::NotStored(why) = error {
            // Not for a shared cache: every waiter makes its own fetch, and so does every
            // request for the key for a while (hit-for-pass); a version it had is retired.
            self.give_up(&job, error);
            return self.remember_pass(&job.key, why);
        }
        if job.probe && !self.index.contains(job.version) {
            // The head never came: the probe's waiters get the error (retried like a block).
            return self.give_up(&job, error);
        }
        if let FetchError::Disk(errno) = error {
            let slot = crate::cache::version_id::slot_of(job.version);
            self.store.health().note(slot, errno, unix_now_s());
        }
        if error.passes_through() {
            // Trying again cannot help until space is freed (or on a disk that failed): the
            // waiters hear at once, and are passed through.
            if error.is_disk_full() {
                self.disk_full += 1;
            }
            return self.give_up(&job, error);
        }
        if matches!(error, FetchError::VersionChanged) {
            // The key's next want learns the new version; no byte of it joins this one.
            self.give_up(&job, error);
            return self.retire(job.version);
        }
        let missing: Vec<u32> = (job.first..=job.last)
            .filter(|b| !job.committed.contains(b) && self.block_in_object(job.version, *b))
            .collect();
        let mut retry = Vec::new();
        let mut logged = false;
        for b in missing {
            match self.blocks.failed((job.version, b)) {
                Failed::Retry { attempt } => retry.push((b, attempt)),
                Failed::GiveUp(waiters) => {
                    if !logged && waiters.iter().any(Option::is_some) {
                        self.log_failure(&job, &error);
                        logged = true;
                    }
                    for waiter in waiters.into_iter().flatten() {
                        self.notify(Notice::Failed {
                            waiter,
                            error: error.clone(),
                        });
                    }
                }
            }
        }
        let present = |b: u64| !retry.iter().any(|&(r, _)| u64::from(r) == b);
        let Some(&(_, attempt)) = retry.first() else {
            return;
        };
        let wait = retry_after_ms(attempt, job.version ^ u64::from(job.first)).unwrap_or(0);
        for run in missing_runs(
            u64::from(job.first)..u64::from(job.last) + 1,
            present,
            self.cfg.max_run_blocks,
        ) {
            self.queue.push_back(Job {
                first: run.start as u32,
                last: (run.end - 1) as u32,
                probe: false,
                revalidate: false,
                not_before_ms: now_ms + wait,
                committed: Vec::new(),
                pinned: false,
                ..job.clone()
            });
        }
    }

    pub(super) fn give_up(&mut self, job: &Job, error: FetchError) {
        self.log_failure(job, &error);
        if job.probe && error == FetchError::Unusable(Unusable::Status(404)) {
            self.remember_not_found(&job.key, unix_now_s());
        }
        if job.probe && !self.index.contains(job.version) {
            // The head never came: the data file the fetch was given holds nothing.
            self.queue_unlink(job.version);
            self.flush();
        }
        if job.probe {
            for waiter in self.probes.remove(&job.key).unwrap_or_default() {
                self.notify(Notice::Failed {
                    waiter,
                    error: error.clone(),
                });
            }
        }
        for b in job.first..=job.last {
            if let Failed::GiveUp(waiters) = self.give_up_block(job.version, b) {
                for waiter in waiters.into_iter().flatten() {
                    self.notify(Notice::Failed {
                        waiter,
                        error: error.clone(),
                    });
                }
            }
        }
    }

    /// A revalidation ended: the version is confirmed (a 304, or a 206 with the same
    /// validators: it is fresh again), replaced (another version at the origin: retired, and
    /// the waiters' next want learns the new one), gone (a 404: retired and remembered), or
    /// the origin could not say (the cached version is served on, and asked about again after
    /// `REVALIDATE_RETRY_S`). The waiters then want again.
    pub(super) fn revalidated(
        &mut self,
        job: Job,
        error: Option<FetchError>,
        fields: Option<Box<contract::HeadFields>>,
    ) {
        let (v, now_s) = (job.version, unix_now_s());
        match error {
            Some(FetchError::Stale) => {
                // A kept-alive connection the origin had closed: again at once.
                self.queue.push_front(Job {
                    committed: Vec::new(),
                    pinned: false,
                    ..job
                });
                return;
            }
            None | Some(FetchError::NotModified) => {
                let refresh = fields.and_then(|f| self.renewed_contract(v, job.origin, &f, now_s));
                let record = Record::Fresh {
                    version: v,
                    fetched_unix_s: now_s,
                    refresh,
                };
                // Visible now: a confirmation lost to a crash costs one early revalidation.
                self.index.apply(record.clone());
                // Fresh for longer: published again on its next hit.
                self.invalidate_hot(v);
                self.revalidate_after.remove(&v);
                self.queue_record(record);
                self.flush();
            }
            Some(FetchError::VersionChanged) => self.retire(v),
            // The origin no longer lets it be shared: retired, and its requests pass.
            Some(FetchError::NotStored(why)) => self.remember_pass(&job.key, why),
            Some(FetchError::Unusable(Unusable::Status(404))) => {
                self.retire(v);
                self.remember_not_found(&job.key, now_s);
            }
            Some(error) if !self.may_serve_stale(v, job.origin, now_s) => {
                // `no-cache` and `must-revalidate` are never served unvalidated (RFC 9111
                // §4.2.4, §5.2.2.2), nor any copy past its `stale-if-error` window (RFC
                // 5861; the origin entry's `stale_if_error_s` where it gave none): the
                // waiters get the error; the next request asks again.
                tracing::warn!(
                    origin = self.origin_name(job.origin),
                    path = %job.path,
                    ?error,
                    "revalidation failed; the cached version must not be served stale"
                );
                for waiter in self.probes.remove(&job.key).unwrap_or_default() {
                    self.notify(Notice::Failed {
                        waiter,
                        error: error.clone(),
                    });
                }
                return;
            }
            Some(error) => {
                tracing::warn!(
                    origin = self.origin_name(job.origin),
                    path = %job.path,
                    ?error,
                    "revalidation failed; the cached version is served meanwhile"
                );
                self.revalidate_after.insert(v, now_s + REVALIDATE_RETRY_S);
            }
        }
        for waiter in self.probes.remove(&job.key).unwrap_or_default() {
            self.notify(Notice::Known { waiter, version: v });
        }
    }

    pub(super) fn give_up_block(&mut self, version: u64, block: u32) -> Failed<Option<W>> {
        loop {
            match self.blocks.failed((version, block)) {
                Failed::Retry { .. } => continue,
                g => return g,
            }
        }
    }

    /// Reads block `block` of `version` back and checks it; a block that fails its checksum
    /// is forgotten (the next want fetches it again, alone) and counted.
    pub fn verify_block(&mut self, version: u64, block: u32, buf: &mut Vec<u8>) -> bool {
        let Some(meta) = self.index.meta(version) else {
            return false;
        };
        let Some(crc) = self.index.block_crc(version, block) else {
            return false;
        };
        match self.store.read_block(&meta, block, crc, buf) {
            Ok(()) => true,
            Err(ReadError::Corrupt) => {
                self.blocks_corrupt += 1;
                self.index.forget_block(version, block);
                self.invalidate_hot(version);
                false
            }
            Err(_) => false,
        }
    }
}
