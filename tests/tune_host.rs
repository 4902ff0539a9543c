//! `scripts/tune-host.sh` on a copy of the `trouble` fixture: the dry run changes nothing,
//! `--apply` fixes what the doctor warns about, and a second `--apply` changes nothing more.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use shardline::doctor::{run_checks, DoctorArgs, DoctorContext, Status};

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A writable copy of a fixture tree (symlinks kept).
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = manifest().join("tests/fixtures/doctor").join(name);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", src.display()))
        .arg(dir.path())
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a failed");
    dir
}

fn tune(root: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new("bash")
        .arg(manifest().join("scripts/tune-host.sh"))
        .args(args)
        .env("PROC_ROOT", root.join("proc"))
        .env("SYS_ROOT", root.join("sys"))
        .env("SYSCTL_CONF", root.join("etc/sysctl.d/90-shardline.conf"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Every file under `root` with its content, to compare runs.
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                files.insert(entry.path(), std::fs::read(entry.path()).unwrap());
            }
        }
    }
    files
}

#[test]
fn dry_run_then_apply_is_idempotent() {
    let root = copy_fixture("trouble");
    let before = contents(root.path());

    let (code, dry) = tune(root.path(), &["--iface", "eth0"]);
    assert_eq!(code, 0, "{dry}");
    for line in [
        "net.core.wmem_max: 212992 -> 16777216",
        "net.ipv4.tcp_wmem: 4096 16384 4194304 -> 4096 1048576 16777216",
        "net.ipv4.tcp_congestion_control: cubic -> bbr",
        "net.ipv4.tcp_notsent_lowat: 4294967295 -> 16384",
        "txqueuelen eth0: 1000 -> 10000",
        "/etc/sysctl.d/",
        "(dry run: nothing changed",
    ] {
        assert!(dry.contains(line), "missing {line:?} in:\n{dry}");
    }
    assert_eq!(contents(root.path()), before, "dry run wrote something");

    let (code, first) = tune(root.path(), &["--apply", "--iface", "eth0"]);
    assert_eq!(code, 0, "{first}");
    assert!(
        first.contains("net.core.somaxconn: 4096 -> 65535 (applied)"),
        "{first}"
    );
    let applied = contents(root.path());
    assert_ne!(applied, before);
    assert_eq!(
        std::fs::read_to_string(root.path().join("proc/sys/net/ipv4/tcp_wmem")).unwrap(),
        "4096 1048576 16777216\n"
    );

    let (code, second) = tune(root.path(), &["--apply", "--iface", "eth0"]);
    assert_eq!(code, 0, "{second}");
    assert!(
        !second.contains("->"),
        "second --apply changed something:\n{second}"
    );
    assert!(
        second.contains("net.core.wmem_max: ok (16777216)"),
        "{second}"
    );
    assert_eq!(
        contents(root.path()),
        applied,
        "second --apply wrote something"
    );

    // The doctor agrees: every tuned sysctl and the txqueuelen are OK now.
    let data = tempfile::tempdir().unwrap();
    let ctx = DoctorContext::from_args(&DoctorArgs {
        root: root.path().to_path_buf(),
        json: false,
        sample_ms: 0,
        data_root: data.path().to_path_buf(),
        arena_bytes: 64 << 20,
        shards: None,
        config: None,
    });
    let checks = run_checks(&ctx);
    for c in checks
        .iter()
        .filter(|c| c.name.starts_with("net.") || c.name == "nic.eth0.txqueuelen")
    {
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }
}

#[test]
fn bigger_values_are_kept_and_persist_is_idempotent() {
    let root = copy_fixture("healthy");
    let wmem_max = root.path().join("proc/sys/net/core/wmem_max");
    std::fs::write(&wmem_max, "67108864\n").unwrap();

    let (code, out) = tune(root.path(), &["--apply", "--persist"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("net.core.wmem_max: ok (67108864)"), "{out}");
    assert!(!out.contains("->"), "healthy host needs nothing:\n{out}");
    assert!(out.contains("persist: wrote"), "{out}");
    let conf = root.path().join("etc/sysctl.d/90-shardline.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(text.contains("net.core.wmem_max = 67108864\n"), "{text}");
    assert!(
        text.contains("net.ipv4.tcp_notsent_lowat = 16384\n"),
        "{text}"
    );

    let (_, again) = tune(root.path(), &["--apply", "--persist"]);
    assert!(
        again.contains("persist: ") && again.contains(" unchanged"),
        "{again}"
    );
}

#[test]
fn bad_arguments_and_missing_interface() {
    let root = copy_fixture("healthy");
    assert_eq!(tune(root.path(), &["--bogus"]).0, 2);
    let (code, out) = tune(root.path(), &["--iface", "nope0"]);
    assert_eq!(code, 1);
    assert!(out.contains("txqueuelen nope0: no such interface"), "{out}");
}
