//! The admin listener against the real binary: `/metrics` parses back and moves with traffic,
//! `/healthz` turns 503 while a SIGTERM drain is in progress, other paths and methods are
//! refused, and a bad or busy admin address is a configuration error (exit code 2). Control
//! (everything under `/cache/`) needs the bearer token of `admin_token_file` (issue 47): 401
//! without it or with a wrong one, 403 when no token file is set, 429 past the rate; a token
//! file others may read refuses the start; a server-side prefill reads no file outside
//! `prefill_dir`; the CLI sends the token of `--token-file`.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    disk_tempdir, get, pattern, raw_request, read_response, start_with_admin, Response, IO_TIMEOUT,
};
use shardline::metrics::{parse_exposition, Sample};

/// One request to the admin listener on a fresh connection.
fn admin_request(addr: SocketAddr, method: &str, path: &str) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect to admin");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: admin\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let resp = read_response(&mut BufReader::new(s), method == "HEAD").expect("admin response");
    assert_eq!(
        resp.header("connection"),
        Some("close"),
        "{method} {path}: {resp:?}"
    );
    resp
}

fn scrape(addr: SocketAddr) -> Vec<Sample> {
    let r = admin_request(addr, "GET", "/metrics");
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = String::from_utf8(r.body).expect("metrics are UTF-8");
    parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Sum of a family's samples whose labels include all of `labels`.
fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
        .sum()
}

fn healthz(addr: SocketAddr) -> (u16, String) {
    let r = admin_request(addr, "GET", "/healthz");
    (
        r.status,
        String::from_utf8_lossy(&r.body).trim().to_string(),
    )
}

#[test]
fn metrics_parse_back_and_counters_move() {
    let dir = disk_tempdir();
    let len = 200 * 1024;
    std::fs::write(dir.path().join("pkg.bin"), pattern(len)).unwrap();
    let (server, admin) = start_with_admin(dir.path(), &[]);

    // Totals are sums over the per-shard series (there is no shard="all" series).
    let all: [(&str, &str); 0] = [];
    let get_2xx = [("method", "GET"), ("status_class", "2xx")];
    let get_4xx = [("method", "GET"), ("status_class", "4xx")];
    let before = scrape(admin);
    let accepted0 = total(&before, "shardline_connections_accepted_total", &all);
    let ok0 = total(&before, "shardline_requests_total", &get_2xx);
    let bytes0 = total(&before, "shardline_bytes_sent_total", &all);

    for _ in 0..3 {
        let r = get(&server, "/pkg.bin", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), len);
    }
    let r = get(&server, "/missing", &[]);
    assert_eq!(r.status, 404);
    let head = b"HEAD /pkg.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_request(&server, head).unwrap().status, 200);
    // Refused before its method counted: labelled "other".
    assert_eq!(
        raw_request(&server, b"GET / HTTP/1.1\n\n").unwrap().status,
        400
    );

    // The shard publishes its counters as it completes work: poll briefly.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let s = scrape(admin);
        let moved = total(&s, "shardline_connections_accepted_total", &all) >= accepted0 + 4.0
            && total(&s, "shardline_requests_total", &get_2xx) >= ok0 + 3.0
            && total(&s, "shardline_requests_total", &get_4xx) >= 1.0
            && total(&s, "shardline_requests_total", &[("method", "other")]) >= 1.0
            && total(&s, "shardline_bytes_sent_total", &all) >= bytes0 + 3.0 * len as f64;
        if moved {
            break s;
        }
        assert!(Instant::now() < deadline, "counters did not move:\n{s:#?}");
        std::thread::sleep(Duration::from_millis(50));
    };

    // Every sample of a shard family names its shard by number; nothing is pre-summed, so a
    // PromQL sum() counts each event once. The old per-status family is gone. The host's
    // families and the admin listener's own (its refusals) are one per process.
    for s in after.iter().filter(|s| {
        !s.name.starts_with("shardline_host_") && !s.name.starts_with("shardline_admin_")
    }) {
        let shard = s
            .label("shard")
            .unwrap_or_else(|| panic!("no shard label: {s:?}"));
        assert!(shard.parse::<usize>().is_ok(), "{s:?}");
    }
    assert!(!after.iter().any(|s| s.name == "shardline_responses_total"));
    let head_2xx = [("method", "HEAD"), ("status_class", "2xx")];
    assert_eq!(total(&after, "shardline_requests_total", &head_2xx), 1.0);
    let other_4xx = [("method", "other"), ("status_class", "4xx")];
    assert_eq!(total(&after, "shardline_requests_total", &other_4xx), 1.0);
    assert!(total(&after, "shardline_ring_sqes_total", &all) > 0.0);
    assert!(total(&after, "shardline_file_cache_misses_total", &all) > 0.0);

    // The histogram is well-formed whether or not the shards observe into it yet.
    let buckets: Vec<&Sample> = after
        .iter()
        .filter(|s| s.name == "shardline_ttfb_seconds_bucket" && s.label("shard") == Some("0"))
        .collect();
    assert!(buckets.len() > 10);
    assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value));
    assert_eq!(buckets.last().unwrap().label("le"), Some("+Inf"));
    assert_eq!(
        buckets.last().unwrap().value,
        total(&after, "shardline_ttfb_seconds_count", &all)
    );

    assert!(total(&after, "shardline_ttfb_seconds_count", &all) >= 4.0);
    assert!(
        after
            .iter()
            .any(|s| s.name == "shardline_buffer_wait_seconds_bucket"
                && s.label("le") == Some("+Inf"))
    );

    // Host reclaim counters and page-cache size come from this host's /proc.
    if std::path::Path::new("/proc/meminfo").exists() {
        assert!(after
            .iter()
            .any(|s| s.name == "shardline_host_page_cache_bytes"));
        assert!(after
            .iter()
            .any(|s| s.name == "shardline_host_vmstat_total"
                && s.label("name") == Some("pgscan_direct")));
    }
}

#[test]
fn healthz_turns_503_while_draining() {
    let dir = disk_tempdir();
    // Sparse: big enough that the kernel socket buffers cannot hold the whole response, so the
    // download stays in flight while the client does not read.
    let len: u64 = 48 * 1024 * 1024;
    std::fs::File::create(dir.path().join("big.bin"))
        .unwrap()
        .set_len(len)
        .unwrap();
    let config = dir.path().join("drain.toml");
    std::fs::write(&config, "drain_timeout_ms = 30000\n").unwrap();
    let (mut server, admin) = start_with_admin(dir.path(), &["--config", config.to_str().unwrap()]);
    assert_eq!(healthz(admin), (200, "ok".into()));

    // Start the download and read only its head and a little body.
    let mut client = server.connect();
    client
        .write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut first = vec![0u8; 64 * 1024];
    client.read_exact(&mut first).unwrap();
    let head_end = first
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head")
        + 4;
    assert!(first.starts_with(b"HTTP/1.1 200"), "{:?}", &first[..40]);

    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = healthz(admin);
        if status == 503 {
            assert_eq!(body, "draining");
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "healthz never turned 503");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Draining, not gone: the process runs and still answers scrapes.
    assert!(
        server.alive(),
        "server exited while a download was in flight"
    );
    assert!(!scrape(admin).is_empty());
    assert_eq!(healthz(admin).0, 503);

    // The in-flight download completes during the drain, then the process exits cleanly.
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert_eq!(
        (first.len() - head_end + rest.len()) as u64,
        len,
        "download cut short by the drain"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "no exit after the drain");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(
        TcpStream::connect(admin).is_err(),
        "admin still listening after exit"
    );
}

#[test]
fn other_paths_are_404_and_other_methods_405() {
    let dir = disk_tempdir();
    let (server, admin) = start_with_admin(dir.path(), &[]);
    for path in ["/", "/metrics/", "/health", "/healthz/x", "/big.bin"] {
        assert_eq!(admin_request(admin, "GET", path).status, 404, "{path}");
    }
    for method in ["POST", "PUT", "DELETE"] {
        let r = admin_request(admin, method, "/metrics");
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
    }
    let r = admin_request(admin, "HEAD", "/healthz");
    assert_eq!((r.status, r.header("content-length")), (200, Some("3")));
    assert_eq!(healthz(admin).0, 200);
    // The data listener does not serve the admin routes.
    assert_eq!(get(&server, "/healthz", &[]).status, 404);
}

#[test]
fn buffer_waits_show_in_their_histogram() {
    // The smallest arena (8 chunks of 64 KiB, 4 held back for small responses) and eight
    // downloads whose clients do not read (4 KiB receive buffers): their sends cannot finish,
    // so they hold the large-response chunks and the others must wait for a buffer. The test
    // waits for that state on the metric rather than hoping a race produces it.
    let dir = disk_tempdir();
    let len = 4 << 20;
    std::fs::write(dir.path().join("big.bin"), pattern(len)).unwrap();
    let config = dir.path().join("small-arena.toml");
    std::fs::write(
        &config,
        "chunk_bytes = 65536\narena_bytes = 524288\ntick_budget_bytes = 65536\n\
         shard_tick_budget_bytes = 65536\n",
    )
    .unwrap();
    let (server, admin) = start_with_admin(dir.path(), &["--config", config.to_str().unwrap()]);
    let clients: Vec<TcpStream> = (0..8)
        .map(|_| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            s.set_recv_buffer_size(4096).expect("SO_RCVBUF");
            s.connect(&server.addr.into()).expect("connect");
            let mut s: TcpStream = s.into();
            s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    let deadline = Instant::now() + IO_TIMEOUT;
    while total(&scrape(admin), "shardline_arena_waits_total", &[]) == 0.0 {
        assert!(
            Instant::now() < deadline,
            "no download waited for a buffer while eight clients held theirs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let want = pattern(len);
    let readers: Vec<_> = clients
        .into_iter()
        .map(|s| std::thread::spawn(move || read_response(&mut BufReader::new(s), false).unwrap()))
        .collect();
    for r in readers {
        let r = r.join().unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body == want, "body differs");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = scrape(admin);
        let waits = total(&s, "shardline_arena_waits_total", &[]);
        let observed = total(&s, "shardline_buffer_wait_seconds_count", &[]);
        let inf = total(
            &s,
            "shardline_buffer_wait_seconds_bucket",
            &[("le", "+Inf")],
        );
        // Every wait that began has ended (the downloads are done), so each was observed once.
        if waits > 0.0 && observed == waits {
            assert_eq!(inf, observed);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "arena waits {waits}, buffer-wait observations {observed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `request` on a fresh admin connection and reads the whole reply (the listener closes).
fn raw_admin(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect to admin");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("admin reply");
    out
}

#[test]
fn answers_while_hundreds_of_connections_stall() {
    let dir = disk_tempdir();
    let (_server, admin) = start_with_admin(dir.path(), &[]);
    // Idle connections that never send, and heads that stop half-way.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(admin).expect("idle connect"))
        .collect();
    let half: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(admin).expect("half-open connect");
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect();
    // IO_TIMEOUT is only a guard against a hang: the point is that these are answered at all
    // while the stalled connections are open (one-at-a-time serving made them wait ~2 s each).
    assert_eq!(healthz(admin), (200, "ok".into()));
    assert!(!scrape(admin).is_empty());
    assert_eq!(healthz(admin).0, 200);
    // A bare LF is no line end for the admin either (the data path's parser decides).
    let reply = raw_admin(admin, b"GET /healthz HTTP/1.0\n\n");
    assert!(
        reply.starts_with(b"HTTP/1.1 400 "),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    let reply = raw_admin(admin, b"\n\n");
    assert!(
        reply.starts_with(b"HTTP/1.1 400 "),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    drop((idle, half));
    assert_eq!(healthz(admin).0, 200);
}

/// Runs `shardline serve` expecting it to fail at start-up; returns (exit code, stderr).
fn serve_fails(root: &std::path::Path, admin: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .arg("serve")
        .arg("--root")
        .arg(root)
        .args(["--listen", "127.0.0.1:0", "--shards", "1", "--admin", admin])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("shardline kept running with --admin {admin:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn bad_or_busy_admin_address_is_a_config_error() {
    let dir = disk_tempdir();
    let (code, err) = serve_fails(dir.path(), "localhost:nine");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("admin"), "{err}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = serve_fails(dir.path(), &addr);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("admin") && err.contains(&addr), "{err}");
}

// ---- control needs the token (issue 47) ---------------------------------------------------------

/// One request to the admin listener carrying `auth` as its Authorization header, if any.
fn control(addr: SocketAddr, method: &str, target: &str, auth: Option<&str>) -> Response {
    let mut s = TcpStream::connect(addr).expect("connect to admin");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let req = format!("{method} {target} HTTP/1.1\r\nHost: admin\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).unwrap();
    read_response(&mut BufReader::new(s), method == "HEAD").expect("admin response")
}

fn body(r: &Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// A server with a pull-through cache (its origin never reached), a control token and
/// `extra` config lines; the token, its admin address and the work directory.
struct Controlled {
    server: common::Server,
    admin: SocketAddr,
    token: common::AdminToken,
    dir: tempfile::TempDir,
}

impl Controlled {
    /// `extra` may name `{dir}`: the work directory.
    fn start(extra: &str) -> Controlled {
        let dir = disk_tempdir();
        let root = dir.path().join("root");
        let cache = dir.path().join("cache");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&cache).unwrap();
        std::fs::create_dir(dir.path().join("prefill")).unwrap();
        let extra = extra.replace("{dir}", dir.path().to_str().unwrap());
        let token = common::AdminToken::write_in(dir.path());
        let cfg = dir.path().join("shardline.toml");
        std::fs::write(
            &cfg,
            format!(
                "cache_dir = \"{}\"\n{}{extra}\n[[origin]]\nprefix = \"/pull/\"\n\
                 url = \"http://127.0.0.1:9\"\n",
                cache.display(),
                token.config_line()
            ),
        )
        .unwrap();
        let (server, admin) = start_with_admin(&root, &["--config", cfg.to_str().unwrap()]);
        Controlled {
            server,
            admin,
            token,
            dir,
        }
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token.token)
    }
}

#[test]
fn control_needs_the_token_and_metrics_and_healthz_do_not() {
    let c = Controlled::start("");
    let purge = "/cache/purge?prefix=/pull/";
    let r = control(c.admin, "POST", purge, None);
    assert_eq!(r.status, 401, "{}", body(&r));
    assert!(
        r.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "{r:?}"
    );
    let wrong = format!("Bearer {}x", c.token.token);
    assert_eq!(control(c.admin, "POST", purge, Some(&wrong)).status, 401);
    assert_eq!(
        control(c.admin, "POST", purge, Some("Basic YWRtaW46YWRtaW4=")).status,
        401
    );
    let r = control(c.admin, "POST", purge, Some(&c.bearer()));
    assert_eq!((r.status, body(&r).trim()), (200, "purged 0"));
    // Every control endpoint, read or write, is behind the token.
    for (method, target) in [
        ("GET", "/cache/object?target=/pull/a.bin"),
        ("GET", "/cache/prefill"),
        ("POST", "/cache/pin?target=/pull/a.bin&until=1"),
        ("POST", "/cache/prefill/begin"),
    ] {
        assert_eq!(
            control(c.admin, method, target, None).status,
            401,
            "{target}"
        );
    }
    let r = control(
        c.admin,
        "GET",
        "/cache/object?target=/pull/a.bin",
        Some(&c.bearer()),
    );
    assert_eq!(r.status, 200, "{}", body(&r));
    // The read-only routes need nothing, and count the refusals.
    assert_eq!(healthz(c.admin), (200, "ok".into()));
    let s = scrape(c.admin);
    assert_eq!(
        total(
            &s,
            "shardline_admin_refused_total",
            &[("reason", "no_credential")]
        ),
        5.0
    );
    assert_eq!(
        total(
            &s,
            "shardline_admin_refused_total",
            &[("reason", "bad_credential")]
        ),
        2.0
    );
    assert!(
        !c.server.log().contains(&c.token.token),
        "the token was logged"
    );
}

#[test]
fn without_a_token_file_control_is_off() {
    let dir = disk_tempdir();
    let (server, admin) = start_with_admin(dir.path(), &[]);
    let r = control(admin, "POST", "/cache/purge?path=/a", None);
    assert_eq!(r.status, 403);
    assert!(body(&r).contains("admin_token_file"), "{}", body(&r));
    let r = control(
        admin,
        "POST",
        "/cache/prefill?list=/etc/passwd",
        Some("Bearer anything-at-all-0123456789"),
    );
    assert_eq!(r.status, 403);
    assert!(!body(&r).contains("root:"), "{}", body(&r));
    assert_eq!(healthz(admin).0, 200);
    let s = scrape(admin);
    assert_eq!(
        total(
            &s,
            "shardline_admin_refused_total",
            &[("reason", "control_off")]
        ),
        2.0
    );
    assert_eq!(
        server.log().matches("control is off").count(),
        1,
        "said once at start-up: {}",
        server.log()
    );
}

#[test]
fn a_prefill_reads_no_file_outside_prefill_dir() {
    // No prefill_dir: a server-side prefill is off, whatever the list.
    let c = Controlled::start("");
    let r = control(
        c.admin,
        "POST",
        "/cache/prefill?list=/etc/passwd",
        Some(&c.bearer()),
    );
    assert_eq!(r.status, 403, "{}", body(&r));
    assert!(body(&r).contains("prefill_dir") && !body(&r).contains("root:"));
    drop(c);

    let c = Controlled::start("prefill_dir = \"{dir}/prefill\"");
    let prefill = c.dir.path().join("prefill");
    // A secret beside the prefill directory, and a symlink to it and to /etc/passwd inside.
    let secret = c.dir.path().join("secret.txt");
    std::fs::write(&secret, "root:SECRET-LINE-1\nroot:SECRET-LINE-2\n").unwrap();
    std::os::unix::fs::symlink(&secret, prefill.join("out.txt")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", prefill.join("passwd")).unwrap();
    std::fs::create_dir(prefill.join("sub")).unwrap();
    let post = |list: &str, auth: Option<&str>| {
        let r = control(
            c.admin,
            "POST",
            &format!("/cache/prefill?list={list}"),
            auth,
        );
        (r.status, body(&r))
    };
    let bearer = c.bearer();
    for list in [
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "../secret.txt",
        "..%2Fsecret.txt",
        "sub/../../secret.txt",
        "out.txt",
        "passwd",
        "sub",
        secret.to_str().unwrap(),
    ] {
        let (status, text) = post(list, Some(&bearer));
        assert_eq!(status, 400, "{list}: {text}");
        assert!(
            !text.contains("root:") && !text.contains("SECRET-LINE"),
            "{list}: {text}"
        );
        // Without the token the same request is refused before anything is looked at.
        let (status, text) = post(list, None);
        assert_eq!(status, 401, "{list}: {text}");
        assert!(!text.contains("root:"), "{list}: {text}");
    }
    assert!(post("../x", Some(&bearer)).1.contains(".."));
    assert!(post("/etc/passwd", Some(&bearer)).1.contains("not under"));
    assert!(post("out.txt", Some(&bearer)).1.contains("outside"));
    assert!(post("sub", Some(&bearer)).1.contains("not a regular file"));
    // A list inside: its bad lines are named, each with a short, escaped prefix.
    let long = format!("not-a-url-{}", "z".repeat(500));
    std::fs::write(
        prefill.join("release.txt"),
        format!("/pull/a.bin\n{long}\nftp://x/\x1b[31m\n"),
    )
    .unwrap();
    let (status, text) = post("release.txt", Some(&bearer));
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("line 2: ") && text.contains("line 3: "),
        "{text}"
    );
    assert!(!text.contains(&long) && text.contains("zzz..."), "{text}");
    assert!(!text.contains('\x1b') && text.contains("\\x1b"), "{text}");
    // By its absolute path under the directory too.
    let abs = prefill.join("release.txt");
    assert_eq!(post(abs.to_str().unwrap(), Some(&bearer)).0, 400);
}

#[test]
fn a_token_file_others_may_read_is_refused_at_start_up() {
    use std::os::unix::fs::PermissionsExt;
    let dir = disk_tempdir();
    let token = common::AdminToken::write_in(dir.path());
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(&cfg, token.config_line()).unwrap();
    let serve = || {
        common::run_shardline(
            &[
                "serve",
                "--root",
                dir.path().to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--shards",
                "1",
                "--admin",
                "127.0.0.1:0",
                "--config",
                cfg.to_str().unwrap(),
            ],
            Duration::from_secs(30),
        )
    };
    for (mode, text) in [
        (0o644, "0123456789abcdef0123\n"),
        (0o640, "0123456789abcdef0123\n"),
        (0o600, ""),
        (0o600, "short\n"),
    ] {
        std::fs::write(&token.file, text).unwrap();
        std::fs::set_permissions(&token.file, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = serve();
        assert!(!out.timed_out, "it served with mode {mode:o}, {text:?}");
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        let line = out.stderr.lines().last().unwrap_or_default();
        assert!(line.contains("admin_token_file"), "{}", out.stderr);
        assert!(!out.stderr.contains("0123456789abcdef"), "{}", out.stderr);
    }
}

#[test]
fn the_cli_purges_with_its_token_file_and_not_without() {
    use std::os::unix::fs::PermissionsExt;
    let c = Controlled::start("");
    let admin = c.admin.to_string();
    let purge = |extra: &[&str]| {
        let mut args = vec!["cache", "purge", "--prefix"];
        args.extend_from_slice(extra);
        args.push("/pull/");
        common::run_shardline(&args, Duration::from_secs(30))
    };
    let out = purge(&["--admin", &admin, "--token-file", c.token.path()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "purged 0");
    let out = purge(&["--admin", &admin]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("401"), "{}", out.stderr);
    // The token from the config's admin_token_file.
    let cfg = c.dir.path().join("cli.toml");
    std::fs::write(
        &cfg,
        format!("admin = \"{admin}\"\n{}", c.token.config_line()),
    )
    .unwrap();
    let out = purge(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // The prefill without the token fails once, before looking at its lines.
    let list = c.dir.path().join("cli-list.txt");
    std::fs::write(&list, "/pull/a.bin\n/pull/b.bin\n").unwrap();
    let edge = c.server.addr.to_string();
    let prefill = |token: &[&str]| {
        let mut args = vec!["cache", "prefill", "--admin", &admin, "--edge", &edge];
        args.extend_from_slice(token);
        args.extend(["--json", list.to_str().unwrap()]);
        common::run_shardline(&args, Duration::from_secs(30))
    };
    let out = prefill(&[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("admin token"), "{}", out.stderr);
    assert!(!out.stderr.contains("line 1"), "{}", out.stderr);
    // With it, the lines reach the server's routing (the origin is never reached: they fail).
    let out = prefill(&["--token-file", c.token.path()]);
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("\"line\":2"), "{}", out.stdout);
    // A token file others may read is refused on this side too.
    let loose = c.dir.path().join("loose.token");
    std::fs::write(&loose, format!("{}\n", c.token.token)).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = purge(&["--admin", &admin, "--token-file", loose.to_str().unwrap()]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("chmod 600"), "{}", out.stderr);
}

#[test]
fn a_flood_of_control_requests_is_limited_and_healthz_still_answers() {
    let c = Controlled::start("admin_control_per_s = 5");
    let bearer = c.bearer();
    let mut limited = 0;
    for i in 0..60 {
        let r = control(c.admin, "GET", "/cache/prefill", Some(&bearer));
        if r.status == 429 {
            limited += 1;
            assert_eq!(r.header("retry-after"), Some("1"));
        }
        if i % 10 == 0 {
            assert_eq!(healthz(c.admin).0, 200);
        }
    }
    assert!(limited >= 30, "{limited} of 60 were limited");
    let s = scrape(c.admin);
    assert_eq!(
        total(
            &s,
            "shardline_admin_refused_total",
            &[("reason", "rate_limited")]
        ),
        limited as f64
    );
    // The CLI waits a 429 out instead of failing.
    let out = common::run_shardline(
        &[
            "cache",
            "purge",
            "--admin",
            &c.admin.to_string(),
            "--token-file",
            c.token.path(),
            "/pull/a.bin",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn sighup_reads_the_token_file_again() {
    use std::os::unix::fs::PermissionsExt;
    let c = Controlled::start("");
    let old = c.bearer();
    let target = "/cache/object?target=/pull/a.bin";
    assert_eq!(control(c.admin, "GET", target, Some(&old)).status, 200);
    let new = "rotated-token-0123456789abcdef";
    std::fs::write(&c.token.file, format!("{new}\n")).unwrap();
    common::send_signal(&c.server, "HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_bearer = format!("Bearer {new}");
    while control(c.admin, "GET", target, Some(&new_bearer)).status != 200 {
        assert!(Instant::now() < deadline, "the new token never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(control(c.admin, "GET", target, Some(&old)).status, 401);
    // A rotation to a file others may read is refused: the running token stays.
    std::fs::set_permissions(&c.token.file, std::fs::Permissions::from_mode(0o644)).unwrap();
    common::send_signal(&c.server, "HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.server.log().contains("admin token not reloaded") {
        assert!(Instant::now() < deadline, "{}", c.server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        control(c.admin, "GET", target, Some(&new_bearer)).status,
        200
    );
}
