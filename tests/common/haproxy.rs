//! A real HAProxy in front of test servers: started from a configuration's text on a loopback
//! port, killed on drop. `shipped` turns one of the configurations in `config/` into one that
//! runs here, changing only what a loopback test must.

use super::tls::tool;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on (for HAProxy's `bind`, which cannot take port 0 and
/// report it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `haproxy -db`; killed on drop.
pub struct Haproxy {
    child: Child,
    /// Where it listens (127.0.0.1 and the port its configuration binds).
    pub addr: SocketAddr,
    output: PathBuf,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts HAProxy with `config`, which binds 127.0.0.1:`port`, and waits until that port
    /// accepts connections. Its output (and its log, where `config` logs to stdout) is kept
    /// for `output()` and shown when a test fails. Fails naming the package when it is not
    /// installed.
    pub fn start(config: &str, port: u16) -> Haproxy {
        let haproxy = tool("haproxy", "haproxy");
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config).unwrap();
        let output = dir.path().join("haproxy.out");
        let out = std::fs::File::create(&output).unwrap();
        let child = Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn haproxy");
        let mut h = Haproxy {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            output,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(h.addr).is_err() {
            if let Some(st) = h.child.try_wait().unwrap() {
                panic!("haproxy exited ({st}):\n{}", h.output());
            }
            assert!(
                Instant::now() < deadline,
                "haproxy did not listen on {port}:\n{}",
                h.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        h
    }

    /// What HAProxy printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("haproxy output:\n{}", self.output());
        }
    }
}

/// `config/NAME` as shipped, with only what a loopback test must change, as perf/fleet.sh
/// does: the `bind :80` of its client frontend becomes 127.0.0.1:`port`, its `server` lines
/// become one per address of `servers` (edge1, edge2, ...), its log goes to stdout (a test
/// host may have no /dev/log), and `maxconn` drops to 1000 (100000 needs ~200k descriptors).
/// Everything else (timeouts, health checks, request rules) is the shipped file's. Fails when a
/// line it rewrites is gone, so a changed config cannot turn into an untested one.
pub fn shipped(name: &str, port: u16, servers: &[SocketAddr]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = String::new();
    let (mut bind, mut log, mut maxconn, mut server) = (0, 0, 0, 0);
    for line in text.lines() {
        match line {
            "    bind :80" => {
                bind += 1;
                out += &format!("    bind 127.0.0.1:{port}\n");
            }
            "    log /dev/log local0 info" => {
                log += 1;
                out += "    log stdout format raw local0 info\n";
            }
            "    maxconn 100000" => {
                maxconn += 1;
                out += "    maxconn 1000\n";
            }
            l if l.starts_with("    server edge") => {
                server += 1;
                if server == 1 {
                    for (i, a) in servers.iter().enumerate() {
                        out += &format!("    server edge{} {a}\n", i + 1);
                    }
                }
            }
            l => {
                out += l;
                out += "\n";
            }
        }
    }
    assert!(
        bind == 1 && log == 1 && maxconn == 1 && server > 0,
        "config/{name} no longer has the lines a test rewrites (bind :80 {bind}, log {log}, \
         maxconn {maxconn}, server edgeN {server})"
    );
    out
}
