//! Incremental scan of a request head: tells the shard when `parse_request` can say more
//! than `Partial`, so each received byte is looked at once, whatever the segmentation.
//!
//! `parse_request` is a pure function of the whole buffer; calling it on every receive makes a
//! head trickled one byte at a time cost O(n²) (a 15 KB head sent in 1000 one-byte segments
//! re-parses ~15 MB). `HeadScan` keeps a small state machine over the bytes already seen, the
//! way nginx resumes its parser, and answers `Wait` only when it is *certain* that
//! `parse_request` would answer `Partial`. It triggers a parse:
//! - when the request line ends (its method, target and version are judged then),
//! - when the head ends (CRLF CRLF),
//! - at any byte it does not expect in a well-formed head (a control byte, a bare LF, a space
//!   where a token goes, the 65th field, a line at the length limit...). From then on it parses
//!   on every call, exactly as before; `parse_request` decides what the byte means,
//! - when the buffer passes `MAX_HEAD_BYTES`.
//!
//! So the scanner never decides anything about a request: it only skips calls whose answer is
//! known. The property tests below hold it to that against `parse_request` on every prefix.
//!
//! The shard scans as bytes arrive (`scan`, in the receive's completion) and parses later, on
//! the connection's turn (`take_parse`): a `Parse` verdict is kept until the parse takes it,
//! so a byte that arrives alone costs one completion and one step here, and nothing more.

use super::request::{
    is_tchar, MAX_HEADER_COUNT, MAX_HEAD_BYTES, MAX_LEADING_EMPTY_LINES, MAX_REQUEST_LINE_BYTES,
};

/// The request-line version's shape; `#` is a digit.
const VERSION_SHAPE: &[u8; 8] = b"HTTP/#.#";

/// What the caller should do after `advance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `parse_request` on the buffer would return `Partial`: wait for more bytes.
    Wait,
    /// Call `parse_request` on the buffer.
    Parse,
}

/// Where the scan is in the head's grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// Before the request line: empty lines may come.
    Leading,
    /// After a CR before the request line.
    LeadingCr,
    /// Inside the method token.
    Method,
    /// Just after the method's SP.
    TargetFirst,
    /// Inside the target.
    Target,
    /// Matching `VERSION_SHAPE`; the index of the next byte to match.
    Version(u8),
    /// After the version, expecting CR.
    LineEnd,
    /// After the request line's CR.
    LineCr,
    /// At the start of a field line (or the final CRLF).
    FieldStart,
    /// Inside a field name.
    Name,
    /// Inside a field value.
    Value,
    /// After a field line's CR.
    ValueCr,
    /// After the final CR.
    EndCr,
    /// The head is over, or a byte the scan does not model came: parse on every call.
    Parse,
}

/// Per-connection state of the head scan; `reset` it whenever the buffer loses bytes at its
/// front (a request consumed) or is cleared.
#[derive(Clone, Copy, Debug)]
pub struct HeadScan {
    /// Bytes of the buffer already scanned.
    scanned: usize,
    at: At,
    /// Bytes of the request line seen so far (the limit's 414 is decided per byte).
    line_bytes: usize,
    /// Empty lines seen before the request line.
    leading_lines: usize,
    /// Field lines ended so far.
    fields: usize,
    /// A `Parse` verdict that no parse has taken yet (`take_parse`).
    parse_due: bool,
}

impl Default for HeadScan {
    fn default() -> Self {
        Self::new()
    }
}

impl HeadScan {
    /// A scan at the start of an empty buffer.
    pub const fn new() -> Self {
        Self {
            scanned: 0,
            at: At::Leading,
            line_bytes: 0,
            leading_lines: 0,
            fields: 0,
            parse_due: false,
        }
    }

    /// Forgets everything: the buffer starts anew.
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    /// Scans the bytes of `buf` not seen yet and says whether `parse_request(buf)` can return
    /// anything but `Partial`. `buf` must be the previous buffer with bytes appended.
    pub fn advance(&mut self, buf: &[u8]) -> Verdict {
        if buf.len() < self.scanned {
            // Not an append: the caller forgot a reset. Start over rather than misjudge.
            debug_assert!(false, "head buffer shrank without a reset");
            self.reset();
        }
        let mut verdict = if buf.len() > MAX_HEAD_BYTES {
            Verdict::Parse
        } else {
            Verdict::Wait
        };
        // Bytes past the limit are never judged by parse_request; nothing to scan there.
        let new = buf
            .get(self.scanned..buf.len().min(MAX_HEAD_BYTES))
            .unwrap_or_default();
        for &b in new {
            if self.at == At::Parse {
                break;
            }
            if self.step(b) {
                verdict = Verdict::Parse;
            }
        }
        self.scanned = buf.len();
        if self.at == At::Parse {
            verdict = Verdict::Parse;
        }
        verdict
    }

    /// `advance`, keeping a `Parse` verdict until `take_parse`: true when `parse_request(buf)`
    /// may answer more than `Partial` (now, or since a byte scanned earlier).
    pub fn scan(&mut self, buf: &[u8]) -> bool {
        if self.advance(buf) == Verdict::Parse {
            self.parse_due = true;
        }
        self.parse_due
    }

    /// As `scan`, for the caller about to parse: the kept verdict is taken, so the next
    /// `scan` waits again until a byte calls for a parse.
    pub fn take_parse(&mut self, buf: &[u8]) -> bool {
        let due = self.scan(buf);
        self.parse_due = false;
        due
    }

    /// Moves over one byte; true when `parse_request` must look (the request line just ended).
    fn step(&mut self, b: u8) -> bool {
        let in_line = matches!(
            self.at,
            At::Method | At::TargetFirst | At::Target | At::Version(_) | At::LineEnd
        ) || (self.at == At::Leading && b != b'\r');
        if in_line {
            // parse_request judges a byte at or past the limit (a 414, or the CR exactly at it).
            if self.line_bytes >= MAX_REQUEST_LINE_BYTES {
                self.at = At::Parse;
                return true;
            }
            self.line_bytes = self.line_bytes.saturating_add(1);
        }
        let (next, look) = match (self.at, b) {
            (At::Leading, b'\r') => (At::LeadingCr, false),
            (At::Leading, b) if is_tchar(b) => (At::Method, false),
            (At::LeadingCr, b'\n') if self.leading_lines < MAX_LEADING_EMPTY_LINES => {
                self.leading_lines = self.leading_lines.saturating_add(1);
                (At::Leading, false)
            }
            (At::Method, b) if is_tchar(b) => (At::Method, false),
            (At::Method, b' ') => (At::TargetFirst, false),
            (At::TargetFirst | At::Target, 0x21..=0x7e | 0x80..=0xff) => (At::Target, false),
            (At::Target, b' ') => (At::Version(0), false),
            (At::Version(i), b) => match VERSION_SHAPE.get(usize::from(i)) {
                Some(b'#') if b.is_ascii_digit() => (Self::after_version(i), false),
                Some(&want) if want != b'#' && b == want => (Self::after_version(i), false),
                _ => (At::Parse, true),
            },
            (At::LineEnd, b'\r') => (At::LineCr, false),
            // The request line is whole: parse_request judges version, method and target now.
            (At::LineCr, b'\n') => (At::FieldStart, true),
            (At::FieldStart, b'\r') => (At::EndCr, false),
            // httparse fails at the first byte of a field past its table.
            (At::FieldStart, b) if is_tchar(b) && self.fields < MAX_HEADER_COUNT => {
                (At::Name, false)
            }
            (At::Name, b) if is_tchar(b) => (At::Name, false),
            (At::Name, b':') => (At::Value, false),
            (At::Value, b'\t' | 0x20..=0x7e | 0x80..=0xff) => (At::Value, false),
            (At::Value, b'\r') => (At::ValueCr, false),
            (At::ValueCr, b'\n') => {
                self.fields = self.fields.saturating_add(1);
                (At::FieldStart, false)
            }
            // The head is whole.
            (At::EndCr, b'\n') => (At::Parse, true),
            _ => (At::Parse, true),
        };
        self.at = next;
        look
    }

    /// The state after matching `VERSION_SHAPE[i]`.
    fn after_version(i: u8) -> At {
        let next = i.saturating_add(1);
        if usize::from(next) == VERSION_SHAPE.len() {
            At::LineEnd
        } else {
            At::Version(next)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::{parse_request, tests::request_strategy, Parsed};
    use proptest::prelude::*;

    /// Feeds `buf` in pieces cut at `cuts` the way the shard does (advance, then parse only on
    /// `Parse`) and checks every answer against `parse_request` on the same prefix. Returns how
    /// many times it parsed.
    fn feed(buf: &[u8], cuts: &[usize]) -> usize {
        let mut scan = HeadScan::new();
        let mut ends: Vec<usize> = cuts.iter().map(|&c| c.min(buf.len())).collect();
        ends.push(buf.len());
        ends.sort_unstable();
        ends.dedup();
        let mut parses = 0;
        for end in ends {
            let prefix = &buf[..end];
            let want = parse_request(prefix);
            match scan.advance(prefix) {
                Verdict::Wait => assert_eq!(
                    want,
                    Parsed::Partial,
                    "waited at {end} of {:?}",
                    String::from_utf8_lossy(buf)
                ),
                Verdict::Parse => parses += 1,
            }
            if want != Parsed::Partial {
                break;
            }
        }
        parses
    }

    /// The shard's way: every byte is scanned as it arrives, and the parse runs only on the
    /// connection's turns (after the bytes up to each of `turns`); a turn parses only when a
    /// verdict is due. Checks that a skipped turn could only have answered `Partial` and that
    /// nothing due is lost between turns.
    fn feed_deferred(buf: &[u8], turns: &[usize]) {
        let mut scan = HeadScan::new();
        for end in 1..=buf.len() {
            let prefix = &buf[..end];
            let due = scan.scan(prefix);
            let want = parse_request(prefix);
            if !due {
                assert_eq!(want, Parsed::Partial, "nothing due at {end}");
            }
            if turns.contains(&end) || end == buf.len() {
                let parse = scan.take_parse(prefix);
                assert_eq!(parse, due, "a turn takes what the scan kept ({end})");
                if !parse {
                    assert_eq!(want, Parsed::Partial);
                }
            }
            if want != Parsed::Partial {
                break;
            }
        }
    }

    fn byte_by_byte(buf: &[u8]) -> usize {
        let cuts: Vec<usize> = (0..=buf.len()).collect();
        feed(buf, &cuts)
    }

    #[test]
    fn a_well_formed_head_is_parsed_twice_whatever_the_segmentation() {
        let mut head = b"\r\nGET /depot/1/chunk/abc?x=1 HTTP/1.1\r\nHost: cdn\r\n".to_vec();
        for i in 0..60 {
            head.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "v".repeat(200)).as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert!(matches!(parse_request(&head), Parsed::Complete { .. }));
        // Once when the request line ends, once when the head does.
        assert_eq!(byte_by_byte(&head), 2);
        assert_eq!(feed(&head, &[]), 1);
        assert_eq!(feed(&head, &[10, 5000]), 2);
    }

    #[test]
    fn limits_are_left_to_the_parser() {
        let long_line = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
        byte_by_byte(long_line.as_bytes());
        let at_limit = format!(
            "GET /{} HTTP/1.1\r\nHost: a\r\n\r\n",
            "a".repeat(MAX_REQUEST_LINE_BYTES - 14)
        );
        byte_by_byte(at_limit.as_bytes());
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..70 {
            many.extend_from_slice(format!("X{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(matches!(parse_request(&many), Parsed::Rejected(r) if r.status == 431));
        byte_by_byte(&many);
        let mut big = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..40 {
            big.extend_from_slice(format!("X{i}: {}\r\n", "y".repeat(500)).as_bytes());
        }
        assert!(matches!(parse_request(&big), Parsed::Rejected(r) if r.status == 431));
        byte_by_byte(&big);
        let leading = "\r\n".repeat(MAX_LEADING_EMPTY_LINES + 1) + "GET / HTTP/1.1\r\n\r\n";
        byte_by_byte(leading.as_bytes());
    }

    #[test]
    fn a_pipelined_request_after_a_reset_scans_alone() {
        let two = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n";
        let mut scan = HeadScan::new();
        assert_eq!(scan.advance(two), Verdict::Parse);
        let Parsed::Complete { head_len, .. } = parse_request(two) else {
            panic!("first head")
        };
        scan.reset();
        let rest = &two[head_len..];
        assert_eq!(scan.advance(&rest[..10]), Verdict::Wait);
        assert_eq!(scan.advance(rest), Verdict::Parse);
    }

    #[test]
    fn a_verdict_scanned_on_arrival_waits_for_the_parse_that_takes_it() {
        let head = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
        let line_end = head.iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut scan = HeadScan::new();
        for end in 1..line_end {
            assert!(
                !scan.scan(&head[..end]),
                "no parse due inside the request line ({end})"
            );
        }
        // The request line's end asks for a parse; a later byte that asks nothing keeps it.
        assert!(scan.scan(&head[..line_end]));
        assert!(scan.scan(&head[..line_end + 1]));
        assert!(scan.take_parse(&head[..line_end + 1]));
        // Taken (the parse said Partial): the field bytes wait again, until the head ends.
        for end in line_end + 2..head.len() {
            assert!(!scan.scan(&head[..end]), "no parse due at {end}");
        }
        assert!(scan.scan(head));
        assert!(scan.take_parse(head));
        scan.reset();
        assert!(!scan.take_parse(b"GE"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn structured_heads_wait_only_when_the_parser_would(
            req in request_strategy(),
            cuts in proptest::collection::vec(0usize..80, 0..8),
        ) {
            feed(&req, &cuts);
            byte_by_byte(&req);
            feed_deferred(&req, &cuts);
        }

        #[test]
        fn arbitrary_bytes_wait_only_when_the_parser_would(
            req in proptest::collection::vec(
                prop_oneof![any::<u8>(), Just(b'\r'), Just(b'\n'), Just(b' '), Just(b':'),
                            Just(b'/'), Just(b'H'), Just(b'T'), Just(b'P'), Just(b'1')], 0..64)
        ) {
            byte_by_byte(&req);
        }

        #[test]
        fn mutated_heads_wait_only_when_the_parser_would(
            at in 0usize..60, byte in any::<u8>(), insert in any::<bool>(),
        ) {
            let mut req = b"GET /p?q HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\n\r\n".to_vec();
            let at = at.min(req.len());
            if insert { req.insert(at, byte) } else if at < req.len() { req[at] = byte }
            byte_by_byte(&req);
        }
    }
}
