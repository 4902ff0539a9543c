//! An edge behind a load balancer: the health path on the serving listener, drain without
//! loss on SIGTERM, SIGHUP reload, and a restart that hands the address to a new process.

mod common;

use common::*;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HEALTH: &str = "/__shardline/health";

fn small_root() -> tempfile::TempDir {
    let dir = disk_tempdir();
    std::fs::write(dir.path().join("a.txt"), b"hello\n").unwrap();
    dir
}

#[test]
fn health_path_answers_on_the_serving_listener_without_a_file() {
    let dir = small_root();
    let server = Server::start(dir.path(), &[]);
    let r = get(&server, HEALTH, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"200 OK\n");
    let r = get(&server, &format!("{HEALTH}?from=haproxy"), &[]);
    assert_eq!(r.status, 200, "a query string is ignored");
    let head = raw_request(
        &server,
        format!("HEAD {HEALTH} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    // Files are still files; a path beside the health path is not health.
    assert_eq!(get(&server, "/a.txt", &[]).body, b"hello\n");
    assert_eq!(get(&server, &format!("{HEALTH}x"), &[]).status, 404);
}

// ---- drain, reload, handover ---------------------------------------------------------------

/// A download large enough to stay in flight across a drain or a reload.
const BIG_LEN: u64 = (32 << 20) + 777;
/// How long a test waits for something the server should do promptly (generous: CI is slow).
const PATIENCE: Duration = Duration::from_secs(20);

fn config_file(dir: &Path, text: &str) -> String {
    let p = dir.join("shardline.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// A root with `a.txt` and the big pattern file `big.bin`.
fn fleet_root() -> tempfile::TempDir {
    let dir = root_with_pattern_file("big.bin", BIG_LEN);
    std::fs::write(dir.path().join("a.txt"), b"hello\n").unwrap();
    dir
}

/// A download of `big.bin` that reads slowly (64 KiB per 20 ms) until `fast` is set, checking
/// every byte; joins to the bytes received and the first problem seen.
struct SlowDownload {
    received: Arc<AtomicU64>,
    fast: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Option<String>)>,
}

impl SlowDownload {
    fn start(addr: SocketAddr) -> SlowDownload {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let fast = Arc::new(AtomicBool::new(false));
        let (rx, f) = (received.clone(), fast.clone());
        let thread = std::thread::spawn(move || {
            let mut r = BufReader::with_capacity(64 << 10, s);
            let head = match read_response(&mut r, true) {
                Ok(h) if h.status == 200 => h,
                other => return (0, Some(format!("bad head: {other:?}"))),
            };
            if head.header("content-length") != Some(BIG_LEN.to_string().as_str()) {
                return (0, Some(format!("bad length: {head:?}")));
            }
            let mut buf = vec![0u8; 64 << 10];
            let mut done = 0u64;
            while done < BIG_LEN {
                let n = (BIG_LEN - done).min(buf.len() as u64) as usize;
                if let Err(e) = r.read_exact(&mut buf[..n]) {
                    return (done, Some(format!("read failed at {done}: {e}")));
                }
                if buf[..n] != pattern_range(done, n)[..] {
                    return (done, Some(format!("bytes differ at {done}")));
                }
                done += n as u64;
                rx.store(done, Ordering::Relaxed);
                if !f.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            (done, None)
        });
        let d = SlowDownload {
            received,
            fast,
            thread,
        };
        let deadline = Instant::now() + PATIENCE;
        while d.received.load(Ordering::Relaxed) < (1 << 20) {
            assert!(Instant::now() < deadline, "download did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    fn in_flight(&self) -> bool {
        self.received.load(Ordering::Relaxed) < BIG_LEN
    }

    /// Lets it finish and checks it got every byte right.
    fn finish(self) {
        self.fast.store(true, Ordering::Relaxed);
        let (got, problem) = self.thread.join().expect("download thread");
        assert_eq!(problem, None, "in-flight download damaged");
        assert_eq!(got, BIG_LEN);
    }
}

/// One `GET path` on a fresh connection: Ok(response) or the error that stopped it (a refused
/// connect, a reset, EOF before a response).
fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())?;
    read_response(&mut BufReader::new(s), false)
}

fn wait_for_log(server: &Server, needle: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !server.log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_turns_health_503_at_once_keeps_accepting_then_drains_without_loss() {
    let root = fleet_root();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config_file(
        cfg_dir.path(),
        "drain_accept_ms = 2000\ndrain_timeout_ms = 60000\n",
    );
    let mut server = Server::start(root.path(), &["--config", &cfg]);
    assert_eq!(get(&server, HEALTH, &[]).status, 200);
    let download = SlowDownload::start(server.addr);

    send_signal(&server, "TERM");
    let signalled = Instant::now();
    // The balancer's next check sees 503 (on a new connection: the listener still accepts).
    let health = loop {
        let r = try_get(server.addr, HEALTH).expect("health check refused during the drain");
        if r.status == 503 || signalled.elapsed() > PATIENCE {
            break r;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(health.status, 503, "health after SIGTERM: {health:?}");
    assert!(
        signalled.elapsed() < Duration::from_millis(1500),
        "health took {:?} to turn 503",
        signalled.elapsed()
    );
    // Within drain_accept_ms, connections the balancer still sends are served, and closed.
    let r = try_get(server.addr, "/a.txt").expect("refused within drain_accept_ms");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello\n"[..]));
    assert_eq!(r.header("connection"), Some("close"));
    // Then the listener closes, while the download is still in flight.
    let deadline = Instant::now() + PATIENCE;
    let refused = loop {
        match try_get(server.addr, "/a.txt") {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                break signalled.elapsed()
            }
            _ => {}
        }
        assert!(Instant::now() < deadline, "listener never closed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        refused >= Duration::from_millis(1900),
        "listener closed after {refused:?}, before drain_accept_ms"
    );
    assert!(
        download.in_flight(),
        "download ended before the test meant anything"
    );
    download.finish();
    let st = wait_exit(&mut server, PATIENCE).expect("no exit after the drain");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn sighup_applies_a_new_timeout_refuses_fixed_keys_by_name_and_keeps_connections() {
    let root = fleet_root();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config_file(cfg_dir.path(), "header_timeout_ms = 30000\n");
    let (server, admin) = start_with_admin(root.path(), &["--config", &cfg]);
    let (mut ka, mut ka_r) = connect_pair(&server);
    let first = exchange(&mut ka, &mut ka_r, "GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(first.status, 200);
    let download = SlowDownload::start(server.addr);

    config_file(
        cfg_dir.path(),
        "header_timeout_ms = 300\nchunk_bytes = 1048576\n",
    );
    send_signal(&server, "HUP");
    wait_for_log(&server, "configuration reloaded");
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("chunk_bytes") && l.contains("cannot change while running")),
        "no refusal naming chunk_bytes:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("header_timeout_ms") && l.contains("cannot change")),
        "header_timeout_ms may change:\n{log}"
    );

    // Shards pick a reload up on their next loop tick and publish its epoch once applied.
    wait_reload_applied(admin, 1, 1);
    // The new header timeout: a connection that sends nothing is closed in well under the old
    // 30 s.
    let mut silent = server.connect();
    let opened = Instant::now();
    let mut sink = Vec::new();
    let _ = silent.read_to_end(&mut sink);
    assert!(
        opened.elapsed() < Duration::from_secs(10),
        "silent connection kept {:?}: the reloaded header_timeout_ms did not apply\n{}",
        opened.elapsed(),
        server.log()
    );
    // Connections from before the reload were not dropped.
    let again = exchange(&mut ka, &mut ka_r, "GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("keep-alive connection from before the reload");
    assert_eq!(
        (again.status, again.body.as_slice()),
        (200, &b"hello\n"[..])
    );
    assert!(download.in_flight());
    download.finish();
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
}

#[test]
fn restart_hands_the_address_to_a_new_process_without_a_refused_connection() {
    let root = fleet_root();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config_file(cfg_dir.path(), "drain_timeout_ms = 60000\n");
    let two = ["--shards", "2", "--config", &cfg];
    let mut old = Server::start(root.path(), &two);
    let addr = old.addr;
    let download = SlowDownload::start(addr);

    // A client loop: fresh connections back to back for the whole handover.
    let stop = Arc::new(AtomicBool::new(false));
    let looper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut ok, mut failures) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match try_get(addr, "/a.txt") {
                    Ok(r) if r.status == 200 && r.body == b"hello\n" => ok += 1,
                    Ok(r) => failures.push(format!("status {}", r.status)),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (ok, failures)
        })
    };

    let listen = addr.to_string();
    let new = Server::start(
        root.path(),
        &["--shards", "2", "--config", &cfg, "--listen", &listen],
    );
    assert_eq!(new.addr, addr);
    wait_for_log(&new, "another process listens on this address");
    std::thread::sleep(Duration::from_millis(300));
    send_signal(&old, "TERM");
    wait_for_log(&old, "handover: new connections go to the successor");
    wait_for_log(&old, "draining: no new connections");
    std::thread::sleep(Duration::from_millis(500));
    // The new process serves while the old one still drains its download.
    assert!(old.alive(), "the old process should still be draining");
    assert!(download.in_flight());
    download.finish();
    let st = wait_exit(&mut old, PATIENCE).expect("old process did not exit");
    assert_eq!(st.code(), Some(0));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (ok, failures) = looper.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len() as u64,
        &failures[..failures.len().min(5)]
    );
    assert!(ok > 20, "only {ok} requests in the loop");
    // Only the new process is left, and it serves (health 200).
    assert_eq!(try_get(addr, HEALTH).unwrap().status, 200);
    drop(new);
}
