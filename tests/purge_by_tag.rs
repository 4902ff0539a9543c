//! Purge by tag (issue 42, item 10): the origin tags its replies (`Surrogate-Key`, or
//! `Cache-Tag` where the `[[origin]]` entry says so); `shardline cache purge --tag T` and
//! `POST /cache/purge?tag=T` retire every object carrying `T`, for good (a restart keeps them
//! purged), and the tag field never reaches a client.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scripted_origin::{object, ranged, Asked, ScriptedOrigin};
use common::{get, AdminToken, Server};

/// (path, the tag field the origin sends with it).
const OBJECTS: [(&str, &str); 5] = [
    ("/pull/a.bin", "Surrogate-Key: build-1234 game-x\r\n"),
    ("/pull/b.bin", "Surrogate-Key: build-1234\r\n"),
    // With a tag too long to keep (dropped and counted).
    (
        "/pull/c.bin",
        "Surrogate-Key: other xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\
         xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\
         xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\
         xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n",
    ),
    ("/tagged/d.bin", "Cache-Tag: other, build-1234\r\n"),
    ("/tagged/e.bin", "Cache-Tag: other\r\n"),
];

/// The origin: every object fresh for an hour, with its tag field.
fn tagging_origin() -> (ScriptedOrigin, Vec<Vec<u8>>) {
    let contents: Vec<Vec<u8>> = (0..OBJECTS.len())
        .map(|i| object(90_000 + i * 1000, i as u8))
        .collect();
    let origin = ScriptedOrigin::start(
        OBJECTS
            .iter()
            .zip(&contents)
            .map(|((p, _), c)| (*p, c.clone()))
            .collect(),
    );
    origin.set(Arc::new(|a: &Asked, c: &[u8]| {
        let bare = a.path.split('?').next().unwrap_or("");
        let tags = OBJECTS
            .iter()
            .find(|(p, _)| *p == bare)
            .map_or("", |(_, t)| *t);
        let fields = format!("Cache-Control: max-age=3600\r\n{tags}");
        (ranged(c, a.range, &fields), false, None)
    }));
    (origin, contents)
}

/// The edge's config: `/pull/` by Surrogate-Key (the default), `/tagged/` by Cache-Tag, a
/// control token.
fn write_config(dir: &std::path::Path, origin: SocketAddr, token: &AdminToken) -> String {
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let cfg = dir.join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n{}\
             [[origin]]\nprefix = \"/pull/\"\nurl = \"http://{origin}\"\n\
             [[origin]]\nprefix = \"/tagged/\"\nurl = \"http://{origin}\"\n\
             purge_tag_header = \"cache-tag\"\n",
            cache.display(),
            token.config_line()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

fn start(dir: &std::path::Path, cfg: &str) -> (Server, SocketAddr) {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    common::start_with_admin(&root, &["--config", cfg, "--shards", "2"])
}

/// Requests the origin received for `path`.
fn fetched(origin: &ScriptedOrigin, path: &str) -> usize {
    origin.seen().iter().filter(|s| s.path == path).count()
}

/// GETs every object; asserts its bytes, that no tag field reached the client, and returns
/// which of them the origin was asked for again (by index).
fn get_all(server: &Server, origin: &ScriptedOrigin, contents: &[Vec<u8>]) -> Vec<usize> {
    let mut refetched = Vec::new();
    for (i, ((path, _), content)) in OBJECTS.iter().zip(contents).enumerate() {
        let before = fetched(origin, path);
        let r = get(server, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(&r.body == content, "{path}: its bytes");
        for field in ["surrogate-key", "cache-tag"] {
            assert_eq!(r.header(field), None, "{path}: {field} reached the client");
        }
        if fetched(origin, path) > before {
            refetched.push(i);
        }
    }
    refetched
}

/// Waits (up to 30 s) until shard 0 reports `n` for `family` (with `label`).
fn wait_metric(admin: SocketAddr, family: &str, label: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = common::admin_metric(admin, family, label);
        if got == n {
            return;
        }
        assert!(Instant::now() < deadline, "{family}: {got}, want {n}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until shard 0 reports `n` versions purged by tag.
fn wait_purged(admin: SocketAddr, n: u64) {
    wait_metric(admin, "shardline_cache_purged_total", "by=\"tag\"", n);
}

#[test]
fn a_tag_purges_every_object_carrying_it_for_good() {
    let (origin, contents) = tagging_origin();
    let dir = common::disk_tempdir();
    let token = AdminToken::write_in(dir.path());
    let cfg = write_config(dir.path(), origin.addr, &token);
    let (mut server, admin) = start(dir.path(), &cfg);
    let all: Vec<usize> = (0..OBJECTS.len()).collect();
    let tagged = vec![0, 1, 3];

    // Filled once each, then hits.
    assert_eq!(
        get_all(&server, &origin, &contents),
        all,
        "the first GETs miss"
    );
    assert_eq!(
        get_all(&server, &origin, &contents),
        Vec::<usize>::new(),
        "then hits"
    );
    // c.bin's over-long tag was dropped, and counted.
    wait_metric(admin, "shardline_cache_tags_dropped_total", "", 1);

    // The CLI: build-1234 goes (on both entries: Surrogate-Key and Cache-Tag), "other" stays.
    let purge_cli = |admin: SocketAddr, tag: &str| {
        common::run_shardline(
            &[
                "cache",
                "purge",
                "--admin",
                &admin.to_string(),
                "--token-file",
                token.path(),
                "--tag",
                tag,
            ],
            Duration::from_secs(30),
        )
    };
    let out = purge_cli(admin, "build-1234");
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "purged 3");
    assert_eq!(
        get_all(&server, &origin, &contents),
        tagged,
        "the tagged ones miss"
    );
    assert_eq!(get_all(&server, &origin, &contents), Vec::<usize>::new());
    wait_purged(admin, 3);

    // The endpoint: a token is required; a bad tag is refused; then the same again.
    let anonymous = shardline::cache::tool::AdminClient::new(admin, None);
    let (status, _) = anonymous
        .request("POST", "/cache/purge?tag=build-1234")
        .unwrap();
    assert_eq!(status, 401, "no token, no purge");
    let client = token.client(admin);
    for bad in ["tag=", "tag=a%20b", "tag=x&path=/pull/a.bin", "tag=a&tag=b"] {
        let (status, body) = client
            .request("POST", &format!("/cache/purge?{bad}"))
            .unwrap();
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, body) = client
        .request("POST", "/cache/purge?tag=build-1234")
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "purged 3"));
    let (status, body) = client.request("POST", "/cache/purge?tag=nothing").unwrap();
    assert_eq!((status, body.as_str()), (200, "purged 0"));
    wait_purged(admin, 6);

    // A restart keeps them purged: the tagged ones miss, "other" is still a hit.
    assert!(server.terminate().success());
    let (server, _admin) = start(dir.path(), &cfg);
    assert_eq!(
        get_all(&server, &origin, &contents),
        tagged,
        "after a restart: the purged ones miss, the rest hit"
    );
    // Their new versions carry their tags again, through the journal (the server killed
    // with SIGKILL this time: `Server`'s drop).
    drop(server);
    let (server, admin) = start(dir.path(), &cfg);
    let out = purge_cli(admin, "other");
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout.trim(),
        "purged 3",
        "c, d and e, replayed with their tags"
    );
    assert_eq!(get_all(&server, &origin, &contents), vec![2, 3, 4]);
}

/// A reply that is not stored (each client's own fetch) carries its tag field to no one either.
#[test]
fn the_tag_field_never_reaches_a_client_of_a_pass() {
    let origin = ScriptedOrigin::start(vec![("/pull/own.bin", object(5000, 9))]);
    origin.set(Arc::new(|a: &Asked, c: &[u8]| {
        let fields = "Cache-Control: private\r\nSurrogate-Key: build-1234\r\nCache-Tag: x\r\n";
        (ranged(c, a.range, fields), false, None)
    }));
    let dir = common::disk_tempdir();
    let token = AdminToken::write_in(dir.path());
    let cfg = write_config(dir.path(), origin.addr, &token);
    let (server, _admin) = start(dir.path(), &cfg);
    for _ in 0..2 {
        let r = get(&server, "/pull/own.bin", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("cache-control"), Some("private"));
        assert_eq!(r.header("surrogate-key"), None);
        assert_eq!(r.header("cache-tag"), None);
    }
    assert!(
        fetched(&origin, "/pull/own.bin") >= 2,
        "each client's own fetch"
    );
}
