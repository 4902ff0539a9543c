//! Range and conditional requests against the real binary, byte-exact, including a file of
//! several hundred MiB read at unaligned offsets (O_DIRECT with an aligned superset read).

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, SystemTime};

/// The big file: 300 MiB + 12345 bytes, so its length is aligned to nothing.
const BIG_LEN: u64 = (300 << 20) + 12345;
/// A medium file (O_DIRECT too, above the 8 MiB default threshold).
const MEDIUM_LEN: u64 = (20 << 20) + 777;
/// The small file.
const SMALL_LEN: usize = 10_000;

const MTIME_SECS: u64 = 1_609_459_200;
const MTIME_HTTP: &str = "Fri, 01 Jan 2021 00:00:00 GMT";
const OLDER_HTTP: &str = "Thu, 31 Dec 2020 23:59:59 GMT";
const NEWER_HTTP: &str = "Fri, 01 Jan 2021 00:00:01 GMT";

fn start_big() -> Server {
    let (dir, _) = cached_pattern_file("big.bin", BIG_LEN);
    Server::start(&dir, &[])
}

/// small.bin (pattern, SMALL_LEN), medium.bin (pattern, MEDIUM_LEN), empty.bin; mtime fixed.
fn start_small() -> Server {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("small.bin"), pattern(SMALL_LEN)).unwrap();
    write_pattern_file(&root.join("medium.bin"), MEDIUM_LEN);
    std::fs::write(root.join("empty.bin"), b"").unwrap();
    std::fs::write(root.join("page.html"), b"<p>hello</p>").unwrap();
    for name in ["small.bin", "medium.bin", "empty.bin", "page.html"] {
        std::fs::File::options()
            .write(true)
            .open(root.join(name))
            .unwrap()
            .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(MTIME_SECS))
            .unwrap();
    }
    Server::start_owning(dir, &root, &[])
}

fn range_req(path: &str, range: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\nRange: {range}\r\n\r\n")
}

/// Reads a response head, then streams its body (Content-Length bytes) comparing it with the
/// pattern starting at `offset`, in 1 MiB pieces. Returns the head and the bytes compared.
fn stream_check(reader: &mut impl BufRead, offset: u64, what: &str) -> (Response, u64) {
    let head = read_response(reader, true).expect("response head");
    let len: u64 = head
        .header("content-length")
        .expect("Content-Length")
        .parse()
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        reader
            .read_exact(&mut buf[..n])
            .unwrap_or_else(|e| panic!("{what}: body ended at {done} of {len}: {e}"));
        let want = pattern_range(offset + done, n);
        if buf[..n] != want[..] {
            let i = buf[..n]
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "{what}: byte {} (file offset {}) is {:#04x}, want {:#04x}",
                done + i as u64,
                offset + done + i as u64,
                buf[i],
                want[i]
            );
        }
        done += n as u64;
    }
    (head, done)
}

/// Checks a 206 single-range response for [start, end] (inclusive) of a `total`-byte file.
fn check_single(r: &Response, start: u64, end: u64, total: u64, what: &str) {
    assert_eq!(r.status, 206, "{what}: {:?}", r.headers);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes {start}-{end}/{total}").as_str()),
        "{what}"
    );
    assert_eq!(
        r.header("content-length"),
        Some((end - start + 1).to_string().as_str()),
        "{what}"
    );
}

#[test]
fn big_file_unaligned_ranges_are_byte_exact() {
    let server = start_big();
    let l = BIG_LEN;
    // (Range header, first byte, last byte inclusive)
    let cases: Vec<(String, u64, u64)> = vec![
        ("bytes=0-0".into(), 0, 0),
        ("bytes=1000-1999".into(), 1000, 1999),
        (
            "bytes=1000-".to_string() + &(1000 + 3 * 4096).to_string(),
            1000,
            1000 + 3 * 4096,
        ),
        ("bytes=4095-4096".into(), 4095, 4096),
        ("bytes=4095-12000".into(), 4095, 12000),
        ("bytes=4097-9000".into(), 4097, 9000),
        ("bytes=511-513".into(), 511, 513),
        ("bytes=524287-524288".into(), 524_287, 524_288),
        ("bytes=524287-1572865".into(), 524_287, 1_572_865),
        ("bytes=123456789-128699668".into(), 123_456_789, 128_699_668),
        (format!("bytes={}-{}", l - 1, l - 1), l - 1, l - 1),
        ("bytes=-1".into(), l - 1, l - 1),
        ("bytes=-1000".into(), l - 1000, l - 1),
        ("bytes=-4097".into(), l - 4097, l - 1),
        (
            format!("bytes={}-", l - (3 << 20) - 17),
            l - (3 << 20) - 17,
            l - 1,
        ),
        (format!("bytes={}-{}", l - 100, l + 5000), l - 100, l - 1),
        (format!("bytes={}-{}", l - 5000, u64::MAX), l - 5000, l - 1),
    ];
    let (mut s, mut r) = connect_pair(&server);
    for (range, start, end) in &cases {
        s.write_all(range_req("/big.bin", range).as_bytes())
            .unwrap();
        let (head, n) = stream_check(&mut r, *start, range);
        check_single(&head, *start, *end, l, range);
        assert_eq!(n, end - start + 1, "{range}");
    }
    // The same ranges on fresh connections too (no state carried between requests).
    for (range, start, end) in cases.iter().step_by(3) {
        let mut s = server.connect();
        s.write_all(range_req("/big.bin", range).as_bytes())
            .unwrap();
        let mut r = BufReader::new(s);
        let (head, _) = stream_check(&mut r, *start, range);
        check_single(&head, *start, *end, l, range);
    }
}

#[test]
fn big_file_full_download_is_byte_exact() {
    let server = start_big();
    let mut s = server.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = BufReader::with_capacity(1 << 20, s);
    let (head, n) = stream_check(&mut r, 0, "full download");
    assert_eq!(head.status, 200);
    assert_eq!(n, BIG_LEN);
    assert_eq!(head.header("content-range"), None);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{} bytes after the body", rest.len());
}

#[test]
fn big_file_range_to_u64_max_is_clipped() {
    let server = start_big();
    let r = raw_request(
        &server,
        b"HEAD /big.bin HTTP/1.1\r\nHost: test\r\nRange: bytes=0-18446744073709551615\r\n\r\n",
    )
    .unwrap();
    check_single(&r, 0, BIG_LEN - 1, BIG_LEN, "HEAD bytes=0-u64::MAX");
    // Past u64::MAX: saturates, still clipped.
    let r = raw_request(
        &server,
        b"HEAD /big.bin HTTP/1.1\r\nHost: test\r\nRange: bytes=5-99999999999999999999999\r\n\r\n",
    )
    .unwrap();
    check_single(&r, 5, BIG_LEN - 1, BIG_LEN, "HEAD bytes=5-huge");
}

#[test]
fn range_to_u64_max_gets_the_whole_file() {
    let server = start_small();
    for path in ["/small.bin", "/medium.bin"] {
        let total = if path == "/small.bin" {
            SMALL_LEN as u64
        } else {
            MEDIUM_LEN
        };
        let mut s = server.connect();
        s.write_all(range_req(path, "bytes=0-18446744073709551615").as_bytes())
            .unwrap();
        let mut r = BufReader::new(s);
        let (head, n) = stream_check(&mut r, 0, path);
        check_single(&head, 0, total - 1, total, path);
        assert_eq!(n, total);
    }
}

#[test]
fn unsatisfiable_ranges_are_416() {
    let server = start_small();
    let l = SMALL_LEN as u64;
    for range in [
        format!("bytes={l}-"),
        format!("bytes={l}-{}", l + 10),
        format!("bytes={}-{}", l + 100, l + 200),
        "bytes=-0".to_string(),
        "bytes=18446744073709551615-".to_string(),
        "bytes=99999999999999999999999-".to_string(),
    ] {
        let (mut s, mut r) = connect_pair(&server);
        let resp = exchange(&mut s, &mut r, &range_req("/small.bin", &range)).unwrap();
        assert_eq!(resp.status, 416, "{range}: {resp:?}");
        assert_eq!(
            resp.header("content-range"),
            Some(format!("bytes */{l}").as_str()),
            "{range}"
        );
        // The connection is still in a good state (the 416 body matched its Content-Length).
        let next = exchange(&mut s, &mut r, &range_req("/small.bin", "bytes=0-9")).unwrap();
        assert_eq!(next.status, 206, "after 416 for {range}");
        assert_eq!(next.body, pattern(10));
    }
    // Any range of an empty file is unsatisfiable.
    let resp = get(&server, "/empty.bin", &[("Range", "bytes=0-")]);
    assert_eq!(resp.status, 416, "{resp:?}");
    assert_eq!(resp.header("content-range"), Some("bytes */0"));
}

#[test]
fn small_file_ranges() {
    let server = start_small();
    let full = pattern(SMALL_LEN);
    let l = SMALL_LEN as u64;
    for (range, start, end) in [
        ("bytes=0-9".to_string(), 0u64, 9u64),
        ("bytes=1000-4095".into(), 1000, 4095),
        ("bytes=-1".into(), l - 1, l - 1),
        ("bytes=-20000".into(), 0, l - 1),
        ("bytes=9990-".into(), 9990, l - 1),
        (format!("bytes=9990-{}", l + 50), 9990, l - 1),
        ("BYTES=5-6".into(), 5, 6),
        ("bytes= 5 - 6 ".into(), 5, 6),
    ] {
        let r = get(&server, "/small.bin", &[("Range", &range)]);
        check_single(&r, start, end, l, &range);
        assert_eq!(r.body, &full[start as usize..=end as usize], "{range} body");
    }
}

#[test]
fn malformed_or_foreign_ranges_are_ignored() {
    let server = start_small();
    let full = pattern(SMALL_LEN);
    for range in [
        "bytes=abc",
        "bytes=5-2",
        "bytes=--1",
        "bytes=1-2-3",
        "bytes 0-5",
        "items=0-5",
        "bytes=",
        "bytes=0x10-0x20",
        "bytes=-",
    ] {
        let r = get(&server, "/small.bin", &[("Range", range)]);
        assert_eq!(r.status, 200, "{range}: {:?}", r.headers);
        assert_eq!(r.header("content-range"), None, "{range}");
        assert!(r.body == full, "{range}: body differs");
    }
}

/// One part of a multipart/byteranges body.
#[derive(Debug)]
struct Part {
    content_type: Option<String>,
    content_range: String,
    data: Vec<u8>,
}

/// Parses a multipart/byteranges body strictly: `--B` delimiters, part headers, exactly as
/// many bytes as each Content-Range says, then CRLF and the next delimiter, `--B--` at the end.
fn parse_multipart(body: &[u8], boundary: &str) -> Vec<Part> {
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    // Preamble: anything before the first delimiter (shardline sends a CRLF).
    let first = body
        .windows(delim.len())
        .position(|w| w == delim.as_bytes())
        .expect("no delimiter in multipart body");
    let mut pos = first + delim.len();
    loop {
        let rest = &body[pos..];
        if rest.starts_with(b"--") {
            // Closing delimiter; only CRLF (epilogue) may follow.
            let epilogue = &rest[2..];
            assert!(
                epilogue.is_empty() || epilogue == b"\r\n",
                "junk after closing delimiter: {:?}",
                String::from_utf8_lossy(epilogue)
            );
            break;
        }
        assert!(rest.starts_with(b"\r\n"), "delimiter not followed by CRLF");
        pos += 2;
        let head_end = body[pos..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| pos + i)
            .expect("part head not terminated");
        let head = String::from_utf8(body[pos..head_end].to_vec()).expect("part head utf-8");
        let mut content_type = None;
        let mut content_range = None;
        for line in head.split("\r\n").filter(|l| !l.is_empty()) {
            let (n, v) = line.split_once(':').expect("part header");
            match n.trim().to_ascii_lowercase().as_str() {
                "content-type" => content_type = Some(v.trim().to_string()),
                "content-range" => content_range = Some(v.trim().to_string()),
                other => panic!("unexpected part header {other}"),
            }
        }
        let content_range = content_range.expect("part without Content-Range");
        let (a, b) = parse_content_range(&content_range).0;
        pos = head_end + 4;
        let len = (b - a + 1) as usize;
        let data = body[pos..pos + len].to_vec();
        pos += len;
        assert!(
            body[pos..].starts_with(format!("\r\n{delim}").as_bytes()),
            "part data not followed by CRLF and the delimiter"
        );
        pos += 2 + delim.len();
        parts.push(Part {
            content_type,
            content_range,
            data,
        });
    }
    parts
}

/// `bytes a-b/total` -> ((a, b), total).
fn parse_content_range(v: &str) -> ((u64, u64), u64) {
    let rest = v.strip_prefix("bytes ").expect("bytes unit");
    let (range, total) = rest.split_once('/').expect("total");
    let (a, b) = range.split_once('-').expect("a-b");
    (
        (a.parse().unwrap(), b.parse().unwrap()),
        total.parse().unwrap(),
    )
}

fn boundary_of(r: &Response) -> String {
    let ct = r.header("content-type").expect("Content-Type");
    assert!(
        ct.starts_with("multipart/byteranges"),
        "not multipart: {ct:?}"
    );
    ct.split("boundary=")
        .nth(1)
        .expect("boundary parameter")
        .trim_matches('"')
        .to_string()
}

fn check_multipart(r: &Response, want: &[(u64, u64)], total: u64, part_type: &str) {
    assert_eq!(r.status, 206, "{:?}", r.headers);
    assert_eq!(
        r.header("content-range"),
        None,
        "multipart has no top-level Content-Range"
    );
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    let parts = parse_multipart(&r.body, &boundary_of(r));
    assert_eq!(parts.len(), want.len(), "{parts:?}");
    for (p, &(a, b)) in parts.iter().zip(want) {
        assert_eq!(p.content_range, format!("bytes {a}-{b}/{total}"));
        assert_eq!(p.content_type.as_deref(), Some(part_type));
        assert!(
            p.data == pattern_range(a, (b - a + 1) as usize),
            "part {a}-{b} differs"
        );
    }
}

#[test]
fn multi_range_is_multipart_byteranges() {
    let server = start_small();
    let l = SMALL_LEN as u64;
    let r = get(&server, "/small.bin", &[("Range", "bytes=0-9,20-29")]);
    check_multipart(&r, &[(0, 9), (20, 29)], l, "application/octet-stream");
    let r = get(
        &server,
        "/small.bin",
        &[("Range", "bytes=4095-4097, 100-199 ,-5")],
    );
    // In the order requested (RFC 9110 §15.3.7.2), not sorted by offset.
    check_multipart(
        &r,
        &[(4095, 4097), (100, 199), (l - 5, l - 1)],
        l,
        "application/octet-stream",
    );
    // Through the keep-alive connection: the multipart body length is exact.
    let (mut s, mut rd) = connect_pair(&server);
    let first = exchange(&mut s, &mut rd, &range_req("/small.bin", "bytes=1-2,7-8")).unwrap();
    check_multipart(&first, &[(1, 2), (7, 8)], l, "application/octet-stream");
    let next = exchange(&mut s, &mut rd, &range_req("/small.bin", "bytes=3-4")).unwrap();
    check_single(&next, 3, 4, l, "after multipart");
    assert_eq!(next.body, pattern_range(3, 2));
}

#[test]
fn multi_range_on_a_large_file_is_byte_exact() {
    let server = start_small();
    let l = MEDIUM_LEN;
    let want = [(1000, 1999), (524_287, 1_100_000), (l - 4097, l - 1)];
    let spec = want
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(",");
    let r = get(
        &server,
        "/medium.bin",
        &[("Range", &format!("bytes={spec}"))],
    );
    check_multipart(&r, &want, l, "application/octet-stream");
    let r = get(&server, "/page.html", &[("Range", "bytes=0-1,3-4")]);
    assert_eq!(r.status, 206);
    let parts = parse_multipart(&r.body, &boundary_of(&r));
    assert_eq!(parts.len(), 2);
    assert!(parts[0]
        .content_type
        .as_deref()
        .is_some_and(|t| t.starts_with("text/html")));
    assert_eq!(parts[0].data, b"<p");
    assert_eq!(parts[1].data, b"he");
}

#[test]
fn overlapping_ranges_are_coalesced() {
    let server = start_small();
    let l = SMALL_LEN as u64;
    // Overlapping and adjacent: one range.
    let r = get(&server, "/small.bin", &[("Range", "bytes=0-9,5-14")]);
    check_single(&r, 0, 14, l, "0-9,5-14");
    assert_eq!(r.body, pattern(15));
    let r = get(&server, "/small.bin", &[("Range", "bytes=10-19,0-9")]);
    check_single(&r, 0, 19, l, "10-19,0-9 (adjacent)");
    assert_eq!(r.body, pattern(20));
    // Two of three merge.
    let r = get(
        &server,
        "/small.bin",
        &[("Range", "bytes=100-109,0-9,5-14")],
    );
    // The merged range stands where its earliest member (0-9) stood: after 100-109.
    check_multipart(&r, &[(100, 109), (0, 14)], l, "application/octet-stream");
}

#[test]
fn if_none_match() {
    let server = start_small();
    let etag = get(&server, "/small.bin", &[])
        .header("etag")
        .unwrap()
        .to_string();
    let (mut s, mut r) = connect_pair(&server);
    for inm in [
        etag.clone(),
        format!("W/{etag}"),
        format!("\"nope\", {etag}"),
        "*".to_string(),
    ] {
        let req = format!("GET /small.bin HTTP/1.1\r\nHost: t\r\nIf-None-Match: {inm}\r\n\r\n");
        let resp = exchange(&mut s, &mut r, &req).unwrap();
        assert_eq!(resp.status, 304, "If-None-Match: {inm}");
        assert_eq!(resp.header("etag"), Some(etag.as_str()));
        assert!(resp.body.is_empty());
        // 304 carries no body: the next response on the connection parses.
        let next = exchange(&mut s, &mut r, &range_req("/small.bin", "bytes=0-3")).unwrap();
        assert_eq!(next.status, 206, "after 304");
        assert_eq!(next.body, pattern(4));
    }
    for inm in ["\"other\"", "W/\"other\"", "garbage"] {
        let resp = get(&server, "/small.bin", &[("If-None-Match", inm)]);
        assert_eq!(resp.status, 200, "If-None-Match: {inm}");
        assert_eq!(resp.body, pattern(SMALL_LEN));
    }
    // A matching If-None-Match wins over a Range.
    let resp = get(
        &server,
        "/small.bin",
        &[("If-None-Match", &etag), ("Range", "bytes=0-9")],
    );
    assert_eq!(resp.status, 304);
    // And HEAD.
    let resp = raw_request(
        &server,
        format!("HEAD /small.bin HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(resp.status, 304);
}

#[test]
fn if_modified_since() {
    let server = start_small();
    let lm = get(&server, "/small.bin", &[])
        .header("last-modified")
        .unwrap()
        .to_string();
    assert_eq!(lm, MTIME_HTTP);
    for (ims, status) in [
        (MTIME_HTTP, 304),
        (NEWER_HTTP, 304),
        (OLDER_HTTP, 200),
        ("Sunday, 06-Nov-94 08:49:37 GMT", 200),
        ("not a date", 200),
    ] {
        let resp = get(&server, "/small.bin", &[("If-Modified-Since", ims)]);
        assert_eq!(resp.status, status, "If-Modified-Since: {ims}");
        if status == 200 {
            assert_eq!(resp.body, pattern(SMALL_LEN));
        }
    }
    // If-None-Match takes precedence over If-Modified-Since.
    let resp = get(
        &server,
        "/small.bin",
        &[
            ("If-None-Match", "\"other\""),
            ("If-Modified-Since", MTIME_HTTP),
        ],
    );
    assert_eq!(resp.status, 200);
}

#[test]
fn if_range() {
    let server = start_small();
    let etag = get(&server, "/small.bin", &[])
        .header("etag")
        .unwrap()
        .to_string();
    let l = SMALL_LEN as u64;
    let r = get(
        &server,
        "/small.bin",
        &[("If-Range", &etag), ("Range", "bytes=100-199")],
    );
    check_single(&r, 100, 199, l, "If-Range current ETag");
    assert_eq!(r.body, pattern_range(100, 100));
    for stale in [
        "\"stale\"",
        &format!("W/{etag}"),
        OLDER_HTTP,
        NEWER_HTTP,
        "junk",
    ] {
        let r = get(
            &server,
            "/small.bin",
            &[("If-Range", stale), ("Range", "bytes=100-199")],
        );
        assert_eq!(r.status, 200, "If-Range: {stale}");
        assert_eq!(r.header("content-range"), None);
        assert!(r.body == pattern(SMALL_LEN), "If-Range {stale}: body");
    }
    let r = get(
        &server,
        "/small.bin",
        &[("If-Range", MTIME_HTTP), ("Range", "bytes=-10")],
    );
    check_single(&r, l - 10, l - 1, l, "If-Range Last-Modified");
    assert_eq!(r.body, pattern_range(l - 10, 10));
}

#[test]
fn etag_changes_when_the_file_changes() {
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    let path = root.join("f.bin");
    std::fs::write(&path, pattern(1000)).unwrap();
    let server = Server::start_owning(dir, &root, &[]);
    let before = get(&server, "/f.bin", &[]);
    let etag = before.header("etag").unwrap().to_string();
    // Replace it (new inode, new size), wait past the open-file revalidation interval.
    let tmp = root.join("f.tmp");
    std::fs::write(&tmp, pattern(2000)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(&server, "/f.bin", &[("If-None-Match", &etag)]);
        if r.status == 200 {
            assert_eq!(r.body, pattern(2000));
            assert_ne!(r.header("etag"), Some(etag.as_str()));
            break;
        }
        assert_eq!(r.status, 304);
        assert!(
            std::time::Instant::now() < deadline,
            "replaced file still served with the old ETag"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // If-Range with the old tag now gets the whole new file.
    let r = get(
        &server,
        "/f.bin",
        &[("If-Range", &etag), ("Range", "bytes=0-9")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, pattern(2000));
}

#[test]
fn test_pattern_helper_is_consistent() {
    // The fast period-based generator the checks above rely on agrees with the definition.
    assert_eq!(pattern_range(0, 100_000), pattern(100_000));
    for start in [
        0u64,
        4092,
        PATTERN_PERIOD - 3,
        PATTERN_PERIOD,
        BIG_LEN - 5000,
        123_456_789,
    ] {
        let got = pattern_range(start, 5000);
        let want: Vec<u8> = (start..start + 5000).map(pattern_byte).collect();
        assert_eq!(got, want, "offset {start}");
    }
}

#[test]
fn too_many_ranges_get_the_whole_file() {
    let server = start_small();
    let specs = |n: u64| {
        (0..n)
            .map(|i| format!("{}-{}", i * 100, i * 100 + 9))
            .collect::<Vec<_>>()
            .join(",")
    };
    // At the default cap (16): multipart.
    let r = get(
        &server,
        "/small.bin",
        &[("Range", &format!("bytes={}", specs(16)))],
    );
    let want: Vec<(u64, u64)> = (0..16).map(|i| (i * 100, i * 100 + 9)).collect();
    check_multipart(&r, &want, SMALL_LEN as u64, "application/octet-stream");
    // Over it: the Range header is ignored.
    let r = get(
        &server,
        "/small.bin",
        &[("Range", &format!("bytes={}", specs(17)))],
    );
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert!(r.body == pattern(SMALL_LEN));
}

#[test]
fn sizes_around_chunk_and_direct_io_boundaries_are_byte_exact() {
    // 512 KiB chunks; a small file's head and body share one chunk when they fit; files from
    // 8 MiB on are read with O_DIRECT.
    const CHUNK: u64 = 512 * 1024;
    const DIRECT: u64 = 8 << 20;
    let mut sizes = vec![0u64, 1, 2, 4095, 4096, 4097];
    for d in [400u64, 300, 260, 250, 240, 230, 220, 200, 150, 100, 1] {
        sizes.push(CHUNK - d);
    }
    sizes.extend([CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1]);
    sizes.extend([
        DIRECT - 1,
        DIRECT,
        DIRECT + 1,
        DIRECT + 4095,
        DIRECT + 4096,
        DIRECT + CHUNK,
    ]);
    let dir = disk_tempdir();
    let root = dir.path().to_path_buf();
    for &n in &sizes {
        write_pattern_file(&root.join(format!("s{n}.bin")), n);
    }
    let server = Server::start_owning(dir, &root, &[]);
    let (mut s, mut r) = connect_pair(&server);
    for &n in &sizes {
        let path = format!("/s{n}.bin");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .unwrap();
        let (head, got) = stream_check(&mut r, 0, &path);
        assert_eq!(head.status, 200, "{path}");
        assert_eq!(got, n, "{path}");
        if n > 2 {
            // Last two bytes and an unaligned middle range.
            s.write_all(range_req(&path, "bytes=-2").as_bytes())
                .unwrap();
            let (head, _) = stream_check(&mut r, n - 2, &path);
            check_single(&head, n - 2, n - 1, n, &path);
            let (a, b) = (n / 3, n - n / 5 - 1);
            if a <= b {
                s.write_all(range_req(&path, &format!("bytes={a}-{b}")).as_bytes())
                    .unwrap();
                let (head, _) = stream_check(&mut r, a, &path);
                check_single(&head, a, b, n, &path);
            }
        }
    }
}

/// Full and ranged downloads of `len`-byte pattern file `/f.bin` on one connection.
fn check_downloads(server: &Server, len: u64, what: &str) {
    let (mut s, mut r) = connect_pair(server);
    s.write_all(b"GET /f.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let (head, n) = stream_check(&mut r, 0, what);
    assert_eq!((head.status, n), (200, len), "{what}");
    for (a, b) in [
        (1, 1),
        (4095, 700_000),
        (len / 2 + 3, len - 2),
        (len - 1, len - 1),
    ] {
        s.write_all(range_req("/f.bin", &format!("bytes={a}-{b}")).as_bytes())
            .unwrap();
        let (head, _) = stream_check(&mut r, a, what);
        check_single(&head, a, b, len, what);
    }
    let multi = get(server, "/f.bin", &[("Range", "bytes=0-9,600000-1300000")]);
    check_multipart(
        &multi,
        &[(0, 9), (600_000, 1_300_000)],
        len,
        "application/octet-stream",
    );
}

#[test]
fn page_cache_only_file_systems_serve_byte_exact() {
    // tmpfs has no block device: large files fall back from O_DIRECT to RWF_DONTCACHE or
    // plain buffered reads.
    let Some(dir) = tmpfs_tempdir() else {
        return;
    };
    let len = (12 << 20) + 5;
    write_pattern_file(&dir.path().join("f.bin"), len);
    let root = dir.path().to_path_buf();
    let server = Server::start_owning(dir, &root, &[]);
    check_downloads(&server, len, "tmpfs");
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[test]
fn zero_copy_sends_are_byte_exact() {
    // zerocopy = "on" forces SEND_ZC even over loopback (where "auto" turns it off), so the
    // notification-driven buffer reuse is exercised.
    let dir = disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let len = (24 << 20) + 999;
    write_pattern_file(&root.join("f.bin"), len);
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(&cfg, "zerocopy = \"on\"\n").unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    check_downloads(&server, len, "zerocopy");
    // Vanishing clients while SEND_ZC buffers wait for their notifications.
    for i in 0..10u64 {
        let mut s = server.connect();
        s.write_all(b"GET /f.bin HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0;
        while got < i * 200_000 {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        drop(s);
    }
    check_downloads(&server, len, "zerocopy after disconnects");
    drop(dir);
}
