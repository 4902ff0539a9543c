//! loadgen: the precise half of `perf/bench.sh`. std only but for rustls: every subcommand
//! speaks HTTPS with `--tls 1` (`tls.rs` lists the TLS options).
//!
//! Subcommands (every one prints `key=value` lines that bench.sh parses):
//!   gen    --path P --size N --seed S          write N bytes of the deterministic stream
//!   cpu    --pgid G                            utime+stime (s) summed over process group G
//!   bulk   --addr A --path U --conns C --duration-s D --warmup-s W [--pgid G] [--expect-len N]
//!          C keep-alive connections download U in a loop; bytes, server CPU and our own CPU
//!          are measured over the window [W, D) only (steady state, no connect or drain).
//!   ttfb   --addr A --path U --rate R --duration-s D [--delay-s S] [--seed S --expect-len N]
//!          one request per 1/R s, each on a fresh connection, open loop (a slow answer does
//!          not delay the next request); time to first byte is measured from before connect().
//!          Each probe also reports its own thread's run-queue wait over that interval
//!          (/proc/thread-self/schedstat): time the *client* was runnable but not running,
//!          which a busy, unpinned client adds to what it measures; and the CPU it was on.
//!   get    --addr A --path U [--range START-END] [--seed S] [--expect-len N]
//!          one GET (END inclusive, as in HTTP); the body is checked against the stream.
//!   idle   --addr A --path U --conns N [--pid P] [--settle-s S] [--ready-file R --stop-file F]
//!          opens N keep-alive connections, each sends one request and reads its response,
//!          then all stay idle; server RSS and fd count of P before and after; with the files,
//!          writes R once idle and holds the connections until F exists (the caller counts
//!          them on the server's side), then counts those the server has not closed.
//!   swarm  --addr A --path U --conns N --duration-s D [--warmup-s W] [--rate-bytes-per-s R]
//!          [--pace-tick-ms T] [--read-bytes B] [--rcvbuf-bytes K] [--stall 1] [--pgid G]
//!          [--expect-len L] [--gap-ms 1000] [--ready-file F] [--stop-file F]
//!          N connections on one epoll thread (perf/link.sh): download U in a loop, each paced
//!          by a token bucket of R bytes/s (0 = as fast as possible), or stalled (GET sent, never
//!          read); read gaps over --gap-ms while a connection wanted bytes are counted.
//!   fetch  --addr A --clients N --file-path U --file-seed S --file-len L --range-path U
//!          --range START-END --range-seed S [--timeout-s T]
//!          N fresh clients at once, each fetches a file and then a range (verified): times.
//!   handshakes --addr A --conns C --duration-s D [--warmup-s W] [--path U] [--rate R]
//!          [--pgid G] (with --tls 1): C workers connect, complete a TLS handshake, GET U (if
//!          given) and close, over and over (full handshakes with --tls-resume 0, resumed
//!          ones after the first with 1); with --rate, attempts start at R/s in all (a flood:
//!          failed attempts count too). Completed handshakes/s and server CPU per handshake.
//!   flood  --addr A --rate R --duration-s D [--warmup-s W] [--hold-ms H] (with --tls 1): an
//!          open loop of R connections/s, each replaying one ClientHello (no client crypto)
//!          and held until the server answers with its flight or H ms pass (`flood.rs`).
//!   ttfb ... --keepalive 1: the probes share one kept-alive connection (reconnected if
//!          closed) instead of a fresh connection each.
//!   trickle --addr A --path U --conns C --head-bytes H --tail-bytes T --gap-ms G: C
//!          connections send the first H-T bytes of an H-byte head at once, then the last T one
//!          byte per G ms each (`trickle.rs`); every one must get its 200. [--spread 1]: each
//!          connection's bytes at its own phase of the gap, not all in one burst.
//!   misses --addr A --rate R --duration-s D [--conns 8] [--prefix /nx/]: R requests/s in all
//!          for paths that do not exist, never the same twice, on C keep-alive connections
//!          (`misses.rs`); every answer must be a 404.
//!   traffic-gen --dir D [--seed S] [--scale F] / traffic --addr A --dir D [--seed S]
//!          [--scale F] [--clients C]: the platforms' mixed traffic (`traffic.rs`): writes the
//!          catalogue an origin serves, then plays the seeded trace against A, checking every
//!          body byte.
//!   hellos --addr A --conns N --announce-bytes X --send-bytes B --hold-s S: N connections
//!          each send the first B bytes of a ClientHello announcing X bytes, then stall for S s
//!          (`hellos.rs`); how many the server still holds open at the end.
//!
//! Fixture content: byte `o` of a file made with seed `s` is byte `o % 8` (little endian) of
//! `splitmix64(s, o / 8)`, so any range of any fixture can be verified without reading the file
//! (reading it would put it in the page cache, which workload 5 measures).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod fetch;
mod flood;
mod hellos;
mod misses;
mod swarm;
mod tls;
mod traffic;
mod trickle;

use tls::Stream;

const HEAD_MAX: usize = 64 * 1024;
const READ_BUF: usize = 1 << 20;

extern "C" {
    fn sysconf(name: i32) -> i64;
    fn sched_getcpu() -> i32;
}

/// Run-queue wait of the calling thread so far, in ns (schedstat field 2); 0 when unreadable.
fn thread_runqueue_wait_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// The CPU the calling thread runs on.
fn current_cpu() -> i32 {
    // SAFETY: sched_getcpu takes no arguments and only returns a number.
    unsafe { sched_getcpu() }
}
const SC_CLK_TCK: i32 = 2;

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no memory side effects.
    let t = unsafe { sysconf(SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

// ---------------------------------------------------------------- fixture stream

fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn stream_byte(seed: u64, off: u64) -> u8 {
    word(seed, off / 8).to_le_bytes()[(off % 8) as usize]
}

/// Checks received bytes against the stream, from a start offset on.
struct Verifier {
    seed: u64,
    off: u64,
    bad_at: Option<u64>,
}

impl Verifier {
    fn new(seed: u64, off: u64) -> Self {
        Verifier {
            seed,
            off,
            bad_at: None,
        }
    }
    fn feed(&mut self, mut data: &[u8]) {
        if self.bad_at.is_some() {
            self.off += data.len() as u64;
            return;
        }
        while !data.is_empty() && !self.off.is_multiple_of(8) {
            if data[0] != stream_byte(self.seed, self.off) {
                self.bad_at = Some(self.off);
            }
            data = &data[1..];
            self.off += 1;
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let got = u64::from_le_bytes(c.try_into().unwrap());
            if got != word(self.seed, self.off / 8) && self.bad_at.is_none() {
                let exp = word(self.seed, self.off / 8).to_le_bytes();
                let k = c
                    .iter()
                    .zip(exp.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                self.bad_at = Some(self.off + k as u64);
            }
            self.off += 8;
        }
        for &b in chunks.remainder() {
            if b != stream_byte(self.seed, self.off) && self.bad_at.is_none() {
                self.bad_at = Some(self.off);
            }
            self.off += 1;
        }
    }
}

fn cmd_gen(a: &Args) {
    let path = a.str("path");
    let size = a.u64("size");
    let seed = a.u64("seed");
    let mut f =
        std::fs::File::create(&path).unwrap_or_else(|e| die(&format!("create {path}: {e}")));
    let block: u64 = 8 << 20;
    let mut buf = vec![0u8; block as usize];
    let mut off = 0u64;
    while off < size {
        let n = block.min(size - off);
        for (k, c) in buf[..n as usize].chunks_mut(8).enumerate() {
            let w = word(seed, off / 8 + k as u64).to_le_bytes();
            c.copy_from_slice(&w[..c.len()]);
        }
        f.write_all(&buf[..n as usize])
            .unwrap_or_else(|e| die(&format!("write {path}: {e}")));
        off += n;
    }
    f.sync_all()
        .unwrap_or_else(|e| die(&format!("fsync {path}: {e}")));
    println!("gen_path={path}");
    println!("gen_bytes={size}");
}

// ---------------------------------------------------------------- /proc readers

/// (pid, pgrp, utime+stime ticks) for every process.
fn proc_stats() -> Vec<(u32, u32, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((pgrp, ticks)) = parse_stat(&s) {
            out.push((pid, pgrp, ticks));
        }
    }
    out
}

/// From a /proc/PID/stat line: (pgrp, utime + stime).
fn parse_stat(s: &str) -> Option<(u32, u64)> {
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
    let pgrp = f.get(2)?.parse().ok()?;
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some((pgrp, ut + st))
}

fn group_cpu_s(pgid: u32) -> f64 {
    let ticks: u64 = proc_stats()
        .into_iter()
        .filter(|&(_, g, _)| g == pgid)
        .map(|(_, _, t)| t)
        .sum();
    ticks as f64 / clk_tck()
}

/// Seconds the threads of process group `pgid` spent waiting on a run queue (runnable but not
/// running: /proc/PID/task/TID/schedstat, second field). On a shared host this is the time other
/// work took from the server; on a dedicated one it stays near zero.
fn group_wait_s(pgid: u32) -> f64 {
    let mut ns: u64 = 0;
    for (pid, g, _) in proc_stats() {
        if g != pgid {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in rd.flatten() {
            let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
                continue;
            };
            ns += s
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

fn self_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_stat(&s))
        .map(|(_, t)| t as f64 / clk_tck())
        .unwrap_or(f64::NAN)
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

fn cmd_cpu(a: &Args) {
    let pgid = a.u64("pgid") as u32;
    println!("cpu_s={:.3}", group_cpu_s(pgid));
    println!("runqueue_wait_s={:.3}", group_wait_s(pgid));
}

// ---------------------------------------------------------------- HTTP client

struct Head {
    status: u16,
    content_length: Option<u64>,
    content_range: Option<String>,
    content_type: Option<String>,
    close: bool,
    first_byte: Instant,
}

struct Conn {
    s: Stream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Conn {
    fn connect(addr: &SocketAddr, buf_len: usize, timeout: Option<Duration>) -> io::Result<Conn> {
        let s = match timeout {
            Some(t) => TcpStream::connect_timeout(addr, t)?,
            None => TcpStream::connect(addr)?,
        };
        s.set_nodelay(true)?;
        s.set_read_timeout(timeout)?;
        s.set_write_timeout(timeout)?;
        let s = Stream::over(s)?;
        Ok(Conn {
            s,
            buf: vec![0u8; buf_len.max(HEAD_MAX)],
            start: 0,
            end: 0,
        })
    }

    fn send_get(&mut self, path: &str, range: Option<(u64, u64)>, close: bool) -> io::Result<()> {
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: shardline-loadgen\r\n");
        if let Some((a, b)) = range {
            req.push_str(&format!("Range: bytes={a}-{b}\r\n"));
        }
        if close {
            req.push_str("Connection: close\r\n");
        }
        req.push_str("\r\n");
        self.s.write_all(req.as_bytes())?;
        self.s.flush()
    }

    fn read_head(&mut self) -> io::Result<Head> {
        let mut first_byte = None;
        loop {
            if let Some(p) = find_crlfcrlf(&self.buf[self.start..self.end]) {
                let head = std::str::from_utf8(&self.buf[self.start..self.start + p])
                    .map_err(|_| bad("response head is not UTF-8"))?
                    .to_string();
                self.start += p + 4;
                let mut h = parse_head(&head)?;
                if let Some(fb) = first_byte {
                    h.first_byte = fb;
                }
                return Ok(h);
            }
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end >= HEAD_MAX {
                return Err(bad("response head over 64 KiB"));
            }
            let n = self.s.read(&mut self.buf[self.end..])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before a response head",
                ));
            }
            if first_byte.is_none() {
                first_byte = Some(Instant::now());
            }
            self.end += n;
        }
    }

    /// Consumes exactly `len` body bytes, handing each piece to `f`.
    fn read_body(&mut self, len: u64, mut f: impl FnMut(&[u8])) -> io::Result<()> {
        let mut left = len;
        let have = ((self.end - self.start) as u64).min(left) as usize;
        if have > 0 {
            f(&self.buf[self.start..self.start + have]);
            self.start += have;
            left -= have as u64;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        while left > 0 {
            debug_assert_eq!(self.start, self.end);
            let want = (self.buf.len() as u64).min(left) as usize;
            let n = self.s.read(&mut self.buf[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("connection closed with {left} of {len} body bytes missing"),
                ));
            }
            f(&self.buf[..n]);
            left -= n as u64;
        }
        Ok(())
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn find_crlfcrlf(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

fn parse_head(head: &str) -> io::Result<Head> {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(bad(&format!("bad status line {status_line:?}")));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&format!("bad status line {status_line:?}")))?;
    let mut h = Head {
        status,
        content_length: None,
        content_range: None,
        content_type: None,
        close: version == "HTTP/1.0",
        first_byte: Instant::now(),
    };
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            h.content_length = Some(
                v.parse()
                    .map_err(|_| bad(&format!("bad Content-Length {v:?}")))?,
            );
        } else if k.eq_ignore_ascii_case("content-range") {
            h.content_range = Some(v.to_string());
        } else if k.eq_ignore_ascii_case("content-type") {
            h.content_type = Some(v.to_string());
        } else if k.eq_ignore_ascii_case("connection") {
            if v.eq_ignore_ascii_case("close") {
                h.close = true;
            } else if v.eq_ignore_ascii_case("keep-alive") {
                h.close = false;
            }
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad("unexpected Transfer-Encoding in a file response"));
        }
    }
    Ok(h)
}

fn resolve(addr: &str) -> SocketAddr {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .unwrap_or_else(|| die(&format!("cannot resolve {addr}")))
}

// ---------------------------------------------------------------- bulk

struct BulkShared {
    bytes: AtomicU64,
    responses: AtomicU64,
    errors: AtomicU64,
    /// Longest gap between two reads of one in-flight response, in µs.
    max_gap_us: AtomicU64,
    measuring: AtomicBool,
    first_error: Mutex<Option<String>>,
    /// Body bytes per connection (worker), for the fairness figures.
    per_conn: Vec<AtomicU64>,
}

fn cmd_bulk(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let path = a.str("path");
    let conns = a.u64("conns") as usize;
    let duration = a.f64("duration-s");
    let warmup = a.f64_or("warmup-s", 1.0).min(duration / 2.0);
    let pgid = a.opt_u64("pgid").map(|g| g as u32);
    let expect_len = a.opt_u64("expect-len");
    let sh = Arc::new(BulkShared {
        bytes: AtomicU64::new(0),
        responses: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        max_gap_us: AtomicU64::new(0),
        measuring: AtomicBool::new(false),
        first_error: Mutex::new(None),
        per_conn: (0..conns).map(|_| AtomicU64::new(0)).collect(),
    });
    for k in 0..conns {
        let sh = sh.clone();
        let path = path.clone();
        thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || bulk_worker(k, addr, &path, expect_len, &sh))
            .expect("spawn");
    }
    let t_start = Instant::now();
    thread::sleep(Duration::from_secs_f64(warmup));
    sh.measuring.store(true, Ordering::SeqCst);
    // Time and byte counters first, CPU after: a /proc scan can wait for the CPU behind 100
    // busy workers, and that wait must not fall between the byte snapshot and the clock.
    let t0 = Instant::now();
    let b0 = sh.bytes.load(Ordering::SeqCst);
    let r0 = sh.responses.load(Ordering::SeqCst);
    let pc0: Vec<u64> = sh
        .per_conn
        .iter()
        .map(|a| a.load(Ordering::SeqCst))
        .collect();
    let c0 = pgid.map(group_cpu_s);
    let w0 = pgid.map(group_wait_s);
    let me0 = self_cpu_s();
    let end = t_start + Duration::from_secs_f64(duration);
    thread::sleep(end.saturating_duration_since(Instant::now()));
    let secs = t0.elapsed().as_secs_f64();
    let b1 = sh.bytes.load(Ordering::SeqCst);
    let r1 = sh.responses.load(Ordering::SeqCst);
    let mut pc: Vec<f64> = sh
        .per_conn
        .iter()
        .zip(&pc0)
        .map(|(a, b0)| (a.load(Ordering::SeqCst) - b0) as f64)
        .collect();
    let c1 = pgid.map(group_cpu_s);
    let w1 = pgid.map(group_wait_s);
    let me1 = self_cpu_s();
    let bytes = b1 - b0;
    println!("window_s={secs:.3}");
    println!("window_bytes={bytes}");
    println!("bytes_per_s={:.0}", bytes as f64 / secs);
    println!("responses_completed={}", r1 - r0);
    println!("errors={}", sh.errors.load(Ordering::SeqCst));
    println!(
        "max_read_gap_ms={:.1}",
        sh.max_gap_us.load(Ordering::SeqCst) as f64 / 1000.0
    );
    if let (Some(c0), Some(c1)) = (c0, c1) {
        println!("server_cpu_s={:.3}", c1 - c0);
    }
    if let (Some(w0), Some(w1)) = (w0, w1) {
        println!("server_runqueue_wait_s={:.3}", w1 - w0);
    }
    println!("client_cpu_s={:.3}", me1 - me0);
    // Fairness between connections over the window: slowest, median and fastest connection,
    // and Jain's index (1 = all equal, 1/n = one connection got everything).
    pc.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if !pc.is_empty() {
        let mbps = |b: f64| b / secs / 1e6;
        println!("conn_mb_per_s_min={:.2}", mbps(pc[0]));
        println!("conn_mb_per_s_p50={:.2}", mbps(pct(&pc, 50.0)));
        println!("conn_mb_per_s_max={:.2}", mbps(pc[pc.len() - 1]));
        let sum: f64 = pc.iter().sum();
        let sq: f64 = pc.iter().map(|x| x * x).sum();
        if sq > 0.0 {
            println!("jain_fairness={:.3}", sum * sum / (pc.len() as f64 * sq));
        }
    }
    if let Some(e) = sh.first_error.lock().unwrap().as_ref() {
        println!("first_error={e}");
    }
    // Workers are mid-download; exiting closes their sockets.
    let _ = io::stdout().flush();
    exit(0);
}

fn bulk_worker(k: usize, addr: SocketAddr, path: &str, expect_len: Option<u64>, sh: &BulkShared) {
    let mut conn: Option<Conn> = None;
    loop {
        let r = (|| -> io::Result<()> {
            if conn.is_none() {
                conn = Some(Conn::connect(
                    &addr,
                    READ_BUF,
                    Some(Duration::from_secs(30)),
                )?);
            }
            let c = conn.as_mut().unwrap();
            c.send_get(path, None, false)?;
            let h = c.read_head()?;
            if h.status != 200 {
                return Err(bad(&format!("status {} for {path}", h.status)));
            }
            let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
            if let Some(e) = expect_len {
                if len != e {
                    return Err(bad(&format!("Content-Length {len}, expected {e}")));
                }
            }
            let mut last = Instant::now();
            c.read_body(len, |d| {
                sh.bytes.fetch_add(d.len() as u64, Ordering::Relaxed);
                sh.per_conn[k].fetch_add(d.len() as u64, Ordering::Relaxed);
                let now = Instant::now();
                if sh.measuring.load(Ordering::Relaxed) {
                    let gap = (now - last).as_micros() as u64;
                    sh.max_gap_us.fetch_max(gap, Ordering::Relaxed);
                }
                last = now;
            })?;
            sh.responses.fetch_add(1, Ordering::Relaxed);
            if h.close {
                conn = None;
            }
            Ok(())
        })();
        if let Err(e) = r {
            sh.errors.fetch_add(1, Ordering::Relaxed);
            let mut fe = sh.first_error.lock().unwrap();
            if fe.is_none() {
                *fe = Some(e.to_string());
            }
            drop(fe);
            conn = None;
            thread::sleep(Duration::from_millis(20));
        }
    }
}

// ---------------------------------------------------------------- ttfb

fn cmd_ttfb(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let path = a.str("path");
    let rate = a.f64("rate");
    let duration = a.f64("duration-s");
    let delay = a.f64_or("delay-s", 0.0);
    let seed = a.opt_u64("seed");
    let expect_len = a.opt_u64("expect-len");
    let keepalive = a.opt_u64("keepalive").unwrap_or(0) != 0;
    thread::sleep(Duration::from_secs_f64(delay));
    let n = (rate * duration).floor().max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let (tx, rx) = mpsc::channel::<(u64, Result<Timing, String>)>();
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut kept: Option<Conn> = None;
    for i in 0..n {
        if keepalive {
            // One connection, probes in order (a probe that overruns its slot delays the next).
            let at = start + interval * i as u32;
            thread::sleep(at.saturating_duration_since(Instant::now()));
            let r =
                one_small_on(&mut kept, addr, &path, seed, expect_len).map_err(|e| e.to_string());
            if r.is_err() {
                kept = None;
            }
            let _ = tx.send((i, r));
            continue;
        }
        let at = start + interval * i as u32;
        thread::sleep(at.saturating_duration_since(Instant::now()));
        let tx = tx.clone();
        let path = path.clone();
        handles.push(thread::spawn(move || {
            let r = one_small(addr, &path, seed, expect_len).map_err(|e| e.to_string());
            let _ = tx.send((i, r));
        }));
    }
    drop(tx);
    for h in handles {
        let _ = h.join();
    }
    let mut all: Vec<(u64, Result<Timing, String>)> = rx.into_iter().collect();
    all.sort_by_key(|(i, _)| *i);
    let mut ms = Vec::new();
    let mut waits = Vec::new();
    let mut net = Vec::new();
    let mut on_cpu = HashMap::<i32, u64>::new();
    let mut errors = 0u64;
    let mut first_error = None;
    // Request order, for looking at when the slow ones happened:
    // "i:connect_ms/ttfb_ms/client_wait_ms@cpu".
    let mut samples = Vec::new();
    for (i, r) in &all {
        match r {
            Ok(t) => {
                ms.push(t.ttfb_ms);
                waits.push(t.client_wait_ms);
                net.push((t.ttfb_ms - t.client_wait_ms).max(0.0));
                *on_cpu.entry(t.cpu).or_default() += 1;
                samples.push(format!(
                    "{i}:{:.2}/{:.2}/{:.2}@{}",
                    t.connect_ms, t.ttfb_ms, t.client_wait_ms, t.cpu
                ));
            }
            Err(e) => {
                errors += 1;
                samples.push(format!("{i}:error"));
                first_error.get_or_insert(e.clone());
            }
        }
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("requests={n}");
    println!("ok={}", ms.len());
    println!("errors={errors}");
    if !ms.is_empty() {
        println!("ttfb_p50_ms={:.3}", pct(&ms, 50.0));
        println!("ttfb_p90_ms={:.3}", pct(&ms, 90.0));
        println!("ttfb_p99_ms={:.3}", pct(&ms, 99.0));
        println!("ttfb_max_ms={:.3}", ms[ms.len() - 1]);
        println!("over_5ms={}", ms.iter().filter(|&&v| v > 5.0).count());
        waits.sort_by(|a, b| a.partial_cmp(b).unwrap());
        net.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("client_wait_p50_ms={:.3}", pct(&waits, 50.0));
        println!("client_wait_p99_ms={:.3}", pct(&waits, 99.0));
        println!("client_wait_max_ms={:.3}", waits[waits.len() - 1]);
        println!("client_wait_sum_ms={:.3}", waits.iter().sum::<f64>());
        println!("ttfb_minus_wait_p50_ms={:.3}", pct(&net, 50.0));
        println!("ttfb_minus_wait_p99_ms={:.3}", pct(&net, 99.0));
        let mut cpus: Vec<_> = on_cpu.into_iter().collect();
        cpus.sort();
        let cpus: Vec<String> = cpus.iter().map(|(c, n)| format!("{c}:{n}")).collect();
        println!("first_byte_cpu={}", cpus.join(","));
    }
    if let Some(e) = first_error {
        println!("first_error={e}");
    }
    println!("samples={}", samples.join(" "));
}

struct Timing {
    connect_ms: f64,
    ttfb_ms: f64,
    /// Run-queue wait of the probing thread between connect() and the first byte.
    client_wait_ms: f64,
    /// CPU the probing thread ran on when the first byte arrived.
    cpu: i32,
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// One request on the kept-alive connection `kept` (opened first if there is none); time to
/// first byte is measured from the request's write (the handshake is not part of it).
fn one_small_on(
    kept: &mut Option<Conn>,
    addr: SocketAddr,
    path: &str,
    seed: Option<u64>,
    expect_len: Option<u64>,
) -> io::Result<Timing> {
    let connect_t = Instant::now();
    if kept.is_none() {
        *kept = Some(Conn::connect(
            &addr,
            HEAD_MAX,
            Some(Duration::from_secs(10)),
        )?);
    }
    let connect_ms = connect_t.elapsed().as_secs_f64() * 1000.0;
    let c = kept.as_mut().expect("connected");
    let wait0 = thread_runqueue_wait_ns();
    let t0 = Instant::now();
    c.send_get(path, None, false)?;
    let h = c.read_head()?;
    let wait1 = thread_runqueue_wait_ns();
    let cpu = current_cpu();
    let ttfb = (h.first_byte - t0).as_secs_f64() * 1000.0;
    if h.status != 200 {
        return Err(bad(&format!("status {}", h.status)));
    }
    let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
    if let Some(e) = expect_len {
        if len != e {
            return Err(bad(&format!("Content-Length {len}, expected {e}")));
        }
    }
    let mut v = seed.map(|s| Verifier::new(s, 0));
    c.read_body(len, |d| {
        if let Some(v) = v.as_mut() {
            v.feed(d)
        }
    })?;
    if h.close {
        *kept = None;
    }
    if let Some(at) = v.and_then(|v| v.bad_at) {
        return Err(bad(&format!("body differs from the fixture at byte {at}")));
    }
    Ok(Timing {
        connect_ms,
        ttfb_ms: ttfb,
        client_wait_ms: wait1.saturating_sub(wait0) as f64 / 1e6,
        cpu,
    })
}

/// One request on a fresh connection; returns time to first byte in ms (from before connect).
fn one_small(
    addr: SocketAddr,
    path: &str,
    seed: Option<u64>,
    expect_len: Option<u64>,
) -> io::Result<Timing> {
    let wait0 = thread_runqueue_wait_ns();
    let t0 = Instant::now();
    let mut c = Conn::connect(&addr, HEAD_MAX, Some(Duration::from_secs(10)))?;
    let connect_ms = t0.elapsed().as_secs_f64() * 1000.0;
    c.send_get(path, None, false)?;
    let h = c.read_head()?;
    let wait1 = thread_runqueue_wait_ns();
    let cpu = current_cpu();
    let ttfb = (h.first_byte - t0).as_secs_f64() * 1000.0;
    if h.status != 200 {
        return Err(bad(&format!("status {}", h.status)));
    }
    let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
    if let Some(e) = expect_len {
        if len != e {
            return Err(bad(&format!("Content-Length {len}, expected {e}")));
        }
    }
    let mut v = seed.map(|s| Verifier::new(s, 0));
    c.read_body(len, |d| {
        if let Some(v) = v.as_mut() {
            v.feed(d)
        }
    })?;
    if let Some(at) = v.and_then(|v| v.bad_at) {
        return Err(bad(&format!("body differs from the fixture at byte {at}")));
    }
    Ok(Timing {
        connect_ms,
        ttfb_ms: ttfb,
        client_wait_ms: wait1.saturating_sub(wait0) as f64 / 1e6,
        cpu,
    })
}

// ---------------------------------------------------------------- get

fn cmd_get(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let path = a.str("path");
    let range = a.opt_str("range").map(|r| {
        let (s, e) = r
            .split_once('-')
            .unwrap_or_else(|| die("--range wants START-END"));
        let s: u64 = s.parse().unwrap_or_else(|_| die("bad range start"));
        let e: u64 = e.parse().unwrap_or_else(|_| die("bad range end"));
        if e < s {
            die("range end before start");
        }
        (s, e)
    });
    let seed = a.opt_u64("seed");
    let expect_len = a.opt_u64("expect-len");
    struct Got {
        status: u16,
        bytes: u64,
        ttfb_ms: f64,
        bad_at: Option<u64>,
        content_range: Option<String>,
    }
    let t0 = Instant::now();
    let r = (|| -> io::Result<Got> {
        let mut c = Conn::connect(&addr, READ_BUF, Some(Duration::from_secs(60)))?;
        c.send_get(&path, range, true)?;
        let h = c.read_head()?;
        let ttfb = (h.first_byte - t0).as_secs_f64() * 1000.0;
        let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
        let mut v = seed.map(|s| Verifier::new(s, range.map_or(0, |r| r.0)));
        let mut got = 0u64;
        c.read_body(len, |d| {
            got += d.len() as u64;
            if let Some(v) = v.as_mut() {
                v.feed(d)
            }
        })?;
        Ok(Got {
            status: h.status,
            bytes: got,
            ttfb_ms: ttfb,
            bad_at: v.and_then(|v| v.bad_at),
            content_range: h.content_range,
        })
    })();
    let secs = t0.elapsed().as_secs_f64();
    match r {
        Ok(Got {
            status,
            bytes: got,
            ttfb_ms: ttfb,
            bad_at,
            content_range: cr,
        }) => {
            println!("status={status}");
            println!("bytes={got}");
            println!("secs={secs:.4}");
            println!("mb_per_s={:.1}", got as f64 / secs / 1e6);
            println!("ttfb_ms={ttfb:.3}");
            if let Some(cr) = cr {
                println!("content_range={cr}");
            }
            let want_status = if range.is_some() { 206 } else { 200 };
            let want_len = range.map(|(s, e)| e - s + 1).or(expect_len);
            let mut ok = status == want_status;
            if status != want_status {
                println!("error=status {status}, expected {want_status}");
            }
            if let Some(w) = want_len {
                if got != w {
                    ok = false;
                    println!("error=body {got} bytes, expected {w}");
                }
            }
            if let Some(at) = bad_at {
                ok = false;
                println!("error=body differs from the fixture at file offset {at}");
            }
            println!("ok={}", ok as u8);
            if !ok {
                exit(3);
            }
        }
        Err(e) => {
            println!("ok=0");
            println!("error={e}");
            exit(3);
        }
    }
}

// ---------------------------------------------------------------- idle

/// Longest `idle` waits for its --stop-file.
const IDLE_HOLD_MAX_S: u64 = 120;

fn cmd_idle(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let path = a.str("path");
    let n = a.u64("conns") as usize;
    let pid = a.opt_u64("pid").map(|p| p as u32);
    let settle = a.f64_or("settle-s", 1.0);
    let rss0 = pid.and_then(rss_kib);
    let fd0 = pid.and_then(fd_count);
    let t0 = Instant::now();
    let mut conns = Vec::with_capacity(n);
    let mut errors = 0u64;
    let mut first_error = None;
    for _ in 0..n {
        let r = (|| -> io::Result<Conn> {
            let mut c = Conn::connect(&addr, 0, Some(Duration::from_secs(10)))?;
            c.send_get(&path, None, false)?;
            let h = c.read_head()?;
            if h.status != 200 {
                return Err(bad(&format!("status {}", h.status)));
            }
            let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
            c.read_body(len, |_| {})?;
            if h.close {
                return Err(bad("server closed a keep-alive connection"));
            }
            // Drop the 64 KiB head buffer: 10 000 of them would be our RSS, not the server's.
            c.buf = Vec::new();
            Ok(c)
        })();
        match r {
            Ok(c) => conns.push(c),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e.to_string());
                if errors > 100 && conns.is_empty() {
                    break;
                }
            }
        }
    }
    let open_s = t0.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs_f64(settle));
    let rss1 = pid.and_then(rss_kib);
    let fd1 = pid.and_then(fd_count);
    // With --ready-file/--stop-file the connections are held while the caller counts them on
    // the server's side (`ss`), so a server that closed idle ones cannot pass as holding them.
    if let (Some(ready), Some(stop)) = (a.opt_str("ready-file"), a.opt_str("stop-file")) {
        std::fs::write(&ready, format!("{}\n", conns.len()))
            .unwrap_or_else(|e| die(&format!("--ready-file {ready}: {e}")));
        let deadline = Instant::now() + Duration::from_secs(IDLE_HOLD_MAX_S);
        while !std::path::Path::new(&stop).exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let mut still_open = 0u64;
    for c in &mut conns {
        if c.s.tcp().set_nonblocking(true).is_err() {
            continue;
        }
        let mut b = [0u8; 1];
        match c.s.read(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => still_open += 1,
            _ => {}
        }
    }
    println!("conns_wanted={n}");
    println!("conns_established={}", conns.len());
    println!("conns_still_open={still_open}");
    println!("errors={errors}");
    println!("open_s={open_s:.2}");
    let show = |k: &str, v: Option<u64>| match v {
        Some(v) => println!("{k}={v}"),
        None => println!("{k}=n/a"),
    };
    show("rss_before_kib", rss0);
    show("rss_after_kib", rss1);
    show("fd_before", fd0);
    show("fd_after", fd1);
    if let Some(e) = first_error {
        println!("first_error={e}");
    }
}

// ---------------------------------------------------------------- handshakes

struct HandshakeShared {
    done: AtomicU64,
    resumed: AtomicU64,
    attempts: AtomicU64,
    errors: AtomicU64,
    /// Attempt slots handed out (open loop, `--rate`).
    slots: AtomicU64,
    first_error: Mutex<Option<String>>,
}

fn cmd_handshakes(a: &Args) {
    if tls::client().is_none() {
        die("handshakes needs --tls 1");
    }
    let addr = resolve(&a.str("addr"));
    let conns = a.u64("conns") as usize;
    let duration = a.f64("duration-s");
    let warmup = a.f64_or("warmup-s", 1.0).min(duration / 2.0);
    let path = a.opt_str("path");
    let rate = a.f64_or("rate", 0.0);
    let pgid = a.opt_u64("pgid").map(|g| g as u32);
    let sh = Arc::new(HandshakeShared {
        done: AtomicU64::new(0),
        resumed: AtomicU64::new(0),
        attempts: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        slots: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    let t_start = Instant::now();
    for _ in 0..conns {
        let sh = sh.clone();
        let path = path.clone();
        thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || loop {
                if rate > 0.0 {
                    // Open loop: attempt k starts at k / rate, whatever became of the others.
                    let k = sh.slots.fetch_add(1, Ordering::Relaxed);
                    let at = t_start + Duration::from_secs_f64(k as f64 / rate);
                    thread::sleep(at.saturating_duration_since(Instant::now()));
                }
                sh.attempts.fetch_add(1, Ordering::Relaxed);
                let r = (|| -> io::Result<bool> {
                    let mut c = Conn::connect(&addr, HEAD_MAX, Some(Duration::from_secs(10)))?;
                    let resumed = c.s.resumed().unwrap_or(false);
                    if let Some(p) = &path {
                        c.send_get(p, None, true)?;
                        let h = c.read_head()?;
                        let len = h.content_length.ok_or_else(|| bad("no Content-Length"))?;
                        c.read_body(len, |_| {})?;
                    }
                    Ok(resumed)
                })();
                match r {
                    Ok(resumed) => {
                        sh.done.fetch_add(1, Ordering::Relaxed);
                        if resumed {
                            sh.resumed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        sh.errors.fetch_add(1, Ordering::Relaxed);
                        let mut fe = sh.first_error.lock().unwrap();
                        fe.get_or_insert(e.to_string());
                    }
                }
            })
            .expect("spawn");
    }
    thread::sleep(Duration::from_secs_f64(warmup));
    let t0 = Instant::now();
    let (d0, r0, a0, e0) = (
        sh.done.load(Ordering::SeqCst),
        sh.resumed.load(Ordering::SeqCst),
        sh.attempts.load(Ordering::SeqCst),
        sh.errors.load(Ordering::SeqCst),
    );
    let c0 = pgid.map(group_cpu_s);
    let me0 = self_cpu_s();
    let end = t_start + Duration::from_secs_f64(duration);
    thread::sleep(end.saturating_duration_since(Instant::now()));
    let secs = t0.elapsed().as_secs_f64();
    let done = sh.done.load(Ordering::SeqCst) - d0;
    let resumed = sh.resumed.load(Ordering::SeqCst) - r0;
    let attempts = sh.attempts.load(Ordering::SeqCst) - a0;
    let errors = sh.errors.load(Ordering::SeqCst) - e0;
    let c1 = pgid.map(group_cpu_s);
    let me1 = self_cpu_s();
    println!("window_s={secs:.3}");
    println!("handshakes={done}");
    println!("handshakes_per_s={:.0}", done as f64 / secs);
    println!("resumed={resumed}");
    println!("attempts_per_s={:.0}", attempts as f64 / secs);
    println!("errors={errors}");
    if let (Some(c0), Some(c1)) = (c0, c1) {
        let cpu = c1 - c0;
        println!("server_cpu_s={cpu:.3}");
        if done > 0 {
            println!("server_cpu_us_per_handshake={:.1}", cpu * 1e6 / done as f64);
            // What one fully busy core would complete at this cost.
            println!("handshakes_per_core_s={:.0}", done as f64 / cpu.max(1e-9));
        }
    }
    println!("client_cpu_s={:.3}", me1 - me0);
    if let Some(e) = sh.first_error.lock().unwrap().as_ref() {
        println!("first_error={e}");
    }
    let _ = io::stdout().flush();
    exit(0);
}

// ---------------------------------------------------------------- args

struct Args(HashMap<String, String>);

impl Args {
    fn parse(v: &[String]) -> Args {
        let mut m = HashMap::new();
        let mut it = v.iter();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                die(&format!("unexpected argument {k}"))
            };
            let val = it
                .next()
                .unwrap_or_else(|| die(&format!("--{k} needs a value")));
            m.insert(k.to_string(), val.clone());
        }
        Args(m)
    }
    fn opt_str(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }
    fn str(&self, k: &str) -> String {
        self.opt_str(k)
            .unwrap_or_else(|| die(&format!("--{k} is required")))
    }
    fn opt_u64(&self, k: &str) -> Option<u64> {
        self.0.get(k).map(|v| {
            v.parse()
                .unwrap_or_else(|_| die(&format!("--{k}: not a number: {v}")))
        })
    }
    fn u64(&self, k: &str) -> u64 {
        self.opt_u64(k)
            .unwrap_or_else(|| die(&format!("--{k} is required")))
    }
    fn f64_or(&self, k: &str, d: f64) -> f64 {
        self.0
            .get(k)
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| die(&format!("--{k}: not a number: {v}")))
            })
            .unwrap_or(d)
    }
    fn f64(&self, k: &str) -> f64 {
        if !self.0.contains_key(k) {
            die(&format!("--{k} is required"));
        }
        self.f64_or(k, 0.0)
    }
}

fn die(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    exit(2);
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = argv.split_first() else {
        die("usage: loadgen gen|cpu|bulk|ttfb|get|idle|swarm|fetch|handshakes|trickle|misses|hellos --key value ...")
    };
    let a = Args::parse(rest);
    tls::init(&a);
    match cmd.as_str() {
        "handshakes" => cmd_handshakes(&a),
        "flood" => flood::cmd_flood(&a),
        "gen" => cmd_gen(&a),
        "cpu" => cmd_cpu(&a),
        "bulk" => cmd_bulk(&a),
        "ttfb" => cmd_ttfb(&a),
        "get" => cmd_get(&a),
        "idle" => cmd_idle(&a),
        "swarm" => swarm::cmd_swarm(&a),
        "fetch" => fetch::cmd_fetch(&a),
        "trickle" => trickle::cmd_trickle(&a),
        "misses" => misses::cmd_misses(&a),
        "hellos" => hellos::cmd_hellos(&a),
        "traffic-gen" => traffic::cmd_gen(&a),
        "traffic" => traffic::cmd_play(&a),
        _ => die(&format!("unknown subcommand {cmd}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_accepts_the_stream_from_any_offset_and_split() {
        let seed = 7;
        let data: Vec<u8> = (0..200u64).map(|o| stream_byte(seed, o)).collect();
        for start in 0..20usize {
            for split in start..data.len() {
                let mut v = Verifier::new(seed, start as u64);
                v.feed(&data[start..split]);
                v.feed(&data[split..]);
                assert_eq!(v.bad_at, None, "start {start} split {split}");
            }
        }
    }

    #[test]
    fn verifier_reports_the_first_wrong_byte() {
        let seed = 9;
        let mut data: Vec<u8> = (0..100u64).map(|o| stream_byte(seed, o)).collect();
        data[37] ^= 1;
        let mut v = Verifier::new(seed, 3);
        v.feed(&data[3..]);
        assert_eq!(v.bad_at, Some(37));
    }

    #[test]
    fn head_parsing() {
        let h = parse_head("HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/100\r\nConnection: close").unwrap();
        assert_eq!(h.status, 206);
        assert_eq!(h.content_length, Some(10));
        assert_eq!(h.content_range.as_deref(), Some("bytes 0-9/100"));
        assert!(h.close);
        assert!(parse_head("FOO 200").is_err());
    }

    #[test]
    fn stat_parsing_survives_spaces_in_comm() {
        let s = "123 (a b) c) S 1 123 123 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(s), Some((123, 12)));
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(pct(&v, 50.0), 50.0);
        assert_eq!(pct(&v, 99.0), 99.0);
        assert_eq!(pct(&[3.0], 99.0), 3.0);
    }
}
