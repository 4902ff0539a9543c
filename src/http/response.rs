//! Response heads, small error responses and multipart/byteranges framing.
//!
//! Writers append to a caller-owned [`Sink`]: a `Vec<u8>` (in the shard, a reused
//! per-connection buffer), a [`ByteCounter`] (exact lengths without writing) or a
//! [`SliceSink`] (any byte window straight into a registered chunk). They format integers on
//! the stack and never allocate anything else. Every field value is checked
//! for bytes that could break the head (CR, LF, NUL, other controls); a bad value is dropped
//! rather than written, since all of them come from our own code and a dropped optional header
//! is better than a smuggled one.

use crate::http::range::ByteRange;

/// Product name sent in `Server`.
pub const SERVER_NAME: &str = "shardline";

/// Content-Type of error bodies.
pub const ERROR_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// What a response head says; the writer never allocates beyond `out` growth.
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// Status code, 100..=599 (anything else is written as 500).
    pub status: u16,
    /// Writes `Connection: keep-alive` when true (harmless for 1.1, needed for 1.0 clients),
    /// `Connection: close` when false.
    pub keep_alive: bool,
    /// The 29-byte IMF-fixdate from the shard's `DateCache`.
    pub date: &'a [u8],
    /// `Content-Length`; never written for 1xx and 204, which must not carry one.
    pub content_length: Option<u64>,
    /// `Content-Type`.
    pub content_type: Option<&'a str>,
    /// `Last-Modified`, an IMF-fixdate.
    pub last_modified: Option<&'a [u8]>,
    /// `ETag`, quotes included.
    pub etag: Option<&'a [u8]>,
    /// `Content-Range` for 206 (`Bytes`) or 416 (`Unsatisfied`).
    pub content_range: Option<ContentRange>,
    /// `Accept-Ranges: bytes`.
    pub accept_ranges: bool,
    /// `Allow: GET, HEAD` (required on 405).
    pub allow: bool,
    /// Further header lines, each `Name: value\r\n`, written as they are (a response from
    /// the cache: `Age`, `Cache-Status` and the origin's stored fields); checked when made.
    pub extra: &'a [u8],
}

/// A `Content-Range` value; positions are inclusive as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentRange {
    /// `bytes start-end_inclusive/total`
    Bytes {
        /// First byte sent.
        start: u64,
        /// Last byte sent.
        end_inclusive: u64,
        /// Full length of the representation.
        total: u64,
    },
    /// `bytes */total`, for 416.
    Unsatisfied {
        /// Full length of the representation.
        total: u64,
    },
}

impl ContentRange {
    /// The `Bytes` form of a half-open range; None for an empty range.
    pub fn from_range(r: ByteRange, total: u64) -> Option<Self> {
        (r.start < r.end).then(|| ContentRange::Bytes {
            start: r.start,
            end_inclusive: r.end_inclusive(),
            total,
        })
    }
}

/// Where response writers put their bytes.
pub trait Sink {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Counts what a writer would write: exact lengths from the writer itself, so a length and
/// its bytes can never disagree.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteCounter {
    /// Bytes put so far.
    pub bytes: usize,
}

impl Sink for ByteCounter {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes = self.bytes.saturating_add(bytes.len());
    }
}

/// Writes the window `[skip, skip + out.len())` of a writer's output into `out` and drops the
/// rest: renders framing straight into a chunk, also when it straddles two chunks.
#[derive(Debug)]
pub struct SliceSink<'o> {
    out: &'o mut [u8],
    skip: usize,
    written: usize,
}

impl<'o> SliceSink<'o> {
    /// A sink that skips the first `skip` bytes it is given and then fills `out`.
    pub fn new(out: &'o mut [u8], skip: usize) -> Self {
        Self {
            out,
            skip,
            written: 0,
        }
    }

    /// Bytes written into `out`.
    pub fn written(&self) -> usize {
        self.written
    }
}

impl Sink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let dropped = self.skip.min(bytes.len());
        self.skip -= dropped;
        let rest = bytes.get(dropped..).unwrap_or_default();
        let room = self.out.get_mut(self.written..).unwrap_or_default();
        let n = rest.len().min(room.len());
        if let (Some(dst), Some(src)) = (room.get_mut(..n), rest.get(..n)) {
            dst.copy_from_slice(src);
            self.written += n;
        }
    }
}

/// Standard reason phrase for the statuses shardline sends; "Unknown" for others.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Longest decimal u64.
const U64_DIGITS: usize = 20;

/// Decimal digits of `v`, right-aligned in a stack buffer; returns (buffer, first digit index).
fn decimal(mut v: u64) -> ([u8; U64_DIGITS], usize) {
    let mut buf = [b'0'; U64_DIGITS];
    let mut i = U64_DIGITS;
    loop {
        i -= 1;
        if let Some(slot) = buf.get_mut(i) {
            // `v % 10` is 0..=9.
            *slot = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    (buf, i)
}

fn push_u64(out: &mut (impl Sink + ?Sized), v: u64) {
    let (buf, start) = decimal(v);
    out.put(buf.get(start..).unwrap_or_default());
}

/// Number of decimal digits in `v`.
fn decimal_len(v: u64) -> usize {
    U64_DIGITS - decimal(v).1
}

/// A field value we may write: HTAB / SP / VCHAR / obs-text only (RFC 9110 §5.5).
fn is_safe_value(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn push_field(out: &mut (impl Sink + ?Sized), name: &str, value: &[u8]) {
    if !is_safe_value(value) {
        return;
    }
    out.put(name.as_bytes());
    out.put(b": ");
    out.put(value);
    out.put(b"\r\n");
}

fn push_status_line(out: &mut (impl Sink + ?Sized), status: u16) {
    let status = if (100..=599).contains(&status) {
        status
    } else {
        500
    };
    out.put(b"HTTP/1.1 ");
    push_u64(out, u64::from(status));
    out.put(b" ");
    out.put(reason_phrase(status).as_bytes());
    out.put(b"\r\n");
}

/// Appends a full response head (`HTTP/1.1 ...` through the blank line) to `out`.
pub fn write_head(head: &Head<'_>, out: &mut (impl Sink + ?Sized)) {
    push_status_line(out, head.status);
    push_field(out, "Server", SERVER_NAME.as_bytes());
    push_field(out, "Date", head.date);
    if let Some(ct) = head.content_type {
        push_field(out, "Content-Type", ct.as_bytes());
    }
    let bodyless = head.status < 200 || head.status == 204;
    if let (Some(len), false) = (head.content_length, bodyless) {
        out.put(b"Content-Length: ");
        push_u64(out, len);
        out.put(b"\r\n");
    }
    match head.content_range {
        Some(ContentRange::Bytes {
            start,
            end_inclusive,
            total,
        }) => {
            out.put(b"Content-Range: bytes ");
            push_u64(out, start);
            out.put(b"-");
            push_u64(out, end_inclusive);
            out.put(b"/");
            push_u64(out, total);
            out.put(b"\r\n");
        }
        Some(ContentRange::Unsatisfied { total }) => {
            out.put(b"Content-Range: bytes */");
            push_u64(out, total);
            out.put(b"\r\n");
        }
        None => {}
    }
    if let Some(lm) = head.last_modified {
        push_field(out, "Last-Modified", lm);
    }
    if let Some(etag) = head.etag {
        push_field(out, "ETag", etag);
    }
    if head.accept_ranges {
        out.put(b"Accept-Ranges: bytes\r\n");
    }
    if head.allow {
        out.put(b"Allow: GET, HEAD\r\n");
    }
    out.put(head.extra);
    out.put(if head.keep_alive {
        b"Connection: keep-alive\r\n"
    } else {
        b"Connection: close\r\n"
    });
    out.put(b"\r\n");
}

/// Length of the text body `write_error` sends for `status` (`"404 Not Found\n"`).
pub fn error_body_len(status: u16) -> usize {
    // Three digits, a space, the phrase, a newline.
    reason_phrase(status).len().saturating_add(5)
}

/// The head of `write_error`'s response (the text body's length included).
pub fn error_head(status: u16, keep_alive: bool, date: &[u8]) -> Head<'_> {
    Head {
        status,
        keep_alive,
        date,
        content_length: Some(error_body_len(status) as u64),
        content_type: Some(ERROR_CONTENT_TYPE),
        last_modified: None,
        etag: None,
        content_range: None,
        accept_ranges: false,
        allow: status == 405,
        extra: b"",
    }
}

/// The head `write_error` would send, without the body: the answer to a HEAD request.
pub fn write_error_head(
    status: u16,
    keep_alive: bool,
    date: &[u8],
    out: &mut (impl Sink + ?Sized),
) {
    write_head(&error_head(status, keep_alive, date), out);
}

/// A small complete error response (status + short text body), for rejects and 404s.
///
/// A 405 carries `Allow: GET, HEAD`. A 416 needs `Content-Range: bytes */len`, which only the
/// caller knows: build that one with `write_head`.
pub fn write_error(status: u16, keep_alive: bool, date: &[u8], out: &mut (impl Sink + ?Sized)) {
    let status = if (100..=599).contains(&status) {
        status
    } else {
        500
    };
    write_error_head(status, keep_alive, date, out);
    push_u64(out, u64::from(status));
    out.put(b" ");
    out.put(reason_phrase(status).as_bytes());
    out.put(b"\n");
}

/// Length of a multipart boundary made by `Boundary::new`.
pub const BOUNDARY_BYTES: usize = 26;

const BOUNDARY_PREFIX: &[u8] = b"shardline-";
const MULTIPART_TYPE_PREFIX: &[u8] = b"multipart/byteranges; boundary=";
const MULTIPART_TYPE_BYTES: usize = MULTIPART_TYPE_PREFIX.len() + BOUNDARY_BYTES;
const _: () = assert!(BOUNDARY_PREFIX.len() + 16 == BOUNDARY_BYTES);

/// A multipart/byteranges boundary (`shardline-` + 16 hex digits) and the Content-Type that
/// announces it, both on the stack.
#[derive(Clone, Copy, Debug)]
pub struct Boundary {
    content_type: [u8; MULTIPART_TYPE_BYTES],
}

/// SplitMix64: spreads a counter into bits that look unrelated to the file content.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Boundary {
    /// A boundary derived from `seed` (e.g. a per-shard counter mixed with the start time).
    ///
    /// A boundary must not occur inside the parts; 64 pseudo-random bits make that as unlikely
    /// as nginx's and Apache's choices, and unlike them no process-wide state is touched.
    pub fn new(seed: u64) -> Self {
        let mut content_type = [b'0'; MULTIPART_TYPE_BYTES];
        let bits = splitmix64(seed);
        for (i, slot) in content_type.iter_mut().enumerate() {
            *slot = if let Some(&b) = MULTIPART_TYPE_PREFIX.get(i) {
                b
            } else if let Some(&b) = BOUNDARY_PREFIX.get(i - MULTIPART_TYPE_PREFIX.len()) {
                b
            } else {
                let digit = i - MULTIPART_TYPE_PREFIX.len() - BOUNDARY_PREFIX.len();
                let nibble = ((bits >> ((15 - digit.min(15)) * 4)) & 0xf) as u8;
                if nibble < 10 {
                    b'0' + nibble
                } else {
                    b'a' + nibble - 10
                }
            };
        }
        Self { content_type }
    }

    /// The boundary itself, without the leading dashes.
    pub fn as_str(&self) -> &str {
        self.content_type()
            .get(MULTIPART_TYPE_PREFIX.len()..)
            .unwrap_or_default()
    }

    /// `multipart/byteranges; boundary=...`, for the response's Content-Type.
    pub fn content_type(&self) -> &str {
        // Built from ASCII only, so this never fails.
        std::str::from_utf8(&self.content_type).unwrap_or_default()
    }
}

/// Bytes `write_part_header` produces for these arguments.
pub fn part_header_len(
    boundary: &str,
    content_type: &str,
    start: u64,
    end_inclusive: u64,
    total: u64,
) -> usize {
    // "\r\n--" B "\r\nContent-Type: " CT "\r\nContent-Range: bytes " s "-" e "/" t "\r\n\r\n"
    let fixed = 4 + 16 + 23 + 2 + 4;
    [
        fixed,
        boundary.len(),
        content_type.len(),
        decimal_len(start),
        decimal_len(end_inclusive),
        decimal_len(total),
    ]
    .iter()
    .fold(0usize, |a, &b| a.saturating_add(b))
}

/// Appends the delimiter and headers that precede one part of a multipart/byteranges body.
///
/// Every part, the first included, starts with CRLF: before the first part it is preamble,
/// which recipients ignore (RFC 2046 §5.1.1), and it keeps every part the same shape (nginx
/// does the same).
pub fn write_part_header(
    boundary: &str,
    content_type: &str,
    start: u64,
    end_inclusive: u64,
    total: u64,
    out: &mut (impl Sink + ?Sized),
) {
    out.put(b"\r\n--");
    out.put(boundary.as_bytes());
    out.put(b"\r\nContent-Type: ");
    out.put(content_type.as_bytes());
    out.put(b"\r\nContent-Range: bytes ");
    push_u64(out, start);
    out.put(b"-");
    push_u64(out, end_inclusive);
    out.put(b"/");
    push_u64(out, total);
    out.put(b"\r\n\r\n");
}

/// Bytes `write_closing_boundary` produces.
pub fn closing_boundary_len(boundary: &str) -> usize {
    boundary.len().saturating_add(8)
}

/// Appends the final delimiter (`CRLF --boundary-- CRLF`) after the last part.
pub fn write_closing_boundary(boundary: &str, out: &mut (impl Sink + ?Sized)) {
    out.put(b"\r\n--");
    out.put(boundary.as_bytes());
    out.put(b"--\r\n");
}

/// Exact multipart/byteranges body length for `ranges` of a `total`-byte file: the part
/// headers, the parts and the closing delimiter, so `Content-Length` can be sent up front.
/// None if it does not fit a u64 (not possible for real ranges of a real file).
pub fn multipart_length(
    boundary: &str,
    content_type: &str,
    ranges: &[ByteRange],
    total: u64,
) -> Option<u64> {
    let mut sum = u64::try_from(closing_boundary_len(boundary)).ok()?;
    for r in ranges {
        let header = part_header_len(boundary, content_type, r.start, r.end_inclusive(), total);
        sum = sum
            .checked_add(u64::try_from(header).ok()?)?
            .checked_add(r.len())?;
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

    fn base() -> Head<'static> {
        Head {
            status: 200,
            keep_alive: true,
            date: DATE,
            content_length: None,
            content_type: None,
            last_modified: None,
            etag: None,
            content_range: None,
            accept_ranges: false,
            allow: false,
            extra: b"",
        }
    }

    /// Parses `bytes` as a response head: (code, headers, head length).
    fn parse(bytes: &[u8]) -> (u16, Vec<(String, String)>, usize) {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(bytes).expect("valid response") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("incomplete head"),
        };
        assert_eq!(resp.version, Some(1));
        let code = resp.code.unwrap();
        assert_eq!(resp.reason, Some(reason_phrase(code)));
        let hs = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8(h.value.to_vec()).unwrap(),
                )
            })
            .collect();
        (code, hs, n)
    }

    fn get<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
        let mut it = hs.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name));
        let first = it.next().map(|(_, v)| v.as_str());
        assert!(it.next().is_none(), "duplicate {name}");
        first
    }

    #[test]
    fn full_200_head() {
        let mut out = Vec::new();
        write_head(
            &Head {
                content_length: Some(1234),
                content_type: Some("application/zstd"),
                last_modified: Some(DATE),
                etag: Some(b"\"1-2-3\""),
                accept_ranges: true,
                ..base()
            },
            &mut out,
        );
        let (code, hs, n) = parse(&out);
        assert_eq!(n, out.len());
        assert_eq!(code, 200);
        assert_eq!(get(&hs, "server"), Some("shardline"));
        assert_eq!(get(&hs, "date"), Some(std::str::from_utf8(DATE).unwrap()));
        assert_eq!(get(&hs, "content-length"), Some("1234"));
        assert_eq!(get(&hs, "content-type"), Some("application/zstd"));
        assert_eq!(get(&hs, "last-modified"), get(&hs, "date"));
        assert_eq!(get(&hs, "etag"), Some("\"1-2-3\""));
        assert_eq!(get(&hs, "accept-ranges"), Some("bytes"));
        assert_eq!(get(&hs, "connection"), Some("keep-alive"));
        assert_eq!(get(&hs, "allow"), None);
        assert_eq!(get(&hs, "content-range"), None);
    }

    #[test]
    fn range_heads() {
        let mut out = Vec::new();
        write_head(
            &Head {
                status: 206,
                keep_alive: false,
                content_length: Some(500),
                content_range: ContentRange::from_range(ByteRange { start: 0, end: 500 }, 1000),
                ..base()
            },
            &mut out,
        );
        let (code, hs, _) = parse(&out);
        assert_eq!(code, 206);
        assert_eq!(get(&hs, "content-range"), Some("bytes 0-499/1000"));
        assert_eq!(get(&hs, "connection"), Some("close"));

        out.clear();
        write_head(
            &Head {
                status: 416,
                content_length: Some(0),
                content_range: Some(ContentRange::Unsatisfied { total: u64::MAX }),
                ..base()
            },
            &mut out,
        );
        let (code, hs, _) = parse(&out);
        assert_eq!(code, 416);
        assert_eq!(
            get(&hs, "content-range"),
            Some("bytes */18446744073709551615")
        );
        assert_eq!(
            ContentRange::from_range(ByteRange { start: 5, end: 5 }, 9),
            None
        );
    }

    #[test]
    fn bodyless_statuses_never_carry_content_length() {
        let mut out = Vec::new();
        write_head(
            &Head {
                status: 204,
                content_length: Some(10),
                ..base()
            },
            &mut out,
        );
        let (_, hs, _) = parse(&out);
        assert_eq!(get(&hs, "content-length"), None);
    }

    #[test]
    fn unsafe_values_are_dropped() {
        let mut out = Vec::new();
        write_head(
            &Head {
                etag: Some(b"\"x\"\r\nSet-Cookie: a=b"),
                content_type: Some("text/plain\n"),
                last_modified: Some(b"\0"),
                ..base()
            },
            &mut out,
        );
        let (_, hs, n) = parse(&out);
        assert_eq!(n, out.len());
        assert_eq!(get(&hs, "etag"), None);
        assert_eq!(get(&hs, "set-cookie"), None);
        assert_eq!(get(&hs, "content-type"), None);
        assert_eq!(get(&hs, "last-modified"), None);
    }

    #[test]
    fn out_of_range_status_becomes_500() {
        for status in [0, 99, 600, u16::MAX] {
            let mut out = Vec::new();
            write_head(&Head { status, ..base() }, &mut out);
            assert_eq!(parse(&out).0, 500);
            out.clear();
            write_error(status, false, DATE, &mut out);
            assert!(out.ends_with(b"\r\n\r\n500 Internal Server Error\n"));
        }
    }

    #[test]
    fn error_responses() {
        for status in [400, 403, 404, 405, 414, 416, 431, 500, 501, 505, 299] {
            for keep_alive in [true, false] {
                let mut out = Vec::new();
                write_error(status, keep_alive, DATE, &mut out);
                let (code, hs, n) = parse(&out);
                assert_eq!(code, status);
                let body = &out[n..];
                assert_eq!(body.len(), error_body_len(status));
                assert_eq!(
                    body,
                    format!("{status} {}\n", reason_phrase(status)).as_bytes()
                );
                let len = body.len().to_string();
                assert_eq!(get(&hs, "content-length"), Some(len.as_str()));
                assert_eq!(get(&hs, "content-type"), Some(ERROR_CONTENT_TYPE));
                let allow = (status == 405).then_some("GET, HEAD");
                assert_eq!(get(&hs, "allow"), allow);
                let conn = if keep_alive { "keep-alive" } else { "close" };
                assert_eq!(get(&hs, "connection"), Some(conn));

                let mut head_only = Vec::new();
                write_error_head(status, keep_alive, DATE, &mut head_only);
                assert_eq!(head_only, out[..n]);
            }
        }
    }

    #[test]
    fn reason_phrases() {
        assert_eq!(reason_phrase(200), "OK");
        assert_eq!(reason_phrase(416), "Range Not Satisfiable");
        assert_eq!(reason_phrase(431), "Request Header Fields Too Large");
        assert_eq!(reason_phrase(777), "Unknown");
    }

    #[test]
    fn decimal_digits() {
        for v in [0, 9, 10, 99, 100, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
            assert_eq!(decimal_len(v), out.len());
        }
    }

    #[test]
    fn boundary() {
        let b = Boundary::new(42);
        assert_eq!(b.as_str().len(), BOUNDARY_BYTES);
        assert!(b.as_str().starts_with("shardline-"));
        assert!(b.as_str()[10..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            b.content_type(),
            format!("multipart/byteranges; boundary={}", b.as_str())
        );
        assert_ne!(Boundary::new(1).as_str(), Boundary::new(2).as_str());
    }

    /// Builds a whole multipart body over `file` and checks it against `multipart_length`,
    /// then reads every part back.
    fn multipart_round_trip(file: &[u8], ranges: &[ByteRange]) {
        let boundary = Boundary::new(7);
        let b = boundary.as_str();
        let ct = "application/octet-stream";
        let total = file.len() as u64;
        let mut body = Vec::new();
        for r in ranges {
            let before = body.len();
            write_part_header(b, ct, r.start, r.end_inclusive(), total, &mut body);
            assert_eq!(
                body.len() - before,
                part_header_len(b, ct, r.start, r.end_inclusive(), total)
            );
            body.extend_from_slice(&file[r.start as usize..r.end as usize]);
        }
        let before = body.len();
        write_closing_boundary(b, &mut body);
        assert_eq!(body.len() - before, closing_boundary_len(b));
        assert_eq!(
            multipart_length(b, ct, ranges, total),
            Some(body.len() as u64)
        );

        // Read it back: split on the delimiter, parse each part's headers with httparse.
        let delim = format!("\r\n--{b}");
        let text = body.as_slice();
        let mut parts = Vec::new();
        let mut pos = 0;
        while let Some(off) = find(&text[pos..], delim.as_bytes()) {
            parts.push(pos + off);
            pos += off + delim.len();
        }
        assert_eq!(parts.len(), ranges.len() + 1);
        assert!(text[*parts.last().unwrap() + delim.len()..] == *b"--\r\n");
        for (i, r) in ranges.iter().enumerate() {
            let part = &text[parts[i] + delim.len()..parts[i + 1]];
            assert!(part.starts_with(b"\r\n"));
            let mut headers = [httparse::EMPTY_HEADER; 4];
            let (n, hs) = match httparse::parse_headers(&part[2..], &mut headers).unwrap() {
                httparse::Status::Complete(x) => x,
                httparse::Status::Partial => panic!("partial part header"),
            };
            assert_eq!(hs[0].name, "Content-Type");
            assert_eq!(hs[0].value, ct.as_bytes());
            assert_eq!(hs[1].name, "Content-Range");
            let want = format!("bytes {}-{}/{}", r.start, r.end_inclusive(), total);
            assert_eq!(hs[1].value, want.as_bytes());
            assert_eq!(&part[2 + n..], &file[r.start as usize..r.end as usize]);
        }
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn multipart_body() {
        let file: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        multipart_round_trip(
            &file,
            &[
                ByteRange { start: 0, end: 10 },
                ByteRange {
                    start: 100,
                    end: 350,
                },
                ByteRange {
                    start: 999,
                    end: 1000,
                },
            ],
        );
        multipart_round_trip(&file, &[ByteRange { start: 5, end: 6 }]);
        multipart_round_trip(&file, &[]);
    }

    #[test]
    fn sinks_agree_with_vec() {
        let mut whole = Vec::new();
        write_part_header("b0undary", "text/plain", 5, 99, 1000, &mut whole);
        let mut counter = ByteCounter::default();
        write_part_header("b0undary", "text/plain", 5, 99, 1000, &mut counter);
        assert_eq!(counter.bytes, whole.len());
        // Any window, in pieces that straddle the writer's own put calls.
        for piece in [1usize, 3, 7, 64] {
            let mut joined = Vec::new();
            let mut skip = 0;
            loop {
                let mut buf = vec![0xAA; piece];
                let mut sink = SliceSink::new(&mut buf, skip);
                write_part_header("b0undary", "text/plain", 5, 99, 1000, &mut sink);
                let n = sink.written();
                if n == 0 {
                    break;
                }
                joined.extend_from_slice(&buf[..n]);
                skip += n;
            }
            assert_eq!(joined, whole, "piece {piece}");
        }
    }

    #[test]
    fn multipart_length_overflow_is_none() {
        let huge = [
            ByteRange {
                start: 0,
                end: u64::MAX,
            },
            ByteRange {
                start: 0,
                end: u64::MAX,
            },
        ];
        assert_eq!(multipart_length("b", "x", &huge, u64::MAX), None);
    }

    proptest! {
        #[test]
        fn part_header_len_is_exact(
            start in any::<u64>(), end in any::<u64>(), total in any::<u64>(), seed in any::<u64>()
        ) {
            let boundary = Boundary::new(seed);
            let mut out = Vec::new();
            write_part_header(boundary.as_str(), "video/mp4", start, end, total, &mut out);
            prop_assert_eq!(out.len(), part_header_len(boundary.as_str(), "video/mp4", start, end, total));
        }

        #[test]
        fn every_head_parses(status in 0u16..1000, keep_alive in any::<bool>(),
                             len in proptest::option::of(any::<u64>()),
                             accept_ranges in any::<bool>(), allow in any::<bool>()) {
            let mut out = Vec::new();
            write_head(&Head { status, keep_alive, content_length: len, accept_ranges, allow, ..base() }, &mut out);
            let (_, _, n) = parse(&out);
            prop_assert_eq!(n, out.len());
        }
    }
}
