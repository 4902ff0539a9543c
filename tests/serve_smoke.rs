//! Smoke test: the real binary serves a small and a large file byte-exact over loopback.

mod common;
use common::*;

#[test]
fn serves_small_and_large_files_byte_exact() {
    let dir = disk_tempdir();
    let small = pattern(1000);
    let large = pattern(20 << 20);
    std::fs::write(dir.path().join("small.txt"), &small).unwrap();
    std::fs::write(dir.path().join("large.bin"), &large).unwrap();
    let root = dir.path().to_path_buf();
    let server = Server::start_owning(dir, &root, &[]);
    let r = get(&server, "/small.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, small);
    let r = get(&server, "/large.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == large, "large body differs");
    let r = get(&server, "/large.bin", &[("Range", "bytes=1000-3000999")]);
    assert_eq!(r.status, 206);
    assert!(r.body == large[1000..3001000], "ranged body differs");
}
