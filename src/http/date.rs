//! HTTP-date (RFC 9110 §5.6.7): formatting as IMF-fixdate and parsing all three historic
//! forms, both by the `httpdate` crate, plus a per-shard cache so the `Date` header is
//! formatted once per second, not per response.
//!
//! This module is the seam between the crate's `SystemTime` world and ours (whole seconds as
//! `i64`, bytes off the wire, fixed 29-byte values): it clamps instants to what the crate can
//! carry, since `httpdate` panics outside 1970..=9999 and a file's mtime can be anything.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length in bytes of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
pub const HTTP_DATE_BYTES: usize = 29;

/// Earliest instant formatted as itself (1970-01-01T00:00:00Z); earlier ones are clamped to
/// it. `httpdate` covers no earlier year, and a pre-1970 mtime is an accident, not a version.
pub const MIN_HTTP_DATE_SECS: i64 = 0;

/// Latest instant an IMF-fixdate can carry (9999-12-31T23:59:59Z): its year has 4 digits.
pub const MAX_HTTP_DATE_SECS: i64 = 253_402_300_799;

/// Longest input `parse_http_date` looks at; anything longer is not a date (RFC 850 is 33).
pub const MAX_HTTP_DATE_INPUT_BYTES: usize = 64;

/// A `fmt::Write` into a fixed IMF-fixdate buffer, so formatting never allocates.
struct FixdateBuf {
    bytes: [u8; HTTP_DATE_BYTES],
    len: usize,
}

impl std::fmt::Write for FixdateBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(std::fmt::Error)?;
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Formats `unix_secs` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
///
/// Instants outside MIN_HTTP_DATE_SECS..=MAX_HTTP_DATE_SECS are clamped to the nearest one
/// (an IMF-fixdate has exactly four year digits; `httpdate` starts at 1970).
pub fn format_http_date(unix_secs: i64) -> [u8; HTTP_DATE_BYTES] {
    let secs = unix_secs.clamp(MIN_HTTP_DATE_SECS, MAX_HTTP_DATE_SECS);
    // Non-negative after the clamp.
    let instant = UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs());
    let mut out = FixdateBuf {
        bytes: *b"Thu, 01 Jan 1970 00:00:00 GMT",
        len: 0,
    };
    // The crate writes exactly 29 bytes in one piece; should that ever change, the write
    // fails and the epoch placeholder stays rather than a torn value.
    if write!(out, "{}", httpdate::HttpDate::from(instant)).is_err() || out.len != HTTP_DATE_BYTES {
        return *b"Thu, 01 Jan 1970 00:00:00 GMT";
    }
    out.bytes
}

/// Parses an HTTP-date in any of the three forms RFC 9110 requires recipients to accept.
///
/// Case-sensitive, as the RFC says; surrounding whitespace is ignored. The weekday must agree
/// with the date (the crate checks it), and years before 1970 are not dates to us. Returns
/// seconds since the Unix epoch, or None for anything else: every caller then ignores the
/// field, the safe outcome for every conditional header.
pub fn parse_http_date(s: &[u8]) -> Option<i64> {
    let s = s.trim_ascii();
    if s.len() > MAX_HTTP_DATE_INPUT_BYTES {
        return None;
    }
    let text = std::str::from_utf8(s).ok()?;
    let when: SystemTime = text.parse::<httpdate::HttpDate>().ok()?.into();
    let secs = when.duration_since(UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok()
}

/// The shard's formatted `Date` value, re-formatted only when the second changes.
#[derive(Clone, Debug)]
pub struct DateCache {
    secs: i64,
    value: [u8; HTTP_DATE_BYTES],
}

impl DateCache {
    /// A cache holding `now_secs` already formatted.
    pub fn new(now_secs: i64) -> Self {
        Self {
            secs: now_secs,
            value: format_http_date(now_secs),
        }
    }

    /// Moves the cache to `now_secs`; formats only if the second differs from the cached one.
    pub fn refresh(&mut self, now_secs: i64) {
        if now_secs != self.secs {
            self.secs = now_secs;
            self.value = format_http_date(now_secs);
        }
    }

    /// The 29-byte IMF-fixdate for the cached second.
    pub fn header_value(&self) -> &[u8] {
        &self.value
    }

    /// The second the cached value stands for.
    pub fn secs(&self) -> i64 {
        self.secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_rfc_example() {
        assert_eq!(
            &format_http_date(784_111_777),
            b"Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(&format_http_date(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            &format_http_date(951_782_400),
            b"Tue, 29 Feb 2000 00:00:00 GMT"
        );
        assert_eq!(
            &format_http_date(1_609_459_199),
            b"Thu, 31 Dec 2020 23:59:59 GMT"
        );
    }

    #[test]
    fn out_of_range_instants_are_clamped() {
        assert_eq!(&format_http_date(-1), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            &format_http_date(i64::MIN),
            b"Thu, 01 Jan 1970 00:00:00 GMT"
        );
        assert_eq!(
            &format_http_date(MAX_HTTP_DATE_SECS),
            b"Fri, 31 Dec 9999 23:59:59 GMT"
        );
        assert_eq!(
            &format_http_date(MAX_HTTP_DATE_SECS + 1),
            b"Fri, 31 Dec 9999 23:59:59 GMT"
        );
        assert_eq!(
            &format_http_date(i64::MAX),
            b"Fri, 31 Dec 9999 23:59:59 GMT"
        );
        assert_eq!(
            parse_http_date(b"Fri, 31 Dec 9999 23:59:59 GMT"),
            Some(MAX_HTTP_DATE_SECS)
        );
        assert_eq!(
            parse_http_date(b"Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(MIN_HTTP_DATE_SECS)
        );
    }

    #[test]
    fn parses_all_three_forms() {
        let want = Some(784_111_777);
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), want);
        assert_eq!(parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), want);
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994"), want);
        assert_eq!(parse_http_date(b"Sun Nov 06 08:49:37 1994"), want);
        assert_eq!(parse_http_date(b"  Sun, 06 Nov 1994 08:49:37 GMT "), want);
        assert_eq!(
            parse_http_date(b"Thursday, 01-Jan-15 00:00:00 GMT"),
            Some(1_420_070_400)
        );
    }

    #[test]
    fn rejects_malformed_dates() {
        for bad in [
            &b""[..],
            b"garbage",
            b"Sun, 06 Nov 1994 08:49:37 UTC",
            b"sun, 06 Nov 1994 08:49:37 GMT",
            b"Sun, 06 nov 1994 08:49:37 GMT",
            b"Sun, 31 Nov 1994 08:49:37 GMT",
            b"Sun, 29 Feb 1900 08:49:37 GMT",
            b"Sun, 00 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 24:00:00 GMT",
            b"Sun, 06 Nov 1994 08:60:00 GMT",
            b"Sun, 06 Nov 1994 08:49:60 GMT",
            b"Sun, 06 Nov 0000 08:49:37 GMT",
            b"Sun, 6 Nov 1994 08:49:37 GMT ",
            b"Sun, +6 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 08:49:3x GMT",
            b"Sun, 06 Nov 1994 08-49-37 GMT",
            b"Sunday, 06-Nov-1994 08:49:37 GMT",
            b"Sundax, 06-Nov-94 08:49:37 GMT",
            b"Sun Nov 6 08:49:37 1994",
            b"Sun Nov  6 08:49:37 19944",
            b"Sun Nov  x 08:49:37 1994",
            b",",
            b"Sunday,",
            // The weekday must agree with the date (6 Nov 1994 was a Sunday).
            b"Mon, 06 Nov 1994 08:49:37 GMT",
            b"Monday, 06-Nov-94 08:49:37 GMT",
            b"Mon Nov  6 08:49:37 1994",
            // Before 1970, and not ASCII.
            b"Wed, 31 Dec 1969 23:59:59 GMT",
            b"Sun, 06 Nov 1994 08:49:37 GMT\xff",
            b"\xffun, 06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(
                parse_http_date(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse_http_date(&[b'1'; 200]), None);
    }

    #[test]
    fn date_cache_reformats_only_on_new_second() {
        let mut c = DateCache::new(784_111_777);
        assert_eq!(c.header_value(), b"Sun, 06 Nov 1994 08:49:37 GMT");
        c.refresh(784_111_777);
        assert_eq!(c.secs(), 784_111_777);
        assert_eq!(c.header_value(), b"Sun, 06 Nov 1994 08:49:37 GMT");
        c.refresh(784_111_778);
        assert_eq!(c.secs(), 784_111_778);
        assert_eq!(c.header_value(), b"Sun, 06 Nov 1994 08:49:38 GMT");
        // Clamped like `format_http_date`, never a panic.
        c.refresh(-5);
        assert_eq!(c.header_value(), b"Thu, 01 Jan 1970 00:00:00 GMT");
    }

    proptest! {
        #[test]
        fn round_trips_1970_to_9999(secs in 0i64..=MAX_HTTP_DATE_SECS) {
            let s = format_http_date(secs);
            prop_assert_eq!(parse_http_date(&s), Some(secs));
        }

        #[test]
        fn asctime_agrees_with_imf(secs in 0i64..=MAX_HTTP_DATE_SECS) {
            let s = format_http_date(secs);
            // Rebuild the same instant in asctime form from the IMF fields.
            let mut a = Vec::new();
            a.extend_from_slice(&s[0..3]);
            a.push(b' ');
            a.extend_from_slice(&s[8..11]);
            a.push(b' ');
            a.extend_from_slice(&s[5..7]);
            a.push(b' ');
            a.extend_from_slice(&s[17..25]);
            a.push(b' ');
            a.extend_from_slice(&s[12..16]);
            prop_assert_eq!(parse_http_date(&a), Some(secs));
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_http_date(&bytes);
        }

        #[test]
        fn format_never_panics(secs in any::<i64>()) {
            let s = format_http_date(secs);
            prop_assert_eq!(
                parse_http_date(&s),
                Some(secs.clamp(MIN_HTTP_DATE_SECS, MAX_HTTP_DATE_SECS))
            );
        }
    }
}
