//! The shard's side of a pass-through (`fill::relay`): a pulled request whose fill found no
//! room on the cache's disk gets the origin's bytes streamed to it, unstored. Its response
//! is planned like a cached one (the version's size and validators are known from the
//! fill's probe), its body's reads (`Action::Read`) are answered from one origin fetch run
//! without a data file, and every piece that fetch receives is copied into the connection's
//! chunk, then let go. Hits, and the other requests, never wait for it.

use super::cache_glue::Bypass;
use super::slots::{ArenaSlot, ConnSlot};
use super::{RingOps, Shard, ShardMetrics};
use crate::cache::index::ObjectVersion;
use crate::fill::cache_fill::Handover;
use crate::fill::cache_fill::PassThrough;
use crate::fill::edge::Waiter;
use crate::fill::relay::{Relay, Step, MAX_PASS_THROUGHS_PER_SHARD};
use crate::fill::FillEvent;
use crate::http::plan::{self, FileRead};
use crate::http::request::{Method, Request};

/// Why a pass-through could not start (`start_relay_of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotStarted {
    /// No arena slot, or the origin runs its `max_fetches`: room comes back as fetches end.
    Busy,
    /// No cache, or the request could not be made.
    Refused,
}

impl<R: RingOps> Shard<R> {
    /// Answers `req` with its own fetch from origin `origin` (`path` there), nothing of it
    /// stored or shared (its key's replies may not be stored, or it carries Authorization):
    /// the request waits for the reply's head (as for a fill, within
    /// `cache_wait_timeout_ms`), is then answered from it (`respond_bypassed`), and its body
    /// is the fetch's pieces. It asks for the request's single range (from its first byte),
    /// else the whole object. While the shard runs `MAX_PASS_THROUGHS_PER_SHARD` already, it
    /// waits for one to end (within `cache_wait_timeout_ms`); 503 when no fetch can start.
    pub(super) fn respond_bypass(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        origin: usize,
        path: &str,
        detail: &'static str,
    ) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        // Several ranges would need the origin's bytes out of order: the whole object, sent
        // whole (`respond_bypassed`).
        let several = req.range.is_some_and(|r| r.contains(&b','));
        let whole = req.if_range.is_some() || several;
        let from = if whole {
            0
        } else {
            crate::fill::edge::EdgeCache::first_byte(req.range).unwrap_or(0)
        };
        let end = crate::fill::edge::EdgeCache::last_byte(req.range)
            .filter(|_| !whole)
            .map_or(u64::MAX, |last| last.saturating_add(1));
        let authorization = req.authorization.and_then(|a| std::str::from_utf8(a).ok());
        // Its own fetch: the client's fields, its Cookie too.
        let mut forward = String::new();
        crate::origin::request::forwardable(req.fields, true, &mut forward);
        if self.cache.pulls.relays.len() >= MAX_PASS_THROUGHS_PER_SHARD {
            // The shard runs as many as it may: this one waits for one to end.
            return self.wait_for_relay(c, detail);
        }
        let client = (authorization, forward.as_str());
        let mut started = self.start_relay_of(c, origin, path, None, client, (from, end), 1);
        if started == Err(NotStarted::Busy) {
            // Marked before a second try: a fetch that ends on any shard after that try
            // failed wakes this shard's waiters (`run_fill`).
            if let Some(edge) = self.cache.edge.as_ref() {
                edge.fill.wait_for_budget();
            }
            started = self.start_relay_of(c, origin, path, None, client, (from, end), 1);
        }
        if started == Err(NotStarted::Busy) {
            // The origin is at its fetch bound (or no slot is free): it waits for room.
            return self.wait_for_relay(c, detail);
        }
        if started.is_err() {
            ShardMetrics::add(&self.metrics.cache_error, 1);
            return self.respond_status(c, 503, keep_alive, head_only);
        }
        self.note_bypass(c, detail);
        self.park_for_fill(c);
    }

    /// Request `c` is answered by an origin reply of its own, unstored (`detail`: why): its
    /// label, its counters, and its `Pulls::bypasses` entry, waiting for the reply's head.
    fn note_bypass(&mut self, c: ConnSlot, detail: &'static str) {
        self.conns[c.index()].set_cache_label(Some("PASS"));
        ShardMetrics::add(&self.metrics.cache_pass, 1);
        let m = &self.metrics;
        let reason = match detail {
            "private" => &m.not_stored_private,
            "no-store" => &m.not_stored_no_store,
            "vary" => &m.not_stored_vary,
            "authorization" => &m.not_stored_authorization,
            "status" => &m.not_stored_status,
            "never-cache" => &m.not_stored_never_cache,
            "loading" => &m.not_stored_loading,
            // A hit whose data file the disk would not open (`read_failover`).
            "disk" => &m.cache_disk_failovers,
            _ => &m.not_stored_lately,
        };
        ShardMetrics::add(reason, 1);
        self.cache.pulls.bypasses.insert(
            self.conn_ref(c),
            Bypass {
                detail,
                head: None,
                status: 0,
            },
        );
    }

    /// A fill's reply was handed over (`Handover`): to its waiter, answered from it
    /// (`respond_handed`), when that request still waits; else the fetch ends, and a waiter
    /// that cannot take it makes its own.
    pub(super) fn handover_arrived(&mut self, h: Handover<Waiter>) {
        let waiting = h.waiter.filter(|w| {
            let conn = &self.conns[w.conn.index()];
            conn.generation() == w.generation && conn.is_open() && conn.awaiting_fill()
        });
        let Some(waiter) = waiting else {
            return self.drop_handed(h.job);
        };
        self.cache
            .pulls
            .handed
            .insert(self.conn_ref(waiter.conn), h);
        self.resume_fill(waiter, Some(super::cache_glue::FillAnswer::Handed));
    }

    /// Ends handed-over fetch `job`, which nobody takes.
    pub(super) fn drop_handed(&mut self, job: u64) {
        let now_ms = self.clock.now_ms;
        if let Some(edge) = self.cache.edge.as_mut() {
            edge.fill.drop_handed(&mut self.ring, job, now_ms);
        }
    }

    /// Answers `req` from the reply its fill got and may not store (`Pulls::handed`): the
    /// fill's fetch goes on as this request's pass-through. A request that carries a Cookie
    /// (the fill asked without it: its reply was to be shared), or other client fields than
    /// the fill's request carried, or wants bytes before the reply's first, makes its own
    /// fetch instead.
    pub(super) fn respond_handed(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        origin: usize,
        path: &str,
        rate: crate::limits::RateSpec,
    ) {
        let Some(h) = self.cache.pulls.handed.remove(self.conn_ref(c)) else {
            return self.respond_status(c, 502, req.keep_alive && !self.leaving(), false);
        };
        let detail = h.why.label();
        let wants_from = if req.if_range.is_some() {
            0
        } else {
            crate::fill::edge::EdgeCache::first_byte(req.range).unwrap_or(0)
        };
        // The reply answers the lines the fill's request carried: this request's own (the
        // last client to join may have noted others), and no Cookie (the fill sent none).
        let mut mine = String::new();
        crate::origin::request::forwardable(req.fields, false, &mut mine);
        if crate::origin::request::carries_cookie(req.fields)
            || mine != h.facts.request_lines
            || wants_from < h.from
            || self.cache.pulls.relays.len() >= MAX_PASS_THROUGHS_PER_SHARD
        {
            self.drop_handed(h.job);
            return self.respond_bypass(c, req, origin, path, detail);
        }
        let generation = self.conns[c.index()].generation();
        self.cache.pulls.relay_jobs.insert(h.job, (c, generation));
        self.cache
            .pulls
            .relays
            .insert(self.conn_ref(c), Relay::new(h.job, h.facts.size, h.from));
        self.note_bypass(c, detail);
        let now_s = u64::try_from(self.clock.date.secs()).unwrap_or(0);
        let status = h.facts.status;
        let meta = self.unstored_version(h.facts, now_s);
        if let Some(b) = self.cache.pulls.bypasses.get_mut(self.conn_ref(c)) {
            b.head = Some(meta);
            b.status = status;
        }
        if let Some(edge) = self.cache.edge.as_mut() {
            edge.fill.claim_handed(h.job);
        }
        self.respond_bypassed(c, req, rate);
    }

    /// A bypass's head came (`Pulls::bypasses`): the response is planned from it, and its
    /// body read from the fetch already running. A response that reads nothing (a HEAD, a
    /// 304, a 416) ends the fetch.
    pub(super) fn respond_bypassed(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        rate: crate::limits::RateSpec,
    ) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let Some(Bypass {
            detail,
            head: Some(meta),
            status,
        }) = self.cache.pulls.bypasses.remove(self.conn_ref(c))
        else {
            return self.respond_status(c, 502, keep_alive, head_only);
        };
        // Another status than 200/206 is passed on whole, whatever range or condition the
        // request named.
        let passed = !matches!(status, 200 | 206);
        let whole = super::cache_glue::whole_request(req);
        let req = if passed { &whole } else { req };
        let default_lifetime_s = self
            .cache
            .edge
            .as_ref()
            .map_or(0, |e| e.fill.default_lifetime_s());
        let mut extra = std::mem::take(&mut self.cache.pulls.head_extra);
        super::cache_glue::cached_head_lines(
            &mut extra,
            &meta,
            super::cache_glue::Served::Passed(detail),
            u64::try_from(self.clock.date.secs()).unwrap_or(0),
            default_lifetime_s,
        );
        let etag = format!("\"p-{:x}\"", meta.size);
        let fetched = crate::http::date::format_http_date(meta.fetched_unix_s as i64);
        let facts = super::cache_glue::pulled_facts(
            &meta,
            etag.as_bytes(),
            (&fetched, meta.fetched_unix_s as i64),
            FileRead::Direct { align: 1 },
            &extra,
        );
        let limits = self.plan_limits(c);
        let mut ctx =
            super::respond::plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        if let Some(date) = super::cache_glue::stored_date(&meta) {
            ctx.date = date.as_bytes();
        }
        let mut plan = plan::plan_response(req, &facts, &limits, &ctx);
        if passed {
            plan.pass_status(status);
        }
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let mut started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        if started.reads_file && started.single_file_range().is_none() {
            // Several ranges: the fetch asked for the whole object, which goes out whole.
            started.give_back(&mut self.pools.body_pool);
            let whole = Request {
                range: None,
                ..*req
            };
            let limits = self.plan_limits(c);
            plan = plan::plan_response(&whole, &facts, &limits, &ctx);
            if passed {
                plan.pass_status(status);
            }
            let bufs = self.pools.body_pool.pop().unwrap_or_default();
            started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        }
        started.inline_head = false;
        self.cache.pulls.head_extra = extra;
        let from = self
            .cache
            .pulls
            .relays
            .get(self.conn_ref(c))
            .map(|r| r.from);
        let reads_from = started.single_file_range().map(|(f, _)| f);
        if !started.reads_file || from.is_none() {
            // Nothing to read: the fetch is not needed.
            self.relay_end(c);
            return self.install(c, started, None, rate);
        }
        if reads_from.is_none() || reads_from < from {
            // Several ranges, or bytes before what the fetch asked for: it cannot answer.
            started.give_back(&mut self.pools.body_pool);
            self.relay_end(c);
            ShardMetrics::add(&self.metrics.cache_error, 1);
            return self.respond_status(c, 502, keep_alive, head_only);
        }
        self.install(c, started, None, rate);
        self.conns[c.index()].set_relay();
        self.relay_reaches_end_of_disk(c);
    }

    /// Answers `req` (under origin `origin`, cache key `key`, origin path `path`) with a
    /// pass-through: its own fetch when the version is unknown (its disk failed), 503 when
    /// the shard runs `MAX_PASS_THROUGHS_PER_SHARD` already or no fetch can start now.
    pub(super) fn respond_pass_through(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        origin: usize,
        key: &[u8],
        path: &str,
        rate: crate::limits::RateSpec,
    ) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let meta = self
            .cache
            .edge
            .as_mut()
            .map(|e| e.fill.try_index().map(|index| index.current(key)));
        let meta = match meta {
            Some(Some(meta)) => meta,
            // The fill's lock was held: asked again at the next tick.
            Some(None) => {
                return self.ask_again_later(c, super::cache_glue::FillAnswer::PassThrough);
            }
            None => None,
        };
        if meta
            .as_ref()
            .is_some_and(|m| !crate::origin::contract::selects(&m.selecting, req.fields))
        {
            // A variant stored for other values of the fields its Vary names: not this
            // request's (RFC 9111 §4.1), which makes its own fetch.
            return self.respond_bypass(c, req, origin, path, "vary");
        }
        if meta.is_none() {
            // The version left the index before this request got here: its disk failed or
            // stalled, and took its objects out. The request makes its own fetch (a 503
            // here cut a cold download whose disk froze, under load).
            return self.respond_bypass(c, req, origin, path, "disk");
        }
        let Some(meta) =
            meta.filter(|_| self.cache.pulls.relays.len() < MAX_PASS_THROUGHS_PER_SHARD)
        else {
            ShardMetrics::add(&self.metrics.cache_error, 1);
            return self.respond_status(c, 503, keep_alive, head_only);
        };
        // The origin's validators, as a cached copy would have; made up only where it gave
        // none (there is no data file): a Last-Modified of when it was fetched, an ETag of
        // the size.
        let etag = format!("\"p-{:x}\"", meta.size);
        let fetched = crate::http::date::format_http_date(meta.fetched_unix_s as i64);
        let mut extra = std::mem::take(&mut self.cache.pulls.head_extra);
        let default_lifetime_s = self
            .cache
            .edge
            .as_ref()
            .map_or(0, |e| e.fill.default_lifetime_s());
        super::cache_glue::cached_head_lines(
            &mut extra,
            &meta,
            super::cache_glue::Served::Passed("disk-full"),
            u64::try_from(self.clock.date.secs()).unwrap_or(0),
            default_lifetime_s,
        );
        let facts = super::cache_glue::pulled_facts(
            &meta,
            etag.as_bytes(),
            (&fetched, meta.fetched_unix_s as i64),
            FileRead::Direct { align: 1 },
            &extra,
        );
        let limits = self.plan_limits(c);
        let mut ctx =
            super::respond::plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        if let Some(date) = super::cache_glue::stored_date(&meta) {
            ctx.date = date.as_bytes();
        }
        let mut plan = plan::plan_response(req, &facts, &limits, &ctx);
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let mut started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        if started.reads_file && started.single_file_range().is_none() {
            // Several ranges would need the origin's bytes out of order: the whole object.
            started.give_back(&mut self.pools.body_pool);
            let whole = Request {
                range: None,
                ..*req
            };
            let limits = self.plan_limits(c);
            plan = plan::plan_response(&whole, &facts, &limits, &ctx);
            let bufs = self.pools.body_pool.pop().unwrap_or_default();
            started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        }
        started.inline_head = false;
        self.cache.pulls.head_extra = extra;
        self.conns[c.index()].set_cache_label(Some("PASS"));
        ShardMetrics::add(&self.metrics.cache_pass, 1);
        let Some((from, end)) = started.single_file_range().filter(|_| started.reads_file) else {
            // A HEAD, a 304, a 416: no bytes to fetch.
            return self.install(c, started, None, rate);
        };
        let refuse = |shard: &mut Self, started: super::respond::Started| {
            started.give_back(&mut shard.pools.body_pool);
            shard.conns[c.index()].set_cache_label(None);
            ShardMetrics::add(&shard.metrics.cache_error, 1);
            shard.respond_status(c, 503, keep_alive, head_only);
        };
        if !self.start_relay(c, origin, path, &meta, (from, end), 1) {
            return refuse(self, started);
        }
        tracing::info!(
            shard = self.index,
            path,
            size = meta.size,
            "cache disk full, failed or stalled: passing the object through from its origin, unstored"
        );
        self.install(c, started, None, rate);
        self.conns[c.index()].set_relay();
    }

    /// A response streaming from the cache whose fill found no room on the disk: the rest of
    /// it, from the end of what is on disk, is passed through from the origin. False when it
    /// cannot be (the caller cuts it, as before).
    pub(super) fn stream_to_pass_through(&mut self, c: ConnSlot) -> bool {
        if self.cache.pulls.relays.len() >= MAX_PASS_THROUGHS_PER_SHARD {
            return false;
        }
        let key = self.conn_ref(c);
        let (Some(stream), Some(read)) = (
            self.cache.pulls.streams.get(key).map(|(s, _)| s),
            self.cache.pulls.reads.get(key),
        ) else {
            return false;
        };
        let meta = read.meta().clone();
        let conn = &self.conns[c.index()];
        let Some(from) = conn.readable_end() else {
            return false;
        };
        let end = stream.last.map_or(meta.size, |l| l + 1);
        if from >= end {
            return false;
        }
        let (origin, path) = (stream.origin, stream.path.clone());
        if !self.start_relay(c, origin, &path, &meta, (from, end), 1) {
            return false;
        }
        tracing::info!(
            shard = self.index,
            path,
            from,
            "cache disk full, failed or stalled: passing the rest of a streaming response through, unstored"
        );
        // Off the fill's waiter lists: its bytes past `from` come from the pass-through now.
        self.cache.pulls.streams.remove(self.conn_ref(c));
        let waiter = crate::fill::edge::Waiter {
            shard: self.index as u16,
            conn: c,
            generation: self.conns[c.index()].generation(),
        };
        if let Some(edge) = self.cache.edge.as_mut() {
            edge.fill.cancel(&waiter);
        }
        ShardMetrics::add(&self.metrics.cache_pass, 1);
        self.conns[c.index()].set_relay();
        if self.conns[c.index()].next_file_offset() == Some(from) {
            // Everything before `from` is planned (read from disk): read on from the relay.
            self.relay_reaches_end_of_disk(c);
        }
        true
    }

    /// Starts connection `c`'s pass-through of `meta`'s bytes `from..end` from origin
    /// `origin` (`path` there): a slot for its fetch, the fetch, and the relay that answers
    /// `c`'s reads from it. `client_owed` is 1 when `c` has yet to take the chunk it reads
    /// into (0: it holds it). False when no slot or origin connection is free now.
    pub(super) fn start_relay(
        &mut self,
        c: ConnSlot,
        origin: usize,
        path: &str,
        meta: &ObjectVersion,
        range: (u64, u64),
        client_owed: usize,
    ) -> bool {
        // A stored variant's bytes are asked for as its own request asked (`Vary`).
        let lines = crate::origin::contract::variant_request_lines(&meta.selecting);
        self.start_relay_of(
            c,
            origin,
            path,
            Some(meta),
            (None, &lines),
            range,
            client_owed,
        )
        .is_ok()
    }

    /// `start_relay` of `meta`'s version, or (None) of whatever the origin answers: its
    /// size comes with its head. `client` is the client's Authorization and field lines,
    /// forwarded.
    #[allow(clippy::too_many_arguments)]
    fn start_relay_of(
        &mut self,
        c: ConnSlot,
        origin: usize,
        path: &str,
        meta: Option<&ObjectVersion>,
        client: (Option<&str>, &str),
        (from, end): (u64, u64),
        client_owed: usize,
    ) -> Result<(), NotStarted> {
        let (authorization, forward) = client;
        let Some(block_bytes) = self.cache.edge.as_ref().map(|e| e.fill.block_bytes()) else {
            return Err(NotStarted::Refused);
        };
        // This one's client and every running pass-through's may each still want a chunk.
        let chunks_owed = self.cache.pulls.relays.len() + client_owed;
        let Some(slot) = self.arena.take_leaving(chunks_owed) else {
            return Err(NotStarted::Busy);
        };
        let pass = PassThrough {
            origin,
            path,
            block_bytes: meta.map_or(block_bytes, |m| m.block_bytes),
            size: meta.map(|m| m.size),
            etag: meta.map_or("", |m| &m.etag),
            last_modified: meta.map_or("", |m| &m.last_modified),
            authorization,
            forward,
            from,
            end,
        };
        let now_ms = self.clock.now_ms;
        let Some(edge) = self.cache.edge.as_mut() else {
            self.hand_slot_over(slot);
            return Err(NotStarted::Refused);
        };
        match edge
            .fill
            .begin_pass_through(&mut self.ring, &pass, slot, now_ms)
        {
            Ok(job) => {
                let generation = self.conns[c.index()].generation();
                self.cache.pulls.relay_jobs.insert(job, (c, generation));
                self.cache.pulls.relays.insert(
                    self.conn_ref(c),
                    Relay::new(job, meta.map_or(u64::MAX, |m| m.size), from),
                );
                Ok(())
            }
            Err((slot, busy)) => {
                self.hand_slot_over(slot);
                Err(if busy {
                    NotStarted::Busy
                } else {
                    NotStarted::Refused
                })
            }
        }
    }

    /// Requests waiting for a pass-through of their own (`Pulls::relay_waits`) go now: the
    /// first `count` still waiting (one that left or timed out has no answer left). One that
    /// still finds no room waits again, at the back.
    pub(super) fn wake_relay_waiters(&mut self, mut count: usize) {
        while count > 0 {
            let Some(w) = self.cache.pulls.relay_waits.pop_front() else {
                return;
            };
            let conn = &self.conns[w.conn.index()];
            if conn.generation() == w.generation
                && conn.awaiting_fill()
                && self.cache.pulls.answers.contains(self.conn_ref(w.conn))
            {
                self.cache.pulls.relay_ready_waits.push(w);
                count -= 1;
            }
        }
    }

    /// Request `c` waits for a pass-through of its own (`detail`: why it has one): until one
    /// of the shard's ends, a fetch frees room at the origin or a slot comes back
    /// (`wake_relay_waiters`), within
    /// its wait (`cache_wait_timeout_ms`, then 503: it never reached the origin).
    fn wait_for_relay(&mut self, c: ConnSlot, detail: &'static str) {
        self.park_for_fill(c);
        let waiter = self.waiter(c);
        self.cache.pulls.answers.insert(
            self.conn_ref(c),
            super::cache_glue::FillAnswer::Bypass(detail),
        );
        self.cache.pulls.relay_waits.push_back(waiter);
        ShardMetrics::add(&self.metrics.cache_pass_waits, 1);
    }

    /// A pass-through response's pipeline reached the end of what is on disk (it stops there
    /// so that no read straddles it): its reads from here on come from the relay.
    pub(super) fn relay_reaches_end_of_disk(&mut self, c: ConnSlot) {
        if self.conns[c.index()].set_readable_end(u64::MAX) {
            self.ready.push_bulk(c);
        }
    }

    /// Each tick (from `run_fill`): the pass-through fetches' events, the reads they answer,
    /// and the pass-throughs whose connection is closing.
    pub(super) fn run_relays(&mut self) {
        let mut events = Vec::new();
        let mut steps = Vec::new();
        loop {
            let now_ms = self.clock.now_ms;
            if let Some(edge) = self.cache.edge.as_mut() {
                edge.fill.take_pass_through_events(&mut events);
            }
            let mut cancels = std::mem::take(&mut self.cache.pulls.relay_cancels);
            for c in cancels.drain(..) {
                if let Some(relay) = self.cache.pulls.relays.get_mut(self.conn_ref(c)) {
                    let slot = relay.take_read();
                    let job = relay.job;
                    if relay.ended.is_none() {
                        if let Some(edge) = self.cache.edge.as_mut() {
                            edge.fill.abort_pass_through(&mut self.ring, job, now_ms);
                        }
                    }
                    if let Some(slot) = slot {
                        self.complete_relay_read(c, slot, -libc::ECANCELED);
                    }
                }
            }
            // Cancels that came while these were done wait for the next turn.
            cancels.append(&mut self.cache.pulls.relay_cancels);
            self.cache.pulls.relay_cancels = cancels;
            let mut ready = std::mem::take(&mut self.cache.pulls.relay_ready);
            if events.is_empty() && ready.is_empty() {
                self.cache.pulls.relay_ready = ready;
                return;
            }
            for e in events.drain(..) {
                if let FillEvent::Head { job, facts } = e {
                    self.bypass_head(job, facts);
                    continue;
                }
                let (job, piece, ended) = match e {
                    FillEvent::Piece {
                        job,
                        slot,
                        file_offset,
                        len,
                    } => (job, Some((slot, file_offset, len)), None),
                    FillEvent::Ended {
                        job, error, slot, ..
                    } => {
                        // A pass-through writes no file, so none is given up at a disk's
                        // deadline: its slot always comes back with its end.
                        if let Some(slot) = slot {
                            self.release_slot(slot);
                        }
                        (job, None, Some(error))
                    }
                    FillEvent::Released { slot, .. } => {
                        if let Some(slot) = slot {
                            self.release_slot(slot);
                        }
                        continue;
                    }
                    FillEvent::Head { .. } | FillEvent::Committed { .. } => continue,
                };
                let Some(&(c, generation)) = self.cache.pulls.relay_jobs.get(&job) else {
                    continue;
                };
                if ended.is_some() {
                    self.cache.pulls.relay_jobs.remove(&job);
                }
                let live = self.conns[c.index()].generation() == generation;
                let Some(relay) = self
                    .cache
                    .pulls
                    .relays
                    .get_mut(self.conn_ref(c))
                    .filter(|r| live && r.job == job)
                else {
                    // Its response ended first: the piece is not wanted.
                    if piece.is_some() {
                        if let Some(edge) = self.cache.edge.as_mut() {
                            edge.fill.abort_pass_through(&mut self.ring, job, now_ms);
                        }
                    }
                    continue;
                };
                if let Some((slot, file_offset, len)) = piece {
                    relay.piece(slot, file_offset, len);
                }
                if let Some(error) = ended {
                    if let Some(e) = &error {
                        tracing::warn!(shard = self.index, error = ?e, "pass-through fetch failed");
                    }
                    relay.ended = Some(error.is_none());
                    let waiting = self
                        .cache
                        .pulls
                        .bypasses
                        .get(self.conn_ref(c))
                        .is_some_and(|b| b.head.is_none());
                    if let (true, Some(e)) = (waiting, error) {
                        // A bypass whose fetch ended before its head: the origin's error.
                        self.cache.pulls.bypasses.remove(self.conn_ref(c));
                        let status = crate::fill::edge::EdgeCache::status_for(&e);
                        let waiter = self.waiter(c);
                        self.resume_fill(
                            waiter,
                            Some(super::cache_glue::FillAnswer::Status(status)),
                        );
                        continue;
                    }
                }
                ready.push(c);
            }
            for c in ready.drain(..) {
                self.step_relay(c, &mut steps);
            }
            // Reads asked while these were done are answered on the next turn of the loop.
            ready.append(&mut self.cache.pulls.relay_ready);
            self.cache.pulls.relay_ready = ready;
        }
    }

    /// A pass-through fetch's head came: for a bypass waiting on it, the reply as a version
    /// never indexed (its size, validators, freshness and stored lines), and the request is
    /// answered from it.
    fn bypass_head(&mut self, job: u64, facts: crate::origin::fetch::HeadFacts) {
        let Some(&(c, generation)) = self.cache.pulls.relay_jobs.get(&job) else {
            return;
        };
        let conn_ref = self.conn_ref(c);
        let waiting = self
            .cache
            .pulls
            .bypasses
            .get(conn_ref)
            .is_some_and(|b| b.head.is_none());
        if self.conns[c.index()].generation() != generation || !waiting {
            return;
        }
        let now_s = u64::try_from(self.clock.date.secs()).unwrap_or(0);
        let status = facts.status;
        let whole = facts.whole;
        let meta = self.unstored_version(facts, now_s);
        if let Some(relay) = self.cache.pulls.relays.get_mut(conn_ref) {
            relay.set_size(meta.size);
            if whole {
                // The origin sent it all (a 200, a redirect, an error): from its first byte.
                relay.from = 0;
            }
        }
        if let Some(b) = self.cache.pulls.bypasses.get_mut(conn_ref) {
            b.head = Some(meta);
            b.status = status;
        }
        let waiter = self.waiter(c);
        self.resume_fill(waiter, Some(super::cache_glue::FillAnswer::Bypassed));
    }

    /// An origin reply one client gets, as a version never indexed (its size, validators,
    /// freshness and stored lines, its Set-Cookie too), arrived at `now_s`.
    fn unstored_version(
        &self,
        facts: crate::origin::fetch::HeadFacts,
        now_s: u64,
    ) -> ObjectVersion {
        let contract = crate::origin::contract::Contract::of(&facts.fields, now_s as i64);
        ObjectVersion {
            key: Vec::new(),
            version: 0,
            size: facts.size,
            block_bytes: self.cache.edge.as_ref().map_or(1, |e| e.fill.block_bytes()),
            fetched_unix_s: now_s,
            etag: facts.etag.unwrap_or_default(),
            last_modified: facts.last_modified.unwrap_or_default(),
            content_type: facts.content_type.unwrap_or_default(),
            freshness: crate::cache::record::Freshness {
                // Never stored: fresh for nothing (the lines say what the origin said).
                lifetime_s: Some(0),
                initial_age_s: u32::try_from(contract.initial_age_s).unwrap_or(u32::MAX),
                ..Default::default()
            },
            // Its own reply: its Set-Cookie too.
            headers: facts.fields.stored + &facts.fields.own,
            // Its status goes with the bypass (`Bypass::status`).
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        }
    }

    /// Does what pass-through `c` can do now: copies, pieces let go, reads completed.
    fn step_relay(&mut self, c: ConnSlot, steps: &mut Vec<Step>) {
        let Some(relay) = self.cache.pulls.relays.get_mut(self.conn_ref(c)) else {
            return;
        };
        let job = relay.job;
        steps.clear();
        let failed = relay.run(steps).is_err();
        for step in steps.drain(..) {
            match step {
                Step::Copy {
                    from,
                    from_off,
                    to,
                    to_off,
                    len,
                } => self.ring.arena_copy(from, from_off, to, to_off, len),
                Step::PieceDone => {
                    let now_ms = self.clock.now_ms;
                    if let Some(edge) = self.cache.edge.as_mut() {
                        edge.fill.delivered(&mut self.ring, job, now_ms);
                    }
                }
                Step::ReadDone { slot, len } => self.complete_relay_read(c, slot, len as i32),
            }
        }
        // A read the fetch can no longer answer (it ended, or the reads went backwards):
        // the response is cut, never padded.
        let Some(relay) = self.cache.pulls.relays.get_mut(self.conn_ref(c)) else {
            return;
        };
        if failed || (relay.ended.is_some() && relay.reading()) {
            if let Some(slot) = relay.take_read() {
                self.complete_relay_read(c, slot, -libc::EIO);
            }
        }
    }

    /// Completes connection `c`'s read into `slot` with `res` (bytes, or -errno).
    fn complete_relay_read(&mut self, c: ConnSlot, slot: ArenaSlot, res: i32) {
        let cx = self.cx();
        let mut out = self.take_actions();
        if res >= 0 {
            self.conns[c.index()].source_delivered(&cx);
        }
        // No file: nothing to check for changes.
        self.conns[c.index()].on_read(slot, res, &mut |_| true, &cx, &mut out);
        self.run_actions(c, out);
        // A response gone over from a failed disk: its next held chunk.
        self.try_failover(c);
    }

    /// Connection `c`'s response ended (or it closed): its pass-through is forgotten, and a
    /// fetch still running for it is ended (its `Ended` gives the fetch's slot back).
    pub(super) fn relay_end(&mut self, c: ConnSlot) {
        let Some(relay) = self.cache.pulls.relays.remove(self.conn_ref(c)) else {
            return;
        };
        self.wake_relay_waiters(1);
        debug_assert!(!relay.reading(), "a pass-through ended with a read pending");
        if relay.ended.is_none() {
            let now_ms = self.clock.now_ms;
            if let Some(edge) = self.cache.edge.as_mut() {
                edge.fill
                    .abort_pass_through(&mut self.ring, relay.job, now_ms);
            }
            // Its events (the end) are taken on the next turn of `run_relays`.
            self.cache.pulls.relay_ready.push(c);
        }
    }
}
