//! How long a restart takes to make the cache index ready, and how large the journal is,
//! after a churn history many times the live cache (issue 29's restart target).
//!
//! `cargo run --release --example cache_restart -- [DIR] [OBJECTS] [BLOCKS] [CHURN]`
//! (`open JOURNAL`: only the timed restart; `append JOURNAL OBJECTS BLOCKS [FIRST]`: grow a
//! cache's journal, for `perf/cache-index.sh`'s restart of a real edge, objects numbered from
//! FIRST; `open-disks [--in-order] DIR...`: a cache of several disks opened as a start-up
//! does, their journals replayed side by side, or one after another)
//! (defaults: a temp dir on the current directory's disk, 1 000 000 objects of 4 blocks,
//! churn 10). It writes OBJECTS x CHURN versions through the journal the way the fill does
//! (an object record, its block records; each key's older version dropped), compacting with
//! the fill's rule (`COMPACT_DEAD_PERCENT` of at least `COMPACT_MIN_BYTES`), then opens the
//! journal as a start-up does and prints: the journal's bytes against the live records', the
//! time to a ready index, and the process's peak RSS.
//!
//! It runs on the server's allocator (mimalloc, `src/main.rs`), so its figures are the
//! server's load's: on glibc's malloc, whose heaps grow a page at a time and get no
//! transparent huge pages, the same 10 million objects were ready in 6.0-7.8 s here against
//! 4.3-5.7 s (a contended host, 2026-12-08).

use std::path::PathBuf;
use std::time::Instant;

use shardline::cache::index::ObjectVersion;
use shardline::cache::journal::{snapshot, Record};
use shardline::cache::journal_file::JournalFile;
use shardline::fill::cache_fill::{COMPACT_DEAD_PERCENT, COMPACT_MIN_BYTES};

/// The server's allocator, so that the load measured is the server's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A memory line of the process's status (`VmHWM`: peak resident, `VmRSS`: resident now), in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The restart, in a process of its own (so its memory is the replay's alone).
fn open_only(path: &str) {
    let before = status_kib("VmRSS");
    let start = Instant::now();
    let (_j, index, stats) = JournalFile::open(std::path::Path::new(path)).expect("reopen");
    let ready = start.elapsed();
    let after = status_kib("VmRSS");
    let objects = index.keys().max(1) as u64;
    println!(
        "restart: index ready in {:.3} s ({} objects, {} records, torn tail {}), peak RSS {} MiB",
        ready.as_secs_f64(),
        index.keys(),
        stats.records,
        stats.damaged_tail,
        status_kib("VmHWM") / 1024
    );
    println!(
        "memory: RSS {} MiB before the load, {} MiB after: {} bytes per object",
        before / 1024,
        after / 1024,
        after.saturating_sub(before) * 1024 / objects
    );
}

/// A watch that notes nothing: under a watch, `open_disks` opens the disks one after another.
#[derive(Debug)]
struct InOrder;

impl shardline::cache::watch::DiskWatch for InOrder {
    fn created(&self, _: &std::path::Path) {}
    fn wrote(&self, _: &std::path::Path, _: u64, _: &[u8]) {}
    fn set_len(&self, _: &std::path::Path, _: u64) {}
    fn synced(&self, _: &std::path::Path) {}
    fn renamed(&self, _: &std::path::Path, _: &std::path::Path) {}
    fn removed(&self, _: &std::path::Path) {}
    fn dir_synced(&self, _: &std::path::Path) {}
}

/// A start-up's open of the cache disks `args` (`--in-order` first: one after another), in a
/// process of its own.
fn open_disks(args: &[String]) {
    let in_order = args.first().map(String::as_str) == Some("--in-order");
    let dirs: Vec<PathBuf> = args[usize::from(in_order)..]
        .iter()
        .map(PathBuf::from)
        .collect();
    let watch: shardline::cache::watch::Watch = in_order.then(|| {
        std::sync::Arc::new(InOrder) as std::sync::Arc<dyn shardline::cache::watch::DiskWatch>
    });
    let start = Instant::now();
    let opened = shardline::cache::disks::open_disks(&dirs, true, watch).expect("open");
    println!(
        "open-disks: {} disks {}, index ready in {:.3} s ({} objects), peak RSS {} MiB",
        dirs.len(),
        if in_order { "in order" } else { "side by side" },
        start.elapsed().as_secs_f64(),
        opened.index.keys(),
        status_kib("VmHWM") / 1024
    );
}

/// Object `i`'s version `version` of `blocks` blocks, as a depot chunk (origin entry 0).
fn synthetic(i: u64, version: u64, blocks: u32, round: u64) -> ObjectVersion {
    ObjectVersion {
        key: format!("\0\0depot/{}/chunk/{:040x}", i % 4096, i).into_bytes(),
        version,
        size: u64::from(blocks) << 18,
        block_bytes: 1 << 18,
        fetched_unix_s: 1_800_000_000 + round,
        etag: format!("\"{version:x}\""),
        last_modified: String::new(),
        content_type: "application/octet-stream".into(),
        freshness: Default::default(),
        headers: String::new(),
        status: 200,
        selecting: String::new(),
        tags: Default::default(),
    }
}

/// Appends `objects` objects (keys numbered from `first`) of `blocks` blocks to the journal at
/// `path` (a cache's, which may hold objects already), numbered after its highest version:
/// `perf/cache-index.sh` grows a real edge's cache this way (their data files are never read).
fn append(path: &str, objects: u64, blocks: u32, first: u64) {
    let (mut journal, index, _) = JournalFile::open(std::path::Path::new(path)).expect("journal");
    let mut version = index.max_version();
    let mut batch = Vec::with_capacity(1024 * (blocks as usize + 1));
    for i in 0..objects {
        version += 1;
        batch.push(Record::Object(synthetic(first + i, version, blocks, 0)));
        for block in 0..blocks {
            batch.push(Record::Block {
                version,
                block,
                crc: (version as u32) ^ block,
            });
        }
        if batch.len() >= 1024 * (blocks as usize + 1) || i + 1 == objects {
            journal.append(&batch, i + 1 == objects).expect("append");
            batch.clear();
        }
    }
    println!("appended {objects} objects, versions up to {version}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("open") {
        return open_only(&args[1]);
    }
    if args.first().map(String::as_str) == Some("append") {
        let objects = args[2].parse().expect("OBJECTS");
        let first = args.get(4).map_or(0, |a| a.parse().expect("FIRST"));
        return append(&args[1], objects, args[3].parse().expect("BLOCKS"), first);
    }
    if args.first().map(String::as_str) == Some("open-disks") {
        return open_disks(&args[1..]);
    }
    let dir = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| tempfile::tempdir_in(".").expect("a temp dir here").keep());
    let objects: u64 = args
        .get(1)
        .map_or(1_000_000, |a| a.parse().expect("OBJECTS"));
    let blocks: u32 = args.get(2).map_or(4, |a| a.parse().expect("BLOCKS"));
    let churn: u64 = args.get(3).map_or(10, |a| a.parse().expect("CHURN"));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("journal");
    let _ = std::fs::remove_file(&path);

    let (mut journal, mut index, _) = JournalFile::open(&path).expect("journal");
    let written = Instant::now();
    let mut version = 0u64;
    let mut compactions = 0;
    // The journal's length at each compaction over what the compaction wrote: how far the
    // trigger let it grow past the live records.
    let mut grown_max = 0f64;
    let mut batch = Vec::with_capacity(blocks as usize + 2);
    let mut current: Vec<u64> = vec![0; objects as usize];
    for round in 0..churn {
        for i in 0..objects {
            version += 1;
            batch.clear();
            batch.push(Record::Object(synthetic(i, version, blocks, round)));
            for block in 0..blocks {
                batch.push(Record::Block {
                    version,
                    block,
                    crc: (version as u32) ^ block,
                });
            }
            let old = std::mem::replace(&mut current[i as usize], version);
            if old != 0 {
                batch.push(Record::Drop { version: old });
            }
            journal.append(&batch, false).expect("append");
            for r in batch.drain(..) {
                index.apply(r);
            }
            let len = journal.len();
            let dead = len.saturating_sub(index.live_bytes());
            if len >= COMPACT_MIN_BYTES && dead * 100 > len * COMPACT_DEAD_PERCENT {
                let mut snap = Vec::with_capacity(index.live_bytes() as usize);
                snapshot(&index, &mut snap);
                let new = journal
                    .write_snapshot(&journal.compaction_path(), &snap)
                    .expect("snapshot");
                let from = journal.len();
                grown_max = grown_max.max(from as f64 / snap.len() as f64);
                journal
                    .finish_compaction(new, snap.len() as u64, from)
                    .expect("compaction");
                compactions += 1;
            }
        }
    }
    // What a compaction would write now: the live records, as the journal holds them.
    let mut snap = Vec::new();
    snapshot(&index, &mut snap);
    let live = snap.len() as u64;
    let len = journal.len();
    drop((journal, index));
    println!(
        "history: {} versions ({objects} objects x {churn}), {compactions} compactions \
         (each when the journal was at most {grown_max:.2}x the live records), written in {:.1} s",
        version,
        written.elapsed().as_secs_f64()
    );
    println!(
        "journal {len} bytes, live records {live} bytes: {:.2}x",
        len as f64 / live as f64
    );
    let status = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["open", path.to_str().expect("a UTF-8 path")])
        .status()
        .expect("the restart process");
    assert!(status.success());
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
