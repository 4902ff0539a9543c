//! Test helper (used by the fill's tests and `tests/cache_fill.rs`): nginx on loopback as a
//! real origin, serving a directory, with its own count of the body bytes it sent.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// nginx serving `root` on a free loopback port; stopped on drop.
pub struct NginxOrigin {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    work: PathBuf,
}

impl NginxOrigin {
    /// Starts nginx serving `root`, keeping its files in `work` (an existing directory),
    /// with `extra` added to its `http` block (e.g. `limit_rate 8m;`).
    pub fn start(root: &Path, work: &Path, extra: &str) -> NginxOrigin {
        NginxOrigin::start_with(root, work, extra, None)
    }

    /// As `start`, speaking HTTPS (TLS 1.2 and 1.3) with certificate chain `cert` and key
    /// `key` (PEM files).
    pub fn start_tls(
        root: &Path,
        work: &Path,
        extra: &str,
        cert: &Path,
        key: &Path,
    ) -> NginxOrigin {
        NginxOrigin::start_with(root, work, extra, Some((cert, key)))
    }

    fn start_with(
        root: &Path,
        work: &Path,
        extra: &str,
        tls: Option<(&Path, &Path)>,
    ) -> NginxOrigin {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let listen = match tls {
            Some((cert, key)) => format!(
                "listen {addr} ssl; ssl_certificate {}; ssl_certificate_key {}; \
                 ssl_protocols TLSv1.2 TLSv1.3;",
                cert.display(),
                key.display()
            ),
            None => format!("listen {addr};"),
        };
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n\
             http {{ log_format sent '$body_bytes_sent $status \"$http_range\" \"$http_if_none_match\" \"$uri\" \"$connection_requests\" \"$args\"';\n\
               access_log {d}/access.log sent; keepalive_requests 100000; {extra}\n\
               client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
               uwsgi_temp_path {d}; scgi_temp_path {d};\n\
               server {{ {listen} root {r}; location / {{ }} }} }}\n",
            d = work.display(),
            r = root.display(),
        );
        std::fs::write(work.join("nginx.conf"), conf).expect("nginx.conf");
        let child = Command::new(nginx_bin())
            .arg("-p")
            .arg(work)
            .arg("-c")
            .arg(work.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts (scripts/test-deps.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        NginxOrigin {
            child,
            addr,
            work: work.to_path_buf(),
        }
    }

    /// Body bytes nginx has sent so far (its access log: one line per finished request).
    pub fn body_bytes_sent(&self) -> u64 {
        self.log().iter().map(|l| l.body_bytes).sum()
    }

    /// What nginx logged, a line per finished request, in order.
    pub fn log(&self) -> Vec<OriginLogLine> {
        let log = std::fs::read_to_string(self.work.join("access.log")).unwrap_or_default();
        log.lines().map(OriginLogLine::parse).collect()
    }

    /// Stops nginx (requests to it are refused from now on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (at most 5 s) for nginx to have logged at least `want` body bytes (it logs a
    /// request when it ends), then returns its count.
    pub fn wait_body_bytes(&self, want: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.body_bytes_sent() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.body_bytes_sent()
    }

    /// Waits (at most 5 s) for nginx to have logged at least `want` requests (it logs one
    /// when it ends, which may be after its answer reached us), then returns its log.
    pub fn wait_requests(&self, want: usize) -> Vec<OriginLogLine> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.requests() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.log()
    }

    /// Requests nginx has logged.
    pub fn requests(&self) -> usize {
        std::fs::read_to_string(self.work.join("access.log"))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// One request as nginx logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginLogLine {
    /// Body bytes sent.
    pub body_bytes: u64,
    /// The status sent.
    pub status: u16,
    /// The request's Range header ("-" when none).
    pub range: String,
    /// The request's If-None-Match header ("-" when none).
    pub if_none_match: String,
    /// The request's path.
    pub uri: String,
    /// Requests its connection had carried, this one included (2 and up: kept alive).
    pub connection_requests: u32,
    /// The request's query ("" when none).
    pub args: String,
}

impl OriginLogLine {
    fn parse(line: &str) -> OriginLogLine {
        let (bytes, rest) = line.trim().split_once(' ').expect("a logged request");
        let (status, rest) = rest.split_once(' ').expect("a status");
        // nginx writes a quote inside a field as \x22; the fields' own quotes are literal.
        let mut quoted = rest
            .split('"')
            .filter(|f| !f.trim().is_empty())
            .map(|f| f.replace("\\x22", "\""));
        OriginLogLine {
            body_bytes: bytes.parse().expect("a byte count"),
            status: status.parse().expect("a status"),
            range: quoted.next().unwrap_or_else(|| "-".into()),
            if_none_match: quoted.next().unwrap_or_else(|| "-".into()),
            uri: quoted.next().unwrap_or_default(),
            connection_requests: quoted.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            args: quoted.next().unwrap_or_default(),
        }
    }

    /// The first and last byte of its Range (`bytes=a-b`), if it had one.
    pub fn range_bytes(&self) -> Option<(u64, u64)> {
        let (a, b) = self.range.strip_prefix("bytes=")?.split_once('-')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }
}

impl Drop for NginxOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx binary (Debian puts it in /usr/sbin).
pub fn nginx_bin() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("nginx is not installed: scripts/test-deps.sh installs it (the origin of these tests)");
}
