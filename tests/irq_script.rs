//! `scripts/irq-affinity.sh` against copies of the topology fixtures: a dry run writes
//! nothing, `--apply` writes what the dry run announced, and a second `--apply` changes nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every file under `root` with its contents, to compare whole trees before and after a run.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry.path().strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, fs::read(entry.path()).unwrap());
            }
        }
    }
    out
}

/// A temporary copy of fixture `name`; its root holds `sys/` and `proc/`.
fn fixture_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &manifest_dir().join("tests/fixtures/topology").join(name),
        dir.path(),
    );
    dir
}

fn run_script(root: &Path, shardline: &Path, args: &[&str]) -> (Output, String) {
    let output = Command::new("bash")
        .arg(manifest_dir().join("scripts/irq-affinity.sh"))
        .args(args)
        .env("SYSFS_ROOT", root.join("sys"))
        .env("PROC_ROOT", root.join("proc"))
        .env("SHARDLINE", shardline)
        .env_remove("SHARDLINE_PLAN_ARGS")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output, text)
}

fn read(root: &Path, rel: &str) -> String {
    fs::read_to_string(root.join(rel))
        .unwrap()
        .trim()
        .to_string()
}

const NO_SHARDLINE: &str = "/nonexistent/shardline";

#[test]
fn dry_run_changes_nothing_and_apply_is_idempotent() {
    let dir = fixture_copy("nic-8-queues");
    let root = dir.path();
    let no_bin = Path::new(NO_SHARDLINE);
    let before = snapshot(root);

    let (out, text) = run_script(root, no_bin, &["eth0", "--cpus", "0-3"]);
    assert!(out.status.success(), "{text}");
    assert_eq!(snapshot(root), before, "dry run must not write:\n{text}");
    assert!(text.contains("shard CPUs (--cpus): 0-3"), "{text}");
    assert!(text.contains("irq/41/smp_affinity_list: 5 -> 1"), "{text}");
    assert!(
        text.contains("irq/42/smp_affinity_list: 0-7 -> 2"),
        "{text}"
    );
    assert!(
        text.contains("irq/40/smp_affinity_list: 0 (unchanged)"),
        "{text}"
    );
    assert!(
        text.contains("tx-5/xps_cpus: CPUs none -> 1 (writes mask 2)"),
        "{text}"
    );
    assert!(text.contains("dry run: 9 files would change"), "{text}");

    let (out, text) = run_script(root, no_bin, &["eth0", "--cpus", "0-3", "--apply"]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("applied 9 of 9 changes"), "{text}");
    assert_eq!(read(root, "proc/irq/41/smp_affinity_list"), "1");
    assert_eq!(read(root, "proc/irq/42/smp_affinity_list"), "2");
    assert_eq!(read(root, "sys/class/net/eth0/queues/tx-5/xps_cpus"), "2");
    assert_eq!(read(root, "sys/class/net/eth0/queues/tx-3/xps_cpus"), "8");
    // Already-correct files are not rewritten (tx-0 keeps its kernel-style leading zero).
    assert_eq!(read(root, "sys/class/net/eth0/queues/tx-0/xps_cpus"), "01");
    let applied = snapshot(root);

    let (out, text) = run_script(root, no_bin, &["eth0", "--cpus", "0-3", "--apply"]);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("nothing to change: 16 files already match"),
        "{text}"
    );
    assert_eq!(snapshot(root), applied);
}

#[test]
fn cpus_come_from_shardline_plan_json() {
    let dir = fixture_copy("nic-8-queues");
    let root = dir.path();
    // The JSON the real `shardline plan --json` prints for this root and these flags.
    let args = shardline::placement::PlanArgs {
        root: root.to_path_buf(),
        cpus: "nic-local".parse().unwrap(),
        nic: Some("eth0".to_string()),
        shards: Some(2),
        json: true,
        smt: false,
        hwloc: false,
    };
    let json = shardline::placement::plan_cli_output(&args).unwrap();
    let bin_dir = tempfile::tempdir().unwrap();
    fs::write(bin_dir.path().join("plan.json"), json).unwrap();
    let fake = bin_dir.path().join("shardline");
    fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > '{dir}/args'\ncat '{dir}/plan.json'\n",
            dir = bin_dir.path().display()
        ),
    )
    .unwrap();
    let mut perms = fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    fs::set_permissions(&fake, perms).unwrap();

    let (out, text) = run_script(root, &fake, &["eth0"]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("shard CPUs (shardline plan): 0-1"), "{text}");
    let called = fs::read_to_string(bin_dir.path().join("args")).unwrap();
    assert_eq!(
        called.trim(),
        format!("plan --json --root {} --nic eth0", root.display())
    );
    // Queue k -> shard k mod 2: IRQ 42 (queue 2) to CPU 0, IRQ 47 (queue 7) to CPU 1.
    assert!(
        text.contains("irq/42/smp_affinity_list: 0-7 -> 0"),
        "{text}"
    );
    assert!(text.contains("irq/47/smp_affinity_list: 3 -> 1"), "{text}");
}

#[test]
fn falls_back_to_online_cpus() {
    let dir = fixture_copy("nic-8-queues");
    let (out, text) = run_script(dir.path(), Path::new(NO_SHARDLINE), &["eth0"]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("shard CPUs (online CPUs): 0-7"), "{text}");
    assert!(text.contains("irq/41/smp_affinity_list: 5 -> 1"), "{text}");
    assert!(text.contains("irq/45/smp_affinity_list: 1 -> 5"), "{text}");
}

#[test]
fn warns_about_irqbalance_with_the_irqs_to_ban() {
    let dir = fixture_copy("two-socket-smt");
    let (out, text) = run_script(
        dir.path(),
        Path::new(NO_SHARDLINE),
        &["ens1f0", "--cpus", "4-7"],
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("irqbalance is running (pid 812)"), "{text}");
    assert!(
        text.contains("IRQBALANCE_ARGS=\"--banirq=91 --banirq=92 --banirq=93 --banirq=94\""),
        "{text}"
    );
    // mlx5 vectors are found through device/msi_irqs; the async vector (90) is left alone.
    assert!(text.contains("irq/93/smp_affinity_list: 2 -> 6"), "{text}");
    assert!(!text.contains("irq/90/"), "{text}");
}

#[test]
fn refuses_unknown_interface_and_bad_cpu_lists() {
    let dir = fixture_copy("single-node");
    let no_bin = Path::new(NO_SHARDLINE);
    let (out, text) = run_script(dir.path(), no_bin, &["eth9"]);
    assert!(!out.status.success());
    assert!(text.contains("no interface eth9"), "{text}");
    let (out, text) = run_script(dir.path(), no_bin, &["ens3", "--cpus", "3-1"]);
    assert!(!out.status.success());
    assert!(text.contains("reversed range"), "{text}");
    // virtio-net: no queue IRQs to pin, XPS still set.
    let (out, text) = run_script(dir.path(), no_bin, &["ens3", "--cpus", "0-2"]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("no queue IRQs of ens3"), "{text}");
    assert!(
        text.contains("tx-0/xps_cpus: CPUs none -> 0,2 (writes mask 5)"),
        "{text}"
    );
}
