//! `shardline doctor` as a process: exit codes, JSON on stdout, the table. Needs main.rs to
//! wire `Command::Doctor(shardline::doctor::DoctorArgs)` to `run_doctor_cli`.

use std::path::{Path, PathBuf};
use std::process::Command;

use shardline::doctor::report::Report;
use shardline::doctor::Status;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

fn doctor(root: &Path, extra: &[&str]) -> std::process::Output {
    let data = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_shardline"))
        .arg("doctor")
        .arg("--root")
        .arg(root)
        .arg("--data-root")
        .arg(data.path())
        .args(["--sample-ms", "0"])
        .args(extra)
        .output()
        .expect("run shardline doctor")
}

#[test]
fn trouble_fixture_exits_1_with_json() {
    let out = doctor(&fixture("trouble"), &["--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report");
    let rings = report
        .checks
        .iter()
        .find(|c| c.name == "nic.eth0.rings")
        .unwrap();
    assert_eq!(rings.status, Status::Fail);
    assert!(report.summary.fail >= 4);
}

#[test]
fn healthy_fixture_exits_0_with_table() {
    let out = doctor(&fixture("healthy"), &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("STATUS  CHECK"), "{text}");
    assert!(
        text.contains("OK      net.ipv4.tcp_congestion_control"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("0 fail"), "{text}");
}

#[test]
fn arena_and_shards_flags_reach_the_memlock_check() {
    let out = doctor(
        &fixture("trouble"),
        &["--json", "--arena-bytes", "1048576", "--shards", "2"],
    );
    let report: Report = serde_json::from_slice(&out.stdout).unwrap();
    let memlock = report
        .checks
        .iter()
        .find(|c| c.name == "rlimit.memlock")
        .unwrap();
    assert_eq!(memlock.status, Status::Ok);
    assert!(memlock
        .recommended
        .starts_with(">= 2 MiB (1 MiB arena x 2 shards)"));
}
