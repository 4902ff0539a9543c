//! Per-shard open-file cache: resolve beneath the root, pick the read mode, keep the file in
//! the ring's fixed-file table, revalidate on a short interval (nginx `open_file_cache`).
//!
//! Opens happen synchronously on the shard thread (openat2 + statx + fcntl + one
//! files-update), only on a cache miss or once per `open_file_valid_ms` per hot file; a hit
//! costs no syscall, and neither does a path that gave 404/403 within that interval
//! (`missing.rs`). Responses hold a reference, so a file replaced by rename keeps serving
//! the old version to the responses that started on it.
//!
//! A hit allocates nothing, also one that revalidates: the request path is resolved into the
//! cache's reused [`ResolveScratch`], looked up by borrowed key, and reopened (every
//! `open_file_valid_ms`) from a NUL-terminated copy kept in the entry
//! (`tests/request_path_alloc.rs` checks it). A miss allocates: the entry's key and opened
//! path, the index-file path of a directory, and once per device and mode a log line.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;

mod missing;

use crate::config::{EtagSource, SymlinkPolicy};
use crate::fs::resolve::{resolve_into, ResolveError, ResolveScratch};
use crate::http::conditional::{self, ETAG_MAX_BYTES};
use crate::http::request::MAX_REQUEST_LINE_BYTES;
use crate::http::{date, mime};
use crate::shard::ring_ops::RingOps;
use crate::shard::slots::FileSlot;

/// File name served for a directory.
pub const INDEX_FILE: &str = "index.html";
pub use crate::ring_api::ARENA_ALIGN_BYTES;
/// Extended attribute holding the publisher's SHA-256 of the file (for `etag = "xattr"`).
pub const DIGEST_XATTR: &str = "user.sha256";
/// Bytes of a SHA-256 digest.
const SHA256_BYTES: usize = 32;
/// Longest digest xattr value read: 64 hex digits plus a trailing newline or two.
const DIGEST_XATTR_MAX_BYTES: usize = 2 * SHA256_BYTES + 2;

/// The part of a ring the cache uses: the fixed-file table its open files live in. Every
/// [`RingOps`] is one; tests can supply just this.
pub trait FileTable {
    /// Places an open file in file slot `index`.
    fn register(&mut self, index: FileSlot, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// Empties file slot `index`.
    fn unregister(&mut self, index: FileSlot) -> io::Result<()>;
}

impl<R: RingOps> FileTable for R {
    fn register(&mut self, index: FileSlot, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.register_file(index, fd)
    }
    fn unregister(&mut self, index: FileSlot) -> io::Result<()> {
        self.unregister_file(index)
    }
}

/// How a file's bytes are read (the cache chooses; the response plan and the pipeline follow).
pub use crate::http::plan::FileRead as ReadMode;

/// An open, validated file in the fixed-file table.
pub struct OpenFile {
    _fd: OwnedFd,
    /// Slot in the ring's file range (the same as its cache entry).
    pub fixed: FileSlot,
    /// Size at open.
    pub size: u64,
    /// Inode number (revalidation: a file replaced by rename has a new one).
    pub ino: u64,
    /// Modification time, seconds.
    pub mtime_secs: i64,
    mtime_nsec: u32,
    etag: [u8; ETAG_MAX_BYTES],
    etag_len: usize,
    /// `Last-Modified` value.
    pub last_modified: [u8; 29],
    /// How to read it.
    pub mode: ReadMode,
    /// `Content-Type` of the opened path (looked up once, at open).
    pub content_type: &'static str,
    /// Resolved path (relative to root) it is cached under, with `wants_dir` its map.
    key: Box<str>,
    wants_dir: bool,
    /// Path actually opened (differs from key for directory index files), NUL-terminated so
    /// that reopening it to revalidate needs no copy, whatever its length.
    opened: CString,
    validated_ms: u64,
    refs: u32,
    /// Replaced on disk; freed when the last response lets go.
    stale: bool,
    /// A cache data file (`acquire_immutable`): never changed in place (a new version is a
    /// new file), so no revalidation; its blocks are written while it is served.
    immutable: bool,
    dev: (u32, u32),
}

impl OpenFile {
    /// The strong ETag, quoted.
    pub fn etag(&self) -> &[u8] {
        &self.etag[..self.etag_len]
    }
    /// The path that was opened, relative to the root.
    pub fn opened_path(&self) -> &str {
        // Built from a `&str`, so always UTF-8.
        self.opened.to_str().unwrap_or_default()
    }
}

/// Why a file could not be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// ENOENT/ENOTDIR, a directory without index, or not a regular file: 404.
    NotFound,
    /// EACCES/ELOOP/EXDEV (symlink leaving the root) or a refused symlink: 403.
    Forbidden,
    /// Every cache entry is held by a response: 503.
    Busy,
    /// Anything else (logged): 500.
    Other(i32),
}

impl OpenError {
    /// The HTTP status for this error.
    pub fn status(self) -> u16 {
        match self {
            OpenError::NotFound => 404,
            OpenError::Forbidden => 403,
            OpenError::Busy => 503,
            OpenError::Other(_) => 500,
        }
    }

    fn from_errno(e: Errno) -> OpenError {
        match e {
            Errno::NOENT | Errno::NOTDIR | Errno::NAMETOOLONG => OpenError::NotFound,
            Errno::ACCESS | Errno::PERM | Errno::LOOP | Errno::XDEV => OpenError::Forbidden,
            other => OpenError::Other(other.raw_os_error()),
        }
    }
}

/// Why a request target could not be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetError {
    /// The path was refused before any file was looked at.
    Path(ResolveError),
    /// The file could not be opened or cached.
    Open(OpenError),
}

impl TargetError {
    /// The HTTP status for this error.
    pub fn status(self) -> u16 {
        match self {
            TargetError::Path(e) => e.status(),
            TargetError::Open(e) => e.status(),
        }
    }
}

/// Cache keys by resolved path, one map for file targets and one for directory targets (`a`
/// and `a/` are different requests), so a lookup borrows the path instead of building a key.
struct Keys {
    files: HashMap<Box<str>, FileSlot>,
    dirs: HashMap<Box<str>, FileSlot>,
}

impl Keys {
    /// Both maps sized for every entry, so an insert never grows one.
    fn with_capacity(entries: usize) -> Keys {
        Keys {
            files: HashMap::with_capacity(entries),
            dirs: HashMap::with_capacity(entries),
        }
    }
    fn map(&mut self, wants_dir: bool) -> &mut HashMap<Box<str>, FileSlot> {
        if wants_dir {
            &mut self.dirs
        } else {
            &mut self.files
        }
    }
    fn get(&self, rel: &str, wants_dir: bool) -> Option<FileSlot> {
        let map = if wants_dir { &self.dirs } else { &self.files };
        map.get(rel).copied()
    }
    fn insert(&mut self, rel: &str, wants_dir: bool, idx: FileSlot) {
        self.map(wants_dir).insert(rel.into(), idx);
    }
    fn remove(&mut self, rel: &str, wants_dir: bool) {
        self.map(wants_dir).remove(rel);
    }
}

/// Settings of the cache.
pub struct FileCacheConfig {
    /// Entries (and fixed-file slots).
    pub entries: u32,
    /// Revalidation interval.
    pub valid_ms: u64,
    /// Threshold for O_DIRECT.
    pub direct_io_min_bytes: u64,
    /// Symlink policy.
    pub symlinks: SymlinkPolicy,
    /// Chunk size (an O_DIRECT alignment must divide it).
    pub chunk_bytes: usize,
    /// Where the ETag comes from.
    pub etag: EtagSource,
}

/// The per-shard cache.
pub struct FileCache {
    root: OwnedFd,
    cfg: FileCacheConfig,
    keys: Keys,
    /// Where request paths are resolved (sized for the longest request line at start-up).
    scratch: ResolveScratch,
    entries: Vec<Option<OpenFile>>,
    free: Vec<FileSlot>,
    clock_hand: usize,
    modes_logged: HashSet<(u32, u32, &'static str)>,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that opened the file.
    pub misses: u64,
    /// Paths that just gave 404 or 403, answered again without an open.
    missing: missing::Missing,
    /// Lookups answered from `missing`.
    pub negative_hits: u64,
}

impl FileCache {
    /// A cache serving files beneath `root`.
    pub fn new(root: &Path, cfg: FileCacheConfig) -> std::io::Result<FileCache> {
        let root = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let n = cfg.entries;
        Ok(FileCache {
            root,
            cfg,
            keys: Keys::with_capacity(n as usize),
            scratch: ResolveScratch::with_capacity(MAX_REQUEST_LINE_BYTES),
            entries: (0..n).map(|_| None).collect(),
            free: (0..n).rev().map(FileSlot::new).collect(),
            clock_hand: 0,
            modes_logged: HashSet::new(),
            hits: 0,
            misses: 0,
            missing: missing::Missing::with_capacity(missing::MISSING_PATHS_MAX),
            negative_hits: 0,
        })
    }

    /// Entry `idx` (must be acquired).
    pub fn get(&self, idx: FileSlot) -> &OpenFile {
        self.entries[idx.index()]
            .as_ref()
            .expect("file cache entry in use")
    }

    /// Resolves a raw request path (query stripped, still percent-encoded) and acquires its
    /// file: [`resolve_into`] the cache's scratch, then [`FileCache::acquire`]. No allocation
    /// on a hit.
    pub fn acquire_target(
        &mut self,
        ring: &mut impl FileTable,
        raw_path: &[u8],
        now_ms: u64,
    ) -> Result<FileSlot, TargetError> {
        // The scratch leaves `self` for the call so the path borrowed from it can be handed
        // back in; moving a Vec out and back allocates nothing.
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = match resolve_into(raw_path, &mut scratch) {
            Ok(r) => self
                .acquire(ring, r.rel_path, r.wants_dir, now_ms)
                .map_err(TargetError::Open),
            Err(e) => Err(TargetError::Path(e)),
        };
        self.scratch = scratch;
        result
    }

    /// The path the last [`FileCache::acquire_target`] resolved (for logging its failure).
    pub fn target_path(&self) -> &str {
        self.scratch.resolved()
    }

    /// Finds or opens the file for `rel` (a resolved path; `wants_dir` when the URL ended in
    /// '/') and takes a reference to it.
    pub fn acquire(
        &mut self,
        ring: &mut impl FileTable,
        rel: &str,
        wants_dir: bool,
        now_ms: u64,
    ) -> Result<FileSlot, OpenError> {
        if let Some(idx) = self.keys.get(rel, wants_dir) {
            let fresh = {
                let f = self.get(idx);
                now_ms.saturating_sub(f.validated_ms) < self.cfg.valid_ms
            };
            // In-place changes show in the open descriptor (one fstat, no path walk); a
            // replacement by rename only in a fresh lookup, done every `valid_ms`.
            let same = self.unchanged_since_open(idx) && (fresh || self.still_same(idx));
            if same {
                let f = self.entries[idx.index()].as_mut().expect("mapped entry");
                if !fresh {
                    f.validated_ms = now_ms;
                }
                f.refs += 1;
                self.hits += 1;
                return Ok(idx);
            }
            // Changed on disk: drop it from the map; responses holding it keep the old file.
            // (`unchanged_since_open` may have done both already; doing them again is harmless.)
            self.keys.remove(rel, wants_dir);
            self.entries[idx.index()].as_mut().expect("entry").stale = true;
            self.free_if_unused(ring, idx);
        }
        if let Some(e) = self.missing.get(rel, wants_dir, now_ms, self.cfg.valid_ms) {
            self.negative_hits += 1;
            return Err(e);
        }
        self.misses += 1;
        let (fd, opened) = match self.open_path(rel, wants_dir) {
            Ok(found) => found,
            Err(e) => {
                self.missing.insert(rel, wants_dir, e, now_ms);
                return Err(e);
            }
        };
        let idx = self.free_slot(ring).ok_or(OpenError::Busy)?;
        let file = self.build_entry(fd, idx, rel, wants_dir, opened, now_ms)?;
        ring.register(idx, file._fd.as_fd())
            .map_err(|e| OpenError::Other(e.raw_os_error().unwrap_or(libc::EIO)))?;
        self.keys.insert(rel, wants_dir, idx);
        self.entries[idx.index()] = Some(file);
        self.entries[idx.index()].as_mut().expect("just set").refs = 1;
        Ok(idx)
    }

    /// Finds or opens a pull-through cache data file at `path` (outside the root) of an object
    /// of `size_bytes`, kept under `key` (which must not be a resolved request path: the
    /// caller prefixes it with a NUL).
    /// The file is never revalidated: a cache version never changes in place.
    pub fn acquire_immutable(
        &mut self,
        ring: &mut impl FileTable,
        key: &str,
        path: &std::path::Path,
        size_bytes: u64,
        now_ms: u64,
    ) -> Result<FileSlot, OpenError> {
        debug_assert!(key.starts_with('\0'), "a cache key never looks like a path");
        if let Some(idx) = self.keys.get(key, false) {
            let f = self.entries[idx.index()].as_mut().expect("mapped entry");
            f.refs += 1;
            self.hits += 1;
            return Ok(idx);
        }
        self.misses += 1;
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(OpenError::from_errno)?;
        let idx = self.free_slot(ring).ok_or(OpenError::Busy)?;
        let opened = path.to_string_lossy().into_owned();
        let mut file = self.build_entry(fd, idx, key, false, opened, now_ms)?;
        file.immutable = true;
        // A data file still filling is smaller than its object: its read mode follows the
        // object's size (O_DIRECT for a large one), not the bytes written so far.
        if file.mode == ReadMode::Buffered && size_bytes >= self.cfg.direct_io_min_bytes {
            let st = rustix::fs::statx(
                &file._fd,
                "",
                AtFlags::EMPTY_PATH,
                StatxFlags::BASIC_STATS | StatxFlags::DIOALIGN,
            )
            .map_err(OpenError::from_errno)?;
            file.mode = self.large_file_mode(&file._fd, &st, file.dev);
        }
        ring.register(idx, file._fd.as_fd())
            .map_err(|e| OpenError::Other(e.raw_os_error().unwrap_or(libc::EIO)))?;
        self.keys.insert(key, false, idx);
        self.entries[idx.index()] = Some(file);
        self.entries[idx.index()].as_mut().expect("just set").refs = 1;
        Ok(idx)
    }

    /// Forgets the entry under `key` (a dropped cache version, whose data file was removed):
    /// its descriptor is closed now when no response holds it, else at the last release, so
    /// the disk gets the file's room back.
    pub fn forget(&mut self, ring: &mut impl FileTable, key: &str) {
        let Some(idx) = self.keys.get(key, false) else {
            return;
        };
        self.keys.remove(key, false);
        if let Some(f) = self.entries[idx.index()].as_mut() {
            f.stale = true;
        }
        self.free_if_unused(ring, idx);
    }

    /// Drops a response's reference.
    pub fn release(&mut self, ring: &mut impl FileTable, idx: FileSlot) {
        let f = self.entries[idx.index()].as_mut().expect("released entry");
        assert!(f.refs > 0, "file cache refcount underflow");
        f.refs -= 1;
        self.free_if_unused(ring, idx);
    }

    /// RWF_DONTCACHE was refused (EOPNOTSUPP): read this file buffered from now on.
    pub fn demote_to_buffered(&mut self, idx: FileSlot) {
        let f = self.entries[idx.index()].as_mut().expect("entry");
        if f.mode == ReadMode::DontCache {
            f.mode = ReadMode::Buffered;
            let dev = f.dev;
            self.log_mode(dev, ReadMode::Buffered, "RWF_DONTCACHE returned EOPNOTSUPP");
        }
    }

    /// A reload changed `open_file_valid_ms`: entries are revalidated on the new interval.
    pub fn set_valid_ms(&mut self, valid_ms: u64) {
        self.cfg.valid_ms = valid_ms;
    }

    /// Cached entries (open files).
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn free_if_unused(&mut self, ring: &mut impl FileTable, idx: FileSlot) {
        let remove = matches!(&self.entries[idx.index()], Some(f) if f.stale && f.refs == 0);
        if remove {
            self.evict(ring, idx);
        }
    }

    fn evict(&mut self, ring: &mut impl FileTable, idx: FileSlot) {
        if let Some(f) = self.entries[idx.index()].take() {
            if !f.stale {
                self.keys.remove(&f.key, f.wants_dir);
            }
            if let Err(e) = ring.unregister(idx) {
                tracing::warn!(error = %e, "unregistering a fixed file failed");
            }
            self.free.push(idx);
        }
    }

    fn free_slot(&mut self, ring: &mut impl FileTable) -> Option<FileSlot> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        // Clock sweep for an entry no response holds.
        let n = self.entries.len();
        for _ in 0..n {
            let i = self.clock_hand;
            self.clock_hand = (self.clock_hand + 1) % n;
            if matches!(&self.entries[i], Some(f) if f.refs == 0) {
                self.evict(ring, FileSlot::new(i as u32));
                return self.free.pop();
            }
        }
        None
    }

    fn resolve_flags(&self) -> ResolveFlags {
        let mut r = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if self.cfg.symlinks == SymlinkPolicy::Deny {
            r |= ResolveFlags::NO_SYMLINKS;
        }
        r
    }

    /// Opens a resolved path ("" is the root itself).
    fn open_at(&self, path: &str) -> Result<OwnedFd, OpenError> {
        self.open_beneath(if path.is_empty() { "." } else { path })
    }

    /// openat2 beneath the root. A `&str` longer than rustix's on-stack buffer is copied into
    /// a heap CString for the call; a `&CStr` never is.
    fn open_beneath(&self, path: impl rustix::path::Arg) -> Result<OwnedFd, OpenError> {
        rustix::fs::openat2(
            &self.root,
            path,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
            self.resolve_flags(),
        )
        .map_err(OpenError::from_errno)
    }

    /// Opens `rel`, following a directory to its index file.
    fn open_path(&self, rel: &str, wants_dir: bool) -> Result<(OwnedFd, String), OpenError> {
        let first = if wants_dir && !rel.is_empty() {
            format!("{rel}/{INDEX_FILE}")
        } else {
            rel.to_string()
        };
        let fd = self.open_at(&first)?;
        let st = rustix::fs::fstat(&fd).map_err(OpenError::from_errno)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((fd, first)),
            FileType::Directory => {
                let index = if first.is_empty() {
                    INDEX_FILE.to_string()
                } else {
                    format!("{first}/{INDEX_FILE}")
                };
                let fd = self.open_at(&index)?;
                let st = rustix::fs::fstat(&fd).map_err(OpenError::from_errno)?;
                if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile {
                    Ok((fd, index))
                } else {
                    Err(OpenError::NotFound)
                }
            }
            _ => Err(OpenError::NotFound),
        }
    }

    /// Whether the open file still has the size and mtime it had when opened (one fstat on an
    /// open descriptor: no path walk, no I/O). Checked after every chunk read, so a file
    /// rewritten in place under a response is detected and never sent as a mix of versions.
    /// A changed file is dropped from the cache so the next request reopens it.
    pub fn unchanged_since_open(&mut self, idx: FileSlot) -> bool {
        let f = self.get(idx);
        if f.immutable {
            return true;
        }
        let same = match rustix::fs::fstat(&f._fd) {
            Ok(st) => {
                st.st_size as u64 == f.size
                    && st.st_mtime == f.mtime_secs
                    && st.st_mtime_nsec as u32 == f.mtime_nsec
            }
            Err(_) => false,
        };
        if !same {
            let f = self.entries[idx.index()].as_mut().expect("entry");
            if !f.stale {
                f.stale = true;
                self.keys.remove(&f.key, f.wants_dir);
            }
        }
        same
    }

    fn still_same(&self, idx: FileSlot) -> bool {
        let f = self.get(idx);
        let Ok(fd) = self.open_beneath(f.opened.as_c_str()) else {
            return false;
        };
        match rustix::fs::statx(&fd, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS) {
            Ok(st) => {
                st.stx_ino == f.ino
                    && st.stx_size == f.size
                    && st.stx_mtime.tv_sec == f.mtime_secs
                    && st.stx_mtime.tv_nsec == f.mtime_nsec
            }
            Err(_) => false,
        }
    }

    fn build_entry(
        &mut self,
        fd: OwnedFd,
        fixed: FileSlot,
        key: &str,
        wants_dir: bool,
        opened: String,
        now_ms: u64,
    ) -> Result<OpenFile, OpenError> {
        let st = rustix::fs::statx(
            &fd,
            "",
            AtFlags::EMPTY_PATH,
            StatxFlags::BASIC_STATS | StatxFlags::DIOALIGN,
        )
        .map_err(OpenError::from_errno)?;
        let dev = (st.stx_dev_major, st.stx_dev_minor);
        let mode = if st.stx_size >= self.cfg.direct_io_min_bytes {
            self.large_file_mode(&fd, &st, dev)
        } else {
            ReadMode::Buffered
        };
        let mut etag = [0u8; ETAG_MAX_BYTES];
        let digest_len = match self.cfg.etag {
            EtagSource::Xattr => read_digest_etag(&fd, &opened, &mut etag),
            EtagSource::Mtime => None,
        };
        let etag_len = digest_len.unwrap_or_else(|| {
            conditional::format_etag(
                st.stx_size,
                st.stx_mtime.tv_sec,
                st.stx_mtime.tv_nsec,
                &mut etag,
            )
        });
        Ok(OpenFile {
            _fd: fd,
            fixed,
            size: st.stx_size,
            ino: st.stx_ino,
            mtime_secs: st.stx_mtime.tv_sec,
            mtime_nsec: st.stx_mtime.tv_nsec,
            etag,
            etag_len,
            last_modified: date::format_http_date(st.stx_mtime.tv_sec),
            mode,
            content_type: mime::content_type_for(opened.as_bytes()),
            key: key.into(),
            wants_dir,
            // A resolved path has no NUL (refused as NulByte), nor has INDEX_FILE.
            opened: CString::new(opened).map_err(|_| OpenError::NotFound)?,
            validated_ms: now_ms,
            refs: 0,
            stale: false,
            immutable: false,
            dev,
        })
    }

    /// O_DIRECT where the file system allows it and its alignment fits the arena; otherwise
    /// RWF_DONTCACHE (demoted to plain buffered if the kernel refuses it).
    fn large_file_mode(
        &mut self,
        fd: &OwnedFd,
        st: &rustix::fs::Statx,
        dev: (u32, u32),
    ) -> ReadMode {
        let align = dio_alignment(st);
        let mode = match align {
            Some(a)
                if a <= ARENA_ALIGN_BYTES
                    && (self.cfg.chunk_bytes as u64).is_multiple_of(u64::from(a))
                    && rustix::fs::fcntl_setfl(
                        fd,
                        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::DIRECT,
                    )
                    .is_ok() =>
            {
                ReadMode::Direct { align: a }
            }
            _ => ReadMode::DontCache,
        };
        let why = match (mode, align) {
            (ReadMode::Direct { .. }, _) => "O_DIRECT accepted",
            (_, None) => "file system reports no O_DIRECT alignment and has no block device",
            _ => "O_DIRECT refused or alignment unusable",
        };
        self.log_mode(dev, mode, why);
        mode
    }

    fn log_mode(&mut self, dev: (u32, u32), mode: ReadMode, why: &str) {
        if self.modes_logged.insert((dev.0, dev.1, mode.label())) {
            tracing::info!(
                device = format!("{}:{}", dev.0, dev.1),
                mode = mode.label(),
                why,
                "large-file read mode for this file system"
            );
        }
    }
}

/// The ETag from the publisher's digest xattr, or None (absent, unsupported, or malformed:
/// the caller falls back to size + mtime). One fgetxattr per open, never per request.
fn read_digest_etag(fd: &OwnedFd, path: &str, out: &mut [u8; ETAG_MAX_BYTES]) -> Option<usize> {
    let mut value = [0u8; DIGEST_XATTR_MAX_BYTES];
    let n = match rustix::fs::fgetxattr(fd, DIGEST_XATTR, &mut value) {
        Ok(n) => n,
        // No digest published for this file (or no xattrs on this file system): the fallback.
        Err(Errno::NODATA | Errno::NOTSUP) => return None,
        Err(e) => {
            tracing::warn!(path, error = %e, "reading {DIGEST_XATTR} failed; ETag from size + mtime");
            return None;
        }
    };
    let len = digest_etag(&value[..n.min(value.len())], out);
    if len.is_none() {
        tracing::warn!(
            path,
            "{DIGEST_XATTR} is neither 64 hex digits nor 32 bytes; ETag from size + mtime"
        );
    }
    len
}

/// Writes `"sha256-<64 lowercase hex>"` for an xattr value of 64 hex digits (any case, trailing
/// whitespace allowed, as `sha256sum` prints) or 32 raw digest bytes; None for anything else.
fn digest_etag(value: &[u8], out: &mut [u8; ETAG_MAX_BYTES]) -> Option<usize> {
    const PREFIX: &[u8] = b"\"sha256-";
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let text = value.trim_ascii_end();
    let mut digits = [0u8; 2 * SHA256_BYTES];
    if text.len() == digits.len() && text.iter().all(u8::is_ascii_hexdigit) {
        for (d, &c) in digits.iter_mut().zip(text) {
            *d = c.to_ascii_lowercase();
        }
    } else if value.len() == SHA256_BYTES {
        for (pair, &b) in digits.chunks_exact_mut(2).zip(value) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0xf)];
        }
    } else {
        return None;
    }
    let len = PREFIX.len() + digits.len() + 1;
    let tag = out.get_mut(..len)?;
    tag[..PREFIX.len()].copy_from_slice(PREFIX);
    tag[PREFIX.len()..len - 1].copy_from_slice(&digits);
    tag[len - 1] = b'"';
    Some(len)
}

/// O_DIRECT alignment: statx STATX_DIOALIGN, else the block device's logical block size.
fn dio_alignment(st: &rustix::fs::Statx) -> Option<u32> {
    if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && st.stx_dio_offset_align > 0 {
        let a = st.stx_dio_offset_align.max(st.stx_dio_mem_align);
        return a.is_power_of_two().then_some(a);
    }
    if st.stx_dev_major == 0 {
        // Virtual file systems (tmpfs, overlay upper on tmpfs...) have no block device.
        return None;
    }
    let base = format!("/sys/dev/block/{}:{}", st.stx_dev_major, st.stx_dev_minor);
    for p in [
        format!("{base}/queue/logical_block_size"),
        format!("{base}/../queue/logical_block_size"),
    ] {
        if let Ok(text) = std::fs::read_to_string(&p) {
            if let Ok(v) = text.trim().parse::<u32>() {
                if v.is_power_of_two() {
                    return Some(v);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(value: &[u8]) -> Option<String> {
        let mut out = [0u8; ETAG_MAX_BYTES];
        digest_etag(value, &mut out).map(|n| String::from_utf8(out[..n].to_vec()).unwrap())
    }

    #[test]
    fn digest_etag_from_hex_or_raw_bytes() {
        let hex = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08";
        let want = format!("\"sha256-{}\"", hex.to_ascii_lowercase());
        assert_eq!(tag(hex.as_bytes()), Some(want.clone()));
        assert_eq!(tag(format!("{hex}\n").as_bytes()), Some(want.clone()));
        let raw: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(tag(&raw), Some(want.clone()));
        assert!(want.len() <= ETAG_MAX_BYTES);
    }

    #[test]
    fn malformed_digests_are_refused() {
        assert_eq!(tag(b""), None);
        assert_eq!(tag(b"abc"), None);
        assert_eq!(tag(&[b'g'; 64]), None);
        assert_eq!(tag(&[b'a'; 63]), None);
        assert_eq!(tag(&[0u8; 33]), None);
    }
}
