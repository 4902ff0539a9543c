//! How long the cache's index takes to rebuild at start-up (issue 20): writes a journal of N
//! objects (each an `ObjectVersion` and `--blocks` committed blocks) to a file, drops it from
//! the page cache, then reads and replays it, timing each part. Run by `perf/cache-index.sh`.
//!
//!   cargo run --release --example cache_index -- --objects 1000000 --blocks 4 --dir DIR

use std::io::Write;
use std::time::Instant;

use shardline::cache::{journal::Record, replay, ObjectVersion};

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.windows(2)
        .find(|w| w[0] == name)
        .map_or(default, |w| w[1].parse().expect("a number"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let objects = arg(&args, "--objects", 1_000_000);
    let blocks = arg(&args, "--blocks", 4) as u32;
    let dir = args
        .windows(2)
        .find(|w| w[0] == "--dir")
        .map_or_else(std::env::temp_dir, |w| w[1].clone().into());
    let path = dir.join("cache-index-bench.journal");

    let t = Instant::now();
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    let mut buf = Vec::new();
    for i in 0..objects {
        buf.clear();
        Record::Object(ObjectVersion {
            key: format!("patches.example.net/game/build-{}/chunk-{i:08}.pak", i % 97).into_bytes(),
            version: i + 1,
            size: u64::from(blocks) << 20,
            block_bytes: 1 << 20,
            fetched_unix_s: 1_764_633_600 + i,
            etag: format!("\"{:016x}\"", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            last_modified: "Tue, 01 Dec 2026 00:00:00 GMT".into(),
            content_type: "application/octet-stream".into(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags: Default::default(),
        })
        .encode(&mut buf);
        for b in 0..blocks {
            Record::Block {
                version: i + 1,
                block: b,
                crc: (i as u32) ^ b,
            }
            .encode(&mut buf);
        }
        file.write_all(&buf).expect("write");
    }
    let file = file.into_inner().expect("flush");
    file.sync_all().expect("fsync");
    let write_s = t.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&path).expect("stat").len();
    // Cold start: the journal is read from the disk, not the page cache.
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).expect("fadvise");
    drop(file);

    let t = Instant::now();
    let data = std::fs::read(&path).expect("read");
    let read_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (index, stats) = replay(&data);
    let replay_s = t.elapsed().as_secs_f64();
    assert_eq!(index.keys() as u64, objects, "every object replayed");
    assert_eq!(stats.records, objects * (1 + u64::from(blocks)));
    assert!(!stats.damaged_tail);
    std::fs::remove_file(&path).expect("remove");
    println!("objects={objects}");
    println!("blocks_per_object={blocks}");
    println!("journal_bytes={bytes}");
    println!("write_s={write_s:.3}");
    println!("read_s={read_s:.3}");
    println!("replay_s={replay_s:.3}");
    println!("rebuild_s={:.3}", read_s + replay_s);
    println!("records={}", stats.records);
}
