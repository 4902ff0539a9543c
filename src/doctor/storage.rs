//! Data-root checks: filesystem type, O_DIRECT alignment (`statx` STATX_DIOALIGN), whether an
//! aligned O_DIRECT read works and whether `RWF_DONTCACHE` reads work. These probe the real
//! data root (not `--root`): a fixture tree cannot say what a kernel does with a file.

use std::fs;
use std::io::{IoSliceMut, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags, CWD};
use rustix::io::{Errno, ReadWriteFlags};

use super::{Check, Status};

/// `RWF_DONTCACHE` (Linux 6.14): read through the page cache, then drop the pages read in.
/// Not yet named by rustix.
const RWF_DONTCACHE: u32 = 0x80;
/// Size of the probe file: big enough for any DIO alignment seen in practice.
const PROBE_BYTES: usize = 64 << 10;
/// Alignment assumed when the kernel reports none (pre-6.1 or the filesystem does not say).
const ALIGN_BYTES_FALLBACK: usize = 4096;
/// Largest alignment the O_DIRECT probe honours.
const ALIGN_BYTES_MAX: usize = 1 << 20;
/// Entries of the data root looked at for an existing file when the probe cannot be written.
const EXISTING_SCAN_MAX: usize = 256;

/// The data root's checks, in report order.
pub fn checks(data_root: &Path) -> Vec<Check> {
    let (fs_check, kind) = filesystem(data_root);
    // RAM-backed filesystems accept O_DIRECT (6.6+) but keep the data in the page cache.
    let ram_backed = matches!(kind, "tmpfs" | "ramfs");
    if fs_check.status == Status::Fail {
        return vec![fs_check];
    }
    let mut checks = vec![fs_check];
    match Probe::new(data_root) {
        Ok(probe) => {
            let (align_check, align) = dio_align(&probe);
            checks.push(align_check);
            let direct = o_direct(&probe, align, ram_backed);
            let direct_ok = direct.status == Status::Ok;
            checks.push(direct);
            checks.push(dontcache(&probe, direct_ok));
        }
        Err(e) => checks.push(Check::new(
            "storage.probe",
            Status::Warn,
            e,
            "a writable data root or one holding a file",
            "O_DIRECT alignment and RWF_DONTCACHE support could not be probed",
        )),
    }
    checks
}

/// Free space below which the pull-through cache's disk is reported (a fill that cannot get
/// space fails; hits keep being served).
pub const CACHE_FREE_WARN_PERCENT: u64 = 10;

/// The pull-through cache directory's checks (`cache_dir` of `--config`): the same storage
/// probes as the data root (its blocks are written and read with O_DIRECT), named `cache.*`,
/// and its free space.
pub fn cache_checks(cache_dir: &Path) -> Vec<Check> {
    let mut checks: Vec<Check> = checks(cache_dir)
        .into_iter()
        .map(|mut c| {
            c.name = c.name.replacen("storage.", "cache.", 1);
            c
        })
        .collect();
    checks.push(match rustix::fs::statvfs(cache_dir) {
        Ok(st) => {
            let total = st.f_blocks.saturating_mul(st.f_frsize);
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            let percent = (free * 100).checked_div(total).unwrap_or(0);
            let status = if percent < CACHE_FREE_WARN_PERCENT {
                Status::Warn
            } else {
                Status::Ok
            };
            Check::new(
                "cache.free_space",
                status,
                format!(
                    "{} GiB free of {} GiB ({percent}%)",
                    free >> 30,
                    total >> 30
                ),
                format!("at least {CACHE_FREE_WARN_PERCENT}% free"),
                "there is no eviction budget yet: fills stop when the disk is full",
            )
        }
        Err(e) => Check::new(
            "cache.free_space",
            Status::Fail,
            format!("{}: {e}", cache_dir.display()),
            "a readable cache_dir",
            "the cache cannot fill a directory it cannot stat",
        ),
    });
    checks
}

/// Name and verdict for a `statfs` magic number.
fn fs_kind(magic: u64) -> (&'static str, Status, &'static str) {
    match magic {
        0xEF53 => ("ext4", Status::Ok, "local filesystem with O_DIRECT"),
        0x5846_5342 => (
            "xfs",
            Status::Ok,
            "local filesystem with O_DIRECT (4k alignment is common)",
        ),
        0x9123_683E => (
            "btrfs",
            Status::Ok,
            "O_DIRECT works; checksummed data falls back to buffered on some kernels",
        ),
        0xF2F5_2010 => ("f2fs", Status::Ok, "local filesystem with O_DIRECT"),
        0xCA45_1A4E => ("bcachefs", Status::Ok, "local filesystem with O_DIRECT"),
        0x2FC1_2FC1 => (
            "zfs",
            Status::Warn,
            "O_DIRECT is honoured only from OpenZFS 2.3; older versions cache in the ARC",
        ),
        0x0102_1994 => (
            "tmpfs",
            Status::Warn,
            "RAM-backed: O_DIRECT still goes through the page cache",
        ),
        0x8584_58F6 => ("ramfs", Status::Warn, "RAM-backed: no O_DIRECT"),
        0x794C_7630 => (
            "overlayfs",
            Status::Warn,
            "overlay: O_DIRECT depends on the upper/lower filesystem; serve from a plain mount",
        ),
        0x6969 => (
            "nfs",
            Status::Warn,
            "network filesystem: every miss is a network round trip",
        ),
        0xFF53_4D42 | 0xFE53_4D42 => (
            "cifs/smb",
            Status::Warn,
            "network filesystem: every miss is a network round trip",
        ),
        0x6573_5546 => (
            "fuse",
            Status::Warn,
            "FUSE: O_DIRECT and throughput depend on the daemon",
        ),
        0x0102_1997 => (
            "9p",
            Status::Warn,
            "9p (VM share): slow and no real O_DIRECT",
        ),
        _ => (
            "unknown",
            Status::Warn,
            "unrecognised filesystem: O_DIRECT behaviour unknown",
        ),
    }
}

/// The filesystem check and the filesystem's name ("" when unknown or unreadable).
fn filesystem(data_root: &Path) -> (Check, &'static str) {
    let name = "storage.fs";
    // "." says nothing in a report; show where it resolved to.
    let shown = fs::canonicalize(data_root).unwrap_or_else(|_| data_root.to_path_buf());
    let recommended = "ext4 or xfs on local NVMe";
    match rustix::fs::statfs(data_root) {
        Ok(st) => {
            // f_type's width differs by architecture; the magic always fits 32 bits.
            #[allow(clippy::unnecessary_cast)]
            let magic = st.f_type as u64 & 0xFFFF_FFFF;
            let (kind, status, why) = fs_kind(magic);
            let current = if kind == "unknown" {
                format!("{} (magic {magic:#x})", shown.display())
            } else {
                format!("{} on {kind}", shown.display())
            };
            (Check::new(name, status, current, recommended, why), kind)
        }
        Err(e) => (
            Check::new(
                name,
                Status::Fail,
                format!("{}: {e}", data_root.display()),
                "an existing, readable data root",
                "shardline serves files from here",
            ),
            "",
        ),
    }
}

/// A file to probe: one the doctor wrote in its own temporary directory under the data root
/// (removed on drop), or an existing file when the data root is read-only.
struct Probe {
    file: PathBuf,
    made_dir: Option<PathBuf>,
}

impl Probe {
    fn new(data_root: &Path) -> Result<Self, String> {
        let dir = data_root.join(format!(".shardline-doctor-{}", std::process::id()));
        let written = fs::create_dir(&dir).and_then(|()| {
            let file = dir.join("probe");
            let mut f = fs::File::create(&file)?;
            f.write_all(&[0x5a; PROBE_BYTES])?;
            // On disk, so the O_DIRECT read below reads the device, not dirty pages.
            f.sync_all()?;
            Ok(file)
        });
        match written {
            Ok(file) => Ok(Self {
                file,
                made_dir: Some(dir),
            }),
            Err(write_err) => {
                let _ = fs::remove_dir_all(&dir);
                let file = existing_file(data_root).ok_or_else(|| {
                    format!(
                        "cannot write a probe under {} ({write_err}) and it holds no regular file",
                        data_root.display()
                    )
                })?;
                Ok(Self {
                    file,
                    made_dir: None,
                })
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(dir) = &self.made_dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// A non-empty regular file directly in `dir`, if any.
fn existing_file(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .take(EXISTING_SCAN_MAX)
        .filter_map(Result::ok)
        .find(|e| e.metadata().is_ok_and(|m| m.is_file() && m.len() > 0))
        .map(|e| e.path())
}

/// The DIO alignment check and the alignment the O_DIRECT probe should use.
fn dio_align(probe: &Probe) -> (Check, usize) {
    let name = "storage.dio_align";
    let recommended = "reported by statx (shardline aligns ranges to it)";
    match rustix::fs::statx(CWD, &probe.file, AtFlags::empty(), StatxFlags::DIOALIGN) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && st.stx_dio_offset_align > 0 => {
            let mem = st.stx_dio_mem_align;
            let offset = st.stx_dio_offset_align;
            let align = usize::try_from(mem.max(offset)).unwrap_or(ALIGN_BYTES_FALLBACK);
            (
                Check::new(
                    name,
                    Status::Ok,
                    format!("memory {mem} B, offset {offset} B"),
                    recommended,
                    "O_DIRECT ranges are widened to this alignment (never a hand-set 512: XFS wants 4k)",
                ),
                align,
            )
        }
        Ok(_) => (
            Check::new(
                name,
                Status::Warn,
                "not reported (kernel before 6.1, or the filesystem has no O_DIRECT)",
                recommended,
                "shardline falls back to the block device's logical block size",
            ),
            ALIGN_BYTES_FALLBACK,
        ),
        Err(e) => (
            Check::new(
                name,
                Status::Warn,
                format!("statx failed: {e}"),
                recommended,
                "shardline falls back to the block device's logical block size",
            ),
            ALIGN_BYTES_FALLBACK,
        ),
    }
}

/// Opens the probe with O_DIRECT and reads one aligned block into an aligned buffer.
fn o_direct(probe: &Probe, align: usize, ram_backed: bool) -> Check {
    let name = "storage.o_direct";
    let recommended = "aligned O_DIRECT reads work";
    let why_refused =
        "big files then go through RWF_DONTCACHE or the page cache (reclaim hurts neighbours)";
    let fd = match rustix::fs::open(
        &probe.file,
        OFlags::RDONLY | OFlags::DIRECT | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            return Check::new(
                name,
                Status::Warn,
                format!("open refused: {e}"),
                recommended,
                why_refused,
            )
        }
    };
    // A power of two (align_offset needs one), bounded so a garbage statx value cannot make
    // us allocate much; a real alignment above the bound shows up as a failed read below.
    let align = align.clamp(512, ALIGN_BYTES_MAX).next_power_of_two();
    // Over-allocate and pick the aligned window: aligned memory without unsafe.
    let mut raw = vec![0u8; align * 2];
    let start = raw.as_ptr().align_offset(align);
    let Some(buf) = raw.get_mut(start..start.saturating_add(align)) else {
        return Check::new(
            name,
            Status::Warn,
            "cannot align a probe buffer",
            recommended,
            why_refused,
        );
    };
    match rustix::io::pread(&fd, buf, 0) {
        Ok(n) if ram_backed => Check::new(
            name,
            Status::Warn,
            format!("opens and reads ({n} B), but the data stays in RAM"),
            recommended,
            "a RAM-backed filesystem serves O_DIRECT from the page cache: fine for tests, not for 200 GB of packages",
        ),
        Ok(n) => Check::new(
            name,
            Status::Ok,
            format!("works ({n} B read at {align} B alignment)"),
            recommended,
            "big files skip the page cache, so serving 200 GB packages does not evict everything else",
        ),
        Err(e) => Check::new(
            name,
            Status::Warn,
            format!("open works, aligned read fails: {e}"),
            recommended,
            why_refused,
        ),
    }
}

/// A buffered `preadv2(RWF_DONTCACHE)` read of the probe.
fn dontcache(probe: &Probe, direct_ok: bool) -> Check {
    let name = "storage.dontcache";
    let recommended = "supported (Linux 6.14+, ext4/xfs)";
    let fd = match rustix::fs::open(&probe.file, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            return Check::new(
                name,
                Status::Warn,
                format!("cannot open probe: {e}"),
                recommended,
                "",
            )
        }
    };
    let mut buf = [0u8; 4096];
    let result = rustix::io::preadv2(
        &fd,
        &mut [IoSliceMut::new(&mut buf)],
        0,
        ReadWriteFlags::from_bits_retain(RWF_DONTCACHE),
    );
    // Only files where O_DIRECT is refused use RWF_DONTCACHE, so its absence matters only then.
    let (status, why) = match (&result, direct_ok) {
        (Ok(_), _) => (
            Status::Ok,
            "fallback where O_DIRECT is refused: no page-cache pollution",
        ),
        (Err(_), true) => (
            Status::Ok,
            "only the fallback where O_DIRECT is refused, and O_DIRECT works here",
        ),
        (Err(_), false) => (
            Status::Warn,
            "without a working O_DIRECT, big files fill the page cache and push out hot data",
        ),
    };
    let current = match result {
        Ok(_) => "works".to_string(),
        Err(Errno::OPNOTSUPP) => "not supported: falls back to buffered".to_string(),
        Err(e) => format!("fails ({e}): falls back to buffered"),
    };
    Check::new(name, status, current, recommended, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_cleans_up_and_checks_do_not_fail() {
        let dir = tempfile::tempdir().unwrap();
        let checks = checks(dir.path());
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "storage.fs",
                "storage.dio_align",
                "storage.o_direct",
                "storage.dontcache"
            ]
        );
        assert!(
            checks.iter().all(|c| c.status != Status::Fail),
            "{checks:#?}"
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probe left behind"
        );
    }

    #[test]
    fn missing_data_root_fails() {
        let checks = checks(Path::new("/nonexistent/shardline-doctor"));
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Status::Fail);
    }

    #[test]
    fn read_only_roots_use_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("empty"), b"").unwrap();
        assert_eq!(existing_file(dir.path()), None);
        fs::write(dir.path().join("pkg.bin"), b"data").unwrap();
        assert_eq!(existing_file(dir.path()), Some(dir.path().join("pkg.bin")));
        // A data root that is a file: no probe, a WARN, no crash.
        let checks = checks(&dir.path().join("pkg.bin"));
        assert_eq!(checks.last().unwrap().name, "storage.probe");
        assert_eq!(checks.last().unwrap().status, Status::Warn);
    }

    #[test]
    fn tmpfs_warns_that_o_direct_stays_in_ram() {
        let shm = Path::new("/dev/shm");
        if filesystem(shm).1 != "tmpfs" {
            // Same skip variable as the integration tests (tests/README.md).
            let skip = std::env::var("SHARDLINE_SKIP_TMPFS").is_ok_and(|v| v == "1");
            assert!(
                skip,
                "/dev/shm is not tmpfs here; set SHARDLINE_SKIP_TMPFS=1 to skip"
            );
            eprintln!("skipped (SHARDLINE_SKIP_TMPFS=1): /dev/shm is not tmpfs here");
            return;
        }
        let dir = tempfile::tempdir_in(shm).unwrap();
        let checks = checks(dir.path());
        let direct = checks
            .iter()
            .find(|c| c.name == "storage.o_direct")
            .unwrap();
        assert_eq!(direct.status, Status::Warn, "{direct:?}");
        assert!(
            checks.iter().all(|c| c.status != Status::Fail),
            "{checks:#?}"
        );
    }

    #[test]
    fn known_magics() {
        assert_eq!(fs_kind(0xEF53).0, "ext4");
        assert_eq!(fs_kind(0x0102_1994).1, Status::Warn);
        assert_eq!(fs_kind(1).0, "unknown");
    }
}
