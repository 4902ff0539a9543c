//! Process start-up: plan shards, bind the SO_REUSEPORT group, spawn and pin one thread per
//! shard, then run the lifecycle: SIGHUP reloads, SIGUSR1 reopens the access log,
//! SIGTERM/SIGINT leave rotation, hand the address over (or wait out the balancer's checks),
//! close the listeners and drain.
//!
//! Stopping, step by step (times from config; the README's "Running on a real host" shows it
//! behind HAProxy):
//! 1. SIGTERM: the health path and /healthz answer 503 at once; responses close their
//!    connections. If another process listens in our reuseport group (a successor started
//!    for a restart), new connections are steered to it (`steering::handover_program`) and
//!    the listeners close after `HANDOVER_GRACE_MS`, once our backlog is accepted. Otherwise
//!    the edge keeps accepting for `drain_accept_ms`, until the balancer has seen the 503s.
//! 2. The listeners close; in-flight responses get `drain_timeout_ms`, then the rest close.
//!    A second SIGTERM/SIGINT skips what is left of step 1.

use std::net::TcpListener;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::config::{Config, ConfigError, ShardCount};
use crate::metrics::ShardMetrics;
use crate::placement::{CpuSelection, PlanError, PlanRequest};
use crate::shard::{self, ShardParams};
use crate::topology::Topology;
use std::path::Path;

/// Listen backlog per shard socket (the kernel caps it at net.core.somaxconn).
pub const LISTEN_BACKLOG: i32 = 4096;
/// How often the main thread looks for signals and dead shards.
const MAIN_POLL_MS: u64 = 50;
/// After steering new connections to a successor: time for connections already in our
/// backlog (or mid-handshake) to be accepted before our listeners close.
pub const HANDOVER_GRACE_MS: u64 = 500;
/// Where the kernel says whether a closing listener's queued connections move to another
/// socket of its group (Linux 5.14+); without it a handover relies on `HANDOVER_GRACE_MS`.
const TCP_MIGRATE_REQ_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Why serving stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// Bad configuration, a busy port, an impossible CPU plan: exit code 2.
    Config(ConfigError),
    /// Start-up or runtime failure: exit code 1.
    Runtime(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "{e}"),
            ServeError::Runtime(m) => write!(f, "{m}"),
        }
    }
}

impl From<ConfigError> for ServeError {
    fn from(e: ConfigError) -> Self {
        ServeError::Config(e)
    }
}

/// The CPUs the shards run on, one shard each: the shard plan (`cpus`, `nic`, `smt`, `shards`)
/// over the host topology, restricted to the CPUs this process may use. Plan warnings (IRQ
/// affinity, NUMA placement, irqbalance) are logged.
pub fn shard_cpus(cfg: &Config) -> Result<Vec<usize>, ConfigError> {
    let err = |key: &str, message: String| ConfigError {
        key: key.into(),
        message,
    };
    let mut topo = Topology::read(Path::new("/")).map_err(|e| err("cpus", e.to_string()))?;
    topo.restrict_to_live_affinity()
        .map_err(|e| err("cpus", format!("reading this process's CPU affinity: {e}")))?;
    let request = PlanRequest {
        cpus: cfg
            .cpus
            .parse::<CpuSelection>()
            .map_err(|e| err("cpus", e.to_string()))?,
        nic: cfg.nic.clone(),
        shards: match cfg.shards {
            ShardCount::Auto => None,
            ShardCount::Fixed(n) => Some(n),
        },
        one_per_core: !cfg.smt,
    };
    let plan = crate::placement::plan(&topo, &request).map_err(|e| {
        let key = match e {
            PlanError::UnknownNic { .. } | PlanError::NicWithoutLocalCpus { .. } => "nic",
            PlanError::TooManyShards { .. } | PlanError::ZeroShards => "shards",
            _ => "cpus",
        };
        err(key, e.to_string())
    })?;
    for w in &plan.warnings {
        tracing::warn!("plan: {w}");
    }
    Ok(plan.cpus())
}

/// Binds one listener per shard on the same address (SO_REUSEPORT group).
pub fn bind_group(cfg: &Config, shards: usize) -> Result<Vec<TcpListener>, ConfigError> {
    bind_group_on(cfg, "listen", cfg.listen, &vec![None; shards])
}

/// Like `bind_group`, one listener per entry of `incoming_cpus`; a `Some(cpu)` listener is
/// marked with SO_INCOMING_CPU, so the kernel's own reuseport choice (used when no steering
/// program is attached, or it returns an index past the group: see `steering`) picks the
/// listener of the CPU that received the SYN (Linux 6.2+; older kernels ignore the mark).
fn bind_group_on(
    cfg: &Config,
    key: &str,
    addr: std::net::SocketAddr,
    incoming_cpus: &[Option<usize>],
) -> Result<Vec<TcpListener>, ConfigError> {
    let shards = incoming_cpus.len();
    let mut addr = addr;
    let mut out = Vec::with_capacity(shards);
    let host_notsent_lowat = host_tcp_notsent_lowat();
    for _ in 0..shards {
        let bind_err = |e: std::io::Error| ConfigError {
            key: key.into(),
            message: format!("{addr}: {e}"),
        };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(bind_err)?;
        sock.set_reuse_address(true).map_err(bind_err)?;
        sock.set_reuse_port(true).map_err(bind_err)?;
        // Accepted sockets inherit TCP_NODELAY: small responses leave at once.
        sock.set_tcp_nodelay(true).map_err(bind_err)?;
        // Accepted sockets inherit TCP_NOTSENT_LOWAT too: a bound on what a socket queues
        // unsent, never looser than the host's own.
        if let Some(bytes) = notsent_lowat_to_set(cfg.notsent_lowat_bytes, host_notsent_lowat) {
            sock.set_tcp_notsent_lowat(bytes).map_err(bind_err)?;
        }
        if let Some(cpu) = incoming_cpus[out.len()] {
            sock.set_cpu_affinity(cpu).map_err(bind_err)?;
        }
        sock.bind(&addr.into()).map_err(bind_err)?;
        sock.listen(LISTEN_BACKLOG).map_err(bind_err)?;
        let l: TcpListener = sock.into();
        // Port 0: the first socket picks the port, the rest join it.
        addr = l.local_addr().map_err(bind_err)?;
        out.push(l);
    }
    Ok(out)
}

/// Head-room kept below RLIMIT_MEMLOCK for locked pages the count does not see (the limit is
/// per user: another process of the same user may hold some).
const MEMLOCK_SLACK_BYTES: u64 = 256 * 1024;
/// `CAP_IPC_LOCK` bit in the capability masks of /proc/self/status.
const CAP_IPC_LOCK_BIT: u32 = 14;
/// Descriptors kept below RLIMIT_NOFILE for ordinary files and sockets (listeners, rings,
/// logs, admin connections) beside the fixed-file table.
const NOFILE_RESERVE: u64 = 64;
/// Fewest connections per shard worth starting with when RLIMIT_NOFILE is tight.
const MIN_CONNECTIONS_PER_SHARD: usize = 16;

/// The host's (this network namespace's) `net.ipv4.tcp_notsent_lowat`; unreadable counts as
/// the kernel default, no limit.
fn host_tcp_notsent_lowat() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_notsent_lowat")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u32::MAX)
}

/// The TCP_NOTSENT_LOWAT to set on the listeners: the configured bound when it is tighter
/// than the host's, else none (0 configured: always the host's).
fn notsent_lowat_to_set(configured: u32, host: u32) -> Option<u32> {
    (configured != 0 && configured < host).then_some(configured)
}

fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK_BIT) != 0)
}

/// `bytes` for people: "8 MiB", "3.5 MiB", "532 KiB".
fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= MIB {
        let tenths = (bytes * 10).div_ceil(MIB);
        if tenths.is_multiple_of(10) {
            format!("{} MiB", tenths / 10)
        } else {
            format!("{}.{} MiB", tenths / 10, tenths % 10)
        }
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// "1 shard", "2 shards".
fn shard_count(n: usize) -> String {
    format!("{n} shard{}", if n == 1 { "" } else { "s" })
}

/// Per-shard sizes of the registered (locked) memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LockedSizes {
    arena_slots: usize,
    chunk_bytes: usize,
    recv_buffers: usize,
}

impl LockedSizes {
    fn of(cfg: &Config) -> LockedSizes {
        LockedSizes {
            arena_slots: cfg.arena_slots(),
            chunk_bytes: cfg.chunk_bytes,
            recv_buffers: cfg.recv_buffers,
        }
    }

    /// Bytes one shard with these sizes charges to RLIMIT_MEMLOCK.
    fn memlock_bytes(&self, page_bytes: u64) -> u64 {
        crate::shard::ring::memlock_bytes(
            crate::shard::SQ_ENTRIES,
            crate::shard::CQ_ENTRIES,
            u16::try_from(self.recv_buffers).unwrap_or(u16::MAX),
            u16::try_from(self.arena_slots).unwrap_or(u16::MAX),
            self.chunk_bytes,
            page_bytes,
        )
    }
}

/// What fits in a memlock budget: how many shards, each with these sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MemlockFit {
    shards: usize,
    sizes: LockedSizes,
}

/// The largest arena (then the most receive buffers) one shard can have within `budget` bytes,
/// never above `wanted`: chunks halve (down to MIN_CHUNK_BYTES) until the minimum number of
/// slots fits, then as many slots as fit are taken; receive buffers drop to the minimum only if
/// even that does not fit. None when the smallest shard does not fit.
fn fit_shard(budget: u64, wanted: LockedSizes, min_slots: usize, page: u64) -> Option<LockedSizes> {
    let recv_choices = [wanted.recv_buffers, crate::config::MIN_RECV_BUFFERS];
    for recv_buffers in recv_choices {
        let mut chunk = wanted.chunk_bytes;
        let with = |arena_slots, chunk_bytes| LockedSizes {
            arena_slots,
            chunk_bytes,
            recv_buffers: recv_buffers.min(wanted.recv_buffers),
        };
        while chunk > crate::config::MIN_CHUNK_BYTES
            && with(min_slots, chunk).memlock_bytes(page) > budget
        {
            chunk /= 2;
        }
        if with(min_slots, chunk).memlock_bytes(page) > budget {
            continue;
        }
        let fixed = with(0, chunk).memlock_bytes(page);
        let per_slot = with(1, chunk).memlock_bytes(page) - fixed;
        // Never more than asked for: the configured arena in bytes, in slots of this size.
        let wanted_slots =
            (wanted.arena_slots * wanted.chunk_bytes / chunk).min(crate::config::MAX_ARENA_SLOTS);
        let slots = (((budget - fixed) / per_slot) as usize).min(wanted_slots);
        return Some(with(slots.max(min_slots), chunk));
    }
    None
}

/// Fits `shards` shards wanting `wanted` each into `limit` bytes of locked memory: unchanged if
/// they fit; else the most shards (down to one) that fit with a smaller arena (and, if need be,
/// fewer receive buffers), sized by `fit_shard`. Err carries the smallest shard's need.
fn fit_memlock(
    limit: u64,
    shards: usize,
    wanted: LockedSizes,
    min_slots: usize,
    page: u64,
) -> Result<Option<MemlockFit>, u64> {
    let budget = limit.saturating_sub(MEMLOCK_SLACK_BYTES);
    let shards = shards.max(1);
    if wanted.memlock_bytes(page).saturating_mul(shards as u64) <= budget {
        return Ok(None);
    }
    for n in (1..=shards).rev() {
        if let Some(sizes) = fit_shard(budget / n as u64, wanted, min_slots, page) {
            return Ok(Some(MemlockFit { shards: n, sizes }));
        }
    }
    let smallest = LockedSizes {
        arena_slots: min_slots,
        chunk_bytes: crate::config::MIN_CHUNK_BYTES,
        recv_buffers: crate::config::MIN_RECV_BUFFERS,
    };
    Err(smallest.memlock_bytes(page) + MEMLOCK_SLACK_BYTES)
}

/// Registered memory counts against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. Raises
/// the soft limit to the hard one; if `shards` shards (each: io_uring rings, receive-buffer
/// ring, arena) still do not fit, starts with what does (smaller arena and chunks, then fewer
/// receive buffers, then fewer shards) and says so in one warning. Returns the number of shards
/// to start; fails only when not even one minimal shard fits.
pub fn fit_arena_to_memlock(cfg: &mut Config, shards: usize) -> Result<usize, ConfigError> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    if has_cap_ipc_lock() {
        return Ok(shards);
    }
    let mut lim = getrlimit(Resource::Memlock);
    if lim.current != lim.maximum {
        let raised = rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if setrlimit(Resource::Memlock, raised).is_ok() {
            lim = getrlimit(Resource::Memlock);
        }
    }
    let Some(limit) = lim.current else {
        return Ok(shards); // unlimited
    };
    let page = rustix::param::page_size() as u64;
    let wanted = LockedSizes::of(cfg);
    let min_slots = cfg.pipeline_depth + crate::shard::buffers::RESERVED_FOR_SMALL_SLOTS;
    let fit = match fit_memlock(limit, shards, wanted, min_slots, page) {
        Ok(None) => return Ok(shards),
        Ok(Some(fit)) => fit,
        Err(minimum) => {
            return Err(ConfigError {
                key: "RLIMIT_MEMLOCK".into(),
                message: format!(
                    "the locked-memory limit is {}, but even one shard needs {} (io_uring \
                     rings, receive-buffer ring and an arena of {} chunks); raise it with \
                     `ulimit -l` (or LimitMEMLOCK= in a systemd unit), or grant CAP_IPC_LOCK",
                    human_bytes(limit),
                    human_bytes(minimum),
                    min_slots
                ),
            })
        }
    };
    let s = fit.sizes;
    let arena_bytes = s.arena_slots * s.chunk_bytes;
    tracing::warn!(
        memlock_bytes = limit,
        shards_from = shards,
        shards_to = fit.shards,
        arena_bytes_to = arena_bytes,
        chunk_bytes_to = s.chunk_bytes,
        recv_buffers_to = s.recv_buffers,
        "RLIMIT_MEMLOCK is {}, less than the {} of registered memory {} want: starting {} \
         with {} arenas of {} chunks and {} receive buffers; raise it (ulimit -l, \
         LimitMEMLOCK=) for full-size arenas",
        human_bytes(limit),
        human_bytes(wanted.memlock_bytes(page) * shards as u64),
        shard_count(shards),
        shard_count(fit.shards),
        human_bytes(arena_bytes as u64),
        human_bytes(s.chunk_bytes as u64),
        s.recv_buffers
    );
    cfg.arena_bytes = arena_bytes;
    cfg.chunk_bytes = s.chunk_bytes;
    cfg.recv_buffers = s.recv_buffers;
    cfg.tick_budget_bytes = cfg.tick_budget_bytes.max(cfg.chunk_bytes);
    cfg.shard_tick_budget_bytes = cfg.shard_tick_budget_bytes.max(cfg.tick_budget_bytes);
    cfg.validate()?;
    Ok(fit.shards)
}

/// Fixed-file table sizes (connections, open files) that fit under a hard RLIMIT_NOFILE of
/// `hard`; None when the configured ones fit, Err when not even MIN_CONNECTIONS_PER_SHARD do.
/// The file cache gives way only when it would otherwise take more than half the room.
fn fit_nofile(hard: u64, conns: usize, files: usize) -> Result<Option<(usize, usize)>, u64> {
    let overflow = u64::from(crate::shard::OVERFLOW_SOCKET_SLOTS);
    let needed = (conns + files) as u64 + overflow + NOFILE_RESERVE;
    if hard >= needed {
        return Ok(None);
    }
    let room = hard.saturating_sub(overflow + NOFILE_RESERVE) as usize;
    let files = files.min(room / 2).max(1);
    let conns = conns.min(room.saturating_sub(files));
    if conns < MIN_CONNECTIONS_PER_SHARD {
        return Err(MIN_CONNECTIONS_PER_SHARD as u64 + 1 + overflow + NOFILE_RESERVE);
    }
    Ok(Some((conns, files)))
}

/// The ring's fixed-file table (sockets + files) may not exceed RLIMIT_NOFILE: raise the soft
/// limit towards the hard one (as nginx's worker_rlimit_nofile); if the hard limit is too low,
/// lower the connection cap (and, if need be, the open-file cache) to fit, with one warning.
pub fn fit_file_table_to_nofile(cfg: &mut Config) -> Result<(), ConfigError> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let conns = cfg.max_connections_per_shard;
    let files = cfg.open_file_cache_entries;
    let lim = getrlimit(Resource::Nofile);
    let hard = lim.maximum.unwrap_or(u64::MAX);
    let (fit_conns, fit_files) = match fit_nofile(hard, conns, files) {
        Ok(None) => (conns, files),
        Ok(Some(fit)) => fit,
        Err(minimum) => {
            return Err(ConfigError {
                key: "RLIMIT_NOFILE".into(),
                message: format!(
                    "the descriptor limit is {hard}, but a shard needs at least {minimum}; \
                     raise it with `ulimit -n` (or LimitNOFILE= in a systemd unit)"
                ),
            })
        }
    };
    let needed = (fit_conns + fit_files) as u64
        + u64::from(crate::shard::OVERFLOW_SOCKET_SLOTS)
        + NOFILE_RESERVE;
    if lim.current.is_some_and(|c| c < needed) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(needed.min(hard)),
                maximum: lim.maximum,
            },
        );
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    if soft < needed {
        return Err(ConfigError {
            key: "RLIMIT_NOFILE".into(),
            message: format!(
                "the soft descriptor limit is {soft} and could not be raised to {needed}; raise \
                 it with `ulimit -n` (or LimitNOFILE= in a systemd unit)"
            ),
        });
    }
    if (fit_conns, fit_files) != (conns, files) {
        tracing::warn!(
            nofile_hard = hard,
            max_connections_per_shard_to = fit_conns,
            open_file_cache_entries_to = fit_files,
            "RLIMIT_NOFILE allows {hard} descriptors, fewer than the {} fixed-file slots a shard \
             wants: serving at most {fit_conns} connections per shard with an open-file cache \
             of {fit_files}; raise it (ulimit -n, LimitNOFILE=) for {conns}",
            (conns + files) as u64
                + u64::from(crate::shard::OVERFLOW_SOCKET_SLOTS)
                + NOFILE_RESERVE
        );
        cfg.max_connections_per_shard = fit_conns;
        cfg.open_file_cache_entries = fit_files;
        cfg.validate()?;
    }
    Ok(())
}

/// Applies a new log filter (tracing EnvFilter syntax).
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String>>;

/// How SIGHUP re-reads the configuration, and how a new log filter is applied.
pub struct Reloader {
    /// Loads the configuration again the way start-up did (file plus command-line flags).
    pub load: Box<dyn Fn() -> Result<Config, ConfigError>>,
    /// Applies a new `log_level`.
    pub set_log_level: SetLogLevel,
}

impl Reloader {
    /// No reload source: SIGHUP re-applies the start-up configuration (nothing changes).
    pub fn fixed(cfg: &Config) -> Reloader {
        let cfg = cfg.clone();
        Reloader {
            load: Box::new(move || Ok(cfg.clone())),
            set_log_level: Box::new(|_| Ok(())),
        }
    }
}

/// Runs the server until SIGTERM/SIGINT and a drain; SIGHUP re-applies the start-up config.
pub fn serve(cfg: Config) -> Result<(), ServeError> {
    let reloader = Reloader::fixed(&cfg);
    serve_with(cfg, reloader)
}

/// Inodes of our listening sockets (how `/proc/net/tcp` names them).
fn socket_inodes(listeners: &[TcpListener]) -> Vec<u64> {
    listeners
        .iter()
        .filter_map(|l| rustix::fs::fstat(l).ok().map(|st| st.st_ino))
        .collect()
}

/// Listening sockets of other processes in our reuseport group.
fn foreign_listeners(local: &std::net::SocketAddr, own: &[u64]) -> usize {
    crate::handover::foreign_listeners(Path::new("/proc/net"), local, own)
}

/// Runs the server until SIGTERM/SIGINT and a drain, reloading through `reloader` on SIGHUP.
pub fn serve_with(mut cfg: Config, reloader: Reloader) -> Result<(), ServeError> {
    cfg.validate()?;
    let started_cfg = cfg.clone();
    let mut cpus = shard_cpus(&cfg)?;
    let shards = fit_arena_to_memlock(&mut cfg, cpus.len())?;
    cpus.truncate(shards);
    fit_file_table_to_nofile(&mut cfg)?;
    let incoming: Vec<Option<usize>> = cpus.iter().map(|&c| cfg.steering.then_some(c)).collect();
    let listeners = bind_group_on(&cfg, "listen", cfg.listen, &incoming)?;
    let local = listeners[0]
        .local_addr()
        .map_err(|e| ServeError::Runtime(e.to_string()))?;
    let tls_builder = crate::tls::TlsBuilder::new().map_err(tls_config_error)?;
    let tls_context = tls_builder.build(&cfg).map_err(tls_config_error)?;
    let signing = crate::signing::Signing::load(&cfg.signed_url).map_err(|e| {
        ServeError::Config(ConfigError {
            key: e.file.display().to_string(),
            message: format!("signed_url key file: {}", e.message),
        })
    })?;
    // Refused here, before anything serves: a token file others may read, or a bad token.
    let admin_token = crate::admin::auth::AdminToken::load(cfg.admin_token_file.as_deref())
        .map_err(|message| {
            ServeError::Config(ConfigError {
                key: "admin_token_file".into(),
                message,
            })
        })?;
    let admin_token = Arc::new(crate::admin::auth::TokenSlot::new(admin_token));
    let tls_listeners = match cfg.tls_listen {
        Some(addr) => bind_group_on(&cfg, "tls_listen", addr, &incoming)?,
        None => Vec::new(),
    };
    let tls_local = tls_listeners.first().and_then(|l| l.local_addr().ok());
    let own_inodes = socket_inodes(&listeners);
    let predecessor = foreign_listeners(&local, &own_inodes);
    if predecessor > 0 {
        // A restart: the old process still serves and owns indices 0..n of the group.
        tracing::info!(
            listen = %local,
            other_listeners = predecessor,
            "another process listens on this address (restart handover): its steering stays \
             until it leaves; send it SIGTERM to hand new connections to this process"
        );
    } else if cfg.steering && listeners.len() > 1 {
        // Every socket is listening, so group index == shard index == listen order.
        let program = crate::steering::reuseport_cbpf_program(&cpus);
        for group in [&listeners, &tls_listeners] {
            if let Some(first) = group.first() {
                crate::shard::ring_sys::attach_reuseport_cbpf(first.as_fd(), &program).map_err(
                    |e| ServeError::Runtime(format!("attaching reuseport steering: {e}")),
                )?;
            }
        }
    }
    // The main thread keeps its own descriptors of the listeners until step 2 of the stop,
    // to steer the group away from them at a handover.
    let clone_all = |group: &[TcpListener]| -> Result<Vec<TcpListener>, ServeError> {
        group
            .iter()
            .map(TcpListener::try_clone)
            .collect::<Result<_, _>>()
            .map_err(|e| ServeError::Runtime(format!("duplicating a listener: {e}")))
    };
    let listener_fds = clone_all(&listeners)?;
    let tls_listener_fds = clone_all(&tls_listeners)?;
    let cfg = Arc::new(cfg);
    let lifecycle = crate::lifecycle::Lifecycle::new(cfg.clone());
    lifecycle.set_tls(tls_context);
    lifecycle.set_signing(Arc::new(signing));
    let shutdown = Arc::new(AtomicBool::new(false));
    let log_epoch = Arc::new(AtomicU64::new(0));
    let signals = signal_hook::iterator::Signals::new([
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGUSR1,
        libc::SIGHUP,
    ])
    .map_err(|e| ServeError::Runtime(format!("installing signal handlers: {e}")))?;
    // The pull-through cache all shards share: its journals are replayed once, on the
    // loader's thread; past `cache_ready_wait_ms` the shards serve while it goes on.
    let disks = cfg.cache_disks();
    let edge = match disks.first() {
        Some(dir) if !cfg.origin.is_empty() => {
            let in_dir = |e| ServeError::Runtime(format!("cache_dir {}: {e}", dir.display()));
            let (shared, loader) =
                crate::fill::edge::SharedEdge::open_loading(&disks, cpus.len(), &cfg)
                    .map_err(in_dir)?;
            match loader.wait_ms(cfg.cache_ready_wait_ms) {
                Some(result) => result.map_err(in_dir)?,
                None => tracing::warn!(
                    cache_dir = %dir.display(),
                    cache_ready_wait_ms = cfg.cache_ready_wait_ms,
                    "serving while the cache loads: pulled requests pass through unstored and \
                     /healthz says loading until it is done (shardline_cache_load_* in /metrics)"
                ),
            }
            Some(shared)
        }
        _ => None,
    };
    let (ready_tx, ready_rx) = mpsc::channel::<(usize, std::io::Result<()>)>();
    let mut handles = Vec::with_capacity(cpus.len());
    let mut all_metrics = Vec::with_capacity(cpus.len());
    let mut tls_listeners = tls_listeners.into_iter();
    for (index, (listener, &cpu)) in listeners.into_iter().zip(&cpus).enumerate() {
        let metrics = Arc::new(ShardMetrics::default());
        // The per-origin families' labels (rendered from shard 0's).
        let _ = metrics.origins.names.set(
            cfg.origin
                .iter()
                .map(|o| (o.url.clone(), o.prefix.clone()))
                .collect(),
        );
        if let Some(e) = &edge {
            let _ = metrics.cache_load.set(e.load.clone());
        }
        all_metrics.push(metrics.clone());
        let params = ShardParams {
            index,
            config: cfg.clone(),
            listener,
            tls_listener: tls_listeners.next(),
            shutdown: shutdown.clone(),
            metrics,
            log_epoch: log_epoch.clone(),
            lifecycle: lifecycle.clone(),
            edge: edge.clone(),
        };
        let tx = ready_tx.clone();
        let h = std::thread::Builder::new()
            .name(format!("shard-{index}"))
            .spawn(move || {
                if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                    tracing::warn!(shard = index, cpu, "could not pin shard thread");
                }
                shard::run(params, |r| {
                    let _ = tx.send((index, r));
                });
            })
            .map_err(|e| ServeError::Runtime(format!("spawning shard thread: {e}")))?;
        handles.push(h);
    }
    drop(ready_tx);
    let mut failure = None;
    for _ in 0..handles.len() {
        match ready_rx.recv() {
            Ok((_, Ok(()))) => {}
            Ok((i, Err(e))) => failure = Some(format!("shard {i} failed to start: {e}")),
            Err(_) => failure = Some("a shard thread died during start-up".into()),
        }
    }
    if let Some(msg) = failure {
        shutdown.store(true, Ordering::Relaxed);
        for h in handles {
            let _ = h.join();
        }
        return Err(ServeError::Runtime(msg));
    }
    // The shards serve; now the admin listener (it reads their metrics, never the reverse).
    let admin = match crate::admin::start(
        cfg.admin_addr()?,
        all_metrics.clone(),
        lifecycle.leaving_flag(),
        PathBuf::from("/proc"),
        edge.clone(),
        Some(loopback_if_unspecified(local)),
        crate::admin::Control {
            token: admin_token.clone(),
            per_s: cfg.admin_control_per_s,
            prefill_dir: cfg.prefill_dir.clone(),
        },
    ) {
        Ok(a) => a,
        Err(e) => {
            shutdown.store(true, Ordering::Relaxed);
            for h in handles {
                let _ = h.join();
            }
            return Err(ServeError::Config(ConfigError {
                key: "admin".into(),
                message: format!("{}: {e}", cfg.admin.trim()),
            }));
        }
    };
    tracing::info!(
        shards = cpus.len(),
        cpus = ?cpus,
        listen = %local,
        root = %cfg.root.display(),
        "shardline serving"
    );
    println!(
        "shardline: serving {} at http://{local}/ ({} shard{} on CPU {:?})",
        cfg.root.display(),
        cpus.len(),
        if cpus.len() == 1 { "" } else { "s" },
        cpus
    );
    if let Some(tls) = tls_local {
        tracing::info!(tls_listen = %tls, "TLS listener serving");
        println!("shardline: HTTPS at https://{tls}/");
    }
    if let Some(a) = &admin {
        tracing::info!(admin = %a.local_addr(), "admin listener serving /metrics and /healthz");
        if admin_token.get().is_none() {
            tracing::warn!(
                admin = %a.local_addr(),
                "admin listener: control is off (no admin_token_file): every /cache/ request \
                 gets 403; /metrics and /healthz are served"
            );
        }
        // After the serving line: tools that take the first "http://" line get the data port.
        println!("shardline: admin at http://{}/", a.local_addr());
    }
    let mut signals = signals;
    let mut stop_signal = None;
    while stop_signal.is_none() {
        for sig in signals.pending() {
            match sig {
                // Log rotation: every shard reopens its access log.
                libc::SIGUSR1 => {
                    log_epoch.fetch_add(1, Ordering::Relaxed);
                }
                libc::SIGHUP => reload(
                    &started_cfg,
                    &lifecycle,
                    &reloader,
                    &tls_builder,
                    &admin_token,
                ),
                _ => stop_signal = Some(sig),
            }
        }
        if handles.iter().any(|h| h.is_finished()) {
            tracing::error!("a shard stopped unexpectedly; shutting down");
            shutdown.store(true, Ordering::Relaxed);
            for h in handles {
                let _ = h.join();
            }
            return Err(ServeError::Runtime("a shard stopped unexpectedly".into()));
        }
        if stop_signal.is_none() {
            std::thread::sleep(Duration::from_millis(MAIN_POLL_MS));
        }
    }
    // Step 1: out of rotation at once; hand over or wait for the balancer's checks.
    lifecycle.start_leaving();
    let running = lifecycle.config();
    let successor = foreign_listeners(&local, &own_inodes);
    let accept_for_ms = if successor > 0 {
        hand_over(&listener_fds, successor, &cpus);
        if !tls_listener_fds.is_empty() {
            let tls_addr = tls_local.unwrap_or(local);
            let tls_inodes = socket_inodes(&tls_listener_fds);
            let tls_successor = foreign_listeners(&tls_addr, &tls_inodes);
            if tls_successor > 0 {
                hand_over(&tls_listener_fds, tls_successor, &cpus);
            }
        }
        HANDOVER_GRACE_MS
    } else {
        running.drain_accept_ms
    };
    tracing::info!(
        signal = stop_signal,
        successor_listeners = successor,
        accept_for_ms,
        drain_timeout_ms = running.drain_timeout_ms,
        "leaving rotation: health answers 503; accepting, then draining in-flight responses"
    );
    wait_or_signal(&mut signals, Duration::from_millis(accept_for_ms));
    // Step 2: listeners close (the shards drop theirs; ours go first), in-flight drains.
    drop(listener_fds);
    drop(tls_listener_fds);
    shutdown.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(admin);
    tracing::info!("shardline stopped");
    Ok(())
}

/// Sleeps up to `d`; a further SIGTERM/SIGINT ends it early (an operator in a hurry).
/// A certificate or key-file problem at start-up, as a configuration error naming the file.
fn tls_config_error(e: crate::tls::TlsError) -> ServeError {
    ServeError::Config(ConfigError {
        key: e.file.display().to_string(),
        message: e.message,
    })
}

fn wait_or_signal(signals: &mut signal_hook::iterator::Signals, d: Duration) {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        if signals
            .pending()
            .any(|s| s == libc::SIGTERM || s == libc::SIGINT)
        {
            tracing::info!("second stop signal: closing the listeners now");
            return;
        }
        std::thread::sleep(Duration::from_millis(MAIN_POLL_MS).min(d));
    }
}

/// Steers new connections of the group to the `successor` process's sockets and away from
/// ours (`steering::handover_program`; our SO_INCOMING_CPU marks are cleared so the kernel's
/// fallback never picks us either), so our listeners can close without a queued connection.
fn hand_over(listeners: &[TcpListener], successor: usize, cpus: &[usize]) {
    let program = crate::steering::handover_program(listeners.len(), successor, cpus);
    match crate::shard::ring_sys::attach_reuseport_cbpf(listeners[0].as_fd(), &program) {
        Ok(()) => tracing::info!(
            successor_listeners = successor,
            "handover: new connections go to the successor process"
        ),
        Err(e) => tracing::warn!(error = %e, "handover: steering to the successor failed"),
    }
    for l in listeners {
        // usize::MAX is -1 as the kernel's int: "no CPU".
        if let Err(e) = socket2::SockRef::from(l).set_cpu_affinity(usize::MAX) {
            tracing::warn!(error = %e, "handover: clearing SO_INCOMING_CPU failed");
        }
    }
    let migrate = std::fs::read_to_string(TCP_MIGRATE_REQ_SYSCTL).unwrap_or_default();
    if migrate.trim() != "1" {
        tracing::warn!(
            "net.ipv4.tcp_migrate_req is not 1: a connection that reaches our backlog in the \
             last instant before the listeners close is reset instead of moving to the \
             successor (sysctl -w net.ipv4.tcp_migrate_req=1)"
        );
    }
}

/// SIGHUP: load the configuration again, apply what may change at runtime, and name every
/// key that may not (its running value stays).
fn reload(
    started: &Config,
    lifecycle: &crate::lifecycle::Lifecycle,
    reloader: &Reloader,
    tls: &crate::tls::TlsBuilder,
    admin_token: &crate::admin::auth::TokenSlot,
) {
    let new = match (reloader.load)() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(key = %e.key, error = %e.message, "reload refused: {e}");
            return;
        }
    };
    let running = lifecycle.config();
    let mut outcome = match running.reload(started, &new) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(key = %e.key, error = %e.message, "reload refused: {e}");
            return;
        }
    };
    // Certificates and ticket keys are read again even when the file names did not change
    // (renewed in place); a file that fails keeps everything TLS as it runs.
    match tls.build(&outcome.config) {
        Ok(ctx) => lifecycle.set_tls(ctx),
        Err(e) => {
            tracing::error!(
                file = %e.file.display(),
                error = %e.message,
                "reload: TLS not reloaded, the running certificates and ticket keys stay: {e}"
            );
            outcome.config.tls_certificate = running.tls_certificate.clone();
            outcome.config.tls_ticket_key_file = running.tls_ticket_key_file.clone();
            outcome.config.tls_ticket_lifetime_s = running.tls_ticket_lifetime_s;
        }
    }
    // Signing keys are read again too (rotated in place); a file that fails keeps the rules
    // and keys as they run.
    match crate::signing::Signing::load(&outcome.config.signed_url) {
        Ok(s) => lifecycle.set_signing(Arc::new(s)),
        Err(e) => {
            tracing::error!(
                file = %e.file.display(),
                error = %e.message,
                "reload: signed_url keys not reloaded, the running rules and keys stay: {e}"
            );
            outcome.config.signed_url = running.signed_url.clone();
        }
    }
    // The admin token is read again too (rotated in place); a file that fails keeps the token
    // that runs.
    match crate::admin::auth::AdminToken::load(outcome.config.admin_token_file.as_deref()) {
        Ok(token) => {
            if token.is_none() && admin_token.get().is_some() {
                tracing::warn!("reload: no admin_token_file: admin control is off from now on");
            }
            admin_token.set(token);
        }
        Err(e) => {
            tracing::error!(
                key = "admin_token_file",
                error = %e,
                "reload: admin token not reloaded, the running one stays: {e}"
            );
            outcome.config.admin_token_file = running.admin_token_file.clone();
        }
    }
    for key in &outcome.refused {
        tracing::warn!(
            key,
            "reload: `{key}` cannot change while running; keeping the running value (restart \
             to apply it)"
        );
    }
    if outcome.config.log_level != running.log_level {
        if let Err(e) = (reloader.set_log_level)(&outcome.config.log_level) {
            tracing::warn!(key = "log_level", error = %e, "reload: log_level not applied");
        }
    }
    lifecycle.publish(outcome.config);
    tracing::info!(
        epoch = lifecycle.epoch(),
        refused = outcome.refused.len(),
        "configuration reloaded"
    );
}

/// `addr`, reached on loopback when it is a wildcard (what a local client connects to).
pub fn loopback_if_unspecified(mut addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

#[cfg(test)]
mod tests {
    #[test]
    fn notsent_lowat_bounds_but_never_loosens_the_host() {
        use super::notsent_lowat_to_set as set;
        // The kernel default (no limit): the bound applies.
        assert_eq!(set(512 * 1024, u32::MAX), Some(512 * 1024));
        // The field profile's 16 KiB is tighter: kept.
        assert_eq!(set(512 * 1024, 16384), None);
        assert_eq!(set(512 * 1024, 512 * 1024), None);
        // 0: always the host's.
        assert_eq!(set(0, u32::MAX), None);
    }

    use super::*;

    const PAGE: u64 = 4096;
    const MIB: u64 = 1 << 20;
    /// The defaults: 64 MiB arena of 512 KiB chunks, 1024 receive buffers.
    const DEFAULT: LockedSizes = LockedSizes {
        arena_slots: 128,
        chunk_bytes: 512 * 1024,
        recv_buffers: 1024,
    };
    /// pipeline_depth 4 + 4 slots held back for small responses.
    const MIN_SLOTS: usize = 8;

    #[test]
    fn ring_memory_is_counted_as_measured_on_6_18() {
        // Measured as nobody under an 8 MiB limit: 4096/16384 rings charge 133 pages; with no
        // buffer ring 1915 4 KiB arena pages still fit, 1916 do not (2048 - 133 = 1915). With
        // no slot, the sealing spare is still registered: one chunk more.
        let rings = crate::shard::ring::memlock_bytes(4096, 16384, 0, 0, 4096, PAGE);
        assert_eq!(rings, 134 * PAGE);
        // A 1024-entry buffer ring is 4 pages (1911 arena pages fit with it, as measured).
        let with_recv = crate::shard::ring::memlock_bytes(4096, 16384, 1024, 0, 4096, PAGE);
        assert_eq!(with_recv - rings, 4 * PAGE);
        assert_eq!(
            DEFAULT.memlock_bytes(PAGE),
            137 * PAGE + 64 * MIB + 512 * 1024,
            "arena + its spare + rings + buffer ring"
        );
    }

    #[test]
    fn enough_memlock_changes_nothing() {
        assert_eq!(fit_memlock(1 << 30, 4, DEFAULT, MIN_SLOTS, PAGE), Ok(None));
    }

    #[test]
    fn eight_mib_keeps_two_shards_with_smaller_arenas() {
        let fit = fit_memlock(8 * MIB, 2, DEFAULT, MIN_SLOTS, PAGE)
            .unwrap()
            .unwrap();
        assert_eq!(fit.shards, 2);
        assert_eq!(fit.sizes.chunk_bytes, 256 * 1024);
        assert_eq!(fit.sizes.recv_buffers, 1024);
        assert!(fit.sizes.arena_slots >= MIN_SLOTS);
        // Everything the kernel will charge fits, with the slack left over.
        let total = fit.sizes.memlock_bytes(PAGE) * 2;
        assert!(total + MEMLOCK_SLACK_BYTES <= 8 * MIB, "{total}");
        // One more slot would not.
        let bigger = LockedSizes {
            arena_slots: fit.sizes.arena_slots + 1,
            ..fit.sizes
        };
        assert!(bigger.memlock_bytes(PAGE) * 2 + MEMLOCK_SLACK_BYTES > 8 * MIB);
    }

    #[test]
    fn eight_mib_with_one_shard_counts_the_rings_too() {
        // The old fit left 1 MiB "slack" per shard but the rings alone take 532 KiB and it
        // planned 7 MiB of arena: the sum must now stay under the limit.
        let fit = fit_memlock(8 * MIB, 1, DEFAULT, MIN_SLOTS, PAGE)
            .unwrap()
            .unwrap();
        assert_eq!(fit.shards, 1);
        assert_eq!(fit.sizes.chunk_bytes, 512 * 1024);
        // 13 slots and the sealing spare.
        assert_eq!(fit.sizes.arena_slots, 13);
        assert!(fit.sizes.memlock_bytes(PAGE) + MEMLOCK_SLACK_BYTES <= 8 * MIB);
    }

    #[test]
    fn many_cpus_start_fewer_shards_and_tiny_limits_fail() {
        // 16 CPUs at 8 MiB: 16 rings alone would exceed it.
        let fit = fit_memlock(8 * MIB, 16, DEFAULT, MIN_SLOTS, PAGE)
            .unwrap()
            .unwrap();
        assert!(fit.shards < 16 && fit.shards >= 1, "{fit:?}");
        assert_eq!(fit.sizes.chunk_bytes, crate::config::MIN_CHUNK_BYTES);
        assert!(fit.sizes.memlock_bytes(PAGE) * fit.shards as u64 + MEMLOCK_SLACK_BYTES <= 8 * MIB);
        // Just enough for one minimal shard: receive buffers give way as well.
        let minimal = LockedSizes {
            arena_slots: MIN_SLOTS,
            chunk_bytes: crate::config::MIN_CHUNK_BYTES,
            recv_buffers: crate::config::MIN_RECV_BUFFERS,
        };
        let need = minimal.memlock_bytes(PAGE) + MEMLOCK_SLACK_BYTES;
        let fit = fit_memlock(need, 4, DEFAULT, MIN_SLOTS, PAGE)
            .unwrap()
            .unwrap();
        assert_eq!((fit.shards, fit.sizes), (1, minimal));
        assert_eq!(
            fit_memlock(need - 1, 4, DEFAULT, MIN_SLOTS, PAGE),
            Err(need)
        );
        assert_eq!(
            fit_memlock(64 * 1024, 1, DEFAULT, MIN_SLOTS, PAGE),
            Err(need)
        );
    }

    #[test]
    fn nofile_fits_the_connection_cap_to_the_hard_limit() {
        // Defaults: 16384 connections + 64 overflow + 1024 files + 64 reserve = 17536.
        assert_eq!(fit_nofile(17_536, 16_384, 1024), Ok(None));
        assert_eq!(fit_nofile(1 << 20, 16_384, 1024), Ok(None));
        assert_eq!(
            fit_nofile(4096, 16_384, 1024),
            Ok(Some((4096 - 64 - 64 - 1024, 1024)))
        );
        // A low limit: the file cache takes at most half of what is left.
        assert_eq!(fit_nofile(1024, 16_384, 1024), Ok(Some((448, 448))));
        assert!(fit_nofile(100, 16_384, 1024).is_err());
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_bytes(8 * MIB), "8 MiB");
        assert_eq!(human_bytes(7 * MIB / 2), "3.5 MiB");
        assert_eq!(human_bytes(133 * PAGE), "532 KiB");
    }
}
