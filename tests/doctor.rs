//! `shardline doctor` through the library API on the fixture trees in `tests/fixtures/doctor/`:
//! `healthy` is a tuned 25G edge, `trouble` carries the field reports' traps (rings 512 of 4096,
//! drops growing during the window, a 9000-byte port bridged at 1500, small sysctls, 8 MiB
//! memlock against 4 x 64 MiB arenas).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shardline::doctor::host::{CommandRunner, CounterSampler, Round, RunError, Snapshot};
use shardline::doctor::report::{self, Report};
use shardline::doctor::{any_fail, run_checks, Check, DoctorArgs, DoctorContext, Status};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

fn args(root: PathBuf, data_root: &Path) -> DoctorArgs {
    DoctorArgs {
        root,
        json: false,
        sample_ms: 0,
        data_root: data_root.to_path_buf(),
        arena_bytes: 64 << 20,
        shards: None,
        config: None,
    }
}

fn checks_for(name: &str) -> Vec<Check> {
    let data = tempfile::tempdir().unwrap();
    let ctx = DoctorContext::from_args(&args(fixture(name), data.path()));
    run_checks(&ctx)
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:#?}"))
}

#[test]
fn healthy_host_is_all_ok() {
    let checks = checks_for("healthy");
    println!("{}", report::to_table(&checks));
    // Storage probes the real temp dir, whose filesystem depends on the machine.
    let not_ok: Vec<&Check> = checks
        .iter()
        .filter(|c| !c.name.starts_with("storage.") && c.status != Status::Ok)
        .collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    assert!(!any_fail(&checks));
    // Loopback is skipped, the VLAN is noted as virtual and its MTU compared with eth0.
    assert!(!checks.iter().any(|c| c.name.starts_with("nic.lo")));
    assert_eq!(
        find(&checks, "nic.eth0.100").current,
        "virtual (vlan), mtu 1500"
    );
    assert_eq!(find(&checks, "nic.eth0.100.mtu_vs_eth0").status, Status::Ok);
    assert_eq!(
        find(&checks, "nic.eth0.rings").current,
        "rx 4096 of 4096, tx 4096 of 4096"
    );
    assert!(find(&checks, "rlimit.memlock")
        .current
        .starts_with("soft unlimited"));
}

#[test]
fn trouble_host_shows_every_trap() {
    let checks = checks_for("trouble");
    println!("{}", report::to_table(&checks));
    let status = |name: &str| find(&checks, name).status;

    // The 512-of-4096 trap.
    let rings = find(&checks, "nic.eth0.rings");
    assert_eq!(rings.status, Status::Fail);
    assert_eq!(rings.current, "rx 512 of 4096, tx 512 of 4096");
    assert!(rings
        .recommended
        .contains("ethtool -G eth0 rx 4096 tx 4096"));
    assert_eq!(status("nic.eth1.rings"), Status::Ok);

    // Drops growing between the two snapshots (the doctor-sample-2 overlay).
    let drops = find(&checks, "nic.eth0.drops");
    assert_eq!(drops.status, Status::Fail);
    assert!(
        drops.current.contains("ethtool:tx_busy +1200"),
        "{}",
        drops.current
    );
    assert!(
        drops.current.contains("rx_missed_errors +512"),
        "{}",
        drops.current
    );
    assert_eq!(status("nic.eth1.drops"), Status::Ok);

    // Jumbo-frame trap: eth1 at 9000 bridged into br0 at 1500; the VLAN at 1500 on the
    // 9000 port may be deliberate, so it only warns; the physical ports disagree.
    let bridge = find(&checks, "nic.br0.mtu_vs_eth1");
    assert_eq!(
        (bridge.status, bridge.current.as_str()),
        (Status::Fail, "br0 1500, eth1 9000")
    );
    assert_eq!(status("nic.eth0.100.mtu_vs_eth0"), Status::Warn);
    assert_eq!(status("nic.mtu_consistency"), Status::Warn);
    assert_eq!(
        find(&checks, "nic.br0").current,
        "virtual (bridge), mtu 1500"
    );

    // No ethtool capture for eth2: a WARN that says so, not a crash.
    let off = find(&checks, "nic.eth2.offloads");
    assert_eq!(off.status, Status::Warn);
    assert_eq!(
        off.current,
        "cannot read offloads: ethtool runs only with --root / (no capture ethtool/eth2/ethtool-k.txt)"
    );
    assert_eq!(status("nic.eth2.rings"), Status::Warn);
    assert_eq!(status("nic.eth2.link"), Status::Warn, "1G link");
    assert_eq!(
        find(&checks, "nic.eth0.offloads").current,
        "tso on, gso on, gro off"
    );

    // 8 MiB memlock against 64 MiB x 4 shards (online CPUs of the fixture), no CAP_IPC_LOCK.
    let memlock = find(&checks, "rlimit.memlock");
    assert_eq!(memlock.status, Status::Fail);
    assert_eq!(memlock.current, "soft 8 MiB, hard 8 MiB; no CAP_IPC_LOCK");
    assert!(memlock
        .recommended
        .starts_with(">= 256 MiB (64 MiB arena x 4 shards)"));

    for key in [
        "net.core.wmem_max",
        "net.core.rmem_max",
        "net.ipv4.tcp_wmem",
        "net.core.somaxconn",
        "net.core.netdev_max_backlog",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
        "kernel.io_uring_disabled",
        "nic.eth0.txqueuelen",
        "thp.enabled",
        "cpu.governor",
        "irqbalance",
    ] {
        assert_eq!(status(key), Status::Warn, "{key}");
    }
    let cc = find(&checks, "net.ipv4.tcp_congestion_control");
    assert_eq!(
        (cc.current.as_str(), cc.recommended.as_str()),
        ("cubic", "bbr (modprobe tcp_bbr first)")
    );
    assert_eq!(
        find(&checks, "cpu.governor").current,
        "powersave on 4 of 4 CPUs"
    );
    assert!(any_fail(&checks));
}

#[test]
fn json_parses_back() {
    let checks = checks_for("trouble");
    let report: Report = serde_json::from_str(&report::to_json(&checks)).unwrap();
    assert_eq!(report.checks, checks);
    assert_eq!(
        report.summary.ok + report.summary.warn + report.summary.fail,
        checks.len()
    );
    assert!(report.summary.fail >= 4);
    // Every check carries all four texts, so operators always see what to do.
    for c in &report.checks {
        assert!(
            !c.current.is_empty() && !c.recommended.is_empty() && !c.why.is_empty(),
            "{c:?}"
        );
    }
}

#[test]
fn shards_and_arena_come_from_args() {
    let data = tempfile::tempdir().unwrap();
    let mut a = args(fixture("trouble"), data.path());
    a.arena_bytes = 1 << 20;
    a.shards = Some(8);
    let checks = run_checks(&DoctorContext::from_args(&a));
    let memlock = find(&checks, "rlimit.memlock");
    assert_eq!(memlock.status, Status::Ok, "8 MiB >= 1 MiB x 8");
    assert!(memlock
        .recommended
        .starts_with(">= 8 MiB (1 MiB arena x 8 shards)"));
}

/// Replays the same canned output for every `ethtool` call, or says the tool is missing.
struct Canned(Option<&'static str>);

impl CommandRunner for Canned {
    fn run(&self, program: &str, _args: &[&str]) -> Result<String, RunError> {
        self.0
            .map(str::to_string)
            .ok_or_else(|| RunError::Unavailable(format!("{program} not found")))
    }
}

/// Counts up by `step` between the two snapshots, without sleeping.
struct Growing {
    step: u64,
}

impl CounterSampler for Growing {
    fn snapshot(&self, _ctx: &DoctorContext, _iface: &str, round: Round) -> Snapshot {
        let value = if round == Round::First {
            10
        } else {
            10 + self.step
        };
        Snapshot {
            counters: [("tx_fifo_errors".to_string(), value)].into(),
            note: None,
        }
    }

    fn finish_window(&self, _start: Instant, window: Duration) -> Duration {
        window
    }
}

#[test]
fn injected_runner_and_sampler() {
    let data = tempfile::tempdir().unwrap();
    let mut ctx = DoctorContext::from_args(&args(fixture("healthy"), data.path()));
    ctx.runner = Box::new(Canned(None));
    ctx.sampler = Box::new(Growing { step: 7 });
    ctx.sample = Duration::from_millis(250);
    let checks = run_checks(&ctx);
    let off = find(&checks, "nic.eth0.offloads");
    assert_eq!(
        (off.status, off.current.as_str()),
        (Status::Warn, "cannot read offloads: ethtool not found")
    );
    assert_eq!(
        find(&checks, "nic.eth0.rings").current,
        "cannot read rings: ethtool not found"
    );
    let drops = find(&checks, "nic.eth1.drops");
    assert_eq!(
        (drops.status, drops.current.as_str()),
        (Status::Fail, "tx_fifo_errors +7 in 250 ms")
    );

    // Garbage from the tool is a WARN, not a panic.
    ctx.runner = Box::new(Canned(Some("\u{0}\u{ff}garbage: : :\n[fixed]")));
    ctx.sampler = Box::new(Growing { step: 0 });
    let checks = run_checks(&ctx);
    assert_eq!(
        find(&checks, "nic.eth0.rings").current,
        "cannot parse ethtool -g output"
    );
    assert_eq!(
        find(&checks, "nic.eth0.offloads").current,
        "tso unknown, gso unknown, gro unknown"
    );
    assert_eq!(find(&checks, "nic.eth0.drops").status, Status::Ok);
}

#[test]
fn empty_root_warns_but_does_not_crash() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let checks = run_checks(&DoctorContext::from_args(&args(
        root.path().into(),
        data.path(),
    )));
    assert!(!checks.iter().any(|c| c.name.starts_with("nic.")));
    assert_eq!(find(&checks, "net.core.wmem_max").status, Status::Warn);
    assert_eq!(find(&checks, "rlimit.memlock").status, Status::Warn);
    assert!(!any_fail(&checks), "{checks:#?}");
}
