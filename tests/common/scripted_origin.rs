//! A scripted raw-socket origin for the pull-through cache's tests: it serves named objects,
//! answering each request through a script the test sets (and can change mid-test), and
//! records every request (connection, path, conditional, Authorization) and whether the
//! reply broke the rules.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the origin appends to a reply to poison its connection: a reply of its own.
pub const POISON: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nETag: \"evil\"\r\n\r\nPOISONPOISONPOIS";

/// One request the origin received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The origin's number of the connection it came on (from 0, in accept order).
    pub conn: usize,
    pub path: String,
    /// The reply broke the framing rules (or carried bytes past its end).
    pub bad: bool,
    /// Its If-None-Match, if any.
    pub if_none_match: Option<String>,
    /// It carried Authorization.
    pub authorization: bool,
    /// Its head's field lines, as received.
    pub head: String,
}

/// What a request asked of the origin.
#[derive(Clone, Debug)]
pub struct Asked {
    /// The path (query included).
    pub path: String,
    /// The range asked (inclusive, clamped to the object), the whole object without a Range.
    pub range: (u64, u64),
    /// Its If-None-Match, if any.
    pub if_none_match: Option<String>,
    /// It carried Authorization.
    pub authorization: bool,
    /// Its head's lines, as received.
    pub head: String,
}

/// How the origin answers `asked`, given the object's `content`: the reply's bytes, whether
/// it breaks the rules, and bytes to send later on the same connection (when the test says,
/// through `late_go`).
pub type Script = dyn Fn(&Asked, &[u8]) -> (Vec<u8>, bool, Option<Vec<u8>>) + Send + Sync;

/// A loopback origin that serves `objects` (path, content) through `script`.
pub struct ScriptedOrigin {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<Arc<Script>>>,
    /// Late bytes are written when the test sends on this; each write is acknowledged.
    late_go: mpsc::Sender<()>,
    late_done: Mutex<mpsc::Receiver<()>>,
}

impl ScriptedOrigin {
    pub fn start(objects: Vec<(&'static str, Vec<u8>)>) -> ScriptedOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Arc<Script>>> =
            Arc::new(Mutex::new(Arc::new(|a: &Asked, c: &[u8]| {
                (ranged(c, a.range, ""), false, None)
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

    pub fn set(&self, script: Arc<Script>) {
        *self.script.lock().unwrap() = script;
    }

    /// Has the connection holding late bytes write them, and waits until it has.
    pub fn send_late(&self) {
        self.late_go.send(()).unwrap();
        self.late_done
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .expect("the origin wrote its late bytes");
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// No connection carried a request after a bad reply, and at least one bad reply was sent.
    pub fn assert_no_reuse_after_bad(&self) {
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
        let (mut path, mut range, mut if_none_match, mut authorization) =
            (String::new(), None, None, false);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            head.push_str(line);
            head.push('\n');
            let lower = line.to_ascii_lowercase();
            if let Some(p) = line.strip_prefix("GET ") {
                path = p.split(' ').next().unwrap_or("").to_owned();
            } else if lower.starts_with("authorization:") {
                authorization = true;
            } else if lower.starts_with("if-none-match:") {
                if_none_match = Some(line["if-none-match:".len()..].trim().to_owned());
            } else if let Some(r) = line
                .to_ascii_lowercase()
                .strip_prefix("range: bytes=")
                .map(str::to_owned)
            {
                let (a, b) = r.split_once('-').unwrap();
                range = Some((a.parse::<u64>().unwrap(), b.parse::<u64>().ok()));
            }
        }
        let bare = path.split('?').next().unwrap_or("");
        let Some((_, content)) = objects.iter().find(|(p, _)| *p == bare) else {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let size = content.len() as u64;
        let (first, last) = range.unwrap_or((0, None));
        let last = last.unwrap_or(size - 1).min(size - 1);
        let script = script.lock().unwrap().clone();
        let asked = Asked {
            path: path.clone(),
            range: (first, last),
            if_none_match: if_none_match.clone(),
            authorization,
            head: head.clone(),
        };
        let (reply, bad, late) = script(&asked, content);
        seen.lock().unwrap().push(Seen {
            conn,
            path: path.clone(),
            bad: bad || late.is_some(),
            if_none_match,
            authorization,
            head,
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
pub fn ranged(content: &[u8], (first, last): (u64, u64), fields: &str) -> Vec<u8> {
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

/// shardline (one shard, so one pool of origin connections) pulling `/pull/` from the origin
/// at `origin`, with `origin_keys` in its `[[origin]]` entry; the temp dir holds its root
/// (`root/`), cache and config (`shardline.toml`).
pub fn pulling_edge(
    origin: SocketAddr,
    origin_keys: &str,
) -> (super::Server, SocketAddr, tempfile::TempDir) {
    pulling_edge_on(origin, origin_keys, 1)
}

/// `pulling_edge` with `shards` shards (each its own pool; the origin's `max_fetches` is
/// shared by all).
pub fn pulling_edge_on(
    origin: SocketAddr,
    origin_keys: &str,
    shards: usize,
) -> (super::Server, SocketAddr, tempfile::TempDir) {
    let dir = super::disk_tempdir();
    let root = dir.path().join("root");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&cache).unwrap();
    let cfg = dir.path().join("shardline.toml");
    std::fs::write(
        &cfg,
        format!(
            "cache_dir = \"{}\"\n[[origin]]\nprefix = \"/pull/\"\nurl = \"http://{origin}\"\n{origin_keys}\n",
            cache.display()
        ),
    )
    .unwrap();
    let shards = shards.to_string();
    let (server, admin) = super::start_with_admin(
        &root,
        &["--config", cfg.to_str().unwrap(), "--shards", &shards],
    );
    (server, admin, dir)
}

/// `len` bytes of a pattern that differs by `salt`.
pub fn object(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}
