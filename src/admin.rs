//! The admin listener: `/metrics` (Prometheus text) and `/healthz` on a separate address.
//!
//! One plain std thread, blocking accept, one request per connection, `Connection: close`.
//! It never touches a shard: it only loads the shards' atomics and reads `/proc`, so a busy or
//! slow scraper costs the data path nothing. Limits keep one bad client from wedging it: the
//! request head must arrive within `HEAD_TIMEOUT` and fit in `HEAD_MAX_BYTES`, and the response
//! write gives up after `WRITE_TIMEOUT`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::metrics::{render_prometheus, write_family_header, ShardMetrics};

/// Largest request head accepted (request line + headers); more is answered 431.
pub const HEAD_MAX_BYTES: usize = 8 * 1024;
/// Time a client has to send its complete request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time the response may take to be written before the connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest time spent discarding unread input after an error reply.
const LINGER_TIME: Duration = Duration::from_millis(200);
/// Most unread input discarded after an error reply.
const LINGER_MAX_BYTES: usize = 64 * 1024;
/// Pause after a failed accept (EMFILE and friends) so the thread does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// `/proc/vmstat` counters exposed as `shardline_host_vmstat_total{name="..."}`: reclaim
/// scanning and stealing by kswapd and by allocating tasks, and file pages refaulted right after
/// being evicted (the page cache is too small for the working set).
pub const VMSTAT_COUNTERS: &[&str] = &[
    "pgscan_direct",
    "pgscan_kswapd",
    "pgsteal_direct",
    "pgsteal_kswapd",
    "workingset_refault_file",
];

/// `/proc/meminfo` fields exposed as gauges in bytes: (field, family, help).
const MEMINFO_GAUGES: &[(&str, &str, &str)] = &[
    (
        "Cached",
        "shardline_host_page_cache_bytes",
        "Page cache size (/proc/meminfo Cached).",
    ),
    (
        "Dirty",
        "shardline_host_dirty_bytes",
        "Dirty page-cache memory waiting for writeback (/proc/meminfo Dirty).",
    ),
    (
        "Writeback",
        "shardline_host_writeback_bytes",
        "Page-cache memory being written back now (/proc/meminfo Writeback).",
    ),
];

/// What the admin thread serves from.
struct State {
    metrics: Vec<Arc<ShardMetrics>>,
    shutdown: Arc<AtomicBool>,
    proc_root: PathBuf,
}

/// A running admin listener; stopping (or dropping) it closes the socket and joins the thread.
pub struct AdminHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// A second descriptor of the listening socket, used to wake the blocked accept.
    waker: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl AdminHandle {
    /// The bound address (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the thread (at most one in-flight request, bounded by
    /// `HEAD_TIMEOUT + WRITE_TIMEOUT`).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::Release);
        // shutdown(SHUT_RD) on a listening socket makes a blocked accept() return EINVAL.
        let _ = rustix::net::shutdown(&self.waker, rustix::net::Shutdown::Read);
        let _ = thread.join();
    }
}

impl Drop for AdminHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` on a thread named `admin`.
///
/// `None` means the admin listener is off. `proc_root` is where `vmstat` and `meminfo` are read
/// (`/proc` in production, a fixture tree in tests). `/healthz` answers 503 once `shutdown` is
/// set. A bind failure is returned to the caller (it is a configuration problem).
pub fn start(
    addr: Option<SocketAddr>,
    metrics: Vec<Arc<ShardMetrics>>,
    shutdown: Arc<AtomicBool>,
    proc_root: PathBuf,
) -> std::io::Result<Option<AdminHandle>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let waker = listener.try_clone()?;
    let stop = Arc::new(AtomicBool::new(false));
    let state = State {
        metrics,
        shutdown,
        proc_root,
    };
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || accept_loop(listener, state, thread_stop))?;
    Ok(Some(AdminHandle {
        addr: local,
        stop,
        waker,
        thread: Some(thread),
    }))
}

fn accept_loop(listener: TcpListener, state: State, stop: Arc<AtomicBool>) {
    let mut logged_error = false;
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            break;
        }
        match accepted {
            Ok((stream, _)) => {
                logged_error = false;
                handle(stream, &state);
            }
            Err(e) => {
                if !logged_error {
                    tracing::warn!(error = %e, "admin listener: accept failed; backing off");
                    logged_error = true;
                }
                std::thread::sleep(ACCEPT_ERROR_BACKOFF);
            }
        }
    }
}

/// Why no request head could be read.
#[derive(Debug)]
enum HeadError {
    /// More than `HEAD_MAX_BYTES` without the blank line.
    TooLarge,
    /// Timeout, reset, or the client closed before the head was complete: nothing to answer.
    Gone,
}

/// Reads up to the end of the request head, within `HEAD_TIMEOUT` overall.
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut buf = vec![0u8; HEAD_MAX_BYTES];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Gone);
        }
        let n = match stream.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return Err(HeadError::Gone),
            Ok(n) => n,
        };
        // Only the newly read bytes (and 3 before them) can complete the terminator.
        let from = len.saturating_sub(3);
        len += n;
        if let Some(end) = find_head_end(&buf[from..len]) {
            buf.truncate(from + end);
            return Ok(buf);
        }
        if len == buf.len() {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Index just past the blank line ending a head (`\r\n\r\n`, or bare `\n\n`).
fn find_head_end(b: &[u8]) -> Option<usize> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if b[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// A response of the admin listener.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    status: u16,
    content_type: &'static str,
    extra_headers: &'static str,
    body: String,
}

impl Reply {
    fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_headers: "",
            body: body.to_string(),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\n{}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len(),
            self.extra_headers
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// Answers one request head (without the body: GET has none, others are refused).
fn respond(head: &[u8], state: &State) -> Reply {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = String::from_utf8_lossy(&head[..line_end]);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Reply::text(400, "bad request line\n");
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') || method.is_empty() {
        return Reply::text(400, "bad request line\n");
    }
    if method != "GET" {
        return Reply {
            extra_headers: "Allow: GET\r\n",
            ..Reply::text(405, "only GET is served here\n")
        };
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    match path {
        "/metrics" => Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            extra_headers: "",
            body: render_metrics(&state.metrics, &state.proc_root),
        },
        "/healthz" if state.shutdown.load(Ordering::Relaxed) => Reply::text(503, "draining\n"),
        "/healthz" => Reply::text(200, "ok\n"),
        _ => Reply::text(404, "not found (try /metrics or /healthz)\n"),
    }
}

fn handle(mut stream: TcpStream, state: &State) {
    let reply = match read_head(&mut stream) {
        Ok(head) => respond(&head, state),
        Err(HeadError::TooLarge) => Reply::text(431, "request head too large\n"),
        Err(HeadError::Gone) => return,
    };
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    if stream.write_all(&reply.to_bytes()).is_err() {
        return;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    if matches!(reply.status, 400 | 405 | 431) {
        // The client may still be sending (a body, an oversized head). Closing with unread
        // input sends a reset that can destroy the reply before the client reads it, so read
        // and discard a little first (bounded in bytes and time).
        linger(&mut stream);
    }
}

/// Reads and discards input for at most `LINGER_TIME` or `LINGER_MAX_BYTES`.
fn linger(stream: &mut TcpStream) {
    let deadline = Instant::now() + LINGER_TIME;
    let mut sink = [0u8; 4096];
    let mut total = 0;
    while total < LINGER_MAX_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

/// The whole `/metrics` body: every shard's counters and histogram, then the host's reclaim
/// counters and page-cache size read under `proc_root`.
pub fn render_metrics(metrics: &[Arc<ShardMetrics>], proc_root: &Path) -> String {
    let mut out = render_prometheus(metrics);
    render_host(&mut out, proc_root);
    out
}

/// Appends host gauges from `proc_root/vmstat` and `proc_root/meminfo`. A missing or
/// unreadable file leaves its families out (the shard metrics still render).
fn render_host(out: &mut String, proc_root: &Path) {
    if let Ok(text) = std::fs::read_to_string(proc_root.join("vmstat")) {
        let vmstat = parse_vmstat(&text);
        let picked: Vec<_> = VMSTAT_COUNTERS
            .iter()
            .filter_map(|&name| vmstat.iter().find(|(n, _)| *n == name))
            .collect();
        if !picked.is_empty() {
            write_family_header(
                out,
                "shardline_host_vmstat_total",
                "counter",
                "Host page reclaim counters from /proc/vmstat (pages).",
            );
            for (name, v) in picked {
                let _ = writeln!(out, "shardline_host_vmstat_total{{name=\"{name}\"}} {v}");
            }
        }
        let stalls: Vec<u64> = vmstat
            .iter()
            .filter(|(n, _)| n.starts_with("allocstall"))
            .map(|(_, v)| *v)
            .collect();
        if !stalls.is_empty() {
            let total = stalls.iter().fold(0u64, |a, v| a.wrapping_add(*v));
            write_family_header(
                out,
                "shardline_host_allocstall_total",
                "counter",
                "Allocations that stalled in direct reclaim (sum of /proc/vmstat allocstall*).",
            );
            let _ = writeln!(out, "shardline_host_allocstall_total {total}");
        }
    }
    if let Ok(text) = std::fs::read_to_string(proc_root.join("meminfo")) {
        let meminfo = parse_meminfo(&text);
        for (field, family, help) in MEMINFO_GAUGES {
            if let Some((_, bytes)) = meminfo.iter().find(|(n, _)| n == field) {
                write_family_header(out, family, "gauge", help);
                let _ = writeln!(out, "{family} {bytes}");
            }
        }
    }
}

/// `name value` lines of `/proc/vmstat`; malformed lines are skipped.
fn parse_vmstat(text: &str) -> Vec<(&str, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_ascii_whitespace();
            let (name, v) = (it.next()?, it.next()?.parse().ok()?);
            Some((name, v))
        })
        .collect()
}

/// `Name:   value kB` lines of `/proc/meminfo`, in bytes; malformed lines are skipped.
fn parse_meminfo(text: &str) -> Vec<(&str, u64)> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let mut it = rest.split_ascii_whitespace();
            let v: u64 = it.next()?.parse().ok()?;
            let bytes = match it.next() {
                Some("kB") => v.checked_mul(1024)?,
                None => v,
                Some(_) => return None,
            };
            Some((name.trim(), bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{parse_exposition, Sample};
    use std::io::BufRead;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admin/proc")
    }

    fn state(shutdown: bool, proc_root: PathBuf) -> State {
        State {
            metrics: vec![Arc::new(ShardMetrics::default())],
            shutdown: Arc::new(AtomicBool::new(shutdown)),
            proc_root,
        }
    }

    fn find<'a>(s: &'a [Sample], name: &str, label: Option<(&str, &str)>) -> Option<&'a Sample> {
        s.iter()
            .find(|x| x.name == name && label.is_none_or(|(k, v)| x.label(k) == Some(v)))
    }

    #[test]
    fn host_gauges_from_fixture() {
        let mut out = String::new();
        render_host(&mut out, &fixture());
        let s = parse_exposition(&out).unwrap();
        let vm = |n| {
            find(&s, "shardline_host_vmstat_total", Some(("name", n)))
                .unwrap()
                .value
        };
        assert_eq!(vm("pgscan_direct"), 6011.0);
        assert_eq!(vm("pgscan_kswapd"), 801_337.0);
        assert_eq!(vm("pgsteal_direct"), 5120.0);
        assert_eq!(vm("pgsteal_kswapd"), 771_202.0);
        assert_eq!(vm("workingset_refault_file"), 88_211.0);
        // pgscan_direct_throttle must not be mistaken for pgscan_direct, nor anything else added.
        assert_eq!(
            s.iter()
                .filter(|x| x.name == "shardline_host_vmstat_total")
                .count(),
            VMSTAT_COUNTERS.len()
        );
        let one = |n| find(&s, n, None).unwrap().value;
        assert_eq!(one("shardline_host_allocstall_total"), 43.0);
        assert_eq!(
            one("shardline_host_page_cache_bytes"),
            15_753_308.0 * 1024.0
        );
        assert_eq!(one("shardline_host_dirty_bytes"), 94_084.0 * 1024.0);
        assert_eq!(one("shardline_host_writeback_bytes"), 2048.0 * 1024.0);
        assert!(out.contains("# TYPE shardline_host_allocstall_total counter\n"));
        assert!(out.contains("# TYPE shardline_host_page_cache_bytes gauge\n"));
    }

    #[test]
    fn old_kernel_single_allocstall_and_odd_lines() {
        let v = parse_vmstat("allocstall 7\ngarbage\npgscan_direct x\npgscan_kswapd 3\n");
        assert_eq!(v, vec![("allocstall", 7), ("pgscan_kswapd", 3)]);
        let m = parse_meminfo("Cached:  10 kB\nHugePages_Total:  4\nBad: x kB\nOdd: 1 MB\n");
        assert_eq!(m, vec![("Cached", 10240), ("HugePages_Total", 4)]);
    }

    #[test]
    fn missing_proc_files_leave_host_families_out() {
        let m = vec![Arc::new(ShardMetrics::default())];
        let text = render_metrics(&m, Path::new("/definitely/not/here"));
        parse_exposition(&text).unwrap();
        assert!(!text.contains("shardline_host_"));
        assert!(text.contains("shardline_connections_accepted_total"));
    }

    #[test]
    fn metrics_route_has_shards_and_host() {
        let st = state(false, fixture());
        ShardMetrics::add(&st.metrics[0].accepted, 9);
        let r = respond(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &st);
        assert_eq!(r.status, 200);
        assert!(r.content_type.starts_with("text/plain; version=0.0.4"));
        let s = parse_exposition(&r.body).unwrap();
        let accepted = find(
            &s,
            "shardline_connections_accepted_total",
            Some(("shard", "all")),
        );
        assert_eq!(accepted.unwrap().value, 9.0);
        assert!(find(&s, "shardline_host_allocstall_total", None).is_some());
        // A query string does not change the route.
        assert_eq!(
            respond(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", &st).status,
            200
        );
    }

    #[test]
    fn healthz_follows_shutdown() {
        let st = state(false, fixture());
        let r = respond(b"GET /healthz HTTP/1.1\r\n\r\n", &st);
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        st.shutdown.store(true, Ordering::Relaxed);
        let r = respond(b"GET /healthz HTTP/1.1\r\n\r\n", &st);
        assert_eq!((r.status, r.body.as_str()), (503, "draining\n"));
    }

    #[test]
    fn other_paths_methods_and_garbage() {
        let st = state(false, fixture());
        let status = |h: &[u8]| respond(h, &st).status;
        assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status(b"GET /metrics/ HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status(b"GET /healthz.html HTTP/1.1\r\n\r\n"), 404);
        let r = respond(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", &st);
        assert_eq!(r.status, 405);
        assert!(String::from_utf8(r.to_bytes())
            .unwrap()
            .contains("\r\nAllow: GET\r\n"));
        assert_eq!(status(b"HEAD /healthz HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status(b"get /healthz HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status(b"GET /healthz\r\n\r\n"), 400);
        assert_eq!(status(b"GET  /healthz HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET healthz HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET /healthz SPDY/3\r\n\r\n"), 400);
        assert_eq!(status(b"\xff\xfe\r\n\r\n"), 400);
    }

    #[test]
    fn reply_bytes_are_well_formed() {
        let b = Reply::text(503, "draining\n").to_bytes();
        let text = String::from_utf8(b).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("\r\nContent-Length: 9\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n\r\ndraining\n"));
    }

    #[test]
    fn head_end_is_found_across_reads() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    /// Sends raw bytes to the admin listener and returns (status, headers+body text).
    fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(request);
        let mut text = String::new();
        let mut r = std::io::BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        r.read_to_string(&mut text).unwrap();
        let status = line.split(' ').nth(1).unwrap().parse().unwrap();
        (status, text)
    }

    #[test]
    fn off_when_no_address() {
        let h = start(None, vec![], Arc::new(AtomicBool::new(false)), fixture()).unwrap();
        assert!(h.is_none());
    }

    #[test]
    fn serves_over_tcp_and_stops_promptly() {
        let shutdown = Arc::new(AtomicBool::new(false));
        let metrics = (0..2).map(|_| Arc::new(ShardMetrics::default())).collect();
        let h = start(
            Some("127.0.0.1:0".parse().unwrap()),
            metrics,
            shutdown.clone(),
            fixture(),
        )
        .unwrap()
        .unwrap();
        let addr = h.local_addr();
        assert_ne!(addr.port(), 0);
        let (status, text) = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(status, 200);
        assert!(text.ends_with("\r\n\r\nok\n"), "{text:?}");
        // The head may arrive in pieces.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"ics HTTP/1.1\r\n\r").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK\r\n"), "{body}");
        let body = body.split_once("\r\n\r\n").unwrap().1;
        let samples = parse_exposition(body).unwrap();
        assert!(find(&samples, "shardline_connections_open", Some(("shard", "1"))).is_some());
        // An oversized head is refused, not buffered.
        let big = format!("GET /healthz HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
        assert_eq!(exchange(addr, big.as_bytes()).0, 431);
        shutdown.store(true, Ordering::Relaxed);
        assert_eq!(exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").0, 503);
        let t = Instant::now();
        h.stop();
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "stop took {:?}",
            t.elapsed()
        );
        assert!(
            TcpStream::connect(addr).is_err(),
            "still listening after stop"
        );
    }

    #[test]
    fn a_silent_client_is_dropped_after_the_head_timeout() {
        let h = start(
            Some("127.0.0.1:0".parse().unwrap()),
            vec![Arc::new(ShardMetrics::default())],
            Arc::new(AtomicBool::new(false)),
            fixture(),
        )
        .unwrap()
        .unwrap();
        let addr = h.local_addr();
        let t = Instant::now();
        let mut silent = TcpStream::connect(addr).unwrap();
        silent
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // The next client waits behind the silent one, but not forever.
        let (status, _) = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(status, 200);
        let waited = t.elapsed();
        assert!(
            waited >= HEAD_TIMEOUT - Duration::from_millis(100),
            "{waited:?}"
        );
        assert!(waited < HEAD_TIMEOUT + Duration::from_secs(2), "{waited:?}");
        let mut buf = Vec::new();
        assert_eq!(
            silent.read_to_end(&mut buf).unwrap(),
            0,
            "closed without a reply"
        );
        drop(h);
    }

    #[test]
    fn bind_failure_is_reported() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = start(
            Some(taken.local_addr().unwrap()),
            vec![],
            Arc::new(AtomicBool::new(false)),
            fixture(),
        );
        assert!(r.is_err());
    }
}
