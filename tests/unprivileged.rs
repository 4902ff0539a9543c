//! First start as an ordinary user: the real binary runs as `nobody` with the usual 8 MiB
//! RLIMIT_MEMLOCK (and, in one case, a hard RLIMIT_NOFILE of 4096), serves a file and says in
//! one line what it shrank. Needs root to drop privileges (`prlimit` + `setpriv`, util-linux);
//! without root it fails unless SHARDLINE_SKIP_UNPRIVILEGED=1.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use common::{pattern, read_response, IO_TIMEOUT, STARTUP_TIMEOUT};

/// The usual desktop memlock limit.
const MEMLOCK_BYTES: u64 = 8 * 1024 * 1024;
/// The memlock limit is per user: runs as `nobody` take turns so they never share it.
static AS_NOBODY: Mutex<()> = Mutex::new(());
// io_uring frees a closed ring's locked memory asynchronously (100-500 ms after close here):
// runs follow each other at once, so these tests also check that an immediate restart under a
// tight limit works (the shard retries ENOMEM for RING_ENOMEM_RETRY_MS).

/// True when the test can run; panics with the reason when it cannot and no skip was asked.
fn can_run() -> bool {
    let skip = std::env::var("SHARDLINE_SKIP_UNPRIVILEGED").is_ok_and(|v| v == "1");
    let missing = if !rustix::process::geteuid().is_root() {
        Some("must run as root to start the server as nobody".to_string())
    } else {
        ["prlimit", "setpriv"]
            .into_iter()
            .find(|tool| {
                Command::new(tool)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_err()
            })
            .map(|tool| format!("`{tool}` (util-linux) is not installed"))
    };
    match missing {
        None => true,
        Some(why) if skip => {
            eprintln!("skipped: {why} (SHARDLINE_SKIP_UNPRIVILEGED=1)");
            false
        }
        Some(why) => panic!("{why}; set SHARDLINE_SKIP_UNPRIVILEGED=1 to skip"),
    }
}

/// A directory `nobody` can read (mode 755) holding `pkg.bin` (644) and a copy of the binary
/// (755: the build tree may be closed to other users).
struct World {
    dir: tempfile::TempDir,
    content: Vec<u8>,
}

impl World {
    fn new() -> World {
        let dir = tempfile::Builder::new()
            .prefix("shardline-unprivileged")
            .tempdir_in("/tmp")
            .expect("tempdir under /tmp");
        let set_mode = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        set_mode(dir.path(), 0o755);
        let www = dir.path().join("www");
        std::fs::create_dir(&www).unwrap();
        set_mode(&www, 0o755);
        // Several chunks of even the smallest arena, so the registered buffers are used.
        let content = pattern(3 << 20);
        std::fs::write(www.join("pkg.bin"), &content).unwrap();
        set_mode(&www.join("pkg.bin"), 0o644);
        std::fs::copy(
            env!("CARGO_BIN_EXE_shardline"),
            dir.path().join("shardline"),
        )
        .unwrap();
        set_mode(&dir.path().join("shardline"), 0o755);
        World { dir, content }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }
}

/// A server started as nobody; killed on drop.
struct Unprivileged {
    child: Child,
    addr: SocketAddr,
    stderr_path: PathBuf,
}

/// `prlimit LIMITS setpriv --reuid=nobody ... shardline serve --root ROOT` on loopback port 0,
/// admin off; callers add arguments and I/O.
fn serve_as_nobody(world: &World, limits: &[&str]) -> Command {
    let mut cmd = Command::new("prlimit");
    cmd.args(limits)
        .args([
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ])
        .arg(world.dir.path().join("shardline"))
        .arg("serve")
        .arg("--root")
        .arg(world.root())
        .args(["--listen", "127.0.0.1:0", "--admin", ""]);
    cmd
}

impl Unprivileged {
    /// `prlimit LIMITS setpriv --reuid=nobody ... shardline serve --root ROOT ARGS`.
    fn start(world: &World, limits: &[&str], args: &[&str]) -> Unprivileged {
        let stderr_path = world
            .dir
            .path()
            .join(format!("stderr-{}.log", args.join("_")));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut child = serve_as_nobody(world, limits)
            .args(args)
            .current_dir(world.root())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn prlimit");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("http://").nth(1) {
                    let _ = tx.send(rest.split('/').next().unwrap_or("").to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(a) => a.parse().expect("listening address"),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!("shardline did not start as nobody ({limits:?} {args:?}):\n{log}");
            }
        };
        Unprivileged {
            child,
            addr,
            stderr_path,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// GET /pkg.bin: (status, body).
    fn get(&self) -> (u16, Vec<u8>) {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(b"GET /pkg.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let r = read_response(&mut BufReader::new(s), false).expect("response");
        (r.status, r.body)
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Warning lines about resource limits (other warnings, such as the CPU plan's, vary by host).
fn limit_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") && l.contains("RLIMIT_"))
        .collect()
}

/// Serves the file's bytes under `limits`; the start-up says what it shrank in one line each.
fn serves_as_nobody(limits: &[&str], args: &[&str], expect_warnings: &[&str]) {
    if !can_run() {
        return;
    }
    let _turn = AS_NOBODY.lock().unwrap_or_else(|e| e.into_inner());
    let world = World::new();
    let server = Unprivileged::start(&world, limits, args);
    let (status, body) = server.get();
    let log = server.log();
    assert_eq!(status, 200, "{log}");
    assert!(body == world.content, "body differs from the file\n{log}");
    assert!(!log.contains(" ERROR "), "{log}");
    let warned = limit_warnings(&log);
    assert_eq!(warned.len(), expect_warnings.len(), "{log}");
    for (line, want) in warned.iter().zip(expect_warnings) {
        assert!(line.contains(want), "{line:?} lacks {want:?}");
        // Plain words for people: no Rust Debug values such as Some(4096).
        assert!(!line.contains("Some(") && !line.contains("None"), "{line}");
    }
}

#[test]
fn default_shards_start_as_nobody_with_8_mib_memlock() {
    serves_as_nobody(
        &[&format!("--memlock={MEMLOCK_BYTES}:{MEMLOCK_BYTES}")],
        &[],
        &["RLIMIT_MEMLOCK is 8 MiB"],
    );
}

#[test]
fn one_shard_starts_as_nobody_with_8_mib_memlock() {
    serves_as_nobody(
        &[&format!("--memlock={MEMLOCK_BYTES}:{MEMLOCK_BYTES}")],
        &["--shards", "1"],
        &["RLIMIT_MEMLOCK is 8 MiB"],
    );
}

#[test]
fn a_hard_nofile_limit_of_4096_lowers_the_connection_cap() {
    serves_as_nobody(
        &[
            &format!("--memlock={MEMLOCK_BYTES}:{MEMLOCK_BYTES}"),
            "--nofile=4096:4096",
        ],
        &["--shards", "1"],
        &["RLIMIT_MEMLOCK is 8 MiB", "RLIMIT_NOFILE allows 4096"],
    );
}

#[test]
fn a_tight_memlock_limit_starts_fewer_shards_instead_of_failing() {
    // 2 MiB: one shard's rings (532 KiB on 6.18) and smallest arena (8 x 64 KiB) fit, two on
    // a 2-CPU host do not; more CPUs under 8 MiB are the same situation.
    serves_as_nobody(
        &["--memlock=2097152:2097152"],
        &[],
        &["RLIMIT_MEMLOCK is 2 MiB"],
    );
}

#[test]
fn a_memlock_limit_too_small_for_one_shard_names_the_limit() {
    if !can_run() {
        return;
    }
    let _turn = AS_NOBODY.lock().unwrap_or_else(|e| e.into_inner());
    let world = World::new();
    let out = serve_as_nobody(&world, &["--memlock=65536:65536"])
        .stdin(Stdio::null())
        .output()
        .expect("run prlimit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("RLIMIT_MEMLOCK") && err.contains("64 KiB") && err.contains("ulimit -l"),
        "{err}"
    );
    assert!(!err.contains("Some("), "{err}");
}
