//! Conditional requests (RFC 9110 §13): `If-Match`, `If-Unmodified-Since`, `If-None-Match`,
//! `If-Modified-Since`, `If-Range`, and the strong ETag we generate. Pure functions over
//! borrowed header values.

use crate::http::date::parse_http_date;

/// Size of an ETag buffer: fits `format_etag`'s tag (35 bytes at most) and the content-digest
/// tag `"sha256-<64 hex digits>"` (73 bytes) built from a published xattr.
pub const ETAG_MAX_BYTES: usize = 80;

/// Longest If-Match / If-None-Match value we evaluate. A longer If-None-Match is treated as
/// not matching (200), a longer If-Match as not matching either (412): in both cases the answer
/// is the one that never hands out bytes the client said it did not want.
pub const MAX_ENTITY_TAG_LIST_BYTES: usize = 8 * 1024;

/// The validators of the representation being served.
#[derive(Clone, Copy, Debug)]
pub struct Validators<'a> {
    /// Our strong ETag, quotes included (as written by `format_etag`).
    pub etag: &'a [u8],
    /// Last modification time, whole seconds since the epoch (what `Last-Modified` shows).
    pub mtime_secs: i64,
}

/// The conditional header fields of a GET or HEAD, as received (each None when absent).
#[derive(Clone, Copy, Debug, Default)]
pub struct Conditions<'a> {
    /// `If-Match`.
    pub if_match: Option<&'a [u8]>,
    /// `If-Unmodified-Since`.
    pub if_unmodified_since: Option<&'a [u8]>,
    /// `If-None-Match`.
    pub if_none_match: Option<&'a [u8]>,
    /// `If-Modified-Since`.
    pub if_modified_since: Option<&'a [u8]>,
    /// `If-Range`.
    pub if_range: Option<&'a [u8]>,
    /// Whether the request has a `Range` field (If-Range means nothing without one).
    pub has_range: bool,
}

/// What the preconditions say to do with a GET or HEAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Serve the representation; `use_range` says whether the Range field is to be honoured
    /// (it is present and If-Range, if any, holds).
    Proceed {
        /// Evaluate the Range field (false: send the whole representation with 200).
        use_range: bool,
    },
    /// Answer 304 Not Modified.
    NotModified,
    /// Answer 412 Precondition Failed.
    Failed,
}

/// Evaluates the preconditions of a GET/HEAD in the order of RFC 9110 §13.2.2.
///
/// 1. If-Match (strong comparison, `*` matches: the file exists, or we'd not be here);
///    false -> 412.
/// 2. Only without If-Match: If-Unmodified-Since, if it is a valid HTTP-date; mtime later
///    than the date -> 412.
/// 3. If-None-Match (weak comparison, `*` matches); true -> 304 (our methods are GET/HEAD).
/// 4. Only without If-None-Match: If-Modified-Since, if valid; mtime <= date -> 304.
/// 5. With a Range field: If-Range decides whether it is honoured (`if_range_allows`).
///
/// A malformed If-Match never matches (412) and a malformed If-None-Match never matches
/// (proceed): each way the server refuses to hand out bytes the client did not ask for.
/// Invalid dates are ignored, as §13.1.3 and §13.1.4 require.
pub fn evaluate(c: &Conditions<'_>, v: &Validators<'_>) -> Precondition {
    if let Some(im) = c.if_match {
        if !entity_tag_list_matches(im, v.etag, Comparison::Strong) {
            return Precondition::Failed;
        }
    } else if let Some(ius) = c.if_unmodified_since.and_then(parse_http_date) {
        if v.mtime_secs > ius {
            return Precondition::Failed;
        }
    }
    if let Some(inm) = c.if_none_match {
        if entity_tag_list_matches(inm, v.etag, Comparison::Weak) {
            return Precondition::NotModified;
        }
    } else if let Some(ims) = c.if_modified_since.and_then(parse_http_date) {
        if v.mtime_secs <= ims {
            return Precondition::NotModified;
        }
    }
    let use_range = c.has_range && c.if_range.is_none_or(|ir| if_range_allows(ir, v));
    Precondition::Proceed { use_range }
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

/// How two entity-tags are compared (RFC 9110 §8.8.3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    /// Both strong and the opaque-tags identical (If-Match).
    Strong,
    /// The opaque-tags identical, either or both may be weak (If-None-Match).
    Weak,
}

/// Compares a `*` or `1#entity-tag` field value against our ETag.
///
/// A syntactically invalid list never matches, even if a valid member matched before the junk:
/// the outcome must not depend on where the damage is.
fn entity_tag_list_matches(field: &[u8], etag: &[u8], how: Comparison) -> bool {
    let field = field.trim_ascii();
    if field == b"*" {
        return true;
    }
    if field.len() > MAX_ENTITY_TAG_LIST_BYTES {
        return false;
    }
    let ours_weak = etag.starts_with(b"W/");
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
        let weak = rest.starts_with(b"W/");
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
        let strong_ok = how == Comparison::Weak || !(weak || ours_weak);
        matched |= strong_ok && tag == ours;
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

    const GO: Precondition = Precondition::Proceed { use_range: false };
    const RANGE: Precondition = Precondition::Proceed { use_range: true };

    fn none() -> Conditions<'static> {
        Conditions::default()
    }

    fn inm(value: &[u8]) -> Precondition {
        let c = Conditions {
            if_none_match: Some(value),
            ..none()
        };
        evaluate(&c, &V)
    }

    fn im(value: &[u8]) -> Precondition {
        let c = Conditions {
            if_match: Some(value),
            ..none()
        };
        evaluate(&c, &V)
    }

    fn date(secs: i64) -> [u8; crate::http::date::HTTP_DATE_BYTES] {
        format_http_date(secs)
    }

    #[test]
    fn no_conditions_proceed() {
        assert_eq!(evaluate(&none(), &V), GO);
        let c = Conditions {
            has_range: true,
            ..none()
        };
        assert_eq!(evaluate(&c, &V), RANGE);
    }

    #[test]
    fn if_none_match() {
        use Precondition::*;
        let e = inm;
        assert_eq!(e(b"\"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"W/\"1a-2b-3c\""), NotModified, "weak comparison");
        assert_eq!(e(b"*"), NotModified);
        assert_eq!(e(b" * "), NotModified);
        assert_eq!(e(b"\"x\", \"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"\"x\",W/\"1a-2b-3c\" ,"), NotModified);
        assert_eq!(e(b", ,\"1a-2b-3c\""), NotModified);
        assert_eq!(e(b"\"x\""), GO);
        assert_eq!(e(b"\"1a-2b-3C\""), GO);
        assert_eq!(e(b"1a-2b-3c"), GO, "unquoted is malformed");
        assert_eq!(e(b"\"1a-2b-3c\" junk"), GO, "malformed list");
        assert_eq!(e(b"\"1a-2b-3c\", \"unterminated"), GO);
        assert_eq!(e(b"\"1a-2b-3c"), GO);
        assert_eq!(e(b"\"1a\"2b\""), GO);
        assert_eq!(e(b"w/\"1a-2b-3c\""), GO);
        assert_eq!(e(b""), GO);
        assert_eq!(e(b"**"), GO);
        assert_eq!(e(b"\"a\x7fb\""), GO);
    }

    #[test]
    fn if_match_uses_strong_comparison() {
        use Precondition::*;
        assert_eq!(im(b"\"1a-2b-3c\""), GO);
        assert_eq!(im(b" \"1a-2b-3c\" "), GO);
        assert_eq!(im(b"*"), GO, "the representation exists");
        assert_eq!(im(b"\"x\", \"1a-2b-3c\""), GO, "list");
        assert_eq!(im(b",\"x\",,\"1a-2b-3c\","), GO, "empty list elements");
        assert_eq!(
            im(b"W/\"1a-2b-3c\""),
            Failed,
            "a weak tag never matches strongly"
        );
        assert_eq!(im(b"W/\"1a-2b-3c\", \"y\""), Failed);
        assert_eq!(im(b"\"nope\""), Failed);
        assert_eq!(im(b"\"1a-2b-3C\""), Failed, "case-sensitive");
        // Malformed values never match: the client gets no bytes of a version it did not name.
        for bad in [
            &b""[..],
            b"1a-2b-3c",
            b"\"1a-2b-3c\" junk",
            b"\"1a-2b-3c\", \"unterminated",
            b"\"1a-2b-3c",
            b"**",
            b"*, \"1a-2b-3c\"",
        ] {
            assert_eq!(im(bad), Failed, "{}", String::from_utf8_lossy(bad));
        }
        let mut long = b"\"x\",".repeat(MAX_ENTITY_TAG_LIST_BYTES / 4);
        long.extend_from_slice(b"\"1a-2b-3c\"");
        assert_eq!(im(&long), Failed, "over the list limit");
        // Our own tag, were it weak, could only be matched by `*`.
        let weak = Validators {
            etag: b"W/\"1a-2b-3c\"",
            mtime_secs: MTIME,
        };
        let c = |v: &'static [u8]| Conditions {
            if_match: Some(v),
            ..none()
        };
        assert_eq!(evaluate(&c(b"W/\"1a-2b-3c\""), &weak), Failed);
        assert_eq!(evaluate(&c(b"\"1a-2b-3c\""), &weak), Failed);
        assert_eq!(evaluate(&c(b"*"), &weak), GO);
    }

    #[test]
    fn step2_if_unmodified_since() {
        use Precondition::*;
        let ius = |d: &[u8]| {
            let c = Conditions {
                if_unmodified_since: Some(d),
                ..none()
            };
            evaluate(&c, &V)
        };
        assert_eq!(ius(&date(MTIME)), GO, "not modified since that second");
        assert_eq!(ius(&date(MTIME + 1)), GO);
        assert_eq!(ius(&date(MTIME - 1)), Failed, "modified after the date");
        assert_eq!(ius(b"Mon, 01 Jan 2001 00:00:00 GMT"), GO, "MTIME is 1994");
        assert_eq!(ius(b"Sun Nov  6 08:49:36 1994"), Failed);
        assert_eq!(ius(b"Sunday, 06-Nov-94 08:49:36 GMT"), Failed);
        // Invalid dates, lists of dates included, are ignored (§13.1.4).
        assert_eq!(ius(b"yesterday"), GO);
        assert_eq!(ius(b""), GO);
        let list = b"Sun, 06 Nov 1994 08:49:36 GMT, Sun, 06 Nov 1994 08:49:36 GMT";
        assert_eq!(ius(list), GO);
    }

    #[test]
    fn step1_if_match_makes_if_unmodified_since_ignored() {
        use Precondition::*;
        let both = |m: &'static [u8], d: &[u8]| {
            let c = Conditions {
                if_match: Some(m),
                if_unmodified_since: Some(d),
                ..none()
            };
            evaluate(&c, &V)
        };
        assert_eq!(both(b"\"1a-2b-3c\"", &date(MTIME - 100)), GO);
        assert_eq!(both(b"*", &date(MTIME - 100)), GO);
        assert_eq!(both(b"\"nope\"", &date(MTIME + 100)), Failed);
    }

    #[test]
    fn steps1_2_fail_before_steps3_4_answer_304() {
        use Precondition::*;
        let c = Conditions {
            if_match: Some(b"\"nope\""),
            if_none_match: Some(b"\"1a-2b-3c\""),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), Failed);
        let old = date(MTIME - 1);
        let new = date(MTIME + 1);
        let c = Conditions {
            if_unmodified_since: Some(&old),
            if_modified_since: Some(&new),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), Failed);
        // Passing steps 1-2 lets steps 3-4 answer.
        let c = Conditions {
            if_match: Some(b"\"1a-2b-3c\""),
            if_none_match: Some(b"\"1a-2b-3c\""),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), NotModified);
        let c = Conditions {
            if_unmodified_since: Some(&new),
            if_modified_since: Some(&new),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), NotModified);
    }

    #[test]
    fn step3_if_none_match_makes_if_modified_since_ignored() {
        let later = date(MTIME + 10);
        let c = Conditions {
            if_none_match: Some(b"\"other\""),
            if_modified_since: Some(&later),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), GO);
        let earlier = date(MTIME - 10);
        let c = Conditions {
            if_none_match: Some(b"\"1a-2b-3c\""),
            if_modified_since: Some(&earlier),
            ..none()
        };
        assert_eq!(evaluate(&c, &V), Precondition::NotModified);
    }

    #[test]
    fn step4_if_modified_since() {
        use Precondition::*;
        let e = |d: &[u8]| {
            let c = Conditions {
                if_modified_since: Some(d),
                ..none()
            };
            evaluate(&c, &V)
        };
        assert_eq!(e(&date(MTIME)), NotModified);
        assert_eq!(e(&date(MTIME + 1)), NotModified);
        assert_eq!(e(&date(MTIME - 1)), GO);
        assert_eq!(e(b"Sunday, 06-Nov-94 08:49:37 GMT"), NotModified);
        assert_eq!(e(b"not a date"), GO);
    }

    #[test]
    fn step5_if_range_decides_the_range_last() {
        use Precondition::*;
        let with = |ir: Option<&'static [u8]>, has_range: bool| Conditions {
            if_range: ir,
            has_range,
            ..none()
        };
        assert_eq!(evaluate(&with(None, true), &V), RANGE);
        assert_eq!(evaluate(&with(Some(b"\"1a-2b-3c\""), true), &V), RANGE);
        assert_eq!(evaluate(&with(Some(b"\"old\""), true), &V), GO);
        assert_eq!(
            evaluate(&with(Some(b"\"1a-2b-3c\""), false), &V),
            GO,
            "If-Range without Range is ignored"
        );
        // The earlier steps answer first, whatever If-Range says.
        let c = Conditions {
            if_match: Some(b"\"nope\""),
            ..with(Some(b"\"1a-2b-3c\""), true)
        };
        assert_eq!(evaluate(&c, &V), Failed);
        let c = Conditions {
            if_none_match: Some(b"*"),
            ..with(Some(b"\"1a-2b-3c\""), true)
        };
        assert_eq!(evaluate(&c, &V), NotModified);
        let c = Conditions {
            if_match: Some(b"\"1a-2b-3c\""),
            if_none_match: Some(b"\"x\""),
            ..with(Some(b"\"1a-2b-3c\""), true)
        };
        assert_eq!(evaluate(&c, &V), RANGE);
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
            let c = Conditions { if_match: Some(tag), if_none_match: Some(tag), ..Conditions::default() };
            prop_assert_eq!(evaluate(&c, &v), Precondition::NotModified);
        }

        #[test]
        fn never_panics(tags in proptest::collection::vec(any::<u8>(), 0..64),
                        date in proptest::collection::vec(any::<u8>(), 0..40),
                        which in 0u8..32) {
            let pick = |bit: u8, v: &'_ [u8]| -> Option<Vec<u8>> { (which & bit != 0).then(|| v.to_vec()) };
            let (a, b, c, d) = (pick(1, &tags), pick(2, &date), pick(4, &tags), pick(8, &date));
            let conds = Conditions {
                if_match: a.as_deref(),
                if_unmodified_since: b.as_deref(),
                if_none_match: c.as_deref(),
                if_modified_since: d.as_deref(),
                if_range: Some(&tags),
                has_range: which & 16 != 0,
            };
            let _ = evaluate(&conds, &V);
            let _ = if_range_allows(&tags, &V);
        }
    }
}
