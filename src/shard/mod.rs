//! A shard: one pinned thread, one io_uring, one listener, and everything its connections
//! touch. Shards share nothing mutable; each only writes its own metrics.
//!
//! One loop tick: submit and wait (bounded by the timer interval), drain completions into a
//! bounded batch, dispatch each by its token, answer new connections and requests in up to
//! `URGENT_ROUNDS_MAX` short enters of their own, run the ready queue round-robin under the
//! per-tick budget, sweep timers.

mod accept;
pub mod access_log;
pub mod buffers;
mod cache_glue;
pub mod conn;
pub mod files;
mod handshakes;
pub mod header_buffers;
pub mod intrusive;
pub mod machine;
mod pass_glue;
mod read_failover;
mod reload;
mod respond;
#[allow(unsafe_code)]
pub mod ring;
#[allow(unsafe_code)]
pub mod ring_sys;
pub mod sched;
mod scrub;
#[cfg(test)]
mod sim;
mod state;
pub mod timer_wheel;
mod tls_glue;
// The ring's interface lives below the shard (`crate::ring_api`), where the fill uses it too.
pub use crate::ring_api::{ops as ring_ops, slots, token};

use std::net::TcpListener;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::proxy_protocol::Outcome as ProxyOutcome;
use crate::config::{Config, ZeroCopy};
use crate::http::date::DateCache;
use crate::metrics::ShardMetrics;
use crate::signing::Refusal;
use buffers::ArenaSlots;
use conn::{CloseReason, Source};
use files::{FileCache, FileCacheConfig};
use intrusive::ListSet;
use machine::{Action, Actions, ConnLife, ConnMachine, Counter, Ctx, GiveBack, Limits};
use ring::{Completion, Ring, RingConfig};
use ring_ops::RingOps;
use sched::{ReadyQueue, TickBudget, Turn};
use slots::{ArenaSlot, ConnSlot, FileSlot, SocketSlot};
use timer_wheel::{TimerWheel, TIMER_GRANULARITY_MS, TIMER_WHEEL_BUCKETS};
use token::{Op, Token};

/// Submission queue entries of a shard's ring.
pub const SQ_ENTRIES: u32 = 4096;
/// Completion queue entries (several times the SQ: multishot accepts and receives).
pub const CQ_ENTRIES: u32 = 16384;
/// How often timers are checked, and the longest a shard sleeps in the kernel.
pub const TIMER_SWEEP_MS: u64 = 100;
/// Window over which a shard measures its egress rate (`egress_bytes_per_s`).
pub const EGRESS_RATE_WINDOW_MS: u64 = 1000;
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
/// Most extra enters a tick makes for new connections and requests (`answer_new_requests`):
/// accept -> receive -> response is two steps.
pub const URGENT_ROUNDS_MAX: usize = 2;
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
/// Action buffers allocated at start-up (nesting: an action of one machine may drive another's
/// event, e.g. a released slot handed to a waiting connection).
pub const ACTION_POOL_BUFFERS: usize = 8;
/// Body queue sets allocated at start-up (responses in progress at once before the pool grows).
pub const BODY_POOL_BUFFERS: usize = 256;
/// Completions a wait tries to gather (within `wait_batch_usec`) before the shard wakes.
pub const WAIT_BATCH_COMPLETIONS: usize = 32;
/// Most completions handled per batch before the ready queue runs.
pub const COMPLETION_BATCH_MAX: usize = 4096;
/// Fixed-file slots beyond the connection cap, so over-cap clients get a quick 503.
pub const OVERFLOW_SOCKET_SLOTS: u32 = 64;
/// Most operations one connection has in flight besides its body chunks: a receive, a head
/// send, a TLS send, a poll, a cancel, a shutdown, a close and a peer lookup
/// (`ConnMachine::in_flight`).
pub const CONN_OPS_BESIDES_CHUNKS: usize = 8;
/// Most operations one origin connection, fetching or idle in the pool, has in flight (connect
/// poll, send, receive, disk write, sync, cancel, close), with room to spare.
pub const ORIGIN_CONN_OPS_MAX: usize = 8;
/// Shard-wide operations: two multishot accepts and their cancels, an access-log write, the
/// fill's wake-up poll and the scrub's read (7), with room to spare.
pub const SHARD_OPS_MAX: usize = 8;
/// Back-off after accept fails for lack of descriptors (EMFILE/ENFILE), instead of spinning.
pub const ACCEPT_BACKOFF_MS: u64 = 100;
/// Shortest interval between two "accept failed" log lines.
pub const ACCEPT_WARN_INTERVAL_MS: u64 = 1000;
/// Capacity an idle TLS connection's header buffer is cut back to (it carried a handshake
/// flight of a few KiB; a response head is ~300 bytes).
pub const IDLE_HEAD_BUFFER_BYTES: usize = 512;
/// Bytes per provided receive buffer.
pub const RECV_BUFFER_BYTES: usize = 4096;
/// Canned answer to a connection over the per-shard cap on the TLS port: a plaintext fatal
/// alert (internal_error), which a TLS client understands where it could not read a 503.
pub static OVER_CAP_TLS_ALERT: &[u8] = &[21, 3, 3, 0, 2, 2, 80];
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
    /// This shard's TLS listener, when `tls_listen` is set (its own reuseport group).
    pub tls_listener: Option<TcpListener>,
    /// Set by the main thread on SIGTERM/SIGINT.
    pub shutdown: Arc<AtomicBool>,
    /// This shard's counters.
    pub metrics: Arc<ShardMetrics>,
    /// Bumped by SIGUSR1: reopen the access log.
    pub log_epoch: Arc<AtomicU64>,
    /// Leaving rotation (SIGTERM) and reloaded configuration (SIGHUP).
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
    /// The pull-through cache every shard shares (with `[[origin]]`).
    pub edge: Option<crate::fill::edge::SharedEdge>,
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
    conns: Vec<ConnMachine>,
    free_conns: Vec<ConnSlot>,
    ready: ReadyQueue,
    arena: ArenaSlots,
    files: FileCache,
    /// The listeners and their accepts (`accept.rs`).
    accept: state::Accepting,
    /// TLS handshakes waiting for their turn, their time and their memory (`handshakes.rs`).
    handshaking: state::Handshaking,
    /// Who may ask for what: trusted proxies, signed URLs, clients' connection counts.
    policy: state::Policy,
    /// The edge's egress cap as this shard sees it.
    egress: state::Egress,
    /// The tick's clock and the HTTP date.
    clock: state::Clock,
    /// Buffers allocated at start and reused: completions, actions, body queues.
    pools: state::Pools,
    /// Deadlines and the rate limit's wake-ups.
    timers: state::Timers,
    /// Parked connections and SEND_ZC's share of the arena.
    sends: state::Sends,
    recv_retry: Vec<ConnSlot>,
    /// Shutdown, drain, reloads and log reopening.
    life: state::Life,
    metrics: Arc<ShardMetrics>,
    access_log: Option<access_log::AccessLog>,
    /// The configuration's limits as the machine sees them, built at start and at a reload
    /// (`build_limits`), not per event; the zero-copy warm-up is `ZC_WARMUP_BYTES` (the
    /// simulator, whose files are smaller, lowers it).
    limits: Limits,
    open_conns: usize,
    /// Bytes of bulk work (reads planned, chunk sends) the shard may still add this tick.
    shard_budget: TickBudget,
    /// The pull-through cache's side on this shard (`cache_glue.rs`, `scrub.rs`).
    cache: state::CacheSide,
}

/// The most operations the shard can have in flight at once, from what its config fixes at
/// start-up (and the limits a reload may raise the rest to): the bound of the ring's unqueued
/// FIFO, since every entry waiting there is one of them.
fn unqueued_bound(cfg: &Config) -> usize {
    let sockets = cfg.max_connections_per_shard + OVERFLOW_SOCKET_SLOTS as usize;
    let per_conn = CONN_OPS_BESIDES_CHUNKS + crate::config::MAX_PIPELINE_DEPTH;
    // Fetching plus idle pooled connections, for as many origins as a reload may add.
    let origin_conns = crate::config::MAX_ORIGINS * crate::fill::route::MAX_ORIGIN_FETCHES * 2;
    sockets * per_conn
        + origin_conns * ORIGIN_CONN_OPS_MAX
        + cfg.arena_slots()
        + 2 * cfg.open_file_cache_entries
        + SHARD_OPS_MAX
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
        unqueued_max_entries: unqueued_bound(cfg),
    }
}

impl Shard<Ring> {
    fn new(p: ShardParams) -> std::io::Result<Shard<Ring>> {
        let ring = new_ring_retrying(&ring_config(&p.config))?;
        let loopback = p.listener.local_addr()?.ip().is_loopback();
        let edge = match &p.edge {
            Some(shared) => Some(crate::fill::edge::EdgeCache::open(
                shared,
                p.index,
                &p.config.origin,
                p.config.chunk_bytes,
                p.config.cache_wait_timeout_ms,
            )?),
            None => None,
        };
        let mut shard = Shard::with_ring(
            p.index,
            p.config,
            ring,
            Some(p.listener),
            p.tls_listener,
            loopback,
            p.metrics,
            p.shutdown,
            p.log_epoch,
            p.lifecycle,
        )?;
        shard.cache.edge = edge;
        shard.arm_fill_wake();
        Ok(shard)
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
        tls_listener: Option<TcpListener>,
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
        let egress = lifecycle.egress();
        let egress_clock_offset_us = ring.clock_offset_us(egress.epoch());
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
            conns: (0..max_conns).map(|_| ConnMachine::new()).collect(),
            free_conns: (0..max_conns as u32).rev().map(ConnSlot::new).collect(),
            ready: ReadyQueue::new(max_conns),
            arena: ArenaSlots::new(arena_slots as u16, max_conns),
            files,
            accept: state::Accepting {
                ring_accepts: listener.is_none(),
                listener,
                tls_listener,
                accept_armed: false,
                tls_accept_armed: false,
                accept_retry_ms: 0,
                accept_warned_ms: 0,
                peer_warned: false,
                accepted_in_round: false,
            },
            handshaking: state::Handshaking {
                tls: lifecycle.tls(),
                handshakes: ListSet::new(max_conns),
                hs_credit_us: 0,
                hs_earned_at: Duration::ZERO,
                handshake_bytes: 0,
                handshake_counted: vec![0; max_conns],
            },
            policy: state::Policy {
                trusted: crate::client::TrustedProxies::parse(&cfg.trusted_proxies)
                    .expect("validated at load"),
                signing: lifecycle.signing(),
                path_scratch: crate::fs::resolve::ResolveScratch::with_capacity(
                    crate::http::request::MAX_REQUEST_LINE_BYTES,
                ),
                client_counts: lifecycle.client_counts(),
            },
            egress: state::Egress {
                clock_offset_us: egress_clock_offset_us,
                bucket: egress,
                window: (0, 0),
            },
            clock: state::Clock {
                now_ms: 0,
                now_us: 0,
                date: DateCache::new(now),
                date_read_ms: u64::MAX,
            },
            pools: state::Pools {
                batch: Vec::with_capacity(COMPLETION_BATCH_MAX),
                body_pool: (0..max_conns.min(BODY_POOL_BUFFERS))
                    .map(|_| {
                        conn::BodyBuffers::with_capacity(2 * cfg.max_ranges + 1, cfg.pipeline_depth)
                    })
                    .collect(),
                action_pool: (0..ACTION_POOL_BUFFERS)
                    .map(|_| Vec::with_capacity(machine::ACTIONS_PER_EVENT_MAX))
                    .collect(),
            },
            timers: state::Timers {
                deadlines: TimerWheel::new(max_conns, TIMER_GRANULARITY_MS, TIMER_WHEEL_BUCKETS),
                limit_waits: TimerWheel::new(max_conns, TIMER_GRANULARITY_MS, TIMER_WHEEL_BUCKETS),
                last_sweep_ms: 0,
            },
            sends: state::Sends {
                parked: ListSet::new(max_conns),
                zc_conns: ListSet::new(max_conns),
                zc_held: 0,
                zerocopy,
            },
            recv_retry: Vec::with_capacity(max_conns),
            life: state::Life {
                shutdown,
                drain_deadline_ms: None,
                lifecycle: reload::LifecycleView::new(lifecycle),
                log_epoch,
            },
            metrics,
            access_log,
            limits: build_limits(&cfg, zerocopy, ZC_WARMUP_BYTES),
            open_conns: 0,
            shard_budget: TickBudget::new(cfg.shard_tick_budget_bytes),
            cache: state::CacheSide {
                edge: None,
                pulls: cache_glue::Pulls {
                    read_started_us: vec![0; arena_slots],
                    cached_reads: Vec::with_capacity(arena_slots),
                    ..Default::default()
                },
                scrub: scrub::Scrub::default(),
            },
            cfg,
        })
    }

    fn run_loop(&mut self) -> std::io::Result<()> {
        tracing::debug!(
            shard = self.index,
            deferred_taskrun = self.ring.deferred_taskrun(),
            recv_incremental = self.ring.recv_incremental(),
            zerocopy = self.sends.zerocopy,
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
            self.read_clock();
            self.apply_reload();
            if self.life.shutdown.load(Ordering::Relaxed) && self.life.drain_deadline_ms.is_none() {
                self.begin_drain();
            }
            if let Some(deadline) = self.life.drain_deadline_ms {
                let log_busy = self.access_log.as_ref().is_some_and(|l| l.busy());
                let accepting = self.accept.accept_armed || self.accept.tls_accept_armed;
                if self.open_conns == 0 && !accepting && !log_busy && !self.cache.scrub.busy() {
                    return Ok(false);
                }
                if self.clock.now_ms >= deadline {
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
                // Urgent turns first; the clock is read only when a bulk turn is next.
                let next = match self.ready.next_conn(false) {
                    Some(c) => Some(c),
                    None => {
                        let bulk_allowed = self.shard_budget.has_room()
                            && self.ring.now().saturating_sub(tick_started) < tick_budget_time;
                        self.ready.next_conn(bulk_allowed)
                    }
                };
                let Some(c) = next else {
                    break;
                };
                if self.visit(c, tick_budget) == Turn::MoreWork {
                    self.ready.push_bulk(c);
                }
            }
            self.run_handshakes();
            self.run_fill();
            self.run_scrub();

            let handshake_wait = self.handshake_wait();
            let busy = !self.ready.is_empty()
                || self.cache.scrub.checking()
                || !self.recv_retry.is_empty()
                || !self.cache.pulls.relay_ready.is_empty()
                || !self.cache.pulls.relay_cancels.is_empty()
                || handshake_wait == Some(Duration::ZERO);
            if busy {
                self.ring.submit_and_wait(0, None)?;
            } else {
                let sweep = Duration::from_millis(TIMER_SWEEP_MS);
                let mut timeout = handshake_wait.map_or(sweep, |w| w.min(sweep));
                let scrub_due = self.cache.scrub.due_ms(self.cfg.cache_scrub_bytes_per_s);
                for at_ms in [
                    self.timers.limit_waits.next_deadline_ms(),
                    self.fill_due_ms(),
                    scrub_due,
                ]
                .into_iter()
                .flatten()
                {
                    let wait_ms = at_ms.saturating_sub(self.clock.now_ms).max(1);
                    timeout = timeout.min(Duration::from_millis(wait_ms));
                }
                let batch = (self.cfg.wait_batch_usec > 0).then(|| {
                    (
                        WAIT_BATCH_COMPLETIONS,
                        Duration::from_micros(self.cfg.wait_batch_usec),
                    )
                });
                self.ring.submit_and_wait_batched(timeout, batch)?;
            }
            // Only this reap's accepts (and later rounds') count for the urgent rounds.
            self.accept.accepted_in_round = false;
            self.reap();
            self.answer_new_requests(tick_budget)?;
            self.read_clock();
            self.wake_limited();
            if self.clock.now_ms >= self.timers.last_sweep_ms + TIMER_SWEEP_MS {
                self.timers.last_sweep_ms = self.clock.now_ms;
                self.sweep_timers();
            }
            if let Some(log) = self.access_log.as_mut() {
                log.reopen_if(self.life.log_epoch.load(Ordering::Relaxed));
                let t = Token::shard(Op::LogWrite).encode();
                let force = self.life.drain_deadline_ms.is_some();
                log.maybe_flush(&mut self.ring, t, self.clock.now_ms, force);
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
            ShardMetrics::set(
                &self.metrics.file_cache_negative_hits,
                self.files.negative_hits,
            );
            ShardMetrics::set(
                &self.metrics.tls_pending_handshakes,
                self.pending_handshakes() as u64,
            );
            ShardMetrics::set(
                &self.metrics.tls_handshake_bytes,
                self.handshaking.handshake_bytes as u64,
            );
        }
        Ok(true)
    }

    /// Takes every completion the ring holds, in bounded batches, and dispatches each.
    fn reap(&mut self) {
        loop {
            self.pools.batch.clear();
            let mut batch = std::mem::take(&mut self.pools.batch);
            self.ring
                .drain_completions(&mut batch, COMPLETION_BATCH_MAX);
            let n = batch.len();
            for cqe in &batch {
                self.dispatch(*cqe);
            }
            ShardMetrics::add(&self.metrics.ring_cqes, n as u64);
            self.pools.batch = batch;
            if n < COMPLETION_BATCH_MAX {
                break;
            }
        }
    }

    /// Connections accepted and requests parsed in the completions just reaped take their
    /// next step now, in a short enter of their own (only their entries and what the
    /// completions queued), instead of after the next tick's bulk work: a new connection's
    /// receive completes inline, then its response goes out, at most `URGENT_ROUNDS_MAX`
    /// extra enters a tick. Bulk connections are not visited here.
    fn answer_new_requests(&mut self, tick_budget: usize) -> std::io::Result<()> {
        for _ in 0..URGENT_ROUNDS_MAX {
            let accepted = std::mem::take(&mut self.accept.accepted_in_round);
            let handshakes = self.handshake_wait() == Some(Duration::ZERO);
            if !accepted && !self.ready.has_urgent() && !handshakes {
                break;
            }
            // A ClientHello or Finished that just arrived is answered in this round too.
            self.run_handshakes();
            while let Some(c) = self.ready.next_conn(false) {
                if self.visit(c, tick_budget) == Turn::MoreWork {
                    self.ready.push_bulk(c);
                }
            }
            // Only what these entries complete inline is reaped now: the receives other
            // connections' bytes queued (a trickle's) wait for the loop's next wait, so a new
            // request's answer does not wait behind them.
            self.ring.submit_only()?;
            self.reap();
        }
        Ok(())
    }

    /// The egress bucket's clock, µs, read through this ring's.
    fn egress_now_us(&self) -> u64 {
        self.clock.now_us + self.egress.clock_offset_us
    }

    /// Reads the shard clock (`now_ms`, `now_us`) and, when a new ms began, the wall clock
    /// for the Date header.
    fn read_clock(&mut self) {
        let now = self.ring.now();
        self.clock.now_us = now.as_micros() as u64;
        self.clock.now_ms = now.as_millis() as u64;
        if self.clock.now_ms != self.clock.date_read_ms {
            self.clock.date_read_ms = self.clock.now_ms;
            self.clock.date.refresh(unix_now_secs());
        }
    }

    /// The moment and shard-wide facts a machine event is judged by.
    fn cx(&self) -> Ctx {
        Ctx {
            now_ms: self.clock.now_ms,
            now_us: self.clock.now_us,
            draining: self.life.drain_deadline_ms.is_some(),
            zc_room: self.sends.zc_held < self.cfg.arena_slots() / ZC_ARENA_SHARE_DIVISOR,
            handshake_room_bytes: self
                .cfg
                .tls_handshake_budget_bytes
                .saturating_sub(self.handshaking.handshake_bytes),
            limits: self.limits,
            egress_now_us: self.egress_now_us(),
        }
    }

    fn metrics_requests(&self) -> u64 {
        self.ring.sqes_pushed()
    }

    /// `c` with its current generation, as the fill glue's tables key it.
    fn conn_ref(&self, c: ConnSlot) -> cache_glue::ConnRef {
        cache_glue::ConnRef::new(c, self.conns[c.index()].generation())
    }

    fn token(&self, op: Op, c: ConnSlot) -> u64 {
        Token::conn(op, c, self.conns[c.index()].generation()).encode()
    }

    fn chunk_token(&self, op: Op, c: ConnSlot, slot: ArenaSlot) -> u64 {
        Token::chunk(op, c, self.conns[c.index()].generation(), slot).encode()
    }

    // ---- the driver: machine events in, actions out ----------------------------------------

    /// An action buffer from the pool (allocated at start-up; the pool only grows if actions
    /// nest deeper than it was sized for).
    fn take_actions(&mut self) -> Actions {
        self.pools
            .action_pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(machine::ACTIONS_PER_EVENT_MAX))
    }

    /// Carries out connection `c`'s actions in order (an action may drive another machine,
    /// whose actions run before the next one here), then returns the buffer to the pool.
    fn run_actions(&mut self, c: ConnSlot, mut out: Actions) {
        for &action in &out {
            self.execute(c, action);
        }
        // The ring's unqueued FIFO is sized from this bound (unqueued_bound).
        debug_assert!(
            self.conns[c.index()].in_flight()
                <= CONN_OPS_BESIDES_CHUNKS + crate::config::MAX_PIPELINE_DEPTH,
            "a connection has more operations in flight than unqueued_bound counts"
        );
        out.clear();
        self.pools.action_pool.push(out);
        self.sync_handshake_bytes(c);
        if let Some(spare) = self.conns[c.index()].take_spare() {
            self.pools.body_pool.push(spare);
        }
        self.sync_timer(c);
    }

    /// Brings `handshake_bytes` up to date with what connection `c` holds now (every change to
    /// a connection's TLS buffers comes from a machine call, and every one ends here).
    fn sync_handshake_bytes(&mut self, c: ConnSlot) {
        let now = self.conns[c.index()]
            .tls()
            .map_or(0, |t| t.handshake_bytes());
        let before = std::mem::replace(&mut self.handshaking.handshake_counted[c.index()], now);
        self.handshaking.handshake_bytes = self.handshaking.handshake_bytes - before + now;
    }

    /// Mirrors connection `c`'s deadline into the timer wheel (O(1); a no-op when unchanged).
    fn sync_timer(&mut self, c: ConnSlot) {
        let m = &self.conns[c.index()];
        let want = m.wants_timer().then_some(m.deadline_ms());
        if self.timers.deadlines.deadline(c.raw()) != want {
            match want {
                Some(at_ms) => self.timers.deadlines.arm(c.raw(), at_ms),
                None => self.timers.deadlines.cancel(c.raw()),
            }
        }
    }

    /// Gives connection `c`'s machine one event (`f`) and carries out what it asks for.
    fn drive<T>(
        &mut self,
        c: ConnSlot,
        f: impl FnOnce(&mut ConnMachine, &Ctx, &mut Actions) -> T,
    ) -> T {
        let cx = self.cx();
        let mut out = self.take_actions();
        let result = f(&mut self.conns[c.index()], &cx, &mut out);
        self.run_actions(c, out);
        result
    }

    /// One action of connection `c`'s machine.
    fn execute(&mut self, c: ConnSlot, action: Action) {
        let socket = self.conns[c.index()].socket();
        match action {
            Action::Recv => {
                let t = self.token(Op::Recv, c);
                let multishot = self.conns[c.index()].recv_multishot();
                self.ring.recv(socket, t, multishot);
            }
            Action::CancelRecv => {
                let target = self.token(Op::Recv, c);
                let t = self.token(Op::CancelRecv, c);
                self.ring.cancel_token(target, t);
            }
            Action::RetryRecv => self.recv_retry.push(c),
            Action::SendHead { from, more } => {
                let flags = if more { libc::MSG_MORE } else { 0 };
                let t = self.token(Op::SendHead, c);
                self.ring.send_tx(c, socket, from, flags, t);
            }
            Action::Read {
                slot,
                buf_off,
                len,
                file_fixed,
                file_off,
                rw_flags,
            } => {
                if let Some(relay) = self
                    .cache
                    .pulls
                    .relays
                    .get_mut(self.conn_ref(c))
                    .filter(|r| file_off >= r.from)
                {
                    // A pass-through: the bytes come from its origin fetch, not a disk.
                    relay.read(slot, buf_off, len, file_off);
                    self.cache.pulls.relay_ready.push(c);
                } else {
                    self.read_submitted(c, slot);
                    let t = self.chunk_token(Op::Read, c, slot);
                    self.ring
                        .read_fixed(slot, buf_off, len, file_fixed, file_off, rw_flags, t);
                }
            }
            Action::Send {
                slot,
                off,
                len,
                more,
                zerocopy,
            } => {
                self.shard_budget.charge(len);
                let flags = if more { libc::MSG_MORE } else { 0 };
                let t = self.chunk_token(Op::SendChunk, c, slot);
                self.ring
                    .send_arena(slot, off, len, socket, flags, zerocopy, t);
            }
            Action::CopyHeadToSlot { slot } => {
                self.ring.copy_tx_to_arena(c, slot);
            }
            Action::CopyFraming {
                slot,
                from,
                len,
                to,
            } => {
                let body = self.conns[c.index()]
                    .body()
                    .expect("framing without a body");
                self.ring.arena_mut(slot)[to..to + len]
                    .copy_from_slice(&body.framing[from..from + len]);
            }
            Action::ZeroFill { slot, len } => self.ring.arena_mut(slot)[..len].fill(0),
            Action::ClientKnown => self.count_client(c),
            Action::LimitWait { at_ms } => self.timers.limit_waits.arm(c.raw(), at_ms),
            Action::EgressRefund(bytes) => {
                let rate = self.cfg.egress_limit_bytes_per_s;
                if rate > 0 {
                    let now_us = self.egress_now_us();
                    self.egress.bucket.refund(bytes, rate, now_us);
                }
            }
            Action::GetPeer => {
                let t = self.token(Op::PeerName, c);
                let tls = self.conns[c.index()].tls().is_some();
                let len = self.peer_sockaddr_bytes(tls);
                self.ring.get_peer(c, socket, len, t);
            }
            Action::PollWritable => {
                let t = self.token(Op::PollOut, c);
                self.ring.poll_writable(socket, t);
            }
            Action::ShutdownWrite => {
                let t = self.token(Op::Shutdown, c);
                self.ring.shutdown_write(socket, t);
            }
            Action::CancelAll => {
                if self.cache.pulls.relays.contains(self.conn_ref(c)) {
                    self.cache.pulls.relay_cancels.push(c);
                }
                let t = self.token(Op::Cancel, c);
                self.ring.cancel_socket(socket, t);
            }
            Action::CloseSocket => {
                let t = self.token(Op::Close, c);
                self.ring.close_fixed(socket, t);
            }
            Action::ReleaseHeadBuffer => self.ring.tx_release(c),
            Action::ShrinkHeadBuffer => self.ring.tx_mut(c).shrink_to(IDLE_HEAD_BUFFER_BYTES),
            Action::ReleaseSlot(slot) => self.release_slot(slot),
            Action::ReleaseFile(f) => self.files.release(&mut self.ring, f),
            Action::DemoteFile(f) => self.files.demote_to_buffered(f),
            Action::AwaitBlock { file_offset } => self.fill_await_block(c, file_offset),
            Action::QueueUrgent => self.ready.push_urgent(c),
            Action::QueueBulk => self.ready.push_bulk(c),
            Action::Unqueue => self.ready.remove(c),
            Action::ListParked => {
                if self.sends.parked.list_of(c.raw()).is_none() {
                    self.sends.parked.push_back(0, c.raw());
                }
            }
            Action::Unlist => {
                self.sends.parked.remove(c.raw());
            }
            Action::Reclaim => self.reclaim_parked(),
            Action::WaitArena(demand) => self.arena.wait(c, demand),
            Action::LeaveArenaQueue => self.arena.forget(c),
            Action::ZcTaken => {
                self.sends.zc_held += 1;
                if self.sends.zc_conns.list_of(c.raw()).is_none() {
                    self.sends.zc_conns.push_back(0, c.raw());
                }
            }
            Action::ZcReleased => {
                self.sends.zc_held = self
                    .sends
                    .zc_held
                    .checked_sub(1)
                    .expect("SEND_ZC share count underflow");
                self.sends.zc_conns.remove(c.raw());
            }
            Action::QueueHandshake
            | Action::LeaveHandshakeQueue
            | Action::SendTls { .. }
            | Action::Seal { .. } => self.execute_tls(c, socket, action),
            Action::HandshakeTime(us) => self.metrics.tls_handshake_time.observe(us),
            Action::Count(counter, n) => self.count(counter, n),
            Action::Ttfb(us) => self.metrics.ttfb.observe(us),
            Action::BufferWaited(us) => self.metrics.observe_buffer_wait(Duration::from_micros(us)),
            Action::ResponseDone { status, bytes } => self.response_done(c, status, bytes),
        }
    }

    fn count(&self, counter: Counter, n: u64) {
        let m = &self.metrics;
        let counter = match counter {
            Counter::RecvNoBuffers => &m.recv_no_buffers,
            Counter::HeadScanWaits => &m.head_scan_waits,
            Counter::HeadParses => &m.head_parses,
            Counter::Bytes(Source::Direct) => &m.bytes_direct,
            Counter::Bytes(Source::DontCache) => &m.bytes_dontcache,
            Counter::Bytes(Source::Buffered) => &m.bytes_buffered,
            Counter::Bytes(Source::Memory) => &m.bytes_memory,
            Counter::ParkedSend => &m.parked_sends,
            Counter::ReclaimedChunks => &m.reclaimed_chunks,
            Counter::GivenBack(GiveBack::Reclaim) => &m.given_back_reclaim,
            Counter::GivenBack(GiveBack::ReclaimUnsent) => &m.given_back_reclaim_unsent,
            Counter::GivenBack(GiveBack::ReadAhead) => &m.given_back_read_ahead,
            Counter::Closed(CloseReason::Normal | CloseReason::Drain) => &m.closed_normal,
            Counter::Closed(CloseReason::Timeout) => &m.closed_timeout,
            Counter::Closed(CloseReason::ProtocolError) => &m.closed_error,
            Counter::Closed(CloseReason::Abort) => &m.closed_abort,
            Counter::TlsBytesIn => &m.tls_bytes_in,
            Counter::TlsBytesOut => &m.tls_bytes_out,
            Counter::Proxy(ProxyOutcome::Accepted) => &m.proxy_accepted,
            Counter::Proxy(ProxyOutcome::Local) => &m.proxy_local,
            Counter::Proxy(ProxyOutcome::Untrusted) => &m.proxy_untrusted,
            Counter::Proxy(ProxyOutcome::Malformed) => &m.proxy_malformed,
            Counter::Proxy(ProxyOutcome::Truncated) => &m.proxy_truncated,
            Counter::LimitWait => &m.limit_waits,
            Counter::LimitedBytes => &m.limited_bytes,
            Counter::EgressWait => &m.egress_waits,
            Counter::EgressDelayedBytes => &m.egress_delayed_bytes,
            Counter::EgressBypassBytes => &m.egress_bypass_bytes,
            Counter::SignedUrl(Refusal::Missing) => &m.signed_url_missing,
            Counter::SignedUrl(Refusal::UnknownKey) => &m.signed_url_unknown_key,
            Counter::SignedUrl(Refusal::BadSignature) => &m.signed_url_bad_signature,
            Counter::SignedUrl(Refusal::Expired) => &m.signed_url_expired,
            Counter::Handshake(outcome) => {
                debug_assert_eq!(n, 1, "one handshake outcome per count");
                return self.count_handshake(outcome);
            }
        };
        ShardMetrics::add(counter, n);
    }

    /// Bookkeeping when a response ends (complete or aborted): status counters, access log.
    fn response_done(&mut self, c: ConnSlot, status: u16, bytes: u64) {
        // A pulled version stays pinned only while a response reads it.
        self.fill_reads_end(c);
        self.relay_end(c);
        let now_us = self.clock.now_us;
        let conn = &self.conns[c.index()];
        self.metrics.count_request(conn.method(), status);
        match conn.cache_label() {
            Some("PASS") => ShardMetrics::add(&self.metrics.cache_pass_bytes, bytes),
            Some(_) => ShardMetrics::add(&self.metrics.cache_sent_bytes, bytes),
            None => {}
        }
        if let (Some(source), Some(origin)) = (conn.cache_label(), conn.cache_origin()) {
            self.metrics
                .origins
                .count_sent(usize::from(origin), source, bytes);
        }
        if let Some(log) = self.access_log.as_mut() {
            let (request, range) = conn.log_fields();
            log.record(&access_log::Entry {
                request,
                status,
                bytes,
                duration_us: now_us.saturating_sub(conn.request_start_us()),
                range,
                shard: self.index,
                date: self.clock.date.header_value(),
                tls: conn.tls().and_then(|t| t.facts.as_ref()),
                client: conn
                    .request_client()
                    .or(conn.client().addr().map(|a| a.ip())),
                limiter: conn.limiter(),
                cache: conn.cache_label(),
            });
        }
    }

    // ---- receive ---------------------------------------------------------------------------

    fn retry_recvs(&mut self) {
        if self.recv_retry.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.recv_retry);
        for &c in &list {
            self.drive(c, |m, _, out| m.retry_recv(out));
        }
        list.clear();
        if self.recv_retry.is_empty() {
            self.recv_retry = list;
        }
    }

    fn on_recv(&mut self, c: ConnSlot, cqe: Completion) {
        let bid = cqe.buffer_id();
        if let Some(b) = bid {
            self.ring.claim_recv(b);
        }
        let cx = self.cx();
        let mut out = self.take_actions();
        let data = bid
            .filter(|_| cqe.result > 0)
            .map(|b| self.ring.recv_data(b, cqe.result as usize));
        self.conns[c.index()].on_recv(cqe.result, data, cqe.more(), &cx, &mut out);
        if let Some(b) = bid {
            let used = usize::try_from(cqe.result).unwrap_or(0);
            let kept = cqe.buffer_more();
            self.ring.recycle_recv(b, used, kept);
            if !kept {
                ShardMetrics::add(&self.metrics.recv_buffers_provided, 1);
            }
        }
        self.run_actions(c, out);
    }

    // ---- the ready queue -------------------------------------------------------------------

    fn visit(&mut self, c: ConnSlot, tick_budget: usize) -> Turn {
        if !self.conns[c.index()].is_open() {
            return Turn::Idle;
        }
        if !self.conns[c.index()].responding() {
            if !self.conns[c.index()].can_start_request() {
                return Turn::Idle;
            }
            self.start_request(c);
        }
        let conn = &self.conns[c.index()];
        if !(conn.is_open() && conn.responding()) {
            return Turn::Idle;
        }
        let cx = self.cx();
        let mut out = self.take_actions();
        let mut budget = TickBudget::new(tick_budget);
        let arena = &mut self.arena;
        let conn = &mut self.conns[c.index()];
        let turn = conn.pump(
            &mut budget,
            &mut self.shard_budget,
            &mut |demand| arena.take(demand),
            Some(&self.egress.bucket),
            &cx,
            &mut out,
        );
        conn.try_send(&cx, &mut out);
        self.run_actions(c, out);
        turn
    }

    /// Returns an arena slot; a waiting connection gets it handed over and is queued.
    fn release_slot(&mut self, slot: ArenaSlot) {
        if !self.hand_slot_over(slot) && !self.cache.pulls.relay_waits.is_empty() {
            // A request waiting for its own fetch may have waited for this slot.
            self.wake_relay_waiters(1);
        }
    }

    /// Returns an arena slot without waking a request waiting for its own fetch (one that
    /// took the slot and then found no room at its origin: waking another would only spin);
    /// a waiting connection gets it handed over. True when it was handed over.
    fn hand_slot_over(&mut self, slot: ArenaSlot) -> bool {
        let Some((w, s)) = self.arena.give_back(slot) else {
            return false;
        };
        self.drive(w, |m, cx, out| m.slot_handed(s, cx, out));
        true
    }

    // ---- parked connections ----------------------------------------------------------------

    /// Gives parked chunks (behind full sockets, oldest first) to connections waiting for
    /// the arena; stops when nobody waits.
    fn reclaim_parked(&mut self) {
        while self.arena.waiting() > 0 {
            let Some(c) = self.sends.parked.pop_front(0).map(ConnSlot::new) else {
                return;
            };
            if self.conns[c.index()].is_parked() {
                self.drive(c, |m, _, out| m.reclaim(out));
            }
        }
    }

    /// Gives back the chunks of connections parked longer than `PARK_HOLD_MS` (a stalled
    /// client keeps nothing for long even when nobody else asks).
    ///
    /// The whole list is walked (in order): a connection that parked again while still listed
    /// keeps its old place with a newer `parked_ms`, so the list is not sorted by park time.
    fn expire_parked(&mut self) {
        for _ in 0..self.sends.parked.len(0) {
            let Some(c) = self.sends.parked.pop_front(0).map(ConnSlot::new) else {
                return;
            };
            let conn = &self.conns[c.index()];
            let recent = self.clock.now_ms < conn.parked_ms() + PARK_HOLD_MS;
            if conn.is_parked() && recent {
                self.sends.parked.push_back(0, c.raw());
            } else if conn.is_parked() {
                self.drive(c, |m, _, out| m.reclaim(out));
            }
        }
    }

    // ---- timers, drain ---------------------------------------------------------------------

    /// Wakes the responses whose limiter allows them to go on: every tick, so a wait ends
    /// within the wheel's granularity, not at the next sweep (an egress turn left unused is
    /// bandwidth the cap never gives back).
    fn wake_limited(&mut self) {
        while let Some(c) = self
            .timers
            .limit_waits
            .pop_expired(self.clock.now_ms)
            .map(ConnSlot::new)
        {
            self.drive(c, |m, _, out| m.on_limit_wake(out));
        }
    }

    /// Publishes the bytes per second this shard sent over the last window (`egress_bytes_per_s`).
    fn measure_egress_rate(&mut self) {
        let (since_ms, sent_then) = self.egress.window;
        let elapsed_ms = self.clock.now_ms.saturating_sub(since_ms);
        if elapsed_ms < EGRESS_RATE_WINDOW_MS {
            return;
        }
        let m = &self.metrics;
        let sent = [
            &m.bytes_direct,
            &m.bytes_dontcache,
            &m.bytes_buffered,
            &m.bytes_memory,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum::<u64>();
        let rate = sent.saturating_sub(sent_then) * 1000 / elapsed_ms;
        ShardMetrics::set(&m.egress_rate, rate);
        self.egress.window = (self.clock.now_ms, sent);
    }

    fn sweep_timers(&mut self) {
        debug_assert_eq!(
            self.handshaking.handshake_bytes,
            self.conns
                .iter()
                .map(|m| m.tls().map_or(0, |t| t.handshake_bytes()))
                .sum::<usize>(),
            "the handshake byte count drifted from what the connections hold"
        );
        self.expire_parked();
        self.measure_egress_rate();
        while let Some(c) = self
            .timers
            .deadlines
            .pop_expired(self.clock.now_ms)
            .map(ConnSlot::new)
        {
            if self.conns[c.index()].awaiting_fill()
                && self.clock.now_ms >= self.conns[c.index()].deadline_ms()
            {
                self.fill_timed_out(c);
                continue;
            }
            // The machine judges by its own deadline (the wheel only mirrors it); if the slot
            // did not close, `run_actions` arms the wheel again from what the machine says.
            self.drive(c, |m, cx, out| m.on_timer(cx, out));
        }
        // Connections holding a SEND_ZC chunk (at most half the arena's worth).
        for _ in 0..self.sends.zc_conns.len(0) {
            let Some(c) = self.sends.zc_conns.pop_front(0).map(ConnSlot::new) else {
                break;
            };
            self.sends.zc_conns.push_back(0, c.raw());
            self.drive(c, |m, cx, out| m.check_zerocopy_stuck(cx, out));
        }
    }

    fn begin_drain(&mut self) {
        self.life.drain_deadline_ms = Some(self.clock.now_ms + self.cfg.drain_timeout_ms);
        tracing::info!(shard = self.index, "draining: no new connections");
        if self.accept.accept_armed {
            let target = Token::shard(Op::Accept).encode();
            let t = Token::shard(Op::CancelAccept).encode();
            self.ring.cancel_token(target, t);
        }
        if self.accept.tls_accept_armed {
            let target = Token::shard(Op::AcceptTls).encode();
            let t = Token::shard(Op::CancelAccept).encode();
            self.ring.cancel_token(target, t);
        }
        self.accept.tls_listener = None;
        // Close the listening socket: connections still in its backlog are reset and new ones
        // refused, instead of waiting unanswered until the process exits. An accept still in
        // flight holds its own reference to the socket until the cancel above completes.
        self.accept.listener = None;
        self.accept.ring_accepts = false;
        for c in (0..self.conns.len() as u32).map(ConnSlot::new) {
            if self.conns[c.index()].is_live() {
                self.drive(c, |m, cx, out| m.on_drain(cx, out));
            }
        }
    }

    fn close_all(&mut self, reason: CloseReason) {
        for c in (0..self.conns.len() as u32).map(ConnSlot::new) {
            if self.conns[c.index()].is_live() {
                self.drive(c, |m, cx, out| m.close(reason, cx, out));
            }
        }
    }

    /// A connection's socket is closed: its slot goes back on the free list.
    fn on_close(&mut self, c: ConnSlot) {
        self.timers.limit_waits.cancel(c.raw());
        self.fill_forget(c);
        if let Some(key) = self.conns[c.index()].take_cap_key() {
            self.policy.client_counts.release(key);
        }
        self.conns[c.index()].on_closed();
        self.sync_handshake_bytes(c);
        self.timers.deadlines.cancel(c.raw());
        self.free_conns.push(c);
        self.open_conns -= 1;
        self.socket_slot_freed();
    }

    /// A fixed socket slot was released: an accept backing off for lack of slots may retry now
    /// instead of sleeping out its timer (the back-off only guards against a busy loop).
    fn socket_slot_freed(&mut self) {
        self.accept.accept_retry_ms = 0;
    }

    // ---- dispatch --------------------------------------------------------------------------

    fn dispatch(&mut self, cqe: Completion) {
        let Some(t) = Token::decode(cqe.user_data) else {
            ShardMetrics::add(&self.metrics.stray_completions, 1);
            return;
        };
        match t.op {
            Op::Accept => return self.on_accept(cqe, false),
            Op::AcceptTls => return self.on_accept(cqe, true),
            Op::OverflowClose => return self.socket_slot_freed(),
            Op::Overflow | Op::CancelAccept => return,
            Op::Origin => return self.on_origin(t, cqe.result),
            Op::FillWake => return self.on_fill_wake(),
            Op::Scrub => return self.on_scrub_read(cqe.result),
            Op::LogWrite => {
                if let Some(log) = self.access_log.as_mut() {
                    log.on_write_done(&mut self.ring, cqe.result);
                }
                return;
            }
            _ => {}
        }
        let c = t.conn_slot();
        let live = self
            .conns
            .get(c.index())
            .is_some_and(|conn| conn.generation() == t.generation && conn.life() != ConnLife::Free);
        // Slots are freed only when no operation is in flight, so a mismatch is a bug.
        assert!(live, "completion {t:?} for a free or reused slot");
        let res = cqe.result;
        match t.op {
            Op::Recv => self.on_recv(c, cqe),
            Op::SendHead => {
                self.ring.tx_done(c);
                self.drive(c, |m, cx, out| m.on_head_sent(res, cx, out));
            }
            Op::Read => {
                let slot = t.arena_slot();
                self.ring.arena_done(slot);
                self.read_back(slot);
                let res = match self.verify_cache_read(c, slot, res) {
                    cache_glue::ReadCheck::Use(res) => res,
                    cache_glue::ReadCheck::Hold { now } => {
                        // A bad block: the chunk waits in place for it to be fetched again.
                        self.conns[c.index()].hold_for_refetch(slot);
                        if now {
                            let waiter = self.waiter(c);
                            self.refetch_arrived(waiter, cache_glue::Held::Slot(slot));
                        }
                        return;
                    }
                    cache_glue::ReadCheck::Failover => return self.read_failed_over(c, slot),
                };
                let cx = self.cx();
                let mut out = self.take_actions();
                let files = &mut self.files;
                let mut unchanged = |f: FileSlot| files.unchanged_since_open(f);
                self.conns[c.index()].on_read(slot, res, &mut unchanged, &cx, &mut out);
                self.run_actions(c, out);
                // The last read in the kernel of a response whose disk failed one: it goes on
                // from the origin now.
                self.try_failover(c);
            }
            Op::SendChunk => {
                let (slot, more, notification) =
                    (t.arena_slot(), cqe.more(), cqe.is_notification());
                if notification || !more {
                    // The kernel is done with the buffer: a plain send finished, or SEND_ZC's
                    // notification (or its failure without one) arrived.
                    self.ring.arena_done(slot);
                }
                self.drive(c, |m, cx, out| {
                    m.on_send(slot, res, more, notification, cx, out)
                });
            }
            Op::Cancel => self.drive(c, |m, _, out| m.on_cancel_done(out)),
            Op::CancelRecv => self.drive(c, |m, _, out| m.on_recv_cancel_done(out)),
            Op::PeerName => {
                let len = usize::try_from(res).unwrap_or(0);
                let peer = crate::client::sockaddr::parse(self.ring.peer_done(c, len));
                let refused = res < 0 && res != -libc::ENOTCONN && res != -libc::ECANCELED;
                if refused && !self.accept.peer_warned {
                    // EOPNOTSUPP: a kernel before 6.7 (no socket getsockopt command).
                    self.accept.peer_warned = true;
                    tracing::warn!(
                        shard = self.index,
                        errno = -res,
                        "the kernel did not give a connection's peer address; clients are \
                         logged as \"-\" and count as untrusted (logged once)"
                    );
                }
                let trusted = peer.is_some_and(|p| self.policy.trusted.trusts(p.ip()));
                self.drive(c, |m, _, out| m.on_peer(peer, trusted, out));
            }
            Op::PollOut => self.drive(c, |m, cx, out| m.on_writable(res, cx, out)),
            Op::Shutdown => self.drive(c, |m, _, out| m.on_shutdown_done(out)),
            Op::SendTls => {
                self.ring.tx_done(c);
                self.drive(c, |m, cx, out| m.on_tls_sent(res, cx, out));
            }
            Op::Close => self.on_close(c),
            Op::Accept
            | Op::AcceptTls
            | Op::Overflow
            | Op::OverflowClose
            | Op::CancelAccept
            | Op::Origin
            | Op::FillWake
            | Op::Scrub
            | Op::LogWrite => {
                unreachable!()
            }
        }
    }
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

/// The configuration's limits as the machine sees them (`Ctx::limits`).
fn build_limits(cfg: &Config, zerocopy: bool, zc_warmup_bytes: u64) -> Limits {
    Limits {
        header_timeout_ms: cfg.header_timeout_ms,
        keepalive_timeout_ms: cfg.keepalive_timeout_ms,
        send_timeout_ms: cfg.send_timeout_ms,
        chunk_bytes: cfg.chunk_bytes,
        pipeline_depth: cfg.pipeline_depth,
        zerocopy,
        zerocopy_min_bytes: cfg.zerocopy_min_bytes,
        zerocopy_warmup_bytes: zc_warmup_bytes,
        tls_record_bytes: cfg.tls_record_bytes as u32,
        tls_chunk_bytes: crate::tls::record::chunk_plaintext_capacity(
            cfg.chunk_bytes,
            cfg.tls_record_bytes,
        ),
        tls_handshake_timeout_ms: cfg.tls_handshake_timeout_ms,
        proxy_protocol: cfg.proxy_protocol,
        tls_proxy_protocol: cfg.tls_proxy_protocol,
        egress_limit_bytes_per_s: cfg.egress_limit_bytes_per_s,
        egress_bypass_bytes: cfg.egress_bypass_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest config a shard accepts sizes the unqueued FIFO past what its connections
    /// can hold in flight (the fixed 2^16 it replaced panicked at 2^20 connections doing 1 op).
    #[test]
    fn the_unqueued_bound_covers_every_connection_at_the_config_limits() {
        let cfg = Config {
            max_connections_per_shard: crate::config::MAX_CONNECTIONS_PER_SHARD,
            ..Config::default()
        };
        let ring = ring_config(&cfg);
        let most_per_conn = CONN_OPS_BESIDES_CHUNKS + crate::config::MAX_PIPELINE_DEPTH;
        assert!(ring.unqueued_max_entries >= ring.conn_slots * most_per_conn);
        assert!(ring.unqueued_max_entries > 1 << 16);
        let small = ring_config(&Config::default());
        assert!(small.unqueued_max_entries >= small.conn_slots * most_per_conn);
    }
}
