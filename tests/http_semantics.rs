//! HTTP/1.1 semantics of the real binary: GET/HEAD headers, error statuses, connection
//! management, index files.

mod common;
use common::*;

use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// 2021-01-01T00:00:00Z, as the files' mtime.
const MTIME_SECS: u64 = 1_609_459_200;
const MTIME_HTTP: &str = "Fri, 01 Jan 2021 00:00:00 GMT";

const A_TXT: &[u8] = b"hello, shardline\n";
const ROOT_INDEX: &[u8] = b"<html>root index</html>\n";
const DIR_INDEX: &[u8] = b"<html>dir index</html>\n";

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, data).unwrap();
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(MTIME_SECS))
        .unwrap();
}

/// A root with text, typed files, index files and an empty directory.
fn start() -> Server {
    start_inner(false)
}

/// `start` plus a 12 MiB file (read with O_DIRECT), with the admin listener to check that.
fn start_with_large() -> (Server, SocketAddr) {
    let (dir, root) = fill_root(true);
    start_with_admin_owning(dir, &root, &[])
}

fn start_inner(large: bool) -> Server {
    let (dir, root) = fill_root(large);
    Server::start_owning(dir, &root, &[])
}

/// A temp dir holding the test root (see `start`), with `large.bin` when `large`.
fn fill_root(large: bool) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    write(&root, "a.txt", A_TXT);
    write(&root, "b.txt", b"another file\n");
    write(&root, "index.html", ROOT_INDEX);
    write(&root, "dir/index.html", DIR_INDEX);
    write(&root, "dir/inner.txt", b"inner\n");
    std::fs::create_dir_all(root.join("emptydir")).unwrap();
    for (name, data) in [
        ("page.html", &b"<p>x</p>"[..]),
        ("style.css", b"p{}"),
        ("app.js", b"1"),
        ("data.json", b"{}"),
        ("pic.png", b"\x89PNG"),
        ("pack.bin", b"\0\x01"),
        ("noext", b"plain"),
        ("patch.tar.gz", b"\x1f\x8b"),
    ] {
        write(&root, name, data);
    }
    if large {
        write_pattern_file(&root.join("large.bin"), 12 << 20);
    }
    (dir, root)
}

fn is_imf_fixdate(v: &str) -> bool {
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let b = v.as_bytes();
    v.len() == 29
        && ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].contains(&&v[..3])
        && &v[3..5] == ", "
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b' '
        && [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ]
        .contains(&&v[8..11])
        && b[11] == b' '
        && b[12..16].iter().all(u8::is_ascii_digit)
        && b[16] == b' '
        && b[17..19].iter().all(u8::is_ascii_digit)
        && b[19] == b':'
        && b[20..22].iter().all(u8::is_ascii_digit)
        && b[22] == b':'
        && b[23..25].iter().all(u8::is_ascii_digit)
        && &v[25..] == " GMT"
}

fn req(method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n")
}

/// Headers that must be identical between a GET and a HEAD of the same resource.
const SAME_HEADERS: &[&str] = &[
    "content-length",
    "content-type",
    "last-modified",
    "etag",
    "accept-ranges",
    "server",
    "connection",
];

#[test]
fn get_sends_every_required_header() {
    let server = start();
    let r = get(&server, "/a.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, A_TXT);
    assert_eq!(
        r.header("content-length"),
        Some(A_TXT.len().to_string().as_str())
    );
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; charset=utf-8"),
        "{r:?}"
    );
    assert_eq!(r.header("last-modified"), Some(MTIME_HTTP), "{r:?}");
    let etag = r.header("etag").expect("ETag");
    assert!(
        etag.len() > 2 && etag.starts_with('"') && etag.ends_with('"'),
        "ETag must be a strong quoted tag: {etag:?}"
    );
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    let date = r.header("date").expect("Date");
    assert!(is_imf_fixdate(date), "Date is not an IMF-fixdate: {date:?}");
    assert!(
        r.header("server").is_some_and(|s| s.contains("shardline")),
        "{r:?}"
    );
}

#[test]
fn etag_is_strong_stable_and_distinct() {
    let server = start();
    let first = get(&server, "/a.txt", &[]);
    let e1 = first.header("etag").unwrap().to_string();
    assert!(!e1.starts_with("W/"), "weak ETag {e1}");
    // Same connection, other connections: same tag.
    let (mut s, mut r) = connect_pair(&server);
    for _ in 0..3 {
        let resp = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
        assert_eq!(resp.header("etag"), Some(e1.as_str()));
        let head = exchange(&mut s, &mut r, &req("HEAD", "/a.txt")).unwrap();
        assert_eq!(head.header("etag"), Some(e1.as_str()));
    }
    assert_eq!(
        get(&server, "/a.txt", &[]).header("etag"),
        Some(e1.as_str())
    );
    let other = get(&server, "/b.txt", &[]);
    assert_ne!(
        other.header("etag"),
        Some(e1.as_str()),
        "two files, one ETag"
    );
}

#[test]
fn head_has_get_headers_and_no_body() {
    let (server, admin) = start_with_large();
    for path in ["/a.txt", "/large.bin", "/", "/dir/"] {
        let (mut s, mut r) = connect_pair(&server);
        let head = exchange(&mut s, &mut r, &req("HEAD", path)).unwrap();
        // If HEAD had sent a body, the next response would not parse (or its body would be
        // wrong): read a GET of a different small file on the same connection.
        let after = exchange(&mut s, &mut r, &req("GET", "/b.txt")).unwrap();
        assert_eq!(after.status, 200, "after HEAD {path}: {after:?}");
        assert_eq!(after.body, b"another file\n", "after HEAD {path}");
        let full = exchange(&mut s, &mut r, &req("GET", path)).unwrap();
        assert_eq!(head.status, 200, "HEAD {path}");
        assert_eq!(full.status, 200, "GET {path}");
        for h in SAME_HEADERS {
            assert_eq!(head.header(h), full.header(h), "{h} differs for {path}");
        }
        assert!(head.header("content-length").is_some());
        assert!(head.header("date").is_some());
    }
    let big = get(&server, "/large.bin", &[]);
    assert!(big.body == pattern(12 << 20), "large body differs");
    assert_direct_bytes_sent(admin, 0, "large.bin");
}

#[test]
fn head_of_a_missing_file_has_no_body() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let head = exchange(&mut s, &mut r, &req("HEAD", "/missing.txt")).unwrap();
    assert_eq!(head.status, 404);
    // The 404 kept the connection open (or closed it); either way no body bytes may follow the
    // head. Send the next request and read what comes back.
    if head.header("connection") == Some("close") {
        let rest = expect_closed(&mut r);
        assert!(rest.is_empty(), "HEAD 404 sent a body: {rest:?}");
        return;
    }
    let after = exchange(&mut s, &mut r, &req("GET", "/a.txt"));
    let after = after.expect("response after HEAD 404");
    assert_eq!(
        after.status, 200,
        "HEAD 404 sent body bytes that corrupted the next response: {after:?}"
    );
    assert_eq!(after.body, A_TXT);
}

#[test]
fn content_type_by_extension() {
    let server = start();
    for (path, want) in [
        ("/page.html", "text/html"),
        ("/style.css", "text/css"),
        ("/app.js", "javascript"),
        ("/data.json", "application/json"),
        ("/pic.png", "image/png"),
        ("/pack.bin", "application/octet-stream"),
        ("/noext", "application/octet-stream"),
        ("/patch.tar.gz", "application/gzip"),
        ("/", "text/html"),
        ("/dir/", "text/html"),
    ] {
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        let ct = r.header("content-type").unwrap_or("");
        assert!(ct.starts_with(want) || ct.contains(want), "{path}: {ct:?}");
    }
}

#[test]
fn missing_file_is_404() {
    let server = start();
    for path in [
        "/missing",
        "/missing.txt",
        "/dir/missing",
        "/a.txt/x",
        "/nodir/",
    ] {
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 404, "{path}: {r:?}");
    }
}

#[test]
fn known_methods_get_405_with_allow() {
    let server = start();
    for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
        let r = raw_request(
            &server,
            format!("{method} /a.txt HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method}: {r:?}");
    }
}

#[test]
fn unknown_method_is_501() {
    let server = start();
    for method in ["FOO", "BREW", "get"] {
        let r = raw_request(
            &server,
            format!("{method} /a.txt HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 501, "{method}: {r:?}");
    }
}

#[test]
fn http2_is_505() {
    let server = start();
    let r = raw_request(&server, b"GET /a.txt HTTP/2.0\r\nHost: test\r\n\r\n").unwrap();
    assert_eq!(r.status, 505, "{r:?}");
    let r = raw_request(&server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    assert_eq!(r.status, 505, "{r:?}");
    let r = raw_request(&server, b"GET /a.txt HTTP/3.1\r\nHost: test\r\n\r\n").unwrap();
    assert_eq!(r.status, 505, "{r:?}");
}

/// Sends `request`, expects `status`, then expects the server to close the connection.
fn rejected_and_closed(server: &Server, request: &[u8], status: u16) {
    let mut s = server.connect();
    s.write_all(request).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r, false)
        .unwrap_or_else(|e| panic!("no response to {:?}: {e}", String::from_utf8_lossy(request)));
    assert_eq!(
        resp.status,
        status,
        "{:?}: {resp:?}",
        String::from_utf8_lossy(request)
    );
    let rest = expect_closed(&mut r);
    assert!(
        rest.is_empty(),
        "bytes after a {status}: {:?}",
        String::from_utf8_lossy(&rest)
    );
}

#[test]
fn request_bodies_and_bad_framing_are_400_and_close() {
    let server = start();
    for request in [
        &b"GET /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"GET /a.txt HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 5, 0\r\n\r\nhello",
        b"HEAD /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /a.txt HTTP/1.1\r\n\r\n",
        b"GET /a.txt HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ] {
        rejected_and_closed(&server, request, 400);
    }
    // Still serving.
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
}

#[test]
fn bad_request_closes_even_after_a_good_one() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let ok = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
    assert_eq!(ok.status, 200);
    let bad = exchange(&mut s, &mut r, "GET /a.txt HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("connection"), Some("close"));
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn long_request_line_is_414() {
    let server = start();
    let long = "a".repeat(20 * 1024);
    let request = format!("GET /{long} HTTP/1.1\r\nHost: test\r\n\r\n");
    rejected_and_closed(&server, request.as_bytes(), 414);
}

#[test]
fn huge_header_section_is_431() {
    let server = start();
    let big = "x".repeat(32 * 1024);
    let request = format!("GET /a.txt HTTP/1.1\r\nHost: test\r\nX-Big: {big}\r\n\r\n");
    rejected_and_closed(&server, request.as_bytes(), 431);
}

#[test]
fn too_many_header_fields_is_431() {
    let server = start();
    let mut request = String::from("GET /a.txt HTTP/1.1\r\nHost: test\r\n");
    for i in 0..200 {
        request.push_str(&format!("X-H{i}: v\r\n"));
    }
    request.push_str("\r\n");
    rejected_and_closed(&server, request.as_bytes(), 431);
}

#[test]
fn directories_serve_index_html_or_404() {
    let server = start();
    let r = get(&server, "/", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, ROOT_INDEX);
    let r = get(&server, "/dir/", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, DIR_INDEX);
    let r = get(&server, "/emptydir/", &[]);
    assert_eq!(r.status, 404, "no listings: {r:?}");
    assert!(
        !String::from_utf8_lossy(&r.body).contains("inner"),
        "listing leaked"
    );
    let r = get(&server, "/emptydir", &[]);
    assert!(
        r.status == 404 || (300..400).contains(&r.status),
        "directory without index: {r:?}"
    );
    // A file addressed as a directory is not found.
    let r = get(&server, "/a.txt/", &[]);
    assert_eq!(r.status, 404, "{r:?}");
}

#[test]
fn directory_without_trailing_slash() {
    let server = start();
    let r = get(&server, "/dir", &[]);
    match r.status {
        200 => assert_eq!(r.body, DIR_INDEX),
        301 | 302 | 307 | 308 => {
            let loc = r.header("location").expect("redirect without Location");
            assert!(loc.ends_with("/dir/"), "{loc}");
        }
        other => panic!("GET /dir: unexpected {other}: {r:?}"),
    }
}

#[test]
fn http10_closes_after_the_response_by_default() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let resp = exchange(&mut s, &mut r, "GET /a.txt HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, A_TXT);
    assert_ne!(resp.header("connection"), Some("keep-alive"));
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn http10_keep_alive_keeps_the_connection() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let request = "GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    let first = exchange(&mut s, &mut r, request).unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("connection").map(str::to_ascii_lowercase),
        Some("keep-alive".to_string())
    );
    let second = exchange(&mut s, &mut r, request).unwrap();
    assert_eq!(second.status, 200);
    assert_eq!(second.body, A_TXT);
    let last = exchange(&mut s, &mut r, "GET /b.txt HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(last.body, b"another file\n");
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn http11_keeps_alive_until_connection_close() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    for _ in 0..5 {
        let resp = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, A_TXT);
    }
    let resp = exchange(
        &mut s,
        &mut r,
        "GET /b.txt HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(resp.body, b"another file\n");
    assert!(expect_closed(&mut r).is_empty());
}

#[test]
fn not_found_keeps_the_connection_usable() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let miss = exchange(&mut s, &mut r, &req("GET", "/missing")).unwrap();
    assert_eq!(miss.status, 404);
    if miss.header("connection") == Some("close") {
        assert!(expect_closed(&mut r).is_empty());
        return;
    }
    let ok = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body, A_TXT);
}

#[test]
fn request_target_forms_and_encodings() {
    let server = start();
    let dir = server.root.clone();
    std::fs::write(dir.join("caf\u{e9} menu.txt"), b"encoded name\n").unwrap();
    std::fs::write(dir.join("empty.txt"), b"").unwrap();
    for (target, body) in [
        ("/a.txt?version=3&x=%2F..", A_TXT),
        ("/a.txt#fragment", A_TXT),
        ("http://test/a.txt", A_TXT),
        ("HTTP://test:8080/a.txt?q", A_TXT),
        ("/%61.txt", A_TXT),
        ("//a.txt", A_TXT),
        ("/./a.txt", A_TXT),
        ("/dir/../a.txt", A_TXT),
        ("/caf%C3%A9%20menu.txt", b"encoded name\n"),
        ("/caf%c3%a9%20menu.txt", b"encoded name\n"),
        ("/dir/inner.txt", b"inner\n"),
    ] {
        let r = raw_request(
            &server,
            format!("GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{target}: {r:?}");
        assert_eq!(r.body, body, "{target}");
    }
    // An empty file: 200 with Content-Length 0, and the connection goes on.
    let (mut s, mut r) = connect_pair(&server);
    let e = exchange(&mut s, &mut r, &req("GET", "/empty.txt")).unwrap();
    assert_eq!(e.status, 200);
    assert_eq!(e.header("content-length"), Some("0"));
    let h = exchange(&mut s, &mut r, &req("HEAD", "/empty.txt")).unwrap();
    assert_eq!(h.header("content-length"), Some("0"));
    let next = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
    assert_eq!(next.body, A_TXT);
}

#[test]
fn tolerated_request_shapes() {
    let server = start();
    for request in [
        // A stray CRLF before the request line (RFC 9112 §2.2).
        &b"\r\nGET /a.txt HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"[..],
        // Content-Length: 0 is not a body.
        b"GET /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        // Field names are case-insensitive; optional whitespace around values.
        b"GET /a.txt HTTP/1.1\r\nhOsT:test\r\nconnection:   close  \r\nUSER-AGENT: x\r\n\r\n",
        // HTTP/1.0 needs no Host.
        b"GET /a.txt HTTP/1.0\r\n\r\n",
    ] {
        let r = raw_request(&server, request).unwrap();
        assert_eq!(
            r.status,
            200,
            "{:?}: {r:?}",
            String::from_utf8_lossy(request)
        );
        assert_eq!(r.body, A_TXT);
    }
    // Bare LF line endings are refused (request smuggling shape).
    rejected_and_closed(&server, b"GET /a.txt HTTP/1.1\nHost: test\n\n", 400);
    rejected_and_closed(&server, b"GET /a.txt HTTP/1.1\r\nHost: test\n\r\n", 400);
    // Obsolete line folding.
    rejected_and_closed(
        &server,
        b"GET /a.txt HTTP/1.1\r\nHost: test\r\nX-A: 1\r\n  folded\r\n\r\n",
        400,
    );
}

/// Seconds since the epoch of an IMF-fixdate.
fn parse_imf(v: &str) -> i64 {
    assert!(is_imf_fixdate(v), "{v:?}");
    let day: i64 = v[5..7].parse().unwrap();
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == &v[8..11])
    .unwrap() as i64
        + 1;
    let year: i64 = v[12..16].parse().unwrap();
    let (h, m, s): (i64, i64, i64) = (
        v[17..19].parse().unwrap(),
        v[20..22].parse().unwrap(),
        v[23..25].parse().unwrap(),
    );
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + h * 3600 + m * 60 + s
}

#[test]
fn date_is_current_and_advances() {
    let server = start();
    assert_eq!(parse_imf(MTIME_HTTP), MTIME_SECS as i64);
    let now = || {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let (mut s, mut r) = connect_pair(&server);
    let first = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
    let d1 = parse_imf(first.header("date").unwrap());
    assert!((d1 - now()).abs() <= 2, "Date {d1} vs clock {}", now());
    std::thread::sleep(Duration::from_millis(2100));
    let second = exchange(&mut s, &mut r, &req("GET", "/a.txt")).unwrap();
    let d2 = parse_imf(second.header("date").unwrap());
    assert!(d2 > d1, "cached Date did not advance: {d1} then {d2}");
    assert!((d2 - now()).abs() <= 2, "Date {d2} vs clock {}", now());
}

#[test]
fn etag_survives_a_restart() {
    let dir = disk_tempdir();
    std::fs::write(dir.path().join("a.txt"), A_TXT).unwrap();
    let tags: Vec<String> = (0..2)
        .map(|_| {
            let server = Server::start(dir.path(), &[]);
            let tag = get(&server, "/a.txt", &[])
                .header("etag")
                .unwrap()
                .to_string();
            drop(server);
            tag
        })
        .collect();
    assert_eq!(tags[0], tags[1]);
}

#[test]
fn large_heads_within_the_limits_are_served() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    // A 12 KiB cookie: the head spans several 4 KiB receive buffers but fits the 16 KiB limit.
    let cookie = "c".repeat(12 * 1024);
    let resp = exchange(
        &mut s,
        &mut r,
        &format!("GET /a.txt HTTP/1.1\r\nHost: test\r\nCookie: {cookie}\r\n\r\n"),
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, A_TXT);
    // 60 fields (the limit is 64).
    let mut req = String::from("GET /a.txt HTTP/1.1\r\nHost: test\r\n");
    for i in 0..59 {
        req += &format!("X-F{i}: {i}\r\n");
    }
    req += "\r\n";
    let resp = exchange(&mut s, &mut r, &req).unwrap();
    assert_eq!(resp.status, 200);
    // A long query string (request line under 8 KiB).
    let q = "q".repeat(7 * 1024);
    let resp = exchange(
        &mut s,
        &mut r,
        &format!("GET /a.txt?{q} HTTP/1.1\r\nHost: t\r\n\r\n"),
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, A_TXT);
}

#[test]
fn head_with_ranges_has_no_body() {
    let server = start();
    let (mut s, mut r) = connect_pair(&server);
    let len = A_TXT.len();
    for (range, status) in [
        ("bytes=0-3", 206),
        ("bytes=0-1,5-6", 206),
        (&*format!("bytes={len}-"), 416),
        ("bytes=x", 200),
    ] {
        let head = exchange(
            &mut s,
            &mut r,
            &format!("HEAD /a.txt HTTP/1.1\r\nHost: test\r\nRange: {range}\r\n\r\n"),
        )
        .unwrap();
        assert_eq!(head.status, status, "HEAD Range: {range}");
        let get = exchange(
            &mut s,
            &mut r,
            &format!("GET /a.txt HTTP/1.1\r\nHost: test\r\nRange: {range}\r\n\r\n"),
        )
        .unwrap_or_else(|e| panic!("GET after HEAD Range: {range}: {e}"));
        assert_eq!(get.status, status, "GET after HEAD Range: {range}");
        assert_eq!(
            head.header("content-length"),
            get.header("content-length"),
            "{range}"
        );
        if status != 206 || !range.contains(',') {
            assert_eq!(head.header("content-type"), get.header("content-type"));
        }
    }
}

#[test]
fn oversized_heads_get_their_error_even_when_much_more_was_sent() {
    // The server refuses after 16 KiB but the client already sent far more; closing with
    // unread bytes makes the kernel send RST, which can destroy the error response before the
    // client reads it unless the server drains (lingering close) first.
    let server = start();
    for round in 0..10 {
        for (size, status) in [(256 * 1024, 431), (64 * 1024, 431)] {
            let big = "x".repeat(size);
            let request = format!("GET /a.txt HTTP/1.1\r\nHost: test\r\nX-Big: {big}\r\n\r\n");
            let s = server.connect();
            let mut w = s.try_clone().unwrap();
            // Write from a thread: the server stops reading, so a large write may block.
            let writer = std::thread::spawn(move || {
                let _ = w.write_all(request.as_bytes());
            });
            let mut r = BufReader::new(s.try_clone().unwrap());
            let resp = read_response(&mut r, false);
            let _ = s.shutdown(std::net::Shutdown::Both);
            writer.join().unwrap();
            let resp = resp.unwrap_or_else(|e| {
                panic!("round {round}, {size}-byte header: the {status} response was lost: {e}")
            });
            assert_eq!(resp.status, status);
        }
    }
    let long = "a".repeat(200 * 1024);
    for round in 0..10 {
        let request = format!("GET /{long} HTTP/1.1\r\nHost: test\r\n\r\n");
        let s = server.connect();
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(request.as_bytes());
        });
        let mut r = BufReader::new(s.try_clone().unwrap());
        let resp = read_response(&mut r, false);
        let _ = s.shutdown(std::net::Shutdown::Both);
        writer.join().unwrap();
        let resp = resp.unwrap_or_else(|e| panic!("round {round}: the 414 response was lost: {e}"));
        assert_eq!(resp.status, 414);
    }
}
