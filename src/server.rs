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
use crate::plan::{CpuSelection, PlanError, PlanRequest};
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
    let plan = crate::plan::plan(&topo, &request).map_err(|e| {
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
    bind_group_on(cfg, &vec![None; shards])
}

/// Like `bind_group`, one listener per entry of `incoming_cpus`; a `Some(cpu)` listener is
/// marked with SO_INCOMING_CPU, so the kernel's own reuseport choice (used when no steering
/// program is attached, or it returns an index past the group: see `steering`) picks the
/// listener of the CPU that received the SYN (Linux 6.2+; older kernels ignore the mark).
fn bind_group_on(
    cfg: &Config,
    incoming_cpus: &[Option<usize>],
) -> Result<Vec<TcpListener>, ConfigError> {
    let shards = incoming_cpus.len();
    let mut addr = cfg.listen;
    let mut out = Vec::with_capacity(shards);
    for _ in 0..shards {
        let bind_err = |e: std::io::Error| ConfigError {
            key: "listen".into(),
            message: format!("{addr}: {e}"),
        };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(bind_err)?;
        sock.set_reuse_address(true).map_err(bind_err)?;
        sock.set_reuse_port(true).map_err(bind_err)?;
        // Accepted sockets inherit TCP_NODELAY: small responses leave at once.
        sock.set_tcp_nodelay(true).map_err(bind_err)?;
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

/// Head-room left in RLIMIT_MEMLOCK per shard for the ring's own pinned pages.
const MEMLOCK_SLACK_PER_SHARD_BYTES: u64 = 1 << 20;
/// `CAP_IPC_LOCK` bit in the capability masks of /proc/self/status.
const CAP_IPC_LOCK_BIT: u32 = 14;

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

/// Registered buffers count against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. Raise
/// the soft limit to the hard one; if the arenas still do not fit, shrink the arena (and, if
/// needed, the chunk size) to what does, with a warning, so the default command works for an
/// unprivileged user with the usual 8 MiB limit. Nothing silent: the new sizes are logged.
pub fn fit_arena_to_memlock(cfg: &mut Config, shards: usize) -> Result<(), ConfigError> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    if has_cap_ipc_lock() {
        return Ok(());
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
        return Ok(()); // unlimited
    };
    let per_shard = (limit / shards.max(1) as u64).saturating_sub(MEMLOCK_SLACK_PER_SHARD_BYTES);
    if cfg.arena_bytes as u64 <= per_shard {
        return Ok(());
    }
    let min_slots = (cfg.pipeline_depth + crate::shard::buffers::RESERVED_FOR_SMALL_SLOTS) as u64;
    let mut chunk = cfg.chunk_bytes as u64;
    while chunk > crate::config::MIN_CHUNK_BYTES as u64 && min_slots * chunk > per_shard {
        chunk /= 2;
    }
    let slots = per_shard / chunk;
    if slots < min_slots {
        return Err(ConfigError {
            key: "arena_bytes".into(),
            message: format!(
                "RLIMIT_MEMLOCK is {limit} bytes: too small for {shards} registered arenas of at \
                 least {min_slots} chunks; raise it (ulimit -l, LimitMEMLOCK=) or run fewer shards"
            ),
        });
    }
    let arena = slots * chunk;
    tracing::warn!(
        memlock_bytes = limit,
        shards,
        arena_bytes_from = cfg.arena_bytes,
        arena_bytes_to = arena,
        chunk_bytes_to = chunk,
        "registered arena shrunk to fit RLIMIT_MEMLOCK; raise the limit for full-size arenas"
    );
    cfg.arena_bytes = arena as usize;
    cfg.chunk_bytes = chunk as usize;
    cfg.tick_budget_bytes = cfg.tick_budget_bytes.max(cfg.chunk_bytes);
    cfg.validate()
}

/// The ring's fixed-file table (sockets + files) may not exceed RLIMIT_NOFILE: raise the soft
/// limit to the hard one (as nginx's worker_rlimit_nofile), or say which key to lower.
pub fn fit_file_table_to_nofile(cfg: &Config) -> Result<(), ConfigError> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let needed = (cfg.max_connections_per_shard
        + crate::shard::OVERFLOW_SOCKET_SLOTS as usize
        + cfg.open_file_cache_entries) as u64
        + 64;
    let lim = getrlimit(Resource::Nofile);
    if lim.current.is_none_or(|c| c >= needed) {
        return Ok(());
    }
    let target = match lim.maximum {
        None => needed,
        Some(max) => max.min(needed.max(lim.current.unwrap_or(0))),
    };
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: lim.maximum,
        },
    );
    if getrlimit(Resource::Nofile)
        .current
        .is_none_or(|c| c >= needed)
    {
        return Ok(());
    }
    Err(ConfigError {
        key: "max_connections_per_shard".into(),
        message: format!(
            "the fixed-file table needs {needed} entries but RLIMIT_NOFILE allows {:?}; raise \
             `ulimit -n` or lower max_connections_per_shard / open_file_cache_entries",
            lim.maximum
        ),
    })
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
    let cpus = shard_cpus(&cfg)?;
    fit_arena_to_memlock(&mut cfg, cpus.len())?;
    fit_file_table_to_nofile(&cfg)?;
    let incoming: Vec<Option<usize>> = cpus.iter().map(|&c| cfg.steering.then_some(c)).collect();
    let listeners = bind_group_on(&cfg, &incoming)?;
    let local = listeners[0]
        .local_addr()
        .map_err(|e| ServeError::Runtime(e.to_string()))?;
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
        crate::shard::ring_sys::attach_reuseport_cbpf(listeners[0].as_fd(), &program)
            .map_err(|e| ServeError::Runtime(format!("attaching reuseport steering: {e}")))?;
    }
    // The main thread keeps its own descriptors of the listeners until step 2 of the stop,
    // to steer the group away from them at a handover.
    let listener_fds: Vec<TcpListener> = listeners
        .iter()
        .map(TcpListener::try_clone)
        .collect::<Result<_, _>>()
        .map_err(|e| ServeError::Runtime(format!("duplicating a listener: {e}")))?;
    let cfg = Arc::new(cfg);
    let lifecycle = crate::lifecycle::Lifecycle::new(cfg.clone());
    let shutdown = Arc::new(AtomicBool::new(false));
    let log_epoch = Arc::new(AtomicU64::new(0));
    let signals = signal_hook::iterator::Signals::new([
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGUSR1,
        libc::SIGHUP,
    ])
    .map_err(|e| ServeError::Runtime(format!("installing signal handlers: {e}")))?;
    let (ready_tx, ready_rx) = mpsc::channel::<(usize, std::io::Result<()>)>();
    let mut handles = Vec::with_capacity(cpus.len());
    let mut all_metrics = Vec::with_capacity(cpus.len());
    for (index, (listener, &cpu)) in listeners.into_iter().zip(&cpus).enumerate() {
        let metrics = Arc::new(ShardMetrics::default());
        all_metrics.push(metrics.clone());
        let params = ShardParams {
            index,
            config: cfg.clone(),
            listener,
            shutdown: shutdown.clone(),
            metrics,
            log_epoch: log_epoch.clone(),
            lifecycle: lifecycle.clone(),
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
    if let Some(a) = &admin {
        tracing::info!(admin = %a.local_addr(), "admin listener serving /metrics and /healthz");
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
                libc::SIGHUP => reload(&started_cfg, &lifecycle, &reloader),
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
    shutdown.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    drop(admin);
    tracing::info!("shardline stopped");
    Ok(())
}

/// Sleeps up to `d`; a further SIGTERM/SIGINT ends it early (an operator in a hurry).
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
fn reload(started: &Config, lifecycle: &crate::lifecycle::Lifecycle, reloader: &Reloader) {
    let new = match (reloader.load)() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(key = %e.key, error = %e.message, "reload refused: {e}");
            return;
        }
    };
    let running = lifecycle.config();
    let outcome = match running.reload(started, &new) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(key = %e.key, error = %e.message, "reload refused: {e}");
            return;
        }
    };
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
