//! testssl.sh (Debian package `testssl.sh`, command `testssl`) against the TLS port: protocols,
//! cipher categories and order, forward secrecy, server defaults, HTTP headers, every
//! vulnerability check and the client simulations. Nothing may be rated VULNERABLE or NOT ok,
//! and no finding may be HIGH or CRITICAL. The run's text and JSON output are kept in
//! `target/tmp/testssl/`, or in `$SHARDLINE_TESTSSL_OUT` when set (the committed copy of a run
//! is `perf/testssl/`, made by `perf/testssl.sh`).

mod common;

use common::tls::{run_bounded, tool, Key, Pki};
use common::write_pattern_file;
use std::process::Command;
use std::time::Duration;

#[test]
fn testssl_finds_nothing_vulnerable_or_not_ok() {
    let testssl = tool("testssl", "testssl.sh");
    let dir = common::disk_tempdir();
    write_pattern_file(&dir.path().join("index.html"), 1000);
    let pki = Pki::new();
    // An ECDSA and an RSA certificate, as an edge would carry for old and new clients.
    let ecdsa = pki.leaf("ecdsa", &["localhost"], Key::EcdsaP256, 365);
    let rsa = pki.leaf("rsa", &["localhost"], Key::Rsa2048, 365);
    let cfg = pki.config(&[ecdsa, rsa], "");
    let server = common::Server::start_tls(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let port = server.tls_addr.expect("HTTPS address").port();
    let out = std::env::var_os("SHARDLINE_TESTSSL_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("testssl"));
    std::fs::create_dir_all(&out).unwrap();
    let json = out.join("testssl.json");
    let _ = std::fs::remove_file(&json);
    let o = run_bounded(
        Command::new(testssl)
            .args(["--quiet", "--color", "0", "--warnings", "off", "--add-ca"])
            .arg(&pki.ca)
            .arg("--jsonfile")
            .arg(&json)
            .arg(format!("https://localhost:{port}/index.html")),
        Duration::from_secs(600),
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    std::fs::write(out.join("testssl.txt"), &text).unwrap();
    assert!(
        text.contains("Done "),
        "testssl did not finish:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let findings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("testssl JSON")).expect("JSON");
    let bad: Vec<String> = findings
        .as_array()
        .expect("a list of findings")
        .iter()
        .filter(|f| matches!(f["severity"].as_str(), Some("HIGH" | "CRITICAL")))
        .map(|f| format!("{} [{}]: {}", f["id"], f["severity"], f["finding"]))
        .collect();
    let flagged: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("NOT ok") || l.contains("VULNERABLE"))
        .collect();
    assert!(
        bad.is_empty() && flagged.is_empty(),
        "testssl flagged:\n{}\n{}\n(full output in {})",
        bad.join("\n"),
        flagged.join("\n"),
        out.display()
    );
    // The protocols offered are exactly TLS 1.2 and 1.3.
    for (id, want) in [
        ("SSLv2", "not offered"),
        ("SSLv3", "not offered"),
        ("TLS1", "not offered"),
        ("TLS1_1", "not offered"),
        ("TLS1_2", "offered"),
        ("TLS1_3", "offered"),
    ] {
        let f = findings
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no {id} finding"));
        let finding = f["finding"].as_str().unwrap_or("");
        assert!(finding.starts_with(want), "{id}: {finding}");
    }
}
