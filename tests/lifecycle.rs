//! Process lifecycle: SIGTERM drain with a download in flight, configuration errors, the
//! command line, timeouts, and clients that vanish mid-download.

mod common;
use common::*;

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The download used for drain and disconnect tests.
const DL_LEN: u64 = (64 << 20) + 4321;

fn write_config(dir: &Path, text: &str) -> String {
    let p = dir.join("shardline.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// What a connection attempt made after SIGTERM saw.
#[derive(Debug, PartialEq)]
enum Probe {
    /// Refused: connect failed, EOF or reset without a response, or a 503.
    Refused(String),
    /// Served normally: a drain bug.
    Served(u16),
    /// Connected but nothing came back within the probe's patience: it sits in the backlog.
    Hanging,
}

fn probe_new_connection(addr: std::net::SocketAddr) -> Probe {
    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(e) => return Probe::Refused(format!("connect: {e}")),
    };
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    if let Err(e) = s.write_all(b"GET /small.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    {
        return Probe::Refused(format!("write: {e}"));
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => Probe::Refused("EOF".into()),
        Ok(n) => {
            let line = String::from_utf8_lossy(&buf[..n]).to_string();
            let status: u16 = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if status == 503 {
                Probe::Refused("503".into())
            } else {
                Probe::Served(status)
            }
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Probe::Hanging,
        Err(e) => Probe::Refused(format!("read: {e}")),
    }
}

#[test]
fn sigterm_lets_an_in_flight_download_finish_and_exits_0() {
    let root = root_with_pattern_file("drain.bin", DL_LEN);
    let cfg_dir = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("small.txt"), b"small\n").unwrap();
    // No lame-duck window (drain_accept_ms, tested in fleet_lifecycle.rs): the listener closes
    // at once, which is what this test checks.
    let cfg = write_config(
        cfg_dir.path(),
        "drain_timeout_ms = 60000\ndrain_accept_ms = 0\n",
    );
    let mut server = Server::start(root.path(), &["--config", &cfg]);

    let received = Arc::new(AtomicU64::new(0));
    let go_fast = Arc::new(AtomicBool::new(false));
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"GET /drain.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let client = {
        let received = received.clone();
        let go_fast = go_fast.clone();
        std::thread::spawn(move || {
            // A slow reader: 64 KiB every 20 ms (about 3 MiB/s) until told to hurry.
            let mut r = BufReader::with_capacity(64 << 10, s);
            let head = read_response(&mut r, true).expect("head");
            assert_eq!(head.status, 200);
            let mut buf = vec![0u8; 64 << 10];
            let mut done = 0u64;
            let mut mismatch = None;
            while done < DL_LEN {
                let n = (DL_LEN - done).min(buf.len() as u64) as usize;
                if let Err(e) = r.read_exact(&mut buf[..n]) {
                    return (head, done, Some(format!("read failed at {done}: {e}")));
                }
                if mismatch.is_none() && buf[..n] != pattern_range(done, n)[..] {
                    mismatch = Some(format!("body differs in [{done}, {})", done + n as u64));
                }
                done += n as u64;
                received.store(done, Ordering::Relaxed);
                if !go_fast.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            // Nothing after the body, and (draining) the server closes.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
            if !rest.is_empty() {
                mismatch = Some(format!("{} bytes after the body", rest.len()));
            }
            (head, done, mismatch)
        })
    };

    // Let the download get going, then signal.
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < (2 << 20) {
        assert!(Instant::now() < deadline, "download did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    send_signal(&server, "TERM");
    // The shard's own line: the main thread logs "leaving rotation" before it tells the
    // shards, and a connection the kernel completed before the shard began draining is served
    // (it was accepted; answering it is the graceful thing), so only from this line on must
    // every new connection be refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("draining: no new connections") {
        assert!(
            Instant::now() < deadline,
            "no drain in the log after SIGTERM:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        received.load(Ordering::Relaxed) < DL_LEN / 2,
        "download finished too early for the test to mean anything"
    );

    // New connections are refused from now on, while the download is still in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut probes = Vec::new();
    let refused = loop {
        let p = probe_new_connection(server.addr);
        if let Probe::Served(status) = p {
            panic!("a new connection was served ({status}) after SIGTERM");
        }
        let done = matches!(p, Probe::Refused(_));
        probes.push(p);
        if done {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let in_flight = received.load(Ordering::Relaxed) < DL_LEN;
    go_fast.store(true, Ordering::Relaxed);
    let (head, got, problem) = client.join().expect("client thread");
    assert_eq!(problem, None, "in-flight download was damaged by the drain");
    assert_eq!(got, DL_LEN);
    assert_eq!(
        head.header("content-length"),
        Some(DL_LEN.to_string().as_str())
    );
    let status = wait_exit(&mut server, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("server did not exit after the drain:\n{}", server.log()));
    assert!(in_flight, "the download was over before the probes ended");
    assert!(
        refused,
        "new connections after SIGTERM were neither refused nor answered (they wait in the \
         listen backlog until the process exits): {probes:?}"
    );
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM drain");
}

#[test]
fn sigterm_and_sigint_on_an_idle_server_exit_0() {
    for sig in ["TERM", "INT"] {
        let dir = disk_tempdir();
        std::fs::write(dir.path().join("a.txt"), b"a").unwrap();
        let root = dir.path().to_path_buf();
        let mut server = Server::start_owning(dir, &root, &[]);
        // One idle keep-alive connection open: it must not hold the exit up.
        let (mut s, mut r) = connect_pair(&server);
        let resp = exchange(&mut s, &mut r, "GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        assert_eq!(resp.status, 200);
        send_signal(&server, sig);
        let st = wait_exit(&mut server, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("no exit after SIG{sig}"));
        assert_eq!(st.code(), Some(0), "SIG{sig}");
        assert!(expect_closed(&mut r).is_empty());
    }
}

#[test]
fn sigterm_drain_deadline_cuts_a_stalled_download() {
    let root = root_with_pattern_file("drain.bin", DL_LEN);
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = write_config(cfg_dir.path(), "drain_timeout_ms = 1000\n");
    let mut server = Server::start(root.path(), &["--config", &cfg]);
    // A client that asks and never reads: the response stalls on a full socket buffer.
    let mut s = server.connect();
    s.write_all(b"GET /drain.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    send_signal(&server, "TERM");
    let st = wait_exit(&mut server, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("drain deadline not enforced:\n{}", server.log()));
    assert_eq!(st.code(), Some(0));
    drop(s);
}

// ---- configuration errors ------------------------------------------------------------------

/// Exit code 2, no panic, and exactly one line (clap's usage hint aside) naming `key`.
fn assert_config_error(args: &[&str], key: &str) {
    let out = run_shardline(args, Duration::from_secs(15));
    assert!(!out.timed_out, "{args:?}: kept running instead of failing");
    assert_eq!(
        out.code,
        Some(2),
        "{args:?}: exit code; stderr:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("panicked"),
        "{args:?}: panicked:\n{}",
        out.stderr
    );
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: want one error line, got:\n{}",
        out.stderr
    );
    assert!(
        lines[0].contains(key),
        "{args:?}: the error line does not name `{key}`: {:?}",
        lines[0]
    );
}

#[test]
fn unknown_config_key_is_exit_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "chunk_sise = 1048576\n");
    let root = dir.path().to_str().unwrap();
    assert_config_error(&["serve", "--config", &cfg, "--root", root], "chunk_sise");
}

#[test]
fn zero_shards_in_the_config_file_is_exit_2_naming_shards() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "shards = 0\n");
    let root = dir.path().to_str().unwrap();
    assert_config_error(&["serve", "--config", &cfg, "--root", root], "shards");
}

#[test]
fn bad_config_values_are_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    for (text, key) in [
        ("chunk_bytes = 1000\n", "chunk_bytes"),
        ("pipeline_depth = 0\n", "pipeline_depth"),
        ("max_ranges = 0\n", "max_ranges"),
        ("chunk_bytes = \"big\"\n", "chunk_bytes"),
        ("listen = \"not an address\"\n", "listen"),
        ("zerocopy = \"maybe\"\n", "zerocopy"),
    ] {
        let cfg = write_config(dir.path(), text);
        assert_config_error(&["serve", "--config", &cfg, "--root", &root], key);
    }
}

#[test]
fn zero_shards_flag_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    assert_config_error(
        &[
            "serve",
            "--root",
            root,
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "0",
        ],
        "shards",
    );
}

#[test]
fn root_that_is_a_file_or_missing_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.txt");
    std::fs::write(&file, b"x").unwrap();
    for root in [file.clone(), dir.path().join("does-not-exist")] {
        assert_config_error(
            &[
                "serve",
                "--root",
                root.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ],
            "root",
        );
    }
}

#[test]
fn listen_on_a_port_in_use_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    assert_config_error(
        &[
            "serve",
            "--root",
            dir.path().to_str().unwrap(),
            "--listen",
            &addr,
            "--shards",
            "1",
        ],
        "listen",
    );
    drop(taken);
}

#[test]
fn missing_config_file_is_exit_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("nope.toml");
    assert_config_error(&["serve", "--config", cfg.to_str().unwrap()], "nope.toml");
}

// ---- command line --------------------------------------------------------------------------

#[test]
fn help_and_version() {
    let out = run_shardline(&["--help"], Duration::from_secs(15));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("serve"), "{}", out.stdout);
    let out = run_shardline(&["serve", "--help"], Duration::from_secs(15));
    assert_eq!(out.code, Some(0), "{out:?}");
    for flag in [
        "--config",
        "--root",
        "--listen",
        "--shards",
        "--cpus",
        "--access-log",
        "--log-json",
    ] {
        assert!(
            out.stdout.contains(flag),
            "serve --help lacks {flag}:\n{}",
            out.stdout
        );
    }
    let out = run_shardline(&["--version"], Duration::from_secs(15));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains(env!("CARGO_PKG_VERSION")),
        "{}",
        out.stdout
    );
}

#[test]
fn access_log_flag_writes_a_line_per_response() {
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    let log = dir.path().join("access.log");
    let server = Server::start(&root, &["--access-log", log.to_str().unwrap()]);
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
    assert_eq!(get(&server, "/missing-file", &[]).status, 404);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("/a.txt") && text.contains("/missing-file") {
            assert!(text.contains("404"), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "--access-log {}: no access log lines after two requests (file: {:?})",
            log.display(),
            text
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- timeouts ------------------------------------------------------------------------------

#[test]
fn header_and_keepalive_timeouts_close_connections() {
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    let cfg = write_config(
        dir.path(),
        "header_timeout_ms = 500\nkeepalive_timeout_ms = 500\n",
    );
    let server = Server::start(&root, &["--config", &cfg]);
    // A head that never completes (slowloris).
    let (mut s, mut r) = connect_pair(&server);
    s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n").unwrap();
    let rest = expect_closed(&mut r);
    assert!(
        rest.is_empty() || rest.starts_with(b"HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
    // An idle keep-alive connection.
    let (mut s, mut r) = connect_pair(&server);
    let resp = exchange(&mut s, &mut r, "GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(resp.status, 200);
    assert!(expect_closed(&mut r).is_empty());
    // The server itself is fine.
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
}

// ---- clients that vanish -------------------------------------------------------------------

#[test]
fn clients_disconnecting_mid_download_leave_the_server_healthy() {
    let root = root_with_pattern_file("drain.bin", DL_LEN);
    let fixture_dir = root.path().to_path_buf();
    let cfg_dir = tempfile::tempdir().unwrap();
    // A small arena and open-file cache, so a leaked buffer or file reference shows up as a
    // stuck or refused request below.
    let cfg = write_config(
        cfg_dir.path(),
        "arena_bytes = 8388608\nopen_file_cache_entries = 4\n",
    );
    let mut server = Server::start(&fixture_dir, &["--config", &cfg]);
    for i in 0..20u64 {
        let mut s = server.connect();
        let req = match i % 4 {
            0 => "GET /drain.bin HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
            1 => format!(
                "GET /drain.bin HTTP/1.1\r\nHost: t\r\nRange: bytes={}-\r\n\r\n",
                i * 1_000_003
            ),
            2 => "GET /drain.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=1-2,1000000-40000000\r\n\r\n"
                .to_string(),
            _ => "GET /drain.bin HTTP/1.0\r\n\r\n".to_string(),
        };
        s.write_all(req.as_bytes()).unwrap();
        // Read a varying amount (sometimes nothing), then vanish; every other one with a reset.
        let want = (i % 5) * 300_000;
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0u64;
        while got < want {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        if i % 2 == 1 {
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(s);
        assert!(
            server.alive(),
            "server died after disconnect {i}:\n{}",
            server.log()
        );
    }
    // Healthy: small and large responses, several distinct files (past the cache size).
    for name in ["f1.txt", "f2.txt", "f3.txt", "f4.txt", "f5.txt", "f6.txt"] {
        std::fs::write(fixture_dir.join(name), name.as_bytes()).unwrap();
    }
    for round in 0..2 {
        for name in ["f1.txt", "f2.txt", "f3.txt", "f4.txt", "f5.txt", "f6.txt"] {
            let r = get(&server, &format!("/{name}"), &[]);
            assert_eq!(r.status, 200, "round {round} {name}: {r:?}");
            assert_eq!(r.body, name.as_bytes());
        }
    }
    let mut s = server.connect();
    s.write_all(b"GET /drain.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = BufReader::with_capacity(1 << 20, s);
    let head = read_response(&mut r, true).unwrap();
    assert_eq!(head.status, 200);
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < DL_LEN {
        let n = (DL_LEN - done).min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..n]).unwrap();
        assert!(
            buf[..n] == pattern_range(done, n)[..],
            "body differs at {done}"
        );
        done += n as u64;
    }
    assert!(server.alive());
    assert!(!server.log().contains("panicked"), "{}", server.log());
    // And it still shuts down cleanly.
    let st = server.terminate();
    assert_eq!(st.code(), Some(0));
}

// ---- files that change under a response, stalled readers, the connection cap ---------------

/// Reads a response to `GET path` slowly at first; `during` runs after `after` body bytes.
/// Returns (Content-Length, body bytes received before EOF/reset).
fn download_with_event(
    server: &Server,
    path: &str,
    after: u64,
    during: impl FnOnce(),
) -> (u64, Vec<u8>) {
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::with_capacity(64 << 10, s);
    let head = read_response(&mut r, true).unwrap();
    assert_eq!(head.status, 200);
    let len: u64 = head.header("content-length").unwrap().parse().unwrap();
    let mut body = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut during = Some(during);
    loop {
        if body.len() as u64 >= after {
            if let Some(f) = during.take() {
                f();
            }
        }
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{path}: read failed after {} bytes: {e}", body.len()),
        }
        if body.len() as u64 >= len {
            break;
        }
        if during.is_some() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    (len, body)
}

#[test]
fn a_file_truncated_during_a_response_aborts_it_without_padding() {
    // 48 MiB: far more than loopback socket buffers hold, read with O_DIRECT by default and
    // through the page cache when direct_io_min_bytes is above it.
    const LEN: u64 = 48 << 20;
    for (mode, cfg_text) in [
        ("direct", ""),
        ("buffered", "direct_io_min_bytes = 1073741824\n"),
    ] {
        let dir = disk_tempdir();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let path = root.join("pkg.bin");
        write_pattern_file(&path, LEN);
        let cfg = write_config(dir.path(), cfg_text);
        let (server, admin) = start_with_admin(&root, &["--config", &cfg]);
        let (clen, body) = download_with_event(&server, "/pkg.bin", 1 << 20, || {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(2 << 20)
                .unwrap();
        });
        assert_eq!(clen, LEN);
        assert!(
            (body.len() as u64) < LEN,
            "{mode}: a full {LEN}-byte body arrived from a file truncated to 2 MiB"
        );
        let i = body
            .iter()
            .zip(pattern_range(0, body.len()))
            .position(|(a, b)| *a != b);
        assert_eq!(i, None, "{mode}: wrong byte (zeros?) sent after truncation");
        // Each mode took the read path it names.
        if mode == "direct" {
            assert_direct_bytes_sent(admin, 0, mode);
        } else {
            assert_eq!(direct_bytes_sent(admin), 0, "{mode}: O_DIRECT was used");
        }
        // The server is fine.
        assert_eq!(
            get(&server, "/pkg.bin", &[("Range", "bytes=0-9")]).status,
            206
        );
        drop(server);
        drop(dir);
    }
}

#[test]
fn a_file_replaced_during_a_response_keeps_serving_the_old_version() {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    let path = root.join("pkg.bin");
    write_pattern_file(&path, 24 << 20);
    let server = Server::start_owning(dir, &root, &[]);
    let (clen, body) = download_with_event(&server, "/pkg.bin", 1 << 20, || {
        let tmp = root.join("pkg.tmp");
        std::fs::write(&tmp, vec![0xEEu8; 24 << 20]).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    });
    assert_eq!(clen, 24 << 20);
    assert_eq!(
        body.len() as u64,
        clen,
        "download of the replaced file was cut"
    );
    assert!(
        body == pattern_range(0, body.len()),
        "a mix of two versions was sent"
    );
}

#[test]
fn a_reader_that_stops_is_dropped_after_the_send_timeout() {
    let root = root_with_pattern_file("drain.bin", DL_LEN);
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = write_config(cfg_dir.path(), "send_timeout_ms = 1000\n");
    let server = Server::start(root.path(), &["--config", &cfg]);
    let mut s = server.connect();
    s.write_all(b"GET /drain.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // Stall well past the send timeout, then read what was queued.
    std::thread::sleep(Duration::from_secs(4));
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    assert!(
        (all.len() as u64) < DL_LEN,
        "the stalled response was not dropped ({} bytes)",
        all.len()
    );
    assert_eq!(
        get(&server, "/drain.bin", &[("Range", "bytes=0-9")]).status,
        206
    );
}

#[test]
fn connections_over_the_cap_get_503_and_slots_are_reused() {
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    let cfg = write_config(dir.path(), "max_connections_per_shard = 2\n");
    let (server, admin) = start_with_admin(&root, &["--config", &cfg]);
    // A slot is free again once the server has seen the close; the gauge counts taken slots.
    let wait_all_slots_free = |round: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while admin_metric(admin, "shardline_connections_open", "") != 0 {
            assert!(Instant::now() < deadline, "round {round}: slots not freed");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    for round in 0..3 {
        wait_all_slots_free(round);
        let mut held: Vec<_> = (0..2).map(|_| connect_pair(&server)).collect();
        for (s, r) in held.iter_mut() {
            let resp = exchange(s, r, "GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            assert_eq!(resp.status, 200, "round {round}");
        }
        // Over the cap: answered at once (before any request is read).
        let over = read_response(&mut BufReader::new(server.connect()), false)
            .expect("over-cap connection gets an answer");
        assert_eq!(over.status, 503, "round {round}");
        drop(held);
        // Freed slots come back (the server closes its side once it sees EOF).
        wait_all_slots_free(round);
        let r = raw_request(
            &server,
            b"GET /a.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.status, 200, "round {round}: a freed slot serves");
    }
}

#[test]
fn a_file_rewritten_in_place_during_a_response_is_never_sent_as_a_mix() {
    // DESIGN.md: "If the file shrinks or changes under a response (short read before the
    // promised length, inode/mtime change), abort the connection: never send zeros or a mix
    // of two versions." Same inode, same size, new bytes and a new mtime.
    const LEN: u64 = 48 << 20;
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    let path = root.join("pkg.bin");
    write_pattern_file(&path, LEN);
    let server = Server::start_owning(dir, &root, &[]);
    let (clen, body) = download_with_event(&server, "/pkg.bin", 1 << 20, || {
        let mut f = std::fs::File::options().write(true).open(&path).unwrap();
        let block = vec![0xEEu8; 1 << 20];
        for _ in 0..(LEN >> 20) {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    });
    assert_eq!(clen, LEN);
    let first_new = body
        .iter()
        .zip(pattern_range(0, body.len()))
        .position(|(a, b)| *a != b);
    assert_eq!(
        first_new,
        None,
        "received {} of {LEN} bytes; bytes of the new version start at {:?}: a mix of two \
         versions was sent",
        body.len(),
        first_new
    );
}

#[test]
fn impossible_cpu_plans_are_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let base = ["serve", "--root", root, "--listen", "127.0.0.1:0"];
    let with = |extra: &[&'static str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    assert_config_error(&with(&["--cpus", "4095"]), "cpus");
    assert_config_error(&with(&["--cpus", "zero-ish"]), "cpus");
    assert_config_error(&with(&["--shards", "4096"]), "shards");
    assert_config_error(&with(&["--shards", "many"]), "shards");
    assert_config_error(&["serve", "--root", root, "--listen", "nowhere"], "listen");
}

#[test]
fn log_json_writes_json_lines() {
    let dir = disk_tempdir();
    std::fs::write(dir.path().join("a.txt"), b"a").unwrap();
    let root = dir.path().to_path_buf();
    let mut server = Server::start_owning(dir, &root, &["--log-json"]);
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
    assert_eq!(server.terminate().code(), Some(0));
    let log = server.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v.get("level").is_some(), "{l}");
    }
}
