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
    let dir = common::disk_tempdir();
    let (server, admin) = server_with(
        dir.path(),
        "limit_rate_bytes_per_s = 4096\nlimit_rate_after_bytes = 0\n",
        4 << 20,
    );
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
    assert!(common::admin_metric(admin, "shardline_limit_waits_total", "") >= 100);
}
