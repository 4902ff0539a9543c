//! Who is asking (issue 19): every connection's peer address reaches the access log, over
//! cleartext and HTTPS, from several source addresses (loopback has all of 127.0.0.0/8); behind
//! HAProxy with `send-proxy-v2` the logged address is the client's; a PROXY header from an
//! untrusted peer, a malformed one and one truncated at every byte offset close the connection
//! and are counted.

mod common;

use common::haproxy::{free_port, Haproxy};
use common::tls::{run_bounded, tool, Key, Pki};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// The access log's JSON lines once `n` have been written (waits up to 10 s).
fn log_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_access_log_names_each_clients_own_address() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("a.bin"), 100_000);
    let log = dir.path().join("access.log");
    let pki = Pki::new();
    let leaf = pki.leaf("leaf", &["localhost"], Key::EcdsaP256, 30);
    let cfg = pki.config(&[leaf], "access_log_format = \"json\"");
    let server = common::Server::start_tls(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let http = server.addr.port();
    let https = server.tls_addr.expect("HTTPS address").port();
    let curl = tool("curl", "curl");
    let sources = ["127.0.0.2", "127.0.0.3", "127.0.0.44", "127.1.2.3"];
    for (i, src) in sources.iter().enumerate() {
        let url = if i % 2 == 0 {
            format!("http://127.0.0.1:{http}/a.bin?from={src}")
        } else {
            format!("https://localhost:{https}/a.bin?from={src}")
        };
        let o = run_bounded(
            Command::new(&curl)
                .args(["-sS", "--fail", "-o", "/dev/null", "--interface", src])
                .args(["--cacert", pki.ca.to_str().unwrap()])
                .args(["--resolve", &format!("localhost:{https}:127.0.0.1")])
                .arg(&url),
            Duration::from_secs(30),
        );
        assert!(
            o.status.success(),
            "curl from {src}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lines = log_lines(&log, sources.len());
    assert_eq!(lines.len(), sources.len(), "{lines:?}");
    for src in sources {
        let line = lines
            .iter()
            .find(|l| {
                l["request"]
                    .as_str()
                    .unwrap_or("")
                    .contains(&format!("from={src} "))
            })
            .unwrap_or_else(|| panic!("no line for {src}: {lines:?}"));
        assert_eq!(line["client"], src, "{line}");
        assert_eq!(line["status"], 200);
    }
}

/// HAProxy in TCP mode on 127.0.0.1:`port` in front of `backend`, with `send-proxy-v2`.
fn tcp_haproxy(port: u16, backend: SocketAddr) -> Haproxy {
    Haproxy::start(
        &format!(
            "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30s\n  \
             timeout server 30s\nfrontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
             backend b\n  server s {backend} send-proxy-v2\n"
        ),
        port,
    )
}

/// A server whose listeners both expect PROXY headers from `trusted`, with a JSON access log.
fn proxied_server(
    trusted: &str,
) -> (
    common::Server,
    SocketAddr,
    Pki,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("a.bin"), 100_000);
    let log = dir.path().join("access.log");
    let pki = Pki::new();
    let leaf = pki.leaf("leaf", &["localhost"], Key::EcdsaP256, 30);
    let cfg = pki.config(
        &[leaf],
        &format!(
            "access_log_format = \"json\"\nproxy_protocol = true\ntls_proxy_protocol = true\n\
             trusted_proxies = [\"{trusted}\"]"
        ),
    );
    let (server, admin) = common::start_tls_with_admin(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    (server, admin, pki, dir, log)
}

#[test]
fn behind_haproxy_send_proxy_v2_the_log_names_the_client_not_the_balancer() {
    let (server, admin, pki, _dir, log) = proxied_server("127.0.0.1");
    let (p_http, p_https) = (free_port(), free_port());
    let _h1 = tcp_haproxy(p_http, server.addr);
    let _h2 = tcp_haproxy(p_https, server.tls_addr.expect("HTTPS address"));
    // Our readiness probes of HAProxy made connections (and headers) of their own.
    let accepted = |admin| {
        common::admin_metric(
            admin,
            "shardline_proxy_headers_total",
            "result=\"accepted\"",
        )
    };
    let before = accepted(admin);
    let curl = tool("curl", "curl");
    let sources = ["127.0.0.8", "127.0.0.9"];
    for (i, src) in sources.iter().enumerate() {
        let url = if i == 0 {
            format!("http://127.0.0.1:{p_http}/a.bin?via=haproxy")
        } else {
            format!("https://localhost:{p_https}/a.bin?via=haproxy-tls")
        };
        let o = run_bounded(
            Command::new(&curl)
                .args(["-sS", "--fail", "--interface", src, "-o"])
                .arg(_dir.path().join(format!("got-{i}")))
                .args(["--cacert", pki.ca.to_str().unwrap()])
                .args(["--resolve", &format!("localhost:{p_https}:127.0.0.1")])
                .arg(&url),
            Duration::from_secs(30),
        );
        assert!(
            o.status.success(),
            "curl via haproxy from {src}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = std::fs::read(_dir.path().join(format!("got-{i}"))).unwrap();
        assert_eq!(got, common::pattern(100_000), "body through haproxy");
    }
    let lines = log_lines(&log, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, src) in lines.iter().zip(sources) {
        assert_eq!(line["client"], src, "{line}");
    }
    // Each curl is one connection through HAProxy, with one header (the probes' own
    // connections may still be arriving: at least the two, at most two more).
    let after = accepted(admin);
    assert!(
        after >= before + 2 && after <= 4,
        "accepted {before} -> {after}"
    );
}

/// Sends `bytes` on a fresh connection (then closes the write side when `close`) and returns
/// what the server answered before it closed.
fn exchange(addr: SocketAddr, bytes: &[u8], close: bool) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn untrusted_malformed_and_truncated_proxy_headers_are_closed_and_counted() {
    let request = b"GET /a.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let mut v2 = Vec::new();
    shardline::client::proxy_protocol::encode_v2(
        "198.51.100.1:5000".parse().unwrap(),
        "127.0.0.1:80".parse().unwrap(),
        &mut v2,
    );
    let v1 = b"PROXY TCP4 198.51.100.2 127.0.0.1 5001 80\r\n".to_vec();

    // From an untrusted peer, even a valid header is refused.
    let (server, admin, _pki, _dir, _log) = proxied_server("10.9.9.9");
    let got = exchange(server.addr, &[v2.clone(), request.to_vec()].concat(), false);
    assert!(
        got.is_empty(),
        "an untrusted peer got an answer: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        common::admin_metric(
            admin,
            "shardline_proxy_headers_total",
            "result=\"untrusted\""
        ),
        1
    );
    drop(server);

    let (server, admin, _pki, _dir, _log) = proxied_server("127.0.0.0/8");
    // A request without a header, and a spoofed header after bytes, are malformed.
    for bad in [request.to_vec(), [b"GET ".to_vec(), v1.clone()].concat()] {
        let got = exchange(server.addr, &bad, false);
        assert!(
            got.is_empty(),
            "malformed got: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // Every truncation of both versions, then a close.
    let mut truncations = 0;
    for h in [&v1, &v2] {
        for cut in 1..h.len() {
            let got = exchange(server.addr, &h[..cut], true);
            assert!(got.is_empty(), "truncated at {cut} got an answer");
            truncations += 1;
        }
    }
    // Every truncation followed by the request instead of the rest, then a close: never
    // served. Where the request's bytes read as a v2 length longer than what follows, the
    // header is still incomplete at the close and counts as truncated (the close makes that
    // deterministic: without it the client's read timeout raced the header timeout).
    for h in [&v1, &v2] {
        for cut in 1..h.len() {
            let sent = [&h[..cut], &request[..]].concat();
            let got = exchange(server.addr, &sent, true);
            assert!(
                !got.starts_with(b"HTTP/1.1 200"),
                "a header cut at {cut} and a request were served"
            );
            if shardline::client::proxy_protocol::parse(&sent)
                == shardline::client::proxy_protocol::Parse::Incomplete
            {
                truncations += 1;
            }
        }
    }
    let m = |r: &str| {
        common::admin_metric(
            admin,
            "shardline_proxy_headers_total",
            &format!("result=\"{r}\""),
        )
    };
    assert_eq!(m("truncated"), truncations);
    assert!(m("malformed") >= 2, "malformed {}", m("malformed"));
    // The server still serves a proper client. (A v2 header cut after its length field and
    // followed by request bytes is a complete header with nonsense addresses: length-prefixed
    // binary cannot tell; the request after it is then malformed, never a 200, as above.)
    let before = m("accepted");
    let got = exchange(server.addr, &[v1.clone(), request.to_vec()].concat(), false);
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got[..got.len().min(200)])
    );
    assert_eq!(m("accepted"), before + 1);
}

#[test]
fn x_forwarded_for_counts_only_from_a_trusted_peer_right_most_untrusted_hop() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("a.bin"), 1000);
    let log = dir.path().join("access.log");
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        "access_log_format = \"json\"\ntrusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\"]\n",
    )
    .unwrap();
    let server = common::Server::start(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let curl = tool("curl", "curl");
    let port = server.addr.port();
    // (source address, header, logged client)
    let cases = [
        // A trusted peer: the right-most hop that is not a trusted proxy.
        (
            "127.0.0.1",
            "X-Forwarded-For: 203.0.113.1, 198.51.100.9, 10.1.1.1",
            "198.51.100.9",
        ),
        (
            "127.0.0.1",
            "Forwarded: for=\"[2001:db8::5]:443\"",
            "2001:db8::5",
        ),
        // An untrusted peer spoofing the header: its own address.
        ("127.0.0.6", "X-Forwarded-For: 203.0.113.66", "127.0.0.6"),
        ("127.0.0.6", "Forwarded: for=203.0.113.67", "127.0.0.6"),
    ];
    for (i, (src, header, _)) in cases.iter().enumerate() {
        let o = run_bounded(
            Command::new(&curl)
                .args([
                    "-sS",
                    "--fail",
                    "-o",
                    "/dev/null",
                    "--interface",
                    src,
                    "-H",
                    header,
                ])
                .arg(format!("http://127.0.0.1:{port}/a.bin?case={i}")),
            Duration::from_secs(30),
        );
        assert!(
            o.status.success(),
            "curl case {i}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lines = log_lines(&log, cases.len());
    for (i, (_, header, want)) in cases.iter().enumerate() {
        let line = lines
            .iter()
            .find(|l| {
                l["request"]
                    .as_str()
                    .unwrap_or("")
                    .contains(&format!("case={i} "))
            })
            .unwrap_or_else(|| panic!("no line for case {i}: {lines:?}"));
        assert_eq!(line["client"], *want, "{header}: {line}");
    }
}

/// A kept-alive connection from `src` that has had one 200.
fn connect_from(src: &str, server: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from: SocketAddr = format!("{src}:0").parse().unwrap();
    sock.bind(&from.into()).unwrap();
    sock.connect(&server.into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends a GET of the 1000-byte file on `s` and reads the response head and body (keep-alive)
/// or everything until the close; the status.
fn get_on(s: &mut TcpStream) -> (u16, String) {
    s.write_all(b"GET /a.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|l| body.len() >= l) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[test]
fn the_connection_cap_holds_per_client_across_shards() {
    for action in ["429", "close"] {
        let dir = common::disk_tempdir();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        common::write_pattern_file(&root.join("a.bin"), 1000);
        let cfg = dir.path().join("shardline.toml");
        std::fs::write(
            &cfg,
            format!("max_connections_per_client = 3\nclient_cap_action = \"{action}\"\n"),
        )
        .unwrap();
        let (server, admin) =
            common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "2"]);
        // Three kept-alive connections from one address, spread over both shards by the
        // kernel's hash: all served.
        let mut held: Vec<TcpStream> = (0..3)
            .map(|_| connect_from("127.0.0.2", server.addr))
            .collect();
        for s in held.iter_mut() {
            assert_eq!(get_on(s).0, 200, "{action}: under the cap");
        }
        // A fourth from the same address: over the cap.
        let mut fourth = connect_from("127.0.0.2", server.addr);
        let (status, text) = get_on(&mut fourth);
        if action == "429" {
            assert_eq!(status, 429, "{text}");
            assert!(text.contains("Retry-After: 5"), "{text}");
        } else {
            assert_eq!(status, 0, "closed before any answer: {text}");
        }
        // Another client is not affected.
        assert_eq!(get_on(&mut connect_from("127.0.0.3", server.addr)).0, 200);
        assert_eq!(
            common::admin_metric(admin, "shardline_client_cap_refused_total", ""),
            1
        );
        // One of the three closes: its place is free again.
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (status, _) = get_on(&mut connect_from("127.0.0.2", server.addr));
            if status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{action}: the freed place never came back"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn an_ipv6_listener_logs_and_caps_its_clients_by_their_ipv6_address() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    common::write_pattern_file(&root.join("a.bin"), 1000);
    let log = dir.path().join("access.log");
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "access_log = \"{}\"\naccess_log_format = \"json\"\nmax_connections_per_client = 2\n",
            log.display()
        ),
    )
    .unwrap();
    let (server, admin) = common::start_with_admin(
        &root,
        &["--config", cfg.to_str().unwrap(), "--listen", "[::1]:0"],
    );
    assert!(server.addr.is_ipv6(), "listening on {}", server.addr);
    let connect = || {
        let s = TcpStream::connect(server.addr).expect("connect to [::1]");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut held = [connect(), connect()];
    for s in held.iter_mut() {
        assert_eq!(get_on(s).0, 200, "under the cap");
    }
    // A third from ::1 (the same /64): over the cap, answered 429.
    let (status, text) = get_on(&mut connect());
    assert_eq!(status, 429, "{text}");
    assert_eq!(
        common::admin_metric(admin, "shardline_client_cap_refused_total", ""),
        1
    );
    let lines = log_lines(&log, 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(line["client"], "::1", "{line}");
    }
}

/// The HAProxy configurations shipped in `config/` (one tier, layer 4, two cache tiers) are
/// valid for the HAProxy the tests run (`haproxy -c`).
#[test]
fn shipped_haproxy_configs_are_valid() {
    let haproxy = tool("haproxy", "haproxy");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    for name in ["haproxy.cfg", "haproxy-l4.cfg", "haproxy-tiers.cfg"] {
        let out = Command::new(&haproxy)
            .arg("-c")
            .arg("-f")
            .arg(dir.join(name))
            .output()
            .expect("run haproxy -c");
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
