//! HTTP-date (RFC 9110 §5.6.7): formatting as IMF-fixdate, parsing all three historic forms,
//! and a per-shard cache so the `Date` header is formatted once per second, not per response.
//!
//! Pure integer arithmetic (Howard Hinnant's civil-calendar algorithms): no chrono, no libc
//! time zone state, no allocation.

/// Length in bytes of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
pub const HTTP_DATE_BYTES: usize = 29;

/// Earliest instant an IMF-fixdate can carry (0001-01-01T00:00:00Z): its year has 4 digits.
pub const MIN_HTTP_DATE_SECS: i64 = -62_135_596_800;

/// Latest instant an IMF-fixdate can carry (9999-12-31T23:59:59Z): its year has 4 digits.
pub const MAX_HTTP_DATE_SECS: i64 = 253_402_300_799;

/// Longest input `parse_http_date` looks at; anything longer is not a date (RFC 850 is 33).
pub const MAX_HTTP_DATE_INPUT_BYTES: usize = 64;

const SECS_PER_DAY: i64 = 86_400;

const DAY_NAMES: [&[u8; 3]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];

const DAY_NAMES_LONG: [&[u8]; 7] = [
    b"Sunday",
    b"Monday",
    b"Tuesday",
    b"Wednesday",
    b"Thursday",
    b"Friday",
    b"Saturday",
];

const MONTH_NAMES: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's `days_from_civil`).
///
/// Callers keep `year` within 0..=9999 so nothing here can overflow an i64.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let month = i64::from(month);
    let day = i64::from(day);
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Proleptic Gregorian (year, month 1..=12, day 1..=31) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small by construction (1..=31, 1..=12); the fallbacks are unreachable.
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

fn is_leap_year(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Two ASCII digits of `v` (0..=99).
fn two_digits(v: i64) -> [u8; 2] {
    let v = v.rem_euclid(100);
    // `v` is 0..=99, so each digit is 0..=9 and fits a u8.
    [b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]
}

/// Formats `unix_secs` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
///
/// Instants outside years 1..=9999 are clamped to the nearest representable one: an IMF-fixdate
/// has exactly four year digits, and a file mtime that far out is nonsense anyway.
pub fn format_http_date(unix_secs: i64) -> [u8; HTTP_DATE_BYTES] {
    let secs = unix_secs.clamp(MIN_HTTP_DATE_SECS, MAX_HTTP_DATE_SECS);
    let days = secs.div_euclid(SECS_PER_DAY);
    let sod = secs.rem_euclid(SECS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 4 with Sunday = 0).
    let weekday = (days + 4).rem_euclid(7);

    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    if let Some(name) = usize::try_from(weekday).ok().and_then(|i| DAY_NAMES.get(i)) {
        out[0..3].copy_from_slice(*name);
    }
    out[5..7].copy_from_slice(&two_digits(i64::from(day)));
    if let Some(name) = MONTH_NAMES.get((month as usize).wrapping_sub(1)) {
        out[8..11].copy_from_slice(*name);
    }
    out[12..14].copy_from_slice(&two_digits(year / 100));
    out[14..16].copy_from_slice(&two_digits(year % 100));
    out[17..19].copy_from_slice(&two_digits(sod / 3_600));
    out[20..22].copy_from_slice(&two_digits(sod / 60 % 60));
    out[23..25].copy_from_slice(&two_digits(sod % 60));
    out
}

/// Value of an all-digit slice, or None (also for an empty slice).
fn parse_digits(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 9 {
        return None;
    }
    s.iter().try_fold(0u32, |acc, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u32::from(d))
    })
}

fn month_from_name(s: &[u8]) -> Option<u32> {
    let i = MONTH_NAMES.iter().position(|m| &m[..] == s)?;
    u32::try_from(i).ok()?.checked_add(1)
}

/// Parses `hh:mm:ss` (exactly 8 bytes) into seconds of the day.
fn parse_time_of_day(s: &[u8]) -> Option<i64> {
    if s.len() != 8 || s.get(2) != Some(&b':') || s.get(5) != Some(&b':') {
        return None;
    }
    let h = parse_digits(s.get(0..2)?)?;
    let m = parse_digits(s.get(3..5)?)?;
    let sec = parse_digits(s.get(6..8)?)?;
    // Leap second 60 is not accepted: an invalid date is simply ignored by the caller, which is
    // the safe outcome for every conditional header.
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some(i64::from(h) * 3_600 + i64::from(m) * 60 + i64::from(sec))
}

fn to_unix(year: i64, month: u32, day: u32, time_of_day: i64) -> Option<i64> {
    if !(1..=9999).contains(&year) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    days_from_civil(year, month, day)
        .checked_mul(SECS_PER_DAY)?
        .checked_add(time_of_day)
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn parse_imf_fixdate(s: &[u8]) -> Option<i64> {
    if s.len() != HTTP_DATE_BYTES
        || !DAY_NAMES.iter().any(|d| Some(&d[..]) == s.get(0..3))
        || s.get(3..5) != Some(b", ")
        || s.get(7) != Some(&b' ')
        || s.get(11) != Some(&b' ')
        || s.get(16) != Some(&b' ')
        || s.get(25..29) != Some(b" GMT")
    {
        return None;
    }
    let day = parse_digits(s.get(5..7)?)?;
    let month = month_from_name(s.get(8..11)?)?;
    let year = parse_digits(s.get(12..16)?)?;
    let tod = parse_time_of_day(s.get(17..25)?)?;
    to_unix(i64::from(year), month, day, tod)
}

/// `Sunday, 06-Nov-94 08:49:37 GMT` (obsolete RFC 850 form).
///
/// Two-digit years 70..=99 mean 19xx and 00..=69 mean 20xx. RFC 9110 asks for "the most recent
/// year in the past with those digits unless more than 50 years ahead", which needs the current
/// time; the fixed pivot gives the same answer until 2040 and keeps this a pure function.
fn parse_rfc850(s: &[u8]) -> Option<i64> {
    let comma = s.iter().position(|&b| b == b',')?;
    let (name, rest) = s.split_at(comma);
    if !DAY_NAMES_LONG.contains(&name) {
        return None;
    }
    // rest = ", 06-Nov-94 08:49:37 GMT"
    if rest.len() != 24
        || rest.get(0..2) != Some(b", ")
        || rest.get(4) != Some(&b'-')
        || rest.get(8) != Some(&b'-')
        || rest.get(11) != Some(&b' ')
        || rest.get(20..24) != Some(b" GMT")
    {
        return None;
    }
    let day = parse_digits(rest.get(2..4)?)?;
    let month = month_from_name(rest.get(5..8)?)?;
    let yy = i64::from(parse_digits(rest.get(9..11)?)?);
    let year = if yy >= 70 { 1900 + yy } else { 2000 + yy };
    let tod = parse_time_of_day(rest.get(12..20)?)?;
    to_unix(year, month, day, tod)
}

/// `Sun Nov  6 08:49:37 1994` (C asctime form; day is space-padded).
fn parse_asctime(s: &[u8]) -> Option<i64> {
    if s.len() != 24
        || !DAY_NAMES.iter().any(|d| Some(&d[..]) == s.get(0..3))
        || s.get(3) != Some(&b' ')
        || s.get(7) != Some(&b' ')
        || s.get(10) != Some(&b' ')
        || s.get(19) != Some(&b' ')
    {
        return None;
    }
    let month = month_from_name(s.get(4..7)?)?;
    let day = match s.get(8..10)? {
        [b' ', d] => parse_digits(std::slice::from_ref(d))?,
        dd => parse_digits(dd)?,
    };
    let tod = parse_time_of_day(s.get(11..19)?)?;
    let year = parse_digits(s.get(20..24)?)?;
    to_unix(i64::from(year), month, day, tod)
}

/// Parses an HTTP-date in any of the three forms RFC 9110 requires recipients to accept.
///
/// Case-sensitive, as the RFC says. The weekday name is checked for spelling but not for
/// agreement with the date: nothing depends on it and other servers ignore it too.
/// Returns seconds since the Unix epoch, or None for anything else.
pub fn parse_http_date(s: &[u8]) -> Option<i64> {
    let s = s.trim_ascii();
    if s.len() > MAX_HTTP_DATE_INPUT_BYTES {
        return None;
    }
    match s.len() {
        HTTP_DATE_BYTES if s.get(3) == Some(&b',') => parse_imf_fixdate(s),
        24 if s.get(3) == Some(&b' ') => parse_asctime(s),
        _ => parse_rfc850(s),
    }
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
        assert_eq!(&format_http_date(-1), b"Wed, 31 Dec 1969 23:59:59 GMT");
    }

    #[test]
    fn limits_match_the_calendar() {
        assert_eq!(days_from_civil(1, 1, 1) * SECS_PER_DAY, MIN_HTTP_DATE_SECS);
        assert_eq!(
            days_from_civil(9999, 12, 31) * SECS_PER_DAY + SECS_PER_DAY - 1,
            MAX_HTTP_DATE_SECS
        );
        assert_eq!(
            &format_http_date(i64::MAX),
            b"Fri, 31 Dec 9999 23:59:59 GMT"
        );
        assert_eq!(
            &format_http_date(i64::MIN),
            b"Mon, 01 Jan 0001 00:00:00 GMT"
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
        c.refresh(784_111_778);
        assert_eq!(c.header_value(), b"Sun, 06 Nov 1994 08:49:38 GMT");
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
            prop_assert!(parse_http_date(&s).is_some());
        }
    }
}
