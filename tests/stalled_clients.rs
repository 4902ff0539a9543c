//! Clients that stop reading, or read a byte now and then, must not hold the shard's registered
//! memory: a fresh download completes (byte for byte) while they are still connected, and once
//! they have settled they hold no arena chunk at all.
//!
//! The arena is made small (16 chunks) and the send timeout long (120 s), so an engine that lets
//! a stalled socket pin its chunks cannot serve the fresh download before the deadline here.

mod common;

use common::{
    admin_metric, assert_direct_bytes_sent, pattern_range, read_response, write_pattern_file,
    Server,
};
use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Connections that send a GET for the large file and never read.
const STALLED: usize = 24;
/// Connections that read one byte every `TRICKLE_EVERY`.
const TRICKLING: usize = 8;
const TRICKLE_EVERY: Duration = Duration::from_millis(500);
const LARGE_BYTES: u64 = 64 << 20;
const FRESH_BYTES: u64 = 5 << 20;
/// Generous bound against a hang; the send timeout (120 s) is far beyond it.
const FRESH_DEADLINE: Duration = Duration::from_secs(40);

/// A client socket with a 4 KiB receive buffer that asks for `path` and then does nothing.
fn stalled_client(addr: SocketAddr, path: &str) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    s.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    s.connect(&addr.into()).expect("connect");
    let mut s: TcpStream = s.into();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    s
}

fn fetch(server: &Server, path: &str, range: Option<(u64, u64)>) -> (u16, Vec<u8>) {
    let mut s = server.connect();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    if let Some((a, b)) = range {
        req.push_str(&format!("Range: bytes={a}-{b}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let r = read_response(&mut BufReader::new(s), false).expect("fresh response");
    (r.status, r.body)
}

#[test]
fn stalled_and_trickling_clients_do_not_hold_the_arena() {
    let dir = common::disk_tempdir();
    let root = dir.path();
    write_pattern_file(&root.join("large.bin"), LARGE_BYTES);
    write_pattern_file(&root.join("5m.bin"), FRESH_BYTES);
    let cfg = root.join("shardline.toml");
    std::fs::write(
        &cfg,
        "arena_bytes = 8388608\nsend_timeout_ms = 120000\npipeline_depth = 4\n",
    )
    .unwrap();
    let (server, admin) = common::start_with_admin(
        root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
        ],
    );

    let stalled: Vec<TcpStream> = (0..STALLED)
        .map(|_| stalled_client(server.addr, "/large.bin"))
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tricklers: Vec<_> = (0..TRICKLING)
        .map(|_| {
            let mut s = stalled_client(server.addr, "/large.bin");
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                let mut got = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        break;
                    }
                    got += 1;
                    std::thread::sleep(TRICKLE_EVERY);
                }
                got
            })
        })
        .collect();
    // Let every slow connection reach a full socket.
    std::thread::sleep(Duration::from_millis(1500));

    let t0 = Instant::now();
    let (status, body) = fetch(&server, "/5m.bin", None);
    assert_eq!(status, 200);
    assert!(
        body == pattern_range(0, FRESH_BYTES as usize),
        "5 MiB body differs"
    );
    // An unaligned 10 MB range of the file the stalled clients asked for.
    let (a, b) = (1_000_001u64, 11_000_000u64);
    let (status, body) = fetch(&server, "/large.bin", Some((a, b)));
    assert_eq!(status, 206);
    assert!(
        body == pattern_range(a, (b - a + 1) as usize),
        "ranged body differs"
    );
    assert!(
        t0.elapsed() < FRESH_DEADLINE,
        "fresh downloads waited behind stalled clients for {:?}",
        t0.elapsed()
    );

    // Settled: parked chunks are given back within the hold time, so the stalled and trickling
    // connections (all still open) hold no chunk.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = admin_metric(admin, "shardline_chunks_in_flight", "");
    while held > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        held = admin_metric(admin, "shardline_chunks_in_flight", "");
    }
    assert_eq!(
        held, 0,
        "stalled connections still hold {held} arena chunks"
    );
    let open = admin_metric(admin, "shardline_connections_open", "");
    assert!(
        open >= (STALLED + TRICKLING) as u64,
        "stalled connections were dropped ({open} open): they must stay, holding nothing"
    );
    // The large file is above direct_io_min_bytes: its bytes must come from O_DIRECT reads
    // (the root is on a real disk, see disk_tempdir), or this test did not test the arena.
    assert_direct_bytes_sent(admin, 0, "stalled clients");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(stalled);
    for t in tricklers {
        let _ = t.join();
    }
}

/// The same over HTTPS: clients that complete the handshake, ask for the large file and never
/// read hold no arena chunk once settled (their ciphertext is made again from the file when
/// they read again: `tls::record`), and a fresh HTTPS download completes meanwhile.
#[test]
fn stalled_https_clients_do_not_hold_the_arena() {
    let dir = common::disk_tempdir();
    let root = dir.path();
    write_pattern_file(&root.join("large.bin"), LARGE_BYTES);
    write_pattern_file(&root.join("5m.bin"), FRESH_BYTES);
    let pki = common::tls::Pki::new();
    let leaf = pki.leaf("localhost", &["localhost"], common::tls::Key::EcdsaP256, 30);
    let cfg = pki.config(
        &[leaf],
        "arena_bytes = 8388608\nsend_timeout_ms = 120000\npipeline_depth = 4\n",
    );
    let (server, admin) = common::start_tls_with_admin(root, &["--config", cfg.to_str().unwrap()]);
    let tls = server.tls_addr.expect("HTTPS address");
    let cc = pki.client();
    let stalled: Vec<_> = (0..STALLED + TRICKLING)
        .map(|_| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
            s.set_recv_buffer_size(4096).expect("SO_RCVBUF");
            s.connect(&tls.into()).expect("connect");
            let tcp: TcpStream = s.into();
            let name = "localhost".try_into().unwrap();
            let conn = rustls::ClientConnection::new(cc.clone(), name).unwrap();
            let mut st = rustls::StreamOwned::new(conn, tcp);
            while st.conn.is_handshaking() {
                st.conn.complete_io(&mut st.sock).expect("handshake");
            }
            st.write_all(b"GET /large.bin HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            st.flush().unwrap();
            st
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));

    let t0 = Instant::now();
    let mut fresh = common::tls::TlsConn::connect(tls, cc.clone(), "localhost").unwrap();
    let r = fresh.get("/5m.bin", &[]);
    assert!(
        r.status == 200 && r.body == pattern_range(0, FRESH_BYTES as usize),
        "fresh HTTPS body"
    );
    let (a, b) = (1_000_001u64, 11_000_000u64);
    let r = fresh.get("/large.bin", &[("Range", &format!("bytes={a}-{b}"))]);
    assert!(
        r.status == 206 && r.body == pattern_range(a, (b - a + 1) as usize),
        "ranged HTTPS body"
    );
    assert!(
        t0.elapsed() < FRESH_DEADLINE,
        "fresh HTTPS downloads waited {:?}",
        t0.elapsed()
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = admin_metric(admin, "shardline_chunks_in_flight", "");
    while held > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        held = admin_metric(admin, "shardline_chunks_in_flight", "");
    }
    assert_eq!(
        held, 0,
        "stalled HTTPS connections still hold {held} arena chunks"
    );
    let open = admin_metric(admin, "shardline_connections_open", "");
    assert!(
        open >= (STALLED + TRICKLING) as u64,
        "stalled HTTPS connections were dropped ({open} open)"
    );
    assert_direct_bytes_sent(admin, 0, "stalled HTTPS clients");
    // A stalled client that reads again gets its bytes, sealed again identically: the rest of
    // its body arrives intact after a while of holding nothing.
    let mut st = stalled.into_iter().next().unwrap();
    st.sock
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let resp =
        read_response(&mut BufReader::new(&mut st), false).expect("the stalled client's response");
    assert_eq!(resp.status, 200);
    assert!(
        resp.body == pattern_range(0, LARGE_BYTES as usize),
        "resumed body differs from the file"
    );
}

/// SEND_ZC to a reader that cannot keep up: the socket takes part of a chunk, and the rest of
/// that chunk must leave before the next chunk. (The engine before the parked-chunk change sent
/// the next chunk while the first one's tail waited for its notification, which corrupted
/// bodies over a veth or a NIC; on loopback its sends were not cut short, so only the shaped
/// link and fleet runs, which use zerocopy over veth, showed it. With MSG_DONTWAIT sends, short
/// SEND_ZC completions happen here too.) Zero-copy is forced on (loopback would otherwise turn
/// it off) and the body compared.
#[test]
fn zero_copy_sends_to_a_slow_reader_stay_in_order() {
    let dir = common::disk_tempdir();
    let root = dir.path();
    const LEN: u64 = 24 << 20;
    write_pattern_file(&root.join("zc.bin"), LEN);
    let cfg = root.join("shardline.toml");
    std::fs::write(&cfg, "zerocopy = \"on\"\n").unwrap();
    let server = Server::start(root, &["--config", cfg.to_str().unwrap()]);
    for round in 0..3 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.set_recv_buffer_size(16 * 1024).expect("SO_RCVBUF");
        s.connect(&server.addr.into()).expect("connect");
        let mut s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /zc.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s);
        // Read slowly at first (the socket fills, sends come back short), then at full speed.
        let resp = {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                r.read_exact(&mut byte).expect("head");
                head.push(byte[0]);
            }
            head
        };
        assert!(resp.starts_with(b"HTTP/1.1 200"), "round {round}");
        let mut body = Vec::with_capacity(LEN as usize);
        let mut buf = vec![0u8; 4096];
        while body.len() < LEN as usize {
            let n = r.read(&mut buf).expect("body");
            assert!(n > 0, "round {round}: body cut at {}", body.len());
            body.extend_from_slice(&buf[..n]);
            if body.len() < (4 << 20) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let want = pattern_range(0, LEN as usize);
        if let Some(i) = (0..body.len()).find(|&i| body[i] != want[i]) {
            panic!("round {round}: body differs from the file at offset {i}");
        }
    }
}
