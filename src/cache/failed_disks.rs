//! Which cache disks failed, kept across restarts (issue 43): a failing disk cannot be trusted
//! to carry its own marker (it may take no write at all), so the ids of the disks that failed
//! are written on every other disk (`FAILED_DISKS_FILE`, one id of 16 hex digits per line,
//! written beside and renamed into place). At start-up a disk any opened disk lists comes up
//! failing, its objects misses, until the operator's `online` takes its id off the lists.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::path::Path;

use super::watch::sync_dir;

/// The file each disk keeps the ids of the failed disks in, beside its own id.
pub const FAILED_DISKS_FILE: &str = "failed-disks";
/// Most ids a list holds (`cache_dirs` has at most `MAX_CACHE_DISKS` disks, and a replaced
/// disk keeps its id); lines past it are ignored.
pub const MAX_LISTED: usize = 4 * crate::config::MAX_CACHE_DISKS;

/// The ids listed on any of `dirs` (a missing, unreadable or malformed list counts as empty,
/// line by line).
pub fn read_listed<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join(FAILED_DISKS_FILE)) else {
            continue;
        };
        ids.extend(
            text.lines()
                .take(MAX_LISTED)
                .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok()),
        );
    }
    ids
}

/// Writes `ids` as `dir`'s list, durably (beside, synced, renamed over, the directory
/// synced); an empty list removes the file.
pub fn write_list(dir: &Path, ids: &BTreeSet<u64>) -> io::Result<()> {
    let path = dir.join(FAILED_DISKS_FILE);
    if ids.is_empty() {
        match std::fs::remove_file(&path) {
            Ok(()) => return sync_dir(dir, &None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    let text: String = ids.iter().map(|id| format!("{id:016x}\n")).collect();
    let tmp = dir.join(format!("{FAILED_DISKS_FILE}.new"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir, &None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_the_union_of_every_disk_and_an_empty_one_leaves_no_file() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        write_list(&a, &BTreeSet::from([1, 0xdead_beef])).unwrap();
        write_list(&b, &BTreeSet::from([7])).unwrap();
        std::fs::write(b.join(FAILED_DISKS_FILE), "0000000000000007\nnot hex\n\n").unwrap();
        let listed = read_listed([a.as_path(), b.as_path(), t.path()]);
        assert_eq!(listed, BTreeSet::from([1, 7, 0xdead_beef]));
        write_list(&a, &BTreeSet::new()).unwrap();
        assert!(!a.join(FAILED_DISKS_FILE).exists());
        write_list(&a, &BTreeSet::new()).unwrap();
        assert_eq!(read_listed([a.as_path()]), BTreeSet::new());
    }
}
