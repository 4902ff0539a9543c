//! soakgen: the load client of `perf/soak.sh`. Standard library only.
//!
//! ```text
//! soakgen gen DIR                     write the fixture files (known content) into DIR
//! soakgen run --addr A --seconds N [--workers W] [--pid PID] [--admin ADMIN]
//!                                     mixed load; every byte checked; summary on stdout
//!                                     (with --admin: the server's counters from /metrics)
//! soakgen idle --addr A --conns N --pid PID
//!                                     hold N idle keep-alive connections, report RSS growth
//! ```
//!
//! File content is a function of (seed, offset), so any range of any file is checked without
//! reading the fixture: byte i of a file with seed s is `((i*7 + i/4093) as u8) ^ s`.
//!
//! `run` exits 1 when a byte was wrong, a valid request failed, or the server died.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// (name, size, seed) of every fixture file.
const FILES: &[(&str, u64, u8)] = &[
    ("empty.bin", 0, 0),
    ("manifest.json", 2_345, 1),
    ("small-4k.bin", 4_096, 2),
    ("chunk-100k.bin", 100_000, 3),
    ("pkg-3m.bin", 3_000_001, 4),
    ("pkg-20m.bin", (20 << 20) + 777, 5),
    ("big-256m.bin", 256 << 20, 6),
];
const BIG: usize = 6;

fn byte_at(seed: u8, i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(i / 4093) as u8) ^ seed
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: u64| {
        flag(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} wants a number, got {v}"))
        })
    };
    let addr = || -> SocketAddr {
        flag("--addr")
            .expect("--addr ADDR:PORT")
            .parse()
            .expect("--addr ADDR:PORT")
    };
    match args.first().map(String::as_str) {
        Some("gen") => {
            gen(Path::new(args.get(1).expect("gen DIR")));
            ExitCode::SUCCESS
        }
        Some("run") => run(
            addr(),
            Duration::from_secs(num("--seconds", 60)),
            num("--workers", 8) as usize,
            flag("--pid").map(|p| p.parse().expect("--pid")),
            flag("--admin").map(|a| a.parse().expect("--admin ADDR:PORT")),
        ),
        Some("idle") => idle(
            addr(),
            num("--conns", 10_000) as usize,
            num("--pid", 0) as u32,
        ),
        _ => {
            eprintln!("usage: soakgen gen DIR | run --addr A --seconds N [--workers W] [--pid P] | idle --addr A --conns N --pid P");
            ExitCode::from(2)
        }
    }
}

// ---- fixture ---------------------------------------------------------------------------------

fn gen(dir: &Path) {
    std::fs::create_dir_all(dir).expect("fixture dir");
    for &(name, size, seed) in FILES {
        let path = dir.join(name);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
            continue;
        }
        let mut w =
            BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).expect("create"));
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        while off < size {
            let n = (size - off).min(buf.len() as u64) as usize;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = byte_at(seed, off + k as u64);
            }
            w.write_all(&buf[..n]).expect("write");
            off += n as u64;
        }
        w.flush().expect("flush");
    }
}

// ---- a tiny HTTP/1.1 client --------------------------------------------------------------------

struct Head {
    status: u16,
    fields: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn content_length(&self) -> Result<u64, String> {
        self.get("content-length")
            .ok_or("no Content-Length")?
            .parse()
            .map_err(|e| format!("Content-Length: {e}"))
    }
}

struct Conn {
    r: BufReader<TcpStream>,
    /// Set at the end of the run: long bodies stop being read (the op is then discarded).
    stop: Option<Arc<AtomicBool>>,
}

const IO_TIMEOUT: Duration = Duration::from_secs(30);

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::with_capacity(256 * 1024, s),
            stop: None,
        })
    }

    fn send(&mut self, req: &str) -> Result<(), String> {
        self.r
            .get_mut()
            .write_all(req.as_bytes())
            .map_err(|e| format!("write: {e}"))
    }

    fn head(&mut self) -> Result<Head, String> {
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) => return Err("EOF before a response".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read status: {e}")),
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut fields = Vec::new();
        loop {
            let mut h = String::new();
            self.r
                .read_line(&mut h)
                .map_err(|e| format!("read head: {e}"))?;
            let h = h.trim_end_matches(['\r', '\n']);
            if h.is_empty() {
                break;
            }
            let (n, v) = h
                .split_once(':')
                .ok_or_else(|| format!("bad field {h:?}"))?;
            fields.push((n.trim().to_string(), v.trim().to_string()));
        }
        Ok(Head { status, fields })
    }

    /// Reads `n` body bytes, checking them against file `seed` from offset `off`; returns how
    /// many bytes were wrong.
    fn body_check(&mut self, n: u64, seed: u8, off: u64) -> Result<u64, String> {
        let mut left = n;
        let mut pos = off;
        let mut wrong = 0;
        while left > 0 {
            if self
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                return Err("stopped".into());
            }
            let buf = self.r.fill_buf().map_err(|e| format!("read body: {e}"))?;
            if buf.is_empty() {
                return Err(format!("EOF with {left} of {n} body bytes missing"));
            }
            let k = buf.len().min(left as usize);
            for (j, &b) in buf[..k].iter().enumerate() {
                if b != byte_at(seed, pos + j as u64) {
                    wrong += 1;
                }
            }
            self.r.consume(k);
            left -= k as u64;
            pos += k as u64;
        }
        Ok(wrong)
    }

    fn body_bytes(&mut self, n: usize) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; n];
        self.r
            .read_exact(&mut v)
            .map_err(|e| format!("read body: {e}"))?;
        Ok(v)
    }
}

// ---- the load ----------------------------------------------------------------------------------

/// Deterministic per-worker random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    errors: AtomicU64,
    wrong_bytes: AtomicU64,
    wrong_responses: AtomicU64,
    bytes_checked: AtomicU64,
    aborts: AtomicU64,
    kinds: [AtomicU64; 6],
}

const KIND_NAMES: [&str; 6] = [
    "full",
    "ranged",
    "multi",
    "conditional",
    "churn",
    "big-full",
];

/// What one operation found.
enum Outcome {
    /// `reqs` HTTP requests answered; `wrong` of the `bytes` checked were wrong.
    Ok {
        wrong: u64,
        bytes: u64,
        reqs: u64,
    },
    Aborted,
}

fn pick_file(rng: &mut Rng) -> usize {
    // Mostly small and mid files; the 256 MiB one for ranges.
    match rng.below(100) {
        0..=14 => 1,
        15..=29 => 2,
        30..=49 => 3,
        50..=64 => 4,
        65..=79 => 5,
        80..=97 => BIG,
        _ => 0,
    }
}

fn get_req(path: &str, extra: &str) -> String {
    format!("GET /{path} HTTP/1.1\r\nHost: soak\r\n{extra}\r\n")
}

/// Full GET of file `f`.
fn op_full(c: &mut Conn, f: usize, extra: &str) -> Result<Outcome, String> {
    let (name, size, seed) = FILES[f];
    c.send(&get_req(name, extra))?;
    let h = c.head()?;
    if h.status != 200 || h.content_length()? != size {
        return Err(format!(
            "{name}: status {} length {:?}",
            h.status,
            h.get("content-length")
        ));
    }
    let wrong = c.body_check(size, seed, 0)?;
    Ok(Outcome::Ok {
        wrong,
        bytes: size,
        reqs: 1,
    })
}

fn op_ranged(c: &mut Conn, rng: &mut Rng) -> Result<Outcome, String> {
    let f = 1 + rng.below(FILES.len() as u64 - 1) as usize;
    let (name, size, seed) = FILES[f];
    let max_len = size.min(4 << 20);
    let (spec, start, end) = match rng.below(4) {
        0 => {
            let n = 1 + rng.below(max_len);
            (format!("-{n}"), size - n, size)
        }
        1 => {
            let start = size - 1 - rng.below(max_len);
            (format!("{start}-"), start, size)
        }
        _ => {
            let start = rng.below(size);
            let n = 1 + rng.below((size - start).min(max_len));
            (format!("{start}-{}", start + n - 1), start, start + n)
        }
    };
    c.send(&get_req(name, &format!("Range: bytes={spec}\r\n")))?;
    let h = c.head()?;
    let want_cr = format!("bytes {start}-{}/{size}", end - 1);
    if h.status != 206
        || h.get("content-range") != Some(want_cr.as_str())
        || h.content_length()? != end - start
    {
        return Err(format!(
            "{name} bytes={spec}: {} {:?} (want 206 {want_cr})",
            h.status,
            h.get("content-range")
        ));
    }
    let wrong = c.body_check(end - start, seed, start)?;
    Ok(Outcome::Ok {
        wrong,
        bytes: end - start,
        reqs: 1,
    })
}

fn op_multi(c: &mut Conn, rng: &mut Rng) -> Result<Outcome, String> {
    let f = 3 + rng.below(FILES.len() as u64 - 3) as usize; // files of 100 kB and more
    let (name, size, seed) = FILES[f];
    let parts = 2 + rng.below(3);
    // Disjoint, non-adjacent, ascending ranges of at most 64 KiB.
    let slot = size / parts;
    let mut ranges = Vec::new();
    for p in 0..parts {
        let base = p * slot;
        let len = 1 + rng.below((slot / 2).min(64 * 1024));
        let start = base + rng.below(slot / 2 - len + 1);
        ranges.push((start, start + len - 1));
    }
    let spec: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    c.send(&get_req(
        name,
        &format!("Range: bytes={}\r\n", spec.join(",")),
    ))?;
    let h = c.head()?;
    let ct = h.get("content-type").unwrap_or("").to_string();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .ok_or_else(|| format!("{name} multi: {} {ct:?}", h.status))?
        .to_string();
    if h.status != 206 {
        return Err(format!("{name} multi: status {}", h.status));
    }
    let body = c.body_bytes(h.content_length()? as usize)?;
    let mut rest = &body[..];
    let mut wrong = 0;
    let mut bytes = 0;
    for &(a, b) in &ranges {
        let open = format!("\r\n--{boundary}\r\n");
        rest = rest
            .strip_prefix(open.as_bytes())
            .ok_or("multipart: missing boundary")?;
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("multipart: part head")?;
        let head = String::from_utf8_lossy(&rest[..end]);
        let want = format!("Content-Range: bytes {a}-{b}/{size}");
        if !head.lines().any(|l| l == want) {
            return Err(format!("multipart: {head:?} lacks {want}"));
        }
        rest = &rest[end + 4..];
        let n = (b - a + 1) as usize;
        if rest.len() < n {
            return Err("multipart: short part".into());
        }
        for (j, &x) in rest[..n].iter().enumerate() {
            if x != byte_at(seed, a + j as u64) {
                wrong += 1;
            }
        }
        bytes += n as u64;
        rest = &rest[n..];
    }
    if rest != format!("\r\n--{boundary}--\r\n").as_bytes() {
        return Err("multipart: bad closing boundary".into());
    }
    Ok(Outcome::Ok {
        wrong,
        bytes,
        reqs: 1,
    })
}

fn op_conditional(c: &mut Conn, rng: &mut Rng) -> Result<Outcome, String> {
    let f = 1 + rng.below(5) as usize;
    let (name, size, _) = FILES[f];
    c.send(&format!("HEAD /{name} HTTP/1.1\r\nHost: soak\r\n\r\n"))?;
    let h = c.head()?;
    if h.status != 200 || h.content_length()? != size {
        return Err(format!("HEAD {name}: {}", h.status));
    }
    let etag = h.get("etag").ok_or("HEAD without ETag")?.to_string();
    c.send(&get_req(name, &format!("If-None-Match: {etag}\r\n")))?;
    let h = c.head()?;
    if h.status != 304 {
        return Err(format!("If-None-Match {name}: {} (want 304)", h.status));
    }
    Ok(Outcome::Ok {
        wrong: 0,
        bytes: 0,
        reqs: 2,
    })
}

/// A new connection, one request with `Connection: close`, then EOF expected.
fn op_churn(addr: SocketAddr, rng: &mut Rng, stop: &Arc<AtomicBool>) -> Result<Outcome, String> {
    let mut c = Conn::open(addr).map_err(|e| format!("connect: {e}"))?;
    c.stop = Some(stop.clone());
    let f = 1 + rng.below(3) as usize;
    let out = op_full(&mut c, f, "Connection: close\r\n")?;
    let mut one = [0u8; 1];
    match c.r.read(&mut one) {
        Ok(0) => Ok(out),
        Ok(_) => Err("bytes after a Connection: close response".into()),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(out),
        Err(e) => Err(format!("waiting for close: {e}")),
    }
}

/// Starts a large download, reads a random part of it (prefix checked), then vanishes.
fn op_abort(addr: SocketAddr, rng: &mut Rng, stop: &Arc<AtomicBool>) -> Result<Outcome, String> {
    let mut c = Conn::open(addr).map_err(|e| format!("connect: {e}"))?;
    c.stop = Some(stop.clone());
    let f = if rng.below(2) == 0 { BIG } else { 5 };
    let (name, size, seed) = FILES[f];
    c.send(&get_req(name, ""))?;
    let h = c.head()?;
    if h.status != 200 {
        return Err(format!("{name}: {}", h.status));
    }
    let n = rng.below(size.min(8 << 20));
    let wrong = c.body_check(n, seed, 0)?;
    if wrong > 0 {
        return Ok(Outcome::Ok {
            wrong,
            bytes: n,
            reqs: 1,
        });
    }
    let s = c.r.get_ref();
    if rng.below(2) == 0 {
        // SO_LINGER 0: the close sends a reset.
        let lin = Linger {
            onoff: 1,
            linger: 0,
        };
        set_linger(s, &lin);
    } else {
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(Outcome::Aborted)
}

#[repr(C)]
struct Linger {
    onoff: i32,
    linger: i32,
}

/// setsockopt(SO_LINGER) without a libc crate.
fn set_linger(s: &TcpStream, l: &Linger) {
    use std::os::fd::AsRawFd;
    extern "C" {
        fn setsockopt(fd: i32, level: i32, name: i32, val: *const Linger, len: u32) -> i32;
    }
    const SOL_SOCKET: i32 = 1;
    const SO_LINGER: i32 = 13;
    // SAFETY: `l` is a valid, correctly sized `struct linger` for the duration of the call.
    unsafe {
        setsockopt(
            s.as_raw_fd(),
            SOL_SOCKET,
            SO_LINGER,
            l,
            std::mem::size_of::<Linger>() as u32,
        );
    }
}

fn worker(
    addr: SocketAddr,
    id: u64,
    stop: Arc<AtomicBool>,
    st: Arc<Stats>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::Relaxed) {
        let roll = rng.below(100);
        let (kind, result) = match roll {
            0..=5 => (usize::MAX, op_abort(addr, &mut rng, &stop)),
            6..=10 => (4, op_churn(addr, &mut rng, &stop)),
            _ => {
                if conn.is_none() {
                    match Conn::open(addr) {
                        Ok(mut c) => {
                            c.stop = Some(stop.clone());
                            conn = Some(c);
                        }
                        Err(e) => {
                            st.errors.fetch_add(1, Ordering::Relaxed);
                            push_error(&errors, format!("connect: {e}"));
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    }
                }
                let c = conn.as_mut().expect("just opened");
                match roll {
                    11..=44 => (0, op_full(c, pick_file(&mut rng).min(5), "")),
                    45..=74 => (1, op_ranged(c, &mut rng)),
                    75..=86 => (2, op_multi(c, &mut rng)),
                    87..=97 => (3, op_conditional(c, &mut rng)),
                    _ => (5, op_full(c, BIG, "")),
                }
            }
        };
        if stop.load(Ordering::Relaxed) && result.is_err() {
            break; // cut off by the end of the run, not a server fault
        }
        match result {
            Ok(Outcome::Ok { wrong, bytes, reqs }) => {
                st.requests.fetch_add(reqs, Ordering::Relaxed);
                st.bytes_checked.fetch_add(bytes, Ordering::Relaxed);
                if kind < st.kinds.len() {
                    st.kinds[kind].fetch_add(1, Ordering::Relaxed);
                }
                if wrong > 0 {
                    st.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                    st.wrong_responses.fetch_add(1, Ordering::Relaxed);
                    push_error(
                        &errors,
                        format!(
                            "{wrong} wrong bytes in a {} response",
                            KIND_NAMES.get(kind).unwrap_or(&"abort")
                        ),
                    );
                    conn = None;
                }
            }
            Ok(Outcome::Aborted) => {
                st.requests.fetch_add(1, Ordering::Relaxed);
                st.aborts.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                st.requests.fetch_add(1, Ordering::Relaxed);
                st.errors.fetch_add(1, Ordering::Relaxed);
                push_error(&errors, e);
                conn = None;
            }
        }
    }
}

fn push_error(errors: &std::sync::Mutex<Vec<String>>, e: String) {
    let mut v = errors.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() < 20 {
        v.push(e);
    }
}

// ---- process probes ----------------------------------------------------------------------------

fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn run(
    addr: SocketAddr,
    secs: Duration,
    workers: usize,
    pid: Option<u32>,
    admin: Option<SocketAddr>,
) -> ExitCode {
    let st = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Warm-up: one of each file, so the fd baseline includes the open-file cache.
    let mut warm_errors = 0;
    if let Ok(mut c) = Conn::open(addr) {
        for f in 0..BIG {
            if !matches!(op_full(&mut c, f, ""), Ok(Outcome::Ok { wrong: 0, .. })) {
                warm_errors += 1;
            }
        }
        // The big file too (one byte of it), so its open-file cache entry is in the baseline.
        let (name, _, seed) = FILES[BIG];
        let ok = c.send(&get_req(name, "Range: bytes=0-0\r\n")).is_ok()
            && matches!(c.head(), Ok(h) if h.status == 206)
            && matches!(c.body_check(1, seed, 0), Ok(0));
        if !ok {
            warm_errors += 1;
        }
    } else {
        warm_errors += 1;
    }
    let fd_start = pid.and_then(fd_count);
    let rss_start = pid.and_then(|p| status_kb(p, "VmRSS"));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|i| {
            let (stop, st, errors) = (stop.clone(), st.clone(), errors.clone());
            std::thread::spawn(move || worker(addr, i as u64, stop, st, errors))
        })
        .collect();
    let mut peak_rss = rss_start.unwrap_or(0);
    let mut fd_max = fd_start.unwrap_or(0);
    let mut died = false;
    let mut last_report = Instant::now();
    while t0.elapsed() < secs {
        std::thread::sleep(Duration::from_millis(250));
        if let Some(p) = pid {
            if !alive(p) {
                died = true;
                break;
            }
            peak_rss = peak_rss.max(status_kb(p, "VmRSS").unwrap_or(0));
            fd_max = fd_max.max(fd_count(p).unwrap_or(0));
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "  {:>4.0} s: {} requests, {} errors, {} wrong bytes, RSS {}",
                t0.elapsed().as_secs_f64(),
                st.requests.load(Ordering::Relaxed),
                st.errors.load(Ordering::Relaxed),
                st.wrong_bytes.load(Ordering::Relaxed),
                mib(peak_rss)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let elapsed = t0.elapsed().min(secs);
    // Let the server finish closing what the workers dropped, then count again.
    std::thread::sleep(Duration::from_secs(2));
    let (fd_end, hwm) = match pid {
        Some(p) if alive(p) => (fd_count(p), status_kb(p, "VmHWM")),
        Some(_) => {
            died = true;
            (None, None)
        }
        None => (None, None),
    };
    // One last request: the server still answers correctly.
    let final_ok = Conn::open(addr)
        .ok()
        .and_then(|mut c| op_full(&mut c, 4, "Connection: close\r\n").ok())
        .is_some_and(|o| matches!(o, Outcome::Ok { wrong: 0, .. }));

    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let kinds: BTreeMap<&str, u64> = KIND_NAMES
        .iter()
        .zip(&st.kinds)
        .map(|(n, k)| (*n, g(k)))
        .collect();
    let requests = g(&st.requests);
    println!(
        "soak: {:.0} s, {workers} workers, server {addr}",
        elapsed.as_secs_f64()
    );
    println!(
        "requests                  {requests} ({:.0}/s) {kinds:?}, aborted downloads {}",
        requests as f64 / elapsed.as_secs_f64(),
        g(&st.aborts)
    );
    println!(
        "bytes verified            {:.2} GiB",
        g(&st.bytes_checked) as f64 / f64::from(1u32 << 30)
    );
    println!("errors on valid requests  {}", g(&st.errors) + warm_errors);
    println!(
        "wrong bytes               {} (in {} responses)",
        g(&st.wrong_bytes),
        g(&st.wrong_responses)
    );
    if pid.is_some() {
        println!(
            "server RSS                start {}, peak sampled {}, VmHWM {}",
            rss_start.map_or("?".into(), mib),
            mib(peak_rss),
            hwm.map_or("?".into(), mib)
        );
        println!(
            "server fds                start {}, max {fd_max}, end {} (drift {})",
            fd_start.map_or("?".into(), |v| v.to_string()),
            fd_end.map_or("?".into(), |v| v.to_string()),
            match (fd_start, fd_end) {
                (Some(a), Some(b)) => format!("{:+}", b as i64 - a as i64),
                _ => "?".into(),
            }
        );
    }
    println!(
        "server                    {}",
        if died {
            "DIED"
        } else if final_ok {
            "alive, final GET byte-exact"
        } else {
            "alive, but the final GET FAILED"
        }
    );
    let mut stray = 0.0;
    if let Some(admin) = admin {
        match scrape(admin) {
            Ok(text) => {
                // Summed over the per-shard series (the server exports no total series).
                let all = |family: &str, label: &str| -> f64 {
                    text.lines()
                        .filter(|l| {
                            l.starts_with(&format!("shardline_{family}{{"))
                                && l.contains("shard=\"")
                                && l.contains(label)
                        })
                        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                        .fold(0.0, |a, b| a + b)
                };
                stray = all("stray_completions_total", "");
                let reasons: Vec<String> = ["normal", "timeout", "error", "abort"]
                    .iter()
                    .map(|r| {
                        format!(
                            "{r} {}",
                            all("connections_closed_total", &format!("reason=\"{r}\""))
                        )
                    })
                    .collect();
                println!(
                    "server counters           accepted {}, closed [{}], accept errors {}, \
                     recv ENOBUFS {}, stray completions {stray}",
                    all("connections_accepted_total", ""),
                    reasons.join(", "),
                    all("accept_errors_total", ""),
                    all("recv_no_buffers_total", ""),
                );
            }
            Err(e) => println!("server counters           unavailable: {e}"),
        }
    }
    let errs = errors.lock().unwrap_or_else(|p| p.into_inner());
    for e in errs.iter() {
        println!("  error: {e}");
    }
    let bad = died
        || !final_ok
        || stray > 0.0
        || g(&st.wrong_bytes) > 0
        || g(&st.errors) + warm_errors > 0;
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// GET /metrics from the admin listener.
fn scrape(admin: SocketAddr) -> Result<String, String> {
    let mut c = Conn::open(admin).map_err(|e| format!("connect: {e}"))?;
    c.send("GET /metrics HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")?;
    let h = c.head()?;
    if h.status != 200 {
        return Err(format!("status {}", h.status));
    }
    let body = c.body_bytes(h.content_length()? as usize)?;
    String::from_utf8(body).map_err(|e| e.to_string())
}

// ---- idle connections ----------------------------------------------------------------------------

fn idle(addr: SocketAddr, n: usize, pid: u32) -> ExitCode {
    std::thread::sleep(Duration::from_millis(500));
    let before = status_kb(pid, "VmRSS").unwrap_or(0);
    let mut conns = Vec::with_capacity(n);
    let req = "GET /manifest.json HTTP/1.1\r\nHost: soak\r\n\r\n";
    for i in 0..n {
        let mut c = match Conn::open(addr) {
            Ok(c) => c,
            Err(e) => {
                println!("idle: connection {i} failed: {e}");
                break;
            }
        };
        // One request each, so every connection has been through the full path once.
        let ok = c.send(req).is_ok() && op_read_manifest(&mut c);
        if !ok {
            println!("idle: request on connection {i} failed");
            break;
        }
        conns.push(c);
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = status_kb(pid, "VmRSS").unwrap_or(0);
    let held = conns.len();
    let growth = after.saturating_sub(before);
    println!(
        "idle keep-alive conns     {held}: RSS {} -> {} (+{}, {:.2} KiB per connection)",
        mib(before),
        mib(after),
        mib(growth),
        growth as f64 / held.max(1) as f64
    );
    drop(conns);
    if held == n {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn op_read_manifest(c: &mut Conn) -> bool {
    let (_, size, seed) = FILES[1];
    matches!(c.head(), Ok(h) if h.status == 200) && matches!(c.body_check(size, seed, 0), Ok(0))
}
