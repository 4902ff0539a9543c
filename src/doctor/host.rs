//! How the doctor reaches the host: a file tree under a root path, a command runner for
//! `ethtool`, and the sampler that takes the two counter snapshots. Each is replaceable so tests
//! run every check on fixture trees and captured command output.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::DoctorContext;

/// Largest file the doctor reads; sysfs/procfs values are tiny, so anything bigger is not ours.
const READ_BYTES_MAX: u64 = 1 << 20;

/// A directory tree laid out like `/` (procfs under `proc/`, sysfs under `sys/`).
#[derive(Debug, Clone)]
pub struct Tree {
    root: PathBuf,
}

impl Tree {
    /// A tree rooted at `root` ("/" for the live host).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of `rel` (given as an absolute-looking path such as `/proc/self/limits`).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// Reads `rel` as text with surrounding whitespace trimmed; invalid UTF-8 is replaced.
    pub fn read(&self, rel: &str) -> Result<String, String> {
        let path = self.path(rel);
        let mut bytes = Vec::new();
        fs::File::open(&path)
            .and_then(|f| f.take(READ_BYTES_MAX).read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Reads `rel` as one unsigned integer.
    pub fn read_u64(&self, rel: &str) -> Result<u64, String> {
        let text = self.read(rel)?;
        text.parse()
            .map_err(|_| format!("{}: not a number: {text:?}", self.path(rel).display()))
    }

    /// Whether `rel` exists (a dangling symlink counts, as sysfs links may dangle in fixtures).
    pub fn exists(&self, rel: &str) -> bool {
        fs::symlink_metadata(self.path(rel)).is_ok()
    }

    /// Names of the entries of directory `rel`, sorted; empty when it is missing.
    pub fn list(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path(rel))
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Last path component of the symlink target at `rel` (sysfs `master` -> `br0`).
    pub fn link_name(&self, rel: &str) -> Option<String> {
        let target = fs::read_link(self.path(rel)).ok()?;
        target.file_name()?.to_str().map(str::to_string)
    }
}

/// Why a command's output is not available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The tool is missing (or, for fixture trees, no captured output exists).
    Unavailable(String),
    /// The tool ran and failed (unsupported by the driver, permission denied, ...).
    Failed(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Unavailable(why) | RunError::Failed(why) => f.write_str(why),
        }
    }
}

/// Runs an external tool and returns its stdout; replaced in tests by captured outputs.
pub trait CommandRunner {
    /// Runs `program args...` and returns its standard output.
    fn run(&self, program: &str, args: &[&str]) -> Result<String, RunError>;
}

/// Runs commands on the live host.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, RunError> {
        // LC_ALL=C: the parsers read English labels ("Pre-set maximums", "on"/"off").
        let out = Command::new(program)
            .args(args)
            .env("LC_ALL", "C")
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    RunError::Unavailable(format!("{program} not found"))
                }
                _ => RunError::Unavailable(format!("cannot run {program}: {e}")),
            })?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        Err(RunError::Failed(format!(
            "{program} {} failed ({}){}{first}",
            args.join(" "),
            out.status,
            if first.is_empty() { "" } else { ": " }
        )))
    }
}

/// Serves captured `ethtool` output from a fixture tree: `ethtool -g eth0` reads
/// `<dir>/ethtool/eth0/ethtool-g.txt`. Used whenever `--root` is not `/`, because running the
/// live `ethtool` would describe a different host than the tree.
#[derive(Debug, Clone)]
pub struct CapturedRunner {
    dir: PathBuf,
}

impl CapturedRunner {
    /// Captures under `dir` (a fixture root or its second-snapshot overlay).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Where the capture for `program args` lives, if the invocation has a capture form.
    fn capture_path(&self, program: &str, args: &[&str]) -> Option<PathBuf> {
        match args {
            [flag, iface] if flag.starts_with('-') && !iface.contains('/') => Some(
                self.dir
                    .join(program)
                    .join(iface)
                    .join(format!("{program}{flag}.txt")),
            ),
            _ => None,
        }
    }
}

impl CommandRunner for CapturedRunner {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, RunError> {
        let Some(path) = self.capture_path(program, args) else {
            return Err(RunError::Unavailable(format!(
                "{program} runs only with --root /"
            )));
        };
        fs::read_to_string(&path).map_err(|_| {
            let rel = path.strip_prefix(&self.dir).unwrap_or(&path);
            RunError::Unavailable(format!(
                "{program} runs only with --root / (no capture {})",
                rel.display()
            ))
        })
    }
}

/// Counters of one interface at one instant, plus why some source could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Counter name (`rx_missed_errors`, `ethtool:tx_busy`) -> value.
    pub counters: BTreeMap<String, u64>,
    /// Why `ethtool -S` counters are missing, when they are.
    pub note: Option<String>,
}

/// Which snapshot of the sampling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Start of the window.
    First,
    /// End of the window.
    Second,
}

/// Takes the two counter snapshots; replaceable so tests show growth deterministically.
pub trait CounterSampler {
    /// One snapshot of `iface`'s drop/discard/busy counters.
    fn snapshot(&self, ctx: &DoctorContext, iface: &str, round: Round) -> Snapshot;
    /// Ends the window begun at `start` and returns its length, to report with the growth.
    fn finish_window(&self, start: Instant, window: Duration) -> Duration;
}

/// Kernel statistics files counted as drops (under `sys/class/net/<if>/statistics/`).
pub const SYSFS_DROP_COUNTERS: &[&str] = &[
    "rx_dropped",
    "tx_dropped",
    "rx_missed_errors",
    "rx_fifo_errors",
    "rx_over_errors",
    "tx_fifo_errors",
];

/// Substrings that mark an `ethtool -S` counter as a drop/discard/busy counter.
const ETHTOOL_DROP_MARKS: &[&str] = &["busy", "discard", "drop", "missed", "restart", "no_buf"];

/// Reads the counters of `iface` from `tree` and `runner`.
pub fn read_counters(tree: &Tree, runner: &dyn CommandRunner, iface: &str) -> Snapshot {
    let mut snap = Snapshot::default();
    for name in SYSFS_DROP_COUNTERS {
        if let Ok(v) = tree.read_u64(&format!("/sys/class/net/{iface}/statistics/{name}")) {
            snap.counters.insert((*name).to_string(), v);
        }
    }
    match runner.run("ethtool", &["-S", iface]) {
        Ok(text) => {
            for (name, v) in super::ethtool::parse_stats(&text) {
                let lower = name.to_ascii_lowercase();
                // Many drivers repeat the kernel's own counters (rx_missed_errors): count once.
                let repeated = SYSFS_DROP_COUNTERS.contains(&lower.as_str());
                if !repeated && ETHTOOL_DROP_MARKS.iter().any(|m| lower.contains(m)) {
                    snap.counters.insert(format!("ethtool:{name}"), v);
                }
            }
        }
        Err(e) => snap.note = Some(e.to_string()),
    }
    snap
}

/// Reads the live tree twice, sleeping out the window in between.
#[derive(Debug, Default, Clone, Copy)]
pub struct LiveSampler;

impl CounterSampler for LiveSampler {
    fn snapshot(&self, ctx: &DoctorContext, iface: &str, _round: Round) -> Snapshot {
        read_counters(&ctx.tree, ctx.runner.as_ref(), iface)
    }

    fn finish_window(&self, start: Instant, window: Duration) -> Duration {
        if let Some(left) = window.checked_sub(start.elapsed()) {
            std::thread::sleep(left);
        }
        start.elapsed()
    }
}

/// Name of the fixture directory holding the second snapshot (mirrors the root's layout).
pub const SECOND_SNAPSHOT_DIR: &str = "doctor-sample-2";

/// Fixture sampler: the first snapshot is the root itself, the second overlays the files found
/// under `<root>/doctor-sample-2/` (statistics files and `ethtool/<if>/ethtool-S.txt`).
#[derive(Debug, Clone)]
pub struct OverlaySampler {
    overlay: PathBuf,
}

impl OverlaySampler {
    /// Second snapshot read from `overlay`.
    pub fn new(overlay: impl Into<PathBuf>) -> Self {
        Self {
            overlay: overlay.into(),
        }
    }
}

impl CounterSampler for OverlaySampler {
    fn snapshot(&self, ctx: &DoctorContext, iface: &str, round: Round) -> Snapshot {
        let mut snap = read_counters(&ctx.tree, ctx.runner.as_ref(), iface);
        if round == Round::Second {
            let over = read_counters(
                &Tree::new(&self.overlay),
                &CapturedRunner::new(&self.overlay),
                iface,
            );
            snap.counters.extend(over.counters);
        }
        snap
    }

    fn finish_window(&self, _start: Instant, window: Duration) -> Duration {
        // The snapshots are files: no time passes, report the window that was asked for.
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_runner_maps_flags_to_files() {
        let dir = tempfile::tempdir().unwrap();
        let eth = dir.path().join("ethtool/eth0");
        fs::create_dir_all(&eth).unwrap();
        fs::write(eth.join("ethtool-g.txt"), "Ring parameters for eth0:\n").unwrap();
        let runner = CapturedRunner::new(dir.path());
        assert!(runner
            .run("ethtool", &["-g", "eth0"])
            .unwrap()
            .starts_with("Ring"));
        assert!(matches!(
            runner.run("ethtool", &["-k", "eth0"]),
            Err(RunError::Unavailable(_))
        ));
        // No path escapes through the interface name.
        assert!(runner.run("ethtool", &["-g", "../x"]).is_err());
    }

    #[test]
    fn system_runner_reports_missing_tool() {
        let err = SystemRunner
            .run("shardline-no-such-tool-xyz", &["-g", "eth0"])
            .unwrap_err();
        assert_eq!(
            err,
            RunError::Unavailable("shardline-no-such-tool-xyz not found".into())
        );
    }

    #[test]
    fn tree_reads_trim_and_tolerate_garbage() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("proc")).unwrap();
        fs::write(dir.path().join("proc/n"), " 42\n").unwrap();
        fs::write(dir.path().join("proc/bad"), [0xff, 0xfe, b'\n']).unwrap();
        let tree = Tree::new(dir.path());
        assert_eq!(tree.read_u64("/proc/n"), Ok(42));
        assert!(tree.read_u64("/proc/bad").is_err());
        assert!(tree.read_u64("/proc/missing").is_err());
        assert!(tree.list("/nothing").is_empty());
    }
}
