//! RFC 9110 / 9112 conformance points of issue 12, with the raw requests the issue reports,
//! against the real binary over loopback, comparing bytes.

mod common;
use common::*;

use std::time::{Duration, SystemTime};

/// The file: 5 MiB.
const FIVE_MIB: u64 = 5 << 20;
/// Fixed mtime of every served file: 2021-01-01T00:00:00Z.
const MTIME_SECS: u64 = 1_609_459_200;
const MTIME_HTTP: &str = "Fri, 01 Jan 2021 00:00:00 GMT";
const BEFORE_MTIME_HTTP: &str = "Thu, 31 Dec 2020 23:59:59 GMT";

/// A server over a root holding `5m.bin` (pattern content) with a fixed mtime.
fn start() -> Server {
    let dir = root_with_pattern_file("5m.bin", FIVE_MIB);
    let root = dir.path().to_path_buf();
    std::fs::File::options()
        .write(true)
        .open(root.join("5m.bin"))
        .unwrap()
        .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(MTIME_SECS))
        .unwrap();
    Server::start_owning(dir, &root, &[])
}

fn send(server: &Server, request: &str) -> Response {
    raw_request(server, request.as_bytes())
        .unwrap_or_else(|e| panic!("no response to {request:?}: {e}"))
}

fn etag_of(server: &Server) -> String {
    let r = send(
        server,
        "HEAD /5m.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{r:?}");
    r.header("etag").expect("ETag").to_string()
}

/// GET /5m.bin with these extra header lines (each `Name: value`).
fn get_5m(server: &Server, lines: &[String]) -> Response {
    let mut req = String::from("GET /5m.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for l in lines {
        req.push_str(l);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    send(server, &req)
}

/// A 412 answer: no body, no Content-Range, the current validators as headers.
fn assert_412(r: &Response, etag: &str, what: &str) {
    assert_eq!(r.status, 412, "{what}: {r:?}");
    assert_eq!(r.header("content-length"), Some("0"), "{what}");
    assert!(r.body.is_empty(), "{what}");
    assert_eq!(r.header("content-range"), None, "{what}");
    assert_eq!(r.header("etag"), Some(etag), "{what}");
    assert_eq!(r.header("last-modified"), Some(MTIME_HTTP), "{what}");
}

/// A 206 for bytes first..=last of the 5 MiB file, with those bytes.
fn assert_206(r: &Response, first: u64, last: u64, what: &str) {
    assert_eq!(r.status, 206, "{what}: {:?}", r.headers);
    let want = format!("bytes {first}-{last}/{FIVE_MIB}");
    assert_eq!(r.header("content-range"), Some(want.as_str()), "{what}");
    assert_eq!(
        r.body,
        pattern_range(first, (last - first + 1) as usize),
        "{what}"
    );
}

fn assert_full(r: &Response, what: &str) {
    assert_eq!(r.status, 200, "{what}: {:?}", r.headers);
    assert_eq!(r.body.len() as u64, FIVE_MIB, "{what}");
    assert!(
        r.body == pattern_range(0, FIVE_MIB as usize),
        "{what}: body differs"
    );
}

// ---- item 1: If-Match / If-Unmodified-Since and the order of RFC 9110 §13.2.2 ----------------

#[test]
fn if_match_false_is_412_before_range() {
    let server = start();
    let etag = etag_of(&server);
    // The requests, verbatim.
    let r = send(
        &server,
        "GET /5m.bin HTTP/1.1\r\nHost: t\r\nIf-Match: \"nope\"\r\nRange: bytes=0-9\r\nConnection: close\r\n\r\n",
    );
    assert_412(&r, &etag, "If-Match \"nope\" + Range");
    let r = send(
        &server,
        "GET /5m.bin HTTP/1.1\r\nHost: t\r\nIf-Match: \"nope\"\r\nConnection: close\r\n\r\n",
    );
    assert_412(&r, &etag, "If-Match \"nope\"");
    // Weak tags never match strongly; malformed values never match.
    for im in [
        format!("W/{etag}"),
        etag.trim_matches('"').to_string(),
        format!("{etag} junk"),
        String::new(),
    ] {
        let r = get_5m(&server, &[format!("If-Match: {im}")]);
        assert_412(&r, &etag, &format!("If-Match: {im}"));
    }
    // HEAD is judged like GET.
    let r = send(
        &server,
        "HEAD /5m.bin HTTP/1.1\r\nHost: t\r\nIf-Match: \"nope\"\r\nConnection: close\r\n\r\n",
    );
    assert_412(&r, &etag, "HEAD");
}

#[test]
fn if_match_true_serves_the_range() {
    let server = start();
    let etag = etag_of(&server);
    for im in [
        etag.clone(),
        "*".to_string(),
        format!("\"nope\", {etag}"),
        format!("W/\"nope\",{etag} ,"),
    ] {
        let r = get_5m(
            &server,
            &[format!("If-Match: {im}"), "Range: bytes=0-9".to_string()],
        );
        assert_206(&r, 0, 9, &format!("If-Match: {im}"));
    }
    let r = get_5m(&server, &[format!("If-Match: {etag}")]);
    assert_full(&r, "If-Match without Range");
}

#[test]
fn if_unmodified_since() {
    let server = start();
    let etag = etag_of(&server);
    // The request: the file changed after 2001.
    let r = send(
        &server,
        "GET /5m.bin HTTP/1.1\r\nHost: t\r\nIf-Unmodified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\nRange: bytes=0-9\r\nConnection: close\r\n\r\n",
    );
    assert_412(&r, &etag, "If-Unmodified-Since 2001 + Range");
    let r = get_5m(
        &server,
        &["If-Unmodified-Since: Mon, 01 Jan 2001 00:00:00 GMT".to_string()],
    );
    assert_412(&r, &etag, "If-Unmodified-Since 2001");
    let r = get_5m(
        &server,
        &[format!("If-Unmodified-Since: {BEFORE_MTIME_HTTP}")],
    );
    assert_412(&r, &etag, "one second before the mtime");
    // Not modified since: proceed.
    for ius in [MTIME_HTTP, "Sat, 01 Jan 2050 00:00:00 GMT"] {
        let r = get_5m(
            &server,
            &[
                format!("If-Unmodified-Since: {ius}"),
                "Range: bytes=100-199".to_string(),
            ],
        );
        assert_206(&r, 100, 199, &format!("If-Unmodified-Since: {ius}"));
    }
    // An invalid date is ignored.
    let r = get_5m(
        &server,
        &[
            "If-Unmodified-Since: yesterday".to_string(),
            "Range: bytes=0-0".to_string(),
        ],
    );
    assert_206(&r, 0, 0, "invalid date");
}

#[test]
fn precedence_of_rfc9110_13_2_2() {
    let server = start();
    let etag = etag_of(&server);
    let old = "If-Unmodified-Since: Mon, 01 Jan 2001 00:00:00 GMT".to_string();
    let range = "Range: bytes=10-19".to_string();
    // Step 1 before 2: a true If-Match makes If-Unmodified-Since ignored...
    let r = get_5m(
        &server,
        &[format!("If-Match: {etag}"), old.clone(), range.clone()],
    );
    assert_206(&r, 10, 19, "If-Match true, If-Unmodified-Since false");
    // ...and a false one fails whatever the date says.
    let r = get_5m(
        &server,
        &[
            "If-Match: \"nope\"".to_string(),
            format!("If-Unmodified-Since: {MTIME_HTTP}"),
        ],
    );
    assert_412(&r, &etag, "If-Match false, If-Unmodified-Since true");
    // Steps 1-2 before 3-4: 412 beats 304.
    let r = get_5m(
        &server,
        &[
            "If-Match: \"nope\"".to_string(),
            format!("If-None-Match: {etag}"),
        ],
    );
    assert_412(&r, &etag, "If-Match false, If-None-Match matches");
    let r = get_5m(
        &server,
        &[old.clone(), format!("If-Modified-Since: {MTIME_HTTP}")],
    );
    assert_412(
        &r,
        &etag,
        "If-Unmodified-Since false, If-Modified-Since true",
    );
    // Steps 1-2 pass, then step 3 answers 304 (with the validators, no body).
    let r = get_5m(
        &server,
        &[
            format!("If-Match: {etag}"),
            format!("If-None-Match: {etag}"),
            range.clone(),
        ],
    );
    assert_eq!(r.status, 304, "{r:?}");
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert!(r.body.is_empty());
    // Step 3 before 4: a non-matching If-None-Match makes If-Modified-Since ignored.
    let r = get_5m(
        &server,
        &[
            "If-None-Match: \"other\"".to_string(),
            format!("If-Modified-Since: {MTIME_HTTP}"),
            range.clone(),
        ],
    );
    assert_206(
        &r,
        10,
        19,
        "If-None-Match false, If-Modified-Since would be 304",
    );
    // Step 5 last: a stale If-Range after passing steps 1-4 sends the whole file.
    let r = get_5m(
        &server,
        &[
            format!("If-Match: {etag}"),
            "If-None-Match: \"other\"".to_string(),
            "If-Range: \"stale\"".to_string(),
            range.clone(),
        ],
    );
    assert_full(&r, "If-Range stale");
    let r = get_5m(
        &server,
        &[
            format!("If-Match: {etag}"),
            format!("If-Range: {etag}"),
            range,
        ],
    );
    assert_206(&r, 10, 19, "If-Range current");
}

#[test]
fn a_412_keeps_the_connection_usable() {
    let server = start();
    let etag = etag_of(&server);
    let (mut s, mut r) = connect_pair(&server);
    let first = exchange(
        &mut s,
        &mut r,
        "GET /5m.bin HTTP/1.1\r\nHost: t\r\nIf-Match: \"nope\"\r\nRange: bytes=0-9\r\n\r\n",
    )
    .unwrap();
    assert_412(&first, &etag, "first on the connection");
    assert_eq!(first.header("connection"), Some("keep-alive"));
    let next = exchange(
        &mut s,
        &mut r,
        "GET /5m.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=5242870-\r\n\r\n",
    )
    .unwrap();
    assert_206(&next, 5_242_870, FIVE_MIB - 1, "after the 412");
}

// ---- item 5a: HTTP/1.x with x > 1 is processed as HTTP/1.1 (RFC 9110 §2.5) ------------------

/// Sends `request` on a fresh connection and reads everything until the server closes.
fn raw_exchange(server: &Server, request: &str) -> Vec<u8> {
    use std::io::Write;
    let mut s = server.connect();
    s.write_all(request.as_bytes()).unwrap();
    read_to_eof(&mut s).expect("read to EOF")
}

#[test]
fn http_1_2_is_served_as_http_1_1() {
    let server = start();
    // The request: nginx answers 200, we answered 505.
    let got = raw_exchange(
        &server,
        "GET /5m.bin HTTP/1.2\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert!(
        got.starts_with(b"HTTP/1.1 200 OK\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got[..got.len().min(200)])
    );
    let body_at = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of head")
        + 4;
    assert!(got[body_at..] == pattern_range(0, FIVE_MIB as usize)[..]);
    // Persistent by default as in 1.1, and ranges work.
    let (mut s, mut r) = connect_pair(&server);
    for minor in [2, 9] {
        let req = format!("GET /5m.bin HTTP/1.{minor}\r\nHost: t\r\nRange: bytes=7-16\r\n\r\n");
        let resp = exchange(&mut s, &mut r, &req).unwrap();
        assert_206(&resp, 7, 16, &format!("HTTP/1.{minor}"));
        assert_eq!(resp.header("connection"), Some("keep-alive"));
    }
    // A 1.x request still needs a Host.
    let resp = send(&server, "GET /5m.bin HTTP/1.2\r\n\r\n");
    assert_eq!(resp.status, 400, "{resp:?}");
}

#[test]
fn other_major_versions_are_still_505() {
    let server = start();
    for line in [
        "GET /5m.bin HTTP/2.0",
        "GET /5m.bin HTTP/3.0",
        "GET /5m.bin HTTP/0.9",
    ] {
        let resp = send(&server, &format!("{line}\r\nHost: t\r\n\r\n"));
        assert_eq!(resp.status, 505, "{line}: {resp:?}");
    }
}

// ---- item 3: Host field syntax (RFC 9112 §3.2, RFC 3986 §3.2.2) -------------------------------

/// Sends `request` on a fresh connection; expects `status` and, for a 400, the connection closed.
fn expect_status(server: &Server, request: &str, status: u16) {
    use std::io::Write;
    let (mut s, mut r) = connect_pair(server);
    s.write_all(request.as_bytes()).unwrap();
    let resp =
        read_response(&mut r, false).unwrap_or_else(|e| panic!("no response to {request:?}: {e}"));
    assert_eq!(resp.status, status, "{request:?}: {resp:?}");
    if status == 400 {
        assert_eq!(resp.header("connection"), Some("close"), "{request:?}");
        let rest = expect_closed(&mut r);
        assert!(rest.is_empty(), "{request:?}: more bytes after the 400");
    } else {
        assert_eq!(resp.body.len() as u64, FIVE_MIB, "{request:?}");
    }
}

#[test]
fn invalid_host_is_400() {
    let server = start();
    for host in [
        "a b", "a/b", "a\\b", "a?b", "a#b", "user@a", "a:b", "a:80:81", "a%zz", "a\tb", "[::1",
        "[::1]x", "[zz]", "a]",
    ] {
        expect_status(
            &server,
            &format!("GET /5m.bin HTTP/1.1\r\nHost: {host}\r\n\r\n"),
            400,
        );
    }
    // HTTP/1.0 and absolute-form requests are judged too.
    expect_status(&server, "GET /5m.bin HTTP/1.0\r\nHost: a/b\r\n\r\n", 400);
    expect_status(
        &server,
        "GET http://t/5m.bin HTTP/1.1\r\nHost: a b\r\n\r\n",
        400,
    );
}

#[test]
fn missing_or_repeated_host_is_400() {
    let server = start();
    expect_status(&server, "GET /5m.bin HTTP/1.1\r\n\r\n", 400);
    expect_status(
        &server,
        "GET /5m.bin HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
        400,
    );
    expect_status(
        &server,
        "GET /5m.bin HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
        400,
    );
    expect_status(
        &server,
        "GET /5m.bin HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",
        400,
    );
}

#[test]
fn valid_hosts_are_served() {
    let server = start();
    for host in [
        "t",
        "cdn.example.com",
        "cdn.example.com:8080",
        "127.0.0.1",
        "127.0.0.1:80",
        "[::1]",
        "[::1]:8080",
        "[::ffff:192.0.2.1]",
        "[v1.x]",
        "xn--caf-dma.example",
        "a%41",
        "",
    ] {
        expect_status(
            &server,
            &format!("GET /5m.bin HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
            200,
        );
    }
    // HTTP/1.0 needs no Host.
    expect_status(&server, "GET /5m.bin HTTP/1.0\r\n\r\n", 200);
}

// ---- item 5b: multipart/byteranges parts in the requested order (RFC 9110 §15.3.7.2) ---------

/// The parts of a multipart/byteranges body as (Content-Range value, data), strictly parsed:
/// each part is `CRLF --B CRLF` headers `CRLF CRLF` data, and the body ends `CRLF --B-- CRLF`.
fn multipart_parts(r: &Response) -> Vec<(String, Vec<u8>)> {
    let ct = r.header("content-type").expect("Content-Type");
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("not multipart: {ct:?}"));
    let delim = format!("\r\n--{boundary}");
    let body = &r.body;
    let find = |from: usize, needle: &[u8]| {
        body[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|i| from + i)
    };
    let mut parts = Vec::new();
    let mut at = find(0, delim.as_bytes()).expect("first delimiter");
    loop {
        let after = at + delim.len();
        if body[after..] == *b"--\r\n" {
            return parts;
        }
        assert_eq!(&body[after..after + 2], b"\r\n", "delimiter line");
        let head_end = find(after + 2, b"\r\n\r\n").expect("end of part headers");
        let head = std::str::from_utf8(&body[after + 2..head_end]).expect("part headers");
        let range = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .expect("part Content-Range")
            .to_string();
        let next = find(head_end + 4, delim.as_bytes()).expect("next delimiter");
        parts.push((range, body[head_end + 4..next].to_vec()));
        at = next;
    }
}

/// A 206 multipart whose parts are exactly `want` (inclusive ranges), in this order.
fn assert_parts(r: &Response, want: &[(u64, u64)], what: &str) {
    assert_eq!(r.status, 206, "{what}: {:?}", r.headers);
    assert_eq!(r.header("content-range"), None, "{what}");
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    let parts = multipart_parts(r);
    let got: Vec<&str> = parts.iter().map(|(range, _)| range.as_str()).collect();
    let expected: Vec<String> = want
        .iter()
        .map(|(a, b)| format!("bytes {a}-{b}/{FIVE_MIB}"))
        .collect();
    assert_eq!(got, expected, "{what}: part order");
    for ((a, b), (range, data)) in want.iter().zip(&parts) {
        assert!(
            *data == pattern_range(*a, (b - a + 1) as usize),
            "{what}: bytes of part {range}"
        );
    }
}

#[test]
fn multipart_parts_come_in_the_requested_order() {
    let server = start();
    let cases: &[(&str, &[(u64, u64)])] = &[
        (
            "bytes=5000000-5000009,0-9,1048570-1048580",
            &[(5_000_000, 5_000_009), (0, 9), (1_048_570, 1_048_580)],
        ),
        ("bytes=-10,0-9", &[(FIVE_MIB - 10, FIVE_MIB - 1), (0, 9)]),
        // After coalescing: a merged range stands where its earliest member stood.
        (
            "bytes=200-209,10-19,0-9,100-109",
            &[(200, 209), (0, 19), (100, 109)],
        ),
        (
            "bytes=4096-8191,100-199,150-250,0-0",
            &[(4096, 8191), (100, 250), (0, 0)],
        ),
        // Unsatisfiable specs drop out; the rest keep their order.
        (
            "bytes=3000-3999,99999999-,1000-1999",
            &[(3000, 3999), (1000, 1999)],
        ),
    ];
    for (range, want) in cases {
        let r = get_5m(&server, &[format!("Range: {range}")]);
        assert_parts(&r, want, range);
    }
    // Ranges that all coalesce are one plain 206.
    let r = get_5m(&server, &["Range: bytes=10-19,0-9,5-14".to_string()]);
    assert_206(&r, 0, 19, "all coalesced");
}

// ---- item 7: dates and Content-Types from the maintained crates, end to end ------------------

#[test]
fn pre_1970_mtime_is_served_with_a_clamped_last_modified() {
    // httpdate panics on instants before 1970; a file's mtime can be anything (touch -d 1960).
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    let path = root.join("old.bin");
    std::fs::write(&path, pattern(1000)).unwrap();
    let sixties = SystemTime::UNIX_EPOCH - Duration::from_secs(10 * 365 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(sixties)
        .unwrap();
    let mut server = Server::start_owning(dir, &root, &[]);
    let r = send(
        &server,
        "GET /old.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, pattern(1000));
    let lm = r
        .header("last-modified")
        .expect("Last-Modified")
        .to_string();
    assert_eq!(lm, "Thu, 01 Jan 1970 00:00:00 GMT");
    // Echoing it back works as a validator.
    let r = send(
        &server,
        &format!("GET /old.bin HTTP/1.1\r\nHost: t\r\nIf-Modified-Since: {lm}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(r.status, 304, "{r:?}");
    assert!(server.alive(), "server died:\n{}", server.log());
}

#[test]
fn content_types_over_the_wire() {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    let cases = [
        ("chunk.pak", "application/octet-stream"),
        ("seg001.ts", "video/mp2t"),
        ("index.m3u8", "application/vnd.apple.mpegurl"),
        ("page.html", "text/html; charset=utf-8"),
        ("font.woff2", "font/woff2"),
        ("clip.MKV", "video/x-matroska"),
        ("game.manifest", "application/octet-stream"),
        ("noext", "application/octet-stream"),
    ];
    for (name, _) in cases {
        std::fs::write(root.join(name), b"x").unwrap();
    }
    let server = Server::start_owning(dir, &root, &[]);
    for (name, want) in cases {
        let r = send(
            &server,
            &format!("GET /{name} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200, "{name}: {r:?}");
        assert_eq!(r.header("content-type"), Some(want), "{name}");
        assert_eq!(r.body, b"x");
    }
}

/// A 414 sent while the client is still writing its oversized head: the server shuts its write
/// side and drains what follows (bounded) instead of closing with unread bytes. A plain close
/// would answer the client's further bytes with a TCP reset: its writes fail and, on a real
/// network, the reset can destroy the response before the client reads it. Here the client
/// writes its whole head first (as most clients do), every write succeeds, and then it reads
/// the whole 414 and a clean end of stream.
#[test]
fn error_response_with_unread_bytes_closes_gracefully() {
    use std::io::{BufRead, BufReader, Read, Write};
    const PIECES: usize = 24;
    const PIECE_BYTES: usize = 4096;
    let dir = common::disk_tempdir();
    std::fs::write(dir.path().join("a.txt"), b"hello").unwrap();
    let server = common::Server::start(dir.path(), &[]);
    for _ in 0..3 {
        let mut s = server.connect();
        // A request line far over MAX_REQUEST_LINE_BYTES, sent in pieces after the server
        // has already answered (it rejects at the first byte past the limit).
        s.write_all(b"GET /").unwrap();
        let piece = vec![b'a'; PIECE_BYTES];
        for i in 0..PIECES {
            if let Err(e) = s.write_all(&piece) {
                panic!("write {i} of {PIECES} failed ({e}): the server reset the connection");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        s.write_all(b" HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut r = BufReader::new(s);
        let mut status = String::new();
        r.read_line(&mut status).expect("status line");
        assert!(status.starts_with("HTTP/1.1 414"), "got {status:?}");
        let mut rest = Vec::new();
        let end = r.read_to_end(&mut rest);
        assert!(
            end.is_ok(),
            "the 414 connection ended in {end:?} (a reset), not a clean close"
        );
        let text = String::from_utf8_lossy(&rest);
        assert!(
            text.contains("\r\n\r\n"),
            "response head cut short: {text:?}"
        );
    }
}
