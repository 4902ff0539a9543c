//! Request-head parsing: request line by hand, header fields with `httparse`.
//!
//! `parse_request` is a pure function of the bytes received so far; the shard calls it when
//! `head_scan::HeadScan`, which looks at each received byte once, says it can answer more
//! than `Partial` (so a trickled head costs linear time). It is *prefix-consistent*: every check decides at a fixed byte position
//! from the bytes before it, so a prefix of a request parses as `Partial`, as the same
//! `Rejected` the whole request gets (once enough bytes are there to decide), or, once the
//! head is complete, as the same `Complete`. The split-at-every-offset tests hold it to that.
//!
//! Why the request line is not left to httparse: it reports an error kind without a position
//! and cannot tell an unsupported version (505) from garbage (400), a long line (414) from a
//! long head (431), or an HTTP/0.9 line from a bad target. The line grammar is tiny; header
//! fields, where the subtle rules live, go to httparse, whose default configuration already
//! rejects obs-fold, space before the colon, bare CR and control bytes in values. What it lets
//! through, and we refuse here: bare LF as a line end (accepted by RFC 9112 as a MAY, refused
//! because proxies in front of us may disagree about where a line ends: the classic request
//! smuggling shape), any body framing, a missing, duplicate or malformed Host, and duplicated
//! singleton fields.

use httparse::Status;

/// Longest request line (method, target and version, without CRLF); longer -> 414.
pub const MAX_REQUEST_LINE_BYTES: usize = 8 * 1024;

/// Longest head (empty lines, request line, fields and the final CRLF); longer -> 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Most header fields in one request; more -> 431.
pub const MAX_HEADER_COUNT: usize = 64;

/// Empty lines (CRLF) tolerated before a request line (RFC 9112 §2.2 asks for at least one,
/// for clients that send a stray CRLF after a previous request); more -> 400.
pub const MAX_LEADING_EMPTY_LINES: usize = 4;

// A maximal request line after the maximal run of empty lines still fits a head, so a long
// request line is always reported as 414, never as 431.
const _: () = assert!(MAX_LEADING_EMPTY_LINES * 2 + MAX_REQUEST_LINE_BYTES + 2 < MAX_HEAD_BYTES);

/// Request methods we serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
}

/// HTTP versions we speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0: close after the response unless the client asked for keep-alive.
    Http10,
    /// HTTP/1.1: persistent unless the client said close.
    Http11,
}

/// A parsed request head borrowing the connection's receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// GET or HEAD.
    pub method: Method,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Raw origin-form path, query and fragment stripped, NOT decoded; always starts with '/'.
    pub path: &'a [u8],
    /// Raw text after '?', if any (may be empty).
    pub query: Option<&'a [u8]>,
    /// Whether the connection may stay open after the response (version defaults, then the
    /// `Connection` tokens `close` / `keep-alive`; close wins).
    pub keep_alive: bool,
    /// `Range` value, if present.
    pub range: Option<&'a [u8]>,
    /// `If-Match` value, if present.
    pub if_match: Option<&'a [u8]>,
    /// `If-Unmodified-Since` value, if present.
    pub if_unmodified_since: Option<&'a [u8]>,
    /// `If-None-Match` value, if present.
    pub if_none_match: Option<&'a [u8]>,
    /// `If-Modified-Since` value, if present.
    pub if_modified_since: Option<&'a [u8]>,
    /// `If-Range` value, if present.
    pub if_range: Option<&'a [u8]>,
    /// `Authorization`: a shared cache neither stores the answer nor answers it from
    /// another's (RFC 9111 §3.5); forwarded to the origin with the request's own fetch.
    pub authorization: Option<&'a [u8]>,
    /// The head's field lines as they came (each ending in CRLF), for the fields a pulled
    /// request forwards to its origin (`origin::request::forwardable`).
    pub fields: &'a [u8],
    /// The `X-Forwarded-For` lines, in order (the hops nearest to us are at the right end
    /// of the last one).
    pub x_forwarded_for: ListLines<'a>,
    /// The `Forwarded` lines (RFC 7239), in order.
    pub forwarded: ListLines<'a>,
    /// `Host` value (syntax-checked), if present and not empty.
    pub host: Option<&'a [u8]>,
}

/// Most lines of one forwarding header kept (a longer run keeps its last ones: the hops
/// nearest to us).
pub const FORWARDING_LINES_MAX: usize = 4;

/// The lines of a list header that may repeat (RFC 9110 5.3: they read as one list joined
/// by commas), kept as slices of the request: no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListLines<'a> {
    lines: [&'a [u8]; FORWARDING_LINES_MAX],
    len: usize,
}

impl<'a> ListLines<'a> {
    /// Lines holding `values`, in order (the last `FORWARDING_LINES_MAX` of them).
    pub fn of(values: &[&'a [u8]]) -> ListLines<'a> {
        let mut l = ListLines::default();
        for v in values {
            l.push(v);
        }
        l
    }

    /// Adds the next line; past the bound the oldest goes.
    pub fn push(&mut self, value: &'a [u8]) {
        if self.len == FORWARDING_LINES_MAX {
            self.lines.rotate_left(1);
            self.lines[FORWARDING_LINES_MAX - 1] = value;
        } else {
            self.lines[self.len] = value;
            self.len += 1;
        }
    }

    /// The lines, in order.
    pub fn lines(&self) -> &[&'a [u8]] {
        &self.lines[..self.len]
    }

    /// True when the header is absent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Why a request was refused; every refusal closes the connection after the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    /// Status to answer with (400, 405, 414, 431, 501, 505).
    pub status: u16,
    /// Short human explanation, for logs and metrics labels (not sent to the client).
    pub reason: &'static str,
}

/// Outcome of parsing the bytes received so far.
// A `Complete` is a few hundred bytes of slices on the stack, once per request; boxing it to
// even out the variants would allocate on the request path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole head; the next request (pipelining) starts at `buf[head_len..]`.
    Complete {
        /// The request.
        request: Request<'a>,
        /// Bytes of `buf` the head took, leading empty lines included.
        head_len: usize,
    },
    /// Not enough bytes yet to decide; read more.
    Partial,
    /// Refuse with this status and close.
    Rejected(Reject),
}

const fn reject(status: u16, reason: &'static str) -> Reject {
    Reject { status, reason }
}

const BAD_LEADING_CR: Reject = reject(400, "bare CR before request line");
const BAD_LEADING_LF: Reject = reject(400, "bare LF before request line");
const TOO_MANY_EMPTY_LINES: Reject = reject(400, "too many empty lines before request line");
const LINE_TOO_LONG: Reject = reject(414, "request line too long");
const EMPTY_METHOD: Reject = reject(400, "empty method");
const BAD_METHOD: Reject = reject(400, "invalid byte in method");
const EMPTY_TARGET: Reject = reject(400, "empty request target");
const NO_VERSION: Reject = reject(400, "request line without HTTP version");
const BAD_TARGET_BYTE: Reject = reject(400, "invalid byte in request target");
const BAD_VERSION: Reject = reject(400, "malformed HTTP version");
const BAD_LINE_END: Reject = reject(400, "request line not ended by CRLF");
const UNSUPPORTED_VERSION: Reject = reject(505, "unsupported HTTP version");
const NOT_ALLOWED: Reject = reject(405, "method not allowed");
const NOT_IMPLEMENTED: Reject = reject(501, "method not implemented");
const BAD_TARGET_FORM: Reject = reject(400, "request target not in origin or absolute form");
const BARE_LF: Reject = reject(400, "bare LF in header section");
const HEAD_TOO_LARGE: Reject = reject(431, "request head too large");
const TOO_MANY_HEADERS: Reject = reject(431, "too many header fields");
const BAD_HEADER_NAME: Reject = reject(400, "invalid header field name");
const BAD_HEADER_VALUE: Reject = reject(400, "invalid header field value");
const BAD_NEWLINE: Reject = reject(400, "invalid line ending in header section");
const BAD_HEADER: Reject = reject(400, "malformed header section");
const TRANSFER_ENCODING: Reject = reject(400, "Transfer-Encoding on a request");
const CONTENT_LENGTH: Reject = reject(400, "request body not allowed");
const DUPLICATE_CONTENT_LENGTH: Reject = reject(400, "duplicate Content-Length");
const HOST_MISSING: Reject = reject(400, "HTTP/1.1 request without Host");
const HOST_DUPLICATE: Reject = reject(400, "more than one Host");
const HOST_INVALID: Reject = reject(400, "invalid Host");
const DUPLICATE_FIELD: Reject = reject(400, "duplicate singleton header field");

/// Methods we know but do not serve: 405 with `Allow`, rather than 501.
const KNOWN_METHODS: &[&[u8]] = &[
    b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"CONNECT",
];

/// Result of one parsing step that may need more bytes.
enum Step<T> {
    Done(T),
    Partial,
    Reject(Reject),
}

/// tchar (RFC 9110 §5.6.2): what a method token may contain.
pub(super) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Skips up to MAX_LEADING_EMPTY_LINES CRLFs; returns where the request line starts.
fn skip_empty_lines(buf: &[u8]) -> Step<usize> {
    let mut i = 0usize;
    let mut lines = 0usize;
    loop {
        match buf.get(i) {
            None => return Step::Partial,
            Some(b'\r') => match buf.get(i.saturating_add(1)) {
                None => return Step::Partial,
                Some(b'\n') => {
                    lines = lines.saturating_add(1);
                    if lines > MAX_LEADING_EMPTY_LINES {
                        return Step::Reject(TOO_MANY_EMPTY_LINES);
                    }
                    i = i.saturating_add(2);
                }
                Some(_) => return Step::Reject(BAD_LEADING_CR),
            },
            Some(b'\n') => return Step::Reject(BAD_LEADING_LF),
            Some(_) => return Step::Done(i),
        }
    }
}

/// The three parts of a request line, still unclassified.
struct RequestLine<'a> {
    method: &'a [u8],
    target: &'a [u8],
    major: u8,
    minor: u8,
    /// Bytes taken, CRLF included.
    len: usize,
}

/// Scans `method SP target SP HTTP/d.d CRLF` from the start of `line`.
///
/// Every byte is judged when it arrives: a byte at or past MAX_REQUEST_LINE_BYTES that is not
/// the line end -> 414, a byte the grammar does not allow -> 400. Nothing looks ahead.
fn scan_request_line(line: &[u8]) -> Step<RequestLine<'_>> {
    // Fetches byte `i`, or returns Partial; a content byte past the limit is a 414.
    macro_rules! byte_at {
        ($i:expr) => {{
            let Some(&b) = line.get($i) else {
                return Step::Partial;
            };
            if $i >= MAX_REQUEST_LINE_BYTES {
                return Step::Reject(LINE_TOO_LONG);
            }
            b
        }};
    }

    let mut i = 0usize;
    let method_end = loop {
        let b = byte_at!(i);
        if b == b' ' {
            if i == 0 {
                return Step::Reject(EMPTY_METHOD);
            }
            break i;
        }
        if !is_tchar(b) {
            return Step::Reject(BAD_METHOD);
        }
        i = i.saturating_add(1);
    };

    i = i.saturating_add(1);
    let target_start = i;
    let target_end = loop {
        let b = byte_at!(i);
        match b {
            b' ' if i == target_start => return Step::Reject(EMPTY_TARGET),
            b' ' => break i,
            b'\r' | b'\n' => return Step::Reject(NO_VERSION),
            // Visible ASCII plus raw high bytes (some clients send UTF-8 unencoded; the path
            // resolver insists on valid UTF-8 later). Controls, DEL and NUL are refused here.
            0x21..=0x7e | 0x80..=0xff => {}
            _ => return Step::Reject(BAD_TARGET_BYTE),
        }
        i = i.saturating_add(1);
    };

    i = i.saturating_add(1);
    let mut digits = [0u8; 2];
    let mut next_digit = digits.iter_mut();
    for &expected in b"HTTP/#.#" {
        let b = byte_at!(i);
        let ok = if expected == b'#' {
            match (b.is_ascii_digit(), next_digit.next()) {
                (true, Some(slot)) => {
                    *slot = b - b'0';
                    true
                }
                _ => false,
            }
        } else {
            b == expected
        };
        if !ok {
            return Step::Reject(BAD_VERSION);
        }
        i = i.saturating_add(1);
    }

    // The CR may sit exactly at MAX_REQUEST_LINE_BYTES: the content is then exactly the limit.
    match line.get(i) {
        None => return Step::Partial,
        Some(b'\r') => {}
        Some(_) if i >= MAX_REQUEST_LINE_BYTES => return Step::Reject(LINE_TOO_LONG),
        Some(_) => return Step::Reject(BAD_LINE_END),
    }
    match line.get(i.saturating_add(1)) {
        None => return Step::Partial,
        Some(b'\n') => {}
        Some(_) => return Step::Reject(BAD_LINE_END),
    }
    let [major, minor] = digits;
    Step::Done(RequestLine {
        method: line.get(..method_end).unwrap_or_default(),
        target: line.get(target_start..target_end).unwrap_or_default(),
        major,
        minor,
        len: i.saturating_add(2),
    })
}

fn classify_method(token: &[u8]) -> Result<Method, Reject> {
    match token {
        b"GET" => Ok(Method::Get),
        b"HEAD" => Ok(Method::Head),
        t if KNOWN_METHODS.contains(&t) => Err(NOT_ALLOWED),
        _ => Err(NOT_IMPLEMENTED),
    }
}

/// Splits a request target into (path, query).
///
/// origin-form `/p?q` as is; absolute-form `http(s)://authority/p?q` loses scheme and
/// authority (RFC 9112 §3.2.2 says servers must accept it; we serve one site so the authority
/// is not consulted). `*`, authority-form and anything else are refused. A fragment, which
/// clients should not send, is dropped with everything after it.
fn split_target(target: &[u8]) -> Result<(&[u8], Option<&[u8]>), Reject> {
    let origin = if target.first() == Some(&b'/') {
        target
    } else {
        let after_scheme = strip_prefix_ignore_case(target, b"http://")
            .or_else(|| strip_prefix_ignore_case(target, b"https://"))
            .ok_or(BAD_TARGET_FORM)?;
        let authority_len = after_scheme
            .iter()
            .position(|&b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(after_scheme.len());
        if authority_len == 0 {
            return Err(BAD_TARGET_FORM);
        }
        after_scheme.get(authority_len..).unwrap_or_default()
    };
    let without_fragment = match origin.iter().position(|&b| b == b'#') {
        Some(hash) => origin.get(..hash).unwrap_or_default(),
        None => origin,
    };
    let (path, query) = match without_fragment.iter().position(|&b| b == b'?') {
        Some(q) => (
            without_fragment.get(..q).unwrap_or_default(),
            without_fragment.get(q.saturating_add(1)..),
        ),
        None => (without_fragment, None),
    };
    // Absolute-form with nothing after the authority (`http://host` or `http://host?x`)
    // means the root (RFC 9112 §3.2.2 / RFC 3986 §6.2.3).
    let path: &[u8] = if path.is_empty() { b"/" } else { path };
    Ok((path, query))
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let (head, tail) = s.split_at_checked(prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then_some(tail)
}

/// First LF that is not preceded by CR, counting `h[0]` as following the request line's LF.
fn first_bare_lf(h: &[u8]) -> Option<usize> {
    let mut prev = b'\n';
    for (i, &b) in h.iter().enumerate() {
        if b == b'\n' && prev != b'\r' {
            return Some(i);
        }
        prev = b;
    }
    None
}

/// Sets a singleton field once; a second occurrence is ambiguous and refused.
fn set_once<'a>(slot: &mut Option<&'a [u8]>, value: &'a [u8]) -> Result<(), Reject> {
    if slot.is_some() {
        return Err(DUPLICATE_FIELD);
    }
    *slot = Some(value);
    Ok(())
}

/// What the header fields say, after the framing and Host rules.
#[derive(Default)]
struct Fields<'a> {
    hosts: usize,
    host: Option<&'a [u8]>,
    close: bool,
    keep_alive: bool,
    range: Option<&'a [u8]>,
    if_match: Option<&'a [u8]>,
    if_unmodified_since: Option<&'a [u8]>,
    if_none_match: Option<&'a [u8]>,
    if_modified_since: Option<&'a [u8]>,
    if_range: Option<&'a [u8]>,
    authorization: Option<&'a [u8]>,
    x_forwarded_for: ListLines<'a>,
    forwarded: ListLines<'a>,
}

fn read_fields<'a>(headers: &[httparse::Header<'a>]) -> Result<Fields<'a>, Reject> {
    let mut f = Fields::default();
    let mut content_length_seen = false;
    for h in headers {
        let name = h.name.as_bytes();
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("host") {
            f.hosts = f.hosts.saturating_add(1);
            f.host = Some(h.value);
        } else if is("content-length") {
            // GET and HEAD carry no body; "0" is the only harmless value. Anything else,
            // including "00", "+0", lists and duplicates, is a framing disagreement waiting
            // to happen with whatever proxy sits in front of us.
            if content_length_seen {
                return Err(DUPLICATE_CONTENT_LENGTH);
            }
            content_length_seen = true;
            if h.value != b"0" {
                return Err(CONTENT_LENGTH);
            }
        } else if is("transfer-encoding") {
            return Err(TRANSFER_ENCODING);
        } else if is("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    f.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    f.keep_alive = true;
                }
            }
        } else if is("range") {
            set_once(&mut f.range, h.value)?;
        } else if is("if-match") {
            // A list field like If-None-Match; the same one-line rule applies.
            set_once(&mut f.if_match, h.value)?;
        } else if is("if-unmodified-since") {
            set_once(&mut f.if_unmodified_since, h.value)?;
        } else if is("if-none-match") {
            // A list field that could legally be split over two lines, but joining them would
            // need an allocation and no real client does it.
            set_once(&mut f.if_none_match, h.value)?;
        } else if is("if-modified-since") {
            set_once(&mut f.if_modified_since, h.value)?;
        } else if is("if-range") {
            set_once(&mut f.if_range, h.value)?;
        } else if is("authorization") {
            set_once(&mut f.authorization, h.value)?;
        } else if is("x-forwarded-for") {
            // Read only from a trusted peer (`client::forwarded`); every line counts, as
            // one list.
            f.x_forwarded_for.push(h.value);
        } else if is("forwarded") {
            f.forwarded.push(h.value);
        }
    }
    Ok(f)
}

/// Whether a Host field value is `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2):
/// an IP-literal in brackets, or a reg-name (unreserved, pct-encoded and sub-delims, which
/// covers IPv4address), then optionally `:` and digits. Empty is valid: it is what a client
/// sends when the target URI has no authority.
fn is_valid_host(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    let (host_ok, rest) = if let Some(literal) = value.strip_prefix(b"[") {
        let Some(close) = literal.iter().position(|&b| b == b']') else {
            return false;
        };
        let inside = literal.get(..close).unwrap_or_default();
        (
            is_ip_literal(inside),
            literal.get(close.saturating_add(1)..).unwrap_or_default(),
        )
    } else {
        let colon = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        let (name, rest) = value.split_at(colon);
        (is_reg_name(name), rest)
    };
    let port_ok = match rest.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    host_ok && port_ok
}

/// sub-delims (RFC 3986 §2.2).
fn is_sub_delim(b: u8) -> bool {
    b"!$&'()*+,;=".contains(&b)
}

/// unreserved (RFC 3986 §2.3).
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// reg-name = *( unreserved / pct-encoded / sub-delims ).
fn is_reg_name(name: &[u8]) -> bool {
    let mut i = 0usize;
    while let Some(&b) = name.get(i) {
        if b == b'%' {
            let hex = name.get(i.saturating_add(1)..i.saturating_add(3));
            if !hex.is_some_and(|h| h.len() == 2 && h.iter().all(u8::is_ascii_hexdigit)) {
                return false;
            }
            i = i.saturating_add(3);
        } else if is_unreserved(b) || is_sub_delim(b) {
            i = i.saturating_add(1);
        } else {
            return false;
        }
    }
    true
}

/// What is inside the brackets of an IP-literal: IPv6address or
/// IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ).
fn is_ip_literal(inside: &[u8]) -> bool {
    if let Some(future) = inside
        .strip_prefix(b"v")
        .or_else(|| inside.strip_prefix(b"V"))
    {
        let dot = future.iter().position(|&b| b == b'.').unwrap_or(0);
        let (version, tail) = future.split_at(dot);
        let tail = tail.get(1..).unwrap_or_default();
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !tail.is_empty()
            && tail
                .iter()
                .all(|&b| is_unreserved(b) || is_sub_delim(b) || b == b':');
    }
    // std's parser follows RFC 4291 text forms, embedded IPv4 included, as RFC 3986 does.
    std::str::from_utf8(inside).is_ok_and(|s| s.parse::<std::net::Ipv6Addr>().is_ok())
}

fn header_error(e: httparse::Error) -> Reject {
    match e {
        httparse::Error::TooManyHeaders => TOO_MANY_HEADERS,
        httparse::Error::HeaderName => BAD_HEADER_NAME,
        httparse::Error::HeaderValue => BAD_HEADER_VALUE,
        httparse::Error::NewLine => BAD_NEWLINE,
        _ => BAD_HEADER,
    }
}

/// Parses one request head from the start of `buf` (the bytes received so far).
///
/// Returns `Partial` until the head is complete or a problem is certain. Bytes after the head
/// (a pipelined request) are never looked at, except that a head longer than MAX_HEAD_BYTES is
/// refused as soon as MAX_HEAD_BYTES + 1 bytes have arrived without its end.
pub fn parse_request(buf: &[u8]) -> Parsed<'_> {
    // Bytes past the limit can only make the head too long; nothing else looks at them, which
    // keeps every decision at a position inside the limit.
    let view = buf.get(..MAX_HEAD_BYTES).unwrap_or(buf);
    let over_limit = buf.len() > MAX_HEAD_BYTES;
    let partial = if over_limit {
        Parsed::Rejected(HEAD_TOO_LARGE)
    } else {
        Parsed::Partial
    };

    let line_start = match skip_empty_lines(view) {
        Step::Done(n) => n,
        Step::Partial => return partial,
        Step::Reject(r) => return Parsed::Rejected(r),
    };
    let rest = view.get(line_start..).unwrap_or_default();
    let line = match scan_request_line(rest) {
        Step::Done(line) => line,
        Step::Partial => return partial,
        Step::Reject(r) => return Parsed::Rejected(r),
    };

    // The line is complete: judge what it says. Version first, so an HTTP/2 preface
    // (`PRI * HTTP/2.0`) gets 505 rather than a complaint about its method or target. A higher
    // minor version of 1.x is processed as 1.1, the highest we speak (RFC 9110 §2.5: minor
    // versions are compatible, and the response's HTTP/1.1 tells the client what we are).
    let version = match (line.major, line.minor) {
        (1, 0) => Version::Http10,
        (1, _) => Version::Http11,
        _ => return Parsed::Rejected(UNSUPPORTED_VERSION),
    };
    let method = match classify_method(line.method) {
        Ok(m) => m,
        Err(r) => return Parsed::Rejected(r),
    };
    let (path, query) = match split_target(line.target) {
        Ok(pq) => pq,
        Err(r) => return Parsed::Rejected(r),
    };

    let fields_start = line_start.saturating_add(line.len);
    let fields = view.get(fields_start..).unwrap_or_default();
    // httparse takes a lone LF for a line end; cut its input at the first one so that, if the
    // head is not over before it, we see Partial and refuse the LF ourselves.
    let bare_lf = first_bare_lf(fields);
    let fields = match bare_lf {
        Some(at) => fields.get(..at).unwrap_or_default(),
        None => fields,
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADER_COUNT];
    let (fields_len, headers) = match httparse::parse_headers(fields, &mut headers) {
        Ok(Status::Complete(done)) => done,
        Ok(Status::Partial) if bare_lf.is_some() => return Parsed::Rejected(BARE_LF),
        Ok(Status::Partial) => return partial,
        Err(e) => return Parsed::Rejected(header_error(e)),
    };

    let f = match read_fields(headers) {
        Ok(f) => f,
        Err(r) => return Parsed::Rejected(r),
    };
    if f.hosts > 1 {
        return Parsed::Rejected(HOST_DUPLICATE);
    }
    // Judged even for an absolute-form target, whose authority replaces it: RFC 9112 §3.2
    // wants 400 for any request with an invalid Host.
    if f.host.is_some_and(|h| !is_valid_host(h)) {
        return Parsed::Rejected(HOST_INVALID);
    }
    if version == Version::Http11 && f.hosts == 0 {
        return Parsed::Rejected(HOST_MISSING);
    }
    let keep_alive = !f.close && (version == Version::Http11 || f.keep_alive);
    Parsed::Complete {
        request: Request {
            method,
            version,
            path,
            query,
            keep_alive,
            range: f.range,
            if_match: f.if_match,
            if_unmodified_since: f.if_unmodified_since,
            if_none_match: f.if_none_match,
            if_modified_since: f.if_modified_since,
            if_range: f.if_range,
            authorization: f.authorization,
            fields: fields.get(..fields_len).unwrap_or_default(),
            x_forwarded_for: f.x_forwarded_for,
            forwarded: f.forwarded,
            host: f.host.map(<[u8]>::trim_ascii).filter(|h| !h.is_empty()),
        },
        head_len: fields_start.saturating_add(fields_len),
    }
}

/// The one value of `name` in `query` (raw, not percent-decoded); None when absent or
/// repeated (a repeated one is ambiguous).
pub fn query_param<'a>(query: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let mut found = None;
    for pair in query.split(|&b| b == b'&') {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[..0]),
        };
        if k == name.as_bytes() {
            if found.is_some() {
                return None;
            }
            found = Some(v);
        }
    }
    found
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Asserts the prefix property for `buf` at every split point and returns the full result.
    fn check_splits(buf: &[u8]) -> Parsed<'_> {
        check_splits_in(buf, 0..buf.len())
    }

    /// The prefix property for the prefixes of `buf` with lengths in `splits`: each is
    /// `Partial` or already the whole buffer's `Rejected`, or, once the head is in, the same
    /// `Complete`.
    fn check_splits_in(buf: &[u8], splits: std::ops::Range<usize>) -> Parsed<'_> {
        let full = parse_request(buf);
        for n in splits {
            let prefix = parse_request(&buf[..n]);
            match (&prefix, &full) {
                (Parsed::Partial, _) => {}
                (Parsed::Rejected(a), Parsed::Rejected(b)) if a == b => {}
                (Parsed::Complete { .. }, Parsed::Complete { .. }) if prefix == full => {}
                _ => panic!(
                    "prefix {n} of {:?} gives {prefix:?}, whole gives {full:?}",
                    String::from_utf8_lossy(buf)
                ),
            }
            if let Parsed::Complete { head_len, .. } = full {
                if n < head_len {
                    assert_eq!(prefix, Parsed::Partial, "prefix {n}");
                }
            }
        }
        full
    }

    fn complete(buf: &[u8]) -> (Request<'_>, usize) {
        match check_splits(buf) {
            Parsed::Complete { request, head_len } => (request, head_len),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
        }
    }

    fn rejected(buf: &[u8]) -> u16 {
        match check_splits(buf) {
            Parsed::Rejected(r) => r.status,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
        }
    }

    const GOOD: &[&str] = &[
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "GET /a/b.pak?v=3&x#frag HTTP/1.1\r\nHost: cdn.example\r\n\r\n",
        "GET /%2e%2e/ HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET http://cdn.example/p?q HTTP/1.1\r\nHost: cdn.example\r\n\r\n",
        "GET HTTPS://cdn.example HTTP/1.1\r\nHost: x\r\n\r\n",
        "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nhost:a\r\ncontent-length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\nX-Tab:\tv\t\r\nX-Obs: caf\u{e9}\r\n\r\n",
        "GET /big.bin HTTP/1.1\r\nHost: a\r\nRange: bytes=0-99\r\nIf-Range: \"e\"\r\n\
         If-None-Match: \"e\", W/\"f\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
         User-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
        "GET /caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: 127.0.0.1:80\r\n\r\n",
        "GET / HTTP/1.1\r\nHost:\r\n\r\n",
    ];

    #[test]
    fn good_requests_split_everywhere() {
        for req in GOOD {
            let (_, head_len) = complete(req.as_bytes());
            assert_eq!(head_len, req.len(), "{req:?}");
        }
    }

    #[test]
    fn host_syntax() {
        for good in [
            &b""[..],
            b"a",
            b"cdn.example.com",
            b"CDN.Example.COM.",
            b"cdn.example:8080",
            b"a:",
            b":80",
            b"127.0.0.1",
            b"999.1.1.1",
            b"10.0.0.1:443",
            b"xn--caf-dma.example",
            b"a%41b",
            b"a-b_c~d!$&'()*+,;=",
            b"[::1]",
            b"[::1]:8080",
            b"[2001:db8::ff00:42:8329]",
            b"[::ffff:192.0.2.1]:80",
            b"[v1.fe80::a+en1]",
            b"[V7.x]",
            b" a \t",
        ] {
            assert!(is_valid_host(good), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"a b"[..],
            b"a/b",
            b"a\\b",
            b"a?b",
            b"a#b",
            b"u@a",
            b"u:p@a",
            b"a:b",
            b"a:80:81",
            b"a:-1",
            b"a:8 0",
            b"a%",
            b"a%4",
            b"a%zz",
            b"a\tb",
            b"a\"b",
            b"a<b>",
            b"a[b]",
            b"caf\xc3\xa9",
            b"[::1",
            b"[::1]x",
            b"[::1]:x",
            b"[]",
            b"[zz]",
            b"[::1%25eth0]",
            b"[1.2.3.4]",
            b"[v.x]",
            b"[v1.]",
            b"[vg.x]",
            b"[v1.a/b]",
            b"::1",
            b"a]",
        ] {
            assert!(!is_valid_host(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn higher_http1_minor_versions_are_http11() {
        for minor in 2..=9 {
            let req = format!("GET / HTTP/1.{minor}\r\nHost: a\r\n\r\n");
            let (r, _) = complete(req.as_bytes());
            assert_eq!(r.version, Version::Http11, "{req:?}");
            assert!(r.keep_alive, "persistent by default, as 1.1");
            // And they need a Host, as 1.1 does.
            let no_host = format!("GET / HTTP/1.{minor}\r\n\r\n");
            assert_eq!(rejected(no_host.as_bytes()), 400);
        }
        for other in ["2.0", "2.1", "3.0", "0.9", "9.9"] {
            let req = format!("GET / HTTP/{other}\r\nHost: a\r\n\r\n");
            assert_eq!(rejected(req.as_bytes()), 505, "{req:?}");
        }
    }

    #[test]
    fn forwarding_headers_keep_every_line_up_to_the_bound() {
        let (r, _) = complete(
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.1.1.1\r\n\
              x-forwarded-for: 2.2.2.2, 10.0.0.1\r\nForwarded: for=3.3.3.3\r\n\r\n",
        );
        assert_eq!(
            r.x_forwarded_for.lines(),
            [&b"1.1.1.1"[..], &b"2.2.2.2, 10.0.0.1"[..]]
        );
        assert_eq!(r.forwarded.lines(), [&b"for=3.3.3.3"[..]]);
        let (r, _) = complete(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(r.x_forwarded_for.is_empty() && r.forwarded.is_empty());
        // Past the bound, the last lines stay (the hops nearest to us).
        let l = ListLines::of(&[b"a", b"b", b"c", b"d", b"e", b"f"]);
        assert_eq!(l.lines(), [&b"c"[..], b"d", b"e", b"f"]);
    }

    #[test]
    fn fields_are_extracted() {
        let (r, _) = complete(GOOD[14].as_bytes());
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.version, Version::Http11);
        assert_eq!(r.path, b"/big.bin");
        assert_eq!(r.query, None);
        assert!(r.keep_alive);
        assert_eq!(r.range, Some(&b"bytes=0-99"[..]));
        assert_eq!(r.if_range, Some(&b"\"e\""[..]));
        assert_eq!(r.if_none_match, Some(&b"\"e\", W/\"f\""[..]));
        assert_eq!(
            r.if_modified_since,
            Some(&b"Sun, 06 Nov 1994 08:49:37 GMT"[..])
        );

        let (r, _) = complete(
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-Match: \"e\", W/\"f\"\r\n\
              If-Unmodified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
        );
        assert_eq!(r.if_match, Some(&b"\"e\", W/\"f\""[..]));
        assert_eq!(
            r.if_unmodified_since,
            Some(&b"Sun, 06 Nov 1994 08:49:37 GMT"[..])
        );
        assert_eq!((r.if_none_match, r.if_modified_since), (None, None));

        let (r, _) = complete(GOOD[3].as_bytes());
        assert_eq!(r.path, b"/a/b.pak");
        assert_eq!(r.query, Some(&b"v=3&x"[..]));
        assert_eq!(r.range, None);

        let (r, _) = complete(b"GET /a#x?y HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!((r.path, r.query), (&b"/a"[..], None));
        let (r, _) = complete(b"GET /a? HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!((r.path, r.query), (&b"/a"[..], Some(&b""[..])));

        let (r, _) = complete(GOOD[1].as_bytes());
        assert_eq!(r.method, Method::Head);
        assert_eq!(r.path, b"/x");
    }

    #[test]
    fn absolute_form_keeps_only_path() {
        let (r, _) = complete(GOOD[5].as_bytes());
        assert_eq!((r.path, r.query), (&b"/p"[..], Some(&b"q"[..])));
        let (r, _) = complete(GOOD[6].as_bytes());
        assert_eq!((r.path, r.query), (&b"/"[..], None));
        let (r, _) = complete(b"GET http://h?x HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!((r.path, r.query), (&b"/"[..], Some(&b"x"[..])));
    }

    #[test]
    fn keep_alive_rules() {
        let ka = |s: &str| complete(s.as_bytes()).0.keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, CLOSE\r\n\r\n"
        ));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\nConnection: keep-alivex\r\n\r\n"));
    }

    /// (request, expected status) for every shape we refuse.
    const BAD: &[(&[u8], u16)] = &[
        // Methods.
        (b"POST / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"PUT / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"DELETE / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"PATCH / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"TRACE / HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 405),
        (b"PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n", 501),
        (b"get / HTTP/1.1\r\nHost: a\r\n\r\n", 501),
        (b"BREW / HTTP/1.1\r\nHost: a\r\n\r\n", 501),
        (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b" / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
        // Versions.
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"GET / HTTP/0.9\r\n\r\n", 505),
        (b"GET / HTTP/3.0\r\n\r\n", 505),
        (b"GET /\r\n", 400),
        (b"GET /\n", 400),
        (b"GET / HTTP/1.1x\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/11\r\nHost: a\r\n\r\n", 400),
        (b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/2\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400),
        // Request-line shape.
        (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\rHost: a\r\n\r\n", 400),
        (b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /a\rb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        // Targets.
        (b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET ftp://a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET http:///b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        // Leading empty lines.
        (
            b"\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        ),
        (b"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        // Header section shape.
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\tz\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\n: v\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\n", 400),
        (b"GET / HTTP/1.1\r\n\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\nb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x1bb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX\x00: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400),
        // Body framing.
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\ntransfer-encoding:\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 00\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 0\r\n\r\n",
            400,
        ),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
            400,
        ),
        // Host.
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-Host: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost: a/b\r\n\r\n", 400),
        (b"GET http://a/ HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a:b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400),
        // Duplicated singleton fields.
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-Range: \"a\"\r\nIf-Range: \"b\"\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-None-Match: \"a\"\r\nif-none-match: \"b\"\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-Modified-Since: x\r\nIf-Modified-Since: y\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-Match: \"a\"\r\nIf-Match: \"b\"\r\n\r\n",
            400,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nIf-Unmodified-Since: x\r\nif-unmodified-since: y\r\n\r\n",
            400,
        ),
    ];

    #[test]
    fn bad_requests_split_everywhere() {
        for (req, status) in BAD {
            assert_eq!(
                rejected(req),
                *status,
                "{:?} -> {:?}",
                String::from_utf8_lossy(req),
                parse_request(req)
            );
        }
    }

    #[test]
    fn obviously_bad_bytes_are_refused_early() {
        // A TLS ClientHello or binary junk is refused at its first byte, not after 8 KiB.
        assert_eq!(rejected(b"\x16"), 400);
        assert_eq!(rejected(b"GET /\x00"), 400);
        assert_eq!(rejected(b"GET / HTTP/1.1\r\nHost: a\r\nX: \x00"), 400);
    }

    #[test]
    fn request_line_limit() {
        let line = |target_len: usize| {
            let mut v = b"GET /".to_vec();
            v.resize(4 + target_len, b'a');
            v.extend_from_slice(b" HTTP/1.1");
            v
        };
        // "GET " + target + " HTTP/1.1" = 13 + target bytes of content.
        let exact = line(MAX_REQUEST_LINE_BYTES - 13);
        assert_eq!(exact.len(), MAX_REQUEST_LINE_BYTES);
        let mut req = exact.clone();
        req.extend_from_slice(b"\r\nHost: a\r\n\r\n");
        assert!(matches!(parse_request(&req), Parsed::Complete { .. }));
        // One byte more: 414, also before the CRLF ever arrives.
        let long = line(MAX_REQUEST_LINE_BYTES - 12);
        assert_eq!(
            parse_request(&long),
            Parsed::Rejected(LINE_TOO_LONG),
            "no CRLF yet"
        );
        let mut req = long.clone();
        req.extend_from_slice(b"\r\nHost: a\r\n\r\n");
        let near_limit = MAX_REQUEST_LINE_BYTES - 16..req.len();
        assert_eq!(
            check_splits_in(&req, near_limit),
            Parsed::Rejected(LINE_TOO_LONG)
        );
        let mut req = exact.clone();
        req.extend_from_slice(b"\r\nHost: a\r\n\r\n");
        let near_limit = MAX_REQUEST_LINE_BYTES - 16..req.len();
        assert!(matches!(
            check_splits_in(&req, near_limit),
            Parsed::Complete { .. }
        ));
        // A target that never ends.
        let endless = line(MAX_REQUEST_LINE_BYTES * 2);
        assert_eq!(
            parse_request(&endless[..MAX_REQUEST_LINE_BYTES + 1]),
            Parsed::Rejected(LINE_TOO_LONG)
        );
        assert_eq!(
            parse_request(&endless[..MAX_REQUEST_LINE_BYTES]),
            Parsed::Partial
        );
        // Leading empty lines do not count against the line.
        let mut req = b"\r\n\r\n".to_vec();
        req.extend_from_slice(&exact);
        req.extend_from_slice(b"\r\nHost: a\r\n\r\n");
        assert!(matches!(parse_request(&req), Parsed::Complete { .. }));
    }

    #[test]
    fn head_limit() {
        let mut req = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        let pad_to = |req: &mut Vec<u8>, total: usize| {
            // One big field filling the head to exactly `total` bytes with the final CRLF.
            let room = total - req.len() - b"X: \r\n\r\n".len();
            req.extend_from_slice(b"X: ");
            req.extend(std::iter::repeat_n(b'v', room));
            req.extend_from_slice(b"\r\n\r\n");
        };
        let mut exact = req.clone();
        pad_to(&mut exact, MAX_HEAD_BYTES);
        assert_eq!(exact.len(), MAX_HEAD_BYTES);
        match parse_request(&exact) {
            Parsed::Complete { head_len, .. } => assert_eq!(head_len, MAX_HEAD_BYTES),
            other => panic!("{other:?}"),
        }
        let near_limit = MAX_HEAD_BYTES - 16..exact.len();
        assert!(matches!(
            check_splits_in(&exact, near_limit),
            Parsed::Complete { .. }
        ));
        pad_to(&mut req, MAX_HEAD_BYTES + 1);
        let near_limit = MAX_HEAD_BYTES - 16..req.len();
        assert_eq!(
            check_splits_in(&req, near_limit),
            Parsed::Rejected(HEAD_TOO_LARGE)
        );
        // Decided as soon as the limit is passed, without the rest.
        assert_eq!(
            parse_request(&req[..MAX_HEAD_BYTES + 1]),
            Parsed::Rejected(HEAD_TOO_LARGE)
        );
        assert_eq!(parse_request(&req[..MAX_HEAD_BYTES]), Parsed::Partial);
    }

    #[test]
    fn header_count_limit() {
        let with = |n: usize| {
            let mut req = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
            for i in 1..n {
                req.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
            }
            req.extend_from_slice(b"\r\n");
            req
        };
        let max = with(MAX_HEADER_COUNT);
        assert!(matches!(check_splits(&max), Parsed::Complete { .. }));
        let over = with(MAX_HEADER_COUNT + 1);
        assert_eq!(rejected(&over), 431);
        assert_eq!(parse_request(&over), Parsed::Rejected(TOO_MANY_HEADERS));
    }

    #[test]
    fn pipelined_requests_parse_one_after_another() {
        let a = "GET /first HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\n\r\n";
        let b = "\r\nHEAD /second?x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        let c = "GET /third";
        let all = format!("{a}{b}{c}");
        let Parsed::Complete { request, head_len } = parse_request(all.as_bytes()) else {
            panic!()
        };
        assert_eq!((request.path, head_len), (&b"/first"[..], a.len()));
        let rest = &all.as_bytes()[head_len..];
        let Parsed::Complete { request, head_len } = parse_request(rest) else {
            panic!()
        };
        assert_eq!(request.method, Method::Head);
        assert_eq!(request.path, b"/second");
        assert!(!request.keep_alive);
        assert_eq!(request.range, None);
        assert_eq!(head_len, b.len());
        assert_eq!(parse_request(&rest[head_len..]), Parsed::Partial);

        // Whatever follows a complete head does not change how it parses.
        for req in GOOD {
            let want = parse_request(req.as_bytes());
            for junk in [&b"\x00\xff"[..], b"\n\n\n", b"POST / HTTP/9.9\r\n"] {
                let mut buf = req.as_bytes().to_vec();
                buf.extend_from_slice(junk);
                assert_eq!(parse_request(&buf), want);
            }
        }
    }

    /// A request built from pieces that are each sometimes valid, sometimes not.
    pub(in crate::http) fn request_strategy() -> impl Strategy<Value = Vec<u8>> {
        let lead = prop_oneof![
            Just(""),
            Just("\r\n"),
            Just("\n"),
            Just("\r\n\r\n\r\n\r\n\r\n")
        ];
        let method = prop_oneof![
            Just("GET"),
            Just("HEAD"),
            Just("POST"),
            Just("FOO"),
            Just("G T"),
            Just("")
        ];
        let target = prop_oneof![
            Just("/"),
            Just("/a?b#c"),
            Just("*"),
            Just("http://h/p"),
            Just("/\x00"),
            Just("/a b"),
            Just("")
        ];
        let version = prop_oneof![
            Just(" HTTP/1.1"),
            Just(" HTTP/1.0"),
            Just(" HTTP/2.0"),
            Just(" HTTX/1.1"),
            Just(""),
            Just(" HTTP/1.1 ")
        ];
        let eol = prop_oneof![Just("\r\n"), Just("\n"), Just("\r"), Just("\r\r\n")];
        let field = prop_oneof![
            Just("Host: a"),
            Just("Host: b"),
            Just("Content-Length: 0"),
            Just("Content-Length: 1"),
            Just("Transfer-Encoding: chunked"),
            Just("Connection: close"),
            Just("Range: bytes=0-1"),
            Just(" folded"),
            Just("X: \x01"),
            Just("X : y"),
            Just("X: caf\u{e9}"),
            Just(""),
        ];
        let fields = proptest::collection::vec((field, eol.clone()), 0..6);
        (lead, method, target, version, eol.clone(), fields, eol).prop_map(
            |(lead, m, t, v, e, fields, end)| {
                let mut s = format!("{lead}{m} {t}{v}{e}");
                for (f, e) in fields {
                    s.push_str(f);
                    s.push_str(e);
                }
                s.push_str(end);
                s.into_bytes()
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn structured_requests_are_prefix_consistent(req in request_strategy()) {
            let _ = check_splits(&req);
        }

        #[test]
        fn arbitrary_bytes_are_prefix_consistent(
            req in proptest::collection::vec(
                prop_oneof![any::<u8>(), Just(b'\r'), Just(b'\n'), Just(b' '), Just(b'/')], 0..48)
        ) {
            let _ = check_splits(&req);
        }

        #[test]
        fn complete_heads_are_well_formed(req in request_strategy()) {
            if let Parsed::Complete { request, head_len } = parse_request(&req) {
                prop_assert!(head_len <= req.len() && head_len <= MAX_HEAD_BYTES);
                prop_assert!(req[..head_len].ends_with(b"\r\n\r\n"));
                prop_assert!(request.path.starts_with(b"/"));
            }
        }
    }
}
