//! The shard's state by concern: each group is one subsystem's, so `Shard` holds the ring,
//! the connections and the arena beside a handful of these.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use super::intrusive::ListSet;
use super::timer_wheel::TimerWheel;
use super::{cache_glue, conn, reload, scrub};
use crate::http::date::DateCache;
use crate::ring_api::ops::Completion;
use crate::shard::machine::Actions;

/// The listeners and their accepts (`accept.rs`).
pub(super) struct Accepting {
    pub listener: Option<TcpListener>,
    /// The TLS listener (None without `tls_listen`).
    pub tls_listener: Option<TcpListener>,
    /// The ring itself produces connections (the simulator has no listener).
    pub ring_accepts: bool,
    pub accept_armed: bool,
    pub tls_accept_armed: bool,
    pub accept_retry_ms: u64,
    pub accept_warned_ms: u64,
    /// The kernel refused a peer-address request once (logged once).
    pub peer_warned: bool,
    /// A connection was accepted since the last urgent round (its receive is to go out).
    pub accepted_in_round: bool,
}

/// TLS handshakes (`handshakes.rs`).
pub(super) struct Handshaking {
    /// Certificates and ticket keys for new handshakes (replaced by a reload).
    pub tls: Option<Arc<crate::tls::TlsContext>>,
    /// Connections whose handshake waits for its turn, oldest first: those under way, then
    /// new ones.
    pub handshakes: ListSet<2>,
    /// Handshake time left to spend (µs; negative: a turn overran) and when it was last
    /// earned.
    pub hs_credit_us: i64,
    pub hs_earned_at: Duration,
    /// Handshake bytes the handshaking connections hold now (bounded by
    /// `tls_handshake_budget_bytes`), and what it counts for each connection slot.
    pub handshake_bytes: usize,
    pub handshake_counted: Vec<usize>,
}

/// Who may ask for what.
pub(super) struct Policy {
    /// Peers that may name the client (`trusted_proxies`, parsed; replaced on reload).
    pub trusted: crate::client::TrustedProxies,
    /// Signed-URL rules and keys (replaced on reload).
    pub signing: Arc<crate::signing::Signing>,
    /// Where the path rules (signed URLs, prefix rates) resolve the request path (no
    /// allocation per request).
    pub path_scratch: crate::fs::resolve::ResolveScratch,
    /// Connections per client over all shards.
    pub client_counts: Arc<crate::client::cap::ClientCounts>,
}

/// The edge's egress cap as this shard sees it.
pub(super) struct Egress {
    /// The cap, shared by all shards (`egress_limit_bytes_per_s`).
    pub bucket: Arc<crate::limits::EgressBucket>,
    /// The bucket's clock minus this ring's, µs (both run from their creation).
    pub clock_offset_us: u64,
    /// When the current egress-rate window began (ms), and the bytes sent by then.
    pub window: (u64, u64),
}

/// The tick's clock and the HTTP date.
pub(super) struct Clock {
    pub now_ms: u64,
    /// The same moment in µs: read once per tick with `now_ms` (`read_clock`), as nginx
    /// caches its time per loop turn; every event of the tick is judged by it.
    pub now_us: u64,
    pub date: DateCache,
    /// When the HTTP date was last refreshed (shard clock, ms): at most once per ms.
    pub date_read_ms: u64,
}

/// Buffers allocated at start and reused.
pub(super) struct Pools {
    /// Completions reaped in one go.
    pub batch: Vec<Completion>,
    /// Action buffers for the machines' events (one per nesting level).
    pub action_pool: Vec<Actions>,
    /// Body queues between responses (grows only past the most responses ever in progress
    /// at once).
    pub body_pool: Vec<conn::BodyBuffers>,
}

/// Deadlines.
pub(super) struct Timers {
    /// Each connection's deadline (header, idle, send, linger), mirrored from its machine
    /// after every event: the sweep visits only what expired, never every slot.
    pub deadlines: TimerWheel,
    /// Rate-limited responses waiting for their allowance: when to wake each (no slot held).
    pub limit_waits: TimerWheel,
    pub last_sweep_ms: u64,
}

/// Parked connections and SEND_ZC.
pub(super) struct Sends {
    /// Connections that parked a chunk, oldest first (each slot at most once).
    pub parked: ListSet<1>,
    /// Connections holding a SEND_ZC chunk (the timer sweep checks that it drains).
    pub zc_conns: ListSet<1>,
    /// Arena slots lent to SEND_ZC and not yet released by a notification.
    pub zc_held: usize,
    /// SEND_ZC is used on this shard.
    pub zerocopy: bool,
}

/// Shutdown, drain, reloads and log reopening.
pub(super) struct Life {
    pub shutdown: Arc<AtomicBool>,
    pub drain_deadline_ms: Option<u64>,
    pub lifecycle: reload::LifecycleView,
    pub log_epoch: Arc<AtomicU64>,
}

/// The pull-through cache's side on this shard.
pub(super) struct CacheSide {
    /// The cache, when `[[origin]]` is configured (`fill::edge`).
    pub edge: Option<crate::fill::edge::EdgeCache>,
    /// The pulled responses' state, by connection (`cache_glue::Pulls`).
    pub pulls: cache_glue::Pulls,
    /// The background scrub's pass and its read in flight (shard 0 only).
    pub scrub: scrub::Scrub,
}
