//! Several cache disks (issue 43), end to end against nginx as the origin: objects are spread
//! over the disks of `cache_dirs`, each disk with its own journal, data files and id; a disk
//! missing at start-up is left out with one warning line while the others serve; restarted
//! with it back (blank), the objects of the others are still hits and the new disk takes its
//! share of new objects; `cache_require_all_disks` refuses to start without it.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::get;
use shardline::origin::testing::NginxOrigin;

const OBJECTS: usize = 24;
const OBJECT_BYTES: u64 = 300_000 + 17;
const WARNING: &str = "cache disk left out";

fn data_files(disk: &Path) -> usize {
    std::fs::read_dir(disk.join("data"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn config(dir: &Path, disks: &[PathBuf], origin: std::net::SocketAddr, extra: &str) -> PathBuf {
    let list: Vec<String> = disks
        .iter()
        .map(|d| format!("\"{}\"", d.display()))
        .collect();
    let cfg = dir.join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dirs = [{}]\n{extra}[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{origin}\"\n",
            list.join(", ")
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn objects_spread_over_the_disks_and_a_missing_disk_costs_only_its_share() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    for i in 0..2 * OBJECTS {
        common::write_pattern_file(
            &origin_root.path().join(format!("pull/{i}.bin")),
            OBJECT_BYTES,
        );
    }
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let disks: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("disk{i}")))
        .collect();
    // The third disk is not there at the first start.
    for d in &disks[..2] {
        std::fs::create_dir(d).unwrap();
    }
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    let fetch_all = |server: &common::Server, range: std::ops::Range<usize>| {
        for i in range {
            let r = get(server, &format!("/pull/{i}.bin"), &[]);
            assert_eq!(r.status, 200, "object {i}");
            assert!(r.body == want, "object {i}: other bytes");
        }
    };

    let required = config(
        dir.path(),
        &disks,
        origin.addr,
        "cache_require_all_disks = true\n",
    );
    let out = common::run_shardline(
        &[
            "serve",
            "--root",
            root.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--config",
            required.to_str().unwrap(),
        ],
        Duration::from_secs(20),
    );
    assert!(
        !out.timed_out && out.code != Some(0) && out.stderr.contains("cache_dirs"),
        "cache_require_all_disks starts without a disk: {}",
        out.stderr
    );

    let cfg = config(dir.path(), &disks, origin.addr, "");
    let args = ["--config", cfg.to_str().unwrap(), "--shards", "2"];
    let server = common::Server::start(&root, &args);
    fetch_all(&server, 0..OBJECTS);
    let log = server.log();
    assert_eq!(log.matches(WARNING).count(), 1, "one warning line: {log}");
    assert!(log.contains("disk2"), "the warning names the disk: {log}");
    // Each present disk holds its own journal, id and a share of the objects.
    let before: Vec<usize> = disks.iter().map(|d| data_files(d)).collect();
    assert_eq!(before[0] + before[1], OBJECTS, "{before:?}");
    for d in &disks[..2] {
        assert!(data_files(d) > 0, "{}: no object", d.display());
        assert!(d.join("journal").is_file() && d.join("disk-id").is_file());
    }
    // Served again: hits, from either disk, no origin request.
    let requests = origin.requests();
    fetch_all(&server, 0..OBJECTS);
    assert_eq!(origin.requests(), requests, "the second round was all hits");
    drop(server);

    // Back with a blank third disk: the objects of the others are still hits, and the new
    // disk takes a share of new objects.
    std::fs::create_dir(&disks[2]).unwrap();
    let server = common::Server::start(&root, &args);
    fetch_all(&server, 0..OBJECTS);
    assert_eq!(
        origin.requests(),
        requests,
        "objects on the disks that stayed are hits after the restart"
    );
    assert!(!server.log().contains(WARNING), "{}", server.log());
    fetch_all(&server, OBJECTS..2 * OBJECTS);
    let after: Vec<usize> = disks.iter().map(|d| data_files(d)).collect();
    assert_eq!(after.iter().sum::<usize>(), 2 * OBJECTS, "{after:?}");
    assert!(after[2] > 0, "the new disk took no object: {after:?}");
    assert!(
        after[0] >= before[0] && after[1] >= before[1],
        "no object moved off the disks that stayed: {before:?} -> {after:?}"
    );
}

/// `shardline cache disk ACTION [DISK]` against the admin listener; its stdout.
#[test]
fn an_operator_takes_a_disk_offline_and_back_and_offline_outlives_a_restart() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    for i in 0..4 * OBJECTS {
        common::write_pattern_file(
            &origin_root.path().join(format!("pull/{i}.bin")),
            OBJECT_BYTES,
        );
    }
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let disks: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("disk{i}")))
        .collect();
    for d in &disks {
        std::fs::create_dir(d).unwrap();
    }
    let token = common::AdminToken::write_in(dir.path());
    let cfg = config(dir.path(), &disks, origin.addr, &token.config_line());
    let args = ["--config", cfg.to_str().unwrap(), "--shards", "2"];
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    let fetch_all = |server: &common::Server, range: std::ops::Range<usize>| {
        for i in range {
            let r = get(server, &format!("/pull/{i}.bin"), &[]);
            assert!(r.status == 200 && r.body == want, "object {i}");
        }
    };
    let (server, admin) = common::start_with_admin(&root, &args);
    fetch_all(&server, 0..OBJECTS);
    let status = common::disk_cli(admin, &token, &["status"]);
    assert_eq!(status.matches(" online ").count(), 2, "{status}");
    // Each disk times its operations: the fills' journal appends, and the hits' reads.
    fetch_all(&server, 0..OBJECTS);
    let timed = |op: &str| {
        let family = "shardline_cache_disk_op_seconds_count";
        common::admin_metric(admin, family, &format!("op=\"{op}\""))
    };
    assert!(
        timed("read") >= OBJECTS as u64,
        "{} reads timed",
        timed("read")
    );
    assert!(timed("append") >= 1, "no journal append timed");
    // Without the token, no control.
    let mut s = std::net::TcpStream::connect(admin).unwrap();
    std::io::Write::write_all(
        &mut s,
        b"POST /cache/disks/offline?disk=0 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let r = common::read_response(&mut std::io::BufReader::new(s), false).unwrap();
    assert_eq!(r.status, 401);

    // Offline: the disk's objects are misses (fetched again, onto the other disk), and no new
    // object goes to it.
    let on_first = data_files(&disks[0]);
    assert!(on_first > 0);
    common::disk_cli(admin, &token, &["offline", disks[0].to_str().unwrap()]);
    assert!(common::disk_cli(admin, &token, &["status"]).contains("0 offline"));
    let requests = origin.requests();
    fetch_all(&server, 0..2 * OBJECTS);
    assert_eq!(
        origin.requests() - requests,
        on_first + OBJECTS,
        "the offline disk's objects and the new ones were fetched, nothing else"
    );
    assert_eq!(
        data_files(&disks[0]),
        on_first,
        "a fill went to the offline disk"
    );
    assert_eq!(
        common::admin_metric(admin, "shardline_cache_disk_offline", "disk=\"0\""),
        1
    );
    drop(server);

    // Kept across a restart (by the disk itself), and then back online: it takes a share of
    // new objects.
    let (server, admin) = common::start_with_admin(&root, &args);
    assert!(common::disk_cli(admin, &token, &["status"]).contains("0 offline"));
    fetch_all(&server, 2 * OBJECTS..3 * OBJECTS);
    assert_eq!(data_files(&disks[0]), on_first);
    common::disk_cli(admin, &token, &["online", "0"]);
    assert_eq!(
        common::disk_cli(admin, &token, &["status"])
            .matches(" online ")
            .count(),
        2
    );
    fetch_all(&server, 3 * OBJECTS..4 * OBJECTS);
    assert!(
        data_files(&disks[0]) > on_first,
        "the disk back online took no new object"
    );
    assert!(!disks[0].join("disk-offline").exists());
}

#[test]
fn the_doctor_checks_each_disk_by_name() {
    let dir = common::disk_tempdir();
    let disks = [dir.path().join("disk0"), dir.path().join("missing")];
    std::fs::create_dir(&disks[0]).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "root = \"{}\"\ncache_dirs = [\"{}\", \"{}\"]\n[[origin]]\nurl = \"http://127.0.0.1:9\"\n",
            dir.path().display(),
            disks[0].display(),
            disks[1].display()
        ),
    )
    .unwrap();
    let out = common::run_shardline(
        &["doctor", "--json", "--config", cfg.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(!out.timed_out);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("doctor's JSON");
    let checks = report["checks"].as_array().expect("a checks array");
    let status = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap_or_default().to_string())
    };
    for want in [
        "cache.disk0.fs",
        "cache.disk0.free_space",
        "cache.disk1.free_space",
    ] {
        assert!(status(want).is_some(), "{want} missing: {checks:?}");
    }
    // "warn" is a host with little free space (the CI machine's may be); a
    // disk that is there is never "fail".
    let present = status("cache.disk0.free_space");
    assert!(
        matches!(present.as_deref(), Some("ok") | Some("warn")),
        "the present disk: {present:?}"
    );
    assert_eq!(
        status("cache.disk1.free_space").as_deref(),
        Some("fail"),
        "the missing disk"
    );
}
