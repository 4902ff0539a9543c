//! No origin reply can poison the cache (issue 45): a raw-socket origin, scripted per test,
//! replays hostile replies to the real binary. Each test asserts the client's status or bytes,
//! that nothing wrong was stored (a GET after the origin is fixed gets the right bytes), and
//! that no connection carried a request after a bad reply.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{get, Server};

/// What the origin appends to a reply to poison its connection: a reply of its own.
const POISON: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nETag: \"evil\"\r\n\r\nPOISONPOISONPOIS";

/// One request the origin received.
#[derive(Clone, Debug)]
struct Seen {
    /// The origin's number of the connection it came on (from 0, in accept order).
    conn: usize,
    path: String,
    /// The reply broke the framing rules (or carried bytes past its end).
    bad: bool,
}

/// How the origin answers `path` (`range` asked, inclusive), given `content`: the reply's
/// bytes, whether it breaks the rules, and bytes to send later on the same connection (when
/// the test says, through `late_go`).
type Script = dyn Fn(&str, (u64, u64), &[u8]) -> (Vec<u8>, bool, Option<Vec<u8>>) + Send + Sync;

/// A loopback origin that serves `objects` (path, content) through `script`.
struct ScriptedOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<Arc<Script>>>,
    /// Late bytes are written when the test sends on this; each write is acknowledged.
    late_go: mpsc::Sender<()>,
    late_done: Mutex<mpsc::Receiver<()>>,
}

impl ScriptedOrigin {
    fn start(objects: Vec<(&'static str, Vec<u8>)>) -> ScriptedOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Arc<Script>>> = Arc::new(Mutex::new(Arc::new(|_, r, c| {
            (ranged(c, r, ""), false, None)
        })));
        let (late_go, late_rx) = mpsc::channel::<()>();
        let late_rx = Arc::new(Mutex::new(late_rx));
        let (done_tx, late_done) = mpsc::channel::<()>();
        let objects = Arc::new(objects);
        let (seen2, script2) = (seen.clone(), script.clone());
        std::thread::spawn(move || {
            for (conn, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let (seen, script, objects) = (seen2.clone(), script2.clone(), objects.clone());
                let (late_rx, done_tx) = (late_rx.clone(), done_tx.clone());
                std::thread::spawn(move || {
                    serve_conn(conn, stream, &seen, &script, &objects, &late_rx, &done_tx)
                });
            }
        });
        ScriptedOrigin {
            addr,
            seen,
            script,
            late_go,
            late_done: Mutex::new(late_done),
        }
    }

    fn set(&self, script: Arc<Script>) {
        *self.script.lock().unwrap() = script;
    }

    /// Has the connection holding late bytes write them, and waits until it has.
    fn send_late(&self) {
        self.late_go.send(()).unwrap();
        self.late_done
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .expect("the origin wrote its late bytes");
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// No connection carried a request after a bad reply, and at least one bad reply was sent.
    fn assert_no_reuse_after_bad(&self) {
        let seen = self.seen();
        assert!(
            seen.iter().any(|s| s.bad),
            "no bad reply was sent: {seen:?}"
        );
        for (i, s) in seen.iter().enumerate().filter(|(_, s)| s.bad) {
            let later = seen[i + 1..].iter().find(|t| t.conn == s.conn);
            assert!(
                later.is_none(),
                "connection {} carried {later:?} after a bad reply to {}",
                s.conn,
                s.path
            );
        }
    }
}

fn serve_conn(
    conn: usize,
    stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    script: &Mutex<Arc<Script>>,
    objects: &[(&'static str, Vec<u8>)],
    late_rx: &Mutex<mpsc::Receiver<()>>,
    done_tx: &mpsc::Sender<()>,
) {
    // Each write leaves at once (no Nagle wait behind the reply's unacknowledged tail).
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let (mut path, mut range) = (String::new(), None);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(p) = line.strip_prefix("GET ") {
                path = p.split(' ').next().unwrap_or("").to_owned();
            } else if let Some(r) = line
                .to_ascii_lowercase()
                .strip_prefix("range: bytes=")
                .map(str::to_owned)
            {
                let (a, b) = r.split_once('-').unwrap();
                range = Some((a.parse::<u64>().unwrap(), b.parse::<u64>().ok()));
            }
        }
        let Some((_, content)) = objects.iter().find(|(p, _)| *p == path) else {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let size = content.len() as u64;
        let (first, last) = range.unwrap_or((0, None));
        let last = last.unwrap_or(size - 1).min(size - 1);
        let script = script.lock().unwrap().clone();
        let (reply, bad, late) = script(&path, (first, last), content);
        seen.lock().unwrap().push(Seen {
            conn,
            path: path.clone(),
            bad: bad || late.is_some(),
        });
        if writer.write_all(&reply).is_err() {
            return;
        }
        if let Some(late) = late {
            // Written when the test says so: after the reply was used, before the next
            // request on this connection.
            late_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30))
                .expect("the test asked for the late bytes");
            let _ = writer.write_all(&late);
            // Written is not arrived: wait until the edge's kernel holds every byte (nothing
            // left unacknowledged in this socket's send queue).
            wait_acknowledged(&writer);
            let _ = done_tx.send(());
        }
    }
}

/// Waits until the peer has acknowledged every byte written on `stream` (TIOCOUTQ: bytes
/// not yet sent or not yet acknowledged), so they sit in its receive queue.
fn wait_acknowledged(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one c_int through the pointer, which outlives the call.
        let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        assert_eq!(rc, 0, "TIOCOUTQ");
        if queued == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never acknowledged the origin's late bytes"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A 206 for `range` of `content` with `fields` added to its head.
fn ranged(content: &[u8], (first, last): (u64, u64), fields: &str) -> Vec<u8> {
    let body = &content[first as usize..=last as usize];
    let mut reply = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {first}-{last}/{}\r\n\
         ETag: \"good\"\r\n{fields}\r\n",
        body.len(),
        content.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

/// shardline (one shard, so one pool of origin connections) pulling `/pull/` from `origin`.
fn edge(origin: &ScriptedOrigin) -> (Server, SocketAddr, tempfile::TempDir) {
    let dir = common::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{}\"\n",
            cache.display(),
            origin.addr
        ),
    )
    .unwrap();
    let (server, admin) =
        common::start_with_admin(&root, &["--config", cfg.to_str().unwrap(), "--shards", "1"]);
    (server, admin, dir)
}

fn object(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Issue 45, case 1: a whole reply followed by a reply of the origin's own, in the same write
/// or later while the connection is idle, for a large object (the extra bytes behind the
/// body) and a small one (the extra bytes inside the head's read). The next object comes
/// from a new connection with its own bytes, and the poisoned connection is counted.
#[test]
fn bytes_after_a_reply_never_become_the_next_object() {
    let objects = vec![
        ("/pull/big-now.bin", object(40_000, 1)),
        ("/pull/big-late.bin", object(40_000, 2)),
        ("/pull/small-now.bin", object(3_000, 3)),
        ("/pull/small-late.bin", object(3_000, 4)),
        ("/pull/next-0.bin", object(20_000, 5)),
        ("/pull/next-1.bin", object(20_000, 6)),
        ("/pull/next-2.bin", object(20_000, 7)),
        ("/pull/next-3.bin", object(20_000, 8)),
    ];
    let origin = ScriptedOrigin::start(objects.clone());
    origin.set(Arc::new(|path, range, content| {
        let reply = ranged(content, range, "");
        if !path.contains("next") {
            if path.contains("late") {
                return (reply, false, Some(POISON.to_vec()));
            }
            let mut reply = reply;
            reply.extend_from_slice(POISON);
            return (reply, true, None);
        }
        (reply, false, None)
    }));
    let (server, admin, _dir) = edge(&origin);
    for (round, (path, content)) in objects[..4].iter().enumerate() {
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(&r.body == content, "{path}: the reply's own bytes");
        if path.contains("late") {
            // The poison arrives while the connection is idle in the pool.
            origin.send_late();
        }
        // A new object: its fetch would take the pooled connection.
        let (next_path, next_content) = &objects[4 + round];
        let next = get(&server, next_path, &[("Range", "bytes=0-15")]);
        assert_eq!(next.status, 206, "after {path}");
        assert_eq!(
            next.body,
            next_content[..16],
            "after {path}: not the poison"
        );
        // Served from the cache from now on: the right bytes stay right.
        assert!(&get(&server, next_path, &[]).body == next_content);
    }
    assert!(
        common::admin_metric(admin, "shardline_origin_connections_poisoned_total", "") >= 4,
        "each poisoned connection counted"
    );
    origin.assert_no_reuse_after_bad();
    for (path, content) in &objects {
        assert!(
            &get(&server, path, &[]).body == content,
            "{path} stored right"
        );
    }
}

/// Issue 45, cases 2-5: framing that could mix two replies is refused (502), counted by
/// reason, the connection is never reused, and once the origin is fixed the object's bytes
/// are right (nothing of the bad reply was stored).
#[test]
fn ambiguous_framing_is_refused_and_nothing_of_it_is_stored() {
    let content = object(600_000, 9);
    let cases: Vec<(&'static str, &'static str, Arc<Script>)> = vec![
        (
            "/pull/te-identity.bin",
            "length_and_transfer_encoding",
            Arc::new(|_, r, c| (ranged(c, r, "Transfer-Encoding: identity\r\n"), true, None)),
        ),
        (
            "/pull/two-te.bin",
            "length_and_transfer_encoding",
            Arc::new(|_, (first, last), c| {
                // A chunked body, with a Content-Length and two Transfer-Encoding lines.
                let body = &c[first as usize..=last as usize];
                let mut reply = format!(
                    "HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\
                     Transfer-Encoding: identity\r\nContent-Length: {}\r\n\
                     Content-Range: bytes {first}-{last}/{}\r\n\r\n",
                    body.len(),
                    c.len()
                )
                .into_bytes();
                for chunk in body.chunks(1000) {
                    reply.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    reply.extend_from_slice(chunk);
                    reply.extend_from_slice(b"\r\n");
                }
                reply.extend_from_slice(b"0\r\n\r\n");
                (reply, true, None)
            }),
        ),
        (
            "/pull/two-ranges.bin",
            "bad_content_range",
            Arc::new(|_, (first, last), c| {
                // Block 0's bytes, and a second Content-Range naming the next run.
                let len = last - first + 1;
                let other = format!(
                    "Content-Range: bytes {}-{}/{}\r\n",
                    first + len,
                    last + len,
                    c.len()
                );
                (ranged(c, (first, last), &other), true, None)
            }),
        ),
        (
            "/pull/plus-length.bin",
            "bad_content_length",
            Arc::new(|_, r, c| {
                let reply = ranged(c, r, "");
                let text = String::from_utf8_lossy(&reply[..200]).into_owned();
                let at = text.find("Content-Length: ").unwrap() + "Content-Length: ".len();
                let mut bad = reply[..at].to_vec();
                bad.push(b'+');
                bad.extend_from_slice(&reply[at..]);
                (bad, true, None)
            }),
        ),
    ];
    let objects = cases
        .iter()
        .map(|(p, _, _)| (*p, content.clone()))
        .collect();
    let origin = ScriptedOrigin::start(objects);
    let (server, admin, _dir) = edge(&origin);
    for (path, reason, script) in cases {
        origin.set(script);
        let r = get(&server, path, &[]);
        assert_eq!(r.status, 502, "{path}");
        let label = format!("reason=\"{reason}\"");
        assert!(
            common::admin_metric(admin, "shardline_origin_replies_refused_total", &label) > 0,
            "{path}: refusal counted as {reason}"
        );
        // The origin fixed: the object's bytes are right, whole and by range.
        origin.set(Arc::new(|_, r, c| (ranged(c, r, ""), false, None)));
        let whole = get(&server, path, &[]);
        assert_eq!(whole.status, 200, "{path} fixed");
        assert!(whole.body == content, "{path}: right bytes after the fix");
        let part = get(&server, path, &[("Range", "bytes=262144-262200")]);
        assert_eq!(part.body, content[262144..=262200], "{path}");
    }
    origin.assert_no_reuse_after_bad();
}

/// Issue 45, case 6: interim replies (100 Continue, 103 Early Hints) before the real one are
/// skipped, and the object is served right.
#[test]
fn interim_replies_are_skipped() {
    let content = object(300_000, 7);
    let origin = ScriptedOrigin::start(vec![("/pull/hints.bin", content.clone())]);
    origin.set(Arc::new(|_, r, c| {
        let mut reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\
                          Link: </style.css>; rel=preload\r\n\r\n"
            .to_vec();
        reply.extend_from_slice(&ranged(c, r, ""));
        (reply, false, None)
    }));
    let (server, _admin, _dir) = edge(&origin);
    let r = get(&server, "/pull/hints.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == content, "the real reply's bytes");
    let again = get(&server, "/pull/hints.bin", &[("Range", "bytes=1000-1999")]);
    assert_eq!(again.body, content[1000..2000]);
}
