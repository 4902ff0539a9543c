//! Per-shard access log: lines are formatted into a memory buffer and written with an io_uring
//! write (never a blocking `write(2)` on the loop), at most one write in flight. If the disk
//! falls behind and the buffer reaches its cap, lines are dropped and counted rather than
//! blocking or growing without bound. SIGUSR1 bumps an epoch and every shard reopens the file
//! (log rotation).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsFd;
use std::path::PathBuf;

use super::ring_ops::RingOps;

/// Buffer size that triggers a write.
pub const LOG_FLUSH_BYTES: usize = 64 * 1024;
/// Longest a line waits in memory.
pub const LOG_FLUSH_INTERVAL_MS: u64 = 1000;
/// Most bytes buffered while a write is slow; further lines are dropped (and counted).
pub const LOG_BUFFER_CAP_BYTES: usize = 4 * 1024 * 1024;
/// Longest request target kept in a line.
pub const LOG_TARGET_MAX_BYTES: usize = 1024;

/// One response, as logged.
pub struct Entry<'a> {
    /// `METHOD target VERSION`, already sanitised.
    pub request: &'a [u8],
    /// Status sent.
    pub status: u16,
    /// Bytes sent (head and body).
    pub bytes: u64,
    /// Time from request parsed to response done, microseconds.
    pub duration_us: u64,
    /// Range header, sanitised, or empty.
    pub range: &'a [u8],
    /// Shard number.
    pub shard: usize,
    /// `Date`-style time of the response (IMF-fixdate).
    pub date: &'a [u8],
    /// What the connection's TLS handshake settled (None: cleartext).
    pub tls: Option<&'a crate::tls::session::Facts>,
    /// The client's address (None: the kernel did not give the peer's).
    pub client: Option<std::net::IpAddr>,
    /// The limiter that held the response back, if one did (`rate`: its connection's rate).
    pub limiter: Option<&'static str>,
    /// Where a pulled response's bytes came from: `HIT` (all on disk when it began), `MISS`
    /// (it waited for the fill, then read them from disk), `FILL` (it streamed while the
    /// fill went on); None: not under an `[[origin]]`.
    pub cache: Option<&'static str>,
}

/// A shard's access log.
pub struct AccessLog {
    path: PathBuf,
    file: File,
    json: bool,
    buf: Vec<u8>,
    spare: Vec<u8>,
    in_flight: bool,
    last_flush_ms: u64,
    epoch: u64,
    /// Lines dropped because the buffer was full.
    pub dropped_lines: u64,
    /// Failed writes.
    pub write_errors: u64,
}

fn open(path: &PathBuf) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl AccessLog {
    /// Opens (creates, appends) the log file.
    pub fn open(path: PathBuf, json: bool, epoch: u64) -> std::io::Result<AccessLog> {
        let file = open(&path)?;
        Ok(AccessLog {
            path,
            file,
            json,
            buf: Vec::with_capacity(LOG_FLUSH_BYTES * 2),
            spare: Vec::with_capacity(LOG_FLUSH_BYTES * 2),
            in_flight: false,
            last_flush_ms: 0,
            epoch,
            dropped_lines: 0,
            write_errors: 0,
        })
    }

    /// Appends one line for `e`.
    pub fn record(&mut self, e: &Entry<'_>) {
        if self.buf.len() >= LOG_BUFFER_CAP_BYTES {
            self.dropped_lines += 1;
            return;
        }
        format_line(&mut self.buf, e, self.json);
    }

    /// Starts a write when enough is buffered, the interval passed, or `force` (drain).
    pub fn maybe_flush(&mut self, ring: &mut impl RingOps, token: u64, now_ms: u64, force: bool) {
        if self.in_flight || self.buf.is_empty() {
            return;
        }
        let due = force
            || self.buf.len() >= LOG_FLUSH_BYTES
            || now_ms.saturating_sub(self.last_flush_ms) >= LOG_FLUSH_INTERVAL_MS;
        if !due {
            return;
        }
        self.last_flush_ms = now_ms;
        let out = std::mem::replace(&mut self.buf, std::mem::take(&mut self.spare));
        self.in_flight = true;
        ring.write_log(self.file.as_fd(), out, token);
    }

    /// A write finished with `res` bytes (or a negated errno).
    pub fn on_write_done(&mut self, ring: &mut impl RingOps, res: i32) {
        let mut done = ring.log_write_done();
        self.in_flight = false;
        if res < 0 || res as usize != done.len() {
            // Appends to regular files are not partial in practice; a failure is counted and
            // the lines are lost rather than retried forever.
            self.write_errors += 1;
        }
        done.clear();
        self.spare = done;
    }

    /// Whether a write is in flight (the shard waits for it before exiting).
    pub fn busy(&self) -> bool {
        self.in_flight
    }

    /// Reopens the file if the rotation epoch moved (SIGUSR1).
    pub fn reopen_if(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        self.epoch = epoch;
        match open(&self.path) {
            // An in-flight write keeps its own reference to the old file.
            Ok(f) => self.file = f,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "access log reopen failed")
            }
        }
    }
}

/// Copies `src` into `out` replacing bytes that could break a log line (quotes, backslashes,
/// control characters, non-ASCII) with `\xHH`, keeping at most `max` input bytes.
pub fn sanitize_into(out: &mut Vec<u8>, src: &[u8], max: usize) {
    for &b in src.iter().take(max) {
        if b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ' {
            out.push(b);
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// Formats one line: common log format (the client's address first, `-` when unknown) plus
/// bytes, duration, range, shard and the connection's TLS (version, cipher, SNI, resumed;
/// `tls=-` for cleartext); or a JSON object with the same fields.
pub fn format_line(out: &mut Vec<u8>, e: &Entry<'_>, json: bool) {
    // IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT" -> CLF "06/Nov/1994:08:49:37 +0000".
    let mut clf = [0u8; 26];
    let clf_time: &[u8] = match e.date {
        d if d.len() == 29 => {
            let parts: [&[u8]; 8] = [
                &d[5..7],
                b"/",
                &d[8..11],
                b"/",
                &d[12..16],
                b":",
                &d[17..25],
                b" +0000",
            ];
            let mut n = 0;
            for p in parts {
                clf[n..n + p.len()].copy_from_slice(p);
                n += p.len();
            }
            &clf[..n]
        }
        _ => b"-",
    };
    if json {
        match e.client {
            Some(ip) => {
                let _ = write!(out, "{{\"client\":\"{ip}\",");
            }
            None => out.extend_from_slice(b"{\"client\":null,"),
        }
        out.extend_from_slice(b"\"time\":\"");
        out.extend_from_slice(clf_time);
        out.extend_from_slice(b"\",\"request\":\"");
        out.extend_from_slice(e.request);
        let _ = write!(
            out,
            "\",\"status\":{},\"bytes\":{},\"duration_us\":{},\"range\":\"",
            e.status, e.bytes, e.duration_us
        );
        out.extend_from_slice(e.range);
        out.push(b'"');
        match e.limiter {
            Some(l) => {
                let _ = write!(out, ",\"limiter\":\"{l}\"");
            }
            None => out.extend_from_slice(b",\"limiter\":null"),
        }
        match e.cache {
            Some(c) => {
                let _ = write!(out, ",\"cache\":\"{c}\"");
            }
            None => out.extend_from_slice(b",\"cache\":null"),
        }
        let _ = write!(out, ",\"shard\":{},\"tls\":", e.shard);
        match e.tls {
            None => out.extend_from_slice(b"null"),
            Some(t) => {
                let _ = write!(
                    out,
                    "{{\"version\":\"{}\",\"cipher\":\"{}\",\"sni\":",
                    t.version.as_str(),
                    t.cipher
                );
                match &t.sni {
                    // Plausible host names only (`sniff::client_hello_sni`): nothing to escape.
                    Some(sni) => {
                        let _ = write!(out, "\"{sni}\"");
                    }
                    None => out.extend_from_slice(b"null"),
                }
                let _ = write!(out, ",\"resumed\":{}}}", t.resumed);
            }
        }
        out.extend_from_slice(b"}\n");
    } else {
        match e.client {
            Some(ip) => {
                let _ = write!(out, "{ip} - - [");
            }
            None => out.extend_from_slice(b"- - - ["),
        }
        out.extend_from_slice(clf_time);
        out.extend_from_slice(b"] \"");
        out.extend_from_slice(e.request);
        let _ = write!(
            out,
            "\" {} {} dur_us={} range=\"",
            e.status, e.bytes, e.duration_us
        );
        out.extend_from_slice(if e.range.is_empty() { b"-" } else { e.range });
        let _ = write!(out, "\" shard={}", e.shard);
        if let Some(l) = e.limiter {
            let _ = write!(out, " limiter={l}");
        }
        if let Some(c) = e.cache {
            let _ = write!(out, " cache={c}");
        }
        match e.tls {
            None => out.extend_from_slice(b" tls=-\n"),
            Some(t) => {
                let _ = writeln!(
                    out,
                    " tls={} cipher={} sni={} resumed={}",
                    t.version.as_str(),
                    t.cipher,
                    t.sni.as_deref().unwrap_or("-"),
                    if t.resumed { "yes" } else { "no" }
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(req: &'a [u8], range: &'a [u8]) -> Entry<'a> {
        Entry {
            request: req,
            status: 206,
            bytes: 1234,
            duration_us: 56,
            range,
            shard: 1,
            date: b"Sun, 06 Nov 1994 08:49:37 GMT",
            tls: None,
            client: None,
            limiter: None,
            cache: None,
        }
    }

    fn facts() -> crate::tls::session::Facts {
        crate::tls::session::Facts {
            version: crate::tls::session::Version::Tls13,
            cipher: "TLS13_AES_128_GCM_SHA256",
            sni: Some("edge.test".into()),
            resumed: true,
        }
    }

    #[test]
    fn common_format_line() {
        let mut out = Vec::new();
        format_line(&mut out, &entry(b"GET /a HTTP/1.1", b"bytes=0-9"), false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "- - - [06/Nov/1994:08:49:37 +0000] \"GET /a HTTP/1.1\" 206 1234 dur_us=56 \
             range=\"bytes=0-9\" shard=1 tls=-\n"
        );
        let f = facts();
        let mut out = Vec::new();
        let e = Entry {
            tls: Some(&f),
            ..entry(b"GET /a HTTP/1.1", b"")
        };
        format_line(&mut out, &e, false);
        assert!(String::from_utf8(out).unwrap().ends_with(
            "shard=1 tls=TLSv1.3 cipher=TLS13_AES_128_GCM_SHA256 sni=edge.test resumed=yes\n"
        ));
        for (ip, want) in [
            ("203.0.113.9", "203.0.113.9 - - ["),
            ("2001:db8::1", "2001:db8::1 - - ["),
        ] {
            let mut out = Vec::new();
            let e = Entry {
                client: Some(ip.parse().unwrap()),
                ..entry(b"GET /a HTTP/1.1", b"")
            };
            format_line(&mut out, &e, false);
            assert!(String::from_utf8(out).unwrap().starts_with(want));
        }
    }

    #[test]
    fn json_line_parses() {
        let mut out = Vec::new();
        format_line(&mut out, &entry(b"GET /a HTTP/1.1", b""), true);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["status"], 206);
        assert_eq!(v["shard"], 1);
        assert_eq!(v["request"], "GET /a HTTP/1.1");
        assert!(v["tls"].is_null());
        let f = facts();
        let mut out = Vec::new();
        let e = Entry {
            tls: Some(&f),
            ..entry(b"GET /a HTTP/1.1", b"")
        };
        format_line(&mut out, &e, true);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["tls"]["version"], "TLSv1.3");
        assert_eq!(v["tls"]["sni"], "edge.test");
        assert_eq!(v["tls"]["resumed"], true);
        assert!(v["client"].is_null());
        let mut out = Vec::new();
        let e = Entry {
            client: Some("2001:db8::7".parse().unwrap()),
            ..entry(b"GET /a HTTP/1.1", b"")
        };
        format_line(&mut out, &e, true);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["client"], "2001:db8::7");
        assert!(v["limiter"].is_null());
        let mut out = Vec::new();
        let e = Entry {
            limiter: Some("rate"),
            cache: None,
            ..entry(b"GET /a HTTP/1.1", b"")
        };
        format_line(&mut out, &e, true);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["limiter"], "rate");
        let mut out = Vec::new();
        format_line(&mut out, &e, false);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains(" shard=1 limiter=rate tls=-"));
    }

    #[test]
    fn sanitize_escapes_quotes_and_controls() {
        let mut out = Vec::new();
        sanitize_into(&mut out, b"/a\"b\\c\nd\xff e", 100);
        assert_eq!(out, b"/a\\x22b\\x5cc\\x0ad\\xff e".to_vec());
        let mut out = Vec::new();
        sanitize_into(&mut out, b"abcdef", 3);
        assert_eq!(out, b"abc");
    }
}
