//! The shipped front door (issue 45): a real HAProxy with `config/haproxy.cfg` (only its
//! addresses, log target and maxconn rewritten) in front of a real shardline. A request hidden
//! in a chunked body with bare-LF line ends is refused with 400 and never reaches shardline;
//! without the config's `http-request deny` rules the same bytes do reach it as a request of
//! their own (HAProxy 2.6 takes a bare LF as a chunk-line end; fixed upstream in 3.0), so the
//! check can fail. Plain GETs, with or without `Content-Length: 0`, still pass.

mod common;

use common::haproxy::{free_port, shipped, Haproxy};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"the secret object's bytes\n";

/// A GET with a chunked body whose chunk lines end in a bare LF. RFC 9112 allows only CRLF
/// there: a strict recipient refuses the message (HAProxy 3.0 does), and one that reads the
/// chunk line up to its CRLF sees `0`, an extension holding the hidden GET, and `Host: t` as a
/// trailer: one request. HAProxy 2.6 ends the chunk line at the LF (`0\n`, then `\n` ends the
/// trailers), so the hidden GET is a second request, which it forwards. `Connection: close` on
/// it makes HAProxy close once it is answered, so the client reads to the end without waiting
/// for a timeout.
const SMUGGLED: &[u8] =
    b"GET /a.bin?front HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
0\n\nGET /secret.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

/// What `wait_until_serving` asks for until it gets a 200.
const READY: &[u8] = b"GET /a.bin?ready HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

/// The lines of the shipped config that refuse body framing.
fn is_deny_rule(line: &str) -> bool {
    line.trim_start()
        .starts_with("http-request deny deny_status 400")
}

/// shardline (JSON access log, one shard so its log keeps arrival order) serving `a.bin` and
/// `secret.bin`, and HAProxy with `config` (`shipped`'s text for that shardline) in front.
struct FrontDoor {
    _server: common::Server,
    admin: SocketAddr,
    log: PathBuf,
    haproxy: Haproxy,
    _dir: tempfile::TempDir,
}

impl FrontDoor {
    fn start(edit: impl Fn(String) -> String) -> FrontDoor {
        let dir = common::disk_tempdir();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        common::write_pattern_file(&root.join("a.bin"), 1000);
        std::fs::write(root.join("secret.bin"), SECRET).unwrap();
        let log = dir.path().join("access.log");
        let cfg = dir.path().join("shardline.toml");
        std::fs::write(&cfg, "access_log_format = \"json\"\n").unwrap();
        let (server, admin) = common::start_with_admin(
            &root,
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--access-log",
                log.to_str().unwrap(),
                "--shards",
                "1",
            ],
        );
        let port = free_port();
        let haproxy = Haproxy::start(&edit(shipped("haproxy.cfg", port, &[server.addr])), port);
        let door = FrontDoor {
            _server: server,
            admin,
            log,
            haproxy,
            _dir: dir,
        };
        door.wait_until_serving();
        door
    }

    /// Until the shipped health check has reached shardline and a GET through HAProxy gets a
    /// 200 (HAProxy answers 503 while it counts no edge as up).
    fn wait_until_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let checked = self.logged().iter().any(|l| {
                l["request"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("GET /__shardline/health "))
                    && l["status"] == 200
            });
            if checked && status(&self.send(READY)) == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "HAProxy never had shardline up (health checked: {checked}); access log: {:?}",
                self.logged()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `bytes` through HAProxy on a fresh connection; everything until HAProxy closes.
    fn send(&self, bytes: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(self.haproxy.addr).unwrap();
        s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
        s.write_all(bytes).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("reading through HAProxy: {e}; got {:?}", text(&got)));
        got
    }

    /// The access log's lines so far.
    fn logged(&self) -> Vec<serde_json::Value> {
        logged(&self.log)
    }

    /// The access log once a line for a request containing `marker` is in it: shardline logs
    /// in arrival order on its one shard, so whatever HAProxy forwarded before is in it too.
    fn logged_through(&self, marker: &str) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self.logged();
            if lines
                .iter()
                .any(|l| l["request"].as_str().is_some_and(|r| r.contains(marker)))
            {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "no access log line for {marker}: {lines:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn logged(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The status of the first response in `got` (0 when there is none).
fn status(got: &[u8]) -> u16 {
    text(got)
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Access log lines whose request names `path`.
fn lines_for<'a>(lines: &'a [serde_json::Value], path: &str) -> Vec<&'a serde_json::Value> {
    lines
        .iter()
        .filter(|l| {
            l["request"]
                .as_str()
                .is_some_and(|r| r.contains(&format!(" {path}")))
        })
        .collect()
}

#[test]
fn the_shipped_config_refuses_body_framing_and_the_hidden_get_never_reaches_shardline() {
    let door = FrontDoor::start(|cfg| cfg);
    let got = door.send(SMUGGLED);
    assert_eq!(status(&got), 400, "{}", text(&got));
    // One answer, HAProxy's own, then the close: nothing was forwarded.
    assert_eq!(text(&got).matches("HTTP/1.1 ").count(), 1, "{}", text(&got));
    assert!(!text(&got).contains("shardline"), "{}", text(&got));
    // Any other body framing: a Content-Length other than 0, a chunked POST.
    for refused in [
        &b"GET /a.bin?cl5 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"[..],
        b"GET /a.bin?cl00 HTTP/1.1\r\nHost: t\r\nContent-Length: 00\r\n\r\n",
        b"POST /a.bin?post HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let got = door.send(refused);
        assert_eq!(status(&got), 400, "{}: {}", text(refused), text(&got));
    }
    // What clients send still passes: a plain GET, and one with Content-Length: 0.
    for (req, marker) in [
        (
            &b"GET /a.bin?plain HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"[..],
            "?plain",
        ),
        (
            b"GET /a.bin?cl0 HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            "?cl0",
        ),
    ] {
        let got = door.send(req);
        assert_eq!(status(&got), 200, "{marker}: {}", text(&got));
        assert!(got.ends_with(&common::pattern(1000)), "{marker}: body");
    }
    // Everything sent before the last 200 is logged before it: the hidden GET is not, nor
    // any of the refused requests.
    let lines = door.logged_through("/a.bin?cl0 HTTP");
    assert!(
        lines_for(&lines, "/secret.bin").is_empty(),
        "the hidden GET reached shardline: {lines:?}"
    );
    for marker in ["?front", "?cl5", "?cl00", "?post"] {
        assert!(
            lines_for(&lines, &format!("/a.bin{marker}")).is_empty(),
            "{marker} reached shardline: {lines:?}"
        );
    }
    // Nor did shardline refuse anything itself: HAProxy kept it all out.
    assert_eq!(
        common::admin_metric(
            door.admin,
            "shardline_requests_total",
            "status_class=\"4xx\""
        ),
        0
    );
}

/// The control: the shipped config minus its deny rules lets the same bytes through, so the
/// test above fails if the rules stop doing their work (and this one says so if a HAProxy
/// that refuses bare LF itself ever runs here).
#[test]
fn without_the_deny_rules_haproxy_forwards_the_hidden_get_to_shardline() {
    let stripped = std::cell::Cell::new(0);
    let door = FrontDoor::start(|cfg| {
        let kept: Vec<&str> = cfg.lines().filter(|l| !is_deny_rule(l)).collect();
        stripped.set(cfg.lines().count() - kept.len());
        kept.join("\n") + "\n"
    });
    assert_eq!(stripped.get(), 2, "config/haproxy.cfg's two deny rules");
    let got = door.send(SMUGGLED);
    let lines = door.logged_through("/secret.bin");
    let hidden = lines_for(&lines, "/secret.bin");
    assert_eq!(
        hidden.len(),
        1,
        "{}: the hidden GET did not reach shardline without the deny rules (a HAProxy that \
         refuses a bare LF itself? then the control needs a payload that gets through): {lines:?}",
        door.haproxy.output()
    );
    assert_eq!(hidden[0]["status"], 200, "{lines:?}");
    // shardline itself refused the outer request (body framing), and served the hidden one to
    // the client on the same connection.
    assert_eq!(lines_for(&lines, "/a.bin?front")[0]["status"], 400);
    assert_eq!(status(&got), 400, "{}", text(&got));
    assert!(got.ends_with(SECRET), "{}", text(&got));
}

/// Every HTTP-mode frontend shipped (`config/haproxy.cfg`'s, both of
/// `config/haproxy-tiers.cfg`'s) carries the same deny rules, which the tests above run.
#[test]
fn every_shipped_http_frontend_refuses_body_framing() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let read = |name: &str| std::fs::read_to_string(config.join(name)).unwrap();
    let rules: Vec<String> = read("haproxy.cfg")
        .lines()
        .filter(|l| is_deny_rule(l))
        .map(str::to_owned)
        .collect();
    assert_eq!(rules.len(), 2, "{rules:?}");
    for name in ["haproxy.cfg", "haproxy-tiers.cfg"] {
        let text = read(name);
        let mut frontends = 0;
        for section in text.split("\nfrontend ").skip(1) {
            frontends += 1;
            let body = section.split("\n\n").next().unwrap();
            let here: Vec<&str> = body.lines().filter(|l| is_deny_rule(l)).collect();
            assert_eq!(
                here,
                rules,
                "{name}: frontend {}",
                body.lines().next().unwrap()
            );
        }
        assert!(frontends > 0, "{name} has no frontend");
    }
}
