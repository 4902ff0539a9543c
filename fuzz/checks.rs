//! Invariants checked on every fuzz input, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`) and the stable-Rust smoke test (`tests/fuzz_smoke.rs`), which
//! both include this file with `#[path]`. Each `check_*` takes the raw input bytes, calls one
//! parser and panics when an invariant does not hold (a panic is what libFuzzer reports).
//!
//! Input formats (the seed corpora in `fuzz/corpus/<target>/` follow them):
//! - `request_parser`: the bytes a client sent.
//! - `range_parser`: 8 bytes little-endian file length, 1 byte `max_ranges`, then the Range
//!   header value. Shorter inputs are padded with zeros.
//! - `path_resolver`: the raw request path (query stripped, still percent-encoded).
//! - `origin_response`: the bytes an origin sent (a response head, maybe a body after it).
//! - `proxy_header`: the bytes a balancer sent first (a PROXY v1 or v2 header, then data).
//! - `journal_record`: the bytes of a cache journal (records, torn or damaged).
#![allow(dead_code)]

use shardline::cache::journal::{replay_into, Decoded, Record, FRAME_BYTES, MAX_RECORD_BYTES};
use shardline::client::proxy_protocol::{self, Parse, MAX_HEADER_BYTES, V1_MAX_BYTES};
use shardline::fs::resolve::{resolve_target, MAX_PATH_BYTES, MAX_SEGMENT_BYTES};
use shardline::http::range::{parse_range, RangeOutcome};
use shardline::http::request::{parse_request, Parsed, MAX_HEAD_BYTES, MAX_REQUEST_LINE_BYTES};
use shardline::origin::response::{self as origin_response, MAX_RESPONSE_HEAD_BYTES};

/// Splits a `range_parser` input into (file length, max_ranges, header value).
pub fn split_range_input(data: &[u8]) -> (u64, usize, &[u8]) {
    let mut len = [0u8; 8];
    for (dst, src) in len.iter_mut().zip(data) {
        *dst = *src;
    }
    let max = usize::from(data.get(8).copied().unwrap_or(0));
    let header = data.get(9..).unwrap_or_default();
    (u64::from_le_bytes(len), max, header)
}

/// Builds a `range_parser` input (for seeds and the property test).
pub fn range_input(file_len: u64, max_ranges: u8, header: &[u8]) -> Vec<u8> {
    let mut v = file_len.to_le_bytes().to_vec();
    v.push(max_ranges);
    v.extend_from_slice(header);
    v
}

/// `parse_request`: no panic; statuses from the documented set; a complete head is well
/// formed; and the prefix property (every prefix parses as `Partial` or as the same result,
/// and the head alone parses as the same `Complete`).
pub fn check_request_input(data: &[u8]) {
    let full = parse_request(data);
    match full {
        Parsed::Complete { request, head_len } => {
            assert!(
                head_len > 0 && head_len <= data.len(),
                "head_len {head_len}"
            );
            assert!(
                head_len <= MAX_HEAD_BYTES,
                "head_len {head_len} over the limit"
            );
            assert_eq!(
                request.path.first(),
                Some(&b'/'),
                "path must start with '/'"
            );
            assert!(
                !request.path.iter().any(|&b| b == b'?' || b == b'#'),
                "query or fragment left in the path"
            );
            assert!(request.path.len() < MAX_REQUEST_LINE_BYTES);
            assert!(
                data[..head_len].ends_with(b"\r\n\r\n"),
                "a complete head ends with an empty line"
            );
            // The head alone is the same request; so is the head plus anything after it.
            assert_eq!(parse_request(&data[..head_len]), full, "head alone differs");
        }
        Parsed::Rejected(r) => {
            assert!(
                matches!(r.status, 400 | 405 | 414 | 431 | 501 | 505),
                "unexpected reject status {}",
                r.status
            );
        }
        Parsed::Partial => {
            assert!(
                data.len() <= MAX_HEAD_BYTES,
                "over-long input still Partial"
            );
        }
    }
    // A few prefixes, chosen from the data so every input exercises different cuts.
    let n = data.len();
    let cuts = [
        n / 2,
        n.saturating_sub(1),
        usize::from(data.first().copied().unwrap_or(0)) % (n + 1),
        n.saturating_sub(usize::from(data.last().copied().unwrap_or(0)) % (n + 1)),
    ];
    for k in cuts {
        let p = parse_request(&data[..k]);
        let consistent = match (&p, &full) {
            (Parsed::Partial, _) => true,
            (a, b) => a == b,
        };
        assert!(
            consistent,
            "prefix {k} of {n}: {p:?} but whole input: {full:?}"
        );
    }
}

/// `parse_range`: no panic; every range inside the file, non-empty, disjoint and non-adjacent
/// (in request order, so not sorted); never more parts than `max_ranges`; never more bytes
/// than the file.
pub fn check_range_input(data: &[u8]) {
    let (file_len, max_ranges, header) = split_range_input(data);
    match parse_range(header, file_len, max_ranges) {
        RangeOutcome::Full => {}
        RangeOutcome::Unsatisfiable => {}
        RangeOutcome::Single(r) => {
            assert!(r.start < r.end, "empty single range {r:?}");
            assert!(r.end <= file_len, "{r:?} past the end of {file_len}");
            assert!(max_ranges >= 1, "a range with max_ranges 0");
        }
        RangeOutcome::Multi(rs) => {
            assert!(rs.len() >= 2, "Multi with {} part(s)", rs.len());
            assert!(
                rs.len() <= max_ranges,
                "{} parts over max {max_ranges}",
                rs.len()
            );
            let mut sum: u64 = 0;
            for r in &rs {
                assert!(r.start < r.end, "empty part {r:?}");
                assert!(r.end <= file_len, "{r:?} past the end of {file_len}");
                sum = sum.checked_add(r.len()).expect("sum overflows");
            }
            assert!(sum <= file_len, "parts add up to {sum} > {file_len}");
            // Parts come in request order (RFC 9110 §15.3.7.2); by offset they are apart.
            let mut by_start = rs.clone();
            by_start.sort_unstable_by_key(|r| r.start);
            for w in by_start.windows(2) {
                assert!(w[0].end < w[1].start, "parts overlap or touch: {w:?}");
            }
        }
    }
}

/// `resolve_target`: every accepted path is relative, normalised and harmless, resolving it
/// again (re-encoded) gives the same path, and a path that climbs out is never accepted.
pub fn check_path_input(data: &[u8]) {
    let Ok(r) = resolve_target(data) else {
        return;
    };
    let p = r.rel_path.as_str();
    assert!(!p.starts_with('/'), "leading '/': {p:?}");
    assert!(!p.bytes().any(|b| b == 0), "NUL in {p:?}");
    assert!(!p.contains('\\'), "backslash in {p:?}");
    assert!(
        !p.bytes().any(|b| b < 0x20 || b == 0x7f),
        "control byte in {p:?}"
    );
    assert!(p.len() <= MAX_PATH_BYTES, "{} bytes", p.len());
    if !p.is_empty() {
        for seg in p.split('/') {
            assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "bad segment {seg:?} in {p:?}"
            );
            assert!(
                seg.len() <= MAX_SEGMENT_BYTES,
                "segment of {} bytes",
                seg.len()
            );
        }
    } else {
        assert!(r.wants_dir, "the root must be a directory request");
    }
    // Beneath the root, judged by an independent model: decode once, walk the segments, and
    // if the depth ever goes below the root the resolver must have refused the path.
    if model_escapes(data) {
        panic!(
            "{:?} climbs above the root but resolved to {p:?}",
            String::from_utf8_lossy(data)
        );
    }
    let again = reencode(p);
    let r2 = resolve_target(again.as_bytes()).expect("a resolved path resolves again");
    assert_eq!(r2.rel_path, r.rel_path, "resolution is not idempotent");
}

/// True when `raw`, percent-decoded once (malformed escapes give false: the resolver refuses
/// those anyway), has a `..` segment that climbs above the root.
fn model_escapes(raw: &[u8]) -> bool {
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) if !hex.is_some_and(|h| h.starts_with('+')) => decoded.push(b),
                _ => return false,
            }
            i += 3;
        } else {
            decoded.push(raw[i]);
            i += 1;
        }
    }
    let mut depth: i64 = 0;
    for seg in decoded.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// `/` + `rel` with '%' written as `%25`, so resolving it yields `rel` again.
fn reencode(rel: &str) -> String {
    let mut s = String::with_capacity(rel.len() + 1);
    s.push('/');
    for ch in rel.chars() {
        if ch == '%' {
            s.push_str("%25");
        } else {
            s.push(ch);
        }
    }
    s
}

/// The origin response head parser: no panic; a complete head lies inside the buffer and the
/// limit and ends with an empty line; every prefix of a complete head is incomplete or the
/// same error (what the fetch relies on to parse only when `head_may_end` says so), and the
/// end scan never misses the receive that completes it. The framing decision does not depend
/// on how the bytes were split (issue 45): every prefix is incomplete, or the same head, or a
/// refusal where the whole is refused too.
pub fn check_origin_response_input(data: &[u8]) {
    let whole = origin_response::parse(data);
    for n in 0..=data.len() {
        match origin_response::parse(&data[..n]) {
            Ok(None) => {}
            Ok(Some(head)) => assert_eq!(Ok(Some(head)), whole, "a split at {n} decides otherwise"),
            Err(e) => assert!(
                whole.is_err(),
                "a split at {n} refuses ({e:?}), the whole does not"
            ),
        }
    }
    if let Ok(Some(head)) = &whole {
        assert!(head.head_len <= data.len() && head.head_len <= MAX_RESPONSE_HEAD_BYTES);
        let h = &data[..head.head_len];
        assert!(
            h.ends_with(b"\n\n") || h.ends_with(b"\n\r\n"),
            "head without an end"
        );
        assert!(
            origin_response::head_may_end(h, 0),
            "the end scan misses a whole head"
        );
        for n in 0..head.head_len {
            assert!(
                !matches!(origin_response::parse(&data[..n]), Ok(Some(_))),
                "a head complete before its end at {n}"
            );
        }
        assert_eq!(
            origin_response::parse(h),
            whole,
            "the head alone parses the same"
        );
    }
}

/// The PROXY header parser: no panic; a whole header is inside the buffer and its bounds (v1
/// at most `V1_MAX_BYTES`, any at most `MAX_HEADER_BYTES`); every prefix of it is incomplete
/// (so a header split over receives is waited for, never misread); bytes after it change
/// nothing.
pub fn check_proxy_input(data: &[u8]) {
    match proxy_protocol::parse(data) {
        Parse::Done { len, source } => {
            assert!(
                len > 0 && len <= data.len() && len <= MAX_HEADER_BYTES,
                "len {len}"
            );
            if data.starts_with(b"PROXY ") {
                assert!(len <= V1_MAX_BYTES, "a v1 header of {len} bytes");
            }
            for n in 0..len {
                assert_eq!(
                    proxy_protocol::parse(&data[..n]),
                    Parse::Incomplete,
                    "prefix {n}"
                );
            }
            assert_eq!(
                proxy_protocol::parse(&data[..len]),
                Parse::Done { len, source }
            );
        }
        Parse::Incomplete => assert!(data.len() <= MAX_HEADER_BYTES, "waits past the bound"),
        Parse::Invalid(_) => {}
    }
}

/// The journal record parser: no panic on any bytes; a record it accepts lies inside the
/// buffer, passes `validate` and encodes back to the same bytes (a record of the older
/// format, without the origin's contract, to the same record with the defaults); replay
/// never reads past the buffer.
pub fn check_journal_input(data: &[u8]) {
    match Record::decode(data) {
        Decoded::Record(r, n) => {
            assert!(n <= data.len() && n <= FRAME_BYTES + MAX_RECORD_BYTES);
            assert_eq!(r.validate(), Ok(()));
            let mut again = Vec::new();
            r.encode(&mut again);
            if again.len() == n {
                assert_eq!(
                    again,
                    &data[..n],
                    "an accepted record encodes back differently"
                );
            } else {
                // An older record, written now with its defaults: the same record.
                assert!(again.len() > n, "a record encodes back shorter");
                assert_eq!(Record::decode(&again), Decoded::Record(r, again.len()));
            }
        }
        Decoded::Refused(_, n) => assert!(n <= data.len()),
        Decoded::Incomplete | Decoded::Corrupt => {}
    }
    let mut index = Default::default();
    let mut stats = Default::default();
    let (used, _) = replay_into(data, &mut index, &mut stats);
    assert!(
        used <= data.len(),
        "replay used {used} of {} bytes",
        data.len()
    );
}
