//! A full cache disk (issue 20): the cache directory is a small tmpfs (mounted by the test,
//! so it runs as root). Once fills have taken all its room, a fill that needs more gets a
//! clean 503 (or, when its response had begun, a cut: never a wrong byte), hits and local
//! files go on being served byte for byte, and a purge makes room for fills again.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::get;
use shardline::origin::testing::NginxOrigin;

/// Room of the cache's tmpfs: two 6 MiB objects fit, the third does not.
const DISK_BYTES: u64 = 14 << 20;
const OBJECT_BYTES: u64 = 6 * 1024 * 1024 + 999;
const SKIP_ROOT: &str = "SHARDLINE_SKIP_ROOT";

/// A tmpfs of `DISK_BYTES` mounted on a temp dir, unmounted on drop.
struct SmallDisk {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache");
        std::fs::create_dir(&path).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}")])
            .arg("shardline-full-disk")
            .arg(&path)
            .status()
            .expect("mount runs");
        assert!(st.success(), "mounting a tmpfs on {}", path.display());
        SmallDisk { path, _dir: dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A GET whose body may be cut: the status and the body bytes that came before the close.
fn get_maybe_cut(server: &common::Server, path: &str) -> (u16, Vec<u8>) {
    let mut s = server.connect();
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut s, request.as_bytes()).unwrap();
    let all = common::read_to_eof(&mut s).unwrap_or_default();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&all[..end]);
    let status = head[9..12].parse().expect("a status");
    (status, all[end + 4..].to_vec())
}

fn data_files(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("data"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn a_full_cache_disk_keeps_serving_hits_and_refuses_fills_cleanly() {
    if !common::prerequisite(
        common::running_as_root(),
        SKIP_ROOT,
        "mounting the small tmpfs the cache fills needs root",
    ) {
        return;
    }
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    for name in ["a", "b", "c", "d"] {
        common::write_pattern_file(
            &origin_root.path().join(format!("pull/{name}.bin")),
            OBJECT_BYTES,
        );
    }
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let disk = SmallDisk::mount();
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("local.bin"), 100_000);
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            disk.path.display(),
            origin.addr
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "2"]);
    let want = common::pattern_range(0, OBJECT_BYTES as usize);

    for name in ["a", "b"] {
        let r = get(&server, &format!("/pull/{name}.bin"), &[]);
        assert_eq!(r.status, 200, "{name} fits");
        assert!(r.body == want, "{name}: the cold body differs");
    }
    // No room for a third: a 503 before the response begins, or a cut once it has; never a
    // wrong byte.
    let mut refused = 0;
    for name in ["c", "d"] {
        let (status, body) = get_maybe_cut(&server, &format!("/pull/{name}.bin"));
        match status {
            503 => refused += 1,
            200 => assert!(
                body.len() < want.len() && body == want[..body.len()],
                "{name}: a full disk gave {} bytes, not a clean cut",
                body.len()
            ),
            s => panic!("{name}: status {s} on a full disk"),
        }
    }
    assert!(
        refused >= 1,
        "the last fill had begun nothing, so it is a 503"
    );
    // Shared counts are reported by shard 0 at its next tick (at least once a second).
    let given_up = || common::admin_metric(admin, "shardline_cache_disk_full_fills", "");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while given_up() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(given_up() >= 1, "counted: {}", given_up());
    let log = server.log();
    assert!(log.contains("cache disk full"), "{log}");

    // Hits, ranges and local files go on.
    for _ in 0..4 {
        let r = get(&server, "/pull/a.bin", &[]);
        assert!(r.status == 200 && r.body == want, "a hit on a full disk");
        let r = get(
            &server,
            "/pull/b.bin",
            &[("Range", "bytes=3000000-3000999")],
        );
        assert_eq!(r.status, 206);
        assert_eq!(r.body, &want[3_000_000..3_001_000]);
    }
    let r = get(&server, "/local.bin", &[]);
    assert_eq!((r.status, r.body.len()), (200, 100_000));

    // Room again: what was purged is gone, and the refused object fills whole.
    let admin = admin.to_string();
    for path in ["/pull/a.bin", "/pull/c.bin", "/pull/d.bin"] {
        let out = common::run_shardline(
            &["cache", "purge", "--admin", &admin, path],
            Duration::from_secs(20),
        );
        assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while data_files(&disk.path) > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(data_files(&disk.path), 1, "only b.bin is kept");
    let r = get(&server, "/pull/c.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        r.body == want,
        "the refused object fills whole once there is room"
    );
}
