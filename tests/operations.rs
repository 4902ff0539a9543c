//! Operations features against the real binary: the access log (and its reopen on SIGUSR1)
//! and the network-only zero endpoint.

mod common;
use common::*;
use std::time::{Duration, Instant};

fn wait_for(path: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn access_log_lines_and_reopen_on_sigusr1() {
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), pattern(100)).unwrap();
    let log = dir.path().join("access.log");
    let server = Server::start(&root, &["--access-log", log.to_str().unwrap()]);
    assert_eq!(
        get(&server, "/a.txt", &[("Range", "bytes=0-9")]).status,
        206
    );
    assert_eq!(get(&server, "/missing", &[]).status, 404);
    let text = wait_for(&log, "/missing");
    assert!(
        text.contains("\"GET /a.txt HTTP/1.1\" 206 ") && text.contains("range=\"bytes=0-9\""),
        "{text}"
    );
    assert!(text.contains("\"GET /missing HTTP/1.1\" 404 "), "{text}");

    // Rotation: move the file away, SIGUSR1, the next line lands in a new file.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    let pid = server.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-USR1", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    while Instant::now() < deadline && !text.contains("/after-rotate") {
        let _ = get(&server, "/after-rotate", &[]);
        std::thread::sleep(Duration::from_millis(200));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    assert!(text.contains("/after-rotate"), "new log file: {text:?}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("/missing"));
}

#[test]
fn zero_endpoint_sends_exact_zero_bytes_only_when_enabled() {
    let dir = disk_tempdir();
    let cfg = dir.path().join("diag.toml");
    std::fs::write(&cfg, "diag_endpoint = true\n").unwrap();
    let server = Server::start(dir.path(), &["--config", cfg.to_str().unwrap()]);
    for n in [0usize, 1, 524_288, 3_000_001] {
        let r = get(&server, &format!("/__shardline/zero?bytes={n}"), &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), n);
        assert!(r.body.iter().all(|&b| b == 0));
    }
    assert_eq!(get(&server, "/__shardline/zero?bytes=abc", &[]).status, 400);
    assert_eq!(get(&server, "/__shardline/zero", &[]).status, 400);

    let off = Server::start(dir.path(), &[]);
    assert_eq!(get(&off, "/__shardline/zero?bytes=10", &[]).status, 404);
}
