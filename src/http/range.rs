//! `Range: bytes=...` (RFC 9110 §14) with nginx's defensive semantics.
//!
//! Ranges are half-open `[start, end)` internally (the `Content-Range` writer converts). Digits
//! accumulate with saturating arithmetic, the number of specs is capped, and a multi-range
//! request whose parts add up to more than the file is answered with the whole file, as nginx
//! does: both stop a tiny request from costing a huge response.

/// Default cap on range specs per request (config `max_ranges`); more than this and the Range
/// header is ignored (200 with the whole body, as nginx does beyond its `max_ranges`).
///
/// Each part of a multipart/byteranges response costs a part header, a separate read and a
/// send, so many tiny ranges are a cheap way to make an edge do a lot of work (the Apache
/// "Range: bytes=0-,5-0,5-1,..." DoS, CVE-2011-3192). nginx is unlimited by default and Apache
/// 2.4 allows 200; update clients (and media players) ask for one range, sometimes a handful,
/// so 16 leaves room for legitimate use while bounding the per-request work and the size of the
/// `Vec` we return.
pub const MAX_RANGES: usize = 16;

/// Half-open byte range [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte offset included.
    pub start: u64,
    /// First byte offset not included.
    pub end: u64,
}

impl ByteRange {
    /// Number of bytes in the range (0 if malformed, never negative).
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True when the range holds no bytes (never the case for ranges `parse_range` returns).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Last byte offset included, as `Content-Range` writes it.
    pub fn end_inclusive(&self) -> u64 {
        self.end.saturating_sub(1)
    }
}

/// What to send for a Range header against a file of a given length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Ignore the header: 200 with the whole body (malformed, too many, or too large in sum).
    Full,
    /// 206 with one Content-Range.
    Single(ByteRange),
    /// 206 multipart/byteranges; disjoint and non-adjacent, at least two, in request order.
    Multi(Vec<ByteRange>),
    /// 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

/// One syntactically valid range-spec, before looking at the file length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spec {
    /// `first-` or `first-last` (inclusive), last >= first.
    Int { first: u64, last: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix(u64),
}

/// Decimal digits, saturating at u64::MAX instead of overflowing.
///
/// Saturation is the right overflow answer for every position: a huge first-pos is past any
/// file (unsatisfiable), a huge last-pos is clipped to the end, a huge suffix means "all of it".
fn parse_saturating(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut acc: u64 = 0;
    for &b in s {
        let d = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc = acc
            .checked_mul(10)
            .and_then(|a| a.checked_add(u64::from(d)))
            .unwrap_or(u64::MAX);
    }
    Some(acc)
}

fn parse_spec(element: &[u8]) -> Option<Spec> {
    let dash = element.iter().position(|&b| b == b'-')?;
    let (left, right) = element.split_at(dash);
    // Skip the dash itself; spaces around it are tolerated, as nginx does.
    let right = right.get(1..)?.trim_ascii();
    let left = left.trim_ascii();
    if left.is_empty() {
        return parse_saturating(right).map(Spec::Suffix);
    }
    let first = parse_saturating(left)?;
    if right.is_empty() {
        return Some(Spec::Int { first, last: None });
    }
    let last = parse_saturating(right)?;
    if last < first {
        return None;
    }
    Some(Spec::Int {
        first,
        last: Some(last),
    })
}

/// The part of the file a spec selects, or None when it is unsatisfiable (RFC 9110 §14.1.1).
fn satisfy(spec: Spec, file_len: u64) -> Option<ByteRange> {
    match spec {
        Spec::Int { first, last } => {
            if first >= file_len {
                return None;
            }
            let end = last.map_or(file_len, |l| l.saturating_add(1).min(file_len));
            Some(ByteRange { start: first, end })
        }
        Spec::Suffix(n) => {
            if n == 0 || file_len == 0 {
                return None;
            }
            Some(ByteRange {
                start: file_len.saturating_sub(n),
                end: file_len,
            })
        }
    }
}

/// Merges overlapping or adjacent ranges in place, keeping the order of the request.
///
/// A merged range takes the place of the earliest of its members: RFC 9110 §15.3.7.2 asks
/// for the parts in the order their range-specs appeared, less those coalesced into others.
/// Sorting by offset is only how overlaps are found.
fn coalesce(ranges: &mut Vec<ByteRange>) {
    // (range, position of its earliest member in the request)
    let mut by_start: Vec<(ByteRange, usize)> =
        ranges.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    by_start.sort_unstable_by_key(|(r, _)| (r.start, r.end));
    let mut merged: Vec<(ByteRange, usize)> = Vec::with_capacity(by_start.len());
    for (r, i) in by_start {
        match merged.last_mut() {
            Some((prev, first)) if r.start <= prev.end => {
                prev.end = prev.end.max(r.end);
                *first = (*first).min(i);
            }
            _ => merged.push((r, i)),
        }
    }
    merged.sort_unstable_by_key(|(_, first)| *first);
    ranges.clear();
    ranges.extend(merged.into_iter().map(|(r, _)| r));
}

/// Interprets a Range header value for a file of `file_len` bytes.
///
/// `bytes=a-b`, `bytes=a-`, `bytes=-n` and comma lists of them (optional whitespace). The unit
/// is case-insensitive. A malformed header, another unit, `a > b`, more than `max_ranges` specs
/// (0 disables ranges) or parts adding up to more than the file give `Full`. Specs starting at
/// or past the end are dropped; if none is left, `Unsatisfiable` (always so for an empty file).
/// Overlapping or adjacent ranges are coalesced, the rest keep the request's order; if they
/// merge into one, the answer is `Single`.
/// Only a request with two or more satisfiable ranges allocates.
pub fn parse_range(header: &[u8], file_len: u64, max_ranges: usize) -> RangeOutcome {
    let header = header.trim_ascii();
    let Some((unit, set)) = header.split_at_checked(6) else {
        return RangeOutcome::Full;
    };
    if !unit.eq_ignore_ascii_case(b"bytes=") {
        return RangeOutcome::Full;
    }

    let mut specs: usize = 0;
    let mut sum: u64 = 0;
    let mut first: Option<ByteRange> = None;
    let mut more: Vec<ByteRange> = Vec::new();
    for element in set.split(|&b| b == b',') {
        let element = element.trim_ascii();
        if element.is_empty() {
            // Empty list elements are allowed by the list rule (RFC 9110 §5.6.1.2).
            continue;
        }
        specs = specs.saturating_add(1);
        if specs > max_ranges {
            return RangeOutcome::Full;
        }
        let Some(spec) = parse_spec(element) else {
            return RangeOutcome::Full;
        };
        if let Some(r) = satisfy(spec, file_len) {
            sum = sum.saturating_add(r.len());
            if first.is_none() {
                first = Some(r);
            } else {
                more.push(r);
            }
        }
    }
    if specs == 0 {
        return RangeOutcome::Full;
    }
    let Some(first) = first else {
        return RangeOutcome::Unsatisfiable;
    };
    if sum > file_len {
        return RangeOutcome::Full;
    }
    if more.is_empty() {
        return RangeOutcome::Single(first);
    }
    more.insert(0, first);
    coalesce(&mut more);
    match more.as_slice() {
        [only] => RangeOutcome::Single(*only),
        _ => RangeOutcome::Multi(more),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use RangeOutcome::*;

    fn r(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    fn p(h: &str, len: u64) -> RangeOutcome {
        parse_range(h.as_bytes(), len, MAX_RANGES)
    }

    #[test]
    fn single_forms() {
        assert_eq!(p("bytes=0-499", 1000), Single(r(0, 500)));
        assert_eq!(p("bytes=500-999", 1000), Single(r(500, 1000)));
        assert_eq!(p("bytes=500-", 1000), Single(r(500, 1000)));
        assert_eq!(p("bytes=-500", 1000), Single(r(500, 1000)));
        assert_eq!(p("bytes=0-0", 1000), Single(r(0, 1)));
        assert_eq!(p("bytes=999-999", 1000), Single(r(999, 1000)));
        assert_eq!(
            p("BYTES=0-1", 1000),
            Single(r(0, 2)),
            "unit is case-insensitive"
        );
        assert_eq!(p("  bytes= 0 - 1 ", 1000), Single(r(0, 2)));
        assert_eq!(
            p("bytes=0-999", 1000),
            Single(r(0, 1000)),
            "whole file is still 206"
        );
    }

    #[test]
    fn clipping_and_suffix() {
        assert_eq!(p("bytes=500-5000", 1000), Single(r(500, 1000)));
        assert_eq!(p("bytes=-5000", 1000), Single(r(0, 1000)));
        assert_eq!(p("bytes=-1000", 1000), Single(r(0, 1000)));
        assert_eq!(p("bytes=-1", 1), Single(r(0, 1)));
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(p("bytes=1000-", 1000), Unsatisfiable);
        assert_eq!(p("bytes=1000-2000", 1000), Unsatisfiable);
        assert_eq!(p("bytes=1000-,2000-3000", 1000), Unsatisfiable);
        assert_eq!(p("bytes=-0", 1000), Unsatisfiable, "zero-length suffix");
        assert_eq!(p("bytes=0-", 0), Unsatisfiable);
        assert_eq!(p("bytes=0-0", 0), Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), Unsatisfiable);
        // One satisfiable spec among unsatisfiable ones is enough.
        assert_eq!(p("bytes=2000-,0-9", 1000), Single(r(0, 10)));
    }

    #[test]
    fn overflow_never_panics() {
        let max = u64::MAX;
        assert_eq!(p("bytes=0-18446744073709551615", 1000), Single(r(0, 1000)));
        assert_eq!(p("bytes=0-18446744073709551616", 1000), Single(r(0, 1000)));
        assert_eq!(
            p("bytes=0-99999999999999999999999999", 10),
            Single(r(0, 10))
        );
        assert_eq!(p("bytes=18446744073709551615-", 1000), Unsatisfiable);
        assert_eq!(p("bytes=18446744073709551616-", 1000), Unsatisfiable);
        assert_eq!(p("bytes=-18446744073709551616", 1000), Single(r(0, 1000)));
        assert_eq!(p("bytes=-18446744073709551615", max), Single(r(0, max)));
        assert_eq!(p("bytes=0-18446744073709551615", max), Single(r(0, max)));
        assert_eq!(
            p("bytes=18446744073709551614-", max),
            Single(r(max - 1, max))
        );
        assert_eq!(
            p("bytes=000000000000000000000000001-2", 10),
            Single(r(1, 3))
        );
    }

    #[test]
    fn malformed_is_ignored() {
        for h in [
            "",
            "bytes",
            "bytes=",
            "bytes=,",
            "bytes=-",
            "bytes=5-3",
            "bytes=a-b",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=0x10-",
            "bytes=1-2,x",
            "bytes 0-1",
            "bytes =0-1",
            "items=0-1",
            "bytes=--1",
            "bytes=1",
            "bytes=1-2;3-4",
            "bytes=\u{0}0-1",
        ] {
            assert_eq!(p(h, 1000), Full, "{h:?}");
        }
        // Malformed beats an empty file: the header is ignored before the length matters.
        assert_eq!(p("bytes=5-3", 0), Full);
    }

    #[test]
    fn multi_in_request_order_and_coalesced() {
        assert_eq!(p("bytes=0-9,20-29", 1000), Multi(vec![r(0, 10), r(20, 30)]));
        assert_eq!(
            p("bytes=20-29, 0-9", 1000),
            Multi(vec![r(20, 30), r(0, 10)]),
            "request order, not offset order"
        );
        assert_eq!(p("bytes=0-9,10-19", 1000), Single(r(0, 20)), "adjacent");
        assert_eq!(p("bytes=10-19,0-9", 1000), Single(r(0, 20)), "adjacent");
        assert_eq!(p("bytes=0-9,5-14", 1000), Single(r(0, 15)), "overlapping");
        assert_eq!(
            p("bytes=0-9,5-14,100-109,-10", 1000),
            Multi(vec![r(0, 15), r(100, 110), r(990, 1000)])
        );
        assert_eq!(
            p("bytes=-10,100-109,5-14,0-9", 1000),
            Multi(vec![r(990, 1000), r(100, 110), r(0, 15)])
        );
        // A merged range stands where its earliest member stood.
        assert_eq!(
            p("bytes=500-509,100-109,0-9,5-14", 1000),
            Multi(vec![r(500, 510), r(100, 110), r(0, 15)])
        );
        assert_eq!(
            p("bytes=500-509,5-14,100-109,0-4", 1000),
            Multi(vec![r(500, 510), r(0, 15), r(100, 110)])
        );
        assert_eq!(
            p("bytes=200-209,10-19,0-9,100-109", 1000),
            Multi(vec![r(200, 210), r(0, 20), r(100, 110)])
        );
        // Unsatisfiable specs drop out without disturbing the others' order.
        assert_eq!(
            p("bytes=50-59,5000-,0-9", 1000),
            Multi(vec![r(50, 60), r(0, 10)])
        );
        assert_eq!(p("bytes=0-1,,,4-5", 10), Multi(vec![r(0, 2), r(4, 6)]));
        assert_eq!(p("bytes=4-5,,,0-1", 10), Multi(vec![r(4, 6), r(0, 2)]));
    }

    #[test]
    fn caps() {
        let sixteen = (0..16)
            .map(|i| format!("{}-{}", i * 10, i * 10 + 1))
            .collect::<Vec<_>>()
            .join(",");
        assert!(matches!(p(&format!("bytes={sixteen}"), 1000), Multi(v) if v.len() == 16));
        assert_eq!(p(&format!("bytes={sixteen},500-501"), 1000), Full);
        // Unsatisfiable specs count too: the cap is about work done parsing.
        assert_eq!(parse_range(b"bytes=0-1,5000-", 1000, 1), Full);
        assert_eq!(
            parse_range(b"bytes=0-1", 1000, 0),
            Full,
            "0 disables ranges"
        );
        // Parts adding up to more than the file: whole file (nginx).
        assert_eq!(p("bytes=0-,0-", 1000), Full);
        assert_eq!(p("bytes=0-599,400-999", 1000), Full);
        assert_eq!(p("bytes=0-499,400-899", 1000), Single(r(0, 900)));
    }

    #[test]
    fn byte_range_helpers() {
        assert_eq!(r(5, 10).len(), 5);
        assert_eq!(r(5, 10).end_inclusive(), 9);
        assert!(r(5, 5).is_empty());
        assert_eq!(r(10, 5).len(), 0);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(h in proptest::collection::vec(any::<u8>(), 0..64),
                                       len in any::<u64>()) {
            let _ = parse_range(&h, len, MAX_RANGES);
        }

        #[test]
        fn returned_ranges_are_in_bounds(
            specs in proptest::collection::vec(
                (proptest::option::of(any::<u64>().prop_map(|v| v % 2000)),
                 proptest::option::of(prop_oneof![any::<u64>(), 0u64..2000])),
                1..20),
            len in prop_oneof![0u64..1500, any::<u64>()],
            max in 0usize..20,
        ) {
            let h = specs.iter().map(|(a, b)| {
                format!("{}-{}",
                    a.map(|v| v.to_string()).unwrap_or_default(),
                    b.map(|v| v.to_string()).unwrap_or_default())
            }).collect::<Vec<_>>().join(", ");
            let h = format!("bytes={h}");
            let ok = |x: &ByteRange| x.start < x.end && x.end <= len;
            match parse_range(h.as_bytes(), len, max) {
                Full | Unsatisfiable => {}
                Single(x) => prop_assert!(ok(&x), "{h} {len} {x:?}"),
                Multi(v) => {
                    prop_assert!(v.len() >= 2 && v.len() <= max);
                    prop_assert!(v.iter().all(ok), "{h} {len} {v:?}");
                    let mut sorted = v.clone();
                    sorted.sort_unstable_by_key(|x| x.start);
                    prop_assert!(sorted.windows(2).all(|w| w[0].end < w[1].start), "{v:?}");
                    prop_assert!(v.iter().map(|x| x.len()).sum::<u64>() <= len);
                }
            }
        }
    }
}
