//! Signed URLs (issue 19) against the real binary: `shardline sign` makes a URL that curl
//! downloads byte for byte; an expired one, a bad signature, a missing one, an unknown key id
//! and a `..` detour into the prefix get 403 and are counted by reason; key rotation by SIGHUP
//! while a client downloads in a loop: the new key works at once, the removed one stops, and
//! the loop never sees an error.

mod common;

use common::tls::{run_bounded, tool};
use common::Server;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BODY: usize = 300_000;

fn hex_key(b: u8) -> String {
    format!("{b:02x}").repeat(32)
}

fn sign(cfg: &std::path::Path, url: &str, key_id: &str, expires_in: u64) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["sign", url, "--key-id", key_id, "--expires-in"])
        .arg(expires_in.to_string())
        .arg("--config")
        .arg(cfg)
        .output()
        .expect("shardline sign");
    assert!(
        o.status.success(),
        "sign: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// (status, body) of a GET of `url` with curl (the body goes through a file: run_bounded
/// reads the pipes only at the end).
fn curl(url: &str) -> (u16, Vec<u8>) {
    let curl = tool("curl", "curl");
    let out = tempfile::NamedTempFile::new().unwrap();
    let o = run_bounded(
        Command::new(curl)
            .args(["-sS", "-w", "%{http_code}", "-o"])
            .arg(out.path())
            .arg(url),
        Duration::from_secs(30),
    );
    let status = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl {url}: {}", String::from_utf8_lossy(&o.stderr)));
    (status, std::fs::read(out.path()).unwrap())
}

fn wait_for_log(server: &Server, needle: &str, after: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if server.log().matches(needle).count() > after {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn signed_urls_are_checked_counted_and_rotate_on_sighup() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("beta")).unwrap();
    std::fs::create_dir_all(root.join("free")).unwrap();
    common::write_pattern_file(&root.join("beta/game.pak"), BODY as u64);
    common::write_pattern_file(&root.join("free/x.bin"), 1000);
    let keys = dir.path().join("url.keys");
    std::fs::write(&keys, format!("k1 {}\nk2 {}\n", hex_key(1), hex_key(2))).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[signed_url]]\nprefix = \"/beta/\"\nkey_file = \"{}\"\n",
            keys.display()
        ),
    )
    .unwrap();
    let (server, admin) = common::start_with_admin(&root, &["--config", cfg.to_str().unwrap()]);
    let base = format!("http://127.0.0.1:{}", server.addr.port());
    let refused = |reason: &str| {
        common::admin_metric(
            admin,
            "shardline_signed_url_refused_total",
            &format!("reason=\"{reason}\""),
        )
    };

    // A signed URL: every byte.
    let good = sign(&cfg, &format!("{base}/beta/game.pak"), "k1", 600);
    assert!(good.contains("expires=") && good.contains("key_id=k1") && good.contains("signature="));
    let (status, body) = curl(&good);
    assert_eq!(status, 200, "{good}");
    assert_eq!(body, common::pattern(BODY));
    // Outside the prefix nothing is asked.
    assert_eq!(curl(&format!("{base}/free/x.bin")).0, 200);

    // Missing, a `..` detour into the prefix, a bad signature, an unknown key, expired.
    assert_eq!(curl(&format!("{base}/beta/game.pak")).0, 403);
    assert_eq!(curl(&format!("{base}/free/../beta/game.pak")).0, 403);
    assert_eq!(refused("missing"), 2);
    let mut bad = good.clone();
    let last = bad.pop().unwrap();
    bad.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(curl(&bad).0, 403);
    let moved = good.replace("/beta/game.pak", "/beta/other.pak");
    assert_eq!(curl(&moved).0, 403);
    assert_eq!(refused("bad_signature"), 2);
    assert_eq!(curl(&good.replace("key_id=k1", "key_id=k9")).0, 403);
    assert_eq!(refused("unknown_key"), 1);
    let rule = shardline::signing::RuleConfig {
        prefix: "/beta/".into(),
        key_file: keys.clone(),
        expires_param: "expires".into(),
        key_id_param: "key_id".into(),
        signature_param: "signature".into(),
    };
    let ring = shardline::signing::KeyRing::load(&keys).unwrap();
    let game = shardline::fs::resolve::resolve_target(b"/beta/game.pak").unwrap();
    let old = shardline::signing::sign_query(
        &rule,
        &shardline::fs::resolve::ResolvedRef {
            rel_path: &game.rel_path,
            wants_dir: game.wants_dir,
        },
        "k1",
        ring.get("k1").unwrap(),
        1_000_000,
    );
    assert_eq!(curl(&format!("{base}/beta/game.pak?{old}")).0, 403);
    assert_eq!(refused("expired"), 1);

    // Rotation under load: a client downloads with k2 in a loop while k1 is removed.
    let with_k2 = sign(&cfg, &format!("{base}/beta/game.pak"), "k2", 600);
    let stop = Arc::new(AtomicBool::new(false));
    let loop_url = with_k2.clone();
    let stop2 = stop.clone();
    let looper = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(Ordering::Relaxed) {
            let (status, body) = curl(&loop_url);
            assert_eq!(status, 200, "a k2 download during the rotation");
            assert_eq!(body.len(), BODY);
            n += 1;
        }
        n
    });
    std::thread::sleep(Duration::from_millis(300));
    let reloads = server.log().matches("configuration reloaded").count();
    std::fs::write(&keys, format!("k2 {}\nk3 {}\n", hex_key(2), hex_key(3))).unwrap();
    common::send_signal(&server, "HUP");
    assert!(
        wait_for_log(&server, "configuration reloaded", reloads),
        "{}",
        server.log()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(curl(&good).0, 403, "k1 is gone after the reload");
    let with_k3 = sign(&cfg, &format!("{base}/beta/game.pak"), "k3", 600);
    assert_eq!(curl(&with_k3).0, 200, "k3 works after the reload");
    // A bad key file is refused with one line naming it; the running keys stay.
    std::fs::write(&keys, "k4 nothex\n").unwrap();
    let reloads = server.log().matches("configuration reloaded").count();
    common::send_signal(&server, "HUP");
    assert!(
        wait_for_log(&server, "configuration reloaded", reloads),
        "{}",
        server.log()
    );
    assert!(
        server.log().contains("signed_url keys not reloaded"),
        "{}",
        server.log()
    );
    assert_eq!(
        curl(&with_k3).0,
        200,
        "the running keys stay after a bad file"
    );
    stop.store(true, Ordering::Relaxed);
    let n = looper.join().expect("the download loop saw an error");
    assert!(n >= 2, "the loop ran {n} downloads");
}
