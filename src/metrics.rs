//! Per-shard counters. Each shard is the only writer of its own `ShardMetrics` (relaxed
//! atomic stores, no contention); readers (the admin endpoint, tests) only load.
//!
//! Rendering follows the Prometheus text exposition format 0.0.4: one `# HELP` and one
//! `# TYPE` line per family, counters end in `_total`, durations are in seconds. Related
//! counters share a family and differ by a label (`reason`, `source`, `method` and
//! `status_class`), so a dashboard can `sum by (reason)` without knowing every field. Every
//! series carries `shard="N"` and there is no all-shards series: summing is PromQL's job, and a
//! pre-summed series would make every `sum()` count twice.
//!
//! Why not the `prometheus-client` crate: its counters are read-modify-write atomics and its
//! histogram takes a mutex per observation, where each shard here is the single writer of plain
//! atomics (load + store, no locked instruction on the data path); using it only as an encoder
//! over our atomics would add a dependency for the ~100 lines of formatting below.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::http::request::Method;

/// Prometheus metric type of a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only ever grows (between restarts).
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// How one `ShardMetrics` field is exposed.
#[derive(Clone, Copy, Debug)]
pub struct FieldInfo {
    /// Rust field name.
    pub field: &'static str,
    /// Family name without the `shardline_` prefix (counters end in `_total`).
    pub family: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Extra label distinguishing this field inside its family, if any.
    pub label: Option<(&'static str, &'static str)>,
    /// The field's doc comment (HELP text of an unlabelled family).
    pub help: &'static str,
}

macro_rules! counters {
    ($($(#[doc = $doc:expr])* $name:ident : $kind:ident $family:literal
        $({ $lk:ident = $lv:literal })?),* $(,)?) => {
        /// Counters of one shard.
        #[derive(Default, Debug)]
        pub struct ShardMetrics {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
            /// Time to first byte: request head parsed -> first response byte handed to the
            /// kernel, in microseconds (`Histogram::observe`).
            pub ttfb: Histogram,
            /// Time a response waited for an arena buffer (`observe_buffer_wait`).
            pub buffer_wait: Histogram,
            /// Requests answered, by method and status class (`count_request`).
            pub requests: RequestCounters,
            /// TLS handshakes by outcome, version and resumption (`TlsCounters::count`).
            pub tls_handshakes: TlsCounters,
            /// Time from accept to a completed TLS handshake, in microseconds.
            pub tls_handshake_time: Histogram,
            /// Time from an origin fetch's start to the origin's head, in microseconds.
            pub origin_first_byte_time: Histogram,
            /// Counters by `[[origin]]` entry (`OriginCounters`).
            pub origins: OriginCounters,
            /// The cache's load, and once done its disks and their health, set once at
            /// start-up (rendered from shard 0's: `render_cache_load`, `render_cache_disks`).
            pub cache_load: std::sync::OnceLock<std::sync::Arc<crate::cache::disks::DiskLoad>>,
        }

        /// Every counter/gauge field, in rendering order.
        pub const FIELDS: &[FieldInfo] = &[$(FieldInfo {
            field: stringify!($name),
            family: $family,
            kind: Kind::$kind,
            label: counters!(@label $($lk = $lv)?),
            help: concat!($($doc),*),
        },)*];

        impl ShardMetrics {
            /// (name, value) of every counter, for rendering (same order as `FIELDS`).
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
    (@label) => { None };
    (@label $lk:ident = $lv:literal) => { Some((stringify!($lk), $lv)) };
}

counters! {
    /// Connections accepted.
    accepted: Counter "connections_accepted_total",
    /// Connections refused because the shard was at its cap.
    refused_over_cap: Counter "connections_refused_total",
    /// Connections open now.
    open: Gauge "connections_open",
    /// Connections closed after a complete exchange (client close or Connection: close).
    closed_normal: Counter "connections_closed_total" { reason = "normal" },
    /// Connections closed by a timeout (header, idle, send progress).
    closed_timeout: Counter "connections_closed_total" { reason = "timeout" },
    /// Connections closed because of a protocol error.
    closed_error: Counter "connections_closed_total" { reason = "error" },
    /// Connections aborted mid-response (file changed, I/O error, client reset).
    closed_abort: Counter "connections_closed_total" { reason = "abort" },
    /// Body bytes sent from O_DIRECT reads.
    bytes_direct: Counter "bytes_sent_total" { source = "direct" },
    /// Body bytes sent from RWF_DONTCACHE reads.
    bytes_dontcache: Counter "bytes_sent_total" { source = "dontcache" },
    /// Body bytes sent from buffered reads.
    bytes_buffered: Counter "bytes_sent_total" { source = "buffered" },
    /// Bytes sent from memory (headers, error bodies, multipart framing).
    bytes_memory: Counter "bytes_sent_total" { source = "memory" },
    /// Chunks (registered buffers) held by in-flight reads and sends now.
    chunks_in_flight: Gauge "chunks_in_flight",
    /// Times a connection waited for an arena slot.
    arena_waits: Counter "arena_waits_total",
    /// SQEs submitted.
    ring_sqes: Counter "ring_sqes_total",
    /// Completions handled.
    ring_cqes: Counter "ring_cqes_total",
    /// io_uring_enter calls.
    ring_enters: Counter "ring_enters_total",
    /// Configuration reloads this shard has applied (SIGHUP epochs; 0 until the first).
    config_epoch: Gauge "config_epoch",
    /// Open-file cache hits.
    file_cache_hits: Counter "file_cache_hits_total",
    /// Open-file cache misses (opens).
    file_cache_misses: Counter "file_cache_misses_total",
    /// Lookups answered 404/403 from the open-file cache's negative entries (no open).
    file_cache_negative_hits: Counter "file_cache_negative_hits_total",
    /// Accepts that failed for lack of descriptors (backoff applied).
    accept_errors: Counter "accept_errors_total",
    /// Receives that found no provided buffer (retried next tick).
    recv_no_buffers: Counter "recv_no_buffers_total",
    /// Receive buffers given back to the kernel whole after a receive. Where the kernel
    /// consumes them incrementally (6.12+), one per buffer filled, not one per receive: a
    /// head trickled a byte at a time holds no buffer per byte.
    recv_buffers_provided: Counter "recv_buffers_provided_total",
    /// Receives of request bytes that left the head incomplete: scanned on arrival, not
    /// parsed (a head trickled a byte at a time counts one per byte).
    head_scan_waits: Counter "head_scan_waits_total",
    /// Request heads handed to the parser (a well-formed head arriving in pieces: at its
    /// request line's end and at its own end, however it is split).
    head_parses: Counter "head_parses_total",
    /// Completions whose token did not match a live operation (a bug if non-zero).
    stray_completions: Counter "stray_completions_total",
    /// Chunk sends the socket took only part of (or none): the chunk parked behind a poll.
    parked_sends: Counter "parked_sends_total",
    /// Chunks given back by connections behind full sockets (their bytes are read again).
    reclaimed_chunks: Counter "reclaimed_chunks_total",
    /// File bytes read but given back unsent from a parked connection (read again later).
    given_back_reclaim: Counter "given_back_bytes_total" { why = "reclaim" },
    /// File bytes read ahead and given back by a reclaim before any of them left.
    given_back_reclaim_unsent: Counter "given_back_bytes_total" { why = "reclaim_unsent" },
    /// File bytes read but given back unsent when a send fell short (read-ahead cut).
    given_back_read_ahead: Counter "given_back_bytes_total" { why = "read_ahead" },
    /// io_uring_enter calls the kernel answered EBUSY (overflowed completions to reap first).
    ring_busy: Counter "ring_busy_total",
    /// Submissions that waited in the unqueued FIFO because the SQ was full.
    ring_unqueued: Counter "ring_unqueued_total",
    /// Completions the kernel had to hold back because the CQ was full.
    ring_cq_overflow: Counter "ring_cq_overflow_total",
    /// TLS connections accepted on the TLS listener.
    tls_accepted: Counter "tls_connections_accepted_total",
    /// TLS handshakes waiting for their turn on the shard now.
    tls_pending_handshakes: Gauge "tls_pending_handshakes",
    /// Handshake bytes the shard holds now (received, not yet consumed; bounded by
    /// `tls_handshake_budget_bytes`).
    tls_handshake_bytes: Gauge "tls_handshake_bytes",
    /// TLS bytes received (records of every kind, handshakes included).
    tls_bytes_in: Counter "tls_bytes_total" { direction = "in" },
    /// TLS bytes sent (records of every kind, handshakes included).
    tls_bytes_out: Counter "tls_bytes_total" { direction = "out" },
    /// PROXY headers from trusted peers that named the client.
    proxy_accepted: Counter "proxy_headers_total" { result = "accepted" },
    /// PROXY headers for the proxy's own connection (LOCAL, UNKNOWN).
    proxy_local: Counter "proxy_headers_total" { result = "local" },
    /// Connections closed: bytes where a PROXY header was due, from an untrusted peer.
    proxy_untrusted: Counter "proxy_headers_total" { result = "untrusted" },
    /// Connections closed: not a valid PROXY header.
    proxy_malformed: Counter "proxy_headers_total" { result = "malformed" },
    /// Connections closed before their PROXY header was complete.
    proxy_truncated: Counter "proxy_headers_total" { result = "truncated" },
    /// Times a rate-limited response waited for its allowance (holding no arena slot).
    limit_waits: Counter "limit_waits_total",
    /// Bytes sent under a rate limit (past `limit_rate_after_bytes`).
    limited_bytes: Counter "limited_bytes_total",
    /// Times a response waited for its turn under the edge's egress cap (holding no slot).
    egress_waits: Counter "egress_waits_total",
    /// Bytes sent after waiting for the egress cap.
    egress_delayed_bytes: Counter "egress_delayed_bytes_total",
    /// Responses' first bytes that went at once on the egress cap's bypass.
    egress_bypass_bytes: Counter "egress_bypass_bytes_total",
    /// Bytes per second this shard sent over the last second (headers, bodies and TLS
    /// framing; the edge's egress rate is the sum over shards).
    egress_rate: Gauge "egress_bytes_per_s",
    /// Connections over `max_connections_per_client` (closed, or answered 429).
    refused_client_cap: Counter "client_cap_refused_total",
    /// Signed-prefix requests refused (403): a signing parameter missing or repeated.
    signed_url_missing: Counter "signed_url_refused_total" { reason = "missing" },
    /// Signed-prefix requests refused (403): a key id not in the key file.
    signed_url_unknown_key: Counter "signed_url_refused_total" { reason = "unknown_key" },
    /// Signed-prefix requests refused (403): the signature does not match.
    signed_url_bad_signature: Counter "signed_url_refused_total" { reason = "bad_signature" },
    /// Signed-prefix requests refused (403): a good signature past its expiry.
    signed_url_expired: Counter "signed_url_refused_total" { reason = "expired" },
    /// Pulled responses whose bytes were all in the cache when they began.
    cache_hit: Counter "cache_lookups_total" { result = "hit" },
    /// Pulled responses that waited for the fill, then read the cache.
    cache_miss: Counter "cache_lookups_total" { result = "miss" },
    /// Pulled responses that streamed while their object filled.
    cache_fill: Counter "cache_lookups_total" { result = "fill" },
    /// Pulled requests answered with an error (the origin's 4xx, 502, 504).
    cache_error: Counter "cache_lookups_total" { result = "error" },
    /// Pulled requests answered by a pass-through.
    cache_pass: Counter "cache_lookups_total" { result = "pass" },
    /// Pulled requests that waited for a pass-through of their own (the shard ran
    /// `MAX_PASS_THROUGHS_PER_SHARD`).
    cache_pass_waits: Counter "cache_pass_waits_total",
    /// Pulled requests answered by their own origin fetch, unstored: the reply was `private`.
    not_stored_private: Counter "cache_not_stored_total" { reason = "private" },
    /// ... the reply was `no-store`.
    not_stored_no_store: Counter "cache_not_stored_total" { reason = "no-store" },
    /// ... the reply varies on a request field.
    not_stored_vary: Counter "cache_not_stored_total" { reason = "vary" },
    /// ... the request carried Authorization.
    not_stored_authorization: Counter "cache_not_stored_total" { reason = "authorization" },
    /// ... the key's replies were found not storable lately (hit-for-pass).
    not_stored_lately: Counter "cache_not_stored_total" { reason = "not-stored" },
    /// ... the origin answered a redirect or a 2xx other than 200/206.
    not_stored_status: Counter "cache_not_stored_total" { reason = "status" },
    /// ... the path is in its `[[origin]]`'s `never_cache`.
    not_stored_never_cache: Counter "cache_not_stored_total" { reason = "never-cache" },
    /// ... the cache's index was still loading (`cache_ready_wait_ms`).
    not_stored_loading: Counter "cache_not_stored_total" { reason = "loading" },
    /// Bytes of pulled responses sent to clients; they are read from the disk cache.
    cache_sent_bytes: Counter "cache_bytes_total" { source = "disk" },
    /// Bytes received from origins into the cache (heads included).
    cache_origin_bytes: Counter "cache_bytes_total" { source = "origin" },
    /// Bytes of pass-through responses sent to clients (streamed from the origin without
    /// being stored: the cache's disk had no room).
    cache_pass_bytes: Counter "cache_bytes_total" { source = "pass" },
    /// Waits for a block (or an object's head) that joined a fetch already under way, over all
    /// shards (shard 0 reports it).
    cache_waits_joined: Gauge "cache_waits" { how = "joined" },
    /// Waits for a block (or an object's head) that started a fetch, over all shards (shard 0
    /// reports it).
    cache_waits_started: Gauge "cache_waits" { how = "started" },
    /// Fills given up because the cache's disk had no room, over all shards (shard 0 reports
    /// it; their clients got 503, hits went on).
    cache_disk_full: Gauge "cache_disk_full_fills",
    /// Pauses origins asked for (a 429 or 503 with `Retry-After`: no new fetch to that origin
    /// until it ends; a warn line names the origin), over all shards (shard 0 reports it).
    origin_pauses: Gauge "origin_pauses",
    /// Cached versions purged by tag (`POST /cache/purge?tag=`), over all shards (shard 0
    /// reports it).
    cache_purged_by_tag: Counter "cache_purged_total" { by = "tag" },
    /// Purge tags of origin replies dropped over their bounds (too many, too long, not
    /// visible ASCII), over all shards (shard 0 reports it).
    cache_tags_dropped: Counter "cache_tags_dropped_total",
    /// Cached blocks that failed their checksum on a read (dropped, fetched again).
    cache_corrupt_blocks: Counter "cache_corrupt_blocks_total",
    /// Responses whose cache disk failed a read (or its data file's open) and went on from
    /// their origin (`shard::read_failover`).
    cache_disk_failovers: Counter "cache_disk_failovers_total" { outcome = "origin" },
    /// Responses whose cache disk failed a read and could not go on from their origin (no
    /// pass-through could start): cut, with a warn line.
    cache_disk_failovers_cut: Counter "cache_disk_failovers_total" { outcome = "cut" },
    /// Bytes the background scrub read back and checked (`cache_scrub_bytes_per_s`).
    cache_scrub_bytes: Counter "cache_scrub_bytes_total",
    /// Cached blocks the scrub found failing their checksum (dropped before a client met
    /// them; also counted in cache_corrupt_blocks_total).
    cache_scrub_bad_blocks: Counter "cache_scrub_bad_blocks_total",
    /// Passes of the scrub over every cached block, completed.
    cache_scrub_passes: Counter "cache_scrub_passes_total",
    /// How far the scrub's current pass is, in thousandths of the blocks cached when it began.
    cache_scrub_progress: Gauge "cache_scrub_pass_progress_permille",
    /// Hits served without the fill's lock (their version published: every block on disk,
    /// fresh).
    cache_lockless_hits: Counter "cache_lockless_hits_total",
    /// Times this shard found the fill's lock held by another thread and did that work at a
    /// later tick instead of waiting.
    cache_lock_busy: Counter "cache_lock_busy_total",
    /// Cached versions evicted under `cache_max_bytes` since start (over all shards; shard
    /// 0 reports it).
    cache_evictions: Gauge "cache_evictions",
    /// Origin replies refused: not an HTTP/1.x head (or a 101).
    origin_refused_malformed: Counter "origin_replies_refused_total" { reason = "malformed" },
    /// Origin replies refused: a head over its byte or field bound.
    origin_refused_too_large: Counter "origin_replies_refused_total" { reason = "too_large" },
    /// Origin replies refused: a Content-Length not `1*DIGIT`, or two that differ.
    origin_refused_bad_length: Counter "origin_replies_refused_total" { reason = "bad_content_length" },
    /// Origin replies refused: a Transfer-Encoding whose last coding is not chunked.
    origin_refused_bad_te: Counter "origin_replies_refused_total" { reason = "bad_transfer_encoding" },
    /// Origin replies refused: both Transfer-Encoding and Content-Length.
    origin_refused_length_and_te: Counter "origin_replies_refused_total" { reason = "length_and_transfer_encoding" },
    /// Origin replies refused: a Content-Range that does not parse, or two.
    origin_refused_bad_range: Counter "origin_replies_refused_total" { reason = "bad_content_range" },
    /// Origin replies refused: more interim (1xx) replies than `MAX_INTERIM_RESPONSES`.
    origin_refused_interim: Counter "origin_replies_refused_total" { reason = "too_many_interim" },
    /// Origin connections closed because bytes arrived past a reply's end (never read as the
    /// next reply).
    origin_poisoned: Counter "origin_connections_poisoned_total",
    /// Origin fetches this shard runs now.
    origin_fetches: Gauge "origin_fetches",
    /// Connections to origins this shard holds (busy and idle).
    origin_connections: Gauge "origin_connections",
}

/// HELP text of families whose members differ by a label (the fields' own docs describe
/// one member each).
fn family_help(family: &str) -> Option<&'static str> {
    Some(match family {
        "connections_closed_total" => "Connections closed, by reason.",
        "cache_lookups_total" => {
            "Responses under an [[origin]], by where their bytes came from (hit, miss, fill, or \
             pass: streamed from the origin without storing, the cache's disk having no room) or \
             error."
        }
        "cache_bytes_total" => {
            "Bytes of pulled content, by source: disk (sent to clients from the cache), origin \
             (received from origins) and pass (sent to clients of a pass-through)."
        }
        "cache_waits" => {
            "Waits of pulled requests for a block or an object's head, over all shards, by how: \
             joined a fetch under way, or started one: the coalescing ratio is joined / \
             (joined + started) (0.99: 100 clients of a cold object cost one fetch)."
        }
        "bytes_sent_total" => {
            "Bytes sent, by source (direct, dontcache, buffered, memory); over TLS the records' \
             framing counts with the bytes it carries."
        }
        "tls_bytes_total" => "TLS bytes, by direction (in, out), handshakes included.",
        "cache_disk_failovers_total" => {
            "Cached responses whose disk failed a read or a data file's open, by outcome: origin \
             (went on from the origin, every byte right) or cut (no pass-through could start)."
        }
        "cache_not_stored_total" => {
            "Pulled requests answered by their own origin fetch, nothing stored or shared, by \
             reason: private, no-store, vary (a Vary on a request field), authorization (the \
             request's), not-stored (the key's replies lately), status (a redirect or another 2xx), \
             never-cache."
        }
        "cache_purged_total" => {
            "Cached versions purged over the admin listener, over all shards (shard 0 reports \
             them), by what named them: tag (POST /cache/purge?tag=)."
        }
        "origin_replies_refused_total" => {
            "Origin replies refused before any byte was stored (the fetch is tried again or the \
             client gets 502; a warn line names the origin), by reason: malformed, too_large, \
             bad_content_length, bad_transfer_encoding, length_and_transfer_encoding, \
             bad_content_range, too_many_interim."
        }
        "proxy_headers_total" => {
            "PROXY protocol headers on listeners that expect them, by result: accepted, local, \
             untrusted, malformed, truncated (the last three closed the connection)."
        }
        "signed_url_refused_total" => {
            "Requests to a signed_url prefix refused with 403, by reason: missing, unknown_key, \
             bad_signature, expired."
        }
        "given_back_bytes_total" => {
            "File bytes read into the arena but given back unsent (to be read again), by why: \
             reclaim (the rest of a chunk behind a full socket), reclaim_unsent (a chunk read \
             ahead behind it) or read_ahead (cut after a short send)."
        }
        _ => return None,
    })
}

impl ShardMetrics {
    /// Adds `v` to a counter (single writer: load + store is enough and cheaper than RMW).
    pub fn add(counter: &AtomicU64, v: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(v),
            Ordering::Relaxed,
        );
    }

    /// Sets a gauge.
    pub fn set(counter: &AtomicU64, v: u64) {
        counter.store(v, Ordering::Relaxed);
    }

    /// Counts an answered request by method (`None`: the head was refused before its method
    /// was known) and response status.
    pub fn count_request(&self, method: Option<Method>, status: u16) {
        let m = match method {
            Some(Method::Get) => 0,
            Some(Method::Head) => 1,
            None => 2,
        };
        let class = match status {
            100..=199 => 0,
            200..=299 => 1,
            300..=399 => 2,
            400..=499 => 3,
            _ => 4,
        };
        Self::add(&self.requests.counts[m][class], 1);
    }

    /// Records how long a response waited for an arena buffer.
    pub fn observe_buffer_wait(&self, waited: std::time::Duration) {
        self.buffer_wait
            .observe(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
    }
}

/// `method` label values of `shardline_requests_total`, in `RequestCounters` row order
/// (`other`: a head refused before its method was known, such as a 400 or a 405).
pub const REQUEST_METHODS: [&str; 3] = ["GET", "HEAD", "other"];
/// `status_class` label values of `shardline_requests_total`, in column order.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Where a pulled response's bytes came from, for `OriginCounters::sent_bytes`.
pub const ORIGIN_SOURCES: [&str; 3] = ["hit", "miss", "pass"];

/// One shard's counters by `[[origin]]` entry: at most `config::MAX_ORIGINS` of them, so the
/// `origin` label's cardinality is bounded by the config. A hit ratio per origin is
/// `sent_bytes{source="hit"}` over all three sources.
#[derive(Debug)]
pub struct OriginCounters {
    /// Each entry's label values (its url and prefix), set once at start-up; rendering reads
    /// shard 0's.
    pub names: std::sync::OnceLock<Vec<(String, String)>>,
    /// Pulled requests answered.
    pub requests: [AtomicU64; crate::config::MAX_ORIGINS],
    /// Bytes of pulled responses sent, by `ORIGIN_SOURCES` (hit: the object was cached; miss:
    /// the response waited for or streamed with the fill; pass: passed through unstored).
    pub sent_bytes: [[AtomicU64; crate::config::MAX_ORIGINS]; 3],
    /// Bytes received from the origin (heads included).
    pub origin_bytes: [AtomicU64; crate::config::MAX_ORIGINS],
    /// Pauses the origin asked for (429/503 with `Retry-After`), over all shards: shard 0
    /// reports them.
    pub pauses: [AtomicU64; crate::config::MAX_ORIGINS],
}

impl Default for OriginCounters {
    fn default() -> OriginCounters {
        let zeros = || std::array::from_fn(|_| AtomicU64::new(0));
        OriginCounters {
            names: std::sync::OnceLock::new(),
            requests: zeros(),
            sent_bytes: [zeros(), zeros(), zeros()],
            origin_bytes: zeros(),
            pauses: zeros(),
        }
    }
}

impl OriginCounters {
    /// Bytes of a pulled response sent: `source` is the access log's `cache` value.
    pub fn count_sent(&self, origin: usize, source: &str, bytes: u64) {
        let i = match source {
            "HIT" => 0,
            "PASS" => 2,
            _ => 1,
        };
        if let Some(c) = self.sent_bytes[i].get(origin) {
            ShardMetrics::add(c, bytes);
        }
    }
}

/// Appends the per-origin families (`OriginCounters`) of every shard.
fn render_origins(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let Some(names) = shards.first().and_then(|m| m.origins.names.get()) else {
        return;
    };
    let esc = |v: &str| {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let labels: Vec<String> = names
        .iter()
        .enumerate()
        .take(crate::config::MAX_ORIGINS)
        .map(|(i, (url, prefix))| {
            format!(
                "origin=\"{i}\",url=\"{}\",prefix=\"{}\"",
                esc(url),
                esc(prefix)
            )
        })
        .collect();
    type Pick = fn(&OriginCounters) -> &[AtomicU64];
    let families: [(&str, &str, &str, Option<&str>, Pick); 6] = [
        (
            "shardline_origin_requests_total",
            "counter",
            "Pulled requests answered, by [[origin]] entry (origin: its index; url, prefix).",
            None,
            |o| &o.requests,
        ),
        (
            "shardline_origin_sent_bytes_total",
            "counter",
            "Bytes of pulled responses sent, by [[origin]] entry and source: hit (cached), miss \
             (waited for or streamed with the fill) and pass (passed through unstored). The hit \
             ratio of an origin is hit over the sum.",
            Some("hit"),
            |o| &o.sent_bytes[0],
        ),
        ("", "", "", Some("miss"), |o| &o.sent_bytes[1]),
        ("", "", "", Some("pass"), |o| &o.sent_bytes[2]),
        (
            "shardline_origin_received_bytes_total",
            "counter",
            "Bytes received from each [[origin]] entry's origin into the cache (heads included).",
            None,
            |o| &o.origin_bytes,
        ),
        (
            "shardline_origin_pauses_total",
            "counter",
            "Pauses each [[origin]] entry's origin asked for (a 429 or 503 with Retry-After), over \
             all shards (shard 0 reports them).",
            None,
            |o| &o.pauses,
        ),
    ];
    let mut name = "";
    for (family, kind, help, source, pick) in families {
        if !family.is_empty() {
            name = family;
            write_family_header(out, name, kind, help);
        }
        let source = source
            .map(|s| format!(",source=\"{s}\""))
            .unwrap_or_default();
        for (i, label) in labels.iter().enumerate() {
            for (shard, m) in shards.iter().enumerate() {
                let v = pick(&m.origins)[i].load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}{{{label}{source},shard=\"{shard}\"}} {v}");
            }
        }
    }
}

/// Appends the per-disk families of the cache (label `disk`: its slot, with `dir` and `id`).
fn render_cache_disks(out: &mut String, report: &crate::cache::disks::DiskReport) {
    use crate::cache::disk_health::{DiskState, ErrorKind};
    let labels: Vec<String> = report
        .disks
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let dir = d.dir.display().to_string();
            let dir = dir.replace('\\', "\\\\").replace('"', "\\\"");
            format!("disk=\"{i}\",dir=\"{dir}\",id=\"{:016x}\"", d.id)
        })
        .collect();
    let state_gauges = [
        (
            "shardline_cache_disk_failing",
            DiskState::Failing,
            "1 while a cache disk is failing (device errors took it out: no new fills, its \
             objects are misses), else 0.",
        ),
        (
            "shardline_cache_disk_offline",
            DiskState::Offline,
            "1 while the operator has a cache disk offline (shardline cache disk offline), else 0.",
        ),
        (
            "shardline_cache_disk_stalled",
            DiskState::Stalled,
            "1 while a cache disk is stalled (an operation passed cache_disk_op_timeout_ms: no \
             new fills, its objects are misses, its clients go on from the origin), else 0.",
        ),
    ];
    for (name, state, help) in state_gauges {
        write_family_header(out, name, "gauge", help);
        for (i, label) in labels.iter().enumerate() {
            let v = u8::from(report.health.state(i) == state);
            let _ = writeln!(out, "{name}{{{label}}} {v}");
        }
    }
    let name = "shardline_cache_disk_held_ops";
    write_family_header(
        out,
        name,
        "gauge",
        "Operations on a cache disk given up at cache_disk_op_timeout_ms that the kernel or \
         the disk's thread still holds (each keeps its buffer until it comes back).",
    );
    for (i, label) in labels.iter().enumerate() {
        let v = report.health.held_ops(i);
        let _ = writeln!(out, "{name}{{{label}}} {v}");
    }
    let name = "shardline_cache_disk_errors_total";
    write_family_header(
        out,
        name,
        "counter",
        "Errors of each cache disk's I/O by kind: device (count toward failing it), software \
         (the cache's own, never the disk's), full, checksum (a block dropped), stall (an \
         operation past cache_disk_op_timeout_ms), other.",
    );
    for (i, label) in labels.iter().enumerate() {
        for kind in ErrorKind::ALL {
            let v = report.health.errors(i, kind);
            let _ = writeln!(out, "{name}{{{label},kind=\"{}\"}} {v}", kind.label());
        }
    }
    let name = "shardline_cache_disk_op_seconds";
    write_family_header(
        out,
        name,
        "histogram",
        "Latency of each cache disk's operations, by op: read (a client's read of cached \
         blocks, submitted to completed) and append (a journal batch's write, with its sync \
         when durable). A disk that stalls shows here before it fails.",
    );
    for (i, label) in labels.iter().enumerate() {
        for op in crate::cache::disk_health::DiskOp::ALL {
            let Some(s) = report.health.latency(i, op) else {
                continue;
            };
            let series = format!("{label},op=\"{}\"", op.label());
            for (bound, c) in TTFB_BUCKETS_US.iter().zip(&s.cumulative) {
                let le = us_as_seconds(*bound);
                let _ = writeln!(out, "{name}_bucket{{{series},le=\"{le}\"}} {c}");
            }
            let count = s.count();
            let _ = writeln!(out, "{name}_bucket{{{series},le=\"+Inf\"}} {count}");
            let sum = us_as_seconds(s.sum_us);
            let _ = writeln!(out, "{name}_sum{{{series}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{series}}} {count}");
        }
    }
    let name = "shardline_cache_disk_used_bytes";
    write_family_header(
        out,
        name,
        "gauge",
        "Bytes used on each cache disk's file system.",
    );
    for (i, label) in labels.iter().enumerate() {
        if let Some(v) = report.used_bytes(i) {
            let _ = writeln!(out, "{name}{{{label}}} {v}");
        }
    }
    let name = "shardline_cache_disks_left_out";
    write_family_header(
        out,
        name,
        "gauge",
        "Disks of cache_dirs that could not be opened at start-up (their objects are misses).",
    );
    let _ = writeln!(out, "{name} {}", report.missing.len());
}

/// Appends the cache load's gauges: whether it goes on, its journal bytes, the disks whose
/// lock another process holds.
fn render_cache_load(out: &mut String, load: &crate::cache::load_progress::LoadProgress) {
    let (read, total, waiting) = load.figures();
    let gauges = [
        (
            "shardline_cache_loading",
            u64::from(load.loading()),
            "1 while the cache's index loads (pulled requests pass through unstored; /healthz \
             says loading), else 0.",
        ),
        (
            "shardline_cache_load_read_bytes",
            read,
            "Journal bytes replayed by the cache's load.",
        ),
        (
            "shardline_cache_load_total_bytes",
            total,
            "Journal bytes the cache's load replays (over the disks opened so far).",
        ),
        (
            "shardline_cache_load_waiting_disks",
            waiting as u64,
            "Cache disks whose lock another process holds (the load waits for it).",
        ),
        (
            "shardline_cache_load_uncounted_versions",
            load.uncounted_versions(),
            "Versions held at start-up that the eviction has yet to count (it counts them \
             while the shards serve; until then none of them is evicted).",
        ),
    ];
    for (name, value, help) in gauges {
        write_family_header(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// Requests answered, one counter per (method, status class).
#[derive(Default, Debug)]
pub struct RequestCounters {
    counts: [[AtomicU64; STATUS_CLASSES.len()]; REQUEST_METHODS.len()],
}

impl RequestCounters {
    /// Requests counted so far for `method` (a `REQUEST_METHODS` value) and class.
    pub fn get(&self, method: &str, status_class: &str) -> u64 {
        let m = REQUEST_METHODS.iter().position(|&x| x == method);
        let c = STATUS_CLASSES.iter().position(|&x| x == status_class);
        match (m, c) {
            (Some(m), Some(c)) => self.counts[m][c].load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Every request counted so far.
    pub fn total(&self) -> u64 {
        self.counts
            .iter()
            .flatten()
            .fold(0u64, |a, c| a.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

/// `result` label values of `shardline_tls_handshakes_total` other than `ok`, in
/// `TlsCounters::failed` order.
pub const TLS_FAILURES: [&str; 7] = [
    "failed",
    "peer_closed",
    "timeout",
    "queue_full",
    "too_large",
    "plain_http",
    "over_budget",
];
/// `version` label values of completed handshakes.
pub const TLS_VERSIONS: [&str; 2] = ["TLSv1.2", "TLSv1.3"];

/// TLS handshakes: completed ones by version and resumption, the others by why they ended.
#[derive(Default, Debug)]
pub struct TlsCounters {
    ok: [[AtomicU64; 2]; TLS_VERSIONS.len()],
    failed: [AtomicU64; TLS_FAILURES.len()],
}

impl TlsCounters {
    /// Counts a completed handshake (`version` a `TLS_VERSIONS` index).
    pub fn count_ok(&self, version: usize, resumed: bool) {
        ShardMetrics::add(&self.ok[version][usize::from(resumed)], 1);
    }

    /// Counts a handshake that did not complete (`why` a `TLS_FAILURES` index).
    pub fn count_failed(&self, why: usize) {
        ShardMetrics::add(&self.failed[why], 1);
    }

    /// Completed handshakes so far for `version` (a `TLS_VERSIONS` value).
    pub fn ok(&self, version: &str, resumed: bool) -> u64 {
        TLS_VERSIONS
            .iter()
            .position(|&v| v == version)
            .map_or(0, |v| {
                self.ok[v][usize::from(resumed)].load(Ordering::Relaxed)
            })
    }

    /// Handshakes that ended for `why` (a `TLS_FAILURES` value).
    pub fn failed(&self, why: &str) -> u64 {
        TLS_FAILURES
            .iter()
            .position(|&w| w == why)
            .map_or(0, |w| self.failed[w].load(Ordering::Relaxed))
    }
}

pub use crate::histogram::{Histogram, HistogramSnapshot, TTFB_BUCKETS_US};

/// Formats microseconds as seconds without float noise (`250` -> `0.00025`).
fn us_as_seconds(us: u64) -> String {
    let frac = us % 1_000_000;
    if frac == 0 {
        return format!("{}", us / 1_000_000);
    }
    let digits = format!("{frac:06}");
    format!("{}.{}", us / 1_000_000, digits.trim_end_matches('0'))
}

/// Writes the `# HELP` and `# TYPE` lines of a family.
pub fn write_family_header(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.trim().replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Selects one of a shard's histograms.
type PickHistogram = fn(&ShardMetrics) -> &Histogram;

/// Renders all shards' counters in Prometheus text format, one series per shard
/// (`shard="0"`...), then the request counts and the latency histograms.
pub fn render_prometheus(shards: &[std::sync::Arc<ShardMetrics>]) -> String {
    let mut out = String::new();
    if shards.is_empty() {
        return out;
    }
    let snaps: Vec<_> = shards.iter().map(|m| m.snapshot()).collect();
    let mut i = 0;
    while i < FIELDS.len() {
        // Fields of one family are adjacent in FIELDS (checked by a test).
        let family = FIELDS[i].family;
        let end = i + FIELDS[i..]
            .iter()
            .take_while(|f| f.family == family)
            .count();
        let name = format!("shardline_{family}");
        let help = family_help(family).unwrap_or(FIELDS[i].help);
        write_family_header(&mut out, &name, FIELDS[i].kind.as_str(), help);
        for (j, field) in FIELDS.iter().enumerate().take(end).skip(i) {
            let extra = field
                .label
                .map(|(k, v)| format!("{k}=\"{v}\","))
                .unwrap_or_default();
            for (shard, snap) in snaps.iter().enumerate() {
                let v = snap[j].1;
                let _ = writeln!(out, "{name}{{{extra}shard=\"{shard}\"}} {v}");
            }
        }
        i = end;
    }

    render_origins(&mut out, shards);
    if let Some(load) = shards.first().and_then(|m| m.cache_load.get()) {
        render_cache_load(&mut out, &load.progress);
    }
    if let Some(d) = shards.first().and_then(|m| m.cache_load.get()?.disks()) {
        render_cache_disks(&mut out, d);
    }

    let name = "shardline_requests_total";
    write_family_header(
        &mut out,
        name,
        "counter",
        "Requests answered, by method (GET, HEAD, other: refused before the method was known) \
         and status class.",
    );
    for method in REQUEST_METHODS {
        for class in STATUS_CLASSES {
            for (shard, m) in shards.iter().enumerate() {
                let v = m.requests.get(method, class);
                let _ = writeln!(
                    out,
                    "{name}{{method=\"{method}\",status_class=\"{class}\",shard=\"{shard}\"}} {v}"
                );
            }
        }
    }

    let name = "shardline_tls_handshakes_total";
    write_family_header(
        &mut out,
        name,
        "counter",
        "TLS handshakes, by result (ok, failed, peer_closed, timeout, queue_full, too_large, \
         plain_http, over_budget), version and whether a ticket resumed the session.",
    );
    for (v, version) in TLS_VERSIONS.iter().enumerate() {
        for resumed in [false, true] {
            for (shard, m) in shards.iter().enumerate() {
                let n = m.tls_handshakes.ok[v][usize::from(resumed)].load(Ordering::Relaxed);
                let r = if resumed { "yes" } else { "no" };
                let _ = writeln!(
                    out,
                    "{name}{{result=\"ok\",version=\"{version}\",resumed=\"{r}\",shard=\"{shard}\"}} {n}"
                );
            }
        }
    }
    for (w, why) in TLS_FAILURES.iter().enumerate() {
        for (shard, m) in shards.iter().enumerate() {
            let n = m.tls_handshakes.failed[w].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}{{result=\"{why}\",version=\"none\",resumed=\"no\",shard=\"{shard}\"}} {n}"
            );
        }
    }

    let histograms: [(&str, &str, PickHistogram); 4] = [
        (
            "shardline_ttfb_seconds",
            "Time from a parsed request head to its first response byte, in seconds.",
            |m| &m.ttfb,
        ),
        (
            "shardline_buffer_wait_seconds",
            "Time a response waited for a registered arena buffer, in seconds (one observation \
             per wait; a stalled download shows here first).",
            |m| &m.buffer_wait,
        ),
        (
            "shardline_tls_handshake_seconds",
            "Time from accepting a TLS connection to its completed handshake, in seconds \
             (waiting for a turn in the shard's handshake queue included).",
            |m| &m.tls_handshake_time,
        ),
        (
            "shardline_origin_first_byte_seconds",
            "Time from an origin fetch's start (connect included, when it needed one) to the \
             origin's response head, in seconds.",
            |m| &m.origin_first_byte_time,
        ),
    ];
    for (name, help, pick) in histograms {
        write_family_header(&mut out, name, "histogram", help);
        for (shard, m) in shards.iter().enumerate() {
            write_histogram(&mut out, name, &shard.to_string(), &pick(m).snapshot());
        }
    }
    out
}

fn write_histogram(out: &mut String, name: &str, shard: &str, s: &HistogramSnapshot) {
    for (bound, c) in TTFB_BUCKETS_US.iter().zip(&s.cumulative) {
        let le = us_as_seconds(*bound);
        let _ = writeln!(out, "{name}_bucket{{shard=\"{shard}\",le=\"{le}\"}} {c}");
    }
    let count = s.count();
    let _ = writeln!(
        out,
        "{name}_bucket{{shard=\"{shard}\",le=\"+Inf\"}} {count}"
    );
    let sum = us_as_seconds(s.sum_us);
    let _ = writeln!(out, "{name}_sum{{shard=\"{shard}\"}} {sum}");
    let _ = writeln!(out, "{name}_count{{shard=\"{shard}\"}} {count}");
}

/// One sample line of the text format, parsed back.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name (with `_bucket`/`_sum`/`_count` for histograms).
    pub name: String,
    /// Labels in order of appearance.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses (and strictly checks) Prometheus text exposition: every line is a `# HELP`,
/// `# TYPE` or `name{label="value",...} value` line; each family has at most one HELP and one
/// TYPE, and TYPE comes before the family's samples. Used by tests and handy for scripts.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    use std::collections::{HashMap, HashSet};
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut parts = rest.trim_start().splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !valid_name(name) {
                        return Err(bad("bad family name"));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(bad("unknown type"));
                    }
                    if types.insert(name.into(), kind.into()).is_some() {
                        return Err(bad("second TYPE for a family"));
                    }
                    if samples
                        .iter()
                        .any(|s: &Sample| family_of(&s.name, &types) == name)
                    {
                        return Err(bad("TYPE after the family's samples"));
                    }
                }
                (Some("HELP"), Some(name), _) if !helps.insert(name.to_string()) => {
                    return Err(bad("second HELP for a family"));
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| bad("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad("bad value"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| bad("unclosed labels"))?;
                (name, parse_labels(body).map_err(|e| bad(&e))?)
            }
        };
        if !valid_name(name) {
            return Err(bad("bad metric name"));
        }
        let family = family_of(name, &types);
        if let Some(kind) = types.get(family) {
            if kind == "counter" && !name.ends_with("_total") {
                return Err(bad("counter without _total suffix"));
            }
        }
        samples.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    Ok(samples)
}

/// The family a sample belongs to (histogram samples carry a suffix).
fn family_of<'a>(name: &'a str, types: &std::collections::HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types
                .get(base)
                .is_some_and(|k| k == "histogram" || k == "summary")
            {
                return base;
            }
        }
    }
    name
}

fn parse_labels(mut s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"").ok_or("label without =\"")?;
        if !valid_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("bad escape in label value".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = &rest[end + 1..];
        s = match s.strip_prefix(',') {
            Some(r) => r,
            None if s.is_empty() => s,
            None => return Err("labels not separated by ','".into()),
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        samples
            .iter()
            .find(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v)))
            .map(|s| s.value)
    }

    /// Each reason an origin head is refused for has its counter, labelled as the filler
    /// counts it (`HeadError::index` order is the shard's copy order).
    #[test]
    fn every_origin_refusal_reason_has_its_counter() {
        let labels: Vec<&str> = FIELDS
            .iter()
            .filter(|f| f.family == "origin_replies_refused_total")
            .filter_map(|f| f.label.map(|(_, v)| v))
            .collect();
        let reasons: Vec<&str> = crate::origin::response::HeadError::ALL
            .iter()
            .map(|e| e.label())
            .collect();
        assert_eq!(labels, reasons);
    }

    #[test]
    fn per_origin_families_carry_the_entry_and_parse() {
        let a = Arc::new(ShardMetrics::default());
        let b = Arc::new(ShardMetrics::default());
        let names = vec![
            ("http://steam.example".to_string(), "/depot/".to_string()),
            ("http://we\"ird".to_string(), "/x/".to_string()),
        ];
        a.origins.names.set(names).unwrap();
        ShardMetrics::add(&a.origins.requests[1], 4);
        a.origins.count_sent(0, "HIT", 300);
        b.origins.count_sent(0, "MISS", 100);
        b.origins.count_sent(0, "FILL", 1);
        a.origins.count_sent(0, "PASS", 7);
        a.origins.count_sent(crate::config::MAX_ORIGINS, "HIT", 1);
        ShardMetrics::set(&b.origins.origin_bytes[0], 101);
        ShardMetrics::set(&a.origins.pauses[1], 2);
        let text = render_prometheus(&[a, b]);
        let s = parse_exposition(&text).unwrap();
        let get = |name: &str, labels: &[(&str, &str)]| value(&s, name, labels);
        let sent = "shardline_origin_sent_bytes_total";
        assert_eq!(
            get(sent, &[("origin", "0"), ("source", "hit"), ("shard", "0")]),
            Some(300.0)
        );
        assert_eq!(
            get(sent, &[("origin", "0"), ("source", "miss"), ("shard", "1")]),
            Some(101.0)
        );
        assert_eq!(
            get(sent, &[("origin", "0"), ("source", "pass"), ("shard", "0")]),
            Some(7.0)
        );
        assert_eq!(
            get(
                "shardline_origin_requests_total",
                &[("origin", "1"), ("prefix", "/x/")]
            ),
            Some(4.0)
        );
        assert_eq!(
            get(
                "shardline_origin_received_bytes_total",
                &[("url", "http://steam.example"), ("shard", "1")]
            ),
            Some(101.0)
        );
        assert_eq!(
            get(
                "shardline_origin_pauses_total",
                &[("origin", "1"), ("shard", "0")]
            ),
            Some(2.0)
        );
        assert!(text.contains("url=\"http://we\\\"ird\""), "{text}");
        // No names (no [[origin]]): no per-origin families.
        let bare = render_prometheus(&[Arc::new(ShardMetrics::default())]);
        assert!(!bare.contains("shardline_origin_requests_total"));
    }

    #[test]
    fn renders_per_shard_without_an_all_series() {
        let a = Arc::new(ShardMetrics::default());
        let b = Arc::new(ShardMetrics::default());
        ShardMetrics::add(&a.accepted, 2);
        ShardMetrics::add(&b.accepted, 3);
        ShardMetrics::set(&b.open, 7);
        ShardMetrics::add(&a.bytes_direct, 1 << 20);
        a.count_request(Some(Method::Get), 404);
        a.count_request(Some(Method::Get), 206);
        a.count_request(Some(Method::Head), 200);
        b.count_request(None, 400);
        b.count_request(Some(Method::Get), 503);
        let text = render_prometheus(&[a.clone(), b]);
        assert!(text.contains("shardline_connections_accepted_total{shard=\"0\"} 2\n"));
        assert!(text.contains("shardline_connections_accepted_total{shard=\"1\"} 3\n"));
        assert!(!text.contains("\"all\""), "{text}");
        assert!(!text.contains("responses_total"), "{text}");
        assert!(text.contains(
            "shardline_requests_total{method=\"GET\",status_class=\"4xx\",shard=\"0\"} 1\n"
        ));
        assert!(text.contains("# TYPE shardline_connections_open gauge\n"));
        assert!(text.contains("# TYPE shardline_requests_total counter\n"));
        assert!(text.contains("# TYPE shardline_ttfb_seconds histogram\n"));
        assert!(text.contains("# TYPE shardline_buffer_wait_seconds histogram\n"));
        let s = parse_exposition(&text).unwrap();
        assert_eq!(
            value(&s, "shardline_connections_open", &[("shard", "1")]),
            Some(7.0)
        );
        let req = |m: &str, c: &str, shard: &str| {
            value(
                &s,
                "shardline_requests_total",
                &[("method", m), ("status_class", c), ("shard", shard)],
            )
        };
        assert_eq!(req("GET", "2xx", "0"), Some(1.0));
        assert_eq!(req("HEAD", "2xx", "0"), Some(1.0));
        assert_eq!(req("other", "4xx", "1"), Some(1.0));
        assert_eq!(req("GET", "5xx", "1"), Some(1.0));
        assert_eq!(req("GET", "3xx", "1"), Some(0.0));
        assert_eq!(a.requests.total(), 3);
        // A sum over the family is the number of requests, counted once.
        let all: f64 = s
            .iter()
            .filter(|x| x.name == "shardline_requests_total")
            .map(|x| x.value)
            .sum();
        assert_eq!(all, 5.0);
        assert_eq!(
            value(
                &s,
                "shardline_bytes_sent_total",
                &[("source", "direct"), ("shard", "0")]
            ),
            Some((1 << 20) as f64)
        );
    }

    #[test]
    fn every_line_parses_back_and_every_family_is_described_once() {
        let shards: Vec<_> = (0..3).map(|_| Arc::new(ShardMetrics::default())).collect();
        for (i, m) in shards.iter().enumerate() {
            for us in [50, 100, 101, 9_999, 10_000_000, 10_000_001, 99_000_000] {
                m.ttfb.observe(us * (i as u64 + 1));
            }
            ShardMetrics::add(&m.ring_sqes, 10);
        }
        let text = render_prometheus(&shards);
        let samples = parse_exposition(&text).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            // `name{labels} value`, exactly one space, value an integer or decimal.
            let (series, v) = line.rsplit_once(' ').unwrap();
            assert!(series.ends_with('}'), "{line}");
            assert!(!series.contains(' '), "{line}");
            assert!(v == "+Inf" || v.parse::<f64>().is_ok(), "{line}");
        }
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut dedup = families.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), families.len(), "a family is declared twice");
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(helps, families.len());
        // Each field appears once per shard, and nothing else carries its name.
        let histogram_or_requests = |n: &str| {
            n.starts_with("shardline_ttfb")
                || n.starts_with("shardline_buffer_wait")
                || n.starts_with("shardline_tls_handshake_seconds")
                || n.starts_with("shardline_origin_first_byte_seconds")
                || n == "shardline_requests_total"
                || n == "shardline_tls_handshakes_total"
        };
        assert_eq!(
            samples
                .iter()
                .filter(|s| !histogram_or_requests(&s.name))
                .count(),
            FIELDS.len() * 3
        );
        assert_eq!(
            samples
                .iter()
                .filter(|s| s.name == "shardline_requests_total")
                .count(),
            REQUEST_METHODS.len() * STATUS_CLASSES.len() * 3
        );
        assert_eq!(
            samples
                .iter()
                .filter(|s| s.name == "shardline_tls_handshakes_total")
                .count(),
            (TLS_VERSIONS.len() * 2 + TLS_FAILURES.len()) * 3
        );
        // Counters carry _total; gauges do not.
        for f in FIELDS {
            assert_eq!(
                f.family.ends_with("_total"),
                f.kind == Kind::Counter,
                "{f:?}"
            );
            assert!(!f.help.trim().is_empty(), "{f:?}");
        }
    }

    #[test]
    fn fields_of_a_family_are_adjacent_and_labelled() {
        for (i, f) in FIELDS.iter().enumerate() {
            let same: Vec<_> = FIELDS.iter().filter(|g| g.family == f.family).collect();
            if same.len() > 1 {
                assert!(f.label.is_some(), "{f:?} shares a family without a label");
                assert!(family_help(f.family).is_some(), "{f:?} has no family help");
                let first = FIELDS.iter().position(|g| g.family == f.family).unwrap();
                assert!(
                    FIELDS[first..first + same.len()]
                        .iter()
                        .all(|g| g.family == f.family),
                    "family {} is split at {i}",
                    f.family
                );
            }
        }
        assert_eq!(
            ShardMetrics::default().snapshot().len(),
            FIELDS.len(),
            "snapshot and FIELDS disagree"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_inf_equals_count() {
        let shards: Vec<_> = (0..2).map(|_| Arc::new(ShardMetrics::default())).collect();
        let observations = [
            0, 1, 100, 100, 101, 250, 7_000, 2_000_000, 10_000_000, 10_000_001,
        ];
        for us in observations {
            shards[0].ttfb.observe(us);
        }
        shards[1].ttfb.observe(123);
        shards[1].observe_buffer_wait(std::time::Duration::from_millis(30));
        assert_eq!(shards[0].ttfb.count(), observations.len() as u64);
        let samples = parse_exposition(&render_prometheus(&shards)).unwrap();
        for shard in ["0", "1"] {
            let buckets: Vec<_> = samples
                .iter()
                .filter(|s| s.name == "shardline_ttfb_seconds_bucket")
                .filter(|s| s.label("shard") == Some(shard))
                .collect();
            assert_eq!(buckets.len(), TTFB_BUCKETS_US.len() + 1);
            let mut last_le = f64::NEG_INFINITY;
            let mut last_v = 0.0;
            for b in &buckets {
                let le = match b.label("le").unwrap() {
                    "+Inf" => f64::INFINITY,
                    v => v.parse::<f64>().unwrap(),
                };
                assert!(le > last_le, "bounds increase");
                assert!(b.value >= last_v, "cumulative counts never decrease");
                last_le = le;
                last_v = b.value;
            }
            assert_eq!(buckets.last().unwrap().label("le"), Some("+Inf"));
            let count = value(
                &samples,
                "shardline_ttfb_seconds_count",
                &[("shard", shard)],
            );
            assert_eq!(Some(last_v), count, "+Inf == count for shard {shard}");
        }
        let le = |shard: &str, le: &str| {
            value(
                &samples,
                "shardline_ttfb_seconds_bucket",
                &[("shard", shard), ("le", le)],
            )
            .unwrap()
        };
        // Bounds are inclusive: 0, 1, 100, 100 are <= 100 us.
        assert_eq!(le("0", "0.0001"), 4.0);
        assert_eq!(le("0", "0.00025"), 6.0);
        assert_eq!(le("0", "0.01"), 7.0);
        assert_eq!(le("0", "10"), 9.0);
        assert_eq!(le("0", "+Inf"), 10.0);
        assert_eq!(le("1", "0.00025"), 1.0);
        let sum: u64 = observations.iter().sum::<u64>();
        let got = value(&samples, "shardline_ttfb_seconds_sum", &[("shard", "0")]).unwrap();
        assert!((got - sum as f64 / 1e6).abs() < 1e-9, "{got}");
        // The buffer-wait histogram is its own family: 30 ms lands in the 50 ms bucket.
        let wait = |shard: &str, le: &str| {
            value(
                &samples,
                "shardline_buffer_wait_seconds_bucket",
                &[("shard", shard), ("le", le)],
            )
            .unwrap()
        };
        assert_eq!((wait("1", "0.025"), wait("1", "0.05")), (0.0, 1.0));
        assert_eq!(wait("0", "+Inf"), 0.0);
        let wait_sum = value(
            &samples,
            "shardline_buffer_wait_seconds_sum",
            &[("shard", "1")],
        );
        assert_eq!(wait_sum, Some(0.03));
    }

    #[test]
    fn seconds_formatting_is_exact() {
        assert_eq!(us_as_seconds(100), "0.0001");
        assert_eq!(us_as_seconds(250), "0.00025");
        assert_eq!(us_as_seconds(1_000_000), "1");
        assert_eq!(us_as_seconds(2_500_000), "2.5");
        assert_eq!(us_as_seconds(0), "0");
        assert_eq!(us_as_seconds(1), "0.000001");
    }

    #[test]
    fn parser_rejects_malformed_text() {
        for bad in [
            "foo",
            "foo{a=\"1\"",
            "foo{a=1} 2",
            "foo{a=\"1\" b=\"2\"} 2",
            "1foo 2",
            "foo x",
            "# TYPE foo counter\nfoo 1",
            "foo_total 1\n# TYPE foo_total counter",
            "# TYPE a gauge\n# TYPE a gauge",
            "# HELP a x\n# HELP a y",
        ] {
            assert!(parse_exposition(bad).is_err(), "{bad:?} was accepted");
        }
        let ok =
            parse_exposition("# TYPE a_total counter\na_total{x=\"q\\\"\\\\\"} 1.5\n").unwrap();
        assert_eq!(ok[0].label("x"), Some("q\"\\"));
        assert_eq!(ok[0].value, 1.5);
    }

    #[test]
    fn no_shards_renders_nothing() {
        assert_eq!(render_prometheus(&[]), "");
    }
}
