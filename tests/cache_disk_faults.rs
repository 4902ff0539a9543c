//! A cache disk that dies under the edge (issue 43), as root: three loop-backed ext4 file
//! systems as `cache_dirs`, one shut down with `EXT4_IOC_SHUTDOWN` (every later I/O on it fails
//! with EIO, as a dead drive's does), or shrunk under its file system (`losetup
//! --set-capacity`: every read past its new end fails). The edge keeps serving: every response whole and right,
//! the dead disk's objects too (a read it fails goes on from the origin), the dead
//! disk is taken to failing after `DEVICE_ERRORS_TO_FAIL` device errors (shown in
//! `/metrics`), its objects become misses filled again on the other disks, and new objects go
//! to the others only.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::get;
use shardline::cache::disk_health::DEVICE_ERRORS_TO_FAIL;
use shardline::origin::testing::NginxOrigin;

const SKIP_ROOT: &str = "SHARDLINE_SKIP_ROOT";
const SKIP_LOOP: &str = "SHARDLINE_SKIP_LOOP_DEVICES";
const OBJECTS: usize = 24;
const OBJECT_BYTES: u64 = 300_000 + 17;
/// Each disk's image (in /dev/shm: the loop device reads at memory speed).
const DISK_BYTES: u64 = 64 << 20;
/// `EXT4_IOC_SHUTDOWN` (`_IOR('X', 125, __u32)`), and its NOLOGFLUSH mode.
const EXT4_IOC_SHUTDOWN: u64 = 0x8004_587D;
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;
/// What a shrunk disk keeps: its superblock and group descriptors, none of its data.
const SHRUNK_BYTES: u64 = 1 << 20;

/// An ext4 file system on a loop device over an image in /dev/shm, mounted on a temp dir;
/// unmounted and detached on drop.
struct LoopDisk {
    mount: PathBuf,
    device: String,
    image: PathBuf,
    _dir: tempfile::TempDir,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect("run");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A new image in /dev/shm, unique in the process (the tests run side by side), and its loop
/// device.
fn new_device(name: &str) -> (PathBuf, String) {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let image = PathBuf::from(format!(
        "/dev/shm/shardline-disk-{}-{n}-{name}.img",
        std::process::id()
    ));
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(DISK_BYTES).unwrap();
    let device = run(
        "losetup",
        &[
            "--find",
            "--show",
            "--direct-io=on",
            image.to_str().unwrap(),
        ],
    );
    (image, device)
}

impl LoopDisk {
    fn make(name: &str) -> LoopDisk {
        let dir = tempfile::tempdir().unwrap();
        let (image, device) = new_device(name);
        // Built first, so a failing mkfs or mount still detaches the device (`Drop`).
        let disk = LoopDisk {
            mount: dir.path().join(name),
            device,
            image,
            _dir: dir,
        };
        std::fs::create_dir(&disk.mount).unwrap();
        disk.format_and_mount();
        disk
    }

    fn format_and_mount(&self) {
        run("mkfs.ext4", &["-q", "-F", &self.device]);
        let mount = self.mount.to_str().unwrap();
        run("mount", &["-o", "errors=continue", &self.device, mount]);
    }

    /// The drive swapped for a blank one, mounted where the old one was.
    fn replace(&mut self) {
        run("umount", &["-l", self.mount.to_str().unwrap()]);
        run("losetup", &["-d", &self.device]);
        let _ = std::fs::remove_file(&self.image);
        let (image, device) = new_device("replacement");
        (self.image, self.device) = (image, device);
        self.format_and_mount();
    }

    /// Every later I/O on the file system fails with EIO (the ioctl through Python's
    /// `fcntl`, as `../shared/FACTS.md` does it: no `unsafe` in the tests).
    fn shut_down(&self) {
        let script = format!(
            "import fcntl, os, struct\nfd = os.open({:?}, os.O_RDONLY)\nfcntl.ioctl(fd, {EXT4_IOC_SHUTDOWN:#x}, struct.pack('I', {EXT4_GOING_FLAGS_NOLOGFLUSH}))\n",
            self.mount.to_str().unwrap()
        );
        run("python3", &["-c", &script]);
    }

    /// The device ends at `bytes` from now on (its image truncated to them): every read or
    /// write past that fails with EIO. The data files lie past the first few MiB (after the
    /// inode tables), so all of them are cut off.
    fn shrink(&self, bytes: u64) {
        let image = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.image)
            .unwrap();
        image.set_len(bytes).unwrap();
        run("losetup", &["--set-capacity", &self.device]);
        // Hits of small objects read through the page cache: what it holds of the disk goes,
        // so their next reads reach the device (global, but only a cost to anything else).
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Whether this test may make loop disks: root (`root_why` says what for) and loop devices;
/// each missing one is skipped only by its named variable, else the test fails.
fn loop_disks_can_be_made(root_why: &str) -> bool {
    common::prerequisite(common::running_as_root(), SKIP_ROOT, root_why)
        && common::prerequisite(
            Path::new("/dev/loop-control").exists(),
            SKIP_LOOP,
            "no /dev/loop-control: loop devices are missing",
        )
}

fn data_files(disk: &Path) -> usize {
    std::fs::read_dir(disk.join("data"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A GET whose body may be cut: the status and the body bytes that came before the close.
fn get_maybe_cut(server: &common::Server, path: &str) -> (u16, Vec<u8>) {
    let mut s = server.connect();
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut s, request.as_bytes()).unwrap();
    let all = common::read_to_eof(&mut s).unwrap_or_default();
    let Some(end) = all.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, Vec::new());
    };
    let head = String::from_utf8_lossy(&all[..end]);
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, all[end + 4..].to_vec())
}

#[test]
fn a_disk_shut_down_under_the_edge_costs_only_its_objects_and_a_blank_replacement_comes_online() {
    lose_a_disk_under_the_edge(LoopDisk::shut_down, true);
}

/// A disk shrunk under its file system (the image truncated, `losetup --set-capacity`): every
/// read past its new end fails with EIO, as a drive that lost its tail does.
#[test]
fn a_disk_shrunk_under_the_edge_costs_only_its_objects() {
    lose_a_disk_under_the_edge(|d| d.shrink(SHRUNK_BYTES), false);
}

/// Caches `OBJECTS` objects over three disks, `fail`s the one holding the most, and checks
/// that every response stays whole and right, that the disk is taken out, and that its objects
/// and new ones land on the others. With `replace`, the dead drive is then swapped for a blank
/// one and brought online while serving: it takes new objects, and nothing else moves.
fn lose_a_disk_under_the_edge(fail: impl Fn(&LoopDisk), replace: bool) {
    if !loop_disks_can_be_made("loop devices, mkfs and EXT4_IOC_SHUTDOWN need root") {
        return;
    }
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
    let mut disks: Vec<LoopDisk> = (0..3).map(|i| LoopDisk::make(&format!("d{i}"))).collect();
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let token = common::AdminToken::write_in(dir.path());
    let list: Vec<String> = disks
        .iter()
        .map(|d| format!("\"{}\"", d.mount.display()))
        .collect();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dirs = [{}]\n{}[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            list.join(", "),
            token.config_line(),
            origin.addr
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "2"]);
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    for i in 0..OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(r.status == 200 && r.body == want, "object {i}");
    }
    let held: Vec<usize> = disks.iter().map(|d| data_files(&d.mount)).collect();
    assert_eq!(held.iter().sum::<usize>(), OBJECTS, "{held:?}");
    // The disk holding the most dies.
    let dead = (0..3).max_by_key(|&i| held[i]).unwrap();
    assert!(held[dead] > 0);
    fail(&disks[dead]);

    // Every request is whole, never a wrong byte, the dead disk's objects too: a read the
    // disk fails (or a data file it will not open) goes on from the origin.
    for i in 0..OBJECTS {
        let (status, body) = get_maybe_cut(&server, &format!("/pull/{i}.bin"));
        assert!(
            status == 200 && body == want,
            "object {i} after the disk died: status {status}, {} of {} bytes, right so far: {}",
            body.len(),
            want.len(),
            body.len() <= want.len() && body[..] == want[..body.len()]
        );
    }
    let metric = |family: &str, label: &str| common::admin_metric(admin, family, label);
    let errors = |kind: &str| {
        let label = format!("kind=\"{kind}\"");
        metric("shardline_cache_disk_errors_total", &label)
    };
    let failing = metric("shardline_cache_disk_failing", &format!("disk=\"{dead}\""));
    let went_on = metric("shardline_cache_disk_failovers_total", "outcome=\"origin\"");
    let cut = metric("shardline_cache_disk_failovers_total", "outcome=\"cut\"");
    eprintln!(
        "disk {dead} ({} objects) lost: {went_on} responses went on from the origin, {cut} cut; \
         errors: {} device, {} checksum, {} other; failing {failing}",
        held[dead],
        errors("device"),
        errors("checksum"),
        errors("other"),
    );
    assert_eq!(failing, 1, "the dead disk is failing in /metrics");
    assert!(errors("device") >= DEVICE_ERRORS_TO_FAIL);
    assert!(went_on >= 1 && cut == 0, "{went_on} went on, {cut} cut");
    // And from then on none fails.
    for i in 0..OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(
            r.status == 200 && r.body == want,
            "object {i} after the disk was taken out"
        );
    }
    // Its objects were filled again on the others; new objects go there too, all whole.
    for i in OBJECTS..2 * OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(r.status == 200 && r.body == want, "new object {i}");
    }
    let alive: usize = (0..3)
        .filter(|&i| i != dead)
        .map(|i| data_files(&disks[i].mount))
        .sum();
    assert_eq!(
        alive,
        2 * OBJECTS,
        "every object now on the disks that live"
    );
    let log = server.log();
    assert_eq!(
        log.matches("cache disk failing: no new fills").count(),
        1,
        "one line takes the disk out: {log}"
    );
    if !replace {
        return;
    }
    // Its failure is kept across restarts by the disks that live (`failed-disks`).
    let mounts: Vec<PathBuf> = disks.iter().map(|d| d.mount.clone()).collect();
    let listed = |i: usize| mounts[i].join("failed-disks").exists();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !(0..3).filter(|&i| i != dead).all(listed) {
        assert!(
            std::time::Instant::now() < deadline,
            "the live disks never listed the dead one"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The dead drive is swapped for a blank one, and brought online while serving.
    disks[dead].replace();
    let said = common::disk_cli(admin, &token, &["online", &dead.to_string()]);
    assert!(said.contains("blank replacement"), "{said}");
    let status = common::disk_cli(admin, &token, &["status"]);
    assert!(status.contains(&format!("{dead} online")), "{status}");
    assert_eq!(
        metric("shardline_cache_disk_failing", &format!("disk=\"{dead}\"")),
        0
    );
    // Nothing of the others moves: every object is a hit.
    let requests = origin.requests();
    for i in 0..2 * OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(
            r.status == 200 && r.body == want,
            "object {i} after the replacement"
        );
    }
    assert_eq!(origin.requests(), requests, "an object moved");
    // New objects: the replacement takes its share, every byte right.
    for i in 2 * OBJECTS..4 * OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(
            r.status == 200 && r.body == want,
            "object {i} on the replaced disks"
        );
    }
    let took = data_files(&disks[dead].mount);
    // Back: no disk lists it any more (the I/O thread rewrote the lists at its next look).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (0..3).any(listed) {
        assert!(
            std::time::Instant::now() < deadline,
            "a disk still lists the one brought back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!(
        "the blank replacement took {took} of {} new objects",
        2 * OBJECTS
    );
    assert!(took > 0, "the replacement took no new object");
    assert_eq!(origin.requests(), requests + 2 * OBJECTS);
}

/// Thaws a frozen file system on drop, so a failing test never leaves a disk frozen.
struct Frozen<'a>(&'a LoopDisk);

impl Frozen<'_> {
    fn thaw(self) {}
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .args(["-u", self.0.mount.to_str().unwrap()])
            .status();
    }
}

/// The object the stall test downloads cold, at full speed: the freeze lands while several
/// of its read-ahead fetches write (each is given up, and the response must go on once).
const FROZEN_OBJECT_BYTES: u64 = 96 << 20;
/// `cache_disk_op_timeout_ms` in that test.
const FROZEN_OP_TIMEOUT_MS: u64 = 1000;

/// A disk frozen (`fsfreeze`) during a cold download: writes to it block in the kernel (the
/// loop disk is smaller than the object: only what comes before the freeze is written). The
/// fill's write passes `cache_disk_op_timeout_ms`, the disk is stalled, and the download
/// goes on from the origin, every byte right; meanwhile the edge serves everything else, the
/// other disks fill, and the held operation is counted until the disk thaws.
#[test]
fn a_disk_frozen_under_a_cold_download_costs_it_nothing() {
    if !loop_disks_can_be_made("loop devices, mkfs and fsfreeze need root") {
        return;
    }
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    common::write_pattern_file(
        &origin_root.path().join("pull/big.bin"),
        FROZEN_OBJECT_BYTES,
    );
    for i in 0..OBJECTS {
        common::write_pattern_file(
            &origin_root.path().join(format!("pull/{i}.bin")),
            OBJECT_BYTES,
        );
    }
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let disks: Vec<LoopDisk> = (0..3).map(|i| LoopDisk::make(&format!("f{i}"))).collect();
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("local.txt"), b"served from root").unwrap();
    let list: Vec<String> = disks
        .iter()
        .map(|d| format!("\"{}\"", d.mount.display()))
        .collect();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dirs = [{}]\ncache_disk_op_timeout_ms = {FROZEN_OP_TIMEOUT_MS}\n\
             [[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            list.join(", "),
            origin.addr
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "2"]);
    let before: Vec<usize> = disks.iter().map(|d| data_files(&d.mount)).collect();
    // The cold download starts; once its data file exists, its disk is frozen.
    let mut s = server.connect();
    std::io::Write::write_all(
        &mut s,
        b"GET /pull/big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let frozen = loop {
        if let Some(i) = (0..3).find(|&i| data_files(&disks[i].mount) > before[i]) {
            break i;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no data file was created"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    run("fsfreeze", &["-f", disks[frozen].mount.to_str().unwrap()]);
    let guard = Frozen(&disks[frozen]);
    let reader = std::thread::spawn(move || common::read_to_eof(&mut s).unwrap_or_default());
    // While the disk is frozen: the stall is seen, the edge serves local files and the
    // other disks take new objects, every byte right.
    let metric = |family: &str, label: &str| common::admin_metric(admin, family, label);
    let disk_label = format!("disk=\"{frozen}\"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while metric("shardline_cache_disk_stalled", &disk_label) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the frozen disk was never noted stalled"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let local = get(&server, "/local.txt", &[]);
    assert_eq!(
        (local.status, &local.body[..]),
        (200, &b"served from root"[..])
    );
    let want = common::pattern_range(0, OBJECT_BYTES as usize);
    for i in 0..OBJECTS {
        let r = get(&server, &format!("/pull/{i}.bin"), &[]);
        assert!(r.status == 200 && r.body == want, "object {i} while frozen");
    }
    let all = reader.join().unwrap();
    let head = String::from_utf8_lossy(&all[..all.len().min(300)]).to_string();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("a response head: {} bytes: {head:?}", all.len()));
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "status of the download: {head:?}"
    );
    let body = &all[end + 4..];
    let big = common::pattern_range(0, FROZEN_OBJECT_BYTES as usize);
    assert!(
        body == &big[..],
        "the download under the frozen disk: {} of {} bytes, right so far: {}",
        body.len(),
        big.len(),
        body.len() <= big.len() && body[..] == big[..body.len()]
    );
    let held = metric("shardline_cache_disk_held_ops", &disk_label);
    // Only the frozen disk can have stalled.
    let stalls = metric("shardline_cache_disk_errors_total", "kind=\"stall\"");
    eprintln!("disk {frozen} frozen: {held} operations held, {stalls} stalls noted");
    assert!(held >= 1, "the frozen disk holds the operations given up");
    assert!(stalls >= 1);
    // No object went to the frozen disk after the stall.
    assert_eq!(data_files(&disks[frozen].mount), before[frozen] + 1);
    // Thawed, every held operation comes back.
    guard.thaw();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while metric("shardline_cache_disk_held_ops", &disk_label) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the held operations never came back after the thaw"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log = server.log();
    assert!(
        log.contains("cache disk stalled"),
        "one line says the disk stalled: {log}"
    );
}
