//! Shared helpers for integration tests: start the real `shardline` binary on an ephemeral
//! loopback port over a temporary root, talk raw HTTP/1.1 to it, stop it with SIGTERM.
#![allow(dead_code)]

pub mod haproxy;
pub mod scripted_origin;
pub mod tls;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for the server to print its listening line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Socket read/write timeout for test clients (a hung server fails the test, not CI).
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A running server; killed on drop if still alive.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The HTTPS listener's address (servers started with `start_tls`).
    pub tls_addr: Option<SocketAddr>,
    /// The admin listener's address (servers started with `start_with_admin`).
    pub admin: Option<SocketAddr>,
    pub root: PathBuf,
    stderr_path: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// Deterministic content for a test file: byte i = (i * 7 + i / 4093) as u8 (no period that
/// lines up with 512/4096 alignment, so a misplaced chunk shows).
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) + i / 4093) as u8)
        .collect()
}

/// A temp dir on a real disk (not tmpfs) when possible, so O_DIRECT is exercised.
pub fn disk_tempdir() -> tempfile::TempDir {
    for base in ["/var/tmp", "."] {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("shardline-test")
            .tempdir_in(base)
        {
            return d;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

impl Server {
    /// Starts `shardline serve --root ROOT --listen 127.0.0.1:0 ARGS...`.
    pub fn start(root: &Path, extra: &[&str]) -> Server {
        Self::start_inner(root, extra, None)
    }

    /// Like `start` but owns the temp dir holding the root.
    pub fn start_owning(dir: tempfile::TempDir, root: &Path, extra: &[&str]) -> Server {
        Self::start_inner(root, extra, Some(dir))
    }

    /// Like `start`, but the server never runs as root: as root it is started through
    /// `UNPRIVILEGED_PREFIX` (user `nobody`, 8 MiB memlock), so checks that root would bypass
    /// (file permissions, RLIMIT_MEMLOCK) mean something in CI. Everything the server must
    /// read (root directory, binary) has to be readable by `nobody`. Fails when privileges
    /// cannot be dropped; None only when `SHARDLINE_SKIP_DROP_PRIVILEGES=1` asks to skip.
    #[track_caller]
    pub fn start_unprivileged(root: &Path, extra: &[&str]) -> Option<Server> {
        if !running_as_root() {
            return Some(Self::start(root, extra));
        }
        let bin = env!("CARGO_BIN_EXE_shardline");
        let probe = Command::new(UNPRIVILEGED_PREFIX[0])
            .args(&UNPRIVILEGED_PREFIX[1..])
            .args(["test", "-x", bin])
            .status();
        let missing = match probe {
            Ok(st) if st.success() => {
                return Some(Self::start_wrapped(UNPRIVILEGED_PREFIX, root, extra, None))
            }
            Ok(st) => format!(
                "running as root, and user nobody cannot execute {bin} ({st}): the test needs an \
                 unprivileged server (make the target directory world-readable)"
            ),
            Err(e) => format!(
                "running as root, and `{}` cannot be run ({e}): the test needs it to start an \
                 unprivileged server (Debian: util-linux)",
                UNPRIVILEGED_PREFIX.join(" ")
            ),
        };
        prerequisite(false, SKIP_DROP_PRIVILEGES, &missing);
        None
    }

    fn start_inner(root: &Path, extra: &[&str], dir: Option<tempfile::TempDir>) -> Server {
        Self::start_wrapped(&[], root, extra, dir)
    }

    /// Like `start` with a TLS listener among `extra`'s settings: also waits for the
    /// `shardline: HTTPS at https://ADDR/` line (`tls_addr`).
    pub fn start_tls(root: &Path, extra: &[&str]) -> Server {
        Self::start_full(&[], root, extra, None, true)
    }

    /// Starts the server as `WRAPPER... shardline serve ...` (an empty wrapper runs it directly).
    fn start_wrapped(
        wrapper: &[&str],
        root: &Path,
        extra: &[&str],
        dir: Option<tempfile::TempDir>,
    ) -> Server {
        Self::start_full(wrapper, root, extra, dir, false)
    }

    fn start_full(
        wrapper: &[&str],
        root: &Path,
        extra: &[&str],
        dir: Option<tempfile::TempDir>,
        want_tls: bool,
    ) -> Server {
        Self::start_announced(wrapper, root, extra, dir, want_tls, false)
    }

    /// Starts the server and waits for the addresses it prints: the data listener always,
    /// the HTTPS and admin listeners when asked for.
    fn start_announced(
        wrapper: &[&str],
        root: &Path,
        extra: &[&str],
        dir: Option<tempfile::TempDir>,
        want_tls: bool,
        want_admin: bool,
    ) -> Server {
        let stderr_path = std::env::temp_dir().join(format!(
            "shardline-test-{}-{}.log",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let bin = env!("CARGO_BIN_EXE_shardline");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(bin);
                cmd
            }
            None => Command::new(bin),
        };
        let admin_arg = if want_admin { "127.0.0.1:0" } else { "" };
        cmd.arg("serve")
            .arg("--root")
            .arg(root)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--shards",
                "1",
                "--admin",
                admin_arg,
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().expect("spawn shardline");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                // "serving DIR at http://A/", "HTTPS at https://A/", "admin at http://A/".
                let kind = if line.starts_with("shardline: admin at ") {
                    Announced::Admin
                } else if line.starts_with("shardline: HTTPS at ") {
                    Announced::Tls
                } else {
                    Announced::Data
                };
                let rest = line.split("://").nth(1);
                if let Some(addr) = rest.and_then(|r| r.split('/').next()) {
                    let _ = tx.send((kind, addr.to_string()));
                }
            }
        });
        let (mut addr, mut tls_addr, mut admin) = (None, None, None);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while addr.is_none() || (want_tls && tls_addr.is_none()) || (want_admin && admin.is_none())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((kind, a)) => {
                    let parsed: SocketAddr = a.parse().expect("announced address");
                    let slot = match kind {
                        Announced::Data => &mut addr,
                        Announced::Tls => &mut tls_addr,
                        Announced::Admin => &mut admin,
                    };
                    slot.get_or_insert(parsed);
                }
                Err(_) => {
                    let _ = child.kill();
                    let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                    panic!("shardline did not start:\n{log}");
                }
            }
        }
        Server {
            child,
            addr: addr.expect("listening address"),
            tls_addr,
            admin,
            root: root.to_path_buf(),
            stderr_path,
            _dir: dir,
        }
    }

    /// `http://ADDR` + path.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A connected client socket with timeouts.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s
    }

    /// Sends SIGTERM and waits (bounded) for exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id() as i32;
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("shardline did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

/// Which address a line of the server's stdout announces.
#[derive(Clone, Copy)]
enum Announced {
    Data,
    Tls,
    Admin,
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Server {
    fn drop(&mut self) {
        // Whether the server had already exited (a crash) tells a failing test's reader much.
        let exited = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("server (exited before the end of the test: {exited:?}) stderr, last lines:");
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
        let _ = std::fs::remove_file(&self.stderr_path);
    }
}

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First header value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response from `r`; `head_request` means no body follows whatever the headers say.
pub fn read_response(r: &mut impl BufRead, head_request: bool) -> std::io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before a response",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':').unwrap_or((h, ""));
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if !head_request && status != 304 && status != 204 {
        if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().map_err(std::io::Error::other)?;
            resp.body = vec![0; len];
            r.read_exact(&mut resp.body)?;
        }
    }
    Ok(resp)
}

/// Sends raw request bytes on a fresh connection and reads one response.
pub fn raw_request(server: &Server, request: &[u8]) -> std::io::Result<Response> {
    let mut s = server.connect();
    s.write_all(request)?;
    let head = request.starts_with(b"HEAD ");
    read_response(&mut BufReader::new(s), head)
}

/// A simple GET on a fresh connection.
pub fn get(server: &Server, path: &str, extra_headers: &[(&str, &str)]) -> Response {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (n, v) in extra_headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw_request(server, req.as_bytes()).expect("response")
}

/// Reads until EOF (for checking that the server closed the connection).
pub fn read_to_eof(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

/// Starts `shardline serve` like `Server::start` but with the admin listener on an ephemeral
/// loopback port (`--admin 127.0.0.1:0`); returns the server and the admin address, read from
/// the `shardline: admin at http://ADDR/` line the server prints after its serving line.
pub fn start_with_admin(root: &Path, extra: &[&str]) -> (Server, SocketAddr) {
    let server = Server::start_announced(&[], root, extra, None, false, true);
    let admin = server.admin.expect("admin address");
    (server, admin)
}

/// `start_with_admin` with a TLS listener among `extra`'s settings (`tls_addr` is set).
pub fn start_tls_with_admin(root: &Path, extra: &[&str]) -> (Server, SocketAddr) {
    let server = Server::start_announced(&[], root, extra, None, true, true);
    let admin = server.admin.expect("admin address");
    (server, admin)
}

/// `start_with_admin` that also owns the temp dir holding the root (removed with the server).
pub fn start_with_admin_owning(
    dir: tempfile::TempDir,
    root: &Path,
    extra: &[&str],
) -> (Server, SocketAddr) {
    let (mut server, admin) = start_with_admin(root, extra);
    server._dir = Some(dir);
    (server, admin)
}

// ---- helpers added for the issue-2 integration suite ------------------------------------------

/// Byte `i` of the `pattern` content, for any offset of an arbitrarily large file.
pub fn pattern_byte(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(i / 4093)) as u8
}

/// The `pattern` content repeats every 4093 * 256 bytes: 7i mod 256 has period 256 and
/// i / 4093 mod 256 has period 4093 * 256 (a multiple of 256).
pub const PATTERN_PERIOD: u64 = 4093 * 256;

/// `pattern(start + len)[start..]` without building the prefix (copied from one cached period,
/// so checking hundreds of MiB stays cheap in a debug build).
pub fn pattern_range(start: u64, len: usize) -> Vec<u8> {
    static PERIOD: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let period = PERIOD.get_or_init(|| (0..PATTERN_PERIOD).map(pattern_byte).collect());
    let mut out = Vec::with_capacity(len);
    let mut pos = (start % PATTERN_PERIOD) as usize;
    while out.len() < len {
        let n = (len - out.len()).min(period.len() - pos);
        out.extend_from_slice(&period[pos..pos + n]);
        pos = 0;
    }
    out
}

/// Writes `len` bytes of `pattern` content to `path` in bounded chunks (for files of hundreds
/// of MiB that should not be built in memory).
pub fn write_pattern_file(path: &Path, len: u64) {
    const CHUNK: u64 = 8 << 20;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create pattern file"));
    let mut pos = 0;
    while pos < len {
        let n = CHUNK.min(len - pos);
        f.write_all(&pattern_range(pos, n as usize))
            .expect("write pattern file");
        pos += n;
    }
    f.into_inner()
        .expect("flush pattern file")
        .sync_all()
        .expect("sync pattern file");
}

/// A directory under cargo's per-target test scratch space (a real disk, kept between runs)
/// holding `name`, a `pattern` file of `len` bytes. Built once (atomically, so concurrent test
/// binaries never see half a file) and reused by later runs.
pub fn cached_pattern_file(name: &str, len: u64) -> (PathBuf, PathBuf) {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("shardline-fixture-{name}-{len}"));
    std::fs::create_dir_all(&dir).expect("fixture dir");
    let path = dir.join(name);
    // Tests of one binary run on parallel threads: one builds, the others wait for it.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == len);
    if !ok {
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        write_pattern_file(&tmp, len);
        std::fs::rename(&tmp, &path).expect("rename fixture");
    }
    (dir, path)
}

/// Sends a signal (`"TERM"`, `"INT"`, `"KILL"`) to the server without waiting.
pub fn send_signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// Waits up to `timeout` for the server to exit; None if it is still running.
pub fn wait_exit(server: &mut Server, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = server.child.try_wait().expect("try_wait") {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Output of a bounded run of the binary.
#[derive(Debug)]
pub struct RunOutput {
    /// Exit code; None if it was killed by a signal or had to be killed after the timeout.
    pub code: Option<i32>,
    /// True when it was still running at the timeout (and was killed).
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `shardline ARGS...` with stdin closed, killing it after `timeout` (a command that
/// should fail at once but serves instead must not hang the test).
pub fn run_shardline(args: &[&str], timeout: Duration) -> RunOutput {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn shardline");
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    RunOutput {
        code: status.code(),
        timed_out,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Writes `request` on an open connection and reads one response from `reader` (a BufReader
/// over a clone of the same stream), so several exchanges can share one keep-alive connection.
pub fn exchange(
    stream: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    request: &str,
) -> std::io::Result<Response> {
    stream.write_all(request.as_bytes())?;
    read_response(reader, request.starts_with("HEAD "))
}

/// A connection plus a buffered reader over a clone of it.
pub fn connect_pair(server: &Server) -> (TcpStream, BufReader<TcpStream>) {
    let s = server.connect();
    let r = BufReader::new(s.try_clone().expect("clone stream"));
    (s, r)
}

/// After a response, the server must close: the next read sees EOF (or a reset), never more
/// bytes. Returns what was read (empty when the server closed cleanly).
pub fn expect_closed(reader: &mut BufReader<TcpStream>) -> Vec<u8> {
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut rest = Vec::new();
    match reader.read_to_end(&mut rest) {
        Ok(_) => rest,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => rest,
        Err(e) => panic!("connection was not closed by the server: {e} (after {rest:?})"),
    }
}

/// A fresh temp root holding `name`: the cached `pattern` file of `len` bytes, hard-linked
/// (copied where linking fails), so a test can add files to its root without touching the
/// shared fixture.
pub fn root_with_pattern_file(name: &str, len: u64) -> tempfile::TempDir {
    let (_, cached) = cached_pattern_file(name, len);
    let dir = disk_tempdir();
    let dest = dir.path().join(name);
    if std::fs::hard_link(&cached, &dest).is_err() {
        std::fs::copy(&cached, &dest).expect("copy fixture");
    }
    dir
}

// ---- prerequisites: a test that cannot run fails unless the environment asks to skip it -------
// Each reason has one variable, listed in tests/README.md.

/// Skips the tests that need at least two CPUs this process may run on (steering).
pub const SKIP_TWO_CPUS: &str = "SHARDLINE_SKIP_TWO_CPUS";
/// Skips the tests that need a tmpfs at /dev/shm (a file system without O_DIRECT).
pub const SKIP_TMPFS: &str = "SHARDLINE_SKIP_TMPFS";
/// Skips the tests that, run as root, need to drop privileges for the server and cannot.
pub const SKIP_DROP_PRIVILEGES: &str = "SHARDLINE_SKIP_DROP_PRIVILEGES";
/// Turns the "bytes were read with O_DIRECT" checks into notes, for a temp dir (/var/tmp or
/// the working directory) on a file system without O_DIRECT.
pub const SKIP_O_DIRECT: &str = "SHARDLINE_SKIP_O_DIRECT";

/// Runs the server as user `nobody` with the usual desktop memlock limit (8 MiB), when the
/// tests run as root (as CI does).
pub const UNPRIVILEGED_PREFIX: &[&str] = &[
    "prlimit",
    "--memlock=8388608:8388608",
    "setpriv",
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
];

/// True when `skip_var` is set to `1`.
pub fn skip_requested(skip_var: &str) -> bool {
    std::env::var(skip_var).is_ok_and(|v| v == "1")
}

/// A test's prerequisite: true when `met`. Otherwise the test fails with `missing` (it never
/// passes without having run), unless `skip_var=1` asks to skip it: then it says so on stderr
/// and returns false, and the caller returns.
#[track_caller]
pub fn prerequisite(met: bool, skip_var: &str, missing: &str) -> bool {
    if met {
        return true;
    }
    if skip_requested(skip_var) {
        eprintln!("skipped ({skip_var}=1): {missing}");
        return false;
    }
    panic!("{missing}; set {skip_var}=1 to skip this test");
}

/// True when this process runs with user id 0.
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

/// The CPUs this process may run on, sorted.
pub fn allowed_cpus() -> Vec<usize> {
    let mut cpus: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|core| core.id)
        .collect();
    cpus.sort_unstable();
    cpus
}

/// Runs the calling thread on CPU `cpu` alone (a loopback client's CPU steers its connection
/// to that CPU's shard).
pub fn pin_to_cpu(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("pin the client");
}

/// The allowed CPUs when there are at least two (what steering tests need); fails otherwise,
/// None only when `SHARDLINE_SKIP_TWO_CPUS=1` asks to skip.
#[track_caller]
pub fn two_or_more_cpus() -> Option<Vec<usize>> {
    let cpus = allowed_cpus();
    let missing = format!("steering needs at least 2 allowed CPUs, have {cpus:?}");
    prerequisite(cpus.len() >= 2, SKIP_TWO_CPUS, &missing).then_some(cpus)
}

/// A temp dir on the tmpfs at /dev/shm; fails when there is none, None only when
/// `SHARDLINE_SKIP_TMPFS=1` asks to skip.
#[track_caller]
pub fn tmpfs_tempdir() -> Option<tempfile::TempDir> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let is_tmpfs = mounts.lines().any(|l| {
        let mut fields = l.split_whitespace().skip(1);
        fields.next() == Some("/dev/shm") && fields.next() == Some("tmpfs")
    });
    if !prerequisite(is_tmpfs, SKIP_TMPFS, "/dev/shm is not a tmpfs mount") {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("shardline-tmpfs")
        .tempdir_in("/dev/shm");
    match dir {
        Ok(dir) => Some(dir),
        Err(e) => {
            prerequisite(false, SKIP_TMPFS, &format!("no temp dir in /dev/shm: {e}"));
            None
        }
    }
}

/// Sum over shards of the samples of metric `family` (the full name, such as
/// `shardline_bytes_sent_total`) whose labels contain `label` (such as `source="direct"`; empty
/// for all), from the admin listener's `/metrics`. A pre-summed `shard="all"` sample, where the
/// server prints one, is left out.
pub fn admin_metric(admin: SocketAddr, family: &str, label: &str) -> u64 {
    let mut s = TcpStream::connect(admin).expect("admin connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let r = read_response(&mut BufReader::new(s), false).expect("metrics response");
    assert_eq!(r.status, 200, "admin /metrics");
    let text = String::from_utf8(r.body).expect("utf-8 metrics");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(label) && !l.contains("shard=\"all\""))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let name = key.split('{').next()?;
            (name == family).then(|| value.parse::<f64>().ok())?
        })
        .map(|v| v as u64)
        .sum()
}

/// Waits until every one of `shards` shards has applied configuration reload number `epoch`
/// (each publishes `shardline_config_epoch` once it runs on the new settings).
pub fn wait_reload_applied(admin: SocketAddr, shards: u64, epoch: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_metric(admin, "shardline_config_epoch", "") < shards * epoch {
        assert!(
            Instant::now() < deadline,
            "reload {epoch} not applied by all {shards} shards"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Bytes the server sent that were read with O_DIRECT (`bytes_sent_total{source="direct"}`).
pub fn direct_bytes_sent(admin: SocketAddr) -> u64 {
    admin_metric(admin, "shardline_bytes_sent_total", "source=\"direct\"")
}

/// Asserts that O_DIRECT bytes were sent since `before` (an earlier `direct_bytes_sent`): a test
/// that serves a file above `direct_io_min_bytes` from a disk temp dir must exercise O_DIRECT,
/// or it tested the page-cache path instead. `SHARDLINE_SKIP_O_DIRECT=1` turns the failure into
/// a note, for a temp dir on a file system without O_DIRECT.
#[track_caller]
pub fn assert_direct_bytes_sent(admin: SocketAddr, before: u64, what: &str) {
    let sent = direct_bytes_sent(admin) - before;
    let missing = format!(
        "{what}: no bytes were sent from O_DIRECT reads (bytes_sent_total{{source=\"direct\"}} \
         did not grow): the test's root does not support O_DIRECT"
    );
    prerequisite(sent > 0, SKIP_O_DIRECT, &missing);
}

// ---- the admin listener's control token ---------------------------------------------------------

/// A control token for the admin listener (its `/cache/...` endpoints need one): written to
/// `admin.token` in a directory (mode 0600, as the server requires).
pub struct AdminToken {
    /// The token file.
    pub file: PathBuf,
    /// The token.
    pub token: String,
}

impl AdminToken {
    /// A fresh token in `dir/admin.token`.
    pub fn write_in(dir: &Path) -> AdminToken {
        use std::os::unix::fs::PermissionsExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let token = format!("test-{}-{nanos:x}", std::process::id());
        let file = dir.join("admin.token");
        std::fs::write(&file, format!("{token}\n")).expect("write the token file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod 600 the token file");
        AdminToken { file, token }
    }

    /// The config line that names the file.
    pub fn config_line(&self) -> String {
        format!("admin_token_file = \"{}\"\n", self.file.display())
    }

    /// The file's path, for `--token-file`.
    pub fn path(&self) -> &str {
        self.file.to_str().expect("a UTF-8 temp path")
    }

    /// A client of the admin listener at `admin` sending this token.
    pub fn client(&self, admin: SocketAddr) -> shardline::cache::tool::AdminClient {
        shardline::cache::tool::AdminClient::new(admin, Some(self.token.clone()))
    }
}

/// Runs `shardline cache disk ARGS` against the admin listener with `token`; its stdout (a
/// failing command fails the test).
pub fn disk_cli(admin: SocketAddr, token: &AdminToken, args: &[&str]) -> String {
    let admin = admin.to_string();
    let mut all = vec!["cache", "disk"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--admin", &admin, "--token-file", token.path()]);
    let out = run_shardline(&all, Duration::from_secs(20));
    assert_eq!(out.code, Some(0), "cache disk {args:?}: {}", out.stderr);
    out.stdout
}
