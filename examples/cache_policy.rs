//! Byte hit ratio of the cache's eviction policy (S3-FIFO) against LRU on a synthetic trace of
//! a game-update edge (issue 20: "measure the hit ratio on a trace"). Run by
//! `perf/cache-policy.sh`.
//!
//! The trace: a catalog of `--objects` files (1-512 blocks of 1 MiB, log-uniform sizes), asked
//! for by Zipf(`--alpha`) popularity; every download reads its file's blocks in order. A share
//! of the downloads (`--scan-percent`) are one-off files nobody asks for again (old builds,
//! the long tail), the scans that push popular files out of an LRU. Budgets are a share of the
//! catalog's bytes. The trace is the same for both policies (fixed seed).
//!
//!   cargo run --release --example cache_policy -- --objects 5000 --requests 200000

use shardline::cache::evict::{Lru, S3Fifo};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.windows(2)
        .find(|w| w[0] == name)
        .map_or(default, |w| w[1].parse().expect("a number"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let objects = arg(&args, "--objects", 5000.0) as u64;
    let requests = arg(&args, "--requests", 200_000.0) as u64;
    let alpha = arg(&args, "--alpha", 0.9);
    let scan_share = arg(&args, "--scan-percent", 20.0) / 100.0;
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    // Sizes in blocks, log-uniform over 1..=512.
    let sizes: Vec<u64> = (0..objects)
        .map(|_| (512f64.powf(rng.unit())).ceil() as u64)
        .collect();
    let catalog_blocks: u64 = sizes.iter().sum();
    // Zipf CDF over the catalog (rank 0 most popular).
    let weights: Vec<f64> = (1..=objects)
        .map(|r| 1.0 / (r as f64).powf(alpha))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    // The trace: (object id, blocks); one-off objects get ids past the catalog.
    let mut trace = Vec::with_capacity(requests as usize);
    let mut next_unique = objects;
    for _ in 0..requests {
        if rng.unit() < scan_share {
            let blocks = (512f64.powf(rng.unit())).ceil() as u64;
            trace.push((next_unique, blocks));
            next_unique += 1;
        } else {
            let u = rng.unit();
            let i = cdf.partition_point(|&c| c < u).min(objects as usize - 1);
            trace.push((i as u64, sizes[i]));
        }
    }
    let requested: u64 = trace.iter().map(|t| t.1).sum();
    println!("objects={objects}");
    println!("requests={requests}");
    println!("alpha={alpha}");
    println!("scan_percent={}", scan_share * 100.0);
    println!("catalog_blocks={catalog_blocks}");
    println!("requested_blocks={requested}");
    for pct in [5u64, 10, 20, 40] {
        let budget = catalog_blocks * pct / 100;
        let mut evicted = Vec::new();
        let mut s3 = S3Fifo::new(budget);
        let mut lru = Lru::new(budget);
        let (mut s3_hits, mut lru_hits) = (0u64, 0u64);
        for &(obj, blocks) in &trace {
            for b in 0..blocks {
                let key = (obj, b);
                if s3.touch(&key) {
                    s3_hits += 1;
                } else {
                    s3.insert(key, 1, &mut evicted);
                }
                if lru.touch(&key) {
                    lru_hits += 1;
                } else {
                    lru.insert(key, 1, &mut evicted);
                }
                evicted.clear();
            }
        }
        let s3r = s3_hits as f64 / requested as f64;
        let lrur = lru_hits as f64 / requested as f64;
        println!("budget_{pct}_s3fifo={s3r:.4}");
        println!("budget_{pct}_lru={lrur:.4}");
    }
}
