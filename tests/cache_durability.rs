//! The cache index survives what a client or an origin can make it hold (issue 29): a key too
//! long to journal, an object claiming more blocks than a record may name, and a record that
//! replay refuses planted in the middle of the journal each leave every other object cached
//! across a restart, and start-up says in one line what it recovered and what it dropped.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{get, Server};
use shardline::cache::journal::{MAX_BLOCKS_PER_OBJECT, MAX_KEY_BYTES};
use shardline::origin::testing::NginxOrigin;

const OBJECT_BYTES: u64 = 3 * 1024 * 1024 + 77;
/// The smallest block size an object may have: the largest claim in the fewest bytes.
const BLOCK_BYTES: u64 = 64 * 1024;

fn start(root: &Path, cfg: &Path) -> Server {
    Server::start(root, &["--config", cfg.to_str().unwrap(), "--shards", "2"])
}

fn stats(cache: &Path) -> String {
    let out = common::run_shardline(
        &["cache", "stats", "--dir", cache.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{}", out.stdout);
    out.stdout
}

/// A frame replay accepts (length and checksum right) whose kind it does not know.
fn refused_record() -> Vec<u8> {
    let body = [0x4d_u8, 1, 2, 3, 4];
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&shardline::cache::checksum(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[test]
fn odd_keys_huge_claims_and_refused_records_cost_no_other_object_at_a_restart() {
    let origin_root = tempfile::tempdir().unwrap();
    let pull = origin_root.path().join("pull");
    std::fs::create_dir(&pull).unwrap();
    common::write_pattern_file(&pull.join("a.bin"), OBJECT_BYTES);
    common::write_pattern_file(&pull.join("b.bin"), OBJECT_BYTES);
    // A sparse file one block past what a record may name: the origin claims its size.
    let huge = std::fs::File::create(pull.join("huge.bin")).unwrap();
    huge.set_len((MAX_BLOCKS_PER_OBJECT + 1) * BLOCK_BYTES)
        .unwrap();
    drop(huge);
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let (root, cache) = (dir.path().join("root"), dir.path().join("cache"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\ncache_block_bytes = {BLOCK_BYTES}\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let want = common::pattern_range(0, OBJECT_BYTES as usize);

    let server = start(&root, &cfg);
    let r = get(&server, "/pull/a.bin", &[]);
    assert!(r.status == 200 && r.body == want, "a.bin: {}", r.status);
    // A path whose key (origin + path) is one byte over what a record may hold: 414, and
    // nothing of it reaches the origin or the journal.
    let long = format!("/pull/{}", "k".repeat(MAX_KEY_BYTES - "pull/".len() - 1));
    let requests_before = origin.requests();
    let r = get(&server, &long, &[]);
    assert_eq!(r.status, 414, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(origin.requests(), requests_before, "the origin was asked");
    // An object of more blocks than a record may name: refused at its head (502).
    let r = get(&server, "/pull/huge.bin", &[("Range", "bytes=0-99")]);
    assert_eq!(r.status, 502);
    // An object filled after both.
    let r = get(&server, "/pull/b.bin", &[]);
    assert!(r.status == 200 && r.body == want, "b.bin: {}", r.status);
    let body_bytes = origin.wait_body_bytes(2 * OBJECT_BYTES);
    drop(server);

    let s = stats(&cache);
    assert!(s.contains("objects 2\n"), "{s}");
    assert!(s.contains("refused_records 0"), "{s}");
    // A record replay refuses, planted between the two objects' records: it is skipped.
    let journal = cache.join("journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let mut at = 0;
    let mut records = 0;
    while at < bytes.len() / 2 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
        records += 1;
    }
    assert!(
        records > 1 && at < bytes.len(),
        "a record boundary mid-journal"
    );
    bytes.splice(at..at, refused_record());
    std::fs::write(&journal, &bytes).unwrap();

    let server = start(&root, &cfg);
    for name in ["a.bin", "b.bin"] {
        let r = get(&server, &format!("/pull/{name}"), &[]);
        assert!(
            r.status == 200 && r.body == want,
            "{name} after the restart"
        );
    }
    assert_eq!(
        origin.body_bytes_sent(),
        body_bytes,
        "nothing fetched again after the restart"
    );
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("cache index recovered"))
        .unwrap_or_else(|| panic!("no start-up line in:\n{log}"));
    for field in ["objects=2", "refused=1", "torn_tail=false"] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    drop(server);
    let s = stats(&cache);
    assert!(s.contains("objects 2\n"), "{s}");
    assert!(s.contains("refused_records 1"), "{s}");
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        bytes.len() as u64,
        "the journal was not cut"
    );
}
