//! What a shard keeps to serve pulled content: its `CacheFill` (under
//! `cache_dir/shard-<n>/`), the `[[origin]]` rules, and the decisions the shard's request
//! path asks of them. The shard's glue (`shard::cache_glue`) only moves events between this
//! and the connections.
//!
//! The shards share one cache (`SharedEdge`: one index, journal and set of fills behind a
//! mutex); each runs its own fetches on its own ring. A fetch on one shard whose block a
//! client on another waits for posts the notice to that shard and writes its eventfd, whose
//! poll on that shard's ring wakes it.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::cache_fill::{CacheFill, FillConfig, FillCore, Notice, Outcome};
use super::route::{origin_for, OriginConfig};
use super::Filler;
use crate::cache::index::ObjectVersion;
use crate::origin::fetch::FetchError;
use crate::origin::response::Unusable;
use crate::ring_api::slots::ConnSlot;

/// Most keys a shard remembers as published for lock-free hits (past it, it forgets them all
/// and learns them again through the locked path).
pub const HOT_KEYS_PER_SHARD: usize = 4096;
/// Hits served without the lock a shard counts before it hands them to eviction.
pub const MAX_TOUCHED: usize = 1024;

/// Most fetches a shard runs at once over all its origins.
pub const MAX_FETCHES_PER_SHARD: usize = 64;
/// Blocks one origin request asks for.
pub const RUN_BLOCKS: u64 = 64;
/// Bytes a fetch writes between two syncs of the data file (and journal appends): a sync per
/// 256 KiB block cost more than the writes on a fast disk.
pub const SYNC_EVERY_BYTES: u32 = 4 << 20;
/// Attempts per block before the waiting clients get the error.
pub const FILL_ATTEMPTS: u32 = 3;

/// A waiting client: its shard, its connection slot and the slot's generation then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The shard holding the connection (its notices go there).
    pub shard: u16,
    /// The connection slot.
    pub conn: ConnSlot,
    /// The slot's generation when it began to wait.
    pub generation: u16,
}

impl crate::fill::cache_fill::Routed for Waiter {
    fn shard(&self) -> usize {
        usize::from(self.shard)
    }
}

/// What a request's path leads to.
pub enum Route {
    /// Not under any origin: the local root serves it.
    Local,
    /// Filled from origin `origin`, cached under `key`, fetched as `path`.
    Origin {
        /// Index into `[[origin]]`.
        origin: usize,
        /// The cache key.
        key: Vec<u8>,
        /// The request target sent to the origin.
        path: String,
        /// The path matches the entry's `never_cache`: never stored, each client's own fetch.
        never_cache: bool,
    },
}

/// What a request that found every byte it needs on disk takes from the fill in the same
/// hold of its lock: the version (pinned for it: `CacheFill::unpin` when the response ends),
/// the checksums of the blocks it reads first, and, when it streams, how far the committed
/// bytes go.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The version.
    pub meta: ObjectVersion,
    /// Pinned against eviction (a hit served without the lock is not: if its version is
    /// dropped meanwhile, it reads on from the open descriptor of the removed file).
    pub pinned: bool,
    /// The version as published for lock-free hits, when it is.
    pub hot: Option<Arc<super::cache_fill::HotVersion>>,
    /// Checksums from the block of the first byte it needs.
    pub crcs: super::cache_fill::CrcWindow,
    /// Streaming: where the committed bytes from its first byte end.
    pub readable_end: Option<u64>,
}

/// A response that streams a pulled object while it fills: what it asks the fill for next.
#[derive(Clone, Debug)]
pub struct Stream {
    /// The cache key.
    pub key: Vec<u8>,
    /// The origin's index.
    pub origin: usize,
    /// The request target at the origin.
    pub path: String,
    /// First byte the response asked for (where its read-ahead is judged from).
    pub start: u64,
    /// Last byte the response needs (None: the object's end).
    pub last: Option<u64>,
}

/// A shard's pull-through cache.
pub struct EdgeCache {
    /// The fill (index, journal, fetches).
    pub fill: CacheFill<Waiter>,
    origins: Vec<OriginConfig>,
    /// Longest a request waits (ms).
    pub wait_timeout_ms: u64,
    /// Bytes of an arena slot (a response no longer than this never streams).
    slot_bytes: usize,
    /// This shard's number.
    shard: usize,
    /// Every shard's wake-up eventfd (index = shard).
    wakers: Arc<Vec<OwnedFd>>,
    wake_buf: Vec<usize>,
    /// Blocks a streaming response may trail the fill by and still hear of every block
    /// (`cache_read_ahead_blocks`); one further behind hears again when it reaches its end.
    pub follow_blocks: u64,
    dropped_buf: Vec<u64>,
    /// Keys whose current version was published for lock-free hits, with the origin and the
    /// path their streams ask for (at most `HOT_KEYS_PER_SHARD`).
    hot: std::collections::HashMap<Vec<u8>, (usize, String, Arc<super::cache_fill::HotVersion>)>,
    /// Versions hit without the lock since eviction last heard (`MAX_TOUCHED` a batch; at
    /// most twice that while the lock is held elsewhere).
    touched: Vec<u64>,
}

/// What the shards share: one cache directory, one index and journal, and how to wake each
/// other when a fetch on one has news for waiters on another.
#[derive(Clone)]
pub struct SharedEdge {
    /// The bookkeeping every shard locks (while the disks load, a loading core's:
    /// `FillCore::loading`).
    pub core: Arc<Mutex<FillCore<Waiter>>>,
    /// The disks' load: how far it came, and the disks opened once it is done.
    pub load: Arc<crate::cache::disks::DiskLoad>,
    wakers: Arc<Vec<OwnedFd>>,
    /// Looks every origin's name up again each `origin_resolve_ttl_s`, off the shard threads
    /// (its thread stops with the last clone).
    resolver: Arc<crate::origin::resolve::Resolver>,
    /// `cache_read_ahead_blocks`.
    read_ahead_blocks: u64,
    /// Each origin's fetches at once over every shard (`[[origin]] max_fetches`).
    budgets: Vec<Arc<crate::origin::pool::FetchBudget>>,
    /// Each origin's bandwidth cap, shared by every shard (None: `max_bytes_per_s` 0).
    bandwidth: Vec<Option<Arc<crate::limits::egress::EgressBucket>>>,
    /// The `[[origin]]` entries (routing for `object_state`).
    origins: Vec<OriginConfig>,
    /// `cache_disk_op_timeout_ms`: a fill's write or sync past it is given up.
    disk_op_timeout_ms: u64,
}

/// What the cache holds of one request target (`SharedEdge::object_state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectState {
    /// The `[[origin]]` entry the target routes to.
    pub origin: usize,
    /// The object's size, once its head was fetched.
    pub size: Option<u64>,
    /// Whether every block of it is on disk.
    pub cached: bool,
}

impl SharedEdge {
    /// Opens the cache's disks `cache_dirs` at once (replaying each journal; a disk that
    /// cannot be opened is left out unless `cache_require_all_disks`) for `shards` shards,
    /// with the cache keys and `[[origin]]` entries of `config`, its files written under
    /// `watch` (a model of the disk, for power-loss crashes; None for the real disk). Its
    /// I/O runs inline, on whichever thread queues it: the simulator's one thread, whose
    /// runs repeat by seed. The server opens with `open_loading`.
    pub fn open_inline(
        cache_dirs: &[PathBuf],
        shards: usize,
        config: &crate::config::Config,
        watch: crate::cache::watch::Watch,
    ) -> std::io::Result<SharedEdge> {
        let mut opened =
            crate::cache::disks::open_disks(cache_dirs, config.cache_require_all_disks, watch)?;
        opened
            .journals
            .set_op_timeout_ms(config.cache_disk_op_timeout_ms);
        let report = Arc::new(crate::cache::disks::DiskReport::of(&opened));
        let core = FillCore::on_disks(opened, fill_config(config), shards)?;
        let wakers = Arc::new(shard_wakers(shards)?);
        let core = core.into_shared();
        let load = Arc::new(crate::cache::disks::DiskLoad::default());
        load.finish(Some(report));
        Self::around(core, load, wakers, config)
    }

    /// Opens the cache on a thread of its own (`cache-load`), its I/O on the cache's I/O
    /// thread (no shard thread syncs, creates or unlinks): the edge returned serves at once, every pulled request passing through unstored
    /// (`Outcome::Loading`), until the loaded core takes the loading one's place. The load
    /// first waits for each disk's lock while another process holds it (a restart
    /// handover's predecessor, `cache::disk_lock`). `Loader::wait_ms` gives its end.
    pub fn open_loading(
        cache_dirs: &[PathBuf],
        shards: usize,
        config: &crate::config::Config,
    ) -> std::io::Result<(SharedEdge, Loader)> {
        let cfg = fill_config(config);
        let core = FillCore::loading(cache_dirs, cfg.clone(), shards).into_shared();
        let wakers = Arc::new(shard_wakers(shards)?);
        let load = Arc::new(crate::cache::disks::DiskLoad::default());
        let edge = Self::around(core.clone(), load.clone(), wakers.clone(), config)?;
        let loader = Loader {
            end: Arc::new((Mutex::new(LoadEnd::Running), std::sync::Condvar::new())),
        };
        let end = loader.end.clone();
        let dirs = cache_dirs.to_vec();
        let (require_all, op_timeout_ms) = (
            config.cache_require_all_disks,
            config.cache_disk_op_timeout_ms,
        );
        let origins = config.origin.len();
        std::thread::Builder::new()
            .name("cache-load".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let result = (|| {
                    let locks = crate::cache::disk_lock::wait_for_locks(&dirs, &load.progress);
                    let mut opened = crate::cache::disks::open_disks_with(
                        &dirs,
                        require_all,
                        None,
                        locks,
                        Some(&load.progress),
                    )?;
                    opened.journals.set_op_timeout_ms(op_timeout_ms);
                    let report = Arc::new(crate::cache::disks::DiskReport::of(&opened));
                    let loaded = FillCore::on_disks_uncounted(opened, cfg, shards)?;
                    let uncounted = loaded.uncounted();
                    load.progress.set_uncounted_versions(uncounted as u64);
                    loaded.install_threaded(&core, wakers)?;
                    load.finish(Some(report.clone()));
                    tracing::info!(
                        cache_dir = %dirs[0].display(),
                        disks = report.disks.len(),
                        disks_left_out = report.missing.len(),
                        origins,
                        rebuild_ms = started.elapsed().as_millis() as u64,
                        "pull-through cache open"
                    );
                    let counting = std::time::Instant::now();
                    // Held weakly from here: a stop that lets go of the core ends the count.
                    let weak = Arc::downgrade(&core);
                    drop(core);
                    if count_for_eviction(weak, &load.progress) {
                        tracing::info!(
                            versions = uncounted,
                            count_ms = counting.elapsed().as_millis() as u64,
                            "the eviction counts every version held"
                        );
                    }
                    Ok(())
                })();
                if result.is_err() {
                    load.finish(None);
                }
                Loader::ended(&end, result, &dirs[0]);
            })?;
        Ok((edge, loader))
    }

    /// The edge around `core`, its load `load` and the shards' `wakers`, with the
    /// `[[origin]]` entries of `config`.
    fn around(
        core: Arc<Mutex<FillCore<Waiter>>>,
        load: Arc<crate::cache::disks::DiskLoad>,
        wakers: Arc<Vec<OwnedFd>>,
        config: &crate::config::Config,
    ) -> std::io::Result<SharedEdge> {
        let names = config
            .origin
            .iter()
            .map(OriginConfig::name_and_port)
            .collect::<Result<Vec<_>, _>>()
            .map_err(std::io::Error::other)?;
        let ttl = std::time::Duration::from_secs(config.origin_resolve_ttl_s);
        let resolver = crate::origin::resolve::Resolver::spawn(names, ttl)?;
        Ok(SharedEdge {
            core,
            load,
            wakers,
            resolver: Arc::new(resolver),
            read_ahead_blocks: config.cache_read_ahead_blocks,
            disk_op_timeout_ms: config.cache_disk_op_timeout_ms,
            budgets: config
                .origin
                .iter()
                .map(|o| crate::origin::pool::FetchBudget::new(o.max_fetches))
                .collect(),
            bandwidth: config
                .origin
                .iter()
                .map(|o| {
                    (o.max_bytes_per_s > 0)
                        .then(|| Arc::new(crate::limits::egress::EgressBucket::new()))
                })
                .collect(),
            origins: config.origin.clone(),
        })
    }

    /// The cache's disks: those opened (index = slot), those left out, their health. None
    /// while they load.
    pub fn disks(&self) -> Option<&Arc<crate::cache::disks::DiskReport>> {
        self.load.disks()
    }

    /// Whether the disks are still loading (every pulled request passes through).
    pub fn loading(&self) -> bool {
        !self.load.progress.ready()
    }
}

/// Start-up versions the eviction counts per hold of the shared lock, after the shards serve
/// (`FillCore::count_for_eviction`): about a millisecond of a shard's wait for the lock.
pub const EVICTION_COUNT_STEP: usize = 4096;

/// Counts the versions a loaded core held at start-up for its eviction, `EVICTION_COUNT_STEP`
/// at a time, the lock let go in between: true once all are, false when the core went first
/// (a stop).
fn count_for_eviction(
    core: std::sync::Weak<Mutex<FillCore<Waiter>>>,
    progress: &crate::cache::load_progress::LoadProgress,
) -> bool {
    loop {
        let Some(core) = core.upgrade() else {
            return false;
        };
        let left = crate::fill::cache_fill::lock(&core).count_for_eviction(EVICTION_COUNT_STEP);
        progress.set_uncounted_versions(left as u64);
        if left == 0 {
            return true;
        }
        drop(core);
        // The shards' turn at the lock.
        std::thread::yield_now();
    }
}

/// How a cache load ended, for `Loader::wait_ms`.
enum LoadEnd {
    /// Under way, and waited for.
    Running,
    /// Under way, and nobody waits any more: a failure ends the process.
    Detached,
    /// Ended before anybody stopped waiting.
    Done(std::io::Result<()>),
}

/// A cache load running on its own thread (`SharedEdge::open_loading`).
pub struct Loader {
    end: Arc<(Mutex<LoadEnd>, std::sync::Condvar)>,
}

/// The exit status of a process whose cache failed to load after its shards started (the
/// status of a failed start).
pub const LOAD_FAILED_EXIT: i32 = 1;

impl Loader {
    /// Waits up to `ms` for the load to end: its result, or None when it goes on. A load
    /// that fails after that logs why and ends the process (`LOAD_FAILED_EXIT`), as a
    /// failure before serving does.
    pub fn wait_ms(self, ms: u64) -> Option<std::io::Result<()>> {
        let (end, ended) = &*self.end;
        let guard = end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut guard, _) = ended
            .wait_timeout_while(guard, std::time::Duration::from_millis(ms), |e| {
                matches!(e, LoadEnd::Running)
            })
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match std::mem::replace(&mut *guard, LoadEnd::Detached) {
            LoadEnd::Done(result) => Some(result),
            _ => None,
        }
    }

    /// The loader's end: handed to the waiter, or, with none, a failure ends the process.
    fn ended(
        end: &(Mutex<LoadEnd>, std::sync::Condvar),
        result: std::io::Result<()>,
        dir: &std::path::Path,
    ) {
        let mut guard = end
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*guard, LoadEnd::Detached) {
            if let Err(e) = result {
                tracing::error!(
                    cache_dir = %dir.display(),
                    error = %e,
                    "the pull-through cache failed to load: the process ends"
                );
                std::process::exit(LOAD_FAILED_EXIT);
            }
            return;
        }
        *guard = LoadEnd::Done(result);
        end.1.notify_all();
    }
}

/// The fill's settings from `config`.
fn fill_config(config: &crate::config::Config) -> FillConfig {
    let block_bytes = config.cache_block_bytes;
    FillConfig {
        block_bytes,
        read_ahead_blocks: config.cache_read_ahead_blocks,
        max_run_blocks: RUN_BLOCKS,
        slot_bytes: config.chunk_bytes,
        align_bytes: crate::ring_api::ARENA_ALIGN_BYTES as usize,
        max_attempts: FILL_ATTEMPTS,
        sync_every_blocks: (SYNC_EVERY_BYTES / block_bytes).max(1),
        max_bytes: config.cache_max_bytes,
        revalidate_s: config.cache_revalidate_s,
        heuristic_max_s: config.cache_heuristic_max_s,
        not_found_s: config.cache_404_s,
        open_files: config.cache_open_files,
        compact_min_bytes: super::cache_fill::COMPACT_MIN_BYTES,
        origin_names: config.origin.iter().map(|o| o.url.clone()).collect(),
        origin_policies: config
            .origin
            .iter()
            .map(|o| super::cache_fill::OriginPolicy {
                cache_policy: o.cache_policy,
                ttl_s: o.ttl_s,
                stale_if_error_s: o.stale_if_error_s,
                purge_tag_header: o.tag_header(),
            })
            .collect(),
    }
}

/// One wake-up eventfd per shard.
fn shard_wakers(shards: usize) -> std::io::Result<Vec<OwnedFd>> {
    (0..shards)
        .map(|_| {
            rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
            )
            .map_err(std::io::Error::from)
        })
        .collect()
}

impl SharedEdge {
    /// The `[[origin]]` entry and cache key a client's request for `path` (and `query`) under
    /// Host `host` would have; Err names why it is none of the cache's.
    fn key_of(
        &self,
        path: &[u8],
        query: Option<&[u8]>,
        host: Option<&[u8]>,
    ) -> Result<(usize, Vec<u8>), &'static str> {
        let mut scratch = crate::fs::resolve::ResolveScratch::default();
        let resolved = crate::fs::resolve::resolve_into(path, &mut scratch)
            .map_err(|_| "the path does not resolve")?;
        let origin = origin_for(&self.origins, &resolved, host)
            .ok_or("no [[origin]] covers this path and host")?;
        let key = super::route::cache_key(
            origin,
            resolved.rel_path,
            query,
            &self.origins[origin].key_query,
        );
        Ok((origin, key))
    }

    /// What the cache holds of request target `path` (and `query`) under Host `host`, as a
    /// client's request would find it; Err names why it is none of the cache's (no
    /// `[[origin]]` covers it, or it does not resolve). For `shardline cache prefill`.
    pub fn object_state(
        &self,
        path: &[u8],
        query: Option<&[u8]>,
        host: Option<&[u8]>,
    ) -> Result<ObjectState, &'static str> {
        let (origin, key) = self.key_of(path, query, host)?;
        let core = super::cache_fill::lock(&self.core);
        let index = core.index();
        Ok(match index.current(&key) {
            Some(m) => ObjectState {
                origin,
                size: Some(m.size),
                cached: index.blocks_present(m.version) == m.blocks(),
            },
            None => ObjectState {
                origin,
                size: None,
                cached: false,
            },
        })
    }

    /// Pins the object request target `path` (and `query`, under Host `host`) names against
    /// eviction until `until_unix_s` (`FillCore::pin_until`); Ok(false) when it is not cached
    /// yet, Err naming why it is none of the cache's.
    pub fn pin_until(
        &self,
        path: &[u8],
        query: Option<&[u8]>,
        host: Option<&[u8]>,
        until_unix_s: u64,
    ) -> Result<bool, &'static str> {
        let (_, key) = self.key_of(path, query, host)?;
        let mut core = super::cache_fill::lock(&self.core);
        Ok(core.pin_until(&key, until_unix_s))
    }

    /// Purges every cached object whose origin tagged it `tag` (`FillCore::purge_tag`), on
    /// every shard: returns how many.
    pub fn purge_tag(&self, tag: &str) -> usize {
        let mut core = super::cache_fill::lock(&self.core);
        let purged = core.purge_tag(tag);
        let mut wake = Vec::new();
        core.take_wakes(&mut wake);
        drop(core);
        for shard in wake {
            let _ = rustix::io::write(&self.wakers[shard], &1u64.to_ne_bytes());
        }
        purged
    }

    /// Purges cached objects by request path (`/pull/a.bin`) or path prefix (`/pull/`):
    /// `FillCore::purge`. None when the path does not resolve (dot segments above the root,
    /// a NUL).
    pub fn purge(&self, path: &[u8], prefix: bool) -> Option<usize> {
        let mut scratch = crate::fs::resolve::ResolveScratch::default();
        let resolved = crate::fs::resolve::resolve_into(path, &mut scratch).ok()?;
        let mut rel = resolved.rel_path.to_string();
        // A prefix that names a directory matches only what is beneath it.
        if prefix && path.ends_with(b"/") && !rel.is_empty() {
            rel.push('/');
        }
        // Through `Locked`: its release hands the drops' records to the I/O thread.
        let mut core = super::cache_fill::lock(&self.core);
        let purged = core.purge(&rel, prefix);
        // The shards close their descriptors of the removed files (not called from a shard:
        // each is woken).
        let mut wake = Vec::new();
        core.take_wakes(&mut wake);
        drop(core);
        for shard in wake {
            let _ = rustix::io::write(&self.wakers[shard], &1u64.to_ne_bytes());
        }
        Some(purged)
    }
}

impl EdgeCache {
    /// Shard `shard`'s cache: its own fetches over `origins`, the shared bookkeeping of
    /// `shared`.
    pub fn open(
        shared: &SharedEdge,
        shard: usize,
        origins: &[OriginConfig],
        slot_bytes: usize,
        wait_timeout_ms: u64,
    ) -> std::io::Result<EdgeCache> {
        let published = shared.resolver.addresses();
        let targets = origins
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let mut t = o.target().map_err(std::io::Error::other)?;
                t.resolved = Some((published.clone(), i));
                t.budget = shared.budgets.get(i).cloned();
                t.bandwidth = shared
                    .bandwidth
                    .get(i)
                    .cloned()
                    .flatten()
                    .map(|b| (b, o.max_bytes_per_s));
                Ok(t)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut filler = Filler::new(targets, MAX_FETCHES_PER_SHARD);
        filler.set_disk_op_timeout_ms(shared.disk_op_timeout_ms);
        let fill = CacheFill::attach(shared.core.clone(), shard, filler);
        Ok(EdgeCache {
            fill,
            origins: origins.to_vec(),
            wait_timeout_ms,
            slot_bytes,
            shard,
            wakers: shared.wakers.clone(),
            wake_buf: Vec::new(),
            follow_blocks: shared.read_ahead_blocks.max(1),
            dropped_buf: Vec::new(),
            hot: std::collections::HashMap::new(),
            touched: Vec::with_capacity(MAX_TOUCHED),
        })
    }

    /// This shard's wake-up descriptor (polled through the ring).
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.wakers[self.shard].as_fd()
    }

    /// Empties this shard's wake-up counter (after its poll completed).
    pub fn drain_wake(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.wakers[self.shard], &mut buf);
    }

    /// Where request `path` (raw) with Host `host` is served from.
    pub fn route(
        &self,
        path: &[u8],
        query: Option<&[u8]>,
        host: Option<&[u8]>,
        scratch: &mut crate::fs::resolve::ResolveScratch,
    ) -> Route {
        let Ok(resolved) = crate::fs::resolve::resolve_into(path, scratch) else {
            return Route::Local;
        };
        let Some(origin) = origin_for(&self.origins, &resolved, host) else {
            return Route::Local;
        };
        let rel = resolved.rel_path;
        let never_cache = self.origins[origin]
            .never_cache
            .iter()
            // Patterns start with '/' (checked at load); the resolved path has none.
            .any(|p| crate::config::origin::path_matches(&p.as_bytes()[1..], rel.as_bytes()));
        Route::Origin {
            never_cache,
            origin,
            key: super::route::cache_key(origin, rel, query, &self.origins[origin].key_query),
            path: super::route::origin_path(rel, query),
        }
    }

    /// The byte range (first, last) a request needs from a version of `size` bytes: the span
    /// of its satisfiable ranges, or the whole object (a bad or absent Range is answered by
    /// the plan, which needs only the size); and whether it is several ranges.
    pub fn span(range: Option<&[u8]>, size: u64, head_only: bool) -> (u64, Option<u64>, bool) {
        if head_only || size == 0 {
            return (0, Some(0), false);
        }
        let Some(value) = range else {
            return (0, None, false);
        };
        use crate::http::range::{parse_range, RangeOutcome, MAX_RANGES};
        match parse_range(value, size, MAX_RANGES) {
            RangeOutcome::Full => (0, None, false),
            RangeOutcome::Single(r) => (r.start, Some(r.end - 1), false),
            RangeOutcome::Multi(rs) => {
                let first = rs.iter().map(|r| r.start).min().unwrap_or(0);
                let last = rs.iter().map(|r| r.end - 1).max().unwrap_or(size - 1);
                (first, Some(last), true)
            }
            RangeOutcome::Unsatisfiable => (0, Some(0), false),
        }
    }

    /// The pieces (first, last inclusive) of a multipart range over an object of `size`.
    fn pieces(range: Option<&[u8]>, size: u64) -> Vec<(u64, u64)> {
        use crate::http::range::{parse_range, RangeOutcome, MAX_RANGES};
        match range.map(|v| parse_range(v, size, MAX_RANGES)) {
            Some(RangeOutcome::Multi(rs)) => rs.iter().map(|r| (r.start, r.end - 1)).collect(),
            _ => Vec::new(),
        }
    }

    /// The first piece of several `bytes=A-B,...` ranges when it is closed (both sides
    /// numbers), before the size is known; None for one range, or a first piece open or a
    /// suffix.
    fn first_piece(range: Option<&[u8]>) -> Option<(u64, u64)> {
        let spec = range?.trim_ascii().strip_prefix(b"bytes=")?;
        let comma = spec.iter().position(|&b| b == b',')?;
        let mut first = b"bytes=".to_vec();
        first.extend_from_slice(&spec[..comma]);
        match Self::single_range_sides(Some(&first))? {
            (Some(a), Some(b)) if b >= a => Some((a, b)),
            _ => None,
        }
    }

    /// The two sides of a single `bytes=A-B` range, as numbers where they are (either may be
    /// empty: an open range, a suffix); None for several ranges or another unit.
    fn single_range_sides(range: Option<&[u8]>) -> Option<(Option<u64>, Option<u64>)> {
        let spec = range?.trim_ascii().strip_prefix(b"bytes=")?;
        if spec.contains(&b',') {
            return None;
        }
        let dash = spec.iter().position(|&b| b == b'-')?;
        let num = |side: &[u8]| {
            std::str::from_utf8(side.trim_ascii())
                .ok()?
                .parse::<u64>()
                .ok()
        };
        Some((num(&spec[..dash]), num(&spec[dash + 1..])))
    }

    /// The first byte of a single `bytes=N-...` range, before the size is known (a suffix
    /// or several ranges: None, the object's start).
    pub fn first_byte(range: Option<&[u8]>) -> Option<u64> {
        Self::single_range_sides(range)?.0
    }

    /// The last byte of a single `bytes=N-M` range, before the size is known (open, a suffix
    /// or several ranges: None).
    pub fn last_byte(range: Option<&[u8]>) -> Option<u64> {
        match Self::single_range_sides(range)? {
            (Some(first), Some(last)) if last >= first => Some(last),
            _ => None,
        }
    }

    /// What `waiter` wants of `key`: `Ready(version)` when it may start. A remembered 404
    /// comes first, and for a request not yet `admitted` (not resumed after a wait), a stale
    /// version's revalidation (`FillCore::admit`). A single range (or
    /// the whole object) longer than a chunk streams: it starts once its first block is on
    /// disk and reads on as the fill commits more (the span is returned for that); anything
    /// else starts once every byte it needs is there. None when the fill's lock is held by
    /// another thread and no lock-free hit answers: the shard asks again at a later tick.
    #[allow(clippy::too_many_arguments)]
    pub fn want(
        &mut self,
        key: &[u8],
        origin: usize,
        path: &str,
        range: Option<&[u8]>,
        head_only: bool,
        admitted: bool,
        waiter: Waiter,
    ) -> Option<(Outcome, Option<Stream>, Option<Hit>)> {
        let first = Self::first_byte(range).filter(|_| !head_only).unwrap_or(0);
        let slot_bytes = self.slot_bytes as u64;
        if let Some(hit) = self.hot_hit(key, range, head_only, admitted) {
            return Some(hit);
        }
        // One hold of the fill's lock for the whole decision, and for a hit everything its
        // response needs from the fill.
        let touched = &mut self.touched;
        let (outcome, streaming, (start, last), hit) = self.fill.try_with_core(|core| {
            Self::flush_touched(touched, core);
            let now_s = super::cache_fill::unix_now_s();
            if let Some(outcome) = core.admit(key, origin, path, first, !admitted, waiter, now_s) {
                return (outcome, false, (first, None), None);
            }
            let Some(size) = core
                .index()
                .current_version(key)
                .and_then(|v| core.index().size_of(v))
            else {
                // Unknown yet: its first fetch asks for no more than a closed range (or a
                // HEAD: the first block) needs.
                let (first, last) = match Self::first_piece(range) {
                    // Several ranges: the probe fetches the first piece's blocks alone.
                    Some((a, b)) if !head_only => (a, Some(b)),
                    _ if head_only => (first, Some(0)),
                    _ => (first, Self::last_byte(range)),
                };
                let outcome = core.want(key, origin, path, first, last, waiter);
                return (outcome, false, (first, None), None);
            };
            let (first, last, multi) = Self::span(range, size, head_only);
            let span_bytes = last.unwrap_or(size.saturating_sub(1)).saturating_sub(first) + 1;
            let streaming = !multi && span_bytes > slot_bytes;
            let outcome = if streaming {
                core.want_streaming(key, origin, path, first, last, waiter)
            } else if multi {
                let pieces = Self::pieces(range, size);
                core.want_pieces(key, origin, path, &pieces, waiter)
            } else {
                core.want(key, origin, path, first, last, waiter)
            };
            let hit = match outcome {
                Outcome::Ready(v) => core.index().meta(v).map(|meta| {
                    core.pin(v);
                    let mut crcs = super::cache_fill::CrcWindow::EMPTY;
                    core.fill_window(v, first, &mut crcs);
                    let readable_end = streaming.then(|| core.readable_end(v, first));
                    Hit {
                        meta,
                        pinned: true,
                        hot: core.hot_version(v),
                        crcs,
                        readable_end,
                    }
                }),
                _ => None,
            };
            (outcome, streaming, (first, last), hit)
        })?;
        if let Some(h) = hit.as_ref().and_then(|h| h.hot.clone()) {
            if self.hot.len() >= HOT_KEYS_PER_SHARD {
                self.hot.clear();
            }
            self.hot.insert(key.to_vec(), (origin, path.to_owned(), h));
        }
        let stream = streaming.then(|| Stream {
            key: key.to_vec(),
            origin,
            path: path.to_owned(),
            start,
            last,
        });
        Some((outcome, stream, hit))
    }

    /// A hit served without the fill's lock: the key's version was published
    /// (`HotVersion`), is still valid and fresh, and every block of it is on disk. Its
    /// eviction frequency is counted later, in a batch (`touched`).
    fn hot_hit(
        &mut self,
        key: &[u8],
        range: Option<&[u8]>,
        head_only: bool,
        admitted: bool,
    ) -> Option<(Outcome, Option<Stream>, Option<Hit>)> {
        let (origin, path, h) = self.hot.get(key)?;
        let now_s = super::cache_fill::unix_now_s();
        // A request resumed after a wait goes the locked way (it may be the revalidation's),
        // and so does one whose disk is failing (the lock's release takes its objects out).
        let slot = crate::cache::version_id::slot_of(h.meta.version);
        if admitted
            || !h.valid()
            || now_s >= h.fresh_until_s
            || !self.fill.store().health().usable(slot)
        {
            self.hot.remove(key);
            return None;
        }
        let size = h.meta.size;
        let (first, last, multi) = Self::span(range, size, head_only);
        let span_bytes = last.unwrap_or(size.saturating_sub(1)).saturating_sub(first) + 1;
        let streaming = !multi && span_bytes > self.slot_bytes as u64;
        let version = h.meta.version;
        let hit = Hit {
            meta: h.meta.clone(),
            pinned: false,
            crcs: h.window(first),
            readable_end: streaming.then_some(size),
            hot: Some(h.clone()),
        };
        let stream = streaming.then(|| Stream {
            key: key.to_vec(),
            origin: *origin,
            path: path.clone(),
            start: first,
            last,
        });
        if self.touched.len() >= MAX_TOUCHED {
            let touched = std::mem::take(&mut self.touched);
            let flushed = self.fill.try_with_core(|core| core.touch(&touched));
            self.touched = touched;
            if flushed.is_some() {
                self.touched.clear();
            }
        }
        // With the lock held elsewhere the counts wait for the next hold; past twice the
        // batch, further ones are let go (they only weigh eviction).
        if self.touched.len() < 2 * MAX_TOUCHED {
            self.touched.push(version);
        }
        Some((Outcome::Ready(version), stream, Some(hit)))
    }

    /// How many shards share the cache.
    pub fn shards(&self) -> usize {
        self.wakers.len()
    }

    /// Forgets that `key` was published for lock-free hits (its next request takes the
    /// locked path).
    pub fn forget_hot(&mut self, key: &[u8]) {
        self.hot.remove(key);
    }

    /// Counts the hits served without the lock for eviction, in the hold `core` is.
    fn flush_touched(touched: &mut Vec<u64>, core: &mut super::cache_fill::FillCore<Waiter>) {
        core.touch(touched);
        touched.clear();
    }

    /// The streaming response `stream` (of `waiter`, on `version`) reached byte `from` of
    /// what is committed: it waits on the next block (and moves the read-ahead on). `Ready`
    /// when it is there; `Busy` when the key has another version now. None when the fill's
    /// lock is held by another thread (asked again at a later tick).
    pub fn want_more(
        &mut self,
        stream: &Stream,
        version: u64,
        from: u64,
        waiter: Waiter,
    ) -> Option<Outcome> {
        self.fill.want_more(
            version,
            &stream.key,
            stream.origin,
            &stream.path,
            stream.start,
            from,
            stream.last,
            waiter,
        )
    }

    /// Hands the file-cache key of each version dropped since the last call to `forget`.
    pub fn dropped_files(&mut self, mut forget: impl FnMut(&str)) {
        let mut dropped = std::mem::take(&mut self.dropped_buf);
        self.fill.take_dropped(&mut dropped);
        for v in dropped.drain(..) {
            forget(&self.data_file(v).0);
        }
        self.dropped_buf = dropped;
    }

    /// Version `version`'s data file, and the key the shard's file cache keeps it under.
    pub fn data_file(&self, version: u64) -> (String, PathBuf) {
        (
            format!("\0cache/{version:016x}"),
            self.fill.store().data_path(version),
        )
    }

    /// The status a client gets when its fill failed: the origin's 4xx as it came, 504 for a
    /// timeout, 503 when the cache's disk is full, 500 for another disk error, 502 otherwise.
    pub fn status_for(error: &FetchError) -> u16 {
        match error {
            // The origin's refusal or error is its answer (a redirect is passed on by the
            // request's own fetch, with its Location).
            FetchError::Unusable(Unusable::Status(s)) if (400..600).contains(s) => *s,
            FetchError::Unusable(Unusable::Throttled { .. }) => 503,
            FetchError::Timeout(_) => 504,
            e if e.is_disk_full() => 503,
            FetchError::Disk(_) => 500,
            _ => 502,
        }
    }

    /// This shard's notices, in order, and the slots its fetches gave back; wakes the other
    /// shards whose waiters heard from this shard's fetches.
    pub fn take_notices(
        &mut self,
        notices: &mut Vec<Notice<Waiter>>,
        slots: &mut Vec<crate::ring_api::slots::ArenaSlot>,
    ) {
        let mut wake = std::mem::take(&mut self.wake_buf);
        self.fill.take(notices, slots, &mut wake);
        for shard in wake.drain(..) {
            if shard != self.shard {
                let _ = rustix::io::write(&self.wakers[shard], &1u64.to_ne_bytes());
            }
        }
        self.wake_buf = wake;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_needs_the_span_of_its_ranges() {
        assert_eq!(EdgeCache::span(None, 1000, false), (0, None, false));
        assert_eq!(
            EdgeCache::span(Some(b"bytes=100-199"), 1000, false),
            (100, Some(199), false)
        );
        assert_eq!(
            EdgeCache::span(Some(b"bytes=900-, 0-9"), 1000, false),
            (0, Some(999), true)
        );
        assert_eq!(
            EdgeCache::span(Some(b"bytes=-10"), 1000, false),
            (990, Some(999), false)
        );
        assert_eq!(
            EdgeCache::span(Some(b"bytes=5000-"), 1000, false),
            (0, Some(0), false)
        );
        assert_eq!(EdgeCache::span(None, 1000, true), (0, Some(0), false));
    }

    #[test]
    fn a_cold_range_probes_from_its_first_byte() {
        assert_eq!(
            EdgeCache::first_byte(Some(b"bytes=2500000-2600000")),
            Some(2_500_000)
        );
        assert_eq!(EdgeCache::first_byte(Some(b"bytes=7-")), Some(7));
        assert_eq!(EdgeCache::first_byte(Some(b"bytes=-7")), None);
        assert_eq!(EdgeCache::first_byte(Some(b"bytes=1-2,5-6")), None);
        assert_eq!(EdgeCache::first_byte(None), None);
        assert_eq!(EdgeCache::last_byte(Some(b"bytes=7-9")), Some(9));
        assert_eq!(EdgeCache::last_byte(Some(b"bytes= 7 - 9 ")), Some(9));
        for open_or_odd in [
            &b"bytes=7-"[..],
            b"bytes=-9",
            b"bytes=9-7",
            b"bytes=1-2,5-6",
            b"items=1-2",
        ] {
            assert_eq!(EdgeCache::last_byte(Some(open_or_odd)), None);
        }
    }

    #[test]
    fn origin_errors_map_to_statuses() {
        assert_eq!(
            EdgeCache::status_for(&FetchError::Unusable(Unusable::Status(404))),
            404
        );
        // The origin's own errors keep their status (issue 42: a well-formed answer is never
        // a 502); a redirect is passed on by the request's own fetch, never mapped here.
        for status in [500, 503, 403, 410] {
            assert_eq!(
                EdgeCache::status_for(&FetchError::Unusable(Unusable::Status(status))),
                status
            );
        }
        assert_eq!(
            EdgeCache::status_for(&FetchError::Unusable(Unusable::Status(302))),
            502
        );
        assert_eq!(
            EdgeCache::status_for(&FetchError::Head(
                crate::origin::response::HeadError::BadLength
            )),
            502
        );
        assert_eq!(EdgeCache::status_for(&FetchError::Timeout("connect")), 504);
        assert_eq!(EdgeCache::status_for(&FetchError::Connect(111)), 502);
        assert_eq!(EdgeCache::status_for(&FetchError::Disk(libc::ENOSPC)), 503);
        assert_eq!(EdgeCache::status_for(&FetchError::Disk(libc::EIO)), 500);
    }
}
