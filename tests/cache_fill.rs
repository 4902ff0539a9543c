//! The pull-through cache against the real binary (issue 20): nginx serving fixture files is
//! the origin (started by the test), requests under an `[[origin]]` prefix are filled into
//! `cache_dir` and served from it, everything else from the local root. Every body is
//! compared byte for byte with the origin's file; nginx's own log counts what it sent.

mod common;

use std::path::Path;

use common::{get, Server};
use shardline::origin::testing::NginxOrigin;

const OBJECT_BYTES: u64 = 5 * 1024 * 1024 + 123;

struct Edge {
    server: Server,
    admin: std::net::SocketAddr,
    origin: NginxOrigin,
    origin_root: std::path::PathBuf,
    cache: std::path::PathBuf,
    log: std::path::PathBuf,
    /// The admin listener's control token.
    token: common::AdminToken,
    /// The server's `prefill_dir`.
    prefill_dir: std::path::PathBuf,
    _dirs: Vec<tempfile::TempDir>,
}

/// An origin with `pull/obj.bin` (OBJECT_BYTES of the test pattern) and `pull/small.txt`, and
/// shardline with `shards` shards filling `/pull/` from it; the local root has `local.bin`.
fn edge(shards: &str, extra_config: &str) -> Edge {
    edge_with(shards, extra_config, "", OBJECT_BYTES)
}

/// As `edge`, with `nginx_extra` in the origin's `http` block and an object of `object_bytes`.
fn edge_with(shards: &str, extra_config: &str, nginx_extra: &str, object_bytes: u64) -> Edge {
    edge_with_origin_keys(shards, extra_config, "", nginx_extra, object_bytes)
}

/// As `edge_with`, with `origin_keys` in the `[[origin]]` table.
fn edge_with_origin_keys(
    shards: &str,
    extra_config: &str,
    origin_keys: &str,
    nginx_extra: &str,
    object_bytes: u64,
) -> Edge {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    common::write_pattern_file(&origin_root.path().join("pull/obj.bin"), object_bytes);
    std::fs::write(origin_root.path().join("pull/small.txt"), b"a manifest\n").unwrap();
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), nginx_extra);
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    common::write_pattern_file(&root.join("local.bin"), 100_000);
    let token = common::AdminToken::write_in(dir.path());
    let prefill_dir = dir.path().join("prefill");
    std::fs::create_dir(&prefill_dir).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n{}prefill_dir = \"{}\"\n{extra_config}\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n{origin_keys}\n",
            cache.display(),
            token.config_line(),
            prefill_dir.display(),
            origin.addr
        ),
    )
    .unwrap();
    let log = dir.path().join("access.log");
    let (server, admin) = common::start_with_admin(
        &root,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--shards",
            shards,
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    Edge {
        server,
        admin,
        origin,
        origin_root: origin_root.path().to_path_buf(),
        cache,
        log,
        token,
        prefill_dir,
        _dirs: vec![origin_root, work, dir],
    }
}

/// A GET of `path` on a connection of its own, in a thread of its own.
fn get_in_thread(
    addr: std::net::SocketAddr,
    path: &str,
) -> std::thread::JoinHandle<common::Response> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    std::thread::spawn(move || {
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
        let mut w = s.try_clone().unwrap();
        std::io::Write::write_all(&mut w, request.as_bytes()).unwrap();
        common::read_response(&mut std::io::BufReader::new(s), false).unwrap()
    })
}

/// The bytes of the origin's `pull/obj.bin`.
fn origin_file() -> Vec<u8> {
    common::pattern_range(0, OBJECT_BYTES as usize)
}

#[test]
fn a_cold_object_is_filled_from_the_origin_then_served_from_the_cache() {
    // Two shards share one cache: whichever shard a request lands on, a hit is a hit.
    let e = edge("2", "");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), want.len());
    assert!(
        r.body == want,
        "the cold body differs from the origin's file"
    );
    let etag = r.header("etag").expect("an ETag").to_string();
    let sent = e.origin.wait_body_bytes(OBJECT_BYTES);
    assert_eq!(sent, OBJECT_BYTES, "the origin sent the object once");

    // Warm: from the cache, nothing more from the origin, the same validator.
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == want, "the warm body differs");
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    let r = get(&e.server, "/pull/obj.bin", &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 304);
    for _ in 0..8 {
        // New connections: over both shards.
        let r = get(
            &e.server,
            "/pull/obj.bin",
            &[("Range", "bytes=1000000-1000099")],
        );
        assert_eq!(r.status, 206);
        assert_eq!(r.body, &want[1_000_000..1_000_100]);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        e.origin.body_bytes_sent(),
        OBJECT_BYTES,
        "hits fetch nothing"
    );
    // The origin's validator is the one clients see (the same on every edge).
    let origin_etag = {
        let mut s = std::net::TcpStream::connect(e.origin.addr).unwrap();
        std::io::Write::write_all(
            &mut s,
            b"HEAD /pull/obj.bin HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        common::read_response(&mut std::io::BufReader::new(s), true).unwrap()
    };
    assert_eq!(origin_etag.header("etag"), Some(etag.as_str()));
    let r = get(&e.server, "/local.bin", &[]);
    assert_eq!(r.status, 200);

    // The access log says where each response's bytes came from (every shard's lines are
    // written by the time the server has drained and exited).
    let mut e = e;
    assert!(e.server.terminate().success());
    let text = std::fs::read_to_string(&e.log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{lines:#?}");
    let count = |label: &str| lines.iter().filter(|l| l.contains(label)).count();
    assert_eq!(
        count(" cache=FILL") + count(" cache=MISS"),
        1,
        "the cold download: {lines:#?}"
    );
    assert_eq!(count(" cache=HIT"), 10, "the hits: {lines:#?}");
    assert_eq!(
        count("cache="),
        11,
        "the local file has no cache field: {lines:#?}"
    );
}

/// Waits until the origin has sent at least `blocks` blocks of 256 KiB (the object's last one
/// is shorter) into the cache and no fetch runs, then checks it sent exactly those (heads
/// aside): `what` names the step.
fn origin_sent_blocks(e: &Edge, blocks: u64, fetches: u64, what: &str) {
    const BLOCK: u64 = 256 * 1024;
    let bytes = (blocks * BLOCK).min(OBJECT_BYTES);
    let received =
        || common::admin_metric(e.admin, "shardline_cache_bytes_total", "source=\"origin\"");
    let running = || common::admin_metric(e.admin, "shardline_origin_fetches", "");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while received() < bytes || running() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the origin sent {} bytes, {} fetches run; want {blocks} blocks",
            received(),
            running()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let got = received();
    // Each fetch's head is a few hundred bytes.
    assert!(
        got >= bytes && got < bytes + fetches * 1024,
        "{what}: the origin sent {got} bytes, want {bytes} ({blocks} blocks) and {fetches} heads"
    );
}

#[test]
fn a_closed_range_reads_ahead_only_when_it_continues_what_was_read_before() {
    // 256 KiB blocks, a read-ahead capped at 8 of them.
    let e = edge("1", "cache_read_ahead_blocks = 8");
    let want = origin_file();
    const B: usize = 256 * 1024;
    let ranged = |first: usize, last: usize| {
        let r = get(
            &e.server,
            "/pull/obj.bin",
            &[("Range", &format!("bytes={first}-{last}"))],
        );
        assert_eq!(r.status, 206);
        assert!(r.body == want[first..=last], "bytes {first}-{last} differ");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {first}-{last}/{OBJECT_BYTES}").as_str())
        );
    };
    // A cold range in the middle (inside block 9): that block, nothing past it.
    ranged(2_500_000, 2_600_000);
    origin_sent_blocks(&e, 1, 1, "a cold range in the middle");
    // The next range continues it (block 10): one block of read-ahead past it.
    ranged(10 * B, 11 * B - 1);
    origin_sent_blocks(&e, 3, 2, "a range after the one before");
    // Block 11 is there already; three behind it, so two more come while it is served.
    ranged(11 * B, 12 * B - 1);
    origin_sent_blocks(&e, 5, 3, "a range whose blocks are there");
    // A jump (block 18; nothing behind it): exactly its block.
    ranged(18 * B + 7, 18 * B + 1000);
    origin_sent_blocks(&e, 6, 4, "a jump");
    // A whole download from the start streams and reads ahead to the end.
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == want, "the whole object differs");
    origin_sent_blocks(
        &e,
        OBJECT_BYTES.div_ceil(256 * 1024),
        16,
        "the whole object",
    );
}

#[test]
fn a_cold_multipart_range_fetches_its_pieces_blocks_only() {
    // Riot's patcher asks for several pieces of a bundle in one request. 256 KiB blocks:
    // three pieces in blocks 2, 9 and 15 of the 5 MiB object.
    let e = edge("1", "");
    let want = origin_file();
    const B: usize = 256 * 1024;
    let pieces = [
        (2 * B + 10, 2 * B + 5000),
        (9 * B, 9 * B + 99),
        (15 * B + 7, 15 * B + 70),
    ];
    let spec: Vec<String> = pieces.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    let range = format!("bytes={}", spec.join(","));
    let r = get(&e.server, "/pull/obj.bin", &[("Range", &range)]);
    assert_eq!(r.status, 206);
    let boundary = r
        .header("content-type")
        .and_then(|t| t.strip_prefix("multipart/byteranges; boundary="))
        .expect("a multipart answer")
        .to_string();
    let mut rest: &[u8] = &r.body;
    for &(a, b) in &pieces {
        let opening = format!("\r\n--{boundary}\r\n");
        rest = rest
            .strip_prefix(opening.as_bytes())
            .unwrap_or_else(|| panic!("part {a}-{b} does not start with the boundary"));
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("part head");
        let head = String::from_utf8_lossy(&rest[..end]).to_string();
        let range_line = format!("Content-Range: bytes {a}-{b}/{OBJECT_BYTES}");
        assert!(head.lines().any(|l| l == range_line), "part head {head:?}");
        rest = &rest[end + 4..];
        assert!(rest[..=b - a] == want[a..=b], "part {a}-{b} differs");
        rest = &rest[b - a + 1..];
    }
    assert_eq!(rest, format!("\r\n--{boundary}--\r\n").as_bytes());
    // The probe fetched the first piece's block, then one fetch each for the others: the
    // span between them (14 blocks) was never asked for.
    origin_sent_blocks(&e, 3, 3, "a cold multipart range");
}

#[test]
fn an_origins_max_fetches_holds_over_all_shards() {
    let Some(cpus) = common::two_or_more_cpus() else {
        return;
    };
    // nginx answers 503 to a request beyond one at a time (limit_conn; limit_rate keeps each
    // response going long enough to overlap another): its log shows whether the edge ever
    // had two fetches running at once, whatever the retries made of them.
    let e = edge_with_origin_keys(
        "2",
        "",
        "max_fetches = 1",
        "limit_conn_zone $server_addr zone=one_at_a_time:1m;\nlimit_conn one_at_a_time 1;\nlimit_rate 20m;",
        OBJECT_BYTES,
    );
    const OBJECTS: usize = 16;
    for i in 0..OBJECTS {
        common::write_pattern_file(&e.origin_root.join(format!("pull/o{i}.bin")), 600_000);
    }
    let addr = e.server.addr;
    let clients: Vec<_> = (0..OBJECTS)
        .map(|i| {
            let cpu = cpus[i % 2];
            std::thread::spawn(move || {
                common::pin_to_cpu(cpu);
                get_in_thread(addr, &format!("/pull/o{i}.bin"))
                    .join()
                    .unwrap()
            })
        })
        .collect();
    let responses: Vec<common::Response> = clients
        .into_iter()
        .map(|c| c.join().expect("a client"))
        .collect();
    let log = e.origin.wait_requests(OBJECTS);
    assert!(
        log.iter().all(|l| l.status == 200 || l.status == 206),
        "the origin refused a second fetch at once: {log:#?}"
    );
    let want = common::pattern(600_000);
    for r in responses {
        assert_eq!(r.status, 200);
        assert!(r.body == want, "a client got other bytes");
    }
    for shard in ["0", "1"] {
        let label = format!("shard=\"{shard}\"");
        assert!(
            common::admin_metric(e.admin, "shardline_cache_lookups_total", &label) > 0,
            "no request reached shard {shard}: the cap was not tried over two shards"
        );
    }
}

#[test]
fn an_origins_bandwidth_cap_paces_its_fills() {
    // The lowest cap (1 MiB/s) and a 4 MiB object. What is checked is a lower bound on the
    // fill's time, which load on the test host can only lengthen: without the cap, loopback
    // brings it in milliseconds.
    const CAPPED_BYTES: u64 = 4 << 20;
    let e = edge_with_origin_keys("1", "", "max_bytes_per_s = 1048576", "", CAPPED_BYTES);
    let start = std::time::Instant::now();
    let r = common::get(&e.server, "/pull/obj.bin", &[]);
    let took = start.elapsed();
    assert_eq!(r.status, 200);
    assert!(
        r.body == common::pattern_range(0, CAPPED_BYTES as usize),
        "other bytes"
    );
    // A receive is charged after it came (the first, at most a fill slot of 1 MiB, before any
    // wait) and the bucket lets EGRESS_BURST_MS run ahead: 3 MiB at 1 MiB/s remain, less 20 ms.
    assert!(
        took >= std::time::Duration::from_millis(2500),
        "4 MiB came through a 1 MiB/s cap in {took:?}"
    );
}

#[test]
fn an_origin_that_answers_429_with_retry_after_is_paused_and_the_others_go_on() {
    // A second origin (another nginx server) answers every request 429 with Retry-After: 30.
    let busy_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let e = edge_with_origin_keys(
        "1",
        "cache_wait_timeout_ms = 1000",
        &format!("[[origin]]\nprefix = \"/busy/\"\nurl = \"http://127.0.0.1:{busy_port}\""),
        &format!(
            "server {{ listen 127.0.0.1:{busy_port}; \
             location / {{ add_header Retry-After 30 always; return 429; }} }}"
        ),
        OBJECT_BYTES,
    );
    let busy_requests = || {
        e.origin
            .log()
            .iter()
            .filter(|l| l.uri.starts_with("/busy/"))
            .count()
    };
    let retry_later = |path: &str| {
        let r = get(&e.server, path, &[]);
        assert_eq!(r.status, 503, "{path}");
        let s: u64 = r
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{path}: no Retry-After in seconds"));
        assert!((1..=30).contains(&s), "{path}: Retry-After {s}");
    };
    // The first request's fetch is refused; the client waits its timeout, then is told to
    // come back when the origin said.
    retry_later("/busy/a.bin");
    assert_eq!(busy_requests(), 1);
    // A request for another object of that origin during the pause sends it nothing.
    retry_later("/busy/b.bin");
    assert_eq!(
        busy_requests(),
        1,
        "a fetch reached the origin during its pause"
    );
    // The other origin is not paused.
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == origin_file());
    assert_eq!(
        common::admin_metric(e.admin, "shardline_origin_pauses", ""),
        1
    );
    let log = e.server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("origin asked the edge to wait")
                && l.contains(&format!("127.0.0.1:{busy_port}"))
                && l.contains("pause_s=30")),
        "no log line naming the paused origin:\n{log}"
    );
}

#[test]
fn host_aliases_share_objects_tokens_do_not_split_them_and_key_query_does() {
    let e = edge_with_origin_keys(
        "1",
        "",
        "hosts = [\"a.example\", \"b.example\"]\nkey_query = [\"v\"]",
        "",
        OBJECT_BYTES,
    );
    let want = origin_file();
    let fetch = |target: &str, host: &str| {
        common::raw_request(
            &e.server,
            format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .expect("a response")
    };
    let origin_gets = || {
        e.origin
            .log()
            .iter()
            .filter(|l| l.uri == "/pull/obj.bin")
            .map(|l| l.args.clone())
            .collect::<Vec<_>>()
    };
    // Filled through one name, with a session token: the origin gets the whole query.
    let r = fetch("/pull/obj.bin?sid=1&v=1", "a.example");
    assert_eq!(r.status, 200);
    assert!(r.body == want);
    let filled = e.origin.wait_body_bytes(OBJECT_BYTES);
    assert!(
        origin_gets().iter().all(|a| a == "sid=1&v=1"),
        "{:?}",
        origin_gets()
    );
    // Through the other name, with another token: the same object, a hit.
    let r = fetch("/pull/obj.bin?v=1&sid=2", "B.example:8080");
    assert_eq!(r.status, 200);
    assert!(r.body == want);
    assert_eq!(
        e.origin.body_bytes_sent(),
        filled,
        "a token split the object"
    );
    // Another value of a keyed parameter is another object.
    let r = fetch("/pull/obj.bin?v=2", "b.example");
    assert_eq!(r.status, 200);
    assert!(r.body == want);
    assert!(e.origin.wait_body_bytes(2 * OBJECT_BYTES) >= 2 * OBJECT_BYTES);
    assert!(
        origin_gets().iter().any(|a| a == "v=2"),
        "{:?}",
        origin_gets()
    );
    // A name the entry does not list, or a bare address, is not this origin's: the local root.
    assert_eq!(fetch("/pull/obj.bin?v=1", "c.example").status, 404);
    assert_eq!(fetch("/pull/obj.bin?v=1", "127.0.0.1:8080").status, 404);
    assert_eq!(
        common::admin_metric(e.admin, "shardline_cache_lookups_total", "result=\"hit\""),
        1
    );
}

/// The `expr` values of a Prometheus rules file: `expr: ...` on one line, or `expr: |` and the
/// lines indented under it. Every rule must also have an alert name, a severity and a summary.
fn alert_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let indent = |l: &str| l.len() - l.trim_start().len();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        if rest.trim() == "|" {
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || indent(l) > indent(line))
                .map(|l| l.trim())
                .collect();
            exprs.push(block.join(" "));
        } else {
            exprs.push(rest.trim().to_string());
        }
    }
    let count = |key: &str| {
        lines
            .iter()
            .filter(|l| l.trim_start().starts_with(key))
            .count()
    };
    assert_eq!(count("- alert:"), exprs.len(), "a rule without an expr");
    assert_eq!(count("severity:"), exprs.len(), "a rule without a severity");
    assert_eq!(count("summary:"), exprs.len(), "a rule without a summary");
    exprs
}

/// Every `expr` string anywhere in a Grafana dashboard.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn per_origin_counters_count_and_the_shipped_dashboard_and_alerts_query_real_metrics() {
    let e = edge("1", "");
    let want = origin_file();
    for _ in 0..2 {
        let r = get(&e.server, "/pull/obj.bin", &[]);
        assert_eq!(r.status, 200);
        assert!(r.body == want);
    }
    let metrics = {
        let mut s = std::net::TcpStream::connect(e.admin).unwrap();
        std::io::Write::write_all(
            &mut s,
            b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let r = common::read_response(&mut std::io::BufReader::new(s), false).unwrap();
        String::from_utf8(r.body).unwrap()
    };
    // The miss and the hit, each whole (its head included), under origin entry 0.
    let m = |family: &str, label: &str| common::admin_metric(e.admin, family, label);
    assert_eq!(m("shardline_origin_requests_total", "origin=\"0\""), 2);
    let sent = "shardline_origin_sent_bytes_total";
    let whole = OBJECT_BYTES..OBJECT_BYTES + 1024;
    assert!(
        whole.contains(&m(sent, "source=\"hit\"")),
        "hit {}",
        m(sent, "source=\"hit\"")
    );
    assert!(
        whole.contains(&m(sent, "source=\"miss\"")),
        "miss {}",
        m(sent, "source=\"miss\"")
    );
    assert_eq!(m(sent, "source=\"pass\""), 0);
    assert!(m("shardline_origin_received_bytes_total", "prefix=\"/pull/\"") >= OBJECT_BYTES);
    // Every metric the shipped dashboard and alert rules query is on /metrics.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    let rules = alert_exprs(&std::fs::read_to_string(root.join("prometheus-alerts.yml")).unwrap());
    assert!(exprs.len() >= 10 && rules.len() >= 5, "{exprs:?} {rules:?}");
    exprs.extend(rules);
    let mut checked = 0;
    for expr in &exprs {
        let names = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|t| t.starts_with("shardline_"));
        for name in names {
            let exposed = metrics.lines().any(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            });
            assert!(exposed, "{name} (in `{expr}`) is not on /metrics");
            checked += 1;
        }
    }
    assert!(checked >= exprs.len(), "an expr without a shardline metric");
}

#[test]
fn a_shardline_shield_between_the_edge_and_the_origin_works_end_to_end() {
    use std::io::{Read, Write};
    const BIG: u64 = 24 << 20;
    // The shield (B) fills from nginx (8 MB/s per connection: its fill takes a while); the
    // edge (A) fills from B and revalidates with it every time.
    let shield = edge_with("1", "", "limit_rate 8m;", BIG);
    let dir = common::disk_tempdir();
    let (root, cache) = (dir.path().join("root"), dir.path().join("cache"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("edge.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\ncache_revalidate_s = 0\ncache_heuristic_max_s = 0\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            shield.server.addr
        ),
    )
    .unwrap();
    let (edge_server, _edge_admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap()]);
    let want = common::pattern_range(0, BIG as usize);
    let at_origin = {
        let mut s = std::net::TcpStream::connect(shield.origin.addr).unwrap();
        s.write_all(b"HEAD /pull/obj.bin HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n")
            .unwrap();
        common::read_response(&mut std::io::BufReader::new(s), true).unwrap()
    };
    // Cold through both tiers, streaming: the client has its first MiB while the shield's
    // journal still lacks blocks of the object.
    let mut s = edge_server.connect();
    s.write_all(b"GET /pull/obj.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        r.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    for h in ["etag", "last-modified"] {
        let v = at_origin.header(h).unwrap().to_lowercase();
        assert!(
            head.contains(&format!("{h}: {v}\r\n")),
            "{h} through two tiers: {head}"
        );
    }
    let mut body = vec![0u8; 1 << 20];
    r.read_exact(&mut body).unwrap();
    let journal = std::fs::read(shield.cache.join("journal")).unwrap();
    let (index, _) = shardline::cache::journal::replay(&journal);
    let v = index
        .current(b"\0\0pull/obj.bin")
        .expect("the shield's version")
        .version;
    let (present, blocks) = (index.blocks_present(v), index.meta(v).unwrap().blocks());
    assert!(
        present < blocks,
        "the first MiB came only after the shield had it all ({present} of {blocks} blocks)"
    );
    r.read_to_end(&mut body).unwrap();
    assert!(body == want, "the cold body through two tiers differs");
    assert_eq!(shield.origin.wait_body_bytes(BIG), BIG);
    // A range, and a conditional request, answered by the edge.
    let r = get(
        &edge_server,
        "/pull/obj.bin",
        &[("Range", "bytes=4000000-4000999")],
    );
    assert_eq!(r.status, 206);
    assert!(r.body == want[4_000_000..4_001_000]);
    let etag = at_origin.header("etag").unwrap();
    let r = get(&edge_server, "/pull/obj.bin", &[("If-None-Match", etag)]);
    assert_eq!(r.status, 304);
    // The edge revalidated with the shield each time (cache_revalidate_s = 0), which
    // answered 304 from its own cache: the origin sent nothing more.
    let not_modified = common::admin_metric(
        shield.admin,
        "shardline_requests_total",
        "status_class=\"3xx\"",
    );
    assert!(
        not_modified >= 2,
        "the shield answered {not_modified} revalidations with 304"
    );
    assert_eq!(shield.origin.body_bytes_sent(), BIG);
}

#[test]
fn prefill_fills_what_is_not_cached_skips_what_is_and_names_bad_lines() {
    let e = edge("1", "");
    let dir = tempfile::tempdir().unwrap();
    let admin = e.admin.to_string();
    let edge_addr = e.server.addr.to_string();
    let prefill = |list: &str| {
        let path = dir.path().join("list.txt");
        std::fs::write(&path, list).unwrap();
        common::run_shardline(
            &[
                "cache",
                "prefill",
                "--admin",
                &admin,
                "--edge",
                &edge_addr,
                "--token-file",
                e.token.path(),
                "--json",
                path.to_str().unwrap(),
            ],
            std::time::Duration::from_secs(60),
        )
    };
    // By line: the objects are fetched several at once, so they end in any order.
    let results = |out: &common::RunOutput| {
        let mut r = out
            .stdout
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                (
                    v["line"].as_u64().unwrap(),
                    v["result"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>();
        r.sort();
        r
    };
    let list = "# release day\n\n/pull/obj.bin\nhttp://any.host/pull/small.txt?sid=9\n";
    // First run: both fetched (through the edge, so they are cached), the origin sends each
    // once.
    let out = prefill(list);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert_eq!(
        results(&out),
        vec![(3, "filled".to_string()), (4, "filled".to_string())]
    );
    let sent = e.origin.wait_body_bytes(OBJECT_BYTES + 11);
    assert_eq!(sent, OBJECT_BYTES + 11, "the origin sent each object once");
    // Second run: nothing to fetch.
    let out = prefill(list);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert_eq!(
        results(&out),
        vec![(3, "cached".to_string()), (4, "cached".to_string())]
    );
    assert!(
        out.stderr.contains("2 already cached, 0 filled, 0 failed"),
        "{}",
        out.stderr
    );
    assert_eq!(
        e.origin.body_bytes_sent(),
        sent,
        "a cached object was fetched again"
    );
    // A second prefill while one runs (its lease held) is refused, and runs once it ended.
    let control = e.token.client(e.admin);
    let (status, id) = control.request("POST", "/cache/prefill/begin").unwrap();
    assert_eq!(status, 200);
    let out = prefill(list);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("another prefill runs"),
        "{}",
        out.stderr
    );
    let end = format!("/cache/prefill/end?id={id}");
    control.request("POST", &end).unwrap();
    assert_eq!(prefill(list).code, Some(0));
    // Bad lines are named and nothing is fetched: not a URL, then a path no origin covers.
    let out = prefill("/pull/obj.bin\nftp://x/y\n");
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("line 2: not an http(s) URL"),
        "{}",
        out.stderr
    );
    let out = prefill("/pull/obj.bin\n/local.bin\n");
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.contains("line 2: /local.bin: no [[origin]]"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "nothing fetched: {}", out.stdout);
    // An object the origin does not have fails; the run says so and exits 1.
    let out = prefill("/pull/missing.bin\n/pull/obj.bin\n");
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert_eq!(
        results(&out),
        vec![(1, "failed".to_string()), (2, "cached".to_string())]
    );
    assert!(out.stderr.contains("0 filled, 1 failed"), "{}", out.stderr);
    // (The origin's 404 has a body of its own.)
    let of_cached: u64 = e
        .origin
        .log()
        .iter()
        .filter(|l| l.uri != "/pull/missing.bin")
        .map(|l| l.body_bytes)
        .sum();
    assert_eq!(of_cached, sent, "nothing cached was fetched again");
}

/// `POST /cache/prefill?list=` runs the prefill in the server; `pin_until` keeps its objects
/// through evictions that take everything else; `--pin-until` does the same from the CLI.
#[test]
fn a_server_side_prefill_fills_and_pins_and_the_pins_outlast_evictions() {
    const MIB: u64 = 1 << 20;
    let e = edge_with_origin_keys("1", "cache_max_bytes = 3145728", "", "", OBJECT_BYTES);
    for name in ["p1", "p2", "c1", "o1", "o2", "o3", "o4", "o5"] {
        common::write_pattern_file(&e.origin_root.join(format!("pull/{name}.bin")), MIB);
    }
    // The server reads lists from its prefill_dir only.
    let list = e.prefill_dir.join("release.txt");
    let control = e.token.client(e.admin);
    let admin = |method: &str, target: &str| control.request(method, target).unwrap();
    // A bad line: 400 naming it, nothing fetched.
    std::fs::write(
        &list,
        "/pull/p1.bin
ftp://x/y
",
    )
    .unwrap();
    let (status, body) = admin("POST", &format!("/cache/prefill?list={}", list.display()));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("line 2"), "{body}");
    assert!(e.origin.log().is_empty(), "nothing fetched");
    // The server fills both and pins them for an hour.
    std::fs::write(
        &list,
        "/pull/p1.bin
/pull/p2.bin
",
    )
    .unwrap();
    let (status, body) = admin(
        "POST",
        &format!("/cache/prefill?list={}&pin_until=%2B1h", list.display()),
    );
    assert_eq!(status, 202, "{body}");
    let status_json = || {
        let (status, body) = admin("GET", "/cache/prefill");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while status_json()["running"].as_bool() == Some(true) {
        assert!(
            std::time::Instant::now() < deadline,
            "the prefill never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let s = status_json();
    assert_eq!(
        (s["filled"].as_u64(), s["failed"].as_u64()),
        (Some(2), Some(0)),
        "{s}"
    );
    assert_eq!(s["bytes"].as_u64(), Some(2 * MIB));
    // The CLI pins one more (it fetches it first).
    let list2 = e.prefill_dir.join("more.txt");
    std::fs::write(
        &list2,
        "/pull/c1.bin
",
    )
    .unwrap();
    let out = common::run_shardline(
        &[
            "cache",
            "prefill",
            "--admin",
            &e.admin.to_string(),
            "--edge",
            &e.server.addr.to_string(),
            "--pin-until",
            "+1h",
            "--token-file",
            e.token.path(),
            "--json",
            list2.to_str().unwrap(),
        ],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("\"pinned\":true"), "{}", out.stdout);
    // Five more objects through a 3 MiB budget: everything unpinned goes, the pinned stay.
    for name in ["o1", "o2", "o3", "o4", "o5"] {
        let r = get(&e.server, &format!("/pull/{name}.bin"), &[]);
        assert_eq!(r.status, 200);
    }
    for name in ["p1", "p2", "c1"] {
        let (status, body) = admin("GET", &format!("/cache/object?target=/pull/{name}.bin"));
        assert_eq!(status, 200);
        assert!(
            body.contains("\"cached\":true"),
            "{name} was evicted: {body}"
        );
    }
    let (_, body) = admin("GET", "/cache/object?target=/pull/o1.bin");
    assert!(
        body.contains("\"cached\":false"),
        "o1 was not evicted: {body}"
    );
    // A prefill over a list of what is cached fetches nothing.
    let sent = e.origin.body_bytes_sent();
    let (status, body) = admin("POST", &format!("/cache/prefill?list={}", list.display()));
    assert_eq!(status, 202, "{body}");
    assert!(body.contains("2 cached, 0 to fetch"), "{body}");
    assert_eq!(e.origin.body_bytes_sent(), sent);
}

#[test]
fn many_clients_of_one_cold_object_all_get_it_and_the_origin_sends_it_once() {
    // Over two shards: the clients land on both, the fill is one.
    let e = edge("2", "");
    let want = std::sync::Arc::new(origin_file());
    let addr = e.server.addr;
    let clients: Vec<_> = (0..20)
        .map(|_| get_in_thread(addr, "/pull/obj.bin"))
        .collect();
    for c in clients {
        let r = c.join().expect("a client");
        assert_eq!(r.status, 200);
        assert!(r.body == *want, "a client got other bytes");
    }
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
}

#[test]
fn origin_errors_reach_the_client_and_local_files_are_untouched() {
    let e = edge("2", "");
    let r = get(&e.server, "/pull/missing.bin", &[]);
    assert_eq!(r.status, 404, "the origin's 404 is passed on");
    let r = get(&e.server, "/pull/small.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"a manifest\n"[..]));
    let r = get(&e.server, "/local.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, common::pattern_range(0, 100_000));
    let r = get(&e.server, "/pull/../local.bin", &[]);
    assert_eq!(r.status, 200, "dot segments resolve before routing");
    assert_eq!(r.body.len(), 100_000);
}

#[test]
fn an_unreachable_origin_is_a_502_and_the_edge_keeps_serving() {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    common::write_pattern_file(&root.join("local.bin"), 1000);
    // A port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{dead}\"\n",
            cache.display()
        ),
    )
    .unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap()]);
    let r = get(&server, "/pull/x.bin", &[]);
    assert_eq!(r.status, 502);
    let r = get(&server, "/local.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        Path::new(&cache).join("journal").is_file(),
        "the cache is open"
    );
}

/// A cold download streams: the client has its first MiB while the object is still filling
/// (the cache's journal vouches for only some of its blocks then), and every byte is right.
#[test]
fn a_cold_download_streams_blocks_as_they_arrive() {
    use std::io::{Read, Write};
    const BIG: u64 = 24 << 20;
    // 4 MB/s per origin connection: the fill takes seconds, the first block a fraction.
    let e = edge_with("1", "", "limit_rate 4m;", BIG);
    let mut s = e.server.connect();
    s.write_all(b"GET /pull/obj.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        r.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(&format!("Content-Length: {BIG}")), "{head}");
    let mut first = vec![0u8; 1 << 20];
    r.read_exact(&mut first).unwrap();
    let journal = std::fs::read(e.cache.join("journal")).unwrap();
    let (index, _) = shardline::cache::journal::replay(&journal);
    let v = index
        .current(b"\0\0pull/obj.bin")
        .expect("the version")
        .version;
    let present = index.blocks_present(v);
    let blocks = index.meta(v).unwrap().blocks();
    assert!(
        present < blocks,
        "the first MiB came only after the whole object ({present} of {blocks} blocks) was in"
    );
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    first.extend_from_slice(&rest);
    assert_eq!(first.len() as u64, BIG);
    assert!(
        first == common::pattern_range(0, BIG as usize),
        "streamed bytes differ"
    );
}

/// The background scrub finds a byte flipped in a cached block before any client reads it:
/// the block is dropped, counted and logged with its object, and the next GET fetches that
/// block alone again and returns the whole object right.
#[test]
fn the_scrub_finds_a_damaged_block_before_a_client_does() {
    use std::os::unix::fs::FileExt;
    let e = edge("1", "cache_scrub_bytes_per_s = 67108864");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    let m = |family: &str| common::admin_metric(e.admin, family, "");
    let wait_for = |family: &str, want: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while m(family) < want {
            assert!(
                std::time::Instant::now() < deadline,
                "{family} stayed at {} (want {want})\n{}",
                m(family),
                e.server.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    // A whole pass over the clean object finds nothing.
    wait_for("shardline_cache_scrub_passes_total", 1);
    assert_eq!(m("shardline_cache_scrub_bad_blocks_total"), 0);
    assert!(m("shardline_cache_scrub_bytes_total") >= OBJECT_BYTES);
    // Block 5 (blocks of 256 KiB): one byte flipped on the disk.
    let at = 5 * 262_144 + 77;
    let data = e.cache.join("data/0000000000000001");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.write_all_at(&[want[at] ^ 0x20], at as u64).unwrap();
    f.sync_all().unwrap();
    wait_for("shardline_cache_scrub_bad_blocks_total", 1);
    let log = e.server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("scrub: a cached block failed its checksum")
                && l.contains("pull/obj.bin")
                && l.contains("block=5")),
        "no scrub line naming the object and block:\n{log}"
    );
    // The client never met it: only the scrub counted a corrupt block, and the GET fetched
    // that block alone again.
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(
        r.status == 200 && r.body == want,
        "a wrong byte reached the client"
    );
    assert_eq!(m("shardline_cache_corrupt_blocks_total"), 1);
    assert_eq!(
        e.origin.wait_body_bytes(OBJECT_BYTES + 262_144),
        OBJECT_BYTES + 262_144
    );
    assert!(m("shardline_cache_scrub_pass_progress_permille") <= 1000);
}

/// `cache_scrub_shard` picks the shard that scrubs: with two shards and 1, shard 1 reads the
/// whole cache back and shard 0 reads nothing.
#[test]
fn the_scrub_runs_on_the_shard_the_operator_names() {
    let e = edge(
        "2",
        "cache_scrub_bytes_per_s = 67108864\ncache_scrub_shard = 1",
    );
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    let m = |family: &str, label: &str| common::admin_metric(e.admin, family, label);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while m("shardline_cache_scrub_passes_total", "shard=\"1\"") < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "shard 1 finished no pass\n{}",
            e.server.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(m("shardline_cache_scrub_bytes_total", "shard=\"1\"") >= OBJECT_BYTES);
    assert_eq!(m("shardline_cache_scrub_bytes_total", "shard=\"0\""), 0);
    assert_eq!(m("shardline_cache_scrub_passes_total", "shard=\"0\""), 0);
}

/// A cached block damaged on disk under a running server: the read that meets it fails its
/// checksum, the block is fetched again alone at the front of the fill's queue, and the same
/// response goes on with the right bytes: one GET returns the whole object byte for byte, and
/// the corrupt-block counter rises by one.
#[test]
fn a_block_damaged_on_disk_is_fetched_again_and_the_same_response_completes() {
    use std::os::unix::fs::FileExt;
    let e = edge("1", "");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    let corrupt = "shardline_cache_corrupt_blocks_total";
    assert_eq!(common::admin_metric(e.admin, corrupt, ""), 0);
    // Block 3 of version 1 (blocks of 256 KiB): one byte flipped.
    let at = 3 * 262_144 + 10;
    let data = e.cache.join("data/0000000000000001");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.write_all_at(&[want[at] ^ 0x5a], at as u64).unwrap();
    f.sync_all().unwrap();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), want.len(), "the response was cut");
    assert!(r.body == want, "a wrong byte reached the client");
    assert_eq!(common::admin_metric(e.admin, corrupt, ""), 1);
    assert_eq!(
        e.origin.wait_body_bytes(OBJECT_BYTES + 262_144),
        OBJECT_BYTES + 262_144,
        "only the damaged block came again"
    );
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(
        r.status == 200 && r.body == want,
        "the refetched object differs"
    );
    // `shardline cache verify` reads every block back: all good now (the refetched block
    // superseded the damaged one), and it names a block damaged again.
    let dir = e.cache.to_str().unwrap().to_string();
    let timeout = std::time::Duration::from_secs(30);
    let ok = common::run_shardline(&["cache", "verify", "--dir", &dir], timeout);
    assert_eq!(ok.code, Some(0), "{}", ok.stdout);
    assert!(ok.stdout.contains(", 0 corrupt"), "{}", ok.stdout);
    let at = 7 * 262_144 + 3;
    f.write_all_at(&[want[at] ^ 1], at as u64).unwrap();
    f.sync_all().unwrap();
    let bad = common::run_shardline(&["cache", "verify", "--dir", &dir], timeout);
    assert_eq!(bad.code, Some(1), "{}", bad.stdout);
    assert!(
        bad.stdout
            .contains("corrupt version 0000000000000001 block 7"),
        "{}",
        bad.stdout
    );
    let stats = common::run_shardline(&["cache", "stats", "--dir", &dir], timeout);
    assert!(stats.stdout.contains("objects 1\n"), "{}", stats.stdout);
    assert!(
        stats
            .stdout
            .contains(&format!("object_bytes {OBJECT_BYTES}\n")),
        "{}",
        stats.stdout
    );
}

/// Bad blocks in several chunks a response reads at once (blocks 1, 3, 5 and 7 of 256 KiB:
/// one in each of the first four 512 KiB chunks): every chunk waits for its own block, and
/// one GET still returns the whole object right.
#[test]
fn several_chunks_held_for_bad_blocks_at_once_all_go_on() {
    use std::os::unix::fs::FileExt;
    let e = edge("1", "");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    let data = e.cache.join("data/0000000000000001");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    for block in [1u64, 3, 5, 7] {
        let at = (block * 262_144 + 100) as usize;
        f.write_all_at(&[want[at] ^ 0x81], at as u64).unwrap();
    }
    f.sync_all().unwrap();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), want.len(), "the response was cut");
    assert!(r.body == want, "a wrong byte reached the client");
    let corrupt = "shardline_cache_corrupt_blocks_total";
    assert_eq!(common::admin_metric(e.admin, corrupt, ""), 4);
    assert_eq!(
        e.origin.wait_body_bytes(OBJECT_BYTES + 4 * 262_144),
        OBJECT_BYTES + 4 * 262_144,
        "only the damaged blocks came again"
    );
}

/// A version with every block on disk is published for hits that take no lock: the warm
/// GETs after the first are served that way (counted), byte for byte, ranges too; a purge
/// unpublishes it, so the next GET goes to the origin again.
#[test]
fn warm_hits_take_no_lock_and_a_purge_ends_that() {
    let e = edge("1", "");
    let want = origin_file();
    let lockless =
        |e: &Edge| common::admin_metric(e.admin, "shardline_cache_lockless_hits_total", "");
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    // The first warm GET publishes it (under the lock); the next ones need no lock.
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    let before = lockless(&e);
    for _ in 0..3 {
        let r = get(&e.server, "/pull/obj.bin", &[]);
        assert!(r.status == 200 && r.body == want, "a lockless hit's body");
    }
    let r = get(
        &e.server,
        "/pull/obj.bin",
        &[("Range", "bytes=1000-2000999")],
    );
    assert_eq!(r.status, 206);
    assert!(r.body == want[1000..2_001_000], "a lockless range's body");
    assert_eq!(lockless(&e), before + 4);
    let out = common::run_shardline(
        &[
            "cache",
            "purge",
            "--admin",
            &e.admin.to_string(),
            "--token-file",
            e.token.path(),
            "/pull/obj.bin",
        ],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(
        lockless(&e),
        before + 4,
        "a purged version served without the lock"
    );
    assert_eq!(
        e.origin.wait_body_bytes(2 * OBJECT_BYTES),
        2 * OBJECT_BYTES,
        "fetched again after the purge"
    );
}

/// With 16 MiB chunks and 64 KiB blocks one read holds 256 blocks: every one of them is
/// checked. A byte flipped in any block of a cached object (here the first, one in the
/// middle of a read and the last) is caught, and one GET still returns the whole object.
#[test]
fn every_block_of_a_large_read_is_checked() {
    use std::os::unix::fs::FileExt;
    const BIG: u64 = 32 << 20;
    const BLOCK: u64 = 64 << 10;
    let e = edge_with(
        "1",
        "chunk_bytes = 16777216\ncache_block_bytes = 65536\narena_bytes = 268435456\n\
         tick_budget_bytes = 16777216\nshard_tick_budget_bytes = 33554432\n",
        "",
        BIG,
    );
    let want = common::pattern_range(0, BIG as usize);
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    let corrupt = "shardline_cache_corrupt_blocks_total";
    let data = e.cache.join("data/0000000000000001");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    for (i, block) in [100u64, 0, BIG / BLOCK - 1].into_iter().enumerate() {
        let at = (block * BLOCK + 4321) as usize;
        f.write_all_at(&[want[at] ^ 0x81], at as u64).unwrap();
        f.sync_all().unwrap();
        let r = get(&e.server, "/pull/obj.bin", &[]);
        assert_eq!(r.status, 200, "block {block}");
        assert_eq!(
            r.body.len(),
            want.len(),
            "block {block}: the response was cut"
        );
        assert!(
            r.body == want,
            "block {block}: a wrong byte reached the client"
        );
        assert_eq!(
            common::admin_metric(e.admin, corrupt, ""),
            i as u64 + 1,
            "block {block}"
        );
    }
}

/// `shardline doctor --config` checks the cache directory: the O_DIRECT probes as for the
/// data root, named `cache.*`, and its free space.
#[test]
fn doctor_checks_the_cache_directory() {
    let dir = common::disk_tempdir();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "root = \"{}\"\ncache_dir = \"{}\"\n[[origin]]\nurl = \"http://127.0.0.1:9\"\n",
            dir.path().display(),
            cache.display()
        ),
    )
    .unwrap();
    let out = common::run_shardline(
        &["doctor", "--json", "--config", cfg.to_str().unwrap()],
        std::time::Duration::from_secs(60),
    );
    assert!(!out.timed_out);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("doctor's JSON");
    let names: Vec<String> = report["checks"]
        .as_array()
        .expect("a checks array")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    for want in ["cache.fs", "cache.o_direct", "cache.free_space"] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
}

/// Under `cache_max_bytes` the cache evicts whole versions (S3-FIFO): with room for one of two
/// 2 MiB objects, filling the second drops the first (journaled, its data file removed), and
/// asking for the first again fetches it again; every body stays right.
#[test]
fn a_byte_budget_evicts_whole_versions_and_they_are_fetched_again() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    let two_mib = 2u64 << 20;
    common::write_pattern_file(&origin_root.path().join("pull/a.bin"), two_mib);
    common::write_pattern_file(&origin_root.path().join("pull/b.bin"), two_mib);
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let (root, cache) = (dir.path().join("root"), dir.path().join("cache"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\ncache_max_bytes = 3145728\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    let want = common::pattern_range(0, two_mib as usize);
    for path in ["/pull/a.bin", "/pull/b.bin", "/pull/a.bin"] {
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body == want, "{path} differs");
    }
    assert_eq!(
        origin.wait_body_bytes(3 * two_mib),
        3 * two_mib,
        "a was evicted by b and fetched again"
    );
    let journal = std::fs::read(cache.join("journal")).unwrap();
    let (index, _) = shardline::cache::journal::replay(&journal);
    assert_eq!(index.versions(), 1, "one object fits the budget");
    let data_files = data_files(&cache, 1);
    assert_eq!(data_files, 1, "evicted versions' files are gone");
}

/// The budget counts what a version holds on disk, not the size its origin claims: a small
/// range of a huge object (Delivery Optimization, Battle.net archives) evicts nothing.
#[test]
fn a_range_of_a_huge_object_costs_the_budget_its_blocks_only() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    let two_mib = 2u64 << 20;
    common::write_pattern_file(&origin_root.path().join("pull/a.bin"), two_mib);
    // 1 GiB that takes no room: a hole reads as zeros.
    let huge = std::fs::File::create(origin_root.path().join("pull/huge.bin")).unwrap();
    huge.set_len(1 << 30).unwrap();
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let (root, cache) = (dir.path().join("root"), dir.path().join("cache"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\ncache_max_bytes = 4194304\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    let want = common::pattern_range(0, two_mib as usize);
    let r = get(&server, "/pull/a.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    let r = get(
        &server,
        "/pull/huge.bin",
        &[("Range", "bytes=536870912-536871935")],
    );
    assert_eq!(r.status, 206);
    assert!(r.body.iter().all(|&b| b == 0) && r.body.len() == 1024);
    let r = get(&server, "/pull/a.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    let a_fetches = origin
        .wait_requests(2)
        .iter()
        .filter(|l| l.uri == "/pull/a.bin")
        .count();
    assert_eq!(
        a_fetches, 1,
        "a.bin was evicted by a 1 KiB range of a 1 GiB object and fetched again"
    );
}

/// Files in the cache's data directory (one per version kept), once it holds `want` (a
/// replaced version goes when the last response reading it has ended, which the server may
/// learn a moment after its client had the last byte), or after 5 s.
fn data_files(cache: &Path, want: usize) -> usize {
    let count = || {
        std::fs::read_dir(cache.join("data"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while count() != want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    count()
}

/// With `cache_revalidate_s = 0` and `cache_heuristic_max_s = 0` (nginx sends a Last-Modified)
/// every request revalidates first: an unchanged object is
/// confirmed by a 304 (no body byte fetched again), a changed one (new content, new ETag)
/// becomes a new version that replaces the old one on disk, and one deleted at the origin
/// becomes the origin's 404.
#[test]
fn a_stale_version_is_revalidated_and_a_changed_object_replaces_it() {
    let e = edge("2", "cache_revalidate_s = 0\ncache_heuristic_max_s = 0");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == want, "the cold body differs from the origin's");
    let etag = r.header("etag").expect("an ETag").to_string();
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    let asked = e.origin.log().len();

    // Unchanged: one conditional request, answered 304; the body comes from the cache.
    let r = get(
        &e.server,
        "/pull/obj.bin",
        &[("Range", "bytes=4000000-4000999")],
    );
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &want[4_000_000..4_001_000]);
    // nginx logs the 304 when it ends, which may come after our client had its answer.
    let log = e.origin.wait_requests(asked + 1);
    assert_eq!(log.len(), asked + 1, "one revalidation: {log:?}");
    let last = log.last().unwrap();
    assert_eq!((last.status, last.body_bytes), (304, 0), "{last:?}");
    assert_eq!(last.if_none_match, etag, "it asked with the cached ETag");
    assert_eq!(
        last.range_bytes().map(|(a, _)| a / (256 * 1024)),
        Some(4_000_000 / (256 * 1024)),
        "it asked for the block the request starts in"
    );
    assert_eq!(r.header("etag"), Some(etag.as_str()));

    // Changed at the origin: new bytes and a new mtime, so a new ETag.
    let path = e.origin_root.join("pull/obj.bin");
    let changed: Vec<u8> = want.iter().map(|b| b ^ 0x5a).collect();
    std::fs::write(&path, &changed).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(
        r.body == changed,
        "the new version's bytes, none of the old"
    );
    let new_etag = r.header("etag").expect("an ETag").to_string();
    assert_ne!(new_etag, etag);
    let r = get(&e.server, "/pull/obj.bin", &[("Range", "bytes=100-199")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &changed[100..200]));
    assert_eq!(
        data_files(&e.cache, 1),
        1,
        "the replaced version's data file is gone"
    );

    // Deleted at the origin: its 404.
    std::fs::remove_file(&path).unwrap();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(
        data_files(&e.cache, 0),
        0,
        "nothing of it is kept: {}",
        e.server.log()
    );
}

/// A revalidation the origin cannot answer leaves the cached version served (the edge keeps
/// its content while the origin is down) and names the origin in the log.
#[test]
fn a_cached_version_is_served_while_its_origin_is_down() {
    let mut e = edge("1", "cache_revalidate_s = 0\ncache_heuristic_max_s = 0");
    let want = origin_file();
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    e.origin.stop();
    for _ in 0..3 {
        let r = get(&e.server, "/pull/obj.bin", &[]);
        assert_eq!(r.status, 200);
        assert!(r.body == want, "the cached bytes");
    }
    let r = get(&e.server, "/pull/other.bin", &[]);
    assert_eq!(r.status, 502, "nothing cached: the origin's absence shows");
    let origin = format!("http://{}", e.origin.addr);
    let log = e.server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("revalidation failed") && l.contains(&origin)),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("origin fill failed") && l.contains(&origin)),
        "{log}"
    );
}

/// An origin's 404 is remembered for `cache_404_s`: repeated requests for a missing file
/// reach the origin once; other keys are not affected.
#[test]
fn an_origin_404_is_remembered_briefly() {
    let e = edge("2", "cache_404_s = 60");
    for _ in 0..6 {
        let r = get(&e.server, "/pull/missing.bin", &[]);
        assert_eq!(r.status, 404);
    }
    let asked = |e: &Edge| e.origin.log().iter().filter(|l| l.status == 404).count();
    e.origin.wait_requests(1);
    assert_eq!(asked(&e), 1, "{:?}", e.origin.log());
    // Created at the origin meanwhile: still the remembered 404 until it expires.
    std::fs::write(e.origin_root.join("pull/missing.bin"), b"late\n").unwrap();
    assert_eq!(get(&e.server, "/pull/missing.bin", &[]).status, 404);
    assert_eq!(e.origin.log().len(), 1);
    let r = get(&e.server, "/pull/small.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"a manifest\n"[..]));
}

/// The metrics say where pulled bytes came from, how long the origin took to answer, and how
/// often a wait joined a fetch already under way.
#[test]
fn cache_metrics_count_bytes_by_source_latency_and_coalescing() {
    let e = edge("2", "");
    let want = origin_file();
    let clients: Vec<_> = (0..8)
        .map(|_| get_in_thread(e.server.addr, "/pull/obj.bin"))
        .collect();
    for c in clients {
        let r = c.join().expect("a client");
        assert_eq!(r.status, 200);
        assert!(r.body == want);
    }
    assert_eq!(e.origin.wait_body_bytes(OBJECT_BYTES), OBJECT_BYTES);
    // Each shard moves its counters at the end of a tick, and shard 0 reports the shared
    // ones: a count is read once it is there (or after 5 s).
    let metric = |family: &str, label: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let v = common::admin_metric(e.admin, family, label);
            if v > 0 || std::time::Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let origin_bytes = metric("shardline_cache_bytes_total", "source=\"origin\"");
    assert!(
        (OBJECT_BYTES..OBJECT_BYTES + 64 * 1024).contains(&origin_bytes),
        "origin bytes {origin_bytes}: the body once, and heads"
    );
    let disk_bytes = metric("shardline_cache_bytes_total", "source=\"disk\"");
    assert!(disk_bytes >= 8 * OBJECT_BYTES, "disk bytes {disk_bytes}");
    assert!(metric("shardline_origin_first_byte_seconds_count", "") >= 1);
    let joined = metric("shardline_cache_waits", "how=\"joined\"");
    let started = metric("shardline_cache_waits", "how=\"started\"");
    assert!(started >= 1, "someone started the fill");
    assert!(
        joined >= 1,
        "eight clients of one object: some joined ({joined}/{started})"
    );
}

/// `shardline cache purge` (through the admin listener) forgets one object, or every object
/// under a prefix: the next request fetches it from the origin again, byte for byte, and
/// the purged versions' data files go.
#[test]
fn a_purged_object_is_fetched_from_the_origin_again() {
    let e = edge("2", "");
    let want = origin_file();
    assert!(get(&e.server, "/pull/obj.bin", &[]).body == want);
    assert_eq!(get(&e.server, "/pull/small.txt", &[]).status, 200);
    assert_eq!(
        e.origin.wait_body_bytes(OBJECT_BYTES + 11),
        OBJECT_BYTES + 11
    );
    assert_eq!(data_files(&e.cache, 2), 2);
    let admin = e.admin.to_string();
    let purge = |args: &[&str]| {
        let mut all = vec![
            "cache",
            "purge",
            "--admin",
            &admin,
            "--token-file",
            e.token.path(),
        ];
        all.extend_from_slice(args);
        common::run_shardline(&all, std::time::Duration::from_secs(20))
    };
    let out = purge(&["/pull/obj.bin"]);
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout.trim(), "purged 1");
    assert_eq!(
        data_files(&e.cache, 1),
        1,
        "only the purged object's file goes"
    );
    // Hits for the other object; the purged one comes from the origin again.
    let r = get(&e.server, "/pull/small.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"a manifest\n"[..]));
    let r = get(&e.server, "/pull/obj.bin", &[]);
    assert!(r.status == 200 && r.body == want);
    assert_eq!(
        e.origin.wait_body_bytes(2 * OBJECT_BYTES + 11),
        2 * OBJECT_BYTES + 11
    );
    let out = purge(&["--prefix", "/pull/"]);
    assert_eq!(out.stdout.trim(), "purged 2", "{}", out.stderr);
    assert_eq!(data_files(&e.cache, 0), 0);
    let out = purge(&["--prefix", "/pull/"]);
    assert_eq!(out.stdout.trim(), "purged 0");
    let out = purge(&["pull/x"]);
    assert_eq!(
        out.code,
        Some(1),
        "a path must start with /: {}",
        out.stderr
    );
    assert_eq!(get(&e.server, "/pull/small.txt", &[]).status, 200);
    assert_eq!(
        e.origin.wait_requests(4).len(),
        4,
        "small.txt fetched twice, obj.bin twice"
    );
}

/// An `https://` origin (nginx with a certificate from a test CA, trusted through
/// `ca_file`): the fill speaks TLS on the shard's ring, every byte arrives as the origin
/// has it, the origin sends each byte once, and a kept-alive TLS connection carries the
/// next fetch. An origin whose certificate the edge does not trust is a 502, naming it.
#[test]
fn an_https_origin_fills_the_cache_over_tls() {
    let pki = common::tls::Pki::new();
    let (cert, key) = pki.leaf("origin", &["127.0.0.1"], common::tls::Key::EcdsaP256, 30);
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    common::write_pattern_file(&origin_root.path().join("pull/obj.bin"), OBJECT_BYTES);
    std::fs::write(origin_root.path().join("pull/small.txt"), b"a manifest\n").unwrap();
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start_tls(origin_root.path(), work.path(), "", &cert, &key);
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    // A second origin whose certificate no configured root vouches for.
    let other = common::tls::Pki::new();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n\
             [[origin]]\nprefix = \"/pull/\"\nurl = \"https://{addr}\"\nca_file = \"{ca}\"\n\
             [[origin]]\nprefix = \"/untrusted/\"\nurl = \"https://{addr}\"\nca_file = \"{other}\"\n",
            cache.display(),
            addr = origin.addr,
            ca = pki.ca.display(),
            other = other.ca.display(),
        ),
    )
    .unwrap();
    let server = Server::start(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    let want = origin_file();
    let r = get(&server, "/pull/obj.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == want, "the body pulled over TLS differs");
    assert_eq!(
        origin.wait_body_bytes(OBJECT_BYTES),
        OBJECT_BYTES,
        "each byte once"
    );
    let r = get(
        &server,
        "/pull/obj.bin",
        &[("Range", "bytes=2000000-2000099")],
    );
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &want[2_000_000..2_000_100])
    );
    let r = get(&server, "/pull/small.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"a manifest\n"[..]));
    let log = origin.log();
    assert!(
        log.iter().all(|l| l.status == 206 || l.status == 200),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|l| l.uri == "/pull/small.txt" && l.connection_requests >= 2),
        "the second fetch went over the kept-alive TLS connection: {log:?}"
    );
    let r = get(&server, "/untrusted/obj.bin", &[]);
    assert_eq!(r.status, 502, "an untrusted certificate");
    let text = server.log();
    assert!(
        text.contains("origin TLS handshake") && text.contains("127.0.0.1"),
        "{text}"
    );
}

/// HTTPS reads of a pulled object with the default block (half a chunk): over TLS a chunk
/// holds a little less plaintext than two blocks, so each read is one block. Cold (streamed
/// while it fills), warm, and ranges that start inside a block and cross blocks: every byte.
#[test]
fn https_clients_read_a_pulled_object_cold_warm_and_by_range() {
    let origin_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(origin_root.path().join("pull")).unwrap();
    common::write_pattern_file(&origin_root.path().join("pull/obj.bin"), OBJECT_BYTES);
    let work = tempfile::tempdir().unwrap();
    let origin = NginxOrigin::start(origin_root.path(), work.path(), "");
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let pki = common::tls::Pki::new();
    let leaf = pki.leaf("edge", &["localhost"], common::tls::Key::EcdsaP256, 30);
    let cfg = pki.config(
        &[leaf],
        &format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    );
    let (server, _admin) =
        common::start_tls_with_admin(&root, &["--config", cfg.to_str().unwrap()]);
    let tls_addr = server.tls_addr.expect("a TLS listener");
    let want = origin_file();
    let mut conn = common::tls::TlsConn::connect(tls_addr, pki.client(), "localhost").unwrap();
    for round in ["cold", "warm"] {
        let r = conn.get("/pull/obj.bin", &[]);
        assert_eq!(r.status, 200, "{round}");
        assert!(r.body == want, "{round}: the HTTPS body differs");
    }
    let block = 256 * 1024;
    for (first, last) in [
        (1000, 1999),
        (block - 10, block + 10),
        (3 * block + 77, OBJECT_BYTES - 1),
    ] {
        let range = format!("bytes={first}-{last}");
        let r = conn.get("/pull/obj.bin", &[("Range", &range)]);
        assert_eq!(r.status, 206, "{range}");
        assert!(
            r.body == want[first as usize..=last as usize],
            "{range}: the HTTPS body differs"
        );
    }
    // A fresh connection after all that: the server is still up.
    let mut again = common::tls::TlsConn::connect(tls_addr, pki.client(), "localhost").unwrap();
    assert_eq!(again.get("/pull/obj.bin", &[]).status, 200);
}
