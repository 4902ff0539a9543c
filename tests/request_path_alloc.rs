//! The request path of a cache hit allocates nothing: resolving a target into the shard's
//! scratch and acquiring/releasing a cached file are run under a counting global allocator
//! (this test binary's own), and every heap allocation on this thread fails the test.
//!
//! Unlike the other files here this one does not start the binary: it calls the library's
//! resolver and open-file cache directly, because only in-process can allocations be counted.
//! The cache runs on a fake fixed-file table (the real ring's only role in it). The last test
//! also plans whole response heads (parse, preconditions, range, head) the way the shard does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io;
use std::os::fd::BorrowedFd;

use shardline::config::{EtagSource, SymlinkPolicy};
use shardline::fs::resolve::{resolve_into, ResolveError, ResolveScratch, MAX_PATH_BYTES};
use shardline::http::date::DateCache;
use shardline::http::plan::{plan_response, FileFacts, PlanContext, PlanLimits};
use shardline::http::request::{parse_request, Parsed, MAX_REQUEST_LINE_BYTES};
use shardline::ring_api::slots::FileSlot;
use shardline::shard::files::{FileCache, FileCacheConfig, FileTable, OpenError, TargetError};

/// Counts allocations made by the thread that armed it; everything else passes straight on.
struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: a thread being torn down has no TLS left, and is not counting anyway.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting only touches
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Heap allocations `f` makes on this thread.
fn allocations_in<T>(f: impl FnOnce() -> T) -> (u64, T) {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (ALLOCATIONS.with(Cell::get), out)
}

#[test]
fn the_counter_sees_an_allocation() {
    // Guards the guard: a counter that never counts would pass every test below.
    let (n, v) = allocations_in(|| std::hint::black_box(vec![1u8; 16]));
    assert_eq!(v.len(), 16);
    assert!(n >= 1, "counting allocator saw {n} allocations for a Vec");
}

/// What a target must resolve to: (relative path, wants_dir), or the refusal.
type Expected = Result<(&'static str, bool), ResolveError>;

/// Typical and hostile request targets, with what each must resolve to.
fn targets() -> Vec<(Vec<u8>, Expected)> {
    let seg = "s".repeat(255);
    let deep = vec![seg.as_str(); 16].join("/");
    let deep: &'static str = Box::leak(deep.into_boxed_str());
    let mut climbing = b"/".to_vec();
    while climbing.len() < MAX_REQUEST_LINE_BYTES - 64 {
        climbing.extend_from_slice(b"x/../");
    }
    climbing.extend_from_slice(b"last");
    vec![
        (b"/".to_vec(), Ok(("", true))),
        (b"/manifest.json".to_vec(), Ok(("manifest.json", false))),
        (b"/dir/".to_vec(), Ok(("dir", true))),
        (b"/dir/../big.bin".to_vec(), Ok(("big.bin", false))),
        (b"//a/./b//c%20d.pak".to_vec(), Ok(("a/b/c d.pak", false))),
        (b"/caf%C3%A9/%252e".to_vec(), Ok(("caf\u{e9}/%2e", false))),
        (format!("/{deep}").into_bytes(), Ok((deep, false))),
        (climbing, Ok(("last", false))),
        (b"/../etc/passwd".to_vec(), Err(ResolveError::Escapes)),
        (b"/%2e%2e/%2e%2e/x".to_vec(), Err(ResolveError::Escapes)),
        (b"/..%2f..%2fetc".to_vec(), Err(ResolveError::EncodedSlash)),
        (b"/a%00b".to_vec(), Err(ResolveError::NulByte)),
        (b"/%c0%af".to_vec(), Err(ResolveError::NotUtf8)),
        (b"/%zz".to_vec(), Err(ResolveError::BadEncoding)),
        (b"/a\\b".to_vec(), Err(ResolveError::BadEncoding)),
        (format!("/{seg}x").into_bytes(), Err(ResolveError::TooLong)),
        (
            format!("/{deep}/{seg}").into_bytes(),
            Err(ResolveError::TooLong),
        ),
    ]
}

#[test]
fn resolving_into_the_scratch_allocates_nothing() {
    let targets = targets();
    assert!(targets
        .iter()
        .all(|(raw, _)| raw.len() <= MAX_REQUEST_LINE_BYTES));
    assert!(targets.iter().any(|(raw, _)| raw.len() > MAX_PATH_BYTES));
    let mut scratch = ResolveScratch::with_capacity(MAX_REQUEST_LINE_BYTES);
    // No warm-up: a scratch sized at start-up must already be enough for the first request.
    for round in 0..3 {
        for (raw, want) in &targets {
            let (n, got) = allocations_in(|| {
                resolve_into(raw, &mut scratch).map(|r| (r.rel_path.len(), r.wants_dir))
            });
            let shown = String::from_utf8_lossy(&raw[..raw.len().min(80)]).into_owned();
            assert_eq!(
                n, 0,
                "round {round}: resolving {shown:?} allocated {n} times"
            );
            let got = got.map(|(len, dir)| (&scratch.resolved()[..len], dir));
            assert_eq!(got, *want, "{shown:?}");
        }
    }
    assert_eq!(scratch.capacity(), MAX_REQUEST_LINE_BYTES);
}

/// A fixed-file table that only records which slots are filled.
#[derive(Default)]
struct FakeTable {
    filled: Vec<bool>,
}

impl FileTable for FakeTable {
    fn register(&mut self, index: FileSlot, _fd: BorrowedFd<'_>) -> io::Result<()> {
        let i = index.index();
        if self.filled.len() <= i {
            self.filled.resize(i + 1, false);
        }
        assert!(!self.filled[i], "slot {i} registered twice");
        self.filled[i] = true;
        Ok(())
    }
    fn unregister(&mut self, index: FileSlot) -> io::Result<()> {
        let slot = self.filled.get_mut(index.index());
        assert_eq!(slot.as_deref(), Some(&true), "slot {index} not registered");
        if let Some(s) = slot {
            *s = false;
        }
        Ok(())
    }
}

/// A root with a small manifest, a large file (read with O_DIRECT or RWF_DONTCACHE), and
/// directories served by their index file.
fn root_with_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::write(root.join("manifest.json"), vec![b'm'; 1024]).expect("manifest");
    std::fs::write(root.join("big.bin"), vec![7u8; 4 << 20]).expect("big file");
    std::fs::write(root.join("index.html"), b"root index").expect("root index");
    std::fs::create_dir(root.join("dir")).expect("dir");
    std::fs::write(root.join("dir/index.html"), b"dir index").expect("dir index");
    // Longer than rustix's on-stack path buffer (256 bytes), so reopening it by a &str
    // would allocate a CString.
    let long = root.join(long_dir());
    std::fs::create_dir(&long).expect("long dir");
    std::fs::write(long.join(long_file()), b"long").expect("long file");
    dir
}

/// A directory name of 200 bytes (NAME_MAX is 255).
fn long_dir() -> String {
    "d".repeat(200)
}

/// A file name of 200 bytes.
fn long_file() -> String {
    "f".repeat(200)
}

fn cache(root: &std::path::Path, valid_ms: u64) -> FileCache {
    FileCache::new(
        root,
        FileCacheConfig {
            entries: 8,
            valid_ms,
            direct_io_min_bytes: 1 << 20,
            symlinks: SymlinkPolicy::Beneath,
            chunk_bytes: 512 * 1024,
            etag: EtagSource::Mtime,
        },
    )
    .expect("file cache")
}

/// Hit targets (raw, file it serves, its size).
fn hits() -> Vec<(String, String, u64)> {
    let long = format!("{}/{}", long_dir(), long_file());
    [
        ("/manifest.json", "manifest.json", 1024),
        ("/big.bin", "big.bin", 4 << 20),
        ("/dir/", "dir/index.html", 9),
        ("/dir", "dir/index.html", 9),
        ("/", "index.html", 10),
        (&format!("/{long}"), &long, 4),
    ]
    .into_iter()
    .map(|(raw, opened, size)| (raw.to_owned(), opened.to_owned(), size))
    .collect()
}

/// Acquires each hit target once and releases it; returns allocations on this thread.
fn serve_hits(files: &mut FileCache, table: &mut FakeTable, now_ms: u64) -> u64 {
    let mut total = 0;
    for (raw, opened, size) in hits() {
        let (n, idx) = allocations_in(|| {
            let idx = files
                .acquire_target(table, raw.as_bytes(), now_ms)
                .expect("cached file");
            let f = files.get(idx);
            // What the response plan reads from the entry, read here under the counter too.
            std::hint::black_box((f.size, f.etag(), f.opened_path(), f.last_modified));
            files.release(table, idx);
            idx
        });
        let f = files.get(idx);
        assert_eq!((f.opened_path(), f.size), (opened.as_str(), size));
        total += n;
    }
    total
}

#[test]
fn a_cache_hit_allocates_nothing() {
    let dir = root_with_files();
    let mut table = FakeTable::default();
    let mut files = cache(dir.path(), 60_000);
    // Warm-up: each target misses once (a miss may allocate: its key and opened path).
    serve_hits(&mut files, &mut table, 0);
    assert_eq!(files.misses, hits().len() as u64);
    for now_ms in 1..200 {
        let n = serve_hits(&mut files, &mut table, now_ms);
        assert_eq!(n, 0, "cache hits at {now_ms} ms allocated {n} times");
    }
    assert_eq!(
        files.misses,
        hits().len() as u64,
        "every later lookup was a hit"
    );
    assert_eq!(files.hits, 199 * hits().len() as u64);
}

#[test]
fn a_revalidated_hit_allocates_nothing() {
    // valid_ms 0: every hit re-walks the path (openat2 + statx) to catch a rename.
    let dir = root_with_files();
    let mut table = FakeTable::default();
    let mut files = cache(dir.path(), 0);
    serve_hits(&mut files, &mut table, 0);
    for now_ms in 1..50 {
        let n = serve_hits(&mut files, &mut table, now_ms);
        assert_eq!(n, 0, "revalidated hits at {now_ms} ms allocated {n} times");
    }
    assert_eq!(files.misses, hits().len() as u64);
}

#[test]
fn refusals_and_misses_keep_their_statuses() {
    let dir = root_with_files();
    let mut table = FakeTable::default();
    let mut files = cache(dir.path(), 60_000);
    let cases: [(&[u8], TargetError); 4] = [
        (b"/../x", TargetError::Path(ResolveError::Escapes)),
        (b"/missing", TargetError::Open(OpenError::NotFound)),
        (b"/manifest.json/", TargetError::Open(OpenError::NotFound)),
        (
            b"/%2e%2e%2fetc",
            TargetError::Path(ResolveError::EncodedSlash),
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(files.acquire_target(&mut table, raw, 0), Err(want));
    }
    assert_eq!(
        files.target_path(),
        "",
        "a refused path leaves nothing to log"
    );
    assert_eq!(
        files
            .acquire_target(&mut table, b"/missing", 0)
            .map_err(TargetError::status),
        Err(404)
    );
    assert_eq!(files.target_path(), "missing");
    // A file and a directory request for the same name are different entries.
    let a = files.acquire_target(&mut table, b"/dir", 0).expect("dir");
    let b = files.acquire_target(&mut table, b"/dir/", 0).expect("dir/");
    assert_ne!(a, b);
    files.release(&mut table, a);
    files.release(&mut table, b);
}

/// What `Shard::respond` does for a file hit up to its body segments, with the same library
/// calls: parse, resolve and acquire, then the response plan (`http::plan::plan_response`:
/// preconditions, range, head) and its head written out. The segment and chunk queues it then
/// builds (`respond.rs`: `start_plan`, `Body::chunks`) are not covered here.
fn plan_hit(
    files: &mut FileCache,
    table: &mut FakeTable,
    date: &DateCache,
    raw_request: &[u8],
    tx: &mut Vec<u8>,
) -> u16 {
    let Parsed::Complete { request: req, .. } = parse_request(raw_request) else {
        panic!("a complete request");
    };
    let idx = files
        .acquire_target(table, req.path, 1)
        .expect("cached file");
    let f = files.get(idx);
    let facts = FileFacts {
        size: f.size,
        etag: f.etag(),
        last_modified: &f.last_modified,
        mtime_secs: f.mtime_secs,
        read: f.mode,
        content_type: f.content_type,
        extra: b"",
    };
    let limits = PlanLimits {
        max_ranges: 16,
        chunk_bytes: 512 * 1024,
        diag_endpoint: false,
        health_path: b"",
    };
    let ctx = PlanContext {
        date: date.header_value(),
        leaving: false,
        boundary_seed: 0,
    };
    let plan = plan_response(&req, &facts, &limits, &ctx);
    tx.clear();
    plan.write_head(tx);
    let status = plan.status();
    files.release(table, idx);
    status
}

#[test]
fn planning_a_hit_response_head_allocates_nothing() {
    let dir = root_with_files();
    let mut table = FakeTable::default();
    let mut files = cache(dir.path(), 60_000);
    let date = DateCache::new(1_700_000_000);
    let etag = {
        let idx = files
            .acquire_target(&mut table, b"/manifest.json", 0)
            .expect("warm");
        let tag = String::from_utf8(files.get(idx).etag().to_vec()).expect("ascii etag");
        files.release(&mut table, idx);
        let idx = files
            .acquire_target(&mut table, b"/big.bin", 0)
            .expect("warm");
        files.release(&mut table, idx);
        tag
    };
    let requests: Vec<(Vec<u8>, u16)> = vec![
        (
            b"GET /manifest.json HTTP/1.1\r\nHost: cdn\r\n\r\n".to_vec(),
            200,
        ),
        (
            b"HEAD /manifest.json HTTP/1.1\r\nHost: cdn\r\n\r\n".to_vec(),
            200,
        ),
        (
            format!("GET /manifest.json HTTP/1.1\r\nHost: cdn\r\nIf-None-Match: {etag}\r\n\r\n")
                .into_bytes(),
            304,
        ),
        (
            b"GET /big.bin HTTP/1.1\r\nHost: cdn\r\nRange: bytes=1048576-\r\n\r\n".to_vec(),
            206,
        ),
        (b"GET /big.bin HTTP/1.0\r\n\r\n".to_vec(), 200),
    ];
    let mut tx = Vec::with_capacity(1024);
    for (raw, want) in &requests {
        let (n, status) = allocations_in(|| plan_hit(&mut files, &mut table, &date, raw, &mut tx));
        let line = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        assert_eq!(status, *want, "{line:?}");
        assert!(
            tx.starts_with(format!("HTTP/1.1 {want}").as_bytes()),
            "{line:?}"
        );
        assert_eq!(n, 0, "planning {line:?} allocated {n} times");
    }
    assert_eq!(tx.capacity(), 1024, "the head fitted the reused buffer");
}
