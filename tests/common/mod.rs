//! Shared helpers for integration tests: start the real `shardline` binary on an ephemeral
//! loopback port over a temporary root, talk raw HTTP/1.1 to it, stop it with SIGTERM.
#![allow(dead_code)]

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

    fn start_inner(root: &Path, extra: &[&str], dir: Option<tempfile::TempDir>) -> Server {
        let stderr_path = std::env::temp_dir().join(format!(
            "shardline-test-{}-{}.log",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardline"));
        cmd.arg("serve")
            .arg("--root")
            .arg(root)
            .args(["--listen", "127.0.0.1:0", "--shards", "1", "--admin", ""])
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
                if let Some(rest) = line.split("http://").nth(1) {
                    let addr = rest.split('/').next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(a) => a.parse().expect("listening address"),
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!("shardline did not start:\n{log}");
            }
        };
        Server {
            child,
            addr,
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

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
    let stderr_path = std::env::temp_dir().join(format!(
        "shardline-test-{}-admin-{}.log",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .arg("serve")
        .arg("--root")
        .arg(root)
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .args(["--admin", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn shardline");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            let admin = line.starts_with("shardline: admin at ");
            if let Some(rest) = line.split("http://").nth(1) {
                let addr = rest.split('/').next().unwrap_or("").to_string();
                let _ = tx.send((admin, addr));
            }
        }
    });
    let mut addr = None;
    let mut admin = None;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while addr.is_none() || admin.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, a)) => admin = Some(a.parse().expect("admin address")),
            Ok((false, a)) => addr = Some(a.parse().expect("listening address")),
            Err(_) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!("shardline did not start with an admin listener:\n{log}");
            }
        }
    }
    let server = Server {
        child,
        addr: addr.unwrap(),
        root: root.to_path_buf(),
        stderr_path,
        _dir: None,
    };
    (server, admin.unwrap())
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
