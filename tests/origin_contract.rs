//! The cache keeps the origin's contract (issue 42, RFC 9111): its freshness decides when the
//! edge asks again, its end-to-end fields reach every client, and what must be validated is
//! never served unvalidated. A scripted origin (tests/common/scripted_origin.rs) answers with
//! the fields each test names, and 304 to a conditional request for its ETag.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::scripted_origin::{object, pulling_edge, ranged, Asked, ScriptedOrigin};
use common::{get, Server};

/// An origin that answers every object with `fields` (by path), and 304 to If-None-Match.
fn contract_origin(objects: Vec<(&'static str, Vec<u8>, &'static str)>) -> ScriptedOrigin {
    let origin = ScriptedOrigin::start(objects.iter().map(|(p, c, _)| (*p, c.clone())).collect());
    let fields: Vec<(String, &'static str)> = objects
        .iter()
        .map(|(p, _, f)| (p.to_string(), *f))
        .collect();
    origin.set(Arc::new(move |a: &Asked, c: &[u8]| {
        let bare = a.path.split('?').next().unwrap_or("");
        let f = fields
            .iter()
            .find(|(p, _)| p == bare)
            .map_or("", |(_, f)| *f);
        if a.if_none_match.as_deref() == Some("\"good\"") {
            let head = format!("HTTP/1.1 304 Not Modified\r\nETag: \"good\"\r\n{f}\r\n");
            return (head.into_bytes(), false, None);
        }
        (ranged(c, a.range, f), false, None)
    }));
    origin
}

/// shardline (one shard) pulling `/pull/` from `origin`.
fn edge(origin: &ScriptedOrigin) -> (Server, SocketAddr, tempfile::TempDir) {
    edge_with(origin, "")
}

/// `edge` with `origin_keys` in the `[[origin]]` entry.
fn edge_with(
    origin: &ScriptedOrigin,
    origin_keys: &str,
) -> (Server, SocketAddr, tempfile::TempDir) {
    pulling_edge(origin.addr, origin_keys)
}

/// A request's (count, conditional count) at the origin for `path`.
fn asked(origin: &ScriptedOrigin, path: &str) -> (usize, usize) {
    let seen = origin.seen();
    let of = seen.iter().filter(|s| s.path == path);
    (
        of.clone().count(),
        of.filter(|s| s.if_none_match.is_some()).count(),
    )
}

/// Freshness precedence (RFC 9111 §4.2.1, RFC 9213): a fresh object is served without asking,
/// and one whose lifetime is over (by max-age, s-maxage, CDN-Cache-Control or Expires) or that
/// is `no-cache` is asked again, conditionally, on its next use.
#[test]
fn the_origins_freshness_decides_when_to_ask_again() {
    let cases: Vec<(&'static str, &'static str, usize)> = vec![
        ("/pull/fresh.bin", "Cache-Control: max-age=3600\r\n", 0),
        ("/pull/silent.bin", "", 0),
        ("/pull/zero.bin", "Cache-Control: max-age=0\r\n", 1),
        (
            "/pull/cdn.bin",
            "Cache-Control: max-age=3600\r\nCDN-Cache-Control: max-age=0\r\n",
            1,
        ),
        (
            "/pull/cdn-longer.bin",
            "Cache-Control: max-age=0\r\nCDN-Cache-Control: max-age=3600\r\n",
            0,
        ),
        (
            "/pull/smax.bin",
            "Cache-Control: max-age=3600, s-maxage=0\r\n",
            1,
        ),
        (
            "/pull/expired.bin",
            "Date: Sun, 06 Dec 2026 00:00:00 GMT\r\nExpires: Sat, 05 Dec 2026 00:00:00 GMT\r\n",
            1,
        ),
        (
            "/pull/nocache.bin",
            "Cache-Control: max-age=3600, no-cache\r\n",
            1,
        ),
        (
            "/pull/aged.bin",
            "Cache-Control: max-age=100\r\nAge: 100\r\n",
            1,
        ),
    ];
    let objects: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, f, _))| (*p, object(70_000, i as u8), *f))
        .collect();
    let origin = contract_origin(objects.clone());
    let (server, _admin, _dir) = edge(&origin);
    for ((path, fields, revalidations), (_, content, _)) in cases.iter().zip(&objects) {
        for _ in 0..2 {
            let r = get(&server, path, &[]);
            assert_eq!(r.status, 200, "{path}");
            assert!(&r.body == content, "{path}: its bytes");
        }
        assert_eq!(
            asked(&origin, path),
            (1 + revalidations, *revalidations),
            "{path} ({fields:?}): origin requests and conditional ones"
        );
    }
}

/// The origin's end-to-end fields reach every client of the object, miss and hit, whole and
/// ranged (RFC 9111 §3.1, RFC 9110 §7.6.1): Content-Encoding labels the bytes, Set-Cookie is
/// never replayed; Age and Cache-Status (RFC 9211) say where the bytes came from.
#[test]
fn the_origins_head_reaches_every_client() {
    let content = object(300_000, 3);
    let fields = "Cache-Control: public, max-age=3600\r\nContent-Encoding: gzip\r\n\
                  Content-Disposition: attachment; filename=\"patch.pak\"\r\n\
                  Link: </manifest>; rel=preload\r\nSet-Cookie: session=alice\r\n\
                  Connection: x-hop\r\nX-Hop: 1\r\nDate: Fri, 01 Jan 2100 00:00:00 GMT\r\n";
    let origin = contract_origin(vec![("/pull/patch.pak", content.clone(), fields)]);
    let (server, _admin, _dir) = edge(&origin);
    let check = |r: &common::Response, what: &str| {
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{what}");
        assert_eq!(
            r.header("content-disposition"),
            Some("attachment; filename=\"patch.pak\""),
            "{what}"
        );
        assert_eq!(
            r.header("cache-control"),
            Some("public, max-age=3600"),
            "{what}"
        );
        assert_eq!(r.header("link"), Some("</manifest>; rel=preload"), "{what}");
        assert_eq!(r.header("set-cookie"), None, "{what}: never replayed");
        assert_eq!(r.header("x-hop"), None, "{what}");
        // The origin's Date, never the edge's (RFC 9110 §6.6.1), and only one.
        assert_eq!(
            r.header("date"),
            Some("Fri, 01 Jan 2100 00:00:00 GMT"),
            "{what}"
        );
        let dates = r
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("date"));
        assert_eq!(dates.count(), 1, "{what}");
        let age: u64 = r.header("age").expect("Age").parse().expect("a number");
        assert!(age < 3600, "{what}: age {age}");
    };
    let miss = get(&server, "/pull/patch.pak", &[]);
    assert_eq!(miss.status, 200);
    assert!(miss.body == content);
    check(&miss, "miss");
    let status = miss.header("cache-status").expect("Cache-Status");
    assert!(
        status.starts_with("shardline; fwd=miss; stored"),
        "{status}"
    );
    let hit = get(&server, "/pull/patch.pak", &[]);
    assert!(hit.body == content);
    check(&hit, "hit");
    let status = hit.header("cache-status").expect("Cache-Status");
    assert!(status.starts_with("shardline; hit; ttl="), "{status}");
    let part = get(&server, "/pull/patch.pak", &[("Range", "bytes=100-199")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.body, content[100..200]);
    check(&part, "range");
    assert_eq!(asked(&origin, "/pull/patch.pak").0, 1, "one origin request");
}

/// `no-cache` and `must-revalidate` (RFC 9111 §5.2.2.2, §5.2.2.4): once the origin cannot
/// confirm the copy, clients get an error, never the stale bytes; a copy with neither is
/// served stale meanwhile (today's rule, kept for the rest).
#[test]
fn a_copy_that_must_be_validated_is_never_served_stale() {
    let cases: Vec<(&'static str, &'static str, bool)> = vec![
        ("/pull/nocache.bin", "Cache-Control: no-cache\r\n", false),
        (
            "/pull/must.bin",
            "Cache-Control: max-age=0, must-revalidate\r\n",
            false,
        ),
        (
            "/pull/proxy.bin",
            "Cache-Control: max-age=0, proxy-revalidate\r\n",
            false,
        ),
        ("/pull/stale-ok.bin", "Cache-Control: max-age=0\r\n", true),
    ];
    let objects: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, f, _))| (*p, object(50_000, 40 + i as u8), *f))
        .collect();
    let origin = contract_origin(objects.clone());
    let (server, _admin, _dir) = edge(&origin);
    for (path, content, _) in &objects {
        assert!(&get(&server, path, &[]).body == content, "{path} cached");
    }
    // The origin fails from now on.
    origin.set(Arc::new(|_: &Asked, _: &[u8]| {
        (
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".to_vec(),
            false,
            None,
        )
    }));
    for ((path, fields, stale_ok), (_, content, _)) in cases.iter().zip(&objects) {
        let r = get(&server, path, &[]);
        if *stale_ok {
            assert_eq!(r.status, 200, "{path} ({fields:?}) served stale");
            assert!(&r.body == content);
        } else {
            assert!(r.status >= 500, "{path} ({fields:?}): got {}", r.status);
            assert!(&r.body != content, "{path}: never the stale bytes");
        }
    }
}

/// What a shared cache may not store (RFC 9111 §3, §3.5) is each client's own: `private`,
/// `no-store`, a Vary on a request field, and any request with Authorization get their own
/// origin fetch, whole and ranged, and never another client's bytes; nothing of it is kept.
/// Two clients whose requests meet in one fill each get their own reply.
#[test]
fn what_may_not_be_stored_is_each_clients_own() {
    // The origin answers each request with bytes of its own: the query names the client.
    let size = 200_000usize;
    let cases: Vec<(&'static str, &'static str)> = vec![
        (
            "/pull/private.bin",
            "Cache-Control: private, max-age=600\r\n",
        ),
        ("/pull/nostore.bin", "Cache-Control: no-store\r\n"),
        (
            "/pull/vary.bin",
            "Vary: *\r\nCache-Control: max-age=600\r\n",
        ),
        ("/pull/auth.bin", "Cache-Control: max-age=600\r\n"),
    ];
    let origin = ScriptedOrigin::start(cases.iter().map(|(p, _)| (*p, vec![0u8; size])).collect());
    let fields: Vec<(String, &'static str)> =
        cases.iter().map(|(p, f)| (p.to_string(), *f)).collect();
    origin.set(Arc::new(move |a: &Asked, _: &[u8]| {
        let (bare, query) = a.path.split_once('?').unwrap_or((&a.path, ""));
        let f = fields
            .iter()
            .find(|(p, _)| p == bare)
            .map_or("", |(_, f)| *f);
        let salt = query
            .bytes()
            .fold(7u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
        (ranged(&object(size, salt), a.range, f), false, None)
    }));
    let (server, admin, _dir) = edge(&origin);
    let mine = |query: &str| {
        let salt = query
            .bytes()
            .fold(7u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
        object(size, salt)
    };
    for (path, fields) in &cases {
        let auth: &[(&str, &str)] = if path.contains("auth") {
            &[("Authorization", "Bearer x")]
        } else {
            &[]
        };
        for user in ["user=alice", "user=bob", "user=carol"] {
            let url = format!("{path}?{user}");
            let r = get(&server, &url, auth);
            assert_eq!(r.status, 200, "{url} ({fields:?})");
            assert!(r.body == mine(user), "{url}: its own bytes");
            let status = r.header("cache-status").unwrap_or_default();
            assert!(status.contains("fwd=miss; detail="), "{url}: {status}");
            let part = get(
                &server,
                &url,
                &[&[("Range", "bytes=1000-1999")], auth].concat(),
            );
            assert_eq!(part.status, 206, "{url} ranged");
            assert_eq!(
                part.body,
                mine(user)[1000..2000],
                "{url} ranged: its own bytes"
            );
        }
        let (requests, authorized) = asked_prefix(&origin, path);
        if auth.is_empty() {
            // The fill's reply went to the client that started it: one request per client.
            assert_eq!(requests, 6, "{path}: each client asked the origin once");
        } else {
            assert_eq!(
                (requests, authorized),
                (6, 6),
                "{path}: each asked with its credential"
            );
        }
    }
    // The first request of each key learns why; the next ones pass at once (hit-for-pass).
    for (reason, at_least) in [
        ("private", 1),
        ("no-store", 1),
        ("vary", 1),
        ("authorization", 6),
        ("not-stored", 15),
    ] {
        let label = format!("reason=\"{reason}\"");
        let n = common::admin_metric(admin, "shardline_cache_not_stored_total", &label);
        assert!(n >= at_least, "{reason}: {n} counted");
    }
    // Nothing was stored: the cache holds no version of them.
    assert_eq!(
        common::admin_metric(admin, "shardline_cache_lookups_total", "result=\"hit\""),
        0
    );
    // Two clients meet in one fill of a key not yet known to be private: the origin holds
    // the fill's reply until the second request has joined it (the coalescing counter
    // says so); then each client gets its own bytes from its own fetch.
    let together = "/pull/together.bin";
    let origin2 = ScriptedOrigin::start(vec![(together, vec![0u8; size])]);
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (r2, f2) = (release.clone(), first.clone());
    origin2.set(Arc::new(move |a: &Asked, _: &[u8]| {
        let query = a.path.split_once('?').map_or("", |(_, q)| q);
        let salt = query
            .bytes()
            .fold(7u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
        if f2.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !r2.load(std::sync::atomic::Ordering::SeqCst)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        (
            ranged(&object(size, salt), a.range, "Cache-Control: private\r\n"),
            false,
            None,
        )
    }));
    let (server2, admin2, _dir2) = edge(&origin2);
    let server2 = Arc::new(server2);
    let clients: Vec<_> = ["user=dave", "user=erin"]
        .into_iter()
        .map(|user| {
            let server2 = server2.clone();
            std::thread::spawn(move || (user, get(&server2, &format!("{together}?{user}"), &[])))
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while common::admin_metric(admin2, "shardline_cache_waits", "how=\"joined\"") < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second request never joined the fill"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        let (user, r) = client.join().unwrap();
        assert_eq!(r.status, 200, "{user}");
        assert!(
            r.body == mine(user),
            "{user} got its own bytes, not the fill's"
        );
    }
}

/// A reply with `Vary` (RFC 9111 §4.1) is stored with the values of the request that got
/// it, and a request with other values gets its own variant, stored under its own key
/// (`contract::variant_key`, at most `MAX_VARIANTS_PER_KEY` of them): each language is fetched
/// once and then hit. A request whose variant's place holds another's makes its own fetch
/// and gets its own bytes, every time.
#[test]
fn a_vary_reply_is_served_only_to_requests_that_match_it() {
    use shardline::origin::contract::{selecting_lines, variant_key};
    let size = 50_000usize;
    let path = "/pull/localized.bin";
    let origin = ScriptedOrigin::start(vec![(path, vec![0u8; size])]);
    let (server, admin, _dir) = edge(&origin);
    let language = |head: &str| {
        head.lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("accept-language:")
                    .map(|v| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let salt = |lang: &str| lang.bytes().fold(3u8, |h, b| h.wrapping_mul(31) ^ b);
    origin.set(Arc::new(move |a: &Asked, _: &[u8]| {
        // The reply is the language the request asked for.
        let lang = language(&a.head);
        (
            ranged(
                &object(size, salt(&lang)),
                a.range,
                "Vary: Accept-Language\r\nCache-Control: max-age=600\r\n",
            ),
            false,
            None,
        )
    }));
    let ask = |lang: &str| {
        let r = get(&server, path, &[("Accept-Language", lang)]);
        assert_eq!(r.status, 200);
        assert!(
            r.body == object(size, salt(lang)),
            "{lang:?}: the bytes for its own language"
        );
        assert_eq!(r.header("vary"), Some("Accept-Language"));
        r.header("cache-status").unwrap_or_default().to_owned()
    };
    // The variant place a language takes (what the key adds depends only on the values).
    let stored = selecting_lines("Accept-Language", "Accept-Language: en\r\n");
    let place = |lang: &str| {
        let fields = format!("Accept-Language: {lang}\r\n");
        variant_key(b"k", &stored, fields.as_bytes()).expect("a variant")
    };
    assert!(ask("en").contains("fwd=miss"));
    assert!(ask("en").contains("hit"), "the same language: a hit");
    assert!(
        ask("fr").contains("fwd=miss"),
        "another: its own variant, stored"
    );
    assert!(ask("fr").contains("hit"), "that variant: a hit");
    assert!(ask("en").contains("hit"), "the first one stays");
    // A language whose place is fr's: its own fetch each time, never fr's bytes.
    let sharing = (0..1000)
        .map(|i| format!("x{i}"))
        .find(|l| place(l) == place("fr"))
        .expect("a language sharing fr's place");
    assert!(ask(&sharing).contains("detail=vary"), "{sharing}: its own");
    assert!(ask(&sharing).contains("detail=vary"), "{sharing}: again");
    assert!(ask("fr").contains("hit"), "fr's variant stays");
    assert_eq!(
        asked(&origin, path).0,
        4,
        "one origin request per stored language, one per request of the other"
    );
    assert_eq!(
        common::admin_metric(admin, "shardline_cache_not_stored_total", "reason=\"vary\""),
        2
    );
}

/// Sets `origin` to hold every request until `release` is set (at most 30 s), counting them
/// in `entered`, then answer each with `size` bytes salted by `seed` and its query (each
/// user's own bytes).
fn hold_requests(
    origin: &ScriptedOrigin,
    size: usize,
    seed: u8,
) -> (
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (e2, r2) = (entered.clone(), release.clone());
    origin.set(Arc::new(move |a: &Asked, _: &[u8]| {
        e2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !r2.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let user = a.path.split_once('?').map_or("", |(_, q)| q);
        (
            ranged(&object(size, user_salt(seed, user)), a.range, ""),
            false,
            None,
        )
    }));
    (entered, release)
}

/// The salt of `user`'s bytes (`hold_requests`).
fn user_salt(seed: u8, user: &str) -> u8 {
    user.bytes().fold(seed, |h, b| h.wrapping_mul(31) ^ b)
}

/// More requests of their own at once than a shard runs pass-throughs
/// (`MAX_PASS_THROUGHS_PER_SHARD`, 8): the others wait for one to end, none gets a 503.
#[test]
fn requests_past_the_pass_through_bound_wait_for_their_turn() {
    const CLIENTS: usize = 12;
    const BOUND: usize = 8;
    let size = 20_000usize;
    let path = "/pull/mine.bin";
    let origin = ScriptedOrigin::start(vec![(path, vec![0u8; size])]);
    let (entered, release) = hold_requests(&origin, size, 5);
    let (server, admin, _dir) = edge(&origin);
    let server = Arc::new(server);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let server = server.clone();
            std::thread::spawn(move || {
                let user = format!("user={i}");
                let r = get(
                    &server,
                    &format!("{path}?{user}"),
                    &[("Authorization", "Bearer t")],
                );
                (user, r)
            })
        })
        .collect();
    // The bound's worth reach the origin, the rest wait at the edge: then the origin answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while entered.load(std::sync::atomic::Ordering::SeqCst) < BOUND
        || common::admin_metric(admin, "shardline_cache_pass_waits_total", "")
            < (CLIENTS - BOUND) as u64
    {
        assert!(std::time::Instant::now() < deadline, "never saturated");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(entered.load(std::sync::atomic::Ordering::SeqCst), BOUND);
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        let (user, r) = client.join().unwrap();
        assert_eq!(r.status, 200, "{user}: waited, never refused");
        assert!(
            r.body == object(size, user_salt(5, &user)),
            "{user}: its own bytes"
        );
    }
    assert_eq!(asked(&origin, path).0, 0, "every request carried its query");
    assert_eq!(asked_prefix(&origin, path).0, CLIENTS);
}

/// A request waiting for room to start its own fetch that runs out of time
/// (`cache_wait_timeout_ms`) gets a 503: it never reached the origin, so the edge, not the
/// origin, was short. The ones the origin holds past that time get a 504.
#[test]
fn a_wait_for_room_that_runs_out_is_a_503_and_a_held_fetch_a_504() {
    const CLIENTS: usize = 12;
    const BOUND: usize = 8;
    let size = 20_000usize;
    let path = "/pull/mine.bin";
    let origin = ScriptedOrigin::start(vec![(path, vec![0u8; size])]);
    let (entered, release) = hold_requests(&origin, size, 7);
    let dir = common::disk_tempdir();
    let (root, cache) = (dir.path().join("root"), dir.path().join("cache"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\ncache_wait_timeout_ms = 1500\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    let server = Arc::new(server);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let server = server.clone();
            std::thread::spawn(move || {
                let user = format!("user={i}");
                let r = get(
                    &server,
                    &format!("{path}?{user}"),
                    &[("Authorization", "Bearer t")],
                );
                (user, r)
            })
        })
        .collect();
    let answers: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    // Every answer came while the origin still held its requests: only the bound's worth
    // reached it.
    assert_eq!(entered.load(std::sync::atomic::Ordering::SeqCst), BOUND);
    assert_eq!(
        common::admin_metric(admin, "shardline_cache_pass_waits_total", ""),
        (CLIENTS - BOUND) as u64,
        "the requests past the bound waited"
    );
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    let count = |status: u16| answers.iter().filter(|(_, r)| r.status == status).count();
    assert_eq!(
        (count(504), count(503)),
        (BOUND, CLIENTS - BOUND),
        "held at the origin: 504; never sent: 503; got {:?}",
        answers
            .iter()
            .map(|(u, r)| (u, r.status))
            .collect::<Vec<_>>()
    );
}

/// Requests of their own past the origin's `max_fetches` (its fetch bound, here 1, shared by
/// two shards) wait for a fetch to end, on their shard or the other one; none gets a 503.
#[test]
fn requests_past_the_origins_fetch_bound_wait_for_room() {
    const CLIENTS: usize = 8;
    const BOUND: usize = 1;
    let Some(cpus) = common::two_or_more_cpus() else {
        return;
    };
    let size = 10_000usize;
    let path = "/pull/theirs.bin";
    let origin = ScriptedOrigin::start(vec![(path, vec![0u8; size])]);
    let (entered, release) = hold_requests(&origin, size, 9);
    let (server, admin, _dir) =
        common::scripted_origin::pulling_edge_on(origin.addr, &format!("max_fetches = {BOUND}"), 2);
    let server = Arc::new(server);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let server = server.clone();
            let cpu = cpus[i % 2];
            std::thread::spawn(move || {
                // Loopback SYNs are steered to the shard of the sending CPU: half the clients
                // go to each shard.
                common::pin_to_cpu(cpu);
                let user = format!("user={i}");
                let r = get(
                    &server,
                    &format!("{path}?{user}"),
                    &[("Authorization", "Bearer t")],
                );
                (user, r)
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while entered.load(std::sync::atomic::Ordering::SeqCst) < BOUND
        || common::admin_metric(admin, "shardline_cache_pass_waits_total", "")
            < (CLIENTS - BOUND) as u64
    {
        assert!(std::time::Instant::now() < deadline, "never at the bound");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(entered.load(std::sync::atomic::Ordering::SeqCst), BOUND);
    for shard in ["0", "1"] {
        let label = format!("shard=\"{shard}\"");
        let waits = common::admin_metric(admin, "shardline_cache_pass_waits_total", &label);
        assert!(
            waits > 0,
            "shard {shard} has requests waiting for the origin"
        );
    }
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        let (user, r) = client.join().unwrap();
        assert_eq!(r.status, 200, "{user}: waited, never refused");
        assert!(
            r.body == object(size, user_salt(9, &user)),
            "{user}: its own bytes"
        );
    }
    assert_eq!(asked_prefix(&origin, path).0, CLIENTS);
}

/// A reply framed by chunked encoding (a manifest an origin generates) is dechunked and
/// stored with its length: the client gets the bytes with a Content-Length, the next one a
/// hit; a coding besides chunked stays refused (502), never served as the object.
#[test]
fn a_chunked_reply_is_stored_with_its_length() {
    let manifest: Vec<u8> = (0..5000u32)
        .map(|i| b"0123456789abcdef"[(i % 16) as usize])
        .collect();
    let origin = ScriptedOrigin::start(vec![
        ("/pull/latest.json", manifest.clone()),
        ("/pull/coded.json", manifest.clone()),
    ]);
    origin.set(Arc::new(|a: &Asked, c: &[u8]| {
        let coding = if a.path.contains("coded") {
            "gzip, chunked"
        } else {
            "chunked"
        };
        let mut reply = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: {coding}\r\nCache-Control: max-age=60\r\n\r\n"
        )
        .into_bytes();
        for piece in c.chunks(1234) {
            reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            reply.extend_from_slice(piece);
            reply.extend_from_slice(b"\r\n");
        }
        reply.extend_from_slice(b"0\r\n\r\n");
        (reply, false, None)
    }));
    let (server, _admin, _dir) = edge(&origin);
    for round in 0..2 {
        let r = get(&server, "/pull/latest.json", &[]);
        assert_eq!(r.status, 200, "round {round}");
        assert!(r.body == manifest, "round {round}: the dechunked bytes");
        assert_eq!(r.header("content-length"), Some("5000"));
        assert_eq!(r.header("transfer-encoding"), None);
    }
    assert_eq!(asked(&origin, "/pull/latest.json").0, 1, "stored");
    assert_eq!(get(&server, "/pull/coded.json", &[]).status, 502);
}

/// Requests at the origin for `path`, whatever their query.
fn asked_prefix(origin: &ScriptedOrigin, path: &str) -> (usize, usize) {
    let seen = origin.seen();
    let of = seen
        .iter()
        .filter(|s| s.path.split('?').next() == Some(path));
    (of.clone().count(), of.filter(|s| s.authorization).count())
}

/// Answers other than 200/206 reach the client as the origin gave them (issue 42, item 7): a
/// redirect with its Location and body, a refusal or an error with its status and body; none
/// is a 502. One with explicit freshness, or a heuristically cacheable one with a
/// Last-Modified, is stored and served whole from the cache (a range asked of it too); the
/// others are each client's own.
#[test]
fn the_origins_other_answers_reach_the_client() {
    // (path, status, fields, origin requests for the three client requests)
    let cases: Vec<(&'static str, u16, &'static str, usize)> = vec![
        (
            "/pull/moved.bin",
            302,
            "Location: https://cdn.example/v2/moved.bin\r\n",
            3,
        ),
        (
            "/pull/perm.bin",
            301,
            "Location: /pull/v2/perm.bin\r\nCache-Control: max-age=600\r\n",
            1,
        ),
        ("/pull/see.bin", 307, "Location: /pull/elsewhere.bin\r\n", 3),
        ("/pull/denied.bin", 403, "", 3),
        ("/pull/gone.bin", 410, "", 3),
        (
            "/pull/old-gone.bin",
            410,
            "Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n",
            1,
        ),
        ("/pull/missing.bin", 404, "Cache-Control: no-store\r\n", 3),
        ("/pull/absent.bin", 404, "Cache-Control: max-age=600\r\n", 1),
        ("/pull/broken.bin", 500, "", 3),
        (
            "/pull/overloaded.bin",
            503,
            "Cache-Control: max-age=600\r\n",
            1,
        ),
        ("/pull/later.bin", 503, "", 3),
    ];
    let origin = ScriptedOrigin::start(
        cases
            .iter()
            .map(|(p, _, _, _)| (*p, vec![1u8; 10]))
            .collect(),
    );
    let table: Vec<(String, u16, &'static str)> = cases
        .iter()
        .map(|(p, s, f, _)| (p.to_string(), *s, *f))
        .collect();
    origin.set(Arc::new(move |a: &Asked, _: &[u8]| {
        let (_, status, fields) = table.iter().find(|(p, _, _)| *p == a.path).expect("a case");
        let body = format!("the origin's {status} page\n");
        let reply = format!(
            "HTTP/1.1 {status} Whatever\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n{fields}\r\n{body}",
            body.len()
        );
        (reply.into_bytes(), false, None)
    }));
    let (server, _admin, _dir) = edge(&origin);
    for (path, status, fields, requests) in &cases {
        for round in 0..3 {
            // The last round asks a range: a stored answer is served whole all the same.
            let range: &[(&str, &str)] = if round == 2 {
                &[("Range", "bytes=2-5")]
            } else {
                &[]
            };
            let r = get(&server, path, range);
            assert_eq!(r.status, *status, "{path} round {round}");
            if let Some(location) = fields.strip_prefix("Location: ") {
                let location = location.split("\r\n").next().unwrap();
                assert_eq!(r.header("location"), Some(location), "{path}");
            }
            assert_eq!(
                String::from_utf8_lossy(&r.body),
                format!("the origin's {status} page\n"),
                "{path} round {round}: the origin's body"
            );
        }
        // Each request asked once unless stored: the first one's fill reply was its own.
        assert_eq!(asked(&origin, path).0, *requests, "{path}: origin requests");
    }
}

/// Per-origin policy (issue 42, item 8): `cache_policy = "override"` stores what its origin
/// forbids (no-store, max-age=0) for `ttl_s`, but never a `private` reply; `never_cache`
/// paths are each client's own fetch whatever the origin says.
#[test]
fn the_operator_may_override_the_origin_but_never_share_private() {
    let cases: Vec<(&'static str, &'static str)> = vec![
        (
            "/pull/forbidden.bin",
            "Cache-Control: no-store, max-age=0\r\n",
        ),
        ("/pull/private.bin", "Cache-Control: private\r\n"),
        ("/pull/v1/latest.json", "Cache-Control: max-age=3600\r\n"),
    ];
    let objects: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, f))| (*p, object(30_000, 90 + i as u8), *f))
        .collect();
    let origin = contract_origin(objects.clone());
    let (server, _admin, dir) = edge_with(
        &origin,
        "cache_policy = \"override\"\nttl_s = 3600\nnever_cache = [\"/pull/*/latest.json\"]",
    );
    let (root, cfg) = (dir.path().join("root"), dir.path().join("shardline.toml"));
    for (path, content, _) in &objects {
        for _ in 0..3 {
            let r = get(&server, path, &[]);
            assert_eq!(r.status, 200, "{path}");
            assert!(&r.body == content, "{path}");
        }
    }
    assert_eq!(
        asked(&origin, "/pull/forbidden.bin").0,
        1,
        "stored for ttl_s"
    );
    assert_eq!(
        asked(&origin, "/pull/private.bin").0,
        3,
        "private: never shared, one request per client"
    );
    assert_eq!(
        asked(&origin, "/pull/v1/latest.json").0,
        3,
        "never_cache: each its own"
    );
    // A ttl_s without override, or a pattern not starting with '/', is refused at start.
    std::fs::write(
        &cfg,
        format!(
            "[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\nttl_s = 5\n",
            origin.addr
        ),
    )
    .unwrap();
    let out = common::run_shardline(
        &[
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
        ],
        std::time::Duration::from_secs(10),
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("ttl_s"), "{}", out.stderr);
}

/// `stale-while-revalidate` and `stale-if-error` (RFC 5861, issue 42 item 5): a copy within
/// its stale-while-revalidate window is served at once while one revalidation runs behind it;
/// when revalidation fails, a copy is served stale only within its stale-if-error window (the
/// origin entry's `stale_if_error_s` where the origin gave none).
#[test]
fn stale_copies_are_served_within_their_windows() {
    let cases: Vec<(&'static str, &'static str)> = vec![
        (
            "/pull/swr.bin",
            "Cache-Control: max-age=0, stale-while-revalidate=600\r\n",
        ),
        (
            "/pull/sie.bin",
            "Cache-Control: max-age=0, stale-if-error=600\r\n",
        ),
        ("/pull/plain.bin", "Cache-Control: max-age=0\r\n"),
    ];
    let objects: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (p, f))| (*p, object(40_000, 120 + i as u8), *f))
        .collect();
    let origin = contract_origin(objects.clone());
    // No stale copy on error unless the origin allows it.
    let (server, _admin, _dir) = edge_with(&origin, "stale_if_error_s = 0");
    for (path, content, _) in &objects {
        assert!(&get(&server, path, &[]).body == content, "{path} cached");
    }
    // Within stale-while-revalidate: served at once, as a hit, and revalidated behind it.
    let r = get(&server, "/pull/swr.bin", &[]);
    assert!(r.body == objects[0].1);
    let status = r.header("cache-status").unwrap_or_default().to_owned();
    assert!(status.starts_with("shardline; hit"), "{status}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while asked(&origin, "/pull/swr.bin").1 < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "no revalidation behind the stale hit"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The origin fails from now on.
    origin.set(Arc::new(|_: &Asked, _: &[u8]| {
        (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec(),
            false,
            None,
        )
    }));
    let sie = get(&server, "/pull/sie.bin", &[]);
    assert_eq!(sie.status, 200, "within stale-if-error: served stale");
    assert!(sie.body == objects[1].1);
    let plain = get(&server, "/pull/plain.bin", &[]);
    assert!(
        plain.status >= 500,
        "stale_if_error_s = 0: not served stale ({})",
        plain.status
    );
}

/// A revalidation renews the stored contract (RFC 9111 §4.3.4): a 304's fields replace the
/// stored ones of the same name and its freshness replaces the old one, so a copy confirmed
/// with a longer max-age is not asked about again, and clients see the new fields.
#[test]
fn a_304_renews_the_stored_fields_and_freshness() {
    let content = object(60_000, 77);
    let origin = contract_origin(vec![(
        "/pull/renewed.bin",
        content.clone(),
        "Cache-Control: max-age=0\r\nX-Build: 1\r\nX-Kept: yes\r\n",
    )]);
    let (server, _admin, _dir) = edge(&origin);
    assert_eq!(
        get(&server, "/pull/renewed.bin", &[]).header("x-build"),
        Some("1")
    );
    // The origin now confirms with other fields: a long lifetime and a new build number.
    origin.set(Arc::new(|a: &Asked, c: &[u8]| {
        let f = "Cache-Control: max-age=3600\r\nX-Build: 2\r\n";
        if a.if_none_match.as_deref() == Some("\"good\"") {
            let head = format!("HTTP/1.1 304 Not Modified\r\nETag: \"good\"\r\n{f}\r\n");
            return (head.into_bytes(), false, None);
        }
        (ranged(c, a.range, f), false, None)
    }));
    let r = get(&server, "/pull/renewed.bin", &[]);
    assert!(r.body == content);
    assert_eq!(
        r.header("x-build"),
        Some("2"),
        "the 304's field replaced the stored one"
    );
    assert_eq!(
        r.header("x-kept"),
        Some("yes"),
        "fields it did not name are kept"
    );
    assert_eq!(r.header("cache-control"), Some("max-age=3600"));
    for _ in 0..3 {
        assert!(get(&server, "/pull/renewed.bin", &[]).body == content);
    }
    assert_eq!(
        asked(&origin, "/pull/renewed.bin"),
        (2, 1),
        "fresh for the 304's max-age: not asked again"
    );
}

/// The client's end-to-end request fields reach the origin (as a reverse proxy forwards
/// them): on a fill without its Cookie (the reply is shared), on its own fetch with it; never
/// hop-by-hop ones or the client's range and conditionals.
#[test]
fn the_clients_fields_reach_the_origin() {
    let origin = contract_origin(vec![
        (
            "/pull/shared.bin",
            object(20_000, 1),
            "Cache-Control: max-age=600\r\n",
        ),
        (
            "/pull/own.bin",
            object(20_000, 2),
            "Cache-Control: private\r\n",
        ),
    ]);
    let (server, _admin, _dir) = edge(&origin);
    let fields = [
        ("X-Client-Build", "7"),
        ("Cookie", "session=alice"),
        ("Range", "bytes=0-9"),
        ("Connection", "close, X-Hop"),
        ("X-Hop", "1"),
    ];
    for path in ["/pull/shared.bin", "/pull/own.bin"] {
        assert_eq!(get(&server, path, &fields).status, 206, "{path}");
    }
    let seen = origin.seen();
    let head_of = |path: &str| {
        seen.iter()
            .filter(|s| s.path == path)
            .map(|s| s.head.to_ascii_lowercase())
            .collect::<Vec<_>>()
    };
    for head in head_of("/pull/shared.bin") {
        assert!(head.contains("x-client-build: 7"), "{head}");
        assert!(
            !head.contains("cookie"),
            "a shared fill carries no cookie: {head}"
        );
        assert!(!head.contains("x-hop"), "{head}");
    }
    let own = head_of("/pull/own.bin");
    let last = own.last().expect("its own fetch");
    assert!(
        last.contains("cookie: session=alice"),
        "its own fetch: {last}"
    );
    assert!(last.contains("x-client-build: 7"), "{last}");
}
