//! The filler on a real ring against real origins: nginx serving fixture files (started by
//! the test), and scripted TCP peers for the faults nginx does not make. Every block that
//! lands is journaled, the journal reopened, and each block read back against its checksum.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::cache::index::ObjectVersion;
use crate::cache::journal::Record;
use crate::cache::journal_file::JournalFile;
use crate::cache::store::BlockStore;
use crate::shard::ring::{Ring, RingConfig};

const CHUNK: usize = 512 * 1024;
const BLOCK: u32 = 1 << 20;
const ALIGN: usize = 4096;

/// nginx serving `root` on loopback, stopped on drop.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(root: &Path) -> Nginx {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 64; }}\n\
             http {{ access_log off; keepalive_requests 10000;\n\
               client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
               uwsgi_temp_path {d}; scgi_temp_path {d};\n\
               server {{ listen {addr}; root {r}; location / {{ }} }} }}\n",
            d = dir.path().display(),
            r = root.display(),
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new(nginx_bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts (scripts/test-deps.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_bin() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("nginx is not installed: scripts/test-deps.sh installs it (the origin of these tests)");
}

fn ring(slots: u16) -> Ring {
    Ring::new(&RingConfig {
        sq_entries: 64,
        cq_entries: 256,
        socket_slots: 4,
        file_slots: 4,
        arena_slots: slots,
        chunk_bytes: CHUNK,
        arena_align_bytes: ALIGN,
        recv_buffers: 4,
        recv_buffer_bytes: 4096,
        conn_slots: 2,
    })
    .expect("a ring (needs io_uring and a few MiB of RLIMIT_MEMLOCK)")
}

fn target(addr: SocketAddr, max_fetches: usize, timeouts: Timeouts) -> OriginTarget {
    OriginTarget {
        addr,
        host: "origin.test".into(),
        max_fetches,
        max_idle: max_fetches,
        timeouts,
    }
}

const TIMEOUTS: Timeouts = Timeouts {
    connect_ms: 2000,
    first_byte_ms: 5000,
    idle_ms: 5000,
};

fn object(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("shardline-fill")
        .tempdir_in("/var/tmp")
        .expect("a temp dir on disk (O_DIRECT)")
}

fn open_data(store: &BlockStore, version: u64) -> Arc<File> {
    Arc::new(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(store.data_path(version))
            .expect("an O_DIRECT data file"),
    )
}

fn plan(first: u32, last: u32, size: Option<u64>) -> Plan {
    Plan {
        first_block: first,
        last_block: last,
        block_bytes: BLOCK,
        size,
        etag: None,
        slot_bytes: CHUNK,
        align_bytes: ALIGN,
    }
}

/// Runs the ring until `jobs` fetches ended; returns every event in order.
fn drive(ring: &mut Ring, filler: &mut Filler, jobs: usize, limit: Duration) -> Vec<FillEvent> {
    let start = Instant::now();
    let mut events = Vec::new();
    let mut batch = Vec::new();
    let ended = |e: &[FillEvent]| {
        e.iter()
            .filter(|e| matches!(e, FillEvent::Ended { .. }))
            .count()
    };
    while ended(&events) < jobs {
        assert!(start.elapsed() < limit, "fetches did not end: {events:?}");
        ring.submit_and_wait(1, Some(Duration::from_millis(20)))
            .expect("submit");
        batch.clear();
        ring.drain_completions(&mut batch, 64);
        let now_ms = start.elapsed().as_millis() as u64;
        for c in &batch {
            let t = Token::decode(c.user_data).expect("our token");
            assert_eq!(t.op, crate::shard::token::Op::Origin);
            filler.on_completion(ring, t, c.result, now_ms);
        }
        filler.expire(start.elapsed().as_millis() as u64);
        filler.take_events(&mut events);
    }
    events
}

fn version(key: &str, v: u64, facts: &HeadFacts) -> ObjectVersion {
    ObjectVersion {
        key: key.as_bytes().to_vec(),
        version: v,
        size: facts.size,
        block_bytes: BLOCK,
        fetched_unix_s: 0,
        etag: facts.etag.clone().unwrap_or_default(),
        last_modified: facts.last_modified.clone().unwrap_or_default(),
        content_type: facts.content_type.clone().unwrap_or_default(),
    }
}

/// A cold object fetched from nginx in two concurrent runs over two keep-alive connections:
/// every block lands, is journaled after it is durable, and reads back byte for byte from
/// the reopened journal's checksums; a second round reuses the idle connections.
#[test]
fn blocks_fetched_from_nginx_land_on_disk_and_read_back_against_their_checksums() {
    let root = tempfile::tempdir().unwrap();
    let size = 3 * BLOCK as usize + 12_345;
    let obj = object(size, 7);
    std::fs::write(root.path().join("patch.bin"), &obj).unwrap();
    let origin = Nginx::start(root.path());

    let dir = disk_dir();
    let store = BlockStore::open(dir.path()).unwrap();
    let (mut journal, _, _) = JournalFile::open(&dir.path().join("journal")).unwrap();
    let mut ring = ring(4);
    let mut filler = Filler::new(vec![target(origin.addr, 2, TIMEOUTS)], 4);
    let file = open_data(&store, 1);
    for (job, (first, last)) in [(0u64, (0, 1)), (1, (2, 3))] {
        filler
            .begin(
                &mut ring,
                job,
                0,
                "/patch.bin",
                plan(first, last, None),
                ArenaSlot::new(job as u16),
                file.clone(),
                0,
            )
            .expect("a fetch starts");
    }
    assert_eq!(filler.connections(), 2);
    let events = drive(&mut ring, &mut filler, 2, Duration::from_secs(30));
    let mut meta = None;
    let mut records = Vec::new();
    for e in &events {
        match e {
            FillEvent::Head { facts, .. } => {
                assert_eq!(facts.size, size as u64);
                assert!(facts.etag.is_some(), "nginx sends an ETag");
                if meta.is_none() {
                    let m = version("origin.test/patch.bin", 1, facts);
                    records.push(Record::Object(m.clone()));
                    meta = Some(m);
                }
            }
            FillEvent::Committed { block, crc, .. } => records.push(Record::Block {
                version: 1,
                block: *block,
                crc: *crc,
            }),
            FillEvent::Ended { error, .. } => assert_eq!(error, &None),
        }
    }
    journal.append(&records, true).unwrap();
    drop(journal);
    let (_, index, _) = JournalFile::open(&dir.path().join("journal")).unwrap();
    let meta = meta.unwrap();
    assert_eq!(index.blocks_present(1), 4);
    let mut buf = Vec::new();
    for block in 0..4u32 {
        let crc = index.block_crc(1, block).expect("committed");
        store
            .read_block(&meta, block, crc, &mut buf)
            .expect("block reads back");
        let start = block as usize * BLOCK as usize;
        assert_eq!(&buf[..], &obj[start..(start + BLOCK as usize).min(size)]);
    }

    // A second round: the same two connections carry it (kept alive, reused).
    for job in 2..4u64 {
        let block = (job - 2) as u32;
        filler
            .begin(
                &mut ring,
                job,
                0,
                "/patch.bin",
                plan(block, block, Some(size as u64)),
                ArenaSlot::new(job as u16),
                file.clone(),
                0,
            )
            .expect("a fetch starts");
    }
    assert_eq!(filler.connections(), 2, "idle connections were reused");
    let events = drive(&mut ring, &mut filler, 2, Duration::from_secs(30));
    assert!(events
        .iter()
        .all(|e| !matches!(e, FillEvent::Ended { error: Some(_), .. })));
}

/// More fetches than the origin's bound: the extra one is refused with its slot.
#[test]
fn fetches_past_the_origins_bound_wait() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut ring = ring(2);
    let mut filler = Filler::new(vec![target(listener.local_addr().unwrap(), 1, TIMEOUTS)], 4);
    let dir = disk_dir();
    let store = BlockStore::open(dir.path()).unwrap();
    let file = open_data(&store, 1);
    let p = plan(0, 0, None);
    filler
        .begin(
            &mut ring,
            0,
            0,
            "/a",
            p.clone(),
            ArenaSlot::new(0),
            file.clone(),
            0,
        )
        .expect("the first starts");
    match filler.begin(&mut ring, 1, 0, "/a", p, ArenaSlot::new(1), file, 0) {
        Err(Begin::Wait(slot)) => assert_eq!(slot, ArenaSlot::new(1)),
        other => panic!("{other:?}"),
    }
    // A peer that accepts and says nothing: the first byte times out, the socket is shut
    // down, and the fetch ends with the timeout and its slot.
    filler.origins[0].timeouts.first_byte_ms = 100;
    let _peer = listener.accept().unwrap();
    let events = drive(&mut ring, &mut filler, 1, Duration::from_secs(10));
    match events.last() {
        Some(FillEvent::Ended {
            error: Some(FetchError::Timeout(_)),
            slot,
            ..
        }) => assert_eq!(*slot, ArenaSlot::new(0)),
        other => panic!("{other:?}"),
    }
    assert_eq!(filler.running(), 0);
    assert_eq!(
        filler.connections(),
        0,
        "a failed fetch closes its connection"
    );
}

/// Faults a scripted origin makes: a reset mid-block, a wrong length, a 5xx, a refused
/// connect. Each ends its fetch with the right error, commits only whole blocks, and leaves
/// no connection behind.
#[test]
fn origin_faults_end_the_fetch_with_their_error() {
    let obj = object(2 * BLOCK as usize, 3);
    let head = |len: usize| {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {len}\r\nContent-Range: bytes 0-{}/{}\r\n\r\n",
            len - 1,
            obj.len()
        )
    };
    type Script = Box<dyn Fn(&mut std::net::TcpStream) + Send>;
    type Case = (Script, fn(&FetchError) -> bool, usize);
    let whole = obj.clone();
    let scripts: Vec<Case> = vec![
        (
            // Block 0 whole, then a reset mid-block 1.
            {
                let h = head(obj.len());
                let body = whole.clone();
                Box::new(move |s: &mut std::net::TcpStream| {
                    s.write_all(h.as_bytes()).unwrap();
                    s.write_all(&body[..BLOCK as usize + 1000]).unwrap();
                    // A reset discards what the receiver has not read yet: give the filler
                    // time to take block 0 first.
                    std::thread::sleep(Duration::from_millis(1000));
                    let _ = socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO));
                })
            },
            |e| matches!(e, FetchError::Connection(_)),
            1,
        ),
        (
            // A Content-Length that disagrees with the Content-Range.
            Box::new(|s: &mut std::net::TcpStream| {
                s.write_all(
                    b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-99/2097152\r\n\r\n0123456789",
                )
                .unwrap();
            }),
            |e| matches!(e, FetchError::Unusable(_)),
            0,
        ),
        (
            Box::new(|s: &mut std::net::TcpStream| {
                s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                    .unwrap();
            }),
            |e| {
                matches!(
                    e,
                    FetchError::Unusable(crate::origin::response::Unusable::Status(503))
                )
            },
            0,
        ),
    ];
    for (script, want, commits) in scripts {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req).unwrap();
            script(&mut s);
        });
        let mut ring = ring(1);
        let mut filler = Filler::new(vec![target(addr, 1, TIMEOUTS)], 1);
        let dir = disk_dir();
        let store = BlockStore::open(dir.path()).unwrap();
        filler
            .begin(
                &mut ring,
                0,
                0,
                "/x",
                plan(0, 1, None),
                ArenaSlot::new(0),
                open_data(&store, 1),
                0,
            )
            .expect("starts");
        let events = drive(&mut ring, &mut filler, 1, Duration::from_secs(10));
        peer.join().unwrap();
        let got = events
            .iter()
            .filter(|e| matches!(e, FillEvent::Committed { .. }))
            .count();
        assert_eq!(got, commits, "{events:?}");
        match events.last() {
            Some(FillEvent::Ended { error: Some(e), .. }) => assert!(want(e), "{e:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(filler.connections(), 0);
    }

    // Nobody listens: the connect is refused.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut ring = ring(1);
    let mut filler = Filler::new(vec![target(addr, 1, TIMEOUTS)], 1);
    let dir = disk_dir();
    let store = BlockStore::open(dir.path()).unwrap();
    filler
        .begin(
            &mut ring,
            0,
            0,
            "/x",
            plan(0, 0, None),
            ArenaSlot::new(0),
            open_data(&store, 1),
            0,
        )
        .expect("starts");
    let events = drive(&mut ring, &mut filler, 1, Duration::from_secs(10));
    match events.last() {
        Some(FillEvent::Ended {
            error: Some(FetchError::Connect(e)),
            ..
        }) => assert_eq!(*e, libc::ECONNREFUSED),
        other => panic!("{other:?}"),
    }
}
