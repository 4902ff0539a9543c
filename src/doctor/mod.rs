//! `shardline doctor`: reads the host and says, check by check, what would slow a download edge
//! down — sysctls, NIC rings/offloads/drops/MTU, memlock vs the registered arena, the data root's
//! O_DIRECT and RWF_DONTCACHE support, THP, CPU governor, irqbalance.
//!
//! Everything under `/proc` and `/sys` is read through [`host::Tree`] rooted at `--root`, and
//! `ethtool` goes through a [`host::CommandRunner`], so the whole doctor runs on fixture trees
//! (`tests/fixtures/doctor/`). Nothing here changes the host; `scripts/tune-host.sh` does that.

pub mod ethtool;
pub mod host;
pub mod nic;
pub mod report;
pub mod storage;
pub mod sysctl;
pub mod system;
pub mod tls;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use host::{CapturedRunner, CommandRunner, CounterSampler, LiveSampler, OverlaySampler, Tree};

/// Default registered arena per shard, matching the engine's default (64 MiB).
pub const ARENA_BYTES_DEFAULT: u64 = 64 << 20;

/// Command-line options of `shardline doctor`.
#[derive(clap::Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Root under which /proc and /sys are read (a fixture tree in tests).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Window over which drop counters are sampled twice, in milliseconds.
    #[arg(long = "sample-ms", default_value_t = 1000)]
    pub sample_ms: u64,
    /// Document root to probe for O_DIRECT alignment and RWF_DONTCACHE (a probe file is
    /// written in a hidden temporary directory there and removed; read-only roots use an
    /// existing file).
    #[arg(long = "data-root", default_value = ".")]
    pub data_root: PathBuf,
    /// Registered arena bytes per shard, compared with RLIMIT_MEMLOCK.
    #[arg(long = "arena-bytes", default_value_t = ARENA_BYTES_DEFAULT)]
    pub arena_bytes: u64,
    /// Number of shards (default: online CPUs under --root).
    #[arg(long)]
    pub shards: Option<usize>,
    /// The server's config file: its certificates and ticket keys are checked too.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As recommended.
    Ok,
    /// Worth a look; may cost throughput or latency, or could not be verified.
    Warn,
    /// Will hurt: fix before serving (exit code 1).
    Fail,
}

impl Status {
    /// Upper-case label for the table.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One row of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable dotted name (`net.core.wmem_max`, `nic.eth0.rings`).
    pub name: String,
    /// OK / WARN / FAIL.
    pub status: Status,
    /// What the host has now.
    pub current: String,
    /// What the field report recommends.
    pub recommended: String,
    /// One line of why it matters.
    pub why: String,
}

impl Check {
    /// Builds a check from its parts.
    pub fn new(
        name: impl Into<String>,
        status: Status,
        current: impl Into<String>,
        recommended: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            status,
            current: current.into(),
            recommended: recommended.into(),
            why: why.into(),
        }
    }
}

/// Everything the checks read from: the tree, the data root, the sizes to compare against and
/// the replaceable command runner and counter sampler.
pub struct DoctorContext {
    /// `/proc` and `/sys` live under this tree.
    pub tree: Tree,
    /// Document root probed for O_DIRECT and RWF_DONTCACHE (a real path, not under `tree`).
    pub data_root: PathBuf,
    /// Drop-counter sampling window.
    pub sample: Duration,
    /// Registered arena bytes per shard.
    pub arena_bytes: u64,
    /// Shards the engine would run.
    pub shards: usize,
    /// Runs `ethtool` (or serves captures of it).
    pub runner: Box<dyn CommandRunner>,
    /// Takes the two drop-counter snapshots.
    pub sampler: Box<dyn CounterSampler>,
    /// The server's configuration, when given (`--config`): its TLS files are checked.
    pub config: Option<crate::config::Config>,
}

impl DoctorContext {
    /// Context for `args`: the live `ethtool` and a sleeping sampler for `--root /`; captured
    /// outputs and the `doctor-sample-2/` overlay (when present) for any other root.
    pub fn from_args(args: &DoctorArgs) -> Self {
        let tree = Tree::new(&args.root);
        let live = args.root == std::path::Path::new("/");
        let runner: Box<dyn CommandRunner> = if live {
            Box::new(host::SystemRunner)
        } else {
            Box::new(CapturedRunner::new(&args.root))
        };
        let overlay = args.root.join(host::SECOND_SNAPSHOT_DIR);
        let sampler: Box<dyn CounterSampler> = if !live && overlay.is_dir() {
            Box::new(OverlaySampler::new(overlay))
        } else {
            Box::new(LiveSampler)
        };
        let shards = args
            .shards
            .unwrap_or_else(|| system::online_cpus(&tree))
            .max(1);
        Self {
            tree,
            data_root: args.data_root.clone(),
            sample: Duration::from_millis(args.sample_ms),
            arena_bytes: args.arena_bytes,
            shards,
            runner,
            sampler,
            config: None,
        }
    }
}

/// Runs every check and returns them in report order.
pub fn run_checks(ctx: &DoctorContext) -> Vec<Check> {
    // Start the counter window first and do the other checks inside it, so the window costs
    // no extra wall time when the other checks are slow (the storage probe does I/O).
    let nics = nic::discover(&ctx.tree);
    let start = Instant::now();
    let first = nic::first_snapshots(ctx, &nics);

    let mut checks = sysctl::checks(&ctx.tree);
    checks.push(system::memlock(ctx));
    let storage = storage::checks(&ctx.data_root);
    let cpu = [
        system::transparent_hugepages(&ctx.tree),
        system::cpu_governor(&ctx.tree),
        system::irqbalance(&ctx.tree),
        tls::cpu_aes(&ctx.tree),
        tls::ktls(&ctx.tree),
    ];
    let window = ctx.sampler.finish_window(start, ctx.sample);
    checks.extend(nic::checks(ctx, &nics, &first, window));
    checks.extend(storage);
    checks.extend(cpu);
    if let Some(cfg) = &ctx.config {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        checks.extend(tls::certificates(cfg, now));
        if !cfg.origin.is_empty() {
            // Each cache disk on its own (`cache.diskN.*` with several): a missing or sick one
            // is named.
            let disks = cfg.cache_disks();
            for (i, dir) in disks.iter().enumerate() {
                let mut each = storage::cache_checks(dir);
                if disks.len() > 1 {
                    for c in &mut each {
                        c.name = c.name.replacen("cache.", &format!("cache.disk{i}."), 1);
                        c.current = format!("{}: {}", dir.display(), c.current);
                    }
                }
                checks.extend(each);
            }
        }
    }
    checks
}

/// Whether any check failed.
pub fn any_fail(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// Exit code for a report: 1 on any FAIL, 0 otherwise.
pub fn exit_code(checks: &[Check]) -> ExitCode {
    if any_fail(checks) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `shardline doctor`: runs the checks, prints a table or JSON, exits 1 on any FAIL.
pub fn run_doctor_cli(args: &DoctorArgs) -> ExitCode {
    let mut ctx = DoctorContext::from_args(args);
    if let Some(path) = &args.config {
        match crate::config::Config::from_file(path) {
            Ok(cfg) => ctx.config = Some(cfg),
            Err(e) => {
                eprintln!("shardline doctor: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let checks = run_checks(&ctx);
    let out = if args.json {
        report::to_json(&checks)
    } else {
        report::to_table(&checks)
    };
    println!("{out}");
    exit_code(&checks)
}

/// Formats a byte count in the largest exact binary unit ("8 MiB", "1536 KiB", "100 B").
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && value >= 1024 && value.is_multiple_of(1024) {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format_in_exact_units() {
        assert_eq!(fmt_bytes(8 << 20), "8 MiB");
        assert_eq!(fmt_bytes(1536 << 10), "1536 KiB");
        assert_eq!(fmt_bytes(100), "100 B");
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1 << 50), "1024 TiB");
    }

    #[test]
    fn exit_code_follows_fail() {
        let ok = Check::new("a", Status::Ok, "", "", "");
        let warn = Check::new("b", Status::Warn, "", "", "");
        let fail = Check::new("c", Status::Fail, "", "", "");
        assert!(!any_fail(&[ok.clone(), warn.clone()]));
        assert!(any_fail(&[ok, warn, fail]));
        assert!(!any_fail(&[]));
    }
}
