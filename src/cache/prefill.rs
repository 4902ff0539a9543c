//! `shardline cache prefill`: fills a running server's cache with the objects a list names,
//! before the clients ask (release day). Each line is a URL (`http[s]://host[:port]/path?q`,
//! its host is the Host the request carries) or an absolute path; blank lines and `#` comments
//! are skipped. The whole list is checked first, against the server's own routing (the admin
//! listener's `GET /cache/object`): a line that is not a URL, or that no `[[origin]]` covers,
//! is an error naming its line, and nothing is fetched. Then each object not cached yet is
//! fetched through the server's own listener, as a client would, so it joins a fill already
//! under way and is checked like any response; the body is read at `--rate` at most, and the
//! fill's read-ahead keeps the origin within one read-ahead window of that pace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::tool::AdminClient;

/// Largest list read (16 MiB: about 100 000 URLs of Steam's length).
pub const MAX_LIST_BYTES: u64 = 16 << 20;
/// Most objects one prefill takes.
pub const MAX_LIST_OBJECTS: usize = 1_000_000;
/// Longest line taken (a URL the server would refuse anyway is refused here first).
pub const MAX_LINE_BYTES: usize = 8192;
/// Connect, read and write timeout of each request (a stalled fetch fails its object).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of a list line an error report echoes: enough to recognise the line, never the
/// whole of a long one (a report may reach someone who may not read the file).
pub const ECHO_PREFIX_BYTES: usize = 64;
/// Most bytes of an admin reply or a response head read.
const HEAD_MAX_BYTES: usize = 64 * 1024;
/// Bytes read from a body at once.
const READ_BYTES: usize = 256 * 1024;

/// One object of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its line in the list (1-based).
    pub line: usize,
    /// The Host its request carries (a URL's authority; None for a bare path).
    pub host: Option<String>,
    /// The request target: the path and its query.
    pub target: String,
}

impl Target {
    /// Its path, its query and its Host, as a client's request carries them.
    pub fn parts(&self) -> (&[u8], Option<&[u8]>, Option<&[u8]>) {
        let (path, query) = match self.target.split_once('?') {
            Some((p, q)) => (p.as_bytes(), Some(q.as_bytes())),
            None => (self.target.as_bytes(), None),
        };
        (path, query, self.host.as_deref().map(str::as_bytes))
    }
}

/// Parses the list; Err holds one message per bad line, each naming it.
pub fn parse_list(text: &str) -> Result<Vec<Target>, Vec<String>> {
    let mut targets = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        match parse_line(l) {
            Ok((host, target)) => targets.push(Target { line, host, target }),
            Err(why) => errors.push(format!("line {line}: {why}: {}", echo_prefix(l))),
        }
        if targets.len() > MAX_LIST_OBJECTS {
            errors.push(format!("line {line}: more than {MAX_LIST_OBJECTS} objects"));
            break;
        }
    }
    if errors.is_empty() {
        Ok(targets)
    } else {
        Err(errors)
    }
}

/// The first `ECHO_PREFIX_BYTES` bytes of `s` for an error report, every byte but visible
/// ASCII escaped (`\xNN`, and `\\` for a backslash) so no control byte reaches a terminal or
/// a log, and `...` when cut.
pub fn echo_prefix(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(ECHO_PREFIX_BYTES + 8);
    for &b in s.as_bytes().iter().take(ECHO_PREFIX_BYTES) {
        match b {
            b'\\' => out.push_str("\\\\"),
            b' '..=b'~' => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    if s.len() > ECHO_PREFIX_BYTES {
        out.push_str("...");
    }
    out
}

/// `http[s]://host[:port]/path?q` or `/path?q` -> (Host, target).
fn parse_line(l: &str) -> Result<(Option<String>, String), &'static str> {
    if l.len() > MAX_LINE_BYTES {
        return Err("longer than 8192 bytes");
    }
    if l.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("a space or control byte in it");
    }
    let l = l.split('#').next().unwrap_or_default();
    if l.starts_with('/') {
        return Ok((None, l.to_string()));
    }
    let rest = l
        .strip_prefix("http://")
        .or_else(|| l.strip_prefix("https://"))
        .ok_or("not an http(s) URL or an absolute path")?;
    let (authority, target) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() {
        return Err("a URL without a host");
    }
    Ok((Some(host.to_string()), target))
}

/// What the server's cache holds of a target (the admin's `GET /cache/object`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Every block is on disk: nothing to fetch.
    pub cached: bool,
    /// The object's size, once known.
    pub size: Option<u64>,
}

/// Asks the admin listener what the cache holds of `t`; Err(message) when no `[[origin]]`
/// covers it (or the server cannot say).
pub fn lookup(admin: &AdminClient, t: &Target) -> Result<Held, String> {
    use super::tool::query_encode;
    let mut q = format!("target={}", query_encode(&t.target));
    if let Some(h) = &t.host {
        q.push_str(&format!("&host={}", query_encode(h)));
    }
    let (status, body) = admin
        .request("GET", &format!("/cache/object?{q}"))
        .map_err(|e| format!("admin listener {}: {e}", admin.addr))?;
    if status != 200 {
        return Err(body);
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|_| format!("admin listener: not JSON: {body}"))?;
    Ok(Held {
        cached: v["cached"].as_bool().unwrap_or(false),
        size: v["size"].as_u64(),
    })
}

/// Seconds between renewals of the prefill's lease (a third of the admin's `PREFILL_LEASE_S`).
pub const LEASE_RENEW_S: u64 = 10;

/// This prefill's lease on the server (`POST /cache/prefill/begin`): one prefill at a time.
pub struct Lease {
    admin: AdminClient,
    id: u64,
    renewed: Instant,
}

impl Lease {
    /// Takes the server's prefill lease; Err names why (another prefill runs).
    pub fn begin(admin: &AdminClient) -> Result<Lease, String> {
        let (status, body) = admin
            .request("POST", "/cache/prefill/begin")
            .map_err(|e| format!("admin listener {}: {e}", admin.addr))?;
        let id = body
            .trim()
            .parse()
            .ok()
            .filter(|_| status == 200)
            .ok_or(body)?;
        Ok(Lease {
            admin: admin.clone(),
            id,
            renewed: Instant::now(),
        })
    }

    /// Renews the lease when `LEASE_RENEW_S` have passed; Err when it was lost.
    pub fn renew_if_due(&mut self) -> Result<(), String> {
        if self.renewed.elapsed() < Duration::from_secs(LEASE_RENEW_S) {
            return Ok(());
        }
        let target = format!("/cache/prefill/renew?id={}", self.id);
        match self.admin.request("POST", &target) {
            Ok((200, _)) => {
                self.renewed = Instant::now();
                Ok(())
            }
            Ok((_, body)) => Err(body),
            Err(e) => Err(format!("admin listener {}: {e}", self.admin.addr)),
        }
    }

    /// Gives the lease back (the next prefill may begin at once).
    pub fn end(self) {
        let _ = self
            .admin
            .request("POST", &format!("/cache/prefill/end?id={}", self.id));
    }
}

/// Fetches at once by default: each waits the origin's first-byte delay, so a few in flight
/// keep a distant origin busy up to the rate.
pub const DEFAULT_PARALLEL: usize = 8;
/// Most fetches at once a prefill may ask for.
pub const MAX_PARALLEL: usize = 64;

/// `--pin-until`: Unix seconds, or `+N` with a unit (`s`, `m`, `h`, `d`) from `now_unix_s`.
pub fn parse_pin_until(v: &str, now_unix_s: u64) -> Result<u64, String> {
    let bad = || format!("'{v}' is not Unix seconds or +N[smhd] (as +72h)");
    let Some(rel) = v.strip_prefix('+') else {
        return v.parse::<u64>().map_err(|_| bad());
    };
    let (digits, unit) = rel.split_at(rel.len().saturating_sub(1));
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(bad()),
    };
    Ok(now_unix_s.saturating_add(secs))
}

/// Pins `t` against eviction until `until_unix_s` through the admin listener (`POST
/// /cache/pin`); Ok(false) when the server does not hold it.
pub fn pin(admin: &AdminClient, t: &Target, until_unix_s: u64) -> Result<bool, String> {
    use super::tool::query_encode;
    let mut q = format!("target={}&until={until_unix_s}", query_encode(&t.target));
    if let Some(h) = &t.host {
        q.push_str(&format!("&host={}", query_encode(h)));
    }
    match admin.request("POST", &format!("/cache/pin?{q}")) {
        Ok((200, body)) => Ok(body.trim() == "pinned"),
        Ok((_, body)) => Err(body.trim().to_string()),
        Err(e) => Err(format!("admin listener {}: {e}", admin.addr)),
    }
}

/// Fetches `todo` through the server's listener `edge`, `parallel` at once, their bodies read
/// at `rate` bytes per second over all (0: no cap). `on_bytes` hears of every read,
/// `on_done` of every object's end (its body bytes, or why it failed), from the workers'
/// threads.
pub fn run(
    edge: SocketAddr,
    todo: &[&Target],
    rate_bytes_per_s: u64,
    parallel: usize,
    on_bytes: &(dyn Fn(u64) + Sync),
    on_done: &(dyn Fn(&Target, &Result<u64, String>) + Sync),
) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let pacer = std::sync::Mutex::new(Pacer::new(rate_bytes_per_s));
    std::thread::scope(|scope| {
        for _ in 0..parallel.clamp(1, MAX_PARALLEL).min(todo.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(t) = todo.get(i) else {
                    return;
                };
                let result = fetch(edge, t, &pacer, &mut |n| on_bytes(n));
                on_done(t, &result);
            });
        }
    });
}

/// Holds reads to `rate` bytes per second (0: no cap) since it was made.
pub struct Pacer {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl Pacer {
    /// A pacer starting now.
    pub fn new(rate_bytes_per_s: u64) -> Pacer {
        Pacer {
            rate: rate_bytes_per_s,
            start: Instant::now(),
            bytes: 0,
        }
    }

    /// `n` more bytes were read: how long to wait before the rate allows them.
    pub fn took(&mut self, n: u64) -> Duration {
        self.bytes += n;
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        due.saturating_sub(self.start.elapsed())
    }
}

/// Fetches `t` through the server's listener `edge`, reading its body at `pacer`'s rate
/// (shared by the fetches of one prefill; the wait is slept outside its lock) and reporting
/// each read's bytes to `progress`; the body bytes, or why it failed.
pub fn fetch(
    edge: SocketAddr,
    t: &Target,
    pacer: &std::sync::Mutex<Pacer>,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, String> {
    let pace = |n: u64| {
        let wait = pacer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .took(n);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    };
    let mut s = TcpStream::connect_timeout(&edge, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(REQUEST_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let host = t.host.as_deref().unwrap_or("shardline-prefill");
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: shardline-prefill\r\nConnection: close\r\n\r\n",
        t.target
    );
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; READ_BYTES];
    let mut head = Vec::new();
    let body_start = loop {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the server closed before the head".into());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > HEAD_MAX_BYTES {
            return Err("a response head over 64 KiB".into());
        }
    };
    let text = String::from_utf8_lossy(&head[..body_start]).to_string();
    let status: u16 = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or("not an HTTP response")?;
    if status != 200 {
        let line = text.lines().next().unwrap_or_default();
        return Err(format!("the server answered {line}"));
    }
    let length: Option<u64> = text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    });
    let mut got = (head.len() - body_start) as u64;
    progress(got);
    pace(got);
    loop {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        got += n as u64;
        progress(n as u64);
        pace(n as u64);
    }
    match length {
        Some(l) if got != l => Err(format!("{got} of {l} bytes: the response was cut")),
        _ => Ok(got),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_take_urls_and_paths_and_name_every_bad_line() {
        let list = "# release 1.2\n\n/pull/a.bin\nhttp://cdn.example:8080/pull/b.bin?sid=1\n\
                    https://cdn.example?x=1\n  /pull/c.bin  \n";
        let t = parse_list(list).unwrap();
        assert_eq!(
            t,
            vec![
                Target {
                    line: 3,
                    host: None,
                    target: "/pull/a.bin".into()
                },
                Target {
                    line: 4,
                    host: Some("cdn.example:8080".into()),
                    target: "/pull/b.bin?sid=1".into()
                },
                Target {
                    line: 5,
                    host: Some("cdn.example".into()),
                    target: "/?x=1".into()
                },
                Target {
                    line: 6,
                    host: None,
                    target: "/pull/c.bin".into()
                },
            ]
        );
        let bad = parse_list("/ok\nftp://x/y\npull/rel\nhttp:///nohost\n/a b\n").unwrap_err();
        assert_eq!(bad.len(), 4, "{bad:?}");
        for (msg, line) in bad.iter().zip([2, 3, 4, 5]) {
            assert!(msg.starts_with(&format!("line {line}: ")), "{msg}");
        }
        assert!(parse_list(&format!("/{}\n", "a".repeat(MAX_LINE_BYTES))).is_err());
        assert_eq!(parse_list("\n# nothing\n").unwrap(), vec![]);
    }

    #[test]
    fn an_error_echoes_a_bounded_sanitised_prefix_of_its_line() {
        assert_eq!(echo_prefix("/pull/a.bin"), "/pull/a.bin");
        assert_eq!(echo_prefix("a\tb\x1b[31m\\"), "a\\x09b\\x1b[31m\\\\");
        assert_eq!(echo_prefix("é"), "\\xc3\\xa9");
        let long = "x".repeat(ECHO_PREFIX_BYTES * 3);
        let e = echo_prefix(&long);
        assert_eq!(e, format!("{}...", "x".repeat(ECHO_PREFIX_BYTES)));
        // A line of a secret file: its error names the line, with a 64-byte prefix at most.
        let secret = format!("root:{}:0:0:root:/root:/bin/bash", "$6$".repeat(40));
        let errors = parse_list(&format!("{secret}\n")).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("line 1: "), "{}", errors[0]);
        assert!(!errors[0].contains(&secret), "{}", errors[0]);
        assert!(
            errors[0].len() < 64 + ECHO_PREFIX_BYTES + 8,
            "{}",
            errors[0]
        );
        // Control bytes in a line are escaped, not echoed.
        let errors = parse_list("/a\x07b\n").unwrap_err();
        assert!(errors[0].ends_with("/a\\x07b"), "{}", errors[0]);
    }

    #[test]
    fn the_pacer_holds_the_rate_and_a_zero_rate_does_not_wait() {
        let mut free = Pacer::new(0);
        assert_eq!(free.took(1 << 30), Duration::ZERO);
        // 1 MB at 10 MB/s: the last 100 kB may go 100 ms after the start, not before.
        let mut p = Pacer::new(10_000_000);
        let mut wait = Duration::ZERO;
        for _ in 0..10 {
            wait = p.took(100_000);
        }
        let may_go = p.start.elapsed() + wait;
        assert!(may_go >= Duration::from_millis(100), "{may_go:?}");
    }

    #[test]
    fn pin_until_takes_unix_seconds_or_a_time_from_now() {
        assert_eq!(parse_pin_until("1800000000", 5), Ok(1_800_000_000));
        assert_eq!(parse_pin_until("+90s", 10), Ok(100));
        assert_eq!(parse_pin_until("+2m", 0), Ok(120));
        assert_eq!(parse_pin_until("+72h", 0), Ok(72 * 3600));
        assert_eq!(parse_pin_until("+7d", 1), Ok(7 * 86_400 + 1));
        for bad in ["", "+", "+5", "+5w", "tomorrow", "-5"] {
            assert!(parse_pin_until(bad, 0).is_err(), "{bad}");
        }
    }
}
