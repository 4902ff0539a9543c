//! Conditional requests (RFC 9110 §13): `If-None-Match`, `If-Modified-Since`, `If-Range`, and
//! the strong ETag we generate. Pure functions over borrowed header values.

use crate::http::date::parse_http_date;

/// Size of an ETag buffer: fits `format_etag`'s tag (35 bytes at most) and the content-digest
/// tag `"sha256-<64 hex digits>"` (73 bytes) built from a published xattr.
pub const ETAG_MAX_BYTES: usize = 80;

/// Longest If-None-Match value we evaluate; a longer list is treated as not matching (200).
pub const MAX_IF_NONE_MATCH_BYTES: usize = 8 * 1024;

/// The validators of the representation being served.
#[derive(Clone, Copy, Debug)]
pub struct Validators<'a> {
    /// Our strong ETag, quotes included (as written by `format_etag`).
    pub etag: &'a [u8],
    /// Last modification time, whole seconds since the epoch (what `Last-Modified` shows).
    pub mtime_secs: i64,
}

/// What the preconditions say to do with a GET or HEAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Serve the representation normally.
    Proceed,
    /// Answer 304 Not Modified.
    NotModified,
}

/// Evaluates If-None-Match and If-Modified-Since for a GET/HEAD (RFC 9110 §13.2.2 steps 3-4).
///
/// If-None-Match takes precedence: when present, If-Modified-Since is not looked at, and a
/// malformed If-None-Match counts as "no match" (the full response is always a safe answer).
/// If-None-Match uses weak comparison and `*` matches (the file exists, or we'd not be here).
/// If-Modified-Since is ignored unless it is a valid HTTP-date; mtime <= date means 304.
pub fn evaluate(
    if_none_match: Option<&[u8]>,
    if_modified_since: Option<&[u8]>,
    v: &Validators<'_>,
) -> Precondition {
    if let Some(inm) = if_none_match {
        return if if_none_match_matches(inm, v.etag) {
            Precondition::NotModified
        } else {
            Precondition::Proceed
        };
    }
    if let Some(ims) = if_modified_since.and_then(parse_http_date) {
        if v.mtime_secs <= ims {
            return Precondition::NotModified;
        }
    }
    Precondition::Proceed
}

/// Whether an If-Range value lets a Range request be answered with 206 (RFC 9110 §13.1.5).
///
/// An entity-tag must match ours strongly (weak tags never match); otherwise the value must be
/// a valid HTTP-date exactly equal to our mtime in seconds. Anything else means "send it all".
pub fn if_range_allows(if_range: &[u8], v: &Validators<'_>) -> bool {
    let value = if_range.trim_ascii();
    match value.first() {
        Some(b'"') => is_entity_tag_opaque(value) && value == v.etag,
        Some(b'W') if value.get(1) == Some(&b'/') => false,
        _ => parse_http_date(value) == Some(v.mtime_secs),
    }
}

/// A quoted opaque-tag: `"` *etagc `"`, with etagc = %x21 / %x23-7E / obs-text.
fn is_entity_tag_opaque(tag: &[u8]) -> bool {
    match tag {
        [b'"', inner @ .., b'"'] => inner.iter().all(|&b| b == 0x21 || (b >= 0x23 && b != 0x7f)),
        _ => false,
    }
}

/// The opaque part (quotes included) of an entity-tag, for weak comparison.
fn opaque(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

/// Weak comparison of an If-None-Match list (`*` or 1#entity-tag) against our ETag.
///
/// A syntactically invalid list never matches, even if a valid member matched before the junk:
/// the outcome must not depend on where the damage is.
fn if_none_match_matches(field: &[u8], etag: &[u8]) -> bool {
    let field = field.trim_ascii();
    if field == b"*" {
        return true;
    }
    if field.len() > MAX_IF_NONE_MATCH_BYTES {
        return false;
    }
    let ours = opaque(etag);
    let mut matched = false;
    let mut rest = field;
    loop {
        rest = rest.trim_ascii_start();
        let Some(first) = rest.first() else { break };
        if *first == b',' {
            // Empty list elements are allowed by the list rule (RFC 9110 §5.6.1.2).
            rest = rest.get(1..).unwrap_or_default();
            continue;
        }
        let body = rest.strip_prefix(b"W/").unwrap_or(rest);
        if body.first() != Some(&b'"') {
            return false;
        }
        let Some(close) = body
            .get(1..)
            .and_then(|b| b.iter().position(|&c| c == b'"'))
        else {
            return false;
        };
        // Opening quote + `close` bytes + closing quote.
        let Some(tag) = body.get(..close.saturating_add(2)) else {
            return false;
        };
        if !is_entity_tag_opaque(tag) {
            return false;
        }
        matched |= tag == ours;
        rest = body.get(tag.len()..).unwrap_or_default().trim_ascii_start();
        match rest.first() {
            None => break,
            Some(b',') => rest = rest.get(1..).unwrap_or_default(),
            Some(_) => return false,
        }
    }
    matched
}

fn hex_digit(n: u8) -> u8 {
    match n {
        0..=9 => b'0' + n,
        _ => b'a' + (n - 10),
    }
}

/// Appends `v` in lowercase hex without leading zeros, keeping at most `max_digits` low digits.
fn push_hex(v: u64, max_digits: usize, out: &mut [u8; ETAG_MAX_BYTES], pos: &mut usize) {
    let needed = (16 - (v.leading_zeros() / 4) as usize).max(1);
    let digits = needed.min(max_digits);
    for i in (0..digits).rev() {
        // `i` < 16, so the shift is in range.
        let nibble = ((v >> (i * 4)) & 0xf) as u8;
        if let Some(slot) = out.get_mut(*pos) {
            *slot = hex_digit(nibble);
            *pos += 1;
        }
    }
}

fn push_byte(b: u8, out: &mut [u8; ETAG_MAX_BYTES], pos: &mut usize) {
    if let Some(slot) = out.get_mut(*pos) {
        *slot = b;
        *pos += 1;
    }
}

/// Writes our strong ETag `"<size>-<mtime_ns>"` (lowercase hex) and returns its length.
///
/// Only what is identical on every edge holding the same bytes goes in: the size and the
/// modification time, which `rsync -a` and `cp -p` preserve to the nanosecond. No inode, no
/// device: a client resuming with `If-Range` on another edge of the fleet must see the same
/// tag for the same file (nginx builds its ETag from the same two values, mtime in seconds).
/// mtime comes as statx gives it (seconds + nanoseconds) so a file rewritten twice within one
/// second with the same size still changes ETag; the nanosecond count is folded to 64 bits
/// (wraps every 584 years). Two full 64-bit hex numbers need 35 bytes, so nothing is ever cut.
pub fn format_etag(
    size: u64,
    mtime_secs: i64,
    mtime_nsec: u32,
    out: &mut [u8; ETAG_MAX_BYTES],
) -> usize {
    let mtime_ns = i128::from(mtime_secs)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(i128::from(mtime_nsec));
    // Truncation is the intended fold to 64 bits.
    let mtime = mtime_ns as u64;
    let mut pos = 0;
    push_byte(b'"', out, &mut pos);
    push_hex(size, 16, out, &mut pos);
    push_byte(b'-', out, &mut pos);
    push_hex(mtime, 16, out, &mut pos);
    push_byte(b'"', out, &mut pos);
    pos
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::date::format_http_date;
    use proptest::prelude::*;

    const MTIME: i64 = 784_111_777;
    const V: Validators<'static> = Validators {
        etag: b"\"1a-2b-3c\"",
        mtime_secs: MTIME,
    };

    fn etag(size: u64, secs: i64, nsec: u32) -> String {
        let mut buf = [0u8; ETAG_MAX_BYTES];
        let n = format_etag(size, secs, nsec, &mut buf);
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn etag_format() {
        assert_eq!(etag(0x2b, 0, 0x3c), "\"2b-3c\"");
        assert_eq!(etag(0, 0, 0), "\"0-0\"");
        assert_eq!(etag(2, 1, 5), "\"2-3b9aca05\"");
        // Pre-epoch mtimes fold to large u64 values rather than failing.
        assert_eq!(etag(2, -1, 0), "\"2-ffffffffc4653600\"");
        let worst = etag(u64::MAX, -1, 999_999_999);
        assert_eq!(worst, "\"ffffffffffffffff-ffffffffffffffff\"");
        assert!(worst.len() <= ETAG_MAX_BYTES);
        assert_ne!(etag(9, MTIME, 1), etag(9, MTIME, 2));
        assert_ne!(etag(9, MTIME, 1), etag(10, MTIME, 1));
    }

    #[test]
    fn etag_depends_only_on_size_and_mtime() {
        // Same bytes on two edges (different inodes, same size and preserved mtime): one tag.
        assert_eq!(etag(1 << 40, MTIME, 123), etag(1 << 40, MTIME, 123));
    }

    #[test]
    fn if_none_match() {
        use Precondition::*;
        let e = |inm: &[u8]| evaluate(Some(inm), None, &V);
        assert_eq!(e(b"\"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"W/\"1a-2b-3c\""), NotModified, "weak comparison");
        assert_eq!(e(b"*"), NotModified);
        assert_eq!(e(b" * "), NotModified);
        assert_eq!(e(b"\"x\", \"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"\"x\",W/\"1a-2b-3c\" ,"), NotModified);
        assert_eq!(e(b", ,\"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"\"x\""), Proceed);
        assert_eq!(e(b"\"1a-2b-3C\""), Proceed);
        assert_eq!(e(b"1a-2b-3c"), Proceed, "unquoted is malformed");
        assert_eq!(e(b"\"1a-2b-3c\" junk"), Proceed, "malformed list");
        assert_eq!(e(b"\"1a-2b-3c\", \"unterminated"), Proceed);
        assert_eq!(e(b"\"1a-2b-3c"), Proceed);
        assert_eq!(e(b"\"1a\"2b\""), Proceed);
        assert_eq!(e(b"w/\"1a-2b-3c\""), Proceed);
        assert_eq!(e(b""), Proceed);
        assert_eq!(e(b"**"), Proceed);
        assert_eq!(e(b"\"a\x7fb\""), Proceed);
    }

    #[test]
    fn if_none_match_wins_over_if_modified_since() {
        let later = format_http_date(MTIME + 10);
        assert_eq!(
            evaluate(Some(b"\"other\""), Some(&later), &V),
            Precondition::Proceed
        );
        let earlier = format_http_date(MTIME - 10);
        assert_eq!(
            evaluate(Some(b"\"1a-2b-3c\""), Some(&earlier), &V),
            Precondition::NotModified
        );
    }

    #[test]
    fn if_modified_since() {
        use Precondition::*;
        let e = |d: &[u8]| evaluate(None, Some(d), &V);
        assert_eq!(e(&format_http_date(MTIME)), NotModified);
        assert_eq!(e(&format_http_date(MTIME + 1)), NotModified);
        assert_eq!(e(&format_http_date(MTIME - 1)), Proceed);
        assert_eq!(e(b"Sunday, 06-Nov-94 08:49:37 GMT"), NotModified);
        assert_eq!(e(b"not a date"), Proceed);
        assert_eq!(evaluate(None, None, &V), Proceed);
    }

    #[test]
    fn if_range() {
        assert!(if_range_allows(b"\"1a-2b-3c\"", &V));
        assert!(if_range_allows(b" \"1a-2b-3c\" ", &V));
        assert!(
            !if_range_allows(b"W/\"1a-2b-3c\"", &V),
            "weak never matches"
        );
        assert!(!if_range_allows(b"\"other\"", &V));
        assert!(!if_range_allows(b"\"1a-2b-3c", &V));
        assert!(if_range_allows(&format_http_date(MTIME), &V));
        assert!(if_range_allows(b"Sun Nov  6 08:49:37 1994", &V));
        assert!(!if_range_allows(&format_http_date(MTIME + 1), &V));
        assert!(!if_range_allows(&format_http_date(MTIME - 1), &V));
        assert!(!if_range_allows(b"garbage", &V));
        assert!(!if_range_allows(b"", &V));
    }

    proptest! {
        #[test]
        fn etag_never_overflows_and_is_quoted(
            size in any::<u64>(), secs in any::<i64>(), nsec in 0u32..1_000_000_000
        ) {
            let mut buf = [0u8; ETAG_MAX_BYTES];
            let n = format_etag(size, secs, nsec, &mut buf);
            prop_assert!(n <= ETAG_MAX_BYTES);
            let tag = &buf[..n];
            prop_assert!(is_entity_tag_opaque(tag));
            let v = Validators { etag: tag, mtime_secs: 0 };
            prop_assert!(if_range_allows(tag, &v));
            prop_assert_eq!(evaluate(Some(tag), None, &v), Precondition::NotModified);
        }

        #[test]
        fn never_panics(inm in proptest::collection::vec(any::<u8>(), 0..64),
                        ims in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = evaluate(Some(&inm), Some(&ims), &V);
            let _ = evaluate(None, Some(&ims), &V);
            let _ = if_range_allows(&inm, &V);
        }
    }
}
