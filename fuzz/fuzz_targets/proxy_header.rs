//! cargo-fuzz target; the invariants live in `fuzz/checks.rs`, shared with the stable-Rust
//! smoke test `tests/fuzz_smoke.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::check_proxy_input(data);
});
