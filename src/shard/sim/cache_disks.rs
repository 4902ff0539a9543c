//! Several cache disks in the simulator's pull runs (issue 43): the cache spreads over two to
//! four directories, each with its own journal, data files and id, so the checker's rules (no
//! wrong byte, no cut download, every arena slot back) hold over the placement too.

use std::path::Path;

use super::rng::Rng;
use crate::config::Config;

/// Share of the pull runs (power-loss runs aside) whose cache spreads over two to four disks.
pub const MULTI_DISK_RUN_PERCENT: u64 = 40;

/// In `MULTI_DISK_RUN_PERCENT` of the runs, moves the pull run's cache (`cfg.cache_dir`) onto
/// two to four disks beneath `root/cache`. Its own random stream: the rest of a seed's world
/// stays what it was.
pub fn spread(seed: u64, root: &Path, cfg: &mut Config) -> std::io::Result<()> {
    let mut rng = Rng::new(seed ^ 0x043d_15c5);
    if !rng.chance(MULTI_DISK_RUN_PERCENT) {
        return Ok(());
    }
    let cache = root.join("cache");
    cfg.cache_dirs = (0..rng.range(2, 4))
        .map(|i| cache.join(format!("disk{i}")))
        .collect();
    for d in &cfg.cache_dirs {
        std::fs::create_dir_all(d)?;
        // Ids from the seed (a blank disk draws a random one): placement, and so the run,
        // repeats.
        let id = format!("{:016x}\n", rng.below(u64::MAX));
        std::fs::write(d.join(crate::cache::disks::DISK_ID_FILE), id)?;
    }
    cfg.cache_dir = None;
    Ok(())
}
