//! The `shardline` command line: parse flags, then hand over to the library.

use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use shardline::config::{Config, LogFormat, ShardCount};

/// mimalloc, not glibc's malloc: the cache's start-up allocates one body per version on its
/// loading threads, and glibc grows a thread's arena a page at a time, an mprotect each
/// (248 000 for 10 million versions); with mimalloc they were ready about a quarter sooner.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// shardline: a shard-per-core io_uring HTTP/1.1 download engine for game-update CDN edges.
#[derive(Parser)]
#[command(name = "shardline", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a directory over HTTP/1.1 (GET/HEAD, Range, keep-alive) from one shard per CPU.
    Serve(ServeArgs),
    /// Print the shard plan: shard -> CPU -> core -> NUMA node -> NIC queue/IRQ, with warnings.
    Plan(shardline::placement::PlanArgs),
    /// Check this host (sysctls, NIC rings/offloads/MTU/drops, memlock, O_DIRECT) for the
    /// traps that masquerade as slow storage or a slow network.
    Doctor(shardline::doctor::DoctorArgs),
    /// TLS helpers for operators.
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Sign a URL for a `[[signed_url]]` prefix: prints it with its expiry, key id and
    /// HMAC-SHA256 signature appended.
    Sign(SignArgs),
    /// The pull-through cache: what its directory holds, whether it reads back, and purging
    /// objects from a running server.
    #[command(subcommand)]
    Cache(CacheCommand),
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Objects, versions, blocks and bytes the cache's journal vouches for.
    Stats(CacheDirArgs),
    /// Reads every block the journal vouches for and checks its CRC-32C; exit 1 and a line
    /// per block when any fails (a running server drops and refetches such a block when it
    /// reads it).
    Verify(CacheDirArgs),
    /// Tells a running server (through its admin listener) to forget an object, every
    /// object under a prefix, or (`--tag T`) every object its origin tagged T in its
    /// `purge_tag_header`: the next request fetches it from the origin again.
    Purge(CachePurgeArgs),
    /// Fills a running server's cache with the objects a list names (a URL or a path per
    /// line; blank lines and `#` comments skipped) before clients ask: what is cached is
    /// skipped, the rest is fetched through the server's own listener at `--rate` at most.
    /// The whole list is checked first (a line that is not a URL or that no `[[origin]]`
    /// covers is named, and nothing is fetched). Exit 1 with a summary if any object failed.
    Prefill(CachePrefillArgs),
    /// The cache's disks on a running server: `status` lists each one (state, id, errors by
    /// kind, bytes used) and those left out at start-up; `offline DISK` takes one out (its
    /// objects become misses, no fill goes to it; kept on the disk across restarts);
    /// `online DISK` brings it back (it takes its share of new objects). DISK is a
    /// directory of `cache_dirs`, or a slot from `status`.
    Disk(CacheDiskArgs),
}

/// Flags of `shardline cache disk`.
#[derive(Args)]
struct CacheDiskArgs {
    /// status, offline or online.
    #[arg(value_parser = ["status", "offline", "online"])]
    action: String,
    /// The disk (offline, online): its directory in `cache_dirs`, or its slot.
    disk: Option<String>,
    /// The server's admin listener (ADDRESS:PORT).
    #[arg(long, value_name = "ADDR", conflicts_with = "config")]
    admin: Option<std::net::SocketAddr>,
    /// The server's config file (its `admin` address and `admin_token_file`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The admin token's file (mode 0600), in place of the config's `admin_token_file`.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// Flags of `shardline cache prefill`.
#[derive(Args)]
struct CachePrefillArgs {
    /// The list: a file, or - for standard input.
    list: String,
    /// The server's config file (its `admin` and `listen` addresses, and its
    /// `admin_token_file`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["admin", "edge"])]
    config: Option<PathBuf>,
    /// The admin token's file (mode 0600), in place of the config's `admin_token_file`.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The server's admin listener (ADDRESS:PORT), with --edge.
    #[arg(long, value_name = "ADDR", requires = "edge")]
    admin: Option<std::net::SocketAddr>,
    /// The server's listener the objects are fetched through (ADDRESS:PORT), with --admin.
    #[arg(long, value_name = "ADDR", requires = "admin")]
    edge: Option<std::net::SocketAddr>,
    /// Most bytes per second fetched, over all objects (0: no cap).
    #[arg(long, value_name = "BYTES_PER_S", default_value_t = 0)]
    rate: u64,
    /// Objects fetched at once (each waits the origin's first byte; a few keep it busy).
    #[arg(long, value_name = "N", default_value_t = shardline::cache::prefill::DEFAULT_PARALLEL)]
    parallel: usize,
    /// Keep every listed object from eviction until then: Unix seconds, or +N[smhd] from now
    /// (as +72h). Held in the server's memory: a restart keeps the objects, not the pins.
    #[arg(long, value_name = "TIME")]
    pin_until: Option<String>,
    /// One JSON line per object on standard output instead of the progress bar.
    #[arg(long)]
    json: bool,
}

/// Flags of `shardline cache purge`.
#[derive(Args)]
struct CachePurgeArgs {
    /// The request path of the object (`/pull/a.bin`), or with `--prefix` the path prefix.
    #[arg(required_unless_present = "tag", conflicts_with = "tag")]
    path: Option<String>,
    /// Purge everything whose path starts with PATH.
    #[arg(long, conflicts_with = "tag")]
    prefix: bool,
    /// Purge every object its origin tagged TAG (`Surrogate-Key` or `Cache-Tag`, as the
    /// `[[origin]]`'s `purge_tag_header` says), in place of PATH.
    #[arg(long, value_name = "TAG")]
    tag: Option<String>,
    /// The server's admin listener (ADDRESS:PORT).
    #[arg(long, value_name = "ADDR", conflicts_with = "config")]
    admin: Option<std::net::SocketAddr>,
    /// The server's config file (its `admin` address and `admin_token_file`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The admin token's file (mode 0600), in place of the config's `admin_token_file`.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// Where the cache is: `--dir`, or the `cache_dir` of `--config`.
#[derive(Args)]
struct CacheDirArgs {
    /// The cache directory.
    #[arg(long, value_name = "DIR", conflicts_with = "config")]
    dir: Option<PathBuf>,
    /// The server's config file (its `cache_dir`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Flags of `shardline sign`.
#[derive(Args)]
struct SignArgs {
    /// The URL (https://host/path?query) or path to sign.
    url: String,
    /// Id of the key to sign with (a line of the rule's key file).
    #[arg(long, value_name = "ID")]
    key_id: String,
    /// Seconds from now until the URL expires.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    expires_in: u64,
    /// The server's config file: the `[[signed_url]]` rule covering the path gives the key
    /// file and parameter names.
    #[arg(long, value_name = "FILE", conflicts_with = "key_file")]
    config: Option<PathBuf>,
    /// A key file, with the default parameter names (expires, key_id, signature).
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum TlsCommand {
    /// Rotate a session-ticket key file: a new random key becomes the current one and the
    /// old current key stays as the previous (tickets it issued still resume). Copy the file
    /// to every edge, then send SIGHUP.
    NewTicketKey {
        /// The key file (created if missing; replaced atomically).
        file: PathBuf,
    },
}

/// Flags of `shardline serve`; each overrides the same key of the config file.
#[derive(Args)]
#[command(args_override_self = true)]
struct ServeArgs {
    /// TOML config file (see config/shardline.toml for every key and its default).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory to serve [default: current directory].
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080]; port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// Number of shards: "auto" (one per selected CPU) or a number.
    #[arg(long, value_name = "N|auto")]
    shards: Option<ShardCount>,
    /// CPUs to run shards on: "all" or a list such as "0-3,8".
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Write an access log line per response to this file.
    #[arg(long, value_name = "FILE")]
    access_log: Option<PathBuf>,
    /// Admin listener for /metrics and /healthz [default: 127.0.0.1:9900]; "" turns it off,
    /// port 0 picks a free port (printed as "shardline: admin at http://ADDR/").
    #[arg(long, value_name = "ADDR:PORT", overrides_with = "admin")]
    admin: Option<String>,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long)]
    log_json: bool,
    /// Address of the HTTPS listener (needs --tls-cert and --tls-key, or [[tls_certificate]]
    /// in the config file).
    #[arg(long, value_name = "ADDR:PORT")]
    tls_listen: Option<std::net::SocketAddr>,
    /// PEM certificate chain served on the TLS listener (the default certificate).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Plan(args) => shardline::placement::run_plan_cli(&args),
        Command::Doctor(args) => shardline::doctor::run_doctor_cli(&args),
        Command::Tls(TlsCommand::NewTicketKey { file }) => new_ticket_key(&file),
        Command::Sign(args) => sign(&args),
        Command::Cache(c) => cache_command(c),
    }
}

fn cache_command(c: CacheCommand) -> ExitCode {
    let args = match &c {
        CacheCommand::Stats(a) | CacheCommand::Verify(a) => a,
        CacheCommand::Purge(p) => return cache_purge(p),
        CacheCommand::Disk(d) => return cache_disk(d),
        CacheCommand::Prefill(p) => return cache_prefill(p),
    };
    let dir = match (&args.dir, &args.config) {
        (Some(d), _) => d.clone(),
        (None, Some(cfg)) => match shardline::config::Config::from_file(cfg) {
            // The first disk of several (`--dir` names another).
            Ok(c) => match c.cache_disks().into_iter().next() {
                Some(d) => d,
                None => {
                    eprintln!("shardline: {} sets no cache_dir", cfg.display());
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                eprintln!("shardline: config error: {e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => {
            eprintln!("shardline: give --dir DIR or --config FILE");
            return ExitCode::from(2);
        }
    };
    match c {
        CacheCommand::Stats(_) => match shardline::cache::tool::stats(&dir) {
            Ok(s) => {
                println!(
                    "objects {}\nversions {}\nblocks {}\nbytes {}\nobject_bytes {}\njournal_bytes {}\ndamaged_tail {}\nrefused_records {}",
                    s.objects, s.versions, s.blocks, s.bytes, s.object_bytes, s.journal_bytes, s.damaged_tail, s.refused_records
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("shardline: cache {}: {e}", dir.display());
                ExitCode::from(2)
            }
        },
        CacheCommand::Verify(_) => match shardline::cache::tool::verify(&dir) {
            Ok((checked, bad)) => {
                for (version, block) in &bad {
                    println!("corrupt version {version:016x} block {block}");
                }
                println!("checked {checked} blocks, {} corrupt", bad.len());
                if bad.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("shardline: cache {}: {e}", dir.display());
                ExitCode::from(2)
            }
        },
        CacheCommand::Purge(_) | CacheCommand::Prefill(_) | CacheCommand::Disk(_) => {
            unreachable!("answered above")
        }
    }
}

/// The admin client of `--token-file`, else of `config`'s `admin_token_file`; Err is the
/// message (a token file others may read is refused, as the server refuses it).
fn admin_client(
    addr: std::net::SocketAddr,
    token_file: Option<&std::path::Path>,
    config: Option<&Config>,
) -> Result<shardline::cache::tool::AdminClient, String> {
    let file = token_file.or_else(|| config.and_then(|c| c.admin_token_file.as_deref()));
    shardline::cache::tool::AdminClient::with_token_file(addr, file)
        .map_err(|e| format!("admin token: {e}"))
}

fn cache_purge(p: &CachePurgeArgs) -> ExitCode {
    let cfg = match p.config.as_deref().map(Config::from_file).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shardline: {e}");
            return ExitCode::from(2);
        }
    };
    let admin = match (p.admin, &cfg) {
        (Some(a), _) => a,
        (None, Some(c)) => match c.admin_addr() {
            Ok(Some(a)) => a,
            Ok(None) => {
                let file = p.config.as_deref().unwrap_or(std::path::Path::new(""));
                eprintln!("shardline: {} turns the admin listener off", file.display());
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("shardline: {e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => {
            eprintln!("shardline: give --admin ADDR or --config FILE");
            return ExitCode::from(2);
        }
    };
    let admin = match admin_client(admin, p.token_file.as_deref(), cfg.as_ref()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shardline: {e}");
            return ExitCode::from(2);
        }
    };
    let reply = match (&p.tag, &p.path) {
        (Some(tag), _) => shardline::cache::tool::purge_tag(&admin, tag),
        (None, Some(path)) => shardline::cache::tool::purge(&admin, path, p.prefix),
        (None, None) => unreachable!("clap requires PATH without --tag"),
    };
    match reply {
        Ok((200, body)) => {
            println!("{body}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!("shardline: purge refused ({status}): {body}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("shardline: admin listener {}: {e}", admin.addr);
            ExitCode::from(2)
        }
    }
}

/// `shardline cache disk status|offline|online [DISK]`.
fn cache_disk(d: &CacheDiskArgs) -> ExitCode {
    let cfg = match d.config.as_deref().map(Config::from_file).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shardline: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = match (d.admin, &cfg) {
        (Some(a), _) => a,
        (None, Some(c)) => match c.admin_addr() {
            Ok(Some(a)) => a,
            _ => {
                eprintln!("shardline: the config sets no admin listener; give --admin ADDR");
                return ExitCode::from(2);
            }
        },
        (None, None) => {
            eprintln!("shardline: give --admin ADDR or --config FILE");
            return ExitCode::from(2);
        }
    };
    let disk = match (d.action.as_str(), d.disk.as_deref()) {
        ("status", _) => None,
        (_, Some(disk)) => Some(disk),
        (action, None) => {
            eprintln!("shardline: cache disk {action} needs the disk (its directory or slot)");
            return ExitCode::from(2);
        }
    };
    let admin = match admin_client(addr, d.token_file.as_deref(), cfg.as_ref()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shardline: {e}");
            return ExitCode::from(2);
        }
    };
    match shardline::cache::tool::disk(&admin, &d.action, disk) {
        Ok((200, body)) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!(
                "shardline: cache disk {} refused ({status}): {body}",
                d.action
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("shardline: admin listener {}: {e}", admin.addr);
            ExitCode::from(2)
        }
    }
}

/// `shardline cache prefill` (see `shardline::cache::prefill`).
fn cache_prefill(p: &CachePrefillArgs) -> ExitCode {
    use shardline::cache::prefill::{self, MAX_LIST_BYTES};
    use std::io::Read;
    let fail = |msg: &str| {
        eprintln!("shardline: prefill: {msg}");
        ExitCode::from(2)
    };
    let cfg = match p.config.as_deref().map(Config::from_file).transpose() {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    let (admin, edge) = match (p.admin, p.edge, &cfg) {
        (Some(a), Some(e), _) => (a, e),
        (_, _, Some(c)) => match c.admin_addr() {
            Ok(Some(a)) => (a, shardline::server::loopback_if_unspecified(c.listen)),
            Ok(None) => {
                let file = p.config.as_deref().unwrap_or(std::path::Path::new(""));
                return fail(&format!("{} turns the admin listener off", file.display()));
            }
            Err(e) => return fail(&e.to_string()),
        },
        _ => return fail("give --config FILE, or --admin ADDR and --edge ADDR"),
    };
    let admin = match admin_client(admin, p.token_file.as_deref(), cfg.as_ref()) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    let mut text = String::new();
    let read = if p.list == "-" {
        std::io::stdin()
            .take(MAX_LIST_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(&p.list)
            .and_then(|f| f.take(MAX_LIST_BYTES + 1).read_to_string(&mut text))
    };
    if let Err(e) = read {
        return fail(&format!("{}: {e}", p.list));
    }
    if text.len() as u64 > MAX_LIST_BYTES {
        return fail(&format!("{}: longer than {MAX_LIST_BYTES} bytes", p.list));
    }
    let targets = match prefill::parse_list(&text) {
        Ok(t) => t,
        Err(errors) => {
            for e in &errors {
                eprintln!("shardline: prefill: {}: {e}", p.list);
            }
            return fail(&format!("{} bad lines; nothing fetched", errors.len()));
        }
    };
    // A refused token (or control off) fails once here, not once per line below.
    match admin.request("GET", "/cache/prefill") {
        Ok((401 | 403, body)) => return fail(body.trim()),
        Ok(_) => {}
        Err(e) => return fail(&format!("admin listener {}: {e}", admin.addr)),
    }
    // Every line against the server's routing first; then only what is not cached.
    let mut todo = Vec::new();
    let mut errors = Vec::new();
    let mut cached = 0usize;
    for t in &targets {
        match prefill::lookup(&admin, t) {
            Ok(h) if h.cached => cached += 1,
            Ok(_) => todo.push(t),
            Err(why) => errors.push(format!("line {}: {}: {why}", t.line, t.target)),
        }
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("shardline: prefill: {}: {e}", p.list);
        }
        return fail(&format!(
            "{} lines the server cannot fill; nothing fetched",
            errors.len()
        ));
    }
    let pin_until = match p
        .pin_until
        .as_deref()
        .map(|v| prefill::parse_pin_until(v, shardline::fill::cache_fill::unix_now_s()))
    {
        Some(Err(e)) => return fail(&format!("--pin-until: {e}")),
        Some(Ok(t)) => Some(t),
        None => None,
    };
    if !(1..=prefill::MAX_PARALLEL).contains(&p.parallel) {
        return fail(&format!("--parallel must be 1..={}", prefill::MAX_PARALLEL));
    }
    // One prefill at a time per server.
    let lease = match prefill::Lease::begin(&admin) {
        Ok(l) => std::sync::Mutex::new(l),
        Err(why) => return fail(why.trim()),
    };
    let pin = |t: &prefill::Target| match pin_until {
        Some(until) => prefill::pin(&admin, t, until).map(|_| ()),
        None => Ok(()),
    };
    let mut pin_failed = 0usize;
    for t in targets.iter().filter(|t| !todo.contains(t)) {
        let pinned = pin(t);
        if let Err(e) = &pinned {
            pin_failed += 1;
            eprintln!(
                "shardline: prefill: line {}: {}: not pinned: {e}",
                t.line, t.target
            );
        }
        if p.json {
            println!(
                "{}",
                serde_json::json!({"line": t.line, "target": t.target, "result": "cached", "bytes": 0, "pinned": pin_until.is_some() && pinned.is_ok()})
            );
        }
    }
    let bar = if p.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(todo.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} objects, {msg} [{elapsed_precise}, ETA {eta}]",
        )
        .expect("a valid template"),
    );
    let started = std::time::Instant::now();
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let lease_lost = std::sync::Mutex::new(None::<String>);
    let on_bytes = |n: u64| {
        // A long object keeps the lease too.
        if let Err(why) = lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .renew_if_due()
        {
            *lease_lost
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
        }
        let total = bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
        let rate = total as f64 / started.elapsed().as_secs_f64().max(1e-3);
        bar.set_message(format!(
            "{} at {}/s",
            indicatif::HumanBytes(total),
            indicatif::HumanBytes(rate as u64)
        ));
    };
    let on_done = |t: &prefill::Target, result: &Result<u64, String>| {
        bar.inc(1);
        let mut line = match result {
            Ok(n) => {
                serde_json::json!({"line": t.line, "target": t.target, "result": "filled", "bytes": n})
            }
            Err(e) => {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if !p.json {
                    bar.suspend(|| {
                        eprintln!("shardline: prefill: line {}: {}: {e}", t.line, t.target)
                    });
                }
                serde_json::json!({"line": t.line, "target": t.target, "result": "failed", "error": e})
            }
        };
        if result.is_ok() && pin_until.is_some() {
            let pinned = pin(t);
            if let Err(e) = &pinned {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                bar.suspend(|| {
                    eprintln!(
                        "shardline: prefill: line {}: {}: not pinned: {e}",
                        t.line, t.target
                    )
                });
            }
            line["pinned"] = serde_json::json!(pinned.is_ok());
        }
        if p.json {
            println!("{line}");
        }
    };
    prefill::run(edge, &todo, p.rate, p.parallel, &on_bytes, &on_done);
    bar.finish_and_clear();
    if let Some(why) = lease_lost.into_inner().unwrap_or(None) {
        return fail(why.trim());
    }
    lease
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .end();
    let failed = failed.into_inner() + pin_failed;
    let bytes = bytes.into_inner();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "shardline: prefill: {} objects: {cached} already cached, {} filled, {failed} failed; {} in {secs:.1} s ({}/s)",
        targets.len(),
        todo.len().saturating_sub(failed),
        indicatif::HumanBytes(bytes),
        indicatif::HumanBytes((bytes as f64 / secs.max(1e-3)) as u64)
    );
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn sign(a: &SignArgs) -> ExitCode {
    use shardline::signing::{sign_query, KeyRing, RuleConfig};
    // Split scheme://authority, path, query (the fragment, if any, is dropped).
    let url = a.url.split('#').next().unwrap_or_default();
    let (origin, rest) = match url.find("://") {
        Some(i) => match url[i + 3..].find('/') {
            Some(j) => url.split_at(i + 3 + j),
            None => (url, "/"),
        },
        None => ("", url),
    };
    let (raw_path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let resolved = match shardline::fs::resolve::resolve_target(raw_path.as_bytes()) {
        Ok(r) => r,
        Err(e) => return config_error(&format!("{raw_path}: {e:?}")),
    };
    let path = shardline::fs::resolve::ResolvedRef {
        rel_path: &resolved.rel_path,
        wants_dir: resolved.wants_dir,
    };
    let rule = match (&a.config, &a.key_file) {
        (Some(cfg), _) => {
            let cfg = match Config::from_file(cfg) {
                Ok(c) => c,
                Err(e) => return config_error(&e.to_string()),
            };
            match shardline::signing::covering_rule(&cfg.signed_url, &path) {
                Some((_, r)) => r.clone(),
                None => {
                    return config_error(&format!(
                        "no [[signed_url]] prefix covers /{}",
                        resolved.rel_path
                    ))
                }
            }
        }
        (None, Some(file)) => RuleConfig {
            prefix: "/".into(),
            key_file: file.clone(),
            expires_param: "expires".into(),
            key_id_param: "key_id".into(),
            signature_param: "signature".into(),
        },
        (None, None) => return config_error("give --config FILE or --key-file FILE"),
    };
    let ring = match KeyRing::load(&rule.key_file) {
        Ok(r) => r,
        Err(e) => return config_error(&format!("{}: {e}", rule.key_file.display())),
    };
    let Some(key) = ring.get(&a.key_id) else {
        return config_error(&format!(
            "{}: no key '{}'",
            rule.key_file.display(),
            a.key_id
        ));
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let signed = sign_query(
        &rule,
        &path,
        &a.key_id,
        key,
        now.saturating_add(a.expires_in),
    );
    let sep = if query.is_some_and(|q| !q.is_empty()) {
        "&"
    } else {
        ""
    };
    println!("{origin}{raw_path}?{}{sep}{signed}", query.unwrap_or(""));
    ExitCode::SUCCESS
}

fn new_ticket_key(file: &std::path::Path) -> ExitCode {
    let old = std::fs::read(file).ok();
    let bytes = match shardline::tls::tickets::rotated_key_file(old.as_deref()) {
        Ok(b) => b,
        Err(e) => return config_error(&e.to_string()),
    };
    let tmp = file.with_extension("new");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, file));
    match written {
        Ok(()) => {
            let keys = bytes.len() / shardline::tls::tickets::TICKET_KEY_BYTES;
            println!(
                "{}: new current key, {} key(s) in all",
                file.display(),
                keys
            );
            ExitCode::SUCCESS
        }
        Err(e) => config_error(&format!("{}: {e}", file.display())),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => return config_error(&e.to_string()),
    };
    let set_log_level = init_logging(cfg.log_format, &cfg.log_level);
    // SIGHUP loads the file again with the same flags on top, as start-up did.
    let reloader = shardline::server::Reloader {
        load: Box::new(move || load_config(&args)),
        set_log_level,
    };
    match shardline::server::serve_with(cfg, reloader) {
        Ok(()) => ExitCode::SUCCESS,
        Err(shardline::server::ServeError::Config(e)) => config_error(&e.to_string()),
        Err(e) => {
            eprintln!("shardline: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The config file (or the defaults) with the command-line flags applied.
fn load_config(args: &ServeArgs) -> Result<Config, shardline::config::ConfigError> {
    let mut cfg = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(v) = &args.root {
        cfg.root = v.clone();
    }
    if let Some(v) = args.listen {
        cfg.listen = v;
    }
    if let Some(v) = args.shards {
        cfg.shards = v;
    }
    if let Some(v) = &args.cpus {
        cfg.cpus = v.clone();
    }
    if let Some(v) = &args.access_log {
        cfg.access_log = Some(v.clone());
    }
    if let Some(v) = &args.admin {
        cfg.admin = v.clone();
    }
    if args.log_json {
        cfg.log_format = LogFormat::Json;
    }
    if let Some(v) = args.tls_listen {
        cfg.tls_listen = Some(v);
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        // The flag's certificate is the default one, ahead of the file's.
        cfg.tls_certificate.insert(
            0,
            shardline::config::TlsCertificate {
                cert: cert.clone(),
                key: key.clone(),
                ocsp: None,
            },
        );
    }
    Ok(cfg)
}

fn config_error(msg: &str) -> ExitCode {
    eprintln!("shardline: {msg}");
    ExitCode::from(2)
}

/// Logging to stderr; RUST_LOG, when set, wins over `log_level` at start-up. Returns how to
/// change the filter later.
fn init_logging(format: LogFormat, log_level: &str) -> shardline::server::SetLogLevel {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only for a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    fn setter<S: 'static>(
        handle: tracing_subscriber::reload::Handle<EnvFilter, S>,
    ) -> shardline::server::SetLogLevel {
        Box::new(move |level: &str| {
            let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
            handle.reload(filter).map_err(|e| e.to_string())
        })
    }
    match format {
        LogFormat::Json => {
            let b = builder.json().with_filter_reloading();
            let handle = b.reload_handle();
            b.init();
            setter(handle)
        }
        LogFormat::Text => {
            let b = builder.with_filter_reloading();
            let handle = b.reload_handle();
            b.init();
            setter(handle)
        }
    }
}
