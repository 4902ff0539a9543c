//! The admin listener: `/metrics` (Prometheus text) and `/healthz` on a separate address.
//!
//! One plain std thread runs a `poll(2)` loop over the listener and at most
//! `ADMIN_CONNECTIONS_MAX` non-blocking connections, one request each, `Connection: close`.
//! Idle, slow or half-open clients therefore cost a slot, never the other clients' time: every
//! connection has a deadline (`HEAD_TIMEOUT` for its head, `WRITE_TIMEOUT` for the reply), and
//! when the table is full the oldest connection still sending its head is dropped for the new
//! one, so a health check gets through hundreds of stalled connections. Heads are parsed by the
//! data path's own parser (`http::request`), with its limits and its refusals.
//!
//! It never touches a shard: it only loads the shards' atomics and reads `/proc`, so a busy or
//! slow scraper costs the data path nothing.
//!
//! `/metrics` and `/healthz` are read-only and open. Everything under `/cache/` is control
//! and passes `auth::Gate` first: a bearer token from `admin_token_file` (403 when there is
//! none: control off), then `admin_control_per_s`. A server-side prefill reads its list only
//! from beneath `prefill_dir` (`fs::confine`), and its error report echoes no more than a
//! sanitised prefix of a line (`cache::prefill::echo_prefix`).

pub mod auth;
mod disks;

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::http::request::{parse_request, Method, Parsed, MAX_HEAD_BYTES};
use crate::http::response::reason_phrase;
use crate::metrics::{render_prometheus, write_family_header, ShardMetrics};

/// Most admin connections open at once. Over it, the oldest connection that has not sent a
/// complete head yet is closed to make room; if every slot is busy replying, the newcomer is.
pub const ADMIN_CONNECTIONS_MAX: usize = 128;
/// Time a client has to send its complete request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time the response may take to be written before the connection is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest time spent discarding unread input after a reply.
const LINGER_TIME: Duration = Duration::from_millis(200);
/// Most unread input discarded after a reply.
const LINGER_MAX_BYTES: usize = 64 * 1024;
/// Pause after a failed accept (EMFILE and friends) so the thread does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Connections accepted per loop turn, so a connect flood cannot starve the open ones.
const ACCEPTS_PER_TURN_MAX: usize = 64;
/// Longest poll sleep: the stop flag is also checked this often.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes read per `read` call.
const READ_CHUNK_BYTES: usize = 4096;

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
    /// The pull-through cache, for `POST /cache/purge` (None: no `[[origin]]`).
    edge: Option<crate::fill::edge::SharedEdge>,
    /// The running prefill's lease, if one runs (`/cache/prefill/*`): one at a time.
    prefill: Arc<std::sync::Mutex<PrefillLease>>,
    /// The server's listener a prefill started here fetches through (`POST /cache/prefill`).
    edge_listen: Option<SocketAddr>,
    /// The last prefill started here, and how far it got (`GET /cache/prefill`).
    prefill_run: Arc<std::sync::Mutex<Option<PrefillRun>>>,
    /// Who may use the control endpoints, and how often.
    gate: auth::Gate,
    /// The only directory `POST /cache/prefill?list=` reads from (None: refused).
    prefill_dir: Option<PathBuf>,
}

/// What the control endpoints (`/cache/...`) need.
pub struct Control {
    /// The token they require (None in it: control is off); SIGHUP may replace it.
    pub token: Arc<auth::TokenSlot>,
    /// Control requests taken a second (`admin_control_per_s`).
    pub per_s: u32,
    /// Where a server-side prefill's lists are (`prefill_dir`).
    pub prefill_dir: Option<PathBuf>,
}

impl Control {
    /// Control off: no token, no prefill directory.
    pub fn off() -> Control {
        Control {
            token: Arc::default(),
            per_s: crate::config::DEFAULT_ADMIN_CONTROL_PER_S,
            prefill_dir: None,
        }
    }
}

/// A prefill the admin listener runs (`POST /cache/prefill`), as `GET /cache/prefill` shows it.
#[derive(Default)]
struct PrefillRun {
    list: String,
    objects: usize,
    cached: usize,
    to_fetch: usize,
    filled: usize,
    failed: usize,
    bytes: u64,
    started: Option<Instant>,
    finished_s: Option<f64>,
    /// The first `PREFILL_ERRORS_KEPT` failures, each naming its line.
    errors: Vec<String>,
}

/// Failures a server-side prefill keeps for `GET /cache/prefill`, and bad lines its refusal
/// names at most (a reply stays small whatever the list).
pub const PREFILL_ERRORS_KEPT: usize = 100;

/// Seconds a prefill's lease lasts without a renewal (a prefill that died frees it after).
pub const PREFILL_LEASE_S: u64 = 30;

/// Which prefill runs: its id and when its lease ends.
#[derive(Default)]
struct PrefillLease {
    held: Option<(u64, std::time::Instant)>,
    next_id: u64,
}

/// A running admin listener; stopping (or dropping) it closes the socket and joins the thread.
pub struct AdminHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// A second descriptor of the listening socket, used to wake the poll at once.
    waker: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl AdminHandle {
    /// The bound address (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, drops every admin connection and waits for the thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::Release);
        // shutdown(SHUT_RD) on a listening socket makes it readable (accept fails with EINVAL),
        // which wakes the poll before its interval is up.
        let _ = rustix::net::shutdown(&self.waker, rustix::net::Shutdown::Read);
        let _ = thread.join();
    }
}

impl Drop for AdminHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Binds `addr` and serves `/metrics`, `/healthz` and the control endpoints (behind
/// `control`) on a thread named `admin`.
///
/// `None` means the admin listener is off. `proc_root` is where `vmstat` and `meminfo` are read
/// (`/proc` in production, a fixture tree in tests). `/healthz` answers 503 once `shutdown` is
/// set. A bind failure is returned to the caller (it is a configuration problem).
pub fn start(
    addr: Option<SocketAddr>,
    metrics: Vec<Arc<ShardMetrics>>,
    shutdown: Arc<AtomicBool>,
    proc_root: PathBuf,
    edge: Option<crate::fill::edge::SharedEdge>,
    edge_listen: Option<SocketAddr>,
    control: Control,
) -> std::io::Result<Option<AdminHandle>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let waker = listener.try_clone()?;
    let stop = Arc::new(AtomicBool::new(false));
    let state = State {
        metrics,
        shutdown,
        proc_root,
        edge,
        prefill: Default::default(),
        edge_listen,
        prefill_run: Default::default(),
        gate: auth::Gate::new(control.token, control.per_s),
        prefill_dir: control.prefill_dir,
    };
    let thread_stop = stop.clone();
    let thread = std::thread::Builder::new()
        .name("admin".into())
        .spawn(move || Server::new(listener, state).run(&thread_stop))?;
    Ok(Some(AdminHandle {
        addr: local,
        stop,
        waker,
        thread: Some(thread),
    }))
}

/// Where one admin connection is in its single exchange.
enum Stage {
    /// Receiving the request head (bytes so far).
    Head(Vec<u8>),
    /// Writing the reply; `linger` asks to discard unread input before closing.
    Reply {
        out: Vec<u8>,
        sent: usize,
        linger: bool,
    },
    /// Reply sent and write side shut: discarding what the client still sends.
    Linger { drained: usize },
}

/// One admin connection.
struct Conn {
    stream: TcpStream,
    stage: Stage,
    /// When the current stage gives up.
    deadline: Instant,
}

impl Conn {
    fn wants(&self) -> PollFlags {
        match self.stage {
            Stage::Head(_) | Stage::Linger { .. } => PollFlags::IN,
            Stage::Reply { .. } => PollFlags::OUT,
        }
    }

    fn reading_head(&self) -> bool {
        matches!(self.stage, Stage::Head(_))
    }
}

/// What to do with a connection after handling its readiness.
enum Next {
    Keep,
    Close,
}

/// The admin thread's event loop.
struct Server {
    listener: TcpListener,
    state: State,
    /// Open connections, oldest first.
    conns: Vec<Conn>,
    /// Accepting is paused until then after an accept error.
    accept_paused_until: Option<Instant>,
    accept_error_logged: bool,
}

impl Server {
    fn new(listener: TcpListener, state: State) -> Server {
        Server {
            listener,
            state,
            conns: Vec::with_capacity(ADMIN_CONNECTIONS_MAX),
            accept_paused_until: None,
            accept_error_logged: false,
        }
    }

    fn run(mut self, stop: &AtomicBool) {
        let mut ready: Vec<PollFlags> = Vec::with_capacity(ADMIN_CONNECTIONS_MAX + 1);
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if self.accept_paused_until.is_some_and(|t| now >= t) {
                self.accept_paused_until = None;
            }
            let accepting = self.accept_paused_until.is_none();
            let wait = self
                .conns
                .iter()
                .map(|c| c.deadline)
                .chain(self.accept_paused_until)
                .min()
                .map_or(POLL_INTERVAL, |t| {
                    t.saturating_duration_since(now).min(POLL_INTERVAL)
                });
            ready.clear();
            {
                let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.conns.len() + 1);
                let listen_events = if accepting {
                    PollFlags::IN
                } else {
                    PollFlags::empty()
                };
                fds.push(PollFd::new(&self.listener, listen_events));
                for c in &self.conns {
                    fds.push(PollFd::new(&c.stream, c.wants()));
                }
                // `wait` is at most POLL_INTERVAL, which always converts.
                let timeout = Timespec::try_from(wait).unwrap_or(Timespec {
                    tv_sec: 0,
                    tv_nsec: POLL_INTERVAL.subsec_nanos().into(),
                });
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) => ready.extend(fds.iter().map(|f| f.revents())),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "admin listener: poll failed; stopping");
                        return;
                    }
                }
            }
            if stop.load(Ordering::Acquire) {
                break;
            }
            // Connections first (they were polled), then new ones; close in reverse so the
            // indices of the ones not yet visited stay valid.
            let now = Instant::now();
            for i in (0..self.conns.len()).rev() {
                let events = ready.get(i + 1).copied().unwrap_or(PollFlags::empty());
                let next = if events.is_empty() {
                    Next::Keep
                } else {
                    self.progress(i)
                };
                // The deadline holds whether or not bytes trickle in (a slow head is no head).
                let expired = matches!(next, Next::Keep) && now >= self.conns[i].deadline;
                if expired || matches!(next, Next::Close) {
                    self.conns.remove(i);
                }
            }
            if accepting && ready.first().is_some_and(|e| !e.is_empty()) {
                self.accept_some();
            }
        }
    }

    /// Accepts up to `ACCEPTS_PER_TURN_MAX` pending connections.
    fn accept_some(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN_MAX {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    self.accept_error_logged = false;
                    self.admit(stream);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    if !self.accept_error_logged {
                        tracing::warn!(error = %e, "admin listener: accept failed; backing off");
                        self.accept_error_logged = true;
                    }
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_ERROR_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Adds a connection, making room by closing the oldest one still sending its head.
    fn admit(&mut self, stream: TcpStream) {
        if self.conns.len() >= ADMIN_CONNECTIONS_MAX {
            match self.conns.iter().position(Conn::reading_head) {
                Some(oldest) => drop(self.conns.remove(oldest)),
                // Every slot is writing a reply (each bounded by WRITE_TIMEOUT): refuse.
                None => return,
            }
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            stage: Stage::Head(Vec::new()),
            deadline: Instant::now() + HEAD_TIMEOUT,
        };
        // The request usually arrived with the connection: answer without another poll.
        if matches!(step(&mut conn, &self.state), Next::Keep) {
            self.conns.push(conn);
        }
    }

    fn progress(&mut self, i: usize) -> Next {
        step(&mut self.conns[i], &self.state)
    }
}

/// Advances one connection as far as its socket allows without blocking.
fn step(conn: &mut Conn, state: &State) -> Next {
    loop {
        match &mut conn.stage {
            Stage::Head(buf) => {
                let mut chunk = [0u8; READ_CHUNK_BYTES];
                // One byte past the head limit is enough for the parser to answer 431.
                let room = (MAX_HEAD_BYTES + 1)
                    .saturating_sub(buf.len())
                    .min(chunk.len());
                match conn.stream.read(&mut chunk[..room]) {
                    Ok(0) => return Next::Close,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return Next::Close,
                }
                let Some((reply, linger)) = answer(buf, state) else {
                    continue;
                };
                conn.stage = Stage::Reply {
                    out: reply.to_bytes(),
                    sent: 0,
                    linger,
                };
                conn.deadline = Instant::now() + WRITE_TIMEOUT;
            }
            Stage::Reply { out, sent, linger } => {
                match conn.stream.write(&out[*sent..]) {
                    Ok(0) => return Next::Close,
                    Ok(n) => *sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return Next::Close,
                }
                if *sent < out.len() {
                    continue;
                }
                let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                if !*linger {
                    return Next::Close;
                }
                conn.stage = Stage::Linger { drained: 0 };
                conn.deadline = Instant::now() + LINGER_TIME;
            }
            Stage::Linger { drained } => {
                // Closing with unread input sends a reset that can destroy the reply before
                // the client reads it, so read and discard a little first.
                let mut sink = [0u8; READ_CHUNK_BYTES];
                match conn.stream.read(&mut sink) {
                    Ok(0) => return Next::Close,
                    Ok(n) => *drained += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => return Next::Close,
                }
                if *drained >= LINGER_MAX_BYTES {
                    return Next::Close;
                }
            }
        }
    }
}

/// A response of the admin listener.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    status: u16,
    content_type: &'static str,
    extra_headers: &'static str,
    body: String,
    /// Answering HEAD: the same header, no body.
    head_only: bool,
}

impl Reply {
    fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_headers: "",
            body: body.to_string(),
            head_only: false,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\n{}Connection: close\r\n\r\n",
            self.status,
            reason_phrase(self.status),
            self.content_type,
            self.body.len(),
            self.extra_headers
        )
        .into_bytes();
        if !self.head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// The reply to the bytes received so far, and whether to discard unread input before
/// closing (a refused request, or bytes after the head); `None` until the head is complete.
fn answer(buf: &[u8], state: &State) -> Option<(Reply, bool)> {
    // POST is taken for `/cache/purge` alone: its head is read by the same parser, as a GET
    // (the arguments are in the query; a body is refused like any other).
    let post = buf.starts_with(b"POST ");
    let as_get;
    let head = if post {
        as_get = [&b"GET "[..], &buf[5..]].concat();
        &as_get[..]
    } else {
        buf
    };
    match parse_request(head) {
        Parsed::Partial => None,
        Parsed::Rejected(r) => {
            let mut reply = Reply::text(r.status, &format!("{}\n", r.reason));
            if r.status == 405 {
                reply.extra_headers = "Allow: GET, HEAD\r\n";
            }
            Some((reply, true))
        }
        Parsed::Complete { request, head_len } => {
            // Control is judged on the very path the routes below match, before any of them.
            let gate = if auth::is_control(request.path) {
                state.gate.check(&head[..head_len], Instant::now())
            } else {
                Ok(())
            };
            let mut reply = match gate {
                Err(why) => refusal(why),
                Ok(()) => dispatch(post, request.path, request.query, state),
            };
            reply.head_only = request.method == Method::Head;
            let linger = head_len + usize::from(post) < buf.len() || reply.status >= 400;
            Some((reply, linger))
        }
    }
}

/// The reply to a complete request that may go on (its method POST or GET/HEAD).
fn dispatch(post: bool, path: &[u8], query: Option<&[u8]>, state: &State) -> Reply {
    if path.starts_with(b"/cache/") && state.edge.as_ref().is_some_and(|e| e.loading()) {
        return cache_loading();
    }
    match (post, path) {
        (true, b"/cache/purge") => purge(query, state),
        (true, b"/cache/pin") => pin(query, state),
        (true, b"/cache/prefill") => prefill_start(query, state),
        (true, b"/cache/disks/offline") => disks::set(query, state, true),
        (true, b"/cache/disks/online") => disks::set(query, state, false),
        (true, p) if p.starts_with(b"/cache/prefill/") => {
            prefill_lease(&p[b"/cache/prefill/".len()..], query, state)
        }
        (true, _) => Reply {
            extra_headers: "Allow: GET, HEAD\r\n",
            ..Reply::text(
                405,
                "POST is for /cache/purge, /cache/pin, /cache/prefill and /cache/disks/ only\n",
            )
        },
        (false, b"/cache/purge") => Reply {
            extra_headers: "Allow: POST\r\n",
            ..Reply::text(405, "purge with POST\n")
        },
        (false, path) => route(path, query, state),
    }
}

/// The reply to a `/cache/` request while the cache's disks load: 503, to be asked again.
fn cache_loading() -> Reply {
    Reply {
        extra_headers: "Retry-After: 1\r\n",
        ..Reply::text(
            503,
            "the cache is loading (shardline_cache_load_* in /metrics; /healthz says ok once \
             it is done): ask again then\n",
        )
    }
}

/// The reply to a refused control request: 403 while control is off (no token would do),
/// 401 with a `WWW-Authenticate` challenge for a missing or wrong token, 429 past the rate.
fn refusal(why: auth::Refusal) -> Reply {
    use auth::Refusal;
    match why {
        Refusal::ControlOff => Reply::text(
            403,
            "control is off on this server: set admin_token_file (a mode 0600 file holding a \
             token) to use /cache/ endpoints; /metrics and /healthz need none\n",
        ),
        Refusal::NoCredential => Reply {
            extra_headers: "WWW-Authenticate: Bearer realm=\"shardline-admin\"\r\n",
            ..Reply::text(
                401,
                "control needs the admin token: Authorization: Bearer TOKEN (the token in \
                 admin_token_file; shardline cache ... --token-file FILE)\n",
            )
        },
        Refusal::BadCredential => Reply {
            extra_headers:
                "WWW-Authenticate: Bearer realm=\"shardline-admin\", error=\"invalid_token\"\r\n",
            ..Reply::text(401, "not the admin token\n")
        },
        Refusal::RateLimited => Reply {
            extra_headers: "Retry-After: 1\r\n",
            ..Reply::text(
                429,
                "over admin_control_per_s control requests a second; retry in a second\n",
            )
        },
    }
}

/// `POST /cache/prefill/begin` (200 and the lease's id; 409 while another prefill holds it),
/// `/cache/prefill/renew?id=N` (another `PREFILL_LEASE_S`; 409 if it was lost) and
/// `/cache/prefill/end?id=N`: one `shardline cache prefill` at a time per server.
fn prefill_lease(action: &[u8], query: Option<&[u8]>, state: &State) -> Reply {
    use std::time::{Duration, Instant};
    let now = Instant::now();
    let mut lease = state
        .prefill
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let live = lease.held.filter(|&(_, until)| until > now);
    let id = query
        .and_then(|q| crate::http::request::query_param(q, "id"))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    let until = now + Duration::from_secs(PREFILL_LEASE_S);
    match action {
        b"begin" => {
            if live.is_some() {
                return Reply::text(
                    409,
                    "another prefill runs on this server; try when it ends\n",
                );
            }
            lease.next_id += 1;
            let id = lease.next_id;
            lease.held = Some((id, until));
            Reply::text(200, &format!("{id}\n"))
        }
        b"renew" => match (live, id) {
            (Some((held, _)), Some(id)) if held == id => {
                lease.held = Some((id, until));
                Reply::text(200, "renewed\n")
            }
            _ => Reply::text(
                409,
                "this prefill's lease was lost (it was not renewed in time)\n",
            ),
        },
        b"end" => {
            if live.is_some_and(|(held, _)| Some(held) == id) {
                lease.held = None;
            }
            Reply::text(200, "ended\n")
        }
        _ => Reply::text(404, "POST /cache/prefill/begin, /renew?id= or /end?id=\n"),
    }
}

/// A request target named in an admin query: its path, its query, and the Host it is asked
/// under.
type NamedTarget = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

/// The `target=` (percent-encoded, its query included) and optional `host=` of an admin
/// query, split into path, query and host; Err is the reply.
fn target_of(query: &[u8]) -> Result<NamedTarget, Reply> {
    let decode = |v: &[u8]| crate::fs::resolve::percent_decode(v);
    let Some(target) = crate::http::request::query_param(query, "target").and_then(decode) else {
        return Err(Reply::text(
            400,
            "give target=PATH (percent-encoded, its query included)\n",
        ));
    };
    let host = crate::http::request::query_param(query, "host").and_then(decode);
    let (path, target_query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => (target[..i].to_vec(), Some(target[i + 1..].to_vec())),
        None => (target, None),
    };
    if !path.starts_with(b"/") {
        return Err(Reply::text(400, "the target must start with /\n"));
    }
    Ok((path, target_query, host))
}

/// `POST /cache/pin?target=/a/b.bin&until=UNIX_S[&host=H]`: keeps that object from eviction
/// until then (`SharedEdge::pin_until`); "pinned", or "not cached" when the cache does not
/// hold it; 404 naming why when no `[[origin]]` covers it.
fn pin(query: Option<&[u8]>, state: &State) -> Reply {
    let Some(edge) = state.edge.as_ref() else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let query = query.unwrap_or_default();
    let until = crate::http::request::query_param(query, "until")
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    let Some(until) = until else {
        return Reply::text(400, "give until=UNIX_SECONDS\n");
    };
    let (path, target_query, host) = match target_of(query) {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    match edge.pin_until(&path, target_query.as_deref(), host.as_deref(), until) {
        Ok(true) => Reply::text(200, "pinned\n"),
        Ok(false) => Reply::text(200, "not cached\n"),
        Err(why) => Reply::text(404, &format!("{why}\n")),
    }
}

/// `POST /cache/prefill?list=NAME[&rate=BYTES_PER_S][&parallel=N][&pin_until=TIME]`: the
/// server itself prefills from a list file on its own disk (the admin listener takes no
/// request body, so a list of 100 000 URLs is named, not sent). NAME is read only from
/// beneath `prefill_dir` (403 without one; 400 for a name outside it, before anything is
/// read). The list is checked whole first, as `shardline cache prefill` checks it: 400 naming
/// the bad lines (at most `PREFILL_ERRORS_KEPT`, each echoing a sanitised prefix), nothing
/// fetched. Then the prefill takes the lease (409 while another runs, checked before the list
/// is read), answers 202, and fetches on a thread of its own through the server's listener;
/// `GET /cache/prefill` shows how far.
fn prefill_start(query: Option<&[u8]>, state: &State) -> Reply {
    use crate::cache::prefill::{self, echo_prefix};
    let (Some(edge), Some(listen)) = (state.edge.as_ref(), state.edge_listen) else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let Some(dir) = state.prefill_dir.as_deref() else {
        return Reply::text(
            403,
            "a server-side prefill is off: set prefill_dir (the only directory its lists are \
             read from), or run shardline cache prefill, which sends the list itself\n",
        );
    };
    let query = query.unwrap_or_default();
    let param = |name: &str| {
        crate::http::request::query_param(query, name)
            .and_then(crate::fs::resolve::percent_decode)
            .and_then(|v| String::from_utf8(v).ok())
    };
    let Some(name) = param("list") else {
        return Reply::text(
            400,
            "give list=NAME (a file beneath prefill_dir, one URL or path a line)\n",
        );
    };
    // Reading and checking a list is the costly part: not while another prefill runs.
    let lease_live = state
        .prefill
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .held
        .is_some_and(|(_, until)| until > Instant::now());
    if lease_live {
        return Reply::text(
            409,
            "another prefill runs on this server; try when it ends\n",
        );
    }
    // The name as replies and the status show it.
    let list = echo_prefix(&name);
    let number = |name: &str, default: u64| match param(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| format!("{name}={v} is not a number\n")),
    };
    let (rate, parallel) = match (
        number("rate", 0),
        number("parallel", prefill::DEFAULT_PARALLEL as u64),
    ) {
        (Ok(r), Ok(p)) if (1..=prefill::MAX_PARALLEL as u64).contains(&p) => (r, p as usize),
        (Err(e), _) | (_, Err(e)) => return Reply::text(400, &e),
        _ => {
            return Reply::text(
                400,
                &format!("parallel must be 1..={}\n", prefill::MAX_PARALLEL),
            )
        }
    };
    let now_s = crate::fill::cache_fill::unix_now_s();
    let pin_until = match param("pin_until").map(|v| prefill::parse_pin_until(&v, now_s)) {
        Some(Err(e)) => return Reply::text(400, &format!("pin_until: {e}\n")),
        Some(Ok(t)) => Some(t),
        None => None,
    };
    let text = match crate::fs::confine::read_beneath(dir, &name, prefill::MAX_LIST_BYTES) {
        Ok(t) => t,
        Err(why) => return Reply::text(400, &format!("list {list}: {why}\n")),
    };
    let targets = match prefill::parse_list(&text) {
        Ok(t) => t,
        Err(errors) => return Reply::text(400, &format!("{list}:\n{}\n", report(&errors))),
    };
    let mut errors = Vec::new();
    let mut todo = Vec::new();
    let mut cached = Vec::new();
    for t in targets {
        let (path, q, host) = t.parts();
        match edge.object_state(path, q, host) {
            Ok(s) if s.cached => cached.push(t),
            Ok(_) => todo.push(t),
            Err(why) => errors.push(format!(
                "line {}: {}: {why}",
                t.line,
                echo_prefix(&t.target)
            )),
        }
    }
    if !errors.is_empty() {
        return Reply::text(
            400,
            &format!(
                "{list}: lines the server cannot fill; nothing fetched:\n{}\n",
                report(&errors)
            ),
        );
    }
    // The lease the CLI takes too: one prefill at a time, whoever runs it.
    let id = {
        let mut lease = state
            .prefill
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if lease.held.is_some_and(|(_, until)| until > now) {
            return Reply::text(
                409,
                "another prefill runs on this server; try when it ends\n",
            );
        }
        lease.next_id += 1;
        // Held until this prefill ends (it releases it then).
        lease.held = Some((lease.next_id, now + Duration::from_secs(10 * 365 * 86_400)));
        lease.next_id
    };
    *state
        .prefill_run
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(PrefillRun {
        list: list.clone(),
        objects: todo.len() + cached.len(),
        cached: cached.len(),
        to_fetch: todo.len(),
        started: Some(Instant::now()),
        ..Default::default()
    });
    let reply = format!(
        "prefill of {list} started: {} objects, {} cached, {} to fetch\n",
        todo.len() + cached.len(),
        cached.len(),
        todo.len()
    );
    let (edge, run, lease) = (
        edge.clone(),
        state.prefill_run.clone(),
        state.prefill.clone(),
    );
    let spawned = std::thread::Builder::new().name("prefill".into()).spawn(move || {
        let with_run = |f: &mut dyn FnMut(&mut PrefillRun)| {
            if let Some(r) = run.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_mut() {
                f(r);
            }
        };
        let pin = |t: &prefill::Target| {
            let Some(until) = pin_until else { return };
            let (path, q, host) = t.parts();
            let _ = edge.pin_until(path, q, host, until);
        };
        cached.iter().for_each(pin);
        let todo_refs: Vec<&prefill::Target> = todo.iter().collect();
        prefill::run(
            listen,
            &todo_refs,
            rate,
            parallel,
            &|n| with_run(&mut |r| r.bytes += n),
            &|t, result| {
                match result {
                    Ok(_) => pin(t),
                    Err(e) => tracing::warn!(line = t.line, target = %t.target, error = %e, "prefill: an object failed"),
                }
                with_run(&mut |r| match result {
                    Ok(_) => r.filled += 1,
                    Err(e) => {
                        r.failed += 1;
                        if r.errors.len() < PREFILL_ERRORS_KEPT {
                            r.errors.push(format!("line {}: {}: {e}", t.line, echo_prefix(&t.target)));
                        }
                    }
                });
            },
        );
        with_run(&mut |r| {
            r.finished_s = r.started.map(|s| s.elapsed().as_secs_f64());
            tracing::info!(list = %r.list, objects = r.objects, cached = r.cached, filled = r.filled, failed = r.failed, bytes = r.bytes, "prefill done");
        });
        let mut lease = lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if lease.held.is_some_and(|(held, _)| held == id) {
            lease.held = None;
        }
    });
    if let Err(e) = spawned {
        state
            .prefill
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .held = None;
        return Reply::text(500, &format!("cannot start the prefill thread: {e}\n"));
    }
    Reply::text(202, &reply)
}

/// A list's error lines for a reply: the first `PREFILL_ERRORS_KEPT`, then how many more.
fn report(errors: &[String]) -> String {
    let mut out = errors
        .iter()
        .take(PREFILL_ERRORS_KEPT)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("\n");
    if errors.len() > PREFILL_ERRORS_KEPT {
        let _ = write!(out, "\n... and {} more", errors.len() - PREFILL_ERRORS_KEPT);
    }
    out
}

/// `GET /cache/prefill`: the last prefill started with `POST /cache/prefill`, as JSON (404
/// when none was).
fn prefill_status(state: &State) -> Reply {
    let run = state
        .prefill_run
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(r) = run.as_ref() else {
        return Reply::text(404, "no prefill was started here\n");
    };
    let elapsed = r
        .finished_s
        .or_else(|| r.started.map(|s| s.elapsed().as_secs_f64()));
    let body = serde_json::json!({
        "list": r.list,
        "running": r.finished_s.is_none(),
        "objects": r.objects,
        "cached": r.cached,
        "to_fetch": r.to_fetch,
        "filled": r.filled,
        "failed": r.failed,
        "bytes": r.bytes,
        "seconds": elapsed,
        "errors": r.errors,
    });
    Reply {
        content_type: "application/json",
        ..Reply::text(200, &format!("{body}\n"))
    }
}

/// `POST /cache/purge?path=/a/b.bin` (one object) or `?prefix=/a/` (everything beneath): the
/// cache forgets them (`SharedEdge::purge`) and the next request fetches from the origin.
/// `?tag=T` (percent-encoded) purges every object its origin tagged `T` (`SharedEdge::purge_tag`).
fn purge(query: Option<&[u8]>, state: &State) -> Reply {
    let Some(edge) = state.edge.as_ref() else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let query = query.unwrap_or_default();
    if query.split(|&b| b == b'&').any(|p| p.starts_with(b"tag=")) {
        return purge_tag(query, edge);
    }
    let (value, prefix) = match (
        crate::http::request::query_param(query, "path"),
        crate::http::request::query_param(query, "prefix"),
    ) {
        (Some(p), None) => (p, false),
        (None, Some(p)) => (p, true),
        _ => return Reply::text(400, "give one of path=/a/b.bin or prefix=/a/\n"),
    };
    if !value.starts_with(b"/") {
        return Reply::text(400, "the path must start with /\n");
    }
    match edge.purge(value, prefix) {
        Some(n) => {
            tracing::info!(path = %String::from_utf8_lossy(value), prefix, objects = n, "cache purge");
            Reply::text(200, &format!("purged {n}\n"))
        }
        None => Reply::text(400, "the path does not resolve\n"),
    }
}

/// `POST /cache/purge?tag=T`: one tag, alone (400 for a bad or repeated one); "purged N".
fn purge_tag(query: &[u8], edge: &crate::fill::edge::SharedEdge) -> Reply {
    use crate::cache::tags::{is_tag, MAX_TAG_BYTES};
    let http = crate::http::request::query_param;
    if http(query, "path").is_some() || http(query, "prefix").is_some() {
        return Reply::text(400, "give one of path=, prefix= or tag=\n");
    }
    let tag = http(query, "tag")
        .and_then(crate::fs::resolve::percent_decode)
        .and_then(|t| String::from_utf8(t).ok());
    let Some(tag) = tag.filter(|t| is_tag(t)) else {
        return Reply::text(
            400,
            &format!(
                "give one tag=T: 1 to {MAX_TAG_BYTES} visible ASCII characters, percent-encoded\n"
            ),
        );
    };
    let n = edge.purge_tag(&tag);
    tracing::info!(tag = %tag, objects = n, "cache purge by tag");
    Reply::text(200, &format!("purged {n}\n"))
}

/// `GET /cache/object?target=/a/b.bin%3Fv%3D1&host=H` (target percent-encoded, host
/// optional): what the cache holds of that request target, as JSON
/// (`{"origin":0,"size":N,"cached":true}`; size null before its head was fetched); 404 naming
/// why when no `[[origin]]` covers it. `shardline cache prefill` asks it before each fetch.
fn object_state(query: Option<&[u8]>, state: &State) -> Reply {
    let Some(edge) = state.edge.as_ref() else {
        return Reply::text(404, "no pull-through cache here (no [[origin]])\n");
    };
    let (path, target_query, host) = match target_of(query.unwrap_or_default()) {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    match edge.object_state(&path, target_query.as_deref(), host.as_deref()) {
        Ok(s) => {
            let size = s.size.map_or("null".to_string(), |n| n.to_string());
            Reply {
                content_type: "application/json",
                ..Reply::text(
                    200,
                    &format!(
                        "{{\"origin\":{},\"size\":{size},\"cached\":{}}}\n",
                        s.origin, s.cached
                    ),
                )
            }
        }
        Err(why) => Reply::text(404, &format!("{why}\n")),
    }
}

/// Answers a GET (or HEAD) of `path`.
fn route(path: &[u8], query: Option<&[u8]>, state: &State) -> Reply {
    match path {
        b"/cache/object" => object_state(query, state),
        b"/cache/prefill" => prefill_status(state),
        b"/cache/disks" => disks::status(state),
        b"/metrics" => {
            let mut text = render_metrics(&state.metrics, &state.proc_root);
            state.gate.render(&mut text);
            Reply {
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                ..Reply::text(200, &text)
            }
        }
        b"/healthz" if state.shutdown.load(Ordering::Relaxed) => Reply::text(503, "draining\n"),
        b"/healthz" if state.edge.as_ref().is_some_and(|e| e.loading()) => {
            Reply::text(503, "loading\n")
        }
        b"/healthz" => Reply::text(200, "ok\n"),
        _ => Reply::text(404, "not found (try /metrics or /healthz)\n"),
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

    /// The token the test states' gate wants.
    const TOKEN: &str = "test-token-0123456789abcdef";

    fn state(shutdown: bool, proc_root: PathBuf) -> State {
        let token = auth::TokenSlot::new(Some(auth::AdminToken::new(TOKEN.into())));
        State {
            metrics: vec![Arc::new(ShardMetrics::default())],
            shutdown: Arc::new(AtomicBool::new(shutdown)),
            proc_root,
            edge: None,
            prefill: Default::default(),
            edge_listen: None,
            prefill_run: Default::default(),
            gate: auth::Gate::new(Arc::new(token), 1000),
            prefill_dir: None,
        }
    }

    /// A request head with the test token.
    fn with_token(method: &str, target: &str) -> Vec<u8> {
        format!("{method} {target} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
            .into_bytes()
    }

    fn find<'a>(s: &'a [Sample], name: &str, label: Option<(&str, &str)>) -> Option<&'a Sample> {
        s.iter()
            .find(|x| x.name == name && label.is_none_or(|(k, v)| x.label(k) == Some(v)))
    }

    /// The reply to a complete head.
    fn respond(head: &[u8], st: &State) -> Reply {
        answer(head, st)
            .unwrap_or_else(|| panic!("{:?} is not complete", String::from_utf8_lossy(head)))
            .0
    }

    #[test]
    fn one_prefill_holds_the_lease_at_a_time() {
        let st = state(false, fixture());
        let post = |target: &str| {
            let r = respond(&with_token("POST", target), &st);
            (r.status, r.body.trim().to_string())
        };
        let (status, id) = post("/cache/prefill/begin");
        assert_eq!(status, 200);
        assert_eq!(
            post("/cache/prefill/begin").0,
            409,
            "a second prefill while one runs"
        );
        assert_eq!(post(&format!("/cache/prefill/renew?id={id}")).0, 200);
        assert_eq!(
            post("/cache/prefill/renew?id=999").0,
            409,
            "not this prefill's lease"
        );
        assert_eq!(post("/cache/prefill/end?id=999").0, 200);
        assert_eq!(
            post("/cache/prefill/begin").0,
            409,
            "a wrong id ends nothing"
        );
        assert_eq!(post(&format!("/cache/prefill/end?id={id}")).0, 200);
        let (status, next) = post("/cache/prefill/begin");
        assert_eq!(status, 200);
        assert_ne!(next, id);
        assert_eq!(
            post(&format!("/cache/prefill/renew?id={id}")).0,
            409,
            "an old lease"
        );
        assert_eq!(post("/cache/prefill/other").0, 404);
        // An expired lease frees the next prefill.
        st.prefill.lock().unwrap().held = Some((7, std::time::Instant::now()));
        assert_eq!(post("/cache/prefill/begin").0, 200);
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
            Some(("shard", "0")),
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
        let r = respond(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", &st);
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        st.shutdown.store(true, Ordering::Relaxed);
        let r = respond(b"GET /healthz HTTP/1.0\r\n\r\n", &st);
        assert_eq!((r.status, r.body.as_str()), (503, "draining\n"));
    }

    #[test]
    fn heads_go_through_the_data_path_parser() {
        let st = state(false, fixture());
        let status = |h: &[u8]| respond(h, &st).status;
        assert_eq!(status(b"GET / HTTP/1.0\r\n\r\n"), 404);
        assert_eq!(status(b"GET /metrics/ HTTP/1.0\r\n\r\n"), 404);
        assert_eq!(status(b"GET /healthz.html HTTP/1.0\r\n\r\n"), 404);
        let r = respond(b"POST /metrics HTTP/1.1\r\nHost: a\r\n\r\n", &st);
        assert_eq!(r.status, 405);
        assert!(String::from_utf8(r.to_bytes())
            .unwrap()
            .contains("\r\nAllow: GET, HEAD\r\n"));
        // POST is for the purge alone; the purge is POST alone; without a cache it is a 404.
        assert_eq!(
            respond(&with_token("POST", "/cache/purge?path=/a"), &st).status,
            404
        );
        let r = respond(&with_token("GET", "/cache/purge?path=/a"), &st);
        assert_eq!(r.status, 405);
        assert_eq!(r.extra_headers, "Allow: POST\r\n");
        assert_eq!(
            status(b"POST /cache/purge HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"),
            400,
            "a body is refused as on the data path"
        );
        // HEAD: GET's header, no body.
        let r = respond(b"HEAD /healthz HTTP/1.0\r\n\r\n", &st);
        let text = String::from_utf8(r.to_bytes()).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.ends_with(
                "\r\nContent-Length: 3\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
            ),
            "{text}"
        );
        assert_eq!(status(b"get /healthz HTTP/1.0\r\n\r\n"), 501);
        // A bare LF ends nothing: the parser refuses it instead of waiting or accepting it.
        assert_eq!(status(b"GET /healthz HTTP/1.0\n\n"), 400);
        assert_eq!(status(b"GET /healthz HTTP/1.1\r\nHost: a\n\n"), 400);
        assert_eq!(status(b"\n\n"), 400);
        assert_eq!(status(b"GET /healthz HTTP/1.1\r\n\r\n"), 400, "no Host");
        assert_eq!(status(b"GET /healthz\r\n\r\n"), 400);
        assert_eq!(status(b"GET  /healthz HTTP/1.0\r\n\r\n"), 400);
        assert_eq!(status(b"GET healthz HTTP/1.0\r\n\r\n"), 400);
        assert_eq!(status(b"GET /healthz SPDY/3\r\n\r\n"), 400);
        assert_eq!(status(b"\xff\xfe\r\n\r\n"), 400);
        // Incomplete heads wait for more bytes.
        assert!(answer(b"GET /metr", &st).is_none());
        assert!(answer(b"GET /metrics HTTP/1.0\r\n", &st).is_none());
        // Oversized heads are refused once the parser's limit is passed.
        let big = format!(
            "GET /healthz HTTP/1.0\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_BYTES)
        );
        assert_eq!(status(&big.as_bytes()[..MAX_HEAD_BYTES + 1]), 431);
    }

    #[test]
    fn refusals_and_leftover_input_linger() {
        let st = state(false, fixture());
        let linger = |h: &[u8]| answer(h, &st).unwrap().1;
        assert!(!linger(b"GET /healthz HTTP/1.0\r\n\r\n"));
        assert!(linger(b"GET /healthz HTTP/1.0\r\n\r\nGET /"));
        assert!(linger(b"GET /nope HTTP/1.0\r\n\r\n"));
        assert!(linger(b"GET /healthz HTTP/1.0\n\n"));
    }

    #[test]
    fn reply_bytes_are_well_formed() {
        let b = Reply::text(503, "draining\n").to_bytes();
        let text = String::from_utf8(b).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(text.contains("\r\nContent-Length: 9\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n\r\ndraining\n"));
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

    fn start_test_listener(shutdown: Arc<AtomicBool>) -> AdminHandle {
        let metrics = (0..2).map(|_| Arc::new(ShardMetrics::default())).collect();
        start(
            Some("127.0.0.1:0".parse().unwrap()),
            metrics,
            shutdown,
            fixture(),
            None,
            None,
            Control::off(),
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn off_when_no_address() {
        let h = start(
            None,
            vec![],
            Arc::new(AtomicBool::new(false)),
            fixture(),
            None,
            None,
            Control::off(),
        )
        .unwrap();
        assert!(h.is_none());
    }

    #[test]
    fn serves_over_tcp_and_stops_promptly() {
        let shutdown = Arc::new(AtomicBool::new(false));
        let h = start_test_listener(shutdown.clone());
        let addr = h.local_addr();
        assert_ne!(addr.port(), 0);
        let (status, text) = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(status, 200);
        assert!(text.ends_with("\r\n\r\nok\n"), "{text:?}");
        // The head may arrive in pieces.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metr").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"ics HTTP/1.0\r\n\r").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK\r\n"), "{body}");
        let body = body.split_once("\r\n\r\n").unwrap().1;
        let samples = parse_exposition(body).unwrap();
        assert!(find(&samples, "shardline_connections_open", Some(("shard", "1"))).is_some());
        // An oversized head is refused, not buffered.
        let big = format!("GET /healthz HTTP/1.0\r\nX: {}\r\n\r\n", "a".repeat(20_000));
        assert_eq!(exchange(addr, big.as_bytes()).0, 431);
        shutdown.store(true, Ordering::Relaxed);
        assert_eq!(exchange(addr, b"GET /healthz HTTP/1.0\r\n\r\n").0, 503);
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
    fn silent_clients_do_not_delay_others_and_are_dropped_later() {
        let h = start_test_listener(Arc::new(AtomicBool::new(false)));
        let addr = h.local_addr();
        let mut silent: Vec<TcpStream> =
            (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"GET /metr").unwrap();
        // Served while they sit there (no wall-clock assertion: the read timeout is a hang guard).
        assert_eq!(exchange(addr, b"GET /healthz HTTP/1.0\r\n\r\n").0, 200);
        // Their head deadline closes them without a reply.
        for s in silent.iter_mut().chain(std::iter::once(&mut half)) {
            s.set_read_timeout(Some(HEAD_TIMEOUT * 5)).unwrap();
            let mut buf = Vec::new();
            assert_eq!(
                s.read_to_end(&mut buf).unwrap(),
                0,
                "closed without a reply"
            );
        }
    }

    #[test]
    fn a_head_trickling_in_is_still_cut_at_its_deadline() {
        let h = start_test_listener(Arc::new(AtomicBool::new(false)));
        let mut s = TcpStream::connect(h.local_addr()).unwrap();
        s.write_all(b"GET /healthz HTTP/1.0\r\nX-Slow: ").unwrap();
        // One byte every 100 ms for four head timeouts: the server must hang up before.
        let rounds = (HEAD_TIMEOUT * 4).as_millis() / 100;
        let cut = (0..rounds).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"a").is_err()
        });
        assert!(cut, "a trickling head outlived its deadline");
    }

    #[test]
    fn over_the_cap_the_oldest_head_is_dropped() {
        let h = start_test_listener(Arc::new(AtomicBool::new(false)));
        let addr = h.local_addr();
        let mut oldest = TcpStream::connect(addr).unwrap();
        oldest.write_all(b"GET /metr").unwrap();
        let _idle: Vec<TcpStream> = (0..ADMIN_CONNECTIONS_MAX + 20)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        assert_eq!(exchange(addr, b"GET /healthz HTTP/1.0\r\n\r\n").0, 200);
        // The oldest half-sent head made room: finishing it now gets no reply.
        let _ = oldest.write_all(b"ics HTTP/1.0\r\n\r\n");
        oldest
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = Vec::new();
        let _ = oldest.read_to_end(&mut buf);
        assert!(buf.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
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
            None,
            None,
            Control::off(),
        );
        assert!(r.is_err());
    }

    #[test]
    fn control_needs_the_token_and_the_read_only_routes_do_not() {
        let mut st = state(false, fixture());
        let plain = |m: &str, t: &str| format!("{m} {t} HTTP/1.1\r\nHost: a\r\n\r\n");
        for (m, t) in [
            ("POST", "/cache/purge?prefix=/"),
            ("POST", "/cache/pin?target=/a&until=1"),
            ("POST", "/cache/prefill?list=/etc/passwd"),
            ("POST", "/cache/prefill/begin"),
            ("GET", "/cache/prefill"),
            ("GET", "/cache/object?target=/a"),
            ("HEAD", "/cache/object?target=/a"),
            ("GET", "/cache/purge"),
            ("GET", "/cache"),
            ("GET", "/cache/anything-new"),
        ] {
            let r = respond(plain(m, t).as_bytes(), &st);
            assert_eq!(r.status, 401, "{m} {t}");
            assert!(
                r.extra_headers.starts_with("WWW-Authenticate: Bearer"),
                "{m} {t}"
            );
            let wrong = format!(
                "{m} {t} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}x\r\n\r\n",
                &TOKEN[1..]
            );
            let r = respond(wrong.as_bytes(), &st);
            assert_eq!(r.status, 401, "{m} {t}");
            assert!(r.extra_headers.contains("invalid_token"), "{m} {t}");
            assert_ne!(respond(&with_token(m, t), &st).status, 401, "{m} {t}");
        }
        assert!(st.gate.refused(auth::Refusal::NoCredential) >= 10);
        assert_eq!(
            respond(plain("GET", "/metrics").as_bytes(), &st).status,
            200
        );
        assert_eq!(
            respond(plain("GET", "/healthz").as_bytes(), &st).status,
            200
        );
        // The refusals are on /metrics.
        let r = respond(plain("GET", "/metrics").as_bytes(), &st);
        let s = parse_exposition(&r.body).unwrap();
        let refused = |reason| {
            find(
                &s,
                "shardline_admin_refused_total",
                Some(("reason", reason)),
            )
            .unwrap()
            .value
        };
        assert_eq!(refused("no_credential"), 10.0);
        assert_eq!(refused("bad_credential"), 10.0);
        assert_eq!(refused("control_off"), 0.0);
        // Without a token file control is off: 403, whatever the request carries.
        st.gate = auth::Gate::new(Arc::new(auth::TokenSlot::new(None)), 1000);
        let r = respond(&with_token("POST", "/cache/purge?path=/a"), &st);
        assert_eq!(r.status, 403);
        assert!(r.body.contains("admin_token_file"), "{}", r.body);
        assert_eq!(st.gate.refused(auth::Refusal::ControlOff), 1);
        assert_eq!(
            respond(plain("GET", "/healthz").as_bytes(), &st).status,
            200
        );
    }

    #[test]
    fn over_the_rate_control_gets_429_and_the_read_only_routes_do_not() {
        let mut st = state(false, fixture());
        let token = auth::TokenSlot::new(Some(auth::AdminToken::new(TOKEN.into())));
        // One a second: a slow test machine cannot earn a second turn within the loop.
        st.gate = auth::Gate::new(Arc::new(token), 1);
        let statuses: Vec<u16> = (0..10)
            .map(|_| respond(&with_token("GET", "/cache/prefill"), &st).status)
            .collect();
        assert_eq!(
            statuses.iter().filter(|&&s| s == 429).count(),
            9,
            "{statuses:?}"
        );
        let r = respond(&with_token("GET", "/cache/prefill"), &st);
        assert_eq!((r.status, r.extra_headers), (429, "Retry-After: 1\r\n"));
        let plain = b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!((0..100).all(|_| respond(plain, &st).status == 200));
        assert_eq!(st.gate.refused(auth::Refusal::RateLimited), 10);
    }
}
