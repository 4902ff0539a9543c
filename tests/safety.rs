//! Path traversal and symlink escapes never reach a canary file outside the root.

mod common;
use common::*;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

struct Fixture {
    server: Server,
    canary: Vec<u8>,
    /// Keeps the sibling directories alive for the server's lifetime.
    _base: tempfile::TempDir,
}

/// base/
///   canary                 <- canary (what `/../canary` would reach)
///   outside/canary         <- canary
///   outside/inner.txt      <- canary
///   root/                  <- served
///     a.txt, sub/inner.txt
///     link.txt -> a.txt                (inside: allowed)
///     linkdir -> sub                   (inside: allowed)
///     escape -> ../outside/canary      (relative, leaves the root: 403)
///     escape_abs -> /abs/outside/canary
///     outdir -> ../outside             (directory leaving the root)
///     outdir_abs -> /abs/outside
fn start() -> Fixture {
    let base = disk_tempdir();
    let canary = format!(
        "CANARY-{}-{:?}-must-never-be-served\n",
        std::process::id(),
        std::time::SystemTime::now()
    )
    .into_bytes();
    let root: PathBuf = base.path().join("root");
    let outside = base.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(base.path().join("canary"), &canary).unwrap();
    std::fs::write(outside.join("canary"), &canary).unwrap();
    std::fs::write(outside.join("inner.txt"), &canary).unwrap();
    std::fs::write(root.join("a.txt"), b"inside file\n").unwrap();
    std::fs::write(root.join("sub/inner.txt"), b"inner inside\n").unwrap();
    let link = |target: &std::path::Path, name: &str| {
        std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    };
    link("a.txt".as_ref(), "link.txt");
    link("sub".as_ref(), "linkdir");
    link("sub/../a.txt".as_ref(), "link_dotdot_inside.txt");
    link("../outside/canary".as_ref(), "escape");
    link(&outside.join("canary"), "escape_abs");
    link("../outside".as_ref(), "outdir");
    link(&outside, "outdir_abs");
    link("../root/../canary".as_ref(), "escape_via_root");
    let server = Server::start(&root, &[]);
    Fixture {
        server,
        canary,
        _base: base,
    }
}

/// Everything the server sends on a fresh connection for `target` (request with
/// `Connection: close`, read to EOF).
fn fetch_all(server: &Server, target: &[u8]) -> Vec<u8> {
    let mut s = server.connect();
    let mut req = b"GET ".to_vec();
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(&req).unwrap();
    let mut out = Vec::new();
    // A reset after the response is fine; what matters is what arrived.
    let _ = std::io::Read::read_to_end(&mut s, &mut out);
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn status_of(resp: &[u8]) -> u16 {
    let line = resp.split(|&b| b == b'\n').next().unwrap_or_default();
    std::str::from_utf8(line)
        .ok()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {:?}", String::from_utf8_lossy(resp)))
}

fn assert_refused(f: &Fixture, target: &[u8], allowed: &[u16]) {
    let shown = String::from_utf8_lossy(target).into_owned();
    let resp = fetch_all(&f.server, target);
    assert!(
        !contains(&resp, &f.canary),
        "{shown}: the canary leaked:\n{}",
        String::from_utf8_lossy(&resp)
    );
    assert!(
        !contains(&resp, b"CANARY-"),
        "{shown}: canary bytes in the response"
    );
    let status = status_of(&resp);
    assert!(
        allowed.contains(&status),
        "{shown}: status {status}, want one of {allowed:?}"
    );
    // The server still answers a normal request.
    let ok = get(&f.server, "/a.txt", &[]);
    assert_eq!(ok.status, 200, "after {shown}");
    assert_eq!(ok.body, b"inside file\n", "after {shown}");
}

const REFUSED: &[u16] = &[400, 403, 404];

#[test]
fn traversal_attempts_never_leak_the_canary() {
    let f = start();
    for target in [
        &b"/../canary"[..],
        b"/../../canary",
        b"/%2e%2e/canary",
        b"/%2E%2E/canary",
        b"/.%2e/canary",
        b"/%2e./canary",
        b"/%252e%252e/canary",
        b"/..%2fcanary",
        b"/..%2Fcanary",
        b"/%2e%2e%2fcanary",
        b"/..%5ccanary",
        b"/..\\canary",
        b"/%c0%af",
        b"/%c0%ae%c0%ae/canary",
        b"/..%c0%afcanary",
        b"/%e0%80%ae%e0%80%ae/canary",
        b"/a.txt%00",
        b"/%00",
        b"/%00/../canary",
        b"/..%00/canary",
        b"/sub/../../canary",
        b"/sub/%2e%2e/%2e%2e/canary",
        b"/sub/./../.././canary",
        b"//../canary",
        b"/./../canary",
        b"/../outside/canary",
        b"/..;/canary",
        b"/%2e%2e;/canary",
        b"/.../canary",
        b"/....//canary",
        b"http://test/../canary",
        b"http://test/%2e%2e/outside/canary",
        b"../canary",
        b"canary",
        b"/root/../../canary",
        b"/%2froot/../canary",
        b"/%",
        b"/%2",
        b"/%zz",
    ] {
        assert_refused(&f, target, REFUSED);
    }
}

#[test]
fn raw_control_bytes_in_the_target_are_refused() {
    let f = start();
    for target in [
        &b"/a.txt\x00"[..],
        b"/\x00../canary",
        b"/a\x01b",
        b"/a\x7fb",
    ] {
        assert_refused(&f, target, &[400]);
    }
}

#[test]
fn symlinks_leaving_the_root_are_403() {
    let f = start();
    for target in [
        &b"/escape"[..],
        b"/escape_abs",
        b"/outdir/canary",
        b"/outdir_abs/canary",
        b"/outdir/inner.txt",
        b"/escape_via_root",
    ] {
        assert_refused(&f, target, &[403]);
    }
    // Directory symlinks leaving the root, asked for as directories.
    for target in [&b"/outdir/"[..], b"/outdir_abs/"] {
        assert_refused(&f, target, &[403, 404]);
    }
}

#[test]
fn symlinks_inside_the_root_are_served() {
    let f = start();
    let r = get(&f.server, "/link.txt", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"inside file\n");
    let r = get(&f.server, "/linkdir/inner.txt", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"inner inside\n");
    let r = get(&f.server, "/link_dotdot_inside.txt", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"inside file\n");
}

#[test]
fn symlinks_can_be_denied_entirely() {
    let base = disk_tempdir();
    let root = base.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"inside file\n").unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link.txt")).unwrap();
    let cfg = base.path().join("shardline.toml");
    std::fs::write(&cfg, "symlinks = \"deny\"\n").unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(get(&server, "/a.txt", &[]).status, 200);
    let r = get(&server, "/link.txt", &[]);
    assert_eq!(r.status, 403, "symlinks = deny: {r:?}");
}

#[test]
fn unreadable_file_is_403() {
    // Root ignores file permissions, so as root (CI) the server runs as `nobody` instead.
    let base = disk_tempdir();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for dir in [base.path(), &root] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(root.join("a.txt"), b"inside file\n").unwrap();
    let p = root.join("secret.txt");
    std::fs::write(&p, b"secret").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    let Some(server) = Server::start_unprivileged(&root, &[]) else {
        return;
    };
    let r = get(&server, "/secret.txt", &[]);
    assert_eq!(r.status, 403, "{r:?}");
    assert!(!contains(&r.body, b"secret"), "{r:?}");
    // The unprivileged server serves what it may read.
    let ok = get(&server, "/a.txt", &[]);
    assert_eq!((ok.status, &ok.body[..]), (200, &b"inside file\n"[..]));
}
