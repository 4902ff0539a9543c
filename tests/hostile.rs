//! Hostile input, faults and limits against the real binary (issue 6).
//!
//! Every test builds a fixture in a disk temp dir: `canary.txt` *outside* the served root (its
//! bytes must never appear in any response), and inside the root a small file, a large file
//! with a known pattern (O_DIRECT sized), a sub directory and symlinks pointing in and out.
//!
//! The request matrix sends each hostile request on a fresh connection and then checks: the
//! status, the headers that matter, the body where it is known, that no canary byte came back,
//! that the connection was closed where its state is in doubt (or still works where it is
//! not), and that the server is alive and answers a health GET byte-exact. Failures are
//! collected per matrix and reported together, so one run shows every deviation.
//!
//! The slow/greedy-client and changing-file tests run servers with small timeouts from a
//! config file. All tests take one global lock: they are timing-sensitive and the CI box is
//! small, so they run one after another even under the default parallel test runner.

mod common;
use common::*;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Content of the file outside the root; no response may contain it.
const CANARY_MARK: &[u8] = b"SHARDLINE-CANARY-outside-the-root";
/// Size of `small.txt` (served buffered, head and body in one send).
const SMALL_LEN: usize = 1000;
/// Size of `big.bin` (over direct_io_min: served with O_DIRECT on a real disk).
const BIG_LEN: usize = 24 << 20;
/// How long a connection the server must close may take to show EOF.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- fixture ---------------------------------------------------------------------------------

struct Fixture {
    /// Holds canary, root and config files; removed on drop.
    dir: tempfile::TempDir,
    root: PathBuf,
    small: Vec<u8>,
    big: Vec<u8>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = disk_tempdir();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let canary = dir.path().join("canary.txt");
        std::fs::write(&canary, CANARY_MARK.repeat(64)).unwrap();
        let small = pattern(SMALL_LEN);
        let big = pattern(BIG_LEN);
        std::fs::write(root.join("small.txt"), &small).unwrap();
        std::fs::write(root.join("big.bin"), &big).unwrap();
        std::fs::write(root.join("empty.bin"), b"").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/inner.txt"), b"inner\n").unwrap();
        // Same name as the canary, but inside: what a directory symlink inside the root finds.
        std::fs::write(root.join("sub/canary.txt"), b"inside the root\n").unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        };
        link(Path::new("../canary.txt"), "link_out");
        link(&canary, "link_abs");
        link(Path::new("small.txt"), "link_in");
        link(Path::new(".."), "link_dir_out");
        link(Path::new("/"), "link_root_abs");
        link(Path::new("sub"), "link_dir_in");
        Fixture {
            dir,
            root,
            small,
            big,
        }
    }

    /// Writes a config file next to the root and returns its path.
    fn config(&self, name: &str, toml: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, toml).unwrap();
        p.display().to_string()
    }

    /// Starts a server on the root with `toml` as its config file.
    fn serve(&self, toml: &str) -> Server {
        let cfg = self.config("shardline.toml", toml);
        Server::start(&self.root, &["--config", &cfg])
    }

    /// Like `serve`, with the admin listener; returns its address too.
    fn serve_admin(&self, toml: &str) -> (Server, SocketAddr) {
        let cfg = self.config("shardline.toml", toml);
        start_with_admin(&self.root, &["--config", &cfg])
    }
}

/// Sum over every label (every shard included) of the samples of the metric family whose name
/// ends with `name`, from the admin listener's `/metrics`.
fn metric(admin: SocketAddr, name: &str) -> f64 {
    metric_where(admin, name, "")
}

/// Like `metric`, only samples whose text contains `label` (such as `reason="timeout"`).
fn metric_where(admin: SocketAddr, name: &str, label: &str) -> f64 {
    let mut s = TcpStream::connect(admin).expect("admin connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .unwrap();
    let r = read_response(&mut BufReader::new(s), false).expect("metrics");
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body)
        .lines()
        // One sample per shard (there is no pre-summed series): add them up.
        .filter(|l| !l.starts_with('#') && l.contains(label))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let family = key.split('{').next()?;
            family.ends_with(name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Completions that matched no live operation are a bug in the engine.
fn assert_no_stray_completions(admin: SocketAddr) {
    let stray = metric(admin, "stray_completions_total");
    assert_eq!(stray, 0.0, "{stray} stray completions");
}

// ---- small helpers ---------------------------------------------------------------------------

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// True when any part of the response carries canary bytes.
fn has_canary(resp: &Response, trailing: &[u8]) -> bool {
    contains(&resp.body, CANARY_MARK)
        || contains(trailing, CANARY_MARK)
        || resp.headers.iter().any(|(n, v)| {
            contains(n.as_bytes(), CANARY_MARK) || contains(v.as_bytes(), CANARY_MARK)
        })
}

/// Reads until EOF or reset (both mean "closed"), within `limit`. Returns the bytes that came
/// before the end, or None if the connection was still open at the limit.
fn wait_closed(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return Some(got)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// GET /small.txt on a fresh connection, byte-exact, and the process still runs.
fn health(server: &mut Server, fx: &Fixture) -> Result<(), String> {
    if !server.alive() {
        return Err(format!("server died; log:\n{}", server.log()));
    }
    let mut s = TcpStream::connect(server.addr).map_err(|e| format!("health connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /small.txt HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("health write: {e}"))?;
    let r =
        read_response(&mut BufReader::new(s), false).map_err(|e| format!("health read: {e}"))?;
    if r.status != 200 || r.body != fx.small {
        return Err(format!(
            "health GET gave {} with {} bytes",
            r.status,
            r.body.len()
        ));
    }
    Ok(())
}

/// Process statistics read from /proc.
fn proc_status_kb(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
}

/// User + system CPU time of a process.
fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = text.rsplit_once(')').unwrap().1;
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis((f[0] + f[1]) * 1000 / tck)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// TCP state (the `st` column of /proc/net/tcp) of the server's end of the connection between
/// `server` and `client`; None once the socket is gone.
fn server_side_state(server: SocketAddr, client: SocketAddr) -> Option<u8> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => panic!("IPv4 only"),
    };
    let (local, remote) = (hex(server), hex(client));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&local.as_str()) && f.get(2) == Some(&remote.as_str()))
            .then(|| u8::from_str_radix(f[3], 16).unwrap())
    })
}

const TCP_ESTABLISHED: u8 = 1;

/// A client socket with a small receive buffer, so a server cannot park a whole file in it.
fn small_window_client(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(32 * 1024).unwrap();
    s.connect(&addr.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Reads a response head (status line and fields) without its body.
fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let resp = read_response(r, true).expect("response head");
    (resp.status, resp.headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Index of the first byte where `got` differs from `want` (or None when `got` is a prefix).
fn first_mismatch(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or_else(|| (got.len() > want.len()).then_some(want.len()))
}

// ---- the request matrix ----------------------------------------------------------------------

/// What must happen to the connection after the row's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// The server must close it (EOF or reset) without sending anything more.
    Close,
    /// It must still work: a second request on it is answered byte-exact.
    KeepAlive,
}

/// What the body must be.
enum BodyCheck {
    Any,
    Exact(Vec<u8>),
    /// multipart/byteranges of `file` with these inclusive ranges, in this order.
    Parts(Vec<u8>, Vec<(usize, usize)>),
}

struct Row {
    name: String,
    req: Vec<u8>,
    status: u16,
    after: After,
    body: BodyCheck,
    headers: Vec<(&'static str, String)>,
}

impl Row {
    fn raw(name: &str, req: impl AsRef<[u8]>, status: u16, after: After) -> Row {
        Row {
            name: name.to_string(),
            req: req.as_ref().to_vec(),
            status,
            after,
            body: BodyCheck::Any,
            headers: Vec::new(),
        }
    }

    /// `GET target HTTP/1.1` with a Host and the extra fields.
    fn get(name: &str, target: &str, extra: &str, status: u16, after: After) -> Row {
        let req = format!("GET {target} HTTP/1.1\r\nHost: test\r\n{extra}\r\n");
        Row::raw(name, req, status, after)
    }

    fn body(mut self, b: &[u8]) -> Row {
        self.body = BodyCheck::Exact(b.to_vec());
        self
    }

    fn parts(mut self, file: &[u8], parts: &[(usize, usize)]) -> Row {
        self.body = BodyCheck::Parts(file.to_vec(), parts.to_vec());
        self
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Row {
        self.headers.push((name, value.into()));
        self
    }
}

/// Checks a multipart/byteranges body part by part; Err describes the first problem.
fn check_multipart(resp: &Response, file: &[u8], parts: &[(usize, usize)]) -> Result<(), String> {
    let ct = resp.header("content-type").unwrap_or("");
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .ok_or_else(|| format!("Content-Type {ct:?}"))?;
    let mut rest: &[u8] = &resp.body;
    for &(a, b) in parts {
        let open = format!("\r\n--{boundary}\r\n");
        rest = rest
            .strip_prefix(open.as_bytes())
            .ok_or("part does not start with a boundary")?;
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("part header not terminated")?;
        let head = String::from_utf8_lossy(&rest[..end]).to_string();
        let want = format!("Content-Range: bytes {a}-{b}/{}", file.len());
        if !head.lines().any(|l| l == want) {
            return Err(format!("part header {head:?} lacks {want:?}"));
        }
        rest = &rest[end + 4..];
        let n = b - a + 1;
        if rest.len() < n || rest[..n] != file[a..=b] {
            return Err(format!("part {a}-{b} has wrong bytes"));
        }
        rest = &rest[n..];
    }
    let close = format!("\r\n--{boundary}--\r\n");
    if rest != close.as_bytes() {
        return Err(format!(
            "after the parts: {:?}",
            String::from_utf8_lossy(rest)
        ));
    }
    Ok(())
}

/// Runs one row; Err describes every way it failed.
fn run_row(server: &mut Server, fx: &Fixture, row: &Row) -> Result<(), String> {
    let mut s = server.connect();
    // The server may refuse an oversized head and close before reading all of it.
    let _ = s.write_all(&row.req);
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let head_only = row.req.starts_with(b"HEAD ");
    let resp = read_response(&mut reader, head_only).map_err(|e| format!("no response: {e}"))?;
    let mut errors = Vec::new();
    let mut trailing = reader.buffer().to_vec();
    if resp.status != row.status {
        errors.push(format!("status {} (want {})", resp.status, row.status));
    }
    for (name, value) in &row.headers {
        match resp.header(name) {
            Some(v) if v == value => {}
            other => errors.push(format!("{name}: {other:?} (want {value:?})")),
        }
    }
    match &row.body {
        BodyCheck::Any => {}
        BodyCheck::Exact(b) if resp.body == *b => {}
        BodyCheck::Exact(b) => errors.push(format!(
            "body of {} bytes differs from the expected {} (first difference at {:?})",
            resp.body.len(),
            b.len(),
            first_mismatch(&resp.body, b)
        )),
        BodyCheck::Parts(file, parts) => {
            if let Err(e) = check_multipart(&resp, file, parts) {
                errors.push(format!("multipart: {e}"));
            }
        }
    }
    // The response must announce what the server does with the connection.
    let announced = resp.header("connection").map(str::to_ascii_lowercase);
    let want = match row.after {
        After::Close => "close",
        After::KeepAlive => "keep-alive",
    };
    if announced.as_deref() != Some(want) {
        errors.push(format!("Connection: {announced:?} (want {want:?})"));
    }
    match row.after {
        After::Close => match wait_closed(&mut s, CLOSE_WAIT) {
            Some(more) => {
                trailing.extend_from_slice(&more);
                if !trailing.is_empty() {
                    errors.push(format!(
                        "{} more bytes after the response: {:?}",
                        trailing.len(),
                        String::from_utf8_lossy(&trailing[..trailing.len().min(200)])
                    ));
                }
            }
            None => errors.push("connection left open".to_string()),
        },
        After::KeepAlive => {
            let next = b"GET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n";
            match s
                .write_all(next)
                .and_then(|_| read_response(&mut reader, false))
            {
                Ok(r) if r.status == 200 && r.body == fx.small => {}
                Ok(r) => errors.push(format!("next request on the connection: {}", r.status)),
                Err(e) => errors.push(format!("next request on the connection: {e}")),
            }
        }
    }
    if has_canary(&resp, &trailing) {
        errors.push("CANARY BYTES IN THE RESPONSE".to_string());
    }
    if let Err(e) = health(server, fx) {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Runs every row, then fails listing every row that failed.
fn run_matrix(server: &mut Server, fx: &Fixture, rows: &[Row]) {
    let mut failures = Vec::new();
    for row in rows {
        if let Err(e) = run_row(server, fx, row) {
            failures.push(format!("  {}: {e}", row.name));
        }
        if !server.alive() {
            failures.push("  (server died; remaining rows skipped)".to_string());
            break;
        }
    }
    eprintln!("{} rows run, {} failed", rows.len(), failures.len());
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}\nserver log:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n"),
        server.log()
    );
}

const MATRIX_CONFIG: &str = "max_ranges = 4\nheader_timeout_ms = 5000\n";

#[test]
fn traversal_and_symlinks_never_leave_the_root() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve(MATRIX_CONFIG);
    use After::*;
    let bad = |name: &str, target: &str| Row::get(name, target, "", 400, Close);
    let small = fx.small.clone();
    let rows = vec![
        bad("dotdot", "/../canary.txt"),
        bad("dotdot twice", "/../../canary.txt"),
        bad("dotdot after name", "/sub/../../canary.txt"),
        bad("pct dotdot", "/%2e%2e/canary.txt"),
        bad("pct dotdot upper", "/%2E%2E/canary.txt"),
        bad("dot pct", "/.%2e/canary.txt"),
        bad("pct dot", "/%2e./canary.txt"),
        bad("pct dotdot deep", "/sub/%2e%2e/%2e%2e/canary.txt"),
        bad("nested pct", "/%%32%65%%32%65/canary.txt"),
        bad("nested pct 2", "/%%32%65%%32%65%%32%66canary.txt"),
        bad("backslash", "/..\\canary.txt"),
        bad("backslash deep", "/sub\\..\\..\\canary.txt"),
        bad("pct backslash", "/..%5ccanary.txt"),
        bad("pct backslash upper", "/..%5Ccanary.txt"),
        bad("pct slash", "/..%2fcanary.txt"),
        bad("pct slash in name", "/sub%2f..%2f..%2fcanary.txt"),
        bad("overlong slash", "/..%c0%afcanary.txt"),
        bad("overlong slash lead", "/%c0%af../canary.txt"),
        bad("overlong dots", "/%c0%ae%c0%ae/canary.txt"),
        bad("overlong 3-byte slash", "/..%e0%80%afcanary.txt"),
        bad("pct nul", "/small.txt%00.png"),
        bad("pct nul end", "/small.txt%00"),
        bad("pct cr lf", "/small.txt%0d%0aX-Injected:%20yes"),
        bad("truncated escape", "/small.txt%2"),
        bad("bad hex escape", "/small.txt%zz"),
        bad("double slash dotdot", "//../canary.txt"),
        bad("absolute-form dotdot", "http://test/../canary.txt"),
        bad("absolute-form pct dotdot", "http://test/%2e%2e/canary.txt"),
        Row::raw(
            "raw nul in target",
            b"GET /small.txt\0.png HTTP/1.1\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::raw(
            "raw nul after dotdot",
            b"GET /..\0/canary.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::get(
            "double encoded",
            "/%252e%252e/canary.txt",
            "",
            404,
            KeepAlive,
        ),
        Row::get(
            "double encoded 2",
            "/%25%32%65%25%32%65/canary.txt",
            "",
            404,
            KeepAlive,
        ),
        Row::get("outside name", "/canary.txt", "", 404, KeepAlive),
        Row::get("normalised inside", "/sub/../small.txt", "", 200, KeepAlive).body(&small),
        Row::get("dot segment", "/./small.txt", "", 200, KeepAlive).body(&small),
        Row::get(
            "pct dot inside",
            "/sub/%2e%2e/small.txt",
            "",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::get(
            "dotdot in query",
            "/small.txt?../../canary.txt",
            "",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::get(
            "dotdot in fragment",
            "/small.txt#/../../canary.txt",
            "",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::get("file as directory", "/small.txt/", "", 404, KeepAlive),
        Row::get("root without index", "/", "", 404, KeepAlive),
        Row::get("symlink out relative", "/link_out", "", 403, KeepAlive),
        Row::get("symlink out absolute", "/link_abs", "", 403, KeepAlive),
        Row::get(
            "dir symlink out",
            "/link_dir_out/canary.txt",
            "",
            403,
            KeepAlive,
        ),
        Row::get(
            "dir symlink to /",
            "/link_root_abs/etc/passwd",
            "",
            403,
            KeepAlive,
        ),
        Row::get("symlink in", "/link_in", "", 200, KeepAlive).body(&small),
        Row::get(
            "dir symlink in",
            "/link_dir_in/canary.txt",
            "",
            200,
            KeepAlive,
        )
        .body(b"inside the root\n"),
    ];
    run_matrix(&mut server, &fx, &rows);
}

#[test]
fn smuggling_shapes_are_refused_and_closed() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve(MATRIX_CONFIG);
    use After::*;
    let h = "GET /small.txt HTTP/1.1\r\nHost: test\r\n";
    let bad = |name: &str, fields: &str, body: &str| {
        Row::raw(name, format!("{h}{fields}\r\n{body}"), 400, Close)
    };
    let rows = vec![
        bad(
            "CL+TE",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "0\r\n\r\n",
        ),
        bad(
            "TE+CL",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "0\r\n\r\n",
        ),
        bad("TE chunked", "Transfer-Encoding: chunked\r\n", "0\r\n\r\n"),
        bad("TE identity", "Transfer-Encoding: identity\r\n", ""),
        bad("TE obfuscated", "Transfer-Encoding : chunked\r\n", ""),
        bad("CL body", "Content-Length: 5\r\n", "hello"),
        bad("CL duplicate", "Content-Length: 0\r\nContent-Length: 0\r\n", ""),
        bad("CL conflicting", "Content-Length: 0\r\nContent-Length: 5\r\n", "hello"),
        bad("CL list", "Content-Length: 0, 0\r\n", ""),
        bad("CL plus", "Content-Length: +5\r\n", "hello"),
        bad("CL hex", "Content-Length: 0x10\r\n", ""),
        bad("CL negative", "Content-Length: -1\r\n", ""),
        bad("CL 20 digits", "Content-Length: 18446744073709551616\r\n", ""),
        bad("CL 20 nines", "Content-Length: 99999999999999999999\r\n", ""),
        bad("CL leading zeros", "Content-Length: 00\r\n", ""),
        bad("CL space before colon", "Content-Length : 0\r\n", ""),
        bad("obs-fold", "X-A: b\r\n c\r\n", ""),
        bad("obs-fold CL", "Content-Length:\r\n 5\r\n", "hello"),
        bad("bare CR in value", "X-A: b\rc\r\n", ""),
        bad("bare CR line end", "X-A: b\r", ""),
        bad("bare LF in fields", "X-A: b\n", ""),
        bad("NUL in value", "X-A: b\0c\r\n", ""),
        bad("NUL in name", "X-\0A: b\r\n", ""),
        bad("bad name byte", "X(A): b\r\n", ""),
        bad("duplicate Host", "Host: other\r\n", ""),
        bad("duplicate Range", "Range: bytes=0-1\r\nRange: bytes=5-9\r\n", ""),
        Row::raw(
            "bare LF request line",
            "GET /small.txt HTTP/1.1\nHost: test\n\n",
            400,
            Close,
        ),
        Row::raw(
            "missing Host on 1.1",
            "GET /small.txt HTTP/1.1\r\n\r\n",
            400,
            Close,
        ),
        // The classic: a body the front proxy counted, hiding a second request. The server
        // must refuse the first and never answer the hidden one.
        Row::raw(
            "smuggled request in body",
            format!(
                "{h}Content-Length: 44\r\n\r\nGET /link_abs HTTP/1.1\r\nHost: test\r\n\r\n"
            ),
            400,
            Close,
        ),
        Row::raw(
            "smuggled via TE",
            format!(
                "{h}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n"
            ),
            400,
            Close,
        ),
        Row::raw("CL zero is harmless", format!("{h}Content-Length: 0\r\n\r\n"), 200, KeepAlive)
            .body(&fx.small),
        Row::raw("HTTP/1.0 without Host", "GET /small.txt HTTP/1.0\r\n\r\n", 200, Close)
            .body(&fx.small),
    ];
    run_matrix(&mut server, &fx, &rows);
}

#[test]
fn oversized_heads_methods_and_versions() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve(MATRIX_CONFIG);
    use After::*;
    // A request line of exactly `n` bytes (without CRLF) for /small.txt with a query.
    let line_of = |n: usize| {
        let fixed = "GET /small.txt? HTTP/1.1".len();
        format!("GET /small.txt?{} HTTP/1.1", "q".repeat(n - fixed))
    };
    let fields = |n: usize| (0..n).map(|i| format!("X-F{i}: v\r\n")).collect::<String>();
    let big_fields = (0..20)
        .map(|i| format!("X-F{i}: {}\r\n", "v".repeat(900)))
        .collect::<String>();
    let small = fx.small.clone();
    let rows = vec![
        Row::raw(
            "request line at the limit",
            format!("{}\r\nHost: test\r\n\r\n", line_of(8192)),
            200,
            KeepAlive,
        )
        .body(&small),
        Row::raw(
            "request line over the limit",
            format!("{}\r\nHost: test\r\n\r\n", line_of(8193)),
            414,
            Close,
        ),
        Row::raw(
            "request line far over the limit",
            format!("{}\r\nHost: test\r\n\r\n", line_of(100_000)),
            414,
            Close,
        ),
        Row::get("path over PATH_MAX", &"/a".repeat(2100), "", 414, Close),
        Row::get(
            "segment over NAME_MAX",
            &format!("/{}", "a".repeat(256)),
            "",
            414,
            Close,
        ),
        Row::get(
            "one big field",
            "/small.txt",
            &format!("X-Big: {}\r\n", "b".repeat(17_000)),
            431,
            Close,
        ),
        Row::get("head over 16 KiB", "/small.txt", &big_fields, 431, Close),
        Row::get("64 fields", "/small.txt", &fields(63), 200, KeepAlive).body(&small),
        Row::get("65 fields", "/small.txt", &fields(64), 431, Close),
        Row::get("1000 fields", "/small.txt", &fields(1000), 431, Close),
        Row::raw(
            "4 leading empty lines",
            "\r\n\r\n\r\n\r\nGET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::raw(
            "5 leading empty lines",
            "\r\n\r\n\r\n\r\n\r\nGET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::raw(
            "POST",
            "POST /small.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n",
            405,
            Close,
        )
        .header("allow", "GET, HEAD"),
        Row::raw(
            "PUT",
            "PUT /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "DELETE",
            "DELETE /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "PATCH",
            "PATCH /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "OPTIONS *",
            "OPTIONS * HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "TRACE",
            "TRACE / HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "CONNECT",
            "CONNECT test:443 HTTP/1.1\r\nHost: test\r\n\r\n",
            405,
            Close,
        ),
        Row::raw(
            "unknown method",
            "BREW /pot HTTP/1.1\r\nHost: test\r\n\r\n",
            501,
            Close,
        ),
        Row::raw(
            "lowercase get",
            "get /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            501,
            Close,
        ),
        Row::raw(
            "long method",
            format!("{} / HTTP/1.1\r\nHost: test\r\n\r\n", "M".repeat(5000)),
            501,
            Close,
        ),
        Row::raw(
            "bad method byte",
            "G@T / HTTP/1.1\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::raw("HTTP/0.9", "GET /\r\n", 400, Close),
        Row::raw("HTTP/0.9 file", "GET /small.txt\r\n\r\n", 400, Close),
        Row::raw(
            "HTTP/2 preface",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            505,
            Close,
        ),
        Row::raw(
            "HTTP/2.0 line",
            "GET / HTTP/2.0\r\nHost: test\r\n\r\n",
            505,
            Close,
        ),
        // RFC 9110 §2.5: a higher 1.x minor version is processed as HTTP/1.1.
        Row::raw(
            "HTTP/1.2",
            "GET /small.txt HTTP/1.2\r\nHost: test\r\n\r\n",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::raw(
            "HTTP/3.0",
            "GET / HTTP/3.0\r\nHost: test\r\n\r\n",
            505,
            Close,
        ),
        Row::raw(
            "HTTP/0.9 version",
            "GET / HTTP/0.9\r\nHost: test\r\n\r\n",
            505,
            Close,
        ),
        Row::raw(
            "HTTP/1.10",
            "GET / HTTP/1.10\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::raw(
            "lowercase version",
            "GET / http/1.1\r\nHost: test\r\n\r\n",
            400,
            Close,
        ),
        Row::raw(
            "TLS client hello",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03zzzz\r\n\r\n",
            400,
            Close,
        ),
        Row::raw(
            "HTTP/1.0 keep-alive",
            "GET /small.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            200,
            KeepAlive,
        )
        .body(&small),
        Row::raw(
            "HEAD",
            "HEAD /small.txt HTTP/1.1\r\nHost: test\r\n\r\n",
            200,
            KeepAlive,
        )
        .header("content-length", "1000"),
    ];
    run_matrix(&mut server, &fx, &rows);
}

#[test]
fn hostile_ranges() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve(MATRIX_CONFIG);
    use After::*;
    let n = BIG_LEN;
    let big = fx.big.clone();
    let small = fx.small.clone();
    let r = |name: &str, path: &str, range: &str, status: u16| {
        Row::get(
            name,
            path,
            &format!("Range: {range}\r\n"),
            status,
            KeepAlive,
        )
    };
    let rows = vec![
        r(
            "overflow last",
            "/big.bin",
            "bytes=0-18446744073709551615",
            206,
        )
        .header("content-range", format!("bytes 0-{}/{n}", n - 1))
        .body(&big),
        r(
            "overflow last + 1",
            "/big.bin",
            "bytes=0-18446744073709551616",
            206,
        )
        .header("content-range", format!("bytes 0-{}/{n}", n - 1))
        .body(&big),
        r(
            "overflow first",
            "/big.bin",
            "bytes=18446744073709551615-",
            416,
        )
        .header("content-range", format!("bytes */{n}")),
        r(
            "overflow first + 1",
            "/big.bin",
            "bytes=18446744073709551616-",
            416,
        )
        .header("content-range", format!("bytes */{n}")),
        r(
            "overflow suffix",
            "/big.bin",
            "bytes=-18446744073709551616",
            206,
        )
        .header("content-range", format!("bytes 0-{}/{n}", n - 1))
        .body(&big),
        r(
            "huge digits",
            "/small.txt",
            "bytes=0-99999999999999999999999999999999",
            206,
        )
        .body(&small),
        r(
            "unaligned across chunks",
            "/big.bin",
            "bytes=524287-1572865",
            206,
        )
        .header("content-range", format!("bytes 524287-1572865/{n}"))
        .body(&big[524_287..=1_572_865]),
        r("last byte", "/big.bin", "bytes=-1", 206).body(&big[n - 1..]),
        // Parts in the order requested (RFC 9110 §15.3.7.2), not sorted by offset.
        r(
            "multi unsorted",
            "/big.bin",
            "bytes=5000000-5000001,0-9,1048570-1048580",
            206,
        )
        .parts(
            &big,
            &[(5_000_000, 5_000_001), (0, 9), (1_048_570, 1_048_580)],
        ),
        r(
            "multi at max_ranges",
            "/small.txt",
            "bytes=0-0,2-2,4-4,6-6",
            206,
        )
        .parts(&small, &[(0, 0), (2, 2), (4, 4), (6, 6)]),
        r(
            "multi over max_ranges",
            "/small.txt",
            "bytes=0-0,2-2,4-4,6-6,8-8",
            200,
        )
        .body(&small),
        r(
            "apache killer",
            "/small.txt",
            &format!(
                "bytes=0-,{}",
                (1..200)
                    .map(|i| format!("5-{i}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            200,
        )
        .body(&small),
        r("overlapping", "/big.bin", "bytes=0-99,50-149,140-299", 206)
            .header("content-range", format!("bytes 0-299/{n}"))
            .body(&big[..300]),
        r("adjacent", "/small.txt", "bytes=0-9,10-19", 206).body(&small[..20]),
        r(
            "overlap inside",
            "/small.txt",
            "bytes=100-199,120-130,0-9",
            206,
        )
        .parts(&small, &[(100, 199), (0, 9)]),
        r("sum over the file", "/small.txt", "bytes=0-,0-", 200).body(&small),
        r("reversed", "/small.txt", "bytes=9-1", 200).body(&small),
        r("garbage", "/small.txt", "bytes=a-b", 200).body(&small),
        r("other unit", "/small.txt", "items=0-1", 200).body(&small),
        r("empty set", "/small.txt", "bytes=", 200).body(&small),
        r("negative first", "/small.txt", "bytes=-5-10", 200).body(&small),
        r("past the end", "/small.txt", "bytes=1000-", 416).header("content-range", "bytes */1000"),
        r("zero suffix", "/small.txt", "bytes=-0", 416),
        r(
            "one satisfiable of many",
            "/small.txt",
            "bytes=5000-,0-1",
            206,
        )
        .body(&small[..2]),
        Row::get("empty file", "/empty.bin", "", 200, KeepAlive)
            .header("content-length", "0")
            .body(b""),
        r("range on empty file", "/empty.bin", "bytes=0-0", 416)
            .header("content-range", "bytes */0"),
        r("suffix on empty file", "/empty.bin", "bytes=-5", 416),
        Row::get(
            "If-Range mismatch",
            "/small.txt",
            "Range: bytes=0-1\r\nIf-Range: \"nope\"\r\n",
            200,
            KeepAlive,
        )
        .body(&small),
    ];
    run_matrix(&mut server, &fx, &rows);
}

// ---- symlink race ----------------------------------------------------------------------------

#[test]
fn symlink_race_never_serves_outside_bytes() {
    let _g = serial();
    let fx = Fixture::new();
    // Revalidate the open-file cache on (nearly) every request, so every flip is seen.
    let mut server = fx.serve("open_file_valid_ms = 1\n");
    let stop = Arc::new(AtomicBool::new(false));
    let root = fx.root.clone();
    let canary_abs = fx.dir.path().join("canary.txt");
    let flips = Arc::new(AtomicUsize::new(0));
    // Both names exist before any request: a 404 would be a lookup failure, not a late start.
    std::os::unix::fs::symlink("small.txt", root.join("race")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("race_dir")).unwrap();
    let flipper = {
        let (stop, flips) = (stop.clone(), flips.clone());
        std::thread::spawn(move || {
            let file_targets = [
                PathBuf::from("small.txt"),
                PathBuf::from("../canary.txt"),
                canary_abs,
            ];
            let dir_targets = [
                PathBuf::from("sub"),
                PathBuf::from(".."),
                PathBuf::from("/"),
            ];
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for (name, targets) in [("race", &file_targets), ("race_dir", &dir_targets)] {
                    let tmp = root.join(format!(".{name}.tmp"));
                    let _ = std::fs::remove_file(&tmp);
                    std::os::unix::fs::symlink(&targets[i % targets.len()], &tmp).unwrap();
                    std::fs::rename(&tmp, root.join(name)).unwrap();
                }
                i += 1;
                flips.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut counts = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    let mut s = server.connect();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut requests = 0;
    while Instant::now() < deadline {
        for (path, inside) in [
            ("/race", &fx.small[..]),
            ("/race_dir/canary.txt", &b"inside the root\n"[..]),
        ] {
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
                .unwrap();
            let r = read_response(&mut reader, false).expect("response");
            requests += 1;
            *counts.entry((path, r.status)).or_insert(0) += 1;
            if contains(&r.body, CANARY_MARK) {
                failures.push(format!("{path}: CANARY BYTES"));
            }
            match r.status {
                200 if r.body == inside => {}
                403 => {}
                st => failures.push(format!("{path}: {st} with {} bytes", r.body.len())),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    eprintln!(
        "{requests} requests, {} flips, outcomes {counts:?}",
        flips.load(Ordering::Relaxed)
    );
    assert!(failures.is_empty(), "{failures:?}");
    for path in ["/race", "/race_dir/canary.txt"] {
        assert!(
            counts.contains_key(&(path, 200)),
            "{path} never served: no race"
        );
        assert!(
            counts.contains_key(&(path, 403)),
            "{path} never refused: no race"
        );
    }
    health(&mut server, &fx).unwrap();
}

// ---- slow and greedy clients -----------------------------------------------------------------

/// Writes `bytes` one at a time every `every` until the server closes; returns when it did
/// (measured from `start`) or None if it never did within `limit`.
fn trickle_until_closed(
    s: &mut TcpStream,
    bytes: &[u8],
    every: Duration,
    start: Instant,
    limit: Duration,
) -> Option<Duration> {
    s.set_nonblocking(true).unwrap();
    let mut probe = [0u8; 512];
    for b in bytes.iter().cycle() {
        if start.elapsed() > limit {
            return None;
        }
        if s.write_all(std::slice::from_ref(b)).is_err() {
            return Some(start.elapsed());
        }
        std::thread::sleep(every);
        match s.read(&mut probe) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {} // an error response before the close is fine
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    unreachable!()
}

const SLOW_HEAD: &[u8] =
    b"GET /small.txt HTTP/1.1\r\nHost: test\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n";

#[test]
fn slowloris_is_closed_after_header_timeout() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("header_timeout_ms = 1000\n");
    // A head trickled byte by byte from the first moment.
    let start = Instant::now();
    let mut s = server.connect();
    let closed = trickle_until_closed(
        &mut s,
        SLOW_HEAD,
        Duration::from_millis(50),
        start,
        Duration::from_secs(10),
    );
    let closed = closed.expect("slowloris connection never closed");
    eprintln!("trickled head closed after {closed:?}");
    assert!(
        closed >= Duration::from_millis(900),
        "closed too early: {closed:?}"
    );
    assert!(
        closed <= Duration::from_millis(2500),
        "closed late: {closed:?}"
    );
    // A connection that says nothing at all.
    let start = Instant::now();
    let mut s = server.connect();
    let end = wait_closed(&mut s, Duration::from_secs(10)).expect("silent connection never closed");
    assert!(end.is_empty(), "silent connection got bytes");
    let closed = start.elapsed();
    eprintln!("silent connection closed after {closed:?}");
    assert!(
        closed <= Duration::from_millis(2500),
        "closed late: {closed:?}"
    );
    health(&mut server, &fx).unwrap();
}

/// The header timeout runs from the moment a request may start (the accept, for the first
/// request), not from its first byte: otherwise a client waits almost the whole timeout, sends
/// one byte, and holds the connection for nearly twice as long.
#[test]
fn header_timeout_is_not_restarted_by_the_first_byte() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("header_timeout_ms = 2000\n");
    let start = Instant::now();
    let mut s = server.connect();
    std::thread::sleep(Duration::from_millis(1500));
    let closed = trickle_until_closed(
        &mut s,
        SLOW_HEAD,
        Duration::from_millis(50),
        start,
        Duration::from_secs(10),
    )
    .expect("never closed");
    eprintln!("closed {closed:?} after the accept (header_timeout_ms = 2000)");
    assert!(
        closed <= Duration::from_millis(2000 + 700),
        "a head trickled from 1.5 s on held the connection for {closed:?}, \
         more than header_timeout_ms (2 s) after the accept"
    );
    health(&mut server, &fx).unwrap();
}

#[test]
fn idle_keepalive_is_closed_after_keepalive_timeout() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("keepalive_timeout_ms = 1000\n");
    let mut s = server.connect();
    s.write_all(b"GET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let r = read_response(&mut reader, false).unwrap();
    assert_eq!(r.status, 200);
    let idle_from = Instant::now();
    let rest = wait_closed(&mut s, Duration::from_secs(10)).expect("idle connection never closed");
    let idle = idle_from.elapsed();
    eprintln!("idle keep-alive closed after {idle:?}");
    assert!(rest.is_empty() && reader.buffer().is_empty());
    assert!(
        idle >= Duration::from_millis(900),
        "closed too early: {idle:?}"
    );
    assert!(idle <= Duration::from_millis(2500), "closed late: {idle:?}");
    health(&mut server, &fx).unwrap();
}

#[test]
fn slow_reader_is_dropped_after_send_timeout_and_others_are_served() {
    let _g = serial();
    let fx = Fixture::new();
    let (mut server, admin) = fx.serve_admin("send_timeout_ms = 1500\n");
    let mut s = small_window_client(server.addr);
    let client_addr = s.local_addr().unwrap();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    // Never read; meanwhile others must be served promptly.
    let mut closed_at = None;
    let mut slowest_other = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        health(&mut server, &fx).unwrap();
        slowest_other = slowest_other.max(t.elapsed());
        match server_side_state(server.addr, client_addr) {
            Some(TCP_ESTABLISHED) => {}
            _ => {
                closed_at = Some(start.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "slow reader closed by the server after {closed_at:?}; slowest other GET {slowest_other:?}"
    );
    let closed_at = closed_at.expect("the server never closed a reader that made no progress");
    assert!(
        closed_at >= Duration::from_millis(1300),
        "closed before send_timeout: {closed_at:?}"
    );
    assert!(
        closed_at <= Duration::from_millis(4000),
        "closed late: {closed_at:?}"
    );
    assert!(
        slowest_other < Duration::from_secs(1),
        "others starved: {slowest_other:?}"
    );
    // What did arrive is an exact prefix of the response and ends before the full length.
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let (status, headers) = read_head(&mut reader);
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "content-length"),
        Some(BIG_LEN.to_string().as_str())
    );
    let mut body = reader.buffer().to_vec();
    reader.consume(body.len());
    body.extend(wait_closed(&mut s, Duration::from_secs(10)).expect("EOF after the queued bytes"));
    assert!(body.len() < BIG_LEN, "the whole file arrived");
    assert_eq!(
        first_mismatch(&body, &fx.big),
        None,
        "wrong bytes before the cut"
    );
    let timeouts = metric_where(admin, "connections_closed_total", "reason=\"timeout\"");
    assert_eq!(timeouts, 1.0, "closes by timeout");
    assert_no_stray_completions(admin);
}

#[test]
fn connection_cap_refuses_quickly_and_recovers() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve(
        "max_connections_per_shard = 8\nkeepalive_timeout_ms = 30000\nheader_timeout_ms = 30000\n",
    );
    let req = b"GET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut holders: Vec<(TcpStream, BufReader<TcpStream>)> = (0..8)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(req).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            assert_eq!(read_response(&mut r, false).unwrap().status, 200);
            (s, r)
        })
        .collect();
    let mut refused = Vec::new();
    for i in 0..6 {
        let t = Instant::now();
        let mut s = server.connect();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let _ = s.write_all(req);
        let outcome = match read_response(&mut BufReader::new(s.try_clone().unwrap()), false) {
            Ok(r) => format!("{}", r.status),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                "no answer".to_string()
            }
            Err(_) => "closed".to_string(),
        };
        let took = t.elapsed();
        assert!(
            (outcome == "503" || outcome == "closed") && took < Duration::from_secs(2),
            "over-cap connection {i}: {outcome} after {took:?}"
        );
        refused.push(outcome);
    }
    eprintln!("over-cap outcomes: {refused:?}");
    // Held connections still work.
    for (s, r) in holders.iter_mut().take(2) {
        s.write_all(req).unwrap();
        assert_eq!(read_response(r, false).unwrap().status, 200);
    }
    // Free three places: new connections get in again.
    holders.truncate(5);
    let t = Instant::now();
    loop {
        let mut s = server.connect();
        let _ = s.write_all(req);
        match read_response(&mut BufReader::new(s), false) {
            Ok(r) if r.status == 200 => break,
            other if t.elapsed() > Duration::from_secs(3) => {
                panic!("no place freed after closing holders: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    for (s, r) in holders.iter_mut() {
        s.write_all(req).unwrap();
        assert_eq!(read_response(r, false).unwrap().status, 200);
    }
    health(&mut server, &fx).unwrap();
}

#[test]
fn pipelined_burst_of_10000_is_answered_in_order_with_bounded_memory() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("");
    let pid = server.child.id();
    health(&mut server, &fx).unwrap();
    let rss_before = proc_status_kb(pid, "VmRSS");
    const N: usize = 10_000;
    let mut s = server.connect();
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut burst = Vec::with_capacity(N * 80);
        for i in 0..N {
            let k = i % 990;
            let close = if i == N - 1 {
                "Connection: close\r\n"
            } else {
                ""
            };
            burst.extend_from_slice(
                format!(
                    "GET /small.txt HTTP/1.1\r\nHost: t\r\nRange: bytes={k}-{}\r\n{close}\r\n",
                    k + 9
                )
                .as_bytes(),
            );
        }
        writer.write_all(&burst).unwrap();
    });
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut peak_rss = 0;
    for i in 0..N {
        let r = read_response(&mut reader, false).unwrap_or_else(|e| panic!("response {i}: {e}"));
        let k = i % 990;
        assert_eq!(r.status, 206, "response {i}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {k}-{}/1000", k + 9).as_str()),
            "response {i} out of order"
        );
        assert_eq!(r.body, fx.small[k..k + 10], "response {i} body");
        if i % 1000 == 0 {
            peak_rss = peak_rss.max(proc_status_kb(pid, "VmRSS"));
        }
    }
    sender.join().unwrap();
    assert!(wait_closed(&mut s, CLOSE_WAIT).is_some_and(|b| b.is_empty()));
    let rss_after = proc_status_kb(pid, "VmRSS");
    let growth_kb = peak_rss.max(rss_after).saturating_sub(rss_before);
    eprintln!("RSS before {rss_before} kB, peak {peak_rss} kB, after {rss_after} kB");
    assert!(
        growth_kb < 16 * 1024,
        "RSS grew by {growth_kb} kB during the burst"
    );
    health(&mut server, &fx).unwrap();
}

#[test]
fn clients_vanishing_mid_response_leave_the_server_healthy() {
    let _g = serial();
    let fx = Fixture::new();
    let (mut server, admin) = fx.serve_admin("");
    let pid = server.child.id();
    health(&mut server, &fx).unwrap();
    let fds_before = fd_count(pid);
    let addr = server.addr;
    let workers: Vec<_> = (0..4)
        .map(|w| {
            std::thread::spawn(move || {
                for i in 0..15 {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    let range = if i % 3 == 0 {
                        "Range: bytes=100-20000000\r\n"
                    } else {
                        ""
                    };
                    let pipelined = if i % 4 == 0 { 2 } else { 1 };
                    for _ in 0..pipelined {
                        let _ = s.write_all(
                            format!("GET /big.bin HTTP/1.1\r\nHost: t\r\n{range}\r\n").as_bytes(),
                        );
                    }
                    // Read somewhere between nothing and a few MiB, then vanish.
                    let want = (w * 15 + i) * 200_000 % (5 << 20);
                    let mut got = 0;
                    let mut buf = vec![0u8; 64 * 1024];
                    while got < want {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got += n,
                        }
                    }
                    if i % 2 == 0 {
                        // Reset instead of FIN.
                        socket2::SockRef::from(&s)
                            .set_linger(Some(Duration::ZERO))
                            .unwrap();
                    }
                    drop(s);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    health(&mut server, &fx).unwrap();
    let r = get(&server, "/big.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == fx.big, "big file differs after the aborts");
    assert_direct_bytes_sent(admin, 0, "big.bin");
    let fds_after = fd_count(pid);
    eprintln!("server fds before {fds_before}, after {fds_after}");
    assert!(
        fds_after <= fds_before + 2,
        "fd count grew from {fds_before} to {fds_after}"
    );
    assert_no_stray_completions(admin);
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// Starts a server with room for 2 connections (plus the 64 overflow slots of the socket
/// table), holds both, and floods it with connects for `secs` from 4 threads that keep 100
/// connections each open for 100 ms (never reading). Returns the server, the holders, the
/// server's CPU time during the flood, its wall time and the number of connects made.
fn connect_flood(fx: &Fixture, secs: u64) -> Flood {
    let (server, admin) = fx.serve_admin(
        "max_connections_per_shard = 2\nkeepalive_timeout_ms = 30000\nheader_timeout_ms = 30000\n",
    );
    let pid = server.child.id();
    let holders: Vec<(TcpStream, BufReader<TcpStream>)> = (0..2)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(HOLD_REQ).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            assert_eq!(read_response(&mut r, false).unwrap().status, 200);
            (s, r)
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let connects = Arc::new(AtomicUsize::new(0));
    let addr = server.addr;
    let hammers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, connects) = (stop.clone(), connects.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut batch = Vec::new();
                    while batch.len() < 100 && !stop.load(Ordering::Relaxed) {
                        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                            Ok(s) => batch.push(s),
                            Err(_) => break, // backlog full: the server is not accepting
                        }
                    }
                    connects.fetch_add(batch.len(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                    drop(batch);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let cpu0 = cpu_time(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = cpu_time(pid) - cpu0;
    let wall = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in hammers {
        h.join().unwrap();
    }
    let n = connects.load(Ordering::Relaxed);
    Flood {
        admin,
        server,
        holders,
        cpu,
        wall,
        connects: n,
    }
}

/// What `connect_flood` leaves behind.
struct Flood {
    admin: SocketAddr,
    server: Server,
    holders: Vec<(TcpStream, BufReader<TcpStream>)>,
    cpu: Duration,
    wall: Duration,
    connects: usize,
}

const HOLD_REQ: &[u8] = b"GET /small.txt HTTP/1.1\r\nHost: test\r\n\r\n";

#[test]
fn accept_backs_off_without_busy_looping_when_the_socket_table_is_full() {
    let _g = serial();
    let fx = Fixture::new();
    let Flood {
        admin,
        mut server,
        mut holders,
        cpu,
        wall,
        connects,
    } = connect_flood(&fx, 2);
    let log = server.log();
    let backoffs = log.matches("accept failed").count();
    let first = log
        .lines()
        .find(|l| l.contains("accept failed"))
        .unwrap_or("");
    eprintln!(
        "{connects} connects; server CPU {cpu:?} over {wall:?}; {backoffs} accept back-offs \
         logged, the first: {first}"
    );
    assert!(
        backoffs > 0,
        "the flood never filled the socket table: test proves nothing"
    );
    assert!(
        cpu < wall / 2,
        "server used {cpu:?} of CPU in {wall:?}: busy loop?"
    );
    // Each failed accept waits either for the back-off timer (100 ms) or for a socket slot
    // to free (a refused connection's close): anything more would be a busy loop.
    let counted = metric(admin, "accept_errors_total");
    let refused = metric(admin, "connections_refused_total");
    let timer_bound = wall.as_millis() as f64 / 100.0 + 5.0;
    assert!(
        counted <= refused + timer_bound,
        "{counted} accept failures for {refused} freed slots in {wall:?}: not backing off"
    );
    assert!(
        backoffs <= 5,
        "{backoffs} accept-failure log lines in {wall:?}: the log is not rate-limited"
    );
    assert!(
        counted >= backoffs as f64,
        "accept errors: {counted} counted, {backoffs} logged"
    );
    // The connections it holds were served all along.
    for (s, r) in holders.iter_mut() {
        s.write_all(HOLD_REQ).unwrap();
        assert_eq!(read_response(r, false).unwrap().status, 200);
    }
    assert!(server.alive());
    assert_no_stray_completions(admin);
}

/// After a connect flood at the cap ends and places are free again, a new client must get
/// in promptly. The listen backlog is then full of connections the flood left behind; the
/// shard refuses each with a 503 and a close, which frees its socket slot within
/// microseconds, so draining ~4000 of them should take well under a second.
#[test]
fn a_connect_flood_at_the_cap_does_not_lock_out_clients_afterwards() {
    let _g = serial();
    let fx = Fixture::new();
    let Flood {
        admin,
        mut server,
        holders,
        connects,
        ..
    } = connect_flood(&fx, 2);
    drop(holders);
    let t = Instant::now();
    while health(&mut server, &fx).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no recovery after the flood"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = t.elapsed();
    assert_no_stray_completions(admin);
    let backoffs = server.log().matches("accept failed").count();
    eprintln!("{connects} connects; a new client got in {took:?} after the flood; {backoffs} accept back-offs");
    assert!(
        took < Duration::from_secs(3),
        "a new client waited {took:?} after the flood ended ({backoffs} accept back-offs of \
         100 ms: the backlog drains at 64 connections per back-off)"
    );
}

#[test]
fn file_open_failures_from_rlimit_nofile_are_answered_not_fatal() {
    let _g = serial();
    let fx = Fixture::new();
    for i in 0..8 {
        std::fs::write(fx.root.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let mut server = fx.serve("");
    let pid = server.child.id();
    health(&mut server, &fx).unwrap();
    // Allow exactly the descriptors open now: every new file open fails with EMFILE.
    let open_now = fd_count(pid) as u64;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a null new limit only writes the current one into `old`.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let set = |soft: u64| {
        let lim = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        // SAFETY: prlimit reads `lim` and writes nothing (the old-limit pointer is null).
        let rc =
            unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    };
    set(open_now);
    let mut statuses = Vec::new();
    for i in 0..8 {
        let r = get(&server, &format!("/f{i}.txt"), &[]);
        statuses.push(r.status);
        assert!(
            r.status == 200 && r.body == format!("file {i}\n").as_bytes()
                || matches!(r.status, 500 | 503),
            "f{i}: {} {:?}",
            r.status,
            r.body
        );
    }
    eprintln!("statuses under RLIMIT_NOFILE={open_now}: {statuses:?}");
    assert!(
        statuses.iter().any(|&s| s != 200),
        "no open failed: the limit had no effect"
    );
    assert!(server.alive());
    set(old.rlim_cur);
    for i in 0..8 {
        let r = get(&server, &format!("/f{i}.txt"), &[]);
        assert_eq!(
            (r.status, r.body),
            (200, format!("file {i}\n").into_bytes())
        );
    }
    health(&mut server, &fx).unwrap();
}

// ---- files changing underneath -----------------------------------------------------------------

/// Starts a slow download of `path` on a small-window connection and reads the head and the
/// first `prefix` body bytes. Returns the stream, the Content-Length and the bytes read.
fn start_slow_download(server: &Server, path: &str, prefix: usize) -> (TcpStream, usize, Vec<u8>) {
    let mut s = small_window_client(server.addr);
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let (status, headers) = read_head(&mut reader);
    assert_eq!(status, 200);
    let len: usize = header(&headers, "content-length").unwrap().parse().unwrap();
    let mut body = reader.buffer().to_vec();
    reader.consume(body.len());
    let mut buf = vec![0u8; 64 * 1024];
    while body.len() < prefix {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "EOF in the first {prefix} bytes");
        body.extend_from_slice(&buf[..n]);
    }
    (s, len, body)
}

fn truncation_case(truncate_to: u64) {
    let fx = Fixture::new();
    let original = pattern(32 << 20);
    let path = fx.root.join("trunc.bin");
    std::fs::write(&path, &original).unwrap();
    let mut server = fx.serve("send_timeout_ms = 30000\n");
    let (mut s, len, mut body) = start_slow_download(&server, "/trunc.bin", 1 << 20);
    assert_eq!(len, original.len());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(truncate_to)
        .unwrap();
    let rest = wait_closed(&mut s, Duration::from_secs(20)).expect("connection never closed");
    body.extend_from_slice(&rest);
    eprintln!(
        "truncated to {truncate_to}: received {} of {len} bytes",
        body.len()
    );
    assert_eq!(
        first_mismatch(&body, &original),
        None,
        "wrong bytes after truncation"
    );
    assert!(
        body.len() < len,
        "all {len} bytes arrived although the file was truncated"
    );
    health(&mut server, &fx).unwrap();
    // Once the open-file cache revalidates, the file is served as it is now.
    std::thread::sleep(Duration::from_millis(1200));
    let r = get(&server, "/trunc.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        r.body == original[..truncate_to as usize],
        "truncated file served wrong"
    );
}

#[test]
fn truncated_to_zero_mid_transfer_gives_a_prefix_then_close() {
    let _g = serial();
    truncation_case(0);
}

#[test]
fn truncated_to_unaligned_length_mid_transfer_gives_a_prefix_then_close() {
    let _g = serial();
    truncation_case((20 << 20) + 123);
}

#[test]
fn replaced_by_rename_mid_transfer_keeps_the_old_version_whole() {
    let _g = serial();
    let fx = Fixture::new();
    let old = pattern(32 << 20);
    let new: Vec<u8> = pattern(16 << 20).iter().map(|b| b ^ 0x5a).collect();
    let path = fx.root.join("swap.bin");
    std::fs::write(&path, &old).unwrap();
    let mut server = fx.serve("open_file_valid_ms = 100\nsend_timeout_ms = 30000\n");
    let (mut s, len, mut body) = start_slow_download(&server, "/swap.bin", 1 << 20);
    assert_eq!(len, old.len());
    let tmp = fx.root.join(".swap.bin.tmp");
    std::fs::write(&tmp, &new).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A request that starts now gets the new version whole, while the old one is in flight.
    let r = get(&server, "/swap.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        r.body == new,
        "request after the rename did not get the new version"
    );
    // The in-flight download finishes with the old version, whole.
    let mut buf = vec![0u8; 256 * 1024];
    while body.len() < len {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "EOF after {} of {len} bytes", body.len());
        body.extend_from_slice(&buf[..n]);
    }
    assert_eq!(body.len(), len);
    assert_eq!(
        first_mismatch(&body, &old),
        None,
        "in-flight download mixed versions"
    );
    let r2 = get(&server, "/swap.bin", &[]);
    assert!(r2.status == 200 && r2.body == new);
    health(&mut server, &fx).unwrap();
}

/// Overwritten in place (same inode, same size: `rsync --inplace`, `dd conv=notrunc`): the
/// design says never send a mix of two versions, so the response must either stay the old
/// version whole or stop at an exact prefix of it.
#[test]
fn overwritten_in_place_mid_transfer_never_mixes_versions() {
    let _g = serial();
    let fx = Fixture::new();
    let old = pattern(32 << 20);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0xff).collect();
    let path = fx.root.join("inplace.bin");
    std::fs::write(&path, &old).unwrap();
    let mut server = fx.serve("send_timeout_ms = 30000\n");
    let (mut s, len, mut body) = start_slow_download(&server, "/inplace.bin", 1 << 20);
    assert_eq!(len, old.len());
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(&new).unwrap();
        f.sync_all().unwrap();
    }
    // Read to the end of the body or to an abort, whichever comes first.
    let mut buf = vec![0u8; 256 * 1024];
    while body.len() < len {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    let bad = first_mismatch(&body, &old);
    eprintln!(
        "received {} of {len} bytes; first byte not from the old version: {bad:?}",
        body.len()
    );
    assert_eq!(
        bad,
        None,
        "the response switched to the new content at byte {bad:?} (of {} received)",
        body.len()
    );
    health(&mut server, &fx).unwrap();
}

// ---- more connection-level shapes --------------------------------------------------------------

#[test]
fn pipelined_valid_then_invalid_answers_in_order_then_closes() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("");
    let mut s = server.connect();
    let burst = b"GET /small.txt HTTP/1.1\r\nHost: t\r\n\r\n\
                  GET /sub/inner.txt HTTP/1.1\r\nHost: t\r\n\r\n\
                  GET /small.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc\
                  GET /link_abs HTTP/1.1\r\nHost: t\r\n\r\n";
    s.write_all(burst).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let a = read_response(&mut r, false).unwrap();
    assert_eq!((a.status, &a.body), (200, &fx.small));
    let b = read_response(&mut r, false).unwrap();
    assert_eq!((b.status, &b.body[..]), (200, &b"inner\n"[..]));
    let c = read_response(&mut r, false).unwrap();
    assert_eq!(c.status, 400);
    let mut rest = r.buffer().to_vec();
    rest.extend(wait_closed(&mut s, CLOSE_WAIT).expect("not closed after the 400"));
    assert!(
        rest.is_empty(),
        "answered past the bad request: {:?}",
        String::from_utf8_lossy(&rest)
    );
    health(&mut server, &fx).unwrap();
}

#[test]
fn pipelined_head_304_and_close_keep_framing() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("");
    let etag = get(&server, "/small.txt", &[])
        .header("etag")
        .expect("ETag")
        .to_string();
    let mut s = server.connect();
    let burst = format!(
        "HEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n\
         GET /small.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n\
         GET /small.txt HTTP/1.1\r\nHost: t\r\nRange: bytes=0-4\r\nConnection: close\r\n\r\n\
         GET /small.txt HTTP/1.1\r\nHost: t\r\n\r\n"
    );
    s.write_all(burst.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let a = read_response(&mut r, true).unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("content-length"),
        Some(BIG_LEN.to_string().as_str())
    );
    let b = read_response(&mut r, false).unwrap();
    assert_eq!((b.status, b.body.len()), (304, 0));
    let c = read_response(&mut r, false).unwrap();
    assert_eq!((c.status, &c.body[..]), (206, &fx.small[..5]));
    // `Connection: close` ends the exchange: the fourth request is never answered.
    let mut rest = r.buffer().to_vec();
    rest.extend(wait_closed(&mut s, CLOSE_WAIT).expect("not closed after Connection: close"));
    assert!(
        rest.is_empty(),
        "answered after Connection: close: {:?}",
        String::from_utf8_lossy(&rest)
    );
    health(&mut server, &fx).unwrap();
}

#[test]
fn half_closed_client_gets_the_whole_response() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("");
    let mut s = server.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r, false).unwrap();
    assert_eq!(resp.status, 200);
    assert!(resp.body == fx.big, "body differs");
    assert!(wait_closed(&mut s, CLOSE_WAIT).is_some_and(|b| b.is_empty()));
    health(&mut server, &fx).unwrap();
}

#[test]
fn head_split_into_one_byte_segments_is_served() {
    let _g = serial();
    let fx = Fixture::new();
    let mut server = fx.serve("");
    let mut s = server.connect();
    s.set_nodelay(true).unwrap();
    for b in b"GET /small.txt HTTP/1.1\r\nHost: t\r\nRange: bytes=10-19\r\n\r\n" {
        s.write_all(std::slice::from_ref(b)).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let resp = read_response(&mut BufReader::new(s), false).unwrap();
    assert_eq!((resp.status, &resp.body[..]), (206, &fx.small[10..20]));
    health(&mut server, &fx).unwrap();
}

#[test]
fn open_file_cache_exhaustion_is_a_503_and_recovers() {
    let _g = serial();
    let fx = Fixture::new();
    std::fs::write(fx.root.join("big2.bin"), &fx.big).unwrap();
    let mut server = fx.serve("open_file_cache_entries = 2\nsend_timeout_ms = 30000\n");
    // Two slow downloads hold both entries.
    let (s1, len1, b1) = start_slow_download(&server, "/big.bin", 64 * 1024);
    let (s2, len2, b2) = start_slow_download(&server, "/big2.bin", 64 * 1024);
    let r = get(&server, "/small.txt", &[]);
    eprintln!("third file while both entries are held: {}", r.status);
    assert!(
        r.status == 503 || (r.status == 200 && r.body == fx.small),
        "third file: {}",
        r.status
    );
    // The held downloads finish byte-exact; then the cache serves everything again.
    for (mut s, len, mut body, want) in [(s1, len1, b1, &fx.big), (s2, len2, b2, &fx.big)] {
        let mut buf = vec![0u8; 256 * 1024];
        while body.len() < len {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "EOF after {}", body.len());
            body.extend_from_slice(&buf[..n]);
        }
        assert!(body == *want, "held download differs");
    }
    health(&mut server, &fx).unwrap();
}

/// A client that reads a trickle keeps making "send progress", so the send timeout never
/// fires; while it does, its chunks hold registered arena slots. A handful of such clients
/// must not stop everyone else's large downloads.
#[test]
fn trickle_readers_do_not_starve_other_large_downloads() {
    let _g = serial();
    let fx = Fixture::new();
    // 16 slots of 512 KiB, 4 of them reserved for small responses; 4 chunks per connection.
    // The default send timeout (60 s): the trickle keeps up "progress" well inside it.
    let mut server = fx.serve("arena_bytes = 8388608\npipeline_depth = 4\n");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let mut s = small_window_client(server.addr);
            s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                // 160 KB/s: the big file would take minutes.
                let mut buf = [0u8; 16 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Unhindered, this download takes well under a second even in a debug build.
    let t = Instant::now();
    let limit = Duration::from_secs(10);
    let mut s = server.connect();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = Vec::with_capacity(BIG_LEN + 1024);
    let mut buf = vec![0u8; 256 * 1024];
    let mut eof = false;
    while body.len() < BIG_LEN + 200 && t.elapsed() < limit {
        s.set_read_timeout(Some(
            limit
                .saturating_sub(t.elapsed())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let head_end = body
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |p| p + 4);
    let got = body.len() - head_end;
    eprintln!("a normal {BIG_LEN}-byte download beside 3 trickle readers: {got} body bytes in {took:?} (eof {eof})");
    assert!(
        got >= BIG_LEN,
        "normal download got {got} of {BIG_LEN} bytes in {took:?} beside 3 trickle readers \
         (eof {eof}); log:\n{}",
        server.log()
    );
    assert_eq!(first_mismatch(&body[head_end..], &fx.big), None);
    health(&mut server, &fx).unwrap();
}

/// With very few provided receive buffers, many clients sending at once make receives fail
/// with ENOBUFS; every request must still be answered, in order, byte-exact.
#[test]
fn receive_buffer_exhaustion_is_retried_not_fatal() {
    let _g = serial();
    let fx = Fixture::new();
    let (mut server, admin) = fx.serve_admin("recv_buffers = 16\n");
    let addr = server.addr;
    let small = fx.small.clone();
    const CLIENTS: usize = 64;
    // Every burst leaves all clients at once, so far more receives complete together than
    // there are buffers (with DEFER_TASKRUN they complete when the shard next enters the
    // kernel), whatever the machine's speed. Each request carries 1.5 KiB of padding: where
    // the kernel fills a buffer from several receives (incremental consumption), a burst is
    // still ~290 KiB, over the 64 KiB of 16 buffers.
    let together = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let small = small.clone();
            let together = together.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                for i in 0..30 {
                    together.wait();
                    // Bursts of 3 pipelined requests, so receives land in batches.
                    let mut burst = String::new();
                    for j in 0..3 {
                        let k = (c * 31 + i * 3 + j) % 990;
                        burst.push_str(&format!(
                            "GET /small.txt HTTP/1.1\r\nHost: t\r\nRange: bytes={k}-{}\r\n\
                             X-Pad: {}\r\n\r\n",
                            k + 9,
                            "p".repeat(1536)
                        ));
                    }
                    w.write_all(burst.as_bytes()).map_err(|e| e.to_string())?;
                    for j in 0..3 {
                        let k = (c * 31 + i * 3 + j) % 990;
                        let resp = read_response(&mut r, false)
                            .map_err(|e| format!("client {c} request {i}/{j}: {e}"))?;
                        if resp.status != 206 || resp.body != small[k..k + 10] {
                            return Err(format!("client {c} request {i}/{j}: {}", resp.status));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let failures: Vec<String> = clients
        .into_iter()
        .filter_map(|h| h.join().unwrap().err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} clients failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let enobufs = metric(admin, "recv_no_buffers_total");
    eprintln!("receives that found no provided buffer: {enobufs}");
    assert!(
        enobufs > 0.0,
        "no receive ran out of buffers: the test proves nothing"
    );
    assert_no_stray_completions(admin);
    health(&mut server, &fx).unwrap();
}

/// A flood of requests for a missing file costs one open per `open_file_valid_ms`, not one per
/// request (negative entries, as nginx's `open_file_cache_errors`); a file created under the
/// path is served once its entry is that old.
#[test]
fn missing_files_are_answered_from_negative_entries_then_found() {
    let _g = serial();
    let fx = Fixture::new();
    // One shard (the harness's default), so every request meets the same cache; a long
    // interval, so the repeats fall inside it however loaded the machine is.
    let (mut server, admin) = fx.serve_admin("open_file_valid_ms = 3000\n");
    for _ in 0..20 {
        assert_eq!(get(&server, "/later.bin", &[]).status, 404);
    }
    // Metrics are published by the shard's loop: wait for them to show the 20 requests.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (negative, misses) = loop {
        let negative = metric(admin, "file_cache_negative_hits_total");
        let misses = metric(admin, "file_cache_misses_total");
        if negative + misses >= 20.0 || Instant::now() > deadline {
            break (negative, misses);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("20 requests for a missing file: {misses} opens, {negative} negative hits");
    assert!(
        negative + misses >= 20.0,
        "metrics never showed the requests"
    );
    // The test cannot pin how many 3 s intervals the 20 requests spanned on a loaded host, but
    // each interval costs one open.
    assert!(negative >= 10.0, "{negative} negative hits, {misses} opens");
    std::fs::write(fx.root.join("later.bin"), b"here now").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(&server, "/later.bin", &[]);
        if r.status == 200 {
            assert_eq!(r.body, b"here now");
            break;
        }
        assert_eq!(r.status, 404);
        assert!(
            Instant::now() < deadline,
            "the created file was never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    health(&mut server, &fx).unwrap();
}

// ---- heads trickled a byte at a time (issue 46) ----------------------------------------------

/// The head both trickle tests send: a request line and fields of a few hundred bytes.
fn trickled_head() -> Vec<u8> {
    format!(
        "GET /small.txt HTTP/1.1\r\nHost: test\r\nUser-Agent: trickle\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(60)
    )
    .into_bytes()
}

/// One response's bytes (head and Content-Length body) with its Date line left out: the
/// answers to one request sent two ways are then byte-identical.
fn read_answer(r: &mut impl BufRead) -> Vec<u8> {
    let mut out = Vec::new();
    let mut body_len = 0;
    loop {
        let mut line = Vec::new();
        r.read_until(b'\n', &mut line).expect("response head");
        assert!(line.ends_with(b"\n"), "response head cut short");
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        if let Some(v) = text.strip_prefix("content-length:") {
            body_len = v.trim().parse().expect("content-length");
        }
        let end = line == b"\r\n";
        if !text.starts_with("date:") {
            out.extend_from_slice(&line);
        }
        if end {
            break;
        }
    }
    let at = out.len();
    out.resize(at + body_len, 0);
    r.read_exact(&mut out[at..]).expect("response body");
    out
}

/// Receives of request bytes the shards have seen: each one either waited after the head
/// scan or was parsed.
fn request_receives(admin: SocketAddr) -> f64 {
    metric(admin, "shardline_head_scan_waits_total") + metric(admin, "shardline_head_parses_total")
}

/// Waits until `request_receives` reaches `at_least` (the shards publish counters as they go).
fn wait_request_receives(admin: SocketAddr, at_least: f64) {
    let deadline = Instant::now() + IO_TIMEOUT;
    while request_receives(admin) < at_least {
        assert!(
            Instant::now() < deadline,
            "the server never received the bytes sent ({} of {at_least} receives)",
            request_receives(admin)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A head trickled a byte at a time through many connections at once (issue 46): each byte is
/// one receive and one step of the head scan, parsed only where the request line and the head
/// end; no receive buffer is provided again per byte (the kernel fills one buffer from many
/// receives: fewer buffers than connections never run out); every answer is byte-identical to
/// the one the head sent whole gets.
#[test]
fn heads_trickled_a_byte_at_a_time_are_scanned_per_byte_and_answered_alike() {
    let _g = serial();
    let fx = Fixture::new();
    let (mut server, admin) = fx.serve_admin("recv_buffers = 16\n");
    const CONNS: usize = 40;
    let head = trickled_head();
    let want = {
        let mut s = server.connect();
        s.write_all(&head).unwrap();
        read_answer(&mut BufReader::new(s))
    };
    assert!(
        want.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&want)
    );
    let scans0 = metric(admin, "shardline_head_scan_waits_total");
    let parses0 = metric(admin, "shardline_head_parses_total");
    let provided0 = metric(admin, "shardline_recv_buffers_provided_total");
    let no_buffers0 = metric(admin, "recv_no_buffers_total");
    let start = request_receives(admin);
    let mut conns: Vec<TcpStream> = (0..CONNS)
        .map(|_| {
            let s = server.connect();
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    for (i, &b) in head.iter().enumerate() {
        for s in &mut conns {
            s.write_all(&[b]).unwrap();
        }
        // A round is received before the next is sent: one byte per receive.
        wait_request_receives(admin, start + ((i + 1) * CONNS) as f64);
    }
    for (k, s) in conns.into_iter().enumerate() {
        let got = read_answer(&mut BufReader::new(s));
        assert!(
            got == want,
            "connection {k}: {}",
            String::from_utf8_lossy(&got)
        );
    }
    let scans = metric(admin, "shardline_head_scan_waits_total") - scans0;
    let parses = metric(admin, "shardline_head_parses_total") - parses0;
    let provided = metric(admin, "shardline_recv_buffers_provided_total") - provided0;
    let no_buffers = metric(admin, "recv_no_buffers_total") - no_buffers0;
    let received = (head.len() * CONNS) as f64;
    eprintln!(
        "{received} bytes in 1-byte receives: {scans} scanned, {parses} parsed, \
         {provided} receive buffers provided again, {no_buffers} receives without a buffer"
    );
    assert_eq!(
        parses,
        (2 * CONNS) as f64,
        "parsed at the request line's and the head's end"
    );
    assert_eq!(
        scans,
        ((head.len() - 2) * CONNS) as f64,
        "every other byte only scanned"
    );
    assert_eq!(
        no_buffers, 0.0,
        "16 receive buffers ran out under 40 trickling heads"
    );
    // One buffer per 4 KiB received (per shard), not one per receive; kernels before 6.12
    // consume provided buffers whole and fail here.
    let bound = (received / 4096.0).floor() + 2.0;
    assert!(
        provided <= bound,
        "{provided} receive buffers provided again for {received} one-byte receives (at most \
         {bound}): does the kernel consume buffers incrementally (IOU_PBUF_RING_INC, 6.12+)?"
    );
    assert_no_stray_completions(admin);
    health(&mut server, &fx).unwrap();
}

/// A head cut in two at every position, the first piece received alone, gets the same bytes
/// as the head sent whole: the scan on arrival and the parse on the connection's turn agree
/// wherever the head is cut (at the request line's end too).
#[test]
fn a_head_cut_at_every_position_is_answered_alike() {
    let _g = serial();
    let fx = Fixture::new();
    let (mut server, admin) = fx.serve_admin("");
    let head = trickled_head();
    let want = {
        let mut s = server.connect();
        s.write_all(&head).unwrap();
        read_answer(&mut BufReader::new(s))
    };
    for cut in 1..head.len() {
        let mut s = server.connect();
        s.set_nodelay(true).unwrap();
        let before = request_receives(admin);
        s.write_all(&head[..cut]).unwrap();
        wait_request_receives(admin, before + 1.0);
        s.write_all(&head[cut..]).unwrap();
        let got = read_answer(&mut BufReader::new(s));
        assert!(
            got == want,
            "cut at {cut}: {}",
            String::from_utf8_lossy(&got)
        );
    }
    assert_no_stray_completions(admin);
    health(&mut server, &fx).unwrap();
}
