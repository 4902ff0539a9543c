//! How fast the fill engine (issue 20, `fill::cache_fill`) fills one cold object from an
//! origin onto the cache disk: one reader wants the whole object block by block, as a client
//! download will once the shard serves from the cache. Used by `perf/fill-engine.sh`.
//!
//!   fill_rate --origin 127.0.0.1:8081 --path /obj.bin --dir /mnt/x/cache
//!             [--connections 4] [--read-ahead 8] [--block-mib 1] [--run-blocks 16]
//!
//! Prints `key=value` lines: bytes, seconds, MB/s, blocks fetched, and the origin's
//! connections.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use shardline::fill::cache_fill::{CacheFill, FillConfig, Notice, Outcome};
use shardline::fill::{Filler, OriginTarget};
use shardline::origin::fetch::Timeouts;
use shardline::ring_api::ops::RingOps;
use shardline::ring_api::slots::ArenaSlot;
use shardline::ring_api::token::Token;
use shardline::shard::ring::{Ring, RingConfig};

/// This tool drives the fill from one thread: the lock is always free when it asks.
const ONE_THREAD: &str = "one thread: the fill's lock is free";

const CHUNK: usize = 512 * 1024;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let origin: SocketAddr = arg(&args, "--origin")
        .expect("--origin ADDR")
        .parse()
        .expect("an address");
    let path = arg(&args, "--path").expect("--path /object");
    let dir = PathBuf::from(arg(&args, "--dir").expect("--dir CACHE_DIR"));
    let conns: usize = arg(&args, "--connections").map_or(4, |v| v.parse().unwrap());
    let read_ahead: u64 = arg(&args, "--read-ahead").map_or(8, |v| v.parse().unwrap());
    let block_mib: u32 = arg(&args, "--block-mib").map_or(1, |v| v.parse().unwrap());
    let run_blocks: u64 = arg(&args, "--run-blocks").map_or(16, |v| v.parse().unwrap());
    std::fs::create_dir_all(&dir).expect("cache dir");
    let slots = (conns + 1) as u16;
    let mut ring = Ring::new(&RingConfig {
        sq_entries: 256,
        cq_entries: 1024,
        socket_slots: 4,
        file_slots: 4,
        arena_slots: slots,
        chunk_bytes: CHUNK,
        arena_align_bytes: 4096,
        recv_buffers: 4,
        recv_buffer_bytes: 4096,
        conn_slots: 2,
        // Each fetch holds a few operations; this run has no client connections.
        unqueued_max_entries: 64 * (usize::from(slots) + 4),
    })
    .expect("ring");
    let filler = Filler::new(
        vec![OriginTarget {
            addr: origin,
            resolved: None,
            host: "origin".into(),
            max_fetches: conns,
            budget: None,
            bandwidth: None,
            max_idle: conns,
            timeouts: Timeouts {
                connect_ms: 2000,
                first_byte_ms: 10_000,
                idle_ms: 10_000,
            },
            tls: None,
        }],
        conns,
    );
    let cfg = FillConfig {
        block_bytes: block_mib << 20,
        read_ahead_blocks: read_ahead,
        max_run_blocks: run_blocks,
        slot_bytes: CHUNK,
        align_bytes: 4096,
        max_attempts: 3,
        max_bytes: 0,
        sync_every_blocks: (4 / block_mib).max(1),
        revalidate_s: shardline::config::DEFAULT_CACHE_REVALIDATE_S,
        heuristic_max_s: shardline::config::DEFAULT_CACHE_HEURISTIC_MAX_S,
        not_found_s: 0,
        origin_names: vec![origin.to_string()],
        origin_policies: Vec::new(),
        open_files: shardline::config::DEFAULT_CACHE_OPEN_FILES,
        compact_min_bytes: shardline::fill::cache_fill::COMPACT_MIN_BYTES,
    };
    let mut cf: CacheFill<usize> = CacheFill::open(&dir, cfg, filler).expect("cache");
    let mut free: Vec<ArenaSlot> = (0..slots).map(ArenaSlot::new).collect();
    let (mut notices, mut freed, mut batch) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    let mut pos = 0u64;
    let mut waiting = false;
    let key = path.as_bytes();
    loop {
        let size = cf
            .try_index()
            .expect(ONE_THREAD)
            .current(key)
            .map(|m| (m.size, m.block_bytes));
        if let Some((size, _)) = size {
            if pos >= size {
                break;
            }
        }
        while !waiting {
            let size = cf
                .try_index()
                .expect(ONE_THREAD)
                .current(key)
                .map(|m| (m.size, m.block_bytes));
            let b = u64::from(size.map_or(block_mib << 20, |s| s.1));
            if size.is_some_and(|(s, _)| pos >= s) {
                break;
            }
            match cf
                .want(key, 0, &path, pos, Some(pos | (b - 1)), 0)
                .expect(ONE_THREAD)
            {
                Outcome::Ready(_) => pos = (pos / b + 1) * b,
                Outcome::Waiting => waiting = true,
                Outcome::Busy | Outcome::Refused(_) | Outcome::Pass | Outcome::Loading => {
                    panic!("busy")
                }
            }
        }
        let now_ms = start.elapsed().as_millis() as u64;
        cf.pump(&mut ring, &mut || free.pop(), now_ms);
        ring.submit_and_wait(1, Some(Duration::from_millis(10)))
            .expect("submit");
        batch.clear();
        ring.drain_completions(&mut batch, 256);
        for c in &batch {
            let t = Token::decode(c.user_data).expect("token");
            cf.on_completion(&mut ring, t, c.result, start.elapsed().as_millis() as u64);
        }
        cf.expire(start.elapsed().as_millis() as u64);
        cf.take(&mut notices, &mut freed, &mut Vec::new());
        free.append(&mut freed);
        for n in notices.drain(..) {
            match n {
                Notice::Block { .. } | Notice::Known { .. } => waiting = false,
                Notice::Failed { error, .. } => panic!("fill failed: {error:?}"),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let size = cf
        .try_index()
        .expect(ONE_THREAD)
        .current(key)
        .map_or(0, |m| m.size);
    println!("bytes={size}");
    println!("seconds={secs:.3}");
    println!("mb_per_s={:.1}", size as f64 / secs / 1e6);
    println!(
        "blocks_fetched={}",
        cf.try_with_core(|c| c.blocks_fetched).expect(ONE_THREAD)
    );
    println!("connections={}", cf.filler().connections());
}
