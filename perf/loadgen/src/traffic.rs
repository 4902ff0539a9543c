//! `traffic`: the platforms' real traffic (issue 31), as a seeded trace over a catalogue of
//! objects, played by concurrent keep-alive clients; every body byte is checked against the
//! fixture stream (`crate::Verifier`), so no file is read to check it.
//!
//!   traffic-gen --dir D [--seed S] [--scale F]   writes the catalogue under D (the origin's root)
//!   traffic --addr A [--seed S] [--scale F] [--clients C] [--sessions-from K]
//!
//! The mix (scale 1; `--scale` multiplies object sizes and the Steam chunk count):
//! - **Steam**: 8 depots of 48 chunks (`/depot/<d>/chunk/<40 hex>`, 768 KiB-1.25 MiB each).
//!   One session per depot fetches its chunks in order, whole, with no Range; each request
//!   carries per-session tokens (`?l=&e=&sid=&h=`) and one of three Host names. Depots 0-3 are
//!   downloaded a second time by another client, with other tokens and hosts (one object
//!   under many names and tokens must be fetched once).
//! - **Riot**: 8 bundles of 16 MiB (`/riot/bundles/<hex>.bundle`); 12 sessions of 8
//!   requests, each a multipart Range of 2-5 disjoint pieces of 1-64 KiB inside a 2 MiB window.
//! - **PlayStation 5**: 2 packages of 144 MiB (`/ps5/ppkg/*.pkg`); one session each reads its
//!   package in 18 MiB ranges, in order.
//! - **Delivery Optimization / Battle.net archives**: one 512 MiB archive
//!   (`/do/filestreamingservice/files/<guid>`); 8 sessions of 24 random ranges of 64 KiB-1 MiB.
//! - **Whole files** (Epic, patches): 4 files of 64 MiB (`/files/patch-<k>.bin`), one GET each.
//!
//! Sessions are shuffled (seeded) and taken in turn by `--clients` workers (default 16: Steam
//! keeps 5-30 connections), each on one keep-alive connection. `--sessions-from K` plays only
//! sessions whose kind is in K (a comma list of steam,riot,ps5,do,whole).
//!
//! Output (`key=value`): requests, useful_bytes (the bytes the requests asked for),
//! body_bytes (what arrived), unique_bytes (the union of requested bytes over the catalogue),
//! catalogue_bytes, wall_s, goodput_mb_s (useful bytes per second), wrong_responses (a byte
//! differed, a part was missing, or a Content-Range lied), errors (a failed request: status,
//! connection), and per kind `<kind>_useful_bytes`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{die, resolve, word, Args, Conn, Verifier};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
/// Steam's CDN names one chunk is served under (uklans/cache-domains#67).
const STEAM_HOSTS: [&str; 3] = [
    "cache1-fra1.steamcontent.com",
    "cache2-fra1.steamcontent.com",
    "lancache.steamcontent.com",
];
/// A response body the player keeps whole to parse (multipart): far over any Riot request.
const MULTIPART_BODY_MAX: u64 = 4 * MIB;
/// Per-request socket timeout: a stuck server fails the run instead of hanging it.
const REQUEST_TIMEOUT_S: u64 = 120;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Steam,
    Riot,
    Ps5,
    Do,
    Whole,
}

const KINDS: [(Kind, &str); 5] = [
    (Kind::Steam, "steam"),
    (Kind::Riot, "riot"),
    (Kind::Ps5, "ps5"),
    (Kind::Do, "do"),
    (Kind::Whole, "whole"),
];

/// One object of the catalogue: its path, fixture seed and size.
struct Obj {
    path: String,
    seed: u64,
    size: u64,
}

/// One request: an object, the Host and query it is asked with, and its ranges (inclusive
/// ends; empty: the whole object).
struct Req {
    obj: usize,
    host: &'static str,
    query: Option<String>,
    ranges: Vec<(u64, u64)>,
}

/// Requests one client plays in order on one connection.
struct Session {
    kind: Kind,
    reqs: Vec<Req>,
}

/// A seeded generator (splitmix64 over a counter).
struct Rng {
    seed: u64,
    n: u64,
}

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng { seed, n: 0 }
    }
    fn next(&mut self) -> u64 {
        self.n += 1;
        word(self.seed, self.n)
    }
    /// Uniform in [lo, hi).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo);
        lo + self.next() % (hi - lo)
    }
    fn hex(&mut self, digits: usize) -> String {
        let mut s = String::with_capacity(digits);
        while s.len() < digits {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(digits);
        s
    }
}

fn scaled(bytes: u64, scale: f64) -> u64 {
    ((bytes as f64 * scale) as u64).max(64 * KIB)
}

/// The catalogue and the trace over it, both from `seed` and `scale`.
fn build(seed: u64, scale: f64) -> (Vec<Obj>, Vec<Session>) {
    let mut rng = Rng::new(seed);
    let mut objs = Vec::new();
    let mut sessions = Vec::new();
    let add = |objs: &mut Vec<Obj>, path: String, size: u64, rng: &mut Rng| {
        objs.push(Obj {
            path,
            seed: rng.next(),
            size,
        });
        objs.len() - 1
    };
    // Steam: depots of chunks, fetched whole with tokens under several names.
    let chunks = ((48.0 * scale).round() as usize).max(2);
    let mut depots = Vec::new();
    for d in 0..8u64 {
        let depot = 228_980 + d * 10;
        let ids: Vec<usize> = (0..chunks)
            .map(|_| {
                let size = rng.range(768 * KIB, 1280 * KIB);
                let path = format!("/depot/{depot}/chunk/{}", rng.hex(40));
                add(&mut objs, path, size, &mut rng)
            })
            .collect();
        depots.push(ids);
    }
    let steam_session = |ids: &[usize], rng: &mut Rng| Session {
        kind: Kind::Steam,
        reqs: ids
            .iter()
            .map(|&obj| Req {
                obj,
                host: STEAM_HOSTS[(rng.next() % 3) as usize],
                query: Some(format!(
                    "l={}&e={}&sid={}&h={}",
                    rng.range(1, 50),
                    1_764_000_000 + rng.range(0, 86_400),
                    rng.next(),
                    rng.hex(16)
                )),
                ranges: Vec::new(),
            })
            .collect(),
    };
    for ids in &depots {
        sessions.push(steam_session(ids, &mut rng));
    }
    for ids in depots.iter().take(4) {
        sessions.push(steam_session(ids, &mut rng));
    }
    // Riot: multipart ranges into bundles.
    let bundle = scaled(16 * MIB, scale);
    let bundles: Vec<usize> = (0..8)
        .map(|_| {
            let path = format!("/riot/bundles/{}.bundle", rng.hex(16).to_uppercase());
            add(&mut objs, path, bundle, &mut rng)
        })
        .collect();
    for _ in 0..12 {
        let reqs = (0..8)
            .map(|_| {
                let obj = bundles[(rng.next() % bundles.len() as u64) as usize];
                let window = (2 * MIB).min(bundle);
                let base = rng.range(0, bundle - window + 1);
                let pieces = rng.range(2, 6);
                // Disjoint, sorted pieces: one per equal share of the window.
                let share = window / pieces;
                let ranges = (0..pieces)
                    .map(|p| {
                        let len = rng.range(KIB, (64 * KIB).min(share / 2));
                        let start = base + p * share + rng.range(0, share - len);
                        (start, start + len - 1)
                    })
                    .collect();
                Req {
                    obj,
                    host: "riot.example",
                    query: None,
                    ranges,
                }
            })
            .collect();
        sessions.push(Session {
            kind: Kind::Riot,
            reqs,
        });
    }
    // PlayStation 5: 18 MiB ranges in order.
    let pkg = scaled(144 * MIB, scale);
    let piece = scaled(18 * MIB, scale);
    for k in 0..2 {
        let obj = add(
            &mut objs,
            format!(
                "/ps5/ppkg/UP0001-CUSA{:05}_00-GAME{k}-A0100-V0100.pkg",
                10_000 + k
            ),
            pkg,
            &mut rng,
        );
        let reqs = (0..pkg.div_ceil(piece))
            .map(|i| Req {
                obj,
                host: "gs2.ww.prod.dl.playstation.net",
                query: None,
                ranges: vec![(i * piece, ((i + 1) * piece).min(pkg) - 1)],
            })
            .collect();
        sessions.push(Session {
            kind: Kind::Ps5,
            reqs,
        });
    }
    // Delivery Optimization: random ranges into one archive.
    let archive = scaled(512 * MIB, scale);
    let path = format!(
        "/do/filestreamingservice/files/{}-{}-{}",
        rng.hex(8),
        rng.hex(4),
        rng.hex(12)
    );
    let obj = add(&mut objs, path, archive, &mut rng);
    for _ in 0..8 {
        let reqs = (0..24)
            .map(|_| {
                let len = rng.range(64 * KIB, MIB + 1).min(archive);
                let start = rng.range(0, archive - len + 1);
                Req {
                    obj,
                    host: "10.20.30.40",
                    query: None,
                    ranges: vec![(start, start + len - 1)],
                }
            })
            .collect();
        sessions.push(Session {
            kind: Kind::Do,
            reqs,
        });
    }
    // Whole files.
    let file = scaled(64 * MIB, scale);
    for k in 0..4 {
        let obj = add(&mut objs, format!("/files/patch-{k}.bin"), file, &mut rng);
        sessions.push(Session {
            kind: Kind::Whole,
            reqs: vec![Req {
                obj,
                host: "download.epicgames.com",
                query: None,
                ranges: Vec::new(),
            }],
        });
    }
    // A seeded shuffle of the sessions.
    for i in (1..sessions.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        sessions.swap(i, j);
    }
    (objs, sessions)
}

/// The bytes the trace asks for, each counted once (the union of its ranges per object).
fn unique_bytes(objs: &[Obj], sessions: &[Session]) -> u64 {
    let mut per: Vec<Vec<(u64, u64)>> = vec![Vec::new(); objs.len()];
    for r in sessions.iter().flat_map(|s| &s.reqs) {
        if r.ranges.is_empty() {
            per[r.obj].push((0, objs[r.obj].size - 1));
        } else {
            per[r.obj].extend(&r.ranges);
        }
    }
    let mut total = 0;
    for mut v in per {
        v.sort_unstable();
        let mut cur: Option<(u64, u64)> = None;
        for (a, b) in v {
            match cur {
                Some((ca, cb)) if a <= cb + 1 => cur = Some((ca, cb.max(b))),
                Some((ca, cb)) => {
                    total += cb - ca + 1;
                    cur = Some((a, b));
                }
                None => cur = Some((a, b)),
            }
        }
        if let Some((a, b)) = cur {
            total += b - a + 1;
        }
    }
    total
}

fn seed_scale(a: &Args) -> (u64, f64) {
    let seed = a.opt_u64("seed").unwrap_or(31);
    let scale = a.f64_or("scale", 1.0);
    if !(0.001..=16.0).contains(&scale) {
        die("--scale must be within 0.001..16");
    }
    (seed, scale)
}

/// `traffic-gen`: writes every catalogue object under `--dir`.
pub fn cmd_gen(a: &Args) {
    let dir = a.str("dir");
    let (seed, scale) = seed_scale(a);
    let (objs, _) = build(seed, scale);
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0;
    for o in &objs {
        let path = format!("{dir}{}", o.path);
        if let Some(parent) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| die(&format!("mkdir: {e}")));
        }
        let mut f =
            std::fs::File::create(&path).unwrap_or_else(|e| die(&format!("create {path}: {e}")));
        let mut off = 0u64;
        while off < o.size {
            let n = (buf.len() as u64).min(o.size - off) as usize;
            for (k, c) in buf[..n].chunks_mut(8).enumerate() {
                let w = word(o.seed, off / 8 + k as u64).to_le_bytes();
                c.copy_from_slice(&w[..c.len()]);
            }
            f.write_all(&buf[..n])
                .unwrap_or_else(|e| die(&format!("write {path}: {e}")));
            off += n as u64;
        }
        total += o.size;
    }
    println!("objects={}", objs.len());
    println!("catalogue_bytes={total}");
}

/// What one request brought: useful bytes, body bytes, and whether it was wrong.
#[derive(Default)]
struct Outcome {
    useful: u64,
    body: u64,
    wrong: bool,
}

fn request_text(o: &Obj, r: &Req) -> String {
    let target = match &r.query {
        Some(q) => format!("{}?{q}", o.path),
        None => o.path.clone(),
    };
    let mut req = format!(
        "GET {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: shardline-loadgen-traffic\r\n",
        r.host
    );
    if !r.ranges.is_empty() {
        let list: Vec<String> = r.ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
        req.push_str(&format!("Range: bytes={}\r\n", list.join(",")));
    }
    req.push_str("\r\n");
    req
}

/// `bytes A-B/LEN` -> (A, B).
fn content_range(v: &str) -> Option<(u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, _) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Whether `parts` cover every requested range.
fn covers(parts: &[(u64, u64)], ranges: &[(u64, u64)]) -> bool {
    ranges
        .iter()
        .all(|&(a, b)| parts.iter().any(|&(pa, pb)| pa <= a && b <= pb))
}

/// One part of a multipart/byteranges body: its range (inclusive) and its bytes.
type Part<'a> = ((u64, u64), &'a [u8]);

/// Parses a multipart/byteranges body into its parts.
fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut at = find(body, delim.as_bytes(), 0)?;
    loop {
        at += delim.len();
        if body[at..].starts_with(b"--") {
            return Some(parts);
        }
        let head_end = find(body, b"\r\n\r\n", at)?;
        let head = std::str::from_utf8(&body[at..head_end]).ok()?;
        let range = head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-range")
                .then(|| content_range(v))?
        })?;
        let start = head_end + 4;
        let len = (range.1 - range.0 + 1) as usize;
        let data = body.get(start..start + len)?;
        parts.push((range, data));
        at = find(body, delim.as_bytes(), start + len)?;
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

fn check(o: &Obj, off: u64, data: &[u8]) -> bool {
    let mut v = Verifier::new(o.seed, off);
    v.feed(data);
    v.bad_at.is_none()
}

/// Sends one request on `conn` and reads and checks its response.
fn play(conn: &mut Conn, o: &Obj, r: &Req) -> std::io::Result<Outcome> {
    conn.s.write_all(request_text(o, r).as_bytes())?;
    conn.s.flush()?;
    let head = conn.read_head()?;
    let len = head
        .content_length
        .ok_or_else(|| crate::bad("a response without Content-Length"))?;
    let useful = if r.ranges.is_empty() {
        o.size
    } else {
        r.ranges.iter().map(|(a, b)| b - a + 1).sum()
    };
    let mut out = Outcome {
        useful,
        body: len,
        wrong: false,
    };
    let multipart = head
        .content_type
        .as_deref()
        .and_then(|t| t.split_once("boundary="))
        .map(|(_, b)| b.trim_matches('"').to_string());
    match (head.status, multipart) {
        (200, _) => {
            let mut v = Verifier::new(o.seed, 0);
            conn.read_body(len, |d| v.feed(d))?;
            out.wrong = v.bad_at.is_some() || len != o.size;
        }
        (206, Some(boundary)) => {
            if len > MULTIPART_BODY_MAX {
                return Err(crate::bad("a multipart body over MULTIPART_BODY_MAX"));
            }
            let mut body = Vec::with_capacity(len as usize);
            conn.read_body(len, |d| body.extend_from_slice(d))?;
            out.wrong = match multipart_parts(&body, &boundary) {
                Some(parts) => {
                    let spans: Vec<_> = parts.iter().map(|(s, _)| *s).collect();
                    !covers(&spans, &r.ranges) || !parts.iter().all(|((a, _), d)| check(o, *a, d))
                }
                None => true,
            };
        }
        (206, None) => {
            let span = head.content_range.as_deref().and_then(content_range);
            let Some((a, b)) = span else {
                return Err(crate::bad("a 206 without a Content-Range"));
            };
            let mut v = Verifier::new(o.seed, a);
            conn.read_body(len, |d| v.feed(d))?;
            out.wrong = v.bad_at.is_some() || b - a + 1 != len || !covers(&[(a, b)], &r.ranges);
        }
        (status, _) => {
            conn.read_body(len, |_| {})?;
            return Err(crate::bad(&format!("status {status} for {}", o.path)));
        }
    }
    if head.close {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "closed",
        ));
    }
    Ok(out)
}

#[derive(Default)]
struct Totals {
    requests: AtomicU64,
    useful: AtomicU64,
    body: AtomicU64,
    wrong: AtomicU64,
    errors: AtomicU64,
    per_kind: [AtomicU64; 5],
}

/// `traffic`: plays the trace against `--addr`.
pub fn cmd_play(a: &Args) {
    let addr = resolve(&a.str("addr"));
    let (seed, scale) = seed_scale(a);
    let clients = a.opt_u64("clients").unwrap_or(16).max(1) as usize;
    let (objs, mut sessions) = build(seed, scale);
    if let Some(list) = a.opt_str("sessions-from") {
        let keep: Vec<Kind> = list
            .split(',')
            .map(|n| {
                KINDS
                    .iter()
                    .find(|(_, name)| *name == n.trim())
                    .map(|(k, _)| *k)
                    .unwrap_or_else(|| die(&format!("--sessions-from: unknown kind {n}")))
            })
            .collect();
        sessions.retain(|s| keep.contains(&s.kind));
    }
    let unique = unique_bytes(&objs, &sessions);
    let catalogue: u64 = objs.iter().map(|o| o.size).sum();
    let objs = Arc::new(objs);
    let sessions = Arc::new(sessions);
    let next = Arc::new(AtomicUsize::new(0));
    let totals = Arc::new(Totals::default());
    let start = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (objs, sessions, next, totals) =
                (objs.clone(), sessions.clone(), next.clone(), totals.clone());
            thread::spawn(move || {
                let timeout = Some(Duration::from_secs(REQUEST_TIMEOUT_S));
                let mut conn: Option<Conn> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(s) = sessions.get(i) else {
                        return;
                    };
                    let k = KINDS.iter().position(|(x, _)| *x == s.kind).unwrap();
                    for r in &s.reqs {
                        let o = &objs[r.obj];
                        if conn.is_none() {
                            conn = Conn::connect(&addr, 1 << 20, timeout).ok();
                        }
                        let Some(c) = conn.as_mut() else {
                            totals.errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        totals.requests.fetch_add(1, Ordering::Relaxed);
                        match play(c, o, r) {
                            Ok(out) => {
                                totals.useful.fetch_add(out.useful, Ordering::Relaxed);
                                totals.per_kind[k].fetch_add(out.useful, Ordering::Relaxed);
                                totals.body.fetch_add(out.body, Ordering::Relaxed);
                                if out.wrong {
                                    eprintln!("traffic: wrong bytes in {} {:?}", o.path, r.ranges);
                                    totals.wrong.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {
                                conn = None;
                            }
                            Err(e) => {
                                eprintln!("traffic: {} {:?}: {e}", o.path, r.ranges);
                                totals.errors.fetch_add(1, Ordering::Relaxed);
                                conn = None;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("traffic worker");
    }
    let secs = start.elapsed().as_secs_f64();
    let t = &totals;
    let useful = t.useful.load(Ordering::Relaxed);
    println!("sessions={}", sessions.len());
    println!("requests={}", t.requests.load(Ordering::Relaxed));
    println!("useful_bytes={useful}");
    println!("body_bytes={}", t.body.load(Ordering::Relaxed));
    println!("unique_bytes={unique}");
    println!("catalogue_bytes={catalogue}");
    println!("wall_s={secs:.3}");
    println!("goodput_mb_s={:.1}", useful as f64 / secs / 1e6);
    println!("wrong_responses={}", t.wrong.load(Ordering::Relaxed));
    println!("errors={}", t.errors.load(Ordering::Relaxed));
    for (k, (_, name)) in KINDS.iter().enumerate() {
        println!(
            "{name}_useful_bytes={}",
            t.per_kind[k].load(Ordering::Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_is_seeded_and_well_formed() {
        let (objs, sessions) = build(7, 0.05);
        let (objs2, sessions2) = build(7, 0.05);
        assert_eq!(objs.len(), objs2.len());
        assert_eq!(sessions.len(), sessions2.len());
        for (x, y) in sessions.iter().zip(&*sessions2) {
            let (o1, o2) = (&objs[x.reqs[0].obj], &objs2[y.reqs[0].obj]);
            assert_eq!((&o1.path, o1.seed), (&o2.path, o2.seed));
        }
        for r in sessions.iter().flat_map(|s| &s.reqs) {
            let size = objs[r.obj].size;
            for w in r.ranges.windows(2) {
                assert!(w[0].1 < w[1].0, "pieces are sorted and disjoint");
            }
            assert!(r.ranges.iter().all(|&(a, b)| a <= b && b < size));
        }
        assert!(unique_bytes(&objs, &sessions) <= objs.iter().map(|o| o.size).sum::<u64>());
    }

    #[test]
    fn unique_bytes_counts_overlaps_once() {
        let objs = vec![Obj {
            path: "/a".into(),
            seed: 1,
            size: 100,
        }];
        let req = |ranges: Vec<(u64, u64)>| Req {
            obj: 0,
            host: "h",
            query: None,
            ranges,
        };
        let sessions = vec![Session {
            kind: Kind::Riot,
            reqs: vec![req(vec![(0, 9), (20, 29)]), req(vec![(5, 24)])],
        }];
        assert_eq!(unique_bytes(&objs, &sessions), 30);
    }

    #[test]
    fn multipart_bodies_are_split_into_their_parts() {
        let body = b"\r\n--XYZ\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 2-4/10\r\n\r\nabc\r\n--XYZ\r\nContent-Range: bytes 7-7/10\r\n\r\nd\r\n--XYZ--\r\n";
        let parts = multipart_parts(body, "XYZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], ((2, 4), &b"abc"[..]));
        assert_eq!(parts[1], ((7, 7), &b"d"[..]));
        assert!(covers(&[(2, 4), (7, 7)], &[(3, 4), (7, 7)]));
        assert!(!covers(&[(2, 4)], &[(3, 5)]));
    }
}
