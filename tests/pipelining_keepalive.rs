//! Pipelining and keep-alive on one connection: answers in order, whatever mix of requests,
//! however the bytes are split.

mod common;
use common::*;

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

const MEDIUM_LEN: u64 = (10 << 20) + 333;
const FILES: usize = 50;

fn file_body(i: usize) -> Vec<u8> {
    format!("file number {i} {}\n", "x".repeat(i)).into_bytes()
}

fn start() -> Server {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(root.join("b.txt"), b"bravo bravo\n").unwrap();
    std::fs::write(root.join("small.bin"), pattern(100_000)).unwrap();
    write_pattern_file(&root.join("medium.bin"), MEDIUM_LEN);
    for i in 0..FILES {
        std::fs::write(root.join(format!("f{i}.txt")), file_body(i)).unwrap();
    }
    Server::start_owning(dir, &root, &[])
}

fn get_req(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n")
}

#[test]
fn mixed_pipelined_requests_are_answered_in_order() {
    let server = start();
    let mut batch = String::new();
    batch += &get_req("/a.txt");
    batch += &get_req("/missing.txt");
    batch += "GET /small.bin HTTP/1.1\r\nHost: test\r\nRange: bytes=4095-8192\r\n\r\n";
    batch += "HEAD /b.txt HTTP/1.1\r\nHost: test\r\n\r\n";
    batch += &get_req("/medium.bin");
    batch +=
        "GET /medium.bin HTTP/1.1\r\nHost: test\r\nRange: bytes=1000-2000,600000-700000\r\n\r\n";
    batch += &get_req("/b.txt");
    batch += "HEAD /medium.bin HTTP/1.1\r\nHost: test\r\n\r\n";
    batch += "GET /a.txt HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    let (mut s, mut r) = connect_pair(&server);
    s.write_all(batch.as_bytes()).unwrap();

    let resp = read_response(&mut r, false).unwrap();
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"alpha\n"[..]));
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 404);
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 206);
    assert_eq!(resp.header("content-range"), Some("bytes 4095-8192/100000"));
    assert_eq!(resp.body, pattern_range(4095, 4098));
    let resp = read_response(&mut r, true).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-length"), Some("12"));
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 200);
    assert!(
        resp.body == pattern_range(0, MEDIUM_LEN as usize),
        "medium body differs"
    );
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 206);
    assert!(resp
        .header("content-type")
        .unwrap()
        .starts_with("multipart/byteranges"));
    let body = String::from_utf8_lossy(&resp.body);
    assert!(body.contains(&format!("bytes 1000-2000/{MEDIUM_LEN}")));
    assert!(body.contains(&format!("bytes 600000-700000/{MEDIUM_LEN}")));
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(
        (resp.status, resp.body.as_slice()),
        (200, &b"bravo bravo\n"[..])
    );
    let resp = read_response(&mut r, true).unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-length"),
        Some(MEDIUM_LEN.to_string().as_str())
    );
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"alpha\n"[..]));
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn a_burst_of_1000_pipelined_gets_is_answered_in_order() {
    let server = start();
    const N: usize = 1000;
    let mut batch = Vec::new();
    for i in 0..N {
        // Neighbours always differ (i % 50, and every 7th a HEAD-free Range of the file).
        let f = (i * 17) % FILES;
        if i % 7 == 3 {
            batch.extend_from_slice(
                format!("GET /f{f}.txt HTTP/1.1\r\nHost: test\r\nRange: bytes=5-9\r\n\r\n")
                    .as_bytes(),
            );
        } else {
            batch.extend_from_slice(get_req(&format!("/f{f}.txt")).as_bytes());
        }
    }
    let (s, mut r) = connect_pair(&server);
    // Write from another thread so neither side can block the other on full buffers.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&batch));
    for i in 0..N {
        let f = (i * 17) % FILES;
        let resp = read_response(&mut r, false)
            .unwrap_or_else(|e| panic!("response {i} of {N} missing: {e}"));
        let body = file_body(f);
        if i % 7 == 3 {
            assert_eq!(resp.status, 206, "response {i}");
            assert_eq!(resp.body, &body[5..10], "response {i}");
        } else {
            assert_eq!(resp.status, 200, "response {i}");
            assert_eq!(resp.body, body, "response {i} is out of order or wrong");
        }
    }
    writer.join().unwrap().unwrap();
    drop(s);
}

#[test]
fn requests_split_into_single_bytes_still_work() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    s.set_nodelay(true).unwrap();
    for (path, body) in [("/a.txt", &b"alpha\n"[..]), ("/b.txt", b"bravo bravo\n")] {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: test\r\nUser-Agent: slow-typist\r\nRange: bytes=0-\r\n\r\n"
        );
        for b in req.as_bytes() {
            s.write_all(std::slice::from_ref(b)).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let resp = read_response(&mut r, false).unwrap();
        assert_eq!(resp.status, 206, "{path}");
        assert_eq!(resp.body, body, "{path}");
    }
}

#[test]
fn a_pipelined_request_split_across_writes() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    s.set_nodelay(true).unwrap();
    s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: test\r\n\r\nGET /b.t")
        .unwrap();
    let first = read_response(&mut r, false).unwrap();
    assert_eq!(first.body, b"alpha\n");
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"xt HTTP/1.1\r\nHo").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"st: test\r\n\r").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(b"\n").unwrap();
    let second = read_response(&mut r, false).unwrap();
    assert_eq!(second.status, 200);
    assert_eq!(second.body, b"bravo bravo\n");
}

#[test]
fn pipelined_requests_after_a_half_close_are_all_answered() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let mut batch = String::new();
    for i in 0..5 {
        batch += &get_req(&format!("/f{i}.txt"));
    }
    batch += &get_req("/medium.bin");
    batch += &get_req("/a.txt");
    s.write_all(batch.as_bytes()).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    for i in 0..5 {
        let resp = read_response(&mut r, false)
            .unwrap_or_else(|e| panic!("response {i} after half-close: {e}"));
        assert_eq!(resp.body, file_body(i));
    }
    let resp = read_response(&mut r, false).expect("medium after half-close");
    assert!(resp.body == pattern_range(0, MEDIUM_LEN as usize));
    let resp = read_response(&mut r, false).expect("last response after half-close");
    assert_eq!(resp.body, b"alpha\n");
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn a_bad_request_in_a_pipeline_ends_it_after_the_good_ones() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let batch = format!(
        "{}{}GET /a.txt HTTP/1.1\r\n\r\n{}",
        get_req("/a.txt"),
        get_req("/b.txt"),
        get_req("/f1.txt")
    );
    s.write_all(batch.as_bytes()).unwrap();
    assert_eq!(read_response(&mut r, false).unwrap().body, b"alpha\n");
    assert_eq!(read_response(&mut r, false).unwrap().body, b"bravo bravo\n");
    let bad = read_response(&mut r, false).unwrap();
    assert_eq!(bad.status, 400);
    let rest = expect_closed(&mut r);
    assert!(
        rest.is_empty(),
        "answered past a 400: {:?}",
        String::from_utf8_lossy(&rest)
    );
}

#[test]
fn keep_alive_survives_idle_gaps_and_many_requests() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    for i in 0..200 {
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let f = i % FILES;
        let resp = exchange(&mut s, &mut r, &get_req(&format!("/f{f}.txt"))).unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, file_body(f));
        assert_eq!(resp.header("connection"), Some("keep-alive"));
    }
    // A large body on the same connection, then small ones again.
    let resp = exchange(&mut s, &mut r, &get_req("/medium.bin")).unwrap();
    assert!(resp.body == pattern_range(0, MEDIUM_LEN as usize));
    let resp = exchange(&mut s, &mut r, &get_req("/a.txt")).unwrap();
    assert_eq!(resp.body, b"alpha\n");
}

#[test]
fn pipelined_http10_keep_alive() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let ka = "GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    let batch = format!("{ka}{ka}GET /b.txt HTTP/1.0\r\n\r\n{ka}");
    s.write_all(batch.as_bytes()).unwrap();
    assert_eq!(read_response(&mut r, false).unwrap().body, b"alpha\n");
    assert_eq!(read_response(&mut r, false).unwrap().body, b"alpha\n");
    let last = read_response(&mut r, false).unwrap();
    assert_eq!(last.body, b"bravo bravo\n");
    // HTTP/1.0 without keep-alive ends the connection; the 4th request is not answered.
    assert!(expect_closed(&mut r).is_empty());
    drop(s);
}

#[test]
fn concurrent_downloads_share_a_small_arena_and_small_requests_still_pass() {
    // 16 chunks of 512 KiB (4 kept for small responses): eight concurrent large downloads
    // must queue for buffers, finish byte-exact, and never block small requests.
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    write_pattern_file(&root.join("medium.bin"), MEDIUM_LEN);
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(&cfg, "arena_bytes = 8388608\n").unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    let addr = server.addr;
    let downloads: Vec<_> = (0..8u64)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let start = i * 4099;
                s.write_all(
                    format!(
                        "GET /medium.bin HTTP/1.1\r\nHost: t\r\nRange: bytes={start}-\r\nConnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .unwrap();
                let mut r = std::io::BufReader::new(s);
                let resp = read_response(&mut r, false).unwrap();
                assert_eq!(resp.status, 206);
                assert!(
                    resp.body == pattern_range(start, (MEDIUM_LEN - start) as usize),
                    "download {i} differs"
                );
            })
        })
        .collect();
    for _ in 0..20 {
        let r = get(&server, "/a.txt", &[]);
        assert_eq!(r.body, b"alpha\n");
    }
    for d in downloads {
        d.join().expect("download thread");
    }
}

#[test]
fn many_connections_with_few_receive_buffers() {
    // 16 provided receive buffers for 200 connections that all send at once: receives that
    // find no buffer (ENOBUFS) are retried, no request is lost.
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..FILES {
        std::fs::write(root.join(format!("f{i}.txt")), file_body(i)).unwrap();
    }
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(&cfg, "recv_buffers = 16\n").unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    let mut conns: Vec<_> = (0..200).map(|_| connect_pair(&server)).collect();
    for round in 0..3 {
        for (i, (s, _)) in conns.iter_mut().enumerate() {
            let mut reqs = String::new();
            for k in 0..3 {
                reqs += &get_req(&format!("/f{}.txt", (i + k + round) % FILES));
            }
            s.write_all(reqs.as_bytes()).unwrap();
        }
        for (i, (_, r)) in conns.iter_mut().enumerate() {
            for k in 0..3 {
                let resp = read_response(r, false)
                    .unwrap_or_else(|e| panic!("round {round} conn {i} response {k}: {e}"));
                assert_eq!(resp.body, file_body((i + k + round) % FILES));
            }
        }
    }
}
