//! The per-connection rate limit (issue 19) against the real binary: a limited download
//! arrives whole and its bytes past `limit_rate_after_bytes` are counted as limited; 100
//! connections waiting on their limit hold no arena slot while they wait.

mod common;

use common::tls::{run_bounded, tool};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn server_with(
    dir: &std::path::Path,
    config: &str,
    len: u64,
) -> (common::Server, std::net::SocketAddr) {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    common::write_pattern_file(&root.join("f.bin"), len);
    let cfg = dir.join("shardline.toml");
    std::fs::write(&cfg, config).unwrap();
    common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"])
}

#[test]
fn a_limited_download_arrives_whole_and_its_limited_bytes_are_counted() {
    const LEN: u64 = 1_500_000;
    let dir = common::disk_tempdir();
    let (server, admin) = server_with(
        dir.path(),
        "limit_rate_bytes_per_s = 500000\nlimit_rate_after_bytes = 100000\n",
        LEN,
    );
    let out = dir.path().join("got");
    let o = run_bounded(
        Command::new(tool("curl", "curl"))
            .args(["-sS", "--fail", "-o"])
            .arg(&out)
            .arg(format!("http://127.0.0.1:{}/f.bin", server.addr.port())),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&out).unwrap(), common::pattern(LEN as usize));
    assert_eq!(
        common::admin_metric(admin, "shardline_limited_bytes_total", ""),
        LEN - 100_000,
        "every byte past limit_rate_after_bytes went through the limit"
    );
    assert!(common::admin_metric(admin, "shardline_limit_waits_total", "") > 0);
}

#[test]
fn connections_waiting_on_their_limit_hold_no_arena_slot() {
    let waits = "shardline_limit_waits_total";
    waiting_connections_hold_no_arena_slot(
        "limit_rate_bytes_per_s = 4096\nlimit_rate_after_bytes = 0\n",
        waits,
    );
}

#[test]
fn connections_waiting_on_the_egress_cap_hold_no_arena_slot() {
    // 400 kB/s for the edge, no bypass: a 4 KiB step each, then all queue for their turns.
    let waits = "shardline_egress_waits_total";
    waiting_connections_hold_no_arena_slot(
        "egress_limit_bytes_per_s = 400000\negress_bypass_bytes = 0\n",
        waits,
    );
}

/// 100 clients that read everything they get are each given a little at once, then wait on
/// the limiter that `config` sets (counted by `waits`), holding no arena slot while they do.
fn waiting_connections_hold_no_arena_slot(config: &str, waits: &str) {
    let dir = common::disk_tempdir();
    let (server, admin) = server_with(dir.path(), config, 4 << 20);
    // 100 clients that read everything they get: each is given one step (4 KiB) at once,
    // then waits on its limit.
    let mut conns: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            s.write_all(b"GET /f.bin HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 65536];
    let mut got = vec![0usize; conns.len()];
    while Instant::now() < deadline {
        for (i, s) in conns.iter_mut().enumerate() {
            if let Ok(n) = s.read(&mut buf) {
                got[i] += n;
            }
        }
    }
    assert!(
        got.iter().all(|&n| n > 0),
        "every client got its first step: {got:?}"
    );
    assert!(
        got.iter().all(|&n| n < 64 * 1024),
        "nobody got past its limit: {got:?}"
    );
    assert_eq!(
        common::admin_metric(admin, "shardline_connections_open", ""),
        100,
        "all 100 responses still under way"
    );
    assert_eq!(
        common::admin_metric(admin, "shardline_chunks_in_flight", ""),
        0,
        "a connection waiting on its limit holds no arena slot"
    );
    assert!(common::admin_metric(admin, waits, "") >= 100);
}

/// JSON access-log lines once `n` are there (or what there is after 10 s).
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

/// Downloads `url` with curl into `out`; panics unless it succeeded.
fn curl_to(url: &str, out: &std::path::Path) {
    let o = run_bounded(
        Command::new(tool("curl", "curl"))
            .args(["-sS", "--fail", "--path-as-is", "-o"])
            .arg(out)
            .arg(url),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_egress_cap_holds_over_both_shards_and_a_small_file_skips_its_queue() {
    const CAP: u64 = 8_000_000;
    const LEN: u64 = 4 << 20;
    const CLIENTS: usize = 6;
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    common::write_pattern_file(&root.join("big.bin"), LEN);
    common::write_pattern_file(&root.join("manifest.json"), 1024);
    let log = dir.path().join("access.log");
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "egress_limit_bytes_per_s = {CAP}\negress_bypass_bytes = 65536\n\
             access_log = \"{}\"\naccess_log_format = \"json\"\n",
            log.display()
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "2"]);
    let started = Instant::now();
    let downloads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let url = server.url("/big.bin");
            let out = dir.path().join(format!("big.{i}"));
            std::thread::spawn(move || {
                curl_to(&url, &out);
                out
            })
        })
        .collect();
    // While the bulk queues for its turns, a manifest goes through the bypass.
    std::thread::sleep(Duration::from_millis(500));
    let manifest = dir.path().join("manifest.got");
    curl_to(&server.url("/manifest.json"), &manifest);
    assert_eq!(std::fs::read(&manifest).unwrap(), common::pattern(1024));
    for d in downloads {
        let out = d.join().unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), common::pattern(LEN as usize));
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The cap is never exceeded: all the bytes cannot have left sooner than the cap lets
    // them (less the bucket's 20 ms burst and the bypass share's first bytes).
    let total = CLIENTS as f64 * LEN as f64;
    let earliest = (total - CLIENTS as f64 * 65536.0) / CAP as f64 - 0.02;
    assert!(
        elapsed >= earliest,
        "{total} bytes in {elapsed:.2} s: faster than the cap allows ({earliest:.2} s)"
    );
    assert!(common::admin_metric(admin, "shardline_egress_waits_total", "") > 0);
    let delayed = common::admin_metric(admin, "shardline_egress_delayed_bytes_total", "");
    assert!(
        delayed > total as u64 / 2,
        "most bulk bytes waited for their turn: {delayed}"
    );
    assert!(
        common::admin_metric(admin, "shardline_egress_bypass_bytes_total", "") >= 1024,
        "the manifest went on the bypass"
    );
    let lines = log_lines(&log, CLIENTS + 1);
    assert_eq!(lines.len(), CLIENTS + 1, "{lines:?}");
    for l in &lines {
        let small = l["request"].as_str().unwrap().contains("manifest");
        let want = if small { None } else { Some("egress") };
        assert_eq!(l["limiter"].as_str(), want, "{l}");
    }
}

#[test]
fn a_prefix_rate_applies_under_its_prefix_and_nowhere_else() {
    // Larger than a chunk: a response of one chunk goes whole at once, as with any limit.
    const LEN: u64 = 1_500_000;
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("beta")).unwrap();
    common::write_pattern_file(&root.join("beta/f.bin"), LEN);
    common::write_pattern_file(&root.join("f.bin"), LEN);
    let log = dir.path().join("access.log");
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "access_log = \"{}\"\naccess_log_format = \"json\"\n\n\
             [[rate_limit]]\nprefix = \"/beta/\"\nrate_bytes_per_s = 1000000\n\
             after_bytes = 500000\n",
            log.display()
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    let out = dir.path().join("got");
    curl_to(&server.url("/f.bin"), &out);
    assert_eq!(std::fs::read(&out).unwrap(), common::pattern(LEN as usize));
    assert_eq!(
        common::admin_metric(admin, "shardline_limited_bytes_total", ""),
        0,
        "outside the prefix nothing is limited"
    );
    // Dot segments do not dodge the rule: it judges the path that is served.
    curl_to(&server.url("/x/../beta/f.bin"), &out);
    assert_eq!(std::fs::read(&out).unwrap(), common::pattern(LEN as usize));
    assert_eq!(
        common::admin_metric(admin, "shardline_limited_bytes_total", ""),
        LEN - 500_000,
        "every byte past the prefix's after_bytes went through its rate"
    );
    let lines = log_lines(&log, 2);
    assert_eq!(lines[0]["limiter"].as_str(), None, "{}", lines[0]);
    assert_eq!(lines[1]["limiter"].as_str(), Some("rate"), "{}", lines[1]);
}
