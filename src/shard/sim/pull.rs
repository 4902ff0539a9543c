//! A pull run's world (issue 20, issue 42): the simulated origin's faults and version
//! changes, the cache's configuration, and what each object's origin says about caching it.

use std::path::Path;

use super::model::{Contract, SimFile, Storing};
use super::rng::Rng;
use super::{
    origin, CONTRACT_GZIP_PERCENT, CONTRACT_RUN_PERCENT, SCRUB_RUN_PERCENT, SIM_CACHE_BLOCK_BYTES,
    SIM_PULLED_MAX_BYTES, SIM_PULL_CHUNK_BYTES,
};
use crate::config::Config;

/// Seeds whose contract runs once met an edge bug, fixed since (issue 42), run on their own
/// by `contract_seeds_that_once_leaked_pass`:
/// - a client received the answer made for another client's request: a fill's reply handed to
///   the request that started it although the fetch carried another client's fields (1778,
///   1787); a stored variant's later blocks, or its pass-through, asked with another client's
///   fields or none (1492, 1961, 947), and a disk-full pass-through of a stored variant given
///   to a request it does not select (1858);
/// - several ranges of an object answered per client got 502 (144, 1342, 1817).
pub(super) const CONTRACT_BUG_SEEDS: [u64; 9] =
    [947, 1492, 1778, 1787, 1858, 1961, 144, 1342, 1817];

/// In `CONTRACT_RUN_PERCENT` of the pull runs, draws each pulled object's `Contract` (its own
/// stream: every other draw of a seed stays what it was).
pub(super) fn draw_contracts(files: &mut [SimFile], seed: u64) {
    let mut rng = Rng::new(seed ^ 0x42c0_47ac);
    if !rng.chance(CONTRACT_RUN_PERCENT) {
        return;
    }
    for f in files.iter_mut().filter(|f| f.pulled) {
        let storing = Storing::ALL[rng.below(Storing::ALL.len() as u64) as usize];
        f.contract = Contract {
            storing,
            gzip: rng.chance(CONTRACT_GZIP_PERCENT),
        };
    }
    if std::env::var_os("SHARDLINE_SIM_VERBOSE").is_some() {
        for (i, f) in files.iter().enumerate().filter(|(_, f)| f.pulled) {
            eprintln!("seed {seed}: file {i} {} {:?}", f.url, f.contract);
        }
    }
}

/// A pull run's origin (faults, version changes) and the cache's configuration.
pub(super) fn pull_scenario(
    rng: &mut Rng,
    seed: u64,
    root: &Path,
    cfg: &mut Config,
    files: &[SimFile],
) -> std::io::Result<origin::Origin> {
    let objects: Vec<usize> = (0..files.len()).filter(|&f| files[f].pulled).collect();
    let mut faults = origin::OriginFaults::default();
    if rng.chance(50) {
        faults.slow_pct = rng.below(10);
        faults.reset_pct = rng.below(10);
        faults.short_pct = rng.below(8);
        faults.error_pct = rng.below(8);
        faults.whole_pct = rng.below(15);
        faults.close_pct = rng.below(20);
    }
    if rng.chance(20) {
        faults.disk_full_pct = rng.range(5, 50);
    }
    if rng.chance(15) {
        faults.corrupt_pct = rng.range(2, 20);
    }
    // Issue 45's framing faults draw from their own stream: every other draw of a seed stays.
    let mut framing = Rng::new(seed ^ 0x45);
    if framing.chance(40) {
        faults.trailing_pct = framing.range(5, 40);
    }
    if framing.chance(30) {
        faults.odd_fields_pct = framing.range(5, 30);
    }
    let mut changes = std::collections::VecDeque::new();
    if rng.chance(20) {
        changes.push_back((rng.below(300_000), rng.below(objects.len() as u64) as usize));
    }
    let origin = origin::Origin::new(objects, faults, changes, seed)?;
    let cache_dir = root.join("cache");
    std::fs::create_dir_all(&cache_dir)?;
    cfg.chunk_bytes = SIM_PULL_CHUNK_BYTES;
    cfg.arena_bytes = SIM_PULL_CHUNK_BYTES * rng.range(3, 8) as usize;
    cfg.cache_dir = Some(cache_dir);
    cfg.cache_block_bytes = SIM_CACHE_BLOCK_BYTES;
    cfg.cache_read_ahead_blocks = rng.range(0, 4);
    cfg.cache_wait_timeout_ms = 30_000;
    // Sometimes a budget below the objects' sum: versions are evicted between reads.
    cfg.cache_max_bytes = if rng.chance(30) {
        rng.range(256 * 1024, 2 * SIM_PULLED_MAX_BYTES)
    } else {
        0
    };
    // In some runs the background scrub reads the cache back beside the clients (its own
    // stream: the rest of a seed's world stays what it was).
    let mut scrub_rng = Rng::new(seed ^ 0x5c2b_0b10);
    cfg.cache_scrub_bytes_per_s = if scrub_rng.chance(SCRUB_RUN_PERCENT) {
        scrub_rng.range(1 << 20, 64 << 20)
    } else {
        0
    };
    cfg.origin = vec![crate::fill::route::OriginConfig {
        prefix: "/pull/".into(),
        host: None,
        hosts: Vec::new(),
        key_query: Vec::new(),
        url: format!("http://{}", origin.addr()?),
        host_header: None,
        max_fetches: rng.range(1, 4) as usize,
        connect_timeout_ms: 1000,
        first_byte_timeout_ms: 1500,
        idle_timeout_ms: 1500,
        max_bytes_per_s: 0,
        ca_file: None,
        cache_policy: Default::default(),
        ttl_s: None,
        never_cache: Vec::new(),
        stale_if_error_s: crate::config::origin::DEFAULT_STALE_IF_ERROR_S,
        purge_tag_header: "Surrogate-Key".into(),
    }];
    Ok(origin)
}
