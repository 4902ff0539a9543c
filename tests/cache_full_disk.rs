//! A full cache disk (issue 20): the cache directory is a small tmpfs (mounted by the test,
//! so it runs as root). Once fills have taken all its room, a fill that needs more is passed
//! through: its client gets the origin's bytes streamed, unstored (when its response had begun
//! streaming from the cache, the rest of it); hits and local files go on being served byte for
//! byte, and a purge makes room for fills again.

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
fn a_full_cache_disk_keeps_serving_hits_and_passes_fills_through() {
    if !common::prerequisite(
        common::running_as_root(),
        SKIP_ROOT,
        "mounting the small tmpfs the cache fills needs root",
    ) {
        return;
    }
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    for name in ["a", "b", "c", "d", "e"] {
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
    let token = common::AdminToken::write_in(dir.path());
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n{}[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            disk.path.display(),
            token.config_line(),
            origin.addr
        ),
    )
    .unwrap();
    let access_log = dir.path().join("access.log");
    let (mut server, admin) = common::start_with_admin(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--shards",
            "2",
            "--access-log",
            access_log.to_str().unwrap(),
        ],
    );
    let want = common::pattern_range(0, OBJECT_BYTES as usize);

    for name in ["a", "b"] {
        let r = get(&server, &format!("/pull/{name}.bin"), &[]);
        assert_eq!(r.status, 200, "{name} fits");
        assert!(r.body == want, "{name}: the cold body differs");
    }
    // No room for a third: c's first blocks fit, so its response begins from the cache and
    // the rest of it is passed through; d has no room at all, so it is passed through whole.
    // Never a wrong byte, never a 503.
    for name in ["c", "d"] {
        let (status, body) = get_maybe_cut(&server, &format!("/pull/{name}.bin"));
        assert_eq!(status, 200, "{name}: status {status} on a full disk");
        assert!(
            body.len() == want.len() && body == want,
            "{name}: a full disk gave {} bytes, not the object",
            body.len()
        );
    }
    let log = server.log();
    for how in [
        "passing the rest of a streaming response through",
        "passing the object through from its origin",
    ] {
        assert!(log.contains(how), "{how}: {log}");
    }
    // A range of an object that cannot be stored: exactly its bytes, from the origin.
    let r = get(
        &server,
        "/pull/e.bin",
        &[("Range", "bytes=4000000-4300000")],
    );
    assert_eq!(r.status, 206);
    assert!(
        r.body == want[4_000_000..=4_300_000],
        "a passed-through range"
    );
    // Counted: the responses and their bytes.
    let pass = |family: &str, label: &str| common::admin_metric(admin, family, label);
    assert!(
        pass("shardline_cache_lookups_total", "result=\"pass\"") >= 2,
        "pass-throughs counted"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pass("shardline_cache_bytes_total", "source=\"pass\"") < OBJECT_BYTES + 300_001
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pass_bytes = pass("shardline_cache_bytes_total", "source=\"pass\"");
    assert!(
        pass_bytes >= OBJECT_BYTES + 300_001,
        "pass-through bytes counted: {pass_bytes}"
    );
    // Shared counts are reported by shard 0 at its next tick (at least once a second).
    let given_up = || common::admin_metric(admin, "shardline_cache_disk_full_fills", "");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while given_up() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(given_up() >= 1, "counted: {}", given_up());
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
    for path in ["/pull/a.bin", "/pull/c.bin", "/pull/d.bin", "/pull/e.bin"] {
        let out = common::run_shardline(
            &[
                "cache",
                "purge",
                "--admin",
                &admin,
                "--token-file",
                token.path(),
                path,
            ],
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

    // The access log says which responses were passed through.
    assert!(server.terminate().success());
    let text = std::fs::read_to_string(&access_log).unwrap();
    let passed_lines = text.lines().filter(|l| l.contains(" cache=PASS")).count();
    assert!(passed_lines >= 2, "{text}");
}

/// A cache disk with no room at all: every fill of an object is passed through. Over HTTPS
/// (relayed chunks are sealed like any), twice on one kept-alive connection; to a client
/// that stops reading for a while (the origin waits for it, every byte still right); and to
/// one that leaves mid-body (its origin fetch ends with it, and the server serves on).
#[test]
fn a_pass_through_serves_https_slow_and_vanishing_clients() {
    if !common::prerequisite(
        common::running_as_root(),
        SKIP_ROOT,
        "mounting the small tmpfs the cache fills needs root",
    ) {
        return;
    }
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    common::write_pattern_file(&origin_root.path().join("pull/x.bin"), OBJECT_BYTES);
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let disk = SmallDisk::mount();
    // The journal's first records fit; no block of any object does.
    let filler = disk.path.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; DISK_BYTES as usize - (64 << 10)]);
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let pki = common::tls::Pki::new();
    let leaf = pki.leaf("edge", &["localhost"], common::tls::Key::EcdsaP256, 30);
    let cfg = pki.config(
        &[leaf],
        &format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            disk.path.display(),
            origin.addr
        ),
    );
    let (server, admin) = common::start_tls_with_admin(&root, &["--config", cfg.to_str().unwrap()]);
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    let pass_bytes =
        || common::admin_metric(admin, "shardline_cache_bytes_total", "source=\"pass\"");

    // HTTPS, two responses on one connection.
    let tls_addr = server.tls_addr.expect("a TLS listener");
    let mut conn = common::tls::TlsConn::connect(tls_addr, pki.client(), "localhost").unwrap();
    for round in 0..2 {
        let r = conn.get("/pull/x.bin", &[]);
        assert_eq!(r.status, 200, "round {round}");
        assert!(
            r.body == want,
            "round {round}: the HTTPS pass-through body differs"
        );
    }
    // Counted when each response's last send completes, which may come after the client has
    // its bytes.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pass_bytes() < 2 * OBJECT_BYTES && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        pass_bytes() >= 2 * OBJECT_BYTES,
        "both counted as passed through: {}",
        pass_bytes()
    );

    // A client that stops reading for a while, then reads on.
    let mut s = server.connect();
    std::io::Write::write_all(
        &mut s,
        b"GET /pull/x.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut first = vec![0u8; 64 << 10];
    std::io::Read::read_exact(&mut s, &mut first).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut all = first;
    all.extend(common::read_to_eof(&mut s).unwrap());
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    assert!(
        all[end + 4..] == want[..],
        "the stalled client's body differs"
    );

    // A client that leaves mid-body: its fetch ends (no origin fetch left running), and a
    // later request is served whole.
    let mut s = server.connect();
    std::io::Write::write_all(
        &mut s,
        b"GET /pull/x.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut part = vec![0u8; 100_000];
    std::io::Read::read_exact(&mut s, &mut part).unwrap();
    drop(s);
    let fetches = || common::admin_metric(admin, "shardline_origin_fetches", "");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fetches() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        fetches(),
        0,
        "the pass-through's fetch ended with its client"
    );
    let r = get(&server, "/pull/x.bin", &[("Range", "bytes=-1000")]);
    assert_eq!(r.status, 206);
    assert!(r.body == want[want.len() - 1000..]);
    // The gauge is set at the end of the shard's tick, which may come after the client has
    // its bytes: wait for it.
    let in_flight = || common::admin_metric(admin, "shardline_chunks_in_flight", "");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while in_flight() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(in_flight(), 0, "no arena chunk left behind");
}
