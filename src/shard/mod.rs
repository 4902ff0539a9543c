//! A shard: one pinned thread, one io_uring, one listener, and everything its connections
//! touch. Shards share nothing mutable; each only writes its own metrics.
//!
//! One loop tick: submit and wait (bounded by the timer interval), drain completions into a
//! bounded batch, dispatch each by its token, run the ready queue round-robin under the per-tick
//! budget, sweep timers.

pub mod access_log;
pub mod buffers;
pub mod conn;
pub mod files;
pub mod header_buffers;
pub mod intrusive;
mod reload;
mod respond;
#[allow(unsafe_code)]
pub mod ring;
pub mod ring_ops;
#[allow(unsafe_code)]
pub mod ring_sys;
pub mod sched;
#[cfg(test)]
mod sim;
pub mod timer_wheel;
pub mod token;

use std::net::TcpListener;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Config, ZeroCopy};
use crate::http::date::DateCache;
use crate::metrics::ShardMetrics;
use buffers::{ArenaSlots, Demand};
use conn::{ChunkState, CloseReason, Conn, Deadline, Phase, Segment, Source};
use files::{FileCache, FileCacheConfig};
use ring::{Completion, Ring, RingConfig};
use ring_ops::RingOps;
use sched::{ReadyQueue, TickBudget, Turn};
use token::{Op, Token};

/// Submission queue entries of a shard's ring.
pub const SQ_ENTRIES: u32 = 4096;
/// Completion queue entries (several times the SQ: multishot accepts and receives).
pub const CQ_ENTRIES: u32 = 16384;
/// How often timers are checked, and the longest a shard sleeps in the kernel.
pub const TIMER_SWEEP_MS: u64 = 100;
/// Chunks a response reads ahead until its first chunk has left (and after a slow send).
pub const READ_AHEAD_START_CHUNKS: usize = 2;
/// A SEND_ZC buffer not yet released by the kernel after this long (the peer is slow to
/// acknowledge) makes the connection give back the read-ahead it holds behind it.
pub const READ_AHEAD_FAST_SEND_MS: u64 = 20;
/// At most 1/N of the arena may wait for SEND_ZC notifications: a client that took a burst
/// and then stopped reading never acknowledges, and its zero-copy chunks stay the kernel's
/// until the send timeout, so zero-copy must never be able to pin the whole arena.
pub const ZC_ARENA_SHARE_DIVISOR: usize = 2;
/// Bytes a response must have sent with whole copy sends before it may use SEND_ZC (a fresh
/// socket's send buffer takes a first chunk whole even when its client never reads).
pub const ZC_WARMUP_BYTES: u64 = 2 * 1024 * 1024;
/// Longest a connection keeps a parked chunk (its socket full) while nobody else waits for
/// the arena; the unsent bytes are then re-read when the socket drains. Under arena pressure
/// parked chunks are given back at once.
pub const PARK_HOLD_MS: u64 = 200;
/// Smallest file read planned for a connection whose socket takes little per writable round.
pub const MIN_READ_BYTES: usize = 64 * 1024;
/// Longest the ready-queue walk of one tick may run before bulk work waits for the next tick
/// (new requests are still served): with a fast disk and many connections, a tick stays well
/// under a millisecond, so a small request's turn comes quickly.
pub const TICK_BUDGET_US: u64 = 500;
/// Longest a lingering close waits for the client to stop sending (nginx: lingering_timeout).
pub const LINGER_TIMEOUT_MS: u64 = 2000;
/// Most request bytes a lingering close reads and drops before it closes anyway.
pub const LINGER_MAX_BYTES: u64 = 256 * 1024;
/// Completions a wait tries to gather (within `wait_batch_usec`) before the shard wakes.
pub const WAIT_BATCH_COMPLETIONS: usize = 32;
/// Most completions handled per batch before the ready queue runs.
pub const COMPLETION_BATCH_MAX: usize = 4096;
/// Fixed-file slots beyond the connection cap, so over-cap clients get a quick 503.
pub const OVERFLOW_SOCKET_SLOTS: u32 = 64;
/// Back-off after accept fails for lack of descriptors (EMFILE/ENFILE), instead of spinning.
pub const ACCEPT_BACKOFF_MS: u64 = 100;
/// Shortest interval between two "accept failed" log lines.
pub const ACCEPT_WARN_INTERVAL_MS: u64 = 1000;
/// Bytes per provided receive buffer.
pub const RECV_BUFFER_BYTES: usize = 4096;
/// Canned answer to a connection over the per-shard cap.
pub static OVER_CAP_RESPONSE: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n";

/// Everything a shard thread needs to start.
pub struct ShardParams {
    /// Shard number (also its place in the SO_REUSEPORT group).
    pub index: usize,
    /// Validated configuration.
    pub config: Arc<Config>,
    /// This shard's listener (already bound, part of the reuseport group).
    pub listener: TcpListener,
    /// Set by the main thread on SIGTERM/SIGINT.
    pub shutdown: Arc<AtomicBool>,
    /// This shard's counters.
    pub metrics: Arc<ShardMetrics>,
    /// Bumped by SIGUSR1: reopen the access log.
    pub log_epoch: Arc<AtomicU64>,
    /// Leaving rotation (SIGTERM) and reloaded configuration (SIGHUP).
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
}

/// Builds the shard (ring, arena, caches — after the caller pinned the thread, so memory is
/// first touched on the right NUMA node) and runs it until drained.
pub fn run(params: ShardParams, ready: impl FnOnce(std::io::Result<()>)) {
    match Shard::new(params) {
        Ok(mut shard) => {
            ready(Ok(()));
            if let Err(e) = shard.run_loop() {
                tracing::error!(shard = shard.index, error = %e, "shard loop failed");
            }
        }
        Err(e) => ready(Err(e)),
    }
}

struct Shard<R: RingOps> {
    index: usize,
    cfg: Arc<Config>,
    ring: R,
    conns: Vec<Conn>,
    free_conns: Vec<u32>,
    ready: ReadyQueue,
    arena: ArenaSlots,
    files: FileCache,
    listener: Option<TcpListener>,
    /// The ring itself produces connections (the simulator has no listener).
    ring_accepts: bool,
    accept_armed: bool,
    accept_retry_ms: u64,
    accept_warned_ms: u64,
    date: DateCache,
    metrics: Arc<ShardMetrics>,
    shutdown: Arc<AtomicBool>,
    batch: Vec<Completion>,
    recv_retry: Vec<u32>,
    /// Connections that parked a chunk, oldest first (each slot at most once: `parked_listed`).
    parked: std::collections::VecDeque<u32>,
    now_ms: u64,
    drain_deadline_ms: Option<u64>,
    open_conns: usize,
    zerocopy: bool,
    /// Arena slots lent to SEND_ZC and not yet released by a notification.
    zc_held: usize,
    last_sweep_ms: u64,
    /// Bytes of bulk work (reads planned, chunk sends) the shard may still add this tick.
    shard_budget: TickBudget,
    access_log: Option<access_log::AccessLog>,
    log_epoch: Arc<AtomicU64>,
    lifecycle: reload::LifecycleView,
}

/// Sizes of a shard's ring for `cfg` (the simulator's fake ring uses the same).
fn ring_config(cfg: &Config) -> RingConfig {
    let max_conns = cfg.max_connections_per_shard;
    RingConfig {
        sq_entries: SQ_ENTRIES,
        cq_entries: CQ_ENTRIES,
        socket_slots: max_conns as u32 + OVERFLOW_SOCKET_SLOTS,
        file_slots: cfg.open_file_cache_entries as u32,
        arena_slots: cfg.arena_slots() as u16,
        chunk_bytes: cfg.chunk_bytes,
        arena_align_bytes: files::ARENA_ALIGN_BYTES as usize,
        recv_buffers: cfg.recv_buffers as u16,
        recv_buffer_bytes: RECV_BUFFER_BYTES,
        conn_slots: max_conns,
    }
}

impl Shard<Ring> {
    fn new(p: ShardParams) -> std::io::Result<Shard<Ring>> {
        let ring = new_ring_retrying(&ring_config(&p.config))?;
        let loopback = p.listener.local_addr()?.ip().is_loopback();
        Shard::with_ring(
            p.index,
            p.config,
            ring,
            Some(p.listener),
            loopback,
            p.metrics,
            p.shutdown,
            p.log_epoch,
            p.lifecycle,
        )
    }
}

impl<R: RingOps> Shard<R> {
    /// A shard on `ring`. Without a listener, the ring itself produces connections (the
    /// simulator); `loopback` says whether the listener is on a loopback address.
    #[allow(clippy::too_many_arguments)]
    fn with_ring(
        index: usize,
        cfg: Arc<Config>,
        ring: R,
        listener: Option<TcpListener>,
        loopback: bool,
        metrics: Arc<ShardMetrics>,
        shutdown: Arc<AtomicBool>,
        log_epoch: Arc<AtomicU64>,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
    ) -> std::io::Result<Shard<R>> {
        let max_conns = cfg.max_connections_per_shard;
        let arena_slots = cfg.arena_slots();
        let files = FileCache::new(
            &cfg.root,
            FileCacheConfig {
                entries: cfg.open_file_cache_entries as u32,
                valid_ms: cfg.open_file_valid_ms,
                direct_io_min_bytes: cfg.direct_io_min_bytes,
                symlinks: cfg.symlinks,
                chunk_bytes: cfg.chunk_bytes,
                etag: cfg.etag,
            },
        )?;
        let zerocopy = match cfg.zerocopy {
            ZeroCopy::On => true,
            ZeroCopy::Off => false,
            // Over loopback SEND_ZC always copies and only adds a completion per send.
            ZeroCopy::Auto => !loopback,
        } && ring.probe_supports(ring::opcodes::SEND_ZC);
        let now = unix_now_secs();
        let access_log = match cfg
            .access_log
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            Some(path) => Some(access_log::AccessLog::open(
                path.clone(),
                cfg.access_log_format == crate::config::AccessLogFormat::Json,
                log_epoch.load(Ordering::Relaxed),
            )?),
            None => None,
        };
        Ok(Shard {
            index,
            ring,
            conns: (0..max_conns).map(|_| Conn::new()).collect(),
            free_conns: (0..max_conns as u32).rev().collect(),
            ready: ReadyQueue::new(max_conns),
            arena: ArenaSlots::new(arena_slots as u16, max_conns),
            files,
            ring_accepts: listener.is_none(),
            listener,
            accept_armed: false,
            accept_retry_ms: 0,
            accept_warned_ms: 0,
            date: DateCache::new(now),
            metrics,
            shutdown,
            batch: Vec::with_capacity(COMPLETION_BATCH_MAX),
            recv_retry: Vec::new(),
            parked: std::collections::VecDeque::with_capacity(max_conns),
            now_ms: 0,
            drain_deadline_ms: None,
            open_conns: 0,
            zerocopy,
            zc_held: 0,
            last_sweep_ms: 0,
            shard_budget: TickBudget::new(cfg.shard_tick_budget_bytes),
            access_log,
            log_epoch,
            lifecycle: reload::LifecycleView::new(lifecycle),
            cfg,
        })
    }

    fn run_loop(&mut self) -> std::io::Result<()> {
        tracing::debug!(
            shard = self.index,
            deferred_taskrun = self.ring.deferred_taskrun(),
            zerocopy = self.zerocopy,
            "shard loop starting"
        );
        while self.tick()? {}
        tracing::debug!(shard = self.index, "shard drained");
        Ok(())
    }

    /// One loop tick (see the module doc); false once the shard has drained.
    fn tick(&mut self) -> std::io::Result<bool> {
        // The body of what was the loop, unchanged in shape (the simulator calls it per step).
        {
            self.now_ms = self.ring.now().as_millis() as u64;
            self.date.refresh(unix_now_secs());
            self.apply_reload();
            if self.shutdown.load(Ordering::Relaxed) && self.drain_deadline_ms.is_none() {
                self.begin_drain();
            }
            if let Some(deadline) = self.drain_deadline_ms {
                let log_busy = self.access_log.as_ref().is_some_and(|l| l.busy());
                if self.open_conns == 0 && !self.accept_armed && !log_busy {
                    return Ok(false);
                }
                if self.now_ms >= deadline {
                    self.close_all(CloseReason::Drain);
                }
            }
            self.arm_accept();
            self.retry_recvs();

            let tick_budget = self.cfg.tick_budget_bytes;
            self.shard_budget = TickBudget::new(self.cfg.shard_tick_budget_bytes);
            self.ready.begin_tick();
            let tick_started = self.ring.now();
            let tick_budget_time = Duration::from_micros(TICK_BUDGET_US);
            loop {
                let bulk_allowed = self.shard_budget.has_room()
                    && self.ring.now().saturating_sub(tick_started) < tick_budget_time;
                let Some(c) = self.ready.next_conn(bulk_allowed) else {
                    break;
                };
                if self.visit(c, tick_budget) == Turn::MoreWork {
                    self.ready.push_bulk(c);
                }
            }

            let busy = !self.ready.is_empty() || !self.recv_retry.is_empty();
            if busy {
                self.ring.submit_and_wait(0, None)?;
            } else {
                let batch = (self.cfg.wait_batch_usec > 0).then(|| {
                    (
                        WAIT_BATCH_COMPLETIONS,
                        Duration::from_micros(self.cfg.wait_batch_usec),
                    )
                });
                self.ring
                    .submit_and_wait_batched(Duration::from_millis(TIMER_SWEEP_MS), batch)?;
            }
            loop {
                self.batch.clear();
                let mut batch = std::mem::take(&mut self.batch);
                self.ring
                    .drain_completions(&mut batch, COMPLETION_BATCH_MAX);
                let n = batch.len();
                for cqe in &batch {
                    self.dispatch(*cqe);
                }
                ShardMetrics::add(&self.metrics.ring_cqes, n as u64);
                self.batch = batch;
                if n < COMPLETION_BATCH_MAX {
                    break;
                }
            }
            self.now_ms = self.ring.now().as_millis() as u64;
            if self.now_ms >= self.last_sweep_ms + TIMER_SWEEP_MS {
                self.last_sweep_ms = self.now_ms;
                self.sweep_timers();
            }
            if let Some(log) = self.access_log.as_mut() {
                log.reopen_if(self.log_epoch.load(Ordering::Relaxed));
                let t = Token::new(Op::LogWrite, 0, 0, 0).encode();
                let force = self.drain_deadline_ms.is_some();
                log.maybe_flush(&mut self.ring, t, self.now_ms, force);
            }
            ShardMetrics::set(&self.metrics.ring_sqes, self.ring.sqes_pushed());
            ShardMetrics::set(
                &self.metrics.chunks_in_flight,
                (self.cfg.arena_slots() - self.arena.free_count()) as u64,
            );
            ShardMetrics::set(&self.metrics.ring_enters, self.ring.enters());
            ShardMetrics::set(&self.metrics.open, self.open_conns as u64);
            ShardMetrics::set(&self.metrics.arena_waits, self.arena.waits);
            ShardMetrics::set(&self.metrics.ring_busy, self.ring.busy());
            ShardMetrics::set(&self.metrics.ring_unqueued, self.ring.unqueued_total());
            let overflow = u64::from(self.ring.cq_overflow());
            ShardMetrics::set(&self.metrics.ring_cq_overflow, overflow);
            ShardMetrics::set(&self.metrics.file_cache_hits, self.files.hits);
            ShardMetrics::set(&self.metrics.file_cache_misses, self.files.misses);
        }
        Ok(true)
    }

    /// Records a time-to-first-byte sample.
    fn observe_ttfb(&self, us: u64) {
        self.metrics.ttfb.observe(us);
    }

    fn metrics_requests(&self) -> u64 {
        self.ring.sqes_pushed()
    }

    fn token(&self, op: Op, c: u32, aux: u16) -> u64 {
        Token::new(op, c, self.conns[c as usize].generation, aux).encode()
    }

    // ---- accept ----------------------------------------------------------------------------

    fn arm_accept(&mut self) {
        if self.accept_armed
            || self.drain_deadline_ms.is_some()
            || self.now_ms < self.accept_retry_ms
        {
            return;
        }
        let listener = self.listener.as_ref().map(|l| l.as_fd());
        if listener.is_some() || self.ring_accepts {
            let t = Token::new(Op::Accept, 0, 0, 0).encode();
            self.ring.accept_multi(listener, t);
            self.accept_armed = true;
        }
    }

    fn on_accept(&mut self, cqe: Completion) {
        if !cqe.more() {
            self.accept_armed = false;
        }
        if cqe.result < 0 {
            let errno = -cqe.result;
            if errno != libc::ECANCELED {
                ShardMetrics::add(&self.metrics.accept_errors, 1);
                // Under a connection flood this repeats: log at most once per interval.
                if self.now_ms >= self.accept_warned_ms + ACCEPT_WARN_INTERVAL_MS
                    || self.accept_warned_ms == 0
                {
                    self.accept_warned_ms = self.now_ms.max(1);
                    tracing::warn!(
                        shard = self.index,
                        errno,
                        "accept failed; backing off until a socket slot frees (more such errors \
                         are counted in accept_errors_total, logged at most once a second)"
                    );
                }
                self.accept_retry_ms = self.now_ms + ACCEPT_BACKOFF_MS;
            }
            return;
        }
        let socket = cqe.result as u32;
        let draining = self.drain_deadline_ms.is_some();
        let Some(c) = (!draining).then(|| self.free_conns.pop()).flatten() else {
            ShardMetrics::add(&self.metrics.refused_over_cap, 1);
            let t = Token::new(Op::Overflow, socket, 0, 0).encode();
            let tc = Token::new(Op::OverflowClose, socket, 0, 0).encode();
            self.ring
                .send_static_then_close(socket, OVER_CAP_RESPONSE, t, tc);
            return;
        };
        ShardMetrics::add(&self.metrics.accepted, 1);
        self.open_conns += 1;
        let now = self.now_ms;
        let header_ms = self.cfg.header_timeout_ms;
        let conn = &mut self.conns[c as usize];
        conn.open(socket);
        conn.deadline = Deadline::Header;
        conn.deadline_ms = now + header_ms;
        self.arm_recv(c);
    }

    // ---- receive ---------------------------------------------------------------------------

    fn arm_recv(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.recv_armed || conn.phase != Phase::Open || conn.peer_closed {
            return;
        }
        conn.recv_armed = true;
        conn.ops += 1;
        let socket = conn.socket;
        let t = self.token(Op::Recv, c, 0);
        self.ring.recv(socket, t);
    }

    fn retry_recvs(&mut self) {
        if self.recv_retry.is_empty() {
            return;
        }
        for c in std::mem::take(&mut self.recv_retry) {
            self.conns[c as usize].recv_retry = false;
            self.arm_recv(c);
        }
    }

    fn on_recv(&mut self, c: u32, cqe: Completion) {
        let conn = &mut self.conns[c as usize];
        conn.recv_armed = false;
        conn.ops -= 1;
        let bid = cqe.buffer_id();
        if let Some(b) = bid {
            self.ring.claim_recv(b);
        }
        if conn.phase != Phase::Open {
            if let Some(b) = bid {
                self.ring.recycle_recv(b);
            }
            self.maybe_finish_close(c);
            return;
        }
        if cqe.result < 0 {
            if let Some(b) = bid {
                self.ring.recycle_recv(b);
            }
            match -cqe.result {
                libc::ENOBUFS => {
                    ShardMetrics::add(&self.metrics.recv_no_buffers, 1);
                    if !conn.recv_retry {
                        conn.recv_retry = true;
                        self.recv_retry.push(c);
                    }
                }
                libc::ECANCELED => {}
                _ => self.close(c, CloseReason::Normal),
            }
            return;
        }
        if cqe.result == 0 {
            if let Some(b) = bid {
                self.ring.recycle_recv(b);
            }
            conn.peer_closed = true;
            if !conn.responding {
                self.close(c, CloseReason::Normal);
            }
            return;
        }
        if conn.lingering {
            // Dropped unread: the client is only being let finish before we close.
            if let Some(b) = bid {
                self.ring.recycle_recv(b);
            }
            conn.linger_bytes += cqe.result as u64;
            if conn.linger_bytes > LINGER_MAX_BYTES {
                self.close(c, CloseReason::Normal);
            } else {
                self.arm_recv(c);
            }
            return;
        }
        let Some(b) = bid else {
            self.close(c, CloseReason::ProtocolError);
            return;
        };
        let was_empty = conn.rx.is_empty();
        conn.rx
            .extend_from_slice(self.ring.recv_data(b, cqe.result as usize));
        self.ring.recycle_recv(b);
        // The first byte after an idle keep-alive pause starts the header clock; a new
        // connection's clock started at accept and is not restarted by a trickle.
        if was_empty && !conn.responding && conn.deadline == Deadline::Idle {
            conn.deadline = Deadline::Header;
            conn.deadline_ms = self.now_ms + self.cfg.header_timeout_ms;
        }
        if !conn.responding {
            self.ready.push_urgent(c);
        }
    }

    // ---- the ready queue -------------------------------------------------------------------

    fn visit(&mut self, c: u32, tick_budget: usize) -> Turn {
        if self.conns[c as usize].phase != Phase::Open {
            return Turn::Idle;
        }
        if !self.conns[c as usize].responding {
            self.start_request(c);
        }
        if self.conns[c as usize].phase == Phase::Open && self.conns[c as usize].responding {
            let turn = self.pump(c, tick_budget);
            self.try_send(c);
            return turn;
        }
        Turn::Idle
    }

    /// Turns body segments into chunk reads, within the budget and the pipeline depth.
    fn pump(&mut self, c: u32, tick_budget: usize) -> Turn {
        let depth = self.cfg.pipeline_depth;
        let chunk_bytes = self.cfg.chunk_bytes;
        let mut budget = TickBudget::new(tick_budget);
        loop {
            let conn = &mut self.conns[c as usize];
            let Some(body) = conn.body.as_mut() else {
                return Turn::Idle;
            };
            // A full socket takes nothing now: read when it drains (the poll re-queues us).
            let socket_full = conn.poll_armed;
            if socket_full
                || body.segments.is_empty()
                || body.chunks.len() >= body.read_ahead.min(depth)
            {
                // No more read-ahead wanted now: a slot handed over while waiting goes back.
                let handed = conn.handoff_slot.take();
                if let Some(waited) = conn.end_arena_wait() {
                    self.metrics.observe_buffer_wait(waited);
                    self.arena.forget(c);
                }
                if let Some(slot) = handed {
                    self.release_slot(slot);
                }
                return Turn::Idle;
            }
            // A small response's single chunk is never held back; bulk work stops at the
            // connection's budget or when the shard's budget for this tick is spent.
            if !body.inline_head && (!budget.has_room() || !self.shard_budget.has_room()) {
                return Turn::MoreWork;
            }
            let demand = if body.inline_head {
                Demand::Small
            } else if body.chunks.is_empty() {
                Demand::Bulk
            } else {
                Demand::ReadAhead
            };
            let Some(slot) = conn.handoff_slot.take().or_else(|| self.arena.take(demand)) else {
                if demand == Demand::ReadAhead {
                    // Planned again when one of its chunks finishes.
                    return Turn::Idle;
                }
                if !conn.waiting_arena {
                    conn.start_arena_wait();
                    self.arena.wait(c, demand);
                }
                // Chunks parked behind full sockets are not moving: they go to the waiters.
                self.reclaim_parked();
                return Turn::Idle;
            };
            if let Some(waited) = conn.end_arena_wait() {
                self.metrics.observe_buffer_wait(waited);
            }
            let body = conn.body.as_mut().expect("checked above");
            let source = body.source;
            let mut chunk = conn::Chunk {
                slot,
                state: ChunkState::Ready,
                send_off: 0,
                send_len: 0,
                sent: 0,
                read_buf_off: 0,
                read_file_off: 0,
                read_len: 0,
                read_need: 0,
                read_got: 0,
                send_started_ms: 0,
                source,
                zerocopy: false,
            };
            let seg = body.segments.front_mut().expect("checked above");
            match seg {
                Segment::Mem(bytes) => {
                    let n = bytes.len().min(chunk_bytes);
                    self.ring.arena_mut(slot)[..n].copy_from_slice(&bytes[..n]);
                    chunk.send_len = n as u32;
                    chunk.source = Source::Memory;
                    bytes.drain(..n);
                    if bytes.is_empty() {
                        body.segments.pop_front();
                    }
                }
                Segment::Zero { remaining } => {
                    let n = (*remaining).min(chunk_bytes as u64) as usize;
                    self.ring.arena_mut(slot)[..n].fill(0);
                    chunk.send_len = n as u32;
                    chunk.source = Source::Memory;
                    *remaining -= n as u64;
                    if *remaining == 0 {
                        body.segments.pop_front();
                    }
                }
                Segment::File { pos, end } => {
                    if body.inline_head {
                        // Small file: header and body leave in one send from one slot.
                        let head_len = self.ring.copy_tx_to_arena(c as usize, slot);
                        let len = (*end - *pos) as usize;
                        assert!(head_len + len <= chunk_bytes);
                        chunk.state = ChunkState::Reading;
                        chunk.send_len = (head_len + len) as u32;
                        chunk.read_buf_off = head_len as u32;
                        chunk.read_file_off = *pos;
                        chunk.read_len = len as u32;
                        chunk.read_need = len as u32;
                        body.inline_head = false;
                        *pos = *end;
                    } else {
                        let read_cap =
                            read_cap_bytes(body.read_size_bytes, body.align, chunk_bytes);
                        let plan = crate::fs::dio::plan_chunk(*pos, *end, body.align, read_cap);
                        chunk.state = ChunkState::Reading;
                        chunk.send_off = plan.skip as u32;
                        chunk.send_len = plan.send_len as u32;
                        chunk.read_file_off = plan.read_offset;
                        chunk.read_len = plan.read_len as u32;
                        chunk.read_need = (plan.skip + plan.send_len) as u32;
                        *pos += plan.send_len as u64;
                    }
                    if *pos >= *end {
                        body.segments.pop_front();
                    }
                }
            }
            budget.charge(chunk.send_len as usize);
            self.shard_budget.charge(chunk.send_len as usize);
            let reading = chunk.state == ChunkState::Reading;
            body.chunks.push_back(chunk);
            if reading {
                self.submit_read(c, slot);
            }
        }
    }

    fn submit_read(&mut self, c: u32, slot: u16) {
        let conn = &mut self.conns[c as usize];
        let body = conn.body.as_ref().expect("reading without a body");
        let ch = body
            .chunks
            .iter()
            .find(|ch| ch.slot == slot)
            .expect("chunk for read");
        let got = ch.read_got;
        let (buf_off, len, file_off) = (
            (ch.read_buf_off + got) as usize,
            (ch.read_len - got) as usize,
            ch.read_file_off + u64::from(got),
        );
        let (file_fixed, rw_flags) = (body.file_fixed, body.rw_flags);
        conn.ops += 1;
        let t = self.token(Op::Read, c, slot);
        self.ring
            .read_fixed(slot, buf_off, len, file_fixed, file_off, rw_flags, t);
    }

    fn on_read(&mut self, c: u32, slot: u16, res: i32) {
        self.ring.arena_done(slot);
        let conn = &mut self.conns[c as usize];
        conn.ops -= 1;
        if conn.phase != Phase::Open {
            self.maybe_finish_close(c);
            return;
        }
        let body = conn.body.as_mut().expect("read completion without a body");
        let i = body
            .chunks
            .iter()
            .position(|ch| ch.slot == slot)
            .expect("read completion for an unknown chunk");
        if res < 0 {
            // Judged by the chunk, not the body: with several chunks in flight, every read
            // submitted with RWF_DONTCACHE comes back refused, not only the first.
            if -res == libc::EOPNOTSUPP && body.chunks[i].source == Source::DontCache {
                // RWF_DONTCACHE refused by this file system: read buffered from now on.
                body.rw_flags = 0;
                body.source = Source::Buffered;
                body.chunks[i].source = Source::Buffered;
                if let Some(file) = body.file {
                    self.files.demote_to_buffered(file);
                }
                self.submit_read(c, slot);
                return;
            }
            tracing::warn!(
                shard = self.index,
                errno = -res,
                "file read failed; aborting response"
            );
            self.close(c, CloseReason::Abort);
            return;
        }
        let ch = &mut body.chunks[i];
        ch.read_got += res as u32;
        if ch.read_got < ch.read_need {
            let aligned = (ch.read_file_off + u64::from(ch.read_got)).is_multiple_of(body.align);
            if res == 0 || !aligned {
                // The file is shorter than promised: it was truncated under us. Never pad.
                tracing::info!(
                    shard = self.index,
                    "file shrank during a response; aborting"
                );
                self.close(c, CloseReason::Abort);
                return;
            }
            self.submit_read(c, slot);
            return;
        }
        ch.state = ChunkState::Ready;
        // The bytes are only good if the file did not change while they were read.
        if let Some(file) = body.file {
            if !self.files.unchanged_since_open(file) {
                tracing::info!(
                    shard = self.index,
                    "file changed during a response; aborting"
                );
                self.close(c, CloseReason::Abort);
                return;
            }
        }
        if self.conns[c as usize].poll_armed {
            // Read ahead landed behind a full socket: the chunk is ours now, so a reclaim that
            // found it still being read (and freed nothing) can take it this time.
            self.list_parked(c);
            self.reclaim_parked();
            return;
        }
        self.send_soon(c);
    }

    // ---- send ------------------------------------------------------------------------------

    fn try_send(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.phase != Phase::Open || conn.send_in_flight() {
            return;
        }
        if let Some(from) = conn.head_from {
            let more = conn.body.as_ref().is_some_and(|b| !b.is_done());
            let flags = if more { libc::MSG_MORE } else { 0 };
            conn.head_sending = true;
            conn.ops += 1;
            let socket = conn.socket;
            let t = self.token(Op::SendHead, c, 0);
            self.ring.send_tx(c as usize, socket, from, flags, t);
            return;
        }
        let Some(body) = conn.body.as_mut() else {
            self.finish_response(c);
            return;
        };
        let Some(ch) = body
            .chunks
            .iter_mut()
            // A chunk fully handed to SEND_ZC only waits for its buffer; one the socket took
            // only part of still goes first (bytes leave in order).
            .find(|ch| ch.state != ChunkState::AwaitNotif || ch.sent < ch.send_len)
        else {
            if body.segments.is_empty() && body.chunks.is_empty() {
                self.finish_response(c);
            }
            return;
        };
        if ch.state != ChunkState::Ready || conn.poll_armed {
            return;
        }
        ch.state = ChunkState::Sending;
        if ch.sent == 0 {
            ch.send_started_ms = self.now_ms;
        }
        let (slot, off, len) = (ch.slot, ch.send_off + ch.sent, ch.send_len - ch.sent);
        let last = body.segments.is_empty() && body.chunks.len() == 1;
        let flags = if last { 0 } else { libc::MSG_MORE };
        // SEND_ZC keeps the buffer until the peer acknowledges it: only for a connection
        // that drains fast; a slow or stalled one gets copy sends and holds nothing.
        let zc = self.zerocopy
            && conn.fast_drain
            && conn.resp_bytes >= ZC_WARMUP_BYTES
            && len as usize >= self.cfg.zerocopy_min_bytes
            && self.zc_held < self.cfg.arena_slots() / ZC_ARENA_SHARE_DIVISOR
            && !body.chunks.iter().any(|c| c.zerocopy);
        let ch = body
            .chunks
            .iter_mut()
            .find(|ch| ch.slot == slot)
            .expect("chunk being sent");
        ch.zerocopy = zc;
        self.zc_held += usize::from(zc);
        self.shard_budget.charge(len as usize);
        conn.ops += 1;
        let socket = conn.socket;
        let t = self.token(Op::SendChunk, c, slot);
        self.ring
            .send_arena(slot, off as usize, len as usize, socket, flags, zc, t);
    }

    /// A chunk became sendable: a small response sends at once; bulk sends wait for the
    /// connection's turn in the ready queue, under the shard's per-tick budget, so one tick
    /// never pushes an unbounded amount of data through the socket layer.
    fn send_soon(&mut self, c: u32) {
        let small = self.conns[c as usize]
            .body
            .as_ref()
            .is_some_and(|b| b.small);
        if small {
            self.try_send(c);
        } else {
            self.ready.push_bulk(c);
        }
    }

    fn on_send_head(&mut self, c: u32, res: i32) {
        self.ring.tx_done(c as usize);
        let conn = &mut self.conns[c as usize];
        conn.ops -= 1;
        conn.head_sending = false;
        if conn.phase != Phase::Open {
            self.maybe_finish_close(c);
            return;
        }
        if res <= 0 {
            self.close(c, CloseReason::Abort);
            return;
        }
        let from = conn.head_from.expect("head send without pending head") + res as usize;
        ShardMetrics::add(&self.metrics.bytes_memory, res as u64);
        self.sent_bytes(c, res as u64);
        let conn = &mut self.conns[c as usize];
        let total = self.ring.tx_len(c as usize);
        conn.head_from = if from < total { Some(from) } else { None };
        conn.deadline_ms = self.now_ms + self.cfg.send_timeout_ms;
        self.try_send(c);
    }

    fn on_send_chunk(&mut self, c: u32, slot: u16, cqe: Completion) {
        let notification = cqe.is_notification();
        let more = cqe.more();
        if notification || !more {
            // The kernel is done with the buffer: a plain send finished, or SEND_ZC's
            // notification (or its failure without one) arrived.
            self.ring.arena_done(slot);
            self.conns[c as usize].ops -= 1;
            let zc_chunk = self.conns[c as usize]
                .body
                .as_mut()
                .and_then(|b| b.chunks.iter_mut().find(|ch| ch.slot == slot))
                .filter(|ch| ch.zerocopy);
            if let Some(ch) = zc_chunk {
                ch.zerocopy = false;
                self.zc_held = self
                    .zc_held
                    .checked_sub(1)
                    .expect("SEND_ZC share count underflow");
            }
        }
        let conn = &mut self.conns[c as usize];
        if conn.phase != Phase::Open {
            if notification || !more {
                self.maybe_finish_close(c);
            }
            return;
        }
        let body = conn.body.as_mut().expect("send completion without a body");
        let i = body
            .chunks
            .iter()
            .position(|ch| ch.slot == slot)
            .expect("send completion for an unknown chunk");
        let ch = &mut body.chunks[i];
        if notification {
            if ch.sent < ch.send_len {
                // The socket was full when SEND_ZC returned short: wait until it drains.
                ch.state = ChunkState::Parked;
                self.park(c);
            } else {
                body.chunks.remove(i);
                self.chunk_finished(c, slot);
                self.send_soon(c);
            }
            return;
        }
        let took = match cqe.result {
            n if n > 0 => n as u32,
            n if -n == libc::EAGAIN => 0,
            _ => {
                if more {
                    ch.state = ChunkState::AwaitNotif;
                    ch.sent = ch.send_len; // nothing more will be sent; wait for the buffer
                }
                self.close(c, CloseReason::Abort);
                return;
            }
        };
        ch.sent += took;
        let whole = ch.sent == ch.send_len;
        let source = ch.source;
        let state = if more {
            ChunkState::AwaitNotif
        } else if whole {
            ChunkState::Ready // removed below
        } else {
            ChunkState::Parked
        };
        ch.state = state;
        if took > 0 {
            let counter = match source {
                Source::Direct => &self.metrics.bytes_direct,
                Source::DontCache => &self.metrics.bytes_dontcache,
                Source::Buffered => &self.metrics.bytes_buffered,
                Source::Memory => &self.metrics.bytes_memory,
            };
            ShardMetrics::add(counter, u64::from(took));
            self.sent_bytes(c, u64::from(took));
            self.conns[c as usize].deadline_ms = self.now_ms + self.cfg.send_timeout_ms;
        }
        self.note_socket_round(c, took, whole);
        if state == ChunkState::Parked {
            self.park(c);
            return;
        }
        if state == ChunkState::Ready {
            let body = self.conns[c as usize].body.as_mut().expect("body");
            let i = body
                .chunks
                .iter()
                .position(|ch| ch.slot == slot)
                .expect("chunk still queued");
            body.chunks.remove(i);
            self.chunk_finished(c, slot);
        }
        self.send_soon(c);
    }

    /// Learns from one send how much the socket takes: a whole send lets the connection read
    /// ahead its full pipeline with full-size reads; a short one (the socket filled up) records
    /// what this writable round took (the read size after a reclaim, `reclaim_from`) and gives
    /// back read-ahead beyond `READ_AHEAD_START_CHUNKS`, so a slow client is never handed more
    /// than it can take.
    fn note_socket_round(&mut self, c: u32, took: u32, whole: bool) {
        let chunk_bytes = self.cfg.chunk_bytes;
        let depth = self.cfg.pipeline_depth;
        let conn = &mut self.conns[c as usize];
        conn.round_bytes += u64::from(took);
        conn.fast_drain = whole;
        let round = conn.round_bytes;
        let Some(body) = conn.body.as_mut() else {
            return;
        };
        if whole {
            body.read_ahead = depth;
            body.read_size_bytes = body.read_size_bytes.saturating_mul(2).min(chunk_bytes);
        } else {
            // What one writable round took: the size of reads once parked chunks are
            // reclaimed (a re-read of what a slow socket could not take wastes disk time).
            conn.round_estimate_bytes = (round as usize).clamp(MIN_READ_BYTES, chunk_bytes);
            if body.read_ahead > READ_AHEAD_START_CHUNKS {
                body.read_ahead = READ_AHEAD_START_CHUNKS;
                self.give_back_chunks(c, READ_AHEAD_START_CHUNKS);
            }
        }
    }

    /// The connection's socket is full: wait for it to drain (one poll per connection; no
    /// buffer is lent to the kernel meanwhile) and list it so its chunks can be reclaimed.
    fn park(&mut self, c: u32) {
        let now = self.now_ms;
        let conn = &mut self.conns[c as usize];
        conn.fast_drain = false;
        if !conn.poll_armed {
            conn.poll_armed = true;
            conn.parked_ms = now;
            conn.ops += 1;
            let socket = conn.socket;
            let t = self.token(Op::PollOut, c, 0);
            self.ring.poll_writable(socket, t);
        }
        ShardMetrics::add(&self.metrics.parked_sends, 1);
        self.list_parked(c);
        self.reclaim_parked();
    }

    /// The socket drained below its low-water mark: parked chunks may send again, and a
    /// connection whose chunks were reclaimed plans fresh reads.
    fn on_poll_out(&mut self, c: u32, res: i32) {
        let conn = &mut self.conns[c as usize];
        conn.ops -= 1;
        conn.poll_armed = false;
        if conn.phase != Phase::Open {
            self.maybe_finish_close(c);
            return;
        }
        if res < 0 && -res != libc::ECANCELED {
            self.close(c, CloseReason::Abort);
            return;
        }
        conn.round_bytes = 0;
        if let Some(body) = conn.body.as_mut() {
            for ch in body.chunks.iter_mut() {
                if ch.state == ChunkState::Parked {
                    ch.state = ChunkState::Ready;
                }
            }
        }
        self.ready.push_bulk(c);
    }

    /// Gives parked chunks (behind full sockets, oldest first) to connections waiting for
    /// the arena; stops when nobody waits.
    fn reclaim_parked(&mut self) {
        while self.arena.waiting() > 0 {
            let Some(c) = self.parked.pop_front() else {
                return;
            };
            self.conns[c as usize].parked_listed = false;
            if self.is_parked(c) {
                self.reclaim_from(c);
            }
        }
    }

    /// Takes every chunk a parked connection holds; its later reads are sized to what its
    /// socket takes per writable round, so the next reclaim wastes little.
    fn reclaim_from(&mut self, c: u32) {
        let freed = self.give_back_chunks(c, 0);
        ShardMetrics::add(&self.metrics.reclaimed_chunks, freed as u64);
        let conn = &mut self.conns[c as usize];
        let estimate = conn.round_estimate_bytes;
        if let Some(body) = conn.body.as_mut() {
            body.read_size_bytes = estimate;
        }
    }

    /// Gives back the chunks of connections parked longer than `PARK_HOLD_MS` (a stalled
    /// client keeps nothing for long even when nobody else asks).
    ///
    /// The whole list is walked (in order): a connection that parked again while still listed
    /// keeps its old place with a newer `parked_ms`, so the list is not sorted by park time.
    fn expire_parked(&mut self) {
        // One pass over the listed connections: one that parked again recently goes to the
        // back, so it cannot shield the ones behind it from expiry.
        for _ in 0..self.parked.len() {
            let Some(c) = self.parked.pop_front() else {
                return;
            };
            let recent = self.now_ms < self.conns[c as usize].parked_ms + PARK_HOLD_MS;
            if self.is_parked(c) && recent {
                self.parked.push_back(c);
                continue;
            }
            self.conns[c as usize].parked_listed = false;
            if self.is_parked(c) {
                self.reclaim_from(c);
            }
        }
    }

    /// Lists a parked connection for reclaim and expiry (once).
    fn list_parked(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if !conn.parked_listed {
            conn.parked_listed = true;
            self.parked.push_back(c);
        }
    }

    fn is_parked(&self, c: u32) -> bool {
        let conn = &self.conns[c as usize];
        conn.phase == Phase::Open && conn.poll_armed
    }

    /// Gives back chunks beyond `keep` that the kernel does not hold (read-ahead not yet sent,
    /// or the unsent rest of a parked chunk), newest first, and rewinds the body so those bytes
    /// are planned again when the client catches up: the disk, not the arena, buffers a slow
    /// client. File bytes are re-read; the unsent rest of a memory chunk (multipart framing,
    /// generated bytes) goes back as a memory segment. A chunk whose response header has not
    /// fully left is kept.
    fn give_back_chunks(&mut self, c: u32, keep: usize) -> usize {
        let conn = &mut self.conns[c as usize];
        let Some(body) = conn.body.as_mut() else {
            return 0;
        };
        let mut freed = [0u16; crate::config::MAX_PIPELINE_DEPTH];
        let mut n_freed = 0;
        while body.chunks.len() > keep && n_freed < crate::config::MAX_PIPELINE_DEPTH {
            let Some(last) = body.chunks.back() else {
                break;
            };
            let ours = matches!(last.state, ChunkState::Ready | ChunkState::Parked);
            let unsent_at = last.send_off + last.sent;
            if !ours || unsent_at < last.read_buf_off {
                break;
            }
            let send_end = last.send_off + last.send_len;
            if last.source == Source::Memory {
                // Each chunk comes from one segment, and segments follow in stream order, so
                // the unsent bytes go in front of whatever is still to plan.
                let rest =
                    self.ring.arena(last.slot)[unsent_at as usize..send_end as usize].to_vec();
                body.segments.push_front(Segment::Mem(rest));
            } else {
                let start = last.read_file_off + u64::from(unsent_at - last.read_buf_off);
                let end = last.read_file_off + u64::from(send_end - last.read_buf_off);
                match body.segments.front_mut() {
                    // The rest of the same file range: extend it back.
                    Some(Segment::File { pos, .. }) if *pos == end => *pos = start,
                    // That range was planned to its end (a part header or nothing follows).
                    _ => body.segments.push_front(Segment::File { pos: start, end }),
                }
            }
            freed[n_freed] = last.slot;
            n_freed += 1;
            body.chunks.pop_back();
        }
        for &slot in &freed[..n_freed] {
            self.release_slot(slot);
        }
        n_freed
    }

    /// A chunk's slot is free again: wake a waiter and let this connection plan more.
    fn chunk_finished(&mut self, c: u32, slot: u16) {
        self.release_slot(slot);
        let conn = &self.conns[c as usize];
        if conn.body.as_ref().is_some_and(|b| !b.segments.is_empty()) {
            self.ready.push_bulk(c);
        }
    }

    /// Returns an arena slot; a waiting connection gets it handed over and is queued.
    fn release_slot(&mut self, slot: u16) {
        if let Some((w, s)) = self.arena.give_back(slot) {
            let conn = &mut self.conns[w as usize];
            assert!(
                conn.handoff_slot.is_none(),
                "second hand-off to a waiting connection"
            );
            if let Some(waited) = conn.end_arena_wait() {
                self.metrics.observe_buffer_wait(waited);
            }
            conn.handoff_slot = Some(s);
            if conn.body.as_ref().is_some_and(|b| b.inline_head) {
                self.ready.push_urgent(w);
            } else {
                self.ready.push_bulk(w);
            }
        }
    }

    fn finish_response(&mut self, c: u32) {
        if let Some(slot) = self.conns[c as usize].handoff_slot.take() {
            self.release_slot(slot);
        }
        let conn = &mut self.conns[c as usize];
        assert!(conn.responding, "finishing a response that was not started");
        if let Some(body) = conn.body.take() {
            assert!(body.chunks.is_empty());
            if let Some(f) = body.file {
                self.files.release(&mut self.ring, f);
            }
        }
        self.response_done(c);
        let conn = &mut self.conns[c as usize];
        if !conn.keep_alive && !conn.peer_closed && conn.status >= 400 {
            self.begin_linger(c);
            return;
        }
        if !conn.keep_alive || conn.peer_closed || self.drain_deadline_ms.is_some() {
            self.close(c, CloseReason::Normal);
            return;
        }
        if conn.rx.is_empty() {
            conn.deadline = Deadline::Idle;
            conn.deadline_ms = self.now_ms + self.cfg.keepalive_timeout_ms;
            self.arm_recv(c);
        } else {
            // A pipelined request is already here.
            conn.deadline = Deadline::Header;
            conn.deadline_ms = self.now_ms + self.cfg.header_timeout_ms;
            self.ready.push_urgent(c);
        }
    }

    /// After an error response on a connection the client may still be writing to (a 414 or
    /// 431 with the rest of the head unread): shut our write side so the client sees the
    /// response and a FIN, then read and drop what it sends (bounded in bytes and time) until
    /// it closes. Closing with unread bytes would send a reset instead, which can destroy the
    /// response in the client's receive buffer (nginx's lingering close).
    fn begin_linger(&mut self, c: u32) {
        let now = self.now_ms;
        let conn = &mut self.conns[c as usize];
        conn.lingering = true;
        conn.rx.clear();
        conn.deadline = Deadline::Linger;
        conn.deadline_ms = now + LINGER_TIMEOUT_MS;
        conn.ops += 1;
        let socket = conn.socket;
        let t = self.token(Op::Shutdown, c, 0);
        self.ring.shutdown_write(socket, t);
        self.arm_recv(c);
    }

    /// Bookkeeping when a response ends (complete or aborted): status counters, access log.
    fn response_done(&mut self, c: u32) {
        let now_us = self.ring.now().as_micros() as u64;
        let conn = &mut self.conns[c as usize];
        conn.responding = false;
        self.metrics.count_request(conn.method, conn.status);
        if let Some(log) = self.access_log.as_mut() {
            log.record(&access_log::Entry {
                request: &conn.log_request,
                status: conn.status,
                bytes: conn.resp_bytes,
                duration_us: now_us.saturating_sub(conn.request_start_us),
                range: &conn.log_range,
                shard: self.index,
                date: self.date.header_value(),
            });
        }
    }

    /// Counts bytes that left for the current response; the first ones mark its first byte.
    fn sent_bytes(&mut self, c: u32, n: u64) {
        let conn = &mut self.conns[c as usize];
        conn.resp_bytes += n;
        if !conn.first_byte_sent {
            conn.first_byte_sent = true;
            let now_us = self.ring.now().as_micros() as u64;
            let ttfb_us = now_us.saturating_sub(conn.request_start_us);
            self.observe_ttfb(ttfb_us);
        }
    }

    // ---- close -----------------------------------------------------------------------------

    fn close(&mut self, c: u32, reason: CloseReason) {
        let conn = &mut self.conns[c as usize];
        if conn.phase != Phase::Open {
            return;
        }
        conn.phase = Phase::Closing;
        conn.close_reason = reason;
        let counter = match reason {
            CloseReason::Normal | CloseReason::Drain => &self.metrics.closed_normal,
            CloseReason::Timeout => &self.metrics.closed_timeout,
            CloseReason::ProtocolError => &self.metrics.closed_error,
            CloseReason::Abort => &self.metrics.closed_abort,
        };
        ShardMetrics::add(counter, 1);
        self.ready.remove(c);
        if let Some(waited) = conn.end_arena_wait() {
            self.metrics.observe_buffer_wait(waited);
            self.arena.forget(c);
        }
        if let Some(slot) = conn.handoff_slot.take() {
            self.release_slot(slot);
        }
        let conn = &mut self.conns[c as usize];
        if conn.ops > 0 && !conn.cancel_sent {
            conn.cancel_sent = true;
            conn.ops += 1;
            let socket = conn.socket;
            let t = self.token(Op::Cancel, c, 0);
            self.ring.cancel_socket(socket, t);
        }
        self.maybe_finish_close(c);
    }

    fn maybe_finish_close(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.phase != Phase::Closing || conn.ops > 0 || conn.close_sent {
            return;
        }
        // Nothing is in flight: every buffer is ours again.
        if let Some(body) = conn.body.take() {
            for ch in &body.chunks {
                self.release_slot(ch.slot);
            }
            if let Some(f) = body.file {
                self.files.release(&mut self.ring, f);
            }
        }
        if self.conns[c as usize].responding {
            self.response_done(c);
        }
        let conn = &mut self.conns[c as usize];
        conn.close_sent = true;
        conn.ops += 1;
        if conn.rx.capacity() > 2 * RECV_BUFFER_BYTES {
            conn.rx = Vec::new();
        }
        self.ring.tx_release(c as usize);
        let socket = conn.socket;
        let t = self.token(Op::Close, c, 0);
        self.ring.close_fixed(socket, t);
    }

    fn on_close(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        conn.ops -= 1;
        assert_eq!(conn.ops, 0, "operations in flight after close");
        conn.phase = Phase::Free;
        conn.generation = conn.generation.wrapping_add(1);
        self.free_conns.push(c);
        self.open_conns -= 1;
        self.socket_slot_freed();
    }

    /// A fixed socket slot was released: an accept backing off for lack of slots may retry now
    /// instead of sleeping out its timer (the back-off only guards against a busy loop).
    fn socket_slot_freed(&mut self) {
        self.accept_retry_ms = 0;
    }

    // ---- timers, drain ---------------------------------------------------------------------

    fn sweep_timers(&mut self) {
        self.expire_parked();
        let now = self.now_ms;
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.phase == Phase::Open
                && conn.deadline != Deadline::None
                && now >= conn.deadline_ms
            {
                // A lingering close that runs out of time is still a normal end.
                let reason = if conn.deadline == Deadline::Linger {
                    CloseReason::Normal
                } else {
                    CloseReason::Timeout
                };
                self.close(c as u32, reason);
                continue;
            }
            // A SEND_ZC buffer the peer is slow to acknowledge gives no completion to learn
            // from: check here that the read-ahead behind it is given back.
            let stuck = conn.body.as_ref().is_some_and(|b| {
                b.read_ahead > READ_AHEAD_START_CHUNKS
                    && b.chunks.iter().any(|ch| {
                        ch.state == ChunkState::AwaitNotif
                            && now.saturating_sub(ch.send_started_ms) > READ_AHEAD_FAST_SEND_MS
                    })
            });
            if conn.phase == Phase::Open && stuck {
                if let Some(b) = self.conns[c].body.as_mut() {
                    b.read_ahead = READ_AHEAD_START_CHUNKS;
                }
                self.give_back_chunks(c as u32, READ_AHEAD_START_CHUNKS);
            }
        }
    }

    fn begin_drain(&mut self) {
        self.drain_deadline_ms = Some(self.now_ms + self.cfg.drain_timeout_ms);
        tracing::info!(shard = self.index, "draining: no new connections");
        if self.accept_armed {
            let target = Token::new(Op::Accept, 0, 0, 0).encode();
            let t = Token::new(Op::CancelAccept, 0, 0, 0).encode();
            self.ring.cancel_token(target, t);
        }
        // Close the listening socket: connections still in its backlog are reset and new ones
        // refused, instead of waiting unanswered until the process exits. An accept still in
        // flight holds its own reference to the socket until the cancel above completes.
        self.listener = None;
        self.ring_accepts = false;
        for c in 0..self.conns.len() as u32 {
            let conn = &mut self.conns[c as usize];
            if conn.phase == Phase::Open {
                if conn.responding {
                    conn.keep_alive = false;
                } else {
                    self.close(c, CloseReason::Drain);
                }
            }
        }
    }

    fn close_all(&mut self, reason: CloseReason) {
        for c in 0..self.conns.len() as u32 {
            self.close(c, reason);
        }
    }

    // ---- dispatch --------------------------------------------------------------------------

    fn dispatch(&mut self, cqe: Completion) {
        let Some(t) = Token::decode(cqe.user_data) else {
            ShardMetrics::add(&self.metrics.stray_completions, 1);
            return;
        };
        match t.op {
            Op::Accept => return self.on_accept(cqe),
            Op::OverflowClose => return self.socket_slot_freed(),
            Op::Overflow | Op::CancelAccept => return,
            Op::LogWrite => {
                if let Some(log) = self.access_log.as_mut() {
                    log.on_write_done(&mut self.ring, cqe.result);
                }
                return;
            }
            _ => {}
        }
        let c = t.slot;
        let live = self
            .conns
            .get(c as usize)
            .is_some_and(|conn| conn.generation == t.generation && conn.phase != Phase::Free);
        // Slots are freed only when no operation is in flight, so a mismatch is a bug.
        assert!(live, "completion {t:?} for a free or reused slot");
        match t.op {
            Op::Recv => self.on_recv(c, cqe),
            Op::SendHead => self.on_send_head(c, cqe.result),
            Op::Read => self.on_read(c, t.aux, cqe.result),
            Op::SendChunk => self.on_send_chunk(c, t.aux, cqe),
            Op::Cancel => {
                self.conns[c as usize].ops -= 1;
                self.maybe_finish_close(c);
            }
            Op::PollOut => self.on_poll_out(c, cqe.result),
            Op::Shutdown => {
                self.conns[c as usize].ops -= 1;
                self.maybe_finish_close(c);
            }
            Op::Close => self.on_close(c),
            Op::Accept | Op::Overflow | Op::OverflowClose | Op::CancelAccept | Op::LogWrite => {
                unreachable!()
            }
        }
    }
}

/// Bytes a file read may ask for: the connection's estimate of what its socket takes,
/// rounded up to the read alignment, between `MIN_READ_BYTES` and a whole chunk.
fn read_cap_bytes(estimate: usize, align: u64, chunk_bytes: usize) -> usize {
    let align = (align as usize).max(1);
    let want = estimate.clamp(MIN_READ_BYTES, chunk_bytes);
    let cap = want.div_ceil(align) * align;
    cap.min(chunk_bytes)
}

/// How long a shard retries building its ring while the kernel says ENOMEM: io_uring gives
/// back a closed ring's locked pages 100-500 ms after the close (measured), so a restart right
/// after a stop, under a tight RLIMIT_MEMLOCK, would otherwise fail.
pub const RING_ENOMEM_RETRY_MS: u64 = 2000;
/// Pause between two such tries.
const RING_ENOMEM_PAUSE_MS: u64 = 100;

fn new_ring_retrying(cfg: &RingConfig) -> std::io::Result<Ring> {
    let deadline = Instant::now() + Duration::from_millis(RING_ENOMEM_RETRY_MS);
    loop {
        match Ring::new(cfg) {
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!(
                            "creating the io_uring and registering its buffers failed: {e}; \
                             the locked memory it needs exceeds RLIMIT_MEMLOCK (raise it with \
                             `ulimit -l`, LimitMEMLOCK= in the unit, or lower arena_bytes)"
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(RING_ENOMEM_PAUSE_MS));
            }
            other => return other,
        }
    }
}

fn unix_now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
