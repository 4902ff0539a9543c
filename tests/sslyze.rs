//! sslyze (a TLS scanner by another project; `scripts/test-deps.sh` installs it from PyPI)
//! against the TLS port, with `--mozilla_config=intermediate`: protocols, cipher suites,
//! curves, certificate path and lifetime, and the robustness checks (CCS injection,
//! Heartbleed, ROBOT, renegotiation, fallback SCSV, compression, extended master secret) must
//! all comply with Mozilla's "intermediate" server configuration. The JSON report is kept in
//! `target/tmp/sslyze/`.

mod common;

use common::tls::{run_bounded, tool, Key, Pki};
use common::write_pattern_file;
use std::process::Command;
use std::time::Duration;

#[test]
fn sslyze_finds_the_tls_port_compliant_with_mozilla_intermediate() {
    let sslyze = tool("sslyze", "sslyze (PyPI)");
    let dir = common::disk_tempdir();
    write_pattern_file(&dir.path().join("index.html"), 1000);
    let pki = Pki::new();
    let ecdsa = pki.leaf("ecdsa", &["localhost"], Key::EcdsaP256, 365);
    let cfg = pki.config(&[ecdsa], "");
    let server = common::Server::start_tls(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let port = server.tls_addr.expect("HTTPS address").port();
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sslyze");
    std::fs::create_dir_all(&out).unwrap();
    let json = out.join("sslyze.json");
    let _ = std::fs::remove_file(&json);
    let o = run_bounded(
        Command::new(sslyze)
            .arg("--mozilla_config=intermediate")
            .arg("--certinfo_ca_file")
            .arg(&pki.ca)
            .arg("--json_out")
            .arg(&json)
            .arg(format!("localhost:{port}")),
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    std::fs::write(out.join("sslyze.txt"), &text).unwrap();
    assert!(
        text.contains("SCANS COMPLETED"),
        "sslyze did not finish:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A scan command that errored (a server answer the scanner did not expect) is a failure
    // even when the compliance check would not look at it.
    assert!(
        !text.contains("Error when running"),
        "a sslyze scan errored:\n{text}"
    );
    assert!(
        text.contains(&format!("localhost:{port}: OK - Compliant")),
        "not compliant with Mozilla intermediate:\n{text}"
    );
    assert!(o.status.success(), "sslyze exit status {:?}", o.status);
    // The report names what it saw: TLS 1.3 and 1.2 suites accepted, nothing older.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("sslyze JSON")).expect("JSON");
    let result = &report["server_scan_results"][0]["scan_result"];
    let accepted = |cmd: &str| {
        result[cmd]["result"]["accepted_cipher_suites"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert!(accepted("tls_1_3_cipher_suites") >= 2, "TLS 1.3 suites");
    assert!(accepted("tls_1_2_cipher_suites") >= 2, "TLS 1.2 suites");
    for old in [
        "ssl_2_0_cipher_suites",
        "ssl_3_0_cipher_suites",
        "tls_1_0_cipher_suites",
        "tls_1_1_cipher_suites",
    ] {
        assert_eq!(accepted(old), 0, "{old} accepted");
    }
}
