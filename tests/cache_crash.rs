//! kill -9 of the real binary in the middle of pull-through fills (issue 20): 20 fills, each
//! killed at a different moment, each followed by a restart on the same cache directory.
//! After every restart the whole object is served byte for byte, and no block the journal
//! had vouched for before the kill is fetched from the origin again.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use common::{get, Server};
use shardline::origin::testing::NginxOrigin;

/// Fills killed (the figure).
const FILLS: usize = 20;
/// Each object: 24 blocks of 256 KiB and a short tail.
const OBJECT_BYTES: u64 = 6 * 1024 * 1024 + 777;
const BLOCK_BYTES: u64 = 256 * 1024;

/// Blocks of `path` (under `/pull/`) the journal in `cache` vouches for now.
fn committed_blocks(cache: &Path, path: &str) -> HashSet<u64> {
    let bytes = std::fs::read(cache.join("journal")).unwrap_or_default();
    let (index, _) = shardline::cache::journal::replay(&bytes);
    let want = format!("pull/{path}");
    let Some(meta) = index
        .each_version()
        .find(|m| m.key.ends_with(want.as_bytes()))
    else {
        return HashSet::new();
    };
    assert_eq!(u64::from(meta.block_bytes), BLOCK_BYTES);
    (0..meta.blocks())
        .filter(|&b| index.block_crc(meta.version, b as u32).is_some())
        .collect()
}

fn start(root: &Path, cfg: &Path) -> Server {
    Server::start(root, &["--config", cfg.to_str().unwrap(), "--shards", "2"])
}

#[test]
fn fills_killed_at_random_moments_serve_no_wrong_byte_and_fetch_no_committed_block_again() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    for i in 0..FILLS {
        common::write_pattern_file(
            &origin_root.path().join(format!("pull/obj{i}.bin")),
            OBJECT_BYTES,
        );
    }
    let work = tempfile::tempdir().unwrap();
    // 6 MiB at 12 MiB/s per connection: a fill takes about half a second.
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "limit_rate 12m;");
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    // A fixed xorshift: the same "random" moments on every run.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut partial = 0;
    for i in 0..FILLS {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let kill_after = Duration::from_millis(20 + seed % 500);
        let path = format!("obj{i}.bin");
        let server = start(&root, &cfg);
        let addr = server.addr;
        let request = format!("GET /pull/{path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let client = std::thread::spawn(move || {
            // Its download dies with the server; only the bytes after the restart count.
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            std::io::Write::write_all(&mut s, request.as_bytes()).unwrap();
            let _ = common::read_to_eof(&mut s);
        });
        std::thread::sleep(kill_after);
        drop(server); // SIGKILL
        client.join().unwrap();

        let before = committed_blocks(&cache, &path);
        let asked_before = origin.log().len();
        let blocks = OBJECT_BYTES.div_ceil(BLOCK_BYTES);
        partial += usize::from(!before.is_empty() && (before.len() as u64) < blocks);
        eprintln!(
            "fill {i}: killed after {kill_after:?} with {} of {blocks} blocks committed",
            before.len()
        );
        let server = start(&root, &cfg);
        let r = get(&server, &format!("/pull/{path}"), &[]);
        assert_eq!(r.status, 200, "fill {i} after its kill");
        assert!(
            r.body == want,
            "fill {i} (killed after {kill_after:?}, {} blocks committed): a wrong byte",
            before.len()
        );
        // Every byte the origin sent for this object after the restart: no committed block.
        let uri = format!("/pull/{path}");
        let log = origin.log();
        for line in log[asked_before..].iter().filter(|l| l.uri == uri) {
            let (a, b) = line
                .range_bytes()
                .unwrap_or_else(|| panic!("a ranged fetch: {line:?}"));
            let refetched: Vec<u64> = (a / BLOCK_BYTES..=b / BLOCK_BYTES)
                .filter(|blk| before.contains(blk))
                .collect();
            assert!(
                refetched.is_empty(),
                "fill {i}: blocks {refetched:?} were committed before the kill and fetched again ({line:?})"
            );
        }
        assert_eq!(committed_blocks(&cache, &path).len() as u64, blocks);
        drop(server);
    }
    // The moments must have hit fills in the middle, not only before or after them.
    assert!(partial >= FILLS / 4, "only {partial} kills landed mid-fill");
    let out = common::run_shardline(
        &["cache", "verify", "--dir", cache.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert_eq!(
        out.code,
        Some(0),
        "cache verify: {} {}",
        out.stdout,
        out.stderr
    );
}
