//! The fleet behind HAProxy, small: `perf/fleet.sh --quick` with this build's binary. Four
//! edges in network namespaces, HAProxy (config/haproxy.cfg) in another, curl clients in
//! another: byte-verified downloads, URL stickiness, the remap fraction when an edge is added,
//! SIGTERM during downloads with every client resuming (206) on another edge, a restart and
//! SIGHUP reloads under load. Needs root, `ip netns`, haproxy and curl (the script installs
//! the Debian packages `haproxy` and `curl` when missing; CI installs them up front).
//! Fails when it cannot run, unless SHARDLINE_SKIP_FLEET=1.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The script's own limit is far below this; a hang fails the test instead of CI.
const FLEET_TIMEOUT: Duration = Duration::from_secs(240);

/// Why the fleet cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root (network namespaces and veth pairs need it)".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("no `ip` command (iproute2): {e}")),
    }
}

#[test]
fn fleet_behind_haproxy_drains_resumes_and_restarts_without_loss() {
    if let Some(why) = missing_prerequisite() {
        assert_eq!(
            std::env::var("SHARDLINE_SKIP_FLEET").as_deref(),
            Ok("1"),
            "the fleet test cannot run: {why}. Run it as root on a host with network \
             namespaces, or set SHARDLINE_SKIP_FLEET=1 to skip it"
        );
        eprintln!("skipped (SHARDLINE_SKIP_FLEET=1): {why}");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let report_dir = tempfile::tempdir().expect("tempdir");
    let report = report_dir.path().join("FLEET.md");
    let mut child = Command::new(repo.join("perf/fleet.sh"))
        .arg("--quick")
        .args(["--bin", env!("CARGO_BIN_EXE_shardline")])
        .arg("--report")
        .arg(&report)
        // Its own namespace names: a perf run of the full script may be going on.
        .env("FLEET_PREFIX", "fl-t")
        .spawn()
        .expect("running perf/fleet.sh");
    let deadline = Instant::now() + FLEET_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            // SIGTERM: its trap removes the namespaces it made.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
            panic!("perf/fleet.sh --quick did not finish in {FLEET_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        status.success(),
        "perf/fleet.sh --quick failed ({status}):\n{text}"
    );
    for row in [
        "downloads through HAProxy verify byte for byte",
        "same URL -> same edge",
        "URLs moved when a 4th edge is added",
        "none refused",
        "edge out of rotation",
        "resumes with 206 on another edge",
        "every byte verifies",
        "under load (new process, old draining)",
        "SIGHUP of every edge under load",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(row) && l.contains("| pass |")),
            "no passing row {row:?} in the report:\n{text}"
        );
    }
    assert!(!text.contains("| FAIL |"), "{text}");
}
