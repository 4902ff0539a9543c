//! Configuration: a TOML file (every key optional) overridden by command-line flags, then
//! validated into one clear error naming the offending key or path.
//!
//! `config/shardline.toml` documents every key with its default and the reason for it.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod origin;
pub mod rules;

/// Smallest chunk we allow: below this, per-chunk overhead dominates.
pub const MIN_CHUNK_BYTES: usize = 64 * 1024;
/// Largest chunk: one registered buffer must stay well under the 1 GiB iovec limit.
pub const MAX_CHUNK_BYTES: usize = 16 * 1024 * 1024;
/// Most chunks one connection may have in flight.
pub const MAX_PIPELINE_DEPTH: usize = 16;
/// Default bound on a served socket's unsent bytes (TCP_NOTSENT_LOWAT, see
/// `notsent_lowat_bytes`): one chunk. Without a bound, a host's default (no limit) lets each
/// stalled client's socket queue megabytes, and 1000 of them push the host into TCP memory
/// pressure that slows every other transfer (`perf/LINK.md`).
pub const DEFAULT_NOTSENT_LOWAT_BYTES: u32 = 512 * 1024;
/// Smallest non-zero `notsent_lowat_bytes` accepted.
pub const MIN_NOTSENT_LOWAT_BYTES: u32 = 16 * 1024;
/// Most arena slots per shard: the kernel registers at most 2^14 buffers, and each shard
/// registers one more than its slots (the spare that TLS records are sealed into).
pub const MAX_ARENA_SLOTS: usize = 16 * 1024 - 1;
/// Most connections per shard (token slot field and fixed-file table size).
pub const MAX_CONNECTIONS_PER_SHARD: usize = 1 << 20;
/// Fewest provided receive buffers per shard (`recv_buffers` is a power of two from here).
pub const MIN_RECV_BUFFERS: usize = 16;
/// Longest completion-batching wait allowed.
pub const MAX_WAIT_BATCH_USEC: u64 = 1000;
/// Most shards (one per CPU; also the SO_REUSEPORT group size).
pub const MAX_SHARDS: usize = 1024;
/// Default `cache_revalidate_s`: 30 days (game files do not change under the same URL).
pub const DEFAULT_CACHE_REVALIDATE_S: u64 = 30 * 24 * 3600;
/// Default `cache_open_files`: data files the fill keeps open for writing.
pub const DEFAULT_CACHE_OPEN_FILES: usize = 1024;
/// Most `cache_open_files` may be (each is a descriptor of the process).
pub const MAX_CACHE_OPEN_FILES: usize = 65_536;
/// Most disks in `cache_dirs`.
pub const MAX_CACHE_DISKS: usize = 64;
/// `cache_disk_op_timeout_ms` when nothing sets it (Squid's swap-timeout is 7 s; an NVMe
/// drive's worst healthy fdatasync is well under a second).
pub const DEFAULT_DISK_OP_TIMEOUT_MS: u64 = 5_000;
/// Shortest `cache_disk_op_timeout_ms` (ms): an fdatasync of a busy healthy disk takes tens.
pub const MIN_DISK_OP_TIMEOUT_MS: u64 = 100;
/// Longest `cache_disk_op_timeout_ms` (ms).
pub const MAX_DISK_OP_TIMEOUT_MS: u64 = 600_000;
/// `cache_ready_wait_ms` when nothing sets it: a cache of a few hundred thousand objects
/// is whole before the shards start; a larger one serves (pulled requests passing through)
/// while it loads.
pub const DEFAULT_CACHE_READY_WAIT_MS: u64 = 1_000;
/// Longest `cache_ready_wait_ms` (ms).
pub const MAX_CACHE_READY_WAIT_MS: u64 = 600_000;
/// Slowest background scrub (`cache_scrub_bytes_per_s`, when on): 64 KiB/s.
pub const MIN_SCRUB_BYTES_PER_S: u64 = 64 * 1024;
/// Fastest background scrub: 10 GB/s (the rate is a cap; the scrub never goes ahead of
/// clients' reads).
pub const MAX_SCRUB_BYTES_PER_S: u64 = 10_000_000_000;
/// Largest `cache_revalidate_s`: 10 years.
pub const MAX_CACHE_REVALIDATE_S: u64 = 10 * 365 * 24 * 3600;
/// Default `cache_heuristic_max_s`: a day, as Traffic Server's `heuristic_max_lifetime` (a
/// version with only a Last-Modified costs one 304 a day at most).
pub const DEFAULT_CACHE_HEURISTIC_MAX_S: u64 = 24 * 3600;
/// Longest an origin's 404 may be remembered (`cache_404_s` is bounded by it).
pub const MAX_NOT_FOUND_S: u64 = 3600;
pub use origin::MAX_ORIGINS;
/// Smallest block size an object may record.
pub const MIN_BLOCK_BYTES: u32 = 64 * 1024;
/// Largest block size an object may record.
pub const MAX_BLOCK_BYTES: u32 = 64 * 1024 * 1024;
/// Most blocks `cache_read_ahead_blocks` may ask for past a request (64 MiB in 256 KiB blocks:
/// four origin requests of `fill::edge::RUN_BLOCKS`).
pub const MAX_READ_AHEAD_BLOCKS: u64 = 256;
/// Arena slots kept back from bulk transfers so a small response never waits behind them
/// (`arena_bytes` must leave this many beyond a pipeline).
pub const RESERVED_FOR_SMALL_SLOTS: usize = 4;

/// Default `egress_bypass_bytes`: a manifest or a small file goes whole past the egress queue.
pub const DEFAULT_EGRESS_BYPASS_BYTES: u64 = 256 * 1024;

/// Default health path on the serving listener (next to the diagnostic `/__shardline/zero`,
/// where it cannot shadow a published file by accident).
pub const DEFAULT_HEALTH_PATH: &str = "/__shardline/health";

/// Longest lame-duck window (`drain_accept_ms`): beyond it a stop looks like a hang.
pub const MAX_DRAIN_ACCEPT_MS: u64 = 600_000;

/// Smallest `tls_handshake_budget_bytes`: one largest ClientHello a connection may buffer
/// (`tls::session::HANDSHAKE_INCOMING_MAX_BYTES`, restated here so config stays a leaf; a test
/// holds them equal).
pub const MIN_TLS_HANDSHAKE_BUDGET_BYTES: usize = 72 * 1024;

/// Default admin listener: loopback only, so metrics are not exposed to clients by accident.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9900";
/// Default `admin_control_per_s`: control requests (with the token) the admin listener takes
/// a second; `shardline cache prefill` asks one per object of its list, and waits when told.
pub const DEFAULT_ADMIN_CONTROL_PER_S: u32 = 200;
/// Most `admin_control_per_s` may be.
pub const MAX_ADMIN_CONTROL_PER_S: u32 = 100_000;

/// How many shards to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardCount {
    /// One per CPU the process may run on (after the `cpus` selection).
    Auto,
    /// Exactly this many.
    Fixed(usize),
}

impl<'de> Deserialize<'de> for ShardCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) if n > 0 => Ok(ShardCount::Fixed(n as usize)),
            Raw::N(n) => Err(serde::de::Error::custom(format!(
                "must be \"auto\" or a positive number, got {n}"
            ))),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl std::str::FromStr for ShardCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(ShardCount::Auto);
        }
        match s.parse::<usize>() {
            Ok(0) => Err("must be \"auto\" or a positive number, got 0".into()),
            Ok(n) => Ok(ShardCount::Fixed(n)),
            Err(_) => Err(format!("must be \"auto\" or a positive number, got {s:?}")),
        }
    }
}

/// When to send with SEND_ZC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZeroCopy {
    /// SEND_ZC for large chunks unless the listener is on loopback (where it always copies).
    Auto,
    /// SEND_ZC for every chunk of at least `zerocopy_min_bytes`.
    On,
    /// Plain sends.
    Off,
}

/// Whether symlinks inside the root are followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SymlinkPolicy {
    /// Follow symlinks whose target stays beneath the root (RESOLVE_BENEATH); refuse others.
    Beneath,
    /// Refuse every symlink (RESOLVE_NO_SYMLINKS).
    Deny,
}

/// Where the strong ETag comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EtagSource {
    /// Size + modification time (to the nanosecond): the same on every edge that copied the
    /// file with its mtime (`rsync -a`, `cp -p`), whatever its inode.
    Mtime,
    /// The content digest the publisher stored in the `user.sha256` xattr (64 hex digits or
    /// 32 raw bytes), read once when the file is opened; files without it use size + mtime.
    Xattr,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Access log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// Common log format plus bytes, duration, range and shard.
    Common,
    /// One JSON object per line.
    Json,
}

/// What a client over `max_connections_per_client` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum ClientCapAction {
    /// Its request is answered `429 Too Many Requests` with `Retry-After`, then a close.
    #[serde(rename = "429")]
    TooManyRequests,
    /// The connection is closed before any request is read.
    #[serde(rename = "close")]
    Close,
}

/// Smallest `tls_record_bytes` (a record smaller than a TCP segment only adds overhead).
pub const MIN_TLS_RECORD_BYTES: usize = 1024;
/// Largest `tls_record_bytes` (TLS caps a record's plaintext at 2^14).
pub const MAX_TLS_RECORD_BYTES: usize = 16 * 1024;
/// Most `[[tls_certificate]]` entries.
pub const MAX_TLS_CERTIFICATES: usize = 256;

/// One certificate the TLS listener serves (`[[tls_certificate]]`; the first is the default).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsCertificate {
    /// PEM chain: the end-entity certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// A DER OCSP response to staple (refreshed by replacing the file and sending SIGHUP).
    #[serde(default)]
    pub ocsp: Option<PathBuf>,
}

/// Every setting of the server; defaults are the documented ones.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory served.
    pub root: PathBuf,
    /// Address the shards listen on (SO_REUSEPORT group).
    pub listen: SocketAddr,
    /// Number of shards.
    pub shards: ShardCount,
    /// CPU selection: "all", "nic-local" or a list such as "0-3,8".
    pub cpus: String,
    /// NIC whose queues the shards follow (for "nic-local" and the plan).
    pub nic: Option<String>,
    /// Run one shard per SMT thread instead of one per physical core.
    pub smt: bool,
    /// Attach the CBPF program that keeps a connection on the CPU that received it.
    pub steering: bool,
    /// Connections one shard holds at most; more are refused with 503.
    pub max_connections_per_shard: usize,
    /// Bytes per read/send chunk (one registered buffer).
    pub chunk_bytes: usize,
    /// Chunks one connection may have in flight.
    pub pipeline_depth: usize,
    /// Bytes one connection may add per loop tick before yielding.
    pub tick_budget_bytes: usize,
    /// Bytes of bulk work (reads planned plus chunk sends) one shard adds per loop tick, over
    /// all connections; bounds how long a tick runs, so a new request waits at most one.
    pub shard_tick_budget_bytes: usize,
    /// Registered buffer arena per shard.
    pub arena_bytes: usize,
    /// Files at least this large are read with O_DIRECT.
    pub direct_io_min_bytes: u64,
    /// SEND_ZC policy.
    pub zerocopy: ZeroCopy,
    /// Smallest chunk sent with SEND_ZC.
    pub zerocopy_min_bytes: usize,
    /// Most unsent bytes a served socket queues (TCP_NOTSENT_LOWAT, set on the listeners and
    /// inherited by accepted sockets) when the host's `net.ipv4.tcp_notsent_lowat` is higher;
    /// a lower host value is kept. 0 always keeps the host's.
    pub notsent_lowat_bytes: u32,
    /// Most ranges in one multi-range request before it is served whole.
    pub max_ranges: usize,
    /// Time a client has to send a complete request head.
    pub header_timeout_ms: u64,
    /// Time an idle keep-alive connection is kept.
    pub keepalive_timeout_ms: u64,
    /// Time a response may make no send progress before the connection is dropped.
    pub send_timeout_ms: u64,
    /// Longest a shard waits to gather several completions per wake-up (0 = wake per
    /// completion); bounds the latency it adds.
    pub wait_batch_usec: u64,
    /// Time in-flight responses get to finish once the listeners are closed.
    pub drain_timeout_ms: u64,
    /// After SIGTERM with no successor process on the address: how long the edge keeps
    /// accepting (health already 503, every response `Connection: close`) so the balancer's
    /// checks take it out of rotation before it refuses a connection.
    pub drain_accept_ms: u64,
    /// Open files cached per shard.
    pub open_file_cache_entries: usize,
    /// How long a cached open file is trusted before it is checked again.
    pub open_file_valid_ms: u64,
    /// Symlink policy.
    pub symlinks: SymlinkPolicy,
    /// ETag source: size + mtime, or a published content digest.
    pub etag: EtagSource,
    /// Access log path; empty or absent means off.
    pub access_log: Option<PathBuf>,
    /// Access log line format.
    pub access_log_format: AccessLogFormat,
    /// Serve `GET /__shardline/zero?bytes=N` (zeros from memory, no disk) for network tests.
    pub diag_endpoint: bool,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter (`info`, `debug`, `shardline=debug,warn`: tracing's EnvFilter syntax); the
    /// RUST_LOG environment variable overrides it at start-up; SIGHUP applies a new value.
    pub log_level: String,
    /// Provided receive buffers per shard (power of two).
    pub recv_buffers: usize,
    /// Admin listener address (`/metrics`, `/healthz`); empty means off.
    pub admin: String,
    /// File holding the bearer token the admin listener's control endpoints (`/cache/...`)
    /// require (mode 0600); absent: control is off (403), `/metrics` and `/healthz` still serve.
    pub admin_token_file: Option<PathBuf>,
    /// Control requests with the token the admin listener takes a second (one second's worth
    /// may come at once); past it they get 429.
    pub admin_control_per_s: u32,
    /// The only directory `POST /cache/prefill?list=` reads lists from; absent: a server-side
    /// prefill is refused.
    pub prefill_dir: Option<PathBuf>,
    /// Path on the serving listener that answers 200, or 503 once draining, without touching
    /// a file: what a load balancer on another host checks. Empty means off.
    pub health_path: String,
    /// Address of the TLS (HTTPS) listener, served by every shard beside `listen`; absent
    /// means no TLS.
    pub tls_listen: Option<SocketAddr>,
    /// Certificates served on `tls_listen`, picked by SNI (exact name, wildcard, then the
    /// first as default).
    pub tls_certificate: Vec<TlsCertificate>,
    /// Session-ticket keys shared by the fleet (48 bytes: current key; 96: current, then
    /// previous); absent means random keys per process, rotated every 6 hours.
    pub tls_ticket_key_file: Option<PathBuf>,
    /// Lifetime announced for tickets made with `tls_ticket_key_file` (seconds).
    pub tls_ticket_lifetime_s: u32,
    /// Plaintext bytes per TLS record (the last record of a chunk may be shorter).
    pub tls_record_bytes: usize,
    /// Time a client has from accept to a completed handshake.
    pub tls_handshake_timeout_ms: u64,
    /// Handshakes per shard that may wait for their turn; a new one past it is closed.
    pub tls_max_pending_handshakes: usize,
    /// Handshake bytes a shard holds at most, over all its handshaking connections (what
    /// arrived and rustls has not consumed: a ClientHello split over records waits whole); a
    /// receive that would pass it gets a handshake_failure alert and a close.
    pub tls_handshake_budget_bytes: usize,
    /// Every connection on `listen` starts with a PROXY protocol header (v1 or v2) from a
    /// peer in `trusted_proxies`, naming the client; anything else is closed and counted.
    pub proxy_protocol: bool,
    /// The same for connections on `tls_listen` (the header comes before the ClientHello).
    pub tls_proxy_protocol: bool,
    /// Peers (IP addresses or CIDR blocks) trusted to name the client: with a PROXY header,
    /// or with X-Forwarded-For / Forwarded. Empty: nobody.
    pub trusted_proxies: Vec<String>,
    /// Path prefixes whose requests must carry a valid signature (`[[signed_url]]`).
    pub signed_url: Vec<rules::RuleConfig>,
    /// Connections one client (address; IPv6 by `client_ipv6_prefix`) may hold open over all
    /// shards; 0 = no cap.
    pub max_connections_per_client: u32,
    /// Leading bits of an IPv6 address that name one client for the cap.
    pub client_ipv6_prefix: u8,
    /// What a connection over the cap gets.
    pub client_cap_action: ClientCapAction,
    /// Bytes per second one response may send once `limit_rate_after_bytes` have gone (as
    /// nginx's `limit_rate`); 0 = no limit.
    pub limit_rate_bytes_per_s: u64,
    /// Bytes a response sends at full speed before `limit_rate_bytes_per_s` applies.
    pub limit_rate_after_bytes: u64,
    /// Path prefixes with a rate of their own (`[[rate_limit]]`), in place of
    /// `limit_rate_bytes_per_s` for responses under them.
    pub rate_limit: Vec<rules::PrefixRate>,
    /// The whole edge's egress cap in bytes per second, over all shards and clients (an
    /// edge held to its commit rate); 0 = none.
    pub egress_limit_bytes_per_s: u64,
    /// First bytes of every response that skip the egress cap's queue (charged to it all the
    /// same, within a tenth of the cap): manifests and small files are never held behind bulk.
    pub egress_bypass_bytes: u64,
    /// Pull-through origins (`[[origin]]`): requests under their prefixes are filled from
    /// them into the cache; others are served from `root`.
    pub origin: Vec<origin::OriginConfig>,
    /// Where the pull-through cache keeps its journal and data files (one directory per
    /// shard beneath it); needed with `[[origin]]`.
    pub cache_dir: Option<PathBuf>,
    /// Several cache disks, one directory (one file system) each: each disk holds its own
    /// journal and data files, and new objects are spread over them by capacity. Instead of
    /// `cache_dir` (which is one disk).
    pub cache_dirs: Vec<PathBuf>,
    /// Refuse to start when a disk of `cache_dirs` cannot be opened (by default the others
    /// serve, with one warning line).
    pub cache_require_all_disks: bool,
    /// Block size of newly cached objects (each object keeps its own).
    pub cache_block_bytes: u32,
    /// Most blocks fetched ahead of what a request needs (the cap of the adaptive
    /// read-ahead: `fill::cache_fill::FillCore::read_ahead`).
    pub cache_read_ahead_blocks: u64,
    /// Longest a request waits for the fill before it gets a 504.
    pub cache_wait_timeout_ms: u64,
    /// Deadline of every cache disk operation (a journal append and its sync, a data file's
    /// create, a fill's write or sync): past it the disk is stalled, its clients go on from
    /// the origin (`cache::disk_health`).
    pub cache_disk_op_timeout_ms: u64,
    /// Longest start-up waits for the cache's index (its disks' locks and journals) before
    /// the shards serve without it: until it is whole, pulled requests pass through unstored
    /// and `/healthz` says `loading` (`fill::edge::SharedEdge::open_loading`). 0: at once.
    pub cache_ready_wait_ms: u64,
    /// Bytes of objects the cache keeps; past it, S3-FIFO evicts whole versions that no
    /// response is reading and no fetch is filling. 0: no budget (the directory grows).
    pub cache_max_bytes: u64,
    /// Seconds a cached version is served after the origin last confirmed it; the next request
    /// after that revalidates it (If-None-Match / If-Modified-Since; a 304 keeps it). 0: every
    /// request revalidates.
    pub cache_revalidate_s: u64,
    /// Longest heuristic freshness (RFC 9111 §4.2.2) a reply with a Last-Modified and no
    /// explicit lifetime gets (a tenth of its age since then, at least `HEURISTIC_MIN_S`).
    pub cache_heuristic_max_s: u64,
    /// Seconds an origin's 404 is remembered (its key's requests get it without asking the
    /// origin); 0: never.
    pub cache_404_s: u64,
    /// Most cached versions whose data file the fill keeps open for writing (least recently
    /// used closed first; a fetch under way keeps its own).
    pub cache_open_files: usize,
    /// Bytes per second the background scrub reads back to check cached blocks against their
    /// checksums (a bad one is dropped before a client meets it); 0: no scrub.
    pub cache_scrub_bytes_per_s: u64,
    /// The shard that runs the scrub (taken modulo the shard count): its reads' completions
    /// and the checks cost that shard's CPU, so an operator puts it where clients feel it
    /// least (the CPU taking the cache disk's interrupts, or the least loaded).
    pub cache_scrub_shard: usize,
    /// Seconds between two lookups of every origin's name (off the shard threads; new
    /// connections go to the latest addresses, in turn).
    pub origin_resolve_ttl_s: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            root: PathBuf::from("."),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            shards: ShardCount::Auto,
            cpus: "all".into(),
            nic: None,
            smt: false,
            steering: true,
            max_connections_per_shard: 16_384,
            chunk_bytes: 512 * 1024,
            pipeline_depth: 4,
            tick_budget_bytes: 1024 * 1024,
            shard_tick_budget_bytes: 2 * 1024 * 1024,
            arena_bytes: 64 * 1024 * 1024,
            direct_io_min_bytes: 8 * 1024 * 1024,
            zerocopy: ZeroCopy::Auto,
            zerocopy_min_bytes: 64 * 1024,
            notsent_lowat_bytes: DEFAULT_NOTSENT_LOWAT_BYTES,
            max_ranges: 16,
            header_timeout_ms: 10_000,
            keepalive_timeout_ms: 75_000,
            send_timeout_ms: 60_000,
            wait_batch_usec: 0,
            drain_timeout_ms: 10_000,
            drain_accept_ms: 3_000,
            open_file_cache_entries: 1024,
            open_file_valid_ms: 1_000,
            symlinks: SymlinkPolicy::Beneath,
            etag: EtagSource::Mtime,
            access_log: None,
            access_log_format: AccessLogFormat::Common,
            diag_endpoint: false,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            recv_buffers: 1024,
            admin: DEFAULT_ADMIN.into(),
            admin_token_file: None,
            admin_control_per_s: DEFAULT_ADMIN_CONTROL_PER_S,
            prefill_dir: None,
            health_path: DEFAULT_HEALTH_PATH.into(),
            tls_listen: None,
            tls_certificate: Vec::new(),
            tls_ticket_key_file: None,
            tls_ticket_lifetime_s: 12 * 3600,
            tls_record_bytes: MAX_TLS_RECORD_BYTES,
            tls_handshake_timeout_ms: 10_000,
            tls_max_pending_handshakes: 1024,
            tls_handshake_budget_bytes: 16 << 20,
            proxy_protocol: false,
            tls_proxy_protocol: false,
            trusted_proxies: Vec::new(),
            signed_url: Vec::new(),
            max_connections_per_client: 0,
            client_ipv6_prefix: 64,
            client_cap_action: ClientCapAction::TooManyRequests,
            limit_rate_bytes_per_s: 0,
            limit_rate_after_bytes: 0,
            rate_limit: Vec::new(),
            egress_limit_bytes_per_s: 0,
            egress_bypass_bytes: DEFAULT_EGRESS_BYPASS_BYTES,
            origin: Vec::new(),
            cache_dir: None,
            cache_dirs: Vec::new(),
            cache_require_all_disks: false,
            cache_block_bytes: 256 * 1024,
            cache_read_ahead_blocks: 256,
            cache_wait_timeout_ms: 60_000,
            cache_disk_op_timeout_ms: DEFAULT_DISK_OP_TIMEOUT_MS,
            cache_ready_wait_ms: DEFAULT_CACHE_READY_WAIT_MS,
            cache_max_bytes: 0,
            cache_revalidate_s: DEFAULT_CACHE_REVALIDATE_S,
            cache_heuristic_max_s: DEFAULT_CACHE_HEURISTIC_MAX_S,
            cache_404_s: 10,
            cache_open_files: DEFAULT_CACHE_OPEN_FILES,
            cache_scrub_bytes_per_s: 0,
            cache_scrub_shard: 0,
            origin_resolve_ttl_s: 60,
        }
    }
}

/// A configuration problem: the key (or path) and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The key or path at fault.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config error: {}: {}", self.key, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parses TOML text; unknown keys and wrong types are errors naming the key.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        toml::from_str::<Config>(text).map_err(|e| {
            let msg = e.message().to_string();
            // toml reports unknown fields as "unknown field `x`, expected ..."
            let key = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.starts_with("unknown field"))
                .map(str::to_string)
                // A bad value: toml points at it; its key is on the same line.
                .or_else(|| e.span().and_then(|span| key_on_line_of(text, span.start)))
                .unwrap_or_else(|| origin.display().to_string());
            err(&key, msg.replace('\n', " "))
        })
    }

    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(&path.display().to_string(), e.to_string()))?;
        Config::from_toml(&text, path)
    }

    /// The admin listener's address; `None` when `admin` is empty (off).
    pub fn admin_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        let v = self.admin.trim();
        if v.is_empty() {
            return Ok(None);
        }
        v.parse().map(Some).map_err(|_| {
            err(
                "admin",
                format!("{v:?} is not an ADDRESS:PORT (use \"\" to turn the admin listener off)"),
            )
        })
    }

    /// Registered arena slots per shard.
    pub fn arena_slots(&self) -> usize {
        self.arena_bytes / self.chunk_bytes
    }

    /// Checks relations between values; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match std::fs::metadata(&self.root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(err(
                    "root",
                    format!("{} is not a directory", self.root.display()),
                ))
            }
            Err(e) => return Err(err("root", format!("{}: {e}", self.root.display()))),
        }
        if let ShardCount::Fixed(n) = self.shards {
            if n == 0 || n > MAX_SHARDS {
                return Err(err(
                    "shards",
                    format!("must be 1..={MAX_SHARDS} or \"auto\""),
                ));
            }
        }
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes)
            || !self.chunk_bytes.is_power_of_two()
        {
            return Err(err(
                "chunk_bytes",
                format!("must be a power of two in {MIN_CHUNK_BYTES}..={MAX_CHUNK_BYTES}"),
            ));
        }
        if self.pipeline_depth == 0 || self.pipeline_depth > MAX_PIPELINE_DEPTH {
            return Err(err(
                "pipeline_depth",
                format!("must be 1..={MAX_PIPELINE_DEPTH}"),
            ));
        }
        if self.tick_budget_bytes < self.chunk_bytes {
            return Err(err(
                "tick_budget_bytes",
                "must be at least chunk_bytes (a connection must be able to add one chunk a tick)",
            ));
        }
        if self.shard_tick_budget_bytes < self.tick_budget_bytes {
            return Err(err(
                "shard_tick_budget_bytes",
                "must be at least tick_budget_bytes",
            ));
        }
        let slots = self.arena_slots();
        let needed = self.pipeline_depth + RESERVED_FOR_SMALL_SLOTS;
        if slots < needed || slots > MAX_ARENA_SLOTS {
            return Err(err(
                "arena_bytes",
                format!(
                    "gives {slots} chunks of {} bytes; need {needed}..={MAX_ARENA_SLOTS}",
                    self.chunk_bytes
                ),
            ));
        }
        if self.max_connections_per_shard == 0
            || self.max_connections_per_shard > MAX_CONNECTIONS_PER_SHARD
        {
            return Err(err(
                "max_connections_per_shard",
                format!("must be 1..={MAX_CONNECTIONS_PER_SHARD}"),
            ));
        }
        if self.max_ranges == 0 {
            return Err(err("max_ranges", "must be at least 1"));
        }
        for (key, v) in [
            ("header_timeout_ms", self.header_timeout_ms),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("send_timeout_ms", self.send_timeout_ms),
            ("open_file_valid_ms", self.open_file_valid_ms),
        ] {
            if v == 0 {
                return Err(err(key, "must be greater than 0"));
            }
        }
        if self.notsent_lowat_bytes != 0 && self.notsent_lowat_bytes < MIN_NOTSENT_LOWAT_BYTES {
            return Err(err(
                "notsent_lowat_bytes",
                format!(
                    "must be 0 (the host's setting) or at least {MIN_NOTSENT_LOWAT_BYTES} \
                     (smaller makes every send a round trip through the event loop)"
                ),
            ));
        }
        if self.wait_batch_usec > MAX_WAIT_BATCH_USEC {
            return Err(err(
                "wait_batch_usec",
                format!("must be 0..={MAX_WAIT_BATCH_USEC} (it adds latency to every response)"),
            ));
        }
        if self.drain_accept_ms > MAX_DRAIN_ACCEPT_MS {
            return Err(err(
                "drain_accept_ms",
                format!("must be 0..={MAX_DRAIN_ACCEPT_MS}"),
            ));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log_level).is_err() {
            return Err(err(
                "log_level",
                format!(
                    "{:?} is not a log filter (e.g. \"info\", \"shardline=debug\")",
                    self.log_level
                ),
            ));
        }
        if self.open_file_cache_entries == 0 || self.open_file_cache_entries > 65_536 {
            return Err(err("open_file_cache_entries", "must be 1..=65536"));
        }
        if !self.recv_buffers.is_power_of_two()
            || !(MIN_RECV_BUFFERS..=32_768).contains(&self.recv_buffers)
        {
            return Err(err(
                "recv_buffers",
                format!("must be a power of two in {MIN_RECV_BUFFERS}..=32768"),
            ));
        }
        let health = self.health_path.as_bytes();
        if !health.is_empty()
            && (health[0] != b'/' || !health.iter().all(|&b| b.is_ascii_graphic() && b != b'?'))
        {
            return Err(err(
                "health_path",
                "must be empty (off) or an absolute path without a query, e.g. \"/__shardline/health\"",
            ));
        }
        self.validate_tls()?;
        if !(16..=128).contains(&self.client_ipv6_prefix) {
            return Err(err("client_ipv6_prefix", "must be 16..=128"));
        }
        if self.signed_url.len() > rules::MAX_SIGNED_URL_RULES {
            return Err(err(
                "signed_url",
                format!("at most {} rules", rules::MAX_SIGNED_URL_RULES),
            ));
        }
        for rule in &self.signed_url {
            rule.validate().map_err(|e| err("signed_url", e))?;
        }
        if self.rate_limit.len() > rules::MAX_RATE_LIMIT_RULES {
            return Err(err(
                "rate_limit",
                format!("at most {} rules", rules::MAX_RATE_LIMIT_RULES),
            ));
        }
        for rule in &self.rate_limit {
            rule.validate().map_err(|e| err("rate_limit", e))?;
        }
        self.validate_cache()?;
        let trusted = crate::client::cidr::TrustedProxies::parse(&self.trusted_proxies)
            .map_err(|e| err("trusted_proxies", e))?;
        if (self.proxy_protocol || self.tls_proxy_protocol) && trusted.is_empty() {
            let key = if self.proxy_protocol {
                "proxy_protocol"
            } else {
                "tls_proxy_protocol"
            };
            return Err(err(
                key,
                "needs trusted_proxies: the PROXY header is accepted only from them",
            ));
        }
        if !(1..=MAX_ADMIN_CONTROL_PER_S).contains(&self.admin_control_per_s) {
            return Err(err(
                "admin_control_per_s",
                format!("must be 1..={MAX_ADMIN_CONTROL_PER_S}"),
            ));
        }
        if let Some(dir) = &self.prefill_dir {
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(err(
                        "prefill_dir",
                        format!("{} is not a directory", dir.display()),
                    ))
                }
                Err(e) => return Err(err("prefill_dir", format!("{}: {e}", dir.display()))),
            }
        }
        if let Some(admin) = self.admin_addr()? {
            if admin.ip() == self.listen.ip()
                && admin.port() == self.listen.port()
                && admin.port() != 0
            {
                return Err(err(
                    "admin",
                    format!("{admin} is also the data listener (listen)"),
                ));
            }
        }
        Ok(())
    }
}

impl Config {
    fn validate_cache(&self) -> Result<(), ConfigError> {
        if self.origin.len() > MAX_ORIGINS {
            return Err(err("origin", format!("at most {} origins", MAX_ORIGINS)));
        }
        for o in &self.origin {
            o.validate().map_err(|e| err("origin", e))?;
        }
        let b = self.cache_block_bytes;
        if !b.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&b) {
            return Err(err(
                "cache_block_bytes",
                format!(
                    "must be a power of two in {}..={}",
                    MIN_BLOCK_BYTES, MAX_BLOCK_BYTES
                ),
            ));
        }
        if self.cache_read_ahead_blocks > MAX_READ_AHEAD_BLOCKS {
            return Err(err(
                "cache_read_ahead_blocks",
                format!("at most {}", MAX_READ_AHEAD_BLOCKS),
            ));
        }
        if !(1..=3_600_000).contains(&self.cache_wait_timeout_ms) {
            return Err(err("cache_wait_timeout_ms", "must be 1..=3600000"));
        }
        if !(MIN_DISK_OP_TIMEOUT_MS..=MAX_DISK_OP_TIMEOUT_MS)
            .contains(&self.cache_disk_op_timeout_ms)
        {
            return Err(err(
                "cache_disk_op_timeout_ms",
                format!("must be {MIN_DISK_OP_TIMEOUT_MS}..={MAX_DISK_OP_TIMEOUT_MS}"),
            ));
        }
        if self.cache_ready_wait_ms > MAX_CACHE_READY_WAIT_MS {
            return Err(err(
                "cache_ready_wait_ms",
                format!("must be 0..={MAX_CACHE_READY_WAIT_MS}"),
            ));
        }
        if self.cache_revalidate_s > MAX_CACHE_REVALIDATE_S {
            return Err(err(
                "cache_revalidate_s",
                format!("at most {MAX_CACHE_REVALIDATE_S} (10 years)"),
            ));
        }
        if self.cache_heuristic_max_s > MAX_CACHE_REVALIDATE_S {
            return Err(err(
                "cache_heuristic_max_s",
                format!("at most {MAX_CACHE_REVALIDATE_S} (10 years)"),
            ));
        }
        if self.cache_scrub_bytes_per_s != 0
            && !(MIN_SCRUB_BYTES_PER_S..=MAX_SCRUB_BYTES_PER_S)
                .contains(&self.cache_scrub_bytes_per_s)
        {
            return Err(err(
                "cache_scrub_bytes_per_s",
                format!("0 (off) or {MIN_SCRUB_BYTES_PER_S}..={MAX_SCRUB_BYTES_PER_S}"),
            ));
        }
        if self.cache_scrub_shard >= MAX_SHARDS {
            return Err(err(
                "cache_scrub_shard",
                format!("must be below {MAX_SHARDS} (a shard's index)"),
            ));
        }
        if !(1..=86_400).contains(&self.origin_resolve_ttl_s) {
            return Err(err("origin_resolve_ttl_s", "must be 1..=86400"));
        }
        let max_404 = MAX_NOT_FOUND_S;
        if self.cache_404_s > max_404 {
            return Err(err("cache_404_s", format!("at most {max_404}")));
        }
        if !(1..=MAX_CACHE_OPEN_FILES).contains(&self.cache_open_files) {
            return Err(err(
                "cache_open_files",
                format!("must be 1..={MAX_CACHE_OPEN_FILES}"),
            ));
        }
        if self.origin.is_empty() {
            return Ok(());
        }
        if b as usize > self.chunk_bytes / 2 {
            // Each read of a pulled object holds whole blocks (to check them), and a TLS chunk
            // carries a little less than chunk_bytes of plaintext.
            return Err(err(
                "cache_block_bytes",
                format!("at most half of chunk_bytes ({})", self.chunk_bytes / 2),
            ));
        }
        if !self.cache_dirs.is_empty() {
            return self.validate_cache_dirs();
        }
        let Some(dir) = &self.cache_dir else {
            return Err(err(
                "cache_dir",
                "[[origin]] needs cache_dir (or cache_dirs): the directory the cache fills",
            ));
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(err(
                "cache_dir",
                format!("{} is not a directory", dir.display()),
            )),
            Err(e) => Err(err("cache_dir", format!("{}: {e}", dir.display()))),
        }
    }

    /// `cache_dirs`: 1 to `MAX_CACHE_DISKS` distinct directories, not beside `cache_dir`. A
    /// directory missing now is no error (the others serve) unless `cache_require_all_disks`.
    fn validate_cache_dirs(&self) -> Result<(), ConfigError> {
        if self.cache_dir.is_some() {
            return Err(err("cache_dirs", "set cache_dir or cache_dirs, not both"));
        }
        if self.cache_dirs.len() > MAX_CACHE_DISKS {
            return Err(err(
                "cache_dirs",
                format!("at most {MAX_CACHE_DISKS} disks"),
            ));
        }
        for (i, dir) in self.cache_dirs.iter().enumerate() {
            if self.cache_dirs[..i].contains(dir) {
                return Err(err(
                    "cache_dirs",
                    format!("{} is listed twice", dir.display()),
                ));
            }
            if self.cache_require_all_disks && !dir.is_dir() {
                return Err(err(
                    "cache_dirs",
                    format!(
                        "{} is not a directory (cache_require_all_disks)",
                        dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The cache's disks: `cache_dirs`, or `cache_dir` as the one disk (empty: no cache).
    pub fn cache_disks(&self) -> Vec<PathBuf> {
        if self.cache_dirs.is_empty() {
            self.cache_dir.iter().cloned().collect()
        } else {
            self.cache_dirs.clone()
        }
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let Some(tls) = self.tls_listen else {
            return Ok(());
        };
        if tls == self.listen && tls.port() != 0 {
            return Err(err(
                "tls_listen",
                format!("{tls} is also the cleartext listener (listen)"),
            ));
        }
        if self.tls_certificate.is_empty() {
            return Err(err(
                "tls_certificate",
                "tls_listen is set: add at least one [[tls_certificate]] with cert and key",
            ));
        }
        if self.tls_certificate.len() > MAX_TLS_CERTIFICATES {
            return Err(err(
                "tls_certificate",
                format!("at most {MAX_TLS_CERTIFICATES}"),
            ));
        }
        if !(MIN_TLS_RECORD_BYTES..=MAX_TLS_RECORD_BYTES).contains(&self.tls_record_bytes) {
            return Err(err(
                "tls_record_bytes",
                format!("must be {MIN_TLS_RECORD_BYTES}..={MAX_TLS_RECORD_BYTES}"),
            ));
        }
        if self.tls_handshake_timeout_ms == 0 {
            return Err(err("tls_handshake_timeout_ms", "must be greater than 0"));
        }
        if self.tls_max_pending_handshakes == 0 {
            return Err(err("tls_max_pending_handshakes", "must be at least 1"));
        }
        if self.tls_handshake_budget_bytes < MIN_TLS_HANDSHAKE_BUDGET_BYTES {
            return Err(err(
                "tls_handshake_budget_bytes",
                format!(
                    "must be at least {MIN_TLS_HANDSHAKE_BUDGET_BYTES} (one largest ClientHello)"
                ),
            ));
        }
        if self.tls_ticket_lifetime_s == 0 || self.tls_ticket_lifetime_s > 7 * 86_400 {
            return Err(err(
                "tls_ticket_lifetime_s",
                "must be 1..=604800 (RFC 8446 caps ticket lifetimes at 7 days)",
            ));
        }
        Ok(())
    }
}

/// Keys SIGHUP applies to the running server; every other key is fixed at start-up (it sized
/// memory, bound a socket or planned the shards) and a changed value is refused by name.
pub const RELOADABLE_KEYS: &[&str] = &[
    "header_timeout_ms",
    "keepalive_timeout_ms",
    "send_timeout_ms",
    "drain_timeout_ms",
    "drain_accept_ms",
    "tick_budget_bytes",
    "shard_tick_budget_bytes",
    "max_ranges",
    "wait_batch_usec",
    "open_file_valid_ms",
    "access_log",
    "access_log_format",
    "log_level",
    "diag_endpoint",
    "health_path",
    "tls_certificate",
    "tls_ticket_key_file",
    "tls_ticket_lifetime_s",
    "tls_handshake_timeout_ms",
    "tls_max_pending_handshakes",
    "tls_handshake_budget_bytes",
    "trusted_proxies",
    "signed_url",
    "max_connections_per_client",
    "client_ipv6_prefix",
    "client_cap_action",
    "limit_rate_bytes_per_s",
    "limit_rate_after_bytes",
    "rate_limit",
    "egress_limit_bytes_per_s",
    "egress_bypass_bytes",
    "cache_scrub_bytes_per_s",
    "cache_scrub_shard",
    "admin_token_file",
];

/// The outcome of a SIGHUP reload.
#[derive(Debug)]
pub struct Reload {
    /// The configuration to run with from now on.
    pub config: Config,
    /// Keys the new file changed that cannot change at runtime (their running value stays).
    pub refused: Vec<&'static str>,
}

impl Config {
    /// Applies the reloadable keys of `new` to `self` (the running configuration) and lists
    /// the fixed keys whose value in `new` differs from `started` (the configuration as loaded
    /// at start-up, before start-up fitted the arena to RLIMIT_MEMLOCK). The result is
    /// validated; an invalid one is an error and nothing changes.
    pub fn reload(&self, started: &Config, new: &Config) -> Result<Reload, ConfigError> {
        let mut refused = Vec::new();
        macro_rules! fixed {
            ($($key:ident),* $(,)?) => {
                $(if new.$key != started.$key {
                    refused.push(stringify!($key));
                })*
            };
        }
        fixed!(
            root,
            listen,
            shards,
            cpus,
            nic,
            smt,
            steering,
            max_connections_per_shard,
            chunk_bytes,
            pipeline_depth,
            arena_bytes,
            direct_io_min_bytes,
            zerocopy,
            zerocopy_min_bytes,
            notsent_lowat_bytes,
            open_file_cache_entries,
            symlinks,
            etag,
            log_format,
            recv_buffers,
            admin,
            admin_control_per_s,
            prefill_dir,
            tls_listen,
            tls_record_bytes,
            proxy_protocol,
            tls_proxy_protocol,
            origin,
            cache_dir,
            cache_dirs,
            cache_require_all_disks,
            cache_block_bytes,
            cache_read_ahead_blocks,
            cache_wait_timeout_ms,
            cache_disk_op_timeout_ms,
            cache_ready_wait_ms,
            cache_max_bytes,
            cache_revalidate_s,
            cache_heuristic_max_s,
            cache_404_s,
            cache_open_files,
            origin_resolve_ttl_s,
        );
        let mut config = self.clone();
        macro_rules! reloadable {
            ($($key:ident),* $(,)?) => {
                $(config.$key = new.$key.clone();)*
                const _: () = assert!([$(stringify!($key)),*].len() == RELOADABLE_KEYS.len());
            };
        }
        reloadable!(
            header_timeout_ms,
            keepalive_timeout_ms,
            send_timeout_ms,
            drain_timeout_ms,
            drain_accept_ms,
            tick_budget_bytes,
            shard_tick_budget_bytes,
            max_ranges,
            wait_batch_usec,
            open_file_valid_ms,
            access_log,
            access_log_format,
            log_level,
            diag_endpoint,
            health_path,
            tls_certificate,
            tls_ticket_key_file,
            tls_ticket_lifetime_s,
            tls_handshake_timeout_ms,
            tls_max_pending_handshakes,
            tls_handshake_budget_bytes,
            trusted_proxies,
            signed_url,
            max_connections_per_client,
            client_ipv6_prefix,
            client_cap_action,
            limit_rate_bytes_per_s,
            limit_rate_after_bytes,
            rate_limit,
            egress_limit_bytes_per_s,
            egress_bypass_bytes,
            cache_scrub_bytes_per_s,
            cache_scrub_shard,
            admin_token_file,
        );
        config.validate()?;
        Ok(Reload { config, refused })
    }
}

/// The bare key of the `key = value` line holding byte `offset` of `text`, if that is what the
/// line is.
fn key_on_line_of(text: &str, offset: usize) -> Option<String> {
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim();
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    bare.then(|| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::from_toml(s, Path::new("test.toml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.chunk_bytes, 512 * 1024);
        assert_eq!(c.pipeline_depth, 4);
        assert_eq!(c.shards, ShardCount::Auto);
        c.validate().unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("chunk_bytes = \"big\"", "chunk_bytes"),
            ("root = \"/srv\"\nlisten = \"nope\"\n", "listen"),
            ("zerocopy = \"maybe\"", "zerocopy"),
        ] {
            assert_eq!(parse(text).unwrap_err().key, key, "{text}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let e = parse("chunk_size = 3").unwrap_err();
        assert_eq!(e.key, "chunk_size");
    }

    #[test]
    fn zero_shards_is_refused() {
        let e = parse("shards = 0").unwrap_err();
        assert!(e.message.contains("positive"), "{e}");
        assert_eq!(e.key, "shards");
        assert_eq!(parse("shards = \"auto\"").unwrap().shards, ShardCount::Auto);
        assert_eq!(parse("shards = 3").unwrap().shards, ShardCount::Fixed(3));
    }

    #[test]
    fn root_must_be_a_directory() {
        let mut c = Config {
            root: PathBuf::from("/definitely/not/here"),
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "root");
        c.root = PathBuf::from("/proc/self/status");
        assert!(c
            .validate()
            .unwrap_err()
            .message
            .contains("not a directory"));
    }

    #[test]
    fn relations_are_checked() {
        let c = Config {
            tick_budget_bytes: 1000,
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "tick_budget_bytes");
        let c = Config {
            arena_bytes: 2 * 512 * 1024,
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "arena_bytes");
        let c = Config {
            chunk_bytes: 100_000,
            ..Config::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "chunk_bytes");
    }

    #[test]
    fn shipped_config_file_parses_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shardline.toml");
        let c = Config::from_file(&path).unwrap();
        let d = Config::default();
        assert_eq!(c.chunk_bytes, d.chunk_bytes);
        assert_eq!(c.tick_budget_bytes, d.tick_budget_bytes);
        assert_eq!(c.arena_bytes, d.arena_bytes);
        assert_eq!(c.direct_io_min_bytes, d.direct_io_min_bytes);
        assert_eq!(c.max_connections_per_shard, d.max_connections_per_shard);
        assert_eq!(c.admin, d.admin);
        assert_eq!(c.admin_token_file, d.admin_token_file);
        assert_eq!(c.admin_control_per_s, d.admin_control_per_s);
        assert_eq!(c.prefill_dir, d.prefill_dir);
        assert_eq!(c.tls_listen, d.tls_listen);
        assert_eq!(c.tls_record_bytes, d.tls_record_bytes);
        assert_eq!(c.tls_ticket_lifetime_s, d.tls_ticket_lifetime_s);
        assert_eq!(c.tls_handshake_timeout_ms, d.tls_handshake_timeout_ms);
        assert_eq!(c.tls_max_pending_handshakes, d.tls_max_pending_handshakes);
        assert_eq!(c.proxy_protocol, d.proxy_protocol);
        assert_eq!(c.tls_proxy_protocol, d.tls_proxy_protocol);
        assert_eq!(c.trusted_proxies, d.trusted_proxies);
        assert_eq!(c.cache_block_bytes, d.cache_block_bytes);
        assert_eq!(c.cache_read_ahead_blocks, d.cache_read_ahead_blocks);
        assert_eq!(c.cache_wait_timeout_ms, d.cache_wait_timeout_ms);
    }

    #[test]
    fn origins_need_a_cache_dir_and_http_urls() {
        let e = parse("[[origin]]\nurl = \"http://127.0.0.1:9\"\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "cache_dir");
        let e = parse("cache_dir = \"/\"\n[[origin]]\nurl = \"ftp://a\"\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "origin");
        let e = parse("cache_block_bytes = 1000\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "cache_block_bytes");
        let c = parse(
            "cache_dir = \"/\"\n[[origin]]\nurl = \"http://127.0.0.1:9\"\nprefix = \"/g/\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.origin[0].max_fetches, 8);
    }

    #[test]
    fn cache_dirs_are_several_disks_and_cache_dir_is_one() {
        let o = "[[origin]]\nurl = \"http://127.0.0.1:9\"\n";
        let c = parse(&format!("cache_dir = \"/\"\n{o}")).unwrap();
        assert_eq!(c.cache_disks(), [PathBuf::from("/")]);
        // A disk missing now is served around, unless every disk is required.
        let c = parse(&format!("cache_dirs = [\"/\", \"/no/such/disk\"]\n{o}")).unwrap();
        c.validate().unwrap();
        assert_eq!(c.cache_disks().len(), 2);
        let c = parse(&format!(
            "cache_dirs = [\"/\", \"/no/such/disk\"]\ncache_require_all_disks = true\n{o}"
        ))
        .unwrap();
        assert_eq!(c.validate().unwrap_err().key, "cache_dirs");
        for bad in [
            "cache_dir = \"/\"\ncache_dirs = [\"/\"]\n",
            "cache_dirs = [\"/\", \"/\"]\n",
        ] {
            let c = parse(&format!("{bad}{o}")).unwrap();
            assert_eq!(c.validate().unwrap_err().key, "cache_dirs", "{bad}");
        }
        assert!(
            parse("cache_dirs = \"/\"\n").is_err(),
            "a list, not a string"
        );
    }

    #[test]
    fn proxy_settings_need_valid_trusted_proxies() {
        let e = parse("proxy_protocol = true\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "proxy_protocol");
        let e = parse("tls_proxy_protocol = true\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "tls_proxy_protocol");
        let e = parse("trusted_proxies = [\"10.0.0.1/8\"]\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "trusted_proxies");
        assert!(e.message.contains("10.0.0.1/8"), "{}", e.message);
        parse("proxy_protocol = true\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n")
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn tls_settings_are_checked() {
        let base = "tls_listen = \"127.0.0.1:8443\"\n";
        let e = parse(base).unwrap().validate().unwrap_err();
        assert_eq!(e.key, "tls_certificate");
        let with_cert = format!("{base}[[tls_certificate]]\ncert = \"a.pem\"\nkey = \"a.key\"\n");
        parse(&with_cert).unwrap().validate().unwrap();
        for (line, key) in [
            ("tls_record_bytes = 100\n", "tls_record_bytes"),
            ("tls_record_bytes = 20000\n", "tls_record_bytes"),
            ("tls_handshake_timeout_ms = 0\n", "tls_handshake_timeout_ms"),
            (
                "tls_max_pending_handshakes = 0\n",
                "tls_max_pending_handshakes",
            ),
            ("tls_ticket_lifetime_s = 700000\n", "tls_ticket_lifetime_s"),
            (
                "tls_handshake_budget_bytes = 73727\n",
                "tls_handshake_budget_bytes",
            ),
        ] {
            let c = parse(&format!("{line}{with_cert}")).unwrap();
            assert_eq!(c.validate().unwrap_err().key, key, "{line}");
        }
        let same = parse(&format!("listen = \"127.0.0.1:8443\"\n{with_cert}")).unwrap();
        assert_eq!(same.validate().unwrap_err().key, "tls_listen");
        assert_eq!(
            parse("[[tls_certificate]]\ncert = \"a\"\nkey = \"b\"\nextra = 1\n")
                .unwrap_err()
                .key,
            "extra"
        );
    }

    #[test]
    fn reload_applies_runtime_keys_and_names_fixed_ones() {
        let started = parse("").unwrap();
        // Start-up shrank the arena to fit RLIMIT_MEMLOCK: not a change the file asked for.
        let running = Config {
            arena_bytes: started.arena_bytes / 2,
            ..started.clone()
        };
        let new = parse(
            "send_timeout_ms = 1234\nlog_level = \"debug\"\nchunk_bytes = 1048576\n\
             listen = \"127.0.0.1:1\"\n",
        )
        .unwrap();
        let r = running.reload(&started, &new).unwrap();
        assert_eq!(r.config.send_timeout_ms, 1234);
        assert_eq!(r.config.log_level, "debug");
        assert_eq!(r.config.chunk_bytes, running.chunk_bytes, "fixed key kept");
        assert_eq!(r.config.listen, running.listen);
        assert_eq!(r.config.arena_bytes, running.arena_bytes);
        assert_eq!(r.refused, vec!["listen", "chunk_bytes"]);
        // The same file again: nothing to refuse.
        assert!(running
            .reload(&started, &started)
            .unwrap()
            .refused
            .is_empty());
        // An invalid result changes nothing.
        let bad = parse("header_timeout_ms = 0").unwrap();
        assert_eq!(
            running.reload(&started, &bad).unwrap_err().key,
            "header_timeout_ms"
        );
    }

    #[test]
    fn the_read_ahead_is_capped() {
        let cap = MAX_READ_AHEAD_BLOCKS;
        parse(&format!("cache_read_ahead_blocks = {cap}"))
            .unwrap()
            .validate()
            .unwrap();
        let err = parse(&format!("cache_read_ahead_blocks = {}", cap + 1))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err.key, "cache_read_ahead_blocks");
    }

    #[test]
    fn health_path_is_checked() {
        assert_eq!(parse("").unwrap().health_path, DEFAULT_HEALTH_PATH);
        parse("health_path = \"\"").unwrap().validate().unwrap();
        parse("health_path = \"/lb-check\"")
            .unwrap()
            .validate()
            .unwrap();
        for bad in ["lb", "/a b", "/a?x=1"] {
            let c = parse(&format!("health_path = \"{bad}\"")).unwrap();
            assert_eq!(c.validate().unwrap_err().key, "health_path", "{bad}");
        }
    }

    #[test]
    fn admin_address_is_checked() {
        let c = parse("").unwrap();
        assert_eq!(
            c.admin_addr().unwrap(),
            Some("127.0.0.1:9900".parse().unwrap())
        );
        let c = parse("admin = \"\"").unwrap();
        assert_eq!(c.admin_addr().unwrap(), None);
        c.validate().unwrap();
        let c = parse("admin = \"[::1]:0\"").unwrap();
        assert_eq!(c.admin_addr().unwrap(), Some("[::1]:0".parse().unwrap()));
        let c = parse("admin = \"localhost\"").unwrap();
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "admin");
        assert!(e.message.contains("localhost"), "{e}");
        let c = parse("admin = \"127.0.0.1:8080\"").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "admin");
        assert_eq!(parse("admin = 9900").unwrap_err().key, "admin");
        // The control side: a rate within bounds, a prefill directory that is one.
        assert_eq!(
            parse("admin_control_per_s = 0")
                .unwrap()
                .validate()
                .unwrap_err()
                .key,
            "admin_control_per_s"
        );
        let c = parse("admin_control_per_s = 100001").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "admin_control_per_s");
        let c = parse("prefill_dir = \"/definitely/not/here\"").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "prefill_dir");
        let c = parse("prefill_dir = \"Cargo.toml\"\nadmin_token_file = \"/x\"").unwrap();
        assert_eq!(c.validate().unwrap_err().key, "prefill_dir");
        assert_eq!(c.admin_token_file, Some(PathBuf::from("/x")));
    }

    #[test]
    fn the_handshake_budget_floor_is_one_largest_client_hello() {
        assert_eq!(
            MIN_TLS_HANDSHAKE_BUDGET_BYTES,
            crate::tls::session::HANDSHAKE_INCOMING_MAX_BYTES
        );
    }
}
