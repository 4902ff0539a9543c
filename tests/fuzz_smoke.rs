//! Stable-Rust stand-in for the cargo-fuzz targets: every seed in `fuzz/corpus/<target>/` and a
//! few thousand generated inputs go through the same invariant checks the fuzz targets run
//! (`fuzz/checks.rs`), so CI exercises the parsers without nightly or libFuzzer.

#[path = "../fuzz/checks.rs"]
mod checks;

use proptest::prelude::*;
use std::path::Path;

/// Runs `check` on every file of `fuzz/corpus/<target>/`; returns how many there were.
fn run_corpus(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        let name = path.display().to_string();
        if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
            panic!("{name}: {e:?}");
        }
        n += 1;
    }
    n
}

#[test]
fn request_corpus() {
    assert!(run_corpus("request_parser", checks::check_request_input) >= 20);
}

#[test]
fn range_corpus() {
    assert!(run_corpus("range_parser", checks::check_range_input) >= 10);
}

#[test]
fn path_corpus() {
    assert!(run_corpus("path_resolver", checks::check_path_input) >= 10);
}

#[test]
fn origin_response_corpus() {
    assert!(run_corpus("origin_response", checks::check_origin_response_input) >= 10);
}

#[test]
fn proxy_corpus() {
    assert!(run_corpus("proxy_header", checks::check_proxy_input) >= 10);
}

#[test]
fn journal_corpus() {
    assert!(run_corpus("journal_record", checks::check_journal_input) >= 8);
    // The seeds' checksums are right (else every seed would only test the checksum).
    let seed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/journal_record/object-and-block");
    let bytes = std::fs::read(seed).expect("seed");
    assert!(matches!(
        shardline::cache::journal::Record::decode(&bytes),
        shardline::cache::journal::Decoded::Record(..)
    ));
}

/// Pieces origin response heads are made of.
fn origin_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("HTTP/1.1 206 Partial Content\r\n".to_string()),
        Just("HTTP/1.0 200 OK\n".to_string()),
        Just("Content-Length: 10\r\n".to_string()),
        Just("Content-Length: 99999999999999999999999\r\n".to_string()),
        Just("Content-Range: bytes 0-9/10\r\n".to_string()),
        Just("Content-Range: bytes 9-0/*\r\n".to_string()),
        Just("Transfer-Encoding: chunked\r\n".to_string()),
        Just("Transfer-Encoding: identity\r\n".to_string()),
        Just("Content-Length: +10\r\n".to_string()),
        Just("HTTP/1.1 100 Continue\r\n\r\n".to_string()),
        Just("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n".to_string()),
        Just("Connection: keep-alive, close\r\n".to_string()),
        Just("ETag: \"\u{e9}\"\r\n".to_string()),
        Just("\r\n".to_string()),
        Just("\n".to_string()),
        "[ -~]{0,12}",
    ]
}

/// PROXY v1 lines and v2 headers, whole or in pieces.
fn proxy_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"PROXY ".to_vec()),
        Just(b"TCP4 192.0.2.1 198.51.100.2 1 2\r\n".to_vec()),
        Just(b"TCP6 ::1 ::2 1 2\r\n".to_vec()),
        Just(b"UNKNOWN\r\n".to_vec()),
        Just(b"\r\n\r\n\x00\r\nQUIT\n".to_vec()),
        Just(vec![
            0x21, 0x11, 0, 12, 192, 0, 2, 1, 198, 51, 100, 2, 0, 1, 0, 2
        ]),
        Just(vec![0x20, 0x00, 0, 0]),
        Just(vec![0x21, 0x21, 0, 36]),
        prop::collection::vec(any::<u8>(), 0..8),
    ]
}

/// Pieces hostile paths are made of.
fn path_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        Just("%2e".to_string()),
        Just("%2E".to_string()),
        Just("%252e".to_string()),
        Just("%%32%65".to_string()),
        Just("%2f".to_string()),
        Just("%5c".to_string()),
        Just("\\".to_string()),
        Just("%c0%af".to_string()),
        Just("%c0%ae".to_string()),
        Just("%00".to_string()),
        Just("\0".to_string()),
        Just("%".to_string()),
        Just("%C3%A9".to_string()),
        Just("//".to_string()),
        "[a-z.]{1,4}",
        "%[0-9a-fA-F]{2}",
    ]
}

fn hostile_path() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(path_piece(), 0..16).prop_map(|v| {
        let mut s = String::from("/");
        s.push_str(&v.concat());
        s.into_bytes()
    })
}

/// Pieces hostile request heads are made of.
fn head_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("GET ".to_string()),
        Just("HEAD ".to_string()),
        Just("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string()),
        Just("/ HTTP/1.1\r\n".to_string()),
        Just("/ HTTP/1.0\r\n".to_string()),
        Just("/\r\n".to_string()),
        Just("Host: a\r\n".to_string()),
        Just("Content-Length: 0\r\n".to_string()),
        Just("Content-Length: +5\r\n".to_string()),
        Just("Content-Length: 0x10\r\n".to_string()),
        Just("Transfer-Encoding: chunked\r\n".to_string()),
        Just("Range: bytes=0-1,5-\r\n".to_string()),
        Just("Connection: close\r\n".to_string()),
        Just("X: a\r\n b\r\n".to_string()),
        Just("X: a\rb\r\n".to_string()),
        Just("X: a\0b\r\n".to_string()),
        Just("\r\n".to_string()),
        Just("\n".to_string()),
        Just("\r".to_string()),
        "[ -~]{0,12}",
    ]
}

fn hostile_head() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(head_piece(), 0..12).prop_map(|v| v.concat().into_bytes())
}

fn range_header() -> impl Strategy<Value = String> {
    let spec = prop_oneof![
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| format!("{a}-{b}")),
        any::<u16>().prop_map(|a| format!("{a}-")),
        any::<u16>().prop_map(|a| format!("-{a}")),
        Just("0-18446744073709551615".to_string()),
        Just("18446744073709551615-".to_string()),
        Just("-18446744073709551616".to_string()),
        Just("99999999999999999999999-".to_string()),
        "[0-9 ,-]{0,8}",
    ];
    prop::collection::vec(spec, 0..24).prop_map(|v| format!("bytes={}", v.join(",")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn generated_paths(raw in hostile_path()) {
        checks::check_path_input(&raw);
    }

    #[test]
    fn arbitrary_paths(raw in prop::collection::vec(any::<u8>(), 0..64)) {
        checks::check_path_input(&raw);
    }

    #[test]
    fn generated_heads(raw in hostile_head()) {
        checks::check_request_input(&raw);
    }

    #[test]
    fn arbitrary_heads(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        checks::check_request_input(&raw);
    }

    #[test]
    fn generated_ranges(
        len in prop_oneof![0u64..100_000, Just(u64::MAX), any::<u64>()],
        max in 0u8..32,
        header in range_header(),
    ) {
        checks::check_range_input(&checks::range_input(len, max, header.as_bytes()));
    }

    #[test]
    fn arbitrary_ranges(raw in prop::collection::vec(any::<u8>(), 0..64)) {
        checks::check_range_input(&raw);
    }

    #[test]
    fn generated_origin_responses(raw in prop::collection::vec(origin_piece(), 0..10)) {
        checks::check_origin_response_input(raw.concat().as_bytes());
    }

    #[test]
    fn arbitrary_origin_responses(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        checks::check_origin_response_input(&raw);
    }

    #[test]
    fn generated_proxy_headers(raw in prop::collection::vec(proxy_piece(), 0..4)) {
        checks::check_proxy_input(&raw.concat());
    }

    #[test]
    fn arbitrary_journal_bytes(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        checks::check_journal_input(&raw);
    }
}
