//! A cache that is not whole yet, end to end against nginx as the origin (issue 44): a second
//! process on the same cache disk (a restart handover's successor) waits for the disk's lock
//! instead of writing beside the first; meanwhile it serves, every pulled request passing
//! through unstored, `/healthz` says `loading` and `/metrics` counts the disk waited for; once
//! the first process exits it loads the journal, and the object the first one cached is a hit
//! with no origin request, on every shard. A load that fails after the shards started ends the
//! process.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{admin_metric, get, read_response, Response, IO_TIMEOUT};
use shardline::origin::testing::NginxOrigin;

const OBJECT_BYTES: u64 = 300_000 + 17;
/// Longest a state this test waits for may take to come (the wait ends when it comes).
const PATIENCE: Duration = Duration::from_secs(60);

fn admin_get(addr: SocketAddr, path: &str) -> Response {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connect to admin");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    read_response(&mut std::io::BufReader::new(s), false).expect("admin response")
}

/// Polls `check` until it holds, failing with `what` past `PATIENCE`.
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn config(dir: &Path, name: &str, disk: &Path, origin: SocketAddr, extra: &str) -> PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n{extra}[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{origin}\"\n",
            disk.display()
        ),
    )
    .unwrap();
    cfg
}

/// An nginx origin serving `/pull/NAME` (`OBJECT_BYTES` of the test pattern each), and a
/// server root and an empty cache disk in a temporary directory.
struct Fixture {
    origin: NginxOrigin,
    dir: tempfile::TempDir,
    root: PathBuf,
    disk: PathBuf,
    _origin_root: tempfile::TempDir,
    _work: tempfile::TempDir,
}

impl Fixture {
    fn new(names: &[&str]) -> Fixture {
        let origin_root = tempfile::tempdir().unwrap();
        std::fs::create_dir(origin_root.path().join("pull")).unwrap();
        for name in names {
            common::write_pattern_file(&origin_root.path().join("pull").join(name), OBJECT_BYTES);
        }
        let work = tempfile::tempdir().unwrap();
        let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
        let dir = common::disk_tempdir();
        let root = dir.path().join("root");
        let disk = dir.path().join("disk");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&disk).unwrap();
        Fixture {
            origin,
            dir,
            root,
            disk,
            _origin_root: origin_root,
            _work: work,
        }
    }
}

#[test]
fn a_second_process_passes_through_until_the_first_lets_go_of_the_disk_then_hits() {
    let f = Fixture::new(&["a.bin", "b.bin"]);
    let (origin, dir, root, disk) = (&f.origin, &f.dir, &f.root, &f.disk);
    let want = common::pattern_range(0, OBJECT_BYTES as usize);

    // The first process caches a.bin.
    let first_cfg = config(dir.path(), "first.toml", disk, origin.addr, "");
    let mut first = common::Server::start(root, &["--config", first_cfg.to_str().unwrap()]);
    for _ in 0..2 {
        let r = get(&first, "/pull/a.bin", &[]);
        assert!(r.status == 200 && r.body == want, "first: {}", r.status);
    }
    let requests = origin.requests();

    // The second starts on the same disk while the first holds it: it serves at once.
    let second_cfg = config(
        dir.path(),
        "second.toml",
        disk,
        origin.addr,
        "cache_ready_wait_ms = 0\n",
    );
    let (second, admin) = common::start_with_admin(
        root,
        &["--config", second_cfg.to_str().unwrap(), "--shards", "2"],
    );
    wait_until("the second process to wait for the disk's lock", || {
        admin_metric(admin, "shardline_cache_load_waiting_disks", "") == 1
    });
    assert_eq!(admin_metric(admin, "shardline_cache_loading", ""), 1);
    let health = admin_get(admin, "/healthz");
    assert_eq!(
        (health.status, String::from_utf8_lossy(&health.body).trim()),
        (503, "loading")
    );
    let log = second.log();
    assert!(
        log.contains("cache disk in use by another process")
            && log.contains(&format!("in use by process {}", first.child.id())),
        "the wait names the holder: {log}"
    );
    // A pulled request passes through: the origin's bytes, nothing stored.
    let r = get(&second, "/pull/a.bin", &[]);
    assert!(
        r.status == 200 && r.body == want,
        "passed through: {}",
        r.status
    );
    let status = r.header("cache-status").unwrap_or_default().to_string();
    assert!(
        status.contains("fwd=miss; detail=loading"),
        "Cache-Status: {status}"
    );
    assert_eq!(origin.requests(), requests + 1, "its own origin request");
    let loading = "reason=\"loading\"";
    assert_eq!(
        admin_metric(admin, "shardline_cache_not_stored_total", loading),
        1
    );
    let range = get(&second, "/pull/b.bin", &[("Range", "bytes=1000-1999")]);
    assert_eq!(range.status, 206);
    assert!(range.body == want[1000..2000], "the range passed through");
    let requests = origin.requests();

    // The first exits; the second takes the disk, loads its journal and is whole.
    assert!(first.terminate().success());
    wait_until("the second process's cache to load", || {
        admin_get(admin, "/healthz").status == 200
    });
    assert_eq!(admin_metric(admin, "shardline_cache_loading", ""), 0);
    assert_eq!(
        admin_metric(admin, "shardline_cache_load_waiting_disks", ""),
        0
    );
    let journal_bytes = std::fs::metadata(disk.join("journal")).unwrap().len();
    assert!(admin_metric(admin, "shardline_cache_load_read_bytes", "") >= journal_bytes);
    assert!(second.log().contains("pull-through cache open"));
    // What the first cached is a hit on every connection (both shards), the origin not asked.
    for _ in 0..8 {
        let r = get(&second, "/pull/a.bin", &[]);
        assert!(r.status == 200 && r.body == want, "hit: {}", r.status);
        let status = r.header("cache-status").unwrap_or_default().to_string();
        assert!(status.contains("hit"), "Cache-Status: {status}");
    }
    assert_eq!(
        origin.requests(),
        requests,
        "a.bin came from the loaded cache"
    );
    // A new object fills and is stored now (the shards work on the loaded cache).
    for _ in 0..8 {
        let r = get(&second, "/pull/b.bin", &[]);
        assert!(r.status == 200 && r.body == want, "b.bin: {}", r.status);
    }
    assert_eq!(
        origin.requests(),
        requests + 1,
        "b.bin fetched once, then hits"
    );
    assert!(disk.join("lock").is_file());
}

#[test]
fn a_load_that_fails_after_the_shards_started_ends_the_process() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let disks = [dir.path().join("disk0"), dir.path().join("disk1")];
    for d in &disks {
        std::fs::create_dir(d).unwrap();
    }
    // The second disk will not open (its id does not read), and all are required.
    std::fs::write(disks[1].join("disk-id"), "not hex").unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dirs = [\"{}\", \"{}\"]\ncache_require_all_disks = true\n\
             cache_ready_wait_ms = 0\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://127.0.0.1:9\"\n",
            disks[0].display(),
            disks[1].display()
        ),
    )
    .unwrap();
    // The first disk's lock is held here, so the load goes on after the shards started.
    let held = shardline::cache::disk_lock::DiskLock::try_take(&disks[0]).unwrap();
    let mut server = common::Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    wait_until("the load to wait for the held disk", || {
        server
            .log()
            .contains("cache disk in use by another process")
    });
    assert_eq!(get(&server, "/", &[]).status, 404, "it serves meanwhile");
    drop(held);
    let status = common::wait_exit(&mut server, PATIENCE).expect("the process should end");
    assert_eq!(status.code(), Some(1), "{}", server.log());
    let log = server.log();
    assert!(
        log.contains("the pull-through cache failed to load: the process ends")
            && log.contains("disk1"),
        "the error names the disk: {log}"
    );
}

/// A restart under a smaller `cache_max_bytes` than its disk holds is healthy once its index
/// is whole; the eviction then counts the versions held while the shards serve
/// (`shardline_cache_load_uncounted_versions` down to 0) and evicts down to the budget: one
/// object of three is left, on disk and in the journal, and every object answers right.
#[test]
fn a_restart_under_a_smaller_budget_serves_then_evicts_down_to_it() {
    let names = ["a.bin", "b.bin", "c.bin"];
    let f = Fixture::new(&names);
    let (origin, dir, root, disk) = (&f.origin, &f.dir, &f.root, &f.disk);
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    let data_files = || std::fs::read_dir(disk.join("data")).map_or(0, |d| d.count());

    let first_cfg = config(dir.path(), "first.toml", disk, origin.addr, "");
    let mut first = common::Server::start(root, &["--config", first_cfg.to_str().unwrap()]);
    for name in names {
        for _ in 0..2 {
            let r = get(&first, &format!("/pull/{name}"), &[]);
            assert!(r.status == 200 && r.body == want, "{name}: {}", r.status);
        }
    }
    assert_eq!(origin.requests(), 3, "each fetched once, then a hit");
    assert!(first.terminate().success());
    assert_eq!(data_files(), 3);

    // Room for one object: the restart evicts two, after it serves.
    let budget = format!("cache_max_bytes = {}\n", OBJECT_BYTES + 4096);
    let second_cfg = config(dir.path(), "second.toml", disk, origin.addr, &budget);
    let (mut second, admin) = common::start_with_admin(
        root,
        &["--config", second_cfg.to_str().unwrap(), "--shards", "2"],
    );
    wait_until("the restarted cache to load", || {
        admin_get(admin, "/healthz").status == 200
    });
    wait_until("the eviction to count every version", || {
        admin_metric(admin, "shardline_cache_load_uncounted_versions", "") == 0
    });
    wait_until("two evicted versions' files to go", || data_files() == 1);
    wait_until("the log to say the count is done", || {
        second
            .log()
            .contains("the eviction counts every version held")
    });
    for name in names {
        let r = get(&second, &format!("/pull/{name}"), &[]);
        assert!(r.status == 200 && r.body == want, "{name}: {}", r.status);
    }
    assert!(second.terminate().success());
    let journal = std::fs::read(disk.join("journal")).unwrap();
    let (index, _) = shardline::cache::journal::replay(&journal);
    assert_eq!(index.versions(), 1, "one object fits the budget");
}
