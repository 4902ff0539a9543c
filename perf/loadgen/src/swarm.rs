//! `swarm`: many connections on one thread (epoll, edge-triggered), for perf/link.sh.
//!
//! A thread per connection does not reach 10 000 connections on a 2-core box; one epoll loop
//! does. Each connection downloads `--path` in a loop over keep-alive, optionally paced by the
//! client (a token bucket on its reads), optionally with a small receive buffer, or stalled
//! (sends its GET and never reads). It measures over the window [warm-up, end) like `bulk`, and
//! tracks read gaps: how long a connection that wanted to read waited for bytes.
//!
//! With `--tls 1` every connection speaks HTTPS: the handshake runs on the same loop, the
//! token bucket paces the bytes read off the socket (records, as a NIC would see them), and
//! the plaintext they carry is what is counted as body.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

use crate::{find_crlfcrlf, group_cpu_s, group_wait_s, parse_head, pct, self_cpu_s, Args};

const AF_INET: i32 = 2;
const SOCK_STREAM: i32 = 1;
const SOCK_NONBLOCK: i32 = 0o4000;
const SOCK_CLOEXEC: i32 = 0o2000000;
const SOL_SOCKET: i32 = 1;
const SO_RCVBUF: i32 = 8;
const IPPROTO_TCP: i32 = 6;
const TCP_NODELAY: i32 = 1;
const EINPROGRESS: i32 = 115;
pub(crate) const EPOLL_CTL_ADD: i32 = 1;
pub(crate) const EPOLLIN: u32 = 0x1;
pub(crate) const EPOLLOUT: u32 = 0x4;
pub(crate) const EPOLLERR: u32 = 0x8;
pub(crate) const EPOLLHUP: u32 = 0x10;
pub(crate) const EPOLLRDHUP: u32 = 0x2000;
pub(crate) const EPOLLET: u32 = 1 << 31;

/// One read never asks for more than this (the scratch buffer every connection shares).
const SCRATCH_BYTES: usize = 256 * 1024;
/// Connects in flight at once: a burst of 10 000 SYNs would overflow the server's SYN queue
/// and turn into 1 s retransmits that measure the ramp, not the server.
const CONNECTS_IN_FLIGHT_MAX: usize = 256;
/// Events taken per epoll_wait.
const EVENTS_MAX: usize = 1024;
/// The loop wakes at least this often (stop file, window edges).
const LOOP_TICK_MS: u64 = 50;
/// Wait before a failed connection is opened again.
const RECONNECT_DELAY_MS: u64 = 20;
/// Shortest pacing sleep: a wait rounded down to zero would fire in the same loop turn, find
/// the bucket a hair short again and spin forever with the same clock reading.
const PACE_WAIT_MIN_US: u64 = 1000;

#[repr(C)]
struct SockaddrIn {
    family: u16,
    port_be: u16,
    addr_be: [u8; 4],
    zero: [u8; 8],
}

#[cfg_attr(target_arch = "x86_64", repr(C, packed))]
#[cfg_attr(not(target_arch = "x86_64"), repr(C))]
#[derive(Clone, Copy)]
pub(crate) struct EpollEvent {
    pub(crate) events: u32,
    pub(crate) data: u64,
}

extern "C" {
    fn socket(domain: i32, ty: i32, proto: i32) -> i32;
    fn connect(fd: i32, addr: *const SockaddrIn, len: u32) -> i32;
    fn setsockopt(fd: i32, level: i32, name: i32, val: *const i32, len: u32) -> i32;
    pub(crate) fn epoll_create1(flags: i32) -> i32;
    pub(crate) fn epoll_ctl(epfd: i32, op: i32, fd: i32, ev: *mut EpollEvent) -> i32;
    pub(crate) fn epoll_wait(epfd: i32, evs: *mut EpollEvent, max: i32, timeout_ms: i32) -> i32;
}

fn set_int_opt(fd: i32, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: `v` lives across the call and its size is passed.
    let r = unsafe { setsockopt(fd, level, name, &v, 4) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking IPv4 socket whose connect is under way (or done); SO_RCVBUF set before
/// connect so that the window scale follows it.
pub(crate) fn start_connect(addr: &SocketAddr, rcvbuf_bytes: usize) -> io::Result<TcpStream> {
    let SocketAddr::V4(a) = addr else {
        return Err(io::Error::other("swarm supports IPv4 addresses only"));
    };
    // SAFETY: plain syscall; the descriptor is owned by the TcpStream right after.
    let fd = unsafe { socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    if rcvbuf_bytes > 0 {
        set_int_opt(fd, SOL_SOCKET, SO_RCVBUF, rcvbuf_bytes as i32)?;
    }
    set_int_opt(fd, IPPROTO_TCP, TCP_NODELAY, 1)?;
    let sa = SockaddrIn {
        family: AF_INET as u16,
        port_be: a.port().to_be(),
        addr_be: a.ip().octets(),
        zero: [0; 8],
    };
    // SAFETY: `sa` is a valid sockaddr_in for the length given.
    let r = unsafe { connect(fd, &sa, std::mem::size_of::<SockaddrIn>() as u32) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(s)
}

/// How long a paced connection holding `tokens` sleeps before reading `need` bytes at `rate`
/// bytes/s; None = read now. Sleeps until the bucket holds one full read (fewer, larger reads),
/// never for less than PACE_WAIT_MIN_US, and allows one byte of float slack so that a timer that
/// is due never finds the bucket a hair short.
fn pace_wait(tokens: f64, need: f64, rate: f64) -> Option<Duration> {
    let need = (need - 1.0).max(1.0);
    if tokens >= need {
        return None;
    }
    Some(
        Duration::from_secs_f64((need - tokens) / rate)
            .max(Duration::from_micros(PACE_WAIT_MIN_US)),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Waiting to be (re)connected.
    Idle,
    Connecting,
    /// TLS handshake under way (`--tls 1`).
    Handshaking,
    Head,
    Body,
    /// Stall mode: request sent, never read again.
    Stalled,
}

struct Conn {
    s: Option<TcpStream>,
    /// The connection's TLS (`--tls 1`).
    tls: Option<Box<rustls::ClientConnection>>,
    state: State,
    head: Vec<u8>,
    body_left: u64,
    close_after: bool,
    tokens: f64,
    refilled: Instant,
    /// In the timer heap, waiting for tokens.
    throttled: bool,
    /// Edge-triggered: the last read did not end in EAGAIN.
    readable: bool,
    /// When this connection last got bytes, or started to want them (request sent, tokens
    /// refilled): a read gap runs from here to the next read.
    want_since: Instant,
    bytes: u64,
    window_start_bytes: u64,
    gapped_in_window: bool,
    ever_established: bool,
    /// Generation: a timer for an older socket of this slot is ignored.
    gen: u32,
}

struct Cfg {
    addr: SocketAddr,
    request: Vec<u8>,
    expect_len: Option<u64>,
    rate_bytes_per_s: f64,
    bucket_bytes: f64,
    read_max_bytes: usize,
    rcvbuf_bytes: usize,
    stall: bool,
    gap_threshold: Duration,
}

struct Stats {
    errors: u64,
    first_error: Option<String>,
    responses: u64,
    window_responses: u64,
    max_gap: Duration,
    measuring: bool,
    closed_by_server: u64,
}

struct Swarm {
    cfg: Cfg,
    conns: Vec<Conn>,
    epfd: i32,
    /// (when, slot, generation): connections waiting for tokens or for a reconnect.
    timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    /// Slots waiting for a connect slot, in order.
    connect_queue: std::collections::VecDeque<usize>,
    connecting: usize,
    scratch: Vec<u8>,
    st: Stats,
}

impl Swarm {
    fn error(&mut self, k: usize, e: impl ToString) {
        self.st.errors += 1;
        self.st.first_error.get_or_insert_with(|| e.to_string());
        self.drop_conn(k);
        if !self.cfg.stall {
            let c = &mut self.conns[k];
            c.state = State::Idle;
            self.timers.push(Reverse((
                Instant::now() + Duration::from_millis(RECONNECT_DELAY_MS),
                k,
                c.gen,
            )));
        }
    }

    fn drop_conn(&mut self, k: usize) {
        let c = &mut self.conns[k];
        if c.state == State::Connecting {
            self.connecting -= 1;
        }
        c.s = None;
        c.tls = None;
        c.state = State::Idle;
        c.throttled = false;
        c.gen = c.gen.wrapping_add(1);
    }

    /// Writes what rustls has for the server (a ClientHello, a Finished, a request's records);
    /// the socket takes these few hundred bytes whole.
    fn tls_flush(&mut self, k: usize) -> Result<(), String> {
        let c = &mut self.conns[k];
        let (Some(tls), Some(s)) = (c.tls.as_mut(), c.s.as_mut()) else {
            return Ok(());
        };
        while tls.wants_write() {
            match tls.write_tls(s) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(format!("TLS write: {e}")),
            }
        }
        Ok(())
    }

    /// Handshake bytes arrived: feed rustls; once it is done, the request goes out.
    fn handshake_step(&mut self, k: usize, now: Instant) {
        loop {
            let c = &mut self.conns[k];
            let (Some(tls), Some(s)) = (c.tls.as_mut(), c.s.as_mut()) else {
                return;
            };
            match tls.read_tls(s) {
                Ok(0) => return self.error(k, "connection closed during the TLS handshake"),
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        return self.error(k, format!("TLS handshake: {e}"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return self.error(k, format!("TLS read: {e}")),
            }
        }
        if let Err(e) = self.tls_flush(k) {
            return self.error(k, e);
        }
        if !self.conns[k]
            .tls
            .as_ref()
            .is_some_and(|t| t.is_handshaking())
        {
            self.send_request(k, now);
            self.conns[k].readable = true;
            self.service(k, now);
        }
    }

    fn open(&mut self, k: usize) {
        match start_connect(&self.cfg.addr, self.cfg.rcvbuf_bytes) {
            Ok(s) => {
                let c = &mut self.conns[k];
                let mut ev = EpollEvent {
                    events: EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                    data: k as u64,
                };
                // SAFETY: valid epoll fd and socket fd; `ev` outlives the call.
                let r = unsafe { epoll_ctl(self.epfd, EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    self.error(k, format!("epoll_ctl: {e}"));
                    return;
                }
                c.s = Some(s);
                c.state = State::Connecting;
                c.head.clear();
                c.readable = false;
                self.connecting += 1;
            }
            Err(e) => self.error(k, format!("connect: {e}")),
        }
    }

    fn send_request(&mut self, k: usize, now: Instant) {
        let c = &mut self.conns[k];
        if let Some(tls) = c.tls.as_mut() {
            if let Err(e) = tls.writer().write_all(&self.cfg.request) {
                return self.error(k, format!("TLS request: {e}"));
            }
            if let Err(e) = self.tls_flush(k) {
                return self.error(k, e);
            }
            let c = &mut self.conns[k];
            c.state = if self.cfg.stall {
                State::Stalled
            } else {
                State::Head
            };
            c.head.clear();
            c.want_since = now;
            return;
        }
        let s = c.s.as_mut().expect("connected");
        // A fresh (or just drained) socket takes a ~100-byte request whole.
        match s.write(&self.cfg.request) {
            Ok(n) if n == self.cfg.request.len() => {
                c.state = if self.cfg.stall {
                    State::Stalled
                } else {
                    State::Head
                };
                c.head.clear();
                c.want_since = now;
            }
            Ok(_) => self.error(k, "short write of the request"),
            Err(e) => self.error(k, format!("send request: {e}")),
        }
    }

    fn on_event(&mut self, k: usize, events: u32, now: Instant) {
        let state = self.conns[k].state;
        match state {
            State::Idle => {}
            State::Connecting => {
                if events & (EPOLLOUT | EPOLLERR | EPOLLHUP) == 0 {
                    return;
                }
                let s = self.conns[k].s.as_ref().expect("connecting");
                match s.take_error() {
                    Ok(None) if events & (EPOLLERR | EPOLLHUP) == 0 => {}
                    Ok(Some(e)) | Err(e) => return self.error(k, format!("connect: {e}")),
                    Ok(None) => return self.error(k, "connect: hang-up"),
                }
                self.connecting -= 1;
                self.conns[k].ever_established = true;
                self.conns[k].state = State::Idle;
                if let Some((cfg, name)) = crate::tls::client() {
                    match rustls::ClientConnection::new(cfg.clone(), name.clone()) {
                        Ok(t) => self.conns[k].tls = Some(Box::new(t)),
                        Err(e) => return self.error(k, format!("TLS: {e}")),
                    }
                    self.conns[k].state = State::Handshaking;
                    if let Err(e) = self.tls_flush(k) {
                        return self.error(k, e);
                    }
                    if events & EPOLLIN != 0 {
                        self.handshake_step(k, now);
                    }
                    return;
                }
                self.send_request(k, now);
                if events & EPOLLIN != 0 {
                    self.conns[k].readable = true;
                }
                self.service(k, now);
            }
            State::Handshaking => {
                if events & (EPOLLERR | EPOLLHUP) != 0 && events & EPOLLIN == 0 {
                    return self.error(k, "connection lost during the TLS handshake");
                }
                if events & (EPOLLIN | EPOLLRDHUP) != 0 {
                    self.handshake_step(k, now);
                }
            }
            State::Stalled => {
                if events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP) != 0 {
                    // The server gave up on us (send timeout, reset): that is its defence.
                    self.st.closed_by_server += 1;
                    self.drop_conn(k);
                }
            }
            State::Head | State::Body => {
                if events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP) != 0 {
                    self.conns[k].readable = true;
                    self.service(k, now);
                }
            }
        }
    }

    /// Reads what the token bucket allows; arms a timer when it runs dry.
    fn service(&mut self, k: usize, now: Instant) {
        let paced = self.cfg.rate_bytes_per_s > 0.0;
        loop {
            let c = &mut self.conns[k];
            if !matches!(c.state, State::Head | State::Body) || !c.readable || c.throttled {
                return;
            }
            let mut allow = self.cfg.read_max_bytes.min(SCRATCH_BYTES);
            if paced {
                let dt = now.saturating_duration_since(c.refilled).as_secs_f64();
                c.tokens = (c.tokens + dt * self.cfg.rate_bytes_per_s).min(self.cfg.bucket_bytes);
                c.refilled = now;
                let need = self.cfg.bucket_bytes.min(allow as f64);
                if let Some(wait) = pace_wait(c.tokens, need, self.cfg.rate_bytes_per_s) {
                    c.throttled = true;
                    self.timers.push(Reverse((now + wait, k, c.gen)));
                    return;
                }
                allow = allow.min(c.tokens as usize);
            }
            if c.state == State::Body {
                allow = allow.min(c.body_left.max(1) as usize);
            }
            let s = c.s.as_mut().expect("open");
            if let Some(tls) = c.tls.as_mut() {
                // Records off the socket (what the bucket paces), then their plaintext.
                let got = match tls.read_tls(&mut Read::by_ref(s).take(allow as u64)) {
                    Ok(0) => Ok(0),
                    Ok(n) => match tls.process_new_packets() {
                        Ok(_) => Ok(n),
                        Err(e) => return self.error(k, format!("TLS: {e}")),
                    },
                    Err(e) => Err(e),
                };
                let wire = match got {
                    Ok(0) => {
                        let what = if c.state == State::Head {
                            "connection closed before a response head".to_string()
                        } else {
                            format!("connection closed with {} body bytes missing", c.body_left)
                        };
                        return self.error(k, what);
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        c.readable = false;
                        return;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return self.error(k, format!("read: {e}")),
                };
                let gap = now.saturating_duration_since(c.want_since);
                if self.st.measuring {
                    self.st.max_gap = self.st.max_gap.max(gap);
                    if gap > self.cfg.gap_threshold {
                        c.gapped_in_window = true;
                    }
                }
                c.want_since = now;
                if paced {
                    c.tokens -= wire as f64;
                }
                loop {
                    let c = &mut self.conns[k];
                    let tls = c.tls.as_mut().expect("TLS");
                    let n = match tls.reader().read(&mut self.scratch) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if let Err(e) = self.consume(k, n, now) {
                        return self.error(k, e);
                    }
                    if self.conns[k].tls.is_none() {
                        // The response ended the connection (Connection: close).
                        return;
                    }
                }
                continue;
            }
            match s.read(&mut self.scratch[..allow]) {
                Ok(0) => {
                    let what = if c.state == State::Head {
                        "connection closed before a response head".to_string()
                    } else {
                        format!("connection closed with {} body bytes missing", c.body_left)
                    };
                    return self.error(k, what);
                }
                Ok(n) => {
                    let gap = now.saturating_duration_since(c.want_since);
                    if self.st.measuring {
                        self.st.max_gap = self.st.max_gap.max(gap);
                        if gap > self.cfg.gap_threshold {
                            c.gapped_in_window = true;
                        }
                    }
                    c.want_since = now;
                    if paced {
                        c.tokens -= n as f64;
                    }
                    if let Err(e) = self.consume(k, n, now) {
                        return self.error(k, e);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.readable = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.error(k, format!("read: {e}")),
            }
        }
    }

    /// Accounts `n` bytes just read into the scratch buffer.
    fn consume(&mut self, k: usize, n: usize, now: Instant) -> Result<(), String> {
        let c = &mut self.conns[k];
        let mut body = n as u64;
        if c.state == State::Head {
            c.head.extend_from_slice(&self.scratch[..n]);
            let Some(p) = find_crlfcrlf(&c.head) else {
                if c.head.len() > crate::HEAD_MAX {
                    return Err("response head over 64 KiB".into());
                }
                return Ok(());
            };
            let text =
                std::str::from_utf8(&c.head[..p]).map_err(|_| "response head is not UTF-8")?;
            let h = parse_head(text).map_err(|e| e.to_string())?;
            if h.status != 200 {
                return Err(format!("status {}", h.status));
            }
            let len = h.content_length.ok_or("no Content-Length")?;
            if let Some(e) = self.cfg.expect_len {
                if len != e {
                    return Err(format!("Content-Length {len}, expected {e}"));
                }
            }
            body = (c.head.len() - p - 4) as u64;
            c.head.clear();
            c.state = State::Body;
            c.body_left = len;
            c.close_after = h.close;
        }
        if body > c.body_left {
            return Err("more bytes than the response holds".into());
        }
        c.body_left -= body;
        c.bytes += body;
        if c.state == State::Body && c.body_left == 0 {
            self.st.responses += 1;
            if self.st.measuring {
                self.st.window_responses += 1;
            }
            if c.close_after {
                self.drop_conn(k);
                self.connect_queue.push_back(k);
            } else {
                self.send_request(k, now);
            }
        }
        Ok(())
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, k, gen))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let c = &mut self.conns[k];
            if c.gen != gen {
                continue;
            }
            match c.state {
                State::Idle => self.connect_queue.push_back(k),
                State::Head | State::Body if c.throttled => {
                    c.throttled = false;
                    // From now on the client wants bytes: a gap starts here, not at the last read.
                    c.want_since = now;
                    self.service(k, now);
                }
                _ => {}
            }
        }
    }
}

/// `swarm --addr A --path U --conns N --duration-s D [--warmup-s W] [--rate-bytes-per-s R]
/// [--pace-tick-ms T] [--read-bytes B] [--rcvbuf-bytes K] [--stall 1] [--pgid G]
/// [--expect-len L] [--gap-ms 1000] [--ready-file F] [--stop-file F]`
pub fn cmd_swarm(a: &Args) {
    let addr = crate::resolve(&a.str("addr"));
    let path = a.str("path");
    let n = a.u64("conns") as usize;
    let duration = a.f64("duration-s");
    let warmup = a.f64_or("warmup-s", 1.0);
    let rate = a.f64_or("rate-bytes-per-s", 0.0);
    let tick_ms = a.f64_or("pace-tick-ms", 200.0);
    let read_max = a.opt_u64("read-bytes").unwrap_or(SCRATCH_BYTES as u64) as usize;
    let rcvbuf = a.opt_u64("rcvbuf-bytes").unwrap_or(0) as usize;
    let stall = a.opt_u64("stall").unwrap_or(0) != 0;
    let pgid = a.opt_u64("pgid").map(|g| g as u32);
    let gap_ms = a.f64_or("gap-ms", 1000.0);
    let ready_file = a.opt_str("ready-file");
    let stop_file = a.opt_str("stop-file");
    if n == 0 || read_max == 0 {
        crate::die("--conns and --read-bytes must be at least 1");
    }
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: shardline-loadgen-swarm\r\n\r\n",
        addr.ip()
    )
    .into_bytes();
    // Bucket: what the rate earns in one pacing tick, at least one read byte.
    let bucket = (rate * tick_ms / 1000.0).max(1.0);
    // SAFETY: plain syscall.
    let epfd = unsafe { epoll_create1(0o2000000) };
    if epfd < 0 {
        crate::die(&format!("epoll_create1: {}", io::Error::last_os_error()));
    }
    let t_start = Instant::now();
    let mut sw = Swarm {
        cfg: Cfg {
            addr,
            request,
            expect_len: a.opt_u64("expect-len"),
            rate_bytes_per_s: rate,
            bucket_bytes: bucket,
            read_max_bytes: read_max,
            rcvbuf_bytes: rcvbuf,
            stall,
            gap_threshold: Duration::from_secs_f64(gap_ms / 1000.0),
        },
        conns: (0..n)
            .map(|_| Conn {
                s: None,
                tls: None,
                state: State::Idle,
                head: Vec::new(),
                body_left: 0,
                close_after: false,
                tokens: bucket,
                refilled: t_start,
                throttled: false,
                readable: false,
                want_since: t_start,
                bytes: 0,
                window_start_bytes: 0,
                gapped_in_window: false,
                ever_established: false,
                gen: 0,
            })
            .collect(),
        epfd,
        timers: BinaryHeap::new(),
        connect_queue: (0..n).collect(),
        connecting: 0,
        scratch: vec![0u8; SCRATCH_BYTES],
        st: Stats {
            errors: 0,
            first_error: None,
            responses: 0,
            window_responses: 0,
            max_gap: Duration::ZERO,
            measuring: false,
            closed_by_server: 0,
        },
    };
    let end = t_start + Duration::from_secs_f64(duration);
    let window_at = t_start + Duration::from_secs_f64(warmup.min(duration));
    let mut ramp_s: Option<f64> = None;
    let mut ready_written = false;
    let mut window: Option<(Instant, f64, Option<f64>, Option<f64>)> = None;
    let mut events = vec![EpollEvent { events: 0, data: 0 }; EVENTS_MAX];
    loop {
        let now = Instant::now();
        if now >= end
            || stop_file
                .as_deref()
                .is_some_and(|f| std::path::Path::new(f).exists())
        {
            break;
        }
        if window.is_none() && now >= window_at {
            sw.st.measuring = true;
            for c in &mut sw.conns {
                c.window_start_bytes = c.bytes;
            }
            window = Some((
                Instant::now(),
                self_cpu_s(),
                pgid.map(group_cpu_s),
                pgid.map(group_wait_s),
            ));
        }
        while sw.connecting < CONNECTS_IN_FLIGHT_MAX {
            let Some(k) = sw.connect_queue.pop_front() else {
                break;
            };
            sw.open(k);
        }
        if ramp_s.is_none() && sw.connecting == 0 && sw.connect_queue.is_empty() {
            ramp_s = Some(t_start.elapsed().as_secs_f64());
        }
        if !ready_written && ramp_s.is_some() {
            if let Some(f) = &ready_file {
                let up = sw.conns.iter().filter(|c| c.s.is_some()).count();
                let _ = std::fs::write(f, format!("established={up}\n"));
            }
            ready_written = true;
        }
        sw.fire_timers(Instant::now());
        let next_timer = sw.timers.peek().map(|Reverse((t, _, _))| *t);
        let mut wait = Duration::from_millis(LOOP_TICK_MS);
        if let Some(t) = next_timer {
            wait = wait.min(t.saturating_duration_since(Instant::now()));
        }
        if window.is_none() {
            wait = wait.min(window_at.saturating_duration_since(Instant::now()));
        }
        let timeout_ms = (wait.as_micros().div_ceil(1000)) as i32;
        // SAFETY: `events` has EVENTS_MAX entries.
        let got = unsafe { epoll_wait(epfd, events.as_mut_ptr(), EVENTS_MAX as i32, timeout_ms) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            crate::die(&format!("epoll_wait: {e}"));
        }
        let now = Instant::now();
        for ev in &events[..got as usize] {
            let (k, evs) = (ev.data as usize, ev.events);
            sw.on_event(k, evs, now);
        }
    }
    let now = Instant::now();
    let me1 = self_cpu_s();
    let c1 = pgid.map(group_cpu_s);
    let w1 = pgid.map(group_wait_s);
    let (w_t0, me0, c0, wt0) = window.unwrap_or((now, me1, c1, w1));
    let secs = now.saturating_duration_since(w_t0).as_secs_f64();
    // A connection still waiting for bytes at the end has an open gap: count it too.
    for c in &mut sw.conns {
        if matches!(c.state, State::Head | State::Body) && !c.throttled {
            let gap = now.saturating_duration_since(c.want_since);
            sw.st.max_gap = sw.st.max_gap.max(gap);
            if gap > sw.cfg.gap_threshold {
                c.gapped_in_window = true;
            }
        }
    }
    let mut per: Vec<f64> = sw
        .conns
        .iter()
        .filter(|c| c.ever_established)
        .map(|c| (c.bytes - c.window_start_bytes) as f64)
        .collect();
    let bytes: f64 = per.iter().sum();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let established = sw.conns.iter().filter(|c| c.ever_established).count();
    let open_now = sw.conns.iter().filter(|c| c.s.is_some()).count();
    println!("conns_wanted={n}");
    println!("conns_established={established}");
    println!("conns_open_at_end={open_now}");
    if let Some(r) = ramp_s {
        println!("ramp_s={r:.2}");
    }
    println!("window_s={secs:.3}");
    println!("window_bytes={bytes:.0}");
    if secs > 0.0 {
        println!("bytes_per_s={:.0}", bytes / secs);
    }
    println!("responses_completed={}", sw.st.window_responses);
    println!("errors={}", sw.st.errors);
    println!("closed_by_server={}", sw.st.closed_by_server);
    println!(
        "max_read_gap_ms={:.1}",
        sw.st.max_gap.as_secs_f64() * 1000.0
    );
    println!(
        "conns_gap_over_threshold={}",
        sw.conns.iter().filter(|c| c.gapped_in_window).count()
    );
    println!("gap_threshold_ms={gap_ms:.0}");
    if let (Some(c0), Some(c1)) = (c0, c1) {
        println!("server_cpu_s={:.3}", c1 - c0);
    }
    if let (Some(w0), Some(w1)) = (wt0, w1) {
        println!("server_runqueue_wait_s={:.3}", w1 - w0);
    }
    println!("client_cpu_s={:.3}", me1 - me0);
    if !per.is_empty() && secs > 0.0 {
        let mbps = |b: f64| b / secs / 1e6;
        println!("conn_mb_per_s_min={:.3}", mbps(per[0]));
        println!("conn_mb_per_s_p50={:.3}", mbps(pct(&per, 50.0)));
        println!("conn_mb_per_s_max={:.3}", mbps(per[per.len() - 1]));
        let sq: f64 = per.iter().map(|x| x * x).sum();
        if sq > 0.0 {
            println!(
                "jain_fairness={:.3}",
                bytes * bytes / (per.len() as f64 * sq)
            );
        }
    }
    if let Some(e) = &sw.st.first_error {
        println!("first_error={e}");
    }
    let _ = io::stdout().flush();
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_never_sleeps_zero_and_reads_once_the_bucket_is_full() {
        let rate = 1_500_000.0;
        let bucket = 300_000.0;
        // Empty bucket: sleep about one tick.
        let w = pace_wait(0.0, bucket, rate).unwrap();
        assert!((w.as_secs_f64() - 0.2).abs() < 0.001, "{w:?}");
        // A hair short of full (float rounding at the due time): read now, no spin.
        assert_eq!(pace_wait(bucket - 0.5, bucket, rate), None);
        // Short by less than the minimum sleep: sleep the minimum, never zero.
        let w = pace_wait(bucket - 1.0001, bucket, rate).unwrap();
        assert_eq!(w, Duration::from_micros(PACE_WAIT_MIN_US));
    }

    #[test]
    fn one_byte_per_second_reader_wakes_once_a_second() {
        // Bucket of one byte: wait for a whole token, not 1 ms slices.
        let w = pace_wait(0.0, 1.0, 1.0).unwrap();
        assert_eq!(w, Duration::from_secs(1));
        assert_eq!(pace_wait(1.0, 1.0, 1.0), None);
        let w = pace_wait(0.9999999, 1.0, 1.0).unwrap();
        assert_eq!(w, Duration::from_micros(PACE_WAIT_MIN_US));
    }
}
