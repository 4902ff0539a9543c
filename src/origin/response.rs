//! An origin's response head, and what a fill may do with it.
//!
//! A fill asks for a run of blocks (`Range: bytes=a-b`) of the version it believes in (its
//! size and ETag, if it has them). The origin may answer 206 with that run, 200 with the whole
//! object (an origin that ignores Range: the whole object is used), 304 to a revalidation, or
//! something else. `judge` says which, and refuses everything that could mix bytes of two
//! versions: another size, another ETag, a range other than the one asked for, or a body
//! whose length the head does not give.

/// Longest origin response head read.
pub const MAX_RESPONSE_HEAD_BYTES: usize = 16 * 1024;
/// Most header fields read from an origin's response.
pub const MAX_RESPONSE_HEADERS: usize = 64;
/// Longest pause an origin's `Retry-After` can ask of the edge (longer asks are cut to it, so
/// a wrong date cannot stop an origin's fills for days).
pub const MAX_ORIGIN_PAUSE_S: u64 = 300;

/// A `Retry-After` value (RFC 9110 10.2.3): seconds from now, or an HTTP-date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// `delay-seconds`.
    Seconds(u64),
    /// An HTTP-date, in seconds since the Unix epoch.
    Date(i64),
}

impl RetryAfter {
    /// Parses a `Retry-After` value; None for anything else (the field is then ignored).
    pub fn parse(value: &str) -> Option<RetryAfter> {
        let v = value.trim();
        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            // More digits than a u64 holds is a very long wait: the cap applies.
            return Some(RetryAfter::Seconds(v.parse().unwrap_or(u64::MAX)));
        }
        crate::http::date::parse_http_date(v.as_bytes()).map(RetryAfter::Date)
    }

    /// Seconds to wait from `now_unix_s`, at most `MAX_ORIGIN_PAUSE_S` (a date in the past:
    /// 0).
    pub fn seconds_from(self, now_unix_s: i64) -> u64 {
        let s = match self {
            RetryAfter::Seconds(s) => s,
            RetryAfter::Date(at) => u64::try_from(at.saturating_sub(now_unix_s)).unwrap_or(0),
        };
        s.min(MAX_ORIGIN_PAUSE_S)
    }
}

/// `Content-Range: bytes first-last/total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte.
    pub first: u64,
    /// Last byte (inclusive).
    pub last: u64,
    /// The object's size (None: `*`, unknown).
    pub total: Option<u64>,
}

/// Most interim (1xx) responses skipped before the final one (RFC 9110 §15.2); they count
/// against `MAX_RESPONSE_HEAD_BYTES` too.
pub const MAX_INTERIM_RESPONSES: usize = 8;

/// How the reply's body is framed (RFC 9112 §6.3), decided once from the whole head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body whatever the fields say: 204 and 304.
    NoBody,
    /// Exactly this many bytes (Content-Length).
    Length(u64),
    /// Chunked (the last transfer coding): the length is not in the head.
    Chunked,
    /// Neither field: the body runs until the origin closes.
    UntilClose,
}

/// The fields of an origin's response head a fill uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginHead<'a> {
    /// Status code of the final response (interim 1xx ones skipped).
    pub status: u16,
    /// Bytes of the head, interim responses included (the body starts here).
    pub head_len: usize,
    /// How the body is framed.
    pub framing: Framing,
    /// Content-Range (206).
    pub content_range: Option<ContentRange>,
    /// ETag.
    pub etag: Option<&'a str>,
    /// Last-Modified.
    pub last_modified: Option<&'a str>,
    /// Content-Type.
    pub content_type: Option<&'a str>,
    /// The connection may carry the next fetch.
    pub keep_alive: bool,
    /// `Retry-After`, when it parses.
    pub retry_after: Option<RetryAfter>,
}

impl OriginHead<'_> {
    /// The body's length when the head gives it (Content-Length, or 0 for 204/304).
    pub fn content_length(&self) -> Option<u64> {
        match self.framing {
            Framing::NoBody => Some(0),
            Framing::Length(n) => Some(n),
            Framing::Chunked | Framing::UntilClose => None,
        }
    }
}

/// Why a head was refused: one reason per refusal, each counted
/// (`shardline_origin_replies_refused_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// Not an HTTP/1.x response head (or a 101, which a fetch never asks for).
    Malformed,
    /// Longer than `MAX_RESPONSE_HEAD_BYTES`, or more fields than `MAX_RESPONSE_HEADERS`.
    TooLarge,
    /// A Content-Length that is not `1*DIGIT`, or two that disagree.
    BadLength,
    /// A Transfer-Encoding whose last coding is not `chunked` (the body's end would be the
    /// close, which a fetch never relies on), or an empty one.
    BadTransferEncoding,
    /// Both Transfer-Encoding and Content-Length (RFC 9112 §6.3: a smuggling signature).
    LengthAndTransferEncoding,
    /// A Content-Range that does not parse, or more than one.
    BadContentRange,
    /// More than `MAX_INTERIM_RESPONSES` interim (1xx) responses.
    TooManyInterim,
}

impl HeadError {
    /// Every reason, in the order of `label` (the metrics' array index).
    pub const ALL: [HeadError; 7] = [
        HeadError::Malformed,
        HeadError::TooLarge,
        HeadError::BadLength,
        HeadError::BadTransferEncoding,
        HeadError::LengthAndTransferEncoding,
        HeadError::BadContentRange,
        HeadError::TooManyInterim,
    ];

    /// The metric label of this reason.
    pub fn label(self) -> &'static str {
        match self {
            HeadError::Malformed => "malformed",
            HeadError::TooLarge => "too_large",
            HeadError::BadLength => "bad_content_length",
            HeadError::BadTransferEncoding => "bad_transfer_encoding",
            HeadError::LengthAndTransferEncoding => "length_and_transfer_encoding",
            HeadError::BadContentRange => "bad_content_range",
            HeadError::TooManyInterim => "too_many_interim",
        }
    }

    /// This reason's index in `ALL`.
    pub fn index(self) -> usize {
        HeadError::ALL
            .iter()
            .position(|&e| e == self)
            .expect("every reason is in ALL")
    }
}

/// Whether the bytes `buf[scanned..]`, just received after `scanned` bytes that held no end of
/// a head, may end one: an empty line (`\n\n` or `\n\r\n`, httparse takes a bare LF in a
/// response) ending in them. Looks back two bytes and at the new ones only, so a head that
/// arrives one byte at a time costs linear time: the fetch parses only when this says so (or
/// the head buffer is full). A malformed head is then refused at its end or at the limit
/// instead of at its first bad byte, which for an origin changes nothing but when.
pub fn head_may_end(buf: &[u8], scanned: usize) -> bool {
    let from = scanned.saturating_sub(2);
    let window = buf.get(from..).unwrap_or_default();
    window
        .windows(2)
        .enumerate()
        .any(|(i, w)| w == b"\n\n" || (w == b"\n\r" && window.get(i + 2) == Some(&b'\n')))
}

/// Parses the head at the front of `buf`: None while it is incomplete. Interim (1xx)
/// responses before the final one are skipped; the body's framing is decided once, from every
/// field of the final head, and anything ambiguous is refused with its reason.
pub fn parse(buf: &[u8]) -> Result<Option<OriginHead<'_>>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut at = 0;
    let mut interim = 0;
    let (resp, head_len) = loop {
        let mut resp = httparse::Response::new(&mut fields);
        let n = match resp.parse(&buf[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_RESPONSE_HEAD_BYTES => {
                return Err(HeadError::TooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(_) => return Err(HeadError::Malformed),
        };
        if at + n > MAX_RESPONSE_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        match resp.code.ok_or(HeadError::Malformed)? {
            // A fetch never asks to switch protocols.
            101 => return Err(HeadError::Malformed),
            100..=199 => {
                interim += 1;
                if interim > MAX_INTERIM_RESPONSES {
                    return Err(HeadError::TooManyInterim);
                }
                at += n;
            }
            _ => break (resp, at + n),
        }
    };
    let status = resp.code.ok_or(HeadError::Malformed)?;
    let version = resp.version.ok_or(HeadError::Malformed)?;
    let mut head = OriginHead {
        status,
        head_len,
        framing: Framing::UntilClose,
        content_range: None,
        etag: None,
        last_modified: None,
        content_type: None,
        keep_alive: version == 1,
        retry_after: None,
    };
    let mut content_length: Option<u64> = None;
    // Transfer-Encoding fields combine into one list (RFC 9110 §5.3): its last coding, and
    // how often `chunked` appears in it.
    let mut codings: Option<(&str, usize)> = None;
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).map(str::trim);
        let name = h.name;
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("content-length") {
            let n = value
                .ok()
                .and_then(parse_digits)
                .ok_or(HeadError::BadLength)?;
            if content_length.is_some_and(|m| m != n) {
                return Err(HeadError::BadLength);
            }
            content_length = Some(n);
        } else if is("transfer-encoding") {
            let v = value.map_err(|_| HeadError::BadTransferEncoding)?;
            for coding in v.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                let (_, chunked) = codings.unwrap_or(("", 0));
                let chunked = chunked + usize::from(coding.eq_ignore_ascii_case("chunked"));
                codings = Some((coding, chunked));
            }
            if codings.is_none() {
                return Err(HeadError::BadTransferEncoding);
            }
        } else if is("content-range") && head.status == 206 {
            // It frames only a 206's body (RFC 9110 §14.4); on any other status it means
            // nothing here and is left alone.
            if head.content_range.is_some() {
                return Err(HeadError::BadContentRange);
            }
            head.content_range = Some(
                value
                    .ok()
                    .and_then(parse_content_range)
                    .ok_or(HeadError::BadContentRange)?,
            );
        } else if is("etag") {
            head.etag = value.ok();
        } else if is("last-modified") {
            head.last_modified = value.ok();
        } else if is("content-type") {
            head.content_type = value.ok();
        } else if is("retry-after") {
            head.retry_after = value.ok().and_then(RetryAfter::parse);
        } else if is("connection") {
            let v = value.unwrap_or("");
            if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")) {
                head.keep_alive = false;
            } else if v
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
            {
                head.keep_alive = true;
            }
        }
    }
    head.framing = match (codings, content_length) {
        (Some(_), Some(_)) => return Err(HeadError::LengthAndTransferEncoding),
        // Chunked exactly once, and last: anything else would end at the close, or is
        // nonsense (RFC 9112 §6.1, §6.3).
        (Some((last, 1)), None) if last.eq_ignore_ascii_case("chunked") => Framing::Chunked,
        (Some(_), None) => return Err(HeadError::BadTransferEncoding),
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::UntilClose,
    };
    if matches!(status, 204 | 304) {
        head.framing = Framing::NoBody;
    }
    Ok(Some(head))
}

/// `1*DIGIT` (Content-Length, RFC 9110 §8.6; the positions of a Content-Range, §14.4): no
/// sign, no list, no spaces inside, and it fits a u64.
fn parse_digits(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// `bytes first-last/total` (or `/*`).
fn parse_content_range(v: &str) -> Option<ContentRange> {
    let rest = v.strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last) = (parse_digits(first)?, parse_digits(last)?);
    let total = match total {
        "*" => None,
        t => Some(parse_digits(t)?),
    };
    (first <= last && total.is_none_or(|t| last < t)).then_some(ContentRange { first, last, total })
}

/// What the fill believes about the object when it asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect<'a> {
    /// The range asked for (first, last inclusive); None: the whole object.
    pub range: Option<(u64, u64)>,
    /// The size of the version being filled, once known.
    pub size: Option<u64>,
    /// The ETag of the version being filled, once known.
    pub etag: Option<&'a str>,
    /// The Last-Modified of the version being filled, once known (compared only when there
    /// is no ETag to compare).
    pub last_modified: Option<&'a str>,
    /// Any final status with a length is an answer to pass on (`Verdict::Answer`): a request
    /// the cache does not serve gets its origin's reply as it is.
    pub any_status: bool,
}

/// What a fill does with a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The body is bytes `first..=last` of an object of `total` bytes, as asked.
    Range {
        /// First byte.
        first: u64,
        /// Last byte (inclusive).
        last: u64,
        /// The object's size.
        total: u64,
    },
    /// The body is the whole object of `size` bytes (no range asked, or the origin ignored it:
    /// the whole object is used).
    Whole {
        /// The object's size.
        size: u64,
    },
    /// 304: the version is still good.
    NotModified,
    /// Another final status, for a fetch that passes any on (`Expect::any_status`): its body
    /// is `size` bytes.
    Answer {
        /// The origin's status.
        status: u16,
        /// The body's length.
        size: u64,
    },
    /// The object is not the version being filled (another size or ETag): the fill stops and
    /// a new version begins; no byte of this response joins the old one.
    VersionChanged,
    /// The origin refused (status), or its answer cannot be used (no length, a transfer
    /// coding, another range than asked): the fill is retried or the client gets an error.
    Unusable(Unusable),
}

/// Why a response cannot be used for a fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// A status other than 200, 206 or 304 (the status is passed on).
    Status(u16),
    /// The body's length is not given by Content-Length (or the response is transfer-coded).
    NoLength,
    /// A 206 for another range than asked, or without a usable Content-Range.
    WrongRange,
    /// An object the cache cannot record (more blocks than `MAX_BLOCKS_PER_OBJECT`, or a
    /// key or field over its bound): refused before anything of it is journaled.
    Uncacheable,
    /// 429 or 503 with a `Retry-After`: the origin asks the edge to wait before its next
    /// fetch (fills to it pause; this one is tried again after the pause).
    Throttled {
        /// 429 or 503.
        status: u16,
        /// How long.
        retry_after: RetryAfter,
    },
}

/// Judges `head` against what the fill expected.
pub fn judge(head: &OriginHead<'_>, expect: &Expect<'_>) -> Verdict {
    if head.status == 304 {
        return Verdict::NotModified;
    }
    if head.status != 200 && head.status != 206 {
        if let (true, Some(size)) = (expect.any_status, head.content_length()) {
            return Verdict::Answer {
                status: head.status,
                size,
            };
        }
        if let (429 | 503, Some(retry_after)) = (head.status, head.retry_after) {
            return Verdict::Unusable(Unusable::Throttled {
                status: head.status,
                retry_after,
            });
        }
        return Verdict::Unusable(Unusable::Status(head.status));
    }
    if let (Some(want), Some(got)) = (expect.etag, head.etag) {
        if want != got {
            return Verdict::VersionChanged;
        }
    } else if let (Some(want), Some(got)) = (expect.last_modified, head.last_modified) {
        if want != got {
            return Verdict::VersionChanged;
        }
    }
    let Framing::Length(len) = head.framing else {
        return Verdict::Unusable(Unusable::NoLength);
    };
    let size = if head.status == 200 {
        len
    } else {
        let Some(cr) = head.content_range else {
            return Verdict::Unusable(Unusable::WrongRange);
        };
        let Some(total) = cr.total else {
            return Verdict::Unusable(Unusable::WrongRange);
        };
        if cr.last - cr.first + 1 != len {
            return Verdict::Unusable(Unusable::WrongRange);
        }
        total
    };
    if expect.size.is_some_and(|s| s != size) {
        return Verdict::VersionChanged;
    }
    if head.status == 200 {
        return Verdict::Whole { size };
    }
    let cr = head.content_range.expect("checked above");
    match expect.range {
        Some((first, last)) if (cr.first, cr.last) == (first, last.min(size.saturating_sub(1))) => {
            Verdict::Range {
                first: cr.first,
                last: cr.last,
                total: size,
            }
        }
        _ => Verdict::Unusable(Unusable::WrongRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Fed in pieces the way the fetch does (parse only when `head_may_end` says so), a
        /// head is found at the same receive as parsing every time would find it, and the
        /// parser never panics on what an origin sends.
        #[test]
        fn a_head_is_never_missed_by_the_end_scan(
            status in prop_oneof![Just("HTTP/1.1 206 Partial Content"), Just("HTTP/1.0 200 OK"),
                                  Just("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"),
                                  Just("HTTP/1.1 304 Not Modified"), Just("HTTP/9 x"), Just("")],
            fields in proptest::collection::vec(prop_oneof![
                Just("Content-Length: 10"), Just("Content-Range: bytes 0-9/10"),
                Just("ETag: \"v\""), Just("Connection: close"), Just("X: y"), Just(""),
                Just("Bad Field"), Just("Content-Length: x"), Just("Transfer-Encoding: chunked"),
                Just("Content-Length: +10"), Just("Transfer-Encoding: identity")], 0..6),
            eol in prop_oneof![Just("\r\n"), Just("\n")],
            junk in proptest::collection::vec(any::<u8>(), 0..20),
            cuts in proptest::collection::vec(0usize..200, 0..10),
        ) {
            let mut text = format!("{status}{eol}");
            for f in &fields {
                text.push_str(f);
                text.push_str(eol);
            }
            text.push_str(eol);
            let mut buf = text.into_bytes();
            buf.extend_from_slice(&junk);
            let mut ends: Vec<usize> = cuts.iter().map(|&c| c.min(buf.len())).collect();
            ends.push(buf.len());
            ends.sort_unstable();
            ends.dedup();
            let mut scanned = 0;
            for end in ends {
                let prefix = &buf[..end];
                let every_time = parse(prefix);
                if head_may_end(prefix, scanned) {
                    prop_assert_eq!(parse(prefix), every_time);
                    if !matches!(every_time, Ok(None)) {
                        break;
                    }
                } else {
                    // Skipping the parse may only delay an error, never a head.
                    prop_assert!(!matches!(every_time, Ok(Some(_))), "head missed at {}", end);
                }
                scanned = end;
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_origin_head_parser(
            buf in proptest::collection::vec(
                prop_oneof![any::<u8>(), Just(b'\r'), Just(b'\n'), Just(b':'), Just(b' ')], 0..300)
        ) {
            let _ = parse(&buf);
            let _ = head_may_end(&buf, buf.len() / 2);
        }
    }

    #[test]
    fn the_end_scan_sees_an_end_split_anywhere() {
        let h = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n";
        for cut in 0..h.len() {
            let found_before = head_may_end(&h[..cut], 0);
            let found_after = head_may_end(h, cut);
            assert!(found_before || found_after, "cut at {cut}");
        }
        assert!(!head_may_end(b"HTTP/1.1 200 OK\r\nX: y\r\n", 0));
        assert!(head_may_end(b"HTTP/1.0 200 OK\n\n", 17));
    }

    fn head(text: &str) -> OriginHead<'_> {
        parse(text.as_bytes()).unwrap().expect("complete")
    }

    const ASK: Expect<'static> = Expect {
        range: Some((1048576, 2097151)),
        size: Some(10 << 20),
        etag: Some("\"v1\""),
        last_modified: None,
        any_status: false,
    };

    #[test]
    fn a_206_for_the_asked_range_is_used_and_anything_else_is_not() {
        let ok = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                  Content-Range: bytes 1048576-2097151/10485760\r\nETag: \"v1\"\r\n\r\n";
        let h = head(ok);
        assert_eq!(h.head_len, ok.len());
        assert!(h.keep_alive);
        assert_eq!(
            judge(&h, &ASK),
            Verdict::Range {
                first: 1048576,
                last: 2097151,
                total: 10 << 20
            }
        );
        // Another range than asked.
        let other = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                     Content-Range: bytes 0-1048575/10485760\r\n\r\n";
        assert_eq!(
            judge(&head(other), &ASK),
            Verdict::Unusable(Unusable::WrongRange)
        );
        // A length that does not match the range.
        let short = "HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\
                     Content-Range: bytes 1048576-2097151/10485760\r\n\r\n";
        assert_eq!(
            judge(&head(short), &ASK),
            Verdict::Unusable(Unusable::WrongRange)
        );
        // The last run of a shorter tail: asked past the end, given up to it.
        let tail = Expect {
            range: Some((9 << 20, (11 << 20) - 1)),
            ..ASK
        };
        let h = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                 Content-Range: bytes 9437184-10485759/10485760\r\n\r\n";
        assert!(matches!(judge(&head(h), &tail), Verdict::Range { .. }));
    }

    #[test]
    fn a_200_to_a_range_request_is_the_whole_object() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 10485760\r\nETag: \"v1\"\r\n\r\n");
        assert_eq!(judge(&h, &ASK), Verdict::Whole { size: 10 << 20 });
    }

    #[test]
    fn another_size_or_etag_is_another_version_never_mixed_in() {
        let bigger = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                      Content-Range: bytes 1048576-2097151/20971520\r\n\r\n";
        assert_eq!(judge(&head(bigger), &ASK), Verdict::VersionChanged);
        let other_tag = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                         Content-Range: bytes 1048576-2097151/10485760\r\nETag: \"v2\"\r\n\r\n";
        assert_eq!(judge(&head(other_tag), &ASK), Verdict::VersionChanged);
        let whole = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(judge(&head(whole), &ASK), Verdict::VersionChanged);
        // No ETag on either side: a new Last-Modified is a new version; the same one is not.
        let dated = Expect {
            etag: None,
            last_modified: Some("Tue, 01 Dec 2026 10:00:00 GMT"),
            ..ASK
        };
        let newer = "HTTP/1.1 206 Partial Content\r\nContent-Length: 1048576\r\n\
                     Content-Range: bytes 1048576-2097151/10485760\r\n\
                     Last-Modified: Wed, 02 Dec 2026 10:00:00 GMT\r\n\r\n";
        assert_eq!(judge(&head(newer), &dated), Verdict::VersionChanged);
        let same = newer.replace("Wed, 02", "Tue, 01");
        assert!(matches!(judge(&head(&same), &dated), Verdict::Range { .. }));
    }

    #[test]
    fn statuses_lengths_and_codings_the_fill_cannot_use() {
        let cases = [
            (
                "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n",
                Verdict::NotModified,
            ),
            (
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                Verdict::Unusable(Unusable::Status(404)),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                Verdict::Unusable(Unusable::NoLength),
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                Verdict::Unusable(Unusable::NoLength),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(judge(&head(text), &ASK), want, "{text:?}");
        }
    }

    #[test]
    fn a_429_or_503_with_retry_after_asks_the_edge_to_wait() {
        let throttled = |status: u16, retry_after: RetryAfter| {
            Verdict::Unusable(Unusable::Throttled {
                status,
                retry_after,
            })
        };
        let cases = [
            (
                "HTTP/1.1 429 Too Many\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n",
                throttled(429, RetryAfter::Seconds(2)),
            ),
            (
                "HTTP/1.1 503 Busy\r\nRetry-After: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
                throttled(503, RetryAfter::Date(784_111_777)),
            ),
            (
                "HTTP/1.1 429 Too Many\r\nContent-Length: 0\r\n\r\n",
                Verdict::Unusable(Unusable::Status(429)),
            ),
            (
                "HTTP/1.1 429 Too Many\r\nRetry-After: soon\r\n\r\n",
                Verdict::Unusable(Unusable::Status(429)),
            ),
            (
                "HTTP/1.1 500 Oops\r\nRetry-After: 2\r\n\r\n",
                Verdict::Unusable(Unusable::Status(500)),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(judge(&head(text), &ASK), want, "{text:?}");
        }
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_bounded() {
        assert_eq!(RetryAfter::parse(" 7 "), Some(RetryAfter::Seconds(7)));
        assert_eq!(RetryAfter::parse("-1"), None);
        assert_eq!(RetryAfter::parse(""), None);
        assert_eq!(RetryAfter::parse("1.5"), None);
        let huge = RetryAfter::parse("99999999999999999999999").unwrap();
        assert_eq!(huge.seconds_from(0), MAX_ORIGIN_PAUSE_S);
        assert_eq!(RetryAfter::Seconds(7).seconds_from(123), 7);
        let at = RetryAfter::parse("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(at.seconds_from(784_111_777 - 60), 60);
        assert_eq!(at.seconds_from(784_111_777 + 60), 0, "a date past");
        assert_eq!(at.seconds_from(0), MAX_ORIGIN_PAUSE_S, "capped");
    }

    /// The framing decision (RFC 9112 §6.3, RFC 9110 §5.3, §15.2): one per head, with a reason
    /// per refusal.
    #[test]
    fn framing_is_strict_and_each_refusal_has_its_reason() {
        let ok = |text: &str| parse(text.as_bytes()).map(|h| h.map(|h| h.framing));
        let h = |fields: &str| format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
        let cases: &[(&str, Result<Option<Framing>, HeadError>)] = &[
            ("Content-Length: 3000\r\n", Ok(Some(Framing::Length(3000)))),
            ("Content-Length: +3000\r\n", Err(HeadError::BadLength)),
            ("Content-Length: -1\r\n", Err(HeadError::BadLength)),
            ("Content-Length: 3 000\r\n", Err(HeadError::BadLength)),
            ("Content-Length: 30, 30\r\n", Err(HeadError::BadLength)),
            ("Content-Length: 0x10\r\n", Err(HeadError::BadLength)),
            ("Content-Length: \r\n", Err(HeadError::BadLength)),
            (
                "Content-Length: 99999999999999999999999\r\n",
                Err(HeadError::BadLength),
            ),
            (
                "Content-Length: 30\r\nContent-Length: 30\r\n",
                Ok(Some(Framing::Length(30))),
            ),
            (
                "Content-Length: 30\r\nContent-Length: 31\r\n",
                Err(HeadError::BadLength),
            ),
            ("Transfer-Encoding: chunked\r\n", Ok(Some(Framing::Chunked))),
            ("Transfer-Encoding: gzip, CHUNKED\r\n", Ok(Some(Framing::Chunked))),
            (
                "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                Ok(Some(Framing::Chunked)),
            ),
            // The last coding is not chunked: the body would end at the close.
            ("Transfer-Encoding: identity\r\n", Err(HeadError::BadTransferEncoding)),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                Err(HeadError::BadTransferEncoding),
            ),
            (
                "Transfer-Encoding: chunked, chunked\r\n",
                Err(HeadError::BadTransferEncoding),
            ),
            ("Transfer-Encoding: ,\r\n", Err(HeadError::BadTransferEncoding)),
            (
                "Transfer-Encoding: identity\r\nContent-Length: 16\r\n",
                Err(HeadError::LengthAndTransferEncoding),
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nContent-Length: 1000\r\n",
                Err(HeadError::LengthAndTransferEncoding),
            ),
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                Err(HeadError::LengthAndTransferEncoding),
            ),
            ("", Ok(Some(Framing::UntilClose))),
            // Content-Range frames only a 206 (below): on a 200 it is left alone.
            ("Content-Range: ananananananana\r\n", Ok(Some(Framing::UntilClose))),
        ];
        for (fields, want) in cases {
            assert_eq!(ok(&h(fields)), *want, "{fields:?}");
        }
        let partial = |fields: &str| format!("HTTP/1.1 206 Partial Content\r\n{fields}\r\n");
        for fields in [
            "Content-Range: bytes 0-9/20\r\nContent-Range: bytes 10-19/20\r\n",
            "Content-Range: bytes +0-9/20\r\n",
            "Content-Range: bytes 0 - 9/20\r\n",
            "Content-Range: ananananananana\r\n",
        ] {
            assert_eq!(
                ok(&partial(fields)),
                Err(HeadError::BadContentRange),
                "{fields:?}"
            );
        }
        // 204 and 304 have no body, whatever their fields say.
        let not_modified = "HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n";
        assert_eq!(ok(not_modified), Ok(Some(Framing::NoBody)));
        assert_eq!(head(not_modified).content_length(), Some(0));
        let no_content = "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(ok(no_content), Ok(Some(Framing::NoBody)));
        // Every reason has its own label.
        let labels: std::collections::HashSet<_> =
            HeadError::ALL.iter().map(|e| e.label()).collect();
        assert_eq!(labels.len(), HeadError::ALL.len());
        for (i, e) in HeadError::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
        }
    }

    #[test]
    fn interim_replies_are_skipped_and_bounded() {
        let last = "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\
                    Content-Range: bytes 0-9/100\r\n\r\n";
        for interim in [
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n",
        ] {
            let text = format!("{interim}{last}body");
            let h = head(&text);
            assert_eq!((h.status, h.framing), (206, Framing::Length(10)));
            assert_eq!(h.head_len, interim.len() + last.len());
            // Only the interim reply arrived so far: not complete yet.
            assert_eq!(parse(interim.as_bytes()), Ok(None));
        }
        let many = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM_RESPONSES);
        assert!(matches!(
            parse(format!("{many}{last}").as_bytes()),
            Ok(Some(_))
        ));
        let too_many = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM_RESPONSES + 1);
        assert_eq!(
            parse(format!("{too_many}{last}").as_bytes()),
            Err(HeadError::TooManyInterim)
        );
        assert_eq!(
            parse(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"),
            Err(HeadError::Malformed)
        );
    }

    #[test]
    fn heads_are_bounded_and_checked() {
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\nContent-Le"), Ok(None));
        assert_eq!(parse(b"garbage\r\n\r\n"), Err(HeadError::Malformed));
        let two = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
        assert_eq!(parse(two.as_bytes()), Err(HeadError::BadLength));
        let bad_range = "HTTP/1.1 206 P\r\nContent-Range: bytes 9-3/10\r\n\r\n";
        assert_eq!(parse(bad_range.as_bytes()), Err(HeadError::BadContentRange));
        let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long.resize(MAX_RESPONSE_HEAD_BYTES + 10, b'a');
        assert_eq!(parse(&long), Err(HeadError::TooLarge));
        let many: String = (0..MAX_RESPONSE_HEADERS + 1)
            .map(|i| format!("X-{i}: 1\r\n"))
            .collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(parse(text.as_bytes()), Err(HeadError::TooLarge));
        // HTTP/1.0 closes unless told otherwise; Connection: close always does.
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(head("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(!head("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n").keep_alive);
        assert_eq!(
            parse_content_range("bytes 0-9/*"),
            Some(ContentRange {
                first: 0,
                last: 9,
                total: None
            })
        );
    }
}
