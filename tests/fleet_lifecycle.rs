//! An edge behind a load balancer: the health path on the serving listener, drain without
//! loss on SIGTERM, SIGHUP reload, and a restart that hands the address to a new process.

mod common;

use common::*;

const HEALTH: &str = "/__shardline/health";

fn small_root() -> tempfile::TempDir {
    let dir = disk_tempdir();
    std::fs::write(dir.path().join("a.txt"), b"hello\n").unwrap();
    dir
}

#[test]
fn health_path_answers_on_the_serving_listener_without_a_file() {
    let dir = small_root();
    let server = Server::start(dir.path(), &[]);
    let r = get(&server, HEALTH, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"200 OK\n");
    let r = get(&server, &format!("{HEALTH}?from=haproxy"), &[]);
    assert_eq!(r.status, 200, "a query string is ignored");
    let head = raw_request(
        &server,
        format!("HEAD {HEALTH} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    // Files are still files; a path beside the health path is not health.
    assert_eq!(get(&server, "/a.txt", &[]).body, b"hello\n");
    assert_eq!(get(&server, &format!("{HEALTH}x"), &[]).status, 404);
}
