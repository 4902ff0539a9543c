//! Validators are the same on every edge of a fleet: two roots holding the same bytes under
//! different inodes (a copy with its mtime preserved, as `rsync -a` makes) served by two
//! server instances give the same ETag and Last-Modified, and a download resumed on the
//! second edge with `Range` + `If-Range: <ETag from the first>` gets 206 with exactly the
//! remaining bytes. With `etag = "xattr"` the published digest is the tag, whatever the mtime.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;

const FILE_BYTES: usize = 3 * 1024 * 1024 + 12_345;
const RESUME_AT: usize = 1_000_001;

/// A root with `name` holding `bytes`, with the given mtime.
fn root_with(name: &str, bytes: &[u8], mtime: SystemTime) -> tempfile::TempDir {
    let dir = disk_tempdir();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write file");
    let f = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_modified(mtime).expect("set mtime");
    dir
}

fn inode(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).expect("metadata");
    (m.dev(), m.ino())
}

#[test]
fn same_bytes_on_two_edges_have_the_same_validators_and_resume_across_them() {
    let bytes = pattern(FILE_BYTES);
    // Nanoseconds on purpose: a preserved mtime keeps them, and the tag depends on them.
    let mtime = SystemTime::UNIX_EPOCH + Duration::new(1_780_000_000, 123_456_789);
    let a_dir = root_with("patch.bin", &bytes, mtime);
    let b_dir = root_with("patch.bin", &bytes, mtime);
    assert_ne!(
        inode(&a_dir.path().join("patch.bin")),
        inode(&b_dir.path().join("patch.bin")),
        "the two copies must be different files"
    );
    let a = Server::start(a_dir.path(), &[]);
    let b = Server::start(b_dir.path(), &[]);

    let ha = get(&a, "/patch.bin", &[]);
    let hb = get(&b, "/patch.bin", &[]);
    assert_eq!((ha.status, hb.status), (200, 200));
    assert_eq!(ha.body, bytes, "edge A bytes");
    assert_eq!(hb.body, bytes, "edge B bytes");
    let etag = ha.header("etag").expect("ETag from A").to_string();
    assert_eq!(hb.header("etag"), Some(etag.as_str()), "ETag differs");
    assert_eq!(
        ha.header("last-modified"),
        hb.header("last-modified"),
        "Last-Modified differs"
    );

    // The download was cut on A after RESUME_AT bytes; the balancer sends the retry to B.
    let range = format!("bytes={RESUME_AT}-");
    let r = get(&b, "/patch.bin", &[("Range", &range), ("If-Range", &etag)]);
    assert_eq!(r.status, 206, "If-Range with A's ETag must resume on B");
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes {RESUME_AT}-{}/{FILE_BYTES}", FILE_BYTES - 1).as_str())
    );
    assert_eq!(r.body.len(), FILE_BYTES - RESUME_AT);
    assert!(r.body == bytes[RESUME_AT..], "resumed bytes differ");

    // A different mtime is a different version: the resume must not mix the two.
    let c_dir = root_with("patch.bin", &bytes, mtime + Duration::from_nanos(1));
    let c = Server::start(c_dir.path(), &[]);
    let r = get(&c, "/patch.bin", &[("Range", &range), ("If-Range", &etag)]);
    assert_eq!(r.status, 200, "a changed mtime must send the whole file");
    assert_eq!(r.body.len(), FILE_BYTES);
}

/// Sets the publisher's digest xattr; false when this file system has no user xattrs.
fn set_digest(path: &Path, value: &str) -> bool {
    match rustix::fs::setxattr(
        path,
        "user.sha256",
        value.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    ) {
        Ok(()) => true,
        Err(rustix::io::Errno::NOTSUP) => false,
        Err(e) => panic!("setxattr {}: {e}", path.display()),
    }
}

#[test]
fn xattr_digest_is_the_etag_on_every_edge_and_absent_digests_fall_back() {
    let bytes = pattern(200_000);
    let digest = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    // Different mtimes: a sync tool that did not keep them.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let a_dir = root_with("m.bin", &bytes, t0);
    let b_dir = root_with("m.bin", &bytes, t0 + Duration::from_secs(7));
    std::fs::write(a_dir.path().join("plain.txt"), b"no digest here").unwrap();
    let have_xattrs = set_digest(&a_dir.path().join("m.bin"), digest)
        && set_digest(&b_dir.path().join("m.bin"), &format!("{digest}\n"));
    if !have_xattrs {
        assert_eq!(
            std::env::var("SHARDLINE_SKIP_XATTR").as_deref(),
            Ok("1"),
            "the test directory's file system has no user xattrs (set SHARDLINE_SKIP_XATTR=1 \
             to skip this test)"
        );
        eprintln!("skipped: no user xattrs here (SHARDLINE_SKIP_XATTR=1)");
        return;
    }
    let cfg = disk_tempdir();
    let cfg_path = cfg.path().join("shardline.toml");
    std::fs::write(&cfg_path, "etag = \"xattr\"\n").unwrap();
    let cfg_arg = cfg_path.to_str().unwrap();
    let a = Server::start(a_dir.path(), &["--config", cfg_arg]);
    let b = Server::start(b_dir.path(), &["--config", cfg_arg]);
    let want = format!("\"sha256-{}\"", digest.to_ascii_lowercase());
    let ra = get(&a, "/m.bin", &[]);
    assert_eq!(ra.header("etag"), Some(want.as_str()));
    let r = get(
        &b,
        "/m.bin",
        &[("Range", "bytes=1000-"), ("If-Range", &want)],
    );
    assert_eq!(r.status, 206);
    assert!(r.body == bytes[1000..]);
    // No digest: size + mtime, as with etag = "mtime".
    let p = get(&a, "/plain.txt", &[]);
    let tag = p.header("etag").expect("fallback ETag");
    assert!(
        !tag.contains("sha256") && tag.starts_with('"') && tag.contains('-'),
        "{tag}"
    );
}
