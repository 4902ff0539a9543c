//! The shard's side of the pull-through cache (`fill::edge`): routes a request to the cache,
//! parks it while the fill works (`ConnMachine::await_fill`: no slot, a deadline), carries
//! origin completions to the fill, lends it arena slots, and resumes the waiting requests
//! when their bytes are on disk. A cached version is served as a file response over its data
//! file (`FileCache::acquire_immutable`), so the chunk pipeline is the one every file uses.

use super::buffers::Demand;
use super::slots::ConnSlot;
use super::{RingOps, Shard};
use crate::fill::cache_fill::{Notice, Outcome};
use crate::fill::edge::{EdgeCache, Route, Waiter};
use crate::http::plan::{self, FileFacts};
use crate::http::request::{Method, Request};

impl<R: RingOps> Shard<R> {
    /// Answers `req` from the cache when it is under an `[[origin]]`; false when it is not
    /// (the local root serves it).
    pub(super) fn respond_pulled(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        rate: crate::limits::RateSpec,
    ) -> bool {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let Some(edge) = self.edge.as_mut() else {
            return false;
        };
        let mut scratch = std::mem::take(&mut self.path_scratch);
        let route = edge.route(req.path, req.host, &mut scratch);
        self.path_scratch = scratch;
        let Route::Origin { origin, key, path } = route else {
            return false;
        };
        if let Some(status) = self.fill_failed.remove(&c.raw()) {
            self.respond_status(c, status, keep_alive && status < 500, head_only);
            return true;
        }
        let waiter = (c, self.conns[c.index()].generation);
        let edge = self.edge.as_mut().expect("checked above");
        match edge.want(&key, origin, &path, req.range, head_only, waiter) {
            Outcome::Ready(version) => self.respond_cached(c, req, version, rate),
            Outcome::Waiting => {
                let timeout_ms = edge.wait_timeout_ms;
                let cx = self.cx();
                self.conns[c.index()].await_fill(timeout_ms, &cx);
                self.sync_timer(c);
            }
            Outcome::Busy => self.respond_status(c, 503, keep_alive, head_only),
        }
        true
    }

    /// Serves `req` from version `version` of the cache (every byte it needs is on disk).
    fn respond_cached(
        &mut self,
        c: ConnSlot,
        req: &Request<'_>,
        version: u64,
        rate: crate::limits::RateSpec,
    ) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let edge = self.edge.as_ref().expect("a pulled request has a cache");
        let meta = edge.meta(version).expect("a ready version").clone();
        let (key, path) = edge.data_file(version);
        let idx = match self
            .files
            .acquire_immutable(&mut self.ring, &key, &path, self.now_ms)
        {
            Ok(idx) => idx,
            Err(e) => {
                tracing::warn!(shard = self.index, path = %path.display(), ?e, "cache data file");
                return self.respond_status(c, e.status(), keep_alive, head_only);
            }
        };
        let limits = self.plan_limits(c);
        let ctx = super::respond::plan_context(&self.date, self.leaving(), self.boundary_seed(c));
        let f = self.files.get(idx);
        // The origin's validators and type, so every edge holding this version says the same.
        let last_modified = crate::http::date::parse_http_date(meta.last_modified.as_bytes())
            .map(|s| (meta.last_modified.as_bytes(), s));
        let facts = FileFacts {
            size: meta.size,
            etag: if meta.etag.is_empty() {
                f.etag()
            } else {
                meta.etag.as_bytes()
            },
            last_modified: last_modified.map_or(&f.last_modified[..], |l| l.0),
            mtime_secs: last_modified.map_or(f.mtime_secs, |l| l.1),
            read: f.mode,
            content_type: if meta.content_type.is_empty() {
                "application/octet-stream"
            } else {
                &meta.content_type
            },
        };
        let plan = plan::plan_response(req, &facts, &limits, &ctx);
        let bufs = self.body_pool.pop().unwrap_or_default();
        let started = super::respond::start_plan(self.ring.tx_mut(c), &plan, bufs);
        if !started.reads_file {
            self.files.release(&mut self.ring, idx);
            return self.install(c, started, None, rate);
        }
        self.install(c, started, Some(idx), rate);
    }

    /// Each tick: deadlines, queued fetches (slots at bulk priority), slots given back, and
    /// the waiting requests whose fill moved.
    pub(super) fn run_fill(&mut self) {
        let Some(edge) = self.edge.as_mut() else {
            return;
        };
        edge.fill.expire(self.now_ms);
        let arena = &mut self.arena;
        edge.fill.pump(
            &mut self.ring,
            &mut || arena.take(Demand::Bulk),
            self.now_ms,
        );
        let mut notices = std::mem::take(&mut self.fill_notices);
        let mut slots = std::mem::take(&mut self.fill_slots);
        edge.take_notices(&mut notices, &mut slots);
        for slot in slots.drain(..) {
            self.release_slot(slot);
        }
        for n in notices.drain(..) {
            match n {
                Notice::Block { waiter, .. } | Notice::Known { waiter, .. } => {
                    self.resume_fill(waiter, None)
                }
                Notice::Failed { waiter, error } => {
                    tracing::warn!(shard = self.index, ?error, "origin fill failed");
                    self.resume_fill(waiter, Some(EdgeCache::status_for(&error)));
                }
            }
        }
        self.fill_notices = notices;
        self.fill_slots = slots;
    }

    /// The earliest fill deadline or retry (ms), for the loop's sleep.
    pub(super) fn fill_due_ms(&self) -> Option<u64> {
        self.edge.as_ref().and_then(|e| e.fill.next_due_ms())
    }

    /// A waiting request's fill moved (or failed with `status`): it is answered again.
    fn resume_fill(&mut self, (c, generation): Waiter, status: Option<u16>) {
        let conn = &self.conns[c.index()];
        if conn.generation != generation || !conn.is_open() || !conn.awaiting_fill() {
            return;
        }
        if let Some(s) = status {
            self.fill_failed.insert(c.raw(), s);
        }
        self.conns[c.index()].fill_resumed();
        self.resuming_fill = true;
        self.start_request(c);
        self.resuming_fill = false;
        // Outside a visit nothing pumps a response begun here: queue the connection (a fresh
        // response is urgent work, as a new request is).
        if self.conns[c.index()].responding() {
            self.ready.push_urgent(c);
        }
    }

    /// A waiting request ran out of time: 504.
    pub(super) fn fill_timed_out(&mut self, c: ConnSlot) {
        let waiter = (c, self.conns[c.index()].generation);
        if let Some(edge) = self.edge.as_mut() {
            edge.fill.cancel(&waiter);
        }
        self.resume_fill(waiter, Some(504));
    }

    /// Connection `c` is gone: its waits end.
    pub(super) fn fill_forget(&mut self, c: ConnSlot) {
        self.fill_failed.remove(&c.raw());
        let waiter = (c, self.conns[c.index()].generation);
        if let Some(edge) = self.edge.as_mut() {
            edge.fill.cancel(&waiter);
        }
    }

    /// An `Op::Origin` completion.
    pub(super) fn on_origin(&mut self, t: super::token::Token, res: i32) {
        let now_ms = self.ring.now().as_millis() as u64;
        match self.edge.as_mut() {
            Some(edge) => edge.fill.on_completion(&mut self.ring, t, res, now_ms),
            None => super::ShardMetrics::add(&self.metrics.stray_completions, 1),
        }
    }
}
