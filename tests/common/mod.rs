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
