//! `perf/link.sh` without benchmarking: bad arguments are refused with a clear message and exit
//! status 2 before anything is created; `--dry-run` only prints; `--check-cleanup` creates the
//! namespaces, veth pair, tbf qdisc, ram disk, seed sysctls and processes of a real run and
//! removes every one of them again. Nothing here is timed.

use std::path::Path;
use std::process::{Command, Output};

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("perf/link.sh")
}

fn run(args: &[&str]) -> (Output, String, String) {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .expect("run bash perf/link.sh");
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, so, se)
}

#[test]
fn bad_arguments_exit_2_naming_the_problem() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "unknown argument '--bogus'"),
        (
            &["--disk", "floppy"],
            "--disk wants ram or repo, not 'floppy'",
        ),
        (&["--disk"], "--disk needs a value"),
        (&["--rate", "fast"], "--rate wants a tc rate"),
        (&["--rate", "10"], "--rate wants a tc rate"),
        (
            &["--sysctl", "tuned"],
            "--sysctl wants default, seed or both",
        ),
        (
            &["--duration-s", "1"],
            "--duration-s wants an integer from 2",
        ),
        (
            &["--duration-s", "ten"],
            "--duration-s wants an integer from 2",
        ),
        (&["--big-conns", "0"], "--big-conns wants an integer from 1"),
        (&["--workloads", "fast,nope"], "unknown workload 'nope'"),
        (&["--nice", "99"], "--nice wants an integer from -20 to 19"),
        (
            &["--quick", "--out", "/nonexistent-dir/x.md"],
            "--out: directory",
        ),
    ];
    for (args, want) in cases {
        let (out, so, se) = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: stderr {se}");
        assert!(se.contains(want), "{args:?}: stderr lacks {want:?}: {se}");
        assert!(
            se.contains("--help"),
            "{args:?}: no pointer to --help: {se}"
        );
        assert!(!so.contains("plan"), "{args:?}: printed a plan: {so}");
    }
}

#[test]
fn help_and_dry_run_print_without_creating_anything() {
    let (out, so, _) = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        so.contains("--check-cleanup") && so.contains("--disk ram|repo"),
        "{so}"
    );

    let (out, so, se) = run(&[
        "--dry-run",
        "--quick",
        "--rate",
        "2500mbit",
        "--sysctl",
        "seed",
    ]);
    assert_eq!(out.status.code(), Some(0), "{se}");
    assert!(
        so.contains("tbf rate 2500mbit burst 256kb latency 1ms"),
        "{so}"
    );
    assert!(so.contains("sysctl profiles: seed"), "{so}");
    assert!(so.contains("net.ipv4.tcp_notsent_lowat"), "{so}");
    let ns = so
        .split_whitespace()
        .find(|w| w.starts_with("(pl-srv-"))
        .expect("namespace name in the plan")
        .trim_matches(|c| c == '(' || c == ',');
    let list = Command::new("ip").args(["netns", "list"]).output();
    if let Ok(list) = list {
        assert!(
            !String::from_utf8_lossy(&list.stdout).contains(ns),
            "--dry-run created {ns}"
        );
    }
}

/// Values of the seed keys in the root namespace.
fn root_sysctls() -> Vec<(String, String)> {
    let keys = [
        "net/core/wmem_max",
        "net/core/rmem_max",
        "net/ipv4/tcp_wmem",
        "net/core/somaxconn",
        "net/core/netdev_max_backlog",
        "net/ipv4/tcp_congestion_control",
        "net/ipv4/tcp_slow_start_after_idle",
        "net/ipv4/tcp_notsent_lowat",
    ];
    keys.iter()
        .map(|k| {
            let v = std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default();
            (k.to_string(), v.trim().to_string())
        })
        .collect()
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn check_cleanup_leaves_nothing_behind() {
    if std::env::var("SHARDLINE_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("skipped: SHARDLINE_SKIP_NETNS=1");
        return;
    }
    let uid = sh("id -u");
    assert_eq!(
        uid.trim(),
        "0",
        "perf/link.sh --check-cleanup needs root (namespaces, tc, losetup, mount); \
         set SHARDLINE_SKIP_NETNS=1 to skip this test"
    );
    let before = root_sysctls();
    let (out, _, se) = run(&["--check-cleanup"]);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{se}");
    // It really made them: the names it reports, each then gone.
    let created = se
        .lines()
        .find(|l| l.contains("created: "))
        .unwrap_or_else(|| panic!("no 'created:' line:\n{se}"));
    assert!(se.contains("clean: no namespace"), "{se}");
    let tag = created
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pl-srv-"))
        .expect("namespace name")
        .to_string();
    assert!(tag.chars().all(|c| c.is_ascii_digit()), "{created}");
    let netns = sh("ip netns list");
    assert!(!netns.contains(&format!("pl-srv-{tag}")), "{netns}");
    assert!(!netns.contains(&format!("pl-cli-{tag}")), "{netns}");
    let links = sh("ip -o link show");
    assert!(!links.contains(&format!("pl-s{tag}")), "{links}");
    assert!(!links.contains(&format!("pl-c{tag}")), "{links}");
    let img = format!("/dev/shm/pl-disk-{tag}.img");
    assert!(!Path::new(&img).exists(), "{img} left behind");
    let loops = sh("losetup -a");
    assert!(!loops.contains(&img), "{loops}");
    let mounts = sh("findmnt -rno TARGET");
    assert!(!mounts.contains(&format!("pl-mnt-{tag}")), "{mounts}");
    let procs = sh("ps -eo args");
    assert!(
        !procs.lines().any(|l| l.contains(&format!("pl-srv-{tag}"))),
        "{procs}"
    );
    assert_eq!(
        root_sysctls(),
        before,
        "root-namespace sysctls changed (is another link.sh running?)"
    );
    let seed_applied = se.contains("seed:") || se.contains("link up (seed sysctls)");
    assert!(seed_applied, "the seed profile was not applied:\n{se}");
}
