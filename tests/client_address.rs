//! Who is asking (issue 19): every connection's peer address reaches the access log, over
//! cleartext and HTTPS, from several source addresses (loopback has all of 127.0.0.0/8).

mod common;

use common::tls::{run_bounded, tool, Key, Pki};
use std::process::Command;
use std::time::{Duration, Instant};

/// The access log's JSON lines once `n` have been written (waits up to 10 s).
fn log_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_access_log_names_each_clients_own_address() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("a.bin"), 100_000);
    let log = dir.path().join("access.log");
    let pki = Pki::new();
    let leaf = pki.leaf("leaf", &["localhost"], Key::EcdsaP256, 30);
    let cfg = pki.config(&[leaf], "access_log_format = \"json\"");
    let server = common::Server::start_tls(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let http = server.addr.port();
    let https = server.tls_addr.expect("HTTPS address").port();
    let curl = tool("curl", "curl");
    let sources = ["127.0.0.2", "127.0.0.3", "127.0.0.44", "127.1.2.3"];
    for (i, src) in sources.iter().enumerate() {
        let url = if i % 2 == 0 {
            format!("http://127.0.0.1:{http}/a.bin?from={src}")
        } else {
            format!("https://localhost:{https}/a.bin?from={src}")
        };
        let o = run_bounded(
            Command::new(&curl)
                .args(["-sS", "--fail", "-o", "/dev/null", "--interface", src])
                .args(["--cacert", pki.ca.to_str().unwrap()])
                .args(["--resolve", &format!("localhost:{https}:127.0.0.1")])
                .arg(&url),
            Duration::from_secs(30),
        );
        assert!(
            o.status.success(),
            "curl from {src}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lines = log_lines(&log, sources.len());
    assert_eq!(lines.len(), sources.len(), "{lines:?}");
    for src in sources {
        let line = lines
            .iter()
            .find(|l| {
                l["request"]
                    .as_str()
                    .unwrap_or("")
                    .contains(&format!("from={src} "))
            })
            .unwrap_or_else(|| panic!("no line for {src}: {lines:?}"));
        assert_eq!(line["client"], src, "{line}");
        assert_eq!(line["status"], 200);
    }
}
